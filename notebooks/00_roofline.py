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
# # 00 · Roofline: the ceilings of this GPU
#
# Chapter 00 measures the two ceilings every later chapter is judged against: the bandwidth of
# the best copy kernel and the BF16 rate of cuBLAS. This notebook shows one such run.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/00_roofline.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 00_roofline` and shows what it just measured.
#
# Without a recorded run the cells below say so and skip their work.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import results  # noqa: E402

CHAPTER = "00_roofline"
data = results.notebook_results(CHAPTER)

# %% [markdown]
# ## The measured run, one screen per op
#
# Time is the median of many launches in the run's headline mode (in a CUDA graph where the run
# timed one); *% of ceiling* is the achieved rate (model bytes / time) relative to the best copy of
# the same run. `print(results.text_table(data))` prints every timing mode, the DRAM bytes and the
# peers' ratios.

# %%
if data:
    print(results.summary_text(data))

# %% [markdown]
# ## The copy versions against the ceiling
#
# One bar per version. The solid line is the run's ceiling, the dashed line the driver's
# `cudaMemcpy`. Going from `v0_scalar` to `v1_vec16` quadruples the bytes per instruction;
# `v2_inflight` keeps four 16-byte loads in flight per thread (Little's law).

# %%
if data:
    H = results.headline(data)
    copies = results.rows(data, op="copy", kind="version")
    memcpy = results.find_row(data, "copy", "cuda_memcpy")
    gbps = [results.rate(r, H) or 0 for r in copies]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar([r["version"] for r in copies], gbps, color="tab:blue")
    ax.bar_label(bars, labels=[f"{results.pct_ceiling(r, H, data) or 0:.1f}%" for r in copies])
    ceiling, _ = results.ceiling_of(data, H)
    ax.axhline(ceiling, color="black", label=f"ceiling {ceiling:.0f} GB/s")
    if memcpy and results.rate(memcpy, H):
        ax.axhline(results.rate(memcpy, H), color="tab:orange", ls="--",
                   label=f"cudaMemcpy {results.rate(memcpy, H):.0f} GB/s")
    ax.set_ylim(0, 1.3 * max([ceiling] + gbps))  # room for the legend
    ax.set_ylabel(f"GB/s (model bytes / time, {results.MODE_WORDS[H]})")
    ax.set_title(f"copy, {copies[0]['shape']}  ({data['gpu']})")
    ax.legend(loc="upper left", ncol=2)
    plt.show()

# %% [markdown]
# ## The roofline of this run
#
# Attainable FLOP/s = min(P, I × BW), with BW the copy ceiling and P the cuBLAS BF16 rate, both from
# the run above. The vertical lines place a BF16 matrix product C[M,N] = A[M,K]·B[N,K]ᵀ with
# N = K = 4096 on the intensity axis: its model is F = 2MNK FLOP over B = 2(MK + NK + MN) bytes.
# One token (M = 1) sits near 1 FLOP/byte, deep in the memory-bound region.

# %%
ridge = results.ridge_point(data) if data else None
if ridge:
    flop_per_byte, gemm = ridge
    bandwidth = data["ceiling_gbps"] * 1e9  # bytes/s
    peak = gemm["tflops"] * 1e12  # FLOP/s
    intensity = np.logspace(-1, 4, 400)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(intensity, np.minimum(peak, intensity * bandwidth) / 1e12, color="black", lw=2)
    ax.axvline(flop_per_byte, color="gray", ls=":", label=f"ridge {flop_per_byte:.0f} FLOP/byte")
    N = K = 4096
    for M, color in zip((1, 16, 256, 4096), plt.cm.viridis(np.linspace(0, 0.9, 4))):
        gemm_intensity = 2 * M * N * K / (2 * (M * K + N * K + M * N))
        ax.axvline(gemm_intensity, color=color, ls="--",
                   label=f"BF16 GEMM M={M}: {gemm_intensity:.0f} FLOP/byte")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"roofline of this run ({data['gpu']})")
    ax.legend(fontsize=8, loc="lower right")
    plt.show()
elif data:
    print("This run has no FLOP-rate row, so there is no roofline to draw.")

# %% [markdown]
# ## Try
#
# - Live mode: change `kUnroll` in `solutions/00_roofline/v2_inflight.cu` (1, 2, 8), rebuild, rerun
#   this notebook. Where does one more load in flight stop helping?
# - Compare `v0_scalar` with the Little's-law estimate in the book: how much latency would make
#   4 bytes in flight per thread enough?
