#!/usr/bin/env python3
"""Launch chosen versions at one bench shape, for a profiler to look at.

The bench times and checks; this only launches, so that Nsight Compute or Nsight Systems sees the
kernels you ask for and nothing else. Each launch comes after an L2 flush (as in the bench), and
is checked against the reference once, first. For example, every section of Nsight Compute on the
third launch of one version:

    PYTHONPATH=reference ncu --clock-control none --set full -k regex:gemv_v3 -s 2 -c 1 \\
        python3 tools/profile.py --chapter 06_int4_gemv --op int4i_gemv \\
        --shape m=1,n=28672,k=8192,g=128 --version v3_mma_split_k --launches 3

A production or torch peer of the same case (`--peer`, a name of the bench's rows: "flashinfer
fp8_blockscale_gemm_sm90", "torch_scaled_mm") launches the same way, on the same inputs. Each
profiled launch sits in an NVTX range named `launch`, the flush outside it, so that
`ncu --nvtx --nvtx-include "launch/"` sees the measured kernels and nothing else (a peer's own
preparation included).

--list-shapes prints the shapes the bench has for an op.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The package, and not this script's folder: this file would shadow the standard library's profile
# module, which libraries the bench imports load.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reference"))

from lkw import bench, peers  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chapter", required=True)
    ap.add_argument("--op", required=True)
    ap.add_argument("--shape", help="a bench shape string of the op, e.g. m=1,n=28672,k=8192,g=128")
    ap.add_argument("--version", action="append", default=[], help="version id (repeatable; default: all)")
    ap.add_argument("--peer", action="append", default=[], help="a peer of the case, by its row name (repeatable)")
    ap.add_argument("--launches", type=int, default=3, help="launches of each version")
    ap.add_argument("--list-shapes", action="store_true")
    args = ap.parse_args(argv)

    if args.chapter not in bench.CHAPTERS:
        ap.error(f"no bench cases for chapter {args.chapter}")
    cases = [c for c in bench.CHAPTERS[args.chapter]() if c.op == args.op]
    if not cases:
        ap.error(f"chapter {args.chapter} has no bench cases for op {args.op}")
    if args.list_shapes or not args.shape:
        print("\n".join(c.shape for c in cases))
        return 0
    case = next((c for c in cases if c.shape == args.shape), None)
    if case is None:
        ap.error(f"no shape {args.shape} for {args.op} (--list-shapes prints them)")
    peer_factories = {**case.torch_peers, **case.library_peers}
    unknown = [p for p in args.peer if p not in peer_factories]
    if unknown:
        ap.error(f"no peer {', '.join(unknown)} of {args.op} (it has: {', '.join(sorted(peer_factories))})")
    versions = bench.versions_of(args.chapter, args.op)
    if args.peer and not args.version:
        versions = []  # peers asked, no version: the peers alone
    if args.version:
        versions = [v for v in versions if v["id"] in args.version]
        missing = set(args.version) - {v["id"] for v in versions}
        if missing:
            ap.error(f"no version {', '.join(sorted(missing))} of {args.op}")

    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(case.seed)
    typed_inputs, typed_outputs = case.make(torch, gen)
    inputs, outputs = bench._raw(typed_inputs), bench._raw(typed_outputs)
    # An op that updates its outputs in place (a KV cache) starts each version from what make()
    # put there; its launches repeat the same writes, so the check after the first one holds.
    initial = [t.clone() for t in outputs] if case.initial_outputs else None
    expected = bench._reference(case, [bench._host_bits(t) for t in inputs],
                                [bench._host_bits(t) for t in initial or []])
    ext = bench.ext()
    status = 0
    for v in versions:
        bench._prime([(inputs, outputs)], initial)
        for i in range(args.launches):
            ext.flush_l2()
            with torch.cuda.nvtx.range("launch"):
                ext.launch(v["name"], inputs, outputs, params=case.params, dtypes=case.dtypes)
            if i == 0:
                torch.cuda.synchronize()
                check = bench._verify(case, inputs, outputs, expected)
                print(f"{v['name']} {case.shape}: {'ok' if check['pass'] else 'WRONG ' + check['text'][:200]}")
                status |= not check["pass"]
        torch.cuda.synchronize()
    # The peers as the bench hands them over: the inputs, then an in-place op's initial outputs;
    # prepared, called and checked through the bench's own helpers.
    typed_initial = [r.view(t.dtype) for r, t in zip(initial, typed_outputs)] if initial else []
    for name in args.peer:
        try:
            call = bench._as_peer_call(peer_factories[name](torch, [*typed_inputs, *typed_initial]))
        except peers.Absent as e:
            print(f"{name}: skipped: {e}")
            continue
        for i in range(args.launches):
            ext.flush_l2()
            with torch.cuda.nvtx.range("launch"):
                outs = bench._outs(call())
            if i == 0:
                torch.cuda.synchronize()
                check = bench._check_peer(case, call, outs, inputs, expected)
                print(f"{name} {case.shape}: {'ok' if check['pass'] else 'WRONG ' + check['text'][:200]}")
        torch.cuda.synchronize()
    return status


if __name__ == "__main__":
    sys.exit(main())
