"""Chapter 01 references: BF16 and FP8 (E4M3, E5M2) at the bit level.

Every function takes and returns raw bits for the narrow formats (uint16 for BF16, uint8 for
FP8) and numpy float32 for FP32, exactly as the golden files store them. The casts use ml_dtypes
and round where the CUDA instructions round:

- FP32 -> BF16: ``cvt.rn.bf16.f32``, round to nearest even, NaN stays NaN, overflow gives Inf.
- FP32 -> FP8: ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, round to nearest even, NaN stays NaN,
  anything beyond the largest finite value (Inf included) becomes that value with its sign.
- FP8 -> BF16: exact, every FP8 value (and Inf/NaN) is representable in BF16.

The second half of the file decodes and encodes the same formats from their sign, exponent and
mantissa fields with integer arithmetic only. It is independent of ml_dtypes on purpose: the tests
use it to check the functions above, exhaustively where the input space allows.
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

# NaN and out-of-range inputs are part of the contract, not accidents: no warnings for them.
_quiet = np.errstate(invalid="ignore", over="ignore")

E4M3_MAX = 448.0
E5M2_MAX = 57344.0


@_quiet
def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """FP32 -> BF16 bits, rounded to nearest even; NaN stays NaN, overflow rounds to Inf."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bits -> FP32, exact (BF16 is the upper half of an FP32)."""
    return np.asarray(bits, np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


@_quiet
def f64_to_bf16(x: np.ndarray) -> np.ndarray:
    """FP64 -> BF16 bits, rounded ONCE to nearest even.

    ml_dtypes casts FP64 through FP32, which rounds twice (1 + 2^-8 + 2^-30 would become 1.0).
    Rounding to FP32 with round-to-odd first keeps a sticky bit, so the final round to nearest
    even gives the correctly rounded BF16.
    """
    x = np.asarray(x, np.float64)
    f = x.astype(np.float32)
    bits = f.view(np.uint32).astype(np.int64)
    inexact = (f.astype(np.float64) != x) & ~np.isnan(x)
    # An inexact result with an even last bit moves one ulp towards x, onto an odd one.
    step = np.where(np.abs(f) < np.abs(x), 1, -1)
    bits = np.where(inexact & ((bits & 1) == 0), bits + step, bits)
    return f32_to_bf16(bits.astype(np.uint32).view(np.float32))


@_quiet
def f32_to_e4m3(x: np.ndarray) -> np.ndarray:
    """FP32 -> FP8 E4M3 bits, satfinite: NaN stays NaN, |x| > 448 (Inf too) gives +-448,
    everything else rounds to nearest even."""
    clipped = np.clip(np.asarray(x, np.float32), -E4M3_MAX, E4M3_MAX)  # NaN passes through
    return clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


@_quiet
def f32_to_e5m2(x: np.ndarray) -> np.ndarray:
    """FP32 -> FP8 E5M2 bits, satfinite: NaN stays NaN, |x| > 57344 (Inf too) gives +-57344,
    everything else rounds to nearest even."""
    clipped = np.clip(np.asarray(x, np.float32), -E5M2_MAX, E5M2_MAX)  # NaN passes through
    return clipped.astype(ml_dtypes.float8_e5m2).view(np.uint8)


def e4m3_to_bf16(bits: np.ndarray) -> np.ndarray:
    """FP8 E4M3 bits -> BF16 bits, exact (NaN -> NaN)."""
    values = np.asarray(bits, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return f32_to_bf16(values)


def e5m2_to_bf16(bits: np.ndarray) -> np.ndarray:
    """FP8 E5M2 bits -> BF16 bits, exact (Inf -> Inf, NaN -> NaN)."""
    values = np.asarray(bits, np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float32)
    return f32_to_bf16(values)


# ---------------------------------------------------------------------------------------------
# Independent field-level formulas (integer arithmetic; used by the tests only).


@dataclass(frozen=True)
class Format:
    """A binary float format: 1 sign bit, `exp_bits` exponent bits, `man_bits` mantissa bits.

    `ieee`: exponent all ones means Inf (mantissa 0) or NaN. Otherwise (the "fn" formats such as
    E4M3FN) there is no Inf and only the all-ones pattern is NaN, so the top binade has values.
    """

    exp_bits: int
    man_bits: int
    ieee: bool

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_all_ones(self) -> int:
        return (1 << self.exp_bits) - 1

    @property
    def man_all_ones(self) -> int:
        return (1 << self.man_bits) - 1

    @property
    def max_finite_code(self) -> int:
        """Bits of the largest finite positive value."""
        if self.ieee:
            return ((self.exp_all_ones - 1) << self.man_bits) | self.man_all_ones
        return (self.exp_all_ones << self.man_bits) | (self.man_all_ones - 1)

    @property
    def nan_code(self) -> int:
        return (self.exp_all_ones << self.man_bits) | self.man_all_ones

    @property
    def inf_code(self) -> int:
        return self.exp_all_ones << self.man_bits

    @property
    def storage(self) -> type:
        return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[self.bits]


BF16 = Format(exp_bits=8, man_bits=7, ieee=True)
E4M3 = Format(exp_bits=4, man_bits=3, ieee=False)
E5M2 = Format(exp_bits=5, man_bits=2, ieee=True)
F32 = Format(exp_bits=8, man_bits=23, ieee=True)
F64 = Format(exp_bits=11, man_bits=52, ieee=True)


def decode(bits: np.ndarray, fmt: Format) -> np.ndarray:
    """Value of each code as float64: (-1)^s * 2^(e - bias) * 1.m, or 2^(1 - bias) * 0.m when
    the exponent field is 0. Exact for every format narrower than float64."""
    b = np.asarray(bits).astype(np.int64)
    sign = (b >> (fmt.exp_bits + fmt.man_bits)) & 1
    exp = (b >> fmt.man_bits) & fmt.exp_all_ones
    man = b & fmt.man_all_ones
    significand = np.where(exp == 0, man, man | (1 << fmt.man_bits))
    scale = np.maximum(exp, 1) - fmt.bias - fmt.man_bits
    value = np.ldexp(significand.astype(np.float64), scale.astype(np.int32))
    if fmt.ieee:
        top = exp == fmt.exp_all_ones
        value = np.where(top & (man == 0), np.inf, value)
        value = np.where(top & (man != 0), np.nan, value)
    else:
        value = np.where((exp == fmt.exp_all_ones) & (man == fmt.man_all_ones), np.nan, value)
    return np.where(sign == 1, -value, value)


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Number of bits of each non-negative int64 (0 for 0), by binary search on shifts."""
    n = np.zeros(v.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        more = (v >> (n + step)) != 0
        n += np.where(more, step, 0)
    return n + (v != 0)


def encode(x: np.ndarray, fmt: Format, saturate: bool) -> np.ndarray:
    """Bits of float32/float64 values in `fmt`, rounded to nearest, ties to even, on integers.

    Each input is split into an integer significand and a power of two, the significand is shifted
    right to the target's quantum with round-half-to-even, and the result is packed into fields.
    Overflow gives Inf (NaN for "fn" formats), or the largest finite value when `saturate`;
    NaN gives NaN.
    """
    x = np.asarray(x)
    src = {np.dtype(np.float32): F32, np.dtype(np.float64): F64}[x.dtype]
    raw = x.view(src.storage).astype(np.uint64)
    sign = (raw >> np.uint64(src.bits - 1)).astype(np.int64)
    exp = ((raw >> np.uint64(src.man_bits)) & np.uint64(src.exp_all_ones)).astype(np.int64)
    man = (raw & np.uint64(src.man_all_ones)).astype(np.int64)
    # |x| = sig * 2^q exactly.
    sig = np.where(exp == 0, man, man | (1 << src.man_bits))
    q = np.maximum(exp, 1) - src.bias - src.man_bits

    # Target quantum: 2^(floor(log2|x|) - man_bits), but never below the subnormal quantum.
    floor_log2 = q + _bit_length(sig) - 1
    min_exp = 1 - fmt.bias
    target_q = np.maximum(floor_log2, min_exp) - fmt.man_bits
    shift = target_q - q
    assert (shift[sig != 0] > 0).all(), "encode only narrows"
    # sig < 2^53, so any shift of 55 or more rounds to zero exactly as the true shift would.
    shift = np.clip(shift, 1, 55)
    kept = sig >> shift
    rest = sig & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    kept += (rest > half) | ((rest == half) & ((kept & 1) == 1))

    # A carry out of the significand moves to the next binade.
    carry = kept == (1 << (fmt.man_bits + 1))
    kept = np.where(carry, kept >> 1, kept)
    target_q = target_q + carry
    normal = kept >= (1 << fmt.man_bits)
    exp_field = np.where(normal, target_q + fmt.man_bits + fmt.bias, 0)
    man_field = np.where(normal, kept - (1 << fmt.man_bits), kept)
    code = (exp_field << fmt.man_bits) | man_field

    overflow = code > fmt.max_finite_code
    if saturate:
        overflow_code = fmt.max_finite_code
    else:
        overflow_code = fmt.inf_code if fmt.ieee else fmt.nan_code
    src_inf = (exp == src.exp_all_ones) & (man == 0)
    src_nan = (exp == src.exp_all_ones) & (man != 0)
    code = np.where(overflow | src_inf, overflow_code, code)
    code = np.where(src_nan, fmt.nan_code, code)
    code |= sign << (fmt.bits - 1)
    return code.astype(fmt.storage)
