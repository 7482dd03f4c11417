"""Chapter 11's bench: the decoder layer, one workbook kernel swapped in at a time.

    python -m lkw.layer_bench                  # every format, decode T = 1, 8, 32 (KV 2048), prefill
    python -m lkw.layer_bench --quick          # decode T = 1 only, few replays
    python -m lkw.layer_bench --write-results  # ... and write results/<gpu>/11_decoder_layer.json

For each format (BF16, W4A16, FP8) and case it reports, all in one run, every time the median of
CUDA-graph replays (the headline mode of lkw.bench: a decoder captures its step in a graph):

1. the waterfall: the torch layer (lkw.layer_torch.torch_steps), then one workbook kernel swapped
   in at a time, in layer order, the layer's graph time after each swap;
2. the per-kernel table: each step of the all-workbook layer alone in a graph, over copies of its
   inputs enough to exceed twice the L2 (``step_copies``: its weights and cache come from memory,
   as in the layer), its model bytes and FLOPs (lkw.decoder_layer.step_models; FP8 here:
   ``models``) and % of its bound (bytes over the copy ceiling measured in the same run, or FLOPs
   over the tensor peak, whichever is longer);
   their sum against the graphed layer (what remains is named: allocations and the gaps between
   kernels; where chapter 05's fused rope + cache step is not built, the copies that make q and k
   contiguous for the RoPE kernel when T > 1);
   and the layer's own timeline (``in_layer``): one replay of the all-workbook layer under
   torch.profiler, each kernel's time between its neighbours and the time between kernels;
3. the whole layer: graph time, the layer's byte and FLOP bound (``layer_bound``), % of it;
4. peers in the same run: torch eager and torch.compile (BF16), each in a CUDA graph; the
   production-kernel layer (lkw.layer_torch.production_steps, vLLM through lkw.peers; skipped with
   the reason when absent); chapter 11's C++ runner through lkw._ext (skipped with the reason when
   its op is not registered);
5. the issue's goal table, computed from the rows.

The whole layers (1, 3 and 4) are timed side by side (``time_graphs``): every graph captured, then
round after round each replayed once, so that a GPU's clocks drifting over the run (a
compute-bound prefill layer most) fall on all of them alike.

Inputs are rotated as lkw.bench rotates them: R copies of the layer (weights, caches, activations)
in distinct memory, R large enough that they exceed twice the L2, and the graph runs the R layers
one after another (as a model's layers run); the time per layer is the graph's time over R. Before
timing, the all-workbook layer is checked against the float64 reference (lkw.layer_torch's
reference_steps) on the first copy; after timing, once more.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lkw import decoder_layer as dl
from lkw import elementwise, layer_torch, peers, results

CHAPTER = "11_decoder_layer"
# chapter 11's C++ runner: op decoder_layer_<fmt>, its one version (solutions/11_decoder_layer/
# layer.h).
RUNNER_OP = "11_decoder_layer/decoder_layer_{fmt}/v0_runner"
KV_LEN = 2048
CASES = [("decode", 1), ("decode", 8), ("decode", 32), ("prefill", 2048)]
QUICK_CASES = [("decode", 1)]
REPLAYS, QUICK_REPLAYS = 20, 5
# The full layer against the float64 reference (the runner's FP32 attention in the layer at decode,
# float64 attention in the reference): relative Frobenius error of out and r2. Each BF16 step rounds
# (<= 2^-9 relative), the attention rounds o to BF16 (~2^-9; torch SDPA, in the torch layers and
# for a prompt in every layer, rounds P too); FP8 adds the activation codes (one code, 2^-4, where a
# kernel's BF16 input sits an ulp from the reference's: the norm's FP32 rstd is a few ulps off in
# many rows, which moves a few % of the codes). A wrong step is off by O(1).
LAYER_TOLERANCE = {"bf16": 1.5e-2, "w4a16": 1.5e-2, "fp8": 8e-2}
GOAL_T1_BOUND_PCT = 75.0


def case_name(kind: str, t: int) -> str:
    return f"{kind} T={t}" + (f" KV={KV_LEN}" if kind == "decode" else "")


def context_of(kind: str, t: int) -> int:
    return KV_LEN if kind == "decode" else t


# ---------------------------------------------------------------------------------------------
# Byte and FLOP models: lkw.decoder_layer's, for B sequences and for FP8


def models(cfg: dl.Config, fmt: str, kind: str, t: int) -> list[dl.Cost]:
    """Per-step costs of a case: prefill is one sequence of T tokens (decoder_layer.step_models);
    decode is T sequences of one token each with KV_LEN tokens of context: the attention reads
    every sequence's context, so its KV bytes and FLOPs are T times one sequence's."""
    context = context_of(kind, t)
    costs = dl.step_models(cfg, t, context, fmt)
    if kind == "decode" and t > 1:
        one = {c.name: c for c in dl.step_models(cfg, 1, context, "bf16")}["attention"]
        costs = [c._replace(bytes=t * one.bytes, flops=t * one.flops, kv_bytes=t * one.kv_bytes)
                 if c.name == "attention" else c for c in costs]
    return costs


def layer_bound(cfg: dl.Config, fmt: str, kind: str, t: int) -> tuple[int, int]:
    """(bytes, FLOPs) of the layer fused: every weight once, each sequence's KV cache read once and
    the new tokens' K, V written, x and residual read, out and r2 written (decoder_layer's
    layer_bound, per sequence for decode)."""
    costs = models(cfg, fmt, kind, t)
    weights = sum(c.weight_bytes for c in costs)
    kv_token = cfg.hkv * cfg.head_dim * 2 * dl.KV_BYTES
    seqs, context = (t, KV_LEN) if kind == "decode" else (1, t)
    kv = seqs * context * kv_token + t * kv_token
    return weights + kv + 4 * t * cfg.d * dl.BF16 + 8 * t, sum(c.flops for c in costs)


def bound_us(nbytes: float, flops: float, gbps: float | None, tflops: float | None) -> float | None:
    """The roofline time: the longer of bytes at the copy ceiling and FLOPs at the tensor peak."""
    if not gbps:
        return None
    t = nbytes / gbps / 1e3
    return max(t, flops / tflops / 1e6) if tflops else t


# ---------------------------------------------------------------------------------------------
# One case: R rotated copies of the layer, timed in CUDA graphs


@dataclass
class LayerSet:
    w: layer_torch.LayerWeights
    x: object
    res: object
    meta: layer_torch.Meta
    cache: layer_torch.KVCache


@dataclass
class Case:
    cfg: dl.Config
    fmt: str
    kind: str
    t: int
    sets: list[LayerSet]
    cos_sin: object


def l2_bytes() -> int:
    import torch

    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20) or 60 << 20)


def rotations(cfg: dl.Config, fmt: str, kind: str, t: int) -> int:
    """lkw.bench's rule: enough copies that they exceed twice the L2, plus one; at least two."""
    from lkw import bench

    nbytes, _ = layer_bound(cfg, fmt, kind, t)
    return bench.rotation_sets(nbytes, l2_bytes())


def make_case(cfg: dl.Config, fmt: str, kind: str, t: int, base: layer_torch.LayerWeights,
              seed: int = 0) -> Case:
    import torch

    device = base.norm1.device
    gen = torch.Generator(device=device).manual_seed(seed)
    context = context_of(kind, t)
    sets = []
    for r in range(rotations(cfg, fmt, kind, t)):
        if kind == "decode":
            meta = layer_torch.decode_meta(t, context, device, seed=seed + r)
        else:
            meta = layer_torch.prefill_meta(t, device, seed=seed + r)
        cache = layer_torch.new_cache(cfg, meta.block_tables.numel(), device, gen)
        rng = np.random.default_rng(seed + r)
        x, res = (layer_torch.from_bits(a, device) for a in dl.random_inputs(rng, cfg, t))
        sets.append(LayerSet(base if r == 0 else base.clone(), x, res, meta, cache))
    return Case(cfg, fmt, kind, t, sets, layer_torch.rope_cache(cfg, context + 64, device))


def body_of(case: Case, steps: dict):
    """The R layers, one after another (what the graph captures)."""

    def body():
        for s in case.sets:
            layer_torch.forward(steps, case.cfg, s.w, s.x, s.res, s.meta, s.cache, case.cos_sin)

    return body


def capture(body):
    """body() captured once in a CUDA graph, after two warm-up calls on a side stream."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def time_graph(body, per_call: int, replays: int) -> dict:
    """Capture body() once, replay it; the median replay time over per_call (the calls it holds),
    with min and max."""
    import torch

    graph = capture(body)
    for _ in range(3):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for a, z in zip(starts, stops, strict=True):
        a.record()
        graph.replay()
        z.record()
    torch.cuda.synchronize()
    us = sorted(1000.0 * a.elapsed_time(z) / per_call for a, z in zip(starts, stops, strict=True))
    del graph
    return {"graph_us": statistics.median(us), "graph_min_us": us[0], "graph_max_us": us[-1],
            "replays": replays}


def time_graphs(makers: list[tuple[str, object]], per_call: int, replays: int, log=print) -> dict[str, dict]:
    """The whole-layer rows timed side by side: each maker() gives a body, captured once (a maker
    or capture that fails is that row's reason, as in timed); then `replays` rounds, each replaying
    every graph once, the order turned by one each round. A GPU's clocks drift over a run (a
    compute-bound prefill layer most), so two layers timed one after the other can differ by more
    than their gap; timed in turns, each sees the same clocks. Each row as time_graph's."""
    import torch

    graphs, rows = {}, {}
    for name, make in makers:
        row = timed(name, lambda m=make: {"graph": capture(m())}, log)
        if "graph" in row:
            graphs[name] = row.pop("graph")
        else:
            rows[name] = row
    names = list(graphs)
    for name in names:  # a warm-up round
        graphs[name].replay()
    events = {name: [] for name in names}
    for r in range(replays):
        for name in names[r % len(names):] + names[: r % len(names)] if names else []:
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graphs[name].replay()
            z.record()
            events[name].append((a, z))
    torch.cuda.synchronize()
    for name in names:
        us = sorted(1000.0 * a.elapsed_time(z) / per_call for a, z in events[name])
        rows[name] = {"graph_us": statistics.median(us), "graph_min_us": us[0], "graph_max_us": us[-1],
                      "replays": replays, "interleaved": len(names)}
    graphs.clear()
    return {name: rows[name] for name, _ in makers}


def timeline(spans: list[tuple[str, float, float]], per_call: int) -> dict:
    """The GPU's work in one graph replay, from (name, start, end) of its kernels (µs, any order):
    per layer (the replay holds per_call layers), the time some kernel ran (the union of the
    spans), the time from the first start to the last end, what lies between the kernels (the
    difference: a kernel's launch and drain, a dependency's wait), and each kernel name's time."""
    spans = sorted(spans, key=lambda x: x[1])
    busy, end, by = 0.0, None, {}
    for name, a, z in spans:
        if end is None or a >= end:
            busy += z - a
            end = z
        elif z > end:  # overlapping the one before: only the part after it
            busy += z - end
            end = z
        us, n = by.get(name, (0.0, 0))
        by[name] = (us + z - a, n + 1)
    span = max(z for _, _, z in spans) - spans[0][1] if spans else 0.0
    rows = sorted(({"kernel": k[:120], "us": us / per_call, "launches": n / per_call}
                   for k, (us, n) in by.items()), key=lambda r: -r["us"])
    return {"kernels_us": busy / per_call, "span_us": span / per_call,
            "between_us": (span - busy) / per_call, "launches": len(spans) / per_call,
            "by_kernel": rows}


def in_layer(body, per_call: int) -> dict:
    """The workbook layer's kernels as they run in its graph: one replay under torch.profiler
    (CUPTI records each kernel of a replayed graph), as ``timeline``. The per-kernel table times
    each step alone over its own copies; here each kernel runs between its neighbours, on their
    outputs, so the two tables differ by what the layer does to a kernel, and the time between
    kernels is the part of the layer no kernel holds."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    graph = capture(body)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    del graph
    spans = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
             if e.device_type == DeviceType.CUDA]
    if not spans:
        raise RuntimeError("the profiler recorded no kernel of the replayed graph")
    return timeline(spans, per_call)


def timed(name: str, fn, log=print) -> dict:
    """fn() -> dict, or a row that says why it did not run."""
    import torch

    try:
        return fn()
    except peers.Absent as e:
        log(f"  {name}: skipped: {e}")
        return {"graph_us": None, "skipped": str(e)}
    except Exception as e:  # noqa: BLE001  (a row that fails is recorded with its reason)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        log(f"  {name}: did not run: {why}")
        torch.cuda.synchronize()
        return {"graph_us": None, "error": why}


# ---------------------------------------------------------------------------------------------
# Verification against the float64 reference


def rel_error(got, ref) -> float:
    g, r = got.double(), ref.double()
    if not bool(g.isfinite().all()):
        return float("inf")
    return float((g - r).norm() / r.norm())


def verify(case: Case, steps: dict, which: int = 0) -> dict:
    """The layer with `steps` against reference_steps on copy `which` (each on a clone of its
    cache): out and r2 within LAYER_TOLERANCE[fmt]."""
    s = case.sets[which]
    ref_steps = layer_torch.reference_steps(case.cfg, case.fmt)
    c_ref, c_got = s.cache.clone(), s.cache.clone()
    out_r, r2_r = layer_torch.forward(ref_steps, case.cfg, s.w, s.x, s.res, s.meta, c_ref, case.cos_sin)
    out_g, r2_g = layer_torch.forward(steps, case.cfg, s.w, s.x, s.res, s.meta, c_got, case.cos_sin)
    err = max(rel_error(out_g, out_r), rel_error(r2_g, r2_r))
    tol = LAYER_TOLERANCE[case.fmt]
    return {"correct": err <= tol, "rel_error": err, "tolerance": tol}


# ---------------------------------------------------------------------------------------------
# The rows of one case


def swappable(fmt: str, owner: dict[str, str]) -> list[str]:
    """The steps the workbook replaces, in layer order: not BF16's GEMMs (cuBLAS in both layers),
    not a step the workbook layer leaves to torch (a prompt's attention: torch's in every layer).
    The runner's attention at decode is one of them, though not a lesson."""
    out = []
    for name in layer_torch.STEP_NAMES:
        if owner[name].startswith(("cuBLAS", "torch")):
            continue
        out.append(name)
    return out


def waterfall(case: Case, wb: dict, order: list[str]) -> list[tuple[str, dict]]:
    """The waterfall's layers: (what was swapped last, the steps), from the torch layer to the
    all-workbook one."""
    steps = dict(layer_torch.torch_steps(case.cfg, case.fmt))
    layers = [("torch layer", dict(steps))]
    for name in order:
        if name == "cache_write" and layer_torch.writes_cache(wb["rope"]):
            continue  # swapped with rope: the fused kernel wrote the cache already
        steps[name] = wb[name]
        layers.append((name, dict(steps)))
    return layers


PER_KERNEL_LAUNCHES = 64
MAX_STEP_COPIES = 64
COPY_BUDGET = 4 << 30  # bytes of argument copies a step's row may allocate


def step_copies(step_bytes: int, sets: int, l2: int) -> int:
    """How many copies of a step's arguments its per-kernel row rotates over: lkw.bench's rule (more
    than twice the L2, plus one) for the step's own bytes, so that a GEMV whose weights would fit
    the L2 twice over reads them from memory, as it does in the layer; at least the layer's sets,
    at most MAX_STEP_COPIES (a small step stays in the L2: in the layer its input was just written
    by the step before, so it is there too)."""
    from lkw import bench

    if step_bytes <= 0:
        return sets
    return max(sets, min(MAX_STEP_COPIES, bench.rotation_sets(step_bytes, l2)))


def arg_bytes(obj, seen: set | None = None) -> int:
    """Bytes of the distinct tensor storages that `obj` holds, through tuples, lists, dicts and
    objects' fields (a Proj's derived layouts included)."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = ("storage", obj.untyped_storage().data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if ("object", id(obj)) in seen:
        return 0
    seen.add(("object", id(obj)))
    if isinstance(obj, (tuple, list)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).values()
    else:
        return 0
    return sum(arg_bytes(x, seen) for x in items)


def step_args(case: Case, traces: list[dict], name: str, copies: int,
              budget: int = COPY_BUDGET) -> list[tuple]:
    """Up to `copies` argument tuples of step `name`: the layer's sets' own, then deep copies of
    them in distinct memory (tensors cloned, views kept views of their clone), as many as fit in
    `budget` bytes (a small step's arguments may hold a whole cache: decode T = 32's is 268 MB)."""
    import copy

    extra = copies - len(case.sets)
    if extra > 0:
        size = arg_bytes(traces[0][name][0])
        copies = len(case.sets) + (min(extra, budget // size) if size else extra)
    out = []
    for i in range(copies):
        s, tr = case.sets[i % len(case.sets)], traces[i % len(case.sets)]
        args = tr[name][0]
        if name == "cache_write":
            args = (*args[:2], s.cache, args[3])
        out.append(args if i < len(case.sets) else copy.deepcopy(args))
    return out


def per_kernel(case: Case, wb: dict, costs: list[dl.Cost], owner: dict, ceiling_gbps, tflops,
               replays: int, log=print) -> list[dict]:
    """Each step of the all-workbook layer alone, in a graph over copies of the inputs that step
    gets in the layer (a traced run): step_copies of them, so that its weights and cache are read
    from memory as in the layer."""
    traces = []
    for s in case.sets:
        tr = {}
        layer_torch.forward(wb, case.cfg, s.w, s.x, s.res, s.meta, s.cache, case.cos_sin, trace=tr)
        traces.append(tr)
    rows = []
    fused = layer_torch.writes_cache(wb["rope"])
    l2 = l2_bytes()
    for c in costs:
        if fused and c.name == "cache_write":  # its work is in rope's row
            rows.append({"step": c.name, "kernel": owner.get(c.name, ""), "chapter": c.chapter,
                         "model_bytes": 0, "flops": 0, "bound_us": None, "pct_bound": None,
                         "graph_us": None})
            continue
        if fused and c.name == "rope":  # one pass over qkv: the fused op's bytes
            c = c._replace(bytes=elementwise.qkv_rope_cache_bytes(
                case.t, case.cfg.hq, case.cfg.hkv, case.cfg.head_dim, case.cfg.head_dim))

        def run(c=c):
            calls = step_args(case, traces, c.name, step_copies(c.bytes, len(case.sets), l2))
            # A graph of a few calls alone pays each replay's fixed cost over few launches: enough
            # passes over the copies that a replay holds PER_KERNEL_LAUNCHES launches at least.
            passes = max(1, math.ceil(PER_KERNEL_LAUNCHES / len(calls)))

            def body():
                for _ in range(passes):
                    for args in calls:
                        wb[c.name](*args)

            return {**time_graph(body, passes * len(calls), replays), "passes": passes,
                    "copies": len(calls)}

        row = timed(c.name, run, log)
        b_us = bound_us(c.bytes, c.flops, ceiling_gbps, tflops)
        us = row.get("graph_us")
        rows.append({"step": c.name, "kernel": owner.get(c.name, ""), "chapter": c.chapter,
                     "model_bytes": c.bytes, "flops": c.flops, "bound_us": b_us,
                     "pct_bound": 100.0 * b_us / us if us and b_us else None, **row})
    return rows


def compiled_bf16(case: Case):
    """torch.compile of the BF16 torch layer (Inductor, static shapes), one function of tensors so
    the R copies share one compilation; compiled on the first (untimed) call."""
    import torch

    cfg, meta0 = case.cfg, case.sets[0].meta
    steps = layer_torch.torch_steps(cfg, "bf16")

    def flat(x, res, n1, wqkv, wo, n2, wgu, wd, pos, slots, tables, kc, vc, cos_sin):
        p = lambda w: layer_torch.Proj("bf16", w, None, w.shape[0], w.shape[1])
        w = layer_torch.LayerWeights("bf16", n1, p(wqkv), p(wo), n2, p(wgu), p(wd))
        meta = layer_torch.Meta(pos, slots, tables, meta0.q_len, meta0.prompt)
        return layer_torch.forward(steps, cfg, w, x, res, meta, layer_torch.KVCache(kc, vc), cos_sin)

    torch._dynamo.reset()
    fn = torch.compile(flat, dynamic=False, fullgraph=True)

    def body():
        for s in case.sets:
            w = s.w
            fn(s.x, s.res, w.norm1, w.qkv.weight, w.o.weight, w.norm2, w.gate_up.weight,
               w.down.weight, s.meta.positions, s.meta.slots, s.meta.block_tables, s.cache.key,
               s.cache.value, case.cos_sin)

    return body


# ---- chapter 11's C++ runner ------------------------------------------------------------------


def runner_inputs(case: Case, s: LayerSet) -> tuple[list, list, dict]:
    """The C++ runner's arguments from the bench's torch tensors: (inputs, outputs, params) of
    `_ext.launch(<runner op>, ...)`, in the order solutions/11_decoder_layer/layer.h documents
    (lkw.decoder_layer.op_inputs is the same order for the golden files' numpy arrays):
    inputs x, residual, positions, slot_mapping, block_table [blocks] (ONE sequence), cos_sin,
    norm1, qkv's tensors, o's, norm2, gate_up's, down's; a projection's tensors are W (BF16);
    the tiled words, scales [N, K/128], the repacked words, scales [K/128, N] (W4A16: chapter 06's
    and 07's layouts); E4M3 W, block scales (FP8). Outputs key_cache, value_cache (updated in
    place), out, residual_out; param eps. The runner takes one sequence: batched decode has no
    runner row."""
    import torch

    from lkw import bench

    if s.meta.batch != 1:
        raise peers.Absent(f"the runner takes one sequence; this case has {s.meta.batch}")

    def tensors(p: layer_torch.Proj) -> list:
        if p.fmt == "bf16":
            return [p.weight]
        if p.fmt == "fp8":
            return [p.weight, p.scales]
        tiled = p.derived("int4t", lambda: (bench._torch_tiled_gemv_words(torch, p.weight),
                                            p.scales.t().contiguous()))
        repacked = p.derived("w4a16r", lambda: (bench._torch_repack(torch, p.weight), p.scales))
        return [*tiled, *repacked]

    w = s.w
    inputs = [s.x, s.res, s.meta.positions, s.meta.slots, s.meta.block_tables[0], case.cos_sin,
              w.norm1, *tensors(w.qkv), *tensors(w.o), w.norm2, *tensors(w.gate_up), *tensors(w.down)]
    outputs = [s.cache.key, s.cache.value, torch.empty_like(s.x), torch.empty_like(s.res)]
    return inputs, outputs, {"eps": case.cfg.eps}


def runner_name(fmt: str, names: set[str]) -> str:
    name = RUNNER_OP.format(fmt=fmt)
    if name not in names:
        raise peers.Absent(f"{name} is not registered (built without chapter 11)")
    return name


def runner_body(case: Case):
    """The runner over the R copies; peers.Absent when its op is not registered or the case has
    several sequences."""
    name = runner_name(case.fmt, layer_torch.registered())
    args = [runner_inputs(case, s) for s in case.sets]
    dtypes = None
    if case.fmt == "w4a16":  # int32 words travel as the runner's uint32
        per = ["", "uint32", "", "uint32", ""]
        dtypes = ["", "", "", "", "", "", ""] + per[1:] + per[1:] + [""] + per[1:] + per[1:] + [""] * 4

    def body():
        for inputs, outputs, params in args:
            layer_torch.launch(name, inputs, outputs, params, dtypes=dtypes)

    return body


# ---------------------------------------------------------------------------------------------
# The run


def _first_mode(peak: dict) -> float | None:
    """A {mode: TFLOP/s} peak's graph figure, else back to back, else one launch."""
    return peak.get("graph") or peak.get("back_to_back") or peak.get("one_launch") if peak else None


def ceiling(log=print, gpu_name: str | None = None, measure_peak=None
            ) -> tuple[float | None, float | None, str]:
    """(copy ceiling GB/s in a graph, BF16 tensor peak TFLOP/s, what they are): chapter 00's best
    copy measured now (lkw.bench); the tensor peak of the recorded cuBLAS run of this GPU
    (lkw.results), or, where this GPU has none, that cuBLAS row timed now (measure_peak, by default
    lkw.bench.measure_tensor_peak; {mode: TFLOP/s}): never another GPU's figure."""
    import torch

    from lkw import bench

    measure_peak = measure_peak or (lambda: bench.measure_tensor_peak(
        warmup=5, iters=20, l2_bytes=l2_bytes(), log=log))
    gbps = None
    try:
        best, version, _ = bench.measure_ceiling(warmup=5, iters=20, l2_bytes=l2_bytes(), log=log)
        gbps = best.get("graph") or best.get("back_to_back")
        what = f"copy ceiling: {version}, measured in this run"
    except Exception as e:  # noqa: BLE001
        what = f"copy ceiling not measured ({type(e).__name__}: {e})"
    gpu = results.gpu_slug(gpu_name or torch.cuda.get_device_name())
    peak, shown = results.tensor_peak(gpu)
    tflops = _first_mode(peak)
    if not tflops:
        try:
            tflops = _first_mode(measure_peak())
            row = "/".join(results.TENSOR_PEAK_ROW)
            shown = (f"{row} timed in this run ({shown})" if tflops
                     else f"{shown}; {row} timed in this run gave no correct TFLOP/s")
        except Exception as e:  # noqa: BLE001
            shown = f"{shown}; not measured either ({type(e).__name__}: {e})"
    return gbps, tflops, f"{what}; tensor peak: {shown}"


def run_case(cfg, fmt, kind, t, base, *, replays, ceiling_gbps, tflops, compile_bf16, timeline=True,
             log=print) -> dict:
    names = layer_torch.registered()
    case = make_case(cfg, fmt, kind, t, base)
    r = len(case.sets)
    log(f"{fmt} {case_name(kind, t)}: {r} rotated copies")
    owner = layer_torch.workbook_owner(fmt, t, names, prompt=case.sets[0].meta.prompt)
    wb = layer_torch.workbook_steps(cfg, fmt, t, names)
    check = verify(case, wb)
    log(f"  workbook layer vs reference: rel error {check['rel_error']:.3g} "
        f"(tolerance {check['tolerance']}): {'ok' if check['correct'] else 'WRONG'}")
    costs = models(cfg, fmt, kind, t)
    kernels = per_kernel(case, wb, costs, owner, ceiling_gbps, tflops, replays, log)
    nbytes, flops = layer_bound(cfg, fmt, kind, t)
    # The whole layers, timed side by side (time_graphs): the waterfall's, the production one
    # (checked first, as the workbook layer is: a peer timed unchecked could be timing wrong work),
    # the runner, torch.compile.
    layers = waterfall(case, wb, swappable(fmt, owner))
    makers = [(f"waterfall {name}", lambda s=steps: body_of(case, s)) for name, steps in layers]

    def checked_production() -> dict:
        p_steps, p_what = layer_torch.production_steps(cfg, fmt)
        p_check = verify(case, p_steps)
        log(f"  production layer vs reference: rel error {p_check['rel_error']:.3g}: "
            f"{'ok' if p_check['correct'] else 'WRONG'}")
        makers.append(("production", lambda: body_of(case, p_steps)))
        return {"kernels": p_what, "check": p_check}

    production = timed("production", checked_production, log)  # its reason where it cannot run
    makers.append(("runner", lambda: runner_body(case)))
    if fmt == "bf16" and compile_bf16:
        makers.append(("torch.compile", lambda: compiled_bf16(case)))
    timed_rows = time_graphs(makers, r, replays, log)
    fall = [{"swapped": name, **timed_rows[f"waterfall {name}"]} for name, _ in layers]
    for row in fall:
        log(f"  waterfall {row['swapped']}: {row['graph_us']}")
    whole = {"workbook": fall[-1]}
    whole["workbook"]["correct"] = check["correct"]
    whole["torch_eager"] = fall[0]
    whole["production"] = {**timed_rows["production"], **production} if "kernels" in production else production
    whole["runner"] = timed_rows["runner"]
    if fmt == "bf16" and compile_bf16:
        whole["torch_compile"] = timed_rows["torch.compile"]
    for who, row in whole.items():
        log(f"  {who}: {row.get('graph_us')}")
    inside = (timed("in the layer", lambda: in_layer(body_of(case, wb), r), log) if timeline else
              {"graph_us": None, "skipped": "--no-timeline"})
    after = verify(case, wb, which=r - 1)
    b_us = bound_us(nbytes, flops, ceiling_gbps, tflops)
    us = whole["workbook"].get("graph_us")
    summed = sum(k["graph_us"] for k in kernels if k.get("graph_us")) if kernels else None
    return {
        "format": fmt, "kind": kind, "t": t, "context": context_of(kind, t), "case": case_name(kind, t),
        "rotations": r, "check": check, "check_after": after, "owner": owner,
        "torch_paths": dict(layer_torch.TORCH_PATHS), "waterfall": fall, "kernels": kernels,
        "kernel_sum_us": summed, "in_layer": inside, "layer": whole, "bound_bytes": nbytes, "bound_flops": flops,
        "bound_us": b_us, "pct_bound": 100.0 * b_us / us if us and b_us else None,
        "unaccounted": ("allocations, gaps between kernels" if layer_torch.writes_cache(wb["rope"]) else
                        "q, k made contiguous for RoPE (T > 1), allocations, gaps between kernels"),
    }


def _us(run: dict, fmt: str, case: str, who: str) -> float | None:
    for c in run["cases"]:
        if c["format"] == fmt and c["case"] == case:
            return c["layer"].get(who, {}).get("graph_us")
    return None


def goals(run: dict) -> list[dict]:
    """The issue's goals, each with its measured value (None where a row is missing)."""
    out = []

    def ratio(a, b):
        return b / a if a and b else None

    def add(goal, value, target, unit="x"):
        met = None if value is None else value >= target
        out.append({"goal": goal, "value": value, "target": target, "unit": unit, "met": met})

    for c in run["cases"]:
        add(f"{c['format']} {c['case']}: workbook vs production layer",
            ratio(c["layer"]["workbook"].get("graph_us"), c["layer"].get("production", {}).get("graph_us")), 1.0)
    t1 = case_name("decode", 1)
    w4 = next((c for c in run["cases"] if c["format"] == "w4a16" and c["case"] == t1), None)
    add("w4a16 decode T=1: % of the layer's byte bound", w4 and w4["pct_bound"], GOAL_T1_BOUND_PCT, "%")
    add("w4a16 decode T=1 vs torch.compile BF16",
        ratio(_us(run, "w4a16", t1, "workbook"), _us(run, "bf16", t1, "torch_compile")), 2.5)
    t32 = case_name("decode", 32)
    add("w4a16 decode T=32 vs torch.compile BF16",
        ratio(_us(run, "w4a16", t32, "workbook"), _us(run, "bf16", t32, "torch_compile")), 2.0)
    pre = case_name("prefill", 2048)
    add("fp8 prefill T=2048 vs torch.compile BF16",
        ratio(_us(run, "fp8", pre, "workbook"), _us(run, "bf16", pre, "torch_compile")), 1.3)
    for c in run["cases"]:
        us, summed = c["layer"]["workbook"].get("graph_us"), c["kernel_sum_us"]
        dev = abs(summed - us) / us * 100.0 if us and summed else None
        out.append({"goal": f"{c['format']} {c['case']}: per-kernel sum within 10% of the layer",
                    "value": dev, "target": 10.0, "unit": "% off", "met": None if dev is None else dev <= 10.0})
    return out


def print_run(run: dict, out=sys.stdout) -> None:
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
    for c in run["cases"]:
        print(f"\n== {c['format']} {c['case']} ({c['rotations']} copies; check "
              f"{'ok' if c['check']['correct'] else 'WRONG'}, rel error {c['check']['rel_error']:.2g})", file=out)
        print("waterfall (µs per layer, in a graph):", file=out)
        for w in c["waterfall"]:
            print(f"  {w['swapped']:<14} {f(w.get('graph_us'))}", file=out)
        print(f"{'step':<14} {'µs':>8} {'MB':>9} {'% bound':>8}  kernel", file=out)
        for k in c["kernels"]:
            print(f"  {k['step']:<12} {f(k.get('graph_us')):>8} {k['model_bytes'] / 1e6:>9.2f} "
                  f"{f(k.get('pct_bound')):>8}  {k['kernel']}", file=out)
        lay = c["layer"]
        print(f"layer: workbook {f(lay['workbook'].get('graph_us'))} µs, sum of kernels "
              f"{f(c['kernel_sum_us'])}, bound {f(c['bound_us'])} µs ({f(c['pct_bound'])}% of it)", file=out)
        inside = c.get("in_layer") or {}
        if "kernels_us" in inside:
            print(f"in the layer (one replay profiled): kernels {f(inside['kernels_us'])} µs, between "
                  f"them {f(inside['between_us'])}, {f(inside['launches'], 0)} launches", file=out)
            for k in inside["by_kernel"][:12]:
                print(f"  {f(k['us']):>8}  x{f(k['launches'], 0)}  {k['kernel'][:90]}", file=out)
        elif inside:
            print(f"in the layer: not profiled ({inside.get('skipped') or inside.get('error')})", file=out)
        for who in ("torch_eager", "torch_compile", "production", "runner"):
            if who in lay:
                why = lay[who].get("skipped") or lay[who].get("error") or ""
                print(f"  {who:<14} {f(lay[who].get('graph_us'))} µs {why}", file=out)
    print("\ngoals:", file=out)
    for g in run["goals"]:
        met = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        print(f"  {g['goal']:<58} {f(g['value'], 2):>8} {g['unit']} (target {g['target']}) {met}", file=out)


def stamped(cases: list[dict], run: dict) -> list[dict]:
    """Each case with the commit and date of the run that measured it (its own where it has them,
    else the run's): a merged file's header names only its last part."""
    return [dict(c, commit=c.get("commit", run.get("commit")), date=c.get("date", run.get("date")))
            for c in cases]


def merge(recorded: dict, run: dict) -> dict:
    """The recorded run with this run's (format, case) rows in place of its own and the goals
    recomputed, every case stamped with its own run's commit and date; the run's GPU must be the
    recorded one's."""
    if recorded.get("gpu") != run["gpu"]:
        raise ValueError(f"cannot merge a {run['gpu']} run into a {recorded.get('gpu')} one")
    new = {(c["format"], c["case"]) for c in run["cases"]}
    kept = [c for c in recorded.get("cases", []) if (c["format"], c["case"]) not in new]
    merged = dict(run, cases=stamped(kept, recorded) + stamped(run["cases"], run))
    merged["goals"] = goals(merged)
    return merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="decode T = 1 only, few replays")
    ap.add_argument("--formats", default=",".join(layer_torch.FORMATS))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (minutes)")
    ap.add_argument("--no-timeline", action="store_true",
                    help="skip the layer's own timeline (torch.profiler; off under Nsight Compute)")
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--cases", help="only these cases, e.g. 'decode 1,prefill 2048' (default: all)")
    ap.add_argument("--merge", action="store_true",
                    help="with --write-results: keep the recorded run's other (format, case) rows")
    ap.add_argument("--json", help="also write the run here")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("layer_bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    from lkw import bench

    cfg = dl.LLAMA3_8B
    cases = QUICK_CASES if args.quick else CASES
    if args.cases:  # a device call holds a part of the matrix: run it in parts, --merge each
        cases = [(kind, int(t)) for kind, t in (c.split() for c in args.cases.split(","))]
    replays = QUICK_REPLAYS if args.quick else REPLAYS
    gbps, tflops, what = ceiling()
    print(f"{torch.cuda.get_device_name()}: {what} ({gbps} GB/s, {tflops} TFLOP/s)")
    run = {"chapter": CHAPTER, "gpu": torch.cuda.get_device_name(), "driver": bench._driver(),
           "cuda": torch.version.cuda, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "commit": bench._commit(), "timing_modes": ["graph"], "headline": "graph",
           "ceiling_gbps": gbps, "tensor_tflops": tflops, "ceiling_note": what,
           "peer_libraries": peers.status(), "cases": []}
    for fmt in args.formats.split(","):
        base = layer_torch.layer_weights(cfg, fmt, "cuda", seed=0)
        for kind, t in cases:
            run["cases"].append(run_case(cfg, fmt, kind, t, base, replays=replays, ceiling_gbps=gbps,
                                         tflops=tflops * (2 if fmt == "fp8" else 1) if tflops else None,
                                         compile_bf16=not args.no_compile,
                                         timeline=not args.no_timeline))
            torch.cuda.empty_cache()
        del base
    run["cases"] = stamped(run["cases"], run)
    run["goals"] = goals(run)
    print_run(run)
    text = json.dumps(run, indent=1, default=str)
    if args.json:
        Path(args.json).write_text(text)
    if args.write_results:
        path = results.results_dir() / results.gpu_slug(run["gpu"]) / f"{CHAPTER}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        if args.merge and path.is_file():
            text = json.dumps(merge(json.loads(path.read_text()), run), indent=1, default=str)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
