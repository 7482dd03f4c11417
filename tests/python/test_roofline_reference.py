"""lkw.roofline: the copy and the BF16 GEMM references."""

import numpy as np
import pytest

from lkw import roofline
from lkw.formats import BF16, bf16_to_f32, encode, f32_to_bf16


def bf16(values) -> np.ndarray:
    """BF16 bits of values that BF16 holds exactly."""
    x = np.array(values, np.float32)
    bits = f32_to_bf16(x)
    assert np.array_equal(bf16_to_f32(bits), x), "test data must be exact in BF16"
    return bits


def test_copy_is_a_bitwise_copy(rng):
    words = rng.integers(0, 2**32, 4099, dtype=np.uint32)
    out = roofline.copy(words)
    assert out.dtype == np.uint32 and np.array_equal(out, words)
    assert not np.shares_memory(out, words)


def test_gemm_by_hand():
    a = bf16([[1, 2, 3]])  # (1,3)
    b = bf16([[1, 0, -1], [0.5, 0.25, 2]])  # (2,3)
    c = roofline.gemm_bf16(a, b)  # (1,2): [1 - 3, 0.5 + 0.5 + 6]
    assert c.dtype == np.uint16 and c.shape == (1, 2)
    assert bf16_to_f32(c).tolist() == [[-2.0, 7.0]]


def test_gemm_uses_b_transposed(rng):
    """C[m,n] = sum_k A[m,k] B[n,k], written as loops, rounded once by the integer encoder."""
    a = f32_to_bf16(rng.standard_normal((3, 5), np.float32))
    b = f32_to_bf16(rng.standard_normal((4, 5), np.float32))
    a64, b64 = bf16_to_f32(a).astype(np.float64), bf16_to_f32(b).astype(np.float64)
    want = np.array(
        [[sum(a64[m, k] * b64[n, k] for k in range(5)) for n in range(4)] for m in range(3)]
    )
    assert np.array_equal(roofline.gemm_bf16(a, b), encode(want, BF16, saturate=False))


def test_gemm_rounds_once():
    """The exact sum 1 + 2^-8 + 2^-30 rounds up to 1 + 2^-7; through FP32 it would round to 1."""
    a = bf16([[1, 2.0**-8, 2.0**-30]])
    b = bf16([[1, 1, 1]])
    assert roofline.gemm_bf16(a, b).tolist() == [[0x3F81]]


def test_gemm_matches_integer_rounding_of_the_float64_product(rng):
    a = f32_to_bf16(rng.standard_normal((33, 130), np.float32))  # (M,K)
    b = f32_to_bf16(rng.standard_normal((77, 130), np.float32))  # (N,K)
    exact = bf16_to_f32(a).astype(np.float64) @ bf16_to_f32(b).astype(np.float64).T
    assert np.array_equal(roofline.gemm_bf16(a, b), encode(exact, BF16, saturate=False))


def test_gemm_refuses_mismatched_k():
    with pytest.raises(ValueError, match="A\\[M,K\\] and B\\[N,K\\]"):
        roofline.gemm_bf16(bf16([[1, 2, 3]]), bf16([[1, 2]]))
