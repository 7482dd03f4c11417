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
# # 11 · The decoder layer: every chapter in one Llama-3-8B layer
#
# Part 1 needs no GPU: what each of the layer's ten steps must move (the byte model of
# `lkw.decoder_layer.step_models`), per weight format, and what that means as a time at the copy
# ceiling. Part 2 replays a measured run of `python -m lkw.layer_bench --write-results`: the
# waterfall (the torch layer, then one workbook kernel swapped in at a time) and each kernel on
# the roofline.
#
# - **Replay** (the default): `results/h200/11_decoder_layer.json`, else another GPU's recorded run
#   (an H100's, said; the folder can be changed with `LKW_RESULTS_DIR`). Without one the measured
#   cells say so and skip.
# - **Measure** (a GPU, the compiled extension and torch): `python -m lkw.layer_bench
#   --write-results` from the repository root, then run this notebook again.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import decoder_layer as dl  # noqa: E402
from lkw import layer_bench, results  # noqa: E402

CHAPTER = "11_decoder_layer"
CFG = dl.LLAMA3_8B
FORMATS = ("bf16", "w4a16", "fp8")

# %% [markdown]
# ## Part 1 · What one decode step must move
#
# Decode, one token, 2048 tokens of context. Each bar is one step's model bytes (each input read
# once, each output written once): the four projections are nearly all of it, and the format
# decides their size: 2 bytes per weight (BF16), 1 and a little (FP8 with 128 × 128 block
# scales), half and a little (INT4 with a BF16 scale per 128). The attention's bar is the KV cache
# (the same in every format here: BF16). The layer's bound is the sum with every intermediate
# removed (`layer_bench.layer_bound`).

# %%
steps = list(dl.STEP_NAMES)
fig, ax = plt.subplots(figsize=(11, 3.5))
width = 0.27
for i, fmt in enumerate(FORMATS):
    costs = {c.name: c for c in layer_bench.models(CFG, fmt, "decode", 1)}
    ax.bar(np.arange(len(steps)) + (i - 1) * width, [costs[s].bytes / 1e6 for s in steps], width,
           label=fmt)
ax.set_xticks(np.arange(len(steps)), steps, rotation=30)
ax.set_ylabel("model MB per step")
ax.set_title("decode T = 1, KV 2048: bytes per step")
ax.legend()
plt.show()
for fmt in FORMATS:
    nbytes, flops = layer_bench.layer_bound(CFG, fmt, "decode", 1)
    print(f"{fmt:>6}: layer bound {nbytes / 1e6:7.1f} MB, {flops / 1e9:.2f} GFLOP: "
          f"{nbytes / 4.8e6:5.1f} µs at 4.8 TB/s (the H200's nominal HBM bandwidth)")

# %% [markdown]
# ## Part 2 · The measured run

# %%
data = results.replay(CHAPTER)  # this GPU's run, else another GPU's, said
if data is not None:
    print(f"{data['gpu']}, {data['date']}, commit {data['commit']}; {data.get('ceiling_note', '')}")
    for c in data["cases"]:
        lay = c["layer"]
        us = lay["workbook"].get("graph_us")
        line = f"{c['format']:>6} {c['case']:<22} workbook {us if us is None else round(us, 1)} µs"
        for who in ("torch_eager", "torch_compile", "production", "runner"):
            v = lay.get(who, {}).get("graph_us")
            if v is not None:
                line += f", {who} {v:.1f}"
        print(line)

# %% [markdown]
# ### The waterfall
#
# Each bar is the whole layer's time in a CUDA graph; from left to right one more step runs the
# workbook's kernel instead of torch's ops. The drop at a bar is what that chapter's kernel saves
# inside the layer, where the neighbours, the caches and the launch gaps are real.

# %%
if data is not None:
    cases = [c for c in data["cases"] if c["kind"] == "decode" and c["t"] == 1] or data["cases"][:3]
    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.6), squeeze=False)
    for ax, c in zip(axes[0], cases):
        labels = [w["swapped"] for w in c["waterfall"]]
        times = [w.get("graph_us") or 0.0 for w in c["waterfall"]]
        ax.bar(range(len(times)), times, color="tab:blue")
        if c.get("bound_us"):
            ax.axhline(c["bound_us"], color="k", ls="--", lw=1, label="layer bound")
            ax.legend()
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=8)
        ax.set_title(f"{c['format']} {c['case']}")
        ax.set_ylabel("µs per layer (graph)")
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ### Each kernel on the roofline
#
# One point per step of the all-workbook layer: its arithmetic intensity (model FLOPs over model
# bytes) and the rate it reached. The roof is the run's copy ceiling and the tensor peak it
# recorded; a decode projection sits far left (bytes), a prefill projection far right (FLOPs).

# %%
if data is not None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gbps, tflops = data.get("ceiling_gbps"), data.get("tensor_tflops")
    for c in data["cases"]:
        pts = [(k["flops"] / k["model_bytes"], k["flops"] / k["graph_us"] / 1e6)
               for k in c["kernels"] if k.get("graph_us") and k["flops"]]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=14, label=f"{c['format']} {c['case']}")
    if gbps and tflops:
        ai = np.logspace(-1, 4, 100)
        ax.plot(ai, np.minimum(ai * gbps / 1e3, tflops), "k--", lw=1, label="roof (BF16 peak)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte (model)")
    ax.set_ylabel("TFLOP/s reached")
    ax.legend(fontsize=7, ncol=2)
    plt.show()

# %% [markdown]
# ### The goals
#
# The goal table, as the bench computed it from the rows above.

# %%
if data is not None:
    for g in data.get("goals", [])[:40]:
        met = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        value = "-" if g["value"] is None else f"{g['value']:.2f}"
        print(f"{g['goal']:<66} {value:>8} {g['unit']:<6} target {g['target']}: {met}")
