"""lkw.formats: the ml_dtypes-based casts against the independent field-level formulas of the same
module (exhaustively where the input space allows), both against hand-checked values, and
against torch where it is installed."""

import ml_dtypes
import numpy as np
import pytest

from lkw import formats
from lkw.formats import BF16, E4M3, E5M2, decode, encode

# name, cast under test, target format, satfinite
CASTS = [
    ("bf16", formats.f32_to_bf16, BF16, False),
    ("e4m3", formats.f32_to_e4m3, E4M3, True),
    ("e5m2", formats.f32_to_e5m2, E5M2, True),
]
CAST_IDS = [c[0] for c in CASTS]
# name, FP8 -> BF16 function, FP8 format, ml_dtypes type
FP8 = [
    ("e4m3", formats.e4m3_to_bf16, E4M3, ml_dtypes.float8_e4m3fn),
    ("e5m2", formats.e5m2_to_bf16, E5M2, ml_dtypes.float8_e5m2),
]
FP8_IDS = [f[0] for f in FP8]


def f32(bits) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


def assert_same_codes(got: np.ndarray, want: np.ndarray, fmt: formats.Format) -> None:
    """Equal bits, except that a NaN matches any NaN (payload and sign are free)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan_got, nan_want = np.isnan(decode(got, fmt)), np.isnan(decode(want, fmt))
    bad = (nan_got != nan_want) | (~nan_want & (got != want))
    where = np.flatnonzero(bad)[:8]
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} differ, e.g. at {where.tolist()}: "
        f"got {[hex(v) for v in got[where]]}, want {[hex(v) for v in want[where]]}"
    )


def upper_half_neighbourhood(rng) -> np.ndarray:
    """Every FP32 upper half with the low halves that matter for rounding to 16 or fewer bits:
    0, 1, just below/at/above the BF16 tie, all ones, and a random one."""
    upper = np.arange(1 << 16, dtype=np.uint32)[:, None] << 16  # (65536,1)
    fixed = np.tile(np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32), (1 << 16, 1))
    lows = np.column_stack([fixed, rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32)])
    return (upper | lows).reshape(-1).view(np.float32)


def wide_random(rng, n: int) -> np.ndarray:
    """Random FP32 bit patterns (every magnitude, Inf, NaN) and log-uniform values in 2^[-30,20]."""
    patterns = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)
    typical = rng.standard_normal(n) * np.exp2(rng.uniform(-30, 20, n))
    return np.concatenate([patterns, typical.astype(np.float32)])


# --- the independent decoder itself, against values worked out by hand -----------------------

DECODE_ANCHORS = [
    (BF16, 0x3F80, 1.0),
    (BF16, 0xC000, -2.0),
    (BF16, 0x7F7F, 3.3895313892515355e38),
    (BF16, 0x0080, 2.0**-126),
    (BF16, 0x0001, 2.0**-133),
    (BF16, 0x7F80, np.inf),
    (BF16, 0xFF80, -np.inf),
    (E4M3, 0x38, 1.0),
    (E4M3, 0x7E, 448.0),
    (E4M3, 0xFE, -448.0),
    (E4M3, 0x78, 256.0),
    (E4M3, 0x08, 2.0**-6),
    (E4M3, 0x07, 7 * 2.0**-9),
    (E4M3, 0x01, 2.0**-9),
    (E5M2, 0x3C, 1.0),
    (E5M2, 0x7B, 57344.0),
    (E5M2, 0x7C, np.inf),
    (E5M2, 0xFC, -np.inf),
    (E5M2, 0x04, 2.0**-14),
    (E5M2, 0x01, 2.0**-16),
]


@pytest.mark.parametrize(("fmt", "code", "value"), DECODE_ANCHORS)
def test_decode_known_values(fmt, code, value):
    assert decode(np.array([code]), fmt)[0] == value


@pytest.mark.parametrize(
    ("fmt", "nan_codes"),
    [
        (BF16, [0x7FC0, 0xFFC0, 0x7F81]),
        (E4M3, [0x7F, 0xFF]),
        (E5M2, [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]),
    ],
)
def test_decode_nan_codes(fmt, nan_codes):
    every = decode(np.arange(1 << fmt.bits), fmt)
    assert np.isnan(every[nan_codes]).all()
    if fmt is not BF16:  # BF16 has 2 * 127 NaN codes; the FP8 lists above are complete
        assert np.isnan(every).sum() == len(nan_codes)


def test_decode_keeps_the_sign_of_zero():
    zeros = decode(np.array([0x00, 0x80]), E4M3)
    assert (zeros == 0).all() and np.signbit(zeros).tolist() == [False, True]


@pytest.mark.parametrize("fmt", [BF16, E4M3, E5M2])
def test_max_finite_code_is_the_largest_finite_value(fmt):
    every = decode(np.arange(1 << fmt.bits), fmt)
    assert every[fmt.max_finite_code] == np.max(every[np.isfinite(every)])


# --- decoding: exhaustive ---------------------------------------------------------------------


def test_bf16_to_f32_all_codes():
    codes = np.arange(1 << 16, dtype=np.uint16)
    got = formats.bf16_to_f32(codes)
    assert got.dtype == np.float32
    want = decode(codes, BF16)
    finite_or_inf = ~np.isnan(want)
    assert np.isnan(got[~finite_or_inf]).all()
    # Compare bits: -0 must stay -0.
    assert np.array_equal(
        got[finite_or_inf].view(np.uint32), want[finite_or_inf].astype(np.float32).view(np.uint32)
    )


@pytest.mark.parametrize(("name", "to_bf16", "fmt", "fp8"), FP8, ids=FP8_IDS)
def test_fp8_to_bf16_all_codes(name, to_bf16, fmt, fp8):
    codes = np.arange(256, dtype=np.uint8)
    got = to_bf16(codes)
    assert got.dtype == np.uint16
    assert_same_codes(got, encode(decode(codes, fmt), BF16, saturate=False), BF16)


# --- FP32 -> BF16 / FP8 against integer round-half-to-even ------------------------------------


@pytest.mark.parametrize(("name", "cast", "fmt", "saturate"), CASTS, ids=CAST_IDS)
def test_cast_matches_integer_rne_on_every_upper_half(name, cast, fmt, saturate, rng):
    x = upper_half_neighbourhood(rng)
    assert_same_codes(cast(x), encode(x, fmt, saturate), fmt)


@pytest.mark.parametrize(("name", "cast", "fmt", "saturate"), CASTS, ids=CAST_IDS)
def test_cast_matches_integer_rne_on_random_values(name, cast, fmt, saturate, rng):
    x = wide_random(rng, 1_000_000)
    assert_same_codes(cast(x), encode(x, fmt, saturate), fmt)


@pytest.mark.parametrize(("cast", "fmt"), [c[1:3] for c in CASTS[1:]], ids=FP8_IDS)
@pytest.mark.parametrize("sign", [1, -1])
def test_fp8_values_midpoints_and_their_neighbours(cast, fmt, sign):
    """Each FP8 value maps to its own code; a midpoint between neighbours goes to the one with the
    even code; one FP32 ulp off the midpoint goes to the nearer neighbour."""
    codes = np.arange(fmt.max_finite_code + 1, dtype=np.uint8)  # 0 ... max, increasing values
    if sign < 0:
        codes |= 0x80
    values = decode(codes, fmt).astype(np.float32)
    assert_same_codes(cast(values), codes, fmt)
    lo, hi = codes[:-1], codes[1:]
    mids = (values[:-1] + values[1:]) / 2
    even = np.where(lo % 2 == 0, lo, hi)
    assert_same_codes(cast(mids), even, fmt)
    assert_same_codes(cast(np.nextafter(mids, 0)), lo, fmt)
    assert_same_codes(cast(np.nextafter(mids, sign * np.inf)), hi, fmt)
    for x in (mids, np.nextafter(mids, 0), np.nextafter(mids, sign * np.inf)):
        assert_same_codes(encode(x, fmt, saturate=True), cast(x), fmt)


# --- hand-checked rounding, overflow, NaN -----------------------------------------------------

BF16_ANCHORS = [  # FP32 bits -> BF16 bits
    (0x3F808000, 0x3F80),  # tie, even upper half stays
    (0x3F818000, 0x3F82),  # tie, odd upper half rounds up
    (0xBF818000, 0xBF82),
    (0x3F7F8000, 0x3F80),  # tie carrying into the next binade
    (0x3F807FFF, 0x3F80),
    (0x3F808001, 0x3F81),
    (0x7F7F7FFF, 0x7F7F),  # largest finite BF16
    (0x7F7F8000, 0x7F80),  # its tie rounds to Inf
    (0x7F7FFFFF, 0x7F80),  # largest FP32 -> Inf
    (0xFF7FFFFF, 0xFF80),
    (0x7F800000, 0x7F80),
    (0x00008000, 0x0000),  # subnormal tie to even zero
    (0x00018000, 0x0002),  # subnormal tie, odd -> up
    (0x007FFFFF, 0x0080),  # largest FP32 subnormal -> smallest normal
    (0x80000001, 0x8000),  # -tiny -> -0
]


@pytest.mark.parametrize(("x_bits", "want"), BF16_ANCHORS, ids=[hex(a[0]) for a in BF16_ANCHORS])
def test_f32_to_bf16_known_roundings(x_bits, want):
    x = f32([x_bits])
    assert formats.f32_to_bf16(x)[0] == want
    assert encode(x, BF16, saturate=False)[0] == want


@pytest.mark.parametrize("nan_bits", [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFF800001])
def test_nan_stays_nan(nan_bits):
    """These are the NaNs that the "add 0x7fff plus the odd bit" trick turns into Inf or -0."""
    x = f32([nan_bits])
    for _, cast, fmt, saturate in CASTS:
        assert np.isnan(decode(cast(x), fmt)).all()
        assert np.isnan(decode(encode(x, fmt, saturate), fmt)).all()


FP8_ANCHORS = [  # format, FP32 value, expected code
    (E4M3, 2.0**-10, 0x00),  # half the smallest subnormal: tie to even (zero)
    (E4M3, np.nextafter(np.float32(2.0**-10), 1), 0x01),
    (E4M3, 1.5 * 2.0**-9, 0x02),  # tie between codes 1 and 2
    (E4M3, -(2.0**-11), 0x80),  # underflow keeps the sign
    (E4M3, 1.0625, 0x38),  # tie between 1 (0x38) and 1.125 (0x39)
    (E4M3, 1.1875, 0x3A),  # tie between 1.125 (0x39) and 1.25 (0x3a)
    (E4M3, 1e-45, 0x00),
    (E5M2, 2.0**-17, 0x00),
    (E5M2, 1.125, 0x3C),  # tie between 1 (0x3c) and 1.25 (0x3d)
    (E5M2, 1.375, 0x3E),  # tie between 1.25 (0x3d) and 1.5 (0x3e)
]


@pytest.mark.parametrize(("fmt", "x", "want"), FP8_ANCHORS)
def test_fp8_known_roundings(fmt, x, want):
    cast = formats.f32_to_e4m3 if fmt is E4M3 else formats.f32_to_e5m2
    xs = np.array([x], np.float32)
    assert cast(xs)[0] == want
    assert encode(xs, fmt, saturate=True)[0] == want


@pytest.mark.parametrize(
    ("cast", "fmt", "max_finite", "top_tie"),
    [
        (formats.f32_to_e4m3, E4M3, formats.E4M3_MAX, 464.0),
        (formats.f32_to_e5m2, E5M2, formats.E5M2_MAX, 61440.0),
    ],
    ids=FP8_IDS,
)
def test_satfinite(cast, fmt, max_finite, top_tie):
    """Anything beyond the largest finite value, Inf included, becomes it with its sign."""
    assert decode(np.array([fmt.max_finite_code]), fmt)[0] == max_finite
    beyond = np.array(
        [np.nextafter(np.float32(max_finite), np.inf), top_tie, 2 * max_finite, 1e30, np.inf],
        np.float32,
    )
    x = np.concatenate([beyond, -beyond])
    want = np.repeat(np.array([fmt.max_finite_code, fmt.max_finite_code | 0x80], np.uint8), 5)
    assert np.array_equal(cast(x), want)
    assert np.array_equal(encode(x, fmt, saturate=True), want)


def test_without_saturation_the_encoder_overflows():
    """The encoder's non-saturating mode (used for BF16): E5M2 overflows to Inf, E4M3 to NaN."""
    x = np.array([61440.0, np.inf], np.float32)
    assert np.isinf(decode(encode(x, E5M2, saturate=False), E5M2)).all()
    assert np.isnan(decode(encode(x, E4M3, saturate=False), E4M3)).all()


def test_f64_to_bf16_rounds_once():
    """1 + 2^-8 + 2^-30 is above the midpoint between 1 and 1 + 2^-7; rounding through FP32 first
    would land exactly on the midpoint and then on 1."""
    x = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-8, 1 + 3 * 2**-8])
    assert formats.f64_to_bf16(x).tolist() == [0x3F81, 0xBF81, 0x3F80, 0x3F82]


def test_f64_to_bf16_matches_integer_rne(rng):
    n = 1_000_000
    x = rng.standard_normal(n) * np.exp2(rng.uniform(-140, 140, n))
    # BF16 midpoints nudged by 2^-40 relative, below FP32 precision: rounding through FP32 would
    # land on the midpoint itself and then on the even neighbour.
    codes = rng.integers(0, 0x7F7F, n, dtype=np.uint16)  # finite, positive, with a successor
    mids = (decode(codes, BF16) + decode(codes + 1, BF16)) / 2
    up = rng.integers(0, 2, n).astype(bool)
    nudged = mids * (1 + np.where(up, 2.0**-40, -(2.0**-40)))
    assert np.array_equal(formats.f64_to_bf16(nudged), codes + up)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 1e300, 3.4e38])
    x = np.concatenate([x, nudged, specials])
    assert_same_codes(formats.f64_to_bf16(x), encode(x, BF16, saturate=False), BF16)


# --- torch, where present (it does not saturate FP8 casts, so inputs are clipped first) --------


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_against_torch_f32_to_bf16(torch, rng):
    x = np.concatenate([upper_half_neighbourhood(rng), wide_random(rng, 200_000)])
    got = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert_same_codes(formats.f32_to_bf16(x), got, BF16)


@pytest.mark.parametrize(
    ("cast", "fmt", "torch_dtype", "max_finite"),
    [
        (formats.f32_to_e4m3, E4M3, "float8_e4m3fn", formats.E4M3_MAX),
        (formats.f32_to_e5m2, E5M2, "float8_e5m2", formats.E5M2_MAX),
    ],
    ids=FP8_IDS,
)
def test_against_torch_f32_to_fp8(torch, rng, cast, fmt, torch_dtype, max_finite):
    x = np.concatenate([upper_half_neighbourhood(rng), wide_random(rng, 200_000)])
    clipped = np.clip(x, -max_finite, max_finite)
    dtype = getattr(torch, torch_dtype)
    got = torch.from_numpy(clipped).to(dtype).view(torch.uint8).numpy()
    assert_same_codes(cast(x), got, fmt)


@pytest.mark.parametrize(("name", "to_bf16", "fmt", "fp8"), FP8, ids=FP8_IDS)
def test_against_torch_fp8_to_bf16(torch, name, to_bf16, fmt, fp8):
    codes = np.arange(256, dtype=np.uint8)
    dtype = getattr(torch, np.dtype(fp8).name)
    got = torch.from_numpy(codes).view(dtype).to(torch.bfloat16).view(torch.int16).numpy()
    assert_same_codes(to_bf16(codes), got.view(np.uint16), BF16)
