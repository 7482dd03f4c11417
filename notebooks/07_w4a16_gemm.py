# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · W4A16 GEMM: INT4 weights on the tensor cores, from decode to prefill
#
# Chapter 06 made the INT4 product fast for one to sixteen tokens, where reading the weights is
# the whole cost. Chapter 07 takes the same product, y[M, N] = x[M, K] · (s·(q − 8))ᵀ with 4-bit
# codes q and a BF16 scale s per group of G = 128 input channels, to every M an LLM runs: one
# token at decode, thousands at prefill. The question: over which range of M does a GEMM on INT4
# weights beat cuBLAS on BF16 weights, and by how much, against what the roofline allows? This
# notebook looks at the two Llama-70B MLP shapes, 28672 × 8192 and 8192 × 28672 (N × K), in the
# headline timing mode: launches in a CUDA graph.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/07_w4a16_gemm.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 07_w4a16_gemm` and shows what it just measured.
#
# The full table (every shape, every timing mode) is in the book's Results section, or
# `print(results.text_table(data))` after the cells below.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import results  # noqa: E402

CHAPTER = "07_w4a16_gemm"
SHAPES_70B = [(28672, 8192), (8192, 28672)]  # (N, K) of the Llama-70B MLP
G = 128  # input channels per scale
MS = (1, 16, 64, 256, 1024, 4096)  # the batch sizes of the model below

# %% [markdown]
# ## The bound, before any measurement
#
# Bytes per GEMM, each moved once: the INT4 codes N·K/2, the BF16 scales N·(K/G)·2, x M·K·2 and
# y M·N·2. cuBLAS on BF16 weights moves N·K·2 in place of the first two. Both do 2·M·N·K FLOPs.
# Per byte of INT4 weights that is about 4·M FLOP, per byte of BF16 weights about M: the same
# product has four times the arithmetic intensity on INT4 weights.
#
# A kernel can run no faster than the slower of its two roofs: its bytes at the copy bandwidth,
# its FLOPs at the tensor cores' rate. Both roofs are measured, not taken from a data sheet: the
# bandwidth is the run's copy ceiling, the tensor rate is what cuBLAS reaches on BF16 at the run's
# largest M. The table below needs neither: it is the model alone.

# %%
def int4_weight_bytes(n, k, g=G):  # the codes and their scales
    return n * k // 2 + n * (k // g) * 2


def int4_bytes(m, n, k, g=G):
    return int4_weight_bytes(n, k, g) + m * k * 2 + m * n * 2


def bf16_bytes(m, n, k):
    return n * k * 2 + m * k * 2 + m * n * 2


def gemm_flops(m, n, k):
    return 2 * m * n * k


def bound_us(nbytes, flops, gbps, tflops):
    """Time at the roofline: the slower of moving the bytes and doing the FLOPs (µs)."""
    return np.maximum(nbytes / (gbps * 1e3), flops / (tflops * 1e6))


def ideal_speedup(m, n, k, gbps, tflops):
    """The BF16 GEMM's time at its bound over the INT4 GEMM's at its own."""
    f = gemm_flops(m, n, k)
    return bound_us(bf16_bytes(m, n, k), f, gbps, tflops) / bound_us(int4_bytes(m, n, k), f,
                                                                      gbps, tflops)


def ridge_m(weight_bytes, n, k, gbps, tflops):
    """The M where weight_bytes + 2·M·(K + N) bytes take as long as 2·M·N·K FLOPs: below it the
    GEMM is memory-bound, above it compute-bound."""
    per_m = 2 * n * k / (tflops * 1e6) - 2 * (k + n) / (gbps * 1e3)
    return weight_bytes / (gbps * 1e3) / per_m if per_m > 0 else None


for n, k in SHAPES_70B:
    print(f"{n} × {k} (N × K), G = {G}")
    print(f"  {'M':>6}{'INT4 MB':>10}{'BF16 MB':>10}{'GFLOP':>10}{'INT4 FLOP/B':>13}"
          f"{'BF16 FLOP/B':>13}")
    for m in MS:
        b4, b16, f = int4_bytes(m, n, k), bf16_bytes(m, n, k), gemm_flops(m, n, k)
        print(f"  {m:>6}{b4 / 1e6:>10.1f}{b16 / 1e6:>10.1f}{f / 1e9:>10.1f}{f / b4:>13.1f}"
              f"{f / b16:>13.1f}")

# %% [markdown]
# ## The run
#
# Which GPU and commit, and what the run holds: the teaching path on the natural INT4 words (op
# `w4a16_gemm`: `v0` … `v2`) and on the offline-repacked words (op `w4a16r_gemm`: `v3` … `v8`),
# and the peers, measured on the same codes and scales, each packed by its own library: cuBLAS on
# the dequantized BF16 weights (`torch_matmul`), torch's INT4 kernel, vLLM's Marlin and Machete,
# and humming.

# %%
data = results.notebook_results(CHAPTER)
if data:
    H = results.headline(data)  # the timing mode the tables lead with: the graph, where timed
    print(results.header_line(data))
    print(f"headline timing: {results.MODE_WORDS[H]}\n")
    seen = {}
    for r in data["rows"]:
        seen.setdefault((r["op"], r["version"]), r)
    for (op, version), r in seen.items():
        print(f"  {r['kind']:<8} {op:<12} {version:<22} {r.get('summary', '')[:70]}")


# %%
def parse(shape):
    return {kv.split("=")[0]: int(kv.split("=")[1]) for kv in shape.split(",")}


def us(row, mode=None):
    return row.get(results.mkey(mode or H, "us")) if row else None


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


if data:
    at = {}  # (op, version, n, k, m) -> row
    for r in data["rows"]:
        s = parse(r["shape"])
        at[(r["op"], r["version"], s["n"], s["k"], s["m"])] = r
    run_shapes = sorted({(n, k) for (_, _, n, k, _) in at}, key=lambda nk: -nk[0] * nk[1])
    SHOWN = [s for s in SHAPES_70B if s in run_shapes] or run_shapes[:2]
    run_ms = sorted({m for (*_, m) in at})
    entries = list(dict.fromkeys((r["op"], r["version"]) for r in data["rows"]
                                 if r["kind"] in ("version", "peer")))
    kinds = {(r["op"], r["version"]): r["kind"] for r in data["rows"]}
    versions = [e for e in entries if kinds[e] == "version"]
    peers = [e for e in entries if kinds[e] == "peer"]
    BF16 = next((e for e in peers if e[1] == "torch_matmul"), None)  # cuBLAS on BF16 weights
    # The repacked path v3 … v8: one fused INT4 kernel each (v0 is a dequant pass, then cuBLAS).
    PATH = [e for e in versions if e[0] == "w4a16r_gemm"] or versions
    BW, _ = results.ceiling_of(data, H)  # GB/s: the copy ceiling in the headline mode

    def row_at(e, n, k, m):
        return at.get((*e, n, k, m)) if e else None

    def speedup(e, n, k, m):
        """cuBLAS BF16's time over this entry's: above 1, the INT4 kernel is the faster."""
        t, t16 = us(row_at(e, n, k, m)), us(row_at(BF16, n, k, m))
        return t16 / t if t and t16 else None

    def best_version(n, k, m, among=None):
        """(µs, entry) of the fastest of `among` (the repacked path) at one shape and M."""
        timed = [(us(row_at(e, n, k, m)), e) for e in among or PATH if us(row_at(e, n, k, m))]
        return min(timed, default=(None, None))

    # (n, k) -> (TFLOP/s, M): cuBLAS BF16 at the largest M of the shape it ran at, the tensor
    # roof; not where that M still left cuBLAS memory-bound (over half its time at the ceiling).
    PEAK, NO_PEAK = {}, {}
    for n, k in SHOWN:
        done = [m for m in run_ms if results.rate(row_at(BF16, n, k, m) or {}, H, "tflops")]
        if done and BW:
            m = done[-1]
            share = bf16_bytes(m, n, k) / (BW * 1e3) / us(row_at(BF16, n, k, m))
            if share < 0.5:
                PEAK[(n, k)] = (results.rate(row_at(BF16, n, k, m), H, "tflops"), m)
            else:
                NO_PEAK[(n, k)] = f"cuBLAS BF16 at its largest M = {m} is memory-bound"

# %% [markdown]
# ## The bound with the measured roofs
#
# Per shape: the two roofs of this run, the M at which each GEMM turns compute-bound (the ridge
# M, where its memory time and its compute time are equal), then per M the memory-bound times of
# INT4 and BF16, the compute-bound time they share, and the ideal speed-up: the BF16 GEMM's time at
# its bound over the INT4 GEMM's at its own. Below the INT4 ridge both are memory-bound and the
# ideal is the byte ratio, close to 4×; past it the INT4 GEMM is compute-bound while the BF16 one is
# still memory-bound, so the ideal falls; past the BF16 ridge both are compute-bound and it is 1×.
# The last line checks the model against the `model_bytes` and `flops` the run recorded.

# %%
if data:
    for n, k in SHOWN:
        if not (BW and (n, k) in PEAK):
            why = NO_PEAK.get((n, k), "no copy ceiling or no cuBLAS BF16 row in this run")
            print(f"{n} × {k}: {why}, so no tensor roof and no bound.")
            continue
        P, m_peak = PEAK[(n, k)]
        r4, r16 = ridge_m(int4_weight_bytes(n, k), n, k, BW, P), ridge_m(2 * n * k, n, k, BW, P)
        print(f"{n} × {k} (N × K): copy ceiling {BW:.0f} GB/s, cuBLAS BF16 {P:.0f} TFLOP/s "
              f"(M = {m_peak}), {results.MODE_WORDS[H]}")
        print(f"  machine ridge {P * 1e3 / BW:.0f} FLOP/byte: INT4 turns compute-bound at "
              f"M ≈ {fmt(r4, '.0f')}, BF16 at M ≈ {fmt(r16, '.0f')}")
        print(f"  {'M':>6}{'INT4 mem µs':>13}{'BF16 mem µs':>13}{'compute µs':>12}{'ideal ×':>9}")
        for m in run_ms:
            f = gemm_flops(m, n, k)
            mem4, mem16 = int4_bytes(m, n, k) / (BW * 1e3), bf16_bytes(m, n, k) / (BW * 1e3)
            print(f"  {m:>6}{mem4:>13.1f}{mem16:>13.1f}{f / (P * 1e6):>12.1f}"
                  f"{ideal_speedup(m, n, k, BW, P):>9.2f}")
        print()
    rows = [r for r in data["rows"] if r.get("model_bytes")]
    off = []
    for r in rows:
        s = parse(r["shape"])
        model = (int4_bytes(s["m"], s["n"], s["k"], s["g"]), gemm_flops(s["m"], s["n"], s["k"]))
        if (r["model_bytes"], r.get("flops")) != model:
            off.append(r["version"])
    print(f"The model above gives the run's model_bytes and flops for {len(rows) - len(off)} of "
          f"{len(rows)} rows" + (f"; not for {sorted(set(off))}" if off else "."))

# %% [markdown]
# ## Graph times over M
#
# Per shape, each version and peer: µs per launch in the headline mode at every M of the run; `*`
# marks the fastest version of the whole path (`v0` … `v8`) at each M, `—` a pair that was not
# timed (torch's INT4 kernel stops short of the largest M). Where `v0` is the fastest, the fused
# kernels lose to a dequantization pass followed by cuBLAS.

# %%
if data:
    for n, k in SHOWN:
        print(f"{n} × {k} (N × K), µs per launch {results.MODE_WORDS[H]}")
        print(f"  {'op / version':<32}" + "".join(f"{'M=' + str(m):>10}" for m in run_ms))
        for op in dict.fromkeys(op for op, _ in entries):
            print(op)
            for e in sorted((e for e in entries if e[0] == op), key=lambda e: e not in versions):
                cells = []
                for m in run_ms:
                    t = us(row_at(e, n, k, m))
                    star = "*" if t and best_version(n, k, m, versions)[1] == e else " "
                    cells.append(f"{fmt(t, '.1f')}{star}")
                label = e[1] + ("" if e in versions else " (peer)")
                print(f"  {label:<32}" + "".join(f"{c:>10}" for c in cells))
        print()

# %% [markdown]
# ## Speed-up over cuBLAS BF16
#
# The headline figure: cuBLAS's time on BF16 weights over each kernel's time, against M, one
# panel per shape. Above the grey line at 1× the INT4 kernel is the faster. Solid: the repacked
# teaching path `v3` … `v8`; dashed: the peers; black: the ideal from the bound above. The thick
# grey line is the best of `v3` … `v8` at each M (the fused INT4 kernels; `v0` … `v2` are in the
# table above), and the red star marks its crossover, where it falls below 1×. The dotted and
# dash-dotted verticals are the ridge M of INT4 and of BF16.

# %%
def crossover(pts):
    """The M where a speed-up curve [(M, speed-up)] first falls below 1, interpolated on log
    scales between the two measured Ms around it; None if it never crosses from above."""
    for (m0, s0), (m1, s1) in zip(pts, pts[1:]):
        if s0 >= 1 > s1:
            f = np.log(s0) / (np.log(s0) - np.log(s1))
            return m0 * (m1 / m0) ** f
    return None


def best_curve(n, k):
    pts = [(m, best_version(n, k, m)) for m in run_ms]
    return [(m, us(row_at(BF16, n, k, m)) / t) for m, (t, _) in pts if t and row_at(BF16, n, k, m)]


PEER_STYLES = ["tab:red", "tab:purple", "tab:orange", "tab:brown", "tab:pink"]

if data and BF16:
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(PATH), 1)))
    fig, axes = plt.subplots(1, len(SHOWN), figsize=(6.5 * len(SHOWN), 4.8), squeeze=False)
    for ax, (n, k) in zip(axes[0], SHOWN):
        for style, group in (("o-", zip(colors, PATH)),
                             ("s--", zip(PEER_STYLES, [e for e in peers if e != BF16]))):
            for color, e in group:
                pts = [(m, speedup(e, n, k, m)) for m in run_ms]
                pts = [(m, s) for m, s in pts if s]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, ms=4, label=e[1], alpha=0.85)
        best = best_curve(n, k)
        if best:
            ax.plot(*zip(*best), "-", color="grey", lw=5, alpha=0.35, label="best of the path")
        if BW and (n, k) in PEAK:
            P = PEAK[(n, k)][0]
            grid = np.geomspace(run_ms[0], run_ms[-1], 200)
            ideal = [ideal_speedup(m, n, k, BW, P) for m in grid]
            ax.plot(grid, ideal, "k-", lw=1.8, label="ideal (roofline)")
            for wb, ls, name in ((int4_weight_bytes(n, k), ":", "INT4"), (2 * n * k, "-.", "BF16")):
                r = ridge_m(wb, n, k, BW, P)
                if r:
                    ax.axvline(r, color="k", ls=ls, lw=1, label=f"ridge M of {name}")
        mx = crossover(best)
        if mx:
            ax.plot([mx], [1], "*", color="red", ms=16, zorder=5, label="crossover")
            ax.annotate(f"M ≈ {mx:.0f}", (mx, 1), textcoords="offset points", xytext=(10, 12),
                        color="red", bbox={"fc": "white", "ec": "none", "alpha": 0.8})
        ax.axhline(1, color="grey", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.set_xticks(run_ms, [str(m) for m in run_ms])
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel(f"cuBLAS BF16 time / kernel time, {results.MODE_WORDS[H]}")
        ax.set_title(f"N = {n}, K = {k}", fontsize=10)
        ax.grid(True, which="both", lw=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0), ncol=5, fontsize=8)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ### The crossover against the ridge
#
# The ideal curve never goes below 1×: at the roofline an INT4 GEMM is never slower than a BF16
# one, it only stops being faster once both are compute-bound, past the BF16 ridge. Between the
# INT4 ridge and the BF16 ridge the INT4 kernel is already bound by the tensor cores while cuBLAS
# still waits on its weights, so the INT4 advantage is BF16's memory time over INT4's compute
# time, and it shrinks as 1/M.
#
# A real INT4 kernel reaches only a share e of cuBLAS's tensor rate (the unpack costs
# instructions, the tiles are chosen for small M too), so its speed-up in that band is e times the
# ideal, and it crosses 1× where BF16's memory time equals the INT4 kernel's compute time at
# e·P: the BF16 ridge M computed with the tensor roof lowered to e·P, earlier than the BF16 ridge.
# Where the kernel's share of cuBLAS's rate is lower at those M than at the largest, the measured
# crossover comes earlier still. Below the INT4 ridge the measured speed-up is instead limited by
# how much of the copy ceiling the kernel reaches. The cell below prints, per shape: both ridges,
# e of the best of `v3` … `v8` at the largest M, the crossover this predicts and the one measured
# (interpolated between the two Ms around it), then the measured crossover of each peer.

# %%
if data and BF16:
    for n, k in SHOWN:
        if not (BW and (n, k) in PEAK):
            continue
        P, m_peak = PEAK[(n, k)]
        r4, r16 = ridge_m(int4_weight_bytes(n, k), n, k, BW, P), ridge_m(2 * n * k, n, k, BW, P)
        print(f"{n} × {k}: ridge M of INT4 ≈ {fmt(r4, '.0f')}, of BF16 ≈ {fmt(r16, '.0f')}")
        t_big, e_big = best_version(n, k, m_peak)
        t16 = us(row_at(BF16, n, k, m_peak))
        if t_big and t16:
            e = t16 / t_big
            pred = ridge_m(2 * n * k, n, k, BW, e * P)
            print(f"  best of the path at M = {m_peak}: {e_big[1]}, e = {e:.2f} of cuBLAS's "
                  f"rate; predicted crossover M ≈ {fmt(pred, '.0f')}")
        best = best_curve(n, k)
        mx = crossover(best)
        where = (f"M ≈ {mx:.0f}" if mx else "below 1× at every M" if best and best[0][1] < 1
                 else "not within the run")
        print(f"  measured crossover of the best of the path: {where}")
        for e in peers:
            if e == BF16:
                continue
            pts = [(m, speedup(e, n, k, m)) for m in run_ms]
            pts = [(m, s) for m, s in pts if s]
            mx = crossover(pts)
            where = (f"M ≈ {mx:.0f}" if mx else "below 1× at every M" if pts and pts[0][1] < 1
                     else f"never below 1× up to M = {pts[-1][0]}" if pts else "not timed")
            print(f"  {e[1]:<24} crossover {where}")
        print()

# %% [markdown]
# ## TFLOP/s over M, and the memory bound at small M
#
# The same runs as rates: TFLOP/s against M for `v3` … `v8` and the peers, with cuBLAS BF16 as the
# thick black line and the INT4 roofline (the slower of the copy ceiling times the INT4
# intensity, and cuBLAS's rate) dotted. That roof is measured, not the hardware's peak: a kernel
# tuned for another M than cuBLAS's largest can edge past it. At small M the rate is not the
# point, bandwidth is: the table after the figure gives each kernel's memory-bound time over its
# measured time, in percent, at the small Ms of the run (cuBLAS against its own BF16 bytes, every
# other row against the INT4 bytes). The bound is the copy ceiling, a stream of half reads and
# half writes; a stream that almost only reads, as a GEMV-shaped GEMM does, can pass 100%.

# %%
if data and BF16:
    fig, axes = plt.subplots(1, len(SHOWN), figsize=(6.5 * len(SHOWN), 4.4), squeeze=False)
    for ax, (n, k) in zip(axes[0], SHOWN):
        lines = [(e, c, "o-", 1.2) for e, c in zip(PATH, colors)]
        lines += [(e, c, "s--", 1.2) for e, c in zip([e for e in peers if e != BF16], PEER_STYLES)]
        lines.append((BF16, "black", "s-", 2.5))
        for e, color, style, lw in lines:
            pts = [(m, results.rate(row_at(e, n, k, m) or {}, H, "tflops")) for m in run_ms]
            pts = [(m, t) for m, t in pts if t]
            if pts:
                label = "cuBLAS BF16" if e == BF16 else e[1]
                ax.plot(*zip(*pts), style, color=color, lw=lw, ms=4, label=label, alpha=0.85)
        if BW and (n, k) in PEAK:
            grid = np.geomspace(run_ms[0], run_ms[-1], 200)
            roof = [gemm_flops(m, n, k) / bound_us(int4_bytes(m, n, k), gemm_flops(m, n, k), BW,
                                                    PEAK[(n, k)][0]) / 1e6 for m in grid]
            ax.plot(grid, roof, "k:", lw=1.5, label="INT4 roofline")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xticks(run_ms, [str(m) for m in run_ms])
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel(f"TFLOP/s, {results.MODE_WORDS[H]}")
        ax.set_title(f"N = {n}, K = {k}", fontsize=10)
        ax.grid(True, which="both", lw=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    plt.tight_layout()
    plt.show()

# %%
if data and BW:
    small = [m for m in run_ms if m <= 64][:3] or run_ms[:1]
    print(f"% of the memory bound (its bytes at {BW:.0f} GB/s / its time), {results.MODE_WORDS[H]}")
    print(" " * 32 + "".join(f"{f'{n} × {k}':^{8 * len(small)}}" for n, k in SHOWN))
    print(f"  {'version / peer':<30}" + "".join(f"{'M=' + str(m):>8}" for _ in SHOWN
                                                   for m in small))
    for e in sorted(versions + peers, key=lambda e: e not in versions):
        cells = []
        for n, k in SHOWN:
            for m in small:
                t = us(row_at(e, n, k, m))
                nbytes = (bf16_bytes if e == BF16 else int4_bytes)(m, n, k)
                cells.append(fmt(100 * nbytes / (BW * 1e3) / t if t else None, ".1f"))
        label = e[1] + ("" if e in versions else " (peer)")
        print(f"  {label:<30}" + "".join(f"{c:>8}" for c in cells))

# %% [markdown]
# ## Try
#
# - Lower the tensor roof in `ridge_m` to the TFLOP/s of `v3` at the largest M instead of the
#   best of the path's: where would its crossover be, and does the measured one agree?
# - Redo the speed-up figure with `H = "one_launch"`: at which M does the CPU's launch cost,
#   which a CUDA graph hides, change which kernel is the fastest?
#
# ## Summary
#
# One table per op: each version and peer at every shape of the run in the headline mode, and its
# % of the copy ceiling at the largest shape (for the compute-bound shapes, the TFLOP/s above say
# more).

# %%
if data:
    print(results.summary_text(data))
