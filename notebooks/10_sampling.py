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
# # 10 · Sampling: filters without sorting, draws without the kept set
#
# Part 1 needs neither a GPU nor a measurement: how a radix select finds the k-th largest logit
# of a 128K row by counting, pass by pass; what a sampler's draws look like against the exact
# filtered distribution; how many rounds the pivot rejection takes. All with the chapter's
# reference (`lkw.sampling`), drawing the same Philox numbers the kernels draw. Part 2 shows the
# measured versions and peers against the row's bytes.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): the recorded run
#   `results/h200/10_sampling.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 10_sampling` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import results, sampling  # noqa: E402

CHAPTER = "10_sampling"

# %% [markdown]
# ## Part 1 · Four passes of 256 counters
#
# One row of LM-head-like logits (V = 128,256: a bulk and a few tokens well above it) and k = 50.
# `order_key` maps each FP32 logit to a uint32 with the same order; pass 1 counts the top 8 bits
# of every key, and the bucket holding the 50th largest becomes the answer's first digit; pass 2
# counts the next 8 bits of only the keys that share that digit, and so on. The candidates left
# after each pass, and where the rank falls, without any sort:

# %%
seed = np.random.SeedSequence().entropy % 2**32  # fresh each run; set it to replay one
print("seed", seed)
rng = np.random.default_rng(seed)
row = sampling.lm_logits(rng, 1, 128256)[0]
k = 50
threshold, passes = sampling.radix_select(row, k)
keys = sampling.order_key(row)
fig, axes = plt.subplots(1, len(passes), figsize=(13, 3), sharey=True)
for ax, p in zip(axes, passes):
    ax.bar(np.arange(p.hist.size), p.hist, width=1.0, color="tab:gray")
    ax.bar([p.digit], [p.hist[p.digit]], width=3.0, color="tab:red")
    ax.set_yscale("symlog")
    ax.set_title(f"bits {p.shift + 7}..{p.shift}: {int(p.hist.sum())} candidates", fontsize=9)
    ax.set_xlabel("digit")
axes[0].set_ylabel("keys per bucket")
plt.show()
print(f"the {k}th largest logit: {threshold!r}; tokens kept (ties included): "
      f"{int(np.sum(row >= threshold))}; numpy's sort agrees: {np.sort(row)[-k] == threshold}")

# %% [markdown]
# The first pass sees every key; from the second on, only a bucket's worth. A kernel still reads
# the whole row in every pass (it cannot know which elements are candidates without reading
# them): `v1_radix_select` moves five rows' worth of bytes for one row read, which is what the
# next versions remove.

# %% [markdown]
# ### Sampled against exact
#
# 100,000 draws from one row of a small vocabulary (V = 64) with temperature 0.7, top-k 20 and
# top-p 0.9, each draw the fused sampler's computation (`lkw.sampling.sample`: an inverse CDF at
# u_0 of row b's Philox stream), against the exact renormalized distribution; Pearson's
# chi-square at the chapter's significance. A sampler that forgets the temperature is drawn the
# same way, and fails.

# %%
V, N = 64, 100_000
logits = np.repeat(sampling.lm_logits(np.random.default_rng(seed), 1, V), N, axis=0)
u = sampling.philox_uniforms(int(seed), 0, N, 1)[:, 0]
filters = dict(top_k=20, top_p=0.9)
keys, mass = sampling.from_logits(logits[:1], 0.7)
exact = sampling.renorm(mass, sampling.filter_keep(keys, mass, **filters))[0]
fig, ax = plt.subplots(figsize=(11, 3))
for name, t, shift in (("T = 0.7", 0.7, -0.2), ("T ignored", 1.0, 0.2)):
    tokens = sampling.sample(logits, u, temperature=np.full(N, t, np.float32), **filters)
    counts = np.bincount(tokens, minlength=V)
    stat, df, pvalue = sampling.chi_square(counts, exact)
    ax.bar(np.arange(V) + shift, counts / N, width=0.4,
           label=f"{name}: chi-square {stat:.0f} on {df} df, p = {pvalue:.2g}")
ax.plot(np.arange(V), exact, "k_", markersize=9, label="exact")
ax.set_xlabel("token")
ax.set_ylabel("frequency")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ### Rounds of the pivot rejection
#
# `v3_pivot_rejection` draws a token, tests it against the filters, and moves a pivot until a draw
# survives. On 128K rows with top-k 50 (the draw from the whole row almost always lands in the
# bulk, far below the 50th value) the pivots climb fast; the histogram counts the rounds per row.

# %%
rows = sampling.lm_logits(np.random.default_rng(seed), 64, 128256)
keys, mass = sampling.from_logits(rows)
keep = sampling.filter_keep(keys, mass, top_k=50)
uniforms = sampling.philox_uniforms(int(seed), 0, 64, 65)
tokens, rounds, trace = sampling.pivot_rejection_sample(keys, mass, keep, uniforms)
fig, ax = plt.subplots(figsize=(6, 3))
ax.hist(rounds, bins=np.arange(rounds.max() + 2) - 0.5, color="tab:gray")
ax.set_xlabel("rounds until a draw is kept")
ax.set_ylabel("rows")
plt.show()
print(f"mean {rounds.mean():.1f} rounds, at most {rounds.max()}: about two reads of the row each")

# %% [markdown]
# ## Part 2 · The measured versions

# %%
data = results.notebook_results(CHAPTER)
if data:
    print(results.summary_text(data))

# %% [markdown]
# ### Time per row against the batch
#
# Microseconds per launch in the run's headline mode for every version and peer, per op and
# shape: the sort-based paths against the selection, and the production kernels.

# %%
def rows_at(data, shape, op):
    return [r for r in data["rows"] if r["shape"] == shape and r["op"] == op
            and r.get(results.mkey(H, "us")) and r["kind"] in ("version", "peer")]


if data:
    H = results.headline(data)  # the timing mode the figures show: the graph, where timed
    shapes = list(dict.fromkeys(r["shape"] for r in data["rows"]))
    ops = list(dict.fromkeys(r["op"] for r in data["rows"]))
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        names = list(dict.fromkeys(r["version"] for s in shapes for r in rows_at(data, s, op)))
        width = 0.8 / max(len(names), 1)
        for i, name in enumerate(names):
            us = [next((r[results.mkey(H, "us")] for r in rows_at(data, s, op)
                        if r["version"] == name), 0.0) for s in shapes]
            ax.bar(np.arange(len(shapes)) + i * width, us, width, label=name[:30])
        ax.set_xticks(np.arange(len(shapes)) + 0.4 - width / 2, shapes, fontsize=7, rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel(f"µs, {results.MODE_WORDS[H]}")
        ax.set_title(op, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ### The sampler against the batch
#
# `sample` at V = 128,256 with top-k 50 and top-p 0.9: microseconds per launch against B for each
# version and peer (the headline mode), beside the time the row's bytes take at the copy ceiling.

# %%
if data:
    runs = [r for r in data["rows"] if r["op"] == "sample" and "v=128256,k=50,p=0.9" in r["shape"]
            and r.get(results.mkey(H, "us")) and r["kind"] in ("version", "peer")]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["version"] for r in runs):
        pts = sorted((int(r["shape"].split(",")[0][2:]), r[results.mkey(H, "us")])
                     for r in runs if r["version"] == name)
        ax.plot(*zip(*pts), "o-", label=name[:34])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("B (rows)")
    ax.set_ylabel(f"µs, {results.MODE_WORDS[H]}")
    ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# ### The sampler against the vocabulary
#
# `sample` at B = 64 with top-k 50 and top-p 0.9 over the vocabularies of the run (32,000,
# 128,256 and 152,064 in the H200 run): microseconds per launch against V for each version and
# peer (the headline mode), and dashed, the time the batch's bytes take at the copy ceiling.

# %%
def by_vocab(data):
    """{name: [(V, µs, row)]}, headline mode, of the sample rows at B = 64, top-k 50 + top-p 0.9."""
    out = {}
    for r in data["rows"]:
        f = dict(kv.split("=", 1) for kv in r["shape"].split(",") if "=" in kv)
        chosen = (f.get("b"), f.get("k"), f.get("p")) == ("64", "50", "0.9")
        if (chosen and r["op"] == "sample" and r.get(results.mkey(H, "us"))
                and r["kind"] in ("version", "peer")):
            out.setdefault(r["version"], []).append((int(f["v"]), r[results.mkey(H, "us")], r))
    return {name: sorted(pts, key=lambda p: p[0]) for name, pts in out.items()}


if data:
    series = by_vocab(data)
    vocabs = sorted({v for pts in series.values() for v, _, _ in pts})
    if len(vocabs) < 2:
        print(f"sample rows at B = 64, top-k 50 + top-p 0.9 in this run: V = {vocabs}, no sweep")
    else:
        gbps, _ = results.ceiling_of(data, H)
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, pts in series.items():
            ax.plot([v for v, _, _ in pts], [us for _, us, _ in pts], "o-", label=name[:34])
        if gbps:
            floor = {v: r["model_bytes"] / gbps / 1e3 for pts in series.values() for v, _, r in pts}
            ax.plot(vocabs, [floor[v] for v in vocabs], "k--", label="bytes at the copy ceiling")
        ax.set_yscale("log")
        ax.set_xticks(vocabs, [f"{v:,}" for v in vocabs])
        ax.set_xlabel("V (vocabulary)")
        ax.set_ylabel(f"µs, {results.MODE_WORDS[H]}")
        ax.set_title("sample, B = 64, top-k 50 + top-p 0.9", fontsize=9)
        ax.legend(fontsize=7)
        plt.show()


# %% [markdown]
# ## Try
#
# - In Part 1, take k = 1024 and k = 1. How many candidates does pass 2 see in each case, and why
#   is it the same kind of number?
# - In "Sampled against exact", drop the top-p filter from `filters` but keep it in `exact`: how
#   many draws does the chi-square need before it notices?
# - Make a row where the 50th largest logit is tied with 100 others (`lm_logits(..., ties=True)`)
#   and count the kept tokens. Which rule keeps them all, and why is it the one a threshold test
#   can apply?
