"""The book's knob table (results.ablation_markdown): each ablation entry beside its version."""

import json

from lkw import results


def _row(version, kind, shape, graph, b2b, one):
    return {"name": f"06_int4_gemv/int4t_gemv/{version}", "op": "int4t_gemv", "version": version, "kind": kind,
            "shape": shape, "graph_us": graph, "back_to_back_us": b2b, "time_us": one}


def test_pairs_each_knob_with_its_version_at_the_decode_sizes():
    rows = [_row("v7_tiled_stream", "version", "m=1,n=64,k=256,g=128", 10.0, 11.0, 12.0),
            _row("ablation_v7_no_pdl", "ablation", "m=1,n=64,k=256,g=128", 12.0, 11.0, 12.0),
            _row("ablation_v7_no_pdl", "ablation", "m=4,n=64,k=256,g=128", 12.0, 11.0, 12.0),  # not shown
            _row("v6_pipelined", "version", "m=1,n=64,k=256,g=128", 20.0, 21.0, 22.0)]
    pairs = results.ablation_rows({"rows": rows})
    assert [(v["version"], a["version"], a["shape"]) for v, a in pairs] == [
        ("v7_tiled_stream", "ablation_v7_no_pdl", "m=1,n=64,k=256,g=128")]


def test_markdown_shows_every_mode_and_the_change(monkeypatch):
    data = {"gpu": "NVIDIA H200", "date": "d", "commit": "c", "driver": "x", "cuda": "13.0",
            "rows": [_row("v7_tiled_stream", "version", "m=1,n=64,k=256,g=128", 10.0, 11.0, 12.0),
                     _row("ablation_v7_no_evict_first", "ablation", "m=1,n=64,k=256,g=128", 11.0, 11.0, 6.0)]}
    monkeypatch.setattr(results, "load", lambda chapter, gpu=None: data)
    md = results.ablation_markdown("06_int4_gemv")
    line = next(x for x in md.splitlines() if "no_evict_first" in x)
    assert "10.00 → 11.00 (+10.0%)" in line  # graph first
    assert "11.00 → 11.00 (+0.0%)" in line
    assert "12.00 → 6.00 (-50.0%)" in line
    monkeypatch.setattr(results, "load", lambda chapter, gpu=None: {**data, "rows": data["rows"][:1]})
    assert "No ablation entry" in results.ablation_markdown("06_int4_gemv")


def test_a_chapter_without_a_run_of_this_gpu_shows_another_gpu_s_and_says_whose(tmp_path, monkeypatch):
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    data = {"chapter": "06_int4_gemv", "gpu": "NVIDIA H100 80GB HBM3", "date": "d", "commit": "c",
            "driver": "x", "cuda": "13.0",
            "rows": [_row("v7_tiled_stream", "version", "m=1,n=64,k=256,g=128", 10.0, 11.0, 12.0),
                     _row("ablation_v7_no_pdl", "ablation", "m=1,n=64,k=256,g=128", 11.0, 11.0, 12.0)]}
    assert results.NO_MEASUREMENT in results.ablation_markdown("06_int4_gemv")  # no run anywhere
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "06_int4_gemv.json").write_text(json.dumps(data))
    md = results.ablation_markdown("06_int4_gemv")
    assert f"No {results.GPU.upper()} run of 06_int4_gemv" in md and "NVIDIA H100 80GB HBM3's" in md
    assert "10.00 → 11.00 (+10.0%)" in md
    # A run of this GPU is the one shown, and nothing is said of others.
    (tmp_path / results.GPU).mkdir()
    (tmp_path / results.GPU / "06_int4_gemv.json").write_text(json.dumps({**data, "gpu": "NVIDIA H200"}))
    assert "run of 06_int4_gemv is recorded yet" not in results.ablation_markdown("06_int4_gemv")


def test_a_notebook_replays_another_gpu_s_run_where_this_gpu_has_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(results, "live_available", lambda: False)
    assert results.notebook_results("06_int4_gemv") is None
    assert results.NO_MEASUREMENT in capsys.readouterr().out
    data = {"chapter": "06_int4_gemv", "gpu": "NVIDIA H100 80GB HBM3", "date": "d", "commit": "c",
            "driver": "x", "cuda": "13.0", "rows": [_row("v7_tiled_stream", "version", "m=1,n=64,k=256,g=128", 10.0, 11.0, 12.0)]}
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "06_int4_gemv.json").write_text(json.dumps(data))
    assert results.notebook_results("06_int4_gemv")["gpu"] == "NVIDIA H100 80GB HBM3"
    out = capsys.readouterr().out
    assert f"No {results.GPU.upper()} run of 06_int4_gemv" in out and "results/h100/06_int4_gemv.json" in out
    (tmp_path / results.GPU).mkdir()
    (tmp_path / results.GPU / "06_int4_gemv.json").write_text(json.dumps({**data, "gpu": "NVIDIA H200"}))
    assert results.notebook_results("06_int4_gemv")["gpu"] == "NVIDIA H200"
    assert "Replay:" in capsys.readouterr().out


def test_a_recorded_experiment_is_this_gpu_s_else_the_latest_of_another_s(tmp_path, monkeypatch):
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    assert results.recorded("experiments/08_promotion.json") == (None, "")
    for gpu, date in (("h100", "2026-01-01"), ("b200", "2026-02-02")):
        (tmp_path / gpu / "experiments").mkdir(parents=True)
        (tmp_path / gpu / "experiments" / "08_promotion.json").write_text(
            json.dumps({"gpu": f"NVIDIA {gpu.upper()}", "date": date}))
    run, whose = results.recorded("experiments/08_promotion.json")
    assert run["gpu"] == "NVIDIA B200"  # the latest
    assert f"No {results.GPU.upper()} run of 08_promotion" in whose
    assert "results/b200/experiments/08_promotion.json" in whose
    (tmp_path / results.GPU / "experiments").mkdir(parents=True)
    (tmp_path / results.GPU / "experiments" / "08_promotion.json").write_text(
        json.dumps({"gpu": "NVIDIA H200", "date": "2025-01-01"}))
    assert results.recorded("experiments/08_promotion.json") == ({"gpu": "NVIDIA H200", "date": "2025-01-01"}, "")
