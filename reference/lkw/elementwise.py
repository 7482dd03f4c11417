"""Chapter 05 references: the small elementwise kernels of a decoder layer -- gated activations
(SiLU-and-mul and its fused FP8 quant), rotary embedding (RoPE), fused per-head QK RMSNorm + RoPE,
reshape_and_cache (the write side of a paged KV cache), and RoPE + the cache write fused on a QKV
projection's output (qkv_rope_cache).

This docstring is the contract the chapter's kernels implement. BF16 tensors are raw bits
(uint16), FP8 E4M3 tensors raw bits (uint8), as the golden files store them; every BF16 value is
widened exactly. "FP64 here" means the reference evaluates the exact formula in float64 and rounds
ONCE to BF16 (lkw.formats.f64_to_bf16); a kernel evaluates it in FP32 (a few FP32 roundings and
library transcendentals, each ~2^-24 relative) and rounds once to BF16, which lands within the
tolerance stated per op. The BF16 rounding points below are the ones a kernel must share.

1. Gated activations: x [T, 2d] BF16 -> y [T, d] BF16 (any d >= 1, odd d included).
       gate = x[:, :d], up = x[:, d:]       act_first = True (the default): the gate is the FIRST
                                            half, as vLLM's silu_and_mul and the merged
                                            gate_up_proj (w13 = w1 || w3) of Llama lay it out;
                                            act_first = False swaps the halves (vLLM's
                                            mul_and_silu: y = x[:, :d] * act(x[:, d:]))
       clamp (optional, limit > 0, gpt-oss style): gate = min(gate, fp32(limit)),
                                            up = clip(up, -fp32(limit), fp32(limit)); exact
       y = bf16(act(gate) * up)             FP64 here, ONE rounding; act(gate) is NOT rounded
                                            to BF16 before the multiply
   act: silu(g) = g / (1 + exp(-g)); gelu(g) = g/2 * (1 + erf(g / sqrt 2));
        gelu_tanh(g) = g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3))).
   Kernels: FP32 act with the accurate expf / __expf / erff / tanhf (tanh.approx.f32, 2^-11
   relative, is NOT accurate enough), the product in FP32, cvt.rn to BF16. silu has no
   cancellation: TOLERANCE_ACT = ulp:1. gelu and gelu_tanh as vLLM writes them,
   0.5 g (1 + erff(g / sqrt 2)), cancel for negative g (1 + erff(-4) keeps 2^-24 absolute, not
   relative, accuracy), hence act_tolerance: 1 ulp relative plus an absolute 2^-21 max|gate up|.
   Fused FP8 quant: yb = the BF16 y above, then lkw.quant's rules on yb, exactly as the unfused
   chain (this kernel writing yb, then chapter 03's kernel reading it):
       per token   quant.per_token_fp8(yb)      -> q [T, d], scales [T, 1]
       per group   quant.per_group_fp8(yb)      -> q [T, d], scales [d/128, T] column-major
                                                   (chapter 08's GEMM reads them; d % 128 == 0)
       per tensor  static: scale [1] is an INPUT (a calibrated activation scale), q =
                   quant.quantize_fp8(yb, scale) = e4m3_satfinite(fp32(yb * fp32(1/scale))).
                   A dynamic per-tensor scale needs the whole tensor's absmax before the first
                   element is written: two passes, i.e. no longer a fused one-pass kernel.
   A kernel's q and scales equal these rules applied to ITS OWN yb, bit for bit; against the
   reference's yb they are within TOLERANCE_FP8 (q one E4M3 code, scales 2^-6).

2. RoPE: q [T, Hq, D], k [T, Hk, D] rotated in place; positions [T] (int, 0 <= p < max_pos);
   cos_sin_cache [max_pos, rot_dim] FP32, row p = (cos of the rot_dim/2 angles, then their sin).
   Only the first rot_dim elements of each head rotate (partial rotary, rot_dim even, <= D); the
   other D - rot_dim are neither read nor written. Pair j (0 <= j < rot_dim/2) of a head is
       NEOX  (GPT-NeoX, Llama, Qwen: rotate halves)     (x, y) = (h[j], h[j + rot_dim/2])
       GPT-J (GPT-J, ChatGLM: interleaved pairs)        (x, y) = (h[2j], h[2j + 1])
   and with c = cache[p, j], s = cache[p, rot_dim/2 + j] (s = -s for the inverse rotation):
       x' = bf16(x c - y s),  y' = bf16(y c + x s)       FP64 here, one rounding each
   The kernel's FP32 products round (or fuse into an FMA): within the tolerance of
   rope_tolerance (1 BF16 ulp relative plus an absolute 2^-20 * absmax for cancellation, where
   x c ~ y s and the FP32 error of a product is many ulps of the small result).
   The cache: cos_sin_cache(max_pos, rot_dim, base) with inv_freq[j] = fp32(base^(-2j/rot_dim))
   (inv_freq below), angle = fp32(p * inv_freq[j]) -- ONE FP32 multiply, as vLLM builds its
   cache in float32 (near p = 8192 this rounding moves the angle by up to ~2^-12 rad, far beyond
   what cos/sin may be off for a BF16 result, so it is part of the contract) -- and cos, sin of that FP32 angle rounded once to
   FP32. A version that computes cos/sin instead of reading the cache takes inv_freq as input,
   forms the angle with one FP32 multiply (__fmul_rn: p < 2^24 is exact in FP32) and uses the
   accurate sincosf (not __sinf/__cosf, whose error grows with the argument).
   Not in the contract (the issue does not ask): Llama-3 / YaRN frequency scaling, rope_dim_offset.

3. qk_norm_rope (Qwen3): every head of q and of k is RMS-normalized over its D elements with its
   own weight (q_weight [D] for q heads, k_weight [D] for k heads), then rotated as in 2, in one
   pass. Rounding points = the unfused chain: n = lkw.rmsnorm.rmsnorm(head, w, eps) (rstd in
   FP32, z = bf16(fp32(h * rstd)), n = bf16(z * w)), then RoPE of n. The rstd's summation order
   is free, so n is only known within 2 BF16 ulps (lkw.rmsnorm.TOLERANCE_Y); the rotation mixes
   two such n, hence qk_norm_rope_tolerance. vLLM's fused kernel keeps z and n in FP32 (no BF16
   rounding between norm and rotation); the tolerance admits it, the Python tests pin the chain.

4. reshape_and_cache: key, value [T, Hk, D] BF16 -> the caches, through slot_mapping [T] (int):
   slot s >= 0 goes to block b = s // block_size, offset o = s % block_size; slot -1 is padding:
   that token is neither read nor written (its cache bytes keep whatever they held). Other
   negative slots, slots >= num_blocks * block_size and repeated slots are errors (a repeated
   slot would make the result depend on the write order). Layouts (LAYOUTS):
       "paged" (vLLM v1 PagedAttention)  key [blocks, Hk, D/x, block_size, x], element
               (b, h, i // x, o, i % x); value [blocks, Hk, D, block_size], element (b, h, i, o);
               x = 16 bytes / cache element size (8 for BF16, 16 for FP8), D % x == 0
       "nhd"   (flash, FlashInfer)       both [blocks, block_size, Hk, D], element (b, o, h, i)
       "hnd"                             both [blocks, Hk, block_size, D], element (b, h, o, i)
   A BF16 cache stores the bits unchanged (exact). An FP8 E4M3 cache has per-tensor k_scale and
   v_scale (FP32 [1], inputs): stored = quant.quantize_fp8(x, scale), i.e. e4m3_satfinite(
   fp32(x * fp32(1/scale))), bit-exact against chapter 03's quantization of the same values.
   vLLM's fp8::scaled_convert divides (x / scale); x * (1/scale) differs in the last FP32 bit now
   and then (one E4M3 code), and multiplying matches chapter 03 and the other fused quant paths.
   The reference returns updated copies of the caches it is given; the kernels write in place.
5. qkv_rope_cache: 2 and 4 in one pass over a QKV projection's output qkv [T, Hq + 2 Hk, D] BF16
   (its heads in that order: Hq query, Hk key, Hk value heads). The query heads rotated as in 2
   -> q_out [T, Hq, D]; the key heads rotated as in 2 and the value heads as they are -> the BF16
   caches as in 4 (Hk is the caches': their shapes say it). Every position must lie in the
   cos/sin cache (the kernel skips a token whose position does not: nothing written); a padding
   slot (-1) writes q_out only. The same roundings as rope then reshape_and_cache.

Byte models (the roofline minimum: each input read once, each output written once) are the
*_bytes functions; generators of inputs are at the end, with poisoned caches for checking that
padding slots stay untouched.
"""

import math

import numpy as np

from lkw import formats, quant, rmsnorm

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
LAYOUTS = ("paged", "nhd", "hnd")
BLOCK_AXIS = {"paged": 3, "nhd": 1, "hnd": 2}  # the block_size axis of each layout's key cache
KV_DTYPES = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8}  # manifest name -> stored bits
CACHE_VECTOR_BYTES = 16  # "paged" key layout: x = 16 bytes of one token's head in a row
POISON = {np.dtype(np.uint16): 0x7FC1, np.dtype(np.uint8): 0x7F}  # BF16 and E4M3 NaN codes
MAX_POSITION = 1 << 24  # positions are exact in FP32 below this

TOLERANCE_ACT = "ulp:1"  # silu: FP32 act and product, one rounding: never two BF16 codes away
# Fused FP8 quant against the REFERENCE's yb (q, scales): a kernel's yb is within one BF16 ulp,
# which moves a scale by <= 2^-7 (1 ulp of the absmax) and q's pre-rounding value by <= 2^-6
# relative, less than one E4M3 step (>= 2^-4 relative): q within one code, scales within 2^-6.
# Against quant.* of the kernel's OWN yb, q and scales are exact.
TOLERANCE_FP8 = {
    "per_token": "ulp:1/close:0.015625:0",
    "per_group": "ulp:1/close:0.015625:0",
    "per_tensor": "ulp:1",  # the scale is an input
}
TOLERANCE_KV = "exact"  # reshape_and_cache copies (BF16) or quantizes with chapter 03's rule (FP8)


# ---------------------------------------------------------------------------------------------
# Argument checks (clear errors instead of numpy broadcasting surprises)


def _bf16(x, ndim: int, what: str) -> np.ndarray:
    """BF16 bits with `ndim` dims -> float64 values (exact)."""
    x = np.asarray(x)
    if x.ndim != ndim or x.dtype != np.uint16:
        raise ValueError(
            f"{what}: expected BF16 bits with {ndim} dims (uint16), got {x.dtype} {x.shape}"
        )
    return formats.bf16_to_f32(x).astype(np.float64)


def _ints(a, shape: tuple[int, ...], what: str) -> np.ndarray:
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer) or a.shape != shape:
        raise ValueError(f"{what}: expected integers of shape {shape}, got {a.dtype} {a.shape}")
    return a.astype(np.int64)


def _scale(scale, what: str) -> np.ndarray:
    s = np.asarray(scale)
    if s.dtype != np.float32 or s.shape != (1,) or not (np.isfinite(s[0]) and s[0] > 0):
        raise ValueError(f"{what}: expected one positive finite FP32 scale [1], got {scale!r}")
    return s


# ---------------------------------------------------------------------------------------------
# 1. Gated activations


_erfc = np.frompyfunc(math.erfc, 1, 1)


@np.errstate(over="ignore")  # exp(-g) overflows for g < -709: the act -> -0, as in FP32
def activation(g: np.ndarray, act: str) -> np.ndarray:
    """act(g) in float64 for float64 g, in forms without cancellation for negative g:
    (1 + erf(t)) / 2 = erfc(-t) / 2 and (1 + tanh(z)) / 2 = 1 / (1 + exp(-2z)); in float64
    1 + erf(-6) is already 0 (erfc(6) ~ 2e-17 is below half an ulp of 1), and an FP32 kernel
    loses the relative accuracy near g = -4 (see act_tolerance)."""
    if act == "silu":
        return g / (1.0 + np.exp(-g))
    if act == "gelu":
        return 0.5 * g * _erfc(-g / math.sqrt(2.0)).astype(np.float64)
    if act == "gelu_tanh":
        z = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)
        return g / (1.0 + np.exp(-2.0 * z))
    raise ValueError(f"act must be one of {ACTIVATIONS}, got {act!r}")


def gate_and_up(x, act_first: bool = True, limit: float | None = None):
    """(gate, up) float64 [T, d] of x [T, 2d] BF16: the gate is the first half when act_first,
    the second otherwise; with `limit`, gate <= limit and |up| <= limit (FP32 limit)."""
    x64 = _bf16(x, 2, "x [T, 2d]")
    if x64.shape[1] % 2 or x64.shape[1] == 0:
        raise ValueError(f"x [T, 2d]: the last dim must be even and > 0, got {x64.shape[1]}")
    d = x64.shape[1] // 2
    gate, up = (x64[:, :d], x64[:, d:]) if act_first else (x64[:, d:], x64[:, :d])
    if limit is not None:
        if not limit > 0:
            raise ValueError(f"limit must be > 0, got {limit}")
        lim = float(np.float32(limit))
        gate, up = np.minimum(gate, lim), np.clip(up, -lim, lim)
    return gate, up


def act_and_mul(x, act: str = "silu", act_first: bool = True, limit: float | None = None):
    """x [T, 2d] BF16 -> y = bf16(act(gate) * up) [T, d] BF16, FP64 here and rounded once."""
    gate, up = gate_and_up(x, act_first, limit)
    return formats.f64_to_bf16(activation(gate, act) * up)


def silu_and_mul(x) -> np.ndarray:
    """x [T, 2d] BF16 -> bf16(silu(x[:, :d]) * x[:, d:]) [T, d] (vLLM's silu_and_mul)."""
    return act_and_mul(x, "silu")


def gelu_and_mul(x) -> np.ndarray:
    return act_and_mul(x, "gelu")


def gelu_tanh_and_mul(x) -> np.ndarray:
    return act_and_mul(x, "gelu_tanh")


def silu_and_mul_fp8_per_token(x, scale_ub: float | None = None):
    """-> (q E4M3 [T, d], scales FP32 [T, 1]) = quant.per_token_fp8(silu_and_mul(x))."""
    return quant.per_token_fp8(silu_and_mul(x), scale_ub)


def silu_and_mul_fp8_per_group(x, scales_row_major: float = 0):
    """-> (q E4M3 [T, d], scales FP32 [d/128, T] column-major, or [T, d/128] with
    scales_row_major) = quant.per_group_fp8(silu_and_mul(x))."""
    return quant.per_group_fp8(silu_and_mul(x), scales_row_major)


def silu_and_mul_fp8_per_tensor(x, scale) -> np.ndarray:
    """-> q E4M3 [T, d] with the static FP32 scale [1]: e4m3(fp32(yb * fp32(1/scale)))."""
    s = _scale(scale, "silu_and_mul_fp8_per_tensor scale")
    return quant.quantize_fp8(formats.bf16_to_f32(silu_and_mul(x)), s)


# ---------------------------------------------------------------------------------------------
# 2. RoPE


def inv_freq(rot_dim: int, base: float = 10000.0) -> np.ndarray:
    """FP32 [rot_dim/2]: fp32(base^(-2j/rot_dim)), computed in FP64 and rounded once."""
    if rot_dim <= 0 or rot_dim % 2:
        raise ValueError(f"rot_dim must be even and > 0, got {rot_dim}")
    return (1.0 / np.float64(base) ** (np.arange(0, rot_dim, 2) / rot_dim)).astype(np.float32)


def cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> np.ndarray:
    """FP32 [max_pos, rot_dim]: row p = (cos(a_0..a_{r/2-1}), sin(a_0..)), a_j = fp32(p *
    inv_freq[j]) one FP32 multiply, cos/sin of that FP32 angle rounded once to FP32."""
    if not 0 < max_pos <= MAX_POSITION:
        raise ValueError(f"max_pos must be in 1..2^24, got {max_pos}")
    p = np.arange(max_pos, dtype=np.float32)[:, None]
    angle = (p * inv_freq(rot_dim, base)[None, :]).astype(np.float64)  # (P,R/2) FP32 product
    return np.hstack([np.cos(angle), np.sin(angle)]).astype(np.float32)  # (P,R)


def pair_indices(rot_dim: int, is_neox: bool) -> tuple[np.ndarray, np.ndarray]:
    """(x index, y index) [rot_dim/2] of each rotated pair inside a head; pair j uses
    cos/sin column j."""
    j = np.arange(rot_dim // 2)
    return (j, j + rot_dim // 2) if is_neox else (2 * j, 2 * j + 1)


def _cache_rows(positions, t: int, cache) -> tuple[np.ndarray, np.ndarray, int]:
    """(cos, sin) float64 [T, 1, rot_dim/2] of each token's position, and rot_dim."""
    cache = np.asarray(cache)
    if cache.dtype != np.float32 or cache.ndim != 2 or cache.shape[1] % 2 or cache.shape[1] == 0:
        raise ValueError(
            f"cos_sin_cache: expected FP32 [max_pos, rot_dim] with rot_dim even, got "
            f"{cache.dtype} {cache.shape}"
        )
    pos = _ints(positions, (t,), "positions [T]")
    if np.any(pos < 0) or np.any(pos >= cache.shape[0]):
        bad = pos[(pos < 0) | (pos >= cache.shape[0])][0]
        raise ValueError(f"positions: {bad} is outside the cache's 0..{cache.shape[0] - 1}")
    rot_dim = cache.shape[1]
    rows = cache[pos].astype(np.float64)[:, None, :]  # (T,1,R)
    return rows[..., : rot_dim // 2], rows[..., rot_dim // 2 :], rot_dim


def rotate(bits: np.ndarray, cos, sin, is_neox: bool) -> np.ndarray:
    """BF16 bits [T, H, D], cos/sin float64 [T, 1, rot_dim/2] -> BF16 bits with the first
    rot_dim elements of each head rotated (one rounding from FP64), the rest the same bits."""
    rot_dim = 2 * cos.shape[-1]
    if rot_dim > bits.shape[-1]:
        raise ValueError(f"rot_dim = {rot_dim} exceeds the head size D = {bits.shape[-1]}")
    xi, yi = pair_indices(rot_dim, is_neox)
    h = formats.bf16_to_f32(bits).astype(np.float64)
    x, y = h[..., xi], h[..., yi]  # (T,H,R/2)
    out = np.array(bits, np.uint16)  # the D - rot_dim tail is not touched
    out[..., xi] = formats.f64_to_bf16(x * cos - y * sin)
    out[..., yi] = formats.f64_to_bf16(y * cos + x * sin)
    return out


def _heads(q, k) -> tuple[np.ndarray, np.ndarray]:
    q64, k64 = _bf16(q, 3, "q [T, Hq, D]"), _bf16(k, 3, "k [T, Hk, D]")
    if q64.shape[0] != k64.shape[0] or q64.shape[2] != k64.shape[2]:
        raise ValueError(f"q {q64.shape} and k {k64.shape} must share T and D")
    return q64, k64


def rope(positions, q, k, cache, is_neox: bool = True, inverse: bool = False):
    """-> (q', k') BF16, the rotated copies of q [T, Hq, D] and k [T, Hk, D]; `inverse` rotates
    by -angle (sin negated)."""
    q64, _ = _heads(q, k)
    cos, sin, _ = _cache_rows(positions, q64.shape[0], cache)
    sin = -sin if inverse else sin
    return rotate(np.asarray(q), cos, sin, is_neox), rotate(np.asarray(k), cos, sin, is_neox)


# ---------------------------------------------------------------------------------------------
# 3. Fused per-head QK RMSNorm + RoPE


def head_rmsnorm(h, w, eps: float) -> np.ndarray:
    """BF16 [T, H, D] -> every head through lkw.rmsnorm.rmsnorm with weight w [D], BF16."""
    h = np.asarray(h)
    t, heads, d = h.shape
    if np.asarray(w).shape != (d,):
        raise ValueError(f"norm weight: expected [{d}], got {np.asarray(w).shape}")
    return rmsnorm.rmsnorm(h.reshape(t * heads, d), w, eps).reshape(t, heads, d)


def qk_norm_rope(positions, q, k, q_weight, k_weight, cache, eps: float, is_neox: bool = True):
    """-> (q', k') BF16: RoPE(rmsnorm(head, weight)) per head, the weights [D] per tensor."""
    _heads(q, k)  # checks before any work
    nq, nk = head_rmsnorm(q, q_weight, eps), head_rmsnorm(k, k_weight, eps)
    return rope(positions, nq, nk, cache, is_neox)


# ---------------------------------------------------------------------------------------------
# 4. reshape_and_cache


def cache_x(kv_dtype: str) -> int:
    """Elements per 16-byte vector of the "paged" key layout: 8 (BF16) or 16 (FP8)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {tuple(KV_DTYPES)}, got {kv_dtype!r}")
    return CACHE_VECTOR_BYTES // np.dtype(KV_DTYPES[kv_dtype]).itemsize


def cache_shapes(layout: str, num_blocks: int, block_size: int, hk: int, d: int, kv_dtype: str):
    """(key cache shape, value cache shape) of a layout."""
    x = cache_x(kv_dtype)
    if layout == "paged":
        if d % x:
            raise ValueError(f"the paged key layout needs D % {x} == 0 for {kv_dtype}, D = {d}")
        return (num_blocks, hk, d // x, block_size, x), (num_blocks, hk, d, block_size)
    if layout == "nhd":
        return ((num_blocks, block_size, hk, d),) * 2
    if layout == "hnd":
        return ((num_blocks, hk, block_size, d),) * 2
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _kv_dtype(key_cache, value_cache) -> str:
    kc, vc = np.asarray(key_cache), np.asarray(value_cache)
    for name, stored in KV_DTYPES.items():
        if kc.dtype == stored and vc.dtype == stored:
            return name
    raise ValueError(
        f"caches must both be BF16 bits (uint16) or E4M3 bits (uint8), got {kc.dtype}, {vc.dtype}"
    )


def cache_index(layout: str, shape: tuple[int, ...], slots, d: int, which: str):
    """Index arrays into a cache of `shape` for tokens at `slots` [n] (all >= 0): broadcast to
    [n, Hk, D], element (token, head, i) of key ("key") or value ("value")."""
    block_size = shape[BLOCK_AXIS[layout]]
    slots = np.asarray(slots, np.int64)
    b, o = (slots // block_size)[:, None, None], (slots % block_size)[:, None, None]  # (n,1,1)
    h = np.arange(shape[2] if layout == "nhd" else shape[1])[None, :, None]  # (1,Hk,1)
    i = np.arange(d)[None, None, :]  # (1,1,D)
    if layout == "paged" and which == "key":
        x = shape[4]
        return b, h, i // x, o, i % x
    if layout == "paged":
        return b, h, i, o
    return (b, o, h, i) if layout == "nhd" else (b, h, o, i)


def _check_slots(slot_mapping, t: int, num_slots: int) -> np.ndarray:
    slots = _ints(slot_mapping, (t,), "slot_mapping [T]")
    if np.any(slots < -1) or np.any(slots >= num_slots):
        bad = slots[(slots < -1) | (slots >= num_slots)][0]
        raise ValueError(f"slot_mapping: {bad} is neither -1 (padding) nor in 0..{num_slots - 1}")
    valid = slots[slots >= 0]
    if np.unique(valid).size != valid.size:
        raise ValueError("slot_mapping: a slot appears twice (the result would depend on order)")
    return slots


def reshape_and_cache(
    key, value, key_cache, value_cache, slot_mapping, layout: str, k_scale=None, v_scale=None
):
    """key, value [T, Hk, D] BF16 -> (key_cache', value_cache'): copies of the given caches with
    each non-padding token written at its slot (BF16 bits, or E4M3 with k_scale / v_scale)."""
    k64, v64 = _bf16(key, 3, "key [T, Hk, D]"), _bf16(value, 3, "value [T, Hk, D]")
    if k64.shape != v64.shape:
        raise ValueError(f"key {k64.shape} and value {v64.shape} must have the same shape")
    t, hk, d = k64.shape
    kv_dtype = _kv_dtype(key_cache, value_cache)
    kc, vc = np.array(key_cache), np.array(value_cache)  # copies: the inputs stay as given
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if kc.ndim < 4:
        raise ValueError(f"key cache: expected the {layout} layout, got shape {kc.shape}")
    num_blocks, block_size = kc.shape[0], kc.shape[BLOCK_AXIS[layout]]
    want = cache_shapes(layout, num_blocks, block_size, hk, d, kv_dtype)
    if (kc.shape, vc.shape) != want:
        raise ValueError(
            f"{layout} {kv_dtype} caches for Hk = {hk}, D = {d} must be {want[0]} and {want[1]}, "
            f"got {kc.shape} and {vc.shape}"
        )
    slots = _check_slots(slot_mapping, t, num_blocks * block_size)
    if kv_dtype == "bfloat16":
        if k_scale is not None or v_scale is not None:
            raise ValueError("k_scale / v_scale are for an FP8 cache only")
        k_new, v_new = np.asarray(key), np.asarray(value)
    else:
        ks, vs = _scale(k_scale, "k_scale"), _scale(v_scale, "v_scale")
        k_new = quant.quantize_fp8(k64.astype(np.float32), ks)
        v_new = quant.quantize_fp8(v64.astype(np.float32), vs)
    keep = slots >= 0
    kc[cache_index(layout, kc.shape, slots[keep], d, "key")] = k_new[keep]
    vc[cache_index(layout, vc.shape, slots[keep], d, "value")] = v_new[keep]
    return kc, vc


def gather_cache(key_cache, value_cache, slots, layout: str, d: int):
    """The inverse: (key, value) [n, Hk, D] as stored at `slots` [n] (all >= 0), raw bits."""
    kc, vc = np.asarray(key_cache), np.asarray(value_cache)
    slots = np.asarray(slots, np.int64)
    return (
        kc[cache_index(layout, kc.shape, slots, d, "key")],
        vc[cache_index(layout, vc.shape, slots, d, "value")],
    )


# ---------------------------------------------------------------------------------------------
# 5. qkv_rope_cache


def cache_kv_heads(layout: str, key_cache) -> int:
    """Hk of a key cache in `layout` (its shape's head axis)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    shape = np.asarray(key_cache).shape
    if len(shape) < 4:
        raise ValueError(f"key cache: expected the {layout} layout, got shape {shape}")
    return shape[2 if layout == "nhd" else 1]


def split_qkv(qkv, hk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qkv [T, Hq + 2 Hk, D] BF16 bits -> (q, k, v) views of its heads."""
    qkv = np.asarray(qkv)
    _bf16(qkv, 3, "qkv [T, Hq + 2 Hk, D]")
    hq = qkv.shape[1] - 2 * hk
    if hk <= 0 or hq <= 0:
        raise ValueError(f"qkv has {qkv.shape[1]} heads: not Hq + 2 Hk with Hk = {hk}, Hq > 0")
    return qkv[:, :hq], qkv[:, hq : hq + hk], qkv[:, hq + hk :]


def qkv_rope_cache(positions, qkv, cache, slot_mapping, key_cache, value_cache, layout: str,
                   is_neox: bool = True):
    """-> (key_cache', value_cache', q_out): rope of the query and key heads, then
    reshape_and_cache of the rotated keys and the values (BF16 caches)."""
    if _kv_dtype(key_cache, value_cache) != "bfloat16":
        raise ValueError("qkv_rope_cache writes BF16 caches")
    q, k, v = split_qkv(qkv, cache_kv_heads(layout, key_cache))
    q_out, k_rot = rope(positions, q, k, cache, is_neox)
    kc, vc = reshape_and_cache(k_rot, v, key_cache, value_cache, slot_mapping, layout)
    return kc, vc, q_out


def dequantize_kv(bits: np.ndarray, scale) -> np.ndarray:
    """float64 value of E4M3 cache bits times the FP32 scale (what attention reads back)."""
    return formats.decode(np.asarray(bits, np.uint8), formats.E4M3) * float(np.asarray(scale)[0])


# ---------------------------------------------------------------------------------------------
# Tolerances and the comparison rule


def act_tolerance(x, act: str = "silu", act_first: bool = True, limit: float | None = None) -> str:
    """The tolerance of act_and_mul(x, act, ...): ulp:1 for silu; for gelu and gelu_tanh
    close:2^-7:ATOL, ATOL = 2^-21 * max |gate * up| (an FP32 1 + erff / 1 + tanhf near 0 is off
    by up to ~2^-24 absolute, times |g / 2 * up|; 4x margin)."""
    if act == "silu":
        return TOLERANCE_ACT
    gate, up = gate_and_up(x, act_first, limit)
    return f"close:{2.0**-7!r}:{2.0**-21 * float(np.max(np.abs(gate * up)))!r}"


def rope_tolerance(*tensors) -> str:
    """close:RTOL:ATOL for RoPE outputs rotated from `tensors` (BF16 bits: q and k). RTOL 2^-7 is
    one BF16 ulp anywhere in a binade; ATOL 2^-20 * absmax covers the FP32 roundings of the
    products (each <= 2^-24 |x c|) where x c - y s cancels."""
    absmax = max(float(np.max(np.abs(formats.bf16_to_f32(np.asarray(a))))) for a in tensors)
    return f"close:{2.0**-7!r}:{2.0**-20 * absmax!r}"


def qk_norm_rope_tolerance(*outputs) -> str:
    """close:RTOL:ATOL for qk_norm_rope outputs (the reference's, BF16 bits). A kernel's n may
    be 2 BF16 ulps (<= 2^-6 |n|) off the reference's (rstd's summation order), a rotated element
    mixes two of them: |error| <= 2^-6 (|n1| + |n2|) <= 2^-5 * absmax of the outputs (a rotation
    keeps a pair's length, so |n1| + |n2| <= 2 absmax). ATOL is twice that, 2^-4 * absmax; RTOL
    2^-6 (two BF16 ulps of the final rounding and of n). Gross errors (pairing, sign, a missing
    norm) are O(|n|)."""
    absmax = max(float(np.max(np.abs(formats.bf16_to_f32(np.asarray(a))))) for a in outputs)
    return f"close:{2.0**-6!r}:{2.0**-4 * absmax!r}"


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Sign-magnitude BF16 / E4M3 codes as integers in value order (+0 and -0 both 0)."""
    b = bits.astype(np.int64)
    sign = 0x8000 if bits.dtype == np.uint16 else 0x80
    return np.where(b & sign, -(b & (sign - 1)), b & (sign - 1))


def matches(got, want, dtype: str, tolerance: str) -> bool:
    """The harness's rule (common/lkw/compare.h) in numpy, for bfloat16 / float8_e4m3fn bits and
    float32: exact (same bits) | ulp:N | close:RTOL:ATOL on decoded values; NaN matches only NaN,
    and an all-zero result never matches a reference that is not all zero."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        return True
    fmt = {"bfloat16": formats.BF16, "float8_e4m3fn": formats.E4M3}.get(dtype)
    g = formats.decode(got, fmt) if fmt else got.astype(np.float64)
    e = formats.decode(want, fmt) if fmt else want.astype(np.float64)
    if not np.any(g) and np.any(e):
        return False
    nan_ok = np.isnan(g) == np.isnan(e)
    num = ~np.isnan(g) & ~np.isnan(e)
    if tolerance == "exact":
        ok = got == want
    elif tolerance.startswith("ulp:"):
        if fmt is None:
            raise ValueError(f"ulp tolerances are for bfloat16 / float8_e4m3fn, not {dtype}")
        ok = np.abs(_ordered(got) - _ordered(want)) <= int(tolerance[4:])
    elif tolerance.startswith("close:"):
        rtol, atol = map(float, tolerance.split(":")[1:])
        with np.errstate(invalid="ignore"):
            ok = np.abs(g - e) <= atol + rtol * np.abs(e)
    else:
        raise ValueError(f"bad tolerance {tolerance!r} (exact | ulp:N | close:RTOL:ATOL)")
    return bool(np.all(nan_ok) and np.all(ok | ~num))


# ---------------------------------------------------------------------------------------------
# Byte models: each input read once, each output written once (bytes per launch)

FP8_SCALE_BYTES = {  # FP32 scales of the fused quant: written (dynamic) or read (static)
    "per_token": lambda t, d: 4 * t,
    "per_group": lambda t, d: 4 * t * (d // quant.GROUP),
    "per_tensor": lambda t, d: 4,
}


def act_and_mul_bytes(t: int, d: int) -> int:
    """Gate and up read (2 + 2 B), y written (2 B): 6 B per output element."""
    return 6 * t * d


def silu_and_mul_fp8_bytes(t: int, d: int, kind: str, fused: bool = True) -> int:
    """Fused: 4 B read + 1 B of q per element, plus the scales (written, or the static one read):
    5 B. Unfused: silu_and_mul (6 B) then the quant kernel reading yb (2 B) and writing q: 9 B."""
    if kind not in FP8_SCALE_BYTES:
        raise ValueError(f"kind must be one of {tuple(FP8_SCALE_BYTES)}, got {kind!r}")
    return (5 if fused else 9) * t * d + FP8_SCALE_BYTES[kind](t, d)


def rope_bytes(t: int, hq: int, hk: int, rot_dim: int, cache_rows: int | None = None) -> int:
    """The rotated rot_dim elements of every q and k head read and written (4 B each; the other
    D - rot_dim are not touched), the positions (int64), and one FP32 cache row per token
    (cache_rows: distinct positions, default T)."""
    rows = t if cache_rows is None else cache_rows
    return 4 * t * (hq + hk) * rot_dim + 8 * t + 4 * rows * rot_dim


def qk_norm_rope_bytes(t: int, hq: int, hk: int, d: int, rot_dim: int, fused: bool = True) -> int:
    """Fused: whole heads read and written once (4 B per element), the two weights, positions and
    cache rows. Unfused: a per-head RMSNorm pass (4 B) then a RoPE pass (4 B over rot_dim)."""
    norm = 4 * t * (hq + hk) * d + 2 * 2 * d
    if fused:
        return norm + 8 * t + 4 * t * rot_dim
    return norm + rope_bytes(t, hq, hk, rot_dim)


def reshape_and_cache_bytes(t: int, hk: int, d: int, kv_dtype: str, valid: int | None = None):
    """slot_mapping read (8 B per token); for each valid (non-padding) token, k and v read (BF16)
    and written in the cache dtype; an FP8 cache also reads its two scales."""
    n = t if valid is None else valid
    item = CACHE_VECTOR_BYTES // cache_x(kv_dtype)  # bytes per cache element
    return 8 * t + n * hk * d * 2 * (2 + item) + (8 if kv_dtype == "float8_e4m3fn" else 0)


def qkv_rope_cache_bytes(t: int, hq: int, hk: int, d: int, rot_dim: int, fused: bool = True,
                         valid: int | None = None) -> int:
    """Fused: qkv read once, q_out and the caches' key and value heads written once (4 B an
    element of qkv), positions and slots, one FP32 cos/sin row a token (`valid` tokens cached).
    Unfused, as a layer chains it from qkv's slices (q and k copied out, rope out of place, v
    copied, reshape_and_cache): 8 B an element of q and of v, 12 B of k."""
    n = t if valid is None else valid
    rows = 16 * t + 4 * t * rot_dim
    if fused:
        return 4 * t * hq * d + 4 * n * 2 * hk * d + rows
    return 8 * t * hq * d + 12 * t * hk * d + 8 * n * hk * d + rows


# ---------------------------------------------------------------------------------------------
# Input generators


def _activations(rng: np.random.Generator, t: int, n: int, spread: float) -> np.ndarray:
    from lkw import golden  # here, not at the top: golden may import this module for its cases

    return golden.activations(rng, t, n, spread)


def gate_up(rng: np.random.Generator, t: int, d: int, spread: float = 4.0) -> np.ndarray:
    """BF16 [T, 2d]: rows of N(0, 1) times 2^u, u in [-spread, spread] (lkw.golden.activations)."""
    return _activations(rng, t, 2 * d, spread)


def heads(rng: np.random.Generator, t: int, h: int, d: int, spread: float = 4.0) -> np.ndarray:
    """BF16 [T, H, D]: each token's heads share a magnitude 2^u, as rows of a projection do."""
    return _activations(rng, t, h * d, spread).reshape(t, h, d)


def positions(rng: np.random.Generator, t: int, max_pos: int) -> np.ndarray:
    """int64 [T] in 0..max_pos-1 (a decode batch: each sequence at its own length)."""
    return rng.integers(0, max_pos, t, dtype=np.int64)


def slot_mapping(rng: np.random.Generator, t: int, num_slots: int, padding: float = 0.25):
    """int64 [T]: distinct slots in 0..num_slots-1, about `padding` of the tokens -1; with T >= 2
    and padding > 0 at least one token is padding and at least one is not."""
    if t > num_slots:
        raise ValueError(f"{t} tokens need {t} distinct slots, the cache has {num_slots}")
    slots = rng.choice(num_slots, t, replace=False).astype(np.int64)
    pad = rng.random(t) < padding
    if t >= 2 and padding > 0:
        one, other = rng.choice(t, 2, replace=False)
        pad[one], pad[other] = True, False
    slots[pad] = -1
    return slots


def poisoned_caches(
    layout: str, num_blocks: int, block_size: int, hk: int, d: int, kv_dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """(key cache, value cache) filled with POISON (a NaN code): an element no token wrote
    keeps it, and a kernel that writes a padding token's slot replaces it."""
    k_shape, v_shape = cache_shapes(layout, num_blocks, block_size, hk, d, kv_dtype)
    stored = np.dtype(KV_DTYPES[kv_dtype])
    return np.full(k_shape, POISON[stored], stored), np.full(v_shape, POISON[stored], stored)
