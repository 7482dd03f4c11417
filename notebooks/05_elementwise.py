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
# # 05 · Elementwise: gated activations, RoPE, QK-norm and the KV cache
#
# Part 1 needs neither a GPU nor a measurement: the byte table of the chapter's ops from their
# models (`lkw.elementwise`), and one rounding point of the RoPE contract shown with the reference.
# Part 2 shows the measured versions and peers: each op at prefill size against the copy ceiling,
# and the decode latencies.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): the recorded run
#   `results/h200/05_elementwise.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 05_elementwise` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import elementwise, results  # noqa: E402

CHAPTER = "05_elementwise"

# %% [markdown]
# ## Part 1 · The bytes each op must move
#
# At T = 8192 tokens of Llama-3-8B (d_ff 14336; 32 q heads and 8 k heads of 128), from the
# chapter's byte models: each input read once, each output written once. The unfused rows are the
# chains the fused versions replace, which write an intermediate tensor and read it back.

# %%
t, d_ff, hq, hk, d = 8192, 14336, 32, 8, 128
act, heads, kv = t * d_ff, t * (hq + hk) * d, t * hk * d  # elements per op
table = [
    ("silu_and_mul", elementwise.act_and_mul_bytes(t, d_ff), act),
    ("silu_and_mul + FP8 per token, fused",
     elementwise.silu_and_mul_fp8_bytes(t, d_ff, "per_token"), act),
    ("silu_and_mul, then the quant kernel",
     elementwise.silu_and_mul_fp8_bytes(t, d_ff, "per_token", False), act),
    ("rope", elementwise.rope_bytes(t, hq, hk, d), heads),
    ("qk_norm_rope, fused", elementwise.qk_norm_rope_bytes(t, hq, hk, d, d), heads),
    ("norm pass, then rope pass", elementwise.qk_norm_rope_bytes(t, hq, hk, d, d, False), heads),
    ("reshape_and_cache, BF16", elementwise.reshape_and_cache_bytes(t, hk, d, "bfloat16"), kv),
    ("reshape_and_cache, FP8", elementwise.reshape_and_cache_bytes(t, hk, d, "float8_e4m3fn"), kv),
]
print(f"{'op':<40}{'MB':>9}{'B per element':>15}")
for name, nbytes, elements in table:
    print(f"{name:<40}{nbytes / 1e6:>9.1f}{nbytes / elements:>15.2f}")

# %% [markdown]
# ## Part 1 · The angle is rounded to FP32 before its cosine
#
# The cos/sin cache holds cos and sin of fp32(p · inv_freq[j]): one FP32 multiply, as vLLM builds
# it. The exact angle p · inv_freq[j] differs from that product by up to half an FP32 ulp of the
# angle, which grows with the position. Below, the largest difference over the 64 frequencies of
# rot_dim = 128, against the position, beside half a BF16 ulp of a rotated value of size 1: past
# a few thousand tokens the angle's rounding alone can move a BF16 result, so a kernel that computes
# its angles another way (in float64, or as p · inv_freq with an FMA) does not match the contract.

# %%
rot = 128
inv = elementwise.inv_freq(rot).astype(np.float64)
positions = np.unique(np.geomspace(1, 131072, 200).astype(np.int64))
exact = positions[:, None] * inv[None, :]
rounded = (positions.astype(np.float32)[:, None] * inv.astype(np.float32)[None, :]).astype(
    np.float64
)
worst = np.max(np.abs(rounded - exact), axis=1)
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.loglog(positions, np.maximum(worst, 1e-12), label="|fp32(p · inv_freq) − p · inv_freq|, worst j")
ax.axhline(2.0**-9, color="k", ls="--", lw=1, label="half a BF16 ulp of a value in [1, 2)")
ax.set_xlabel("position p")
ax.set_ylabel("radians")
ax.legend(fontsize=8)
plt.show()
for p in (1024, 8192, 131072):
    i = np.searchsorted(positions, p)
    print(f"p = {positions[i]:>6}: the FP32 angle is off by up to {worst[i]:.1e} rad")

# %% [markdown]
# ## Part 2 · The measured versions

# %%
data = results.notebook_results(CHAPTER)
if data:
    # Three ops here (one screen); every op: print(results.summary_text(data))
    print(results.summary_text(data, ops=("silu_and_mul", "rope", "reshape_and_cache")))

# %% [markdown]
# ### Each op at prefill size
#
# Percent of the copy ceiling (the run's chapter 00 copy kernel, same mode) at T = 8192, versions
# in blue and peers in gray, one panel per op and model. An op of the fused kind is held to the
# bytes of its own model, so a fused version and its unfused chain are on one scale.

# %%
def rows_at(data, shape):
    return [r for r in data["rows"] if r["shape"] == shape and r.get(results.mkey(H, "us"))
            and r["kind"] in ("version", "peer")]


def pct(row):
    return results.pct_ceiling(row, H, data) or 0.0


if data:
    H = results.headline(data)  # the timing mode the figures show: the graph, where timed
    shapes = [s for s in dict.fromkeys(r["shape"] for r in data["rows"]) if s.startswith("t=8192,")]
    panels = [(op, s) for s in shapes for op in dict.fromkeys(r["op"] for r in rows_at(data, s))]
    cols = 2
    fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, squeeze=False,
                             figsize=(11, 3.2 * ((len(panels) + cols - 1) // cols)))
    for ax, (op, shape) in zip(axes.flat, panels):
        rows = [r for r in rows_at(data, shape) if r["op"] == op]
        colors = ["tab:blue" if r["kind"] == "version" else "tab:gray" for r in rows]
        ax.barh(range(len(rows)), [pct(r) for r in rows], color=colors)
        ax.set_yticks(range(len(rows)), [r["version"][:34] for r in rows], fontsize=7)
        ax.axvline(100, color="k", lw=0.8)
        ax.set_xlabel(f"% of the copy ceiling, {results.MODE_WORDS[H]}")
        ax.set_title(f"{op}\n{shape}", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ### Decode latency
#
# At T ≤ 128 an op moves a few hundred kilobytes at most: the time is a launch and one trip
# through memory, not bandwidth. Microseconds per op, the fastest version against the fastest
# peer, for every decode shape of the run (the goal: ≤ 4 µs in a CUDA graph).

# %%
if data:
    decode = [s for s in dict.fromkeys(r["shape"] for r in data["rows"])
              if int(s.split(",")[0].split("=")[1]) <= 128]
    labels, best_version, best_peer = [], [], []
    for shape in decode:
        for op in dict.fromkeys(r["op"] for r in rows_at(data, shape)):
            rows = [r for r in rows_at(data, shape) if r["op"] == op]
            mine = [r[results.mkey(H, "us")] for r in rows if r["kind"] == "version"]
            peers = [r[results.mkey(H, "us")] for r in rows if r["kind"] == "peer"]
            labels.append(f"{op} {shape.split(',')[0]} {shape.split(',')[-1]}")
            best_version.append(min(mine) if mine else 0.0)
            best_peer.append(min(peers) if peers else 0.0)
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.2))
    ys = np.arange(len(labels))
    ax.barh(ys - 0.2, best_version, 0.4, label="fastest version", color="tab:blue")
    ax.barh(ys + 0.2, best_peer, 0.4, label="fastest peer", color="tab:gray")
    ax.axvline(4.0, color="k", ls="--", lw=0.8, label="4 µs")
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel(f"µs, {results.MODE_WORDS[H]}")
    ax.legend(fontsize=8)
    plt.show()

# %% [markdown]
# ## Try
#
# - From the byte table and the run's copy ceiling, predict `silu_and_mul`'s time at T = 8192
#   before looking it up. How far is `v1` from the prediction, and `v0`?
# - Part 1 shows the FP32 angle's error at p = 131072. How many BF16 outputs of a rotation of
#   random heads change if the cache is built from the exact angle instead? (`elementwise.rope` with
#   two caches.)
# - The paged layout's value cache is written as a column. Compare its row with the NHD row at
#   the same T: what does the difference cost per token?
