"""lkw.elementwise (chapter 05): gated activations with their fused FP8 quant, RoPE (NEOX and GPT-J,
partial rot_dim, inverse), fused QK RMSNorm + RoPE and reshape_and_cache against slow-loop
oracles (per element, per head, per slot); each rounding point shown to matter; the tolerances
against FP32 kernel emulations; mutants a named comparison must reject; bad input."""

import math

import numpy as np
import pytest
from lkw import elementwise as ew
from lkw import formats, quant, rmsnorm


def f64(bits) -> np.ndarray:
    return formats.bf16_to_f32(np.asarray(bits, np.uint16)).astype(np.float64)


def bf16_encode(values) -> np.ndarray:
    """FP64 -> BF16 bits by lkw.formats.encode on integers (no ml_dtypes): the oracles' rounding."""
    return formats.encode(np.asarray(values, np.float64), formats.BF16, saturate=False)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(ew._ordered(np.asarray(a, np.uint16)) - ew._ordered(np.asarray(b, np.uint16)))


def nudge_f32(v: np.ndarray, rng, most: int) -> np.ndarray:
    """v moved by a random number of FP32 ulps in -most..most (a library function's error)."""
    v = np.asarray(v, np.float32)
    step = rng.integers(-most, most + 1, v.shape, dtype=np.int32)
    return (v.view(np.int32) + step).view(np.float32)


# --- 1. gated activations ---------------------------------------------------------------------


def over_one_plus_exp(g: float, t: float) -> float:
    """g / (1 + e^t), -0 / +0 where e^t overflows."""
    return g / (1.0 + math.exp(t)) if t < 700 else math.copysign(0.0, g)


# Without cancellation: (1 + erf(t)) / 2 = erfc(-t) / 2 and (1 + tanh z) / 2 = 1 / (1 + e^-2z).
ACT_ORACLE = {
    "silu": lambda g: over_one_plus_exp(g, -g),
    "gelu": lambda g: 0.5 * g * math.erfc(-g / math.sqrt(2.0)),
    "gelu_tanh": lambda g: over_one_plus_exp(g, -math.sqrt(8 / math.pi) * (g + 0.044715 * g**3)),
}


def act_and_mul_oracle(x, act, act_first=True, limit=None):
    """One output element at a time, Python floats, rounded by lkw.formats.encode."""
    t, two_d = x.shape
    d = two_d // 2
    out = np.zeros((t, d))
    for row in range(t):
        for j in range(d):
            first, second = float(f64(x[row, j])), float(f64(x[row, d + j]))
            gate, up = (first, second) if act_first else (second, first)
            if limit is not None:
                gate, up = min(gate, limit), max(-limit, min(up, limit))
            out[row, j] = ACT_ORACLE[act](gate) * up
    return bf16_encode(out)


@pytest.mark.parametrize("act", ew.ACTIVATIONS)
@pytest.mark.parametrize("t,d", [(1, 37), (3, 8), (2, 1)])  # d not a multiple of 8, T = 1, d = 1
def test_act_and_mul_against_the_element_loop(rng, act, t, d):
    x = ew.gate_up(rng, t, d)
    assert np.array_equal(ew.act_and_mul(x, act), act_and_mul_oracle(x, act))
    assert np.array_equal(
        ew.act_and_mul(x, act, act_first=False), act_and_mul_oracle(x, act, act_first=False)
    )


def test_named_ops_gate_the_first_half(rng):
    x = ew.gate_up(rng, 4, 64)
    assert np.array_equal(ew.silu_and_mul(x), ew.act_and_mul(x, "silu", act_first=True))
    assert np.array_equal(ew.gelu_and_mul(x), ew.act_and_mul(x, "gelu"))
    assert np.array_equal(ew.gelu_tanh_and_mul(x), ew.act_and_mul(x, "gelu_tanh"))
    swapped = np.hstack([x[:, 64:], x[:, :64]])
    assert np.array_equal(ew.act_and_mul(x, act_first=False), ew.silu_and_mul(swapped))


def test_clamp_limits_gate_from_above_and_up_both_ways(rng):
    x = ew.gate_up(rng, 3, 40, spread=0)
    x[:, :40] = formats.f32_to_bf16(f64(x[:, :40]) * 8)  # gates up to ~30
    x[:, 40:] = formats.f32_to_bf16(f64(x[:, 40:]) * 8)
    for act in ew.ACTIVATIONS:
        got = ew.act_and_mul(x, act, limit=7.0)
        assert np.array_equal(got, act_and_mul_oracle(x, act, limit=7.0))
        assert np.any(got != ew.act_and_mul(x, act)), "some values should be clamped"
        assert np.array_equal(ew.act_and_mul(x, act, limit=1e30), ew.act_and_mul(x, act))


def test_silu_is_rounded_once_not_after_the_activation(rng):
    """vLLM's scalar kernel and torch eager round silu(gate) to BF16 before the multiply; the
    contract does not. The two differ on ordinary data (a quarter of the elements, by one ulp)."""
    x = ew.gate_up(rng, 64, 1024)
    gate, up = ew.gate_and_up(x)
    two_roundings = formats.f64_to_bf16(f64(formats.f64_to_bf16(ew.activation(gate, "silu"))) * up)
    y = ew.silu_and_mul(x)
    assert np.mean(y != two_roundings) > 0.1
    assert ulps(y, two_roundings).max() == 1  # so the golden ulp:1 cannot tell them apart


def fp32_silu_kernel(x, rng=None, skew=0):
    """An FP32 kernel: expf, 1 + e, g / (1 + e), * up, each rounded to FP32 (s moved by up to
    `skew` ulps, __expf's error), then cvt.rn to BF16."""
    g, u = (a.astype(np.float32) for a in ew.gate_and_up(x))
    with np.errstate(over="ignore"):
        s = g / (np.float32(1) + np.exp(-g))
    if skew:
        s = nudge_f32(s, rng, skew)
    return formats.f32_to_bf16(s * u)


def test_silu_is_computed_in_float64_not_in_float32(rng):
    """The FP32 chain and the FP64 value rounded once differ on about 1 element in 10^4 (a BF16
    rounding boundary between them); on exactly those the reference is the FP64 one."""
    x = ew.gate_up(rng, 256, 2048)
    y, f32 = ew.silu_and_mul(x), fp32_silu_kernel(x)
    differ = y != f32
    assert 0 < np.sum(differ) < 1e-3 * y.size
    gate, up = ew.gate_and_up(x)
    exact = bf16_encode(gate[differ] / (1 + np.exp(-gate[differ])) * up[differ])
    assert np.array_equal(y[differ], exact)
    assert ulps(y, f32).max() == 1


def test_fp32_kernels_stay_within_the_activation_tolerance(rng):
    assert ew.TOLERANCE_ACT == "ulp:1"
    x = ew.gate_up(rng, 128, 2048)
    for skew in (0, 4):
        got = fp32_silu_kernel(x, rng, skew)
        assert ew.matches(got, ew.silu_and_mul(x), "bfloat16", ew.TOLERANCE_ACT)


def fp32_gelu_kernel(x, act):
    """vLLM's FP32 forms: 0.5 g (1 + erff(g / sqrt 2)), 0.5 g (1 + tanhf(beta (g + k g^3)))."""
    g, u = (a.astype(np.float32) for a in ew.gate_and_up(x))
    if act == "gelu":
        inner = np.frompyfunc(math.erf, 1, 1)(g * np.float32(math.sqrt(0.5))).astype(np.float32)
    else:
        beta, kappa = np.float32(math.sqrt(2 / math.pi)), np.float32(0.044715)
        inner = np.tanh(beta * (g + kappa * (g * g * g)))
    return formats.f32_to_bf16(np.float32(0.5) * g * (np.float32(1) + inner) * u)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_gelu_kernels_cancel_and_the_tolerance_allows_for_it(rng, act):
    """For gate ~ -5 the FP32 1 + erff / 1 + tanhf keeps no relative accuracy: ulp:1 fails a
    correct kernel, act_tolerance passes it, and still rejects the gate / up swap."""
    x = ew.gate_up(rng, 64, 512, spread=1)
    x[:, :512] = formats.f32_to_bf16(f64(x[:, :512]) * 3)  # gates to about -12
    want, got = ew.act_and_mul(x, act), fp32_gelu_kernel(x, act)
    tol = ew.act_tolerance(x, act)
    assert not ew.matches(got, want, "bfloat16", "ulp:1")
    assert ew.matches(got, want, "bfloat16", tol)
    assert not ew.matches(ew.act_and_mul(x, act, act_first=False), want, "bfloat16", tol)
    assert ew.act_tolerance(x, "silu") == ew.TOLERANCE_ACT


def test_mutant_gate_and_up_swapped_is_rejected(rng):
    x = ew.gate_up(rng, 8, 200)
    mutant = ew.act_and_mul(x, act_first=False)  # silu(up) * gate
    assert not ew.matches(mutant, ew.silu_and_mul(x), "bfloat16", ew.TOLERANCE_ACT)


# --- 1b. fused FP8 quant ------------------------------------------------------------------------


def test_fused_fp8_is_the_unfused_chain(rng):
    x = ew.gate_up(rng, 5, 384)
    yb = ew.silu_and_mul(x)
    for got, want in (
        (ew.silu_and_mul_fp8_per_token(x), quant.per_token_fp8(yb)),
        (ew.silu_and_mul_fp8_per_token(x, scale_ub=0.5), quant.per_token_fp8(yb, 0.5)),
        (ew.silu_and_mul_fp8_per_group(x), quant.per_group_fp8(yb)),
        (ew.silu_and_mul_fp8_per_group(x, 1), quant.per_group_fp8(yb, 1)),
    ):
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    q, scales = ew.silu_and_mul_fp8_per_group(x)
    assert scales.shape == (3, 5) and scales.flags.c_contiguous  # [d/128, T]: column-major
    scale = np.array([0.01], np.float32)
    q = ew.silu_and_mul_fp8_per_tensor(x, scale)
    assert np.array_equal(q, quant.quantize_fp8(formats.bf16_to_f32(yb), scale))


def test_static_per_tensor_scale_saturates(rng):
    x = ew.gate_up(rng, 4, 128)
    yb = f64(ew.silu_and_mul(x))
    scale = np.array([np.float32(np.max(np.abs(yb)) / 448 / 4)], np.float32)  # 4x too small
    q = formats.decode(ew.silu_and_mul_fp8_per_tensor(x, scale), formats.E4M3)
    assert np.max(np.abs(q)) == 448 and not np.any(np.isnan(q))


def test_fp8_tolerance_covers_a_kernels_own_yb(rng):
    """A kernel's yb may be one BF16 ulp off the reference's here and there (the 1-ulp tolerance
    above); quantizing that yb keeps q within one E4M3 code and the scales within 2^-6. Moving
    every element (the absmax ones too) up or down one ulp is the worst case."""
    x = ew.gate_up(rng, 16, 512)
    yb = ew.silu_and_mul(x)
    want_q, want_s = quant.per_token_fp8(yb)
    tol_q, tol_s = ew.TOLERANCE_FP8["per_token"].split("/")
    for step in (-1, 1):
        moved = (yb.view(np.int16) + np.int16(step) * np.where(yb & 0x7FFF, 1, 0)).astype(np.int16)
        q, s = quant.per_token_fp8(moved.view(np.uint16))
        assert ew.matches(q, want_q, "float8_e4m3fn", tol_q)
        assert ew.matches(s, want_s, "float32", tol_s)
        assert not np.array_equal(q, want_q)
    q, _ = quant.per_token_fp8(ew.act_and_mul(x, act_first=False))  # a wrong yb is not covered
    assert not ew.matches(q, want_q, "float8_e4m3fn", tol_q)


# --- 2. RoPE ------------------------------------------------------------------------------------


def rope_oracle(positions, h, cache, is_neox, inverse=False):
    """One pair at a time with the index formulas written out, Python floats."""
    t, heads, _d = h.shape
    rot_dim = cache.shape[1]
    half = rot_dim // 2
    out = f64(h).copy()
    for tok in range(t):
        row = cache[positions[tok]].astype(np.float64)
        for head in range(heads):
            v = f64(h[tok, head])
            for j in range(half):
                ix, iy = (j, j + half) if is_neox else (2 * j, 2 * j + 1)
                c, s = float(row[j]), float(row[half + j]) * (-1 if inverse else 1)
                out[tok, head, ix] = v[ix] * c - v[iy] * s
                out[tok, head, iy] = v[iy] * c + v[ix] * s
    return bf16_encode(out)


def rope_inputs(rng, t=3, hq=4, hk=2, d=128, rot_dim=None, max_pos=4096):
    rot_dim = d if rot_dim is None else rot_dim
    cache = ew.cos_sin_cache(max_pos, rot_dim)
    return ew.positions(rng, t, max_pos), ew.heads(rng, t, hq, d), ew.heads(rng, t, hk, d), cache


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    "t,hq,hk,d,rot_dim", [(1, 2, 1, 64, 64), (3, 3, 1, 10, 6), (2, 4, 2, 40, 32)]
)
def test_rope_against_the_pair_loop(rng, is_neox, t, hq, hk, d, rot_dim):
    pos, q, k, cache = rope_inputs(rng, t, hq, hk, d, rot_dim, max_pos=64)
    for inverse in (False, True):
        got_q, got_k = ew.rope(pos, q, k, cache, is_neox, inverse)
        assert np.array_equal(got_q, rope_oracle(pos, q, cache, is_neox, inverse))
        assert np.array_equal(got_k, rope_oracle(pos, k, cache, is_neox, inverse))


def test_neox_is_huggingface_rotate_half(rng):
    """q * cos + rotate_half(q) * sin with cos/sin repeated over both halves (HF's
    apply_rotary_pos_emb), in float64, rounded once."""
    pos, q, k, cache = rope_inputs(rng, t=5, d=64)
    rows = cache[pos].astype(np.float64)
    cos, sin = (np.concatenate([a, a], axis=-1)[:, None, :] for a in (rows[:, :32], rows[:, 32:]))
    for h, got in zip((q, k), ew.rope(pos, q, k, cache), strict=True):
        v = f64(h)
        rotate_half = np.concatenate([-v[..., 32:], v[..., :32]], axis=-1)
        assert np.array_equal(got, formats.f64_to_bf16(v * cos + rotate_half * sin))


def test_partial_rotary_leaves_the_tail_bits(rng):
    pos, q, k, cache = rope_inputs(rng, d=128, rot_dim=64)
    for is_neox in (True, False):
        got_q, got_k = ew.rope(pos, q, k, cache, is_neox)
        assert np.array_equal(got_q[..., 64:], q[..., 64:])
        assert np.array_equal(got_k[..., 64:], k[..., 64:])
        # ...and the rotated part did rotate: every token past position 0 (its first pair turns
        # by a whole radian a position) has changed elements in every head.
        moved = np.asarray(pos) > 0
        assert (got_q[moved, :, :64] != q[moved, :, :64]).any(axis=-1).all()
        # The rotated part is the full rotation of a 64-wide head.
        full = ew.rope(pos, q[..., :64].copy(), k[..., :64].copy(), cache, is_neox)
        assert np.array_equal(got_q[..., :64], full[0]) and np.array_equal(got_k[..., :64], full[1])


def test_neox_and_gptj_pair_different_elements(rng):
    pos, q, k, cache = rope_inputs(rng)
    neox, gptj = ew.rope(pos, q, k, cache, True), ew.rope(pos, q, k, cache, False)
    tol = ew.rope_tolerance(q, k)
    assert not ew.matches(gptj[0], neox[0], "bfloat16", tol)  # mutant: pairing swapped
    assert not ew.matches(neox[1], gptj[1], "bfloat16", tol)
    # Position 0 is the identity in both styles.
    zero = np.zeros_like(pos)
    for style in (True, False):
        assert all(np.array_equal(a, b) for a, b in zip(ew.rope(zero, q, k, cache, style), (q, k)))


def test_mutants_cos_sin_swapped_and_sin_negated_are_rejected(rng):
    pos, q, k, cache = rope_inputs(rng)
    want = ew.rope(pos, q, k, cache)
    tol = ew.rope_tolerance(q, k)
    swapped = np.hstack([cache[:, 64:], cache[:, :64]])  # a kernel reading sin as cos
    negated = ew.rope(pos, q, k, cache, inverse=True)  # a kernel with the sin sign flipped
    for mutant in (ew.rope(pos, q, k, swapped), negated):
        for got, ref in zip(mutant, want, strict=True):
            assert not ew.matches(got, ref, "bfloat16", tol)
    assert all(ew.matches(g, r, "bfloat16", tol) for g, r in zip(want, want, strict=True))


def test_inverse_undoes_the_rotation(rng):
    pos, q, k, cache = rope_inputs(rng)
    for style in (True, False):
        back = ew.rope(pos, *ew.rope(pos, q, k, cache, style), cache, style, inverse=True)
        for b, orig in zip(back, (q, k), strict=True):
            err = np.abs(f64(b) - f64(orig))
            assert np.all(err <= 2.0**-6 * np.max(np.abs(f64(orig)), axis=-1, keepdims=True))
        negated = np.hstack([cache[:, :64], -cache[:, 64:]])
        inverse = ew.rope(pos, q, k, cache, style, inverse=True)
        for a, b in zip(inverse, ew.rope(pos, q, k, negated, style), strict=True):
            assert np.array_equal(a, b)


def test_the_cache_rounds_the_angle_to_fp32(rng):
    """Angle = one FP32 multiply p * inv_freq (vLLM's float32 cache): at p ~ 8000 it is up to
    2^-11 rad off the exact angle, far more than the FP32 rounding of cos/sin."""
    cache = ew.cos_sin_cache(8192, 128)
    assert cache.dtype == np.float32 and cache.shape == (8192, 128)
    assert np.array_equal(cache[0], np.r_[np.ones(64), np.zeros(64)].astype(np.float32))
    inv = ew.inv_freq(128)
    assert inv[0] == 1
    assert np.array_equal(inv, (10000.0 ** (-np.arange(0, 128, 2) / 128)).astype(np.float32))
    p = np.arange(8192)[:, None]
    angle32 = (p.astype(np.float32) * inv).astype(np.float64)
    assert np.array_equal(cache[:, :64], np.cos(angle32).astype(np.float32))
    exact = np.cos(p * inv.astype(np.float64)).astype(np.float32)
    assert np.max(np.abs(cache[:, :64].astype(np.float64) - exact)) > 2.0**-14


def fp32_rope_kernel(positions, h, cache, is_neox, fma):
    """An FP32 kernel: products rounded to FP32 (or x * c fused into an FMA), the sum rounded to
    FP32, then cvt.rn to BF16."""
    cos, sin, rot_dim = ew._cache_rows(positions, h.shape[0], cache)
    xi, yi = ew.pair_indices(rot_dim, is_neox)
    v = f64(h)
    x, y = v[..., xi], v[..., yi]
    f32 = lambda a: a.astype(np.float32).astype(np.float64)
    if fma:
        xo, yo = f32(x * cos - f32(y * sin)), f32(f32(y * cos) + x * sin)
    else:
        xo, yo = f32(f32(x * cos) - f32(y * sin)), f32(f32(y * cos) + f32(x * sin))
    out = np.array(h)
    out[..., xi], out[..., yi] = formats.f64_to_bf16(xo), formats.f64_to_bf16(yo)
    return out


def test_fp32_kernels_stay_within_the_rope_tolerance(rng):
    pos, q, k, cache = rope_inputs(rng, t=64, hq=8, hk=2)
    want = ew.rope(pos, q, k, cache)
    tol = ew.rope_tolerance(q, k)
    for fma in (False, True):
        for h, w in zip((q, k), want, strict=True):
            assert ew.matches(fp32_rope_kernel(pos, h, cache, True, fma), w, "bfloat16", tol)


def test_cancellation_needs_the_absolute_term(rng):
    """Pairs with x c ~ y s: the FP32 rounding of a product is many BF16 ulps of the small result,
    so ulp:1 alone would fail a correct FP32 kernel; rope_tolerance's ATOL passes it."""
    n = 1 << 16
    cache = ew.cos_sin_cache(4096, 2)
    pos = ew.positions(rng, n, 4096)
    c, s = (cache[pos, i].astype(np.float64) for i in (0, 1))
    x = formats.f32_to_bf16(rng.standard_normal(n).astype(np.float32))
    y = formats.f64_to_bf16(f64(x) * c / np.where(s == 0, 1, s))  # y s ~ x c
    h = np.stack([x, y], axis=-1)[:, None, :]  # (T,1,2)
    want = ew.rope(pos, h, h, cache)[0]
    got = fp32_rope_kernel(pos, h, cache, True, fma=False)
    assert ulps(got, want).max() > 1
    assert ew.matches(got, want, "bfloat16", ew.rope_tolerance(h))


# --- 3. QK RMSNorm + RoPE -----------------------------------------------------------------------


def head_norm_oracle(h, w, eps):
    """Per head: FP64 mean of squares, fp32 rstd, z = bf16(fp32(v * rstd)), n = bf16(z * w)."""
    out = np.zeros(h.shape, np.uint16)
    for idx in np.ndindex(h.shape[:2]):
        v = f64(h[idx])
        rstd = float(np.float32(1 / math.sqrt(float(np.mean(v * v)) + float(np.float32(eps)))))
        z = f64(bf16_encode((v * rstd).astype(np.float32).astype(np.float64)))
        out[idx] = bf16_encode(z * f64(w))
    return out


def qk_inputs(rng, t=3, hq=4, hk=2, d=64, rot_dim=None):
    pos, q, k, cache = rope_inputs(rng, t, hq, hk, d, rot_dim, max_pos=256)
    w = [ew._activations(rng, 1, d, 0)[0] for _ in range(2)]
    w = [formats.f32_to_bf16(1 + 0.25 * f64(a)) for a in w]  # weights around 1
    return pos, q, k, w[0], w[1], cache


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("t,d,rot_dim", [(1, 64, 64), (3, 10, 6)])
def test_qk_norm_rope_against_the_head_loop(rng, is_neox, t, d, rot_dim):
    pos, q, k, wq, wk, cache = qk_inputs(rng, t, 3, 1, d, rot_dim)
    got_q, got_k = ew.qk_norm_rope(pos, q, k, wq, wk, cache, 1e-6, is_neox)
    assert np.array_equal(got_q, rope_oracle(pos, head_norm_oracle(q, wq, 1e-6), cache, is_neox))
    assert np.array_equal(got_k, rope_oracle(pos, head_norm_oracle(k, wk, 1e-6), cache, is_neox))


def fp32_qk_norm_rope_kernel(pos, h, w, cache, eps, skew, round_n=True):
    """A fused FP32 kernel: lane-order sum of squares, rstd moved by `skew` FP32 ulps; n rounded
    like the chain (round_n) or kept in FP32 as vLLM's fused kernel does; then RoPE (NEOX)."""
    t, heads, d = h.shape
    v = formats.bf16_to_f32(h).reshape(t * heads, d)
    sq = np.hstack([v * v, np.zeros((t * heads, -d % 32), np.float32)])
    lanes = sq.reshape(t * heads, -1, 32).sum(axis=1, dtype=np.float32)  # (rows,32)
    ss = lanes.sum(axis=1, dtype=np.float32)[:, None]
    rstd = np.float32(1) / np.sqrt(ss / np.float32(d) + np.float32(eps))
    rstd = (rstd.view(np.int32) + np.int32(skew)).view(np.float32)
    if round_n:
        n = f64(rmsnorm.normalize(v, rstd, w))
    else:
        n = (v * rstd * formats.bf16_to_f32(w)).astype(np.float64)
    n = n.reshape(t, heads, d)
    cos, sin, rot_dim = ew._cache_rows(pos, t, cache)
    xi, yi = ew.pair_indices(rot_dim, True)
    x, y = n[..., xi], n[..., yi]
    n[..., xi], n[..., yi] = x * cos - y * sin, y * cos + x * sin
    return formats.f64_to_bf16(n)


def test_qk_norm_rope_rounds_n_to_bf16_like_the_unfused_chain(rng):
    pos, q, k, wq, wk, cache = qk_inputs(rng, t=32, hq=8, hk=2, d=128)
    got_q, got_k = ew.qk_norm_rope(pos, q, k, wq, wk, cache, 1e-6)
    chain = ew.rope(pos, ew.head_rmsnorm(q, wq, 1e-6), ew.head_rmsnorm(k, wk, 1e-6), cache)
    assert np.array_equal(got_q, chain[0]) and np.array_equal(got_k, chain[1])
    fp32_throughout = fp32_qk_norm_rope_kernel(pos, q, wq, cache, 1e-6, 0, round_n=False)
    assert np.mean(fp32_throughout != got_q) > 0.05  # the rounding point is visible...
    tol = ew.qk_norm_rope_tolerance(got_q, got_k)
    assert ew.matches(fp32_throughout, got_q, "bfloat16", tol)  # ...and vLLM's kernel passes


def test_fp32_kernels_stay_within_the_qk_norm_rope_tolerance(rng):
    pos, q, k, wq, wk, cache = qk_inputs(rng, t=32, hq=8, hk=2, d=128)
    want_q, want_k = ew.qk_norm_rope(pos, q, k, wq, wk, cache, 1e-6)
    tol = ew.qk_norm_rope_tolerance(want_q, want_k)
    for skew in (-2, 0, 2):
        for h, w, want in ((q, wq, want_q), (k, wk, want_k)):
            got = fp32_qk_norm_rope_kernel(pos, h, w, cache, 1e-6, skew)
            assert ew.matches(got, want, "bfloat16", tol), skew


def test_qk_norm_rope_mutants_are_rejected(rng):
    pos, q, k, wq, wk, cache = qk_inputs(rng, t=8, hq=4, hk=2, d=128)
    want = ew.qk_norm_rope(pos, q, k, wq, wk, cache, 1e-6)
    tol = ew.qk_norm_rope_tolerance(*want)
    mutants = {
        "weights swapped": ew.qk_norm_rope(pos, q, k, wk, wq, cache, 1e-6),
        "GPT-J pairing": ew.qk_norm_rope(pos, q, k, wq, wk, cache, 1e-6, is_neox=False),
        "no norm": ew.rope(pos, q, k, cache),
        "rope before norm": (
            ew.head_rmsnorm(ew.rope(pos, q, k, cache)[0], wq, 1e-6),
            ew.head_rmsnorm(ew.rope(pos, q, k, cache)[1], wk, 1e-6),
        ),
    }
    for name, got in mutants.items():
        pairs = zip(got, want, strict=True)
        assert not all(ew.matches(g, w, "bfloat16", tol) for g, w in pairs), name


# --- 4. reshape_and_cache -----------------------------------------------------------------------


def cache_oracle(key, value, key_cache, value_cache, slots, layout, k_scale=None, v_scale=None):
    """One (slot, head, element) at a time into the FLAT caches, with the offset arithmetic of
    vLLM's kernels spelled out."""
    t, hk, d = key.shape
    kc, vc = key_cache.copy().reshape(-1), value_cache.copy().reshape(-1)
    fp8 = key_cache.dtype == np.uint8
    x = 16 if fp8 else 8
    bs = key_cache.shape[ew.BLOCK_AXIS[layout]]
    for tok in range(t):
        slot = int(slots[tok])
        if slot == -1:
            continue
        b, o = slot // bs, slot % bs
        for h in range(hk):
            for i in range(d):
                if layout == "paged":
                    k_at = (((b * hk + h) * (d // x) + i // x) * bs + o) * x + i % x
                    v_at = ((b * hk + h) * d + i) * bs + o
                elif layout == "nhd":
                    k_at = v_at = ((b * bs + o) * hk + h) * d + i
                else:
                    k_at = v_at = ((b * hk + h) * bs + o) * d + i
                kv = key[tok, h, i], value[tok, h, i]
                if fp8:
                    kv = tuple(
                        quant.quantize_fp8(formats.bf16_to_f32(np.array([a])), sc)[0]
                        for a, sc in zip(kv, (k_scale, v_scale), strict=True)
                    )
                kc[k_at], vc[v_at] = kv
    return kc.reshape(key_cache.shape), vc.reshape(value_cache.shape)


FP8_SCALES = {"k_scale": np.array([0.02], np.float32), "v_scale": np.array([0.03], np.float32)}


@pytest.mark.parametrize("layout", ew.LAYOUTS)
@pytest.mark.parametrize("kv_dtype", list(ew.KV_DTYPES))
def test_reshape_and_cache_against_the_slot_loop(rng, layout, kv_dtype):
    t, hk, d, blocks, bs = 7, 2, 32, 3, 4
    key, value = ew.heads(rng, t, hk, d, spread=1), ew.heads(rng, t, hk, d, spread=1)
    slots = ew.slot_mapping(rng, t, blocks * bs)
    kc, vc = ew.poisoned_caches(layout, blocks, bs, hk, d, kv_dtype)
    scales = FP8_SCALES if kv_dtype != "bfloat16" else {}
    got = ew.reshape_and_cache(key, value, kc, vc, slots, layout, **scales)
    want = cache_oracle(key, value, kc, vc, slots, layout, *scales.values())
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert all(ew.matches(g, w, kv_dtype, ew.TOLERANCE_KV) for g, w in zip(got, want, strict=True))
    # The inputs are not modified; every element no token wrote is still poison.
    assert np.all(kc == ew.POISON[kc.dtype]) and np.all(vc == ew.POISON[vc.dtype])
    valid = slots >= 0
    for cache in got:
        assert np.sum(cache != ew.POISON[cache.dtype]) <= valid.sum() * hk * d
    # Read back at the valid slots: the values (BF16) or chapter 03's quantization of them.
    k_back, v_back = ew.gather_cache(*got, slots[valid], layout, d)
    if kv_dtype == "bfloat16":
        assert np.array_equal(k_back, key[valid]) and np.array_equal(v_back, value[valid])
    else:
        k_q = quant.quantize_fp8(formats.bf16_to_f32(key[valid]), FP8_SCALES["k_scale"])
        assert np.array_equal(k_back, k_q)
        err = np.abs(ew.dequantize_kv(v_back, FP8_SCALES["v_scale"]) - f64(value[valid]))
        assert np.all(err <= 2.0**-4 * np.abs(f64(value[valid])) + 2.0**-10 * 0.03)


def test_paged_key_vectors_are_16_bytes():
    assert ew.cache_x("bfloat16") == 8 and ew.cache_x("float8_e4m3fn") == 16
    assert ew.cache_shapes("paged", 2, 16, 8, 128, "float8_e4m3fn")[0] == (2, 8, 8, 16, 16)
    bf16_shapes = ew.cache_shapes("paged", 2, 16, 8, 128, "bfloat16")
    assert bf16_shapes == ((2, 8, 16, 16, 8), (2, 8, 128, 16))
    with pytest.raises(ValueError, match="D % 16"):
        ew.cache_shapes("paged", 2, 16, 8, 40, "float8_e4m3fn")  # 40 % 8 == 0 but not % 16


def test_mutant_padding_slot_written_is_rejected(rng):
    """A kernel that forgets the -1 check writes the padding token at slot -1, i.e. (as a C
    pointer offset, or numpy's negative index) the last slot of the cache; the poisoned cache
    compared exactly catches it."""
    t, hk, d, blocks, bs = 6, 2, 16, 2, 8
    key, value = ew.heads(rng, t, hk, d), ew.heads(rng, t, hk, d)
    slots = ew.slot_mapping(rng, t, blocks * bs - 1)  # the last slot stays free
    for layout in ew.LAYOUTS:
        kc, vc = ew.poisoned_caches(layout, blocks, bs, hk, d, "bfloat16")
        want = ew.reshape_and_cache(key, value, kc, vc, slots, layout)
        last = np.full(t, blocks * bs - 1)
        mutant = [c.copy() for c in want]
        pad = slots == -1
        for cache, src, which in zip(mutant, (key, value), ("key", "value"), strict=True):
            cache[ew.cache_index(layout, cache.shape, last[pad], d, which)] = src[pad]
        pairs = zip(mutant, want, strict=True)
        assert not all(ew.matches(m, w, "bfloat16", ew.TOLERANCE_KV) for m, w in pairs)


def test_fp8_cache_multiplies_by_the_reciprocal_not_divides():
    """x * fp32(1/scale), as quant.quantize_fp8, not vLLM's x / scale. With scale 7 these x are
    7 m for m exactly halfway between two E4M3 codes: x / 7 is the tie itself (to the even code)
    and the rounding of fp32(1/7) pushes x * (1/7) off it (found by a search over odd scales)."""
    x = np.array([0.1708984375, 0.1982421875, 0.341796875])
    assert np.all(np.isin(x / 7 * 16 / 2.0 ** np.floor(np.log2(x / 7)) % 2, 1))  # ties in E4M3
    key = np.resize(formats.f64_to_bf16(x), (1, 1, 16))
    assert np.array_equal(f64(key[0, 0, :3]), x)
    scale = np.array([7.0], np.float32)
    kc, vc = ew.poisoned_caches("nhd", 1, 1, 1, 16, "float8_e4m3fn")
    got, _ = ew.reshape_and_cache(key, key, kc, vc, np.arange(1), "nhd", scale, scale)
    x32 = formats.bf16_to_f32(key)
    assert np.array_equal(got.reshape(key.shape), quant.quantize_fp8(x32, scale))
    divided = formats.f32_to_e4m3(x32 / scale[0])
    assert np.all(got.reshape(key.shape)[0, 0, :3] != divided[0, 0, :3])


# --- bad input ----------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors(rng):
    x = ew.gate_up(rng, 2, 64)
    pos, q, k, cache = rope_inputs(rng, t=2, d=64)
    w = q[0, 0]
    kc, vc = ew.poisoned_caches("nhd", 2, 4, 2, 64, "bfloat16")
    key = ew.heads(rng, 2, 2, 64)
    nhd = "nhd"
    fp8_caches = ew.poisoned_caches("nhd", 2, 4, 2, 64, "float8_e4m3fn")
    two = np.array([0, 1])
    bad = [
        (lambda: ew.silu_and_mul(x[:, :63]), "even"),
        (lambda: ew.silu_and_mul(formats.bf16_to_f32(x)), "uint16"),
        (lambda: ew.silu_and_mul(x[0]), "2 dims"),
        (lambda: ew.act_and_mul(x, "relu"), "act must be"),
        (lambda: ew.act_and_mul(x, limit=0.0), "limit"),
        (lambda: ew.silu_and_mul_fp8_per_group(ew.gate_up(rng, 2, 200)), "multiple of 128"),
        (lambda: ew.silu_and_mul_fp8_per_tensor(x, np.array([0.0], np.float32)), "positive"),
        (lambda: ew.silu_and_mul_fp8_per_tensor(x, 0.5), "FP32 scale"),
        (lambda: ew.rope(pos + 4096, q, k, cache), "outside the cache"),
        (lambda: ew.rope(pos.astype(np.float32), q, k, cache), "integers"),
        (lambda: ew.rope(pos[:1], q, k, cache), "positions"),
        (lambda: ew.rope(pos, q, k[..., :32], cache), "share T and D"),
        (lambda: ew.rope(pos, q[..., :32], k[..., :32], cache), "exceeds the head size"),
        (lambda: ew.rope(pos, q, k, cache.astype(np.float64)), "FP32"),
        (lambda: ew.rope(pos, q, k, cache[:, :63]), "rot_dim even"),
        (lambda: ew.cos_sin_cache(16, 7), "even"),
        (lambda: ew.qk_norm_rope(pos, q, k, w[:32], w, cache, 1e-6), r"norm weight"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc, np.array([0, 8]), "nhd"), "neither -1"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc, np.array([0, -2]), "nhd"), "neither -1"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc, np.array([3, 3]), "nhd"), "twice"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc, np.array([0, 1]), "hnd"), "must be"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc, np.array([0, 1]), "vllm"), "layout"),
        (lambda: ew.reshape_and_cache(key, key[:, :1], kc, vc, two, nhd), "same shape"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc.view(np.uint8), two, nhd), "both"),
        (lambda: ew.reshape_and_cache(key, key, kc, vc, two, nhd, **FP8_SCALES), "FP8 cache only"),
        (lambda: ew.reshape_and_cache(key, key, *fp8_caches, two, nhd), "k_scale"),
        (lambda: ew.slot_mapping(rng, 9, 8), "distinct slots"),
        (lambda: ew.silu_and_mul_fp8_bytes(1, 128, "per_row"), "kind"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=message):
            call()


# --- byte models, generators, the comparison ----------------------------------------------------


def test_byte_models_match_the_seed_and_the_issue():
    mib = 1 << 20
    assert ew.act_and_mul_bytes(8192, 14336) == 672 * mib  # seed: 6 B x 117 M = 672 MiB
    t, d = 8192, 14336
    for kind in ("per_token", "per_group", "per_tensor"):
        fused, chain = (ew.silu_and_mul_fp8_bytes(t, d, kind, f) for f in (True, False))
        assert 5 <= fused / (t * d) < 5.05 and 9 <= chain / (t * d) < 9.05  # + 4/128 B of scales
    # RoPE, Llama-3-8B at T = 8192: q and k read and written, 160 MiB, plus positions and rows.
    assert ew.rope_bytes(8192, 32, 8, 128) == 160 * mib + 8192 * 8 + 8192 * 128 * 4
    assert ew.rope_bytes(1, 32, 8, 64, cache_rows=1) == 4 * 40 * 64 + 8 + 256  # partial: 64 of D
    fused, chain = (ew.qk_norm_rope_bytes(8, 32, 8, 128, 128, fused=f) for f in (True, False))
    assert fused < chain and round(chain / fused, 1) == 2.0  # 4 B vs 8 B per element
    # reshape_and_cache, Llama-3-8B, one token: 4 KiB read, 4 KiB written (BF16), 2 KiB (FP8).
    assert ew.reshape_and_cache_bytes(1, 8, 128, "bfloat16") == 8 + 4096 + 4096
    assert ew.reshape_and_cache_bytes(1, 8, 128, "float8_e4m3fn") == 8 + 4096 + 2048 + 8
    assert ew.reshape_and_cache_bytes(4, 8, 128, "bfloat16", valid=3) == 32 + 3 * 8192


def test_qkv_rope_cache_is_rope_then_the_cache_write_of_the_slices(rng):
    t, hq, hk, d = 9, 6, 2, 16
    qkv = ew.heads(rng, t, hq + 2 * hk, d)
    pos, cache = ew.positions(rng, t, 32), ew.cos_sin_cache(32, 8)
    slots = ew.slot_mapping(rng, t, 24)
    for layout in ew.LAYOUTS:
        kc0, vc0 = ew.poisoned_caches(layout, 6, 4, hk, d, "bfloat16")
        kc, vc, q = ew.qkv_rope_cache(pos, qkv, cache, slots, kc0, vc0, layout, is_neox=False)
        q_rot, k_rot = ew.rope(pos, qkv[:, :hq], qkv[:, hq : hq + hk], cache, False)
        want_k, want_v = ew.reshape_and_cache(k_rot, qkv[:, hq + hk :], kc0, vc0, slots, layout)
        assert np.array_equal(q, q_rot) and np.array_equal(kc, want_k) and np.array_equal(vc, want_v)
        # The values are copied, the keys rotated: gathered back, only the values are qkv's.
        keys, values = ew.gather_cache(kc, vc, slots[slots >= 0], layout, d)
        assert np.array_equal(values, qkv[slots >= 0, hq + hk :])
        assert not np.array_equal(keys, qkv[slots >= 0, hq : hq + hk])
        assert np.all(kc0 == ew.POISON[np.dtype(np.uint16)]), "the given caches stay as they were"


def test_qkv_rope_cache_refuses_bad_heads_caches_and_positions(rng):
    qkv, cache = ew.heads(rng, 2, 6, 16), ew.cos_sin_cache(8, 16)
    pos, slots = np.array([1, 2]), np.array([0, 1])
    kc, vc = ew.poisoned_caches("nhd", 2, 4, 3, 16, "bfloat16")
    with pytest.raises(ValueError, match="Hq \\+ 2 Hk"):
        ew.qkv_rope_cache(pos, qkv, cache, slots, kc, vc, "nhd")  # 6 heads, Hk 3: no query head
    kc, vc = ew.poisoned_caches("nhd", 2, 4, 2, 16, "float8_e4m3fn")
    with pytest.raises(ValueError, match="BF16 caches"):
        ew.qkv_rope_cache(pos, qkv, cache, slots, kc, vc, "nhd")
    kc, vc = ew.poisoned_caches("hnd", 2, 4, 2, 16, "bfloat16")
    with pytest.raises(ValueError, match="outside the cache"):
        ew.qkv_rope_cache(np.array([1, 8]), qkv, cache, slots, kc, vc, "hnd")
    with pytest.raises(ValueError, match="layout"):
        ew.qkv_rope_cache(pos, qkv, cache, slots, kc, vc, "nchw")


def test_qkv_rope_cache_bytes_against_the_chain_it_replaces():
    # Llama-3-8B (Hq 32, Hk 8, D 128), one token: 4 B an element of qkv fused; the chain moves
    # 8 B an element of q and v and 12 of k: 2.17x.
    fused = ew.qkv_rope_cache_bytes(1, 32, 8, 128, 128)
    chain = ew.qkv_rope_cache_bytes(1, 32, 8, 128, 128, fused=False)
    assert fused == 4 * 48 * 128 + 16 + 512
    assert chain - 528 == 8 * 32 * 128 + 12 * 8 * 128 + 8 * 8 * 128
    assert round((chain - 528) / (fused - 528), 2) == 2.17
    assert ew.qkv_rope_cache_bytes(4, 32, 8, 128, 128, valid=3) == 4 * 4 * 32 * 128 + 4 * 3 * 16 * 128 + 64 + 2048


def test_generators(rng):
    slots = ew.slot_mapping(rng, 50, 64)
    assert slots.dtype == np.int64 and np.any(slots == -1) and np.any(slots >= 0)
    assert np.unique(slots[slots >= 0]).size == np.sum(slots >= 0) and slots.max() < 64
    assert np.all(ew.slot_mapping(rng, 1, 4, padding=0.0) >= 0)
    pos = ew.positions(rng, 100, 17)
    assert pos.dtype == np.int64 and pos.min() >= 0 and pos.max() < 17
    h = ew.heads(rng, 3, 2, 5)
    assert h.shape == (3, 2, 5) and h.dtype == np.uint16 and np.all(f64(h) != 0)
    for layout in ew.LAYOUTS:
        for kv_dtype in ew.KV_DTYPES:
            for c in ew.poisoned_caches(layout, 2, 16, 2, 32, kv_dtype):
                fmt = formats.BF16 if c.dtype == np.uint16 else formats.E4M3
                assert np.all(c == ew.POISON[c.dtype]) and np.all(np.isnan(formats.decode(c, fmt)))


def test_matches_follows_the_harness_rule():
    a = formats.f32_to_bf16(np.array([1.0, -2.0, 3.0], np.float32))
    nan = np.array([0x7FC0], np.uint16)
    assert ew.matches(a, a, "bfloat16", "exact")
    assert ew.matches(a + np.uint16(1), a, "bfloat16", "ulp:1")
    assert not ew.matches(a + np.uint16(2), a, "bfloat16", "ulp:1")
    tiny, minus_tiny = np.array([0x0001], np.uint16), np.array([0x8001], np.uint16)
    assert ew.matches(tiny, minus_tiny, "bfloat16", "ulp:2")  # across zero: +-0 count once
    assert not ew.matches(np.zeros(3, np.uint16), a, "bfloat16", "close:1:1e9")  # unwritten output
    assert ew.matches(np.array([0x7FC1], np.uint16), nan, "bfloat16", "ulp:0")  # NaN matches NaN
    assert not ew.matches(a[:1], nan, "bfloat16", "close:1:1e9")
    assert not ew.matches(a[:2], a, "bfloat16", "exact")  # shapes differ
    with pytest.raises(ValueError):
        ew.matches(a, a + np.uint16(1), "bfloat16", "rel:1")
