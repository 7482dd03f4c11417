#!/usr/bin/env bash
# The main job. On a machine with a GPU: build, then verify and time every chapter's versions
# and print the tables (tools/bench.py --all; arguments go to it). Without a GPU: build, run the
# host checks and the SASS facts, then print a one-screen summary per chapter of the results
# recorded on an H200 (results/h200/; another GPU's where the H200 has none), saying so;
# `tools/run.sh --all` prints the full tables.
#
# The SASS facts take minutes on a small machine; they are cached until a binary they read
# changes (build/.run_sass_stamp holds the newest binary's mtime, build/run_sass.log the output).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tools/setup.sh || exit 1
py=.venv/bin/python

if $py -c "from lkw import _ext; import sys; sys.exit(0 if _ext.device()['present'] else 1)" \
    2>/dev/null; then
  PYTHONPATH=reference $py tools/bench.py --all "$@"
  exit $?
fi

full=0
for arg in "$@"; do
  case "$arg" in
    --all) full=1 ;;
    *) echo "run: without a GPU the only option is --all (the full recorded tables); got $arg" >&2
       exit 2 ;;
  esac
done

echo "run: no CUDA device on this machine: building, running the host checks and SASS facts."
host_log=build/run_host.log
if ! ctest --test-dir build -L host -V >"$host_log" 2>&1; then
  ctest --test-dir build --rerun-failed --output-on-failure | tail -n 60
  echo "run: host checks FAILED (the whole output: $host_log)"
  exit 1
fi

sass_log=build/run_sass.log
stamp=build/.run_sass_stamp
key="$(stat -c '%Y %n' build/lkw_sass_check build/test_* results/sass/mix.json 2>/dev/null \
  | sort -n | tail -n 1)"
if [ -n "$key" ] && [ -s "$sass_log" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
  echo "run: SASS facts: cached, no binary changed since they passed (rm $stamp to rerun them)."
else
  rm -f "$stamp"
  echo "run: SASS facts: reading every version's machine code with cuobjdump (minutes on 2 cores) ..."
  if ! ctest --test-dir build -L sass -V >"$sass_log" 2>&1; then
    grep -E 'FAIL' "$sass_log" | cut -c 1-120 | head -n 40
    echo "run: SASS facts FAILED (the whole output: $sass_log)"
    exit 1
  fi
  echo "$key" >"$stamp"
fi
echo

if [ "$full" = 1 ]; then
  echo "run: these are the results recorded on an H200 (results/h200/), not measured here:"
  echo
  PYTHONPATH=reference $py tools/bench.py --replay --all
  exit $?
fi

PYTHONPATH=reference $py - "$host_log" "$sass_log" <<'EOF'
"""One screen per chapter: the checks run here, then per op the best version of the recorded run."""
import re
import sys
from collections import Counter
from pathlib import Path

from lkw import results

WIDTH = 120
host_log, sass_log = (Path(p).read_text(errors="replace") for p in sys.argv[1:3])

# ctest -V prefixes each line with the test's number: map numbers to chapters, then count.
chapter_of = {n: c for n, c in re.findall(r"^(\d+): Test command: \S*/test_(\d\d_\w+)", host_log, re.M)}
host = Counter()
for n, k in re.findall(r"^(\d+): \[  PASSED  \] (\d+) tests?\.", host_log, re.M):
    host[chapter_of.get(n)] += int(k)
sass_ok, sass_archs = Counter(), {}
for status, arch, chapter in re.findall(r"(ok  |FAIL) (sm_\w+)\s+(\d\d_\w+)/", sass_log):
    sass_ok[chapter] += status.startswith("ok")
    sass_archs.setdefault(chapter, set()).add(arch)


def fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def us(row, mode):
    return row.get(results.mkey(mode, "us")) if row else None


def rate_text(row, mode):
    tflops, gbps = results.rate(row, mode, "tflops"), results.rate(row, mode)
    flop_per_byte = (row.get("flops") or 0) / row["model_bytes"] if row.get("model_bytes") else 0
    if tflops and flop_per_byte > results.COMPUTE_BOUND_FLOP_PER_BYTE:
        return f"{tflops:.1f} TFLOP/s"
    return f"{gbps:.0f} GB/s" if gbps else "—"


def shape_key(rows, shape):
    """The op's shape this summary shows: the one moving the most bytes, at the smallest batch M
    where the op has one (a GEMV's decode case, M = 1)."""
    m = dict(kv.split("=", 1) for kv in shape.split(",") if "=" in kv).get("m")
    return (-int(m) if m and m.isdigit() else 0,
            max(r.get("model_bytes") or 0 for r in rows if r["shape"] == shape))


print("run: the results recorded on an H200 (results/h200/), not measured here: per op the fastest")
print("     version at its largest shape. The full tables: tools/run.sh --all, or the book.")
chapters = sorted({p.stem for p in results.results_dir().glob("*/[0-9][0-9]_*.json")}
                  | set(host) - {None} | set(sass_ok))
for chapter in chapters:
    archs = ", ".join(sorted(sass_archs.get(chapter, ())))
    checks = f"host checks: {host.get(chapter, 0)} passed · SASS facts: {sass_ok.get(chapter, 0)} passed"
    print()
    print(fit(f"== {chapter}  ·  {checks}" + (f" ({archs})" if archs else "")))
    data, whose = results.book_run(chapter)  # another GPU's run where the H200 has none, said
    if data is None:
        print(fit("   " + results.missing_message(chapter)))
        continue
    if whose:
        print(fit("   " + whose))
    if "rows" not in data:  # chapter 11's layer bench records cases, not rows: its notebook shows them
        print(fit(f"   {data['gpu']} · {data['date'][:10]} · commit {data['commit']} · the layer bench's "
                  f"cases: notebooks/{chapter}.ipynb replays them"))
        continue
    mode = results.headline(data)
    print(fit(f"   {data['gpu']} · {data['date'][:10]} · commit {data['commit']} · µs {results.MODE_WORDS[mode]}"))
    lines = []
    for op in dict.fromkeys(r["op"] for r in data["rows"]):
        rows = [r for r in data["rows"] if r["op"] == op and us(r, mode)]
        if not rows:
            continue
        largest = max(dict.fromkeys(r["shape"] for r in rows), key=lambda s: shape_key(rows, s))
        here = [r for r in rows if r["shape"] == largest]
        mine = [r for r in here if r["kind"] == "version" and r.get("correct", True)]
        best = min(mine or here, key=lambda r: us(r, mode))
        pct = results.pct_ceiling(best, mode, data)
        peers = [r for r in here if r["kind"] == "peer" and r is not best]
        fastest = min(peers, key=lambda r: us(r, mode), default=None)
        versus = f"{fastest['version'][:18]} {us(fastest, mode) / us(best, mode):.2f}×" if fastest else ""
        name = best["version"] + ("" if best["kind"] == "version" else " (peer)")
        lines.append([op, name, largest, f"{us(best, mode):.2f}", rate_text(best, mode),
                      "—" if pct is None else f"{pct:.1f}%", versus])
    if lines:
        lines.insert(0, ["op", "fastest version", "shape", "µs", "rate", "% ceil", "fastest peer"])
        widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
        for line in lines:
            cells = [c.rjust(w) if i in (3, 4, 5) else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
            print(fit("   " + "  ".join(cells).rstrip()))
print()
print("run: fastest peer: its time / ours (above 1, ours is faster); % ceil: of the run's copy ceiling.")
EOF
