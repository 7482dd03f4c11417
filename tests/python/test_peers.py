"""lkw.peers without a GPU: an absent library is skipped with its reason, never faked; the offline
kit's preparation (wheels into the site folder once, FlashInfer's AOT modules into the installed
package, FlashInfer's environment); and, where torch is installed, the mapping of our INT4 words to
GPTQ's uint4b8 words that Marlin's and Machete's packers take."""

import io
import subprocess
import sys
import tarfile
import types

import numpy as np
import pytest
from lkw import bench, peers


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    peers.reset_cache()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(peers.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(peers.SITE_ENV, str(tmp_path / "site"))
    for var in ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_USE_CUDA_NORM"):
        monkeypatch.delenv(var, raising=False)
    yield tmp_path
    peers.reset_cache()


def test_an_absent_library_raises_absent_with_the_reason_every_time(fresh, monkeypatch):
    kit = fresh / "kit"
    kit.mkdir()
    monkeypatch.setenv(peers.KIT_ENV, str(kit))
    for name in ("vllm", "flashinfer", "liger_kernel"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    for lib in peers.LIBRARIES:
        with pytest.raises(peers.Absent) as first:
            peers.library(lib, log=lambda *_: None)
        assert lib in str(first.value) and str(kit) in str(first.value)
        with pytest.raises(peers.Absent) as again:  # cached: the same reason, no second attempt
            peers.library(lib)
        assert str(again.value) == str(first.value)
    status = peers.status()
    assert set(status) == set(peers.LIBRARIES)
    assert not any(s["available"] for s in status.values())
    assert all(s["detail"] for s in status.values())


def test_a_factory_of_an_absent_library_raises_absent_before_touching_its_inputs(fresh, monkeypatch):
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    factories = {**peers.quant_peers("per_group_fp8"), **peers.norm_peers("fused_add_rmsnorm", 1e-6),
                 **peers.gemv_peers(True, bench._torch_nibbles)}
    for factory in factories.values():
        with pytest.raises(peers.Absent):
            factory(None, None)  # torch and the inputs are never reached


def _tar_xz(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:xz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_the_kit_puts_the_aot_modules_into_the_installed_flashinfer_and_sets_its_environment(fresh):
    site = fresh / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    (site / "flashinfer_python-0.6.18.post1.dist-info").mkdir()  # the wheel is already installed
    kit = fresh / "kit"
    kit.mkdir()
    (kit / "flashinfer_python-0.6.18.post1-py3-none-any.whl").write_bytes(b"")
    _tar_xz(kit / "fi_aot_test_sm90a.tar.xz", {"norm/norm.so": b"ELF"})
    calls = []
    peers.prepare_kit(kit, log=calls.append)
    assert (site / "flashinfer" / "data" / "aot" / "norm" / "norm.so").read_bytes() == b"ELF"
    assert str(site) in sys.path and calls == []
    import os

    assert os.environ["FLASHINFER_CUDA_ARCH_LIST"] == "9.0" and os.environ["FLASHINFER_USE_CUDA_NORM"] == "1"
    assert os.environ["FLASHINFER_WORKSPACE_BASE"].startswith(str(fresh))


def test_the_kit_installs_only_the_wheels_not_yet_in_the_site(fresh, monkeypatch):
    kit = fresh / "kit"
    kit.mkdir()
    for wheel in ("liger_kernel-0.8.5-py3-none-any.whl", "apache_tvm_ffi-0.1.15.post2-cp312-abi3.whl"):
        (kit / wheel).write_bytes(b"")
    (fresh / "site").mkdir()
    (fresh / "site" / "liger_kernel-0.8.5.dist-info").mkdir()
    ran = []
    monkeypatch.setattr(peers.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    peers.prepare_kit(kit)
    assert len(ran) == 1
    cmd = ran[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and "--no-index" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--target") + 1] == str(fresh / "site")
    assert [c for c in cmd if c.endswith(".whl")] == [str(kit / "apache_tvm_ffi-0.1.15.post2-cp312-abi3.whl")]


def test_our_interleaved_int4_words_become_gptq_uint4b8_words_of_the_same_q(rng):
    """Marlin's and Machete's packers take GPTQ words [K/8, N] (q[n, 8i + j] in bits 4j of word
    [i, n]); ours are [N, K/8], element e of a word at nibble GEMV_INV_PERM[e], the same q with the
    same bias of 8."""
    torch = pytest.importorskip("torch")
    n, k = 24, 256
    q = rng.integers(0, 16, (n, k), dtype=np.int64)
    words = np.zeros((n, k // 8), np.int64)
    for e, nibble in enumerate(bench.GEMV_INV_PERM):
        words |= q[:, e::8] << (4 * nibble)
    ours = torch.from_numpy(np.where(words >= 2**31, words - 2**32, words).astype(np.int32))
    back = bench._torch_nibbles(torch, ours, interleaved=True)
    assert np.array_equal(back.numpy(), q)
    gptq = peers.gptq_pack(torch, back).numpy().astype(np.int64) & 0xFFFFFFFF
    assert gptq.shape == (k // 8, n)
    for j in range(8):
        assert np.array_equal((gptq >> (4 * j)) & 0xF, q[:, j::8].T)


def test_marlin_scales_keep_every_scale_once(rng):
    torch = pytest.importorskip("torch")
    k, n, g = 512, 128, 128
    s = torch.from_numpy(rng.standard_normal((k // g, n)).astype(np.float32))
    permuted = peers.marlin_permute_scales(torch, s, k, n, g)
    assert permuted.shape == (k // g, n)
    assert np.array_equal(np.sort(permuted.numpy().ravel()), np.sort(s.numpy().ravel()))


def test_chapter_07_peers_are_marlin_machete_and_humming_skipped_when_absent(fresh, monkeypatch):
    """Each on the natural words and [K/G, N] scales; an absent library raises Absent (the bench
    skips the peer, saying why) before the inputs are touched."""
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "humming", None)
    factories = peers.w4a16_peers()
    assert set(factories) == {"vllm marlin_gemm", "vllm machete_mm", "humming HummingLayer"}
    assert {name.split()[0] for name in factories} <= set(peers.LIBRARIES)  # the row's library
    for factory in factories.values():
        with pytest.raises(peers.Absent):
            factory(None, None)
    assert set(peers.W4A16_PEERS.values()) == {peers.marlin_call, peers.machete_call, peers.humming_call}


def test_chapter_08_peers_are_vllm_everywhere_and_flashinfer_for_blocks_skipped_when_absent(fresh, monkeypatch):
    """vLLM's cutlass_scaled_mm at every granularity, FlashInfer's DeepGEMM kernel for blockwise
    scales only; an absent library raises Absent before the inputs are touched."""
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    for granularity in ("tensor", "rowwise", "blockwise"):
        factories = peers.fp8_gemm_peers(granularity)
        blockscale = {"flashinfer fp8_blockscale_gemm_sm90"} if granularity == "blockwise" else set()
        assert set(factories) == {"vllm cutlass_scaled_mm"} | blockscale
        assert {name.split()[0] for name in factories} <= set(peers.LIBRARIES)
        for factory in factories.values():
            with pytest.raises(peers.Absent):
                factory(None, None)


def test_chapter_05_peers_are_named_by_library_and_skipped_when_absent(fresh, monkeypatch):
    """vLLM's activation, quant, rotary, fused QK norm and cache kernels, FlashInfer's activation and
    RoPE, Liger's SwiGLU and RoPE: each factory raises Absent before the inputs are touched when
    its library is not here."""
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    for name in ("vllm", "flashinfer", "liger_kernel"):
        monkeypatch.setitem(sys.modules, name, None)
    factories = {}
    for op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul_fp8_per_token",
               "silu_and_mul_fp8_per_group", "silu_and_mul_fp8_per_tensor"):
        factories.update({f"{op}: {k}": v for k, v in peers.act_peers(op).items()})
    factories.update(peers.rope_peers(is_neox=True))
    factories.update(peers.qk_norm_rope_peers(1e-6))
    for layout in ("paged", "nhd", "hnd"):
        for kv_dtype in ("bfloat16", "float8_e4m3fn"):
            factories.update({f"{layout} {kv_dtype}: {k}": v for k, v in peers.cache_peers(layout, kv_dtype).items()})
    assert {name.split(": ")[-1].split()[0] for name in factories} == {"vllm", "flashinfer", "liger"}
    for name, factory in factories.items():
        with pytest.raises(peers.Absent):
            factory(None, None)  # torch and the inputs are never reached
    assert set(peers.act_peers("silu_and_mul")) == {
        "vllm silu_and_mul", "flashinfer silu_and_mul", "liger swiglu_fused_gate_up_forward"}
    assert peers.act_peers("silu_and_mul_fp8_per_token") == {}  # no library computes this form
    assert "liger rope_forward" not in peers.rope_peers(is_neox=False)  # Liger rotates halves only
    assert set(peers.cache_peers("paged", "bfloat16")) == {"vllm reshape_and_cache"}
    assert set(peers.cache_peers("nhd", "float8_e4m3fn")) == {"vllm reshape_and_cache_flash"}
    assert set(peers.cache_peers("hnd", "bfloat16")) == {"vllm reshape_and_cache_flash (HND strides)"}
    assert set(peers.moe_peers("topk_softmax_bf16", k=8, renormalize=True)) == {"vllm topk_softmax"}


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
def test_vllm_s_flash_cache_kernel_gets_an_hnd_cache_as_a_strided_nhd_view(monkeypatch, kv_dtype):
    """reshape_and_cache_flash addresses the cache by its strides: an HND cache [blocks, Hk, block,
    D] goes in as the view [blocks, block, Hk, D] of the same memory (head stride block * D), and
    what it writes there is the HND cache the peer returns. A stand-in kernel that writes as vLLM's
    does (by the view's strides) lands each token at the contract's HND place."""
    torch = pytest.importorskip("torch")
    from lkw import elementwise as ew

    fp8 = kv_dtype == "float8_e4m3fn"
    t, hk, d, blocks, block = 5, 2, 16, 3, 4
    rng = np.random.default_rng(5)
    key, value = ew.heads(rng, t, hk, d), ew.heads(rng, t, hk, d)
    slots = rng.permutation(blocks * block)[:t].astype(np.int64)
    init = ew.poisoned_caches("hnd", blocks, block, hk, d, kv_dtype)
    typed = torch.float8_e4m3fn if fp8 else torch.bfloat16
    bits = np.uint8 if fp8 else np.int16
    caches = [torch.from_numpy(c.view(bits).copy()).view(typed) for c in init]
    seen = []

    def flash(k, v, kc, vc, slot_mapping, dtype, k_scale, v_scale):
        seen.append((tuple(kc.shape), kc.stride(), dtype))
        b, o = slot_mapping // kc.shape[1], slot_mapping % kc.shape[1]
        src_k, src_v = k.view(torch.int16), v.view(torch.int16)
        if fp8:  # a stand-in for the E4M3 codes: the low byte of each BF16 (where they go is the point)
            src_k, src_v = (x.to(torch.uint8) for x in (src_k & 0xFF, src_v & 0xFF))
        else:
            kc, vc = kc.view(torch.int16), vc.view(torch.int16)
        kc[b, o], vc[b, o] = src_k, src_v

    stub = types.SimpleNamespace(cache_ops=types.SimpleNamespace(reshape_and_cache_flash=flash))  # torch.ops._C_cache_ops
    monkeypatch.setattr(peers, "library", lambda name, log=print: stub)
    ins = [torch.from_numpy(key.view(np.int16)).view(torch.bfloat16),
           torch.from_numpy(value.view(np.int16)).view(torch.bfloat16), torch.from_numpy(slots)]
    ins += [torch.ones(1), torch.ones(1)] if fp8 else []
    (factory,) = peers.cache_peers("hnd", kv_dtype).values()
    call = factory(torch, [*ins, *caches])
    got = [g.view(torch.uint8).numpy().view(bits).reshape(g.shape) for g in call()]
    assert seen == [((blocks, block, hk, d), (hk * block * d, d, block * d, 1), "fp8" if fp8 else "auto")]
    where = ew.cache_index("hnd", init[0].shape, slots, d, "key")
    for g, src in zip(got, (key, value)):
        want = src.view(np.int16) & 0xFF if fp8 else src.view(np.int16)
        assert np.array_equal(g[where], want.astype(bits))
    untouched = np.ones(init[0].shape, bool)
    untouched[where] = False
    assert all(np.array_equal(g[untouched], i.view(bits)[untouched]) for g, i in zip(got, init))


def test_flashinfer_modules_the_kit_does_not_prebuild_are_skipped_not_compiled(fresh, monkeypatch):
    """With the kit, a FlashInfer module missing from its AOT set would JIT-compile on the GPU:
    such a peer is Absent, with the reason; a prebuilt one (or a user's own install) is not."""
    site = fresh / "site"
    (site / "flashinfer" / "data" / "aot" / "rope").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.setenv(peers.KIT_ENV, str(fresh / "kit"))
    peers._flashinfer_prebuilt("rope")
    with pytest.raises(peers.Absent, match="gelu_tanh_and_mul.*JIT"):
        peers._flashinfer_prebuilt("gelu_tanh_and_mul")
    monkeypatch.delenv(peers.KIT_ENV)
    peers._flashinfer_prebuilt("gelu_tanh_and_mul")


def test_chapter_10_peers_are_flashinfer_s_skipped_when_absent_or_not_prebuilt(fresh, monkeypatch):
    """FlashInfer's top_k_mask_logits and top_k_renorm_probs, one per op (vLLM has no kernel of
    this form): an absent FlashInfer raises Absent before the inputs are touched, and so does, with
    the kit, a FlashInfer whose "sampling" module is not prebuilt (it would compile on the GPU);
    a prebuilt one is called as fn(x, top_k), the op's per-row k tensor."""
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    for op in ("top_k_mask_logits", "top_k_renorm_probs"):
        factories = peers.sampling_peers(op)
        assert set(factories) == {f"flashinfer {op}"}
        with pytest.raises(peers.Absent, match="flashinfer"):
            factories[f"flashinfer {op}"](None, None)  # torch and the inputs are never reached
    assert peers.sampling_peers("no_such_op") == {}
    site = fresh / "site"
    (site / "flashinfer" / "data" / "aot" / "norm").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "flashinfer")
    monkeypatch.setenv(peers.KIT_ENV, str(fresh / "kit"))
    stub = types.SimpleNamespace(sampling=types.SimpleNamespace(top_k_renorm_probs=lambda *a: a))
    monkeypatch.setattr(peers, "library", lambda name, log=print: stub)
    factory = peers.sampling_peers("top_k_renorm_probs")["flashinfer top_k_renorm_probs"]
    with pytest.raises(peers.Absent, match="sampling.*JIT"):
        factory(None, None)
    (site / "flashinfer" / "data" / "aot" / "sampling").mkdir()
    assert factory(None, ["probs", "top_k"])() == (("probs", "top_k"),)


def _recording_flashinfer(monkeypatch, *missing):
    """A stand-in FlashInfer whose sampling functions record their arguments (numpy arrays stand in
    for the tensors: the factories only slice and divide them) and return their name."""
    calls = []

    def fn(name):
        def call(*args, **kwargs):
            calls.append((name, args, kwargs))
            if name == "chain_speculative_sampling":
                return "tokens", "accepted alone", "emitted"
            return name if name != "softmax" else "probs"

        return call

    names = ("top_p_renorm_probs", "top_k_top_p_sampling_from_logits", "top_p_sampling_from_probs",
             "top_k_sampling_from_probs", "min_p_sampling_from_probs", "sampling_from_probs",
             "sampling_from_logits", "softmax", "chain_speculative_sampling")
    sampling = types.SimpleNamespace(**{n: fn(n) for n in names if n not in missing})
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    monkeypatch.setattr(peers, "library", lambda name, log=print: types.SimpleNamespace(sampling=sampling))
    return calls


def test_chapter_10_s_other_ops_have_flashinfer_s_kernels_by_filter_set(fresh, monkeypatch):
    """top_p_renorm_probs and rejection_sample one kernel each; sample one per filter set (FlashInfer
    has none for min-p with another filter), an unknown filter refused. All skip when FlashInfer is
    absent, or lacks the function (saying which), before the inputs are touched."""
    monkeypatch.delenv(peers.KIT_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    table = {
        ("top_k", "top_p"): {"flashinfer top_k_top_p_sampling_from_logits"},
        ("top_p",): {"flashinfer softmax + top_p_sampling_from_probs"},
        ("top_k",): {"flashinfer softmax + top_k_sampling_from_probs"},
        ("min_p",): {"flashinfer softmax + min_p_sampling_from_probs"},
        (): {"flashinfer sampling_from_logits", "flashinfer softmax + sampling_from_probs"},
        ("min_p", "top_k"): set(),
    }
    for filters, names in table.items():
        assert set(peers.sampling_peers("sample", filters)) == names, filters
    assert set(peers.sampling_peers("sample", ("top_p", "top_k"))) == table[("top_k", "top_p")]
    assert set(peers.sampling_peers("top_p_renorm_probs")) == {"flashinfer top_p_renorm_probs"}
    assert set(peers.sampling_peers("rejection_sample")) == {"flashinfer chain_speculative_sampling"}
    with pytest.raises(ValueError, match="filters"):
        peers.sampling_peers("sample", ("top_a",))
    for op, filters in (("top_p_renorm_probs", ()), ("rejection_sample", ()), ("sample", ("top_p",))):
        for factory in peers.sampling_peers(op, filters).values():
            with pytest.raises(peers.Absent, match="flashinfer"):
                factory(None, None)
    _recording_flashinfer(monkeypatch, "min_p_sampling_from_probs")
    with pytest.raises(peers.Absent, match="no sampling.min_p_sampling_from_probs"):
        peers.sampling_peers("sample", ("min_p",))["flashinfer softmax + min_p_sampling_from_probs"](None, None)


def test_chapter_10_s_flashinfer_calls_take_the_op_s_tensors_and_seed_offset(fresh, monkeypatch):
    """Each FlashInfer call as the docstring says: logits divided by the per-row T (or FlashInfer's
    softmax with temperature=T), the op's per-row parameter tensors, seed and offset as one-element
    views of seed_offset, top-k before top-p; chain_speculative_sampling's (tokens, accepted alone,
    emitted) returned as the op's (tokens, num_accepted = emitted)."""
    calls = _recording_flashinfer(monkeypatch)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = np.array([0.5, 2.0], np.float32)
    top_k, top_p, min_p = np.array([2, 2], np.int32), np.array([0.9, 0.9], np.float32), np.zeros(2, np.float32)
    seed_offset = np.array([123, 68], np.int64)
    ins = [x, t, top_k, top_p, min_p, seed_offset]

    def seeded(kwargs):
        return (kwargs["seed"].tolist() == [123] and kwargs["offset"].tolist() == [68]
                and np.shares_memory(kwargs["seed"], seed_offset)
                and np.shares_memory(kwargs["offset"], seed_offset))

    (factory,) = peers.sampling_peers("sample", ("top_k", "top_p")).values()
    assert factory(None, ins)() == ("top_k_top_p_sampling_from_logits",)
    ((_, args, kwargs),) = calls
    assert np.array_equal(args[0], x / t[:, None]) and args[1] is top_k and args[2] is top_p
    assert kwargs.pop("filter_apply_order") == "top_k_first" and seeded(kwargs)
    for filters, param in ((("top_p",), top_p), (("top_k",), top_k), (("min_p",), min_p)):
        calls.clear()
        (factory,) = peers.sampling_peers("sample", filters).values()
        name = f"{filters[0]}_sampling_from_probs"
        assert factory(None, ins)() == (name,)
        (softmax, sampled) = calls
        assert softmax[0] == "softmax" and softmax[1][0] is x and softmax[2] == {"temperature": t}
        assert sampled[0] == name and sampled[1][0] == "probs" and sampled[1][1] is param and seeded(sampled[2])
    calls.clear()
    for factory in peers.sampling_peers("sample", ()).values():
        factory(None, ins)()
    assert [c[0] for c in calls] == ["sampling_from_logits", "softmax", "sampling_from_probs"]
    assert np.array_equal(calls[0][1][0], x / t[:, None]) and calls[2][1] == ("probs",)
    assert seeded(calls[0][2]) and seeded(calls[2][2])
    calls.clear()
    probs = np.full((2, 3), 1 / 3, np.float32)
    assert peers.sampling_peers("top_p_renorm_probs")["flashinfer top_p_renorm_probs"](None, [probs, top_p])() == (
        "top_p_renorm_probs",)
    assert calls[0][1][0] is probs and calls[0][1][1] is top_p
    q, drafts, p = np.zeros((2, 4, 3), np.float32), np.zeros((2, 4), np.int32), np.zeros((2, 5, 3), np.float32)
    chain = peers.sampling_peers("rejection_sample")["flashinfer chain_speculative_sampling"]
    assert chain(None, [q, drafts, p, seed_offset])() == ("tokens", "emitted")
    assert all(a is b for a, b in zip(calls[-1][1], (q, drafts, p), strict=True)) and seeded(calls[-1][2])

