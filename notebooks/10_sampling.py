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
# # 10 · Sampling: top-k without sorting
#
# Part 1 needs neither a GPU nor a measurement: how a radix select finds the k-th largest logit
# of a 128K row by counting, pass by pass, with the chapter's reference (`lkw.sampling`). Part 2
# shows the measured versions and peers against the row's bytes.
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
# ## Try
#
# - In Part 1, take k = 1024 and k = 1. How many candidates does pass 2 see in each case, and why
#   is it the same kind of number?
# - Make a row where the 50th largest logit is tied with 100 others (`lm_logits(..., ties=True)`)
#   and count the kept tokens. Which rule keeps them all, and why is it the one a threshold test
#   can apply?
