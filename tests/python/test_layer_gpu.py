"""Chapter 11 on the GPU: the workbook's kernels inside the Llama-3-8B layer (lkw.layer_torch).

- each workbook step, fed the inputs the float64 reference layer gives it, matches the reference
  step within that chapter's tolerance (the harness's rules: ulp / close / exact);
- the whole workbook layer against the reference, per format, decode and prefill; and the
  production-kernel layer the bench times beside it (where the peer kit is);
- the 4-layer greedy decode: the same 32 tokens as the reference for BF16 and W4A16, FP8 agreeing
  on at least FP8_AGREEMENT of them;
- the layer captured once in a CUDA graph and replayed for 100 decode steps with the cache growing
  (positions and slots advanced in device memory, no re-capture), the first and last step checked.

Skipped, with the reason, without torch, a GPU or the compiled extension lkw._ext. The workbook
layers here use the reference's float64 attention (not a workbook kernel), so that what is checked
is the kernels; the bench's layer uses torch SDPA and is checked there (lkw.layer_bench.verify).
"""

import numpy as np
import pytest
from lkw import decoder_layer as dl
from lkw import elementwise, fp8_gemm, gemv, rmsnorm

torch = pytest.importorskip("torch", reason="torch with CUDA runs the chapter 11 layer")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: chapter 11's layer runs on the GPU", allow_module_level=True)
try:
    from lkw import _ext  # noqa: F401
except ImportError as e:
    pytest.skip(f"lkw._ext is not built ({e}): cmake --build build", allow_module_level=True)
from lkw import layer_torch as lt

CFG = dl.LLAMA3_8B
FORMATS = lt.FORMATS
# The whole workbook layer against the reference with the same float64 attention: relative
# Frobenius error of out and r2. The kernels round where the reference rounds; what differs is an
# FP32 sum or rstd a hair off the exact one, now and then an element one BF16 ulp away (2^-8), and
# for FP8 then one E4M3 code (2^-4) downstream of it: the norm's FP32 rstd is a few ulps off
# the reference's in many rows, so FP8 sees such codes in a few % of its elements (torch's own
# FP8 layer: 2.4-4.8 % at the reduced shape). A wrong step is off by O(1).
# BF16 and W4A16: 2^-7, one ulp step (2^-8) on some elements carried through the layer's later
# roundings (a GEMM over K = 14336 spreads it into every output of the row).
LAYER_TOLERANCE = {"bf16": 2**-7, "w4a16": 2**-7, "fp8": 8e-2}
# The 4-layer decode. Logits (teacher forced) within LOGIT_TOLERANCE of the reference's spread;
# a near tie is a top-2 margin below NEAR_TIE of it, which such a difference may decide either
# way. FP8: its activations' codes move by one where a BF16 input sits an ulp from the
# reference's, so its logits move more and at least FP8_AGREEMENT of its teacher-forced tokens
# must be the reference's. torch's own layer (BF16 ops that round elsewhere: larger errors than
# the kernels') at a reduced shape on the CPU: logits within 0.03-0.06 of the spread (BF16,
# W4A16), 0.26-0.32 (FP8), FP8 agreeing on 29-30 of 32.
LOGIT_TOLERANCE = {"bf16": 0.08, "w4a16": 0.08, "fp8": 0.5}
NEAR_TIE = 0.05
FP8_AGREEMENT = 0.8
CASES = [("decode", 1), ("decode", 32), ("prefill", 256)]


@pytest.fixture(scope="module")
def names():
    return lt.registered()


@pytest.fixture(scope="module", params=FORMATS)
def weights(request):
    return request.param, lt.layer_weights(CFG, request.param, "cuda", seed=11)


def setup(kind: str, t: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    meta = lt.decode_meta(t, 2048, "cuda", seed=seed) if kind == "decode" else lt.prefill_meta(t, "cuda")
    cache = lt.new_cache(CFG, meta.block_tables.numel(), "cuda", gen)
    x, res = (lt.from_bits(a, "cuda") for a in dl.random_inputs(np.random.default_rng(seed), CFG, t))
    return meta, cache, x, res, lt.rope_cache(CFG, 2048 + 128, "cuda")


def with_ref_attention(steps: dict) -> dict:
    return dict(steps, attention=lt.ref_attention(CFG))


def bits(t):
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).cpu().numpy()
    if t.dtype == torch.bfloat16:
        return lt.to_bits(t)
    return t.cpu().numpy()


def gemm_tolerance(x, p: lt.Proj) -> str:
    """chapter 06/07's tolerance (lkw.gemv.tolerance) with its maxima computed on the GPU."""
    x64 = x.dequant64() if isinstance(x, lt.Quantized) else x.double()
    w = p.exact()
    walk = float(((x64 * x64) @ (w * w).t()).max())
    abs_sum = float((x64.abs() @ w.abs().t()).max())
    return gemv.tolerance_from_maxima(walk, abs_sum, p.k)


def check_step(name: str, fmt: str, args, got, want) -> list[str]:
    """Problems of one workbook step's output against the reference step's ([] when it passes)."""
    problems = []

    def match(g, w, dtype, tol, what):
        if not elementwise.matches(bits(g), bits(w), dtype, tol):
            problems.append(f"{name} {what}: not within {tol}")

    def match_codes(g: lt.Quantized, w: lt.Quantized):
        # a kernel's BF16 value before its quant may be an ulp off the reference's: one code,
        # scales within 2^-6
        match(g.q, w.q, "float8_e4m3fn", "ulp:1", "q")
        match(g.scales, w.scales, "float32", "close:0.015625:0", "scales")

    if name in ("attn_norm", "ffn_norm"):
        (y, r), (y_ref, r_ref) = got, want
        match(r, r_ref, "bfloat16", "exact", "residual")
        if isinstance(y, lt.Quantized):  # FP8: chapter 04's v5 writes y's group codes, not y
            match_codes(y, lt.Quantized(*lt.quant_per_group(y_ref)))
        else:
            match(y, y_ref, "bfloat16", rmsnorm.TOLERANCE_Y, "y")
    elif name == "rope":
        tol = elementwise.rope_tolerance(lt.to_bits(args[1]), lt.to_bits(args[2]))
        for g, w, what in zip(got, want, ("q", "k"), strict=True):
            match(g, w, "bfloat16", tol, what)
    elif name == "cache_write":
        match(got.key, want.key, "bfloat16", "exact", "key cache")
        match(got.value, want.value, "bfloat16", "exact", "value cache")
    elif name == "act":
        if fmt == "fp8":
            match_codes(got, want)
        else:
            match(got, want, "bfloat16", elementwise.TOLERANCE_ACT, "y")
    elif fmt == "fp8":  # chapter 03's quant (exact on the same BF16 input), then the GEMM
        x, p = args
        xq = x if isinstance(x, lt.Quantized) else lt.Quantized(*lt.quant_per_group(x))
        exact = (xq.dequant64() @ p.exact().t()).cpu().numpy()  # the unrounded product
        k = p.k
        err = fp8_gemm.rel_frobenius_error(lt.to_bits(got), exact)
        # Chapter 08's bound is derived for products of random sign; a layer's inputs are not
        # (attention's output averages V over the context and keeps part of V's column means),
        # where the tensor core's truncating sums drift a little coherently: 1.25x covers it, a
        # wrong scale or block is off by O(1).
        bound = 1.25 * fp8_gemm.error_bound(k)
        if not err <= bound:
            problems.append(f"{name}: relative error {err:.3g} above {bound:.3g}")
    else:
        match(got, want, "bfloat16", gemm_tolerance(args[0], args[1]), "y")
    return problems


def check_rope_cache(wb: dict, trace: dict) -> list[str]:
    """The fused rope step (chapter 05's qkv_rope_cache) on the reference's qkv and cache: q'
    against the reference rope's, the cache against the reference cache_write's (the keys within
    RoPE's tolerance, rotated in FP32 here; the values copied exactly)."""
    (pos, q, k, cos_sin), (q_ref, _) = trace["rope"]
    (_, _, before, slots), after = trace["cache_write"]
    qkv = trace["qkv_proj"][1]  # (T,(Hq+2Hkv)D) BF16
    cache = before.clone()
    got = wb["rope"](pos, qkv, cos_sin, cache, slots)
    tol = elementwise.rope_tolerance(lt.to_bits(q), lt.to_bits(k))
    problems = []
    for g, w, dtype, t, what in ((got, q_ref, "bfloat16", tol, "q"),
                                 (cache.key, after.key, "bfloat16", tol, "key cache"),
                                 (cache.value, after.value, "bfloat16", "exact", "value cache")):
        if not elementwise.matches(bits(g), bits(w), dtype, t):
            problems.append(f"rope + cache_write {what}: not within {t}")
    return problems


@pytest.mark.parametrize("kind,t", CASES)
def test_each_workbook_step_matches_the_reference_step(weights, names, kind, t):
    fmt, w = weights
    meta, cache, x, res, cos_sin = setup(kind, t, seed=t)
    trace = {}
    lt.forward(lt.reference_steps(CFG, fmt), CFG, w, x, res, meta, cache, cos_sin, trace=trace)
    wb = lt.workbook_steps(CFG, fmt, t, names)
    owner = lt.workbook_owner(fmt, t, names)
    problems = []
    for name in dl.STEP_NAMES:
        if name == "attention" or owner[name].startswith("cuBLAS"):
            continue
        args, want = trace[name]
        if lt.writes_cache(wb["rope"]) and name in ("rope", "cache_write"):
            if name == "rope":
                problems += [f"{p} ({owner[name]})" for p in check_rope_cache(wb, trace)]
            continue
        if name == "cache_write":
            k, v, before, slots = args
            got = before.clone()
            wb[name](k, v, got, slots)
        else:
            got = wb[name](*args)
        problems += [f"{p} ({owner[name]})" for p in check_step(name, fmt, args, got, want)]
    assert not problems, f"{fmt} {kind} T = {t}: " + "; ".join(problems)


@pytest.mark.parametrize("kind,t", CASES)
def test_workbook_layer_matches_the_reference(weights, names, kind, t):
    fmt, w = weights
    meta, cache, x, res, cos_sin = setup(kind, t, seed=100 + t)
    ref = lt.forward(lt.reference_steps(CFG, fmt), CFG, w, x, res, meta, cache.clone(), cos_sin)
    wb = with_ref_attention(lt.workbook_steps(CFG, fmt, t, names))
    got = lt.forward(wb, CFG, w, x, res, meta, cache.clone(), cos_sin)
    for what, g, r in zip(("out", "r2"), got, ref, strict=True):
        err = float((g.double() - r.double()).norm() / r.double().norm())
        assert bool(g.isfinite().all()) and err <= LAYER_TOLERANCE[fmt], f"{fmt} {what}: {err:.3g}"


@pytest.mark.parametrize("kind,t", [("decode", 1), ("prefill", 256)])
def test_the_production_layer_matches_the_reference(weights, kind, t):
    """The production-kernel layer the bench times beside the workbook's (vLLM through lkw.peers:
    its norms, FP8 group quants, RoPE, cache, act and GEMMs) with the same float64 attention:
    within the workbook layer's tolerance, or its timing would be of other work. Skipped, with the
    reason, without the peer kit."""
    from lkw import peers

    fmt, w = weights
    try:
        steps, _ = lt.production_steps(CFG, fmt)
    except peers.Absent as e:
        pytest.skip(f"no production peers: {e}")
    meta, cache, x, res, cos_sin = setup(kind, t, seed=200 + t)
    ref = lt.forward(lt.reference_steps(CFG, fmt), CFG, w, x, res, meta, cache.clone(), cos_sin)
    got = lt.forward(with_ref_attention(steps), CFG, w, x, res, meta, cache.clone(), cos_sin)
    for what, g, r in zip(("out", "r2"), got, ref, strict=True):
        err = float((g.double() - r.double()).norm() / r.double().norm())
        assert bool(g.isfinite().all()) and err <= LAYER_TOLERANCE[fmt], f"{fmt} {what}: {err:.3g}"


@pytest.mark.parametrize("lengths,q_len", [([2048] * 32, 1), ([5, 300, 2048, 17, 1], 1),
                                           ([40, 2048, 9], 2), ([300], 256), ([256], 256)])
def test_the_layer_attention_matches_the_reference(names, lengths, q_len):
    """The workbook layer's attention (the runner's, through the registered op) over a batch of
    sequences of different lengths, each reading its own block table row in place: against the
    float64 attention of the reference, and close to torch's SDPA over the gathered cache. The
    cache holds N(0, 1) beyond every context (a kernel reading past a sequence's length is off).
    A prompt (positions from 0: the last case) takes torch's causal flash attention instead, which
    rounds P to BF16 as well: the looser bound."""
    tables = lt.block_tables(len(lengths), 2048 + 64, seed=len(lengths))
    positions = np.concatenate([np.arange(n - q_len, n) for n in lengths])
    meta = lt.make_meta(positions, tables, q_len, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(q_len)
    cache = lt.new_cache(CFG, tables.size, "cuda", gen)
    q = torch.randn(positions.size, CFG.hq * CFG.head_dim, generator=gen, device="cuda").to(torch.bfloat16)
    got = lt.workbook_steps(CFG, "bf16", positions.size, names)["attention"](q, cache, meta).double()
    ref = lt.ref_attention(CFG)(q, cache, meta).double()
    sdpa = lt.sdpa_attention(CFG)(q, cache, meta).double()
    err = float((got - ref).norm() / ref.norm())
    assert meta.prompt == (positions[0] == 0)
    bound = 2**-6 if meta.prompt else 2**-8
    assert err < bound, f"relative error {err:.3g} (bound {bound}: o, and for a prompt P, rounded to BF16)"
    if meta.prompt:  # the workbook layer's attention is torch's for a prompt, not the runner's
        assert torch.equal(got, lt.prompt_attention(CFG)(q, cache, meta).double())
    assert float((sdpa - ref).norm() / ref.norm()) < 2**-6, "the check itself: SDPA agrees too"
    assert torch.isfinite(got).all()


def test_a_mutant_step_fails_the_layer(names):
    """The layer check catches a wrong kernel: the W4A16 GEMV fed the wrong group's scales."""
    w = lt.layer_weights(CFG, "w4a16", "cuda", seed=3)
    meta, cache, x, res, cos_sin = setup("decode", 1, seed=5)
    ref = lt.forward(lt.reference_steps(CFG, "w4a16"), CFG, w, x, res, meta, cache.clone(), cos_sin)
    wb = with_ref_attention(lt.workbook_steps(CFG, "w4a16", 1, names))
    good = wb["down_proj"]

    def rolled(a, p):
        q = lt.Proj(p.fmt, p.weight, p.scales.roll(1, dims=0), p.n, p.k)
        return good(a, q)

    got = lt.forward(dict(wb, down_proj=rolled), CFG, w, x, res, meta, cache.clone(), cos_sin)
    err = float((got[0].double() - ref[0].double()).norm() / ref[0].double().norm())
    assert err > 10 * LAYER_TOLERANCE["w4a16"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_four_layer_greedy_decode_gives_the_reference_tokens(names, fmt):
    """32 greedy tokens of a 4-layer stack, workbook kernels against the float64 reference.
    BF16, W4A16: the same ids, free running; where the two part, the reference's top-2 margin
    there must be a near tie (< NEAR_TIE: a logit difference the layer tolerance allows), and
    from there on the workbook runs teacher-forced on the reference's tokens. FP8: at least
    FP8_AGREEMENT of its teacher-forced choices are the reference's. Every step's logits (teacher
    forced) within LOGIT_TOLERANCE of the reference's."""
    stack = lt.make_stack(CFG, fmt, "cuda", n_layers=4, seed=21)
    ref, margins, ref_logits = lt.greedy_decode(stack, lambda t: lt.reference_steps(CFG, fmt))
    wb = lambda t: with_ref_attention(lt.workbook_steps(CFG, fmt, t, names))
    free, _, _ = lt.greedy_decode(stack, wb)
    forced, _, logits = lt.greedy_decode(stack, wb, forced=ref)
    print(f"{fmt}: reference {ref}\n{fmt}: workbook  {free}\nsmallest top-2 margin {min(margins):.3g}")
    spread = float(ref_logits.std())
    worst = float((logits - ref_logits).abs().max())
    assert worst <= LOGIT_TOLERANCE[fmt] * spread, f"{fmt}: logits off by {worst:.3g} (spread {spread:.3g})"
    if fmt == "fp8":
        same = sum(a == b for a, b in zip(forced, ref, strict=True)) / len(ref)
        assert same >= FP8_AGREEMENT, f"FP8 tokens agree on {same:.0%} (< {FP8_AGREEMENT:.0%})"
        return
    part = next((i for i, (a, b) in enumerate(zip(free, ref, strict=True)) if a != b), None)
    if part is not None:
        assert margins[part] < NEAR_TIE * spread, f"{fmt}: token {part} differs at margin {margins[part]:.3g}"
        bad = [i for i, (a, b) in enumerate(zip(forced, ref, strict=True))
               if a != b and margins[i] >= NEAR_TIE * spread]
        assert not bad, f"{fmt}: teacher-forced tokens {bad} differ away from near ties"


@pytest.mark.parametrize("fmt,t", [("w4a16", 1), ("fp8", 8), ("bf16", 1)])
def test_graph_replays_100_steps_with_the_cache_growing(names, fmt, t):
    """Captured once; each replay after advancing positions and slots in place (and writing new
    inputs into the captured x); steps 1 and 100 checked against the reference layer run on a copy
    of the cache as it was before that replay."""
    w = lt.layer_weights(CFG, fmt, "cuda", seed=4)
    steps = with_ref_attention(lt.workbook_steps(CFG, fmt, t, names))
    start, n = 1000, 100
    meta = lt.decode_meta(t, start, "cuda", capacity=start + n + 1, seed=9)
    cache = lt.new_cache(CFG, meta.block_tables.numel(), "cuda", torch.Generator("cuda").manual_seed(2))
    cos_sin = lt.rope_cache(CFG, start + n + 8, "cuda")
    rng = np.random.default_rng(6)
    x, res = (lt.from_bits(a, "cuda") for a in dl.random_inputs(rng, CFG, t))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lt.forward(steps, CFG, w, x, res, meta, cache.clone(), cos_sin)  # warm-up: layouts made
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, r2 = lt.forward(steps, CFG, w, x, res, meta, cache, cos_sin)
    ref_steps = lt.reference_steps(CFG, fmt)
    for step in range(1, n + 1):
        lt.advance(meta)
        new_x, new_res = dl.random_inputs(rng, CFG, t)
        x.copy_(lt.from_bits(new_x, "cuda"))
        res.copy_(lt.from_bits(new_res, "cuda"))
        before = cache.clone() if step in (1, n) else None
        graph.replay()
        if before is not None:
            ref_cache = before.clone()
            want = lt.forward(ref_steps, CFG, w, x, res, meta, ref_cache, cos_sin)
            for g, r in zip((out, r2), want, strict=True):
                err = float((g.double() - r.double()).norm() / r.double().norm())
                assert err <= LAYER_TOLERANCE[fmt], f"step {step}: {err:.3g}"
            # The new tokens' K and V come from the workbook's QKV GEMM, the reference's from a
            # float64 one: close, not equal. Every other slot must be untouched.
            for what, g, r, b in (("key", cache.key, ref_cache.key, before.key),
                                  ("value", cache.value, ref_cache.value, before.value)):
                written = (g != b) | (r != b)
                assert int(written.sum()) <= t * CFG.hkv * CFG.head_dim, (
                    f"step {step}: the graph wrote {what} cache slots it was not given")
                gw, rw = g[written].double(), r[written].double()
                err = float((gw - rw).norm() / rw.norm())
                assert err <= LAYER_TOLERANCE[fmt], f"step {step}: new {what}s off by {err:.3g}"
    assert int(meta.positions[0]) == start - 1 + n


def test_the_layer_s_own_timeline_sees_every_kernel_of_a_replay():
    """layer_bench.in_layer profiles one replay of a captured graph: three kernels a call and two
    calls a replay give 1.5 launches a layer at per_call = 4, each kernel's name among the rows."""
    from lkw import layer_bench

    x = torch.zeros(1 << 20, device="cuda")

    def body():
        x.add_(1.0)
        x.mul_(2.0)
        x.sub_(1.0)

    def two():
        body()
        body()

    t = layer_bench.in_layer(two, per_call=4)
    assert t["launches"] == pytest.approx(6 / 4)
    assert t["kernels_us"] > 0 and t["between_us"] >= 0 and t["span_us"] >= t["kernels_us"]
    assert len(t["by_kernel"]) >= 2
