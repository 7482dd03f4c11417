#!/usr/bin/env python3
"""Chapter 08's promotion experiment on the GPU: the same FP8 GEMM with promotion into FP32 every
128 k (v4_blockwise on rowwise scales) and without it (ablation_v4_no_promotion: the whole K in
the tensor core's running sum), at K = 512 ... 16384, on products of random sign (shift 0) and
mostly of one sign (shift 1). Each error is the relative Frobenius error against the float64
reference of the dequantized inputs; beside it the accumulation model's prediction for the same
inputs (lkw.fp8_gemm.emulate_fp8_gemm, on the first MODEL_ROWS rows) and the bound.

    python tools/promotion.py --write results/h200/experiments/08_promotion.json

Needs a GPU with sm_90a, torch and the compiled extension lkw._ext; writes the GPU, driver, date
and commit with the rows (the notebook plots them over the model's curves)."""

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "reference"))

import numpy as np  # noqa: E402
from lkw import fp8_gemm  # noqa: E402

KS = (512, 1024, 2048, 4096, 8192, 16384)
M, N = 128, 256  # two tiles of 128 along N, one along M: every consumer warpgroup takes part
MODEL_ROWS = 8  # rows the numpy model emulates (its cost grows with M·N·K)
VERSIONS = {"promoted": "08_fp8_gemm/fp8_gemm/v4_blockwise",
            "unpromoted": "08_fp8_gemm/fp8_gemm/ablation_v4_no_promotion"}
DTYPES = ["float8_e4m3fn", "float8_e4m3fn", "float32", "float32", "bfloat16"]


def run(ext, torch, name: str, host: list[np.ndarray]) -> np.ndarray:
    """Version `name` on the host inputs (A, B, s_a, s_b); y as BF16 bits (uint16) [M, N]."""
    ins = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in host]
    y = torch.full((host[0].shape[0], host[1].shape[0]), -1, dtype=torch.int16, device="cuda")
    ext.launch(name, ins, [y], dtypes=DTYPES)
    torch.cuda.synchronize()
    return y.cpu().numpy().view(np.uint16)


def commit() -> str:
    env = os.environ.get("LKW_COMMIT")
    if env:
        return env
    try:
        return subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                       text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="the JSON file to write (default: print only)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import torch
    from lkw import _ext as ext

    rng = np.random.default_rng(args.seed)
    rows = []
    for shift in (0.0, 1.0):
        for k in KS:
            a, b, s_a, s_b = fp8_gemm.problem(rng, M, N, k, "rowwise", shift)
            ref = fp8_gemm.reference(a, b, s_a, s_b, "rowwise")
            row = {"k": k, "shift": shift, "bound": fp8_gemm.error_bound(k),
                   "bound_unpromoted": fp8_gemm.error_bound(k, None)}
            for key, name in VERSIONS.items():
                y = run(ext, torch, name, [a, b, s_a, s_b])
                row[key] = fp8_gemm.rel_frobenius_error(y, ref)
                sub = fp8_gemm.emulate_fp8_gemm(a[:MODEL_ROWS], b, s_a[:MODEL_ROWS], s_b, "rowwise",
                                                fp8_gemm.PROMOTE_K if key == "promoted" else None)
                row[f"model_{key}"] = fp8_gemm.rel_frobenius_error(sub, ref[:MODEL_ROWS])
            rows.append(row)
            print(f"shift {shift:g} K {k:>6}: promoted {row['promoted']:.2e} (model "
                  f"{row['model_promoted']:.2e}), unpromoted {row['unpromoted']:.2e} (model "
                  f"{row['model_unpromoted']:.2e}), bound {row['bound']:.2e}")
    if args.write:
        dev = ext.device()
        out = {"chapter": "08_fp8_gemm", "experiment": "promotion", "gpu": dev["name"],
               "driver": dev["driver_version"], "cuda": dev["runtime_version"], "commit": commit(),
               "seed": args.seed, "m": M, "n": N,
               "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "rows": rows}
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
