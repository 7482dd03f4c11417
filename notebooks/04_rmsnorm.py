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
# # 04 · RMSNorm: the version ladder, the byte table, decode latency
#
# Part 1 needs neither a GPU nor a measurement: it shows with the chapter's reference
# (`lkw.rmsnorm`) why the contract rounds where it does. Part 2 shows the measured versions, the
# bytes each fused and unfused path moves (measured with Nsight Compute), and decode latency.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded runs
#   `results/h200/04_rmsnorm.json` and `03_dynamic_quant.json` (folder: `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 04_rmsnorm` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import formats, golden, rmsnorm, results  # noqa: E402

CHAPTER = "04_rmsnorm"

# %% [markdown]
# ## Part 1 · Where the rounding points are, and what moving one changes
#
# 64 tokens of 4096, a residual stream four times larger than the update (so bf16(x + residual)
# really rounds), weights around 1. The contract: r = bf16(x + residual) before the variance;
# z = bf16(r · rstd) before the weight; y = bf16(z · w). Two tempting shortcuts, each counted in
# elements of y that come out different:

# %%
seed = np.random.SeedSequence().entropy % 2**32  # fresh each run; set it to replay one
print("seed", seed)
rng = np.random.default_rng(seed)
t, d, eps = 64, 4096, 1e-6
x = golden.activations(rng, t, d)
res = formats.f32_to_bf16(formats.bf16_to_f32(golden.activations(rng, t, d)) * 4)
w = golden.norm_weight(rng, d)
y, r = rmsnorm.fused_add_rmsnorm(x, res, w, eps)

# Shortcut 1: the variance of the FP32 sum, before it is rounded to BF16.
s32 = formats.bf16_to_f32(x) + formats.bf16_to_f32(res)
y1 = rmsnorm.normalize(formats.bf16_to_f32(r), rmsnorm.rstd(s32, eps), w)
# Shortcut 2: x · rstd · w in FP32 with one rounding (no BF16 step for z).
r32 = formats.bf16_to_f32(r)
y2 = formats.f32_to_bf16(r32 * rmsnorm.rstd(r32, eps) * formats.bf16_to_f32(w))
for name, other in [("variance of the unrounded sum", y1), ("one rounding of x·rstd·w", y2)]:
    print(f"{name:<32} changes {np.mean(other != y):.2%} of the elements of y")

# %% [markdown]
# Either shortcut is a fine normalization on its own; what it breaks is the agreement between the
# fused kernel and the unfused chain (an add kernel writing r in BF16, then RMSNorm, then quant):
# the chain can only see the rounded r, and it writes z·w after rounding z. A fused kernel that
# takes a shortcut differs from the chain in the elements above, and its quantization scales,
# taken from the absmax of y, differ with them.

# %% [markdown]
# ## Part 2 · The measured versions

# %%
data = results.notebook_results(CHAPTER)
if data:
    print(results.summary_text(data))

# %% [markdown]
# ### The version ladder (prefill)
#
# Time per op at the prefill shapes (T = 8192) in the run's headline mode, versions and peers side
# by side, on a log scale: `v0_scalar` takes a hundred times longer than the best.

# %%
def rows_at(data, shape):
    return [r for r in data["rows"] if r["shape"] == shape and r.get(results.mkey(H, "us"))
            and r["kind"] in ("version", "peer")]


if data:
    H = results.headline(data)  # the timing mode the figures show: the graph, where timed
    prefill = [s for s in dict.fromkeys(r["shape"] for r in data["rows"]) if s.startswith("t=8192")]
    fig, axes = plt.subplots(len(prefill), 1, figsize=(11, 3.8 * len(prefill)), squeeze=False)
    for ax, shape in zip(axes[:, 0], prefill):
        rows = rows_at(data, shape)
        labels = [f"{r['op']}\n{r['version']}" for r in rows]
        colors = ["tab:blue" if r["kind"] == "version" else "tab:gray" for r in rows]
        ax.bar(range(len(rows)), [r[results.mkey(H, "us")] for r in rows], color=colors)
        ax.set_xticks(range(len(rows)), labels, fontsize=6, rotation=90)
        ax.set_yscale("log")
        ax.set_ylabel(f"µs, {results.MODE_WORDS[H]}")
        ax.set_title(f"{shape}: versions (blue) and peers (gray)")
    plt.show()

# %% [markdown]
# ### The byte table
#
# Bytes per element each path moves at T = 8192, d = 4096: the model (what the path reads and
# writes at least) beside what Nsight Compute measured at the DRAM. The unfused chain of three
# kernels writes r and y out and reads them back; the fused kernel does not.

# %%
def per_element(row):
    t, d = (int(part.split("=")[1]) for part in row["shape"].split(","))
    dram = row["dram_bytes"] / (t * d) if row.get("dram_bytes") else None
    return row["model_bytes"] / (t * d), dram


if data:
    shape = next((s for s in dict.fromkeys(r["shape"] for r in data["rows"]) if s.startswith("t=8192")), None)
    wanted = [("fused_add_rmsnorm_fp8", "chain_unfused", "add + norm + quant, 3 kernels"),
              ("fused_add_rmsnorm", "chain_unfused", "add + norm, 2 kernels"),
              ("fused_add_rmsnorm", "v4_fused_add", "fused add + norm"),
              ("fused_add_rmsnorm_fp8", "v5_fused_add_quant", "fused add + norm + quant"),
              ("rmsnorm", "v3_vec16_registers", "norm alone")]
    bars = []
    for op, version, label in wanted:
        row = next((r for r in data["rows"] if r["op"] == op and r["version"] == version
                    and r["shape"] == shape), None)
        if row:
            bars.append((label, *per_element(row)))
    quant_data = results.load("03_dynamic_quant")
    if quant_data:
        row = next((r for r in quant_data["rows"] if r["op"] == "per_token_fp8"
                    and r["version"] == "v2_vec16" and r["shape"] == shape), None)
        if row:
            bars.append(("quant alone (chapter 03)", *per_element(row)))
    print(f"{'path':<32} {'model B/elem':>12} {'DRAM B/elem':>12}")
    for label, model, dram in bars:
        print(f"{label:<32} {model:>12.2f} {'—' if dram is None else format(dram, '.2f'):>12}")
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ys = np.arange(len(bars))
    ax.barh(ys - 0.2, [b[1] for b in bars], 0.4, label="model")
    ax.barh(ys + 0.2, [b[2] or 0 for b in bars], 0.4, label="measured (ncu)")
    ax.set_yticks(ys, [b[0] for b in bars])
    ax.set_xlabel("bytes per element")
    ax.legend()
    plt.show()

# %% [markdown]
# ### Decode latency
#
# At T = 1, 16 and 64 tokens a row is a few kilobytes: the time is the launch and one trip through
# a block, not bandwidth. Microseconds per op and path, on a log scale (the summary above has the
# numbers):

# %%
if data:
    decode = [s for s in dict.fromkeys(r["shape"] for r in data["rows"]) if not s.startswith("t=8192")]
    ops = list(dict.fromkeys(r["op"] for r in data["rows"]))
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 3.8), squeeze=False)
    for ax, op in zip(axes[0], ops):
        here = [r for s in decode for r in rows_at(data, s) if r["op"] == op]
        for name in dict.fromkeys(r["version"] for r in here):
            mine = [r for r in here if r["version"] == name]
            style = "o-" if mine[0]["kind"] == "version" else "s--"  # versions solid, peers dashed
            ax.plot([r["shape"].split(",")[0] for r in mine], [r[results.mkey(H, "us")] for r in mine],
                    style, label=name[:28])
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_ylabel(f"µs, {results.MODE_WORDS[H]}")
        ax.legend(fontsize=6)
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ## Try
#
# - In Part 1, make the residual the same size as x (drop the `* 4`). How many elements does the
#   first shortcut change now, and why fewer?
# - Predict the time of the unfused chain at T = 8192 from its byte table row and the copy
#   ceiling, then compare with the measurement.
