"""tools/bench.py --compare: each row's change against a baseline run, and a non-zero exit when a
row is slower beyond the spread both runs recorded (min/max), or fails a check the baseline passed.
Synthetic runs only: the comparison is logic, the runs it compares come from the GPU."""

import json

import pytest
from lkw import bench, results


def row(version, us, spread=0.05, op="op", shape="n=1", correct=True, **modes):
    """A row timed one launch at a time (us) and in any of the other modes (graph=..., back_to_back=...),
    each with [min, max] = us * (1 -+ spread)."""
    r = {"name": f"c/{op}/{version}", "op": op, "version": version, "kind": "version", "shape": shape,
         "correct": correct}
    for mode, t in {"one_launch": us, **modes}.items():
        r[results.mkey(mode, "us")] = t
        if t is not None:
            r[results.mkey(mode, "min_us")] = t * (1 - spread)
            r[results.mkey(mode, "max_us")] = t * (1 + spread)
    return r


def run(*rows, chapter="04_rmsnorm", commit="c"):
    return {"chapter": chapter, "gpu": "TEST", "date": "d", "commit": commit, "rows": list(rows)}


def test_slower_beyond_both_spreads_is_a_regression_and_overlap_is_not():
    old = row("v1", 10.0, graph=8.0, back_to_back=9.0)
    # The graph's fastest new launch is slower than the slowest old one: a regression.
    cmp = results.compare_row(old, row("v1", 10.0, graph=9.0, back_to_back=9.2))
    assert cmp["modes"]["graph"][3] == "slower" and cmp["modes"]["back_to_back"][3] == "within"
    assert cmp["modes"]["graph"][2] == pytest.approx(12.5)
    # 5% slower with 5% spreads on both sides: the intervals overlap.
    assert results.compare_row(old, row("v1", 10.5, graph=8.4))["modes"]["graph"][3] == "within"
    assert results.compare_row(old, row("v1", 8.0, graph=6.0))["modes"]["graph"][3] == "faster"


def test_compare_counts_regressions_failures_new_and_missing_rows():
    base = [run(row("v1", 10.0, graph=8.0), row("v2", 5.0, graph=4.0), row("gone", 1.0))]
    new = [run(row("v1", 10.0, graph=9.0), row("v2", 5.0, graph=4.0, correct=False), row("v3", 2.0))]
    text, regressions = results.compare_runs(base, new)
    assert regressions == 2  # v1 slower in the graph, v2 failing its check
    lines = {line.split()[2]: line for line in text.splitlines() if line.startswith("  ")}
    assert "SLOWER" in lines["v1"] and "+12.5%" in lines["v1"]
    assert lines["v2"].split(None, 3)[3].startswith("FAILED CHECK")
    assert lines["v3"].endswith("new") and lines["gone"].endswith("missing in the new run")
    assert text.splitlines()[-1].startswith("compare: 2 row(s) slower")


def test_a_baseline_without_graph_times_is_compared_on_the_modes_both_runs_have():
    old = row("v1", 10.0)  # one launch only (a run before every mode was timed)
    cmp = results.compare_row(old, row("v1", 10.1, graph=7.0, back_to_back=8.0))
    assert set(cmp["modes"]) == {"one_launch"} and cmp["modes"]["one_launch"][3] == "within"
    text, regressions = results.compare_runs([run(old)], [run(row("v1", 10.1, graph=7.0))])
    assert regressions == 0 and "1 launch 10.00->10.10 µs +1.0%" in text


def test_rows_match_by_chapter_op_shape_and_version():
    base = [run(row("v1", 10.0, shape="t=1")), run(row("v1", 1.0, shape="t=1"), chapter="03_dynamic_quant")]
    new = [run(row("v1", 10.0, shape="t=1")), run(row("v1", 20.0, shape="t=1"), chapter="03_dynamic_quant")]
    _, regressions = results.compare_runs(base, new)
    assert regressions == 1


def test_the_cli_replays_two_recorded_runs_and_exits_non_zero_on_a_regression(tmp_path, capsys):
    base, same, slower = tmp_path / "base.json", tmp_path / "same.json", tmp_path / "slower.json"
    base.write_text(json.dumps(run(row("v1", 10.0, graph=8.0))))
    same.write_text(json.dumps(run(row("v1", 10.2, graph=8.1))))
    slower.write_text(json.dumps(run(row("v1", 10.0, graph=9.5))))
    assert bench.main(["--compare", str(base), "--replay-run", str(same)]) == 0
    assert "compare: 0 row(s) slower" in capsys.readouterr().out
    assert bench.main(["--compare", str(base), "--replay-run", str(slower)]) == 1
    assert "SLOWER" in capsys.readouterr().out
    # A folder of results compares every chapter in it.
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "04_rmsnorm.json").write_text(slower.read_text())
    assert bench.main(["--compare", str(base), "--replay-run", str(folder)]) == 1


def test_the_cli_refuses_a_replay_without_a_baseline_and_an_unreadable_baseline(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--replay-run", str(tmp_path)])
    (tmp_path / "x.json").write_text("[]")
    with pytest.raises(SystemExit):
        bench.main(["--compare", str(tmp_path / "x.json"), "--replay-run", str(tmp_path / "x.json")])


# ---- tools/bench.py --merge: a partial run merged into the recorded one ----------------------


def dated(data, date, commit):
    return {**data, "date": date, "commit": commit}


def test_a_partial_run_replaces_its_rows_in_place_and_appends_new_ones():
    old = dated(run(row("v0", 10.0, shape="n=1"), row("v1", 8.0, shape="n=1"), row("v1", 80.0, shape="n=2")),
                "2026-01-01", "aaa")
    new = dated(run(row("v1", 7.0, shape="n=1"), row("v2", 6.0, shape="n=1")), "2026-02-02", "bbb")
    merged = results.merge_runs(old, new)
    got = [(r["version"], r["shape"], r["time_us"], r["run_commit"]) for r in merged["rows"]]
    assert got == [("v0", "n=1", 10.0, "aaa"), ("v1", "n=1", 7.0, "bbb"), ("v1", "n=2", 80.0, "aaa"),
                   ("v2", "n=1", 6.0, "bbb")]
    assert [(r["commit"], r["rows"]) for r in merged["runs"]] == [("aaa", 2), ("bbb", 2)]
    assert (merged["date"], merged["commit"]) == ("2026-02-02", "bbb")
    header = results.header_line(merged)
    assert "merged from 2026-01-01 (commit aaa, 2 rows), 2026-02-02 (commit bbb, 2 rows)" in header
    # Merged again: the stamps and the run summaries carry over; a run left without rows is dropped.
    newer = dated(run(row("v0", 9.0, shape="n=1"), row("v1", 79.0, shape="n=2")), "2026-03-03", "ccc")
    again = results.merge_runs(merged, newer)
    assert [(r["commit"], r["rows"]) for r in again["runs"]] == [("bbb", 2), ("ccc", 2)]
    assert "aaa" not in results.header_line(again)


def test_a_merged_run_merged_in_brings_each_of_its_runs():
    old = dated(run(row("v0", 10.0, shape="n=1")), "2026-01-01", "aaa")
    part2 = results.merge_runs(dated(run(row("v0", 9.0, shape="n=2")), "2026-02-02", "bbb"),
                               dated(run(row("v0", 8.0, shape="n=3")), "2026-03-03", "ccc"))
    merged = results.merge_runs(old, part2)  # two device calls, each of parts merged, put together
    assert [(r["commit"], r["rows"]) for r in merged["runs"]] == [("aaa", 1), ("bbb", 1), ("ccc", 1)]
    assert sum(r["rows"] for r in merged["runs"]) == len(merged["rows"])


def test_a_full_run_merged_in_leaves_one_run_and_the_plain_header():
    old = dated(run(row("v0", 10.0), row("v1", 8.0)), "2026-01-01", "aaa")
    new = dated(run(row("v0", 9.0), row("v1", 7.0)), "2026-02-02", "bbb")
    merged = results.merge_runs(old, new)
    assert [r["time_us"] for r in merged["rows"]] == [9.0, 7.0]
    assert [run_["commit"] for run_ in merged["runs"]] == ["bbb"]
    assert "2026-02-02 · commit bbb" in results.header_line(merged)


def test_a_peer_library_of_any_merged_run_stays_available():
    loaded = {"vllm": {"available": True, "detail": "vLLM kit"}}
    absent = {"vllm": {"available": False, "detail": "vllm not available"}}
    old = {**dated(run(row("v0", 10.0, shape="n=1"), row("v1", 8.0, shape="n=1")), "2026-01-01", "aaa"),
           "peer_libraries": loaded}
    new = {**dated(run(row("v1", 7.0, shape="n=1")), "2026-02-02", "bbb"), "peer_libraries": absent}
    merged = results.merge_runs(old, new)  # v0's row (and its vLLM peers) still from the first run
    assert merged["peer_libraries"] == loaded
    assert [r["peer_libraries"] for r in merged["runs"]] == [loaded, absent]
    assert not any("not in this run" in note for note in results._notes(merged))
    # Once no row of the run with vLLM is left, the merged run says why it is absent.
    again = results.merge_runs(merged, {**dated(run(row("v0", 9.0, shape="n=1")), "2026-03-03", "ccc"),
                                        "peer_libraries": absent})
    assert again["peer_libraries"] == absent
    assert any("vllm not available" in note for note in results._notes(again))


def test_runs_of_another_chapter_or_gpu_do_not_merge():
    old = run(row("v0", 10.0))
    with pytest.raises(ValueError, match="chapter"):
        results.merge_runs(old, run(row("v0", 9.0), chapter="06_int4_gemv"))
    with pytest.raises(ValueError, match="gpu"):
        results.merge_runs(old, {**run(row("v0", 9.0)), "gpu": "OTHER"})


def test_merge_needs_write_results(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--chapter", "04_rmsnorm", "--merge"])
    assert e.value.code == 2 and "--merge goes with --write-results" in capsys.readouterr().err
