"""lkw.fp8_gemm, chapter 08's reference: the scaled GEMM agrees with a slow loop written from the
docstring for each granularity and scale layout (tail N blocks, K not a multiple of 128), shapes
outside the contract are refused, the quantizers are chapter 03's or follow its rounding points
(checked against the integer encoder), the error metric gives hand-computed values, correct
accumulations pass ``check`` while four mutants (a scale from the wrong K block, transposed scale
layouts, promotion without a reset, promotion skipped on one-signed data) fail it, and the byte
and FLOP models give the hand-counted numbers."""

import math

import ml_dtypes
import numpy as np
import pytest
from lkw import formats, fp8_gemm, quant
from lkw.formats import E4M3, encode

GRANULARITIES = fp8_gemm.GRANULARITIES


def e4m3_value(code) -> float:
    """One code's value through ml_dtypes (independent of formats.decode)."""
    return float(np.array([code], np.uint8).view(ml_dtypes.float8_e4m3fn)[0])


def scale_of(granularity, s_a, s_b, m, n, k, row_major=False) -> tuple[float, float]:
    """The scales of A[m, k] and B[n, k], read as the module docstring says."""
    if granularity == "tensor":
        return float(s_a[0]), float(s_b[0])
    if granularity == "rowwise":
        return float(s_a[m, 0]), float(s_b[n, 0])
    kb = k // 128
    return float(s_a[m, kb] if row_major else s_a[kb, m]), float(s_b[n // 128, kb])


def slow_gemm(a, b, s_a, s_b, granularity, row_major=False):
    """y[m, n] = sum_k (a * s_a) (b * s_b), one element at a time with math.fsum; returns the
    sums and sum_k |term| (the scale of the float64 rounding)."""
    (m_rows, k_cols), n_rows = a.shape, b.shape[0]
    av = [[e4m3_value(c) for c in row] for row in a]
    bv = [[e4m3_value(c) for c in row] for row in b]
    y, size = np.zeros((m_rows, n_rows)), np.zeros((m_rows, n_rows))
    for m in range(m_rows):
        for n in range(n_rows):
            terms = []
            for k in range(k_cols):
                sa, sb = scale_of(granularity, s_a, s_b, m, n, k, row_major)
                terms.append((av[m][k] * sa) * (bv[n][k] * sb))  # each factor exact
            y[m, n], size[m, n] = math.fsum(terms), math.fsum(abs(t) for t in terms)
    return y, size


# (M, N, K) per granularity: odd M, N = 144 (a partial second N block), K = 208 (not a multiple of
# 128: the last k block is partial) where the granularity allows it.
SHAPES = {"tensor": (3, 32, 208), "rowwise": (5, 48, 208), "blockwise": (3, 144, 256)}


@pytest.mark.parametrize(
    "granularity,row_major",  # only blockwise A scales have a layout param
    [("tensor", 0), ("rowwise", 0), ("blockwise", 0), ("blockwise", 1)],
)
def test_reference_is_the_slow_loop(rng, granularity, row_major):
    m, n, k = SHAPES[granularity]
    a, s_a = fp8_gemm.quantize_a(fp8_gemm.activations(rng, m, k), granularity, row_major)
    b, s_b = fp8_gemm.quantize_b(fp8_gemm.weights(rng, n, k), granularity)
    ref = fp8_gemm.reference(a, b, s_a, s_b, granularity, row_major)
    want, size = slow_gemm(a, b, s_a, s_b, granularity, row_major)
    assert ref.shape == (m, n) and ref.dtype == np.float64
    assert np.all(np.abs(ref - want) <= 1e-14 * size)  # two float64 sums of the same terms
    y = fp8_gemm.fp8_gemm(a, b, s_a, s_b, granularity, row_major)
    assert y.dtype == np.uint16 and np.array_equal(y, formats.f64_to_bf16(ref))
    named = {
        "tensor": lambda: fp8_gemm.fp8_gemm_tensorwise(a, b, s_a, s_b),
        "rowwise": lambda: fp8_gemm.fp8_gemm_rowwise(a, b, s_a, s_b),
        "blockwise": lambda: fp8_gemm.fp8_gemm_blockwise(a, b, s_a, s_b, row_major),
    }[granularity]
    assert np.array_equal(named(), y)


def test_blockwise_scale_blocks_are_local(rng):
    """A B scale changes the 128 x 128 block it covers and nothing else; the tail block of
    N = 144 covers channels 128..143."""
    m, n, k = 4, 144, 384
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, "blockwise")
    assert s_a.shape == (3, 4) and s_b.shape == (2, 3)
    ref = fp8_gemm.reference(a, b, s_a, s_b, "blockwise")
    for nb, kb in ((1, 2), (0, 0)):
        s = s_b.copy()
        s[nb, kb] *= 2
        diff = fp8_gemm.reference(a, b, s_a, s, "blockwise") - ref
        block = fp8_gemm.dequant_a(a, b, s_a, s_b, "blockwise")[:, 128 * kb : 128 * kb + 128]
        cols = slice(128 * nb, min(128 * nb + 128, n))
        w = fp8_gemm.dequant_b(a, b, s_a, s_b, "blockwise")[cols, 128 * kb : 128 * kb + 128]
        assert np.allclose(diff[:, cols], block @ w.T, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
        others = np.ones(n, bool)
        others[cols] = False
        assert np.all(diff[:, others] == 0)


def test_scale_shapes():
    assert fp8_gemm.scale_shapes(7, 32, 256, "tensor") == ((1,), (1,))
    assert fp8_gemm.scale_shapes(7, 32, 256, "rowwise") == ((7, 1), (32, 1))
    assert fp8_gemm.scale_shapes(7, 2112, 7168, "blockwise") == ((56, 7), (17, 56))
    assert fp8_gemm.scale_shapes(7, 2112, 7168, "blockwise", 1) == ((7, 56), (17, 56))


def test_shapes_outside_the_contract_are_refused(rng):
    def codes(r, c):
        return rng.integers(0, 0x7E, (r, c), dtype=np.uint8)  # finite codes

    for m, n, k, g in [
        (4, 40, 256, "rowwise"),  # N % 16
        (4, 32, 200, "tensor"),  # K % 16
        (4, 32, 144, "blockwise"),  # K % 128
        (0, 32, 256, "tensor"),  # M = 0
        (4, 32, 256, "colwise"),  # no such granularity
    ]:
        with pytest.raises(ValueError):
            fp8_gemm.check_shapes(m, n, k, g)
    a, b = codes(4, 256), codes(32, 256)
    one = np.ones(1, np.float32)
    bad = [
        (a, b, np.ones(4, np.float32), np.ones((32, 1), np.float32), "rowwise"),  # s_a [M]
        (a, b, one, one.astype(np.float64), "tensor"),  # float64 scale
        (a.view(np.int8), b, one, one, "tensor"),  # int8 codes
        (a, codes(32, 128), one, one, "tensor"),  # K differs
        # Row-major A scales [M, K/128] without the param (M = 4 != K/128 = 2).
        (a, b, np.ones((4, 2), np.float32), np.ones((1, 2), np.float32), "blockwise"),
        (a, b, np.ones((2, 4), np.float32), np.ones((2, 1), np.float32), "blockwise"),  # s_b^T
    ]
    for args in bad:
        with pytest.raises(ValueError):
            fp8_gemm.reference(*args)
    with pytest.raises(ValueError):
        fp8_gemm.per_block_fp8(fp8_gemm.weights(rng, 16, 144))
    with pytest.raises(ValueError):
        fp8_gemm.quantize_a(np.zeros((2, 128), np.float32), "tensor")  # values, not BF16 bits


@pytest.mark.parametrize("m", [1, 37])
def test_tail_shapes_are_handled(rng, m):
    """Any M, N a multiple of 16 but not of 128 (DeepSeek-V3's 2112 = 16.5 blocks)."""
    n, k = 2112, 256
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, "blockwise")
    assert s_b.shape == (17, 2)
    a_hat = fp8_gemm.dequant_a(a, b, s_a, s_b, "blockwise")
    b_hat = fp8_gemm.dequant_b(a, b, s_a, s_b, "blockwise")
    # Channel 2111 sits in the 17th (partial) block row.
    col = formats.decode(b[2111], E4M3) * np.repeat(s_b[16].astype(np.float64), 128)
    assert np.array_equal(b_hat[2111], col)
    ref = fp8_gemm.reference(a, b, s_a, s_b, "blockwise")
    assert np.allclose(ref, a_hat @ b_hat.T, rtol=0, atol=1e-12 * np.abs(ref).max())


# ---------------------------------------------------------------------------------------------
# Quantizers


def test_activation_quantizers_are_chapter_03s(rng):
    x = fp8_gemm.activations(rng, 9, 384)
    for g, (q, s) in {
        "tensor": quant.per_tensor_fp8(x),
        "rowwise": quant.per_token_fp8(x),
        "blockwise": quant.per_group_fp8(x),
    }.items():
        got_q, got_s = fp8_gemm.quantize_a(x, g)
        assert np.array_equal(got_q, q) and np.array_equal(got_s, s), g
    q, s = fp8_gemm.quantize_a(x, "blockwise", 1)
    assert np.array_equal(s, quant.per_group_fp8(x, 1)[1]) and s.shape == (9, 3)


def test_per_block_fp8_against_the_integer_encoder(rng):
    """scale = max(fp32(absmax / 448), fp32(1 / 229376)) per 128 x 128 block, inv = fp32(1 /
    scale), code = encode(fp32(w * inv)) with formats' integer encoder (x * inv is exact in
    float64: 8-bit times 24-bit significands)."""
    n, k = 144, 256
    w = fp8_gemm.weights(rng, n, k)
    w[128:, 128:] = 0  # an all-zero (partial) block: the minimum scale, codes 0
    q, scales = fp8_gemm.per_block_fp8(w)
    w32 = formats.bf16_to_f32(w)
    assert scales.shape == (2, 2) and scales.dtype == np.float32
    for nb in range(2):
        for kb in range(2):
            block = w32[128 * nb : 128 * nb + 128, 128 * kb : 128 * kb + 128]
            absmax = float(np.abs(block).max())
            scale = max(np.float32(absmax / 448), np.float32(1 / 229376))
            inv = np.float32(1 / np.float64(scale))
            assert scales[nb, kb] == scale
            product = (block.astype(np.float64) * np.float64(inv)).astype(np.float32)
            want = encode(product, E4M3, saturate=True)
            assert np.array_equal(q[128 * nb : 128 * nb + 128, 128 * kb : 128 * kb + 128], want)
    assert scales[1, 1] == quant.MIN_SCALE and not np.any(q[128:, 128:])


def test_weight_quantizers_per_tensor_and_channel(rng):
    w = fp8_gemm.weights(rng, 48, 256)
    assert all(
        np.array_equal(u, v)
        for u, v in zip(fp8_gemm.quantize_b(w, "tensor"), quant.per_tensor_fp8(w), strict=True)
    )
    assert all(
        np.array_equal(u, v)
        for u, v in zip(fp8_gemm.quantize_b(w, "rowwise"), quant.per_token_fp8(w), strict=True)
    )


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_quantizer_round_trips(rng, granularity):
    """dequant(quantize(x)) is within half an E4M3 step of x (2^-4 relative for normal codes,
    2^-10 times the scale for subnormal ones), and every scale's largest element maps to 448."""
    m, n, k = 24, 160, 512
    x, w = fp8_gemm.activations(rng, m, k), fp8_gemm.weights(rng, n, k)
    a, s_a = fp8_gemm.quantize_a(x, granularity)
    b, s_b = fp8_gemm.quantize_b(w, granularity)
    sa, sb = fp8_gemm.scale_per_block(a, b, s_a, s_b, granularity)
    got_a = fp8_gemm.dequant_a(a, b, s_a, s_b, granularity)
    got_b = fp8_gemm.dequant_b(a, b, s_a, s_b, granularity)
    for codes, scales, orig, rows, got in ((a, sa, x, m, got_a), (b, sb, w, n, got_b)):
        want = formats.bf16_to_f32(orig).astype(np.float64)
        s = np.repeat(scales.astype(np.float64), 128, axis=1)
        half_step = np.maximum(2.0**-4 * np.abs(want), 2.0**-10 * s)
        slack = 1 + 2.0**-16  # the FP32 product x * inv and the rounded reciprocal
        assert np.all(np.abs(got - want) <= slack * half_step)
        values = np.abs(formats.decode(codes, E4M3))
        # Every scale group holds a 448: the tensor, each row, each block.
        if granularity == "tensor":
            assert values.max() == 448
        elif granularity == "rowwise":
            assert np.all(values.max(axis=1) == 448)
        else:
            height = 1 if rows == m else 128
            groups = -(-rows // height)
            padded = np.zeros((groups * height, k))
            padded[:rows] = values
            assert np.all(padded.reshape(groups, height, k // 128, 128).max(axis=(1, 3)) == 448)


def test_outliers_hurt_per_tensor_most(rng):
    """E4M3 is a floating format: a coarser scale costs nothing until values leave its normal
    range, so norm-wise errors barely tell granularities apart (chapter 03 measured the same).
    What per-tensor scaling loses is the small token: with one outlier of 2^12 setting the scale
    (2^12 / 448 ~ 9), a token whose largest element is 2^-6 lands at E4M3's smallest subnormal
    (2^-9) and below, and its output row is mostly gone; its own scale (2^-6 / 448, above
    MIN_SCALE) keeps it at FP8's usual few percent."""
    m, n, k = 16, 64, 1024
    x32 = formats.bf16_to_f32(fp8_gemm.activations(rng, m, k, outliers=0))
    x32[3] *= 2.0**-6 / np.abs(x32[3]).max()
    x32[0, 5] = 2.0**12
    x = formats.f32_to_bf16(x32)
    x32 = formats.bf16_to_f32(x)
    w = fp8_gemm.weights(rng, n, k)
    exact = x32.astype(np.float64) @ formats.bf16_to_f32(w).astype(np.float64).T
    row_error = {}
    for g in ("tensor", "rowwise"):
        a, s_a = fp8_gemm.quantize_a(x, g)
        b, s_b = fp8_gemm.quantize_b(w, g)
        y = fp8_gemm.reference(a, b, s_a, s_b, g)
        row_error[g] = np.linalg.norm(y - exact, axis=1) / np.linalg.norm(exact, axis=1)  # (M,)
    assert row_error["tensor"][3] > 0.5 and row_error["rowwise"][3] < 0.1
    assert row_error["tensor"].mean() > row_error["rowwise"].mean()


# ---------------------------------------------------------------------------------------------
# The metric, the bound, the comparison


def test_error_metric_on_hand_made_cases():
    def bits(v):
        return formats.f32_to_bf16(np.array(v, np.float32))

    ref = np.array([[3.0, 4.0]])
    assert fp8_gemm.rel_frobenius_error(bits([[3, 4]]), ref) == 0
    assert fp8_gemm.rel_frobenius_error(bits([[3, 5]]), ref) == 0.2  # |(0, 1)| / |(3, 4)|
    assert fp8_gemm.rel_frobenius_error(np.array([[0.0, 0.0]]), ref) == 1  # floats accepted
    ref = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert fp8_gemm.rel_frobenius_error(bits([[1 + 2**-7, 0], [0, 0]]), ref) == 2.0**-7
    # A wrong element among many small ones is not averaged away relative to ||ref||.
    ref = np.full((8, 8), 0.5)
    out = np.full((8, 8), 0.5)
    out[3, 5] = 4.5  # ||out - ref|| = 4, ||ref|| = 0.5 * 8 = 4
    assert fp8_gemm.rel_frobenius_error(bits(out), ref) == 1
    for poison in (np.nan, np.inf):
        bad = bits([[3, poison]])
        assert fp8_gemm.rel_frobenius_error(bad, np.array([[3.0, 4.0]])) == np.inf
        verdict = fp8_gemm.check(bad, np.array([[3.0, 4.0]]), 128)
        assert not verdict.ok and verdict.nonfinite == 1
    with pytest.raises(ValueError):
        fp8_gemm.rel_frobenius_error(bits([[1, 2]]), np.zeros((1, 2)))  # never test on zeros
    with pytest.raises(ValueError):
        fp8_gemm.rel_frobenius_error(bits([[1, 2]]), np.ones((2, 1)))


def test_error_bound_as_a_function_of_k():
    b = fp8_gemm.error_bound
    assert b(128) == 2.0**-8 + 4 * 2 * 2.0**-13 + 8 * math.sqrt(128) * 2.0**-24
    assert b(128, None) == b(128)  # a run of 128 either way
    # Promoted: flat in K (only the FP32 term grows); unpromoted: the TC term grows like sqrt(K).
    assert b(16384) / b(128) < 1.02
    tc = [b(k, None) - 2.0**-8 - 8 * math.sqrt(k) * 2.0**-24 for k in (512, 2048, 8192)]
    assert tc[0] == 4 * 4 * 2.0**-13 and math.isclose(tc[2] / tc[1], 2, rel_tol=1e-9)
    assert b(16384, None) > 3 * b(16384)
    assert b(4096, acc_bits=23) < b(4096)  # more accumulator bits, smaller bound
    with pytest.raises(ValueError):
        b(0)


def test_tc_accumulate_on_hand_made_cases():
    acc = np.float32
    one = np.ones((), np.float32)
    # 2 fraction bits: the largest term 1.0 sets a quantum of 0.25; 0.3 truncates toward zero.
    assert fp8_gemm.tc_accumulate(one, np.array([0.3]), 2) == acc(1.25)
    assert fp8_gemm.tc_accumulate(one, np.array([-0.3]), 2) == acc(0.75)
    # The largest term may be a product: 3 sets a quantum of 0.5, 0.2 vanishes, the sum is 3.
    assert fp8_gemm.tc_accumulate(np.zeros((), np.float32), np.array([3.0, 0.2]), 2) == 3
    # The accumulator is truncated too when a product is larger: 0.375 -> 0.0 at quantum 0.5.
    assert fp8_gemm.tc_accumulate(acc(0.375) * one, np.array([2.0]), 2) == 2
    # Terms on the grid add exactly; with acc_bits None it is an FP32 add of the exact sum.
    assert fp8_gemm.tc_accumulate(acc(1.5) * one, np.array([0.25, -0.125]), 13) == acc(1.625)
    assert fp8_gemm.tc_accumulate(one, np.array([2.0**-30, 2.0**-30]), None) == 1
    # Vectorized over outputs.
    got = fp8_gemm.tc_accumulate(np.ones((2, 3), np.float32), np.full((2, 3, 32), 0.5), 13)
    assert got.shape == (2, 3) and got.dtype == np.float32 and np.all(got == 17)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_correct_kernels_pass(rng, granularity):
    """The reference itself, an FP32 accumulator (acc_bits None) and the tensor-core model
    promoted every 32, 128 k (and, for k-independent scales, never) all pass at K = 4096."""
    m, n, k = 8, 32, 4096
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, granularity)
    ref = fp8_gemm.reference(a, b, s_a, s_b, granularity)
    assert fp8_gemm.check(fp8_gemm.fp8_gemm(a, b, s_a, s_b, granularity), ref, k).ok
    fp32 = fp8_gemm.emulate_fp8_gemm(a, b, s_a, s_b, granularity, 128, acc_bits=None)
    assert fp8_gemm.check(fp32, ref, k).ok
    # An FP32 accumulator rounds almost exactly where the float64 reference rounds.
    assert np.mean(fp32 == fp8_gemm.fp8_gemm(a, b, s_a, s_b, granularity)) > 0.95
    for promote_k in (32, 128):
        out = fp8_gemm.emulate_fp8_gemm(a, b, s_a, s_b, granularity, promote_k)
        verdict = fp8_gemm.check(out, ref, k)
        assert verdict.ok, verdict
    if granularity != "blockwise":
        out = fp8_gemm.emulate_fp8_gemm(a, b, s_a, s_b, granularity, None)
        assert fp8_gemm.check(out, ref, k, promote_k=None).ok
    else:
        for bad in (None, 256, 48):  # blockwise scales force a promotion at a divisor of 128
            with pytest.raises(ValueError):
                fp8_gemm.emulate_fp8_gemm(a, b, s_a, s_b, granularity, bad)


def test_promotion_sweep(rng):
    """The model's promotion experiment: random-signed products stay within the bound with or
    without promotion (unpromoted: its own, larger bound); products of one sign without
    promotion drift far above the promoted bound, more with K -- the "promotion skipped" mutant
    -- while promoted they stay within it."""
    ks = (128, 1024, 4096, 16384)
    for row in fp8_gemm.promotion_sweep(rng, ks, m=8, n=16):
        assert row["promoted"] <= row["bound"], row
        assert row["unpromoted"] <= fp8_gemm.error_bound(row["k"], None), row
    rows = fp8_gemm.promotion_sweep(rng, ks, m=8, n=16, shift=1.0)
    for row in rows:
        assert row["promoted"] <= row["bound"], row
    assert rows[0]["unpromoted"] == rows[0]["promoted"]  # K = 128: one run either way
    assert rows[2]["unpromoted"] > 2 * rows[2]["bound"]  # K = 4096 (DeepSeek: ~2% on Hopper)
    assert rows[3]["unpromoted"] > 2 * rows[2]["unpromoted"]


# ---------------------------------------------------------------------------------------------
# Mutants: what check must reject


def rejected(out, ref, k) -> bool:
    verdict = fp8_gemm.check(out, ref, k)
    return not verdict.ok and verdict.error > 2 * verdict.bound  # far out, not by a hair


def test_mutant_scale_of_the_wrong_k_block(rng):
    m, n, k = 16, 256, 1024
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, "blockwise")
    ref = fp8_gemm.reference(a, b, s_a, s_b, "blockwise")
    assert fp8_gemm.check(fp8_gemm.fp8_gemm(a, b, s_a, s_b, "blockwise"), ref, k).ok
    next_b = np.roll(s_b, -1, axis=1)  # block kb multiplied by block kb + 1's weight scale
    next_a = np.roll(s_a, -1, axis=0)  # ... or by its activation scale (column-major: axis 0)
    for wrong_a, wrong_b in ((s_a, next_b), (next_a, s_b)):
        assert rejected(fp8_gemm.fp8_gemm(a, b, wrong_a, wrong_b, "blockwise"), ref, k)


@pytest.mark.parametrize("m", [20, 4])  # M != K/128, and M == K/128 (a true transpose)
def test_mutant_transposed_scale_layout(rng, m):
    """A kernel reading the column-major A scales [K/128, M] as if they were row-major [M, K/128]
    (same bytes, other index), or the B scales [N/128, K/128] transposed."""
    n, k = 256, 512
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, "blockwise")
    ref = fp8_gemm.reference(a, b, s_a, s_b, "blockwise")
    as_row_major = s_a.reshape(m, k // 128)  # the same memory, indexed [m, kb]
    assert rejected(fp8_gemm.fp8_gemm_blockwise(a, b, as_row_major, s_b, 1), ref, k)
    square = fp8_gemm.problem(rng, m, 512, k, "blockwise")  # s_b [4, 4]: its transpose fits
    ref = fp8_gemm.reference(*square, "blockwise")
    a, b, s_a, s_b = square
    assert rejected(fp8_gemm.fp8_gemm_blockwise(a, b, s_a, np.ascontiguousarray(s_b.T)), ref, k)
    # Per-token scales read from the wrong operand (s_a per column, s_b per row) fail as well.
    a, b, s_a, s_b = fp8_gemm.problem(rng, 32, 32, 256, "rowwise")
    ref = fp8_gemm.reference(a, b, s_a, s_b, "rowwise")
    assert rejected(fp8_gemm.fp8_gemm_rowwise(a, b, s_b, s_a), ref, 256)


def test_mutant_promotion_without_reset(rng):
    """The tensor-core accumulator added into the FP32 one every 128 k but never zeroed: block kb
    contributes s_kb * (P_0 + ... + P_kb)."""
    m, n, k = 8, 128, 512
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, "blockwise")
    ref = fp8_gemm.reference(a, b, s_a, s_b, "blockwise")
    av, bv = formats.decode(a, E4M3), formats.decode(b, E4M3)
    sa, sb = fp8_gemm.scale_per_block(a, b, s_a, s_b, "blockwise")
    running, out = np.zeros((m, n)), np.zeros((m, n))
    for kb in range(k // 128):
        cols = slice(128 * kb, 128 * kb + 128)
        running += av[:, cols] @ bv[:, cols].T
        out += sa[:, kb, None].astype(np.float64) * sb[None, :, kb] * running
    assert rejected(formats.f64_to_bf16(out), ref, k)


# ---------------------------------------------------------------------------------------------
# Models and generators


def test_byte_and_flop_models():
    m, n, k = 64, 2112, 7168
    ab, y = m * k + n * k, 2 * m * n
    assert fp8_gemm.model(m, n, k, "tensor") == (ab + 4 * 2 + y, 2 * m * n * k)
    assert fp8_gemm.model(m, n, k, "rowwise") == (ab + 4 * (m + n) + y, 2 * m * n * k)
    blockwise = ab + 4 * (56 * m + 17 * 56) + y  # A: 56 groups per token; B: 17 x 56 blocks
    assert fp8_gemm.model(m, n, k, "blockwise") == (blockwise, 2 * m * n * k)
    # 8192^3 blockwise: ~1/32 of A's bytes and 1/16384 of B's in scales.
    assert fp8_gemm.scale_bytes(8192, 8192, 8192, "blockwise") == 4 * (64 * 8192 + 64 * 64)
    with pytest.raises(ValueError):
        fp8_gemm.model(64, 2112, 7000, "blockwise")


def test_generators(rng):
    x = fp8_gemm.activations(rng, 16, 512)
    x32 = formats.bf16_to_f32(x)
    assert x.dtype == np.uint16 and x.shape == (16, 512)
    row_rms = np.sqrt(np.mean(x32**2, axis=1))
    assert np.all(np.isfinite(x32)) and row_rms.min() > 0
    # Outliers: a few elements far above their row's typical magnitude.
    typical = np.median(np.abs(x32), axis=1, keepdims=True)
    assert 1 <= np.count_nonzero(np.abs(x32) > 30 * typical) <= 3 * fp8_gemm.OUTLIERS
    assert np.count_nonzero(x32 != formats.bf16_to_f32(fp8_gemm.activations(rng, 16, 512))) > 8000
    w = formats.bf16_to_f32(fp8_gemm.weights(rng, 64, 1024))
    assert abs(np.sqrt(np.mean(w**2)) * math.sqrt(1024) - 1) < 0.5  # ~unit rows before 2^u
    shifted = formats.bf16_to_f32(fp8_gemm.weights(rng, 64, 1024, shift=1.0))
    assert np.mean(shifted > 0) > 0.75
