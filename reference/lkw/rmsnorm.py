"""Chapter 04 references: RMSNorm, fused residual add + RMSNorm, and fused add + RMSNorm +
dynamic quantization (per token to FP8 E4M3 or INT8, or per 1 x 128 group to FP8).

This docstring is the contract the chapter's kernels implement. Tensors are BF16 bits (uint16):
x [T, d], residual [T, d], weight [d]; eps is a param, passed to the kernel as an FP32 (eps32 =
fp32(eps)). Per row, with every BF16 value widened to FP32 exactly:

    r     = bf16(fp32(x) + fp32(residual))      fused ops only: the sum is rounded to BF16 FIRST,
                                                and that rounded r is what the variance, the
                                                normalization and residual_out all use (vLLM's
                                                fused_add_rms_norm and the seed's kernel do this)
    v     = r (fused) or x (rmsnorm)
    ss    = sum v^2                             FP32 in the kernel, any order; FP64 here (exact
                                                for BF16 inputs of ordinary range)
    rstd  = fp32(1 / sqrt(ss / d + eps32))      one FP32 per row (the kernel may use rsqrtf)
    z     = bf16(fp32(v * rstd))                the normalized value is rounded to BF16 BEFORE
                                                the weight multiply, as vLLM's rms_norm_kernel
                                                ((scalar_t)(x * s_variance)) * weight) and its
                                                fused RMSNorm+quant kernels do, and as Hugging
                                                Face's LlamaRMSNorm does (weight * h.to(dtype))
    y     = bf16(z * w)                         z * w is exact in FP32 (8-bit significands), so
                                                this is the one rounding of the product
The quantized ops quantize y (called yb: the BF16 value the unfused chain -- the RMSNorm kernel
writing BF16, then per_token_fp8/int8 reading it -- would hand over) with lkw.quant's per-token
rules: scale = max(absmax(yb) / 448, MIN_SCALE), q = e4m3(fp32(yb * fp32(1/scale))) for FP8;
scale = absmax(yb) / 127, q = rint(fp32(yb * fp32(1/scale))) for INT8. The group op quantizes yb
with lkw.quant.per_group_fp8: the FP8 rule applied to each 1 x 128 slice of a row (d a multiple of
128), the scales column-major [d/128, T] -- the blockwise FP8 GEMM's activation format.

Ops (outputs in this order):
    rmsnorm(x, w, eps)                         -> y BF16 [T, d]
    fused_add_rmsnorm(x, residual, w, eps)     -> y BF16 [T, d], residual_out BF16 [T, d]
    fused_add_rmsnorm_fp8(x, residual, w, eps) -> q E4M3 [T, d], scales FP32 [T, 1], residual_out
    fused_add_rmsnorm_int8(...)                -> q int8 [T, d], scales FP32 [T, 1], residual_out
    fused_add_rmsnorm_fp8_group(...)           -> q E4M3 [T, d], scales FP32 [d/128, T],
                                                  residual_out
residual_out = r. The kernels update the residual IN PLACE (vLLM's signature); a test checks the
in-place kernel by comparing the updated residual buffer with residual_out.

How a kernel is compared (the summation order of ss is free, so rstd is only known to a few
FP32 ulps, and z can land on the other side of a BF16 rounding boundary):
- residual_out: exact (an FP32 sum of two BF16 values, rounded once; no reduction involved).
- y: within TOLERANCE_Y = 2 BF16 ulps. One BF16 ulp of z is up to 2^-7 of z but can be 2 ulps
  of y = z * w (z at the bottom of its binade, z * w at the top of its), so a 1-ulp bound on y
  is not safe; tests/python/test_rmsnorm_reference.py measures this on FP32 kernel emulations.
- q and scales of the fused quant ops: exactly quantize_from_normalized(yb) of the kernel's OWN
  yb (the test obtains yb from the same version's fused_add_rmsnorm path, or from a debug
  output), because a scale is a function of one element of yb and moves by 2^-8 when that
  element moves by an ulp. Against the golden files, whose q and scales come from this
  reference's yb, they are close but not exact (see lkw.golden's tolerance for these cases).
A golden manifest carries ONE tolerance per case, so the fused cases' residual_out is compared
within that case's tolerance there; the chapter's C++ tests should also compare it (the last
output of every fused op) exactly.

Where this follows vLLM and where it fixes a choice: rms_norm_kernel and the fused RMSNorm +
dynamic quant kernels round x * rstd to BF16 before the weight multiply (followed here); the
width-8 fused_add_rms_norm path of v0.20 computes x * rstd * w in FP32 with one rounding (not
followed: then fused and unfused outputs would differ). vLLM's fused add + RMSNorm + quant kernel
takes the variance of the FP32 sum x + residual, unrounded; this contract (and vLLM's
fused_add_rms_norm, and the seed's kernel) takes it of the BF16-rounded residual_out.
vLLM rounds the INT8 fused path's scale up to at least FLT_EPSILON; here an all-zero row gives
scale 0 and q 0, as lkw.quant.per_token_int8 does.
"""

import numpy as np

from lkw import formats, quant

TOLERANCE_Y = "ulp:2"


def _bf16(x: np.ndarray, ndim: int, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != ndim or x.dtype != np.uint16:
        raise ValueError(f"{what}: expected BF16 bits with {ndim} dims (uint16), got {x.dtype}")
    return formats.bf16_to_f32(x)


def rstd(v32: np.ndarray, eps: float) -> np.ndarray:
    """FP32 rstd [T, 1] = fp32(1 / sqrt(mean(v^2) + fp32(eps))), the sum in FP64."""
    v = v32.astype(np.float64)
    mean = np.sum(v * v, axis=1, keepdims=True) / v.shape[1]
    return (1.0 / np.sqrt(mean + np.float64(np.float32(eps)))).astype(np.float32)


def normalize(v32: np.ndarray, rstd32: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = bf16(bf16(fp32(v * rstd)) * w), BF16 bits; the two rounding points of the contract."""
    z = formats.bf16_to_f32(formats.f32_to_bf16(v32 * rstd32))  # fp32 product, then BF16
    return formats.f32_to_bf16(z * _bf16(w, 1, "weight"))  # exact FP32 product, one rounding


def add_residual(x: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """residual_out = bf16(fp32(x) + fp32(residual)), BF16 bits."""
    return formats.f32_to_bf16(_bf16(x, 2, "x") + _bf16(residual, 2, "residual"))


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """BF16 [T, d], weight [d] -> y BF16 [T, d]."""
    x32 = _bf16(x, 2, "x")
    return normalize(x32, rstd(x32, eps), w)


def fused_add_rmsnorm(x, residual, w, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """-> (y = rmsnorm(residual_out), residual_out = bf16(x + residual)), both BF16 bits."""
    r = add_residual(x, residual)
    return rmsnorm(r, w, eps), r


def quantize_from_normalized(yb: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(q, scales) of the BF16 normalized output yb, `kind` "fp8" or "int8" (scales [T, 1]) or
    "fp8_group" (scales [d/128, T]): what a fused kernel must produce, bit for bit, from the yb
    it computed."""
    if kind == "fp8":
        return quant.per_token_fp8(yb)
    if kind == "int8":
        return quant.per_token_int8(yb)
    if kind == "fp8_group":
        return quant.per_group_fp8(yb)
    raise ValueError(f"kind must be 'fp8', 'int8' or 'fp8_group', got {kind!r}")


def fused_add_rmsnorm_fp8(x, residual, w, eps: float):
    """-> (q E4M3 bits [T, d], scales FP32 [T, 1], residual_out BF16 [T, d])."""
    yb, r = fused_add_rmsnorm(x, residual, w, eps)
    return (*quantize_from_normalized(yb, "fp8"), r)


def fused_add_rmsnorm_int8(x, residual, w, eps: float):
    """-> (q int8 [T, d], scales FP32 [T, 1], residual_out BF16 [T, d])."""
    yb, r = fused_add_rmsnorm(x, residual, w, eps)
    return (*quantize_from_normalized(yb, "int8"), r)


def fused_add_rmsnorm_fp8_group(x, residual, w, eps: float):
    """-> (q E4M3 bits [T, d], scales FP32 [d/128, T], residual_out BF16 [T, d]): chapter 03's
    per_group_fp8 of yb. d must be a multiple of 128 (refused before anything is computed)."""
    d = np.shape(x)[-1]
    if d % quant.GROUP:
        raise ValueError(f"fused_add_rmsnorm_fp8_group: d = {d} is not a multiple of {quant.GROUP}")
    yb, r = fused_add_rmsnorm(x, residual, w, eps)
    return (*quantize_from_normalized(yb, "fp8_group"), r)
