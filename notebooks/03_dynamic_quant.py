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
# # 03 · Dynamic quantization: one absmax per row, per tensor, per group
#
# Part 1 needs neither a GPU nor a measurement: it quantizes activations with outliers through the
# chapter's reference (`lkw.quant`, the contract the kernels match bit for bit) and compares the
# error of the three granularities. Part 2 shows the measured versions and their torch peers.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/03_dynamic_quant.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 03_dynamic_quant` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import formats, golden, quant, results  # noqa: E402

CHAPTER = "03_dynamic_quant"

# %% [markdown]
# ## Part 1 · Outliers: why a scale per token
#
# 64 tokens of 4096 BF16 activations, rows of different magnitude (each row times 2^u,
# u uniform in [−4, 4]), then 8 elements multiplied by 100 — the data the chapter's tests use.
# Each granularity quantizes to E4M3 and dequantizes; the error is ‖x̂ − x‖ / ‖x‖ per token.

# %%
seed = np.random.SeedSequence().entropy % 2**32  # fresh each run; set it to replay one
print("seed", seed)
rng = np.random.default_rng(seed)
x = golden.with_outliers(rng, golden.activations(rng, 64, 4096))
x32 = formats.bf16_to_f32(x).astype(np.float64)


def token_errors(kind):
    q, scales = getattr(quant, kind)(x)
    xq = quant.dequantize(q, scales, kind)
    return np.linalg.norm(xq - x32, axis=1) / np.linalg.norm(x32, axis=1)


errors = {kind: token_errors(kind) for kind in ("per_tensor_fp8", "per_token_fp8", "per_group_fp8")}
for kind, e in errors.items():
    print(f"{kind:<15} median token error {np.median(e):.4f}   worst token {e.max():.4f}")

q, scale = quant.per_tensor_fp8(x)
codes = np.asarray(q).view(np.uint8) & 0x7F
subnormal = (codes > 0) & (codes < 0x08)
print(f"\nper tensor: scale {float(scale[0]):.4g}; {subnormal.mean():.1%} of the codes are E4M3 "
      f"subnormals (3 bits or fewer), {(codes == 0).mean():.1%} are zero")
q, scales = quant.per_token_fp8(x)
codes = np.asarray(q).view(np.uint8) & 0x7F
print(f"per token:  {((codes > 0) & (codes < 0x08)).mean():.1%} subnormal codes, "
      f"{(codes == 0).mean():.1%} zero")

# %% [markdown]
# One line per token, sorted: the per-tensor scale follows the largest outlier of the whole
# tensor, so the quiet rows lose most of their bits; per token each row keeps its own range, and
# per group (1 × 128) confines an outlier to its 128 neighbours.

# %%
fig, ax = plt.subplots(figsize=(8, 4))
for kind, e in errors.items():
    ax.plot(np.sort(e), label=kind)
ax.set_yscale("log")
ax.set_xlabel("token (sorted by error)")
ax.set_ylabel("relative error of the token")
ax.set_title("E4M3 quantization error, 64 tokens with 8 outliers x100")
ax.legend()
plt.show()

# %% [markdown]
# ## The per-group scales are column-major
#
# For T tokens and d/128 groups the scales are stored as `[d/128, T]`: the T scales of one group
# sit next to each other, the layout an FP8 GEMM with 1 × 128 activation scales reads. Element
# [g, t] is the scale of token t, group g.

# %%
small = golden.activations(rng, 3, 256)
_, group_scales = quant.per_group_fp8(small)
print("x:", small.shape, " scales:", group_scales.shape, " (d/128, T)")
print(group_scales)

# %% [markdown]
# ## Part 2 · The measured versions

# %%
data = results.notebook_results(CHAPTER)
if data:
    print(results.summary_text(data))

# %% [markdown]
# Prefill: one group of bars per op, one bar per version and peer, at the prefill shapes
# (T = 8192), in the run's headline mode. Every op reads 2 bytes and writes 1 per element, so the
# bars are comparable against the copy ceiling of the same run.

# %%
def shape_rows(data, shape):
    return [r for r in data["rows"] if r["shape"] == shape and results.rate(r, H)]


if data:
    H = results.headline(data)  # the timing mode the figures show: the graph, where timed
    ceiling, _ = results.ceiling_of(data, H)
    prefill = [s for s in dict.fromkeys(r["shape"] for r in data["rows"]) if s.startswith("t=8192")]
    fig, axes = plt.subplots(1, len(prefill), figsize=(6 * len(prefill), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], prefill):
        rows = shape_rows(data, shape)
        ops = list(dict.fromkeys(r["op"] for r in rows))
        names = list(dict.fromkeys(r["version"] for r in rows))
        width = 0.8 / len(names)
        for j, name in enumerate(names):
            placed = [(i, next((r for r in rows if r["op"] == op and r["version"] == name), None))
                      for i, op in enumerate(ops)]
            placed = [(i, r) for i, r in placed if r]
            ax.bar([i - 0.4 + (j + 0.5) * width for i, _ in placed], [results.rate(r, H) for _, r in placed],
                   width, label=name)
        ax.axhline(ceiling, color="black", label="copy ceiling")
        ax.set_xticks(range(len(ops)), ops, rotation=15)
        ax.set_ylabel(f"GB/s (model bytes / time, {results.MODE_WORDS[H]})")
        ax.set_title(shape)
        ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# Decode: at T = 1, 16 and 64 tokens the bytes are a few kilobytes and the time is the launch and
# one pass through a block. The latency in microseconds per op, versions and peers, on a log scale
# (the torch peers run several kernels each and take many times longer):

# %%
if data:
    decode = [s for s in dict.fromkeys(r["shape"] for r in data["rows"]) if not s.startswith("t=8192")]
    ops = list(dict.fromkeys(r["op"] for r in data["rows"]))
    fig, axes = plt.subplots(1, len(ops), figsize=(4 * len(ops), 3.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for name in dict.fromkeys(r["version"] for r in data["rows"] if r["op"] == op):
            pts = [(s, results.find_row({"rows": [r for r in data["rows"] if r["shape"] == s]}, op, name))
                   for s in decode]
            pts = [(s, r[results.mkey(H, "us")]) for s, r in pts if r and r.get(results.mkey(H, "us"))]
            if pts:
                ax.plot([s.split(",")[0] for s, _ in pts], [t for _, t in pts], "o-", label=name)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_ylabel(f"µs, {results.MODE_WORDS[H]}")
        ax.legend(fontsize=6)
    plt.show()

# %% [markdown]
# ## Try
#
# - In Part 1, move the outliers into one token (`x[5, :8] *= 100` before quantizing) and compare
#   the three granularities again. Which one is hurt now, and which token?
# - Quantize with `scale_ub` set to the median absmax of the rows
#   (`quant.per_token_fp8(x, scale_ub=...)`): which elements saturate at ±448?
