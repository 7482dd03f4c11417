"""Chapter 06 reference: the W4A16 GEMV y[M, N] = x[M, K] . W_hat[N, K]^T and its tolerance.

Layouts (stored bits, as the golden files hold them; chapter 02's packing, lkw.int4):

- x: BF16 bits uint16 [M, K]; y: BF16 bits uint16 [M, N].
- weights: uint32 [N, K/8], natural order (int4_gemv) or interleaved (int4i_gemv, int4i_zp_gemv);
  int4t_gemv: int4i_gemv's words in the tiled layout of v12, uint32 [ceil(N/16)*16, ceil(K/256)*32]
  holding [tile of 16 rows][step of 32 words][row in the tile][word in the step] (tile_weights).
- scales: BF16 bits [N, K/G], G = K / scales.shape[1] in {32, 64, 128}.
- zero points (int4i_zp_gemv): 4-bit, uint32 [N, K/G/8], natural order along the groups.

W_hat is the dequantized weight, exact in float64: s * (q - 8), or q * s - zs with zs = bf16(z * s)
rounded once per group -- chapter 02's zero-point contract, the zs of lkw.int4.int4i_zp_bf16.
Unlike chapter 02's outputs, W_hat itself is NOT rounded to BF16: a GEMV never stores it. The
product x . W_hat^T is computed in float64 and rounded once, to BF16, where the kernel rounds.
Quantization error (W_hat vs the original weights) is not the kernel's business: the kernels are
compared with this, never with unquantized weights.

What kernels legitimately do differently, and what the tolerance (``tolerance``) allows for:
FP32 accumulation in their own order (split-K, tensor-core sums), and kernels or peers that
round each weight to BF16 before multiplying (chapter 02's W_hat, as cuBLAS on dequantized
weights, torch's int4 kernel, and this chapter's v3 when the scale goes into the mma operand).
"""

import numpy as np

from lkw import int4, roofline
from lkw.formats import f64_to_bf16

RTOL = 1.6e-2  # PyTorch's BF16 default: two BF16 ulps of the output (see tolerance)
ROUNDING_SIGMAS = 8  # safety factor of the statistical ATOL term (see tolerance)


def _bf16(bits: np.ndarray) -> np.ndarray:
    """BF16 bits -> float64, exact."""
    return int4.decode(np.asarray(bits, np.uint16), "bfloat16")


def _group_size(scales: np.ndarray, k: int) -> int:
    s = np.asarray(scales)
    if s.ndim != 2 or s.shape[1] == 0 or k % s.shape[1] or k // s.shape[1] not in int4.GROUP_SIZES:
        raise ValueError(
            f"scales must be [N, K/G] with G in {int4.GROUP_SIZES}: K = {k}, scales {s.shape}"
        )
    return k // s.shape[1]


def w_hat(packed: np.ndarray, scales: np.ndarray, zeros=None, interleaved=False) -> np.ndarray:
    """The dequantized weights [N, K] in float64, exact: s * (q - 8), or with zero points
    q * s - bf16(z * s)."""
    q = int4.unpack(packed, interleaved).astype(np.float64)  # (N,K)
    n, k = q.shape
    g = _group_size(scales, k)
    if np.asarray(scales).shape[0] != n:
        raise ValueError(f"scales must have N = {n} rows, got {np.asarray(scales).shape}")
    s = _bf16(scales)  # (N,K/G)
    if zeros is None:
        return np.repeat(s, g, axis=1) * (q - 8)
    z_words = np.asarray(zeros)
    if s.shape[1] % 8 or z_words.shape != (n, s.shape[1] // 8):
        raise ValueError(
            f"zero points must be [N, K/G/8] words: K/G = {s.shape[1]}, got {z_words.shape}"
        )
    z = int4.unpack(z_words).astype(np.float64)  # (N,K/G)
    zs = _bf16(int4.round_to(z * s, "bfloat16"))  # rounded once per group, as the kernels
    return q * np.repeat(s, g, axis=1) - np.repeat(zs, g, axis=1)


def gemv(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """y = bf16(x . W^T) for BF16 bits x [M, K] and float64 W [N, K]: float64 sums, one rounding."""
    x64 = _bf16(x)
    if x64.ndim != 2 or weights.ndim != 2 or x64.shape[1] != weights.shape[1]:
        raise ValueError(f"gemv needs x [M, K] and W [N, K], got {x64.shape} and {weights.shape}")
    return f64_to_bf16(x64 @ weights.T)  # (M,N)


def int4_gemv(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """y = x . (s * (q - 8))^T: weights packed in the natural nibble order."""
    return gemv(x, w_hat(packed, scales))


def int4i_gemv(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """As int4_gemv, with the weights in the interleaved order of the magic unpack."""
    return gemv(x, w_hat(packed, scales, interleaved=True))


def int4i_zp_gemv(x, packed, scales, zeros) -> np.ndarray:
    """y = x . (q * s - zs)^T, zs = bf16(z * s): interleaved weights, 4-bit zero points."""
    return gemv(x, w_hat(packed, scales, zeros, interleaved=True))


TILE_ROWS = 16  # rows per tile of the tiled layout
STEP_WORDS = 32  # words per row and step (256 k)


def tiled_shape(n: int, k: int) -> tuple[int, int]:
    """The tiled layout's padded shape for N rows and K columns: [ceil(N/16)*16, ceil(K/256)*32]."""
    return -(-n // TILE_ROWS) * TILE_ROWS, -(-(k // 8) // STEP_WORDS) * STEP_WORDS


def tile_weights(words: np.ndarray, fill: np.ndarray | None = None) -> np.ndarray:
    """int4i_gemv's words [N, K/8] in int4t_gemv's tiled layout [ceil(N/16)*16, ceil(K/256)*32]:
    word j of row r at flat index ((r // 16 * steps + j // 32) * 16 + r % 16) * 32 + j % 32, steps =
    ceil(K/256). The padding (rows past N, words past K/8) is zero, or taken from `fill` (an array
    of the padded shape) so that a test can make it anything at all."""
    w = np.asarray(words, np.uint32)
    n, kw = w.shape
    shape = tiled_shape(n, 8 * kw)
    padded = np.zeros(shape, np.uint32) if fill is None else np.array(fill, np.uint32).reshape(shape)
    padded[:n, :kw] = w
    tiles, steps = shape[0] // TILE_ROWS, shape[1] // STEP_WORDS
    blocks = padded.reshape(tiles, TILE_ROWS, steps, STEP_WORDS).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks).reshape(shape)


def untile_weights(tiled: np.ndarray, n: int, k: int) -> np.ndarray:
    """The inverse of tile_weights: [N, K/8] words out of the tiled layout (padding dropped)."""
    t = np.asarray(tiled, np.uint32)
    shape = tiled_shape(n, k)
    if k % 8 or t.shape != shape:
        raise ValueError(f"tiled weights for N = {n}, K = {k} must be {list(shape)} words, got {t.shape}")
    tiles, steps = shape[0] // TILE_ROWS, shape[1] // STEP_WORDS
    rows = t.reshape(tiles, steps, TILE_ROWS, STEP_WORDS).transpose(0, 2, 1, 3)
    return rows.reshape(shape)[:n, : k // 8]


def int4t_gemv(x: np.ndarray, tiled: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """As int4i_gemv, with the weights in the tiled layout (N from the scales, K from x)."""
    n, k = np.asarray(scales).shape[0], np.asarray(x).shape[1]
    return int4i_gemv(x, untile_weights(tiled, n, k), scales)


def bf16_gemv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x . W^T with BF16 weights [N, K] (the cuBLAS peer's op): chapter 00's GEMM reference."""
    return roofline.gemm_bf16(x, w)


def tolerance(x: np.ndarray, weights: np.ndarray) -> str:
    """close:RTOL:ATOL (|got - ref| <= ATOL + RTOL * |ref|) for y = x . W^T, x BF16 bits [M, K],
    W the exact weights [N, K] (float64).

    RTOL = 1.6e-2: the kernel rounds its FP32 sum to BF16 (<= 2^-9 relative) and the reference
    rounds the exact sum; an FP32 sum a hair off the exact one can round to the neighbouring BF16,
    so the two may be one ulp (<= 2^-7 relative at the bottom of a binade) apart; 1.6e-2 ~ 2^-6.

    ATOL covers what no relative bound can, outputs that cancel to near zero, with two terms:

    1. Weights rounded to BF16 before the multiply (v3 with G < 128 or zero points, and the torch
       and cuBLAS peers on dequantized weights): each product x_k w_k carries a relative error
       d_k, |d_k| <= 2^-8 (BF16 keeps 8 significant bits), independent from weight to weight.
       Their sum is a random walk with standard deviation <= 2^-8 / sqrt(3) *
       sqrt(sum_k (x_k w_k)^2). The term is ROUNDING_SIGMAS * 2^-9 * sqrt(max over m, n of
       sum_k (x_k w_k)^2), 4 * sqrt(3) ~ 6.9 standard deviations of the largest output's walk
       (a chance of about 1e-11 per output): never reached by chance, and growing like sqrt(K).
    2. FP32 accumulation: K additions, each off by <= 2^-24 of a partial sum bounded by
       S = max over m, n of sum_k |x_k w_k|, adding up like a random walk: sqrt(K) * 2^-24 * S,
       times 8 for any summation order (tensor-core trees, split-K partials, chunked sums).

    Both are far below what the mutants get wrong (a dropped K tail, another group's scale or
    zero point change outputs by a sizeable fraction of their typical magnitude).
    """
    x64 = _bf16(x)
    walk_sq = np.max((x64 * x64) @ (weights * weights).T)
    abs_sum = np.max(np.abs(x64) @ np.abs(weights).T)
    return tolerance_from_maxima(float(walk_sq), float(abs_sum), x64.shape[1])


def tolerance_from_maxima(walk_sq: float, abs_sum: float, k: int) -> str:
    """`tolerance` from its two maxima over the outputs checked, for callers that compute them
    elsewhere (the bench, on the GPU): walk_sq = max over m, n of sum_k (x_k w_k)^2, abs_sum = max
    over m, n of sum_k |x_k w_k|."""
    atol = ROUNDING_SIGMAS * 2.0**-9 * np.sqrt(walk_sq) + 8 * np.sqrt(k) * 2.0**-24 * abs_sum
    return f"close:{RTOL}:{atol:.3g}"
