"""The chapter notebooks: each .ipynb is the jupytext pair of its .py, with outputs stripped, and
runs top to bottom in replay mode, both on a recorded run (it plots) and before any run exists
(it says so and skips, without an exception). What needs no measurement still runs then: chapter
02's instruction mix comes from the build (results/sass/mix.json) and is shown either way. No cell
prints more than a screen (MAX_LINES), on the example runs and on the committed H200 runs alike."""

import json
from pathlib import Path

import pytest
from lkw import results

# Installed by tools/setup.sh; a bare GPU machine may lack them (the skip says so).
jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = [
    "00_roofline", "01_formats", "02_int4_dequant", "03_dynamic_quant", "04_rmsnorm", "05_elementwise",
    "06_int4_gemv", "07_w4a16_gemm", "08_fp8_gemm", "09_moe", "10_sampling", "11_decoder_layer",
]
# Figures a notebook draws without a measurement: chapter 02's instruction mix, chapter 05's FP32
# angle error, chapter 08's promotion model, chapter 09's padding waste and imbalance (computed on
# the host); chapter 10's radix-select passes, sampled against exact, and the pivot rounds;
# chapter 11's bytes per step of the layer (its byte model).
STATIC_FIGURES = {"02_int4_dequant": 1, "03_dynamic_quant": 1, "05_elementwise": 1, "08_fp8_gemm": 1,
                  "09_moe": 2, "10_sampling": 3, "11_decoder_layer": 1}
# Figures it draws on a recorded run: the static ones, then the measured ones.
RECORDED_FIGURES = {
    "02_int4_dequant": 3,  # mix, versions side by side, mix against time
    "03_dynamic_quant": 3,  # error per token, prefill bars, decode latency
    "04_rmsnorm": 3,  # the version ladder, the byte table, decode latency
    "05_elementwise": 3,  # the angle error, each op at prefill, decode latency
    "07_w4a16_gemm": 2,  # speed-up over cuBLAS against M, TFLOP/s against M
    "08_fp8_gemm": 2,  # the promotion model, TFLOP/s per shape
    "09_moe": 4,  # waste against BLOCK_M, waste and imbalance against T, align and top-k against T
    "10_sampling": 5,  # passes, sampled vs exact, pivot rounds, time per shape, time vs B
    "11_decoder_layer": 3,  # bytes per step, the waterfall, each kernel on the roofline
}
# A cell prints at most this many lines: one screen. Longer tables belong to the book or to
# `print(results.text_table(data))`, which a reader asks for.
MAX_LINES = 60
COMMITTED = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_ipynb_is_in_sync_with_py(chapter):
    paired = jupytext.read(NOTEBOOKS / f"{chapter}.py")
    stored = nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)
    fix = f"run `jupytext --sync notebooks/{chapter}.py`"
    assert [(c.cell_type, c.source) for c in stored.cells] == [
        (c.cell_type, c.source) for c in paired.cells
    ], f"{chapter}.ipynb differs from {chapter}.py: {fix}"
    for cell in stored.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"outputs committed: {fix}"


def execute(chapter: str, results_dir: Path, monkeypatch) -> list[dict]:
    """Run the notebook in a fresh kernel (replay mode) and return all its outputs, after checking
    that no cell printed more than MAX_LINES lines."""
    monkeypatch.setenv("LKW_RESULTS_DIR", str(results_dir))
    monkeypatch.setenv("LKW_REPLAY", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend makes the PNGs
    nb = nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for number, cell in enumerate(code, 1):
        lines = len(printed(cell.outputs).splitlines())
        first = cell.source.splitlines()[0] if cell.source else ""
        assert lines <= MAX_LINES, (
            f"{chapter}, code cell {number} ({first!r}) printed {lines} lines, more than a screen "
            f"({MAX_LINES}): summarize it, and leave the full table to results.text_table"
        )
    return [out for cell in code for out in cell.outputs]


def printed(outputs: list[dict]) -> str:
    return "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")


def first_entry(recorded: dict) -> str:
    """What a notebook's table must name from a run: its first row's version. Chapter 11's run
    (lkw.layer_bench) holds cases of the whole layer instead of rows of versions: its first case."""
    if recorded["chapter"] == "11_decoder_layer":
        return recorded["cases"][0]["case"]
    return recorded["rows"][0]["version"]


def figures(outputs: list[dict]) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_replay_plots_the_recorded_run(chapter, tmp_path, monkeypatch):
    recorded = results.example(chapter)
    path = tmp_path / results.GPU / f"{chapter}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(recorded))
    outputs = execute(chapter, tmp_path, monkeypatch)
    text = printed(outputs)
    assert f"Replay: {path}" in text
    assert recorded["commit"] in text and first_entry(recorded) in text, "no table printed"
    assert figures(outputs) >= RECORDED_FIGURES.get(chapter, 1), "a figure is missing"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_replay_of_the_committed_run_fits_on_screens(chapter, monkeypatch):
    """The runs in results/h200/ are larger than the examples (every shape, every peer): the
    notebook still runs through them, and every cell stays within MAX_LINES (checked in execute)."""
    if not (COMMITTED / results.GPU / f"{chapter}.json").is_file():
        pytest.skip(f"no committed run results/{results.GPU}/{chapter}.json")
    outputs = execute(chapter, COMMITTED, monkeypatch)
    assert f"{results.NO_MEASUREMENT} for {chapter}" not in printed(outputs)
    assert figures(outputs) >= RECORDED_FIGURES.get(chapter, 1), "a figure is missing"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_missing_results_skip_cleanly(chapter, tmp_path, monkeypatch):
    outputs = execute(chapter, tmp_path, monkeypatch)
    assert f"{results.NO_MEASUREMENT} for {chapter}" in printed(outputs)
    assert figures(outputs) == STATIC_FIGURES.get(chapter, 0), "a figure without a measurement"


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "no_results"])
def test_int4_notebook_shows_the_instruction_mix_without_a_gpu(recorded, tmp_path, monkeypatch):
    chapter = "02_int4_dequant"
    if recorded:
        path = tmp_path / results.GPU / f"{chapter}.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(results.example(chapter)))
    text = printed(execute(chapter, tmp_path, monkeypatch))
    mix = results.mix_rows(chapter)
    assert mix, "results/sass/mix.json has no chapter 02 rows"
    for row in mix:
        assert f"{row['op']}/{row['version']}" in text, f"{row['name']} not in the printed mix"
    assert results.SASS_ARCH in text
    # Part 1 works the book's example word through the magic numbers and checks the bit move.
    assert "0x640F6402" in text and "0x936CAF12" in text
    assert "254 of 254 finite codes" in text
