"""Measured results: load ``results/<gpu>/<chapter>.json`` and present it.

One module formats the measurements for everyone who shows them: the book (a mkdocs hook turns
result markers into the tables below), the notebooks (plain-text tables, replay or live runs).
The JSON files are written by ``tools/bench.py``; this module only reads them.

Where the files are: ``$LKW_RESULTS_DIR`` if set, else ``<repo>/results``. A chapter with no file
is not an error: every function here then says "no measurement recorded yet" instead of numbers,
so the book and the notebooks work before the first GPU run.

The instruction mix (``results/sass/mix.json``, written by ``build/lkw_sass_check --mix`` from the
compiled binary, no GPU involved) is presented here too. It belongs to the build, not to a run, so
it is read from the repository (``$LKW_SASS_MIX`` names another file) whatever
``$LKW_RESULTS_DIR`` says.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from lkw import REPO

GPU = "h200"  # the results/<gpu>/ folder the book and the notebooks replay
NO_MEASUREMENT = "No measurement recorded yet"
# A row above this share of the copy ceiling is suspect: the data sat in L2 or the model is wrong.
SUSPECT_PCT = 100.0
# Measured DRAM bytes within this share of the model settle it: the data did come from DRAM.
DRAM_TOLERANCE = 0.05


# The three timing modes of a run (tools/bench.py), the headline first. A row's fields of a mode
# are named by mkey: one launch after an L2 flush keeps the names of the runs before the other
# modes existed (time_us, gbps, pct_ceiling, ...), the others prefix theirs (graph_us, graph_gbps,
# back_to_back_pct_ceiling, ...). A peer entry's ratio of a mode is mkey(mode, "ratio").
MODES = ("graph", "back_to_back", "one_launch")
MODE_WORDS = {"graph": "in a CUDA graph", "back_to_back": "back to back", "one_launch": "one launch"}
_ONE_LAUNCH_KEYS = {"us": "time_us", "min_us": "time_min_us", "max_us": "time_max_us"}


def mkey(mode: str, field: str) -> str:
    """The name of a row's (or a run's, or a peer entry's) field of one timing mode."""
    if mode == "one_launch":
        return _ONE_LAUNCH_KEYS.get(field, field)
    if mode not in MODES:
        raise KeyError(f"no timing mode {mode}")
    return f"{mode}_{field}"


def headline(data: dict) -> str:
    """The mode a run's tables lead with: the graph, unless the run has no graph times at all
    (a run recorded before every mode was timed)."""
    if data.get("headline") in MODES:
        return data["headline"]
    return "graph" if any(r.get("graph_us") is not None for r in data["rows"]) else "one_launch"


def ceiling_of(data: dict, mode: str) -> tuple[float | None, str]:
    """(GB/s, mode it was timed in) of the run's copy ceiling for a mode: the copy timed the same
    way, or, in a run that recorded no such ceiling, the one-launch one."""
    own = data.get(mkey(mode, "ceiling_gbps"))
    return (own, mode) if own else (data.get("ceiling_gbps"), "one_launch")


def rate(row: dict, mode: str, what: str = "gbps") -> float | None:
    """A row's GB/s (or TFLOP/s) in one mode: recorded, or from its time and model."""
    key = mkey(mode, what)
    if key in row:
        return row[key]
    us = row.get(mkey(mode, "us"))
    amount = row.get("model_bytes") if what == "gbps" else row.get("flops")
    return amount / (us * (1e3 if what == "gbps" else 1e6)) if us and amount else None


def pct_ceiling(row: dict, mode: str, data: dict | None = None) -> float | None:
    key = mkey(mode, "pct_ceiling")
    if key in row or data is None:
        return row.get(key)
    top, _ = ceiling_of(data, mode)
    r = rate(row, mode)
    return 100.0 * r / top if top and r else None


def pct_same_size_copy(row: dict, mode: str) -> float | None:
    """% of the same-size copy in one mode: recorded, or against the copy timed that way, or, in a
    run that recorded only the one-launch copy, against that one."""
    key = mkey(mode, "pct_same_size_copy")
    if key in row:
        return row[key]
    copy = row.get(mkey(mode, "same_size_copy_gbps")) or row.get("same_size_copy_gbps")
    r = rate(row, mode)
    return 100.0 * r / copy if copy and r else None


def above_ceiling(row: dict, data: dict | None = None, mode: str | None = None) -> str | None:
    """None, or how a row above the copy ceiling (in `mode`, or in any mode) stands: "explained"
    when Nsight Compute saw the model's bytes move through DRAM (not L2; a mix with fewer writes
    than a copy's 1:1 runs faster), else "suspect"."""
    pcts = [pct_ceiling(row, m, data) for m in ((mode,) if mode else MODES)]
    pct = max((p for p in pcts if p is not None), default=None)
    if pct is None or pct <= SUSPECT_PCT:
        return None
    ratio = row.get("dram_ratio")
    return "explained" if ratio is not None and abs(ratio - 1) <= DRAM_TOLERANCE else "suspect"


# The GEMM chapters' rows are also read against the tensor cores: the BF16 tensor peak is the
# measured rate of chapter 00's cuBLAS GEMM (8192^3) recorded for the same GPU, in the same timing
# mode, read from its results file when a run is benched or shown (never a figure in the code).
TENSOR_PEAK_ROW = ("00_roofline", "gemm_bf16", "cublas")
TENSOR_PEAK_CHAPTERS = ("07_w4a16_gemm",)


def gpu_slug(name: str) -> str:
    """The results folder of a GPU: its model ("NVIDIA H100 80GB HBM3" -> h100), not its last word."""
    model = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", name or "")
    return model[1].lower() if model else (name.split()[-1].lower() if name else "unknown")


def peak_of_row(row: dict) -> dict[str, float]:
    """{mode: TFLOP/s} of a TENSOR_PEAK_ROW row, for each mode that has a rate; {} where the row
    failed its check."""
    if not row.get("correct", True):
        return {}
    return {m: t for m in MODES if (t := rate(row, m, "tflops"))}


def tensor_peak(gpu: str = GPU) -> tuple[dict[str, float], str]:
    """({mode: TFLOP/s}, where it comes from) of the BF16 tensor peak recorded for `gpu`: the rate
    of TENSOR_PEAK_ROW in each timing mode it was timed in; ({}, why not) where the results file
    or the row is missing (or the row failed its check, or has no TFLOP/s)."""
    chapter, op, version = TENSOR_PEAK_ROW
    path = results_path(chapter, gpu)
    try:
        shown = path.relative_to(REPO)
    except ValueError:
        shown = path
    return _tensor_peak_of(str(path), path.stat().st_mtime_ns if path.is_file() else None, str(shown))


@functools.lru_cache(maxsize=8)
def _tensor_peak_of(path: str, mtime: int | None, shown: str) -> tuple[dict[str, float], str]:
    chapter, op, version = TENSOR_PEAK_ROW
    if mtime is None:
        return {}, f"{shown} does not exist"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return {}, f"{shown} cannot be read ({type(e).__name__})"
    row = next((r for r in data.get("rows", []) if r.get("op") == op and r.get("version") == version), None)
    if row is None or not row.get("correct", True):
        return {}, f"{shown} has no {'correct ' if row else ''}{op}/{version} row"
    peak = peak_of_row(row)
    if not peak:
        return {}, f"{shown}: its {op}/{version} row has no TFLOP/s"
    date, commit = row.get("run_date") or data.get("date", "?"), row.get("run_commit") or data.get("commit", "?")
    return peak, f"{chapter}/{op}/{version} at {row.get('shape', '?')} ({shown}, {date}, commit {commit})"


def tensor_peak_of_run(data: dict) -> tuple[dict[str, float], str | None]:
    """The tensor peak a run is read against: the one its bench recorded (tensor_peak_tflops of
    each mode, tensor_peak_source), or, for a chapter of TENSOR_PEAK_CHAPTERS recorded without it,
    the one recorded for its GPU now; ({}, None) for the other chapters."""
    if data.get("tensor_peak_source"):
        peak = {m: data[mkey(m, "tensor_peak_tflops")] for m in MODES if data.get(mkey(m, "tensor_peak_tflops"))}
        return peak, data["tensor_peak_source"]
    if data.get("chapter") not in TENSOR_PEAK_CHAPTERS:
        return {}, None
    return tensor_peak(gpu_slug(data["gpu"]) if data.get("gpu") else GPU)


def pct_tensor_peak(row: dict, mode: str, data: dict | None = None) -> float | None:
    """A row's TFLOP/s in one mode as % of the BF16 tensor peak in that mode: recorded by the
    bench, or from the run's peak (tensor_peak_of_run) where `data` is given."""
    key = mkey(mode, "pct_tensor_peak")
    if key in row or data is None:
        return row.get(key)
    peak = tensor_peak_of_run(data)[0].get(mode)
    r = rate(row, mode, "tflops")
    return 100.0 * r / peak if peak and r else None


def results_dir() -> Path:
    return Path(os.environ.get("LKW_RESULTS_DIR") or Path(REPO) / "results")


def results_path(chapter: str, gpu: str = GPU) -> Path:
    return results_dir() / gpu / f"{chapter}.json"


def load(chapter: str, gpu: str = GPU) -> dict | None:
    """The chapter's results, or None when no run has been recorded."""
    path = results_path(chapter, gpu)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def recorded(relative: str) -> tuple[dict | None, str]:
    """A recorded file, results/<gpu>/RELATIVE: this GPU folder's (GPU), else the latest (by its
    date) of another GPU's folder, with a line that says whose it is; (None, "") where none is."""
    path = results_dir() / GPU / relative
    if path.is_file():
        return json.loads(path.read_text()), ""
    others = [p for p in sorted(results_dir().glob(f"*/{relative}")) if p.relative_to(results_dir()).parts[0] != GPU]
    if not others:
        return None, ""
    path, data = max(((p, json.loads(p.read_text())) for p in others), key=lambda pd: pd[1].get("date") or "")
    return data, (f"No {GPU.upper()} run of {Path(relative).stem} is recorded yet: the figures below are "
                  f"the {data['gpu']}'s (results/{path.relative_to(results_dir()).as_posix()}).")


def book_run(chapter: str) -> tuple[dict | None, str]:
    """The run the book's tables show: this GPU's (load), else recorded(CHAPTER.json)'s."""
    data = load(chapter)
    return (data, "") if data is not None else recorded(f"{chapter}.json")


def missing_message(chapter: str, gpu: str = GPU) -> str:
    path = results_path(chapter, gpu)
    try:
        shown = path.relative_to(REPO)
    except ValueError:
        shown = path
    return (
        f"{NO_MEASUREMENT} for {chapter}: {shown} does not exist. "
        "A GPU run (tools/run.sh) records it."
    )


def rows(data: dict, op: str | None = None, kind: str | None = None) -> list[dict]:
    """The measured rows in file order, optionally only one op and/or one kind."""
    return [
        r
        for r in data["rows"]
        if (op is None or r["op"] == op) and (kind is None or r["kind"] == kind)
    ]


def find_row(data: dict, op: str, version: str) -> dict | None:
    return next((r for r in data["rows"] if r["op"] == op and r["version"] == version), None)


def ridge_point(data: dict) -> tuple[float, dict] | None:
    """FLOP per byte where the matrix-unit roof meets the bandwidth roof, measured in one run.

    The matrix roof is the fastest row with a FLOP rate (chapter 00: the cuBLAS BF16 GEMM), the
    bandwidth roof is the run's copy ceiling. Returns (FLOP/byte, that row) or None.
    """
    with_flops = [r for r in data["rows"] if r.get("tflops")]
    if not with_flops or not data.get("ceiling_gbps"):
        return None
    best = max(with_flops, key=lambda r: r["tflops"])
    return best["tflops"] * 1e12 / (data["ceiling_gbps"] * 1e9), best


# ---- formatting ---------------------------------------------------------------------------------


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _time(us: float | None) -> str:
    if us is None:
        return "—"
    return f"{us:.1f}" if us >= 100 else f"{us:.2f}" if us >= 1 else f"{us:.3f}"


# Rows doing more FLOPs per byte than this show TFLOP/s (GEMMs); the others, whatever FLOPs they
# count (a norm's few per element), are about bytes and show GB/s.
COMPUTE_BOUND_FLOP_PER_BYTE = 10.0


def columns(data: dict) -> list[str]:
    """The headline mode's time, achieved rate and % of ceiling, then the other modes' times (— where
    a row was not timed so), then the rest; every table of a run has these."""
    h = headline(data)
    others = [f"{MODE_WORDS[m]} µs" for m in MODES if m != h]
    return ["op", "version", "summary", "shape", f"{MODE_WORDS[h]} µs", "achieved", "% of ceiling", *others,
            "% of same-size copy", "DRAM bytes / model", f"peers (their time / ours, {MODE_WORDS[h]})"]


def _peer_ratios_text(row: dict, h: str) -> str:
    """Each peer's ratio in the headline mode, or, where a side lacks that time, in the first mode
    both have, named."""
    out = []
    for name, p in (row.get("peers") or {}).items():
        for mode in (h, *(m for m in MODES if m != h)):
            ratio = p.get(mkey(mode, "ratio"))
            if ratio is not None:
                out.append(f"{name} {ratio:.2f}×" + ("" if mode == h else f" ({MODE_WORDS[mode]})"))
                break
    return ", ".join(out) or "—"


def _cells(row: dict, data: dict) -> list[str]:
    """One row as plain strings, in the order of columns(data)."""
    h = headline(data)
    intensity = (row.get("flops") or 0) / row["model_bytes"] if row.get("model_bytes") else 0
    tflops, gbps = rate(row, h, "tflops"), rate(row, h)
    if tflops is not None and intensity > COMPUTE_BOUND_FLOP_PER_BYTE:
        achieved = f"{tflops:.1f} TFLOP/s"
        of_peak = pct_tensor_peak(row, h, data)
        if of_peak is not None:
            achieved += f" ({of_peak:.0f}% of peak)"
    elif gbps is not None:
        achieved = f"{gbps:.0f} GB/s"
    else:
        achieved = "—"
    pct_text = _num(pct_ceiling(row, h, data), ".1f")
    mark = above_ceiling(row, data, h)
    if mark:
        pct_text += " ⚠" if mark == "suspect" else " †"
    version = row["version"]
    if row["kind"] == "peer":
        version += " (peer)"
    if not row.get("correct", True):
        version += " FAILED CHECK"
    failed = [MODE_WORDS[m] for m in ("back_to_back", "graph") if row.get(mkey(m, "correct")) is False]
    if failed and row.get("correct", True):
        version += f" FAILED CHECK {' and '.join(failed)}"
    return [
        row["op"],
        version,
        row.get("summary", ""),
        row.get("shape", ""),
        _time(row.get(mkey(h, "us"))),
        achieved,
        pct_text,
        *(_time(row.get(mkey(m, "us"))) for m in MODES if m != h),
        _num(pct_same_size_copy(row, h), ".1f"),
        _num(row.get("dram_ratio"), ".3f"),
        _peer_ratios_text(row, h),
    ]


def header_line(data: dict) -> str:
    ver = data.get("ceiling_version", "?")
    if data.get("graph_ceiling_gbps"):
        ways = ", ".join(f"{data[mkey(m, 'ceiling_gbps')]:.1f} GB/s {MODE_WORDS[m]}" if m != "graph" else
                         f"{data[mkey(m, 'ceiling_gbps')]:.1f} GB/s in a CUDA graph"
                         for m in MODES if data.get(mkey(m, "ceiling_gbps")))
        ceiling = f"copy ceiling {ways} ({ver})"
    elif data.get("ceiling_gbps"):
        ceiling = f"copy ceiling {data['ceiling_gbps']:.1f} GB/s ({ver})"
    else:
        ceiling = "no copy ceiling in this run"
    runs = data.get("runs") or []
    when = (f"{data['date']} · commit {data['commit']}" if len(runs) < 2 else
            "merged from " + ", ".join(f"{r.get('date')} (commit {r.get('commit')}, {r['rows']} rows)" for r in runs)
            + ", the copy ceiling of the latest")
    return (
        f"{data['gpu']} · driver {data.get('driver') or '?'} · CUDA {data.get('cuda') or '?'} · "
        f"{when} · {ceiling}"
    )


def _timing_note(data: dict) -> str:
    h = headline(data)
    if h == "graph":
        note = (
            "Times: µs per launch, medians, in a CUDA graph (the headline: a batch of launches "
            "rotating over input sets larger than twice the L2, captured once and replayed), back "
            "to back over the same sets, and one launch after an L2 flush (which also charges the "
            "CPU's launch cost). Achieved, % of ceiling and the peers' ratios (their time / ours) "
            "are the graph's; a ratio from another mode, where a side has no graph time, says so."
        )
        top, mode = ceiling_of(data, "graph")
        if top and mode != "graph":
            note += (" This run recorded its copies one launch at a time only: % of ceiling and of "
                     "the same-size copy are against those.")
    else:
        note = (
            "This run timed one launch after an L2 flush (each launch alone, the CPU's launch cost "
            "included); — where a row was not timed back to back or in a CUDA graph."
        )
    return note


def _notes(data: dict) -> list[str]:
    h = headline(data)
    notes = [_timing_note(data)]
    marks = {above_ceiling(r, data) for r in data["rows"]}
    if "suspect" in marks:
        notes.append(
            "⚠ above 100% of the measured ceiling: the data sat in L2 or the byte model is wrong; "
            "the row is not a result until that is settled."
        )
    if "explained" in marks:
        notes.append(
            "† above 100% of the copy ceiling, with DRAM bytes within 5% of the model (so not "
            "served from L2): a mix with fewer writes than a copy's 1:1 moves more bytes per second."
        )
    for r in data["rows"]:
        if not r.get("correct", True):
            why = ": " + " ".join(str(r["check"]).split()) if r.get("check") else ""
            notes.append(f"FAILED CHECK {r['op']}/{r['version']}: wrong output, no time{why}")
        elif any(r.get(mkey(m, "correct")) is False for m in ("back_to_back", "graph")):
            notes.append(f"FAILED CHECK {r['op']}/{r['version']} at {r.get('shape', '')}: wrong output after "
                         "timing back to back or in a CUDA graph, no time there")
        if r.get("graph_error"):
            notes.append(f"{r['op']}/{r['version']} at {r.get('shape', '')}: not captured in a CUDA graph: "
                         f"{r['graph_error']}")
    peak, source = tensor_peak_of_run(data)
    if source and peak.get(h):
        notes.append(f"% of peak: a GEMM row's TFLOP/s over the BF16 tensor peak, the measured cuBLAS "
                     f"GEMM's {peak[h]:.1f} TFLOP/s {MODE_WORDS[h]} ({source}).")
    elif source:
        notes.append(f"No % of the BF16 tensor peak: {source}.")
    absent = [st["detail"] for st in (data.get("peer_libraries") or {}).values() if not st.get("available")]
    if absent:
        notes.append("Production peers not in this run: " + "; ".join(absent) + ".")
    return notes


def text_table(data: dict) -> str:
    """A fixed-width table for notebooks and terminals."""
    cols = columns(data)
    table = [cols] + [_cells(r, data) for r in data["rows"]]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([header_line(data), ""] + lines + [""] + _notes(data)).rstrip()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(chapter: str) -> str:
    """The book's results table for a chapter (or the no-measurement line)."""
    data, whose = book_run(chapter)
    if data is None:
        return missing_message(chapter)
    cols = columns(data)
    out = ([whose, ""] if whose else []) + [f"Measured on {header_line(data)}.", "", "| " + " | ".join(cols) + " |"]
    out.append("|" + ":--|" * 4 + "--:|" * (len(cols) - 5) + ":--|")  # names left, numbers right
    for row in data["rows"]:
        cells = [_md_escape(c) for c in _cells(row, data)]
        cells[0] = f"`{cells[0]}`"
        cells[1] = f"`{row['version']}`" + cells[1][len(row["version"]) :]  # name only in code
        out.append("| " + " | ".join(cells) + " |")
    out += [""] + [f"{n}\n" for n in _notes(data)]
    return "\n".join(out).rstrip() + "\n"


def _fmt_us(t):
    return "—" if t is None else f"{t:.1f}" if t >= 100 else f"{t:.2f}" if t >= 1 else f"{t:.3f}"


def summary_text(data: dict, ops=None) -> str:
    """One short table per op (of `ops` only, when given, in the run's order): each version and
    peer, its time in the headline mode at every shape of the run, and its % of the copy ceiling
    at the largest shape (⚠ / † above the ceiling, ✗ a failed check: the full table's notes say
    why). The notebooks' one-screen view of a run."""
    out: list[str] = []
    H = headline(data)
    out.append(textwrap.fill(header_line(data), 100, subsequent_indent="  "))
    out.append(f"µs per launch {MODE_WORDS[H]}; % of the copy ceiling at the op's largest shape.\n"
               "Every timing mode and column: print(results.text_table(data))\n")
    for op in dict.fromkeys(r["op"] for r in data["rows"]):
        if ops is not None and op not in ops:
            continue
        rows = [r for r in data["rows"] if r["op"] == op and r["kind"] in ("version", "peer")]
        shapes = list(dict.fromkeys(r["shape"] for r in rows))
        # A bare part of a shape (chapter 09's routing: "...,block_m=64,zipf") is the field "variant".
        fields = [dict(kv.split("=", 1) if "=" in kv else ("variant", kv) for kv in s.split(","))
                  for s in shapes]
        varying = [k for k in fields[0] if len({f.get(k) for f in fields}) > 1]
        fixed = ", ".join(f"{k}={v}" for k, v in fields[0].items() if k not in varying) if varying else ""
        labels = ["×".join(f.get(k, "?") for k in varying) for f in fields] if varying else shapes
        largest = max(shapes, key=lambda s: max(r.get("model_bytes") or 0 for r in rows if r["shape"] == s))
        w = max(9, *(len(x) + 2 for x in labels))
        out.append(f"{op}  ({'×'.join(varying)}{'; ' + fixed if fixed else ''})" if varying else op)
        out.append(f"  {'version / peer':<36}" + "".join(f"{x:>{w}}" for x in labels) + f"{'% ceil':>9}")
        names = dict.fromkeys((r["kind"], r["version"]) for r in rows)
        for kind, name in sorted(names, key=lambda kn: kn[0] != "version"):  # versions, then peers
            at = {r["shape"]: r for r in rows if r["version"] == name}
            big = at.get(largest)
            pct = pct_ceiling(big, H, data) if big else None
            mark = above_ceiling(big, data, H) if big else None
            sign = "⚠" if mark == "suspect" else "†" if mark else ""
            if any(not r.get("correct", True) for r in at.values()):
                sign += "✗"
            label = name if kind == "version" else f"{name} (peer)"
            label = label if len(label) <= 36 else label[:35] + "…"
            times = "".join(f"{_fmt_us(at[s].get(mkey(H, 'us')) if s in at else None):>{w}}"
                            for s in shapes)
            out.append(f"  {label:<36}{times}{'—' if pct is None else format(pct, '.1f'):>8}{sign}")
        out.append("")
    return "\n".join(out)


def _shape_fields(shape: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in shape.split(",") if "=" in kv)


# The batch sizes a chapter's knob table shows (its other shapes stay in the results table);
# a chapter not named here shows every shape.
ABLATION_MS = {"06_int4_gemv": ("1", "16")}


def ablation_rows(data: dict, ms: tuple[str, ...] | None = ("1", "16")) -> list[tuple[dict, dict]]:
    """(version row, ablation row) pairs of a run: ablation_<vN>_<knob> against vN_* of the same op
    and shape, at the decode batch sizes `ms` (shapes without an m= all; ms None: every shape)."""
    pairs = []
    for r in data["rows"]:
        if r["kind"] != "ablation" or not r["version"].startswith("ablation_"):
            continue
        base = r["version"][len("ablation_") :].split("_", 1)[0] + "_"
        m = _shape_fields(r["shape"]).get("m")
        if ms is not None and m is not None and m not in ms:
            continue
        v = next((x for x in data["rows"] if x["kind"] == "version" and x["op"] == r["op"]
                  and x["shape"] == r["shape"] and x["version"].startswith(base)), None)
        if v is not None:
            pairs.append((v, r))
    return pairs


def ablation_markdown(chapter: str) -> str:
    """The book's knob table: each ablation entry (one knob of a version turned off) beside the
    version, every timing mode, the change in percent (positive: the knob off is slower)."""
    data, whose = book_run(chapter)
    if data is None:
        return missing_message(chapter)
    pairs = ablation_rows(data, ABLATION_MS.get(chapter))
    if not pairs:
        return "No ablation entry was measured in this run.\n"
    out = ([whose, ""] if whose else []) + [
        f"Measured on {header_line(data)}; µs, the version → the knob off (change).", "",
           "| shape | knob off | " + " | ".join(MODE_WORDS[m] for m in MODES) + " |",
           "|:--|:--|" + "--:|" * len(MODES)]
    for v, r in pairs:
        cells = []
        for mode in MODES:
            a, b = v.get(mkey(mode, "us")), r.get(mkey(mode, "us"))
            cells.append(f"{a:.2f} → {b:.2f} ({100 * (b / a - 1):+.1f}%)" if a and b else "—")
        knob = r["version"][len("ablation_") :].split("_", 1)[1]
        out.append(f"| {r['shape']} | `{knob}` | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


# ---- merging a partial run into a recorded one (tools/bench.py --merge) ------------------------

# What a run's summary in "runs" keeps of its top-level fields.
_RUN_FIELDS = ("date", "commit", "driver", "cuda", "ceiling_version", *(mkey(m, "ceiling_gbps") for m in MODES),
               "peer_libraries", "tensor_peak_source")


def _run_summary(data: dict, rows: int) -> dict:
    return {**{f: data.get(f) for f in _RUN_FIELDS if f in data}, "rows": rows}


def merge_runs(old: dict, new: dict) -> dict:
    """A recorded run with a partial one merged in (the same chapter and GPU, e.g. one op or a few
    shapes measured again or added): each new row replaces the old row of the same op, shape and
    version in place, rows the old run lacks are appended, the others are kept as they were. Every
    row keeps the date and commit of the run that measured it ("run_date", "run_commit"), and its
    rates and % of ceiling stay those of its own run. The top level is the new run's, plus "runs":
    a summary of every run that still owns a row, oldest first (header_line names them)."""
    for field in ("chapter", "gpu"):
        if old.get(field) != new.get(field):
            raise ValueError(f"cannot merge runs of different {field}: {old.get(field)!r} and {new.get(field)!r}")

    def stamped(data: dict) -> list[dict]:
        return [{**r, "run_date": r.get("run_date", data.get("date")), "run_commit": r.get("run_commit", data.get("commit"))}
                for r in data["rows"]]

    chapter = new["chapter"]
    incoming = {_row_key(chapter, r): r for r in stamped(new)}
    rows, placed = [], set()
    for r in stamped(old):
        key = _row_key(chapter, r)
        if key in incoming:
            if key not in placed:
                rows.append(incoming[key])
                placed.add(key)
        else:
            rows.append(r)
    rows += [r for key, r in incoming.items() if key not in placed]
    runs = [dict(run) for run in old.get("runs") or [_run_summary(old, len(old["rows"]))]]
    if runs and "peer_libraries" not in runs[-1] and "peer_libraries" in old:
        runs[-1]["peer_libraries"] = old["peer_libraries"]  # the old top level is its newest run's
    runs += [dict(run) for run in new.get("runs") or [_run_summary(new, 0)]]  # a merged run brings its own
    for run in runs:
        run["rows"] = sum(1 for r in rows if (r["run_date"], r["run_commit"]) == (run.get("date"), run.get("commit")))
    runs = [run for run in runs if run["rows"]]
    return {**new, "rows": rows, "runs": runs, "peer_libraries": _merged_peers(runs)}


def _merged_peers(runs: list[dict]) -> dict:
    """A production peer library is available in a merged run if it was in any run that still owns
    rows (its rows come from there); else the newest run's reason it was not."""
    merged: dict = {}
    for run in runs:  # oldest first: a later run's status replaces an earlier one, never "available"
        for lib, st in (run.get("peer_libraries") or {}).items():
            if lib not in merged or not merged[lib].get("available"):
                merged[lib] = st
    return merged


# ---- comparing two runs (tools/bench.py --compare) ----------------------------------------------


def load_runs(path: Path) -> list[dict]:
    """The runs in a results JSON file, or in every *.json of a folder (not its subfolders)."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    runs = [json.loads(f.read_text()) for f in files]
    runs = [r for r in runs if isinstance(r, dict) and isinstance(r.get("rows"), list)]
    if not runs:
        raise ValueError(f"no results JSON (a dict with rows) in {path}")
    return runs


def _row_key(chapter: str, row: dict) -> tuple:
    return (chapter, row["op"], row.get("shape", ""), row["version"])


def compare_row(old: dict, new: dict) -> dict:
    """One row of two runs, mode by mode: {mode: (old µs, new µs, change %, verdict)}, verdict
    "slower" / "faster" when the new run's [min, max] lies wholly above / below the old run's (the
    recorded spread of both runs), else "within"; plus "failed" when the new row failed its check
    where the old one passed."""
    out: dict = {"modes": {}, "failed": bool(old.get("correct", True)) and not new.get("correct", True)}
    for mode in MODES:
        o, n = old.get(mkey(mode, "us")), new.get(mkey(mode, "us"))
        if not o or not n:
            continue
        o_lo, o_hi = old.get(mkey(mode, "min_us")) or o, old.get(mkey(mode, "max_us")) or o
        n_lo, n_hi = new.get(mkey(mode, "min_us")) or n, new.get(mkey(mode, "max_us")) or n
        verdict = "slower" if n_lo > o_hi else "faster" if n_hi < o_lo else "within"
        out["modes"][mode] = (o, n, 100.0 * (n / o - 1.0), verdict)
    return out


_SHORT = {"graph": "graph", "back_to_back": "b2b", "one_launch": "1 launch"}


def compare_runs(baseline: list[dict], current: list[dict]) -> tuple[str, int]:
    """Each row of the current runs against the baseline's row of the same chapter, op, shape and
    version: (the text to print, the number of regressions: rows slower beyond both runs' spread in
    some mode, or failing a check the baseline passed)."""
    base = {_row_key(run.get("chapter", "?"), r): r for run in baseline for r in run["rows"]}
    base_runs = {run.get("chapter", "?"): run for run in baseline}
    lines, regressions, counts = [], 0, {"slower": 0, "faster": 0, "within": 0, "new": 0, "missing": 0}
    for run in current:
        chapter = run.get("chapter", "?")
        old_run = base_runs.get(chapter)
        was = f"{old_run.get('commit', '?')} ({old_run.get('date', '?')})" if old_run else "no baseline"
        lines.append(f"== {chapter}: {was} -> {run.get('commit', '?')} ({run.get('date', '?')})")
        seen = set()
        for r in run["rows"]:
            key = _row_key(chapter, r)
            seen.add(key)
            label = f"  {r['op']:<24} {r.get('shape', ''):<28} {r['version']:<44}"
            old = base.get(key)
            if old is None:
                counts["new"] += 1
                lines.append(f"{label} new")
                continue
            cmp = compare_row(old, r)
            parts, verdicts = [], set()
            for mode, (o, n, change, verdict) in cmp["modes"].items():
                flag = " SLOWER" if verdict == "slower" else " faster" if verdict == "faster" else ""
                parts.append(f"{_SHORT[mode]} {_time(o)}->{_time(n)} µs {change:+.1f}%{flag}")
                verdicts.add(verdict)
            if cmp["failed"]:
                parts.insert(0, "FAILED CHECK")
            if not parts:
                parts.append("no time in common")
            regressed = cmp["failed"] or "slower" in verdicts
            regressions += regressed
            counts["slower" if regressed else "faster" if "faster" in verdicts else "within"] += 1
            lines.append(f"{label} " + "; ".join(parts))
        for key, old in base.items():
            if key[0] == chapter and key not in seen:
                counts["missing"] += 1
                lines.append(f"  {old['op']:<24} {old.get('shape', ''):<28} {old['version']:<44} missing in the new run")
    lines.append(
        f"compare: {counts['slower']} row(s) slower beyond both runs' spread or failing, {counts['faster']} "
        f"faster, {counts['within']} within; {counts['new']} new, {counts['missing']} missing"
    )
    return "\n".join(lines), regressions


def ridge_markdown(chapter: str) -> str:
    data = load(chapter)
    if data is None:
        return f"{NO_MEASUREMENT} for {chapter}, so no ridge point either."
    ridge = ridge_point(data)
    if ridge is None:
        return "This run has no FLOP-rate row, so no ridge point can be computed from it."
    flop_per_byte, row = ridge
    return (
        f"Ridge point of this run: **{flop_per_byte:.0f} FLOP/byte** "
        f"(`{row['op']}/{row['version']}` at {row['tflops']:.1f} TFLOP/s "
        f"÷ copy ceiling {data['ceiling_gbps']:.1f} GB/s)."
    )


# ---- the instruction mix of the build (SASS opcodes per kernel) --------------------------------

SASS_ARCH = "sm_90a"  # the H200's architecture: the mix the book shows beside the H200 run
SASS_TOOLKIT = "CUDA 13.0"  # the toolkit whose compiler and cuobjdump wrote results/sass/mix.json
NO_MIX = "No instruction mix recorded yet"
ARCH_NOTE = {"sm_80": " (A100)", "sm_89": " (Ada)", "sm_90a": " (Hopper, the H200 of the results)"}
# The opcodes (mnemonics without their .suffixes) each chapter's mix table shows, in this order.
MIX_OPCODES = {
    "02_int4_dequant": [
        "I2F", "LOP3", "PRMT", "HADD2", "HFMA2", "HMUL2", "SHF", "F2FP", "LDG", "STG",
    ],
    # FP8 on Hopper: v0's converts and FP16 HMMA, then the tensor core's own FP8 (QGMMA), and how
    # the tiles arrive (cp.async, TMA on mbarriers) and who holds the registers (setmaxnreg).
    "08_fp8_gemm": [
        "F2FP", "HMMA", "QGMMA", "LDSM", "LDGSTS", "UTMALDG", "SYNCS", "USETMAXREG", "STG",
    ],
}
DEFAULT_MIX_OPCODES = ["LDG", "STG"]
# What one execution of a chapter's kernel covers, said under its mix table.
MIX_UNIT = {
    "02_int4_dequant": (
        "A thread of `v1`–`v6` runs its kernel once for 32 weights: four units of 8 (one INT4 "
        "word or two 8-bit words in, one 16-byte store out), unrolled, so 16 bytes of INT4 "
        "weights or 32 bytes of 8-bit weights; a thread of `v0_naive` runs it for one weight."
    ),
}


def sass_mix_path() -> Path:
    return Path(os.environ.get("LKW_SASS_MIX") or Path(REPO) / "results" / "sass" / "mix.json")


def load_mix() -> dict | None:
    """{arch: {"chapter/op/version": {opcode: count}}}, or None when the file is missing."""
    path = sass_mix_path()
    return json.loads(path.read_text()) if path.is_file() else None


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def mix_rows(chapter: str, arch: str = SASS_ARCH) -> list[dict] | None:
    """The chapter's versions in the mix of one arch, ordered by version then op: each a dict
    with name, op, version, counts {opcode: n} and total (every instruction of the kernel).
    None when there is no mix file; [] when it has no such arch or no version of the chapter."""
    mix = load_mix()
    if mix is None:
        return None
    out = []
    for name, counts in mix.get(arch, {}).items():
        parts = name.split("/")
        if parts[0] != chapter or len(parts) != 3:
            continue
        out.append({"name": name, "op": parts[1], "version": parts[2], "counts": counts,
                    "total": sum(counts.values())})
    return sorted(out, key=lambda r: (r["version"], r["op"]))


def _mix_missing(chapter: str, arch: str, rows: list[dict] | None) -> str | None:
    if rows is None:
        return (
            f"{NO_MIX}: {_shown(sass_mix_path())} does not exist. "
            "`build/lkw_sass_check --mix results/sass/mix.json` writes it from the build."
        )
    if not rows:
        return f"{NO_MIX} for {chapter} on {arch} in {_shown(sass_mix_path())}."
    return None


def _mix_table(chapter: str, arch: str) -> tuple[list[str], list[list[str]]] | str:
    rows = mix_rows(chapter, arch)
    missing = _mix_missing(chapter, arch, rows)
    if missing:
        return missing
    opcodes = MIX_OPCODES.get(chapter, DEFAULT_MIX_OPCODES)
    header = ["version", *opcodes, "total"]
    body = [
        [f"{r['op']}/{r['version']}", *(str(r["counts"].get(op, 0)) for op in opcodes),
         str(r["total"])]
        for r in rows
    ]
    return header, body


def mix_caption(chapter: str, arch: str = SASS_ARCH) -> str:
    unit = MIX_UNIT.get(chapter, "")
    return (
        f"Instruction counts for {arch}{ARCH_NOTE.get(arch, '')}, from cuobjdump of the build "
        f"({SASS_TOOLKIT}), stored in {_shown(sass_mix_path())}. Each is a static count over the "
        "whole kernel: every instruction of its machine code once, including paths not taken and "
        "the padding after its exit. Opcodes are counted without their suffixes (I2F counts "
        "I2F.F16 and I2F.U32.RP alike), 0 where absent; the total counts every opcode, those not "
        f"shown included. {unit}"
    ).rstrip()


def sass_mix_markdown(chapter: str, arch: str = SASS_ARCH) -> str:
    """The book's instruction-mix table for a chapter (or a line saying there is none)."""
    table = _mix_table(chapter, arch)
    if isinstance(table, str):
        return table
    header, body = table
    out = ["| " + " | ".join(header) + " |", "|:--|" + "--:|" * (len(header) - 1)]
    out += ["| " + " | ".join([f"`{cells[0]}`", *cells[1:]]) + " |" for cells in body]
    return "\n".join(out + ["", mix_caption(chapter, arch)]) + "\n"


def sass_mix_text(chapter: str, arch: str = SASS_ARCH) -> str:
    """The same table, fixed-width, for notebooks and terminals."""
    table = _mix_table(chapter, arch)
    if isinstance(table, str):
        return table
    header, body = table
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    lines = [  # names left, counts right
        "  ".join([line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:])])
        for line in [header] + body
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + ["", mix_caption(chapter, arch)])


# ---- notebooks: replay a recorded run, or measure live ------------------------------------------


def replay_forced() -> bool:
    return os.environ.get("LKW_REPLAY", "") not in ("", "0")


def live_available() -> bool:
    """Live mode needs the compiled extension and a visible GPU, and LKW_REPLAY unset."""
    if replay_forced():
        return False
    try:
        ext = importlib.import_module("lkw._ext")
    except ImportError:
        return False
    return bool(ext.device()["present"])


def run_bench(chapter: str) -> dict:
    """Measure the chapter now with tools/bench.py and return its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{chapter}.json"
        cmd = [sys.executable, str(Path(REPO) / "tools" / "bench.py"), "--chapter", chapter]
        subprocess.run(cmd + ["--json", str(out)], check=True, cwd=REPO)
        return json.loads(out.read_text())


def notebook_results(chapter: str) -> dict | None:
    """What a notebook shows: a live run where possible, else the recorded one (this GPU folder's,
    else the latest of another GPU's, as the book shows it, saying whose), else None."""
    if live_available():
        print(f"Live: measuring {chapter} with tools/bench.py on this GPU.")
        return run_bench(chapter)
    return replay(chapter)


def replay(chapter: str) -> dict | None:
    """The recorded run a notebook replays (book_run's: this GPU folder's, else another GPU's),
    saying which; None, said, where none is (chapter 11's notebook, whose live run is the layer
    bench's, replays with this alone)."""
    data, whose = book_run(chapter)
    if data is None:
        print(missing_message(chapter))
        print("The cells below skip their work until a measurement exists.")
        return None
    print(whose or f"Replay: {results_path(chapter)}")
    return data


# ---- the schema by example ----------------------------------------------------------------------


def example(chapter: str) -> dict:
    """A made-up run in the schema that tools/bench.py writes (chapter 11: the schema of
    ``python -m lkw.layer_bench --write-results``, ``_layer_example``); NOT a measurement (its GPU
    says so).

    The tests build the book and execute the notebooks on it, before any real run exists.
    """

    def row(op, version, kind, summary, shape, time_us, model_bytes, flops=0, dram_ratio=1.001,
            peers=None):
        gbps = model_bytes / time_us / 1e3
        return {
            "name": f"{chapter}/{op}/{version}", "op": op, "version": version, "kind": kind,
            "summary": summary, "shape": shape, "time_us": time_us, "model_bytes": model_bytes,
            "gbps": gbps, "pct_ceiling": None if flops else 100.0 * gbps / ceiling,
            "flops": flops, "tflops": flops / time_us / 1e6 if flops else None,
            "dram_bytes": None if dram_ratio is None else round(dram_ratio * model_bytes),
            "dram_ratio": dram_ratio, "correct": True, "peers": peers or {},
        }

    n = 1 << 26
    ceiling = 8 * n / 140.0 / 1e3  # the example's "v2_inflight" time is 140 µs
    if chapter == "11_decoder_layer":  # the layer bench records cases of the layer, not rows
        return _layer_example(ceiling)
    if chapter == "00_roofline":
        memcpy = 142.0
        rows = [
            row("copy", "v0_scalar", "version", "one 4-byte word per thread", f"n={n}", 190.0,
                8 * n, peers={"cuda_memcpy": {"time_us": memcpy, "ratio": memcpy / 190.0}}),
            row("copy", "v1_vec16", "version", "16-byte vectors: one uint4 per thread", f"n={n}",
                150.0, 8 * n, peers={"cuda_memcpy": {"time_us": memcpy, "ratio": memcpy / 150.0}}),
            row("copy", "v2_inflight", "version", "four 16-byte loads in flight per thread",
                f"n={n}", 140.0, 8 * n,
                peers={"cuda_memcpy": {"time_us": memcpy, "ratio": memcpy / 140.0}}),
            row("copy", "cuda_memcpy", "peer", "cudaMemcpyAsync device-to-device", f"n={n}",
                memcpy, 8 * n, dram_ratio=None),
            row("gemm_bf16", "cublas", "peer", "cuBLAS BF16 GEMM, FP32 accumulation",
                "M=N=K=8192", 1500.0, 3 * 2 * 8192**2, flops=2 * 8192**3, dram_ratio=None),
        ]
    elif chapter == "01_formats":
        rows = []
        casts = [("f32_to_bf16", 6), ("bf16_to_f32", 6), ("f32_to_e4m3", 5), ("f32_to_e5m2", 5),
                 ("e4m3_to_bf16", 3), ("e5m2_to_bf16", 3)]
        for op, size in casts:
            for version, share, summary in [
                ("v0_software_bits", 0.55, "integer bit manipulation, scalar"),
                ("v1_hardware_cvt", 0.85, "one cvt instruction per element, scalar"),
                ("v2_vec16", 0.97, "16-byte accesses, paired cvt"),
            ]:
                time_us = size * n / (share * ceiling * 1e3)
                rows.append(row(op, version, "version", summary, f"n={n}", time_us, size * n))
    elif chapter == "02_int4_dequant":
        rows = []
        g = 128
        # (op, weight bytes per element, zero points, [(version, share of the ceiling)])
        ops = [
            ("int4_f16", 0.5, False, [("v0_naive", 0.30), ("v1_vec16", 0.80)]),
            ("int4_bf16", 0.5, False, [("v0_naive", 0.30), ("v1_vec16", 0.78)]),
            ("int4i_f16", 0.5, False, [("v2_lop3_magic", 0.84)]),
            ("int4i_bf16", 0.5, False, [("v3_bf16_magic", 0.83)]),
            ("int4i_zp_f16", 0.5, True, [("v4_zero_points", 0.82)]),
            ("int4i_zp_bf16", 0.5, True, [("v4_zero_points", 0.81)]),
            ("int8_f16", 1.0, False, [("v1_vec16", 0.82), ("v5_int8_prmt", 0.86)]),
            ("e4m3_f16", 1.0, False, [("v1_vec16", 0.86), ("v6_fp8_bit_shift", 0.85)]),
            ("e4m3_bf16", 1.0, False, [("v1_vec16", 0.85), ("v6_fp8_bit_shift", 0.84)]),
        ]
        summaries = {
            "v0_naive": "one element per thread: shift, mask, I2F, sub, mul",
            "v1_vec16": "16-byte loads/stores, per-element convert",
            "v2_lop3_magic": "FP16 magic 0x6400: LOP3 + HSUB2/HFMA2, interleaved weights",
            "v3_bf16_magic": "BF16 magic 0x4300: one mask, shifts by 4, sub 136",
            "v4_zero_points": "zero points: magic unpack + one FMA q·s − z·s",
            "v5_int8_prmt": "UINT8: PRMT into 0x64XX, HSUB2 1152",
            "v6_fp8_bit_shift": "E4M3 by bit shift + power-of-two multiply",
        }
        for op, weight_bytes, zero_points, versions in ops:
            shapes = [(8192, 8192)] + ([(14336, 4096)] if op.startswith("int4") else [])
            for n_rows, k in shapes:
                model = n_rows * k * (weight_bytes + 2) + n_rows * (k // g) * 2  # W + out + scales
                if zero_points:
                    model += n_rows * (k // g) // 2  # 4-bit zero points
                for version, share in versions:
                    time_us = model / (share * ceiling * 1e3)
                    shape = f"n={n_rows},k={k},g={g}"
                    rows.append(row(op, version, "version", summaries[version], shape, time_us,
                                    model))
    elif chapter == "03_dynamic_quant":
        rows = []
        ops = {
            "per_token_fp8": [("v0_two_pass", 0.55), ("v1_row_in_registers", 0.80), ("v2_vec16", 0.92)],
            "per_token_int8": [("v0_two_pass", 0.55), ("v1_row_in_registers", 0.80), ("v2_vec16", 0.91)],
            "per_tensor_fp8": [("v0_two_pass", 0.50), ("v2_vec16", 0.60), ("v3_grid_sync", 0.58)],
            "per_group_fp8": [("v0_two_pass", 0.50), ("v2_vec16", 0.90)],
        }
        for op, versions in ops.items():
            for t, d in [(8192, 4096), (1, 4096), (64, 4096)]:
                scales = 1 if op == "per_tensor_fp8" else t * (d // 128 if op == "per_group_fp8" else 1)
                model = 3 * t * d + 4 * scales
                shape = f"t={t},d={d}"
                times = {}
                for version, share in versions:
                    times[version] = model / (share * ceiling * 1e3) + 2.0  # + a launch
                for peer, share in [("torch_eager", 0.25), ("torch_compile", 0.60)]:
                    if t > 64 or peer == "torch_eager":
                        times[peer] = model / (share * ceiling * 1e3) + 8.0
                peer_times = {k: v for k, v in times.items() if k.startswith("torch")}
                for name, time_us in times.items():
                    kind = "peer" if name.startswith("torch") else "version"
                    peers = {} if kind == "peer" else {
                        p: {"time_us": pt, "ratio": pt / time_us} for p, pt in peer_times.items()}
                    rows.append(row(op, name, kind, "example row", shape, time_us, model,
                                    dram_ratio=None if kind == "peer" else 1.001, peers=peers))
    elif chapter == "04_rmsnorm":
        rows = []
        t, d = 8192, 4096
        # (op, version, kind, bytes per element moved, share of the ceiling)
        ladder = [
            ("rmsnorm", "v0_scalar", "version", 4, 0.10),
            ("rmsnorm", "v1_block_tree", "version", 4, 0.75),
            ("rmsnorm", "v2_warp_shuffle", "version", 4, 0.85),
            ("rmsnorm", "v3_vec16_registers", "version", 4, 0.93),
            ("rmsnorm", "torch_eager", "peer", 4, 0.40),
            ("rmsnorm", "torch_compile", "peer", 4, 0.85),
            ("fused_add_rmsnorm", "v4_fused_add", "version", 8, 0.93),
            ("fused_add_rmsnorm", "chain_unfused", "peer", 10, 0.92),
            ("fused_add_rmsnorm", "torch_compile", "peer", 8, 0.85),
            ("fused_add_rmsnorm_fp8", "v5_fused_add_quant", "version", 7, 0.92),
            ("fused_add_rmsnorm_fp8", "chain_unfused", "peer", 13, 0.90),
            ("fused_add_rmsnorm_fp8", "torch_compile", "peer", 7, 0.55),
            ("fused_add_rmsnorm_int8", "v5_fused_add_quant", "version", 7, 0.92),
            ("fused_add_rmsnorm_int8", "chain_unfused", "peer", 13, 0.90),
            ("fused_add_rmsnorm_fp8_group", "v5_fused_add_quant", "version", 7, 0.92),
            ("fused_add_rmsnorm_fp8_group", "chain_unfused", "peer", 13, 0.90),
        ]
        for shape_t in (t, 1, 16, 64):
            for op, version, kind, per_element, share in ladder:
                if shape_t <= 64 and version == "torch_compile":
                    continue
                group_scales = 4 * shape_t * (d // 128) if op.endswith("_group") else 0
                moved = per_element * shape_t * d + 2 * d + group_scales
                quantized = op.endswith(("fp8", "int8", "_group"))
                model = (7 if quantized else 8 if op.startswith("fused") else 4)
                model = model * shape_t * d + 2 * d + group_scales
                time_us = moved / (share * ceiling * 1e3) + 2.0
                rows.append(row(op, version, kind, "example row", f"t={shape_t},d={d}", time_us,
                                moved if version == "chain_unfused" else model,
                                dram_ratio=None if version.startswith("torch") else 1.002))
        for r in rows:  # peers of the same op and shape, as tools/bench.py records them
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"]}
                              for p in rows if p["kind"] == "peer" and p["op"] == r["op"]
                              and p["shape"] == r["shape"]}
    elif chapter == "05_elementwise":
        rows = []
        d_ff, hq, hk, d = 14336, 32, 8, 128  # Llama-3-8B; qk_norm_rope on Qwen3-8B's heads (the same)
        slots = 16
        # (op, shape of T, bytes of T, [(version, kind, share of the ceiling, extra bytes per T)]):
        # the versions move the model's bytes, chain_unfused the unfused chain's (a peer), torch more.
        families = [
            ("silu_and_mul", lambda t: f"t={t},d={d_ff},llama3_8b", lambda t: 6 * t * d_ff,
             [("v0_act_scalar", "version", 0.45, 0), ("v1_act_vec16", "version", 0.92, 0),
              ("torch_eager", "peer", 0.30, 4 * d_ff),  # silu(gate) written and read back
              ("vllm silu_and_mul", "peer", 0.85, 0), ("flashinfer silu_and_mul", "peer", 0.88, 0)]),
            ("silu_and_mul_fp8_per_token", lambda t: f"t={t},d={d_ff},llama3_8b",
             lambda t: 5 * t * d_ff + 4 * t,
             [("v2_act_fused_fp8", "version", 0.90, 0), ("chain_unfused", "peer", 0.88, 4 * d_ff)]),
            ("rope", lambda t: f"t={t},hq={hq},hk={hk},d={d},rot={d},neox,llama3_8b",
             lambda t: 4 * t * (hq + hk) * d + 8 * t + 4 * t * d,
             [("v3_rope_scalar", "version", 0.40, 0), ("v4_rope_vec16", "version", 0.88, 0),
              ("vllm rotary_embedding", "peer", 0.45, 0),
              ("flashinfer apply_rope_with_cos_sin_cache", "peer", 0.85, 0)]),
            ("qk_norm_rope", lambda t: f"t={t},hq={hq},hk={hk},d={d},rot={d},neox,qwen3_8b",
             lambda t: 4 * t * (hq + hk) * d + 4 * d + 8 * t + 4 * t * d,
             [("v5_qk_norm_rope", "version", 0.85, 0), ("chain_unfused", "peer", 0.85, 4 * (hq + hk) * d),
              ("vllm fused_qk_norm_rope", "peer", 0.80, 0)]),
            ("reshape_and_cache", lambda t: f"t={t},hk={hk},d={d},block={slots},paged,llama3_8b",
             lambda t: 8 * t + 8 * t * hk * d,
             [("v6_cache_scalar", "version", 0.35, 0), ("v7_cache_vec16", "version", 0.85, 0),
              ("vllm reshape_and_cache", "peer", 0.55, 0)]),
        ]
        for op, shape, model_of, entries in families:
            for t in (8192, 16):
                model = model_of(t)
                for version, kind, share, extra in entries:
                    moved = model + extra * t
                    time_us = moved / (share * ceiling * 1e3) + (2.0 if t == 16 else 0.0)
                    rows.append(row(op, version, kind, "example row", shape(t), time_us,
                                    moved if version == "chain_unfused" else model,
                                    dram_ratio=None if kind == "peer" else 1.002))
        for r in rows:
            r["graph_us"] = r["back_to_back_us"] = r["time_us"]
        for r in rows:  # peers of the same op and shape, as tools/bench.py records them
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"],
                                             "graph_us": p["graph_us"], "graph_ratio": p["graph_us"] / r["graph_us"]}
                              for p in rows if p["kind"] == "peer" and p["op"] == r["op"]
                              and p["shape"] == r["shape"]}
    elif chapter == "06_int4_gemv":
        rows, g = [], 128
        for n_rows, k in [(28672, 8192), (4096, 4096)]:
            for m in (1, 2, 4, 8, 16):
                shape = f"m={m},n={n_rows},k={k},g={g}"
                act = 2 * m * k + 2 * m * n_rows
                int4 = n_rows * k // 2 + n_rows * (k // g) * 2 + act
                bf16 = 2 * n_rows * k + act
                # (op, version, kind, bytes, share of the ceiling)
                for op, version, kind, model, share in [
                    ("int4_gemv", "v0_warp_per_column", "version", int4, 0.25),
                    ("int4i_gemv", "v1_lop3_magic", "version", int4, 0.27),
                    ("int4i_gemv", "v2_vec16_rows", "version", int4, 0.42 / m ** 0.5),
                    ("int4i_gemv", "v3_mma_split_k", "version", int4, 0.63 - 0.02 * m),
                    ("int4i_gemv", "torch_int4pack_mm", "peer", int4, 0.35 / m ** 0.3),
                    ("int4i_zp_gemv", "v3_mma_split_k", "version", int4 + n_rows * (k // g) // 2, 0.6),
                    ("int4i_gemv", "v4_persistent_smem_x", "version", int4, 0.68 - 0.015 * m),
                    ("int4i_gemv", "v5_balanced_steps", "version", int4, 0.72 - 0.02 * m),
                    ("int4i_gemv", "v6_pipelined", "version", int4, 0.76 - 0.015 * m),
                    ("int4t_gemv", "v7_tiled_stream", "version", int4, 0.79 - 0.015 * m),
                    ("int4t_gemv", "ablation_v7_no_pdl", "ablation", int4, 0.76 - 0.015 * m),
                    ("bf16_gemv", "cublas", "peer", bf16, 0.9),
                ]:
                    time_us = model / (share * ceiling * 1e3)
                    rows.append(row(op, version, kind, "example row", shape, time_us, model,
                                    flops=0, dram_ratio=None if kind == "peer" else 1.01))
                    # Back to back: the launch partly hidden, more for the dependent launch.
                    rows[-1]["back_to_back_us"] = time_us - (3.0 if version.startswith(("v6", "v7")) else 0.5)
                    # In a CUDA graph: less of the launch again.
                    rows[-1]["graph_us"] = rows[-1]["back_to_back_us"] - 0.5
        for r in rows:
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"],
                                             "back_to_back_us": p["back_to_back_us"],
                                             "back_to_back_ratio": p["back_to_back_us"] / r["back_to_back_us"],
                                             "graph_us": p["graph_us"], "graph_ratio": p["graph_us"] / r["graph_us"]}
                              for p in rows if p["kind"] == "peer" and p["shape"] == r["shape"]
                              and p["op"] in (r["op"], "bf16_gemv")}
    elif chapter == "07_w4a16_gemm":
        rows, g, peak = [], 128, 600.0  # the example's tensor rate, TFLOP/s
        for n_rows, k in [(28672, 8192), (8192, 28672)]:
            for m in (1, 16, 256, 4096):
                shape = f"m={m},n={n_rows},k={k},g={g}"
                act, flops = 2 * m * k + 2 * m * n_rows, 2 * m * n_rows * k
                int4, bf16 = n_rows * k // 2 + n_rows * (k // g) * 2 + act, 2 * n_rows * k + act
                # (op, version, kind, bytes, share of the ceiling, share of the tensor rate)
                for op, version, kind, model, mem, tc in [
                    ("w4a16_gemm", "v0_dequant_cublas", "version", int4, 0.1, 0.9),
                    ("w4a16r_gemm", "v3_repacked_lop3", "version", int4, 0.15, 0.3),
                    ("w4a16r_gemm", "v4_scales_in_shared", "version", int4, 0.2, 0.35),
                    ("w4a16r_gemm", "v5_split_k", "version", int4, 0.4, 0.35),
                    ("w4a16r_gemm", "v6_wgmma", "version", int4, 0.4, 0.75),
                    ("w4a16_gemm", "torch_matmul", "peer", bf16, 0.9, 1.0),
                    ("w4a16_gemm", "vllm marlin_gemm", "peer", int4, 0.6, 0.5),
                ]:
                    time_us = max(model / (mem * ceiling * 1e3), flops / (tc * peak * 1e6))
                    rows.append(row(op, version, kind, "example row", shape, time_us, model,
                                    flops=flops, dram_ratio=None))
                    rows[-1]["graph_us"] = rows[-1]["back_to_back_us"] = time_us
        for r in rows:
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"],
                                             "graph_us": p["graph_us"], "graph_ratio": p["graph_us"] / r["graph_us"]}
                              for p in rows if p["kind"] == "peer" and p["shape"] == r["shape"]}
    elif chapter == "08_fp8_gemm":
        rows, peak = [], 1000.0  # the example's FP8 tensor rate, TFLOP/s
        shapes = [(64, 2112, 7168), (4096, 2112, 7168), (8192, 8192, 8192)]
        for m, n, k in shapes:
            for op, scale in (("fp8_gemm", "rowwise"), ("fp8_gemm_blockwise", "blockwise")):
                sa = m if scale == "rowwise" else m * k // 128
                sb = n if scale == "rowwise" else -(-n // 128) * (k // 128)
                model, flops = m * k + n * k + 4 * (sa + sb) + 2 * m * n, 2 * m * n * k
                # (version, kind, share of the ceiling, share of the tensor rate)
                entries = [("v3_warp_specialized", "version", 0.5, 0.8), ("v4_blockwise", "version", 0.5, 0.75),
                           ("torch_scaled_mm", "peer", 0.6, 0.85), ("vllm cutlass_scaled_mm", "peer", 0.6, 0.9)]
                if op == "fp8_gemm":
                    entries = [("v0_mma_sync", "version", 0.2, 0.25), ("v1_wgmma", "version", 0.3, 0.4),
                               ("v2_tma_pipeline", "version", 0.4, 0.6)] + entries
                else:
                    entries = [e for e in entries if e[0] != "v3_warp_specialized"]
                for version, kind, mem, tc in entries:
                    time_us = max(model / (mem * ceiling * 1e3), flops / (tc * peak * 1e6))
                    rows.append(row(op, version, kind, "example row", f"m={m},n={n},k={k},scale={scale}",
                                    time_us, model, flops=flops, dram_ratio=None))
                    rows[-1]["graph_us"] = rows[-1]["back_to_back_us"] = time_us
        for r in rows:
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"],
                                             "graph_us": p["graph_us"], "graph_ratio": p["graph_us"] / r["graph_us"]}
                              for p in rows if p["kind"] == "peer" and p["op"] == r["op"]
                              and p["shape"] == r["shape"]}
    elif chapter == "09_moe":
        rows, bm = [], 64
        # (op, version, kind, µs at no slots, µs per 1000 slots)
        align = [("v0_align_sort", "version", 12.0, 1.0), ("v1_align_global_atomics", "version", 9.0, 0.3),
                 ("v2_align_shared_counting", "version", 4.5, 1.2), ("v3_align_multi_block", "version", 6.5, 0.05),
                 ("torch_eager", "peer", 55.0, 2.5), ("vllm moe_align_block_size", "peer", 4.4, 0.45)]
        topk = [("v4_topk_thread_per_token", "version", 60.0, 8.0), ("v5_topk_warp_per_token", "version", 3.1, 0.8),
                ("torch_eager", "peer", 15.0, 6.0), ("vllm topk_softmax", "peer", 3.5, 1.0)]
        for e, k in ((8, 2), (256, 8)):
            for t in (1, 128, 4096):
                for dist in ("uniform", "zipf", "one") if (e, t) == (256, 4096) else ("uniform",):
                    cap = -(-(t * k + e * (bm - 1)) // bm) * bm
                    model = 4 * t * k + 4 * cap + 4 * (cap // bm) + 4
                    for version, kind, base, per in align:
                        rows.append(row("moe_align_block_size", version, kind, "example row",
                                        f"t={t},e={e},k={k},block_m={bm},{dist}",
                                        base + per * t * k / 1000 * (1.5 if dist == "one" else 1), model,
                                        dram_ratio=None))
                for version, kind, base, per in topk:
                    rows.append(row("topk_softmax", version, kind, "example row", f"t={t},e={e},k={k}",
                                    base + per * t * e / 1e5, 4 * t * e + 8 * t * k, dram_ratio=None))
        for r in rows:
            r["graph_us"] = r["back_to_back_us"] = r["time_us"]
        for r in rows:
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"],
                                             "graph_us": p["graph_us"], "graph_ratio": p["graph_us"] / r["graph_us"]}
                              for p in rows if p["kind"] == "peer" and p["op"] == r["op"]
                              and p["shape"] == r["shape"]}
    elif chapter == "10_sampling":
        rows = []
        # (version, kind, share of the ceiling at B = 256, µs of fixed cost): the sort-based v0 and
        # the sort peer move the row several times, v1 and FlashInfer about once.
        ladder = [("v0_sort_cub", "version", 0.12, 12.0), ("v1_radix_select", "version", 0.55, 4.0),
                  ("torch_eager", "peer", 0.08, 25.0), ("torch_sort", "peer", 0.05, 30.0)]
        for op in ("top_k_mask_logits", "top_k_renorm_probs"):
            entries = [*ladder, (f"flashinfer {op}", "peer", 0.60, 5.0)]
            for b, v, k in ((1, 128256, 50), (256, 128256, 50), (256, 128256, 1024), (256, 152064, 50)):
                model = b * (8 * v + 16)  # lkw.sampling.renorm_bytes
                for version, kind, share, fixed in entries:
                    time_us = model / (share * ceiling * 1e3) + fixed
                    rows.append(row(op, version, kind, "example row", f"b={b},v={v},k={k}", time_us,
                                    model, dram_ratio=None if kind == "peer" else 1.01))
        for r in rows:
            r["graph_us"] = r["back_to_back_us"] = r["time_us"]
        for r in rows:
            if r["kind"] == "version":
                r["peers"] = {p["version"]: {"time_us": p["time_us"], "ratio": p["time_us"] / r["time_us"],
                                             "graph_us": p["graph_us"], "graph_ratio": p["graph_us"] / r["graph_us"]}
                              for p in rows if p["kind"] == "peer" and p["op"] == r["op"]
                              and p["shape"] == r["shape"]}
    else:
        raise KeyError(f"no example for chapter {chapter}")
    return {
        "chapter": chapter, "gpu": "EXAMPLE GPU (not a measurement)", "driver": "0.0",
        "cuda": "0.0", "date": "2000-01-01T00:00:00Z", "commit": "example",
        "ceiling_gbps": ceiling, "ceiling_version": "00_roofline/copy/v2_inflight", "rows": rows,
    }


def _layer_example(ceiling: float) -> dict:
    """Chapter 11's made-up run in the schema lkw.layer_bench writes (its main and run_case): every
    format and case of a full run, with the bench's own byte models, bounds, step owners (every
    workbook version registered) and goal table; only the times are invented (each kernel at a
    share of its bound plus a launch, torch's ops slower). NOT a measurement (its GPU says so)."""
    import math

    from lkw import layer_bench as lb
    from lkw import layer_torch, peers

    cfg, tflops, l2 = lb.dl.LLAMA3_8B, 600.0, 60 << 20  # the example's BF16 tensor rate, its L2
    names = {v for versions in layer_torch.WORKBOOK.values() for v in versions}
    share = {"attn_norm": 0.6, "qkv_proj": 0.75, "rope": 0.3, "cache_write": 0.3, "attention": 0.5,
             "o_proj": 0.6, "ffn_norm": 0.6, "gate_up_proj": 0.8, "act": 0.7, "down_proj": 0.75}
    torch_path = {"w4a16": "torch._weight_int4pack_mm (tinygemm)",
                  "fp8": "torch._scaled_mm, blockwise scales"}
    gemm = {"bf16": "cuBLAS (torch @)", "w4a16": "vllm marlin_gemm",
            "fp8": "vllm cutlass_scaled_mm (blockwise)"}
    norm = "vllm fused_add_rms_norm"

    def graph(us: float) -> dict:  # lkw.layer_bench.time_graph's row
        return {"graph_us": us, "graph_min_us": 0.97 * us, "graph_max_us": 1.05 * us,
                "replays": lb.REPLAYS}

    paths, cases = {}, []
    for fmt in layer_torch.FORMATS:
        peak = tflops * (2 if fmt == "fp8" else 1)  # the bench's FP8 rate: twice the BF16 peak
        if fmt in torch_path:
            paths[fmt] = torch_path[fmt]
        quant = "vllm per_token_group_fp8_quant + " if fmt == "fp8" else ""
        fmt_norm = "vllm rms_norm_per_block_quant" if fmt == "fp8" else norm  # FP8: they quantize
        production = {  # lkw.layer_torch.production_steps' names
            "attn_norm": fmt_norm, "qkv_proj": gemm[fmt], "rope": "vllm rotary_embedding",
            "cache_write": "vllm reshape_and_cache",
            "attention": layer_torch.WORKBOOK["attention"][0] + " (the workbook layer's)",
            "o_proj": quant + gemm[fmt],
            "ffn_norm": fmt_norm, "gate_up_proj": gemm[fmt],
            "act": "vllm silu_and_mul_per_block_quant" if fmt == "fp8" else "vllm silu_and_mul",
            "down_proj": gemm[fmt]}
        for kind, t in lb.CASES:
            owner = layer_torch.workbook_owner(fmt, t, names)
            kernels = []
            for c in lb.models(cfg, fmt, kind, t):
                b_us = lb.bound_us(c.bytes, c.flops, ceiling, peak)
                us = b_us / share[c.name] + 2.0
                kernels.append({"step": c.name, "kernel": owner[c.name], "chapter": c.chapter,
                                "model_bytes": c.bytes, "flops": c.flops, "bound_us": b_us,
                                "pct_bound": 100.0 * b_us / us, **graph(us)})
            alone = {k["step"]: k["graph_us"] for k in kernels}
            summed = sum(alone.values())
            order = lb.swappable(fmt, owner)
            saved = {s: alone[s] * (0.6 if s.endswith("_proj") else 2.0) for s in order}
            us = 1.04 * summed + sum(saved.values())
            fall = [{"swapped": "torch layer", **graph(us)}]
            for s in order:
                us -= saved[s]
                fall.append({"swapped": s, **graph(us)})
            tol = lb.LAYER_TOLERANCE[fmt]
            check = {"correct": True, "rel_error": tol / 5, "tolerance": tol}
            layer = {"workbook": fall[-1], "torch_eager": fall[0]}  # the same rows, as the bench's
            layer["workbook"]["correct"] = True
            layer["production"] = {**graph(0.9 * us), "kernels": dict(production)}
            seqs = t if kind == "decode" else 1
            layer["runner"] = graph(0.97 * us) if seqs == 1 else {
                "graph_us": None, "skipped": f"the runner takes one sequence; this case has {seqs}"}
            if fmt == "bf16":
                layer["torch_compile"] = graph(0.75 * fall[0]["graph_us"])
            nbytes, flops = lb.layer_bound(cfg, fmt, kind, t)
            b_us = lb.bound_us(nbytes, flops, ceiling, peak)
            cases.append({
                "format": fmt, "kind": kind, "t": t, "context": lb.context_of(kind, t),
                "case": lb.case_name(kind, t),
                "rotations": max(2, math.ceil(2 * l2 / nbytes) + 1),
                "check": check, "check_after": dict(check), "owner": owner,
                "torch_paths": dict(paths), "waterfall": fall, "kernels": kernels,
                "kernel_sum_us": summed, "layer": layer, "bound_bytes": nbytes,
                "bound_flops": flops, "bound_us": b_us, "pct_bound": 100.0 * b_us / us,
                "unaccounted": "q, k made contiguous for RoPE (T > 1), allocations, gaps between "
                               "kernels",
            })
    run = {"chapter": lb.CHAPTER, "gpu": "EXAMPLE GPU (not a measurement)", "driver": "0.0",
           "cuda": "0.0", "date": "2000-01-01T00:00:00Z", "commit": "example",
           "timing_modes": ["graph"], "headline": "graph", "ceiling_gbps": ceiling,
           "tensor_tflops": tflops,
           "ceiling_note": "copy ceiling: 00_roofline/copy/v2_inflight, made up for the example; "
                           "tensor peak: made up for the example (not a measurement)",
           "peer_libraries": {name: {"available": name == "vllm",
                                     "detail": "example (not a measurement)"}
                              for name in peers.LIBRARIES},
           "cases": cases}
    run["goals"] = lb.goals(run)
    return run
