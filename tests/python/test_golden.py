"""lkw.golden: the manifest the C++ tests read, the files it lists, the expected outputs, and the
seed that makes a run repeatable."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lkw import elementwise, formats, golden

REPO = Path(__file__).resolve().parents[2]
SEED = 1234

# Chapter 02's ops, as the C++ registry names them.
DEQUANT_OPS = (
    *("int4_f16", "int4_bf16", "int4i_f16", "int4i_bf16", "int4i_zp_f16", "int4i_zp_bf16"),
    *("int8_f16", "e4m3_f16", "e4m3_bf16"),
)
# Chapters 03 and 04.
QUANT_OPS = ("per_token_fp8", "per_token_int8", "per_tensor_fp8", "per_group_fp8")
NORM_OPS = ("rmsnorm", "fused_add_rmsnorm", "fused_add_rmsnorm_fp8", "fused_add_rmsnorm_int8",
            "fused_add_rmsnorm_fp8_group")
# The contract with the C++ side: every case id and its op.
EXPECTED_CASES = {
    "00_roofline": {
        **{f"copy_n{n}": "copy" for n in (1, 7, 4099, 65536, 1000003)},
        "gemm_m64_n128_k256": "gemm_bf16",
        "gemm_m33_n77_k130": "gemm_bf16",
    },
    "01_formats": {
        "f32_to_bf16_special": "f32_to_bf16",
        "f32_to_bf16_neighbourhood": "f32_to_bf16",
        "f32_to_bf16_random_n1000003": "f32_to_bf16",
        "bf16_to_f32_all_codes": "bf16_to_f32",
        "bf16_to_f32_random_n777": "bf16_to_f32",
        **{f"f32_to_{f}_special": f"f32_to_{f}" for f in ("e4m3", "e5m2")},
        **{f"f32_to_{f}_random_n1000003": f"f32_to_{f}" for f in ("e4m3", "e5m2")},
        **{f"{f}_to_bf16_all_codes": f"{f}_to_bf16" for f in ("e4m3", "e5m2")},
        **{f"{f}_to_bf16_random_n100003": f"{f}_to_bf16" for f in ("e4m3", "e5m2")},
    },
    "02_int4_dequant": {
        **{f"{op}_n64_k1024_g128": op for op in DEQUANT_OPS},
        **{f"{op}_tail_n3_k96_g32": op for op in DEQUANT_OPS if "_zp_" not in op},
        **{f"{op}_tail_n5_k256_g32": op for op in ("int4i_zp_f16", "int4i_zp_bf16")},
        **{f"{op}_wide_n16_k512_g64": op for op in DEQUANT_OPS},
        **{
            f"{op}_exhaustive_n256_k2048_g128": op
            for op in ("int4_f16", "int4_bf16", "int4i_f16", "int4i_bf16")
        },
        **{f"{op}_all_zq_n16_k256_g32": op for op in ("int4i_zp_f16", "int4i_zp_bf16")},
        "int8_f16_all_bytes_n8_k256_g128": "int8_f16",
        **{f"{op}_all_codes_n8_k256_g128": op for op in ("e4m3_f16", "e4m3_bf16")},
    },
    "03_dynamic_quant": {
        **{
            f"{op}_{tag}t{t}_d{d}": op
            for op in QUANT_OPS
            for tag, t, d in (
                ("", 1, 128),
                ("", 5, 5120),
                ("", 64, 4096),
                ("outliers_", 64, 4096),
                ("zero_row_", 5, 4096),
            )
        },
        **{f"{op}_tail_t5_d203": op for op in QUANT_OPS if op != "per_group_fp8"},
        "per_token_fp8_ub_t5_d4096": "per_token_fp8",
        "per_group_fp8_row_major_t40_d5120": "per_group_fp8",
    },
    "04_rmsnorm": {
        **{
            f"{op}_{tag}t{t}_d{d}": op
            for op in NORM_OPS
            if op != "fused_add_rmsnorm_fp8_group"
            for tag, t, d in (
                ("", 1, 4096),
                ("", 5, 5120),
                ("", 64, 4096),
                ("", 64, 128),
                ("tail_", 5, 203),
                ("small_", 5, 4096),
            )
        },
        # d a multiple of 128 (1 x 128 groups), odd T, the row routine's longest row
        **{
            f"fused_add_rmsnorm_fp8_group_{tag}t{t}_d{d}": "fused_add_rmsnorm_fp8_group"
            for tag, t, d in (
                ("", 1, 4096),
                ("", 3, 128),
                ("", 17, 5120),
                ("", 64, 4096),
                ("small_", 5, 4096),
                ("", 3, 32768),
            )
        },
    },
}
# ... and every op's input and output dtypes, as the manifest names them.
EXPECTED_SIGNATURES = {
    "copy": (["uint32"], ["uint32"]),
    "gemm_bf16": (["bfloat16", "bfloat16"], ["bfloat16"]),
    "f32_to_bf16": (["float32"], ["bfloat16"]),
    "bf16_to_f32": (["bfloat16"], ["float32"]),
    "f32_to_e4m3": (["float32"], ["float8_e4m3fn"]),
    "f32_to_e5m2": (["float32"], ["float8_e5m2"]),
    "e4m3_to_bf16": (["float8_e4m3fn"], ["bfloat16"]),
    "e5m2_to_bf16": (["float8_e5m2"], ["bfloat16"]),
    **{op: (["uint32", "float16"], ["float16"]) for op in ("int4_f16", "int4i_f16")},
    **{op: (["uint32", "bfloat16"], ["bfloat16"]) for op in ("int4_bf16", "int4i_bf16")},
    "int4i_zp_f16": (["uint32", "float16", "uint32"], ["float16"]),
    "int4i_zp_bf16": (["uint32", "bfloat16", "uint32"], ["bfloat16"]),
    "int8_f16": (["uint8", "float16"], ["float16"]),
    "e4m3_f16": (["float8_e4m3fn", "float16"], ["float16"]),
    "e4m3_bf16": (["float8_e4m3fn", "bfloat16"], ["bfloat16"]),
    **{op: (["bfloat16"], ["float8_e4m3fn", "float32"]) for op in QUANT_OPS if "fp8" in op},
    "per_token_int8": (["bfloat16"], ["int8", "float32"]),
    "rmsnorm": (["bfloat16", "bfloat16"], ["bfloat16"]),
    "fused_add_rmsnorm": (["bfloat16"] * 3, ["bfloat16", "bfloat16"]),
    "fused_add_rmsnorm_fp8": (["bfloat16"] * 3, ["float8_e4m3fn", "float32", "bfloat16"]),
    "fused_add_rmsnorm_int8": (["bfloat16"] * 3, ["int8", "float32", "bfloat16"]),
    "fused_add_rmsnorm_fp8_group": (["bfloat16"] * 3, ["float8_e4m3fn", "float32", "bfloat16"]),
}
# Cases whose inputs do not depend on the seed.
FIXED_CASES = re.compile(r".*_(special|all_codes)$")


RECORDS = ("in", "init", "out")  # a case's tensor records, in this order


def parse_manifest(path: Path) -> tuple[dict, list[dict]]:
    """Reads a manifest as strictly as the C++ reader should: header, then case records each
    followed by its in records, then its init records (initial contents of outputs updated in
    place), then its out records, each kind with indices 0, 1, ..."""
    lines = path.read_text().splitlines()
    header = re.fullmatch(r"# lkw golden v1 chapter=(\w+) seed=(\d+)", lines[0])
    assert header, f"bad header: {lines[0]!r}"
    cases = []
    for line in lines[1:]:
        fields = line.split()
        assert len(fields) == 5, f"not 5 fields: {line!r}"
        kind, case_id = fields[:2]
        if kind == "case":
            _, _, op, tolerance, params = fields
            assert re.fullmatch(r"[a-z0-9_]+", case_id)
            one = r"exact|ulp:\d+|close:[0-9.e+-]+:[0-9.e+-]+|multiset:\d+:\d+|frob:[0-9.e+-]+"
            assert re.fullmatch(rf"({one})(/({one}))*", tolerance), tolerance
            assert params == "-" or re.fullmatch(r"\w+=[^,=]+(,\w+=[^,=]+)*", params)
            case = {"id": case_id, "op": op, "tolerance": tolerance, "params": params}
            cases.append({**case, "in": [], "init": [], "out": []})
        else:
            assert kind in RECORDS, line
            assert cases and cases[-1]["id"] == case_id, f"record outside its case: {line!r}"
            later = RECORDS[RECORDS.index(kind) + 1 :]
            assert not any(cases[-1][k] for k in later), f"{kind} after {later}: {line!r}"
            index, dtype, file = int(fields[2]), fields[3], fields[4]
            assert index == len(cases[-1][kind]), f"index out of order: {line!r}"
            assert file == f"{case_id}.{kind}{index}.npy"
            cases[-1][kind].append((dtype, path.parent / file))
    for case in cases:
        # An init record is the initial contents of the output of its index: the same dtype.
        assert len(case["init"]) <= len(case["out"]), case["id"]
        for (init_dtype, _), (out_dtype, _) in zip(case["init"], case["out"], strict=False):
            assert init_dtype == out_dtype, case["id"]
    return {"chapter": header[1], "seed": int(header[2])}, cases


def load(file: Path) -> np.ndarray:
    """Loads a .npy, checking the header the C++ reader relies on: C order, little endian."""
    with open(file, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }[version]
        _, fortran_order, dtype = read_header(f)
    assert not fortran_order and dtype.str[0] in "<|", f"{file}: {dtype.str}, {fortran_order}"
    return np.load(file)


def raw_bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def chapter_files(root: Path, chapter: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / chapter).iterdir())}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One run of the command line, as the build runs it."""
    out = tmp_path_factory.mktemp("golden")
    env = {**os.environ, "PYTHONPATH": str(REPO / "reference")}
    env.pop("LKW_SEED", None)
    cmd = [sys.executable, "-m", "lkw.golden", "--out", str(out), "--seed", str(SEED)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return out, run.stdout


@pytest.fixture(scope="module")
def manifests(written):
    return {
        chapter: parse_manifest(written[0] / chapter / "manifest.txt")
        for chapter in golden.CHAPTERS
    }


def test_prints_the_seed(written):
    assert written[1].splitlines()[0] == f"lkw.golden: seed {SEED} (set LKW_SEED to repeat)"


@pytest.mark.parametrize("chapter", list(EXPECTED_CASES))
def test_manifest_lists_the_contracted_cases(manifests, chapter):
    header, cases = manifests[chapter]
    assert header == {"chapter": chapter, "seed": SEED}
    assert {c["id"]: c["op"] for c in cases} == EXPECTED_CASES[chapter]
    assert len({c["id"] for c in cases}) == len(cases), "duplicate case ids"


def dequant_shapes(case_id: str, op: str) -> tuple[list[tuple], tuple]:
    """Input and output shapes of a dequant case from its id (_nN_kK_gG): weights [N, K/8]
    words or [N, K] bytes, scales [N, K/G], zero points [N, K/G/8]; output [N, K]."""
    n, k, g = map(int, re.search(r"_n(\d+)_k(\d+)_g(\d+)$", case_id).groups())
    weights = (n, k // 8) if op.startswith("int4") else (n, k)
    zeros = [(n, k // g // 8)] if "_zp_" in op else []
    return [weights, (n, k // g), *zeros], (n, k)


def expected_shapes(case_id: str, op: str) -> list[tuple]:
    """Input shapes from the case id: _nN, _mM_nN_kK, _nN_kK_gG, all 2^16 or 256 codes,
    2^16 x 5."""
    if op in DEQUANT_OPS:
        return dequant_shapes(case_id, op)[0]
    if m := re.search(r"_t(\d+)_d(\d+)$", case_id):  # chapters 03, 04: x, [residual,] weight
        t, d = map(int, m.groups())
        if op in QUANT_OPS:
            return [(t, d)]
        return [(t, d), (d,)] if op == "rmsnorm" else [(t, d), (t, d), (d,)]
    if m := re.search(r"_m(\d+)_n(\d+)_k(\d+)$", case_id):
        m, n, k = map(int, m.groups())
        return [(m, k), (n, k)]
    if m := re.search(r"_n(\d+)$", case_id):
        return [(int(m[1]),)]
    if case_id.endswith("_all_codes"):
        return [(1 << 16,)] if op == "bf16_to_f32" else [(256,)]
    if case_id.endswith("_neighbourhood"):
        return [(5 << 16,)]
    return [None]  # the _special lists: any length


@pytest.mark.parametrize("chapter", list(EXPECTED_CASES))
def test_files_have_the_declared_dtypes_and_shapes(manifests, chapter):
    for case in manifests[chapter][1]:
        signature = [d for d, _ in case["in"]], [d for d, _ in case["out"]]
        assert signature == EXPECTED_SIGNATURES[case["op"]], case["id"]
        inputs = [load(f) for _, f in case["in"]]
        outputs = [load(f) for _, f in case["out"]]
        for (dtype, _), array in zip(case["in"] + case["out"], inputs + outputs, strict=True):
            assert array.dtype == golden.DTYPES[dtype][0], f"{case['id']}: {dtype} as {array.dtype}"
        for want, array in zip(expected_shapes(case["id"], case["op"]), inputs, strict=True):
            assert want is None or array.shape == want, f"{case['id']}: {array.shape}"
        if case["op"] == "gemm_bf16":
            assert outputs[0].shape == (inputs[0].shape[0], inputs[1].shape[0])
        elif case["op"] in DEQUANT_OPS:
            assert outputs[0].shape == dequant_shapes(case["id"], case["op"])[1], case["id"]
        else:
            assert outputs[0].shape == inputs[0].shape, case["id"]
        if case["op"] == "fused_add_rmsnorm_fp8_group":  # scales [d/128, T], column-major
            t, d = inputs[0].shape
            assert outputs[1].shape == (d // 128, t), case["id"]


@pytest.mark.parametrize("chapter", [*EXPECTED_CASES, "05_elementwise", "10_sampling"])
def test_expected_outputs_are_the_references(manifests, chapter):
    for case in manifests[chapter][1]:
        inputs = [load(f) for _, f in case["in"]]
        init = [load(f) for _, f in case["init"]]
        outputs = [load(f) for _, f in case["out"]]
        params = golden.parse_params(case["params"])
        recomputed = golden.reference(case["op"], inputs, params, init)
        assert len(recomputed) == len(outputs), case["id"]
        for want, got in zip(recomputed, outputs, strict=True):
            assert want.shape == got.shape, case["id"]
            assert np.array_equal(raw_bits(want), raw_bits(got)), case["id"]


@pytest.mark.parametrize("chapter", list(EXPECTED_CASES))
def test_no_input_is_all_zeros(manifests, chapter):
    for case in manifests[chapter][1]:
        for dtype, file in case["in"]:
            assert np.any(golden.values(dtype, load(file)) != 0), f"{case['id']}: {file.name}"


def test_tolerances(manifests):
    for chapter in EXPECTED_CASES:
        for case in manifests[chapter][1]:
            if case["op"] == "gemm_bf16":
                rtol, atol = map(float, case["tolerance"].split(":")[1:])
                assert rtol == 1.6e-2 and 0 < atol < 1e-2, case["tolerance"]
            elif case["op"] in NORM_OPS:
                assert case["tolerance"] == golden.NORM_TOLERANCES[case["op"]], case["id"]
                tolerances = case["tolerance"].split("/")
                assert len(tolerances) in (1, len(case["out"])), case["id"]
                if case["op"] != "rmsnorm":
                    assert tolerances[-1] == "exact", "residual_out is exact"
            else:
                assert case["tolerance"] == "exact", case["id"]


def test_dequant_cases_carry_their_group_size(manifests):
    """Every chapter-02 case names G in its params, and G is K / (groups per row) of its files."""
    for case in manifests["02_int4_dequant"][1]:
        g = int(re.search(r"_g(\d+)$", case["id"])[1])
        assert case["params"] == f"group_size={g}", case["id"]
        assert g in (32, 64, 128)
        weights, scales = (load(f) for _, f in case["in"][:2])
        k = weights.shape[1] * (8 if case["op"].startswith("int4") else 1)
        assert k == g * scales.shape[1], case["id"]


def test_special_cases_hold_the_edges(manifests):
    """The special inputs contain what the chapter's text promises: signed zeros, Inf, several
    NaN payloads, ties, and values beyond the FP8 maximum."""
    files = {c["id"]: c["in"][0][1] for c in manifests["01_formats"][1]}
    bf16_special = raw_bits(load(files["f32_to_bf16_special"]))
    for bits in (0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x3F808000, 0x3F818000):
        assert bits in bf16_special, hex(bits)
    assert len(set(bf16_special[np.isnan(load(files["f32_to_bf16_special"]))])) >= 4
    for name, max_finite in (("e4m3", formats.E4M3_MAX), ("e5m2", formats.E5M2_MAX)):
        x = load(files[f"f32_to_{name}_special"])
        assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()
        assert (x > max_finite).sum() >= 5 and (x < -max_finite).sum() >= 5
        assert (np.abs(x[np.isfinite(x)]) < np.finfo(np.float32).tiny).sum() > 4  # subnormals


def test_same_seed_same_files(written, tmp_path, capsys):
    golden.main(["--out", str(tmp_path), "--seed", str(SEED)])
    for chapter in golden.CHAPTERS:
        assert chapter_files(tmp_path, chapter) == chapter_files(written[0], chapter)


def test_other_seed_other_random_cases(written, manifests, tmp_path, capsys):
    golden.main(["--out", str(tmp_path), "--seed", str(SEED + 1)])
    for chapter in golden.CHAPTERS:
        for case in manifests[chapter][1]:
            name = f"{case['id']}.in0.npy"
            same = (tmp_path / chapter / name).read_bytes() == (
                written[0] / chapter / name
            ).read_bytes()
            assert same == bool(FIXED_CASES.match(case["id"])), case["id"]


def test_one_chapter_alone_gets_the_same_data(written, tmp_path, capsys):
    golden.main(["--out", str(tmp_path), "--seed", str(SEED), "--chapter", "01_formats"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_formats"]
    assert chapter_files(tmp_path, "01_formats") == chapter_files(written[0], "01_formats")


def test_seed_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LKW_SEED", "77")
    golden.main(["--out", str(tmp_path), "--chapter", "00_roofline"])
    assert "lkw.golden: seed 77 (set LKW_SEED to repeat)" in capsys.readouterr().out
    assert parse_manifest(tmp_path / "00_roofline" / "manifest.txt")[0]["seed"] == 77


def test_fresh_seed_is_printed_and_repeats(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("LKW_SEED", raising=False)
    seeds = []
    for run in ("a", "b"):
        golden.main(["--out", str(tmp_path / run), "--chapter", "00_roofline"])
        seeds.append(int(re.search(r"seed (\d+)", capsys.readouterr().out)[1]))
    assert seeds[0] != seeds[1]
    golden.main(
        ["--out", str(tmp_path / "again"), "--seed", str(seeds[0]), "--chapter", "00_roofline"]
    )
    assert chapter_files(tmp_path / "again", "00_roofline") == chapter_files(
        tmp_path / "a", "00_roofline"
    )


def test_writer_refuses_cases_the_cpp_side_would_misread():
    ones = np.ones(4, np.uint32)
    bad = [
        golden.Case("Copy-1", "copy", "exact", [ones]),  # id outside [a-z0-9_]
        golden.Case("copy_1", "copy", "close:1e-2", [ones]),  # tolerance lacks ATOL
        golden.Case("copy_1", "copy", "exact", [np.zeros(4, np.uint32)]),  # all zeros
        golden.Case("copy_1", "copy", "exact", [ones.astype(np.int64)]),  # not stored as uint32
        golden.Case("cast_1", "f32_to_bf16", "exact", [np.full(4, -0.0, np.float32)]),  # -0 is zero
    ]
    for case in bad:
        with pytest.raises(ValueError):
            golden.check_case(case, golden.expected_outputs(case))


def gemm_error_within_tolerance(got: np.ndarray, ref: np.ndarray, tolerance: str) -> np.ndarray:
    """The C++ rule: |got - ref| <= atol + rtol * |ref|, elementwise on BF16 bits."""
    rtol, atol = map(float, tolerance.split(":")[1:])
    g, r = formats.bf16_to_f32(got).astype(np.float64), formats.bf16_to_f32(ref).astype(np.float64)
    return np.abs(g - r) <= atol + rtol * np.abs(r)


def test_gemm_tolerance_passes_fp32_accumulation_and_catches_a_dropped_term(rng):
    m, n, k = 64, 128, 1024
    a = formats.f32_to_bf16(rng.standard_normal((m, k), np.float32))  # (M,K)
    b = formats.f32_to_bf16(rng.standard_normal((n, k), np.float32))  # (N,K)
    tolerance = golden.gemm_bf16_tolerance(a, b)
    ref = golden.OPS["gemm_bf16"].fn(a, b)
    a32, b32 = formats.bf16_to_f32(a), formats.bf16_to_f32(b)
    # What a kernel computes: FP32 sums, in K order and in BLAS's own order, rounded to BF16.
    sequential = np.zeros((m, n), np.float32)
    for kk in range(k):
        sequential += np.outer(a32[:, kk], b32[:, kk])  # BF16 x BF16 is exact in FP32
    for acc in (sequential, a32 @ b32.T):
        assert gemm_error_within_tolerance(formats.f32_to_bf16(acc), ref, tolerance).all()
    dropped = formats.f32_to_bf16(a32[:, :-1] @ b32[:, :-1].T)  # a loop that stops one short
    assert not gemm_error_within_tolerance(dropped, ref, tolerance).all()


def test_gemm_tolerance_passes_the_accumulation_error_of_outputs_that_cancel(rng):
    """A = [X, -X], B = [Y, Y]: every exact output is 0, and an FP32 kernel returns only its
    rounding error, which ATOL alone must cover."""
    m, n, half = 64, 128, 512
    x = formats.f32_to_bf16(rng.standard_normal((m, half), np.float32))
    y = formats.f32_to_bf16(rng.standard_normal((n, half), np.float32))
    a, b = np.hstack([x, x ^ np.uint16(0x8000)]), np.hstack([y, y])  # (M,K), (N,K)
    tolerance = golden.gemm_bf16_tolerance(a, b)
    ref = golden.OPS["gemm_bf16"].fn(a, b)
    assert not np.any(formats.bf16_to_f32(ref))
    a32, b32 = formats.bf16_to_f32(a), formats.bf16_to_f32(b)
    sequential = np.zeros((m, n), np.float32)
    for kk in range(2 * half):
        sequential += np.outer(a32[:, kk], b32[:, kk])
    assert np.any(sequential), "the FP32 sum should leave some rounding error"
    assert gemm_error_within_tolerance(formats.f32_to_bf16(sequential), ref, tolerance).all()


def test_a_new_chapter_is_one_table_entry(tmp_path, monkeypatch, capsys):
    """A chapter registered in CHAPTERS is written like the others, params included."""

    def cases(rng):
        words = rng.integers(1, 2**32, 5, dtype=np.uint32)
        return [golden.Case("copy_params", "copy", "ulp:1", [words], {"eps": 1e-6, "group": 128})]

    monkeypatch.setitem(golden.CHAPTERS, "99_example", cases)
    golden.main(["--out", str(tmp_path), "--seed", "5", "--chapter", "99_example"])
    lines = (tmp_path / "99_example" / "manifest.txt").read_text().splitlines()
    assert lines[1] == "case copy_params copy ulp:1 eps=1e-06,group=128"
    assert parse_manifest(tmp_path / "99_example" / "manifest.txt")[1][0]["out"]


# ------------------------------------------------------------------------------------------------
# The init record: outputs updated in place (chapter 05's KV caches) start from given contents.


def _cache_case(case_id="cache_init", t=3, hk=2, d=8, blocks=2, block_size=4):
    """A small reshape_and_cache case on the paged layout, caches poisoned, one padding token."""
    rng = np.random.default_rng(11)
    key = elementwise.heads(rng, t, hk, d)
    value = elementwise.heads(rng, t, hk, d)
    slots = np.array([5, -1, 2], np.int64)[:t]
    init = list(elementwise.poisoned_caches("paged", blocks, block_size, hk, d, "bfloat16"))
    return golden.Case(
        case_id, "reshape_and_cache", "exact", [key, value, slots], {"layout": 0}, init
    )


def test_init_records_round_trip_in_in_init_out_order(tmp_path, monkeypatch, capsys):
    """A case with init arrays is written as in, init, out records (the order the C++ reader
    relies on), its init files hold the arrays given, and its out files are the reference of the
    inputs followed by the init arrays."""
    case = _cache_case()
    monkeypatch.setitem(golden.CHAPTERS, "99_init", lambda rng: [case])
    golden.main(["--out", str(tmp_path), "--seed", "5", "--chapter", "99_init"])
    manifest = tmp_path / "99_init" / "manifest.txt"
    kinds = [line.split()[0] for line in manifest.read_text().splitlines()[1:]]
    assert kinds == ["case", "in", "in", "in", "init", "init", "out", "out"]
    assert "init cache_init 1 bfloat16 cache_init.init1.npy" in manifest.read_text().splitlines()
    (parsed,) = parse_manifest(manifest)[1]
    assert [d for d, _ in parsed["init"]] == ["bfloat16", "bfloat16"]
    init = [load(f) for _, f in parsed["init"]]
    for got, given in zip(init, case.init, strict=True):
        assert got.dtype == given.dtype and np.array_equal(got, given)
    outputs = [load(f) for _, f in parsed["out"]]
    inputs = [load(f) for _, f in parsed["in"]]
    want = golden.reference(
        "reshape_and_cache", inputs, golden.parse_params(parsed["params"]), init
    )
    assert all(np.array_equal(a, b) for a, b in zip(outputs, want, strict=True))
    # The padding token's slot and every slot no token names keep the poison.
    assert np.sum(outputs[0] != init[0]) == 2 * 2 * 8  # two tokens, Hk = 2, D = 8
    # Without the init arrays the op has nothing to update.
    with pytest.raises(TypeError):
        golden.reference("reshape_and_cache", inputs, golden.parse_params(parsed["params"]))


def test_init_records_are_refused_when_malformed():
    good = _cache_case()
    golden.check_case(good, golden.expected_outputs(good))
    outputs = golden.expected_outputs(good)
    missing = _cache_case()
    missing.init = missing.init[:1]  # one of two caches
    wrong_dtype = _cache_case()
    wrong_dtype.init = [a.view(np.int16) for a in wrong_dtype.init]  # not stored as uint16
    wrong_shape = _cache_case()
    wrong_shape.init = [a.reshape(a.shape[0], -1) for a in wrong_shape.init]
    ones = np.ones(4, np.uint32)
    not_in_place = golden.Case("copy_1", "copy", "exact", [ones], {}, [ones.copy()])
    for case, out in (
        (missing, outputs),
        (wrong_dtype, outputs),
        (wrong_shape, outputs),
        (not_in_place, [ones]),
    ):
        with pytest.raises(ValueError, match="init"):
            golden.check_case(case, out)


def test_the_manifest_reader_refuses_records_out_of_order(tmp_path, monkeypatch):
    case = _cache_case()
    chapter = tmp_path / "99_init"
    monkeypatch.setitem(golden.CHAPTERS, "99_init", lambda rng: [case])
    golden.write_chapter(tmp_path, "99_init", 1)
    lines = (chapter / "manifest.txt").read_text().splitlines()
    parse_manifest(chapter / "manifest.txt")
    first_init = next(i for i, line in enumerate(lines) if line.startswith("init"))
    swapped = (
        lines[: first_init - 1]
        + [lines[first_init], lines[first_init - 1]]
        + lines[first_init + 1 :]
    )
    (chapter / "manifest.txt").write_text("\n".join(swapped) + "\n")
    with pytest.raises(AssertionError, match="init"):
        parse_manifest(chapter / "manifest.txt")


def test_chapter_05_updates_its_caches_from_init_records(manifests):
    """Every reshape_and_cache and qkv_rope_cache case of the written chapter carries both caches'
    initial contents (and no other op has init records)."""
    for case in manifests["05_elementwise"][1]:
        in_place = case["op"].startswith("reshape_and_cache") or case["op"] == "qkv_rope_cache"
        assert len(case["init"]) == (2 if in_place else 0), case["id"]
        assert golden.OPS[case["op"]].init == len(case["init"])
