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
# # 02 · INT4 dequantization: magic numbers, instruction mix, measured versions
#
# Part 1 needs neither a GPU nor a measurement: numpy takes the chapter's example word through the
# magic-number unpack, bit by bit. Part 2 shows the instruction mix of the build
# (`results/sass/mix.json`, read from the compiled binary: no GPU either). Part 3 shows the measured
# versions side by side, and the instruction mix against the measured time.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/02_int4_dequant.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 02_int4_dequant` and shows what it just measured.
#
# Without a recorded run, Part 3 says so and skips its work; Parts 1 and 2 run anyway.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from lkw import int4, results  # noqa: E402

CHAPTER = "02_int4_dequant"
SHAPE = "n=8192,k=8192,g=128"  # the shape at which every op of the chapter is measured


def halves(word, dtype=np.float16):
    """The two 16-bit floats of a 32-bit word, (low half, high half), as float64."""
    return np.array([word], np.uint32).view(dtype).astype(np.float64)


def nibbles(word):
    """The 4-bit values of a word by nibble position, lowest first."""
    return [(word >> (4 * p)) & 0xF for p in range(8)]


# %% [markdown]
# ## Part 1 · One word through the FP16 magic numbers
#
# `lop3` evaluates any three-input bitwise function; its immediate is the function applied to the
# patterns 0xF0, 0xCC, 0xAA. For (a & b) | c that is 0xEA. `0x6400` is FP16 1024.0, whose last
# mantissa bit is worth 1, so `0x6400 | m` reads 1024 + m: the low nibble of each half gives
# 1024 + q (minus 1032 leaves q − 8), the second nibble gives 1024 + 16q (× 1/16 − 72 leaves q − 8).
# Every value here is exact in FP16, so float64 arithmetic shows what the FP16 instructions compute.

# %%
AND_OR = (0xF0 & 0xCC) | 0xAA
print(f"lop3 immediate for (a & b) | c: 0x{AND_OR:02X}")
print(f"0x6400 = {halves(0x64006400)[0]:g}, 0x6408 = {halves(0x64086408)[0]:g}, "
      f"0x2C00 = {halves(0x2C002C00)[0]:g}, 0xD480 = {halves(0xD480D480)[0]:g}")

WORD = 0x9A3F61C2
print(f"\nword 0x{WORD:08X}, nibbles by position: {nibbles(WORD)}")
pairs = []
q = WORD
for _ in range(2):  # two byte pairs per word: the second after q >>= 8
    lo = (q & 0x000F000F) | 0x64006400  # one LOP3 0xEA
    hi = (q & 0x00F000F0) | 0x64006400  # one LOP3 0xEA
    lo_v, hi_v = halves(lo), halves(hi)
    print(f"q = 0x{q:08X}")
    print(f"  q & 0x000F000F | 0x64006400 = 0x{lo:08X} reads {lo_v}, - 1032      -> {lo_v - 1032}")
    print(f"  q & 0x00F000F0 | 0x64006400 = 0x{hi:08X} reads {hi_v}, / 16 - 72 -> {hi_v / 16 - 72}")
    pairs += [lo_v - 1032, hi_v / 16 - 72]
    q >>= 8
magic = np.concatenate(pairs).astype(int)
print("\nthe four pairs, in the order the unpack makes them:", magic.tolist())

# %% [markdown]
# ## Which elements the pairs are: the interleaved order
#
# The pairs come from nibble positions (0, 4), (1, 5), (2, 6), (3, 7). Read in the natural order
# (element j in nibble j), those are elements (0, 4), (1, 5), … — not neighbours. In the interleaved
# order (position p holds element PERM[p]) they are (0, 1), (2, 3), …: the output row in order.

# %%
w = np.array([WORD], np.uint32)  # one word: K = 8
as_interleaved = int4.unpack(w, interleaved=True).astype(int) - 8
print("PERM =", int4.PERM)
print("read as interleaved, q - 8 in element order:", as_interleaved.tolist())
print("read as natural,     q - 8 in element order:", (int4.unpack(w).astype(int) - 8).tolist())
assert magic.tolist() == as_interleaved.tolist()

repacked = int(int4.interleave(w)[0])
print(f"\nthe natural word 0x{WORD:08X} repacked offline: 0x{repacked:08X}")
q, pairs = repacked, []
for _ in range(2):
    pairs += [halves((q & 0x000F000F) | 0x64006400) - 1032,
              halves((q & 0x00F000F0) | 0x64006400) / 16 - 72]
    q >>= 8
print("the same instructions on it:", np.concatenate(pairs).astype(int).tolist(),
      "= the natural word's elements in order")

# %% [markdown]
# ## BF16: 0x4300 = 128, one mask, shifts by 4
#
# BF16 has 7 mantissa bits, and bit 7 of a half is already exponent, so the high-nibble trick has no
# room. Every pair takes the low-nibble path: mask 0x000F000F, OR 0x4300 (128 + q), subtract 136,
# shift the word by 4.

# %%
q, bf16 = WORD, []
for _ in range(4):
    v = halves((q & 0x000F000F) | 0x43004300, ml_dtypes.bfloat16)
    bf16.append(v - 136)
    q >>= 4
print("BF16 pairs:", np.concatenate(bf16).astype(int).tolist(), "(the same as FP16)")

# %% [markdown]
# ## Zero points: q·s − z·s rounds z·s first
#
# With s = 0x3C01 (1 + 2^-10) and z = 3, z·s is a tie in FP16 and rounds to the even neighbour.
# The FMA q·s + (−z·s) rounds once, but z·s was already rounded, so the result can differ from
# s·(q − z) rounded once.

# %%
s = np.array([0x3C01], np.uint16).view(np.float16)[0]
z = 3
zs = np.float16(z * float(s))  # rounded once per group, as the kernel keeps it
print(f"s = {float(s)!r}, z·s = {z * float(s)!r} -> FP16 {float(zs)!r} "
      f"(0x{zs.view(np.uint16):04X})")
for q in (3, 4):
    fused = np.float16(q * float(s) - float(zs))  # the FMA: exact, then one rounding
    direct = np.float16(float(s) * (q - z))
    print(f"q = {q}: q·s − z·s = {float(fused)!r} (0x{fused.view(np.uint16):04X}),"
          f"  s·(q − z) = {float(direct)!r} (0x{direct.view(np.uint16):04X})")

# %% [markdown]
# ## 8-bit weights: INT8 by byte permute, FP8 by moving bits
#
# `__byte_perm(q, 0x64646464, 0x4140)` builds the halves 0x64|b0 and 0x64|b1 (1024 + b); minus
# 1152 leaves b − 128. An E4M3 byte s.eeee.mmm placed as the FP16 s.0eeee.mmm0000000 reads as its
# value / 256. The bit move is checked here on all 254 finite E4M3 codes against ml_dtypes.

# %%
codes = [(WORD >> (8 * i)) & 0xFF for i in range(4)]
int8 = [float(np.array([0x6400 | b], np.uint16).view(np.float16)[0]) - 1152 for b in codes]
print("bytes", [f"0x{b:02X}" for b in codes], "-> b - 128 by the magic:", int8)

e4m3 = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint16)  # no NaN codes
x = e4m3 << 8
placed = (x & 0x8000) | ((x >> 1) & 0x3F80)  # keep the sign, move the rest right by one
shifted = placed.view(np.float16).astype(np.float64) * 256
expected = e4m3.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
print(f"E4M3 bit move x 256 equals ml_dtypes on {int((shifted == expected).sum())} of {len(e4m3)} "
      "finite codes")

# %% [markdown]
# ## Part 2 · The instruction mix of the build (no GPU needed)
#
# Static counts of each version's kernel for sm_90a, as the book shows them. Dividing by the
# weights the code converts gives instructions per weight: the kernel of `v1`…`v6` holds two
# copies of a loop over a thread's two units of 8 weights (32), a thread of `v0_naive` one weight.

# %%
print(results.sass_mix_text(CHAPTER))
mix = results.mix_rows(CHAPTER)


def weights_per_thread(version):
    """v0 converts one weight per thread; v1..v6 two loops over two units of 8 (int4_dequant.cuh)."""
    return 1 if version == "v0_naive" else 32


GROUPS = {  # opcode families, stacked in the plot
    "convert (I2F, F2FP)": ["I2F", "F2FP"],
    "bits (LOP3, PRMT, SHF)": ["LOP3", "PRMT", "SHF"],
    "16-bit math (HADD2, HFMA2, HMUL2)": ["HADD2", "HFMA2", "HMUL2"],
    "memory (LDG, STG)": ["LDG", "STG"],
}

# %% [markdown]
# Instructions per weight for `v1`…`v6`, by family; "the rest" is index math, bounds checks and
# early exits, and the padding after the kernel's last instruction. `v0_naive` runs its whole
# kernel for each weight, far off this scale, so it is printed instead of drawn.

# %%
if mix:
    for r in mix:
        if r["version"] == "v0_naive":
            print(f"{r['op']}/{r['version']}: {r['total']} instructions per weight (not drawn)")
    wide = [r for r in mix if r["version"] != "v0_naive"]
    labels = [f"{r['op']}/{r['version']}" for r in wide]
    left = np.zeros(len(wide))
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(wide) + 1.5))
    for family, opcodes in [*GROUPS.items(), ("the rest", None)]:
        counts = []
        for r in wide:
            if opcodes is None:
                grouped = sum(r["counts"].get(op, 0) for ops in GROUPS.values() for op in ops)
                counts.append(r["total"] - grouped)
            else:
                counts.append(sum(r["counts"].get(op, 0) for op in opcodes))
        per_weight = np.array(counts) / [weights_per_thread(r["version"]) for r in wide]
        ax.barh(labels, per_weight, left=left, label=family)
        left += per_weight
    ax.invert_yaxis()
    ax.set_xlabel(f"static instructions per weight ({results.SASS_ARCH}, {results.SASS_TOOLKIT})")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    plt.show()

# %% [markdown]
# ## Part 3 · The measured versions

# %%
data = results.notebook_results(CHAPTER)
if data:
    print(results.summary_text(data))

# %% [markdown]
# ## The versions side by side
#
# One panel per shape, one group of bars per op, one bar per version, each labelled with its share
# of the copy ceiling (the line). The kernel writes 2 bytes per weight and reads about 0.5, so
# watch where the best versions stop relative to a copy's half-and-half mix.

# %%
if data:
    H = results.headline(data)  # the timing mode the figures show: the graph, where timed
    measured = [r for r in results.rows(data, kind="version") if results.rate(r, H)]
    shapes = list(dict.fromkeys(r["shape"] for r in measured))
    versions = sorted({r["version"] for r in measured})
    colors = dict(zip(versions, plt.cm.tab10.colors))
    ceiling, _ = results.ceiling_of(data, H)
    fig, axes = plt.subplots(len(shapes), 1, figsize=(11, 3.4 * len(shapes)), squeeze=False)
    for ax, shape in zip(axes[:, 0], shapes):
        here = [r for r in measured if r["shape"] == shape]
        ops = list(dict.fromkeys(r["op"] for r in here))
        width = 0.8 / max(sum(r["op"] == op for r in here) for op in ops)
        for i, op in enumerate(ops):
            group = [r for r in here if r["op"] == op]
            for j, r in enumerate(group):
                x = i + (j - (len(group) - 1) / 2) * width
                bar = ax.bar(x, results.rate(r, H), width, color=colors[r["version"]], label=r["version"])
                if results.pct_ceiling(r, H, data) is not None:
                    ax.bar_label(bar, labels=[f"{results.pct_ceiling(r, H, data):.0f}%"], fontsize=7)
        if ceiling:
            ax.axhline(ceiling, color="black", label=f"ceiling {ceiling:.0f} GB/s")
        ax.set_xticks(range(len(ops)), ops, fontsize=8)
        ax.set_ylim(0, 1.35 * max([ceiling or 0] + [results.rate(r, H) for r in here]))  # legend room
        ax.set_ylabel(f"GB/s ({results.MODE_WORDS[H]})")
        ax.set_title(f"{shape}  ({data['gpu']})", fontsize=9)
        unique = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per version
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", ncol=4)
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ## Instruction mix against time
#
# For the INT4 ops at N = K = 8192: x is the kernel's static instruction count per 32-bit word of
# weights (the count × 8 weights per word ÷ the weights one thread converts), y the measured time;
# the right panel leaves out `v0` to show the others on a linear scale. The dashed line is the time
# the INT4 byte model needs at the copy ceiling. Points that fall on
# the line while x changes say the instructions were not the limit; a point far above it at large x
# says they were. (For `v0` the static count includes its 64-bit division subroutine, which runs
# only when indices need 64 bits: its x overstates what it executes.)

# %%
if data and mix:
    totals = {r["name"]: r for r in mix}
    points = [
        r for r in results.rows(data, kind="version")
        if r["op"].startswith("int4") and r["shape"] == SHAPE and r.get(results.mkey(H, "us"))
        and r["name"] in totals
    ]
    if points:
        markers = dict(zip(dict.fromkeys(r["op"] for r in points), "os^vDP"))
        fig, (ax_all, ax_vec) = plt.subplots(1, 2, figsize=(12, 4.5))
        vectorized = [r for r in points if r["version"] != "v0_naive"]
        for ax, shown in ((ax_all, points), (ax_vec, vectorized)):
            for r in shown:
                per_word = totals[r["name"]]["total"] * 8 / weights_per_thread(r["version"])
                ax.scatter(per_word, r[results.mkey(H, "us")], color=colors.get(r["version"], "gray"),
                           marker=markers[r["op"]], s=50, label=f"{r['op']}/{r['version']}")
            if ceiling:
                plain = [r for r in points if "_zp_" not in r["op"]]
                bound_us = min(r["model_bytes"] for r in plain) / (ceiling * 1e3)
                ax.axhline(bound_us, color="black", ls="--", label="INT4 bytes at the ceiling")
            ax.set_ylim(0, 1.2 * max([r[results.mkey(H, "us")] for r in shown] or [1]))
            ax.set_xlabel(f"static instructions per weight word ({results.SASS_ARCH})")
            ax.set_ylabel(f"µs per launch, {results.MODE_WORDS[H]}")
        ax_all.set_xscale("log")
        ax_all.set_title(f"all INT4 versions, {SHAPE}", fontsize=9)
        ax_vec.set_title(f"without v0_naive  ({data['gpu']})", fontsize=9)
        ax_vec.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        fig.tight_layout()
        plt.show()
    else:
        print(f"No INT4 row at {SHAPE} with a time in this run.")

# %% [markdown]
# ## Time against bytes: a fixed cost per launch?
#
# The INT4 versions land at very different shares of the ceiling at different shapes, much more
# than they differ from each other. The chapter's hypothesis (not measured directly): every launch
# pays a fixed cost that does not grow with the matrix (the launch itself, the first memory round
# trip before any store can leave, the last blocks draining on a few SMs). If so, each op's times
# over the shapes lie on one line, time = t0 + bytes / B, with t0 a few microseconds and B close to
# the ceiling. The cell fits that line for every op and version measured at three shapes or more
# and prints how far the worst shape lies from it; with two shapes a line fits anything, so those
# are skipped.

# %%
if data:
    timed = [r for r in results.rows(data, kind="version") if r.get(results.mkey(H, "us"))]
    for op, version in dict.fromkeys((r["op"], r["version"]) for r in timed):
        here = [r for r in timed if (r["op"], r["version"]) == (op, version)]
        if len(here) < 3:
            print(f"{op}/{version}: {len(here)} shape(s), no fit")
            continue
        x = np.array([r["model_bytes"] for r in here])
        y = np.array([r[results.mkey(H, "us")] for r in here])
        us_per_byte, t0 = np.polyfit(x, y, 1)
        rate = 1e-3 / us_per_byte  # bytes per µs → GB/s
        miss = np.abs(y - (t0 + us_per_byte * x)).max()
        share = ""
        if ceiling:
            share = f" ({100 * rate / ceiling:.0f}% of the ceiling)"
        print(f"{op}/{version}: t0 = {t0:.1f} µs, B = {rate:.0f} GB/s{share}; "
              f"the worst of {len(here)} shapes is {miss:.2f} µs off the line")

# %% [markdown]
# ## What the recorded H200 run shows
#
# The book's results section (`book/docs/02_int4_dequant.md`) gives the full account of the run
# recorded in `results/h200/02_int4_dequant.json` (H200, 2026-11-30T05:39:41Z, commit 945cb82); a
# live run shows your own numbers instead. In short:
#
# - `v0_naive` reaches about an eighth of the ceiling: its instructions per weight, not the memory,
#   set its pace.
# - The step to `v1` comes from the store layout, not the arithmetic: an earlier layout with the
#   same arithmetic, whose warp stores touched 16 lines instead of 4, stayed under half of the
#   ceiling (H200, 2026-11-30T05:36:18Z, commit 3f0eb14: the run recorded at commit 2aff5a9,
#   `results/h200/history/02_int4_dequant_strided_stores.json` in git history).
# - `v1`, `v2` and `v3` take the same time at every shape, although `v2` and `v3` run far fewer
#   instructions (Part 2). A standalone dequantization writes 2 bytes for every half byte it reads,
#   so it waits on memory and the unpack's savings cannot show; they matter where the unpack feeds
#   arithmetic from registers (chapters 06 and 07). That is the chapter's key lesson.
# - `v4`'s zero points cost nothing measurable; the 8-bit ops land a little higher than INT4 at the
#   same shape; the FP8 bit shift ties the hardware convert for FP16 and is a little faster for
#   BF16, for a reason the chapter has not pinned down.
# - The shape moves the INT4 versions far more than the version does (the fit above).

# %% [markdown]
# ## Try
#
# - Change `WORD` and check the pairs by hand, then try a word whose two nibbles in every byte are
#   equal: why would it not catch a kernel that reads the nibbles of a byte in swapped order?
# - Replace `- 72` by `- 64` in the high-nibble line of Part 1: which elements change, and by how
#   much? That is the mistake `mutant_high_constant` makes.
# - In the zero-point cell, search for other scales where q·s − z·s and s·(q − z) differ: how often
#   does it happen over all FP16 scales in [0.01, 0.1] and all q, z?
# - Use the fitted line of an INT4 op to predict its time at a shape the bench does not run (say
#   2048 × 4096 or 16384 × 16384), then add that shape to `int4_dequant_cases` in
#   `reference/lkw/bench.py` and measure. How close was the prediction?
