"""lkw.gemv, chapter 06's reference: the dequantized weights agree with chapter 02, the GEMV rounds
once, and the tolerance passes what the kernels legitimately do (emulated here in numpy: FP32
sums in their order, weights rounded to BF16 where v3 rounds them) while failing what the mutants
do (a dropped K tail, another group's scale or zero point)."""

import math

import numpy as np
import pytest

from lkw import formats, gemv, golden, int4


def bf16(values) -> np.ndarray:
    return formats.f32_to_bf16(np.asarray(values, np.float32))


def problem(rng, m=4, n=24, k=1024, g=128, zero_points=False):
    """x bits [M, K], interleaved words [N, K/8], scales bits [N, K/G] (and zero-point words)."""
    x = golden.gemv_activations(rng, m, k)
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    scales = golden.dequant_scales(rng, n, k // g, "bfloat16")
    zeros = rng.integers(0, 2**32, (n, k // g // 8), dtype=np.uint32) if zero_points else None
    return x, words, scales, zeros


def within(got: np.ndarray, ref: np.ndarray, tolerance: str) -> np.ndarray:
    """The C++ rule (common/lkw/compare.h): |got - ref| <= atol + rtol * |ref|, on BF16 bits."""
    rtol, atol = map(float, tolerance.split(":")[1:])
    g, r = (formats.bf16_to_f32(a).astype(np.float64) for a in (got, ref))
    return np.abs(g - r) <= atol + rtol * np.abs(r)


def fp32_sum(x32: np.ndarray, w32: np.ndarray, chunk: int) -> np.ndarray:
    """sum_k x w in FP32, as the kernels order it: FP32 partial sums over `chunk` consecutive k
    (one word, one mma group, ...), each added to an FP32 accumulator."""
    acc = np.zeros((x32.shape[0], w32.shape[0]), np.float32)
    for k0 in range(0, x32.shape[1], chunk):
        part = np.zeros_like(acc)
        for k in range(k0, k0 + chunk):
            part += np.outer(x32[:, k], w32[:, k])  # products of BF16 x and weights: exact
        acc += part
    return acc


# ---------------------------------------------------------------------------------------------
# The reference


@pytest.mark.parametrize("interleaved", [False, True])
def test_w_hat_rounded_is_chapter_02s_dequantized_weights(rng, interleaved):
    _, words, scales, _ = problem(rng, g=64)
    w = gemv.w_hat(words, scales, interleaved=interleaved)
    dequant = int4.int4i_bf16 if interleaved else int4.int4_bf16
    assert np.array_equal(formats.f64_to_bf16(w), dequant(words, scales))


def test_w_hat_with_zero_points_is_chapter_02s_contract(rng):
    _, words, scales, zeros = problem(rng, k=2048, g=32, zero_points=True)
    w = gemv.w_hat(words, scales, zeros, interleaved=True)
    assert np.array_equal(formats.f64_to_bf16(w), int4.int4i_zp_bf16(words, scales, zeros))


def test_natural_and_interleaved_ops_agree(rng):
    x, words, scales, _ = problem(rng)
    assert np.array_equal(
        gemv.int4_gemv(x, words, scales), gemv.int4i_gemv(x, int4.interleave(words), scales)
    )


@pytest.mark.parametrize("n,k", [(37, 1152), (16, 256), (1, 352), (48, 4192)])
def test_tiled_layout_round_trips_and_puts_each_step_of_a_tile_together(rng, n, k):
    """int4t_gemv's layout: word j of row r at ((r // 16 * steps + j // 32) * 16 + r % 16) * 32 +
    j % 32; the padding (odd N, K not a multiple of 256) is dropped on the way back whatever it
    holds, and the op equals int4i_gemv on the same words."""
    x, words, scales, _ = problem(rng, m=3, n=n, k=k, g=32)
    tiled = gemv.tile_weights(words)
    steps = -(-k // 256)
    assert tiled.shape == (-(-n // 16) * 16, steps * 32)
    flat = tiled.reshape(-1)
    r, j = rng.integers(0, n, 50), rng.integers(0, k // 8, 50)
    assert np.array_equal(flat[((r // 16 * steps + j // 32) * 16 + r % 16) * 32 + j % 32], words[r, j])
    noise = rng.integers(0, 2**32, tiled.shape, dtype=np.uint32)
    noisy = gemv.tile_weights(words, noise)
    assert np.array_equal(gemv.untile_weights(noisy, n, k), words)
    assert np.array_equal(gemv.int4t_gemv(x, noisy, scales), gemv.int4i_gemv(x, words, scales))
    with pytest.raises(ValueError, match="tiled weights"):
        gemv.untile_weights(tiled[:-1], n, k)  # a row short of whole tiles
    with pytest.raises(ValueError, match="tiled weights"):
        gemv.int4t_gemv(x, tiled[:, :-32], scales)


def test_zero_point_8_is_the_symmetric_op(rng):
    x, words, scales, _ = problem(rng, k=1024, g=128)
    eights = np.full((words.shape[0], 1), 0x88888888, np.uint32)  # K/G = 8 zero points of 8
    assert np.array_equal(
        gemv.int4i_zp_gemv(x, words, scales, eights), gemv.int4i_gemv(x, words, scales)
    )


def test_the_sum_is_exact_and_rounded_once(rng):
    """Every product of a BF16 activation and s * (q - 8) is exact in float64; math.fsum adds
    them exactly; one rounding to BF16 must give the reference's bits."""
    x, words, scales, _ = problem(rng, m=2, n=6, k=256, g=32)
    w = gemv.w_hat(words, scales, interleaved=True)
    x64 = formats.bf16_to_f32(x).astype(np.float64)
    exact = np.array([[math.fsum(x64[i] * w[j]) for j in range(w.shape[0])] for i in range(2)])
    assert np.array_equal(formats.f64_to_bf16(exact), gemv.int4i_gemv(x, words, scales))


def test_bf16_gemv_is_chapter_00s_gemm(rng):
    x = golden.gemv_activations(rng, 3, 512)
    w = bf16(rng.standard_normal((40, 512)) * 0.05)
    assert np.array_equal(gemv.bf16_gemv(x, w), golden.OPS["gemm_bf16"].fn(x, w))


def test_bad_shapes_are_refused(rng):
    x, words, scales, zeros = problem(rng, k=1024, g=128, zero_points=True)
    with pytest.raises(ValueError):
        gemv.w_hat(words, scales[:, :3])  # K / 3 groups is no group size
    with pytest.raises(ValueError):
        gemv.w_hat(words, scales[:5])  # scales of other rows
    with pytest.raises(ValueError):
        gemv.w_hat(words, scales, zeros[:, :0], interleaved=True)
    with pytest.raises(ValueError):
        gemv.gemv(x[:, :512], gemv.w_hat(words, scales))


# ---------------------------------------------------------------------------------------------
# The tolerance


@pytest.mark.parametrize("g", [32, 128])
def test_tolerance_passes_the_kernels_accumulation_orders(rng, g):
    """FP32 sums per word (v0..v2: exact weights), per group with the scale after (v3, G = 128),
    and weights rounded to BF16 first (v3 with G < 128, the peers on dequantized weights)."""
    x, words, scales, _ = problem(rng, m=8, n=32, k=2048, g=g)
    w = gemv.w_hat(words, scales, interleaved=True)
    ref = gemv.int4i_gemv(x, words, scales)
    tol = gemv.tolerance(x, w)
    x32 = formats.bf16_to_f32(x)
    q = int4.unpack(words, interleaved=True).astype(np.float32) - 8  # (N,K)
    s32 = formats.bf16_to_f32(scales)  # (N,K/G)
    per_word = fp32_sum(x32, w.astype(np.float32), 8)
    per_group = np.zeros((8, 32), np.float32)
    for grp in range(s32.shape[1]):
        cols = slice(grp * g, (grp + 1) * g)
        per_group += fp32_sum(x32[:, cols], q[:, cols], g) * s32[:, grp]
    rounded = formats.bf16_to_f32(int4.int4i_bf16(words, scales))
    rounded_weights = fp32_sum(x32, rounded, 16)
    for acc in (per_word, per_group, rounded_weights):
        assert within(formats.f32_to_bf16(acc), ref, tol).all()


def test_tolerance_passes_zero_points_rounded_into_the_weights(rng):
    x, words, scales, zeros = problem(rng, m=3, n=32, k=2048, g=64, zero_points=True)
    ref = gemv.int4i_zp_gemv(x, words, scales, zeros)
    tol = gemv.tolerance(x, gemv.w_hat(words, scales, zeros, interleaved=True))
    rounded = formats.bf16_to_f32(int4.int4i_zp_bf16(words, scales, zeros))  # v3: one HFMA2
    acc = fp32_sum(formats.bf16_to_f32(x), rounded, 16)
    assert within(formats.f32_to_bf16(acc), ref, tol).all()


def test_tolerance_catches_what_the_mutants_do(rng):
    x, words, scales, zeros = problem(rng, m=2, n=32, k=1024, g=64, zero_points=True)
    w = gemv.w_hat(words, scales, interleaved=True)
    ref, tol = gemv.gemv(x, w), gemv.tolerance(x, w)
    no_tail = w.copy()
    no_tail[:, -96:] = 0  # K = 1024 read as if it were 928 + a dropped tail
    next_scale = gemv.w_hat(words, np.roll(scales, -1, axis=1), interleaved=True)
    for wrong in (no_tail, next_scale):
        assert not within(gemv.gemv(x, wrong), ref, tol).all()
    z = int4.unpack(zeros)  # (N,K/G)
    next_zero = int4.pack(np.roll(z, -1, axis=1))
    ref_zp = gemv.int4i_zp_gemv(x, words, scales, zeros)
    tol_zp = gemv.tolerance(x, gemv.w_hat(words, scales, zeros, interleaved=True))
    assert not within(gemv.int4i_zp_gemv(x, words, scales, next_zero), ref_zp, tol_zp).all()


def test_tolerance_grows_like_sqrt_k(rng):
    atols = []
    for k in (1024, 16384):
        x, words, scales, _ = problem(np.random.default_rng(7), m=4, n=64, k=k)
        atols.append(float(gemv.tolerance(x, gemv.w_hat(words, scales)).split(":")[2]))
    assert 3 < atols[1] / atols[0] < 5.5  # sqrt(16) = 4, give or take the max over outputs
