"""MkDocs hook: put the measured tables into the chapters.

    <!-- lkw:results 00_roofline -->       the chapter's results table (results.markdown_table):
                                           the time in a CUDA graph first (the headline), its
                                           GB/s and % of the ceiling, then back to back and one
                                           launch after an L2 flush; a run recorded before every
                                           mode was timed leads with one launch, "—" elsewhere
    <!-- lkw:ridge 00_roofline -->         the ridge point of that run (results.ridge_markdown)
    <!-- lkw:ablation 06_int4_gemv -->     the knobs of a version, one off at a time (results.ablation_markdown)
    <!-- lkw:sass_mix 02_int4_dequant -->  the chapter's instruction mix on sm_90a, from
                                           results/sass/mix.json (results.sass_mix_markdown)

The tables come from results/h200/<chapter>.json under $LKW_RESULTS_DIR (default <repo>/results).
A chapter without a file gets a plain "no measurement recorded yet" line, so the book builds
(with --strict) before the first GPU run. The book never types a measured number by hand. The
instruction mix comes from the build, not from a GPU run: it is read from the repository's
results/sass/mix.json (or $LKW_SASS_MIX) whatever $LKW_RESULTS_DIR says.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reference"))
from lkw import results  # (needs the path above)

MARKER = re.compile(r"<!--\s*lkw:(results|ridge|sass_mix|ablation)\s+(\w+)\s*-->")
RENDER = {
    "results": results.markdown_table,
    "ridge": results.ridge_markdown,
    "sass_mix": results.sass_mix_markdown,
    "ablation": results.ablation_markdown,
}


def on_page_markdown(markdown, page, config, files, **kwargs):
    return MARKER.sub(lambda m: RENDER[m[1]](m[2]), markdown)


def on_serve(server, config, builder, **kwargs):
    # `mkdocs serve` rebuilds when a new measurement lands, not only when the text changes.
    if results.results_dir().is_dir():
        server.watch(str(results.results_dir()))
    if results.sass_mix_path().is_file():
        server.watch(str(results.sass_mix_path()))
    return server
