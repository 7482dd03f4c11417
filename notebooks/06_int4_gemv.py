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
# # 06 · INT4 GEMV: eight versions against cuBLAS BF16, Marlin and Machete
#
# The question of weight-only quantization at decode: how much faster is a GEMV on INT4 weights
# than cuBLAS on BF16 weights, for M = 1 … 16 tokens, and how close does the teaching path
# (`v0_warp_per_column` … `v7_tiled_stream`) come to the bandwidth bound and to vLLM's production
# INT4 kernels? This notebook looks at the two Llama-70B MLP shapes, 28672 × 8192 and
# 8192 × 28672 (N × K), in the headline timing mode: launches in a CUDA graph.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/06_int4_gemv.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 06_int4_gemv` and shows what it just measured.
#
# The full table (every shape, every timing mode, DRAM bytes) is in the book's Results section, or
# `print(results.text_table(data))` after the cells below.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import results  # noqa: E402

CHAPTER = "06_int4_gemv"
SHAPES_70B = [(28672, 8192), (8192, 28672)]  # (N, K) of the Llama-70B MLP
MS = (1, 8, 16)  # the batch sizes of the summary

# %% [markdown]
# ## The bound, before any measurement
#
# Bytes per GEMV: INT4 reads N·K/2 of weights plus a BF16 scale per 128 of them; BF16 reads N·K·2.
# Both read x (M·K·2) and write y (M·N·2). At the bandwidth bound the speed-up INT4 can buy is the
# ratio of the two byte counts: the ceiling of every ×BF16 figure below.

# %%
def ideal_speedup(m, n, k, g=128):
    act = 2 * m * k + 2 * m * n
    return (2 * n * k + act) / (n * k / 2 + n * (k // g) * 2 + act)


for n, k in SHAPES_70B:
    cells = "  ".join(f"M={m}: {ideal_speedup(m, n, k):.2f}×" for m in MS)
    print(f"{n:>5} × {k:<5}  ideal INT4 speed-up over BF16  {cells}")

# %% [markdown]
# ## The run
#
# Which GPU and commit, and what the run holds: the teaching path's versions (op `int4_gemv` for
# `v0`, `int4i_gemv` for the interleaved words of `v1` … `v6`, `int4i_zp_gemv` for `v3` with zero
# points, `int4t_gemv` for `v7`'s tiled words), the ablation entries (`v7` with one knob off) and
# the peers.

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
        print(f"  {r['kind']:<8} {op:<14} {version:<28} {r.get('summary', '')[:70]}")


# %%
def parse(shape):
    return {kv.split("=")[0]: int(kv.split("=")[1]) for kv in shape.split(",")}


def us(row, mode=None):
    return row.get(results.mkey(mode or H, "us")) if row else None


def is_bf16(row):  # cuBLAS on BF16 weights: op bf16_gemv, or torch's x @ W^T on the dequantized W
    return row["op"] == "bf16_gemv" or row["version"] == "torch_matmul"


if data:
    # (op, version, n, k, m) -> row; the shapes of the run; the fastest BF16 and each named peer.
    at = {}
    for r in data["rows"]:
        s = parse(r["shape"])
        at[(r["op"], r["version"], s["n"], s["k"], s["m"])] = r
    run_shapes = sorted({(n, k) for (_, _, n, k, _) in at}, key=lambda nk: -nk[0] * nk[1])
    # The 70B shapes, or (a run without them) its two largest.
    SHOWN = [s for s in SHAPES_70B if s in run_shapes] or run_shapes[:2]
    run_ms = sorted({m for (*_, m) in at})

    def peer_time(match, n, k, m):
        """The fastest time of the rows `match` accepts at one shape and M, and that row."""
        cands = [r for (op, v, n2, k2, m2), r in at.items() if (n2, k2, m2) == (n, k, m)
                 and match(r) and us(r)]
        best = min(cands, key=us, default=None)
        return (us(best), best) if best else (None, None)

    PEERS = {  # the columns of ratios: their time / ours
        "BF16": is_bf16,
        "Marlin": lambda r: "marlin" in r["version"],
        "Machete": lambda r: "machete" in r["version"],
    }
    entries = list(dict.fromkeys((r["op"], r["version"]) for r in data["rows"]
                                 if r["kind"] in ("version", "peer")))
    kinds = {(r["op"], r["version"]): r["kind"] for r in data["rows"]}
    versions = [e for e in entries if kinds[e] == "version"]
    path = [e for e in versions if e[0] != "int4i_zp_gemv"]  # one op per version: no zero points

# %% [markdown]
# ## Summary: the 70B shapes at M = 1, 8 and 16
#
# Per op, each version and peer in the headline mode: µs per launch, % of the copy ceiling, and
# the ratio *their time / ours* against the faster of the BF16 peers (cuBLAS, torch's matmul on
# the dequantized BF16 weights), Marlin and Machete: above 1, this row is the faster.

# %%
def fmt(x, spec):
    return "—" if x is None else format(x, spec)


if data:
    for n, k in SHOWN:
        groups = "".join(f"{'M = ' + str(m):^38}" for m in MS)
        print(f"{n} × {k} (N × K), {results.MODE_WORDS[H]}".ljust(36) + groups)
        sub = f"{'µs':>9}{'%ceil':>7} {'×BF16':>7}{'×Marl':>7}{'×Mach':>7}"
        print(f"{'op / version':<36}" + "".join(f"{sub:>38}" for _ in MS))
        marks = set()
        for op in dict.fromkeys(op for op, _ in entries):
            print(op)
            mine = [e for e in entries if e[0] == op]
            mine.sort(key=lambda e: e not in versions)  # versions, then peers
            for e in mine:
                cells = []
                for m in MS:
                    row = at.get((*e, n, k, m))
                    t = us(row)
                    pct = results.pct_ceiling(row, H, data) if row else None
                    mark = results.above_ceiling(row, data, H) if row else None
                    marks.add(mark)
                    ratios = []
                    for name, match in PEERS.items():
                        pt, prow = peer_time(match, n, k, m)
                        ratios.append(pt / t if pt and t and prow is not row else None)
                    sign = "⚠" if mark == "suspect" else "†" if mark else " "
                    cells.append(f"{fmt(t, '.2f'):>9}{fmt(pct, '.1f'):>7}{sign}"
                                 + "".join(f"{fmt(x, '.2f'):>7}" for x in ratios))
                label = e[1] + ("" if e in versions else " (peer)")
                print(f"  {label:<34}" + "".join(f"{c:>38}" for c in cells))
        print()
    if marks & {"suspect", "explained"}:
        print("⚠ / †: above 100% of the copy ceiling; ⚠ without a DRAM measurement that settles it "
              "(the book's table notes say what each mark means).")
    print("—: not timed in this mode, not in this run, or the peer itself.")

# %% [markdown]
# ## Time against M
#
# One panel per 70B shape, both axes logarithmic: the teaching path's milestones (`v0`'s scalar
# kernel, `v2`'s memory side done right on the CUDA cores, `v3`'s tensor cores, `v6`'s pipeline
# and `v7`'s tiled stream) against cuBLAS on BF16 weights and vLLM's Marlin and Machete, all in
# the headline mode. The dashed line is the INT4 byte model at the copy ceiling: no INT4 kernel
# can run below it. The table above has every version.

# %%
MILESTONES = ("v0_", "v2_", "v3_", "v6_", "v7_")
PEER_STYLES = {"BF16": ("black", "s", "cuBLAS BF16"), "Marlin": ("tab:red", "^", "vLLM Marlin"),
               "Machete": ("tab:purple", "v", "vLLM Machete")}

if data:
    plotted = [e for e in path if e[1].startswith(MILESTONES)]
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(plotted), 1)))
    top, _ = results.ceiling_of(data, H)
    fig, axes = plt.subplots(1, len(SHOWN), figsize=(6.5 * len(SHOWN), 4.6), squeeze=False)
    for ax, (n, k) in zip(axes[0], SHOWN):
        for color, e in zip(colors, plotted):
            pts = [(m, us(at.get((*e, n, k, m)))) for m in run_ms]
            pts = [(m, t) for m, t in pts if t]
            if pts:
                ax.plot(*zip(*pts), "o-", color=color, label=f"{e[0]}/{e[1]}")
        for name, (color, marker, label) in PEER_STYLES.items():
            match = (lambda r: r["op"] == "bf16_gemv") if name == "BF16" else PEERS[name]
            pts = [(m, peer_time(match, n, k, m)[0]) for m in run_ms]
            pts = [(m, t) for m, t in pts if t]
            if pts:
                ax.plot(*zip(*pts), marker + "--", color=color, label=label, alpha=0.8)
        bound = []  # the byte model of the path's first version, at the ceiling of the mode
        for m in run_ms:
            row = next((at[(*e, n, k, m)] for e in path if (*e, n, k, m) in at), None)
            if top and row and row.get("model_bytes"):
                bound.append((m, row["model_bytes"] / (top * 1e3)))
        if bound:
            ax.plot(*zip(*bound), "k:", lw=1.5, label="INT4 bytes at the copy ceiling")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(plt.FuncFormatter(  # label 2, 3 and 5 · 10^j only
            lambda v, _: f"{v:g}" if round(v / 10 ** np.floor(np.log10(v))) in (2, 3, 5) else ""))
        ax.set_xticks(run_ms, [str(m) for m in run_ms])
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel(f"µs per launch, {results.MODE_WORDS[H]}")
        ax.set_title(f"N = {n}, K = {k}", fontsize=10)
        ax.grid(True, which="both", lw=0.3)
    axes[0][0].legend(fontsize=7)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ## The knobs (ablation)
#
# Each ablation entry is `v7` with one knob of its `Stream` off, the same result bit for bit:
# `no_pdl` launches it as an ordinary kernel (no programmatic dependent launch), `no_evict_first`
# copies the weights under the default L2 policy. Per shape at M = 1 and 16, every timing mode:
# `v7`'s µs → the knob off (change; positive: the knob off is slower).

# %%
if data:
    pairs = results.ablation_rows(data)
    if not pairs:
        print("No ablation entry was measured in this run.")
    else:
        print((f"{'shape':<26}{'knob off':<18}" + "".join(f"{results.MODE_WORDS[m] + ' µs':<26}"
                                                          for m in results.MODES)).rstrip())
        effect = {}
        for v, r in pairs:
            knob = r["version"][len("ablation_"):].split("_", 1)[1]
            cells = []
            for mode in results.MODES:
                a, b = us(v, mode), us(r, mode)
                if a and b:
                    effect.setdefault((knob, mode), []).append(100 * (b / a - 1))
                cells.append(f"{a:.2f} → {b:.2f} ({100 * (b / a - 1):+.1f}%)" if a and b else "—")
            print((f"{r['shape']:<26}{knob:<18}" + "".join(f"{c:<26}" for c in cells)).rstrip())
        print()
        for knob in dict.fromkeys(kn for kn, _ in effect):
            print(f"{knob} against v7, over the shapes above:")
            for mode in results.MODES:
                ch = effect.get((knob, mode))
                if ch:
                    slower = sum(c > 0 for c in ch)
                    print(f"   {results.MODE_WORDS[mode]:<16} slower at {slower:>2} of {len(ch)}, "
                          f"median change {np.median(ch):+.1f}%")

# %% [markdown]
# ## Reading the run
#
# The cell below reads the run and prints, for the 70B shapes:
#
# 1. **The best of the path.** At each M, the fastest teaching-path version in the headline mode:
#    its % of the copy ceiling, its speed-up over the faster BF16 peer beside the ideal (the byte
#    ratio above), and its ratios to Marlin and Machete. The % of the ceiling says how much of the
#    bound is left; the gap between ×BF16 and the ideal says the same from the other side, as far
#    as the BF16 peer streams its weights at the ceiling (its % in the summary).
# 2. **Growth with M.** Each version's time at M = 16 over its time at M = 1. `v0` … `v2` do their
#    multiply-adds on the CUDA cores, one FMA per weight and row of x, so by the design their time
#    should grow with M; from `v3` on the multiply-adds go to the tensor cores and what remains per
#    weight is the unpack, so theirs should stay nearly flat. A ratio far from that expectation is
#    worth a look at the version's section in the book.
# 3. **Timing modes.** At M = 1, each kernel's one-launch time (after an L2 flush, the CPU's launch
#    included) over its graph time: what a kernel pays when nothing hides its launch. `v6` and
#    `v7` start streaming weights before the kernel ahead ends (a dependent launch), which only
#    back-to-back and graph launches can use; Marlin and Machete are called as torch operators
#    from Python, whose cost a CUDA graph removes.
#
# Where production still wins (the book's *Where production kernels win*): at the top of the range
# a GEMM built for reuse beats a GEMV, which chapter 07 takes on.

# %%
def name_of(e):
    return e[1].split("_")[0] if e in versions else e[1]


if data:
    print(f"1. The fastest version of the path, {results.MODE_WORDS[H]}:")
    for n, k in SHOWN:
        for m in MS:
            timed = [(us(at[(*e, n, k, m)]), e) for e in path if us(at.get((*e, n, k, m)))]
            if not timed:
                continue
            t, e = min(timed)
            row = at[(*e, n, k, m)]
            pct = results.pct_ceiling(row, H, data)
            ratios = {name: peer_time(match, n, k, m)[0] for name, match in PEERS.items()}
            text = f"{fmt(pct, '.1f')}% of the ceiling"
            if ratios["BF16"]:
                text += f", {ratios['BF16'] / t:.2f}× BF16 (ideal {ideal_speedup(m, n, k):.2f}×)"
            for name in ("Marlin", "Machete"):
                if ratios[name]:
                    side = "faster" if ratios[name] > t else "slower"
                    text += f", {ratios[name] / t:.2f}× {name} ({side})"
            print(f"   {n:>5}×{k:<5} M={m:<2}  {e[0]}/{e[1]:<22} {t:8.2f} µs  {text}")
    print("\n2. Time at M = 16 / time at M = 1, each version:")
    for n, k in SHOWN:
        growth = []
        for e in path:
            t1, t16 = us(at.get((*e, n, k, 1))), us(at.get((*e, n, k, 16)))
            if t1 and t16:
                growth.append(f"{name_of(e)} {t16 / t1:.1f}×")
        print(f"   {n:>5}×{k:<5} " + ", ".join(growth))
    print("\n3. One launch after a flush / in a CUDA graph, at M = 1:")
    for n, k in SHOWN:
        timed = [(us(at[(*e, n, k, 1)]), e) for e in path if us(at.get((*e, n, k, 1)))]
        best = min(timed, default=None)
        shown = [best[1]] if best else []
        shown += [(r["op"], r["version"]) for name in PEERS
                  for r in [peer_time(PEERS[name], n, k, 1)[1]] if r is not None]
        cells = []
        for e in dict.fromkeys(shown):
            row = at[(*e, n, k, 1)]
            one, graph = us(row, "one_launch"), us(row, "graph")
            if one and graph:
                cells.append(f"{name_of(e)} {one / graph:.2f}×")
        print(f"   {n:>5}×{k:<5} " + (", ".join(cells) or "not timed both ways"))

# %% [markdown]
# ## Try
#
# - Predict from the ideal column where the INT4 advantage would vanish if M kept growing, then
#   compare with chapter 07's Tensor Core GEMM, which is built for that regime.
# - Redo the summary with `H = "back_to_back"` and `H = "one_launch"`: which ratios move, and
#   which versions gain most from being launched in a graph?
