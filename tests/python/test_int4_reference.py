"""lkw.int4 (chapter 02): packing and the interleaved order, the dequant references against
independent integer-level computations, the host emulation of the kernels' magic-number unpack
(lop3, prmt, packed FP16/BF16 arithmetic) bit for bit against the references on every 16-bit
nibble pattern, and the chapter's golden and bench cases. Nothing here needs a GPU."""

import ml_dtypes
import numpy as np
import pytest

from lkw import bench, formats, golden, int4
from lkw.formats import BF16, E4M3, decode, encode
from lkw.int4 import PERM

F16 = formats.Format(exp_bits=5, man_bits=10, ieee=True)  # IEEE binary16, for the field decoder
FMT = {"float16": F16, "bfloat16": BF16}
# Position of element e in an interleaved word (the inverse of PERM).
POSITION = [PERM.index(e) for e in range(8)]
# Every E4M3FN code but the two NaNs.
E4M3_FINITE = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
MAGIC_OPS = ("int4i_f16", "int4i_bf16", "int4i_zp_f16", "int4i_zp_bf16", "int8_f16", "e4m3_f16",
             "e4m3_bf16")


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    bad = got != want
    where = np.argwhere(bad)[:5]
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} differ, e.g. at {where.tolist()}: "
        f"got {[hex(int(got[tuple(i)])) for i in where]}, "
        f"want {[hex(int(want[tuple(i)])) for i in where]}"
    )


def f16_bits(value: float) -> int:
    return int(np.float16(value).view(np.uint16))


def bf16_bits(value: float) -> int:
    return int(np.array(value, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16))


# --- packing ----------------------------------------------------------------------------------


def test_pack_hand_example():
    q = np.arange(8)
    assert int(int4.pack(q)[0]) == 0x76543210  # element j in bits 4j..4j+3
    # Positions 0..7 hold elements 0, 2, 4, 6, 1, 3, 5, 7 (read right to left below).
    assert int(int4.pack(q, interleaved=True)[0]) == 0x75316420
    assert int4.unpack(np.array([0x76543210], np.uint32)).tolist() == list(range(8))
    assert int4.unpack(np.array([0x75316420], np.uint32), interleaved=True).tolist() == list(
        range(8)
    )


def test_natural_order_against_python_ints(rng):
    """Element k of row n is nibble k % 8 (bits 4j..4j+3) of word k // 8, read with Python ints."""
    words = rng.integers(0, 2**32, (3, 5), dtype=np.uint32)  # (N,K/8)
    q = int4.unpack(words)
    assert q.shape == (3, 40) and q.dtype == np.uint8
    for n in range(3):
        for k in range(40):
            assert q[n, k] == (int(words[n, k // 8]) >> (4 * (k % 8))) & 0xF


def test_interleaved_order_against_python_ints(rng):
    words = rng.integers(0, 2**32, (3, 5), dtype=np.uint32)  # (N,K/8)
    q = int4.unpack(words, interleaved=True)
    for n in range(3):
        for k in range(40):
            position = PERM.index(k % 8)
            assert q[n, k] == (int(words[n, k // 8]) >> (4 * position)) & 0xF


@pytest.mark.parametrize("interleaved", [False, True])
def test_pack_unpack_round_trip(rng, interleaved):
    q = rng.integers(0, 16, (7, 96))
    words = int4.pack(q, interleaved)
    assert words.shape == (7, 12) and words.dtype == np.uint32
    assert np.array_equal(int4.unpack(words, interleaved), q)


def test_every_half_word_holds_every_16_bit_pattern_in_both_halves(rng):
    words = int4.every_half_word(rng)
    assert words.shape == (1 << 16,) and words.dtype == np.uint32
    every = np.arange(1 << 16)
    assert np.array_equal(np.sort(words & 0xFFFF), every)
    assert np.array_equal(np.sort(words >> 16), every)


@pytest.mark.parametrize("interleaved", [False, True])
def test_unpack_pack_round_trip_every_half_word(rng, interleaved):
    words = int4.every_half_word(rng)
    assert np.array_equal(int4.pack(int4.unpack(words, interleaved), interleaved), words)
    as_int32 = int4.unpack(words.view(np.int32), interleaved)  # torch hands over int32 views
    assert np.array_equal(as_int32, int4.unpack(words, interleaved))


def interleave_by_masks(w: np.ndarray) -> np.ndarray:
    """The repack as shifts and masks: element e moves from nibble e to nibble POSITION[e]
    (0->0, 1->4, 2->1, 3->5, 4->2, 5->6, 6->3, 7->7)."""
    w = w.astype(np.uint32)
    return (
        (w & 0xF000000F)
        | ((w & 0x000000F0) << 12)
        | ((w & 0x00000F00) >> 4)
        | ((w & 0x0000F000) << 8)
        | ((w & 0x000F0000) >> 8)
        | ((w & 0x00F00000) << 4)
        | ((w & 0x0F000000) >> 12)
    ).astype(np.uint32)


def test_interleave_against_a_direct_formula(rng):
    words = np.concatenate([int4.every_half_word(rng), rng.integers(0, 2**32, 4096, np.uint32)])
    assert np.array_equal(int4.interleave(words), interleave_by_masks(words))
    assert int(int4.interleave(np.array([0x76543210], np.uint32))[0]) == 0x75316420


def test_interleave_and_deinterleave_are_inverse(rng):
    words = int4.every_half_word(rng).reshape(256, 256)
    il = int4.interleave(words)
    assert il.shape == words.shape
    assert np.array_equal(int4.deinterleave(il), words)
    assert np.array_equal(int4.interleave(int4.deinterleave(words)), words)
    assert np.array_equal(int4.unpack(il, interleaved=True), int4.unpack(words))
    assert not np.array_equal(il, words)
    # The permutation is two 3-cycles of nibble positions (1 2 4)(3 6 5): three repacks undo it.
    assert np.array_equal(int4.interleave(int4.interleave(il)), words)


def test_interleaved_masks_pick_consecutive_pairs(rng):
    """Why the order: the mask 0x000F000F on a word shifted by 4i puts elements (2i, 2i+1) into
    the low nibbles of the two 16-bit halves."""
    words = int4.every_half_word(rng)
    q = int4.unpack(words, interleaved=True).reshape(-1, 8)
    for i in range(4):
        picked = (words >> np.uint32(4 * i)) & np.uint32(0x000F000F)
        assert np.array_equal(picked & 0xF, q[:, 2 * i])
        assert np.array_equal(picked >> 16, q[:, 2 * i + 1])


def test_pack_refuses_bad_input():
    with pytest.raises(ValueError):
        int4.pack(np.array([16] + [0] * 7))
    with pytest.raises(ValueError):
        int4.pack(np.array([-1] + [0] * 7))
    with pytest.raises(ValueError):
        int4.pack(np.zeros(12, np.uint8))
    with pytest.raises(TypeError):
        int4.unpack(np.zeros(4, np.int64))


# --- rounding once ----------------------------------------------------------------------------


def midpoints_and_neighbours(fmt: formats.Format) -> np.ndarray:
    """Every finite value of a 16-bit format, the midpoints between neighbours (ties), one
    float64 ulp either side of them, and values past the largest finite one; both signs."""
    values = decode(np.arange(1 << 16), fmt)
    finite = np.unique(np.abs(values[np.isfinite(values)]))
    top = finite[-1] + (finite[-1] - finite[-2]) / 2  # the tie that rounds to Inf
    mids = np.append((finite[:-1] + finite[1:]) / 2, top)
    near = np.concatenate([finite, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    near = np.append(near, [2 * finite[-1], 1e300, np.inf])
    return np.concatenate([near, -near])


def test_f64_to_f16_rounds_once_to_nearest_even(rng):
    """numpy's float64 -> float16 cast against integer round-half-to-even on the fields: ties,
    near-ties, subnormals, overflow, and random float64 over every FP16 binade."""
    x = np.concatenate(
        [
            midpoints_and_neighbours(F16),
            rng.standard_normal(200_000) * np.exp2(rng.uniform(-30, 17, 200_000)),
            # FP16 midpoints plus a bit far below float32's precision: a cast through float32
            # would lose it and round the tie to even instead of up.
            (decode(np.arange(0x3C00, 0x4400), F16) + 2.0**-11) + 2.0**-40,
        ]
    )
    assert_bits_equal(int4.f64_to_f16(x), encode(x, F16, saturate=False), "float16")


def test_f64_to_bf16_rounds_once_where_ml_dtypes_rounds_twice(rng):
    x = np.concatenate(
        [
            midpoints_and_neighbours(BF16),
            rng.standard_normal(200_000) * np.exp2(rng.uniform(-140, 127, 200_000)),
        ]
    )
    assert_bits_equal(int4.round_to(x, "bfloat16"), encode(x, BF16, saturate=False), "bfloat16")
    # The reason for formats.f64_to_bf16: 1 + 2^-8 + 2^-30 is above the tie, so it rounds up;
    # through float32 the 2^-30 is lost and the tie rounds to even (down).
    x = np.array([1 + 2.0**-8 + 2.0**-30])
    assert int(int4.round_to(x, "bfloat16")[0]) == 0x3F81
    assert int(x.astype(ml_dtypes.bfloat16).view(np.uint16)[0]) == 0x3F80


# --- the references against independent computations ---------------------------------------


def make_inputs(rng, op: str, n: int, k: int, g: int, wide: bool = False) -> list[np.ndarray]:
    """Random inputs of a dequant op (golden's generators, so the scales look like the cases')."""
    kind, fmt, zp = golden.dequant_signature(op)
    if kind == "int4":
        weights = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    elif kind == "int8":
        weights = rng.integers(0, 256, (n, k), dtype=np.uint8)
    else:
        weights = rng.choice(E4M3_FINITE, (n, k))
    wide_range = golden.WIDE_SCALE_EXPONENTS[kind, fmt] if wide else None
    inputs = [weights, golden.dequant_scales(rng, n, k // g, fmt, wide_range)]
    if zp:
        inputs.append(rng.integers(0, 2**32, (n, k // g // 8), dtype=np.uint32))
    return inputs


def loop_reference(op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The ops written out element by element with Python ints and floats; values decoded and
    rounded by the field-level formulas of lkw.formats (integer arithmetic, no ml_dtypes)."""
    kind, fmt_name, zp = golden.dequant_signature(op)
    fmt = FMT[fmt_name]
    weights, scales = inputs[0], inputs[1]
    n = weights.shape[0]
    k = weights.shape[1] * (8 if kind == "int4" else 1)
    g = k // scales.shape[1]
    values = np.empty((n, k))
    for row in range(n):
        for col in range(k):
            s = float(decode(np.array([scales[row, col // g]]), fmt)[0])
            if kind == "int4":
                position = col % 8 if op.startswith("int4_") else PERM.index(col % 8)
                q = (int(weights[row, col // 8]) >> (4 * position)) & 0xF
            if kind == "int4" and zp:
                group = col // g
                z = (int(inputs[2][row, group // 8]) >> (4 * (group % 8))) & 0xF
                zs = decode(encode(np.array([z * s]), fmt, saturate=False), fmt)[0]
                values[row, col] = q * s - zs
            elif kind == "int4":
                values[row, col] = s * (q - 8)
            elif kind == "int8":
                values[row, col] = s * (int(weights[row, col]) - 128)
            else:
                values[row, col] = s * float(decode(np.array([weights[row, col]]), E4M3)[0])
    return encode(values, fmt, saturate=False)


def vector_reference(op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The same, vectorized (for the large golden cases)."""
    kind, fmt_name, zp = golden.dequant_signature(op)
    fmt = FMT[fmt_name]
    weights, scales = inputs[0], inputs[1]
    n = weights.shape[0]
    k = weights.shape[1] * (8 if kind == "int4" else 1)
    g = k // scales.shape[1]
    col = np.arange(k)
    s = decode(scales, fmt)[:, col // g]  # (N,K)
    if kind == "int4":
        position = col % 8 if op.startswith("int4_") else np.array(POSITION)[col % 8]
        q = (weights.astype(np.int64)[:, col // 8] >> (4 * position)) & 0xF  # (N,K)
        if zp:
            group = col // g
            z = (inputs[2].astype(np.int64)[:, group // 8] >> (4 * (group % 8))) & 0xF
            zs = decode(encode((z * s).astype(np.float64), fmt, saturate=False), fmt)
            return encode(q * s - zs, fmt, saturate=False)
        return encode(s * (q - 8), fmt, saturate=False)
    if kind == "int8":
        return encode(s * (weights.astype(np.int64) - 128), fmt, saturate=False)
    return encode(s * decode(weights, E4M3), fmt, saturate=False)


@pytest.mark.parametrize("wide", [False, True], ids=["realistic", "wide"])
@pytest.mark.parametrize("op", golden.DEQUANT_OPS)
def test_reference_against_an_element_loop(rng, op, wide):
    n, k, g = (3, 256, 32) if "_zp_" in op else (3, 96, 32)
    inputs = make_inputs(rng, op, n, k, g, wide)
    got = golden.OPS[op].fn(*inputs)
    assert got.dtype == np.uint16 and got.shape == (n, k)
    assert_bits_equal(got, loop_reference(op, inputs), op)


def test_dequant_ops_are_the_registered_ones():
    assert set(golden.DEQUANT_OPS) <= set(golden.OPS)
    assert golden.dequant_signature("int4i_zp_bf16") == ("int4", "bfloat16", True)
    assert golden.dequant_signature("int8_f16") == ("int8", "float16", False)
    assert golden.dequant_signature("e4m3_bf16") == ("e4m3", "bfloat16", False)


@pytest.fixture(scope="module")
def chapter_cases():
    """The chapter's golden cases, as golden.write_chapter draws them, with their outputs."""
    cases = golden.int4_dequant_cases(np.random.default_rng(2024))
    return [(c, golden.expected_outputs(c)[0]) for c in cases]


def test_golden_cases_against_the_vectorized_independent_reference(chapter_cases):
    for case, out in chapter_cases:
        assert_bits_equal(out, vector_reference(case.op, case.inputs), case.id)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_natural_and_interleaved_ops_agree_after_the_repack(rng, fmt):
    suffix = "f16" if fmt == "float16" else "bf16"
    words = int4.every_half_word(rng).reshape(256, 256)
    scales = golden.dequant_scales(rng, 256, 16, fmt)
    natural = golden.OPS[f"int4_{suffix}"].fn(words, scales)
    assert np.array_equal(golden.OPS[f"int4i_{suffix}"].fn(int4.interleave(words), scales), natural)
    assert not np.array_equal(golden.OPS[f"int4i_{suffix}"].fn(words, scales), natural)


def test_references_refuse_what_the_contract_excludes(rng):
    words = rng.integers(0, 2**32, (2, 16), dtype=np.uint32)  # K = 128
    scales = golden.dequant_scales(rng, 2, 4, "float16")
    int4.int4_f16(words, scales)  # G = 32 is fine
    with pytest.raises(ValueError, match="G must be"):
        int4.int4_f16(words, golden.dequant_scales(rng, 2, 8, "float16"))  # G = 16
    with pytest.raises(ValueError, match="scales"):
        int4.int4_f16(words, golden.dequant_scales(rng, 3, 4, "float16"))  # N differs
    with pytest.raises(ValueError, match="zero points"):
        int4.int4i_zp_f16(words, scales, np.ones((2, 1), np.uint32))  # K/G = 4, not 8
    codes = np.full((2, 128), 0x38, np.uint8)
    int4.e4m3_f16(codes, scales)
    for nan in (0x7F, 0xFF):
        codes[1, 5] = nan
        with pytest.raises(ValueError, match="NaN"):
            int4.e4m3_f16(codes, scales)


# --- zero points: z*s is rounded before the FMA ------------------------------------------------


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_zero_point_result_can_differ_from_one_rounding_of_s_times_q_minus_z(rng, fmt):
    """W = round(q*s - round(z*s)) is what the kernel computes; round(s*(q - z)) is not. They
    differ by at most half an ulp of z*s plus half an ulp of the result; where q == z the
    kernel's result is z*s - round(z*s), minus the rounding error of z*s, not 0."""
    suffix = "f16" if fmt == "float16" else "bf16"
    n, k, g = 64, 256, 32
    inputs = make_inputs(rng, f"int4i_zp_{suffix}", n, k, g)
    got = int4.decode(golden.OPS[f"int4i_zp_{suffix}"].fn(*inputs), fmt)
    q = int4.unpack(inputs[0], interleaved=True).astype(np.float64)
    s = np.repeat(int4.decode(inputs[1], fmt), g, axis=1)
    z = np.repeat(int4.unpack(inputs[2]).astype(np.float64), g, axis=1)
    one_rounding = int4.decode(int4.round_to(s * (q - z), fmt), fmt)
    zs = int4.decode(int4.round_to(z * s, fmt), fmt)
    assert (got != one_rounding).any(), "the example should show the difference"
    residual = int4.decode(int4.round_to(z * s - zs, fmt), fmt)  # minus the error of zs
    assert np.array_equal(got[q == z], residual[q == z]) and residual.any()

    def ulp(x):
        x = np.abs(x)
        man = 10 if fmt == "float16" else 7
        min_exp = -14 if fmt == "float16" else -126
        return np.exp2(np.maximum(np.floor(np.log2(np.maximum(x, 2.0**-200))), min_exp) - man)

    exact = s * (q - z)
    assert (np.abs(got - exact) <= ulp(z * s) / 2 + ulp(exact) / 2).all()


# --- host emulation of the magic-number functions, bit for bit --------------------------------


def test_magic_constants():
    """The constants the kernels write as bits, and what they mean."""
    assert int4.F16_1024 == f16_bits(1024) and int4.F16_1032 == f16_bits(1032)
    assert int4.F16_1152 == f16_bits(1152) and int4.F16_256 == f16_bits(256)
    assert int4.F16_SIXTEENTH == f16_bits(1 / 16)
    assert int4.F16_MINUS_72 == f16_bits(-72) and int4.F16_MINUS_64 == f16_bits(-64)
    assert int4.BF16_128 == bf16_bits(128) and int4.BF16_136 == bf16_bits(136)
    # The magic values' last mantissa bit is worth exactly 1.
    assert np.float16(1024) + np.float16(1) == np.float16(1025)
    assert int4.decode(np.uint16(int4.F16_1024 | 1), "float16") == 1025
    assert int4.decode(np.uint16(int4.BF16_128 | 1), "bfloat16") == 129
    assert int4.AND_OR == 0xEA


def test_lop3_emulation(rng):
    a, b, c = (rng.integers(0, 2**32, 10_000, dtype=np.uint32) for _ in range(3))
    assert np.array_equal(int4.lop3(a, b, c, 0xEA), (a & b) | c)
    assert np.array_equal(int4.lop3(a, b, c, 0xF0), a)
    assert np.array_equal(int4.lop3(a, b, c, 0xCC), b)
    assert np.array_equal(int4.lop3(a, b, c, 0xAA), c)
    assert np.array_equal(int4.lop3(a, b, c, 0x96), a ^ b ^ c)
    assert np.array_equal(int4.lop3(a, b, c, 0xF8), a | (b & c))
    assert np.array_equal(int4.lop3(a, b, c, 0x00), np.zeros_like(a))


def test_prmt_emulation():
    a, b = np.uint32(0x33221100), np.uint32(0x77665544)
    assert int(int4.prmt(a, b, 0x3210)) == 0x33221100
    assert int(int4.prmt(a, b, 0x7654)) == 0x77665544
    assert int(int4.prmt(a, b, 0x4140)) == 0x44114400  # (a0, b0, a1, b0)
    assert int(int4.prmt(a, b, 0x0123)) == 0x00112233  # byte reversal
    # A selector nibble with bit 3 set replicates the sign of the byte it names.
    assert int(int4.prmt(np.uint32(0x000080FF), np.uint32(0), 0x4498)) == 0x0000FFFF
    assert int(int4.prmt(np.uint32(0x00007F01), np.uint32(0), 0x4490)) == 0x00000001


def test_f16_magic_low_nibble_every_half_pattern(rng):
    """lop3(q, 0x000F000F, 0x64006400) reads as 1024 + q_lo per half; minus 0x6408 (1032) is
    q_lo - 8, for each of the 2^16 half patterns in both halves."""
    words = int4.every_half_word(rng)
    lo = int4.lop3(words, np.uint32(0x000F000F), np.uint32(0x64006400), int4.AND_OR)
    nibble = np.stack([words & 0xF, (words >> 16) & 0xF], axis=-1).astype(np.float64)
    assert np.array_equal(int4.pair_values(lo, "float16"), 1024 + nibble)
    got = int4.pair_values(int4.hsub2(lo, np.uint32(0x64086408), "float16"), "float16")
    assert np.array_equal(got, nibble - 8)


def test_f16_magic_high_nibble_every_half_pattern(rng):
    """lop3(q, 0x00F000F0, 0x64006400) reads as 1024 + 16 q_hi; fma(v, 1/16, -72) is q_hi - 8,
    for each of the 2^16 half patterns in both halves."""
    words = int4.every_half_word(rng)
    hi = int4.lop3(words, np.uint32(0x00F000F0), np.uint32(0x64006400), int4.AND_OR)
    nibble = np.stack([(words >> 4) & 0xF, (words >> 20) & 0xF], axis=-1).astype(np.float64)
    assert np.array_equal(int4.pair_values(hi, "float16"), 1024 + 16 * nibble)
    got = int4.hfma2(hi, np.uint32(0x2C002C00), np.uint32(0xD480D480), "float16")
    assert np.array_equal(int4.pair_values(got, "float16"), nibble - 8)


@pytest.mark.parametrize("biased", [True, False], ids=["q_minus_8", "q"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_magic_unpack_every_nibble_pair(rng, fmt, biased):
    """The whole word unpack (four pairs in element order) against unpack(interleaved), on words
    holding every 16-bit pattern in both halves: every nibble pair, every position."""
    words = int4.every_half_word(rng)
    fn = int4.u4_to_f16_magic if fmt == "float16" else int4.u4_to_bf16_magic
    pairs = fn(words, biased=biased)  # (65536,4)
    assert pairs.shape == (1 << 16, 4) and pairs.dtype == np.uint32
    got = int4.pair_values(pairs, fmt).reshape(-1, 8)  # pair i = elements (2i, 2i+1)
    want = int4.unpack(words, interleaved=True).reshape(-1, 8) - (8.0 if biased else 0.0)
    assert np.array_equal(got, want)


def test_bf16_magic_every_nibble():
    """0x4300 | q reads as 128 + q; minus 136 is q - 8, for all 16 q."""
    q = np.arange(16, dtype=np.uint16)
    assert np.array_equal(int4.decode(0x4300 | q, "bfloat16") - 136, q - 8.0)
    # Why BF16 takes a shift instead of the FP16 high-nibble path: 0x4300 | (q << 4) overflows
    # its 7 mantissa bits into the exponent for q >= 8, so it does not read as 128 + 16 q.
    high = int4.decode(0x4300 | (q << 4), "bfloat16")
    assert not np.array_equal(high, 128 + 16.0 * q)


def test_int8_prmt_magic_every_byte_in_every_position(rng):
    """prmt into 0x64 high bytes reads as 1024 + b; minus 0x6480 (1152) is b - 128: all 256
    bytes, in each of the four byte positions of a word."""
    b = np.arange(256, dtype=np.uint16)
    assert np.array_equal(int4.decode(0x6400 | b, "float16") - 1152, b - 128.0)
    rows = (np.arange(256)[:, None] + 64 * np.arange(4)) % 256  # (256,4): every byte everywhere
    rows = np.concatenate([rows, rng.integers(0, 256, (4096, 4))]).astype(np.uint8)
    words = rows.view("<u4")[:, 0]
    got = int4.pair_values(int4.u8_to_f16_prmt(words), "float16").reshape(-1, 4)
    assert np.array_equal(got, rows - 128.0)


def test_e4m3_to_f16_bit_shift_every_code():
    """((b & 0x7F) << 7 | sign << 15) read as FP16, times 2^8, is the E4M3 value: all 254 finite
    codes (subnormals included), directly and through the word-level function in every byte
    position."""
    b = E4M3_FINITE.astype(np.uint16)
    bits = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
    value = decode(E4M3_FINITE, E4M3)
    assert np.array_equal(int4.decode(bits, "float16") * 2.0**8, value)
    rows = np.stack([np.roll(E4M3_FINITE, j) for j in range(4)], axis=1)  # (254,4): all codes
    got = int4.pair_values(int4.e4m3_to_f16_shift(rows.view("<u4")[:, 0]), "float16")  # in each
    assert np.array_equal(got.reshape(-1, 4), decode(rows, E4M3))  # byte position
    # The NaN codes are why they are excluded: the shift turns them into +-480, not NaN.
    nan = np.array([[0x7F, 0xFF, 0x38, 0x38]], np.uint8).view("<u4")[:, 0]
    got = int4.pair_values(int4.e4m3_to_f16_shift(nan), "float16").reshape(-1)
    assert got.tolist() == [480.0, -480.0, 1.0, 1.0]


def test_e4m3_to_bf16_bit_shift_every_code():
    """((b & 0x7F) << 4 | sign << 15) read as BF16 (the top half of an FP32), times 2^120, is the
    E4M3 value for all 254 finite codes; the word-level FP32 function agrees in every position."""
    b = E4M3_FINITE.astype(np.uint16)
    bits = ((b & 0x7F) << 4) | ((b & 0x80) << 8)
    value = decode(E4M3_FINITE, E4M3)
    assert np.array_equal(int4.decode(bits, "bfloat16") * 2.0**120, value)
    rows = np.stack([np.roll(E4M3_FINITE, j) for j in range(4)], axis=1)  # (254,4)
    got = int4.e4m3_to_f32_shift(rows.view("<u4")[:, 0])
    assert got.dtype == np.float32
    assert np.array_equal(got.astype(np.float64), decode(rows, E4M3))


def magic_inputs(rng, op: str, wide: bool) -> list[np.ndarray]:
    """Inputs that cover the op's whole code space: every 16-bit nibble pattern in both halves
    (INT4), every (z, q) pair (zero points), every byte / finite code in every byte position."""
    kind, fmt, zp = golden.dequant_signature(op)
    if kind == "int4":
        words = int4.every_half_word(rng).reshape(256, 256)  # (N,K/8): K = 2048
        n, k, g = 256, 2048, 128 if not zp else 32
    elif kind == "int8":
        rows = (np.arange(256)[:, None] + np.arange(256)) % 256  # every byte in every column
        words = rng.permutation(rows).astype(np.uint8)
        n, k, g = 256, 256, 32
    else:
        rows = (np.arange(254)[:, None] + np.arange(256)) % 254
        words = rng.permutation(E4M3_FINITE[rows])
        n, k, g = 254, 256, 32
    inputs = make_inputs(rng, op, n, k, g, wide)
    inputs[0] = words
    if zp:  # every zero point against every value: z varies along the groups and the rows
        z = (np.arange(n)[:, None] + np.arange(k // g)) % 16
        inputs[2] = int4.pack(z)
    return inputs


@pytest.mark.parametrize("wide", [False, True], ids=["realistic", "wide"])
@pytest.mark.parametrize("op", MAGIC_OPS)
def test_emulated_magic_kernel_matches_the_reference_bit_exact(rng, op, wide):
    """The host emulation of each magic-number kernel (unpack, then the packed multiply or FMA
    with the scale) gives the reference's bits on the op's whole code space."""
    inputs = magic_inputs(rng, op, wide)
    kind, fmt, zp = golden.dequant_signature(op)
    if kind == "int4" and zp:
        got = int4.emulate_int4i_zp(*inputs, fmt)
        q = int4.unpack(inputs[0], interleaved=True).reshape(256, -1, 32)
        z = int4.unpack(inputs[2])  # (N,K/G)
        pairs = set(zip(np.broadcast_to(z[..., None], q.shape).ravel(), q.ravel()))
        assert len(pairs) == 256, "every (z, q) pair"
    elif kind == "int4":
        got = int4.emulate_int4i(*inputs, fmt)
    elif kind == "int8":
        got = int4.emulate_int8_f16(*inputs)
    elif fmt == "float16":
        got = int4.emulate_e4m3_f16(*inputs)
    else:
        got = int4.emulate_e4m3_bf16(*inputs)
    assert_bits_equal(got, golden.OPS[op].fn(*inputs), op)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_emulated_magic_kernel_after_the_repack_matches_the_natural_op(rng, fmt):
    """The v2/v3 story: repack natural weights offline, then the magic kernel on the repacked
    words gives what int4_f16 / int4_bf16 gives on the natural ones."""
    words = int4.every_half_word(rng).reshape(256, 256)
    scales = golden.dequant_scales(rng, 256, 16, fmt)
    natural = golden.OPS["int4_f16" if fmt == "float16" else "int4_bf16"].fn(words, scales)
    assert_bits_equal(int4.emulate_int4i(int4.interleave(words), scales, fmt), natural, fmt)


def test_emulated_arithmetic_checks_its_own_exactness():
    """hsub2/hfma2 emulate in float64 and refuse a case where float64 itself would round."""
    big, tiny = np.uint32(bf16_bits(2.0**100)), np.uint32(bf16_bits(2.0**-100))
    with pytest.raises(AssertionError, match="not exact"):
        int4.hsub2(big, tiny, "bfloat16")


# --- the chapter's golden cases --------------------------------------------------------------


def case_by_id(chapter_cases, suffix: str, op: str):
    found = [(c, o) for c, o in chapter_cases if c.op == op and suffix in c.id]
    assert len(found) == 1, (op, suffix)
    return found[0]


@pytest.mark.parametrize("op", ["int4_f16", "int4_bf16", "int4i_f16", "int4i_bf16"])
def test_exhaustive_case_holds_every_half_pattern(chapter_cases, op):
    case, _ = case_by_id(chapter_cases, "_exhaustive_", op)
    words = case.inputs[0].ravel()
    every = np.arange(1 << 16)
    assert np.array_equal(np.sort(words & 0xFFFF), every)
    assert np.array_equal(np.sort(words >> 16), every)


@pytest.mark.parametrize("op", ["int4i_zp_f16", "int4i_zp_bf16"])
def test_all_zq_case_holds_every_zero_point_and_value(chapter_cases, op):
    case, _ = case_by_id(chapter_cases, "_all_zq_", op)
    g = case.params["group_size"]
    q = int4.unpack(case.inputs[0], interleaved=True)  # (N,K)
    z = np.repeat(int4.unpack(case.inputs[2]), g, axis=1)  # (N,K)
    assert len(set(zip(z.ravel().tolist(), q.ravel().tolist()))) == 256


def test_all_codes_and_bytes_cases(chapter_cases):
    for op in ("e4m3_f16", "e4m3_bf16"):
        case, _ = case_by_id(chapter_cases, "_all_codes_", op)
        for row in case.inputs[0]:
            assert set(row.tolist()) == set(E4M3_FINITE.tolist())
    case, _ = case_by_id(chapter_cases, "_all_bytes_", "int8_f16")
    for row in case.inputs[0]:
        assert sorted(row.tolist()) == list(range(256))


def test_no_case_holds_e4m3_nan_codes(chapter_cases):
    for case, _ in chapter_cases:
        if case.op.startswith("e4m3"):
            assert not np.isin(case.inputs[0], [0x7F, 0xFF]).any(), case.id


def test_cases_have_group_sizes_tails_and_finite_outputs(chapter_cases):
    groups = set()
    for case, out in chapter_cases:
        g = case.params["group_size"]
        groups.add(g)
        n, k = out.shape
        assert case.inputs[1].shape == (n, k // g), case.id
        _, fmt, _ = golden.dequant_signature(case.op)
        values = int4.decode(out, fmt)
        assert np.isfinite(values).all(), case.id
        assert (values != 0).mean() > 0.9, case.id
        if "_tail_" in case.id:
            assert n % 2 == 1, case.id
            assert ((k // g) % 2 == 1) or "_zp_" in case.op, case.id
    assert groups == {32, 64, 128}


def test_wide_cases_reach_many_binades_and_fp16_subnormals(chapter_cases):
    for case, out in chapter_cases:
        if "_wide_" not in case.id:
            continue
        _, fmt, _ = golden.dequant_signature(case.op)
        values = np.abs(int4.decode(out, fmt))
        exponents = np.unique(np.floor(np.log2(values[values > 0])))
        assert len(exponents) >= 20, case.id
        if fmt == "float16":
            assert ((values > 0) & (values < 2.0**-14)).any(), f"{case.id}: no subnormal result"


def test_chapter_writes_quickly(tmp_path):
    import time

    start = time.perf_counter()
    golden.write_chapter(tmp_path, "02_int4_dequant", 7)
    assert time.perf_counter() - start < 10  # about half a second here; the budget is 2 s


# --- the chapter's bench cases ---------------------------------------------------------------

LLAMA_SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]


def test_bench_cases_are_the_contracted_shapes():
    cases = bench.CHAPTERS["02_int4_dequant"]()
    want = [(op, 8192, 8192) for op in golden.DEQUANT_OPS]
    want += [(op, n, k) for op in ("int4_f16", "int4_bf16", "int4i_f16", "int4i_bf16")
             for n, k in LLAMA_SHAPES]
    assert sorted((c.op, c.shape) for c in cases) == sorted(
        (op, f"n={n},k={k},g=128") for op, n, k in want
    )
    for c in cases:
        op = golden.OPS[c.op]
        assert c.dtypes == [*op.inputs, *op.outputs], c.op
        assert c.tolerance == "exact" and c.sample_rows == 64


@pytest.mark.parametrize("op", golden.DEQUANT_OPS)
def test_bench_reference_cuts_every_input_to_the_sampled_rows(rng, op):
    """The bench cuts only the first input to the sampled rows; the case's expected() cuts the
    scales and zero points to match, and gives the reference of those rows."""
    case = next(c for c in bench.CHAPTERS["02_int4_dequant"]() if c.op == op)
    k = int(case.shape.split(",")[1][2:])
    inputs = make_inputs(rng, op, 80, k, 128)  # 80 rows stand in for 8192
    got = bench._reference(case, inputs)
    assert len(got) == 1 and got[0].shape == (64, k)
    want = golden.OPS[op].fn(*(a[:64] for a in inputs))
    assert_bits_equal(got[0], want, op)
