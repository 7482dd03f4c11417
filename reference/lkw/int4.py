"""Chapter 02 references: dequantizing INT4, INT8 and FP8 E4M3 weights to FP16/BF16.

Layouts (every function takes and returns the stored bits: uint32 words, uint8 codes, uint16
for FP16/BF16, exactly as the golden files hold them):

- INT4 weights: a uint32 word holds 8 nibbles, a row of K elements is K/8 words, packed uint32
  [N, K/8]. NATURAL order: element k of row n is nibble k % 8 (bits 4j..4j+3 hold element j) of
  word k // 8. INTERLEAVED order (what the lop3 magic-number unpack needs): nibble position p
  of a word holds element PERM[p], PERM = (0, 2, 4, 6, 1, 3, 5, 7). A mask 0x000F000F then
  picks elements (0, 1) into the two 16-bit halves, the next nibble up (2, 3), and so on.
- Scales: [N, K/G], FP16 or BF16, group size G in {32, 64, 128}; element (n, k) uses
  scale[n, k // G]. G is not passed: it is K / scales.shape[1], as the C++ launchers infer it.
- Zero points: 4-bit z in 0..15, packed uint32 [N, K/G/8] in NATURAL order along the groups.
- INT8: uint8 [N, K] with bias 128 (value b - 128). FP8: E4M3FN codes uint8 [N, K]; its NaN
  codes (0x7F, 0xFF) are never weights, and the references refuse them.

Rounding: every reference computes in float64, where each product below is exact, and rounds
once, to nearest even, to the output format -- the point where the kernel rounds. FP16 uses
numpy's float64 -> float16 cast, which rounds once (the tests check it against integer
rounding); BF16 uses formats.f64_to_bf16, because ml_dtypes casts float64 through float32 and
would round twice.

The second half of the file emulates, bit for bit on the host, the register-level unpack
functions of the kernels (solutions/02_int4_dequant/dequant.cuh): lop3, prmt, packed FP16/BF16
arithmetic and the magic numbers. The tests run them on every 16-bit nibble pattern against the
references above, without a GPU.
"""

import ml_dtypes
import numpy as np

from lkw.formats import f64_to_bf16

PERM = (0, 2, 4, 6, 1, 3, 5, 7)  # interleaved: nibble position p holds element PERM[p]
GROUP_SIZES = (32, 64, 128)
E4M3_NAN_CODES = (0x7F, 0xFF)


def f64_to_f16(x: np.ndarray) -> np.ndarray:
    """FP64 -> FP16 bits, rounded once to nearest even (numpy converts from the float64 bits
    directly, not through float32); overflow gives Inf."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float16).view(np.uint16)


_FLOATS = {  # output/scale format -> (numpy type the bits mean, float64 -> bits, rounding once)
    "float16": (np.float16, f64_to_f16),
    "bfloat16": (ml_dtypes.bfloat16, f64_to_bf16),
}


# ---------------------------------------------------------------------------------------------
# Packing


def _words(words: np.ndarray) -> np.ndarray:
    """uint32 view of packed words (int32 arrays, as torch hands them over, are reinterpreted)."""
    w = np.asarray(words)
    if w.dtype == np.int32:
        return w.view(np.uint32)
    if w.dtype != np.uint32:
        raise TypeError(f"packed words must be uint32, got {w.dtype}")
    return w


def pack(q: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """4-bit values [..., K] (0..15, K a multiple of 8) -> uint32 words [..., K/8]."""
    q = np.asarray(q)
    if q.shape[-1] % 8:
        raise ValueError(f"pack: the last dimension ({q.shape[-1]}) must be a multiple of 8")
    if q.size and (q.min() < 0 or q.max() > 15):
        raise ValueError("pack: 4-bit values must lie in 0..15")
    q = q.astype(np.uint32).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    order = PERM if interleaved else range(8)
    words = np.zeros(q.shape[:-1], np.uint32)
    for position, element in enumerate(order):
        words |= q[..., element] << np.uint32(4 * position)
    return words


def unpack(words: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """uint32 words [..., W] -> 4-bit values uint8 [..., 8W] (the inverse of pack)."""
    w = _words(words)
    order = PERM if interleaved else range(8)
    q = np.empty(w.shape + (8,), np.uint8)
    for position, element in enumerate(order):
        q[..., element] = (w >> np.uint32(4 * position)) & np.uint32(0xF)
    return q.reshape(*w.shape[:-1], 8 * w.shape[-1]) if w.ndim else q


def interleave(words: np.ndarray) -> np.ndarray:
    """Naturally packed words -> the same elements in the interleaved order (the offline repack
    the magic-number kernels need)."""
    return pack(unpack(words), interleaved=True)


def deinterleave(words: np.ndarray) -> np.ndarray:
    """Interleaved words -> natural order (the inverse of interleave)."""
    return pack(unpack(words, interleaved=True))


def every_half_word(rng: np.random.Generator) -> np.ndarray:
    """65536 uint32 words in which each 16-bit pattern (every pair of bytes, so every nibble in
    every position) occurs exactly once as a low half and once as a high half; which low half
    meets which high half, and the word order, are random."""
    low = rng.permutation(1 << 16).astype(np.uint32)
    high = rng.permutation(1 << 16).astype(np.uint32)
    return (high << np.uint32(16)) | low


# ---------------------------------------------------------------------------------------------
# The references


def decode(bits: np.ndarray, fmt: str) -> np.ndarray:
    """FP16/BF16 bits (`fmt` "float16" or "bfloat16") -> float64, exact."""
    return np.asarray(bits, np.uint16).view(_FLOATS[fmt][0]).astype(np.float64)


def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """float64 -> FP16/BF16 bits, rounded once to nearest even (overflow gives Inf)."""
    return _FLOATS[fmt][1](x)


def _group_scales(scales: np.ndarray, n: int, k: int, fmt: str) -> tuple[np.ndarray, int]:
    """Scales as float64 [N, K/G] and G, checked against the weights' N and K."""
    s = np.asarray(scales)
    if s.dtype != np.uint16 or s.ndim != 2 or s.shape[0] != n or s.shape[1] == 0:
        raise ValueError(f"scales must be {fmt} bits (uint16) [N={n}, K/G]: {s.dtype} {s.shape}")
    if k % s.shape[1] or k // s.shape[1] not in GROUP_SIZES:
        raise ValueError(f"K={k} and {s.shape[1]} groups per row: G must be one of {GROUP_SIZES}")
    return decode(s, fmt), k // s.shape[1]


def _per_element(per_group: np.ndarray, g: int) -> np.ndarray:
    return np.repeat(per_group, g, axis=1)  # (N,K/G) -> (N,K)


def _int4(packed: np.ndarray, scales: np.ndarray, fmt: str, interleaved: bool) -> np.ndarray:
    w = _words(packed)
    if w.ndim != 2:
        raise ValueError(f"packed weights must be [N, K/8], got {w.shape}")
    q = unpack(w, interleaved).astype(np.float64)  # (N,K)
    s, g = _group_scales(scales, q.shape[0], q.shape[1], fmt)
    return round_to(_per_element(s, g) * (q - 8), fmt)  # exact product, one rounding


def int4_f16(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """W[N,K] = fp16(s * (q - 8)): packed uint32 [N, K/8] (natural), FP16 scales [N, K/G]."""
    return _int4(packed, scales, "float16", interleaved=False)


def int4_bf16(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """W[N,K] = bf16(s * (q - 8)): packed uint32 [N, K/8] (natural), BF16 scales [N, K/G]."""
    return _int4(packed, scales, "bfloat16", interleaved=False)


def int4i_f16(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """As int4_f16, with the weights packed in the interleaved order."""
    return _int4(packed, scales, "float16", interleaved=True)


def int4i_bf16(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """As int4_bf16, with the weights packed in the interleaved order."""
    return _int4(packed, scales, "bfloat16", interleaved=True)


def _int4_zp(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray, fmt: str) -> np.ndarray:
    w = _words(packed)
    if w.ndim != 2:
        raise ValueError(f"packed weights must be [N, K/8], got {w.shape}")
    q = unpack(w, interleaved=True).astype(np.float64)  # (N,K)
    s, g = _group_scales(scales, q.shape[0], q.shape[1], fmt)  # (N,K/G)
    z_words = _words(zeros)
    if z_words.shape != (s.shape[0], s.shape[1] // 8) or s.shape[1] % 8:
        raise ValueError(
            f"zero points must be uint32 [N, K/G/8] with K/G a multiple of 8; "
            f"K/G = {s.shape[1]}, got {z_words.shape}"
        )
    z = unpack(z_words).astype(np.float64)  # (N,K/G)
    zs = decode(round_to(z * s, fmt), fmt)  # z*s rounded once per group, as the kernel keeps it
    # q*s - zs is exact in float64: both are integer multiples of the scale's last-bit weight
    # and below 2^16 of them; the FMA rounds it once.
    return round_to(q * _per_element(s, g) - _per_element(zs, g), fmt)


def int4i_zp_f16(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """W[N,K] = fp16(q*s - zs), zs = fp16(z*s): interleaved packed uint32 [N, K/8], FP16 scales
    [N, K/G], 4-bit zero points uint32 [N, K/G/8] (natural order along the groups).

    The kernel folds the zero point into one FMA per element, q*s + (-zs), with zs = z*s
    computed once per group and rounded to FP16. The FMA itself is exact before its single
    rounding, but zs carries the rounding error of z*s (up to half an FP16 ulp of zs), so the
    result can differ from fp16(s*(q - z)), the dequantized weight computed with one rounding.
    The difference is an absolute one, bounded by half an ulp of z*s: where q == z, fp16(s*(q-z))
    is 0 but this is the (negated) rounding error of z*s, possibly nonzero. This reference
    rounds exactly where the kernel does; GEMM tests that compare with s*(q - z) must allow it.
    """
    return _int4_zp(packed, scales, zeros, "float16")


def int4i_zp_bf16(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """W[N,K] = bf16(q*s - zs), zs = bf16(z*s): as int4i_zp_f16 in BF16, with the same caveat
    (zs is rounded to BF16 first, so the result can differ from bf16(s*(q - z)))."""
    return _int4_zp(packed, scales, zeros, "bfloat16")


def _bytes(codes: np.ndarray, scales: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(codes)
    if b.dtype != np.uint8 or b.ndim != 2:
        raise ValueError(f"8-bit weights must be uint8 [N, K], got {b.dtype} {b.shape}")
    s, g = _group_scales(scales, b.shape[0], b.shape[1], fmt)
    return b, _per_element(s, g)


def int8_f16(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """W[N,K] = fp16(s * (b - 128)): uint8 [N, K] with bias 128, FP16 scales [N, K/G]."""
    b, s = _bytes(codes, scales, "float16")
    return round_to(s * (b.astype(np.float64) - 128), "float16")


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """FP8 E4M3FN codes -> their values as float64 (exact); refuses the NaN codes 0x7F/0xFF."""
    b = np.asarray(codes, np.uint8)
    if np.isin(b, E4M3_NAN_CODES).any():
        raise ValueError("E4M3 weights must not hold the NaN codes 0x7F / 0xFF")
    return b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _e4m3(codes: np.ndarray, scales: np.ndarray, fmt: str) -> np.ndarray:
    b, s = _bytes(codes, scales, fmt)
    return round_to(e4m3_values(b) * s, fmt)  # 4 x 11 (or 8) significant bits: exact in float64


def e4m3_f16(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """W[N,K] = fp16(e4m3(b) * s): FP8 E4M3 codes uint8 [N, K], FP16 scales [N, K/G]."""
    return _e4m3(codes, scales, "float16")


def e4m3_bf16(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """W[N,K] = bf16(e4m3(b) * s): FP8 E4M3 codes uint8 [N, K], BF16 scales [N, K/G]."""
    return _e4m3(codes, scales, "bfloat16")


# ---------------------------------------------------------------------------------------------
# Host emulation of the kernels' register-level unpack (dequant.cuh), bit for bit.
#
# A "pair" is a uint32 holding two FP16 or BF16 values (half2 / __nv_bfloat162): the low half
# is the first element. Packed arithmetic is emulated per half in float64 and rounded once, as
# the hardware does; the helpers check that the float64 intermediate is exact, so the single
# rounding is really the only one.

AND_OR = (0xF0 & 0xCC) | 0xAA  # lop3's truth table for (a & b) | c: 0xEA


def lop3(a, b, c, lut: int) -> np.ndarray:
    """lop3.b32: bit i of the result is bit (a_i << 2 | b_i << 1 | c_i) of `lut`."""
    a, b, c = (np.asarray(x, np.uint32) for x in (a, b, c))
    out = np.zeros(np.broadcast(a, b, c).shape, np.uint32)
    for row in range(8):
        if lut >> row & 1:
            out |= (a if row & 4 else ~a) & (b if row & 2 else ~b) & (c if row & 1 else ~c)
    return out


def prmt(a, b, selector: int) -> np.ndarray:
    """prmt.b32 (CUDA's __byte_perm(a, b, selector)): byte n of the result is byte
    (selector >> 4n) & 7 of the 8-byte value b:a (a is bytes 0..3); a selector nibble with its
    top bit set replicates that byte's sign bit instead."""
    a, b = np.asarray(a, np.uint32), np.asarray(b, np.uint32)
    source = [(a >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)]
    source += [(b >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)]
    out = np.zeros(np.broadcast(a, b).shape, np.uint32)
    for n in range(4):
        nibble = (selector >> (4 * n)) & 0xF
        byte = source[nibble & 7]
        if nibble & 8:
            byte = np.where(byte & np.uint32(0x80), np.uint32(0xFF), np.uint32(0))
        out |= byte << np.uint32(8 * n)
    return out


def pair_values(pairs, fmt: str) -> np.ndarray:
    """uint32 pairs [...] -> float64 [..., 2] (low half first)."""
    p = np.asarray(pairs, np.uint32)
    halves = np.stack([p & np.uint32(0xFFFF), p >> np.uint32(16)], axis=-1).astype(np.uint16)
    return decode(halves, fmt)


def pair_bits(values: np.ndarray, fmt: str) -> np.ndarray:
    """float64 [..., 2] -> uint32 pairs [...], each half rounded once to nearest even."""
    h = round_to(values, fmt).astype(np.uint32)
    return h[..., 0] | (h[..., 1] << np.uint32(16))


def _assert_exact_sum(x: np.ndarray, y: np.ndarray, total: np.ndarray) -> None:
    # TwoSum: the rounding error of x + y in float64; zero means float64 held it exactly.
    yy = total - x
    error = (x - (total - yy)) + (y - yy)
    finite = np.isfinite(total)
    assert not np.any(error[finite]), "float64 intermediate not exact: emulation invalid"


def hsub2(a, b, fmt: str) -> np.ndarray:
    """__hsub2: a - b per half, rounded once."""
    x, y = pair_values(a, fmt), pair_values(b, fmt)
    total = x - y
    _assert_exact_sum(x, -y, total)
    return pair_bits(total, fmt)


def hmul2(a, b, fmt: str) -> np.ndarray:
    """__hmul2: a * b per half, rounded once (the float64 product of two 16-bit floats is
    exact)."""
    return pair_bits(pair_values(a, fmt) * pair_values(b, fmt), fmt)


def hfma2(a, b, c, fmt: str) -> np.ndarray:
    """__hfma2: a * b + c per half, exact before its one rounding."""
    product, addend = pair_values(a, fmt) * pair_values(b, fmt), pair_values(c, fmt)
    total = product + addend
    _assert_exact_sum(product, addend, total)
    return pair_bits(total, fmt)


def _broadcast_pair(bits: int) -> np.uint32:
    return np.uint32(bits | (bits << 16))


# FP16: 1024.0 = 0x6400 has a mantissa whose last bit is worth 1, so 0x6400 | q reads 1024 + q.
F16_1024, F16_1032, F16_1152 = 0x6400, 0x6408, 0x6480
F16_SIXTEENTH, F16_MINUS_64, F16_MINUS_72, F16_256 = 0x2C00, 0xD400, 0xD480, 0x5C00
# BF16: 128.0 = 0x4300 (7 mantissa bits): 0x4300 | q reads 128 + q.
BF16_128, BF16_136 = 0x4300, 0x4308


def u4_to_f16_magic(words, biased: bool = True) -> np.ndarray:
    """Interleaved words [...] -> FP16 pairs [..., 4] of (q - 8) (or q when not `biased`), pair i
    holding elements (2i, 2i+1). Low nibbles of each half: lop3 with 0x000F000F into 0x6400,
    then subtract 1032 (1024 when unbiased). High nibbles: lop3 with 0x00F000F0 gives
    1024 + 16q; times 1/16 minus 72 (64) is q - 8 (q) in one FMA. Then the word shifts by 8."""
    q = _words(words)
    magic = _broadcast_pair(F16_1024)
    sub = _broadcast_pair(F16_1032 if biased else F16_1024)
    sixteenth = _broadcast_pair(F16_SIXTEENTH)
    minus = _broadcast_pair(F16_MINUS_72 if biased else F16_MINUS_64)
    out = []
    for _ in range(2):
        lo = lop3(q, np.uint32(0x000F000F), magic, AND_OR)
        hi = lop3(q, np.uint32(0x00F000F0), magic, AND_OR)
        out += [hsub2(lo, sub, "float16"), hfma2(hi, sixteenth, minus, "float16")]
        q = q >> np.uint32(8)
    return np.stack(out, axis=-1)


def u4_to_bf16_magic(words, biased: bool = True) -> np.ndarray:
    """Interleaved words [...] -> BF16 pairs [..., 4] of (q - 8) (or q when not `biased`).
    BF16's 7 mantissa bits cannot hold 16q, so every pair takes the low-nibble path: lop3 with
    0x000F000F into 0x4300 (128 + q), subtract 136 (128), shift the word by 4."""
    q = _words(words)
    magic = _broadcast_pair(BF16_128)
    sub = _broadcast_pair(BF16_136 if biased else BF16_128)
    out = []
    for _ in range(4):
        out.append(hsub2(lop3(q, np.uint32(0x000F000F), magic, AND_OR), sub, "bfloat16"))
        q = q >> np.uint32(4)
    return np.stack(out, axis=-1)


def u8_to_f16_prmt(words) -> np.ndarray:
    """Words of 4 bytes [...] -> FP16 pairs [..., 2] of (b - 128), in byte order: prmt builds
    (0x64 b0, 0x64 b1) = (1024 + b0, 1024 + b1) in one instruction, minus 1152."""
    q = _words(words)
    magic, k1152 = np.uint32(0x64646464), _broadcast_pair(F16_1152)
    return np.stack(
        [hsub2(prmt(q, magic, sel), k1152, "float16") for sel in (0x4140, 0x4342)], axis=-1
    )


def e4m3_to_f16_shift(words) -> np.ndarray:
    """Words of 4 E4M3 codes [...] -> FP16 pairs [..., 2] of their values, in byte order.
    A code s.eeee.mmm placed as s.0eeee.mmm0000000 reads as value * 2^(7 - 15): prmt moves each
    byte to the top of a half, lop3 keeps the sign and takes the rest shifted right by one, and
    a multiply by 256 restores the exponent bias (exact: the largest result is 448)."""
    q = _words(words)
    k256 = _broadcast_pair(F16_256)
    out = []
    for sel in (0x1404, 0x3424):
        x = prmt(q, np.uint32(0), sel)  # (b_lo << 8, b_hi << 8)
        bits = lop3(x, np.uint32(0x80008000), (x >> np.uint32(1)) & np.uint32(0x3F803F80), AND_OR)
        out.append(hmul2(bits, k256, "float16"))
    return np.stack(out, axis=-1)


def e4m3_to_f32_shift(words) -> np.ndarray:
    """Words of 4 E4M3 codes [...] -> float32 [..., 4] of their values, in byte order: a code
    placed as s.0000eeee.mmm0000 in a BF16 (the top half of an FP32) reads as value *
    2^(7 - 127); times 2^120 in FP32 is exact (FP8 subnormals are FP32 subnormals before it)."""
    q = _words(words)
    out = []
    for sel in (0x1404, 0x3424):
        x = prmt(q, np.uint32(0), sel)
        h = lop3(x, np.uint32(0x80008000), (x >> np.uint32(4)) & np.uint32(0x07F007F0), AND_OR)
        for top in (h << np.uint32(16), h & np.uint32(0xFFFF0000)):
            out.append(top.view(np.float32).astype(np.float64) * 2.0**120)
    return np.stack(out, axis=-1).astype(np.float32)  # exact: values of E4M3


# The chapter's kernels, emulated on the host with the functions above. Each takes and returns
# what the reference of the same op does.


def _pairs_to_rows(pairs: np.ndarray, n: int) -> np.ndarray:
    # pairs (N, words, pairs per word) -> (N, K) uint16, low half first (little endian)
    return np.ascontiguousarray(pairs, "<u4").view("<u2").reshape(n, -1).astype(np.uint16)


def _scale_pairs(scales: np.ndarray, per_word: int, k: int) -> np.ndarray:
    """Scale bits [N, K/G] -> one pair (s, s) per pair of elements: [N, K/per_word, per_word/2]."""
    s = np.asarray(scales, np.uint16).astype(np.uint32)
    g = k // s.shape[1]
    pairs = np.repeat(s | (s << np.uint32(16)), g // 2, axis=1)  # (N,K/2)
    return pairs.reshape(s.shape[0], k // per_word, per_word // 2)


def emulate_int4i(packed: np.ndarray, scales: np.ndarray, fmt: str) -> np.ndarray:
    """The magic-number kernels v2 (FP16) and v3 (BF16): unpack q - 8, multiply by the scale."""
    w = _words(packed)
    n, k = w.shape[0], 8 * w.shape[1]
    unpack_fn = u4_to_f16_magic if fmt == "float16" else u4_to_bf16_magic
    return _pairs_to_rows(hmul2(unpack_fn(w), _scale_pairs(scales, 8, k), fmt), n)


def emulate_int4i_zp(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray, fmt: str):
    """The zero-point kernel v4: unpack q (unbiased), then one FMA q * s + (-zs) with
    zs = z * s rounded once per group."""
    w = _words(packed)
    n, k = w.shape[0], 8 * w.shape[1]
    unpack_fn = u4_to_f16_magic if fmt == "float16" else u4_to_bf16_magic
    s = np.asarray(scales, np.uint16)
    zs = round_to(unpack(zeros).astype(np.float64) * decode(s, fmt), fmt)  # (N,K/G)
    neg_zs = zs ^ np.uint16(0x8000)
    return _pairs_to_rows(
        hfma2(unpack_fn(w, biased=False), _scale_pairs(s, 8, k), _scale_pairs(neg_zs, 8, k), fmt),
        n,
    )


def emulate_int8_f16(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The INT8 byte-permute kernel: prmt magic, then multiply by the scale."""
    b = np.ascontiguousarray(codes, np.uint8)
    n, k = b.shape
    words = b.view("<u4")  # (N,K/4), byte j of a word = element j
    return _pairs_to_rows(hmul2(u8_to_f16_prmt(words), _scale_pairs(scales, 4, k), "float16"), n)


def emulate_e4m3_f16(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The FP8 bit-shift kernel (FP16): shift the bits into place, x 256, x scale."""
    b = np.ascontiguousarray(codes, np.uint8)
    n, k = b.shape
    x = e4m3_to_f16_shift(b.view("<u4"))
    return _pairs_to_rows(hmul2(x, _scale_pairs(scales, 4, k), "float16"), n)


def emulate_e4m3_bf16(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The FP8 bit-shift kernel (BF16): values in FP32, times the scale in FP32 (exact: 4 x 8
    significant bits), one rounding to BF16."""
    b = np.ascontiguousarray(codes, np.uint8)
    n, k = b.shape
    x = e4m3_to_f32_shift(b.view("<u4")).reshape(n, k).astype(np.float64)
    s = decode(np.asarray(scales, np.uint16), "bfloat16")
    return round_to(x * np.repeat(s, k // s.shape[1], axis=1), "bfloat16")
