"""lkw._ext on any machine: the registry as Python sees it, the byte models, and the errors that bad
calls raise before anything reaches a GPU."""

import os

import numpy as np
import pytest

ext = pytest.importorskip("lkw._ext", reason="the extension is built by tools/setup.sh")
# tools/device_check.sh with LKW_CHAPTERS builds only those chapters (and 00, the ceiling)
ONLY = os.environ.get("LKW_CHAPTERS", "").split()


def test_every_chapter_registers_versions_with_sass_promises():
    versions = ext.versions()
    chapters = {v["chapter"] for v in versions}
    assert ({"00_roofline", *ONLY} if ONLY else {"00_roofline", "01_formats", "02_int4_dequant"}) <= chapters
    names = [v["name"] for v in versions]
    assert len(names) == len(set(names)), "a version is registered twice"
    for v in versions:
        assert v["name"] == f"{v['chapter']}/{v['op']}/{v['id']}"
        assert v["kind"] in ("version", "peer", "mutant", "ablation")
        if v["kind"] == "version":
            assert v["summary"] and v["sass"], f"{v['name']} promises nothing checkable"


def test_byte_models_count_each_input_once_and_each_output_once():
    words = np.zeros(1000, np.uint32)
    assert ext.model("00_roofline/copy/v1_vec16", [words], [words])["bytes"] == 8000
    if ONLY and "02_int4_dequant" not in ONLY:
        pytest.skip("02_int4_dequant is not built (LKW_CHAPTERS)")
    packed = np.zeros((16, 64), np.uint32)  # N = 16, K = 512
    scales = np.zeros((16, 4), np.uint16)  # G = 128
    out = np.zeros((16, 512), np.uint16)
    m = ext.model("02_int4_dequant/int4i_f16/v2_lop3_magic", [packed, scales], [out],
                  dtypes=["uint32", "float16", "float16"])
    assert m["bytes"] == 16 * 512 * (0.5 + 2 / 128 + 2)  # INT4 + one 2-byte scale per 128 + out


def test_bad_calls_raise_value_errors():
    a = np.zeros(64, np.uint32)
    with pytest.raises(ValueError, match="no registered version"):
        ext.launch("00_roofline/copy/v9_nothing", [a], [a])
    with pytest.raises(ValueError, match="GPU"):
        ext.launch("00_roofline/copy/v1_vec16", [a], [a.copy()])
    with pytest.raises(ValueError, match="one entry per input and output"):
        ext.model("00_roofline/copy/v1_vec16", [a], [a], dtypes=["uint32"])
    with pytest.raises(ValueError, match="unknown dtype"):
        ext.model("00_roofline/copy/v1_vec16", [a], [a], dtypes=["uint32", "float7"])
    with pytest.raises(ValueError, match="C-contiguous"):
        ext.model("00_roofline/copy/v1_vec16", [np.zeros((8, 8), np.uint32)[:, ::2]], [a])
    with pytest.raises(ValueError, match="a graph holds a batch"):
        ext.time("00_roofline/copy/v1_vec16", [([a], [a.copy()])], batch=0, graph=True)


def test_timing_in_a_cuda_graph_keeps_the_outputs_and_survives_a_failed_capture():
    """ext.time(graph=True): the batch captured once and replayed writes what plain launches
    write; a launch that fails inside the capture raises and leaves the timer usable."""
    torch = pytest.importorskip("torch", reason="device arrays come from torch")
    if not ext.device()["present"] or not torch.cuda.is_available():
        pytest.skip("no GPU: timing in a CUDA graph needs one")
    name = "00_roofline/copy/v1_vec16"
    n = (1 << 20) + 4
    src = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
    sets = [([src], [torch.full_like(src, -1)]) for _ in range(3)]
    t = ext.time(name, sets, warmup=2, iters=5, batch=6, graph=True)
    torch.cuda.synchronize()
    assert t["iters"] == 5 and 0 < t["min_us"] <= t["median_us"] <= t["max_us"]
    for _, (dst,) in sets:
        assert torch.equal(dst, src)
    bad = [([src], [torch.empty(n // 2, dtype=torch.int32, device="cuda")])]  # output too short
    with pytest.raises(RuntimeError):
        ext.time(name, bad, warmup=0, iters=2, batch=2, graph=True)  # fails inside the capture
    for _, (dst,) in sets:
        dst.fill_(-1)
    t = ext.time(name, sets, warmup=0, iters=2, batch=3, graph=True)
    torch.cuda.synchronize()
    assert t["iters"] == 2 and all(torch.equal(dst, src) for _, (dst,) in sets)


def test_the_device_query_answers_without_a_gpu():
    dev = ext.device()
    assert set(dev) >= {"present", "name", "arch", "sms", "l2_bytes"}
    if not dev["present"]:
        assert dev["arch"] == 0
