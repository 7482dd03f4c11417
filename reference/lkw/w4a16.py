"""Chapter 07 reference: the W4A16 GEMM y[M, N] = x[M, K] . W_hat[N, K]^T, its weight layouts,
and the converters from the two layouts real checkpoints ship (GPTQ, AWQ).

Layouts (stored bits, as the golden files hold them; chapter 02's packing, lkw.int4):

- x: BF16 bits uint16 [M, K]; y: BF16 bits uint16 [M, N].
- scales: BF16 bits uint16 [K/G, N], GROUP-MAJOR as GPTQ and AWQ store them (chapter 06 had
  [N, K/G]): element (n, k) uses scales[k // G, n]. G = K / scales.shape[0] in {32, 64, 128}, or
  G = K (one scale per output channel, scales [1, N]). K % 32 == 0.
- w4a16_gemm: weights uint32 [N, K/8] in the natural order (nibble j of word k // 8 of row n holds
  element k, j = k % 8).
- w4a16r_gemm: the same weights repacked for mma.sync m16n8k16 (``repack``), uint32 [N/64, 8K]:
  per block of 64 rows, per k16 step ks, per lane t, 4 words w at flat index (ks * 32 + t) * 4 + w.
  With n_a = 64 nb + 8 (2w) + t // 4, n_b = n_a + 8 and k0 = 16 ks + 2 (t % 4), word w holds
      e0..e7 = q[n_a, k0], q[n_a, k0+1], q[n_a, k0+8], q[n_a, k0+9],
               q[n_b, k0], q[n_b, k0+1], q[n_b, k0+8], q[n_b, k0+9]
  in the interleaved nibble order (int4.PERM: e_2i at nibble i, e_2i+1 at nibble i+4). These are
  the B fragments of n8 tiles 2w and 2w+1 (thread t holds B[k0, k0+1][n] and B[k0+8, k0+9][n],
  n = t / 4): one 16-byte load per lane and k16 step feeds 64 columns, and the magic unpack turns
  a word into the pairs (e0, e1), (e2, e3), (e4, e5), (e6, e7), the four B registers.
  N % 64 == 0, K % 16 == 0.

W_hat = s * (q - 8), exact in float64 and never rounded (a GEMM keeps it in registers); the product
is computed in float64 and rounded once to BF16, where the kernel rounds. With zero points
(``w_hat_zp``) W_hat = (q - z) * s, the checkpoints' contract, exact in float64 too: both ops take
the zero points as an optional fourth input, uint8 [K/G, N] (one z a byte, the scales' layout;
absent, z = 8). The tolerance
is chapter 06's (lkw.gemv.tolerance): it covers FP32 sums in any order and weights rounded to
BF16 before the multiply.

Checkpoints store the same numbers transposed and packed along other axes; ``from_gptq`` and
``from_awq`` return the chapter's natural words, scales [K/G, N] as BF16 bits (rounded once: the
one lossy step, exact for scales BF16 can hold), 4-bit zero points [K/G, N] and the permutation of
K that act-order (GPTQ's desc_act) needs. ``dequant_checkpoint`` says what a checkpoint means,
in float64 and in its own K order; the tests hold the converters to it.
"""

from typing import NamedTuple

import ml_dtypes
import numpy as np

from lkw import gemv, int4

BLOCK_N = 64  # rows per repacked block: 8 n8 tiles, 4 words per lane
STEP_K = 16  # k per mma step
LANES = 32


def _bf16(bits: np.ndarray) -> np.ndarray:
    """BF16 bits -> float64, exact."""
    return int4.decode(np.asarray(bits, np.uint16), "bfloat16")


def group_size(groups: int, k: int) -> int:
    """G for K input channels in `groups` groups: one of int4.GROUP_SIZES, or K (per channel)."""
    g = k // groups if groups > 0 and k % groups == 0 else 0
    if k % 32 or not (g in int4.GROUP_SIZES or (g == k and g > 0)):
        raise ValueError(
            f"K = {k} in {groups} groups: K must be a multiple of 32 and G = K / groups one of "
            f"{int4.GROUP_SIZES} or K"
        )
    return g


def _scales(scales: np.ndarray, n: int, k: int) -> tuple[np.ndarray, int]:
    """Scale bits [K/G, N] as float64 [K/G, N] and G, checked against N and K."""
    s = np.asarray(scales)
    if s.dtype != np.uint16 or s.ndim != 2 or s.shape[1] != n:
        raise ValueError(f"scales must be BF16 bits (uint16) [K/G, N={n}]: {s.dtype} {s.shape}")
    return _bf16(s), group_size(s.shape[0], k)


def w_hat(words: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The dequantized weights [N, K] in float64, exact: s * (q - 8); natural words [N, K/8],
    scale bits [K/G, N]."""
    q = int4.unpack(words).astype(np.float64)  # (N,K)
    s, g = _scales(scales, *q.shape)  # (K/G,N)
    return np.repeat(s.T, g, axis=1) * (q - 8)


def w_hat_zp(words: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """(q - z) * s in float64, exact (the checkpoints' contract); zero points uint8 [K/G, N] in
    0..15."""
    q = int4.unpack(words).astype(np.float64)  # (N,K)
    s, g = _scales(scales, *q.shape)  # (K/G,N)
    z = np.asarray(zeros)
    if z.shape != s.shape or z.size and (z.min() < 0 or z.max() > 15):
        raise ValueError(f"zero points must be 4-bit values [K/G, N] = {s.shape}, got {z.shape}")
    z = z.astype(np.float64)
    return (q - np.repeat(z.T, g, axis=1)) * np.repeat(s.T, g, axis=1)


def gemm(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """y = bf16(x . W^T), x BF16 bits [M, K], W float64 [N, K]: float64 sums, one rounding."""
    return gemv.gemv(x, weights)


def w4a16_gemm(
    x: np.ndarray, words: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None = None
) -> np.ndarray:
    """y = x . (s * (q - z))^T: natural words [N, K/8], scales [K/G, N], zero points uint8
    [K/G, N] in 0..15 or None (z = 8, the symmetric weights)."""
    return gemm(x, w_hat(words, scales) if zeros is None else w_hat_zp(words, scales, zeros))


def w4a16r_gemm(
    x: np.ndarray, repacked: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None = None
) -> np.ndarray:
    """As w4a16_gemm, the weights in the repacked layout [N/64, 8K] (N from the scales, K from x);
    the zero points are not repacked: [K/G, N] as the scales."""
    n, k = np.asarray(scales).shape[-1], np.asarray(x).shape[-1]
    return w4a16_gemm(x, unrepack(repacked, n, k), scales, zeros)


def tolerance(x: np.ndarray, weights: np.ndarray) -> str:
    """Chapter 06's close:RTOL:ATOL for y = x . W^T (lkw.gemv.tolerance): a GEMM sums the same
    products in FP32, only in other orders (mma trees, split-K), and may round s * (q - 8) to BF16
    before the multiply, which the tolerance already allows for."""
    return gemv.tolerance(x, weights)


# ---------------------------------------------------------------------------------------------
# The repacked layout


def _check_repack_shape(n: int, k: int) -> None:
    if n % BLOCK_N or k % STEP_K or n <= 0 or k <= 0:
        raise ValueError(f"repack needs N % {BLOCK_N} == 0 and K % {STEP_K} == 0: N = {n}, K = {k}")


def repack(words: np.ndarray) -> np.ndarray:
    """Natural words [N, K/8] -> the mma fragment layout [N/64, 8K] (see the module docstring)."""
    w = np.asarray(words)
    if w.ndim != 2:
        raise ValueError(f"repack takes words [N, K/8], got shape {w.shape}")
    n, k = w.shape[0], 8 * w.shape[1]
    _check_repack_shape(n, k)
    q = int4.unpack(w)  # (N,K)
    # n = 64 nb + 16 w + 8 h + r, k = 16 ks + 8 p + 2 c + j: lane t = 4 r + c, element 4h + 2p + j.
    q = q.reshape(n // BLOCK_N, 4, 2, 8, k // STEP_K, 2, 4, 2)  # (nb,w,h,r,ks,p,c,j)
    fragments = q.transpose(0, 4, 3, 6, 1, 2, 5, 7)  # (nb,ks,r,c,w,h,p,j)
    return int4.pack(fragments.reshape(n // BLOCK_N, 64 * k), interleaved=True)  # (N/64,8K)


def unrepack(repacked: np.ndarray, n: int, k: int) -> np.ndarray:
    """The inverse of repack: natural words [N, K/8] out of the fragment layout [N/64, 8K]."""
    _check_repack_shape(n, k)
    r = np.asarray(repacked)
    if r.shape != (n // BLOCK_N, 8 * k):
        raise ValueError(
            f"repacked weights for N = {n}, K = {k} must be [{n // BLOCK_N}, {8 * k}] words, "
            f"got {r.shape}"
        )
    fragments = int4.unpack(r, interleaved=True)  # (N/64,64K)
    q = fragments.reshape(n // BLOCK_N, k // STEP_K, 8, 4, 4, 2, 2, 2)  # (nb,ks,r,c,w,h,p,j)
    return int4.pack(q.transpose(0, 4, 5, 2, 1, 6, 3, 7).reshape(n, k))  # (N,K/8)


# ---------------------------------------------------------------------------------------------
# Checkpoints: GPTQ and AWQ
#
# GPTQ: qweight int32 [K/8, N], 8 consecutive k of one column per word, natural nibble order;
#   scales [K/G, N]; qzeros int32 [K/G, N/8], 8 consecutive n per word, natural order, holding
#   z - 1 (the v1 checkpoint format: readers add 1, so a symmetric checkpoint stores 7 for z = 8);
#   g_idx int32 [K], the group of each input channel, not monotone with act-order (desc_act).
# AWQ: qweight int32 [K, N/8], 8 consecutive n per word, nibble i holding column 8c + AWQ_ORDER[i];
#   qzeros int32 [K/G, N/8] packed the same way, z itself; scales [K/G, N]; no act-order.
# Both mean W[n, k] = (q[n, k] - z[group(k), n]) * s[group(k), n].

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]
# ... which is chapter 02's interleaved order (int4.PERM), for the same magic unpack.
GPTQ_ZERO_OFFSET = 1  # a GPTQ (v1) qzeros nibble holds z - 1
SCALE_DTYPES = (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)


class Converted(NamedTuple):
    """A checkpoint in the chapter's layout. The weights are W[:, perm]: x[:, perm] must go in."""

    words: np.ndarray  # uint32 [N, K/8], natural order, K permuted by perm
    scales: np.ndarray  # BF16 bits uint16 [K/G, N]
    zeros: np.ndarray | None  # uint8 [K/G, N] in 0..15, or None (symmetric: z = 8)
    perm: np.ndarray  # int64 [K]: column j of the chapter's weights is input channel perm[j]


def _scale_values(scales: np.ndarray) -> np.ndarray:
    """Checkpoint scales (float16, float32, float64 or bfloat16 values) as float64."""
    s = np.asarray(scales)
    if s.dtype not in SCALE_DTYPES or s.ndim != 2:
        raise TypeError(
            f"scales must be a 2-D float array (values, not bits), got {s.dtype} {s.shape}"
        )
    return s.astype(np.float64)


def _int32_words(words: np.ndarray, shape: tuple[int, int], name: str) -> np.ndarray:
    w = np.asarray(words)
    if w.dtype not in (np.int32, np.uint32) or w.shape != shape:
        raise ValueError(f"{name} must be int32 {list(shape)}, got {w.dtype} {w.shape}")
    return w.view(np.uint32)


def _groups(g_idx, k: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(group of each input channel [K], perm [K]) from g_idx, or contiguous groups without it."""
    g = group_size(groups, k)
    if g_idx is None:
        return np.arange(k) // g, np.arange(k)
    group = np.asarray(g_idx)
    if group.shape != (k,) or not np.issubdtype(group.dtype, np.integer):
        raise ValueError(f"g_idx must be integers [K = {k}], got {group.dtype} {group.shape}")
    perm = np.argsort(group, kind="stable")
    if not np.array_equal(group[perm], np.arange(k) // g):
        raise ValueError(
            f"g_idx must put exactly G = {g} input channels in each of {groups} groups"
        )
    return group.astype(np.int64), perm


def from_gptq(qweight, scales, qzeros=None, g_idx=None) -> Converted:
    """A GPTQ (v1) checkpoint -> the chapter's layout. Without qzeros the checkpoint is symmetric
    (z = 8, zeros None); a symmetric checkpoint's qzeros (all 7) give zeros all 8, which is
    w4a16_gemm's s * (q - 8). With g_idx (act-order) the input channels are sorted by group, stably:
    the words hold W[:, perm], and y = x[:, perm] . W[:, perm]^T = x . W^T."""
    s = _scale_values(scales)  # (K/G,N)
    n = s.shape[1]
    q = int4.unpack(_int32_words(qweight, (np.asarray(qweight).shape[0], n), "qweight").T)  # (N,K)
    k = q.shape[1]
    _, perm = _groups(g_idx, k, s.shape[0])
    zeros = None
    if qzeros is not None:
        if n % 8:
            raise ValueError(f"GPTQ zero points need N % 8 == 0, N = {n}")
        stored = int4.unpack(_int32_words(qzeros, (s.shape[0], n // 8), "qzeros"))  # (K/G,N)
        if np.any(stored == 15):
            raise ValueError("GPTQ qzeros hold 15, z = 16: not a 4-bit zero point")
        zeros = stored + GPTQ_ZERO_OFFSET
    return Converted(int4.pack(q[:, perm]), int4.round_to(s, "bfloat16"), zeros, perm)


def from_awq(qweight, scales, qzeros) -> Converted:
    """An AWQ checkpoint -> the chapter's layout (zero points as stored; perm is the identity)."""
    s = _scale_values(scales)  # (K/G,N)
    k, n = np.asarray(qweight).shape[0], s.shape[1]
    if n % 8:
        raise ValueError(f"AWQ packs 8 columns per word: N = {n}")
    q = int4.unpack(_int32_words(qweight, (k, n // 8), "qweight"), interleaved=True)  # (K,N)
    _, perm = _groups(None, k, s.shape[0])
    zeros = int4.unpack(_int32_words(qzeros, (s.shape[0], n // 8), "qzeros"), interleaved=True)
    return Converted(
        int4.pack(np.ascontiguousarray(q.T)), int4.round_to(s, "bfloat16"), zeros, perm
    )


def _q_and_zeros(q, zeros, groups: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray | None]:
    q = np.asarray(q)
    if q.ndim != 2 or q.shape[0] % 8 or q.shape[1] % 8 or q.size and (q.min() < 0 or q.max() > 15):
        raise ValueError(f"q must be 4-bit values [N, K], N and K multiples of 8: {q.shape}")
    if zeros is None:
        return q, None
    z = np.asarray(zeros)
    if z.shape != (groups, q.shape[0]) or z.size and (z.min() < lo or z.max() > hi):
        raise ValueError(f"zero points must be [K/G, N] = {(groups, q.shape[0])} in {lo}..{hi}")
    return q, z


def to_gptq(q, scales, zeros=None, g_idx=None) -> tuple:
    """q [N, K] (4-bit values, input channels in the checkpoint's order), scales [K/G, N] (floats,
    kept as given), zero points [K/G, N] in 1..16 or None (z = 8) and g_idx [K] or None (k // G)
    -> GPTQ (v1) (qweight, scales, qzeros, g_idx), what from_gptq and dequant_checkpoint read."""
    s = _scale_values(scales)
    q, z = _q_and_zeros(q, zeros, s.shape[0], 1, 16)
    n, k = q.shape
    group, _ = _groups(g_idx, k, s.shape[0])
    if z is None:
        z = np.full((s.shape[0], n), 8)
    qweight = np.ascontiguousarray(int4.pack(q).T).view(np.int32)  # (K/8,N)
    stored = (z - GPTQ_ZERO_OFFSET).astype(np.uint8)  # z = 16 stored as 15
    qzeros = int4.pack(stored).view(np.int32)  # (K/G,N/8)
    return qweight, np.asarray(scales), qzeros, group.astype(np.int32)


def to_awq(q, scales, zeros) -> tuple:
    """q [N, K], scales [K/G, N] (floats, kept as given), zero points [K/G, N] in 0..15 ->
    AWQ (qweight, scales, qzeros)."""
    s = _scale_values(scales)
    q, z = _q_and_zeros(q, zeros, s.shape[0], 0, 15)
    group_size(s.shape[0], q.shape[1])
    qweight = int4.pack(np.ascontiguousarray(q.T), interleaved=True).view(np.int32)  # (K,N/8)
    qzeros = int4.pack(z, interleaved=True).view(np.int32)  # (K/G,N/8)
    return qweight, np.asarray(scales), qzeros


def _nibble(words: np.ndarray, position) -> np.ndarray:
    return ((words.astype(np.int64) & 0xFFFFFFFF) >> (4 * position)) & 0xF


def dequant_checkpoint(kind: str, qweight, scales, qzeros=None, g_idx=None) -> np.ndarray:
    """What a GPTQ ("gptq") or AWQ ("awq") checkpoint means: W[n, k] = (q - z) * s in float64, s
    as given (not rounded to BF16), in the checkpoint's own K order. Written from the formats'
    definitions with shifts and masks, independently of the converters above."""
    s = np.asarray(scales).astype(np.float64)  # (K/G,N)
    words = np.asarray(qweight)
    n = s.shape[1]
    cols = np.arange(n)
    if kind == "gptq":
        k = 8 * words.shape[0]
        rows = np.arange(k)
        q = _nibble(words[rows // 8, :], (rows % 8)[:, None]).T  # (N,K)
        if qzeros is None:
            z = np.full(s.shape, 8)
        else:
            z = _nibble(np.asarray(qzeros)[:, cols // 8], cols % 8) + GPTQ_ZERO_OFFSET  # (K/G,N)
        group = rows * s.shape[0] // k if g_idx is None else np.asarray(g_idx)
    elif kind == "awq":
        if g_idx is not None:
            raise ValueError("AWQ checkpoints have no g_idx")
        k = words.shape[0]
        position = np.argsort(AWQ_ORDER)[cols % 8]  # the nibble that holds column n
        q = _nibble(words[:, cols // 8], position).T  # (N,K)
        z = _nibble(np.asarray(qzeros)[:, cols // 8], position)  # (K/G,N)
        group = np.arange(k) * s.shape[0] // k
    else:
        raise ValueError(f"checkpoint kind must be 'gptq' or 'awq', got {kind!r}")
    return (q - z[group, :].T) * s[group, :].T
