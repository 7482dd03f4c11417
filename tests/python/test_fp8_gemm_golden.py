"""lkw.golden's chapter 08 cases: the edges they cover, the two ops' reference (the granularity
named by the scale shapes: fp8_gemm takes tensor and rowwise scales, fp8_gemm_blockwise blockwise
ones), the frob:BOUND spelling of their tolerance, a tensor core that accumulates
as lkw.fp8_gemm's model says inside the bound, and kernels with the classic FP8 GEMM bugs far
outside it. The comparison is the C++ harness's: the relative Frobenius error against the golden
BF16 output, computed here in numpy (lkw.fp8_gemm.rel_frobenius_error) and, where the extension
is built with the frob spelling, checked against lkw._ext.compare."""

import re
import zlib

import numpy as np
import pytest
from conftest import SEED
from lkw import formats, fp8_gemm, golden

GOLDEN_ROUNDING = 2.0**-8  # the golden output's own rounding of the float64 product, at most
EMULATED = 1 << 25  # M N K at most, for the tensor-core model (numpy, ~M N K operations)


@pytest.fixture(scope="module")
def cases():
    """The chapter's cases as lkw.golden writes them, from this session's seed (printed)."""
    return golden.fp8_gemm_cases(np.random.default_rng([SEED, zlib.crc32(b"08_fp8_gemm")]))


@pytest.fixture(scope="module")
def outputs(cases):
    return {c.id: golden.expected_outputs(c)[0] for c in cases}


def shape_of(case) -> tuple[str, int, int, int, int]:
    """(granularity, M, N, K, a_scales_row_major) from the case's inputs."""
    a, b, s_a, s_b = case.inputs
    row_major = int(case.params.get("a_scales_row_major", 0))
    m, k, n = a.shape[0], a.shape[1], b.shape[0]
    return fp8_gemm.granularity_of(m, n, k, s_a.shape, s_b.shape, row_major), m, n, k, row_major


def bound_of(case) -> float:
    assert re.fullmatch(r"frob:" + golden.FLOAT, case.tolerance), case.tolerance
    return float(case.tolerance[len("frob:"):])


def error(out, ref_bits) -> float:
    """The harness's measure: ||out - ref|| / ||ref|| against the golden BF16 output."""
    return fp8_gemm.rel_frobenius_error(out, formats.bf16_to_f32(ref_bits))


def exact(case) -> np.ndarray:
    """The float64 product (never rounded) of the case."""
    g, *_, row_major = shape_of(case)
    return fp8_gemm.reference(*case.inputs, g, row_major)


# ---------------------------------------------------------------------------------------------
# The reference of the one op


def test_granularity_of_reads_the_scale_shapes_as_the_cpp_launcher_does():
    assert fp8_gemm.granularity_of(7, 48, 256, (1,), (1,)) == "tensor"
    assert fp8_gemm.granularity_of(7, 48, 256, (7, 1), (48, 1)) == "rowwise"
    assert fp8_gemm.granularity_of(7, 48, 256, (2, 7), (1, 2)) == "blockwise"
    assert fp8_gemm.granularity_of(7, 2112, 256, (7, 2), (17, 2), 1) == "blockwise"
    # M = 1, K = 128: blockwise s_a [1, 1] is rowwise's shape, and s_b [1, 1] tells them apart.
    assert fp8_gemm.granularity_of(1, 16, 128, (1, 1), (1, 1)) == "blockwise"
    assert fp8_gemm.granularity_of(1, 16, 128, (1, 1), (16, 1)) == "rowwise"
    for s_a, s_b, row_major in (
        ((7, 2), (1, 2), 0),  # row-major A scales without the param
        ((2, 7), (1, 2), 1),  # column-major A scales with it
        ((2, 7), (2, 1), 0),  # B scales transposed
        ((7,), (48,), 0),  # per-token scales as vectors
        ((1,), (48, 1), 0),  # a tensor scale beside per-channel ones
    ):
        with pytest.raises(ValueError, match="name no granularity"):
            fp8_gemm.granularity_of(7, 48, 256, s_a, s_b, row_major)
    with pytest.raises(ValueError):  # blockwise scales need K % 128 == 0
        fp8_gemm.granularity_of(7, 48, 208, (1, 7), (1, 1))


@pytest.mark.parametrize("granularity", fp8_gemm.GRANULARITIES)
@pytest.mark.parametrize("row_major", [0, 1])
def test_each_op_is_fp8_gemm_at_the_named_granularity_and_takes_only_its_own(rng, granularity, row_major):
    a, b, s_a, s_b = fp8_gemm.problem(rng, 9, 144, 256, granularity)
    if granularity == "blockwise" and row_major:
        s_a = np.ascontiguousarray(s_a.T)
    want = fp8_gemm.fp8_gemm(a, b, s_a, s_b, granularity, row_major)
    # Golden params arrive as floats; the reference takes them so.
    for flag in (row_major, float(row_major)):
        assert np.array_equal(fp8_gemm.fp8_gemm_any(a, b, s_a, s_b, flag), want)
    own, other = ("fp8_gemm_blockwise", "fp8_gemm")[:: 1 if granularity == "blockwise" else -1]
    params = {"a_scales_row_major": float(row_major)}
    assert np.array_equal(golden.reference(own, [a, b, s_a, s_b], params)[0], want)
    with pytest.raises(ValueError, match="scales where"):
        golden.reference(other, [a, b, s_a, s_b], params)
    with pytest.raises(ValueError):
        fp8_gemm.fp8_gemm_any(a, b, s_a, s_b, 2)


# ---------------------------------------------------------------------------------------------
# The cases


def test_cases_cover_the_edges(cases):
    shapes = [shape_of(c) for c in cases]
    assert len({c.id for c in cases}) == len(cases)
    assert all(re.fullmatch(r"[a-z0-9_]+", c.id) for c in cases)
    ops = {"tensor": "fp8_gemm", "rowwise": "fp8_gemm", "blockwise": "fp8_gemm_blockwise"}
    assert all(c.op == ops[g] for c, (g, *_) in zip(cases, shapes, strict=True))
    by = {g: [s for s in shapes if s[0] == g] for g in fp8_gemm.GRANULARITIES}
    assert all(by.values())
    assert {1, 7, 65, 130, 257} <= {m for _, m, *_ in shapes}
    assert {16, 48, 272, 2112} <= {n for _, _, n, *_ in shapes}
    unblocked = {k for g, _, _, k, _ in shapes if g != "blockwise"}
    assert {16, 48, 208} <= unblocked and any(k % 128 for k in unblocked)
    assert {128, 384, 2048, 16384} <= {k for *_, k, _ in shapes}
    assert all(k % 128 == 0 for _, _, _, k, _ in by["blockwise"])
    assert 16384 in {k for *_, k, _ in by["blockwise"]}  # the promoted path over a long K
    assert {r for *_, r in by["blockwise"]} == {0, 1}
    # Row-major A scales as [M, K/128] of the same shape as the column-major [K/128, M].
    assert any(r and m == k // 128 for _, m, _, k, r in by["blockwise"])
    for g in fp8_gemm.GRANULARITIES:  # whole tiles
        assert (g, 128, 256, 512, 0) in shapes
    assert any("positive" in c.id for c in cases if shape_of(c)[0] == "blockwise")
    assert max(m * n for _, m, n, k, _ in shapes if k == 16384) <= 256  # the long K is small


def test_every_case_passes_the_writers_checks_and_stays_small(cases, outputs):
    total = 0
    for c in cases:
        out = outputs[c.id]
        golden.check_case(c, [out])
        _, m, n, *_ = shape_of(c)
        assert out.dtype == np.uint16 and out.shape == (m, n), c.id
        assert np.all(np.isfinite(formats.bf16_to_f32(out))), c.id
        total += sum(x.nbytes for x in c.inputs) + out.nbytes
    assert total < 7 << 20  # the ctest fixture writes the golden data on every run


def test_the_positive_case_is_mostly_positive_products(cases):
    for c in cases:
        if "positive" in c.id:
            a, b = (formats.decode(x, formats.E4M3) for x in c.inputs[:2])
            assert np.mean(a > 0) > 0.75 and np.mean(b > 0) > 0.75, c.id


def test_blockwise_case_params_name_the_a_scale_layout(cases):
    for c in cases:
        g, m, _, k, row_major = shape_of(c)
        walk = {"max_blocks"} if "walk" in c.id else set()
        if g == "blockwise":
            assert set(c.params) == {"a_scales_row_major"} | walk, c.id
            want = (m, k // 128) if row_major else (k // 128, m)
            assert c.inputs[2].shape == want and c.inputs[2].flags.c_contiguous, c.id
        else:
            assert set(c.params) == walk, c.id


def test_walk_cases_give_each_persistent_block_several_units(cases):
    """The max_blocks cases (golden.FP8_GEMM_WALKS): more 128-row tiles (or, one tile, more K
    blocks than a v5 share's minimum) than blocks, so that a block walks several units."""
    walks = [c for c in cases if "walk" in c.id]
    assert {c.op for c in walks} == {"fp8_gemm", "fp8_gemm_blockwise"}
    for c in walks:
        g, m, n, k, _ = shape_of(c)
        tiles = -(-m // 128) * -(-n // 128)
        units = tiles if tiles > 1 else k // 128 // 4  # v5's shares: at least 4 K blocks each
        assert units > c.params["max_blocks"] >= 1, c.id


# ---------------------------------------------------------------------------------------------
# The tolerance


def test_tolerance_spelling_is_checked():
    ones = np.full((1, 16), 0x38, np.uint8)  # E4M3 1.0
    s = np.ones(1, np.float32)
    for tol, ok in (("frob:0.0073", True), ("frob:7.3e-3", True), ("frob:.5", True),
                    ("frob:", False), ("frob:0", False), ("frob:-1", False), ("frob:x", False),
                    ("frob:0.01:2", False)):
        case = golden.Case("c", "fp8_gemm", tol, [ones, ones.repeat(16, 0), s, s])
        if ok:
            golden.check_case(case, golden.expected_outputs(case))
        else:
            with pytest.raises(ValueError, match="tolerance"):
                golden.check_case(case, golden.expected_outputs(case))


def test_rounding_up_never_tightens_a_bound():
    for x in (0.0068421, 0.0099999, 0.00684, 1.23456e-5, 0.1, 2.0**-9):
        text = golden.round_up(x)
        assert x <= float(text) <= x * (1 + 1e-3), (x, text)
        assert float(text) == float(f"{float(text):.4g}"), text  # four digits at most


def test_the_bound_is_error_bound_plus_the_golden_rounding(cases):
    for c in cases:
        g, _, _, k, _ = shape_of(c)
        want = fp8_gemm.error_bound(k, golden.FP8_PROMOTE_K[g]) + GOLDEN_ROUNDING
        assert want <= bound_of(c) <= want * (1 + 1e-3), c.id


def test_the_reference_itself_is_within_its_bound(cases, outputs):
    """The golden output against itself is 0; the float64 product against it is the rounding
    alone: at most 2^-8 (half an ulp of a value just above a power of two), typically about
    2^-9, which a case of few outputs can exceed."""
    for c in cases:
        assert error(outputs[c.id], outputs[c.id]) == 0
        assert error(exact(c), outputs[c.id]) <= GOLDEN_ROUNDING, c.id
    worst = np.full((1, 16), 1 + 2.0**-8 - 2.0**-20)  # rounds down to 1 by almost 2^-8 of itself
    assert error(worst, formats.f64_to_bf16(worst)) > 2.0**-9


def test_the_tensor_core_model_passes_every_small_case(cases, outputs):
    """lkw.fp8_gemm.emulate_fp8_gemm, the tensor core's truncating accumulation: over the whole K
    for tensor and rowwise scales (v0 to v3), promoted every 128 k (v4, and for blockwise scales
    every version) -- within the case's bound, and with an FP32 accumulator too."""
    checked = set()
    for c in cases:
        g, m, n, k, row_major = shape_of(c)
        if m * n * k > EMULATED:
            continue
        runs = [128] if g == "blockwise" else [None, 128]
        for promote_k in runs:
            out = fp8_gemm.emulate_fp8_gemm(*c.inputs, g, promote_k, a_scales_row_major=row_major)
            assert error(out, outputs[c.id]) <= bound_of(c), (c.id, promote_k)
        fp32 = fp8_gemm.emulate_fp8_gemm(*c.inputs, g, 128, acc_bits=None,
                                         a_scales_row_major=row_major)
        assert error(fp32, outputs[c.id]) <= bound_of(c), c.id
        checked.add(g)
    assert checked == set(fp8_gemm.GRANULARITIES)


# ---------------------------------------------------------------------------------------------
# Mutants: what the bound must reject


def caught(out, c, outputs) -> bool:
    return error(out, outputs[c.id]) > bound_of(c)


def blockwise_scales(c):
    """(A codes, B codes, s_a [M, KB], s_b per channel [N, KB], KB) of a blockwise case."""
    g, *_, row_major = shape_of(c)
    sa, sb = fp8_gemm.scale_per_block(*c.inputs, g, row_major)
    return c.inputs[0], c.inputs[1], sa, sb, sa.shape[1]


def products(a, b, k0=0, k1=None) -> np.ndarray:
    """sum over k in [k0, k1) of A_q B_q, float64 [M, N] (exact: few bits per product)."""
    av = formats.decode(a[:, k0:k1], formats.E4M3)
    bv = formats.decode(b[:, k0:k1], formats.E4M3)
    return av @ bv.T


def test_mutant_scale_of_the_wrong_k_block(cases, outputs):
    """Block kb scaled by block kb + 1's scales (mod K/128), of A or of B: every blockwise case
    of two blocks or more with random-signed products catches both. (Products of one sign make
    every block's code sum alike, and a cyclic shift of the weight scales then nearly keeps
    their total: the "positive" case is not asked to.)"""
    seen = 0
    for c in cases:
        if shape_of(c)[0] != "blockwise" or blockwise_scales(c)[4] < 2 or "positive" in c.id:
            continue
        a, b, sa, sb, kb = blockwise_scales(c)
        for wrong_a, wrong_b in ((np.roll(sa, -1, axis=1), sb), (sa, np.roll(sb, -1, axis=1))):
            y = sum(wrong_a[:, j, None].astype(np.float64) * wrong_b[None, :, j]
                    * products(a, b, 128 * j, 128 * j + 128) for j in range(kb))
            assert caught(formats.f64_to_bf16(y), c, outputs), c.id
        seen += 1
    assert seen >= 5


def test_mutant_promotion_skipped(cases, outputs):
    """Blockwise without promotion: the whole K summed in one accumulator, then scaled once by
    the last block's scales."""
    seen = 0
    for c in cases:
        if shape_of(c)[0] != "blockwise" or blockwise_scales(c)[4] < 2:
            continue
        a, b, sa, sb, _ = blockwise_scales(c)
        y = sa[:, -1, None].astype(np.float64) * sb[None, :, -1] * products(a, b)
        assert caught(formats.f64_to_bf16(y), c, outputs), c.id
        seen += 1
    assert seen >= 5


def test_mutant_row_major_scales_read_as_column_major(cases, outputs):
    """A kernel that ignores a_scales_row_major reads [M, K/128] as [K/128, M] (same bytes)."""
    seen = 0
    for c in cases:
        g, m, _, k, row_major = shape_of(c)
        if g == "blockwise" and row_major and k > 128:
            a, b, s_a, s_b = c.inputs
            misread = s_a.reshape(k // 128, m)
            assert caught(fp8_gemm.fp8_gemm(a, b, misread, s_b, g, 0), c, outputs), c.id
            seen += 1
    assert seen >= 2


def test_mutant_activation_scale_applied_twice(cases, outputs):
    """y = s_a . (s_a s_b . acc). A scale that happens to be ~1 cannot tell once from twice (one
    per tensor, or per token at M = 1: x100 outliers put it anywhere near 448 / 448): the cases
    where the mutation moves the float64 product by less than twice the bound are left out, and
    at least three of each granularity remain and catch it."""
    seen = {g: 0 for g in fp8_gemm.GRANULARITIES}
    for c in cases:
        g, *_, row_major = shape_of(c)
        a, b, s_a, s_b = c.inputs
        twice = (s_a * s_a).astype(np.float32)
        moved = fp8_gemm.rel_frobenius_error(fp8_gemm.reference(a, b, twice, s_b, g, row_major), exact(c))
        if moved <= 2 * bound_of(c):
            continue
        assert caught(fp8_gemm.fp8_gemm(a, b, twice, s_b, g, row_major), c, outputs), c.id
        seen[g] += 1
    assert min(seen.values()) >= 3, seen


def test_mutant_channel_scale_indexed_by_row(cases, outputs):
    """Rowwise: s_b read at the output's row m (mod N) instead of its column n."""
    seen = 0
    for c in cases:
        g, m, n, *_ = shape_of(c)
        if g != "rowwise":
            continue
        a, b, s_a, s_b = c.inputs
        y = s_a.astype(np.float64) * s_b[np.arange(m) % n].astype(np.float64) * products(a, b)
        assert caught(formats.f64_to_bf16(y), c, outputs), c.id
        seen += 1
    assert seen >= 5


# ---------------------------------------------------------------------------------------------
# The harness's own comparison


def test_the_harness_compare_agrees_with_numpy(cases, outputs):
    """lkw._ext.compare (common/lkw/compare.h, the C++ tests' and the bench's comparison) on the
    golden tolerance: the same verdict and error as numpy, a NaN fails."""
    ext = pytest.importorskip("lkw._ext", reason="the extension is built by tools/setup.sh")
    probe = np.zeros(1, np.uint16)
    try:
        ext.compare(probe.ctypes.data, probe.ctypes.data, 1, "bfloat16", "frob:1")
    except ValueError:
        pytest.skip("this build of lkw._ext predates the frob:BOUND spelling: rebuild it")

    def compare(got, ref, tol):
        got, ref = np.ascontiguousarray(got), np.ascontiguousarray(ref)
        return ext.compare(got.ctypes.data, ref.ctypes.data, got.size, "bfloat16", tol)

    for c in cases[:8]:
        g, *_, row_major = shape_of(c)
        ref = outputs[c.id]
        good = fp8_gemm.emulate_fp8_gemm(*c.inputs, g, 128, a_scales_row_major=row_major)
        report = compare(good, ref, c.tolerance)
        assert report["pass"], (c.id, report["text"])
        a, b, s_a, s_b = c.inputs
        bad = fp8_gemm.fp8_gemm(a, b, (s_a * 2).astype(np.float32), s_b, g, row_major)
        report = compare(bad, ref, c.tolerance)
        assert not report["pass"] and "Frobenius" in report["text"], c.id
        said = re.search(r"relative Frobenius error ([0-9.e+-]+)", report["text"])
        assert said and float(said[1]) == pytest.approx(error(bad, ref), rel=1e-5), report["text"]
        poisoned = good.copy()
        poisoned.flat[-1] = 0x7FC0  # NaN
        assert not compare(poisoned, ref, c.tolerance)["pass"], c.id
