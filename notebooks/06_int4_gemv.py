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
# # 06 · INT4 GEMV: speed-up over cuBLAS BF16 against the batch size M
#
# The headline question of weight-only quantization at decode: how much faster is a GEMV on INT4
# weights than cuBLAS on BF16 weights, for M = 1 … 16 tokens? The ideal answer is the ratio of the
# bytes the two must read (both at the bandwidth bound); the measured answer is each version's.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/06_int4_gemv.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 06_int4_gemv` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
from lkw import results  # noqa: E402

CHAPTER = "06_int4_gemv"

# %% [markdown]
# ## The bound, before any measurement
#
# Bytes per GEMV: INT4 reads N·K/2 of weights plus a BF16 scale per 128 of them; BF16 reads N·K·2.
# Both read x (M·K·2) and write y (M·N·2). The ideal speed-up is the ratio of the two.

# %%
def ideal_speedup(m, n, k, g=128):
    act = 2 * m * k + 2 * m * n
    return (2 * n * k + act) / (n * k / 2 + n * (k // g) * 2 + act)


for n, k in [(28672, 8192), (4096, 4096)]:
    cells = "  ".join(f"M={m}: {ideal_speedup(m, n, k):.2f}x" for m in (1, 2, 4, 8, 16))
    print(f"N={n:>5}, K={k:>4}  {cells}")

# %% [markdown]
# ## The measured versions

# %%
data = results.notebook_results(CHAPTER)
if data:
    print()
    print(results.text_table(data))


# %%
def parse(shape):
    return {kv.split("=")[0]: int(kv.split("=")[1]) for kv in shape.split(",")}


def speedups(data, n, k, key="time_us"):
    """{name: [(M, cuBLAS time / its time)]} at one (N, K), for the versions and torch peers;
    key="back_to_back_us" compares the back-to-back times, key="graph_us" those in a CUDA graph."""
    cublas = {parse(r["shape"])["m"]: r[key] for r in data["rows"]
              if r["op"] == "bf16_gemv" and r.get(key) and parse(r["shape"])["n"] == n
              and parse(r["shape"])["k"] == k}
    out = {}
    for r in data["rows"]:
        s = parse(r["shape"])
        if r["op"] == "bf16_gemv" or not r.get(key) or (s["n"], s["k"]) != (n, k):
            continue
        if s["m"] in cublas:
            out.setdefault(f"{r['op']}/{r['version']}", []).append((s["m"], cublas[s["m"]] / r[key]))
    return out


# %% [markdown]
# One panel per weight shape: the speed-up over cuBLAS BF16 at each M, every version and peer, and
# the bound's ideal curve (dashed). Where a version falls away from the dashed line, it stopped
# being bound by bytes. The first row compares one launch at a time (L2 flushed before each); the
# second, where the run has it, the same launches back to back, as a decoder's stream runs them;
# the third, where the run has it, those launches captured once in a CUDA graph and replayed, as a
# decoder that captures its step runs them (each timed the same way for cuBLAS and the peers).


# %%
def panels(data, key, title, axes):
    shapes = sorted({(parse(r["shape"])["n"], parse(r["shape"])["k"]) for r in data["rows"]})
    for ax, (n, k) in zip(axes, shapes):
        ms = [1, 2, 4, 8, 16]
        ax.plot(ms, [ideal_speedup(m, n, k) for m in ms], "k--", label="ideal (bytes)")
        for name, pts in speedups(data, n, k, key).items():
            pts.sort()
            ax.plot([m for m, _ in pts], [s for _, s in pts], "o-", label=name)
        ax.axhline(1, color="gray", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("cuBLAS BF16 time / time")
        ax.set_title(f"{title}: N={n}, K={k}", fontsize=9)
        ax.legend(fontsize=6)


if data:
    shapes = {(parse(r["shape"])["n"], parse(r["shape"])["k"]) for r in data["rows"]}
    ways = [(key, title) for key, title in [("time_us", "one launch"), ("back_to_back_us", "back to back"),
                                            ("graph_us", "in a CUDA graph")]
            if any(r.get(key) for r in data["rows"])]
    fig, axes = plt.subplots(len(ways), len(shapes), figsize=(5.5 * len(shapes), 4 * len(ways)), squeeze=False)
    for row, (key, title) in zip(axes, ways):
        panels(data, key, title, row)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ## Reading the panels
#
# - `v0` … `v2` do their multiply-adds on the CUDA cores: one FMA per weight and row of x, so
#   their curves fall as M grows.
# - `v3`, `v4` and `v5` hand the multiply-adds to the tensor cores: their time is nearly flat in
#   M, so their speed-up follows the dashed line's shape, below it by a factor that is the same at
#   every M up to 8. That factor is the work around the mma: the SM still moves every nibble into
#   a mantissa itself, and at M = 1 that instruction stream, not HBM, sets the pace (the book's
#   chapter 06 has the profile and the probe that takes it apart). `v5` unpacks into FP16, two
#   nibbles per half word, and gains at M ≤ 2; from M = 4 it runs `v4`'s kernel. `v6` shares a
#   block's steps evenly over its warps where whole tiles would fall unevenly on the schedulers
#   (28672 × 8192, most M) and runs `v5`'s kernel elsewhere, where balancing's tail after the
#   loop would cost more than it gains. `v7` runs `v5`'s kernel with one step in flight per warp
#   instead of three: the bytes in flight were far more than the bandwidth needs, and every other
#   access (x, the split-K sums) waited behind them; and it cuts a block's partial last round of
#   tiles at half tiles, so that every scheduler gets the same share. It flattens the curve up to
#   M = 8 at the large shapes and gains most at M = 8 and 16.
# - `v8` is `v7` launched as a programmatic dependent: back to back its blocks start as the
#   kernel before finishes, with the weights' first copies already on their way, and only x waits
#   for the kernel before. It is slower one launch at a time (x after the ring) and the fastest in
#   the back-to-back row almost everywhere; compare its curve with `v7`'s in the two rows.
# - `v9` is `v8` at M ≤ 2 with its two ends reworked: at M = 1 (and at M = 2 up to K = 8192) each
#   block holds the whole row of x and its tiles' K split is summed in shared memory (no split-K
#   finish through global memory, about 2 µs at the end of the kernel at 8192 × 28672), and the
#   BF16 fold's Σx pass runs over the rows of x only, on the tensor cores (x in A, a one-hot B).
#   Past M = 2 it is `v8`; back to back and in a graph it is below `v8` at every shape at M ≤ 2 in
#   the recorded run, most at 14336 × 4096, M = 2, where `v8` splits K in two.
# - `v10` is `v9` with every tile's walk along K rotated by a hash of the tile, so that the warps
#   reading at the same moment read at different offsets of their rows: the same bytes, asked of
#   the DRAM in another order. Back to back and in a graph it is below `v9` where the warps' runs
#   line up (the 70B shapes and 8192 × 8192 at M ≤ 2, by 0.4 to 1.1 µs) and within a few tenths
#   elsewhere; compare the two curves at M = 1 and 2.
# - `v11` is `v9` (and `v8` past M = 2) with every copy asking L2 for its own 128-byte line instead
#   of the aligned 256-byte pair: with pairs, every warp asks the DRAM for new bytes only on every
#   second step, all at once; with lines, on every step. In the recorded run it is the fastest
#   of `int4i_gemv`'s versions back to back at 23 of the 30 shapes and in a graph at 24, gains
#   most over `v8` past M = 2 (2.48 µs back to back at M = 8, 8192 × 28672) and needs no
#   rotation. At M ≤ 2 on the 70B shapes it trails `v10` by 0.37 to 0.65 µs back to back in the
#   recorded run and led it at every shape with M ≤ 2 in the run before
#   (`results/h200/history/06_int4_gemv_87c1cce.json`): there the two are within the runs'
#   spread of each other. Compare its curve with `v10`'s and `v8`'s.
# - `int4t_gemv/v12_tiled_weights` is `v11`'s kernel on the same words stored in the order it
#   reads them (tiles of 16 rows, steps of 256 k: each warp step 2 KB of contiguous memory), a new
#   op because the layout is new. Its curve sits above `v11`'s where the rows are long (at M = 1
#   to 8 on the 70B shapes, 0.7 to 1.5 µs faster back to back in the recorded run) and on it
#   elsewhere.
# - `int4t_gemv/v13_consecutive_tiles` is `v12`'s kernel with each block's tiles next to one
#   another in memory instead of 132 tiles apart. Its curve lies on `v12`'s but at M ≤ 2 on
#   28672 × 8192, where a block holds 13 or 14 tiles: there it is 0.3 to 0.5 µs faster back to
#   back and in a graph.
# - `int4t_gemv/v14_evict_first` is `v13` with the weights copied under an L2 evict_first policy,
#   so that the lines the kernel reads again (scales, x) stay in L2 while the weights stream past.
#   Its curve lies a little above `v13`'s at M ≤ 2 on the 70B shapes (0.2 to 0.3 µs back to back
#   in the run of 9b072d6, 0.07 to 0.43 µs in the recorded run) and on it elsewhere; at M = 1 on
#   the 70B shapes, one launch at a time, it is level with `v7`, `v13` and `v15` (within 0.2 µs,
#   whichever the run puts first). Its input sets rotate past the
#   weights (the book's `v14` section says why).
# - `int4t_gemv/v15_block_scales` is `v14` with the scales copied 8 steps at a time, 16 bytes a
#   lane, where the block split leaves K whole at M ≤ 2; elsewhere it runs `v14`'s kernels. There
#   its curve lies a little above `v14`'s back to back and in a graph (0.29 to 0.53 µs at M = 1 on
#   the 70B shapes and M = 2 on 28672 × 8192 in the recorded run). It is the version that reaches
#   3.5× cuBLAS back to back and in a graph at M = 1 on both 70B shapes, in the recorded run and in
#   the one before it, where the margin was thin (the book's Results read both); one launch at a
#   time it is level with `v14`.
# - In a CUDA graph (the third row) the launches reach the SMs faster than from a stream: `v7`
#   comes close to `v8` there, and `v9` to `v15` gain a little over their back-to-back time,
#   about the same share of their time as cuBLAS does, so the ratios hardly move (the book's
#   section "In a CUDA graph").
# - At the small shape the fixed costs of a launch (a first memory round trip, filling the SMs,
#   `v4` staging x) are a large part of a few microseconds, and the simpler versions can win.

# %% [markdown]
# ## Try
#
# - Predict from the ideal curve where the INT4 advantage would vanish if M kept growing, then
#   compare with chapter 07's Tensor Core GEMM, which is built for that regime.
