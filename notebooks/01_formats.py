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
# # 01 · Formats: the bits, then the measured casts
#
# Part 1 needs neither a GPU nor a measurement: it takes the chapter's examples apart with
# ml_dtypes, the same library the tests compare the kernels with. Part 2 shows the measured casts.
#
# - **Replay** (the default without a GPU, or with `LKW_REPLAY=1`): it reads the recorded run
#   `results/h200/01_formats.json` (the folder can be changed with `LKW_RESULTS_DIR`).
# - **Live** (a GPU and the compiled extension `lkw._ext`): it runs
#   `tools/bench.py --chapter 01_formats` and shows what it just measured.

# %%
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "reference" / "lkw").is_dir())
sys.path.insert(0, str(ROOT / "reference"))

import matplotlib.pyplot as plt  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from lkw import results  # noqa: E402

BF16, E4M3, E5M2 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
CHAPTER = "01_formats"

# %% [markdown]
# ## Part 1 · The bit fields of the chapter's examples
#
# Each line rounds an FP32 value to the format (round to nearest, ties to even) and prints
# sign | exponent | mantissa of the result.


# %%
def to_code(value, dtype):
    """The bit pattern of `value` rounded to `dtype`, as an unsigned integer."""
    bits = ml_dtypes.finfo(dtype).bits
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflow are cases we want
        return int(np.array([value], np.float32).astype(dtype).view(f"uint{bits}")[0])


def fields(code, dtype):
    info = ml_dtypes.finfo(dtype)
    text = format(code, f"0{info.bits}b")
    exponent_bits = info.bits - 1 - info.nmant
    sign, exponent, mantissa = text[0], text[1 : 1 + exponent_bits], text[1 + exponent_bits :]
    value = float(np.array([code], f"uint{info.bits}").view(dtype)[0])
    return f"{sign} {exponent} {mantissa}  0x{code:0{info.bits // 4}X}  = {value}"


examples = [
    (1.00390625, BF16, "tie: the kept bits end in 0, stays 1.0"),
    (1.01171875, BF16, "tie: the kept bits end in 1, rounds up"),
    (0.3, E4M3, "3 mantissa bits: 0.3125"),
    (17.0, E4M3, "tie between 16 and 18: even is 16"),
    (19.0, E4M3, "tie between 18 and 20: even is 20"),
    (2.0**-10, E4M3, "half the smallest subnormal: tie, rounds to 0"),
    (448.0, E4M3, "largest finite E4M3"),
    (1.0, E5M2, "the top byte of FP16 0x3C00"),
    (57344.0, E5M2, "largest finite E5M2"),
]
for value, dtype, note in examples:
    print(f"{value:>12} -> {dtype.__name__:<14} {fields(to_code(value, dtype), dtype):<40} {note}")

# %% [markdown]
# ## Saturation
#
# A plain cast to E4M3 has no Inf to overflow into, so large values become NaN. The kernels use
# `cvt.rn.satfinite`, which clamps to ±448 (±57344 for E5M2) and keeps NaN; the reference models
# it as *clamp, then cast*.

# %%
print(f"{'input':>8}  {'E4M3 plain':>10}  {'E4M3 sat':>10}  {'E5M2 plain':>10}  {'E5M2 sat':>10}")
for value in [460.0, 500.0, 61440.0, np.inf, np.nan]:
    cells = []
    for dtype, largest in [(E4M3, 448.0), (E5M2, 57344.0)]:
        with np.errstate(invalid="ignore", over="ignore"):
            plain = np.array([value], np.float32).astype(dtype)[0]
            saturated = np.clip(np.array([value], np.float32), -largest, largest).astype(dtype)[0]
        cells += [float(plain), float(saturated)]
    print(f"{value:>8}  " + "  ".join(f"{c:>10}" for c in cells))

# %% [markdown]
# ## The integer recipe for FP32 → BF16
#
# Add `0x7FFF` plus the last kept bit, shift right by 16; NaN first, so that it stays NaN. Checked
# here against ml_dtypes on a million random FP32 bit patterns and on the tie examples.

# %%
def f32_to_bf16_bits(bits):
    bits = bits.astype(np.uint64)  # room for the carry
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


seed = np.random.SeedSequence().entropy % 2**32  # fresh each run; set it to replay one
print("seed", seed)
rng = np.random.default_rng(seed)
patterns = np.concatenate([
    rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32),
    np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7F800001], np.uint32),
])
with np.errstate(invalid="ignore", over="ignore"):
    expected = patterns.view(np.float32).astype(BF16)
ours = f32_to_bf16_bits(patterns)
nan = np.isnan(expected)
exact = np.array_equal(ours[~nan], expected.view(np.uint16)[~nan])
print("bit-exact on every non-NaN pattern:", exact)
print("NaN stays NaN:", bool(np.isnan(ours[nan].view(BF16).astype(np.float32)).all()))

# %% [markdown]
# ## The FP8 → BF16 bit trick, on all 256 codes
#
# Shift the 7 exponent and mantissa bits of an E4M3 code to bit 20 of an FP32, multiply by 2^120 to
# move the bias from 127 to 7, put the sign back, patch `S.1111.111` to NaN. For E5M2 the byte is
# simply the top half of an FP16.

# %%
codes = np.arange(256, dtype=np.uint32)
sign = (codes & 0x80) << 24
magnitude = ((codes & 0x7F) << 20).view(np.float32) * np.float32(2.0**120)
fp32_bits = sign | magnitude.view(np.uint32)
fp32_bits = np.where((codes & 0x7F) == 0x7F, sign | 0x7FC00000, fp32_bits)
trick = (fp32_bits >> 16).astype(np.uint16).view(BF16).astype(np.float32)
reference = codes.astype(np.uint8).view(E4M3).astype(np.float32)
same = (trick == reference) | (np.isnan(trick) & np.isnan(reference))
print(f"E4M3 -> BF16 trick agrees with ml_dtypes on {same.sum()} of 256 codes")

e5m2_as_fp16 = (codes << 8).astype(np.uint16).view(np.float16).astype(np.float32)
reference = codes.astype(np.uint8).view(E5M2).astype(np.float32)
same = (e5m2_as_fp16 == reference) | (np.isnan(e5m2_as_fp16) & np.isnan(reference))
print(f"E5M2 byte << 8 read as FP16 agrees with ml_dtypes on {same.sum()} of 256 codes")

# %% [markdown]
# ## Part 2 · The measured casts

# %%
data = results.notebook_results(CHAPTER)
if data:
    print(results.summary_text(data))

# %% [markdown]
# One group of bars per cast, one bar per version, against the copy ceiling of the same run. A cast
# is memory-bound, so the question is how close each version gets to the ceiling, and which one
# first reaches it.

# %%
if data:
    H = results.headline(data)
    measured = results.rows(data, kind="version")
    ops = list(dict.fromkeys(r["op"] for r in measured))
    versions = list(dict.fromkeys(r["version"] for r in measured))
    width = 0.8 / len(versions)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for j, version in enumerate(versions):
        placed = [(i, results.find_row(data, op, version)) for i, op in enumerate(ops)]
        placed = [(i, r) for i, r in placed if r and results.rate(r, H) is not None]
        xs = [i - 0.4 + (j + 0.5) * width for i, _ in placed]
        ax.bar(xs, [results.rate(r, H) for _, r in placed], width, label=version)
    ceiling, _ = results.ceiling_of(data, H)
    ax.axhline(ceiling, color="black", label=f"ceiling {ceiling:.0f} GB/s")
    ax.set_xticks(range(len(ops)), ops)
    ax.set_ylim(0, 1.3 * max([ceiling] + [results.rate(r, H) or 0 for r in measured]))  # legend room
    ax.set_ylabel(f"GB/s (model bytes / time, {results.MODE_WORDS[H]})")
    ax.set_title(f"casts ({data['gpu']})")
    ax.legend(fontsize=8, loc="upper left", ncol=len(versions) + 1)
    plt.show()

# %% [markdown]
# ## Try
#
# - Replace `rounded` in `f32_to_bf16_bits` by plain truncation (`bits >> 16`) and count how many
#   of the million patterns change. Which ones are they?
# - Add `-ftz=true` in your head: which E4M3 codes would the bit trick get wrong, and why?
