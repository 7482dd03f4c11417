"""Chapter 03 references: dynamic (absmax) quantization of BF16 activations to FP8 E4M3 and INT8.

This docstring is the contract the chapter's kernels implement. Inputs are BF16 bits (uint16)
[T, d], as the golden files store them; every step below is FP32 arithmetic with IEEE round to
nearest even, and the kernels must round at exactly these points, so their outputs match bit for
bit (absmax is exact whatever the reduction order: max is associative).

Constants (FP32):
    E4M3_MAX  = 448
    INT8_MAX  = 127
    MIN_SCALE = 1 / (448 * 512)   vLLM's min_scaling_factor for E4M3, the FP32 division
                                  1.0f / 229376.0f: an all-zero row gets a finite scale, no 0/0

Per row (or tensor, or group) of BF16 values x, with x32 = fp32(x) (exact):

    absmax = max |x32|                                   exact; 0 for an all-zero row
    FP8:   a      = min(absmax, scale_ub)                only when scale_ub is given (vLLM
                                                         clamps the absmax, not the scale)
           scale  = max(fp32(a / 448), MIN_SCALE)
           inv    = fp32(1 / scale)                      once per row, round to nearest even
           q      = e4m3_satfinite(fp32(x32 * inv))      the product is rounded to FP32 first,
                                                         then cvt.rn.satfinite.e4m3x2.f32
                                                         (lkw.formats.f32_to_e4m3: RNE, |v| > 448
                                                         gives +-448, which only scale_ub causes)
    INT8:  scale  = fp32(absmax / 127)                   no minimum: an all-zero row has scale 0
           inv    = fp32(1 / scale), and inv = 0 when scale == 0 (so that row's q is 0, where
                    1/0 = Inf and 0 * Inf = NaN would otherwise leave q undefined)
           q      = saturate_int8(rint(fp32(x32 * inv))) rint = round half to even
                                                         (cvt.rni.sat.s8.f32); saturation to
                                                         [-128, 127] (never reached by data with
                                                         inv from the row's own absmax)

Ops (outputs in this order; q has the input's shape):
    per_token_fp8(x, scale_ub=None) -> q e4m3 [T, d], scales float32 [T, 1]
    per_token_int8(x)               -> q int8 [T, d], scales float32 [T, 1]
    per_tensor_fp8(x)               -> q e4m3 [T, d], scale float32 [1]   (absmax over the tensor)
    per_group_fp8(x)                -> q e4m3 [T, d], scales float32 [d/128, T]
        Groups are 1 x 128 along d (d a multiple of 128); group g of token t is x[t, 128g:128g+128].
        The scales are COLUMN-MAJOR: the stored array has shape (d/128, T) and element [g, t] is
        the scale of token t, group g, so the T scales of one group are contiguous -- the layout
        cuBLASLt's 1 x 128 (VEC128_32F) activation scales and DeepGEMM's A scales read. With the
        param scales_row_major = 1 they are (T, d/128) instead (the param decides, not the shape,
        which is the same for both when T = d/128).

Dequantized value: q * scale (scale[t] per token, scale per tensor, scale[g, t] per group).

Where this follows vLLM (csrc/quantization/.../fp8/common.cu, int8/scaled_quant.cu) and where it
fixes a choice vLLM leaves open:
- scale_ub: vLLM's per-token FP8 kernel takes min(absmax, *scale_ub) before dividing by 448 and
  applying the minimum; so does this reference.
- vLLM's plain per-token FP8 kernel divides every element by the scale (x / scale, "to match
  FBGemm"), while its per-tensor kernel and its fused RMSNorm+quant kernels multiply by the
  reciprocal. This contract multiplies by inv = 1/scale everywhere, so the fused and the
  unfused paths agree; x / scale and x * (1/scale) differ in the last FP32 bit now and then,
  which can move q by one E4M3 code.
- vLLM's INT8 kernel computes inv as 127 / absmax in one division; here it is 1 / scale with
  scale = absmax / 127 (the stored scale), which can differ from it in the last bit. For an
  all-zero row vLLM stores scale 0 and its cvt.rni.sat turns the NaN into 0: the same result
  as inv = 0 here.
- vLLM's dynamic per-tensor FP8 has no minimum scale; here it has MIN_SCALE like per-token.
- vLLM's per-group quant uses max(absmax, 1e-10) / 448; here it is max(absmax / 448, MIN_SCALE),
  the per-token rule.
"""

import numpy as np

from lkw import formats

E4M3_MAX = np.float32(formats.E4M3_MAX)
INT8_MAX = np.float32(127)
MIN_SCALE = np.float32(1) / np.float32(448 * 512)
GROUP = 128  # per_group_fp8: 1 x 128 groups along d


def _rows(x: np.ndarray) -> np.ndarray:
    """BF16 bits [T, d] -> FP32 values [T, d] (exact)."""
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype != np.uint16:
        raise ValueError(f"expected BF16 bits [T, d] (uint16), got {x.dtype} {x.shape}")
    return formats.bf16_to_f32(x)


def fp8_scale(absmax: np.ndarray, scale_ub: float | None = None) -> np.ndarray:
    """FP32 scale from FP32 absmax: max(min(absmax, scale_ub) / 448, MIN_SCALE)."""
    a = np.asarray(absmax, np.float32)
    if scale_ub is not None:
        a = np.minimum(a, np.float32(scale_ub))
    return np.maximum(a / E4M3_MAX, MIN_SCALE)


def quantize_fp8(x32: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """E4M3 bits of satfinite(fp32(x32 * fp32(1 / scale))); `scale` broadcasts against x32."""
    inv = np.float32(1) / np.asarray(scale, np.float32)
    return formats.f32_to_e4m3(x32 * inv)


def saturate_int8(v: np.ndarray) -> np.ndarray:
    """FP32 -> int8 as cvt.rni.sat.s8.f32: round half to even, clamp to [-128, 127], NaN -> 0."""
    v = np.rint(np.asarray(v, np.float32))  # numpy rounds half to even
    v = np.where(np.isnan(v), np.float32(0), v)
    return np.clip(v, -128, 127).astype(np.int8)


def quantize_int8(x32: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8 of rint(fp32(x32 * inv)), inv = fp32(1 / scale), inv = 0 where scale == 0."""
    scale = np.asarray(scale, np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0))
    return saturate_int8(x32 * inv)


def per_token_fp8(x: np.ndarray, scale_ub: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BF16 [T, d] -> (E4M3 bits [T, d], FP32 scales [T, 1]), one scale per row."""
    x32 = _rows(x)
    scales = fp8_scale(np.max(np.abs(x32), axis=1, keepdims=True), scale_ub)  # (T,1)
    return quantize_fp8(x32, scales), scales


def per_token_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BF16 [T, d] -> (int8 [T, d], FP32 scales [T, 1]), scale = absmax / 127."""
    x32 = _rows(x)
    scales = np.max(np.abs(x32), axis=1, keepdims=True) / INT8_MAX  # (T,1)
    return quantize_int8(x32, scales), scales


def per_tensor_fp8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BF16 [T, d] -> (E4M3 bits [T, d], FP32 scale [1]), one scale for the whole tensor."""
    x32 = _rows(x)
    scale = fp8_scale(np.max(np.abs(x32)).reshape(1))  # (1,)
    return quantize_fp8(x32, scale), scale


def per_group_fp8(x: np.ndarray, scales_row_major: float = 0) -> tuple[np.ndarray, np.ndarray]:
    """BF16 [T, d] -> (E4M3 bits [T, d], FP32 scales [d/128, T] column-major), 1 x 128 groups;
    with scales_row_major (a case param, so 0 or 1) the scales are [T, d/128] instead."""
    x32 = _rows(x)
    t, d = x32.shape
    if d % GROUP:
        raise ValueError(f"per_group_fp8: d = {d} is not a multiple of {GROUP}")
    groups = x32.reshape(t, d // GROUP, GROUP)  # (T,G,128)
    scales = fp8_scale(np.max(np.abs(groups), axis=2))  # (T,G)
    q = quantize_fp8(groups, scales[:, :, None]).reshape(t, d)
    return q, np.ascontiguousarray(scales if scales_row_major else scales.T)  # (T,G) or (G,T)


def dequantize(q: np.ndarray, scales: np.ndarray, kind: str) -> np.ndarray:
    """float64 q * scale for the outputs of the op `kind` (the four above)."""
    if kind == "per_token_int8":
        values = np.asarray(q, np.int8).astype(np.float64)
    else:
        values = formats.decode(np.asarray(q, np.uint8), formats.E4M3)
    s = np.asarray(scales, np.float64)
    if kind == "per_group_fp8":
        t, d = values.shape
        return (values.reshape(t, d // GROUP, GROUP) * s.T[:, :, None]).reshape(t, d)
    return values * s  # (T,1) or (1,) broadcast
