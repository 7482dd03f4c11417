"""Chapter 00 references: the copy kernel and the BF16 GEMM peer that measure the ceilings."""

import numpy as np

from lkw.formats import bf16_to_f32, f64_to_bf16


def copy(words: np.ndarray) -> np.ndarray:
    """dst = src for n 4-byte words (uint32), bit for bit."""
    return np.array(words, np.uint32, copy=True)


def gemm_bf16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C[M,N] = A[M,K] . B[N,K]^T for BF16 bits in and out.

    The products and their sum are computed in float64 (exact products, far more accurate sums
    than the kernel's FP32 accumulation); the only rounding is the final one to BF16.
    """
    a64 = bf16_to_f32(a).astype(np.float64)  # (M,K)
    b64 = bf16_to_f32(b).astype(np.float64)  # (N,K)
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[1]:
        raise ValueError(f"gemm_bf16 needs A[M,K] and B[N,K], got {a64.shape} and {b64.shape}")
    return f64_to_bf16(a64 @ b64.T)  # (M,N)
