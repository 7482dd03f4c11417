"""The bench's parts that need no GPU: the Nsight Compute CSV mapping (kernels by launch order,
the late write-backs of the flush that follows each version), the harness comparison through the
extension, and the replay of recorded results."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lkw import bench

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
            row("bf16_gemv", "cublas", "peer", "m=8", 125.0), row("int4i_gemv", "torch_matmul", "peer", "m=1", 100.0)]
    # Back to back and in a CUDA graph where both sides were timed so.
    rows[0].update(back_to_back_us=32.0, graph_us=30.0)
    rows[1].update(back_to_back_us=112.0, graph_us=111.0)
    rows[3].update(back_to_back_us=96.0)
    bench._peer_ratios(rows)
    assert rows[0]["peers"] == {
        "cublas": {"time_us": 120.0, "ratio": 3.0, "back_to_back_us": 112.0, "back_to_back_ratio": 3.5,
                   "graph_us": 111.0, "graph_ratio": 3.7},
        "torch_matmul": {"time_us": 100.0, "ratio": 2.5, "back_to_back_us": 96.0, "back_to_back_ratio": 3.0}}


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
    two, so three rotate back to back. Past the largest input (int4t_gemv: v14 copies the weights
    evict_first) the scales, x and y alone must exceed twice the L2: 35 sets, one fewer would not."""
    l2 = 60 << 20
    x, w, s, y = _Sized(2 * 8192), _Sized(28672 * 8192 // 2), _Sized(28672 * 64 * 2), _Sized(2 * 28672)
    assert bench._rotations([x, w, s], [y], l2, back_to_back=True) == 3
    sets = bench._rotations([x, w, s], [y], l2, back_to_back=True, past_largest=True)
    rest = x.nbytes + s.nbytes + y.nbytes
    assert (sets - 1) * rest >= 2 * l2 > (sets - 2) * rest
    assert sets == 35
    # Flushed (not back to back) the rule is the same less the extra set; without it, unchanged.
    assert bench._rotations([x, w, s], [y], l2, past_largest=True) == sets - 1
    assert bench._rotations([x, w, s], [y], l2) == 2
    cases = {c.op: c for c in bench.int4_gemv_cases() if c.shape.startswith("m=1,n=28672,k=8192")}
    assert cases["int4t_gemv"].rotate_past_largest and not cases["int4i_gemv"].rotate_past_largest


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


def test_replay_prints_the_recorded_h200_tables():
    out = subprocess.run([sys.executable, str(REPO / "tools" / "bench.py"), "--replay"],
                         capture_output=True, text=True, check=True).stdout
    for chapter in bench.CHAPTERS:
        if (REPO / "results" / "h200" / f"{chapter}.json").exists():
            assert "NVIDIA H200" in out and "copy ceiling" in out
    assert "v1_vec16" in out


def test_profile_lists_an_ops_bench_shapes_and_refuses_unknown_ones():
    run = lambda *a: subprocess.run([sys.executable, str(REPO / "tools" / "profile.py"), *a],
                                    capture_output=True, text=True, cwd=REPO)
    listed = run("--chapter", "06_int4_gemv", "--op", "int4i_gemv", "--list-shapes")
    assert listed.returncode == 0, listed.stderr
    assert "m=1,n=28672,k=8192,g=128" in listed.stdout.split()
    bad_op = run("--chapter", "06_int4_gemv", "--op", "no_such_op", "--list-shapes")
    assert bad_op.returncode == 2 and "no bench cases for op no_such_op" in bad_op.stderr
    bad_shape = run("--chapter", "06_int4_gemv", "--op", "int4i_gemv", "--shape", "m=3,n=1,k=1,g=1")
    assert bad_shape.returncode == 2 and "no shape m=3,n=1,k=1,g=1" in bad_shape.stderr


def test_chapter_06_recorded_run_backs_the_books_claims():
    """What book chapter 06 says of its recorded run, checked against the run: a new run that
    contradicts the text fails here until the text is rewritten."""
    import json
    run = json.loads((REPO / "results" / "h200" / "06_int4_gemv.json").read_text())
    rows = [r for r in run["rows"] if r["op"] in ("int4i_gemv", "bf16_gemv")]
    assert all(r["correct"] for r in run["rows"] if r["kind"] == "version")
    # DRAM bytes within 5% of the model on every version row Nsight Compute measured (the run of
    # 58c3917: within 4.5%; in the run of 87c1cce one row, v14 at M = 8, 4096 x 4096, read 6.0% over,
    # where v15 on the very same kernels read 3.9%: the profiler's spread at the smallest shape).
    measured = [r for r in run["rows"] if r["kind"] == "version" and r.get("dram_ratio")]
    assert len(measured) >= 500 and all(r["dram_ratio"] < 1.05 for r in measured)
    by_shape = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {})[r["version"]] = r
    for shape, vs in by_shape.items():
        best = min((r for r in vs.values() if r["kind"] == "version"), key=lambda r: r["time_us"])
        # Faster than PyTorch's own INT4 kernel at every shape and M.
        assert vs["torch_int4pack_mm"]["time_us"] > best["time_us"], shape
        if shape in ("m=8,n=28672,k=8192,g=128", "m=8,n=8192,k=28672,g=128"):
            assert vs["cublas"]["time_us"] / best["time_us"] >= 2.5, shape  # the M = 8 goal
            assert best["version"] in ("v7_shallow_ring", "v11_line_prefetch"), shape
    # v7's promise: most of its gain at M = 8 and 16 where K is long.
    for m in (8, 16):
        vs = by_shape[f"m={m},n=8192,k=28672,g=128"]
        assert vs["v7_shallow_ring"]["time_us"] < 0.95 * vs["v6_balanced_steps"]["time_us"]
    # Back to back (every version and peer of this op timed both ways, every copy's output
    # checked after): v8's promise, faster than v7 at every M on the 70B shapes; v8, v9 or v10 the
    # fastest nearly everywhere, and v9's promise, faster than v8 at every shape with M <= 2 (its
    # own paths; past M = 2 it runs v8); v10's, faster than v9 where the warps' runs line up
    # (M <= 2 at the 70B shapes and 8192 x 8192) and nowhere more than 0.3 us slower at M <= 2;
    # still faster than PyTorch's INT4 kernel; the M = 8 goal.
    b2b = [r for r in rows if r.get("back_to_back_us") is not None]
    assert b2b and all(r["back_to_back_correct"] for r in b2b)
    fastest_dependent = 0
    lined_up = [f"m={m},n={n},k={k},g=128" for m in (1, 2) for n, k in ((28672, 8192), (8192, 28672), (8192, 8192))]
    for shape, vs in by_shape.items():
        versions = [r for r in vs.values() if r["kind"] == "version"]
        best = min(versions, key=lambda r: r["back_to_back_us"])
        fastest_dependent += best["version"] in ("v8_dependent_launch", "v9_block_split_k", "v10_rotated_walk",
                                                 "v11_line_prefetch")
        assert vs["torch_int4pack_mm"]["back_to_back_us"] > best["back_to_back_us"], shape
        if shape.startswith(("m=1,", "m=2,")) and "v9_block_split_k" in vs:
            assert vs["v9_block_split_k"]["back_to_back_us"] < vs["v8_dependent_launch"]["back_to_back_us"], shape
            # (4096 x 4096, M = 1, back to back: v10 took 7.17, 7.35 and 6.71 us in the runs of ad7d2d5,
            # 9b072d6 and its repeat, v9 7.00, 6.96 and 6.97: see the slack of v12's check below.)
            slack = 1.0 if shape == "m=1,n=4096,k=4096,g=128" else 0.3
            assert vs["v10_rotated_walk"]["back_to_back_us"] < vs["v9_block_split_k"]["back_to_back_us"] + slack, shape
        if shape in lined_up:
            assert vs["v10_rotated_walk"]["back_to_back_us"] < vs["v9_block_split_k"]["back_to_back_us"], shape
        # v11 against v10 (M <= 2) and v8 (past it): see test_chapter_06_run_before_v13_backs_the_v11_claims.
        if ",n=28672," in shape or ",k=28672," in shape:
            assert vs["v8_dependent_launch"]["back_to_back_us"] < vs["v7_shallow_ring"]["back_to_back_us"], shape
            # ... and one launch at a time after the flush, slower (x waits behind the ring), at
            # M <= 8. (At M = 16, 28672 x 8192, v8 was 1.1-1.7 us behind in the runs of 9b072d6 and
            # 87c1cce and 0.35 us ahead in the run of 58c3917: a 61-63 us kernel's spread.)
            if not shape.startswith("m=16,"):
                assert vs["v8_dependent_launch"]["time_us"] > vs["v7_shallow_ring"]["time_us"], shape
        if shape in ("m=8,n=28672,k=8192,g=128", "m=8,n=8192,k=28672,g=128"):
            assert vs["cublas"]["back_to_back_us"] / best["back_to_back_us"] >= 2.5, shape
    assert fastest_dependent >= 25
    # In a CUDA graph (the same launches captured once): every version and peer timed so and
    # checked after; v9 still faster than v8 at M <= 2 (its dependent launch still pays in a
    # graph), v10 than v9 where the runs line up, PyTorch's INT4 kernel still slower, the M = 8 goal
    # still met.
    graphed = [r for r in rows if r.get("graph_us") is not None]
    assert len(graphed) == len(b2b) and all(r["graph_correct"] for r in graphed)
    for shape, vs in by_shape.items():
        best = min((r for r in vs.values() if r["kind"] == "version"), key=lambda r: r["graph_us"])
        assert vs["torch_int4pack_mm"]["graph_us"] > best["graph_us"], shape
        if shape.startswith(("m=1,", "m=2,")):
            assert vs["v9_block_split_k"]["graph_us"] < vs["v8_dependent_launch"]["graph_us"], shape
            assert vs["v10_rotated_walk"]["graph_us"] < vs["v9_block_split_k"]["graph_us"] + 0.3, shape
        if shape in lined_up:
            assert vs["v10_rotated_walk"]["graph_us"] < vs["v9_block_split_k"]["graph_us"], shape
        if shape in ("m=8,n=28672,k=8192,g=128", "m=8,n=8192,k=28672,g=128"):
            assert vs["cublas"]["graph_us"] / best["graph_us"] >= 2.5, shape
    # v12's promise (int4t_gemv: v11's kernels on the same words tiled): correct all three ways, the
    # DRAM bytes of the model, and faster than v11 where the rows are long (M = 1 to 8 on both 70B
    # shapes) back to back and in a graph; nowhere more than 0.2 us slower back to back (but at
    # 4096 x 4096, M = 1), 0.5 us in a graph (M = 16, two n-tiles, where the layout changes little).
    tiled = {r["shape"]: r for r in run["rows"] if r["op"] == "int4t_gemv" and r["version"] == "v12_tiled_weights"}
    assert set(tiled) == set(by_shape)
    for shape, r in tiled.items():
        assert r["correct"] and r["back_to_back_correct"] and r["graph_correct"], shape
        v11 = by_shape[shape]["v11_line_prefetch"]
        # (4096 x 4096: 8 MB of weights, a 7-8 us kernel whose back-to-back times wander by up to
        # 1 us from run to run: at M = 1 v12 0.97 us behind v11 in the run of ad7d2d5, level in its
        # repeat; at M = 8 0.23 us behind in the run of 9b072d6.)
        # (M = 16, 28672 x 8192: 0.09-0.28 us behind in the runs of 9b072d6 and 87c1cce, 0.32 in the
        # run of 58c3917.)
        slack = (1.0 if shape.startswith("m=1,n=4096,k=4096,") else 0.3 if ",n=4096,k=4096," in shape
                 else 0.4 if shape.startswith("m=16,") else 0.2)
        assert r["back_to_back_us"] < v11["back_to_back_us"] + slack, shape
        assert r["graph_us"] < v11["graph_us"] + 0.5, shape
        if (",n=28672," in shape or ",k=28672," in shape) and not shape.startswith("m=16,"):
            assert r["back_to_back_us"] < v11["back_to_back_us"], shape
            assert r["graph_us"] < v11["graph_us"], shape
    # v13's promise (v12's kernels, each block's tiles consecutive): correct all three ways, the DRAM
    # bytes of the model, faster than v12 at M <= 2 on 28672 x 8192 (13 or 14 tiles a block) one
    # launch at a time, back to back and in a graph; nowhere more than 0.4 us slower than v12 (the
    # same kernels where a block holds few tiles and past M = 2).
    consecutive = {r["shape"]: r for r in run["rows"]
                   if r["op"] == "int4t_gemv" and r["version"] == "v13_consecutive_tiles"}
    assert set(consecutive) == set(by_shape)
    for shape, r in consecutive.items():
        assert r["correct"] and r["back_to_back_correct"] and r["graph_correct"], shape
        assert r["dram_ratio"] < 1.05, shape
        v12 = tiled[shape]
        for key in ("time_us", "back_to_back_us", "graph_us"):
            assert r[key] < v12[key] + 0.4, (shape, key)
            if shape in ("m=1,n=28672,k=8192,g=128", "m=2,n=28672,k=8192,g=128"):
                assert r[key] < v12[key] - 0.3, (shape, key)
    # v14's promise (v13 with the weights copied evict_first, the sets rotated past the weights):
    # correct all three ways; the DRAM bytes of the model to 0.5% at M <= 2 on the 70B shapes, fewer
    # than v13's there; faster than v13 at M <= 2 on the 70B shapes back to back and in a graph;
    # nowhere more than 0.6 us slower than v13 one launch at a time and 0.45 the other ways (past
    # M = 2 mixed; 4096 x 4096, M = 1, back to back wanders, see v12's check).
    evict = {r["shape"]: r for r in run["rows"] if r["op"] == "int4t_gemv" and r["version"] == "v14_evict_first"}
    assert set(evict) == set(by_shape)
    for shape, r in evict.items():
        assert r["correct"] and r["back_to_back_correct"] and r["graph_correct"], shape
        assert r["dram_ratio"] < (1.07 if shape == "m=8,n=4096,k=4096,g=128" else 1.05), shape  # (see above)
        # Rotated past the weights: x, the scales and y of the sets but one exceed twice the 60 MB L2.
        m, n, k = (int(f.split("=")[1]) for f in shape.split(",")[:3])
        assert (r["rotations"] - 1) * (m * k * 2 + n * (k // 128) * 2 + m * n * 2) >= 2 * (60 << 20), shape
        v13 = consecutive[shape]
        # (0.4 in the run of 9b072d6; in the run of 87c1cce v14 was up to 0.56 us behind v13 one launch
        # at a time, at M = 16, 28672 x 8192, and 0.41 in a graph at M = 16, 8192 x 28672; 0.50 there
        # in the run of 58c3917.)
        slack = 1.0 if shape.startswith("m=1,n=4096,k=4096,") else 0.55
        for key in ("time_us", "back_to_back_us", "graph_us"):
            assert r[key] < v13[key] + slack + (0.15 if key == "time_us" else 0.0), (shape, key)
        if shape.startswith(("m=1,", "m=2,")) and (",n=28672," in shape or ",k=28672," in shape):
            assert r["dram_ratio"] < 1.005 and r["dram_bytes"] < v13["dram_bytes"], shape
            # (back to back 0.16-0.18 us ahead at M = 2, 28672 x 8192, in the runs of 9b072d6 and
            # 87c1cce, 0.07 in the run of 58c3917; 0.21-0.48 at the other three shapes.)
            assert r["back_to_back_us"] < v13["back_to_back_us"] - (0.0 if shape.startswith("m=2,n=28672,") else 0.1), shape
            assert r["graph_us"] < v13["graph_us"], shape
    # v15's promise (v14 with the scales copied 8 steps at a time, where v9's block split leaves K
    # whole at M <= 2; v14's kernels elsewhere): correct all three ways; the DRAM bytes of the model
    # to 0.5% where its blocks run on the 70B shapes; faster than v14 there back to back and in a
    # graph; elsewhere the same kernels as v14, so within the runs' spread of it: 0.4 us in the run of
    # 87c1cce, up to 0.64 in the run of 58c3917 (one launch at a time at M = 16, 28672 x 8192; 0.61
    # back to back at M = 4, 4096 x 4096, a 7 us kernel). 0.7 (1.0 at 4096 x 4096, M = 1, see v12's).
    blocks = {r["shape"]: r for r in run["rows"] if r["op"] == "int4t_gemv" and r["version"] == "v15_block_scales"}
    assert set(blocks) == set(by_shape)
    for shape, r in blocks.items():
        assert r["correct"] and r["back_to_back_correct"] and r["graph_correct"], shape
        assert r["dram_ratio"] < 1.05, shape
        v14 = evict[shape]
        slack = 1.0 if shape.startswith("m=1,n=4096,k=4096,") else 0.7
        for key in ("time_us", "back_to_back_us", "graph_us"):
            assert r[key] < v14[key] + slack, (shape, key)
        if shape in ("m=1,n=28672,k=8192,g=128", "m=1,n=8192,k=28672,g=128", "m=2,n=28672,k=8192,g=128"):
            assert r["dram_ratio"] < 1.005, shape
            assert r["back_to_back_us"] < v14["back_to_back_us"] - 0.1, shape
            assert r["graph_us"] < v14["graph_us"] - 0.1, shape
    # The goals at M = 1 on the 70B shapes, read against the faster of the two BF16 peers (the C++
    # cuBLAS call and torch.matmul, which calls cuBLAS too), as the book reads them for this run:
    # met back to back and in a graph by v15 (the run of 58c3917: 3.66-3.91x, 89-93% of the ceiling;
    # 87c1cce: 3.51-3.52x, 90-95%), missed one launch at a time (3.15-3.24x, 78%), where the fastest
    # is whichever of v7 (an ordinary launch) and v13-v15 the run's spread puts ahead.
    ceiling = run["ceiling_gbps"]
    for shape in ("m=1,n=28672,k=8192,g=128", "m=1,n=8192,k=28672,g=128"):
        vs = {**by_shape[shape], "v12_tiled_weights": tiled[shape], "v13_consecutive_tiles": consecutive[shape],
              "v14_evict_first": evict[shape], "v15_block_scales": blocks[shape]}
        for key in ("time_us", "back_to_back_us", "graph_us"):
            best = min((r for r in vs.values() if r["kind"] == "version"), key=lambda r: r[key])
            if key == "time_us":
                assert best["version"] in ("v7_shallow_ring", "v13_consecutive_tiles", "v14_evict_first",
                                           "v15_block_scales"), shape
            else:
                assert best["version"] == "v15_block_scales", (shape, key)
            share = best["model_bytes"] / best[key] / 1e3 / ceiling
            assert (share >= 0.85) == (key != "time_us"), (shape, key, share)
            peer = min(vs["cublas"][key], vs["torch_matmul"][key])
            assert (peer / best[key] >= 3.5) == (key != "time_us"), (shape, key, peer / best[key])


def test_chapter_06_run_before_v13_backs_the_v11_claims():
    """The book's claims for v11 against v10 and v8 were measured in the run before v13 (commit
    6a8a865, kept in history/); the run of v13 (ad7d2d5) has v11 behind v10 at M <= 2 on the 70B
    shapes and the recorded run ahead, which the book's Results say with their numbers."""
    import json
    run = json.loads((REPO / "results" / "h200" / "history" / "06_int4_gemv_6a8a865.json").read_text())
    by_shape = {}
    for r in run["rows"]:
        if r["op"] == "int4i_gemv":
            by_shape.setdefault(r["shape"], {})[r["version"]] = r
    for shape, vs in by_shape.items():
        # v11 faster than v10 where the rows are long (every shape with M <= 2 but 4096 x 4096, and
        # there within 0.2 us back to back) and than v8 past M = 2 (the same kernels with 128-byte
        # copies), back to back and in a graph.
        rival = "v10_rotated_walk" if shape.startswith(("m=1,", "m=2,")) else "v8_dependent_launch"
        slack = 0.2 if ",n=4096,k=4096," in shape and rival == "v10_rotated_walk" else 0.0
        assert vs["v11_line_prefetch"]["back_to_back_us"] < vs[rival]["back_to_back_us"] + slack, shape
        assert vs["v11_line_prefetch"]["graph_us"] < vs[rival]["graph_us"], shape
    # In the run of ad7d2d5: v11 behind v10 at M <= 2 on the 70B shapes, by 0.36 to 0.64 us back to
    # back; in the run of 9b072d6 ahead of it there, by 0.16 to 0.55 us.
    for name, low, high in (("history/06_int4_gemv_ad7d2d5.json", 0.3, 0.7),
                             ("history/06_int4_gemv_9b072d6.json", -0.6, -0.1)):
        other = json.loads((REPO / "results" / "h200" / name).read_text())
        rows = {(r["shape"], r["version"]): r for r in other["rows"] if r["op"] == "int4i_gemv"}
        for m in (1, 2):
            for n, k in ((28672, 8192), (8192, 28672)):
                shape = f"m={m},n={n},k={k},g=128"
                gap = rows[shape, "v11_line_prefetch"]["back_to_back_us"] - rows[shape, "v10_rotated_walk"]["back_to_back_us"]
                assert low < gap < high, (name, shape, gap)
