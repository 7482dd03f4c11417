"""The bench's parts that need no GPU: the Nsight Compute CSV mapping (kernels by launch order,
the late write-backs of the flush that follows each version), the rotation and batching rule of the
three timing modes, a chapter's header and ratios from measured rows, the tables of old and new
runs, the harness comparison through the extension, and the schema of every recorded results file.

Tests check behaviour; they never assert a measured figure of a recorded run (benches print those,
and `tools/bench.py --compare` compares runs on the GPU)."""

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from lkw import bench, results

REPO = Path(__file__).resolve().parents[2]


def ncu_csv(kernels):
    lines = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    for i, (name, read, write) in enumerate(kernels):
        lines.append(f'"{i}","{name}","dram__bytes_read.sum","byte","{read:,}"')
        lines.append(f'"{i}","{name}","dram__bytes_write.sum","byte","{write:,}"')
    return "==PROF== noise before the table\n" + "\n".join(lines) + "\n"


def launch(name, *hints, kernels=1):
    return {"name": name, "shape": "n=1", "kernels": kernels, "kernel_hints": list(hints)}


def test_dram_bytes_count_the_flush_writes_after_each_version_and_not_its_reads():
    csv_text = ncu_csv([
        ("copy_v0_scalar_kernel", 1000, 900), ("flush_l2_kernel<0>", 120_000, 100),
        ("copy_v1_vec16_kernel", 1000, 1000), ("flush_l2_kernel<0>", 120_000, 0),
    ])
    order = [launch("a/copy/v0", "copy_v0_scalar_kernel"), launch("a/copy/v1", "copy_v1_vec16_kernel")]
    got = bench.parse_ncu(csv_text, order, log=lambda *_: None)
    assert got == {("a/copy/v0", "n=1"): 2000.0, ("a/copy/v1", "n=1"): 2000.0}


def test_the_first_profiled_flush_alone_is_dropped_not_charged_to_a_version():
    csv_text = ncu_csv([
        ("flush_l2_kernel<0>", 9_999, 9_999),  # the dropped first profiled kernel
        ("copy_v1_vec16_kernel", 1000, 1000), ("flush_l2_kernel<0>", 120_000, 7),
    ])
    order = [{"name": "(first)", "shape": "", "kernels": 0, "kernel_hints": []},
             launch("a/copy/v1", "copy_v1_vec16_kernel")]
    assert bench.parse_ncu(csv_text, order, log=lambda *_: None) == {("a/copy/v1", "n=1"): 2007.0}


def test_int4_gemv_rows_are_compared_with_the_cublas_peer_of_their_shape():
    def row(op, version, kind, shape, time_us):
        return {"op": op, "version": version, "kind": kind, "shape": shape, "time_us": time_us}

    rows = [row("int4i_gemv", "v3", "version", "m=1", 40.0), row("bf16_gemv", "cublas", "peer", "m=1", 120.0),
            row("bf16_gemv", "cublas", "peer", "m=8", 125.0), row("int4i_gemv", "torch_matmul", "peer", "m=1", 100.0),
            row("int4t_gemv", "v7", "version", "m=1", 20.0), row("int4i_zp_gemv", "v3", "version", "m=1", 50.0)]
    # Back to back and in a CUDA graph where both sides were timed so.
    rows[0].update(back_to_back_us=32.0, graph_us=30.0)
    rows[1].update(back_to_back_us=112.0, graph_us=111.0)
    rows[3].update(back_to_back_us=96.0)
    rows[4].update(graph_us=10.0)
    bench._peer_ratios(rows)
    assert rows[0]["peers"] == {
        "cublas": {"time_us": 120.0, "ratio": 3.0, "back_to_back_us": 112.0, "back_to_back_ratio": 3.5,
                   "graph_us": 111.0, "graph_ratio": pytest.approx(3.7)},
        "torch_matmul": {"time_us": 100.0, "ratio": 2.5, "back_to_back_us": 96.0, "back_to_back_ratio": 3.0}}
    # Another INT4 layout meets the INT4 peers measured under int4i_gemv too; zero points do not.
    assert set(rows[4]["peers"]) == {"cublas", "torch_matmul"}
    assert rows[4]["peers"]["cublas"]["graph_ratio"] == pytest.approx(11.1)
    assert set(rows[5]["peers"]) == {"cublas"}


def test_per_output_tolerances_split_on_slashes():
    assert bench.tolerance_of("exact", 3) == "exact"
    assert [bench.tolerance_of("ulp:2/exact", i) for i in (0, 1)] == ["ulp:2", "exact"]


class _Sized:
    """A stand-in for a tensor: only its size in bytes matters to the rotation count."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def numel(self):
        return self.nbytes

    def element_size(self):
        return 1


def test_rotations_past_the_weights_leave_no_scales_in_l2():
    """At M = 1, 28672 x 8192 the sets (x, tiled weights, scales; y) exceed twice the 60 MB L2 in
    two, so three rotate (one more than enough: between two launches on one set the others read
    more than twice the L2). Past the largest input (int4t_gemv: its final versions copy the
    weights evict_first) the scales, x and y alone must exceed twice the L2: 35 sets, one fewer
    would not. One rule for all three timing modes."""
    l2 = 60 << 20
    x, w, s, y = _Sized(2 * 8192), _Sized(28672 * 8192 // 2), _Sized(28672 * 64 * 2), _Sized(2 * 28672)
    assert bench._rotations([x, w, s], [y], l2) == 3
    sets = bench._rotations([x, w, s], [y], l2, past_largest=True)
    rest = x.nbytes + s.nbytes + y.nbytes
    assert (sets - 1) * rest >= 2 * l2 > (sets - 2) * rest
    assert sets == 35
    # Never fewer than two sets, however large one is.
    assert bench._rotations([_Sized(4 * l2)], [_Sized(4 * l2)], l2) == 2
    cases = {c.op: c for c in bench.int4_gemv_cases() if c.shape.startswith("m=1,n=28672,k=8192")}
    assert cases["int4t_gemv"].rotate_past_largest and not cases["int4i_gemv"].rotate_past_largest


def test_a_graph_batch_holds_every_input_set_so_the_graph_rotates_past_the_l2():
    """A CUDA graph replays the same launches: its batch must visit every set, or a decode shape
    with thousands of small sets would replay a handful that sit in L2."""
    assert bench._batching(3) == (bench.BACK_TO_BACK, bench.BACK_TO_BACK_BATCHES)
    for sets in (21, 453, 10_241):
        batch, batches = bench._batching(sets)
        assert batch >= sets and bench.MIN_BATCHES <= batches <= bench.BACK_TO_BACK_BATCHES
    assert bench._batching(10_241)[1] == bench.MIN_BATCHES


def test_checks_after_timing_spread_over_the_sets_first_and_last_included():
    assert bench._spread(5) == [0, 1, 2, 3, 4]
    picked = bench._spread(10_000, 64)
    assert len(picked) == 64 and picked[0] == 0 and picked[-1] == 9_999 and picked == sorted(set(picked))


def test_every_case_is_timed_in_all_three_modes_no_opt_in():
    import dataclasses

    names = {f.name for f in dataclasses.fields(bench.Case)}
    assert "back_to_back" not in names  # no per-case opt-in: every op, version and peer
    assert bench.TIMING_MODES == ["one_launch", "back_to_back", "graph"] and bench.HEADLINE == "graph"
    assert set(bench.TIMING_MODES) == set(results.MODES) and results.MODES[0] == bench.HEADLINE


def test_production_peers_are_wired_to_the_ops_they_compute():
    """The cases name their production peers (built only when measured: no library needed here)."""
    by_op = {}
    for chapter in ("03_dynamic_quant", "04_rmsnorm"):
        for c in bench.CHAPTERS[chapter]():
            by_op.setdefault(c.op, set()).update(c.library_peers)
    assert by_op["per_group_fp8"] == {"vllm per_token_group_fp8_quant"}
    assert by_op["per_token_fp8"] == {"vllm dynamic_per_token_scaled_fp8_quant"}
    assert {"vllm fused_add_rms_norm", "flashinfer fused_add_rmsnorm", "liger fused_add_rms_norm"} <= by_op[
        "fused_add_rmsnorm"]
    assert by_op["fused_add_rmsnorm_fp8_group"] == {"vllm rms_norm_per_block_quant"}
    fp8 = by_op["fused_add_rmsnorm_fp8"]
    assert "vllm rms_norm_dynamic_per_token_quant" in fp8
    # A peer computing another quantization says so in its name.
    assert {p for p in fp8 if "static" in p} == {p for p in fp8 if p.endswith("(static scale)")} != set()
    gemv = {c.shape: c for c in bench.int4_gemv_cases() if c.op == "int4i_gemv"}
    assert all(set(c.library_peers) == {"vllm marlin_gemm", "vllm machete_mm"} for c in gemv.values())
    assert {int(s.split(",")[0][2:]) for s in gemv} == set(bench.GEMV_M)


class _FakeExt:
    @staticmethod
    def device():
        return {"name": "NVIDIA TEST", "runtime_version": 13000}


def test_a_chapter_run_writes_the_timing_marker_ceilings_and_ratios_of_every_mode(monkeypatch):
    """run_chapter on rows as measure_case returns them (no GPU): the header says which modes were
    timed and which leads, each mode's % of ceiling is against the copy timed the same way, and the
    peer ratios are per mode."""

    def row(kind, version, us, b2b, graph):
        r = {"name": f"x/op/{version}", "op": "op", "version": version, "kind": kind, "summary": "",
             "shape": "n=1", "model_bytes": 4e6, "flops": 0.0, "correct": True,
             "time_us": us, "back_to_back_us": b2b, "graph_us": graph, "back_to_back_correct": True,
             "graph_correct": True}
        for mode in results.MODES:
            t = r[results.mkey(mode, "us")]
            r[results.mkey(mode, "min_us")], r[results.mkey(mode, "max_us")] = 0.9 * t, 1.1 * t
        bench._rates(r)
        return r

    case = bench.Case("op", "n=1", ["uint32", "uint32"], None, None)
    monkeypatch.setitem(bench.CHAPTERS, "99_test", lambda: [case])
    monkeypatch.setattr(bench, "ext", lambda: _FakeExt)
    monkeypatch.setattr(bench, "versions_of", lambda *a: [])
    monkeypatch.setattr(bench, "measure_case", lambda *a, **k: [row("version", "v1", 4.0, 2.0, 1.0),
                                                                row("peer", "p", 8.0, 6.0, 5.0)])
    monkeypatch.setattr(bench, "same_size_copy", lambda *a, **k: None)
    ceilings = {"one_launch": 2000.0, "back_to_back": 4000.0, "graph": 8000.0}
    run = bench.run_chapter("99_test", ceiling=(ceilings, "00_roofline/copy/v1", []), warmup=1, iters=1,
                            l2_bytes=1, peer_status={"vllm": {"available": False, "detail": "why"}})
    assert run["timing_modes"] == bench.TIMING_MODES and run["headline"] == "graph"
    assert (run["ceiling_gbps"], run["back_to_back_ceiling_gbps"], run["graph_ceiling_gbps"]) == (2000, 4000, 8000)
    v1 = run["rows"][0]
    assert v1["gbps"] == pytest.approx(1000) and v1["pct_ceiling"] == pytest.approx(50)
    assert v1["graph_gbps"] == pytest.approx(4000) and v1["graph_pct_ceiling"] == pytest.approx(50)
    assert v1["peers"]["p"] == {"graph_us": 5.0, "graph_ratio": 5.0, "back_to_back_us": 6.0,
                                "back_to_back_ratio": 3.0, "time_us": 8.0, "ratio": 2.0}
    assert run["peer_libraries"]["vllm"]["detail"] == "why"
    check_results_schema(run, "99_test")
    table = results.text_table(run)
    header = table.splitlines()[2].split()
    assert header[:6] == ["op", "version", "summary", "shape", "in", "a"]  # the graph's time first
    assert "p 5.00×" in table and "vllm" not in table.split("Production peers")[0].splitlines()[-1]


def test_rounds_give_each_row_the_median_of_its_rounds_and_keep_a_wrong_round_as_it_was():
    """combine_rounds: every row once in the first round's order, each mode's median over the
    rounds (the rates from it), the least minimum and greatest maximum, every round's figure; a row
    wrong in one round is that round's row; a row only a later round has is kept."""

    def row(version, us, graph, correct=True):
        r = {"name": f"x/op/{version}", "op": "op", "version": version, "kind": "version", "summary": "",
             "shape": "n=1", "model_bytes": 4e6, "flops": 8e6, "correct": correct,
             "time_us": us, "back_to_back_us": None, "graph_us": graph}
        for mode in results.MODES:
            t = r[results.mkey(mode, "us")]
            r[results.mkey(mode, "min_us")], r[results.mkey(mode, "max_us")] = (t - 1, t + 1) if t else (None, None)
        bench._rates(r)
        return r

    rounds = [[row("a", 10.0, 4.0), row("b", 20.0, 8.0)],
              [row("a", 12.0, 6.0), row("b", 21.0, None, correct=False)],
              [row("a", 11.0, 5.0), row("b", 22.0, 9.0), row("c", 1.0, 1.0)]]
    a, b, c = bench.combine_rounds(rounds)
    assert (a["version"], b["version"], c["version"]) == ("a", "b", "c")
    assert a["time_us"] == 11.0 and a["graph_us"] == 5.0 and a["rounds"] == 3
    assert a["graph_us_rounds"] == [4.0, 6.0, 5.0] and a["time_us_rounds"] == [10.0, 12.0, 11.0]
    assert (a["graph_min_us"], a["graph_max_us"]) == (3.0, 7.0)
    assert a["graph_gbps"] == pytest.approx(4e6 / 5e3) and a["graph_tflops"] == pytest.approx(8e6 / 5e6)
    assert a["back_to_back_us"] is None and "back_to_back_us_rounds" not in a
    assert b["correct"] is False and b["time_us"] == 21.0 and b["graph_us"] is None
    assert c["time_us"] == 1.0 and c["rounds"] == 1
    assert rounds[0][0]["graph_us"] == 4.0  # the rounds' rows are not changed
    one = [row("a", 10.0, 4.0)]
    assert bench.combine_rounds([one]) is one


def test_only_picks_the_versions_and_peers_and_rounds_measure_each_case_again(monkeypatch):
    """run_chapter with only= and rounds=: measure_case gets the versions whose id the pattern
    finds (and the pattern for the peers), once per round."""
    case = bench.Case("op", "n=1", ["uint32", "uint32"], None, None)
    monkeypatch.setitem(bench.CHAPTERS, "99_test", lambda: [case])
    monkeypatch.setattr(bench, "ext", lambda: _FakeExt)
    monkeypatch.setattr(bench, "versions_of", lambda *a: [{"id": i} for i in ("v5_tuned", "v6", "ablation_v5_x")])
    monkeypatch.setattr(bench, "same_size_copy", lambda *a, **k: None)
    calls = []

    def measure(case, versions, **k):
        calls.append(([v["id"] for v in versions], k["only"]))
        return []

    monkeypatch.setattr(bench, "measure_case", measure)
    bench.run_chapter("99_test", ceiling=({}, "c", []), warmup=1, iters=1, l2_bytes=1, rounds=2, only="v5")
    assert calls == [(["v5_tuned", "ablation_v5_x"], "v5")] * 2


def test_rounds_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0", "--chapter", "08_fp8_gemm"])
    assert "--rounds 0" in capsys.readouterr().err


def _gemm_run_rows(tflops_graph: float) -> list[dict]:
    r = {"name": "07_w4a16_gemm/w4a16r_gemm/v7", "op": "w4a16r_gemm", "version": "v7", "kind": "version",
         "summary": "", "shape": "m=4096,n=8,k=8,g=128", "model_bytes": 1e6, "flops": 2e12, "correct": True,
         "time_us": 4000.0, "back_to_back_us": 4000.0, "graph_us": 2e12 / (tflops_graph * 1e6),
         "back_to_back_correct": True, "graph_correct": True}
    for mode in results.MODES:
        t = r[results.mkey(mode, "us")]
        r[results.mkey(mode, "min_us")], r[results.mkey(mode, "max_us")] = t, t
    bench._rates(r)
    return [r]


def _roofline_file(root: Path, row: dict | None) -> None:
    (root / "h200").mkdir(parents=True, exist_ok=True)
    run = {"chapter": "00_roofline", "gpu": "NVIDIA H200", "date": "D", "commit": "C", "rows": [row] if row else []}
    (root / "h200" / "00_roofline.json").write_text(json.dumps(run))


def test_the_tensor_peak_is_chapter_00_s_recorded_cublas_gemm_per_mode(tmp_path, monkeypatch):
    """results.tensor_peak: the gemm_bf16/cublas row of results/<gpu>/00_roofline.json, its TFLOP/s
    in each mode, and where it came from; none (and why) without the file or the row."""
    recorded = json.loads((REPO / "results" / "h200" / "00_roofline.json").read_text())
    row = next(r for r in recorded["rows"] if r["op"] == "gemm_bf16" and r["version"] == "cublas")
    peak, source = results.tensor_peak("h200")
    assert peak["graph"] == pytest.approx(results.rate(row, "graph", "tflops"))
    assert set(peak) == set(results.MODES) and "gemm_bf16/cublas" in source and "00_roofline.json" in source
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    assert results.tensor_peak("h200") == ({}, f"{tmp_path / 'h200' / '00_roofline.json'} does not exist")
    _roofline_file(tmp_path, {"op": "copy", "version": "v1", "graph_us": 1.0})
    peak, why = results.tensor_peak("h200")
    assert peak == {} and "no gemm_bf16/cublas row" in why
    _roofline_file(tmp_path, {"op": "gemm_bf16", "version": "cublas", "shape": "m=8192,n=8192,k=8192",
                              "flops": 1.1e12, "graph_us": 2000.0, "back_to_back_us": 2200.0, "time_us": 1000.0})
    peak, source = results.tensor_peak("h200")
    assert peak == pytest.approx({"graph": 550.0, "back_to_back": 500.0, "one_launch": 1100.0})


def test_a_w4a16_run_gets_its_percent_of_the_tensor_peak_or_says_why_not(tmp_path, monkeypatch):
    """run_chapter of chapter 07: each row's TFLOP/s in each mode over the peak of that mode, read
    when the bench runs (the run records the peak and its source); without a recorded peak the run
    says why and no row has a %; the table shows the headline's % beside TFLOP/s, and a run
    recorded without the fields gets them from the file when it is shown."""
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    _roofline_file(tmp_path, {"op": "gemm_bf16", "version": "cublas", "shape": "m=8192,n=8192,k=8192",
                              "flops": 1e12, "graph_us": 1250.0, "back_to_back_us": 1250.0, "time_us": 1000.0})
    case = bench.Case("w4a16r_gemm", "m=4096,n=8,k=8,g=128", ["uint32"], None, None)
    monkeypatch.setitem(bench.CHAPTERS, "07_w4a16_gemm", lambda: [case])
    monkeypatch.setattr(bench, "ext", lambda: type("E", (), {"device": staticmethod(
        lambda: {"name": "NVIDIA H200", "runtime_version": 13000})}))
    monkeypatch.setattr(bench, "versions_of", lambda *a: [])
    monkeypatch.setattr(bench, "measure_case", lambda *a, **k: _gemm_run_rows(400.0))
    monkeypatch.setattr(bench, "same_size_copy", lambda *a, **k: None)
    ceiling = ({m: 4000.0 for m in results.MODES}, "00_roofline/copy/v1", [])
    run = bench.run_chapter("07_w4a16_gemm", ceiling=ceiling, warmup=1, iters=1, l2_bytes=1)
    assert run["graph_tensor_peak_tflops"] == pytest.approx(800.0)
    assert run["tensor_peak_tflops"] == pytest.approx(1000.0) and "gemm_bf16/cublas" in run["tensor_peak_source"]
    (r,) = run["rows"]
    assert r["graph_pct_tensor_peak"] == pytest.approx(50.0) and r["pct_tensor_peak"] == pytest.approx(50.0)
    check_results_schema(run, "07 with peak")
    table = results.text_table(run)
    assert "400.0 TFLOP/s (50% of peak)" in table and "the measured cuBLAS GEMM's 800.0 TFLOP/s" in table
    # Recorded before the peak was: computed from the file when shown.
    old = {k: v for k, v in run.items() if "tensor_peak" not in k}
    old["rows"] = [{k: v for k, v in r.items() if "tensor_peak" not in k}]
    assert "(50% of peak)" in results.text_table(old)
    # No peak recorded for this GPU: the run says why, the rows have no %.
    (tmp_path / "h200" / "00_roofline.json").unlink()
    run = bench.run_chapter("07_w4a16_gemm", ceiling=ceiling, warmup=1, iters=1, l2_bytes=1, log=lambda *a: None)
    assert "does not exist" in run["tensor_peak_missing"] and "tensor_peak_source" not in run
    assert all("pct_tensor_peak" not in k for k in run["rows"][0])
    table = results.text_table(run)
    assert "% of peak)" not in table and "No % of the BF16 tensor peak" in table
    # Other chapters: no peak fields at all.
    monkeypatch.setitem(bench.CHAPTERS, "99_test", lambda: [case])
    run = bench.run_chapter("99_test", ceiling=ceiling, warmup=1, iters=1, l2_bytes=1)
    assert not any("tensor_peak" in k for k in run) and "of peak" not in results.text_table(run)


def _old_run():
    """A run of the schema before every mode was timed: one launch only."""
    return {"chapter": "04_rmsnorm", "gpu": "NVIDIA TEST", "driver": "1", "cuda": "13.0", "date": "d",
            "commit": "c", "ceiling_gbps": 4000.0, "ceiling_version": "00_roofline/copy/v1",
            "rows": [{"name": "a/op/v1", "op": "op", "version": "v1", "kind": "version", "summary": "s",
                      "shape": "t=1", "time_us": 2.0, "model_bytes": 4e6, "gbps": 2000.0, "tflops": None,
                      "flops": 0.0, "pct_ceiling": 50.0, "dram_ratio": None, "correct": True,
                      "peers": {"torch_eager": {"time_us": 6.0, "ratio": 3.0}}},
                     {"name": "a/op/torch_eager", "op": "op", "version": "torch_eager", "kind": "peer",
                      "summary": "torch", "shape": "t=1", "time_us": 6.0, "model_bytes": 4e6, "gbps": 666.7,
                      "tflops": None, "flops": 0.0, "pct_ceiling": 16.7, "dram_ratio": None, "correct": True,
                      "peers": {}}]}


def test_an_old_run_still_renders_one_launch_first_with_a_dash_for_the_other_modes():
    run = _old_run()
    assert results.headline(run) == "one_launch"
    cols = results.columns(run)
    assert cols[4] == "one launch µs" and cols[7:9] == ["in a CUDA graph µs", "back to back µs"]
    cells = results._cells(run["rows"][0], run)
    assert cells[4:9] == ["2.00", "2000 GB/s", "50.0", "—", "—"]
    assert cells[-1] == "torch_eager 3.00×"
    assert "timed one launch after an L2 flush" in results.text_table(run)


def test_a_new_run_leads_with_the_graph_and_says_where_a_ratio_comes_from_another_mode():
    run = _old_run()
    run.update(timing_modes=bench.TIMING_MODES, headline="graph", graph_ceiling_gbps=8000.0)
    v1 = run["rows"][0]
    v1.update(graph_us=1.0, back_to_back_us=1.5)
    v1["peers"]["torch_eager"].update(graph_us=2.0, graph_ratio=2.0)
    v1["peers"]["vllm x"] = {"time_us": 5.0, "ratio": 2.5}  # not captured in a graph
    cells = results._cells(v1, run)
    assert results.columns(run)[4:9] == ["in a CUDA graph µs", "achieved", "% of ceiling", "back to back µs",
                                         "one launch µs"]
    # 4 MB in 1 µs is 4000 GB/s, half of the graph's copy ceiling.
    assert cells[4:9] == ["1.00", "4000 GB/s", "50.0", "1.50", "2.00"]
    assert cells[-1] == "torch_eager 2.00×, vllm x 2.50× (one launch)"
    # The peer row has no graph time: its headline cells say so.
    assert results._cells(run["rows"][1], run)[4:7] == ["—", "—", "—"]


def test_bench_cases_of_chapters_03_and_04_name_every_tensor_of_their_op():
    from lkw import golden

    for chapter, ops in (("03_dynamic_quant", golden.QUANT_OPS), ("04_rmsnorm", golden.NORM_OPS)):
        cases = bench.CHAPTERS[chapter]()
        assert {c.op for c in cases} == set(ops)
        for c in cases:
            op = golden.OPS[c.op]
            assert c.dtypes == [*op.inputs, *op.outputs]
            assert "torch_eager" in c.torch_peers
            t = int(c.shape.split(",")[0].split("=")[1])
            assert ("torch_compile" in c.torch_peers) == (t > bench.ACT_SAMPLE_ROWS)


def test_several_profiled_launches_of_a_version_give_their_median():
    csv_text = ncu_csv([
        ("copy_v0_scalar_kernel", 1000, 0), ("flush_l2_kernel<0>", 120_000, 10),
        ("copy_v0_scalar_kernel", 1400, 0), ("flush_l2_kernel<0>", 120_000, 10),  # the outlier
        ("copy_v0_scalar_kernel", 1020, 0), ("flush_l2_kernel<0>", 120_000, 10),
        ("copy_v1_vec16_kernel", 500, 500), ("flush_l2_kernel<0>", 120_000, 0),
    ])
    v0 = launch("a/copy/v0", "copy_v0_scalar_kernel")
    order = [v0, dict(v0), dict(v0), launch("a/copy/v1", "copy_v1_vec16_kernel")]
    got = bench.parse_ncu(csv_text, order, log=lambda *_: None)
    assert got == {("a/copy/v0", "n=1"): 1030.0, ("a/copy/v1", "n=1"): 1000.0}


def test_a_kernel_order_mismatch_drops_the_measurement_instead_of_misattributing_it():
    csv_text = ncu_csv([("copy_v1_vec16_kernel", 1, 1), ("flush_l2_kernel<0>", 1, 1)])
    messages = []
    got = bench.parse_ncu(csv_text, [launch("a/copy/v0", "copy_v0_scalar_kernel")], log=messages.append)
    assert got == {} and "mismatch" in messages[0]


def test_a_version_that_runs_another_kernel_at_some_shapes_is_matched_by_any_of_its_facts():
    # (int4t_gemv v15: its own kernel at M <= 2, v14's elsewhere; both named by its SASS facts.)
    csv_text = ncu_csv([("void persistent::persistent_kernel<2, 1>(Params)", 10, 10), ("flush_l2_kernel<0>", 5, 5),
                        ("void persistent::persistent_blk_kernel<1, 0>(Params)", 20, 20), ("flush_l2_kernel<0>", 5, 5)])
    v15 = launch("a/gemv/v15", "persistent_blk_kernel*ILi1ELi0E*", "persistent_kernel*ELi2E")
    assert bench.parse_ncu(csv_text, [v15, dict(v15)], log=lambda *_: None) == {("a/gemv/v15", "n=1"): 35.0}
    only_own = launch("a/gemv/v15", "persistent_blk_kernel*ILi1ELi0E*")
    messages = []
    assert bench.parse_ncu(csv_text, [only_own, dict(only_own)], log=messages.append) == {}
    assert "mismatch" in messages[0]


def test_missing_kernels_leave_later_launches_unmeasured():
    csv_text = ncu_csv([("cast_v0_kernel<X>", 10, 10), ("flush_l2_kernel<0>", 5, 5)])
    order = [launch("a/x/v0", "cast_v0_kernel"), launch("a/x/v1", "cast_v1_kernel")]
    got = bench.parse_ncu(csv_text, order, log=lambda *_: None)
    assert got == {("a/x/v0", "n=1"): 25.0}


def test_compare_uses_the_harness_and_reports_the_first_bad_element():
    pytest.importorskip("lkw._ext", reason="the extension is built by tools/setup.sh")
    a = np.arange(1, 101, dtype=np.uint32)
    assert bench.compare(a, a.copy(), "uint32")["pass"]
    b = a.copy()
    b[17] += 1
    rep = bench.compare(b, a, "uint32")
    assert not rep["pass"] and rep["first_bad"] == 17 and rep["bad"] == 1
    with pytest.raises(ValueError):
        bench.compare(a, a[:50], "uint32")


def test_replay_prints_the_recorded_h200_tables_and_another_gpus_where_the_h200_has_none():
    out = subprocess.run([sys.executable, str(REPO / "tools" / "bench.py"), "--replay"],
                         capture_output=True, text=True, check=True).stdout
    for chapter in bench.CHAPTERS:
        path = REPO / "results" / "h200" / f"{chapter}.json"
        others = sorted((REPO / "results").glob(f"*/{chapter}.json"))
        if path.exists() or others:
            run = json.loads((path if path.exists() else others[0]).read_text())
            assert results.header_line(run) in out
            assert run["rows"][0]["version"] in out
            if not path.exists():  # the book's rule: whose run it is, said
                assert f"No H200 run of {chapter} is recorded yet" in out and run["gpu"] in out
        else:
            assert results.missing_message(chapter) in out


def test_list_without_the_extension_says_what_to_build(monkeypatch, capsys):
    def missing():
        raise ImportError("No module named 'lkw._ext'")

    monkeypatch.setattr(bench, "ext", missing)
    assert bench.main(["--list"]) == 2
    err = capsys.readouterr().err
    assert "lkw._ext" in err and "tools/setup.sh" in err


def test_profile_lists_an_ops_bench_shapes_and_refuses_unknown_ones():
    run = lambda *a: subprocess.run([sys.executable, str(REPO / "tools" / "profile.py"), *a],
                                    capture_output=True, text=True, cwd=REPO, check=False)
    listed = run("--chapter", "06_int4_gemv", "--op", "int4i_gemv", "--list-shapes")
    assert listed.returncode == 0, listed.stderr
    assert "m=1,n=28672,k=8192,g=128" in listed.stdout.split()
    bad_op = run("--chapter", "06_int4_gemv", "--op", "no_such_op", "--list-shapes")
    assert bad_op.returncode == 2 and "no bench cases for op no_such_op" in bad_op.stderr
    bad_shape = run("--chapter", "06_int4_gemv", "--op", "int4i_gemv", "--shape", "m=3,n=1,k=1,g=1")
    assert bad_shape.returncode == 2 and "no shape m=3,n=1,k=1,g=1" in bad_shape.stderr
    bad_peer = run("--chapter", "06_int4_gemv", "--op", "int4i_gemv", "--shape", "m=1,n=28672,k=8192,g=128",
                   "--peer", "no_such_peer")
    assert bad_peer.returncode == 2 and "no peer no_such_peer" in bad_peer.stderr
    assert "torch_matmul" in bad_peer.stderr  # the peers it has, named


# ------------------------------------------------------------------------------------------------
# The schema of the recorded results (not their figures)

HEADER = {"chapter": str, "gpu": str, "cuda": str, "date": str, "commit": str, "ceiling_version": str,
          "rows": list}
ROW = {"name": str, "op": str, "version": str, "kind": str, "shape": str, "correct": bool}
NUMBER = int | float
MAYBE = int | float | None
# Every mode's fields of a row timed in it (a run with "timing_modes" in its header).
MODE_FIELDS = ("us", "min_us", "max_us", "gbps", "pct_ceiling")


def check_results_schema(run: dict, name: str) -> None:
    for key, kind in HEADER.items():
        assert isinstance(run.get(key), kind), f"{name}: header {key} missing or not {kind.__name__}"
    assert isinstance(run.get("ceiling_gbps"), MAYBE), name
    modes = run.get("timing_modes")
    if modes is not None:
        assert set(modes) == set(results.MODES), f"{name}: timing_modes {modes}"
        assert run.get("headline") in results.MODES, name
        for mode in results.MODES:
            assert results.mkey(mode, "ceiling_gbps") in run, f"{name}: no {mode} copy ceiling"
        assert isinstance(run.get("peer_libraries"), dict), name
    for r in run["rows"]:
        where = f"{name}: {r.get('name')} at {r.get('shape')}"
        for key, kind in ROW.items():
            assert isinstance(r.get(key), kind), f"{where}: {key} missing or not {kind.__name__}"
        assert r["kind"] in ("version", "peer", "variant", "ablation"), where
        assert isinstance(r.get("time_us"), MAYBE) and "model_bytes" in r, where
        assert isinstance(r.get("peers", {}), dict), where
        for peer, entry in (r.get("peers") or {}).items():
            assert all(isinstance(v, NUMBER) for v in entry.values()), f"{where}: peer {peer}"
        if r["correct"]:
            assert isinstance(r["time_us"], NUMBER), f"{where}: a correct row without a time"
        if modes is None or not r["correct"]:
            continue
        # Timed in every mode: each mode's fields, a number or (a check failed, or a capture
        # refused) None beside its *_correct flag.
        for mode in results.MODES:
            for field in MODE_FIELDS:
                key = results.mkey(mode, field)
                if mode != "one_launch" and field != "us" and r.get(results.mkey(mode, "us")) is None:
                    continue
                assert key in r, f"{where}: {key} missing"
                assert isinstance(r[key], MAYBE), f"{where}: {key}"
        assert "back_to_back_correct" in r, f"{where}: back to back not timed"


RECORDED = sorted((REPO / "results" / "h200").glob("*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_every_recorded_results_file_has_the_schema(path):
    run = json.loads(path.read_text())
    if path.stem == "11_decoder_layer":  # cases of the whole layer (lkw.layer_bench), not rows
        from test_decoder_torch import check_layer_run

        check_layer_run(run)
        return
    check_results_schema(run, path.name)
    assert run["chapter"] == path.stem
    # Every row renders (old files too: "—" where a mode was not timed).
    assert len(results.text_table(run).splitlines()) > len(run["rows"])


def test_the_schema_check_requires_every_mode_once_a_run_says_it_timed_them():
    run = _old_run()
    check_results_schema(run, "old")  # an old run: one launch is enough
    run.update(timing_modes=bench.TIMING_MODES, headline="graph", graph_ceiling_gbps=1.0,
               back_to_back_ceiling_gbps=1.0, peer_libraries={})
    with pytest.raises(AssertionError, match="graph_us missing"):
        check_results_schema(run, "new")



# ------------------------------------------------------------------------------------------------
# Chapter 07: the W4A16 GEMM's bench cases (the reference and the repack run on the GPU in the
# bench; here on CPU tensors where torch is installed).


def test_w4a16_cases_cover_every_shape_and_m_of_both_ops_with_the_same_shape_strings():
    cases = bench.CHAPTERS["07_w4a16_gemm"]()
    assert cases and all(c.op in bench.W4A16_OPS for c in cases)
    by_op = {op: [c.shape for c in cases if c.op == op] for op in bench.W4A16_OPS}
    g = bench.W4A16_G
    want = [f"m={m},n={n},k={k},g={g}" for n, k in bench.W4A16_SHAPES for m in bench.W4A16_M]
    assert sorted(by_op["w4a16_gemm"]) == sorted(want) == sorted(by_op["w4a16r_gemm"])
    assert (28672, 8192) in bench.W4A16_SHAPES and (8192, 28672) in bench.W4A16_SHAPES
    assert not set(bench.W4A16_WIDER_SHAPES) & set(bench.W4A16_SHAPES)  # not in the default run
    assert set(bench.W4A16_M) == {1, 16, 64, 256, 1024, 4096}
    wider = bench.w4a16_gemm_cases(shapes=bench.W4A16_WIDER_SHAPES, ms=(16,))
    assert {c.shape for c in wider} == {f"m=16,n={n},k={k},g={g}" for n, k in bench.W4A16_WIDER_SHAPES}
    for c in cases:
        m, n, k = (int(part.split("=")[1]) for part in c.shape.split(",")[:3])
        assert c.dtypes == ["bfloat16", "uint32", "bfloat16", "bfloat16"]
        assert c.flops == 2 * m * n * k
        assert c.model_bytes == n * k // 2 + n * (k // g) * 2 + m * k * 2 + m * n * 2
        assert c.reference_sees_all  # W has N rows, which may equal M: the reference cuts x itself
        assert c.sample_rows == (bench.W4A16_SAMPLE_ROWS if m > bench.W4A16_SAMPLE_ROWS else None)
        # The peers are measured under the natural op; the repacked op meets them through PEER_OPS.
        if c.op == "w4a16_gemm":
            tinygemm = {"torch_int4pack_mm"} if m <= bench.W4A16_INT4PACK_MAX_M else set()
            gemv = {bench.W4A16_GEMV_PEER_NAME} if m <= bench.W4A16_GEMV_MAX_M else set()
            assert set(c.torch_peers) == {"torch_matmul"} | tinygemm | gemv
            assert set(c.library_peers) == {"vllm marlin_gemm", "vllm machete_mm", "humming HummingLayer"}
        else:
            assert not c.torch_peers and not c.library_peers
    assert bench.PEER_OPS["w4a16r_gemm"] == ("w4a16_gemm",)


def test_the_extended_matrix_is_the_issue_s_and_selections_cut_it():
    """--extended: chapter 07's six shapes by nine M; --shape and --op take parts of it, and the
    default run stays the 70B MLP shapes."""
    g = bench.W4A16_G
    full = bench.cases_of("07_w4a16_gemm", extended=True)
    shapes = {(int(c.shape.split(",")[1][2:]), int(c.shape.split(",")[2][2:])) for c in full}
    assert shapes == {(28672, 8192), (8192, 28672), (10240, 8192), (14336, 4096), (4096, 14336), (6144, 4096)}
    assert {int(c.shape.split(",")[0][2:]) for c in full} == {1, 16, 32, 64, 128, 256, 512, 1024, 4096}
    assert len(full) == 2 * 6 * 9
    assert [c.shape for c in bench.cases_of("07_w4a16_gemm")] == [c.shape for c in bench.CHAPTERS["07_w4a16_gemm"]()]
    part = bench.cases_of("07_w4a16_gemm", ops=["w4a16r_gemm"], shape=r"^m=(32|128|512),n=28672,", extended=True)
    assert [c.shape for c in part] == [f"m={m},n=28672,k=8192,g={g}" for m in (32, 128, 512)]
    assert {c.op for c in part} == {"w4a16r_gemm"}
    assert bench.cases_of("07_w4a16_gemm", shape="no such shape") == []
    # A chapter without an extended matrix: --extended is its default run.
    assert [c.shape for c in bench.cases_of("04_rmsnorm", extended=True)] == [c.shape for c in bench.CHAPTERS["04_rmsnorm"]()]


@pytest.mark.parametrize("chapter", sorted(bench.BENCH_PARTS))
def test_a_chapter_s_parts_take_every_case_of_its_matrix_once(chapter):
    """BENCH_PARTS: the parts of a chapter select every case of its full matrix (EXTENDED's where
    it has one) exactly once, so that the parts merged are the whole run, and none is empty."""
    whole = bench.cases_of(chapter, extended=True)
    taken = [(c.op, c.shape) for part in bench.BENCH_PARTS[chapter] for c in part.cases(chapter)]
    assert sorted(taken) == sorted((c.op, c.shape) for c in whole)
    assert len(set(taken)) == len(taken)
    assert all(part.cases(chapter) for part in bench.BENCH_PARTS[chapter])
    for part in bench.BENCH_PARTS[chapter]:  # each op named is the chapter's
        assert set(part.ops) <= {c.op for c in whole}, part


def test_part_selects_what_its_arguments_select_and_parts_lists_them(monkeypatch, capsys):
    """--part N runs exactly what the part's own arguments (Part.args, as --parts prints them)
    select; --part needs one chapter and no --op / --shape of its own; --parts needs no GPU."""
    import shlex

    seen = {}
    monkeypatch.setattr(bench, "ext", lambda: (_ for _ in ()).throw(AssertionError("no GPU wanted")))
    chapter = "07_w4a16_gemm"
    for n, part in enumerate(bench.BENCH_PARTS[chapter], 1):
        args = shlex.split(part.args())
        ops = [args[i + 1] for i, a in enumerate(args) if a == "--op"]
        shape = next((args[i + 1] for i, a in enumerate(args) if a == "--shape"), None)
        via_args = bench.cases_of(chapter, ops, shape, "--extended" in args)
        assert [c.shape for c in via_args] == [c.shape for c in part.cases(chapter)]
        seen[n] = len(via_args)
    assert bench.main(["--parts", "--chapter", chapter]) == 0
    out = capsys.readouterr().out
    for n, part in enumerate(bench.BENCH_PARTS[chapter], 1):
        assert f"--part {n}: {part.args()} ({seen[n]} cases)" in out
    assert f'LKW_BENCH_PARTS="--part N" LKW_PART_TIMEOUT={bench.PART_TIMEOUT}' in out
    parts = len(bench.BENCH_PARTS[chapter])
    for argv, why in ((["--part", "1"], "exactly one --chapter"),
                      (["--chapter", chapter, "--part", "1", "--op", "w4a16_gemm"], "sets --op"),
                      (["--chapter", chapter, "--part", "99"], f"has {parts} parts")):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert why in capsys.readouterr().err


def test_a_bad_shape_pattern_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--chapter", "07_w4a16_gemm", "--shape", "m=(1"])
    assert e.value.code == 2 and "--shape" in capsys.readouterr().err


def test_w4a16_repacked_rows_meet_the_peers_of_the_natural_op():
    rows = [{"op": "w4a16r_gemm", "version": "v1", "kind": "version", "shape": "s", "graph_us": 10.0},
            {"op": "w4a16_gemm", "version": "vllm machete_mm", "kind": "peer", "shape": "s", "graph_us": 20.0},
            {"op": "w4a16_gemm", "version": "torch_matmul", "kind": "peer", "shape": "other", "graph_us": 5.0}]
    bench._peer_ratios(rows)
    assert rows[0]["peers"] == {"vllm machete_mm": {"graph_us": 20.0, "graph_ratio": 2.0}}


def test_the_gpu_references_tolerance_is_lkw_gemv_tolerance_from_its_two_maxima(rng):
    """_w4a16_reference computes the two maxima of lkw.gemv.tolerance on the GPU, slice by slice;
    from the same maxima the formula gives lkw.w4a16.tolerance's string exactly."""
    from lkw import formats, gemv, w4a16

    m, n, k, g = 5, 64, 512, 128
    x = formats.f32_to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    scales = formats.f32_to_bf16((np.abs(rng.standard_normal((k // g, n))) * 0.01 + 1e-3).astype(np.float32))
    w = w4a16.w_hat(words, scales)
    x64 = formats.bf16_to_f32(x).astype(np.float64)
    walk_sq = float(np.max((x64 * x64) @ (w * w).T))
    abs_sum = float(np.max(np.abs(x64) @ np.abs(w).T))
    assert gemv.tolerance_from_maxima(walk_sq, abs_sum, k) == w4a16.tolerance(x, w)


def test_natural_words_transposed_are_gptq_qweight_the_peers_packers_take(rng):
    """lkw.peers.w4a16_peers hands Marlin, Machete and humming our natural words transposed as
    GPTQ's qweight [K/8, N] (element k of column n at nibble k % 8 of word [k // 8, n])."""
    from lkw import int4, w4a16

    n, k, g = 16, 256, 128
    q = rng.integers(0, 16, (n, k))
    scales = np.abs(rng.standard_normal((k // g, n))).astype(np.float32)
    qweight = w4a16.to_gptq(q, scales)[0]
    assert np.array_equal(int4.pack(q).T.view(np.int32), qweight)


def test_w4a16_torch_repack_is_lkw_w4a16_repack_and_unrepack_its_inverse(rng):
    torch = pytest.importorskip("torch")
    from lkw import w4a16

    for n, k in ((64, 16), (128, 256), (192, 1024)):
        words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
        ours = bench._torch_repack(torch, torch.from_numpy(words.view(np.int32)))
        assert ours.dtype == torch.int32 and tuple(ours.shape) == (n // 64, 8 * k)
        assert np.array_equal(ours.numpy().view(np.uint32), w4a16.repack(words))
        back = bench._torch_unrepack(torch, ours, n, k)
        assert np.array_equal(back.numpy().view(np.uint32), words)
    with pytest.raises(ValueError):
        bench._torch_repack(torch, torch.zeros(32, 2, dtype=torch.int32))


def test_w4a16_words_in_chapter_06_s_tiled_layout_are_lkw_gemv_s(rng):
    """The chapter 06 peer's packer: natural words -> interleaved nibbles -> tiles of 16 rows by 32
    words, padding zero: lkw.gemv.tile_weights(lkw.int4.interleave(words)), also where N and K/8
    are not whole tiles and steps."""
    torch = pytest.importorskip("torch")
    from lkw import gemv, int4

    for n, k in ((16, 256), (48, 512), (20, 264)):
        words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
        ours = bench._torch_tiled_gemv_words(torch, torch.from_numpy(words.view(np.int32)))
        assert ours.dtype == torch.int32 and tuple(ours.shape) == gemv.tiled_shape(n, k)
        assert np.array_equal(ours.numpy().view(np.uint32), gemv.tile_weights(int4.interleave(words)))


def test_the_chapter_06_gemv_peer_runs_v7_on_its_layout_or_is_absent_without_chapter_06(rng, monkeypatch):
    """_w4a16_gemv_peer: chapter 06's final version, launched through the registry on the current
    stream with the int4t_gemv tensors (x, the tiled words, scales [N, K/G]) and dtypes; its y is
    the case's y. A build without chapter 06 makes it Absent (skipped, said why), not a failed row."""
    torch = pytest.importorskip("torch")
    from lkw import gemv, golden, int4

    m, n, k, g = 2, 32, 512, 128
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    scales = (rng.random((k // g, n)) * 0.01 + 1e-3).astype(np.float32)
    x = torch.randn(m, k).to(torch.bfloat16)
    inputs = [x, torch.from_numpy(words.view(np.int32)), torch.from_numpy(scales).to(torch.bfloat16)]
    launched = []

    class Ext:
        @staticmethod
        def versions():
            return [{"name": bench.W4A16_GEMV_PEER}]

        @staticmethod
        def launch(name, ins, outs, params=None, dtypes=None, stream=0):
            launched.append((name, [tuple(t.shape) for t in ins], [tuple(t.shape) for t in outs], dtypes, stream))
            tiled = ins[1].numpy().view(np.uint32)
            assert np.array_equal(tiled, gemv.tile_weights(int4.interleave(words)))
            assert torch.equal(ins[2].view(torch.bfloat16), inputs[2].t().contiguous())
            outs[0].view(torch.bfloat16).copy_(torch.full((m, n), 3.0, dtype=torch.bfloat16))

    monkeypatch.setattr(bench, "ext", lambda: Ext)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(cuda_stream=77))
    call = bench._w4a16_gemv_peer(torch, inputs)
    (y,) = call()
    assert y.dtype == torch.bfloat16 and bool((y == 3.0).all())
    assert bench.W4A16_GEMV_PEER in call.summary
    want_dtypes = [*golden.OPS["int4t_gemv"].inputs, *golden.OPS["int4t_gemv"].outputs]
    assert launched == [(bench.W4A16_GEMV_PEER, [(m, k), gemv.tiled_shape(n, k), (n, k // g)], [(m, n)],
                         want_dtypes, 77)]
    Ext.versions = staticmethod(lambda: [])
    with pytest.raises(bench.peers.Absent, match="chapter 06"):
        bench._w4a16_gemv_peer(torch, inputs)
    assert bench.W4A16_GEMV_PEER.startswith("06_int4_gemv/int4t_gemv/")


def test_w4a16_reference_in_torch_slices_is_the_host_reference(rng, monkeypatch):
    """_w4a16_reference (float64 torch, slices of W_hat) against lkw.w4a16: the same BF16 bits
    (float64 sums in another order round the same, but for an exact tie) and the same tolerance."""
    torch = pytest.importorskip("torch")
    from lkw import formats, w4a16

    monkeypatch.setattr(bench, "_REF_ELEMENTS", 3 * 512)  # several slices, the last one partial
    m, n, k, g = 7, 320, 512, 128
    x = formats.f32_to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    scales = formats.f32_to_bf16((np.abs(rng.standard_normal((k // g, n))) * 0.01 + 1e-3).astype(np.float32))
    y, tol = bench._w4a16_reference(torch, x, torch.from_numpy(words.view(np.int32)), scales)
    ref = w4a16.w4a16_gemm(x, words, scales)
    assert y.dtype == ref.dtype and y.shape == (m, n)
    assert np.mean(y == ref) > 0.999
    assert tol == w4a16.tolerance(x, w4a16.w_hat(words, scales))


def test_w4a16_torch_peers_weights_are_the_references_rounded_once(rng):
    """cuBLAS's BF16 weights are W_hat rounded to BF16; tinygemm's scales and zeros are [K/G, N, 2]
    with the scale first and zero 0 ((q - 8) * s + 0)."""
    torch = pytest.importorskip("torch")
    from lkw import formats, w4a16

    n, k, g = 64, 256, 128
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
    scales = formats.f32_to_bf16((np.abs(rng.standard_normal((k // g, n))) * 0.01 + 1e-3).astype(np.float32))
    s_t = torch.from_numpy(scales.view(np.int16)).view(torch.bfloat16)
    w = bench._dequantized_bf16(torch, torch.from_numpy(words.view(np.int32)), False, s_t)
    want = formats.f64_to_bf16(w4a16.w_hat(words, scales))
    assert np.array_equal(w.view(torch.int16).numpy().view(np.uint16), want)
    sz = bench._int4pack_scales_and_zeros(torch, s_t)
    assert tuple(sz.shape) == (k // g, n, 2) and sz.is_contiguous()
    assert torch.equal(sz[..., 0], s_t) and not sz[..., 1].any()


# ------------------------------------------------------------------------------------------------
# Chapter 09's bench helpers (numpy only)


def test_a_multiset_tolerance_compares_by_runs_of_the_reference_s_key():
    ref = np.array([3, 5, 9, 9, 0, 1, 7, 7, 2, 4], np.int32)
    keys = np.array([2, 2, 1, 1], np.int32)  # runs [0, 4), [4, 8); rows 8, 9 past the keys: one more
    tol = "multiset:1:2"
    shuffled = np.array([5, 3, 9, 9, 1, 0, 7, 7, 4, 2], np.int32)  # each run reordered, the tail too
    assert bench.compare(shuffled, ref, "int32", tol, keys)["pass"]
    moved = np.array([5, 3, 9, 1, 9, 0, 7, 7, 4, 2], np.int32)  # a value moved across runs
    rep = bench.compare(moved, ref, "int32", tol, keys)
    assert not rep["pass"] and "multiset" in rep["text"]
    with pytest.raises(ValueError):
        bench.compare(shuffled, ref, "int32", tol)  # no key: refused, not compared element-wise


def test_moe_cases_cover_the_goal_shapes():
    shapes = {(c.op, c.shape) for c in bench.cases_of("09_moe")}
    assert ("moe_align_block_size", "t=4096,e=256,k=8,block_m=64,uniform") in shapes
    assert {("topk_softmax", f"t={t},e=256,k=8") for t in (1, 128, 16384)} <= shapes
    ops = {c.op for c in bench.cases_of("09_moe")}
    assert {"moe_grouped_gemm", "moe_grouped_gemm_silu", "moe_sum"} <= ops


def test_moe_cases_are_issue_45_s_routing_and_expert_shapes():
    """Issue 45: both gating ops (FP32 and BF16 logits) and DeepSeek's router at decode, mid and
    prefill T; the align skewed (Zipf, all-to-one) at T 16, 1024 and 4096 for every model; the
    grouped GEMMs (gate_up with SiLU, down, down with the weighted sum) and moe_sum from T 16 to
    4096."""
    cases = bench.cases_of("09_moe")
    shapes = {(c.op, c.shape) for c in cases}
    models = {"mixtral": (8, 2), "qwen3": (128, 8), "deepseek": (256, 8)}
    assert bench.MOE_ROUTER_T == (1, 16, 128, 1024, 4096, 16384)
    for op in ("topk_softmax", "topk_softmax_bf16"):
        assert {(op, f"t={t},e={e},k={k}") for e, k in models.values() for t in bench.MOE_ROUTER_T} <= shapes
    assert {("deepseek_router", f"t={t},e=256,k=8,groups=8") for t in bench.MOE_ROUTER_T} <= shapes
    for dist in ("uniform", "zipf", "one"):
        for e, k in models.values():
            ts = bench.MOE_T if dist == "uniform" else (16, 1024, 4096)
            want = {("moe_align_block_size", f"t={t},e={e},k={k},block_m=64,{dist}") for t in ts}
            assert want <= shapes, (dist, e)
    assert len([c for c in cases if c.op == "moe_align_block_size"]) == 3 * 6 + 2 * 3 * 3
    assert bench.MOE_GEMM_T == (16, 128, 1024, 4096)
    for e, k, d, inter in bench.MOE_GEMM_MODELS.values():
        for t in bench.MOE_GEMM_T:
            assert ("moe_grouped_gemm_silu", f"t={t},e={e},k={k},n={2 * inter},k_dim={d},block_m=64") in shapes
            assert ("moe_grouped_gemm", f"t={t},e={e},k={k},n={d},k_dim={inter},block_m=64") in shapes
            assert ("moe_grouped_gemm_sum", f"t={t},e={e},k={k},n={d},k_dim={inter},block_m=64") in shapes
            assert ("moe_sum", f"t={t},k={k},d={d}") in shapes
    bf16 = [c for c in cases if c.op == "topk_softmax_bf16"]
    assert all(c.dtypes == ["bfloat16", "float32", "int32"] for c in bf16)
    assert all(set(c.library_peers) == {"vllm topk_softmax"} for c in bf16)
    assert all(c.params == {"k": int(c.shape.split(",")[2][2:]), "renormalize": 1} for c in bf16)


def test_moe_fp8_cases_cover_the_three_models_at_decode_and_prefill():
    """The FP8 grouped ops (v15) at every MOE_GEMM_MODELS model's gate_up and down shapes, T = 16
    and 4096, with the golden ops' dtypes and params, the scaled_mm loop and the BF16 peers."""
    from lkw import golden

    cases = [c for c in bench.cases_of("09_moe") if c.op.endswith("_fp8")]
    shapes = {(c.op, c.shape) for c in cases}
    assert {16, 4096} <= set(bench.MOE_FP8_T)
    for e, k, d, inter in bench.MOE_GEMM_MODELS.values():
        for t in bench.MOE_FP8_T:
            down = f"t={t},e={e},k={k},n={d},k_dim={inter},block_m=64"
            assert ("moe_grouped_gemm_silu_fp8", f"t={t},e={e},k={k},n={2 * inter},k_dim={d},block_m=64") in shapes
            assert ("moe_grouped_gemm_fp8", down) in shapes
            assert ("moe_grouped_gemm_sum_fp8", down) in shapes
    for c in cases:
        op = golden.OPS[c.op]
        assert c.dtypes == [*op.inputs, *op.outputs], c.op
        assert set(op.params) - {"topk"} <= set(c.params) and "routed_experts" in c.params
        assert "torch_scaled_mm_loop" in c.torch_peers and "torch_loop_bf16_dequantized" in c.torch_peers


def test_topk_softmax_bf16_cases_make_exact_bf16_logits_the_reference_and_torch_agree_on(monkeypatch):
    """The BF16 case's logits, (level - E/2)/32, are exact in BF16: the reference on their bits
    equals the FP32 case's on the same levels, and the torch peer (softmax in FP32) matches both."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lkw._ext", reason="the extension is built by tools/setup.sh")
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self if a[:1] == ("cuda",) else to(self, *a, **k))
    fake = _CpuTorch(torch)
    for e, k in ((8, 2), (256, 8)):
        shape = f"t=16,e={e},k={k}"
        (c32,) = bench.cases_of("09_moe", ops=["topk_softmax"], shape=f"^{shape}$")
        (c16,) = bench.cases_of("09_moe", ops=["topk_softmax_bf16"], shape=f"^{shape}$")
        outs = []
        for case in (c32, c16):
            gen = torch.Generator()
            gen.manual_seed(case.seed)
            (x,), _ = case.make(fake, gen)
            host = [bench._host_bits(x)]
            expected = bench._reference(case, host)
            got = bench._outs(case.torch_peers["torch_eager"](torch, [x])())
            check = bench._verify(case, bench._raw([x]), got, expected, case.peer_tolerance)
            assert check["pass"], f"{case.op} {shape}: {check['text']}"
            outs.append(expected)
        assert x.dtype == torch.bfloat16
        assert all(np.array_equal(a, b) for a, b in zip(*outs))  # the same levels, exactly


def test_grouped_sample_reference_is_the_golden_reference_on_its_rows():
    import ml_dtypes
    from lkw import golden, moe

    rng = np.random.default_rng(5)
    t, e, k, n, kk, bm = 12, 5, 2, 16, 24, 16
    ids = moe.routing_ids(rng, t, e, k, "uniform")
    x = rng.standard_normal((t, kk)).astype(ml_dtypes.bfloat16).view(np.uint16)
    w = (rng.standard_normal((e, n, kk)) / 5).astype(ml_dtypes.bfloat16).view(np.uint16)
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, bm)
    for silu, full in ((False, moe.grouped_gemm_bf16), (True, moe.grouped_gemm_silu_bf16)):
        rows = 10
        got, tol = bench.grouped_sample_reference(x, w, ids, k, rows, silu)
        want = full(x.view(ml_dtypes.bfloat16), w.view(ml_dtypes.bfloat16), sorted_ids, expert_ids, bm, k)
        assert np.array_equal(got.view(np.uint16), np.asarray(want).view(np.uint16)[:rows])
        # Its tolerance is the golden formula's on these rows: no larger than on all rows.
        whole = golden.grouped_tolerance(x, w, sorted_ids, expert_ids, bm, k, silu)
        assert tol.startswith("close:1.6e-2:")
        assert 0 < float(tol.split(":")[2]) <= float(whole.split(":")[2]) * 1.001


def test_expert_order_gathers_each_expert_s_slots_in_order():
    ids = np.array([[2, 0], [0, 1], [2, 1]])
    slots, tokens, counts = bench._expert_order(ids, 4)
    assert slots.tolist() == [1, 2, 3, 5, 0, 4] and tokens.tolist() == [0, 1, 1, 2, 0, 2]
    assert counts.tolist() == [2, 2, 2, 0]


def test_grouped_w4a16_sample_reference_is_the_golden_reference_on_its_rows():
    import ml_dtypes
    from lkw import golden, moe, w4a16

    rng = np.random.default_rng(6)
    t, e, k, n, kk, g, bm = 10, 4, 2, 64, 64, 32, 16
    ids = moe.routing_ids(rng, t, e, k, "uniform")
    x = rng.standard_normal((t, kk)).astype(ml_dtypes.bfloat16).view(np.uint16)
    words = np.stack([w4a16.repack(rng.integers(0, 2**32, (n, kk // 8), dtype=np.uint64).astype(np.uint32))
                      for _ in range(e)])
    scales = (np.abs(rng.standard_normal((e, kk // g, n))) * 0.01 + 1e-3).astype(ml_dtypes.bfloat16).view(np.uint16)
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, bm)
    rows = 12
    got, tol = bench.grouped_w4a16_sample_reference(x, words, scales, ids, k, rows)
    want = moe.grouped_gemm_w4a16(x.view(ml_dtypes.bfloat16), words, scales, sorted_ids, expert_ids, bm, k)
    assert np.array_equal(got.view(np.uint16), np.asarray(want).view(np.uint16)[:rows])
    whole = golden.grouped_w4a16_tolerance(x, words, scales, sorted_ids, expert_ids, bm, k)
    assert tol.split(":")[:2] == whole.split(":")[:2]
    assert 0 < float(tol.split(":")[2]) <= float(whole.split(":")[2]) * 1.001


def test_w4a16_sample_rows_stop_before_the_seventeenth_expert():
    from lkw.bench import _rows_within_experts

    ids = np.arange(40, dtype=np.int32).reshape(5, 8) % 20  # slots 0..19 distinct, then repeats
    assert _rows_within_experts(ids, 40, 16) == 16
    assert _rows_within_experts(ids, 40, 20) == 40  # 20 experts in all: every slot
    assert _rows_within_experts(ids, 10, 16) == 10  # fewer rows asked than the limit cuts
    assert _rows_within_experts(np.full((4, 2), 7, np.int32), 8, 1) == 8  # one expert, every slot


def test_same_size_copy_is_the_ceiling_above_its_own_size(monkeypatch):
    """Transfers larger than the ceiling's copy are not measured again (DeepSeek's expert GEMMs
    move gigabytes: a copy of each size cost tens of seconds of a device run)."""
    from lkw import bench

    def fail(*a, **k):
        raise AssertionError("measured")

    monkeypatch.setattr(bench, "measure_case", fail)
    args = {"warmup": 1, "iters": 1, "l2_bytes": 1}
    name = "/".join(bench.CEILING_OP) + "/v1_vec16"
    assert bench.same_size_copy(8.0 * bench.CEILING_WORDS + 8, name, {}, **args) is None
    assert bench.same_size_copy(4 << 20, name, {}, **args) is None  # latency-sized


# ------------------------------------------------------------------------------------------------
# Chapter 08: the FP8 GEMM's bench cases (inputs made and peers run on the GPU; here their list
# and the reference's cut to the sampled rows).


def test_fp8_cases_are_the_issue_s_shapes_with_the_granularity_in_the_shape_string():
    from lkw import fp8_gemm, golden

    cases = bench.cases_of("08_fp8_gemm")
    got = {c.shape for c in cases}
    want = {bench.fp8_shape(s, s, s, g) for s, g in ((8192, "tensor"), (8192, "rowwise"), (8192, "blockwise"),
                                                     (4096, "blockwise"))}
    deepseek = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
    want |= {bench.fp8_shape(m, n, k, "blockwise") for n, k in deepseek for m in (64, 128, 4096)}
    want |= {bench.fp8_shape(m, n, k, "rowwise") for n, k in bench.FP8_ROWWISE_NK for m in bench.FP8_ROWWISE_M}
    # Llama-3-8B's four projections (chapter 11's FP8 layer) at v6's GEMV sizes of M and at the
    # layer's prefill.
    llama = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
    want |= {bench.fp8_shape(m, n, k, "blockwise") for n, k in llama for m in (1, 8, 16, 32, 2048)}
    assert got == want and len(cases) == len(want)
    assert set(bench.FP8_ROWWISE_NK) <= set(deepseek)
    for part, g in (("scale=block", "blockwise"), ("scale=row", "rowwise"), ("scale=tensor", "tensor")):
        picked = bench.cases_of("08_fp8_gemm", shape=part)
        assert picked and all(c.shape.endswith(f",scale={g}") for c in picked)
    for c in cases:
        m, n, k = (int(p.split("=")[1]) for p in c.shape.split(",")[:3])
        g = c.shape.split("scale=")[1]
        op = golden.OPS[c.op]
        assert c.op == ("fp8_gemm_blockwise" if g == "blockwise" else "fp8_gemm")
        assert c.dtypes == [*op.inputs, *op.outputs]
        assert (c.model_bytes, c.flops) == fp8_gemm.model(m, n, k, g)
        assert c.tolerance == golden.fp8_gemm_tolerance(k, g)
        assert float(c.peer_tolerance[5:]) >= 2 * float(c.tolerance[5:])
        assert c.reference_sees_all and c.sample_rows == (bench.FP8_SAMPLE_ROWS if m > bench.FP8_SAMPLE_ROWS else None)
        assert c.params == ({"a_scales_row_major": 0} if g == "blockwise" else {})
        torch_peers = {"torch_scaled_mm", "cublas_bf16"} | ({"torch_scaled_mm_fast_accum"} if g != "blockwise" else set())
        assert set(c.torch_peers) == torch_peers
        library = {"vllm cutlass_scaled_mm"} | ({"flashinfer fp8_blockscale_gemm_sm90"} if g == "blockwise" else set())
        assert set(c.library_peers) == library


@pytest.mark.parametrize("granularity", ["tensor", "rowwise", "blockwise"])
def test_fp8_expected_is_the_reference_on_the_sampled_rows(rng, granularity):
    """The case's reference gets the host bits of every input (scales as uint32) and computes the
    first FP8_SAMPLE_ROWS rows of y against all of B: the rows of A, of per-token s_a and the
    columns of column-major blockwise s_a [K/128, M]."""
    from lkw import fp8_gemm

    m, n, k = 100, 144, 256
    case = bench.fp8_gemm_case(m, n, k, granularity)
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, granularity)
    host = [a, b, s_a.view(np.uint32), s_b.view(np.uint32)]
    (got,) = case.expected(host)
    whole = fp8_gemm.fp8_gemm(a, b, s_a, s_b, granularity)
    assert got.shape == (bench.FP8_SAMPLE_ROWS, n)
    assert np.array_equal(got, whole[: bench.FP8_SAMPLE_ROWS])
    # The cut the bench then applies to a version's output: its leading rows.
    assert case.cut == {} and case.sample_rows == bench.FP8_SAMPLE_ROWS


# ------------------------------------------------------------------------------------------------
# Chapter 05: the elementwise ops' bench cases (inputs made on the GPU; here their list, what the
# shape strings select, the references on host bits as the bench hands them over, the in-place
# caches' rotation and restore, and, where torch is installed, the torch peers' math on the CPU).


def _elementwise_case(op: str, shape: str) -> bench.Case:
    (case,) = [c for c in bench.cases_of("05_elementwise", ops=[op]) if c.shape == shape]
    return case


def test_elementwise_cases_are_the_issue_s_shapes_and_the_shape_strings_select_them():
    from lkw import golden

    cases = bench.cases_of("05_elementwise")
    ts = bench.ELEMENTWISE_T
    models = (("llama3_8b", 14336), ("llama3_70b", 28672))
    # Issue 47: every gated activation and every fused FP8 form at both Llama d_ff and every T.
    act_ops = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", *golden.FP8_ACT_OPS)
    want = {(op, f"t={t},d={d},{m}") for op in act_ops for m, d in models for t in ts}
    want |= {("rope", f"t={t},hq={hq},hk=8,d=128,rot=128,neox,{m}")
             for m, hq in (("llama3_8b", 32), ("llama3_70b", 64)) for t in ts}
    want |= {("qk_norm_rope", f"t={t},hq=32,hk=8,d=128,rot=128,neox,qwen3_8b") for t in ts}
    want |= {(op, f"t={t},hk=8,d=128,block=16,{layout},llama3_8b")
             for op in bench.CACHE_OPS for layout in ("paged", "nhd", "hnd") for t in (16, 1024, 8192)}
    # The layer's RoPE and cache write fused, on both Llama models' heads (the paged layout).
    want |= {("qkv_rope_cache", f"t={t},hq={hq},hk=8,d=128,rot=128,block=16,paged,{m}")
             for m, hq in (("llama3_8b", 32), ("llama3_70b", 64)) for t in ts}
    assert {(c.op, c.shape) for c in cases} == want and len(cases) == len(want) == 103
    assert ts == (1, 16, 128, 1024, 8192) and len(golden.FP8_ACT_OPS) == 3
    assert {c.op for c in bench.cases_of("05_elementwise", shape="llama3_70b")} == {
        *act_ops, "rope", "qkv_rope_cache"}
    assert {c.op for c in bench.cases_of("05_elementwise", shape="qwen3")} == {"qk_norm_rope"}
    picked = bench.cases_of("05_elementwise", ops=["reshape_and_cache_fp8"], shape=r"^t=8192,.*,paged,")
    assert [c.shape for c in picked] == ["t=8192,hk=8,d=128,block=16,paged,llama3_8b"]
    picked = bench.cases_of("05_elementwise", ops=list(bench.CACHE_OPS), shape=",hnd,")
    assert len(picked) == 6 and {c.params["layout"] for c in picked} == {2}  # HND: the launcher's layout 2
    # T = 1: six activation ops, two ropes and two fused rope + cache per Llama model, the QK norm
    assert len(bench.cases_of("05_elementwise", shape=r"^t=1,")) == 2 * 6 + 2 + 2 + 1


def test_cache_slots_are_decode_tokens_or_prompts_filling_scattered_blocks():
    rng = np.random.default_rng(5)
    block, prompt = bench.CACHE_BLOCK, bench.CACHE_PROMPT
    order = rng.permutation(64 * block)  # decode: a permutation of the slots, its first T taken
    assert (bench.cache_slots(16, order) == order[:16]).all()
    blocks = rng.permutation(-(-8192 // block) * bench.CACHE_SPREAD)
    slots = bench.cache_slots(8192, blocks)
    assert len(set(slots.tolist())) == 8192  # distinct: no token overwrites another
    per_prompt = -(-prompt // block)
    for p in range(-(-8192 // prompt)):
        mine = slots[p * prompt:(p + 1) * prompt]
        assert mine[0] % block == 0  # a prompt starts a block of its own
        assert (mine % block == np.arange(len(mine)) % block).all()  # its tokens in order
        used = np.unique(mine // block)
        assert set(used.tolist()) == set(blocks[p * per_prompt:p * per_prompt + len(used)].tolist())
    # A block's tokens are consecutive: the paged value column is written by neighbouring tokens.
    assert all(np.ptp(np.flatnonzero(slots // block == b)) < block for b in np.unique(slots // block))
    with pytest.raises(ValueError, match="cannot hold"):
        bench.cache_slots(8192, blocks[:500])


def test_elementwise_cases_name_their_tensors_peers_and_in_place_caches():
    from lkw import elementwise as ew
    from lkw import golden, peers

    for c in bench.cases_of("05_elementwise"):
        op = golden.OPS[c.op]
        t = int(c.shape.split(",")[0][2:])
        assert c.dtypes == [*op.inputs, *op.outputs]
        assert c.initial_outputs == (op.init == 2)
        assert "torch_eager" in c.torch_peers and ("torch_compile" in c.torch_peers) == (t > bench.ACT_SAMPLE_ROWS)
        assert {name.split()[0] for name in c.library_peers} <= set(peers.LIBRARIES)
        assert c.model_bytes and c.model_bytes > 0
        if c.op == "qkv_rope_cache":  # the caches and q_out, rotated by what a launch moves
            hq = int(c.shape.split(",")[1][3:])
            assert c.params == {"layout": 0, "is_neox": 1} and c.sample_rows is None
            assert c.rotation_bytes == c.model_bytes == ew.qkv_rope_cache_bytes(t, hq, 8, 128, 128)
            assert c.shared_inputs == (2,) and c.reference_sees_all
            assert set(c.library_peers) == {
                "vllm rotary_embedding + reshape_and_cache (in place on qkv's views)"}
            continue
        if c.initial_outputs:  # the caches: compared whole, rotated by the bytes a launch touches
            kv_dtype = bench.CACHE_OPS[c.op]
            layout = c.shape.split(",")[4]
            assert c.params == {"layout": ew.LAYOUTS.index(layout)} and c.sample_rows is None
            assert c.rotation_bytes == c.model_bytes == ew.reshape_and_cache_bytes(t, 8, 128, kv_dtype)
            assert c.tolerance == "exact" and c.peer_tolerance == bench.CACHE_PEER_TOLERANCE[kv_dtype]
            assert set(c.library_peers) == {{"paged": "vllm reshape_and_cache",
                                             "nhd": "vllm reshape_and_cache_flash",
                                             "hnd": "vllm reshape_and_cache_flash (HND strides)"}[layout]}
        else:
            assert c.rotation_bytes is None
            assert c.sample_rows == (bench.ACT_SAMPLE_ROWS if t > bench.ACT_SAMPLE_ROWS else None)
        if c.op in ("rope", "qk_norm_rope"):  # the cos/sin cache, the last input, is shared
            assert c.shared_inputs == (len(op.inputs) - 1,) and c.reference_sees_all
            assert c.params["is_neox"] == 1 and c.params.get("eps", 1e-6) == 1e-6
        else:
            assert c.shared_inputs == ()
    names = {c.op: set(c.library_peers) for c in bench.cases_of("05_elementwise")}
    assert names["silu_and_mul"] == {"vllm silu_and_mul", "flashinfer silu_and_mul",
                                     "liger swiglu_fused_gate_up_forward"}
    assert names["gelu_and_mul"] == {"vllm gelu_and_mul", "flashinfer gelu_and_mul"}
    assert names["gelu_tanh_and_mul"] == {"vllm gelu_tanh_and_mul", "flashinfer gelu_tanh_and_mul"}
    assert names["silu_and_mul_fp8_per_group"] == {"vllm silu_and_mul_per_block_quant"}
    assert names["rope"] == {"vllm rotary_embedding", "flashinfer apply_rope_with_cos_sin_cache",
                             "liger rope_forward"}
    assert names["qk_norm_rope"] == {"vllm fused_qk_norm_rope"}
    assert names["silu_and_mul_fp8_per_token"] == set()


def test_rotations_count_the_bytes_a_launch_touches_where_given():
    """A cache written at T slots: the sets must exceed twice the L2 in touched bytes, not in the
    caches' size (most of which no launch reads)."""
    l2 = 60 << 20
    assert bench._rotations([_Sized(4 << 20)], [_Sized(1 << 30)], l2) == 2
    assert bench._rotations([_Sized(4 << 20)], [_Sized(1 << 30)], l2, touched=1 << 20) == 121


def test_elementwise_act_references_take_the_sampled_rows_and_set_data_tolerances(rng):
    from lkw import elementwise as ew

    x = ew.gate_up(rng, 100, 24)  # (T,2d): the bench's reference does not look at d
    silu = _elementwise_case("silu_and_mul", "t=128,d=14336,llama3_8b")
    (y,) = bench._reference(silu, [x])
    assert np.array_equal(y, ew.silu_and_mul(x[:64]))
    assert silu.tolerance == "ulp:1" and silu.peer_tolerance == "ulp:2"
    for op, act, shape in (("gelu_tanh_and_mul", "gelu_tanh", "t=8192,d=14336,llama3_8b"),
                           ("gelu_and_mul", "gelu", "t=1024,d=28672,llama3_70b")):
        gelu = _elementwise_case(op, shape)
        (y,) = bench._reference(gelu, [x])
        assert np.array_equal(y, ew.act_and_mul(x[:64], act))
        assert gelu.tolerance == ew.act_tolerance(x[:64], act)
        assert gelu.peer_tolerance == "close:0.015625:" + gelu.tolerance.split(":")[2]
    scale = np.array([0.05], np.float32)
    static = _elementwise_case("silu_and_mul_fp8_per_tensor", "t=8192,d=28672,llama3_70b")
    (q,) = bench._reference(static, [x, scale.view(np.uint32)])
    assert np.array_equal(q, ew.silu_and_mul_fp8_per_tensor(x[:64], scale))
    group = _elementwise_case("silu_and_mul_fp8_per_group", "t=8192,d=14336,llama3_8b")
    x = ew.gate_up(rng, 100, 256)
    q, s = bench._reference(group, [x])
    want = ew.silu_and_mul_fp8_per_group(x[:64])
    assert np.array_equal(q, want[0]) and np.array_equal(s, want[1]) and s.shape == (2, 64)
    assert group.cut[1](np.zeros((2, 100)), 64).shape == (2, 64)  # scales [d/128, T]: columns cut


def test_elementwise_rope_references_cut_the_tokens_and_set_the_tolerance_of_the_data(rng):
    from lkw import elementwise as ew

    t, d = 100, 16
    pos = ew.positions(rng, t, 50)
    q, k = ew.heads(rng, t, 4, d), ew.heads(rng, t, 2, d)
    cache = ew.cos_sin_cache(50, d, 500000.0)
    rope = _elementwise_case("rope", "t=1024,hq=32,hk=8,d=128,rot=128,neox,llama3_8b")
    got = bench._reference(rope, [pos.view(np.uint64), q, k, cache.view(np.uint32)])
    want = ew.rope(pos[:64], q[:64], k[:64], cache)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert rope.tolerance == ew.rope_tolerance(q[:64], k[:64]) and rope.peer_tolerance is None
    qk = _elementwise_case("qk_norm_rope", "t=16,hq=32,hk=8,d=128,rot=128,neox,qwen3_8b")
    w = [ew.formats.f32_to_bf16(rng.normal(1, 0.25, d).astype(np.float32)) for _ in "qk"]
    got = bench._reference(qk, [pos.view(np.uint64), q, k, *w, cache.view(np.uint32)])
    want = ew.qk_norm_rope(pos[:16], q[:16], k[:16], *w, cache, 1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert qk.tolerance == ew.qk_norm_rope_tolerance(*want)


@pytest.mark.parametrize("op", ["reshape_and_cache", "reshape_and_cache_fp8"])
@pytest.mark.parametrize("layout", ["paged", "nhd", "hnd"])
def test_elementwise_cache_references_update_the_initial_caches(rng, op, layout):
    """The reference gets the inputs, then the caches' initial contents (Case.initial_outputs),
    and returns the whole caches updated: the slots written, the rest as it was."""
    from lkw import elementwise as ew

    kv_dtype = bench.CACHE_OPS[op]
    case = _elementwise_case(op, f"t=16,hk=8,d=128,block=16,{layout},llama3_8b")
    t, blocks = 16, 4
    key, value = ew.heads(rng, t, 8, 128), ew.heads(rng, t, 8, 128)
    slots = rng.permutation(blocks * 16)[:t].astype(np.int64)
    scales = [np.array([0.01], np.float32), np.array([0.02], np.float32)] if kv_dtype != "bfloat16" else []
    init = list(ew.poisoned_caches(layout, blocks, 16, 8, 128, kv_dtype))
    host = [key, value, slots.view(np.uint64), *(s.view(np.uint32) for s in scales)]
    got = bench._reference(case, host, init)
    want = ew.reshape_and_cache(key, value, *init, slots, layout, *scales)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert np.sum(got[0] != init[0]) > 0.9 * t * 8 * 128


def test_priming_poisons_outputs_or_restores_an_in_place_op_s_initial_contents():
    torch = pytest.importorskip("torch")
    outs = [torch.zeros(4, dtype=torch.int16), torch.zeros(3, dtype=torch.uint8)]
    bench._prime([([], outs)], None)
    assert all(bool((o.view(torch.uint8) == 0xFF).all()) for o in outs)
    initial = [torch.arange(4, dtype=torch.int16), torch.full((3,), 7, dtype=torch.uint8)]
    bench._prime([([], outs)], initial)
    assert all(torch.equal(o, i) for o, i in zip(outs, initial))


def test_poison_reaches_column_major_scales_also_of_one_token():
    """Scales held as the transposed view of a row-major [T, G] array: every byte set, for T = 1
    too (a [G, 1] view with strides (1, G), which torch calls contiguous)."""
    torch = pytest.importorskip("torch")
    for t in (1, 3):
        rows = torch.zeros(t, 32, dtype=torch.float32)
        bench._poison(rows.t())
        assert bool((rows.view(torch.uint8) == 0xFF).all())


def _torch_bits(torch, bits: np.ndarray, dtype):
    """Host BF16 bits (uint16) as a torch BF16 tensor."""
    return torch.from_numpy(bits.view(np.int16).copy()).view(dtype)


def test_the_torch_peers_compute_the_contract_on_the_cpu(rng):
    """The torch peers' math: SiLU-and-mul within two BF16 ulps (silu rounded first), RoPE and
    QK norm + RoPE within their tolerances, the cache writes bit-exact (BF16 and FP8)."""
    torch = pytest.importorskip("torch")
    from lkw import elementwise as ew

    bf16 = torch.bfloat16
    x = ew.gate_up(rng, 5, 64)
    y = bench._torch_act(torch, _torch_bits(torch, x, bf16), "silu")
    assert ew.matches(y.view(torch.int16).numpy().view(np.uint16), ew.silu_and_mul(x), "bfloat16", "ulp:2")
    for act in ("gelu", "gelu_tanh"):  # erf and tanh GELU, each against its own reference
        y = bench._torch_act(torch, _torch_bits(torch, x, bf16), act)
        tol = bench._gelu_tolerances(ew.act_tolerance(x, act))[1]
        assert ew.matches(y.view(torch.int16).numpy().view(np.uint16), ew.act_and_mul(x, act), "bfloat16", tol)
    erf, tanh = (bench._torch_act(torch, _torch_bits(torch, x, bf16), act) for act in ("gelu", "gelu_tanh"))
    assert not torch.equal(erf, tanh)  # the erf form is not the tanh approximation under another name
    t, d = 7, 32
    pos = ew.positions(rng, t, 64)
    q, k = ew.heads(rng, t, 4, d), ew.heads(rng, t, 2, d)
    for is_neox in (True, False):
        cache = ew.cos_sin_cache(64, d, 10000.0)
        args = [torch.from_numpy(pos), _torch_bits(torch, q, bf16), _torch_bits(torch, k, bf16),
                torch.from_numpy(cache)]
        got = bench._torch_rope(torch, *args, is_neox=is_neox)
        want = ew.rope(pos, q, k, cache, is_neox)
        tol = ew.rope_tolerance(q, k)
        for g, w in zip(got, want, strict=True):
            assert ew.matches(g.view(torch.int16).numpy().view(np.uint16), w, "bfloat16", tol)
    qw, kw = (ew.formats.f32_to_bf16(rng.normal(1, 0.25, d).astype(np.float32)) for _ in "qk")
    nq = bench._torch_head_rmsnorm(torch, args[1], _torch_bits(torch, qw, bf16), 1e-6)
    nk = bench._torch_head_rmsnorm(torch, args[2], _torch_bits(torch, kw, bf16), 1e-6)
    got = bench._torch_rope(torch, args[0], nq, nk, args[3])
    want = ew.qk_norm_rope(pos, q, k, qw, kw, cache, 1e-6)
    for g, w in zip(got, want, strict=True):
        assert ew.matches(g.view(torch.int16).numpy().view(np.uint16), w, "bfloat16",
                          ew.qk_norm_rope_tolerance(*want))


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("layout", ["paged", "nhd", "hnd"])
def test_the_torch_cache_peer_writes_copies_and_resets_them(rng, kv_dtype, layout):
    torch = pytest.importorskip("torch")
    from lkw import elementwise as ew

    t, hk, d, blocks = 9, 2, 32, 3
    key, value = ew.heads(rng, t, hk, d), ew.heads(rng, t, hk, d)
    slots = rng.permutation(blocks * 16)[:t].astype(np.int64)
    init = ew.poisoned_caches(layout, blocks, 16, hk, d, kv_dtype)
    fp8 = kv_dtype == "float8_e4m3fn"
    scales = [np.array([0.01], np.float32), np.array([0.03], np.float32)] if fp8 else []
    typed = torch.float8_e4m3fn if fp8 else torch.bfloat16
    caches = [torch.from_numpy(c.view(np.int16 if not fp8 else np.uint8).copy()).view(typed) for c in init]
    ins = [_torch_bits(torch, key, torch.bfloat16), _torch_bits(torch, value, torch.bfloat16),
           torch.from_numpy(slots), *(torch.from_numpy(s) for s in scales), *caches]
    op = "reshape_and_cache_fp8" if fp8 else "reshape_and_cache"
    case = _elementwise_case(op, f"t=16,hk=8,d=128,block=16,{layout},llama3_8b")
    call = case.torch_peers["torch_eager"](torch, ins)
    got = call()
    want = ew.reshape_and_cache(key, value, *init, slots, layout, *scales)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g.view(torch.uint8).numpy().view(w.dtype).reshape(w.shape), w)
    assert all(np.array_equal(c.view(torch.uint8).numpy(), i.view(np.uint8)) for c, i in zip(caches, init))
    call.reset()
    assert all(np.array_equal(g.view(torch.uint8).numpy(), i.view(np.uint8)) for g, i in zip(got, init))


def test_the_chapter_05_example_run_has_the_schema_and_the_bench_s_ops_and_shapes():
    """results.example("05_elementwise") (the notebook's and the book's stand-in before a real run)
    is written in the bench's schema, with the bench's op names and shape strings."""
    run = results.example("05_elementwise")
    check_results_schema(run, "05_elementwise example")
    bench_shapes = {(c.op, c.shape) for c in bench.cases_of("05_elementwise")}
    assert {(r["op"], r["shape"]) for r in run["rows"]} <= bench_shapes
    assert {r["op"] for r in run["rows"]} >= {"silu_and_mul", "rope", "qk_norm_rope", "reshape_and_cache"}
    assert len(results.text_table(run).splitlines()) > len(run["rows"])


class _CpuTorch:
    """torch with the device of the creation functions dropped: a case's make() runs on the CPU
    where no GPU is (its tensors' shapes and dtypes are what the test checks)."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        obj = getattr(self._torch, name)
        if name in ("randn", "rand", "randint", "empty", "full", "randperm", "zeros", "ones", "arange"):

            def without_device(*args, **kwargs):
                kwargs.pop("device", None)
                return obj(*args, **kwargs)

            return without_device
        return obj


@pytest.mark.parametrize("t", [1, 16])
def test_elementwise_cases_make_what_their_references_and_torch_peers_expect(monkeypatch, t):
    """Each decode-sized case's make(): tensors of the registry's dtypes, outputs of the
    reference's shapes, and the torch peer correct against the reference with the case's peer
    tolerance (the harness's comparison), an in-place peer after its reset too."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lkw._ext", reason="the extension is built by tools/setup.sh")
    if torch.cuda.is_available():
        fake, gen = torch, torch.Generator(device="cuda")
    else:
        fake, gen = _CpuTorch(torch), torch.Generator()
        to = torch.Tensor.to
        monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self if a[:1] == ("cuda",) else to(self, *a, **k))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    names = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn", torch.float32: "float32",
             torch.int64: "int64"}
    cases = [c for c in bench.cases_of("05_elementwise") if c.shape.startswith(f"t={t},")]
    assert cases
    for case in cases:
        gen.manual_seed(case.seed)
        typed_in, typed_out = case.make(fake, gen)
        assert [names[x.dtype] for x in typed_in + typed_out] == case.dtypes, case.op
        inputs, outputs = bench._raw(typed_in), bench._raw(typed_out)
        initial = [o.clone() for o in outputs] if case.initial_outputs else []
        expected = bench._reference(case, [bench._host_bits(x) for x in inputs],
                                    [bench._host_bits(x) for x in initial])
        assert [tuple(o.shape) for o in outputs] == [e.shape for e in expected], case.op
        typed_set = [*(r.view(x.dtype) for r, x in zip(inputs, typed_in)),
                     *(r.view(o.dtype) for r, o in zip(initial, typed_out))]
        call = bench._as_peer_call(case.torch_peers["torch_eager"](torch, typed_set))
        outs = bench._outs(call())
        check = bench._verify(case, inputs, outs, expected, case.peer_tolerance)
        assert check["pass"], f"{case.op} {case.shape}: {check['text']}"
        if call.reset is not None:  # it wrote copies: the initial contents it was given are intact
            assert bench._check_peer(case, call, outs, inputs, expected)["pass"]
            assert all(torch.equal(a, b) for a, b in zip(initial, bench._raw(typed_out)))


# ------------------------------------------------------------------------------------------------
# Chapter 10: the top-k ops' bench cases (inputs made on the GPU; here their list, what the shape
# strings select, the references on host bits, and, where torch is installed, the torch peers'
# math and the cases' make() on the CPU).

SAMPLING_OPS = ("top_k_mask_logits", "top_k_renorm_probs")


def test_sampling_cases_are_the_issue_s_shapes_and_the_shape_strings_select_them():
    cases = bench.cases_of("10_sampling", ops=list(SAMPLING_OPS))
    runs = {(b, v, 50) for b in (1, 16, 64, 256) for v in (32000, 128256, 152064)}
    runs |= {(b, 128256, 1024) for b in (1, 16, 64, 256)} | {(64, 128256, 1)}
    want = {(op, f"b={b},v={v},k={k}") for op in SAMPLING_OPS for b, v, k in runs}
    assert {(c.op, c.shape) for c in cases} == want and len(cases) == len(want) == 34
    assert len(bench.cases_of("10_sampling", shape=r",v=128256,k=1024$")) == 8
    assert [c.shape for c in bench.cases_of("10_sampling", shape=r",k=1$")] == ["b=64,v=128256,k=1"] * 2
    picked = bench.cases_of("10_sampling", ops=["top_k_renorm_probs"], shape=r"^b=256,v=152064,")
    assert [(c.op, c.shape) for c in picked] == [("top_k_renorm_probs", "b=256,v=152064,k=50")]
    assert len(bench.cases_of("10_sampling", ops=list(SAMPLING_OPS), shape="v=32000")) == 8


def test_sampling_cases_name_their_tensors_tolerances_peers_and_bytes():
    from lkw import golden, sampling

    for c in bench.cases_of("10_sampling", ops=list(SAMPLING_OPS)):
        b, v, _ = (int(f.split("=")[1]) for f in c.shape.split(","))
        assert c.dtypes == ["float32", "int32", "float32"] and c.params == {}
        assert c.tolerance == golden.SAMPLING_TOLERANCES[c.op] and c.peer_tolerance is None
        assert c.sample_rows is None and not c.reference_sees_all and c.shared_inputs == ()
        assert c.model_bytes == sampling.renorm_bytes(b, v) == b * (8 * v + 16)
        compiled = {"torch_compile"} if b >= bench.SAMPLING_COMPILE_B else set()
        assert set(c.torch_peers) == {"torch_eager", "torch_sort"} | compiled
        assert set(c.library_peers) == {f"flashinfer {c.op}"}


@pytest.mark.parametrize("op", SAMPLING_OPS)
def test_sampling_references_read_the_host_bits(rng, op):
    from lkw import sampling

    x = sampling.lm_logits(rng, 3, 300, ties=True)
    if op == "top_k_renorm_probs":
        x = sampling.softmax(x)
    k = np.array([7, 0, 300], np.int32)
    (case,) = bench.cases_of("10_sampling", ops=[op], shape="^b=1,v=32000,k=50$")
    (got,) = bench._reference(case, [x.view(np.uint32), k.view(np.uint32)])
    fn = sampling.top_k_mask_logits if op == "top_k_mask_logits" else sampling.top_k_renorm_probs
    assert np.array_equal(got.view(np.uint32), fn(x, k).view(np.uint32))


def _matches(op: str, got: np.ndarray, want: np.ndarray) -> bool:
    from lkw import sampling

    if op == "top_k_mask_logits":
        return np.array_equal(got.view(np.uint32), want.view(np.uint32))
    return bool(np.all(np.abs(got.astype(np.float64) - want) <= sampling.PROB_RTOL * np.abs(want)))


@pytest.mark.parametrize("op", SAMPLING_OPS)
def test_the_sampling_torch_peers_compute_the_contract_on_the_cpu(rng, op):
    """torch.topk's k-th value and the sort's gathered k-th value as thresholds: ties at the k-th
    value kept (rows on a grid of 1/4, the maximum twice), disabled k (sort peer: per row) kept
    whole; the mask exact, the renormalization within PROB_RTOL. (masked_fill keeps a -0.0 that
    the contract writes +0.0: the grid's zeros are made +0.0 here, the bench's logits have none.)"""
    torch = pytest.importorskip("torch")
    from lkw import sampling

    b, v = 4, 500
    x = sampling.lm_logits(rng, b, v, ties=True) + np.float32(0)
    if op == "top_k_renorm_probs":
        x = sampling.softmax(x)
    fn = sampling.top_k_mask_logits if op == "top_k_mask_logits" else sampling.top_k_renorm_probs
    for k in (1, 37, 499, 500):
        peer = bench._sampling_torch_peers(op, k, b)["torch_eager"]
        ks = np.full(b, k, np.int32)
        got = peer(torch, [torch.from_numpy(x), torch.from_numpy(ks)])()
        assert _matches(op, got.numpy(), fn(x, ks)), f"torch.topk peer, k = {k}"
    ks = np.array([1, 0, 37, v + 5], np.int32)
    got = bench._sampling_torch_peers(op, 50, b)["torch_sort"](torch, [torch.from_numpy(x), torch.from_numpy(ks)])()
    assert _matches(op, got.numpy(), fn(x, ks)), "the sort peer, a k per row"
    kept = (got.numpy() != (-np.inf if op == "top_k_mask_logits" else 0)).sum(axis=1)
    assert kept[0] >= 2 and kept[1] == kept[3] == v, "the maximum twice: k = 1 keeps both"


def test_sampling_cases_make_what_their_references_and_torch_peers_expect(monkeypatch):
    """Each B = 1 case's make() on the CPU: float32 [B, V] and int32 [B] of the case's k, probs
    that are a softmax, an output of the input's shape; the torch peers agree with the reference."""
    torch = pytest.importorskip("torch")
    fake, gen = _CpuTorch(torch), torch.Generator()
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self if a[:1] == ("cuda",) else to(self, *a, **k))
    cases = bench.cases_of("10_sampling", ops=list(SAMPLING_OPS), shape=r"^b=1,")
    assert len(cases) == 8
    for case in cases:
        gen.manual_seed(case.seed)
        (x, top_k), (out,) = case.make(fake, gen)
        b, v, k = (int(f.split("=")[1]) for f in case.shape.split(","))
        assert x.dtype == torch.float32 and tuple(x.shape) == (b, v) and out.shape == x.shape
        assert top_k.dtype == torch.int32 and top_k.tolist() == [k] * b
        if case.op == "top_k_renorm_probs":
            assert float(x.min()) >= 0 and abs(float(x.double().sum()) - b) < 1e-4
        (want,) = bench._reference(case, [bench._host_bits(x), bench._host_bits(top_k)])
        for name, peer in case.torch_peers.items():
            if name == "torch_compile":
                continue
            got = peer(torch, [x, top_k])()
            assert _matches(case.op, got.numpy(), want), f"{case.op} {case.shape} {name}"


def test_the_chapter_10_example_run_has_the_schema_and_the_bench_s_ops_and_shapes():
    run = results.example("10_sampling")
    check_results_schema(run, "10_sampling example")
    bench_shapes = {(c.op, c.shape) for c in bench.cases_of("10_sampling")}
    assert {(r["op"], r["shape"]) for r in run["rows"]} <= bench_shapes
    assert {r["op"] for r in run["rows"]} == set(SAMPLING_OPS)
    assert {r["version"] for r in run["rows"] if r["kind"] == "version"} == {"v0_sort_cub", "v1_radix_select"}
    assert len(results.text_table(run).splitlines()) > len(run["rows"])


# ------------------------------------------------------------------------------------------------
# Chapter 10: top_p_renorm_probs, sample and rejection_sample, judged by checks (Case.check): their
# cases, the checks on host bits (the reference's outputs pass, a wrong token, value or count is
# caught, uncertain tokens are exempt), the bench's routing of versions and peers to the checks,
# and, where torch is installed, the torch peers on the CPU.

CHECKED_OPS = ("top_p_renorm_probs", "sample", "rejection_sample")


def _fields(shape: str) -> dict[str, str]:
    return dict(f.split("=") for f in shape.split(","))


def test_the_checked_sampling_cases_are_the_brief_s_shapes():
    by_op = {op: [c.shape for c in bench.cases_of("10_sampling", ops=[op])] for op in CHECKED_OPS}
    bs = (1, 16, 64, 256)
    top_p = [f"b={b},v=128256,p={p}" for p in (0.9, 0.95) for b in bs]
    top_p += [f"b={b},v={v},p=0.9" for v in (32000, 152064) for b in bs]
    assert by_op["top_p_renorm_probs"] == top_p
    sets = ("k=50,p=0.9,T=0.7", "p=0.95,T=0.7", "k=1024,T=0.7", "min_p=0.1,T=0.7", "T=1", "k=50,T=0.7")
    sample = [f"b={b},v=128256,{f}" for f in sets for b in bs]
    sample += [f"b=64,v={v},k=50,p=0.9,T=0.7" for v in (32000, 152064)]
    assert by_op["sample"] == sample
    assert by_op["rejection_sample"] == [f"b={b},s=4,v=128256" for b in bs] + ["b=64,s=4,v=32000"]
    assert len(bench.cases_of("10_sampling")) == 34 + 16 + 26 + 5
    # Issue 48's goal "top-k (k = 50) >= 10x torch.topk + multinomial": top-k 50 alone, every B.
    assert [c.shape for c in bench.cases_of("10_sampling", ops=["sample"], shape=r"k=50,T=")] == [
        f"b={b},v=128256,k=50,T=0.7" for b in bs]
    assert [c.shape for c in bench.cases_of("10_sampling", ops=["sample"], shape=r"^b=256,v=128256,T=")] == [
        "b=256,v=128256,T=1"]


def test_the_checked_sampling_cases_name_their_tensors_checks_peers_and_bytes():
    from lkw import sampling

    dtypes = {"top_p_renorm_probs": ["float32"] * 3,
              "sample": ["float32", "float32", "int32", "float32", "float32", "int64", "int32"],
              "rejection_sample": ["float32", "int32", "float32", "int64", "int32", "int32"]}
    for c in bench.cases_of("10_sampling", ops=list(CHECKED_OPS)):
        f = _fields(c.shape)
        b, v = int(f["b"]), int(f["v"])
        assert c.dtypes == dtypes[c.op] and c.expected is None and callable(c.check)
        assert c.sample_rows is None and c.params == {}
        compiled = {"torch_compile"} if b >= bench.SAMPLING_COMPILE_B and c.op != "rejection_sample" else set()
        literal = {"torch_topk_multinomial"} if c.op == "sample" and "k=" in c.shape and "p=" not in c.shape else set()
        assert set(c.torch_peers) == {"torch_eager"} | compiled | literal, c.shape
        assert c.library_peers and all(p.startswith("flashinfer ") for p in c.library_peers)
        if c.op == "top_p_renorm_probs":
            assert c.model_bytes == sampling.renorm_bytes(b, v) and c.peer_check is None
        elif c.op == "sample":
            assert c.model_bytes == sampling.sample_bytes(b, v) and c.peer_check is None
        else:
            assert c.model_bytes == sampling.rejection_bytes(b, int(f["s"]), v)
            assert c.peer_check is bench._rejection_structure
    fi = {c.shape.split(",", 2)[2]: set(c.library_peers) for c in bench.cases_of("10_sampling", ops=["sample"])}
    assert fi["k=50,p=0.9,T=0.7"] == {"flashinfer top_k_top_p_sampling_from_logits"}
    assert fi["k=1024,T=0.7"] == {"flashinfer softmax + top_k_sampling_from_probs"}
    assert fi["T=1"] == {"flashinfer sampling_from_logits", "flashinfer softmax + sampling_from_probs"}
    assert fi["k=50,T=0.7"] == {"flashinfer softmax + top_k_sampling_from_probs"}


def test_the_top_k_50_sample_case_s_torch_peer_is_topk_softmax_and_multinomial(rng, monkeypatch):
    """The peer of the goal "top-k 50 >= 10x torch.topk + multinomial": torch.topk's k-th value
    masks the logits / T, then softmax and torch.multinomial; no sort (that is top-p's path)."""
    torch = pytest.importorskip("torch")
    calls = []
    for name in ("topk", "sort", "multinomial", "softmax"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    (case,) = bench.cases_of("10_sampling", ops=["sample"], shape=r"^b=16,v=128256,k=50,T=")
    k, p, min_p, t = bench.SAMPLE_FILTERS["k=50"]
    assert (k, p, min_p) == (50, 1.0, 0.0)
    host = _sample_host(rng, b=3, v=400, t=t, k=k, p=p, min_p=min_p)
    host[1].view(np.float32)[:] = t
    typed = [torch.from_numpy(a.view(d)) for a, d in zip(host, (np.float32, np.float32, np.int32,
                                                                  np.float32, np.float32, np.int64))]
    assert _peer_check(case, torch, typed, "torch_eager") == []
    assert calls == ["topk", "softmax", "multinomial"]


def test_a_case_has_a_reference_or_a_check_not_both():
    def case(**kw):
        return bench.Case("op", "n=1", ["float32"], lambda torch, gen: None, **kw)

    assert case(expected=lambda host: host).check is None
    assert case(expected=None, check=lambda host, outs: []).expected is None
    for kw in ({"expected": lambda host: host, "check": lambda host, outs: []},
               {"expected": None, "check": lambda host, outs: [], "sample_rows": 4},
               {"expected": lambda host: host, "peer_check": lambda host, outs: []}):
        with pytest.raises(ValueError):
            case(**kw)


def _sample_host(rng, b=6, v=2000, t=0.7, k=50, p=0.9, min_p=0.0, seed=12345):
    from lkw import sampling

    x = sampling.lm_logits(rng, b, v)
    row = [np.full(b, value, dtype) for value, dtype in
           ((t, np.float32), (k, np.int32), (p, np.float32), (min_p, np.float32))]
    row[0][1] = 0  # a greedy row
    host = [x, *row, np.array([seed, 0], np.int64)]
    return [a.view({4: np.uint32, 8: np.uint64}[a.itemsize]) for a in host]


@pytest.mark.parametrize("filters", ["k=50,p=0.9,T=0.7", "p=0.95,T=0.7", "k=1024,T=0.7", "min_p=0.1,T=0.7", "T=1"])
def test_the_sample_check_admits_the_reference_s_tokens_and_catches_wrong_ones(rng, filters):
    """The versions' rule (lkw.sampling.sample with the kernels' Philox u_0) passes, on rows of
    2000 tokens with the case's filters and one greedy row; a token outside the support, another
    token in the greedy row, the poisoned output (-1) and a token past V are each caught."""
    from lkw import sampling

    (case,) = bench.cases_of("10_sampling", ops=["sample"], shape=f"^b=1,v=128256,{filters}$")
    f = _fields(filters)
    k, p, min_p = int(f.get("k", 0)), float(f.get("p", 1)), float(f.get("min_p", 0))
    host = _sample_host(rng, t=float(f["T"]), k=k, p=p, min_p=min_p)
    x, t = host[0].view(np.float32), host[1].view(np.float32)
    u = sampling.philox_uniforms(12345, 0, x.shape[0], 1)[:, 0]
    tokens = sampling.sample(x, u, t, k, p if p < 1 else None, min_p if min_p > 0 else None)
    assert case.check(host, [tokens.view(np.uint32)]) == []
    assert case.check(host, [tokens.view(np.uint32)]) == []  # again, from the cached support
    bad = tokens.copy()
    bad[0] = np.argmin(x[0])  # the least likely token: outside every filter but "none"
    bad[1] = (tokens[1] + 1) % x.shape[1]  # not greedy's
    bad[2], bad[3] = -1, x.shape[1]
    problems = case.check(host, [bad.view(np.uint32)])
    rows = sorted(int(p.split(":")[0].split()[1]) for p in problems)
    assert rows == ([0, 1, 2, 3] if k or p < 1 or min_p else [1, 2, 3]), problems
    assert any("greedy" in p for p in problems) and any("outside 0..1999" in p for p in problems)


def test_the_sample_check_draws_the_support_s_boundary_where_the_widest_reading_does(rng):
    """Top-p at 0.9 (T = 1) on 1000-token rows: the last token the widest reading (p + MARGIN)
    keeps passes, the first one it drops (the largest key outside it) is caught."""
    from lkw import sampling

    host = _sample_host(rng, b=4, v=1000, t=1.0, k=0, p=0.9)
    x = host[0].view(np.float32)
    keys, mass = sampling.from_logits(x, np.ones(4, np.float32))
    wide = sampling.filter_keep(keys, mass, top_p=np.full(4, 0.9, np.float32), slack=+1)
    last_in = np.where(wide, keys, np.inf).argmin(axis=1)
    first_out = np.where(wide, -np.inf, keys).argmax(axis=1)
    (case,) = bench.cases_of("10_sampling", ops=["sample"], shape="^b=1,v=128256,p=0.95")
    greedy = np.argmax(x, axis=1)  # row 1 is greedy (T = 0)
    for tokens, bad_rows in ((last_in, []), (first_out, [0, 2, 3])):
        tokens = np.where(np.arange(4) == 1, greedy, tokens).astype(np.int32)
        problems = case.check(host, [tokens.view(np.uint32)])
        assert sorted(int(p.split(":")[0].split()[1]) for p in problems) == bad_rows, problems


def test_the_top_p_renorm_check_exempts_uncertain_tokens_and_nothing_else(rng):
    """Row 0: probs (1/4, 1/5, 1/20) at p = 0.9: the last token's greater mass is p times the
    row's within MARGIN, so it is uncertain: dropping it (the contract) or keeping it (a float32
    sum) both pass if the row is renormalized over what was kept; keeping it without renormalizing
    (the row sums to 1/2) fails. Rows 1..: LM rows, where a token moved across the threshold, a value off by 1e-3
    relative, a NaN and an empty row are each caught."""
    from lkw import sampling

    (case,) = bench.cases_of("10_sampling", ops=["top_p_renorm_probs"], shape="^b=1,v=128256,p=0.9$")
    v = 3000
    probs = np.zeros((5, v), np.float32)
    probs[0, :3] = (0.25, 0.2, 0.05)
    probs[1:] = sampling.softmax(sampling.lm_logits(rng, 4, v))
    top_p = np.full(5, 0.9, np.float32)
    host = [probs.view(np.uint32), top_p.view(np.uint32)]
    keys, mass = sampling.from_probs(probs)
    assert sampling.uncertain_tokens(keys, mass, top_p=top_p)[0, 2]
    want = sampling.top_p_renorm_probs(probs, top_p)
    assert case.check(host, [want.view(np.uint32)]) == []
    kept_too = want.copy()
    kept_too[0] = sampling.renorm(mass[:1], probs[:1] > 0)[0]
    assert case.check(host, [kept_too.view(np.uint32)]) == []
    kept_too[0, :3] = probs[0, :3]
    assert case.check(host, [kept_too.view(np.uint32)])[0].startswith("row 0: token 0")
    bad = want.copy()
    first_dropped = np.flatnonzero(want[1] == 0)[np.argmax(probs[1][want[1] == 0])]
    bad[1, first_dropped] = probs[1, first_dropped]  # the largest dropped token kept
    bad[2] *= np.float32(1 + 1e-3)
    bad[3, np.argmax(probs[3])] = np.nan
    bad[4] = 0
    problems = case.check(host, [bad.view(np.uint32)])
    assert [p.split(":")[0] for p in problems] == ["row 1", "row 2", "row 3", "row 4"], problems
    assert "against the rule" in problems[0] and "nan" in problems[2]


def _rejection_host(rng, b=6, s=4, v=1500, seed=777, offset=8):
    from lkw import sampling

    q, drafts, p = sampling.speculative_inputs(rng, b, s, v)
    host = [q.view(np.uint32), drafts.view(np.uint32), p.view(np.uint32),
            np.array([seed, offset], np.int64).view(np.uint64)]
    u = sampling.philox_uniforms(seed, offset, b, s + 1)
    tokens, n = sampling.rejection_sample(q, drafts, p, u[:, :s], u[:, s])
    return host, tokens, n


def test_the_rejection_check_holds_versions_to_the_philox_reference_and_peers_to_the_structure(rng):
    """The reference with the kernels' uniforms passes both checks. A wrong num_accepted (with
    tokens that keep the structure), another last token, and each structural fault (a changed
    accepted draft, a count past S, no placeholder after the last token) are caught by the
    versions' check; the peers' check accepts any well-formed output and rejects the faults."""
    (case,) = bench.cases_of("10_sampling", ops=["rejection_sample"], shape="^b=1,")
    host, tokens, n = _rejection_host(rng)
    s, v = tokens.shape[1] - 1, host[0].shape[2]
    assert 0 < n.sum() < n.size * s, "some drafts accepted, some rejected"

    def outs(t, c):
        return [t.astype(np.int32).view(np.uint32), c.astype(np.int32).view(np.uint32)]

    assert case.check(host, outs(tokens, n)) == [] == case.peer_check(host, outs(tokens, n))
    unsure = bench._rejection_reference(host)[2]
    assert np.any((n < s) & ~unsure), "a row that rejected a draft, its last token sure"
    r = int(np.argmax((n < s) & ~unsure))  # a row that rejected a draft, far from a CDF boundary
    other = tokens.copy()
    other[r, n[r]] = (tokens[r, n[r]] + 1) % v  # another resampled token: well-formed
    want = f"row {r}: token {other[r, n[r]]} after {n[r]} accepted drafts, want {tokens[r, n[r]]}"
    assert case.check(host, outs(other, n)) == [want]
    assert case.peer_check(host, outs(other, n)) == []
    fewer, count = tokens.copy(), n.copy()  # row r accepts nothing: its first draft resampled
    j = int(np.argmax(n > 0))
    count[j], fewer[j, 1:] = 0, -1
    assert case.check(host, outs(fewer, count))[0] == f"row {j}: num_accepted 0, want {n[j]}"
    assert case.peer_check(host, outs(fewer, count)) == []
    drafts = host[1].view(np.int32)
    for fault in ("draft", "count", "placeholder"):
        bad, count = tokens.copy(), n.copy()
        if fault == "draft":
            bad[j, 0] = (drafts[j, 0] + 1) % v
        elif fault == "count":
            count[r] = s + 1
        else:
            bad[r, s] = 0 if n[r] < s - 1 else -1
            count[r] = n[r] if n[r] < s - 1 else s
            if n[r] >= s - 1:
                bad[r, :s], bad[r, s] = drafts[r], v  # a last token past V instead
        for check in (case.check, case.peer_check):
            assert check(host, outs(bad, count)), fault


def test_the_bench_routes_versions_and_peers_of_a_checked_case_to_their_checks(monkeypatch):
    """_reference gives the host inputs (Checked); _verify runs the case's check on a version's
    outputs and peer_check on a peer's, an output a peer leaves out (`only`) reaching it as None;
    a failed check's text shows CHECK_SHOWN problems and how many more."""
    monkeypatch.setattr(bench, "_host_bits", lambda t: t)  # host arrays stand in for tensors
    seen = []

    def check(host, outs):
        seen.append(("version", outs))
        return [f"p{i}" for i in range(5)]

    def peer_check(host, outs):
        seen.append(("peer", outs))
        return []

    case = bench.Case("op", "n=2", ["int32", "int32", "int32"], None, None, check=check, peer_check=peer_check)
    host = [np.arange(2)]
    expected = bench._reference(case, host, [np.zeros(2)])
    assert isinstance(expected, bench.Checked) and len(expected.host_inputs) == 2
    outs = [np.ones(2), np.full(2, 7)]
    got = bench._verify(case, [None], outs, expected)
    assert got == {"pass": False, "text": "p0; p1; p2; 2 more"}
    assert bench._verify(case, [None], outs, expected, peer=True, only=(1,))["pass"]
    assert seen[0][0] == "version" and seen[1][0] == "peer" and seen[1][1][0] is None
    assert np.array_equal(seen[1][1][1], outs[1])


def test_checks_compute_what_depends_on_the_inputs_once_per_host_copy():
    calls = []
    cached = bench._once_per_inputs(lambda host: calls.append(1) or len(calls))
    a, b = [np.zeros(3)], [np.zeros(3)]
    assert [cached(a), cached(a), cached(b), cached(b), cached(a)] == [1, 1, 2, 2, 3]


def _cpu_cases(torch, monkeypatch, op: str, shape: str):
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self if a[:1] == ("cuda",) else to(self, *a, **k))
    return _CpuTorch(torch), torch.Generator(), bench.cases_of("10_sampling", ops=[op], shape=shape)


def _peer_check(case, torch, typed_inputs, name):
    outs = bench._outs(case.torch_peers[name](torch, typed_inputs)())
    host = [bench._host_bits(t) for t in typed_inputs]
    return (case.peer_check or case.check)(host, [bench._host_bits(o) for o in outs])


@pytest.mark.parametrize("op", CHECKED_OPS)
def test_the_checked_sampling_cases_make_what_their_checks_and_torch_peers_expect(monkeypatch, op):
    """The B = 1 cases' make() on the CPU (V = 32000 where there is one: the shapes are what is
    checked, not the size): tensors of the case's dtypes and shapes, and the eager torch peer's
    outputs pass the case's (peer) check."""
    torch = pytest.importorskip("torch")
    names = {torch.float32: "float32", torch.int32: "int32", torch.int64: "int64"}
    fake, gen, cases = _cpu_cases(torch, monkeypatch, op, r"^b=1,")
    assert cases
    for case in cases:
        gen.manual_seed(case.seed)
        ins, outs = case.make(fake, gen)
        assert [names[t.dtype] for t in ins + outs] == case.dtypes, case.shape
        f = _fields(case.shape)
        assert tuple(ins[0].shape[::2]) == (int(f["b"]), int(f["v"])) or tuple(ins[0].shape) == (
            int(f["b"]), int(f["v"]))
        if op == "sample":
            assert ins[5].tolist()[1] == 0 and tuple(outs[0].shape) == (1,)
            assert [float(t) for t in ins[1:5]] == pytest.approx(
                [float(f["T"]), int(f.get("k", 0)), float(f.get("p", 1)), float(f.get("min_p", 0))])
        assert _peer_check(case, torch, ins, "torch_eager") == [], case.shape


def test_the_sampling_torch_peers_follow_the_contract_on_the_cpu(rng):
    """The engines' torch paths on 500-token rows: top-p renormalization passes the check of
    top_p_renorm_probs (p = 0.5, 0.9, 0.95), `sample` draws admissible tokens with every filter
    set (200 draws a row: a wrong support would show), rejection sampling is well-formed and
    accepts every draft where q = p (u * q < p with u < 1)."""
    torch = pytest.importorskip("torch")
    from lkw import sampling

    b, v = 4, 500
    x = sampling.lm_logits(rng, b, v)
    probs = sampling.softmax(x)
    for p in (0.5, 0.9, 0.95):
        (case,) = bench.cases_of("10_sampling", ops=["top_p_renorm_probs"], shape="^b=1,v=128256,p=0.9$")
        top_p = np.full(b, p, np.float32)
        got = bench._torch_top_p_renorm(torch, torch.from_numpy(probs), torch.from_numpy(top_p))
        assert case.check([probs.view(np.uint32), top_p.view(np.uint32)], [got.numpy().view(np.uint32)]) == []
    for filters, (k, p, min_p, t) in bench.SAMPLE_FILTERS.items():
        (case,) = bench.cases_of("10_sampling", ops=["sample"], shape=f"^b=1,v=128256,{filters},?T=")
        host = _sample_host(rng, b=b, v=v, t=t, k=k, p=p, min_p=min_p)
        host[1].view(np.float32)[:] = t  # no greedy row: engines route those elsewhere
        typed = [torch.from_numpy(a.view(d)) for a, d in zip(host, (np.float32, np.float32, np.int32,
                                                                      np.float32, np.float32, np.int64))]
        for _ in range(200):
            assert _peer_check(case, torch, typed, "torch_eager") == [], filters
    (case,) = bench.cases_of("10_sampling", ops=["rejection_sample"], shape="^b=1,")
    host, _, _ = _rejection_host(rng, b=b, v=v)
    typed = [torch.from_numpy(a.view(d)) for a, d in zip(host, (np.float32, np.int32, np.float32, np.int64))]
    assert _peer_check(case, torch, typed, "torch_eager") == []
    q = typed[2][:, :4].clone()
    tokens, n = bench._torch_rejection_sample(torch, q, typed[1], typed[2], typed[3])
    assert n.tolist() == [4] * b and torch.equal(tokens[:, :4], typed[1])


def test_results_folder_is_the_gpu_model():
    assert bench._gpu_slug("NVIDIA H200") == "h200"
    assert bench._gpu_slug("NVIDIA H100 80GB HBM3") == "h100"  # not "hbm3"
    assert bench._gpu_slug("") == "unknown"


def test_a_case_that_fails_outside_its_rows_is_recorded_and_the_run_goes_on(monkeypatch):
    """A case whose inputs, reference or launch raise costs that case, not the part: the run
    records it under case_errors and measures the next case."""
    bad, good = bench.Case("op", "n=1", ["uint32"], None, None), bench.Case("op", "n=2", ["uint32"], None, None)
    monkeypatch.setitem(bench.CHAPTERS, "99_test", lambda: [bad, good])
    monkeypatch.setattr(bench, "ext", lambda: _FakeExt)
    monkeypatch.setattr(bench, "versions_of", lambda *a: [])
    monkeypatch.setattr(bench, "same_size_copy", lambda *a, **k: None)
    monkeypatch.setattr(bench, "_device_answers", lambda: True)

    def measure(case, *a, **k):
        if case is bad:
            raise RuntimeError("shape refused\nsecond line")
        return []

    measured = []
    monkeypatch.setattr(bench, "measure_case", lambda case, *a, **k: measured.append(case.shape) or measure(case))
    ceilings = {"one_launch": 1.0, "back_to_back": 1.0, "graph": 1.0}
    run = bench.run_chapter("99_test", ceiling=(ceilings, "00_roofline/copy/v1", []), warmup=1, iters=1,
                            l2_bytes=1, log=lambda *a: None)
    assert measured == ["n=1", "n=2"]
    assert run["case_errors"] == [{"op": "op", "shape": "n=1", "error": "RuntimeError: shape refused"}]
