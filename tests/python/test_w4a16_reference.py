"""lkw.w4a16, chapter 07's reference: the repacked layout is the mma.sync B fragments the module
docstring promises (checked element by element against a slow loop written from the spec, and
against two mutants), the GEMM equals chapter 06's on the same weights, the GPTQ and AWQ
converters round-trip and mean what the checkpoints mean (act-order included), and the golden
cases have the promised shapes and a tolerance that passes the kernels' FP32 sums."""

import math
import re

import ml_dtypes
import numpy as np
import pytest
from lkw import formats, gemv, golden, int4, w4a16


def problem(rng, m=4, n=128, k=512, g=128):
    """x bits [M, K], natural words [N, K/8], scale bits [K/G, N]."""
    x = golden.gemv_activations(rng, m, k)
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    scales = golden.dequant_scales(rng, k // g, n, "bfloat16")
    return x, words, scales


def within(got: np.ndarray, ref: np.ndarray, tolerance: str) -> np.ndarray:
    """The C++ rule (common/lkw/compare.h): |got - ref| <= atol + rtol * |ref|, on BF16 bits."""
    rtol, atol = map(float, tolerance.split(":")[1:])
    g, r = (formats.bf16_to_f32(a).astype(np.float64) for a in (got, ref))
    return np.abs(g - r) <= atol + rtol * np.abs(r)


# ---------------------------------------------------------------------------------------------
# The GEMM


def test_w_hat_is_chapter_06s_with_the_scales_transposed(rng):
    x, words, scales = problem(rng, g=64)
    w = w4a16.w_hat(words, scales)
    assert np.array_equal(w, gemv.w_hat(words, np.ascontiguousarray(scales.T)))
    assert np.array_equal(w4a16.w4a16_gemm(x, words, scales), gemv.gemv(x, w))
    assert w4a16.tolerance(x, w) == gemv.tolerance(x, w)


def test_per_channel_scales(rng):
    """G = K: one scale per output channel, scales [1, N]; also when K is no group size."""
    for k in (1056, 4192):
        _, words, scales = problem(rng, m=3, n=64, k=k, g=k)
        assert scales.shape == (1, 64)
        q = int4.unpack(words).astype(np.float64) - 8
        assert np.array_equal(w4a16.w_hat(words, scales), q * formats.bf16_to_f32(scales).T)


def test_the_sum_is_exact_and_rounded_once(rng):
    x, words, scales = problem(rng, m=2, n=64, k=256, g=32)
    w = w4a16.w_hat(words, scales)
    x64 = formats.bf16_to_f32(x).astype(np.float64)
    exact = np.array([[math.fsum(x64[i] * w[j]) for j in range(64)] for i in range(2)])
    assert np.array_equal(formats.f64_to_bf16(exact), w4a16.w4a16_gemm(x, words, scales))


def test_zero_points_8_are_the_symmetric_weights(rng):
    _, words, scales = problem(rng, g=32)
    eights = np.full(scales.shape, 8, np.uint8)
    assert np.array_equal(w4a16.w_hat_zp(words, scales, eights), w4a16.w_hat(words, scales))
    z = rng.integers(0, 16, scales.shape).astype(np.uint8)
    q = int4.unpack(words).astype(np.float64)
    s = np.repeat(formats.bf16_to_f32(scales).T.astype(np.float64), 32, axis=1)
    assert np.array_equal(w4a16.w_hat_zp(words, scales, z), (q - np.repeat(z.T, 32, axis=1)) * s)


def test_bad_shapes_are_refused(rng):
    x, words, scales = problem(rng, k=512, g=128)
    for bad in (scales[:3], scales[:, :64], scales.astype(np.float32)):  # G = 512/3, N, not bits
        with pytest.raises(ValueError):
            w4a16.w_hat(words, bad)
    with pytest.raises(ValueError):
        w4a16.w_hat(words[:, :2], scales[:1])  # K = 16: not a multiple of 32
    with pytest.raises(ValueError):
        w4a16.w4a16_gemm(x[:, :256], words, scales)
    with pytest.raises(ValueError):
        w4a16.w_hat_zp(words, scales, np.full(scales.shape, 16, np.uint8))
    with pytest.raises(ValueError):
        w4a16.w4a16r_gemm(x, w4a16.repack(words)[:, :-1], scales)


# ---------------------------------------------------------------------------------------------
# The repacked layout


def spec_fragments(q: np.ndarray) -> np.ndarray:
    """The layout as the module docstring states it, one word at a time: [N/64, K/16, 32, 4, 8]
    logical elements e0..e7 of word w of lane t at block nb and step ks."""
    n, k = q.shape
    out = np.zeros((n // 64, k // 16, 32, 4, 8), np.uint8)
    for nb in range(n // 64):
        for ks in range(k // 16):
            for t in range(32):
                for w in range(4):
                    n_a, n_b = nb * 64 + 8 * (2 * w) + t // 4, nb * 64 + 8 * (2 * w + 1) + t // 4
                    k0 = ks * 16 + 2 * (t % 4)
                    out[nb, ks, t, w] = [
                        *(q[n_a, k0], q[n_a, k0 + 1], q[n_a, k0 + 8], q[n_a, k0 + 9]),
                        *(q[n_b, k0], q[n_b, k0 + 1], q[n_b, k0 + 8], q[n_b, k0 + 9]),
                    ]
    return out


def word_elements(repacked: np.ndarray, n: int, k: int) -> np.ndarray:
    """Each word's e0..e7 read with the magic unpack's rule (element 2i at nibble i, element
    2i + 1 at nibble i + 4), independently of int4.unpack: [N/64, K/16, 32, 4, 8]."""
    words = repacked.reshape(n // 64, k // 16, 32, 4).astype(np.uint64)
    nibble = [(words >> np.uint64(4 * p)) & np.uint64(0xF) for p in range(8)]
    order = [nibble[i // 2] if i % 2 == 0 else nibble[i // 2 + 4] for i in range(8)]
    return np.stack(order, axis=-1).astype(np.uint8)


def fragments_match(repack_fn, rng, n=128, k=96) -> bool:
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    repacked = repack_fn(int4.pack(q))
    return repacked.shape == (n // 64, 8 * k) and np.array_equal(
        word_elements(repacked, n, k), spec_fragments(q)
    )


def test_repack_is_the_mma_b_fragments_element_by_element(rng):
    assert fragments_match(w4a16.repack, rng)


def swap_n8_tiles(words: np.ndarray) -> np.ndarray:
    """Mutant: n8 tiles 0 and 1 of every block trade places (e0..e3 with e4..e7 of word 0)."""
    q = int4.unpack(words)
    rows = np.arange(q.shape[0]).reshape(-1, 8, 8)[:, [1, 0, 2, 3, 4, 5, 6, 7]].reshape(-1)
    return w4a16.repack(int4.pack(q[rows]))


def swap_k1_k8(words: np.ndarray) -> np.ndarray:
    """Mutant: k0 + 1 and k0 + 8 trade places in every lane (e1 with e2, e5 with e6)."""
    q = int4.unpack(words)
    step = np.arange(16)
    for c in range(4):
        step[[2 * c + 1, 2 * c + 8]] = step[[2 * c + 8, 2 * c + 1]]
    cols = (np.arange(q.shape[1]).reshape(-1, 16)[:, step]).reshape(-1)
    return w4a16.repack(int4.pack(q[:, cols]))


@pytest.mark.parametrize("mutant", [swap_n8_tiles, swap_k1_k8])
def test_the_fragment_check_and_the_round_trip_catch_the_mutants(rng, mutant):
    assert not fragments_match(mutant, rng)
    words = rng.integers(0, 2**32, (128, 32), dtype=np.uint32)
    assert not np.array_equal(w4a16.unrepack(mutant(words), 128, 256), words)


@pytest.mark.parametrize("n,k", [(64, 16), (64, 256), (192, 1056), (320, 4192), (512, 2080)])
def test_repack_round_trips(rng, n, k):
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    repacked = w4a16.repack(words)
    assert repacked.shape == (n // 64, 8 * k) and repacked.dtype == np.uint32
    assert np.array_equal(w4a16.unrepack(repacked, n, k), words)


def test_repacked_op_is_the_natural_op(rng):
    x, words, scales = problem(rng, m=5, n=192, k=1056, g=32)
    assert np.array_equal(
        w4a16.w4a16r_gemm(x, w4a16.repack(words), scales), w4a16.w4a16_gemm(x, words, scales)
    )


def test_repack_refuses_what_has_no_layout(rng):
    for n, k in ((96, 256), (64, 8), (1, 256)):  # N % 64, K % 16
        with pytest.raises(ValueError, match="repack needs"):
            w4a16.repack(np.zeros((n, k // 8), np.uint32))
    with pytest.raises(ValueError, match="repack takes"):
        w4a16.repack(np.zeros(64, np.uint32))
    good = w4a16.repack(rng.integers(0, 2**32, (128, 32), dtype=np.uint32))
    for bad in (good[:1], good[:, :-4], good.reshape(-1)):
        with pytest.raises(ValueError, match="repacked weights"):
            w4a16.unrepack(bad, 128, 256)
    with pytest.raises(ValueError, match="repack needs"):
        w4a16.unrepack(good, 100, 256)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def bf16_scales(rng, groups, n, dtype=np.float16) -> np.ndarray:
    """Checkpoint scales of `dtype` whose values BF16 holds exactly (so the conversion is exact)."""
    bits = golden.dequant_scales(rng, groups, n, "bfloat16")
    return formats.bf16_to_f32(bits).astype(dtype)


def act_order(rng, k: int, g: int) -> np.ndarray:
    """GPTQ's desc_act g_idx: channels quantized in a random order, G at a time."""
    order = rng.permutation(k)
    g_idx = np.empty(k, np.int32)
    g_idx[order] = np.arange(k) // g
    return g_idx


def assert_means_the_checkpoint(converted, w, x):
    """W_hat of the converted weights is the checkpoint's W with K permuted, and the product with
    x[:, perm] is the product with x."""
    words, scales, zeros, perm = converted
    w_hat = w4a16.w_hat(words, scales) if zeros is None else w4a16.w_hat_zp(words, scales, zeros)
    assert np.array_equal(w_hat, w[:, perm])
    assert sorted(perm) == list(range(w.shape[1]))
    x_perm = formats.bf16_to_f32(x).astype(np.float64)[:, perm]
    x_bits = formats.f64_to_bf16(x_perm)
    assert np.array_equal(w4a16.gemm(x_bits, w_hat), w4a16.gemm(x, w))


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_round_trip_and_meaning(rng, ordered, symmetric):
    n, k, g = 64, 512, 128
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = bf16_scales(rng, k // g, n)
    zeros = None if symmetric else rng.integers(1, 16, (k // g, n))
    g_idx = act_order(rng, k, g) if ordered else None
    checkpoint = w4a16.to_gptq(q, scales, zeros, g_idx)
    qweight, _, qzeros, stored_g_idx = checkpoint
    assert qweight.dtype == np.int32 and qweight.shape == (k // 8, n)
    assert qzeros.dtype == np.int32 and qzeros.shape == (k // g, n // 8)
    if symmetric:
        assert np.all(qzeros.view(np.uint32) == 0x77777777)  # z = 8 stored as 7
    converted = w4a16.from_gptq(*checkpoint)
    if symmetric:
        assert np.all(converted.zeros == 8)
    else:
        assert np.array_equal(converted.zeros, zeros)
    assert np.array_equal(int4.unpack(converted.words), q[:, converted.perm])
    perm = np.argsort(stored_g_idx, kind="stable")
    assert np.array_equal(converted.perm, perm if ordered else np.arange(k))
    w = w4a16.dequant_checkpoint("gptq", *checkpoint)
    z = np.full((k // g, n), 8) if symmetric else zeros
    group = stored_g_idx  # the group of each input channel, k // G without act-order
    assert np.array_equal(group, g_idx if ordered else np.arange(k) // g)
    assert np.array_equal(w, (q - z[group].T) * scales.astype(np.float64)[group].T)
    assert_means_the_checkpoint(converted, w, golden.gemv_activations(rng, 3, k))


def test_gptq_meaning_by_hand():
    """One word and one zero point, decoded by hand: column 0 of qweight row 0 holds k = 0..7,
    nibble j = k; qzeros holds z - 1 for columns 0..7, nibble j = column j."""
    qweight = np.zeros((4, 8), np.uint32)
    qweight[0, 0] = 0x76543210
    qzeros = np.full((1, 1), 0x77777772, np.uint32)  # column 0: z = 3, the others 8
    scales = np.full((1, 8), 0.5, np.float32)
    w = w4a16.dequant_checkpoint("gptq", qweight.view(np.int32), scales, qzeros.view(np.int32))
    assert np.array_equal(w[0, :8], (np.arange(8) - 3) * 0.5)
    assert np.array_equal(w[0, 8:], np.full(24, -1.5))
    assert np.array_equal(w[1], np.full(32, -4.0))


def test_gptq_without_qzeros_is_symmetric(rng):
    n, k, g = 64, 256, 32
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = bf16_scales(rng, k // g, n, np.float32)
    qweight, _, _, g_idx = w4a16.to_gptq(q, scales)
    converted = w4a16.from_gptq(qweight, scales, None, g_idx)
    assert converted.zeros is None
    w = w4a16.dequant_checkpoint("gptq", qweight, scales)
    assert_means_the_checkpoint(converted, w, golden.gemv_activations(rng, 2, k))


def test_gptq_refusals(rng):
    n, k, g = 64, 256, 128
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = bf16_scales(rng, k // g, n)
    with pytest.raises(ValueError):
        w4a16.to_gptq(q, scales, np.zeros((k // g, n), int))  # z = 0: v1 cannot store -1
    z16 = np.full((k // g, n), 16)
    checkpoint = w4a16.to_gptq(q, scales, z16)  # representable (stored 15), means z = 16 ...
    w = w4a16.dequant_checkpoint("gptq", *checkpoint)
    assert np.array_equal(w, (q - 16.0) * np.repeat(scales.astype(np.float64), g, 0).T)
    with pytest.raises(ValueError, match="z = 16"):
        w4a16.from_gptq(*checkpoint)  # ... which no 4-bit zero point holds
    qweight, _, qzeros, g_idx = w4a16.to_gptq(q, scales)
    uneven = g_idx.copy()
    uneven[0] = 1 - uneven[0]  # one group with G + 1 channels, the other with G - 1
    with pytest.raises(ValueError, match="g_idx"):
        w4a16.from_gptq(qweight, scales, qzeros, uneven)
    with pytest.raises(TypeError):
        w4a16.from_gptq(qweight, formats.f32_to_bf16(scales.astype(np.float32)), qzeros)  # bits
    with pytest.raises(ValueError):
        w4a16.from_gptq(qweight, scales[:, :32], qzeros)  # N of the scales is not qweight's


def test_fp16_scales_are_rounded_once_to_bf16(rng):
    """FP16 checkpoint scales BF16 cannot hold: the one lossy step, within 2^-8 (BF16's unit
    roundoff, 8 significant bits) of each."""
    n, k, g = 64, 256, 64
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = (rng.uniform(1e-3, 2e-2, (k // g, n))).astype(np.float16)
    converted = w4a16.from_gptq(*w4a16.to_gptq(q, scales))
    assert np.array_equal(converted.scales, formats.f64_to_bf16(scales.astype(np.float64)))
    s = formats.bf16_to_f32(converted.scales).astype(np.float64)
    assert np.all(np.abs(s - scales) <= 2.0**-8 * scales.astype(np.float64))
    assert not np.array_equal(s, scales.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
def test_awq_round_trip_and_meaning(rng, dtype):
    n, k, g = 128, 512, 64
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = bf16_scales(rng, k // g, n, dtype)
    zeros = rng.integers(0, 16, (k // g, n))
    checkpoint = w4a16.to_awq(q, scales, zeros)
    qweight, _, qzeros = checkpoint
    assert qweight.dtype == np.int32 and qweight.shape == (k, n // 8)
    assert qzeros.dtype == np.int32 and qzeros.shape == (k // g, n // 8)
    converted = w4a16.from_awq(*checkpoint)
    assert np.array_equal(int4.unpack(converted.words), q)
    assert np.array_equal(converted.zeros, zeros)
    assert np.array_equal(converted.perm, np.arange(k))
    w = w4a16.dequant_checkpoint("awq", *checkpoint)
    s = np.repeat(scales.astype(np.float64), g, axis=0).T
    assert np.array_equal(w, (q - np.repeat(zeros, g, axis=0).T) * s)
    assert_means_the_checkpoint(converted, w, golden.gemv_activations(rng, 3, k))


def test_awq_order_by_hand():
    """Nibble i of an AWQ word holds column AWQ_ORDER[i]: columns 0..7 holding 0..7 pack as
    0x75316420 (AutoAWQ's pack loop), the interleaved order of chapter 02."""
    assert w4a16.AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7) == int4.PERM
    q = np.tile(np.arange(8, dtype=np.uint8), (32, 1)).T  # (N=8,K=32): row n holds n
    qweight, _, qzeros = w4a16.to_awq(q, np.ones((1, 8), np.float32), np.arange(8)[None])
    assert np.all(qweight.view(np.uint32) == 0x75316420)
    assert qzeros.view(np.uint32)[0, 0] == 0x75316420


# ---------------------------------------------------------------------------------------------
# Golden cases and their tolerance


def test_golden_cases_have_the_promised_shapes():
    cases = golden.w4a16_gemm_cases(np.random.default_rng(3))
    assert golden.CHAPTERS["07_w4a16_gemm"] is golden.w4a16_gemm_cases
    sym = [op for op in golden.W4A16_OPS for _ in golden.W4A16_SHAPES]
    zp = [op for op in golden.W4A16_OPS for _ in golden.W4A16_ZP_SHAPES]
    assert [c.op for c in cases] == sym + zp
    for case in cases:
        m, n, k, g = map(int, re.search(r"_m(\d+)_n(\d+)_k(\d+)_g(\d+)$", case.id).groups())
        with_zeros = "_zp_" in case.id
        shapes = golden.W4A16_ZP_SHAPES if with_zeros else golden.W4A16_SHAPES
        assert (m, n, k, g) in shapes and case.params == {"group_size": g}
        assert len(case.inputs) == 3 + with_zeros
        x, weights, scales = case.inputs[:3]
        assert x.shape == (m, k) and scales.shape == (k // g, n)
        assert weights.shape == ((n // 64, 8 * k) if case.op == "w4a16r_gemm" else (n, k // 8))
        if with_zeros:
            zeros = case.inputs[3]
            assert zeros.dtype == np.uint8 and zeros.shape == scales.shape and zeros.max() <= 15
        golden.check_case(case, golden.expected_outputs(case))
    for shapes in (golden.W4A16_SHAPES, golden.W4A16_ZP_SHAPES):
        assert {m for m, *_ in shapes} >= {1, 5, 17, 33, 64, 130}
        assert {n for _, n, _, _ in shapes} == {64, 192, 320, 512}
        assert {k % 64 for _, _, k, _ in shapes} == {0, 32}
        assert {g for *_, g in shapes} >= {32, 64, 128} and any(g == k for _, _, k, g in shapes)
    assert {m for m, *_ in golden.W4A16_SHAPES} >= {16}


def test_the_symmetric_cases_kept_their_draws():
    """The zero-point cases come after the symmetric ones, which a seed still draws alike."""
    cases = golden.w4a16_gemm_cases(np.random.default_rng(5))
    rng = np.random.default_rng(5)
    first = golden._w4a16_case(rng, golden.W4A16_OPS[0], *golden.W4A16_SHAPES[0])
    assert cases[0].id == first.id
    assert all(np.array_equal(a, b) for a, b in zip(cases[0].inputs, first.inputs, strict=True))


def test_an_op_takes_its_zero_points_as_an_optional_fourth_input(rng):
    """The manifest names 3 or 4 inputs of the W4A16 ops, never 2 or 5; the zeros are uint8."""
    case = golden._w4a16_case(rng, "w4a16r_gemm", 1, 64, 256, 32, zero_points=True)
    op = golden.OPS["w4a16r_gemm"]
    assert op.input_names(4) == ("bfloat16", "uint32", "bfloat16", "uint8")
    assert op.input_names(3) == ("bfloat16", "uint32", "bfloat16")
    golden.check_case(case, golden.expected_outputs(case))
    for inputs in (case.inputs[:2], [*case.inputs, case.inputs[3]]):
        bad = golden.Case(case.id, case.op, case.tolerance, inputs, case.params)
        with pytest.raises(ValueError, match="takes 4 in"):
            golden.check_case(bad, [np.zeros((1, 64), np.uint16)])
    wrong = golden.Case(case.id, case.op, case.tolerance, [*case.inputs[:3], case.inputs[3] + 0.0])
    with pytest.raises(ValueError, match="uint8 must be stored as"):
        golden.check_case(wrong, golden.expected_outputs(case))


def test_the_zero_point_bias_leaves_q_minus_z_exactly():
    """The kernels' unpack: (0x4300 | q) - (0x4300 | z) in BF16 is q - z for every q and z, and
    z = 8 is chapter 02's constant 136 (0x4308): the symmetric path is the same arithmetic."""
    q, z = np.meshgrid(np.arange(16, dtype=np.uint16), np.arange(16, dtype=np.uint16))
    as_bf16 = lambda bits: bits.view(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
    diff = (as_bf16(0x4300 | q) - as_bf16(0x4300 | z)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(diff.astype(np.float64), q.astype(np.float64) - z)
    assert as_bf16(np.array([0x4300 | 8], np.uint16))[0] == 136.0


def zero_of_stage(zeros: np.ndarray, k: int, g: int) -> np.ndarray:
    """mutant_zero_points' zero points: every k of a 64-k stage takes the group of its first k."""
    group_of_k = (np.arange(k) // 64 * 64) // g
    return zeros[group_of_k]  # (K,N): one row per input channel


def test_the_zero_point_cases_catch_a_zero_point_of_the_wrong_group():
    """mutant_zero_points, emulated: its wrong z changes nothing at G >= 64 (a stage is one
    group), and fails every zero-point case with G = 32, which the golden set therefore has."""
    caught = []
    for case in golden.w4a16_gemm_cases(np.random.default_rng(11)):
        if "_zp_" not in case.id or case.op != "w4a16_gemm":
            continue
        x, words, scales, zeros = case.inputs
        k, g = x.shape[1], int(case.params["group_size"])
        s = np.repeat(formats.bf16_to_f32(scales).T.astype(np.float64), g, axis=1)  # (N,K)
        q = int4.unpack(words).astype(np.float64)
        wrong = (q - zero_of_stage(zeros, k, g).T) * s
        ok = within(w4a16.gemm(x, wrong), golden.expected_outputs(case)[0], case.tolerance).all()
        assert ok == (g >= 64), case.id
        caught.append(not ok)
    assert any(caught)


def fp32_mma_sum(x32: np.ndarray, w32: np.ndarray) -> np.ndarray:
    """FP32 sums in k16 steps (each step's 16 products summed first, as one mma), then split-K:
    two halves of the steps accumulated apart and added at the end."""
    steps = x32.shape[1] // 16
    halves = []
    for lo, hi in ((0, steps // 2), (steps // 2, steps)):
        acc = np.zeros((x32.shape[0], w32.shape[0]), np.float32)
        for s in range(lo, hi):
            cols = slice(16 * s, 16 * s + 16)
            acc += (x32[:, cols].astype(np.float64) @ w32[:, cols].T.astype(np.float64)).astype(
                np.float32
            )
        halves.append(acc)
    return halves[0] + halves[1]


@pytest.mark.parametrize("k,g", [(1056, 32), (4096, 128), (2080, 2080)])
def test_tolerance_passes_fp32_mma_sums_and_catches_the_mutants(rng, k, g):
    x, words, scales = problem(rng, m=17, n=64, k=k, g=g)
    w = w4a16.w_hat(words, scales)
    ref, tol = w4a16.w4a16_gemm(x, words, scales), w4a16.tolerance(x, w)
    x32 = formats.bf16_to_f32(x)
    rounded = formats.bf16_to_f32(formats.f64_to_bf16(w))  # s * (q - 8) rounded into the mma
    for w32 in (w.astype(np.float32), rounded):
        assert within(formats.f32_to_bf16(fp32_mma_sum(x32, w32)), ref, tol).all()
    no_tail = w.copy()
    no_tail[:, -32:] = 0  # K % 64 == 32 read as if K were a multiple of 64
    swapped = w4a16.w_hat(w4a16.unrepack(swap_n8_tiles(words), 64, k), scales)
    for wrong in (no_tail, swapped):
        assert not within(w4a16.gemm(x, wrong), ref, tol).all()


def test_the_golden_cases_catch_a_split_k_sum_that_counts_the_first_split_twice():
    """mutant_split_k_first, emulated: y plus the first split's partial (stages of 64 k, cut as
    gemm_plan.h's split_cut cuts them). Every repacked case that splits K must fail, however
    many splits the GPU's slots give (2 to K/256: each split keeps >= 4 stages)."""
    for case in golden.w4a16_gemm_cases(np.random.default_rng(13)):
        if case.op != "w4a16r_gemm":
            continue
        x, repacked, scales = case.inputs[:3]
        n, k = scales.shape[1], x.shape[1]
        words = w4a16.unrepack(repacked, n, k)
        w = (w4a16.w_hat(words, scales) if len(case.inputs) == 3
             else w4a16.w_hat_zp(words, scales, case.inputs[3]))
        ref = golden.expected_outputs(case)[0]
        k_tiles = -(-k // 64)
        for splits in sorted({2, k_tiles // 4} - {0, 1}):
            first = 64 * (k_tiles // splits + (k_tiles % splits > 0))  # split 0's k, ending
            x64 = formats.bf16_to_f32(x).astype(np.float64)
            doubled = x64 @ w.T + x64[:, :first] @ w[:, :first].T
            got = formats.f64_to_bf16(doubled)
            assert not within(got, ref, case.tolerance).all(), (case.id, splits)
