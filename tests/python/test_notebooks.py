"""The chapter notebooks: each .ipynb is the jupytext pair of its .py, with outputs stripped, and
runs top to bottom in replay mode, both on a recorded run (it plots) and before any run exists
(it says so and skips, without an exception)."""

import json
from pathlib import Path

import pytest
from lkw import results

# Installed by tools/setup.sh; a bare GPU machine may lack them (the skip says so).
jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = ["00_roofline", "01_formats"]


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
    """Run the notebook in a fresh kernel (replay mode) and return all its outputs."""
    monkeypatch.setenv("LKW_RESULTS_DIR", str(results_dir))
    monkeypatch.setenv("LKW_REPLAY", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend makes the PNGs
    nb = nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def printed(outputs: list[dict]) -> str:
    return "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")


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
    assert recorded["commit"] in text and recorded["rows"][0]["version"] in text, "no table printed"
    assert figures(outputs) >= 1, "the notebook drew no figure"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_missing_results_skip_cleanly(chapter, tmp_path, monkeypatch):
    outputs = execute(chapter, tmp_path, monkeypatch)
    assert f"{results.NO_MEASUREMENT} for {chapter}" in printed(outputs)
    assert figures(outputs) == 0, "a figure without a measurement"
