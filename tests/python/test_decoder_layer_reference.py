"""Chapter 11's reference layer (lkw.decoder_layer): the composition against an independent float64
layer, the rounding points (mutants fail a named step), GQA, the causal mask, decode = the last
row of prefill, steps() and the byte/FLOP models of the real Llama-3-8B layer."""

import importlib

import ml_dtypes
import numpy as np
import pytest
from lkw import decoder_layer as dl
from lkw import elementwise, formats, fp8_gemm, gemv, quant, rmsnorm

CFG = dl.TINY
T = 12
U = 2.0**-8  # one BF16 rounding: |error| <= half an ulp <= 2^-8 of the value
# Roundings on the longest path from the layer's inputs to each output: r1, z, xn (attn_norm),
# qkv, rope, attention, o_proj, r2 -- 8 to the residual -- then z2, xn2, gate_up, act, down: 13 to
# out, and the last add (hidden) 14. Each rounding moves the vector by at most U of its norm; if
# no later step amplifies a relative perturbation (unit-variance projections, norms that rescale,
# a softmax of O(1) scores), the row-wise relative error is at most (roundings) * U. Measured:
# about 0.009 for out and 0.005 for r2, well inside. Gross errors (a wrong residual, head or mask)
# are O(1); a skipped or extra rounding is O(U) and is caught by the step-by-step comparison below.
ROUNDINGS = {"residual": 8, "out": 13, "hidden": 14}


def dec(bits):
    return np.asarray(bits, np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# The independent float64 layer: no intermediate rounding, nothing taken from lkw


def w64(lin):
    if lin.fmt == "bf16":
        return dec(lin.weight)
    if lin.fmt == "fp8":  # E4M3 value times its 128 x 128 block's scale
        codes = np.asarray(lin.weight, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        n, k = codes.shape
        nn, kk = np.arange(n), np.arange(k)
        return codes * np.asarray(lin.scales, np.float64)[nn[:, None] // 128, kk[None, :] // 128]
    words = np.asarray(lin.weight).astype(np.int64)
    k = 8 * words.shape[1]
    kk = np.arange(k)
    q = (words[:, kk // 8] >> (4 * (kk % 8))) & 15  # (N,K), nibble k % 8 of word k // 8
    s = dec(lin.scales)  # (K/G,N)
    return s[kk // (k // s.shape[0]), :].T * (q - 8)


def f64_layer(cfg, w, x, res):
    """(out, r2) of the whole sequence (positions 0..T-1) in float64, Hugging Face style."""
    t, hd = x.shape[0], cfg.head_dim

    def norm(v, wt):
        return v / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + cfg.eps) * dec(wt)

    r1 = dec(x) + dec(res)
    qkv = norm(r1, w.norm1) @ w64(w.qkv).T
    q = qkv[:, : cfg.hq * hd].reshape(t, cfg.hq, hd)
    k = qkv[:, cfg.hq * hd : (cfg.hq + cfg.hkv) * hd].reshape(t, cfg.hkv, hd)
    v = qkv[:, (cfg.hq + cfg.hkv) * hd :].reshape(t, cfg.hkv, hd)
    angle = np.arange(t)[:, None] * cfg.theta ** (-np.arange(0, hd, 2) / hd)[None, :]
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]

    def rot(h):  # NEOX: rotate halves
        a, b = h[..., : hd // 2], h[..., hd // 2 :]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    q, k = rot(q), rot(k)
    k, v = np.repeat(k, cfg.group, axis=1), np.repeat(v, cfg.group, axis=1)  # repeat_interleave
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", p, v).reshape(t, -1)
    r2 = o @ w64(w.o).T + r1
    gu = norm(r2, w.norm2) @ w64(w.gate_up).T
    g, u = gu[:, : cfg.d_ff], gu[:, cfg.d_ff :]
    return (g / (1 + np.exp(-g)) * u) @ w64(w.down).T, r2


def row_error(got_bits, ref):
    """max over rows of ||got - ref|| / ||ref||."""
    return float(np.max(np.linalg.norm(dec(got_bits) - ref, axis=1) / np.linalg.norm(ref, axis=1)))


def run(rng, fmt="bf16", t=T, layout="paged", replace=None, x=None, res=None, w=None):
    w = dl.random_weights(rng, CFG, fmt) if w is None else w
    if x is None:
        x, res = dl.random_inputs(rng, CFG, t)
    cache = dl.new_cache(CFG, t, layout, 4, rng)
    result = dl.layer(CFG, w, x, res, np.arange(t), cache, dl.rope_cache(CFG, t), replace)
    return result, w, x, res


def check_e2e(result, w, x, res):
    """Named failures of the row-wise bound against the float64 layer."""
    out, r2 = f64_layer(CFG, w, x, res)
    got = {
        "residual": result.residual,
        "out": result.out,
        "hidden": dl.hidden(result.out, result.residual),
    }
    want = {"residual": r2, "out": out, "hidden": out + r2}
    return [n for n in got if not row_error(got[n], want[n]) <= ROUNDINGS[n] * U]


WEIGHT_ONLY = ("bf16", "w4a16")  # activations stay BF16: the rounding bound holds as it is


@pytest.mark.parametrize("fmt", WEIGHT_ONLY)
def test_layer_matches_float64_layer(rng, fmt):
    result, w, x, res = run(rng, fmt)
    assert check_e2e(result, w, x, res) == []
    assert np.all(np.isfinite(dec(result.out)))


# FP8 W8A8 also quantizes each GEMM's input to E4M3 (half an ulp: 2^-4 of the value, per 1 x 128
# group). On the path to r2: the QKV and O inputs (2); to out: also the gate-up and down inputs
# (4). The float64 layer keeps the dequantized weights exactly, so the rest is the BF16 bound.
Q8 = 2.0**-4
QUANTS = {"residual": 2, "out": 4, "hidden": 4}


def test_fp8_layer_within_quantization_of_float64_layer(rng):
    result, w, x, res = run(rng, "fp8")
    out, r2 = f64_layer(CFG, w, x, res)
    want = {"residual": r2, "out": out, "hidden": out + r2}
    got = {"residual": result.residual, "out": result.out,
           "hidden": dl.hidden(result.out, result.residual)}
    for n in got:
        err = row_error(got[n], want[n])
        assert err <= ROUNDINGS[n] * U + QUANTS[n] * Q8, n
    # and the quantization shows: FP8 is further from the float64 layer than BF16 weights alone
    assert row_error(result.out, out) > 2 * U


def test_fp8_steps_are_chapter_03_quant_and_chapter_08_gemm(rng):
    """Each FP8 projection is chapter 08's blockwise reference on chapter 03's 1 x 128 codes of
    the BF16 input, which for the down projection is what chapter 05's fused
    silu_and_mul_fp8_per_group writes (the runner's rounding points)."""
    w = dl.random_weights(rng, CFG, "fp8")
    x, _ = dl.random_inputs(rng, CFG, 5)
    xq, xs = quant.per_group_fp8(x)
    y = dl.project(x, w.qkv)
    assert np.array_equal(y, fp8_gemm.fp8_gemm_blockwise(xq, w.qkv.weight, xs, w.qkv.scales))
    assert np.array_equal(dl.w_exact(w.qkv), w64(w.qkv))
    gu = formats.f32_to_bf16(rng.standard_normal((5, 2 * CFG.d_ff)).astype(np.float32))
    fused = elementwise.silu_and_mul_fp8_per_group(gu)
    unfused = quant.per_group_fp8(elementwise.silu_and_mul(gu))
    assert all(np.array_equal(a, b) for a, b in zip(fused, unfused, strict=True))
    assert dl.weight_bytes(256, 1024, "fp8") == 256 * 1024 + 4 * 2 * 8


@pytest.mark.parametrize("fmt", dl.FORMATS)
def test_op_inputs_round_trip(rng, fmt):
    """The runner's input list (lkw.decoder_layer.op_inputs, the order of layer.h) gives back
    the weights, and op_reference on it is the layer."""
    cfg = dl.GOLDEN
    w = dl.random_weights(rng, cfg, fmt)
    x, res = dl.random_inputs(rng, cfg, 3)
    cache = dl.new_cache(cfg, 64, "paged", 16, rng)
    cos_sin, pos = dl.rope_cache(cfg, 128), np.arange(40, 43)
    inputs = dl.op_inputs(w, x, res, pos, cache, cos_sin)
    assert len(inputs) == 8 + 4 * {"bf16": 1, "w4a16": 4, "fp8": 2}[fmt]
    back = dl.op_weights(fmt, inputs[6:])
    for a, b in zip(back, w, strict=True):
        if isinstance(a, dl.Linear):
            assert a.fmt == b.fmt and np.array_equal(a.weight, b.weight)
            assert (a.scales is None) == (b.scales is None)
            assert a.scales is None or np.array_equal(a.scales, b.scales)
        else:
            assert np.array_equal(a, b)
    want = dl.layer(cfg, w, x, res, pos, cache, cos_sin)
    key, value, out, r2 = dl.op_reference(fmt, *inputs, cache.key, cache.value, eps=cfg.eps)
    assert np.array_equal(out, want.out) and np.array_equal(r2, want.residual)
    assert np.array_equal(key, want.cache.key, equal_nan=True)
    bad = list(inputs)
    bad[3] = bad[3] + 1  # slot_mapping that disagrees with the block table
    with pytest.raises(ValueError, match="slot_mapping"):
        dl.op_reference(fmt, *bad, cache.key, cache.value, eps=cfg.eps)
    assert dl.op_name(fmt) == f"11_decoder_layer/decoder_layer_{fmt}/v0_runner"


# ---------------------------------------------------------------------------------------------
# Rounding points and residual order: each mutant fails its named step


def _norm_no_z_rounding(x, res, w):  # one rounding of r * rstd * w instead of two
    r = rmsnorm.add_residual(x, res)
    r32 = formats.bf16_to_f32(r)
    return formats.f32_to_bf16(r32 * rmsnorm.rstd(r32, CFG.eps) * formats.bf16_to_f32(w)), r


def _norm_before_add(x, res, w):  # residual order: normalizes x, not x + residual
    return rmsnorm.rmsnorm(x, w, CFG.eps), rmsnorm.add_residual(x, res)


def _norm_of_unrounded_sum(x, res, w):  # variance and normalization of the FP32 sum
    s32 = formats.bf16_to_f32(x) + formats.bf16_to_f32(res)
    return rmsnorm.normalize(s32, rmsnorm.rstd(s32, CFG.eps), w), rmsnorm.add_residual(x, res)


def _silu_rounded_first(gu):  # an extra rounding: bf16(bf16(silu(g)) * u)
    g, u = dec(gu[:, : CFG.d_ff]), dec(gu[:, CFG.d_ff :])
    return formats.f64_to_bf16(dec(formats.f64_to_bf16(g / (1 + np.exp(-g)))) * u)


def _fused_qkv_rope():  # the rotation reads the UNROUNDED projection
    stash = {}

    def qkv(x, lin):
        stash["y"] = dec(x) @ dl.w_exact(lin).T
        return formats.f64_to_bf16(stash["y"])

    def rope(pos, q, k, cos_sin):
        hd, t = CFG.head_dim, q.shape[0]
        cos, sin, _ = elementwise._cache_rows(pos, t, cos_sin)
        y = stash["y"]

        def rot(h):
            a, b = h[..., : hd // 2], h[..., hd // 2 :]
            return formats.f64_to_bf16(np.concatenate([a * cos - b * sin, b * cos + a * sin], -1))

        return (
            rot(y[:, : CFG.hq * hd].reshape(t, CFG.hq, hd)),
            rot(y[:, CFG.hq * hd : (CFG.hq + CFG.hkv) * hd].reshape(t, CFG.hkv, hd)),
        )

    return {"qkv_proj": qkv, "rope": rope}


def _gqa_modulo(q, cache, pos):  # query head h reads KV head h % Hkv (the wrong grouping)
    hq, hkv = CFG.hq, CFG.hkv
    perm = (np.arange(hq) % hkv) * CFG.group + np.arange(hq) // hkv  # h -> a head of group h % Hkv
    o = dl.attention(np.asarray(q)[:, perm], cache, pos, hkv).reshape(q.shape[0], hq, -1)
    return o[:, np.argsort(perm)].reshape(q.shape[0], -1)


MUTANTS = {  # name -> (replacements, the step that must differ first, gross: fails float64 too)
    "attn_norm_no_z_rounding": ({"attn_norm": _norm_no_z_rounding}, "attn_norm", False),
    "attn_norm_before_add": ({"attn_norm": _norm_before_add}, "attn_norm", True),
    "ffn_norm_unrounded_sum": ({"ffn_norm": _norm_of_unrounded_sum}, "ffn_norm", False),
    "act_silu_rounded_first": ({"act": _silu_rounded_first}, "act", False),
    "qkv_unrounded_into_rope": (None, "rope", False),
    "attention_gqa_modulo": ({"attention": _gqa_modulo}, "attention", True),
}


@pytest.mark.parametrize("mutant", [*MUTANTS, "ffn_norm_stale_residual"])
def test_mutants_fail_a_named_step(rng, mutant):
    ref, w, x, res = run(rng)
    if mutant == "ffn_norm_stale_residual":  # residual order: adds the LAYER's residual, not r1
        replace = {"ffn_norm": lambda a, r1, wt: rmsnorm.fused_add_rmsnorm(a, res, wt, CFG.eps)}
        step, gross = "ffn_norm", True
    else:
        replace, step, gross = MUTANTS[mutant]
        replace = _fused_qkv_rope() if replace is None else replace
    got = dl.layer(
        CFG,
        w,
        x,
        res,
        np.arange(T),
        dl.new_cache(CFG, T, "paged", 4, rng),
        dl.rope_cache(CFG, T),
        replace,
    )
    assert dl.first_difference(got.trace, ref.trace) == step
    assert (check_e2e(got, w, x, res) != []) == gross  # a rounding slip hides inside the bound


def test_reference_steps_are_the_chapters_references(rng):
    """The trace replays step by step through the owners' references, bit for bit."""
    ref, w, x, res = run(rng, "w4a16", t=8)
    tr = ref.trace
    xn, r1 = tr["attn_norm"]
    assert np.array_equal(r1, rmsnorm.add_residual(x, res))
    # chapter 06's GEMV (scales [N, K/G]) gives chapter 07's bits at T <= 16
    assert np.array_equal(
        tr["qkv_proj"], gemv.int4_gemv(xn, w.qkv.weight, np.ascontiguousarray(w.qkv.scales.T))
    )
    assert np.array_equal(tr["act"], elementwise.silu_and_mul(tr["gate_up_proj"]))
    assert np.array_equal(tr["ffn_norm"][1], rmsnorm.add_residual(tr["o_proj"], r1))
    assert dl.first_difference(tr, tr) is None


# ---------------------------------------------------------------------------------------------
# Attention: GQA head mapping, causal mask, decode = the last row of prefill


def test_gqa_head_mapping(rng):
    t, hd = 5, CFG.head_dim
    cache = dl.new_cache(CFG, t, "paged", 4, rng)
    k = elementwise.heads(rng, t, CFG.hkv, hd)
    values = np.arange(1, CFG.hkv + 1, dtype=np.float32)[None, :, None]  # KV head g holds g + 1
    v = formats.f32_to_bf16(np.broadcast_to(values, (t, CFG.hkv, hd)))
    cache = dl.cache_write(k, v, cache, np.arange(t))
    o = dec(dl.attention(elementwise.heads(rng, t, CFG.hq, hd), cache, np.arange(t), CFG.hkv))
    want = np.arange(CFG.hq) // CFG.group + 1.0  # query head h -> KV head h // (Hq / Hkv)
    want = np.broadcast_to(want[None, :, None], (t, CFG.hq, hd))
    assert np.array_equal(o.reshape(t, CFG.hq, hd), want)


def test_causal_mask(rng):
    ref, w, x, res = run(rng)
    x2 = x.copy()
    x2[-1] = formats.f32_to_bf16(-formats.bf16_to_f32(x2[-1]))  # change only the last token
    got, *_ = run(rng, x=x2, res=res, w=w)
    for name in ("out", "residual"):
        a, b = getattr(got, name), getattr(ref, name)
        assert np.array_equal(a[:-1], b[:-1]), f"{name}: an earlier token saw a later one"
        assert not np.array_equal(a[-1], b[-1])


@pytest.mark.parametrize("fmt", dl.FORMATS)
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_decode_equals_last_row_of_prefill(rng, fmt, layout):
    """Prefill T - 1 tokens, then decode the last one (T = 1 over the cache): the same bits as
    the last row of a T-token prefill. The cache is poisoned (NaN), so a read of an unwritten slot
    would show; the paged cache's block table is shuffled."""
    w = dl.random_weights(rng, CFG, fmt)
    x, res = dl.random_inputs(rng, CFG, T)
    cos_sin = dl.rope_cache(CFG, T)
    full = dl.layer(CFG, w, x, res, np.arange(T), dl.new_cache(CFG, T, layout, 4, rng), cos_sin)
    cache = dl.new_cache(CFG, T, layout, 4, rng)
    head = dl.layer(CFG, w, x[:-1], res[:-1], np.arange(T - 1), cache, cos_sin)
    step = dl.layer(CFG, w, x[-1:], res[-1:], np.array([T - 1]), head.cache, cos_sin)
    assert np.array_equal(head.out, full.out[:-1])
    assert np.array_equal(step.out, full.out[-1:])
    assert np.array_equal(step.residual, full.residual[-1:])
    assert np.all(np.isfinite(dec(step.out)))


# ---------------------------------------------------------------------------------------------
# steps() and the byte/FLOP models


def test_steps_name_the_owners():
    for fmt, t, gemm in [
        ("bf16", 1, "00_roofline"),
        ("w4a16", 16, "06_int4_gemv"),
        ("w4a16", 17, "07_w4a16_gemm"),
    ]:
        s = dl.steps(fmt, t)
        assert tuple(x.name for x in s) == dl.STEP_NAMES
        owner = {x.name: x.chapter for x in s}
        assert owner["attention"] == ""  # not a workbook kernel
        assert {owner[n] for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")} == {gemm}
        assert owner["attn_norm"] == owner["ffn_norm"] == "04_rmsnorm"
        assert owner["rope"] == owner["act"] == owner["cache_write"] == "05_elementwise"
        for x in s:  # every named reference exists
            module, fn = x.kernel.split(".")
            assert callable(getattr(importlib.import_module(f"lkw.{module}"), fn))


def test_tiny_config_has_llama3_ratios():
    for c in (dl.TINY, dl.LLAMA3_8B):
        assert c.d == c.hq * c.head_dim and c.hq == 4 * c.hkv and 2 * c.d_ff == 7 * c.d


PARAMS = 6144 * 4096 + 4096 * 4096 + 28672 * 4096 + 4096 * 14336  # QKV, O, gate-up, down
NORMS = 2 * 4096 * 2  # two BF16 norm weights


def test_byte_model_matches_hand_arithmetic():
    assert PARAMS == 218_103_808
    bf16, w4 = dl.decode_model("bf16"), dl.decode_model("w4a16")
    assert sum(c.weight_bytes for c in bf16) == 2 * PARAMS + NORMS == 436_224_000  # seed: ~436 MB
    assert sum(c.weight_bytes for c in w4) == PARAMS // 2 + PARAMS // 128 * 2 + NORMS  # ~113 MB
    fp8 = dl.decode_model("fp8")  # 1 B a weight + an FP32 scale per 128 x 128 block
    assert sum(c.weight_bytes for c in fp8) == PARAMS + PARAMS // (128 * 128) * 4 + NORMS
    attn = {c.name: c for c in bf16}["attention"]
    assert attn.kv_bytes == 2048 * 8 * 128 * 2 * 2 == 8 << 20  # seed: 128 KiB * s / 32 per layer
    assert attn.flops == 4 * 128 * 32 * 2048
    gemm_flops = sum(c.flops for c in bf16 if c.name.endswith("_proj"))
    assert gemm_flops == 2 * PARAMS
    assert dl.attention_pairs(2048, 2048) == 2048 * 2049 // 2
    pre = {c.name: c for c in dl.prefill_model("bf16")}
    assert pre["attention"].flops == 4 * 128 * 32 * 2048 * 2049 // 2
    assert pre["qkv_proj"].bytes == 2 * 6144 * 4096 + 2048 * (4096 + 6144) * 2
    assert pre["act"].bytes == 6 * 2048 * 14336
    b, f = dl.layer_bound(dl.LLAMA3_8B, 1, 2048)
    assert b == 2 * PARAMS + NORMS + (2048 + 1) * 4096 + 4 * 4096 * 2 + 8  # + KV, x/res/out/r2, pos
    assert f == sum(c.flops for c in bf16)


@pytest.mark.parametrize("fmt", dl.FORMATS)
def test_weights_dominate_decode_and_prefill_is_compute_bound(fmt):
    decode = dl.decode_model(fmt)
    total = sum(c.bytes for c in decode)
    weights = sum(c.weight_bytes for c in decode)
    assert weights / total > (0.97 if fmt == "bf16" else 0.9)
    assert max(decode, key=lambda c: c.bytes).name == "gate_up_proj"
    assert sum(c.flops for c in decode) / total < 5  # decode: a few FLOPs per byte
    prefill = dl.prefill_model(fmt)
    assert sum(c.flops for c in prefill) / sum(c.bytes for c in prefill) > 300  # H200 ridge ~200
    for c in decode + prefill:
        assert c.bytes > 0 and c.bytes >= c.weight_bytes + c.kv_bytes
