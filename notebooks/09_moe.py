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
# # 09 · MoE routing: what the routing costs the grouped GEMM, and how fast the align runs
#
# A mixture-of-experts layer sends each of T tokens to k of E experts. Before the experts' GEMMs
# can run as one launch, `moe_align_block_size` sorts the T·k (token, expert) slots by expert and
# pads each expert's run to a multiple of BLOCK_M, so that every BLOCK_M-row tile of the grouped
# GEMM reads the weights of exactly one expert. This notebook asks two questions:
#
# 1. **What does that padding cost, and how uneven is the work?** Computed here on the host with
#    the chapter's reference (`lkw.moe`), for three routing distributions and the routing shapes of
#    three models. No GPU and no measurement needed.
# 2. **How fast are the routing kernels?** The versions of `moe_align_block_size` and
#    `topk_softmax` against vLLM's kernels and torch, from the recorded run.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): part 2 reads the recorded run
#   `results/h200/09_moe.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 09_moe` and shows what it just measured.

# %%
import math
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import moe, results  # noqa: E402

CHAPTER = "09_moe"
# The routing shapes (E experts, k per token) of the three models of the chapter.
MODELS = {"Mixtral-8x7B": (8, 2), "Qwen3-30B-A3B": (128, 8), "DeepSeek-V3": (256, 8)}
TS = (1, 16, 128, 1024, 4096, 16384)  # tokens: decode to long prefill
BLOCK_MS = (16, 32, 64, 128, 256)  # the grouped GEMM's tile height
BLOCK_M = 64  # the tile the kernels of the run align to
T_FIXED = 4096  # the T of the waste-against-BLOCK_M view
DISTS = moe.DISTRIBUTIONS  # ("uniform", "zipf", "one")
DIST_WORDS = {"uniform": "uniform", "zipf": f"Zipf {moe.ZIPF_EXPONENT}", "one": "all to one"}
DIST_COLORS = {"uniform": "tab:blue", "zipf": "tab:orange", "one": "tab:red"}
SEED = 9  # fixed: every number of part 1 is the same on every run

# %% [markdown]
# ## Part 1 · Padding waste and load imbalance
#
# ### The align on a small example
#
# Four tokens, four experts, two experts per token, BLOCK_M = 4. Slot i = t·k + j is token t's
# j-th choice. Each expert's run of slots is padded with the sentinel T·k = 8 up to a multiple of
# 4; `expert_ids` names the expert of each 4-row block.

# %%
example_ids = np.array([[0, 1], [0, 2], [1, 0], [0, 3]], np.int32)  # [T, k]
sorted_ids, expert_ids, n_post = moe.moe_align_block_size(example_ids, 4, 4)
print("topk_ids        ", example_ids.tolist())
print("sorted_token_ids", sorted_ids[:n_post].tolist())
print("expert_ids      ", expert_ids[: n_post // 4].tolist())
print(f"{n_post} rows for {example_ids.size} slots: padding waste "
      f"{moe.padding_waste(example_ids, 4, 4):.2f} (padded rows / real rows), imbalance "
      f"{moe.imbalance(example_ids, 4):.2f} (rows of the busiest expert / mean rows per expert)")

# %% [markdown]
# Expert 0 holds 4 slots (a full block), expert 1 two, experts 2 and 3 one each: 8 real rows
# become 16, so the grouped GEMM multiplies 8 rows of padding, a waste of 1.0.
#
# ### Three routing distributions
#
# `moe.routing_ids` draws topk_ids [T, k], k distinct experts per token:
#
# - **uniform**: every set of k experts equally likely, the balanced router that training aims for;
# - **Zipf 1.2**: expert e weighs (e + 1)^−1.2, so a few hot experts take most tokens and many
#   cold experts get a handful, a router early in training or a skewed batch;
# - **all to one**: every token picks experts 0 … k − 1, the worst case for balance.
#
# Two numbers per routing:
#
# - **padding waste** = padded rows / real rows: the extra rows the grouped GEMM multiplies, per
#   real row. Each expert with c rows wastes ⌈c / BLOCK_M⌉·BLOCK_M − c ≤ BLOCK_M − 1 rows, so
#   the waste is large when many experts hold few rows: small T, large E, large BLOCK_M.
# - **load imbalance** = rows of the busiest expert / mean rows per expert (over all E): 1 is
#   balanced, E / k (every token on the same k experts) is the most there can be.
#
# The draws use `np.random.default_rng([SEED, E, k, T, distribution])`, so each number is the
# same on every run (SEED is printed below) and does not depend on the order of the loops.

# %%
def draw(model, dist, t):
    """topk_ids [T, k] of one model's routing shape, one distribution, a fixed seed per cell."""
    e, k = MODELS[model]
    rng = np.random.default_rng([SEED, e, k, t, DISTS.index(dist)])
    return moe.routing_ids(rng, t, e, k, dist)


IDS = {(model, dist, t): draw(model, dist, t) for model in MODELS for dist in DISTS for t in TS}


def waste(model, dist, t, block_m=BLOCK_M):
    return moe.padding_waste(IDS[(model, dist, t)], MODELS[model][0], block_m)


def imbalance(model, dist, t):
    return moe.imbalance(IDS[(model, dist, t)], MODELS[model][0])


print(f"seed {SEED}; one draw per model, distribution and T")

# %% [markdown]
# ### The uniform router on paper
#
# Under uniform routing a token includes expert e with probability k / E, independently of the
# other tokens, so expert e's row count c is Binomial(T, k / E), and the expected waste is
# E · 𝔼[⌈c / BLOCK_M⌉·BLOCK_M] / (T·k) − 1. The figures draw it as a dashed line next to the
# uniform draws: a check that one draw is typical.

# %%
def expected_waste_uniform(t, e, k, block_m):
    """The expected padding waste under uniform routing: each expert's count ~ Binomial(T, k/E)."""
    c = np.arange(t + 1)
    p = k / e
    if p == 1.0:
        pmf = (c == t).astype(float)
    else:
        log_choose = np.array([math.lgamma(t + 1) - math.lgamma(i + 1) - math.lgamma(t - i + 1)
                               for i in c])
        pmf = np.exp(log_choose + c * math.log(p) + (t - c) * math.log1p(-p))
    padded = -(-c // block_m) * block_m
    return e * float(pmf @ padded) / (t * k) - 1.0


# %% [markdown]
# ### The tables
#
# First, at T = 4096 tokens (a prefill chunk): the waste for every BLOCK_M, and the imbalance (it
# does not depend on BLOCK_M). Then, at BLOCK_M = 64: the waste and the imbalance against T.

# %%
def print_grid(title, cols, cell):
    print(title)
    print(f"  {'model':<15}{'routing':<12}" + "".join(f"{c:>9}" for c in cols))
    for model in MODELS:
        for dist in DISTS:
            print(f"  {model:<15}{DIST_WORDS[dist]:<12}" + "".join(f"{cell(model, dist, c):>9}"
                                                             for c in cols))
    print()


print_grid(f"Padding waste at T = {T_FIXED} against BLOCK_M, and the imbalance",
           [f"BM={b}" for b in BLOCK_MS] + ["imbal."],
           lambda m, d, c: (f"{imbalance(m, d, T_FIXED):.2f}" if c == "imbal." else
                            f"{waste(m, d, T_FIXED, int(c[3:])):.3f}"))
print_grid(f"Padding waste at BLOCK_M = {BLOCK_M} against T", [f"T={t}" for t in TS],
           lambda m, d, c: f"{waste(m, d, int(c[2:])):.3f}")
print_grid("Load imbalance (max / mean rows per expert) against T", [f"T={t}" for t in TS],
           lambda m, d, c: f"{imbalance(m, d, int(c[2:])):.2f}")

# %% [markdown]
# How to read them:
#
# - **At decode the waste is the whole tile.** With T = 1 each of the k chosen experts holds one
#   row and pads it to BLOCK_M: a waste of BLOCK_M − 1 whatever the distribution. The grouped GEMM
#   at decode is bound by reading the experts' weights, not by the rows it multiplies, so this
#   waste costs little there, but it is why decode kernels use small tiles.
# - **At prefill the waste falls as 1 / T** once every expert holds many blocks: each expert
#   wastes about BLOCK_M / 2 rows on average, E·BLOCK_M / 2 rows for T·k real ones. DeepSeek-V3
#   (256 experts) wastes the most: at T = 4096 an expert holds 128 rows on average, and BLOCK_M =
#   256 doubles them.
# - **Skew cuts the waste at small T and raises it at large T.** While most experts are idle,
#   Zipf routing puts the tokens on fewer experts than uniform routing, so fewer tiles are partly
#   filled. Once every expert is busy (T = 1024 and 4096 here), the hot experts hold many full
#   blocks but the many cold ones still hold a few rows each, all padded: Zipf then wastes more
#   than uniform, most at large BLOCK_M. At the longest T even the cold experts fill their tiles
#   and the two meet. All to one wastes nothing once T is a multiple of BLOCK_M: k full runs, no
#   other expert.
# - **The imbalance at small T is no skew**: with T·k < E most experts get nothing, and the
#   busiest one holds 1 row against a mean of T·k / E. It means something once T·k ≫ E: uniform
#   routing then approaches 1, Zipf 1.2 stays far above, all to one is E / k at every T.
#
# Inside one GPU the imbalance costs the grouped GEMM little (its blocks form one flat list, any
# SM takes any block), but it costs the align kernel: all slots counted on one expert's counter
# contend for the same atomic. Across GPUs (expert parallelism) the busiest GPU sets the pace.

# %% [markdown]
# ### Waste against BLOCK_M at T = 4096
#
# One panel per model, one line per distribution; dashed: the uniform expectation. BLOCK_M is the
# tile height of the grouped GEMM: a taller tile reuses each expert weight tile over more rows, and
# pays for it in padding.

# %%
fig, axes = plt.subplots(1, len(MODELS), figsize=(4.6 * len(MODELS), 3.8), squeeze=False)
for ax, (model, (e, k)) in zip(axes[0], MODELS.items()):
    for dist in DISTS:
        ax.plot(BLOCK_MS, [waste(model, dist, T_FIXED, b) for b in BLOCK_MS], "o-",
                color=DIST_COLORS[dist], label=DIST_WORDS[dist])
    ax.plot(BLOCK_MS, [expected_waste_uniform(T_FIXED, e, k, b) for b in BLOCK_MS], "--",
            color="k", lw=1, label="uniform, expected")
    ax.set_xscale("log", base=2)
    ax.set_xticks(BLOCK_MS, [str(b) for b in BLOCK_MS])
    ax.set_xlabel("BLOCK_M (rows per tile)")
    ax.set_ylabel("padded rows / real rows")
    ax.set_title(f"{model}: E = {e}, k = {k}, T = {T_FIXED}", fontsize=10)
    ax.grid(True, lw=0.3)
axes[0][0].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Waste and imbalance against T at BLOCK_M = 64
#
# Top row: the padding waste (a symmetric-log axis, so that a waste of 0 shows: linear below
# 0.01); bottom row: the imbalance, with the all-to-one bound E / k dotted. Both axes logarithmic
# in T: the waste falls from BLOCK_M − 1 at decode to a few percent at long prefill.

# %%
fig, axes = plt.subplots(2, len(MODELS), figsize=(4.6 * len(MODELS), 7), squeeze=False)
for col, (model, (e, k)) in enumerate(MODELS.items()):
    top, bottom = axes[0][col], axes[1][col]
    for dist in DISTS:
        top.plot(TS, [waste(model, dist, t) for t in TS], "o-", color=DIST_COLORS[dist],
                 label=DIST_WORDS[dist])
        bottom.plot(TS, [imbalance(model, dist, t) for t in TS], "o-", color=DIST_COLORS[dist],
                    label=DIST_WORDS[dist])
    top.plot(TS, [expected_waste_uniform(t, e, k, BLOCK_M) for t in TS], "--", color="k", lw=1,
             label="uniform, expected")
    bottom.axhline(e / k, color="k", ls=":", lw=1, label="E / k")
    top.set_yscale("symlog", linthresh=0.01)
    bottom.set_yscale("log")
    bottom.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    bottom.yaxis.set_minor_formatter(plt.NullFormatter())
    top.set_title(f"{model}: E = {e}, k = {k}, BLOCK_M = {BLOCK_M}", fontsize=10)
    top.set_ylabel("padded rows / real rows")
    bottom.set_ylabel("max / mean rows per expert")
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.set_xticks(TS, [str(t) for t in TS])
        ax.set_xlabel("T (tokens)")
        ax.grid(True, which="both", lw=0.3)
axes[0][0].legend(fontsize=8)
axes[1][0].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Part 2 · The measured routing kernels
#
# The run times `moe_align_block_size` (BLOCK_M = 64, uniform routing at every T; Zipf and all to
# one at T = 16, 1024 and 4096 on every model) and `topk_softmax` (FP32 logits, renormalized; the
# run's `topk_softmax_bf16` rows take BF16 logits), each version beside vLLM's kernel and torch
# (eager, and compiled where it runs). Times are µs per launch in the run's headline mode, launches
# in a CUDA graph, as a decoder step replays them.

# %%
data = results.notebook_results(CHAPTER)
if data:
    H = results.headline(data)  # the timing mode the figures show: the graph, where timed
    # The routing ops and the whole block here; every op: print(results.summary_text(data))
    print(results.summary_text(data, ops=("moe_align_block_size", "topk_softmax", "moe_block")))


# %%
def parse(shape):
    """'t=4096,e=256,k=8,block_m=64,uniform' -> {'t': 4096, 'e': 256, ..., 'dist': 'uniform'}."""
    out = {}
    for part in shape.split(","):
        key, _, value = part.partition("=")
        out.update({key: int(value)} if value else {"dist": key})
    return out


def us(row):
    return row.get(results.mkey(H, "us")) if row else None


def model_name(e, k):
    return next((m for m, ek in MODELS.items() if ek == (e, k)), f"E = {e}, k = {k}")


def series(op, dist=None):
    """{(e, k): {(kind, version): {T: row}}} of one op (and one routing distribution)."""
    out = {}
    for r in results.rows(data, op):
        s = parse(r["shape"])
        if r["kind"] not in ("version", "peer") or s.get("dist", dist) != dist or not us(r):
            continue
        out.setdefault((s["e"], s["k"]), {}).setdefault((r["kind"], r["version"]), {})[s["t"]] = r
    return out


PEER_COLORS = {"torch_eager": "black", "torch_compile": "tab:gray"}  # vLLM's rows: red


def plot_op(op, dist, goals, title):
    """One panel per routing shape of the op in the run: time against T per version (solid) and
    peer (dashed), log axes; each goal (µs, T range) a thick green segment."""
    shapes = series(op, dist)
    missing = [m for m, ek in MODELS.items() if ek not in shapes]
    if missing:
        which = f"{dist} rows" if dist else "rows"
        print(f"{op}: no {which} for {', '.join(missing)} in this run; no panel for them.")
    if not shapes:
        return
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.6 * len(shapes) + 2.5, 4.4), squeeze=False)
    for ax, ((e, k), entries) in zip(axes[0], sorted(shapes.items())):
        versions = [v for kind, v in entries if kind == "version"]
        colors = dict(zip(versions, plt.cm.viridis(np.linspace(0, 0.85, max(len(versions), 1)))))
        for (kind, version), at in entries.items():
            ts = sorted(at)
            if kind == "version":
                style, color = "o-", colors[version]
            else:
                style = "s--"
                color = ("tab:red" if version.startswith("vllm")
                         else PEER_COLORS.get(version, "tab:brown"))
            ax.plot(ts, [us(at[t]) for t in ts], style, color=color, ms=4,
                    label=version if kind == "version" else f"{version} (peer)")
        for goal_us, t_lo, t_hi, label in goals:
            ax.hlines(goal_us, t_lo, t_hi, color="tab:green", lw=4, alpha=0.6, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        all_t = sorted({t for at in entries.values() for t in at})
        ax.set_xticks(all_t, [str(t) for t in all_t])
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel(f"µs per launch, {results.MODE_WORDS[H]}")
        ax.set_title(f"{title}: {model_name(e, k)} (E = {e}, k = {k})", fontsize=10)
        ax.grid(True, which="both", lw=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    plt.show()


# %% [markdown]
# ### `moe_align_block_size` against T
#
# The counting sort of T·k slots: `v0` sorts them (CUB radix sort), `v1` counts with global
# atomics in three kernels, `v2` does the whole sort in one block's shared memory, `v3` spreads
# the count and the scatter over many blocks. The green segments are the chapter's goals: ≤ 8 µs
# at T = 4096 (T·k = 32768 on DeepSeek-V3) and ≤ 4 µs for T ≤ 128. Watch where each version's
# line bends: a one-block kernel is the fastest while T·k is small and the slowest when it is
# large.

# %%
ALIGN_GOALS = [(8.0, 4096 / 1.4, 4096 * 1.4, "goal ≤ 8 µs at T = 4096"),
               (4.0, 1, 128, "goal ≤ 4 µs for T ≤ 128")]
if data:
    plot_op("moe_align_block_size", "uniform", ALIGN_GOALS, "align, uniform")

# %% [markdown]
# ### The routing distribution, measured
#
# The same align at T = 4096 on DeepSeek-V3 under the three distributions of part 1. The kernel's
# work is the same T·k slots; what changes is how many of them hit the same expert's counter.

# %%
if data:
    at4096 = {}
    for r in results.rows(data, "moe_align_block_size"):
        s = parse(r["shape"])
        if (s["t"], s["e"], s["k"]) == (4096, 256, 8) and us(r):
            at4096.setdefault(r["version"], {})[s["dist"]] = us(r)
    if len(at4096) and any(len(v) > 1 for v in at4096.values()):
        print(f"µs per launch {results.MODE_WORDS[H]}, T = 4096, E = 256, k = 8, BLOCK_M = 64")
        print(f"  {'version / peer':<30}" + "".join(f"{DIST_WORDS[d]:>13}" for d in DISTS))
        for version, by_dist in at4096.items():
            cells = [f"{by_dist[d]:.2f}" if d in by_dist else "—" for d in DISTS]
            print(f"  {version:<30}" + "".join(f"{c:>13}" for c in cells))
    else:
        print("This run has no align rows at T = 4096, E = 256 under more than one distribution.")

# %% [markdown]
# ### `topk_softmax` against T
#
# The gating step: softmax over E logits per token, then the k largest. `v4` gives a token to a
# thread, `v5` to a warp, `v6` to a warp reading 16-byte vectors. The green segment is the goal of
# ≤ 4 µs for T ≤ 128 (decode): there the time is the launch and one pass over a few kilobytes.

# %%
TOPK_GOALS = [(4.0, 1, 128, "goal ≤ 4 µs for T ≤ 128")]
if data:
    plot_op("topk_softmax", None, TOPK_GOALS, "topk_softmax")

# %% [markdown]
# ### The goals, checked
#
# Each goal of the chapter that this run can answer. At every shape the fastest version counts
# (the best of the ladder); over the goal's shapes the worst case is shown: the slowest time
# against a "≤ µs" goal, the smallest ratio against a "≥ ×" goal (a peer's time / ours: above
# 1 we are faster). "not in this run" where the run has no such row.

# %%
def best_rows(op):
    """{shape: the row of the fastest version of op at that shape}, in the headline mode."""
    out = {}
    for r in results.rows(data, op, "version"):
        if us(r) and (r["shape"] not in out or us(r) < us(out[r["shape"]])):
            out[r["shape"]] = r
    return out


def peer_ratio(row, name):
    """The named peer's time / ours at the row's shape, in the headline mode (None: not timed)."""
    peer = next((p for n, p in row.get("peers", {}).items() if n.startswith(name)), None)
    return peer.get(results.mkey(H, "ratio")) if peer else None


def uniform_at(t_max=None, t=None, e=None):
    return lambda s: (s.get("dist", "uniform") == "uniform" and (t is None or s["t"] == t)
                      and (t_max is None or s["t"] <= t_max) and (e is None or s["e"] == e))


# (op, where, which shapes, "µs" or the peer compared, goal)
GOALS = [
    ("moe_align_block_size", "T 4096, E 256", uniform_at(t=4096, e=256), "µs", 8.0),
    ("moe_align_block_size", "T 4096, E 256", uniform_at(t=4096, e=256), "vllm", 3.0),
    ("moe_align_block_size", "T ≤ 128", uniform_at(t_max=128), "µs", 4.0),
    ("moe_align_block_size", "every shape", lambda s: True, "torch_eager", 20.0),
    ("topk_softmax", "T ≤ 128", uniform_at(t_max=128), "µs", 4.0),
    ("topk_softmax", "every shape", lambda s: True, "vllm", 1.5),
    ("topk_softmax", "every shape", lambda s: True, "torch_eager", 10.0),
]

if data:
    print(f"{'op':<21}{'shapes':<15}{'goal':<26}{'worst case':<12}{'':<8}where")
    for op, where, keep, what, goal in GOALS:
        rows = [r for shape, r in best_rows(op).items() if keep(parse(shape))]
        if what == "µs":
            label = f"≤ {goal:g} µs"
            cases = [(us(r), r) for r in rows]
            worst = max(cases, key=lambda c: c[0], default=None)
            ok = worst and worst[0] <= goal
        else:
            label = f"{what} / ours ≥ {goal:g}×"
            cases = [(peer_ratio(r, what), r) for r in rows]
            worst = min(((x, r) for x, r in cases if x), key=lambda c: c[0], default=None)
            ok = worst and worst[0] >= goal
        if worst is None:
            print(f"{op:<21}{where:<15}{label:<26}not in this run")
            continue
        value, row = worst
        shown = f"{value:.2f} µs" if what == "µs" else f"{value:.2f}×"
        print(f"{op:<21}{where:<15}{label:<26}{shown:<12}{'met' if ok else 'NOT met':<8}"
              f"{row['version']} at {row['shape']}")

# %% [markdown]
# ## Try
#
# - Set `moe.ZIPF_EXPONENT = 0.8`, then 2.0, and run the cells of part 1 again: how do the Zipf
#   waste at T = 4096 and the Zipf imbalance move against the uniform ones, and why does a steeper
#   skew bring the waste down again?
# - With `expected_waste_uniform`, find for each T the largest BLOCK_M that keeps DeepSeek-V3's
#   uniform waste under 10 %. Which T could use a 128-row tile?
# - All to one sends every slot's count to k counters. Which version's time in the distribution
#   table should that hurt, which should it help, and does the measurement agree?
# - The full table of part 1: `print_grid("waste, BLOCK_M = 16", [f"T={t}" for t in TS],
#   lambda m, d, c: f"{waste(m, d, int(c[2:]), 16):.3f}")`, and the same for the other tiles.
