"""lkw.layer_torch on the CPU: its float64 reference steps against lkw.decoder_layer's numpy layer,
step by step, at the reduced shape (decoder_layer.TINY), for every format; the pieces the GPU
layer relies on (the one float64 -> BF16 rounding, chapter 03's quantizers, the paged cache's
write and gather, the batch metadata, GQA attention over several sequences); torch's own layer
close to the reference; the bench's byte models (no torch needed). The workbook's kernels and
the timing are GPU work: tests/python/test_layer_gpu.py."""

import json

import numpy as np
import pytest
from lkw import decoder_layer as dl
from lkw import elementwise, formats, fp8_gemm, layer_bench, quant

CFG = dl.TINY


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="CPU torch is needed for lkw.layer_torch (pip install torch)")


@pytest.fixture(scope="module")
def lt(torch):
    from lkw import layer_torch

    return layer_torch


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 2**32
    print("seed", seed)
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# The numpy side of FP8, composed from the chapters' numpy references at the quantization points
# of lkw.decoder_layer's FP8 format (the norms and the attention write BF16, a projection
# quantizes a BF16 input per 1 x 128 group, act quantizes in its own kernel), so that its trace
# holds act's FP8 output as layer_torch's does. decoder_layer's own FP8 layer, where it has one,
# must give the same out and r2 (test below).


def numpy_fp8_steps(cfg: dl.Config) -> dict:
    def gemm(a, lin):
        q, s = a if isinstance(a, tuple) else quant.per_group_fp8(a)
        return fp8_gemm.fp8_gemm_blockwise(q, lin.weight, s, lin.scales)

    return {"qkv_proj": gemm, "o_proj": gemm, "gate_up_proj": gemm, "down_proj": gemm,
            "act": elementwise.silu_and_mul_fp8_per_group}


def numpy_layer(fmt, w, x, res, positions, cache, cos_sin):
    replace = numpy_fp8_steps(CFG) if fmt == "fp8" else None
    return dl.layer(CFG, w, x, res, positions, cache, cos_sin, replace=replace)


def as_numpy(lt, value):
    """A torch step output as numpy bits, in the numpy trace's form."""
    if isinstance(value, lt.Quantized):
        return (value.q.view(__import__("torch").uint8).numpy(), value.scales.numpy())
    if isinstance(value, tuple):
        out = []
        for v in value:
            got = as_numpy(lt, v)
            out.extend(got if isinstance(v, lt.Quantized) else [got])
        return tuple(out)
    return lt.to_bits(value)


@pytest.mark.parametrize("fmt", ["bf16", "w4a16", "fp8"])
def test_reference_steps_match_the_numpy_layer_step_by_step(torch, lt, fmt, rng):
    """A prefill of 5 tokens, then a decode step, both layers on the same weights, inputs and
    (shuffled, poisoned) paged cache: every step's outputs bit for bit, the cache too."""
    seed = int(rng.integers(2**31))
    w_np = lt.numpy_weights(CFG, fmt, seed)
    w = lt.to_device(w_np, CFG, "cpu")
    cache_np = dl.new_cache(CFG, 32, "paged", lt.BLOCK_SIZE, rng)
    cache = lt.KVCache(lt.from_bits(cache_np.key), lt.from_bits(cache_np.value))
    cos_sin_np = dl.rope_cache(CFG, 64)
    cos_sin = torch.from_numpy(cos_sin_np)
    steps = lt.reference_steps(CFG, fmt)
    for positions in (np.arange(5), np.array([5])):
        x_np, res_np = dl.random_inputs(rng, CFG, positions.size)
        want = numpy_layer(fmt, w_np, x_np, res_np, positions, cache_np, cos_sin_np)
        if fmt == "fp8" and "fp8" in dl.FORMATS:  # decoder_layer's own FP8 layer: the same numbers
            own = dl.layer(CFG, w_np, x_np, res_np, positions, cache_np, cos_sin_np)
            assert np.array_equal(own.out, want.out) and np.array_equal(own.residual, want.residual)
        cache_np = want.cache
        meta = lt.make_meta(positions, cache_np.block_table[None], positions.size, "cpu")
        trace = {}
        out, r2 = lt.forward(steps, CFG, w, lt.from_bits(x_np), lt.from_bits(res_np), meta, cache,
                             cos_sin, trace=trace)
        for name in dl.STEP_NAMES:
            if name == "cache_write":
                after = trace[name][1]
                got = elementwise.gather_cache(lt.to_bits(after.key), lt.to_bits(after.value),
                                               cache_np.slots(positions), "paged", CFG.head_dim)
            else:
                got = as_numpy(lt, trace[name][1])
            ref = want.trace[name]
            got, ref = (got, ref) if isinstance(ref, tuple) else ((got,), (ref,))
            for i, (g, r) in enumerate(zip(got, ref, strict=True)):
                assert np.array_equal(np.asarray(g), np.asarray(r)), (
                    f"{fmt}, T = {positions.size}: step {name} output {i} differs from the numpy layer")
        assert np.array_equal(lt.to_bits(out), want.out) and np.array_equal(lt.to_bits(r2), want.residual)
        assert np.array_equal(lt.to_bits(cache.key), cache_np.key), "the whole key cache, untouched slots too"
        assert np.array_equal(lt.to_bits(cache.value), cache_np.value)


def test_a_wrong_step_is_named(torch, lt, rng):
    """The per-step comparison catches a mutant: RoPE rotating by the wrong position."""
    w = lt.layer_weights(CFG, "bf16", "cpu", seed=1)
    meta = lt.prefill_meta(4, "cpu")
    cos_sin = lt.rope_cache(CFG, 16, "cpu")
    x, res = (lt.from_bits(a) for a in dl.random_inputs(rng, CFG, 4))
    steps = lt.reference_steps(CFG, "bf16")
    mutant = dict(steps, rope=lambda pos, q, k, cs: lt.ref_rope(pos + 1, q, k, cs))
    good, bad = {}, {}
    lt.forward(steps, CFG, w, x, res, meta, lt.new_cache(CFG, 1, "cpu"), cos_sin, trace=good)
    lt.forward(mutant, CFG, w, x, res, meta, lt.new_cache(CFG, 1, "cpu"), cos_sin, trace=bad)
    first = next(n for n in dl.STEP_NAMES if not all(
        torch.equal(a, b) for a, b in zip(*(as_tuple(t[n][1]) for t in (good, bad)), strict=True)))
    assert first == "rope"


def as_tuple(v):
    if hasattr(v, "key"):
        return (v.key, v.value)
    return tuple(v) if isinstance(v, tuple) else (v,)


# ---------------------------------------------------------------------------------------------
# The pieces


def test_f64_to_bf16_rounds_once(torch, lt, rng):
    x = rng.standard_normal(20000) * np.exp2(rng.integers(-40, 40, 20000))
    x = np.concatenate([x, [1 + 2.0**-8 + 2.0**-30, -(1 + 2.0**-8 + 2.0**-30), 0.0, -0.0, 1e300, np.inf,
                            -np.inf, 3.3895313892515355e38]])
    got = lt.to_bits(lt.f64_to_bf16(torch.from_numpy(x)))
    assert np.array_equal(got, formats.f64_to_bf16(x))
    assert lt.to_bits(lt.f64_to_bf16(torch.tensor([np.nan], dtype=torch.float64)))[0] & 0x7FFF > 0x7F80


def test_quantizers_match_chapter_03_bit_for_bit(torch, lt, rng):
    from lkw import golden

    x = golden.with_outliers(rng, golden.activations(rng, 7, 512, 4.0))
    q, s = lt.quant_per_token(lt.from_bits(x))
    want_q, want_s = quant.per_token_fp8(x)
    assert np.array_equal(q.view(torch.uint8).numpy(), want_q) and np.array_equal(s.numpy(), want_s)
    q, s = lt.quant_per_group(lt.from_bits(x))
    want_q, want_s = quant.per_group_fp8(x)
    assert np.array_equal(q.view(torch.uint8).numpy(), want_q) and np.array_equal(s.numpy(), want_s)


def test_e4m3_saturates_as_the_kernels_do(torch, lt):
    got = lt.e4m3(torch.tensor([470.0, -1000.0, 448.0, 0.5], dtype=torch.float32)).float().tolist()
    assert got == [448.0, -448.0, 448.0, 0.5]


def test_cache_write_and_gather_agree_with_chapter_05(torch, lt, rng):
    tables = lt.block_tables(2, 40, seed=int(rng.integers(1000)))
    cache = lt.new_cache(CFG, tables.size, "cpu")
    positions = np.array([3, 39])
    meta = lt.make_meta(positions, tables, 1, "cpu")
    k = elementwise.heads(rng, 2, CFG.hkv, CFG.head_dim)
    v = elementwise.heads(rng, 2, CFG.hkv, CFG.head_dim)
    lt.torch_cache_write(lt.from_bits(k), lt.from_bits(v), cache, meta.slots)
    slots = meta.slots.numpy()
    kc0, vc0 = (np.zeros(s.shape, np.uint16) for s in (cache.key, cache.value))
    want_k, want_v = elementwise.reshape_and_cache(k, v, kc0, vc0, slots, "paged")
    assert np.array_equal(lt.to_bits(cache.key), want_k) and np.array_equal(lt.to_bits(cache.value), want_v)
    gk, gv = lt.gather_kv(cache, meta)  # (B,L,Hkv,D): sequence b's position p at row p
    for b, p in enumerate(positions):
        assert np.array_equal(lt.to_bits(gk[b, p]), k[b]) and np.array_equal(lt.to_bits(gv[b, p]), v[b])


def test_advance_moves_positions_and_slots_in_place(torch, lt):
    tables = lt.block_tables(3, 64, seed=5)
    meta = lt.decode_meta(3, 15, "cpu", capacity=64, seed=5)
    slots_ptr = meta.slots.data_ptr()
    lt.advance(meta)
    lt.advance(meta)
    want = lt.make_meta(np.full(3, 16), tables, 1, "cpu")
    assert torch.equal(meta.positions, want.positions) and torch.equal(meta.slots, want.slots)
    assert meta.slots.data_ptr() == slots_ptr, "a graph reads the same tensor: no reallocation"


def test_batched_attention_is_each_sequence_alone(torch, lt, rng):
    """Three sequences of one new token each, different lengths: the reference attention of the
    batch equals decoder_layer.attention of each sequence on its own cache."""
    lengths = [5, 17, 33]
    tables = lt.block_tables(3, 48, seed=3)
    cache = lt.new_cache(CFG, tables.size, "cpu", torch.Generator().manual_seed(int(rng.integers(99))))
    meta = lt.make_meta(np.array(lengths) - 1, tables, 1, "cpu")
    q = elementwise.heads(rng, 3, CFG.hq, CFG.head_dim)
    got = lt.to_bits(lt.ref_attention(CFG)(lt.from_bits(q), cache, meta))
    for b, n in enumerate(lengths):
        one = dl.KVCache("paged", lt.to_bits(cache.key), lt.to_bits(cache.value), tables[b], lt.BLOCK_SIZE)
        want = dl.attention(q[b : b + 1], one, [n - 1], CFG.hkv)
        assert np.array_equal(got[b : b + 1], want), f"sequence {b}"
    sdpa = lt.sdpa_attention(CFG)(lt.from_bits(q), cache, meta).double()
    ref = lt.ref_attention(CFG)(lt.from_bits(q), cache, meta).double()
    assert float((sdpa - ref).norm() / ref.norm()) < 1e-2, "torch SDPA close to the float64 attention"


def test_a_prompt_is_every_sequence_from_position_0(torch, lt):
    tables = lt.block_tables(2, 32, seed=1)
    assert lt.prefill_meta(5, "cpu").prompt
    assert lt.make_meta([0, 1, 2, 0, 1, 2], tables, 3, "cpu").prompt
    assert not lt.make_meta([0, 1, 2, 1, 2, 3], tables, 3, "cpu").prompt, "a chunk past a context"
    assert not lt.make_meta([0, 2, 0, 1], tables, 2, "cpu").prompt
    assert not lt.make_meta([0, 0], tables, 1, "cpu").prompt, "one token: the decode kernel's"
    meta = lt.prefill_meta(4, "cpu", capacity=32)
    lt.advance(meta)
    assert not meta.prompt, "advanced: no longer its first tokens"


@pytest.mark.parametrize("lengths", [(21,), (16, 16), (3, 3, 3)])
def test_prompt_attention_is_the_causal_reference(torch, lt, rng, lengths):
    """Every sequence's first tokens (Meta.prompt): torch's causal SDPA over the prompt's own keys
    equals the float64 attention up to BF16 roundings; the cache past the prompt (NaN here) is
    never read."""
    ql, b = lengths[0], len(lengths)
    tables = lt.block_tables(b, 40, seed=int(rng.integers(99)))  # capacity past the prompt
    cache = lt.new_cache(CFG, tables.size, "cpu", torch.Generator().manual_seed(int(rng.integers(99))))
    meta = lt.make_meta(np.tile(np.arange(ql), b), tables, ql, "cpu")
    assert meta.prompt
    ref = lt.ref_attention(CFG)(q := lt.from_bits(elementwise.heads(rng, b * ql, CFG.hq, CFG.head_dim)),
                                cache, meta).double()
    # NaN in every slot past the prompt: the prompt's attention never reads them.
    k, v = lt.gather_kv(cache, meta)  # (B,L,Hkv,D) of the slots, then written back over NaN
    cache.key.fill_(float("nan"))
    cache.value.fill_(float("nan"))
    lt.torch_cache_write(k[:, :ql].reshape(b * ql, CFG.hkv, -1), v[:, :ql].reshape(b * ql, CFG.hkv, -1),
                         cache, meta.slots)
    got = lt.prompt_attention(CFG)(q, cache, meta).double()
    assert torch.isfinite(got).all()
    assert float((got - ref).norm() / ref.norm()) < 1e-2
    assert torch.equal(lt.sdpa_attention(CFG)(q, cache, meta), lt.prompt_attention(CFG)(q, cache, meta))


@pytest.mark.parametrize("fmt", ["bf16", "w4a16", "fp8"])
def test_torch_layer_is_close_to_the_reference(torch, lt, fmt, rng):
    """torch_steps (BF16 ops, torch's FP8 / INT4 paths or their fallbacks) against the float64
    reference: the same numbers up to BF16 roundings, within the bench's layer tolerance."""
    w = lt.layer_weights(CFG, fmt, "cpu", seed=int(rng.integers(1000)))
    meta = lt.decode_meta(4, 40, "cpu")
    cos_sin = lt.rope_cache(CFG, 64, "cpu")
    cache = lt.new_cache(CFG, meta.block_tables.numel(), "cpu", torch.Generator().manual_seed(1))
    x, res = (lt.from_bits(a) for a in dl.random_inputs(rng, CFG, 4))
    ref = lt.forward(lt.reference_steps(CFG, fmt), CFG, w, x, res, meta, cache.clone(), cos_sin)
    got = lt.forward(lt.torch_steps(CFG, fmt), CFG, w, x, res, meta, cache.clone(), cos_sin)
    for g, r in zip(got, ref, strict=True):
        err = float((g.double() - r.double()).norm() / r.double().norm())
        assert err < layer_bench.LAYER_TOLERANCE[fmt], f"{fmt}: {err:.3g}"


def test_workbook_steps_need_their_versions(torch, lt):
    """Built against a registry without a version, a workbook step says which one it needs."""
    with pytest.raises(LookupError, match="rope"):
        lt.workbook_steps(CFG, "bf16", 1, names=set(lt.WORKBOOK["norm"]))
    names = {n for role in lt.WORKBOOK.values() for n in role[:1]}
    owner = lt.workbook_owner("w4a16", 1, names)
    assert owner["qkv_proj"].startswith("06_int4_gemv/")
    assert owner["attention"].startswith("11_decoder_layer/paged_attention/") and "not a lesson" in owner["attention"]
    without = names - set(lt.WORKBOOK["attention"])
    assert lt.workbook_owner("w4a16", 1, without)["attention"].startswith("(not registered)")
    with pytest.raises(LookupError, match="attention"):
        lt.workbook_steps(CFG, "bf16", 1, names=without)
    assert lt.workbook_owner("w4a16", 32, names)["down_proj"].startswith("07_w4a16_gemm/")
    # W4A16: the GEMV up to 16 tokens, chapter 07's v8 up to 64, its v9 above (as layer.h's runner)
    picks = {t: lt.w4a16_kernel(t, names) for t in (16, 17, 64, 65)}
    assert picks[16].startswith("06_int4_gemv/")
    assert picks[17] == picks[64] == "07_w4a16_gemm/w4a16r_gemm/v8_group_scales"
    assert picks[65] == "07_w4a16_gemm/w4a16r_gemm/v9_warp_specialized"
    assert lt.workbook_owner("fp8", 1, names)["o_proj"].startswith("03_dynamic_quant/")
    # a prompt's attention is torch's, in every layer: the waterfall does not swap it
    prompt = lt.workbook_owner("w4a16", 2048, names, prompt=True)
    assert prompt["attention"] == lt.PROMPT_ATTENTION and prompt["down_proj"].startswith("07_w4a16_gemm/")
    assert "attention" in layer_bench.swappable("w4a16", owner)
    assert "attention" not in layer_bench.swappable("w4a16", prompt)


# ---------------------------------------------------------------------------------------------
# The bench's models (no torch)


def test_models_agree_with_decoder_layer_where_they_overlap():
    cfg = dl.LLAMA3_8B
    for fmt in ("bf16", "w4a16"):
        assert layer_bench.models(cfg, fmt, "decode", 1) == dl.decode_model(fmt)
        assert layer_bench.layer_bound(cfg, fmt, "decode", 1) == dl.layer_bound(cfg, 1, 2048, fmt)
        assert layer_bench.models(cfg, fmt, "prefill", 2048) == dl.prefill_model(fmt)


def test_batched_decode_reads_every_sequences_cache():
    cfg = dl.LLAMA3_8B
    one = {c.name: c for c in layer_bench.models(cfg, "w4a16", "decode", 1)}
    many = {c.name: c for c in layer_bench.models(cfg, "w4a16", "decode", 32)}
    assert many["attention"].kv_bytes == 32 * one["attention"].kv_bytes
    b1, _ = layer_bench.layer_bound(cfg, "w4a16", "decode", 1)
    b32, _ = layer_bench.layer_bound(cfg, "w4a16", "decode", 32)
    kv = cfg.hkv * cfg.head_dim * 4
    assert b32 - b1 == 31 * 2048 * kv + 31 * kv + 31 * (4 * cfg.d * 2 + 8)


def test_fp8_model_is_one_byte_per_weight():
    cfg = dl.LLAMA3_8B
    costs = {c.name: c for c in layer_bench.models(cfg, "fp8", "decode", 1)}
    n, k = cfg.qkv_n, cfg.d
    assert costs["qkv_proj"].weight_bytes == n * k + 4 * (n // 128) * (k // 128)
    assert costs["qkv_proj"].bytes == n * k + 4 * (n // 128) * (k // 128) + k + 4 * (k // 128) + 2 * n
    w = sum(c.weight_bytes for c in costs.values())
    w_bf16 = sum(c.weight_bytes for c in layer_bench.models(cfg, "bf16", "decode", 1))
    assert 0.5 < w / w_bf16 < 0.51, "FP8 weights are half of BF16's, plus 1/4096 of scales"
    assert layer_bench.models(cfg, "fp8", "decode", 1) == dl.decode_model("fp8")


def test_a_step_s_row_rotates_past_the_l2():
    """The per-kernel rows: a step whose bytes fit the L2 twice over gets copies enough to exceed
    it (its weights come from memory, as in the layer); a big step keeps the layer's sets; a tiny
    one stops at MAX_STEP_COPIES."""
    l2 = 50 << 20
    qkv = 12_996_608  # W4A16 qkv_proj at T = 1
    n = layer_bench.step_copies(qkv, 2, l2)
    assert n * qkv > 2 * l2 and (n - 2) * qkv < 2 * l2
    assert layer_bench.step_copies(3 * l2, 2, l2) == 2
    assert layer_bench.step_copies(3 * l2, 5, l2) == 5
    assert layer_bench.step_copies(40_960, 2, l2) == layer_bench.MAX_STEP_COPIES
    assert layer_bench.step_copies(0, 3, l2) == 3


def test_a_step_s_copies_are_distinct_memory(torch, lt):
    """step_args: the sets' own arguments first, then deep copies: every tensor in new memory,
    equal in value, a view still a view of its copy's storage; cache_write gets its set's cache."""
    from types import SimpleNamespace

    base = torch.arange(12.0).view(3, 4)
    view = base[:, 1:]
    sets = [SimpleNamespace(cache="cache0"), SimpleNamespace(cache="cache1")]
    traces = [{"o_proj": ((base, view, 7), None), "cache_write": (("k", "v", None, "slots"), None)}
              for _ in sets]
    case = SimpleNamespace(sets=sets)
    calls = layer_bench.step_args(case, traces, "o_proj", 4)
    assert len(calls) == 4 and calls[0][0] is base and calls[1][0] is base
    for b, v, n in calls[2:]:
        assert b.data_ptr() != base.data_ptr() and torch.equal(b, base) and n == 7
        assert v.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and torch.equal(v, view)
    assert calls[2][0].data_ptr() != calls[3][0].data_ptr()
    writes = layer_bench.step_args(case, traces, "cache_write", 2)
    assert [w[2] for w in writes] == ["cache0", "cache1"]
    # the copies stop at the budget: 48 bytes of storage (the view shares base's) a copy
    assert layer_bench.arg_bytes(traces[0]["o_proj"][0]) == 48
    assert len(layer_bench.step_args(case, traces, "o_proj", 10, budget=100)) == 4
    assert len(layer_bench.step_args(case, traces, "o_proj", 10, budget=48 * 8)) == 10


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_a_step_s_copies_give_its_output(torch, lt, fmt, rng):
    """The copies per_kernel times are arguments the step takes: every step of the torch layer,
    called on a deep copy of the arguments it got in a traced layer, gives the traced output and
    leaves the traced arguments as they were (the cache step writes its copy's cache)."""
    from types import SimpleNamespace

    w = lt.layer_weights(CFG, fmt, "cpu", seed=int(rng.integers(1000)))
    meta = lt.decode_meta(2, 40, "cpu")
    cos_sin = lt.rope_cache(CFG, 64, "cpu")
    cache = lt.new_cache(CFG, meta.block_tables.numel(), "cpu", torch.Generator().manual_seed(1))
    x, res = (lt.from_bits(a) for a in dl.random_inputs(rng, CFG, 2))
    steps, trace = lt.torch_steps(CFG, fmt), {}
    lt.forward(steps, CFG, w, x, res, meta, cache, cos_sin, trace=trace)
    case = SimpleNamespace(sets=[SimpleNamespace(cache=cache)])
    flat = lambda v: [t for t in (v if isinstance(v, tuple) else (v,)) if isinstance(t, torch.Tensor)]
    for name in lt.STEP_NAMES:
        (args, want), = [(trace[name][0], trace[name][1])]
        theirs = [t.clone() for t in flat(args)]
        copied = layer_bench.step_args(case, [trace], name, 2)[1]
        got = steps[name](*copied)
        if name == "cache_write":
            assert got is None and torch.equal(copied[2].key, want.key), name
            assert torch.equal(copied[2].value, want.value), name
            continue
        for g, e in zip(flat(got), flat(want), strict=True):
            assert torch.equal(g, e), name
        for a, b in zip(flat(args), theirs, strict=True):
            assert torch.equal(a, b), name


def test_per_kernel_times_each_step_over_its_copies(torch, lt, rng, monkeypatch):
    """per_kernel end to end on the CPU (the graph timer replaced by one call of the body): a row
    for every step, each with its copies and passes, every call of a step on arguments it takes;
    a step that fails is a row with its reason, and the others still run."""
    from types import SimpleNamespace

    calls = {}

    def fake_graph(body, per_call, replays):
        body()
        return {"graph_us": float(per_call), "replays": replays}

    monkeypatch.setattr(layer_bench, "time_graph", fake_graph)
    monkeypatch.setattr(layer_bench, "l2_bytes", lambda: 1 << 20)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # timed's error path, on the CPU
    sets = []
    for r in range(2):
        w = lt.layer_weights(CFG, "bf16", "cpu", seed=int(rng.integers(1000)))
        meta = lt.decode_meta(1, 40, "cpu", seed=r)
        cache = lt.new_cache(CFG, meta.block_tables.numel(), "cpu", torch.Generator().manual_seed(r))
        x, res = (lt.from_bits(a) for a in dl.random_inputs(rng, CFG, 1))
        sets.append(layer_bench.LayerSet(w, x, res, meta, cache))
    case = SimpleNamespace(cfg=CFG, sets=sets, cos_sin=lt.rope_cache(CFG, 64, "cpu"), t=1)
    steps = lt.torch_steps(CFG, "bf16")

    def counted(name, f):
        def step(*args):
            calls[name] = calls.get(name, 0) + 1
            if name == "act" and calls[name] > len(sets):  # past the traced layers
                raise RuntimeError("broken act")
            return f(*args)
        return step

    wb = {n: counted(n, f) for n, f in steps.items()}
    costs = layer_bench.models(CFG, "bf16", "decode", 1)
    rows = layer_bench.per_kernel(case, wb, costs, {}, 3000.0, 700.0, replays=3, log=lambda *_: None)
    assert [r["step"] for r in rows] == [c.name for c in costs]
    for r, c in zip(rows, costs, strict=True):
        if r["step"] == "act":
            assert r["graph_us"] is None and "broken act" in r["error"]
            continue
        want = layer_bench.step_copies(c.bytes, 2, 1 << 20)
        assert r["copies"] == want and r["passes"] * want >= layer_bench.PER_KERNEL_LAUNCHES
        assert r["graph_us"] == r["passes"] * want  # per_call: every launch the graph holds
    assert any(r.get("copies", 0) > len(sets) for r in rows)  # deep copies were made and called
    # the traced run calls each step once a set; per_kernel once a copy and pass
    for r in rows:
        if r["step"] != "act":
            assert calls[r["step"]] == 2 + r["passes"] * r["copies"], r["step"]


def test_whole_layers_are_timed_in_turns_and_a_failed_one_keeps_its_reason(torch, monkeypatch):
    """time_graphs on the CPU (captures and events faked): each body captured once, every round
    replays each graph once with the order turned by one, each row the median over its rounds; a
    body that fails to build is its row's reason and the others are still timed, in the makers'
    order."""
    clock, order = [0.0], []

    class Graph:
        def __init__(self, name, cost):
            self.name, self.cost = name, cost

        def replay(self):
            order.append(self.name)
            clock[0] += self.cost(len(order))

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.t = clock[0]

        def elapsed_time(self, end):
            return end.t - self.t  # ms

    monkeypatch.setattr(layer_bench, "capture", lambda body: body)  # the body stands for its graph
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    slow_later = lambda n: float(n)  # each replay slower than the last: clocks falling over the run

    def broken():
        raise RuntimeError("no runner here")

    makers = [("a", lambda: Graph("a", slow_later)), ("broken", broken), ("b", lambda: Graph("b", slow_later))]
    rows = layer_bench.time_graphs(makers, per_call=2, replays=5, log=lambda *_: None)
    assert list(rows) == ["a", "broken", "b"]
    assert rows["broken"]["graph_us"] is None and "no runner here" in rows["broken"]["error"]
    assert order == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]  # warm-up, then turns
    # a: replays 3, 6, 7, 10, 11 (ms over 2 calls), b: 4, 5, 8, 9, 12; one after the other the
    # same two layers would be 2500 and 5000 µs
    assert (rows["a"]["graph_us"], rows["b"]["graph_us"]) == (3500.0, 4000.0)
    assert (rows["a"]["graph_min_us"], rows["a"]["graph_max_us"], rows["a"]["replays"]) == (1500.0, 5500.0, 5)


def test_the_timeline_counts_each_microsecond_once_and_names_the_rest():
    """timeline: kernels in any order, per layer (per_call layers a replay); busy time is the union
    of the spans (an overlap counted once, a span inside another not at all), between = span -
    busy, each name's time and launches summed."""
    spans = [("b", 30.0, 50.0), ("a", 0.0, 10.0), ("c", 12.0, 20.0), ("a", 15.0, 25.0),
             ("d", 40.0, 45.0)]  # a(15-25) overlaps c(12-20); d inside b
    t = layer_bench.timeline(spans, per_call=2)
    # busy: 0-10, 12-25, 30-50 = 10 + 13 + 20 = 43; span 0-50; between 7 (10-12, 25-30)
    assert t["kernels_us"] == pytest.approx(43 / 2) and t["span_us"] == pytest.approx(25.0)
    assert t["between_us"] == pytest.approx(7 / 2) and t["launches"] == pytest.approx(2.5)
    by = {r["kernel"]: r for r in t["by_kernel"]}
    assert by["a"]["us"] == pytest.approx(10.0) and by["a"]["launches"] == pytest.approx(1.0)
    assert [r["kernel"] for r in t["by_kernel"]] == ["a", "b", "c", "d"]  # longest first
    # the last span to end need not be the last to start
    assert layer_bench.timeline([("x", 0.0, 100.0), ("y", 10.0, 20.0)], 1)["span_us"] == 100.0
    assert layer_bench.timeline([], 1)["kernels_us"] == 0.0


def test_print_run_shows_the_layer_s_own_timeline_or_why_not():
    import io

    from lkw import results

    run = json.loads(json.dumps(results.example("11_decoder_layer")))
    run["cases"][0]["in_layer"] = layer_bench.timeline([("k1", 0.0, 4.0), ("k2", 5.0, 7.0)], 1)
    run["cases"][1]["in_layer"] = {"graph_us": None, "error": "RuntimeError: no kernel"}
    out = io.StringIO()
    layer_bench.print_run(run, out=out)
    text = out.getvalue()
    assert "kernels 6.0 µs, between them 1.0, 2 launches" in text
    assert "not profiled (RuntimeError: no kernel)" in text


def test_merge_replaces_a_run_s_own_cases_and_keeps_the_rest():
    """--merge: a part of the matrix (a device call's worth) replaces its (format, case) rows of
    the recorded run and keeps the others; the goals are recomputed; another GPU is refused."""
    from lkw import results as res

    recorded = dict(res.example("11_decoder_layer"), commit="aaaaaaa", date="2026-01-01")
    part = dict(recorded, commit="bbbbbbb", date="2026-02-02",
                cases=[dict(c, marker=1) for c in recorded["cases"][:2]])
    merged = layer_bench.merge(recorded, part)
    keys = [(c["format"], c["case"]) for c in merged["cases"]]
    assert sorted(keys) == sorted((c["format"], c["case"]) for c in recorded["cases"])
    assert sum("marker" in c for c in merged["cases"]) == 2
    # every case names the run that measured it; a second merge keeps the stamps
    assert all((c["commit"], c["date"]) == (("bbbbbbb", "2026-02-02") if "marker" in c else
                                            ("aaaaaaa", "2026-01-01")) for c in merged["cases"])
    again = layer_bench.merge(merged, dict(part, commit="ccccccc", cases=[]))
    assert [c["commit"] for c in again["cases"]] == [c["commit"] for c in merged["cases"]]
    assert merged["goals"] == layer_bench.goals(merged)
    with pytest.raises(ValueError, match="cannot merge"):
        layer_bench.merge(recorded, dict(part, gpu="another GPU"))


def test_the_example_run_is_in_the_bench_s_schema():
    """results.example("11_decoder_layer") (the notebook's stand-in before a real run) is what
    layer_bench writes: its print_run and goals read it, a case per format and CASES entry, each
    with every step's kernel row and a waterfall in swap order."""
    import json

    from lkw import results

    run = json.loads(json.dumps(results.example("11_decoder_layer")))
    assert "not a measurement" in run["gpu"]
    check_layer_run(run)
    formats = dict.fromkeys(c["format"] for c in run["cases"])
    assert [(c["format"], c["kind"], c["t"]) for c in run["cases"]] == [
        (f, k, t) for f in formats for k, t in layer_bench.CASES]


def check_layer_run(run: dict) -> None:
    """What layer_bench writes, example or recorded (test_bench checks results/h200's with it):
    print_run and goals read it; each case has every step's kernel row, a waterfall in swap
    order ending at the workbook layer, which is checked correct, and the model's bounds."""
    import io

    assert run["chapter"] == layer_bench.CHAPTER
    assert all(isinstance(run.get(k), str) for k in ("gpu", "date", "commit")), "header"
    assert all(isinstance(c.get(k, ""), str) for c in run["cases"] for k in ("commit", "date"))
    layer_bench.print_run(run, out=io.StringIO())
    assert run["goals"] == layer_bench.goals(run)
    for c in run["cases"]:
        assert c["case"] == layer_bench.case_name(c["kind"], c["t"])
        assert [k["step"] for k in c["kernels"]] == list(dl.STEP_NAMES)
        swapped = [w["swapped"] for w in c["waterfall"]]
        assert swapped == ["torch layer", *layer_bench.swappable(c["format"], c["owner"])]
        assert c["layer"]["workbook"] == c["waterfall"][-1] and c["layer"]["workbook"]["correct"]
        assert (c["bound_bytes"], c["bound_flops"]) == layer_bench.layer_bound(
            dl.LLAMA3_8B, c["format"], c["kind"], c["t"])


def test_the_tensor_peak_is_this_gpus(torch, monkeypatch):
    """The layer bench reads FLOPs against the recorded cuBLAS peak of the GPU it runs on; where
    that GPU has none, cuBLAS is timed in the run: never another GPU's figure (an H100 read
    against the H200's peak showed its GEMMs above 100% of their bound)."""
    from lkw import results

    recorded = {"h200": ({"graph": 700.0}, "results/h200/00_roofline.json")}
    missing = "results/{}/00_roofline.json does not exist"
    monkeypatch.setattr(results, "tensor_peak",
                        lambda gpu: recorded.get(gpu, ({}, missing.format(gpu))))
    timed = []

    def measure():
        timed.append(1)
        return {"graph": 650.0, "one_launch": 600.0}

    _, tflops, what = layer_bench.ceiling(gpu_name="NVIDIA H200", measure_peak=measure)
    assert (tflops, timed) == (700.0, [])
    _, tflops, what = layer_bench.ceiling(gpu_name="NVIDIA H100 80GB HBM3", measure_peak=measure)
    assert (tflops, timed) == (650.0, [1])
    assert "timed in this run" in what and "h100" in what

    def broken():
        raise RuntimeError("no GPU")

    _, tflops, what = layer_bench.ceiling(gpu_name="NVIDIA H100 80GB HBM3", measure_peak=broken)
    assert tflops is None and "no GPU" in what
    _, tflops, what = layer_bench.ceiling(gpu_name="NVIDIA H100 80GB HBM3", measure_peak=dict)
    assert tflops is None and "no correct TFLOP/s" in what


def test_the_measured_peak_is_the_recorded_peaks_row(monkeypatch):
    """bench.measure_tensor_peak times only the row the recorded peak comes from
    (results.TENSOR_PEAK_ROW), through the bench's own measure_case, and keeps correct rates only."""
    from lkw import bench, results

    chapter, op, version = results.TENSOR_PEAK_ROW
    others = [{"id": "not_the_peak"}, {"id": version}]
    monkeypatch.setattr(bench, "versions_of", lambda c, o: others if (c, o) == (chapter, op) else [])
    seen = {}

    def measure_case(case, versions, **kw):
        seen.update(op=case.op, ids=[v["id"] for v in versions])
        return [{"correct": True, "graph_tflops": 700.0, "one_launch_tflops": None},
                {"correct": False, "back_to_back_tflops": 999.0}]

    monkeypatch.setattr(bench, "measure_case", measure_case)
    assert bench.measure_tensor_peak(warmup=1, iters=1, l2_bytes=1) == {"graph": 700.0}
    assert seen == {"op": op, "ids": [version]}
