"""Chapter 08 reference: the W8A8 FP8 GEMM y[M, N] = (A_q . s_a) . (B_q . s_b)^T, its scale
granularities and layouts, the quantizers that produce them, the error metric and its bound, the
byte and FLOP models, input generators, and (an experiment, not a contract) a model of the
tensor core's limited-precision accumulation with and without promotion.

Layouts (stored bits, row-major numpy arrays, as the golden files hold them):

- A: E4M3 bits uint8 [M, K], K contiguous (one token's activations per row).
- B: E4M3 bits uint8 [N, K], K contiguous (one output channel's weights per row). Both operands
  are K-major because FP8 wgmma accepts no other: the transpose bits of wgmma exist only for
  16-bit types. This is the "TN" GEMM that cuBLASLt's FP8 path also requires.
- y: BF16 bits uint16 [M, N], N contiguous.
- Scales: float32, positive (the quantizers keep them >= MIN_SCALE; the reference does not
  look at their values). Three granularities (``GRANULARITIES``):

  "tensor"     s_a [1], s_b [1]                      y = s_a s_b . sum_k A_q B_q
  "rowwise"    s_a [M, 1] per token, s_b [N, 1] per output channel
                                                     y[m, n] = s_a[m] s_b[n] . sum_k A_q B_q
  "blockwise"  s_a [K/128, M]: 1 x 128 groups along K, COLUMN-MAJOR (the M scales of one K block
               contiguous) -- exactly what chapter 03's per_group_fp8 writes, the layout
               DeepGEMM's and cuBLASLt's 1 x 128 activation scales read; with a_scales_row_major
               (a param: 0 or 1, as in chapter 03) s_a is [M, K/128] instead. No padding: a
               kernel that loads the scale column with TMA needs 16-byte strides (M % 4 == 0), so
               it pads a copy or loads these few bytes (1/32 of A's) with ordinary loads.
               s_b [ceil(N/128), K/128]: one scale per 128 x 128 block of B, K blocks contiguous
               (DeepGEMM's layout); the last row of blocks may cover fewer than 128 channels.
               y[m, n] = sum_kb s_a[kb, m] s_b[n // 128, kb] . sum_{k in block kb} A_q B_q

  Element (m, k) of A means decode(A_q[m, k]) * (its scale), element (n, k) of B likewise; a
  per-tensor A with per-channel B is "rowwise" with s_a repeated M times (the same numbers).
  The scales of "tensor" and "rowwise" do not depend on k: they leave the sum and are applied in
  the epilogue. Blockwise scales do: each 128-wide K block's partial sum is multiplied by its two
  scales inside the K loop and added to a second FP32 accumulator (DeepGEMM's "promotion").

Shapes (``check_shapes``; bad shapes raise ValueError, nothing is padded silently):
- M >= 1, any value: tail rows of a tile are TMA's out-of-bounds fill and masked stores.
- N % 16 == 0 and K % 16 == 0: cuBLASLt's FP8 requirement (torch._scaled_mm checks exactly
  this), so every shape the chapter accepts also runs on its peer; it also keeps each row of A,
  B and y a whole number of 16-byte chunks, as TMA needs. N need not be a multiple of 128: the
  tile's tail columns are TMA bounds (DeepSeek-V3's N = 2112 is 16.5 blocks).
- "blockwise": K % 128 == 0 as well (a partial K block would need a scale of its own).
A K that is not a multiple of a kernel's BLOCK_K (but of 16) is TMA's zero fill: zeros add
nothing to the sum.

The reference (``reference``) dequantizes both operands in float64 -- exact: a 4-bit E4M3
significand times a 24-bit FP32 scale fits in 53 bits -- and multiplies in float64; ``fp8_gemm``
rounds that once to BF16, where the kernel rounds. Kernels accumulate in FP32 (or less, see
below) and apply the scales in FP32; the comparison is the relative Frobenius error of the
SPEC's FP8 rule, ``check``, against the float64 reference with the bound ``error_bound(K)``.
The C++ side has two ops, by where the scales act: ``fp8_gemm`` (tensor or rowwise scales, in
the epilogue) and ``fp8_gemm_blockwise``; in both the scale shapes name the granularity, and
``fp8_gemm_any`` (``granularity_of``, ``takes``) is their reference.

The activation quantizers are chapter 03's (lkw.quant: per_tensor_fp8, per_token_fp8,
per_group_fp8), unchanged, so chapter 08 multiplies exactly what chapter 03's kernels write. The
weight quantizers (offline) reuse the same rounding points (quant.fp8_scale, quant.quantize_fp8:
scale = max(absmax / 448, MIN_SCALE), q = e4m3_satfinite(fp32(w * fp32(1 / scale)))) over a
tensor, a row (output channel) or a 128 x 128 block.
"""

from typing import NamedTuple

import numpy as np

from lkw import formats, quant

GRANULARITIES = ("tensor", "rowwise", "blockwise")
BLOCK_K = quant.GROUP  # 128: A's 1 x 128 groups and B's blocks along K
BLOCK_N = 128  # B's blocks along N
ALIGN = 16  # N and K multiples of 16 (cuBLASLt FP8, TMA's 16-byte rows)
MMA_K = 32  # k per FP8 tensor-core step (wgmma ... k32 .e4m3, mma.sync m16n8k32)
TC_ACC_BITS = 13  # the accumulation model's fraction bits, see tc_accumulate
PROMOTE_K = 128  # k per promotion into FP32 (one blockwise scale block)


# ---------------------------------------------------------------------------------------------
# Shapes and layouts


def check_shapes(m: int, n: int, k: int, granularity: str) -> None:
    """Raises ValueError for shapes outside the contract (see the module docstring)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"M, N, K must be >= 1: M = {m}, N = {n}, K = {k}")
    if n % ALIGN or k % ALIGN:
        raise ValueError(f"N and K must be multiples of {ALIGN} (FP8 GEMM): N = {n}, K = {k}")
    if granularity == "blockwise" and k % BLOCK_K:
        raise ValueError(f"blockwise scales need K % {BLOCK_K} == 0: K = {k}")


def scale_shapes(m: int, n: int, k: int, granularity: str, a_scales_row_major=0):
    """(shape of s_a, shape of s_b) for a problem of this granularity."""
    check_shapes(m, n, k, granularity)
    if granularity == "tensor":
        return (1,), (1,)
    if granularity == "rowwise":
        return (m, 1), (n, 1)
    kb = k // BLOCK_K
    return ((m, kb) if a_scales_row_major else (kb, m)), (-(-n // BLOCK_N), kb)


def _codes(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8 or x.ndim != 2:
        raise ValueError(f"{name} must be E4M3 bits (uint8) [rows, K], got {x.dtype} {x.shape}")
    return x


def _operands(a, b, s_a, s_b, granularity, a_scales_row_major):
    """Checked (A, B, s_a, s_b) and (M, N, K)."""
    a, b = _codes(a, "A"), _codes(b, "B")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"A [M, K] and B [N, K] disagree on K: {a.shape}, {b.shape}")
    want_a, want_b = scale_shapes(m, n, k, granularity, a_scales_row_major)
    scales = []
    for name, s, want in (("s_a", s_a, want_a), ("s_b", s_b, want_b)):
        s = np.asarray(s)
        if s.dtype != np.float32 or s.shape != want:
            raise ValueError(
                f"{granularity}: {name} must be float32 {list(want)}, got {s.dtype} {list(s.shape)}"
            )
        scales.append(s)
    return a, b, *scales, (m, n, k)


def scale_per_block(a, b, s_a, s_b, granularity: str, a_scales_row_major=0):
    """The scales as float32 [M, K/128] and [N, K/128] (one column per 128-wide K block, the
    last block partial when K % 128 != 0), whatever the granularity: what each element's block
    is multiplied by."""
    a, b, s_a, s_b, (m, n, k) = _operands(a, b, s_a, s_b, granularity, a_scales_row_major)
    blocks = -(-k // BLOCK_K)
    if granularity == "blockwise":
        rows_a = s_a if a_scales_row_major else s_a.T  # (M,KB)
        return np.ascontiguousarray(rows_a), np.repeat(s_b, BLOCK_N, axis=0)[:n]  # (N,KB)
    return np.broadcast_to(s_a.reshape(-1, 1), (m, blocks)), np.broadcast_to(
        s_b.reshape(-1, 1), (n, blocks)
    )


# Every E4M3 code's value, float64: a table lookup, because formats.decode's bit arithmetic on each
# element of an 8192 x 8192 operand costs the bench seconds per case.
_E4M3_VALUES = formats.decode(np.arange(256, dtype=np.uint8), formats.E4M3)


def _dequant(codes: np.ndarray, per_block: np.ndarray) -> np.ndarray:
    """float64 decode(codes) * scale of each element's K block, exact."""
    k = codes.shape[1]
    s = np.repeat(per_block.astype(np.float64), BLOCK_K, axis=1)[:, :k]  # (rows,K)
    return _E4M3_VALUES[codes] * s


def dequant_a(a, b, s_a, s_b, granularity: str, a_scales_row_major=0) -> np.ndarray:
    """A_hat [M, K] float64, exact."""
    sa, _ = scale_per_block(a, b, s_a, s_b, granularity, a_scales_row_major)
    return _dequant(np.asarray(a), sa)


def dequant_b(a, b, s_a, s_b, granularity: str, a_scales_row_major=0) -> np.ndarray:
    """B_hat [N, K] float64, exact."""
    _, sb = scale_per_block(a, b, s_a, s_b, granularity, a_scales_row_major)
    return _dequant(np.asarray(b), sb)


# ---------------------------------------------------------------------------------------------
# The contract


def reference(a, b, s_a, s_b, granularity: str, a_scales_row_major=0) -> np.ndarray:
    """A_hat . B_hat^T [M, N] in float64 (the dequantized product, never rounded)."""
    sa, sb = scale_per_block(a, b, s_a, s_b, granularity, a_scales_row_major)
    return _dequant(np.asarray(a), sa) @ _dequant(np.asarray(b), sb).T  # (M,N)


def fp8_gemm(a, b, s_a, s_b, granularity: str, a_scales_row_major=0) -> np.ndarray:
    """y = bf16(A_hat . B_hat^T): BF16 bits [M, N], rounded once from the float64 product."""
    return formats.f64_to_bf16(reference(a, b, s_a, s_b, granularity, a_scales_row_major))


def granularity_of(m: int, n: int, k: int, s_a_shape, s_b_shape, a_scales_row_major=0) -> str:
    """The granularity that the scale shapes name, as the C++ launcher reads them
    (fp8_gemm.cuh's granularity_of, in its order): "tensor" for [1], [1]; "rowwise" for [M, 1],
    [N, 1]; "blockwise" for [K/128, M] ([M, K/128] when a_scales_row_major), [ceil(N/128),
    K/128] when K % 128 == 0. No two of them coincide (N >= 16 > ceil(N/128)). Anything else
    names none: ValueError."""
    shapes = {"tensor": ((1,), (1,)), "rowwise": ((m, 1), (n, 1))}
    if k % BLOCK_K == 0:
        kb = k // BLOCK_K
        shapes["blockwise"] = ((m, kb) if a_scales_row_major else (kb, m), (-(-n // BLOCK_N), kb))
    got = (tuple(s_a_shape), tuple(s_b_shape))
    for granularity, want in shapes.items():
        if got == want:
            return granularity
    raise ValueError(
        f"scales s_a {list(got[0])} and s_b {list(got[1])} name no granularity for M = {m}, "
        f"N = {n}, K = {k}: tensor [1], [1]; rowwise [M, 1], [N, 1]; blockwise [K/128, M] "
        "(or [M, K/128] with a_scales_row_major), [ceil(N/128), K/128]"
    )


def fp8_gemm_any(a, b, s_a, s_b, a_scales_row_major=0, takes=GRANULARITIES) -> np.ndarray:
    """fp8_gemm at the granularity the scale shapes name (granularity_of), one of `takes`, else
    ValueError: the C++ ops' signature (fp8_gemm takes tensor and rowwise scales,
    fp8_gemm_blockwise blockwise ones). a_scales_row_major is 0 or 1 (a golden param: maybe 0.0)."""
    if a_scales_row_major not in (0, 1):
        raise ValueError(f"a_scales_row_major must be 0 or 1, got {a_scales_row_major!r}")
    row_major = int(a_scales_row_major)
    a, b = _codes(a, "A"), _codes(b, "B")
    g = granularity_of(a.shape[0], b.shape[0], a.shape[1], np.shape(s_a), np.shape(s_b), row_major)
    if g not in takes:
        raise ValueError(f"{g} scales where {' or '.join(takes)} ones are taken")
    return fp8_gemm(a, b, s_a, s_b, g, row_major)


def fp8_gemm_tensorwise(a, b, s_a, s_b) -> np.ndarray:
    """fp8_gemm with one scale per operand: s_a [1], s_b [1]."""
    return fp8_gemm(a, b, s_a, s_b, "tensor")


def fp8_gemm_rowwise(a, b, s_a, s_b) -> np.ndarray:
    """fp8_gemm with per-token s_a [M, 1] and per-channel s_b [N, 1]."""
    return fp8_gemm(a, b, s_a, s_b, "rowwise")


def fp8_gemm_blockwise(a, b, s_a, s_b, a_scales_row_major=0) -> np.ndarray:
    """fp8_gemm with s_a [K/128, M] (or [M, K/128]) and s_b [ceil(N/128), K/128]."""
    return fp8_gemm(a, b, s_a, s_b, "blockwise", a_scales_row_major)


# ---------------------------------------------------------------------------------------------
# Quantizers


def _bf16_rows(x, name: str) -> np.ndarray:
    """BF16 bits [rows, K] -> FP32 (exact)."""
    x = np.asarray(x)
    if x.dtype != np.uint16 or x.ndim != 2:
        raise ValueError(f"{name} must be BF16 bits (uint16) [rows, K], got {x.dtype} {x.shape}")
    return formats.bf16_to_f32(x)


def quantize_a(x, granularity: str, a_scales_row_major=0) -> tuple[np.ndarray, np.ndarray]:
    """Activations BF16 bits [M, K] -> (E4M3 bits [M, K], s_a): chapter 03's dynamic quantizers,
    per_tensor_fp8 ("tensor"), per_token_fp8 ("rowwise"), per_group_fp8 ("blockwise")."""
    _bf16_rows(x, "x")
    if granularity == "tensor":
        return quant.per_tensor_fp8(x)
    if granularity == "rowwise":
        return quant.per_token_fp8(x)
    if granularity == "blockwise":
        return quant.per_group_fp8(x, a_scales_row_major)
    raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


def per_block_fp8(w) -> tuple[np.ndarray, np.ndarray]:
    """Weights BF16 bits [N, K] -> (E4M3 bits [N, K], scales float32 [ceil(N/128), K/128]): one
    absmax scale per 128 x 128 block (the last row of blocks over the channels it has)."""
    w32 = _bf16_rows(w, "w")
    n, k = w32.shape
    if k % BLOCK_K:
        raise ValueError(f"per_block_fp8: K = {k} is not a multiple of {BLOCK_K}")
    nb = -(-n // BLOCK_N)
    padded = np.zeros((nb * BLOCK_N, k), np.float32)  # zeros leave every absmax as it is
    padded[:n] = np.abs(w32)
    blocks = padded.reshape(nb, BLOCK_N, k // BLOCK_K, BLOCK_K)  # (NB,128,KB,128)
    scales = quant.fp8_scale(blocks.max(axis=(1, 3)))  # (NB,KB)
    per_element = np.repeat(np.repeat(scales, BLOCK_N, axis=0)[:n], BLOCK_K, axis=1)  # (N,K)
    return quant.quantize_fp8(w32, per_element), scales


def quantize_b(w, granularity: str) -> tuple[np.ndarray, np.ndarray]:
    """Weights BF16 bits [N, K] -> (E4M3 bits [N, K], s_b), offline: one scale for the tensor
    ([1]), per output channel ([N, 1], chapter 03's per-token rule applied to the rows of W) or
    per 128 x 128 block (per_block_fp8)."""
    _bf16_rows(w, "w")
    if granularity == "tensor":
        return quant.per_tensor_fp8(w)
    if granularity == "rowwise":
        return quant.per_token_fp8(w)
    if granularity == "blockwise":
        return per_block_fp8(w)
    raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


# ---------------------------------------------------------------------------------------------
# The error metric and its bound


def rel_frobenius_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64; out BF16 bits (uint16) or floats, ref floats.
    Infinite when out holds a NaN or an Inf (a poisoned or overflowed element never averages
    away). A reference of zeros measures nothing: ValueError."""
    out = np.asarray(out)
    got = formats.bf16_to_f32(out).astype(np.float64) if out.dtype == np.uint16 else out
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"out {got.shape} and ref {ref.shape} differ in shape")
    norm = np.linalg.norm(ref)
    if not norm > 0 or not np.isfinite(norm):
        raise ValueError("the reference must be finite and not all zeros")
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - ref) / norm)


BF16_TERM = 2.0**-8  # output rounding: BF16's unit roundoff (8 significant bits)
TC_FACTOR = 4.0  # tensor-core term: ~1.7x the model's worst-case standard deviation
FP32_SIGMAS = 8  # safety factor of the FP32 random-walk term


def error_bound(
    k: int, promote_k: int | None = PROMOTE_K, acc_bits: int | None = TC_ACC_BITS
) -> float:
    """The largest relative Frobenius error a correct kernel may show against the float64
    reference on the chapter's data (random-signed products: ``activations`` x ``weights``), for
    K and a promotion interval (None: the whole K accumulates in the tensor core, CUTLASS's "fast
    accumulation") and the accumulation model's bits (None: an FP32 accumulator, no TC term):

        bound = 2^-8 + 4 sqrt(L / 32) 2^-acc_bits + 8 sqrt(K) 2^-24,   L = min(K, promote_k) or K

    1. Output: one round to nearest BF16 moves an element by up to half an ulp, 2^-8 of a value
       just above a power of two (2^-9 typically), so <= 2^-8 in the Frobenius norm; the
       epilogue's FP32 scale products and an FP32 sum a hair off the exact fit in the slack.
    2. Tensor-core accumulation, in the model of tc_accumulate: step s of a run truncates each of
       its 32 products toward zero by less than u_s = 2^-acc_bits times the step's largest term,
       which after the first steps is the running sum, ~sqrt(32 s) sigma for products of spread
       sigma. Random signs make the errors a random walk: variance <= sum_s 32 u_s^2 / 3, a
       standard deviation ~13 sigma S 2^-acc_bits after S = L / 32 steps, against a run sum of
       ~sqrt(32 S) sigma: ~2.3 sqrt(S) 2^-acc_bits relative. Promotion ends the run every
       promote_k, so each run's error is relative to that run and the term stops growing with K;
       without promotion it grows like sqrt(K). (The estimate is ~2x the model's measured error;
       4 leaves room for the Frobenius norm of few outputs.)
    3. FP32 accumulation across runs (or throughout, in a kernel that keeps FP32): K roundings
       of 2^-24 of partial sums comparable to the result, a random walk, times FP32_SIGMAS for any
       order (tensor-core trees, split-K).
    Not derived for products of one sign (data with a common mean): there a truncating
    accumulator drifts coherently toward zero, and without promotion the model's error reaches
    ~3% at K = 4096 (DeepSeek-V3 reports ~2% on Hopper), far above even the unpromoted bound;
    promoted, it stays within the bound (promotion_sweep(shift=1)). The tests hold the emulated
    kernel to the bound for K = 128 ... 16384 and the mutants far above it.
    """
    if k < 1 or (promote_k is not None and promote_k < 1):
        raise ValueError(f"K and promote_k must be >= 1: K = {k}, promote_k = {promote_k}")
    run = k if promote_k is None else min(k, promote_k)
    tc = 0.0 if acc_bits is None else TC_FACTOR * np.sqrt(run / MMA_K) * 2.0**-acc_bits
    return BF16_TERM + tc + FP32_SIGMAS * np.sqrt(k) * 2.0**-24


class Verdict(NamedTuple):
    ok: bool  # no NaN/Inf and error <= bound
    error: float  # rel_frobenius_error
    bound: float  # error_bound
    nonfinite: int  # elements of out that are NaN or Inf


def check(out, ref, k: int, promote_k: int | None = PROMOTE_K) -> Verdict:
    """The chapter's comparison: out (BF16 bits [M, N]) against the float64 reference of the
    dequantized inputs, every element finite and the relative Frobenius error within
    error_bound(K, promote_k)."""
    out = np.asarray(out)
    got = formats.bf16_to_f32(out) if out.dtype == np.uint16 else out
    nonfinite = int(np.count_nonzero(~np.isfinite(got)))
    error = rel_frobenius_error(out, ref)
    bound = error_bound(k, promote_k)
    return Verdict(nonfinite == 0 and error <= bound, error, bound, nonfinite)


# ---------------------------------------------------------------------------------------------
# Byte and FLOP models


def scale_bytes(m: int, n: int, k: int, granularity: str) -> int:
    """Bytes of s_a and s_b (float32)."""
    shape_a, shape_b = scale_shapes(m, n, k, granularity)
    return 4 * (int(np.prod(shape_a)) + int(np.prod(shape_b)))


def model(m: int, n: int, k: int, granularity: str) -> tuple[int, int]:
    """(bytes, FLOPs) of one GEMM: A (1 B per element), B (1 B), both scale tensors read once,
    y (2 B, BF16) written once -- the roofline minimum; FLOPs = 2 M N K (the useful ones: no
    padded tile is counted)."""
    return m * k + n * k + scale_bytes(m, n, k, granularity) + 2 * m * n, 2 * m * n * k


# ---------------------------------------------------------------------------------------------
# Input generators

ROW_SPREAD = 2.0  # activation rows scaled by 2^u, u uniform in [-ROW_SPREAD, ROW_SPREAD]
OUTLIERS = 8  # activation elements per tensor multiplied by OUTLIER_FACTOR (the SPEC's recipe)
OUTLIER_FACTOR = 100
CHANNEL_SPREAD = 1.0  # weight rows scaled by 2^u, u uniform in [-CHANNEL_SPREAD, CHANNEL_SPREAD]


def activations(
    rng: np.random.Generator, m: int, k: int, outliers: int = OUTLIERS, shift: float = 0.0
) -> np.ndarray:
    """BF16 bits [M, K]: normal samples (mean `shift`), each row times 2^u (tokens of different
    magnitude), and `outliers` distinct elements times 100: the data on which per-tensor scaling
    loses accuracy (a few large values set the scale, small rows sink into E4M3's subnormals)."""
    rows = np.exp2(rng.uniform(-ROW_SPREAD, ROW_SPREAD, (m, 1)))
    x = (rng.standard_normal((m, k)) + shift) * rows
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, min(outliers, flat.size), replace=False)] *= OUTLIER_FACTOR
    return formats.f32_to_bf16(x.astype(np.float32))


def weights(
    rng: np.random.Generator, n: int, k: int, shift: float = 0.0, k_block_spread: float = 0.0
) -> np.ndarray:
    """BF16 bits [N, K]: normal samples (mean `shift`) / sqrt(K), each output channel times 2^u
    (channels of different magnitude, where per-channel scales beat one scale for the tensor);
    with k_block_spread, each 128-wide block of input channels times 2^v, v uniform in
    [-k_block_spread, k_block_spread]: 128 x 128 block scales that differ along K, as trained
    weights' do (with equal ones, a kernel reading the next K block's weight scale goes unseen)."""
    rows = np.exp2(rng.uniform(-CHANNEL_SPREAD, CHANNEL_SPREAD, (n, 1)))
    w = (rng.standard_normal((n, k)) + shift) * rows / np.sqrt(k)
    if k_block_spread:
        blocks = np.exp2(rng.uniform(-k_block_spread, k_block_spread, -(-k // BLOCK_K)))
        w = w * np.repeat(blocks, BLOCK_K)[:k]
    return formats.f32_to_bf16(w.astype(np.float32))


def problem(
    rng: np.random.Generator, m: int, n: int, k: int, granularity: str, shift=0.0,
    k_block_spread=0.0,
):
    """(A, B, s_a, s_b): fresh activations and weights (both of mean `shift` before their
    magnitudes: 0 gives random-signed products, what error_bound covers; 1 gives mostly
    positive ones; k_block_spread: see weights) quantized at `granularity` (s_a column-major
    for "blockwise")."""
    check_shapes(m, n, k, granularity)
    a, s_a = quantize_a(activations(rng, m, k, shift=shift), granularity)
    b, s_b = quantize_b(weights(rng, n, k, shift, k_block_spread), granularity)
    return a, b, s_a, s_b


# ---------------------------------------------------------------------------------------------
# Experiment helper: the tensor core's accumulation, with and without promotion (not a contract)
#
# A model, not Hopper's documented behaviour (NVIDIA documents none). Its assumptions:
# - products of two E4M3 values are exact (8 significant bits at most);
# - one tensor-core step adds the MMA_K = 32 products of one k32 instruction to the accumulator
#   as one fused sum: all 33 terms are aligned to the largest one's binade, each is truncated
#   toward zero to acc_bits fraction bits below it (TC_ACC_BITS = 13: a 14-bit significand, the
#   "about 14 bits" the DeepSeek-V3 technical report gives), the aligned terms are added exactly,
#   and the result is stored as an FP32 accumulator (exactly: it has fewer than 24 bits);
# - the accumulator keeps its value between instructions, so without promotion the whole K is
#   summed this way;
# - promotion every promote_k: the tensor-core accumulator, times the block's scale product
#   fp32(s_a s_b) for blockwise scales, is added to an FP32 accumulator (one rounding, as an FMA;
#   computed as float64 then FP32, a double rounding the experiment ignores) and reset to zero;
# - the epilogue: tensor / rowwise y = bf16(fp32(s_a * fp32(s_b * acc))) (vLLM's order, scale B
#   first); blockwise y = bf16(FP32 accumulator).
# With acc_bits = None each step is an FP32 add of the exact step sum (an ideal FP32 tensor core).
# Blockwise scales change every 128 k, so there promotion is not optional: promote_k must divide
# 128. The promotion-off experiment therefore runs with k-independent scales (tensor, rowwise).


def tc_accumulate(acc: np.ndarray, products: np.ndarray, acc_bits: int | None) -> np.ndarray:
    """One tensor-core step: acc (FP32 [...]) plus the exact products (float64 [..., <= 32]) in
    the model above; returns the new accumulator, FP32 [...]."""
    acc64 = np.asarray(acc, np.float32).astype(np.float64)
    if acc_bits is None:
        return (acc64 + products.sum(axis=-1)).astype(np.float32)
    terms = np.concatenate([acc64[..., None], products], axis=-1)  # (...,33)
    _, e = np.frexp(np.max(np.abs(terms), axis=-1, keepdims=True))  # max in [2^(e-1), 2^e)
    quantum = np.ldexp(1.0, e - 1 - acc_bits)
    return (np.trunc(terms / quantum) * quantum).sum(axis=-1).astype(np.float32)


def emulate_fp8_gemm(
    a,
    b,
    s_a,
    s_b,
    granularity: str,
    promote_k: int | None = PROMOTE_K,
    acc_bits: int | None = TC_ACC_BITS,
    a_scales_row_major=0,
) -> np.ndarray:
    """What a kernel that accumulates as the model says would output: BF16 bits [M, N].
    promote_k: a multiple of 32 (for blockwise a divisor of 128), or None for no promotion.
    Cost ~ M N K operations in numpy: keep M N small (a few thousand outputs)."""
    sa, sb = scale_per_block(a, b, s_a, s_b, granularity, a_scales_row_major)
    av = formats.decode(np.asarray(a), formats.E4M3)  # (M,K)
    bv = formats.decode(np.asarray(b), formats.E4M3)  # (N,K)
    k = av.shape[1]
    blockwise = granularity == "blockwise"
    if promote_k is not None and (promote_k < MMA_K or promote_k % MMA_K):
        raise ValueError(f"promote_k must be a multiple of {MMA_K} or None, got {promote_k}")
    if blockwise and (promote_k is None or BLOCK_K % promote_k):
        raise ValueError(f"blockwise scales need promotion at a divisor of {BLOCK_K}: {promote_k}")
    acc = np.zeros((av.shape[0], bv.shape[0]), np.float32)  # (M,N) tensor-core accumulator
    total = np.zeros_like(acc)  # (M,N) the promoted FP32 accumulator
    for k0 in range(0, k, MMA_K):
        products = av[:, None, k0 : k0 + MMA_K] * bv[None, :, k0 : k0 + MMA_K]  # (M,N,32)
        acc = tc_accumulate(acc, products, acc_bits)
        end = min(k0 + MMA_K, k)
        if promote_k is not None and (end % promote_k == 0 or end == k):
            kb = k0 // BLOCK_K
            scale = sa[:, kb, None] * sb[None, :, kb] if blockwise else np.float32(1)  # (M,N) FP32
            promoted = total.astype(np.float64) + np.asarray(scale, np.float64) * acc
            total = promoted.astype(np.float32)
            acc = np.zeros_like(acc)
    if blockwise:
        return formats.f32_to_bf16(total)
    sums = acc if promote_k is None else total
    return formats.f32_to_bf16(sa[:, :1] * (sb[:, 0][None, :] * sums))  # FP32 products


def promotion_sweep(
    rng: np.random.Generator, ks, m: int = 16, n: int = 16, shift: float = 0.0, **emulate
) -> list:
    """The promotion experiment on the model: per K, relative Frobenius errors of the emulated
    rowwise GEMM without promotion and with it (every PROMOTE_K), fresh data per K (`shift`: see
    problem). Returns [{"k", "promoted", "unpromoted", "bound"}], what the chapter plots next to
    the GPU's measurement; `emulate` passes acc_bits on."""
    rows = []
    for k in ks:
        a, b, s_a, s_b = problem(rng, m, n, k, "rowwise", shift)
        ref = reference(a, b, s_a, s_b, "rowwise")
        errors = {}
        for name, promote_k in (("promoted", PROMOTE_K), ("unpromoted", None)):
            out = emulate_fp8_gemm(a, b, s_a, s_b, "rowwise", promote_k, **emulate)
            errors[name] = rel_frobenius_error(out, ref)
        rows.append({"k": k, **errors, "bound": error_bound(k)})
    return rows
