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
# # 08 · FP8 GEMM: from mma.sync to a warp-specialized blockwise wgmma
#
# y[M, N] = (A · s_a)(B · s_b)ᵀ with A and B in E4M3, FP32 accumulation, a BF16 output, and the
# scales per tensor, per row (token and output channel) or per block (DeepSeek-V3's 1 × 128 for A,
# 128 × 128 for B). Two questions: how close the chapter's versions come to the FP8 tensor cores'
# rate (and, at small M, to the copy ceiling) next to cuBLASLt, vLLM's CUTLASS kernel and
# FlashInfer's; and what promotion, the blockwise GEMM's FP32 add every 128 k, does to the error.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): the recorded run
#   `results/h200/08_fp8_gemm.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 08_fp8_gemm` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lkw import fp8_gemm, results  # noqa: E402

CHAPTER = "08_fp8_gemm"
# DeepSeek-V3's (N, K) of the issue, and the square shapes.
DEEPSEEK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
MS = (64, 128, 4096)

# %% [markdown]
# ## The bound, before any measurement
#
# Bytes, each moved once: A M·K, B N·K (one byte per element), the scales, y 2·M·N. FLOPs 2·M·N·K.
# Per byte of B (the weights) that is 2·M FLOP: the FP8 GEMM's arithmetic intensity grows with M
# as BF16's does, from half the bytes. Below, the model's FLOP per byte at the blockwise scales; the
# H200's FP8 ridge (the run's tensor rate over its copy ceiling) is a few hundred.

# %%
print(f"{'N':>6}{'K':>7}" + "".join(f"{'M=' + str(m):>12}" for m in MS) + "   (FLOP per byte)")
for n, k in DEEPSEEK:
    cells = []
    for m in MS:
        nbytes, flops = fp8_gemm.model(m, n, k, "blockwise")
        cells.append(f"{flops / nbytes:>12.0f}")
    print(f"{n:>6}{k:>7}" + "".join(cells))

# %% [markdown]
# ## Promotion, in the accumulation model
#
# Hopper's FP8 wgmma keeps fewer bits than FP32 in its running sum (about 14, DeepSeek-V3's report
# says; NVIDIA documents nothing). `lkw.fp8_gemm.tc_accumulate` models it: each k32 step aligns its
# products and the running sum to the largest and truncates below 13 fraction bits. Promoted every
# 128 k into an FP32 accumulator (v4), each run of the truncating sum stays short. On a 16 × 16
# output with rowwise scales and fresh data per K, two kinds of data: products of random sign
# (left), where the truncation errors cancel like a random walk and the BF16 output rounding still
# dominates; and products mostly of one sign (right, activations and weights of mean 1), where a
# truncating sum drifts toward zero and the unpromoted error grows with K far past the bound. The
# GPU's measurement of the same two kernels (`v4_blockwise` and `ablation_v4_no_promotion`)
# belongs next to these curves.

# %%
KS = [512, 1024, 2048, 4096, 8192, 16384]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for ax, shift, title in zip(axes, (0.0, 1.0), ("random signs", "mostly one sign")):
    sweep = fp8_gemm.promotion_sweep(np.random.default_rng(0), KS, shift=shift)
    print(f"{title}:  K, promoted, unpromoted, bound")
    for r in sweep:
        print(f"  {r['k']:>6}{r['promoted']:>11.2e}{r['unpromoted']:>11.2e}{r['bound']:>11.2e}")
    ax.loglog(KS, [r["unpromoted"] for r in sweep], "o-", label="whole K in the tensor core")
    ax.loglog(KS, [r["promoted"] for r in sweep], "s-", label="promoted every 128 k")
    ax.loglog(KS, [fp8_gemm.error_bound(k, None) for k in KS], "k--", lw=1, label="bound, unpromoted")
    ax.loglog(KS, [r["bound"] for r in sweep], "k:", lw=1, label="bound, promoted")
    ax.set_xlabel("K")
    ax.set_title(f"model, {title}")
axes[0].set_ylabel("relative Frobenius error")
axes[0].legend(fontsize=8)
plt.show()

# %% [markdown]
# ### The same two kernels on the GPU
#
# `tools/promotion.py` (stage `promotion` of `tools/device_check.sh`) runs `v4_blockwise` and
# `ablation_v4_no_promotion` on rowwise scales at these K, both kinds of data, and records the
# errors with the model's prediction for the same inputs: `results/<gpu>/experiments/08_promotion.json`.

# %%
run, whose = results.recorded("experiments/08_promotion.json")  # this GPU's, else another's, said
if run:
    if whose:
        print(whose)
    print(f"{run['gpu']}, {run['date']}, commit {run['commit']}: M = {run['m']}, N = {run['n']}")
    print(f"{'shift':>6}{'K':>7}{'promoted':>11}{'(model)':>10}{'unpromoted':>12}{'(model)':>10}")
    for r in run["rows"]:
        print(f"{r['shift']:>6g}{r['k']:>7}{r['promoted']:>11.2e}{r['model_promoted']:>10.2e}"
              f"{r['unpromoted']:>12.2e}{r['model_unpromoted']:>10.2e}")
else:
    print(f"{results.NO_MEASUREMENT} for the promotion experiment (results/<gpu>/experiments/08_promotion.json)")

# %% [markdown]
# ## The run
#
# Which GPU and commit, and what the run holds: op `fp8_gemm` (tensor and rowwise scales, `v0` …
# `v4`), op `fp8_gemm_blockwise` (`v4` and the production kernels), and the peers timed in the
# same run.

# %%
data = results.notebook_results(CHAPTER)
if data:
    H = results.headline(data)
    print(results.header_line(data))
    print(f"headline timing: {results.MODE_WORDS[H]}\n")
    seen = {}
    for r in data["rows"]:
        seen.setdefault((r["op"], r["version"]), r)
    for (op, version), r in seen.items():
        print(f"  {r['kind']:<8} {op:<19} {version:<24} {r.get('summary', '')[:60]}")

# %% [markdown]
# ## TFLOP/s per shape, versions and peers side by side
#
# Each group of bars is one shape of the run (M, N, K and the scales), each bar a version or a
# peer, in the headline timing mode.

# %%
if data:
    shapes = list(dict.fromkeys(r["shape"] for r in data["rows"]))
    names = list(dict.fromkeys(f"{r['op']}/{r['version']}" for r in data["rows"] if r["kind"] != "mutant"))
    rate = {(r["shape"], f"{r['op']}/{r['version']}"): results.rate(r, H, "tflops") for r in data["rows"]}
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + i * width for j, s in enumerate(shapes) if rate.get((s, name))]
        ys = [rate[(s, name)] for s in shapes if rate.get((s, name))]
        if xs:
            ax.bar(xs, ys, width, label=name.split("/", 1)[1] + (" (block)" if "blockwise" in name else ""))
    ax.set_xticks([j + 0.4 for j in range(len(shapes))])
    ax.set_xticklabels([s.replace(",", "\n") for s in shapes], fontsize=6)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{CHAPTER}: {results.MODE_WORDS[H]}")
    ax.legend(fontsize=6, ncol=3)
    plt.show()
    best = {}
    for r in data["rows"]:
        t = rate.get((r["shape"], f"{r['op']}/{r['version']}"))
        if t and r["kind"] == "version" and t > best.get(r["shape"], (0, ""))[0]:
            best[r["shape"]] = (t, r["version"])
    for shape, (t, version) in list(best.items())[:20]:
        print(f"  {shape:<40} best version {version:<22} {t:8.1f} TFLOP/s")
