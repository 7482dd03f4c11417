"""The bench: verify, time and report every registered version of a chapter on the GPU.

    python tools/bench.py --list                       # the registry: chapters, ops, versions
    python tools/bench.py --chapter 01_formats         # verify + time, print the table
    python tools/bench.py --all --write-results        # every chapter, refresh results/<gpu>/
    python tools/bench.py --all --write-results --ncu  # ... with DRAM bytes from Nsight Compute
    python tools/bench.py --replay                     # print the recorded results (no GPU)
    python tools/bench.py --chapter 04_rmsnorm --compare results/h200/04_rmsnorm.json
                                                       # each row's change against a recorded run
    python tools/bench.py --compare OLD.json --replay-run NEW.json   # the same, two recorded runs
    python tools/bench.py --chapter 03_dynamic_quant --op per_group_fp8 --write-results --merge
                                                       # a partial run merged into the recorded one
    python tools/bench.py --chapter 07_w4a16_gemm --extended --shape 'n=10240,' --write-results --merge
                                                       # a part of a chapter's full matrix, merged
    python tools/bench.py --parts                      # the chapters' matrices in parts (BENCH_PARTS)
    python tools/bench.py --chapter 09_moe --part 3 --write-results --merge   # one of them, merged

For every (op, shape) of a chapter and every version and peer of that op: make inputs on the GPU
(torch), compute the reference on the host (lkw's numpy references), launch, compare with the
harness's own comparison (lkw._ext.compare), time, then compare again. One timing rule for every
op, version and peer, over the same input sets, rotated so that the working set exceeds twice the
L2 (CUDA events, medians after warm-up):

- in a CUDA graph: a batch of launches rotating over every set, captured once and replayed, as a
  decoder that captures its step runs them. The headline figure;
- back to back: batches of launches with nothing between them, rotating over the sets, as a
  decoder's stream runs its kernels;
- one launch after an L2 flush: each launch alone, which also charges the CPU's launch cost (a
  raw kernel's and a framework call's differ).

The bandwidth ceiling of each mode is the best chapter-00 copy timed that way at the start of the
same run. Peers: torch (eager, torch.compile, cuBLAS through torch) and the production kernels of
lkw.peers (vLLM, FlashInfer, Liger; optional, skipped with the reason printed when absent), each
verified against the same reference as the versions.

With --ncu the bench runs itself once more under Nsight Compute (--clock-control none), launching
each version PROFILED_LAUNCHES times inside an NVTX range "lkw", and reads dram__bytes_read.sum +
dram__bytes_write.sum per kernel, in launch order; a version's DRAM bytes are the median of its
launches.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import io
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lkw import REPO, formats, peers, roofline
from lkw.results import MODE_WORDS, MODES, mkey

CEILING_OP = ("00_roofline", "copy")
CEILING_WORDS = 64 << 20  # 256 MiB of input: far beyond the 60 MB L2


@dataclass
class Case:
    """One measured shape of one op.

    make(torch) returns (inputs, outputs) as device tensors; `dtypes` names every input then
    output for the registry (narrow floats travel as integer views); `expected(host_inputs)`
    returns the reference outputs as host arrays of the same bits, and `rows` optionally limits
    the comparison to some leading-dimension rows (a 8192^3 GEMM is checked on sampled rows).
    An op whose outputs no reference can give bit for bit (a sampled token) has `check` instead
    of `expected` (None) and a tolerance.
    """

    op: str
    shape: str
    dtypes: list[str]
    make: Callable
    expected: Callable | None
    tolerance: str = "exact"  # one for every output, or one per output joined by "/"
    sample_rows: int | None = None
    seed: int = 0
    params: dict[str, float] = field(default_factory=dict)  # eps, scale_ub, ...
    # Python peers measured beside the registry's versions: name -> factory(torch, inputs) that
    # returns a zero-argument callable producing the op's outputs (typed torch tensors, in order).
    torch_peers: dict[str, Callable] = field(default_factory=dict)
    # Production peers (lkw.peers: vLLM, FlashInfer, Liger): the same, the factory returning a
    # peers.PeerCall, or raising peers.Absent when its library is not here (skipped, said why).
    library_peers: dict[str, Callable] = field(default_factory=dict)
    peer_tolerance: str | None = None  # for every peer (default: `tolerance`)
    # check(host_inputs, host_outputs) -> problems (empty: correct), used instead of `expected` and
    # the tolerances where the outputs are judged by a rule rather than compared with reference
    # outputs: a sampled token is admissible or not, a kernel's float32 sums may legitimately
    # decide a token within lkw.sampling.MARGIN of a threshold either way. Host arrays hold the
    # raw bits (_host_bits); every row is checked (no sample_rows); an output a peer does not
    # produce is None. `peer_check` (default: `check`) judges the peers, whose random numbers are
    # not the versions' Philox stream.
    check: Callable[[list[np.ndarray], list[np.ndarray | None]], list[str]] | None = None
    peer_check: Callable[[list[np.ndarray], list[np.ndarray | None]], list[str]] | None = None
    # How output i is cut to the sampled rows (default: its leading rows), e.g. column-major scales.
    cut: dict[int, Callable] = field(default_factory=dict)
    # The reference gets every row (an op whose result depends on the whole tensor) and cuts itself.
    reference_sees_all: bool = False
    # Enough sets that the inputs and outputs other than the largest input (the weights) exceed
    # twice the L2 on their own. A version that copies the weights under an L2 evict_first policy
    # keeps the rest in L2 from one launch to the next when only the whole sets exceed it; a decoder reads every other layer's weights and scales between two launches of one
    # layer and finds them gone.
    rotate_past_largest: bool = False
    # At most this many sets (None: the rule above). MoE routing at decode sizes: ids or logits of
    # a few KiB would need 10^4..10^5 sets, and in a decoder they are the output of the kernel just
    # before, in L2 anyway: such a case is timed with its data in L2 wherever MAX_SETS sets stay
    # under twice the L2 (the chapter's page says which).
    max_sets: int | None = None
    # The byte and FLOP model of the peer rows where no version row gives one (the registry's
    # model, computed in C++, is every row's where a version is registered).
    model_bytes: float | None = None
    flops: float | None = None
    # Outputs updated in place (a KV cache written at a few slots): make() returns them holding
    # their initial contents, which every rotated set gets a copy of and which are restored before
    # each verified or timed run instead of the poison; `expected` gets them after the inputs (the
    # golden data's init arrays), and a peer factory gets them after the inputs too (it must write
    # copies of its own: lkw.peers).
    initial_outputs: bool = False
    # Inputs every rotated set shares instead of a copy of its own, left out of the rotation rule:
    # a table every layer of a decoder reads at the same rows (RoPE's cos/sin cache), which a
    # decoder finds in L2. A set of its own each would also cost thousands of copies at T = 1.
    shared_inputs: tuple[int, ...] = ()
    # The bytes one launch touches, for the rotation rule, where they are fewer than its tensors'
    # (a cache written at T slots is mostly untouched): the sets must exceed twice the L2 in these.
    rotation_bytes: int | None = None

    def __post_init__(self):
        if self.expected is not None and self.check is not None:
            raise ValueError(f"{self.op} {self.shape}: a case has `expected` or `check`, not both")
        if self.check is not None and self.sample_rows:
            raise ValueError(f"{self.op} {self.shape}: a check reads every row (no sample_rows)")
        if self.peer_check is not None and self.check is None:
            raise ValueError(f"{self.op} {self.shape}: peer_check without check")


def _raw(tensors) -> list:
    """Integer views of the same width: the registry gets the dtypes by name (narrow floats
    do not cross DLPack everywhere)."""
    import torch

    views = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return [t.view(views[t.element_size()]) for t in tensors]


def _poison(t) -> None:
    """All bits set (NaN in every float format) in an output, also one held as a transposed view
    (column-major scales), whose bytes are only contiguous seen the other way round. A view of
    one token's scales ([G, 1], strides (1, G)) counts as contiguous to torch, but a byte view
    needs its last stride to be 1: it is turned round too."""
    import torch

    if t.dim() == 2 and t.stride(-1) != 1 and t.t().is_contiguous():
        t = t.t()
    t.view(torch.uint8).fill_(0xFF)


def _host_bits(t) -> np.ndarray:
    """A device tensor's raw bits as a host numpy array of the same width."""
    import torch

    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    arr = t.contiguous().view(view).cpu().numpy()
    return arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[t.element_size()])


# ------------------------------------------------------------------------------------------------
# Chapter cases. A later chapter adds one function and one entry in CHAPTERS.


def _random_f32(torch, gen, n):
    # Normal values over magnitudes 2^-20 .. 2^20, so FP8 casts also see saturation and subnormals.
    x = torch.randn(n, device="cuda", generator=gen)
    scale = torch.exp2(torch.randint(-20, 21, (n,), device="cuda", generator=gen).float())
    return x * scale


def roofline_cases() -> list[Case]:
    n = CEILING_WORDS

    def make_copy(torch, gen):
        src = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda", generator=gen)
        return [src], [torch.empty_like(src)]

    m = k = nn = 8192

    def make_gemm(torch, gen):
        a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn(nn, k, device="cuda", generator=gen).to(torch.bfloat16)
        return [a, b], [torch.empty(m, nn, dtype=torch.bfloat16, device="cuda")]

    return [
        Case("copy", f"n={n}", ["uint32", "uint32"], make_copy, lambda x: [roofline.copy(x[0])]),
        Case(
            "gemm_bf16",
            f"m={m},n={nn},k={k}",
            ["bfloat16", "bfloat16", "bfloat16"],
            make_gemm,
            # The sampled rows of A against the whole of B: B has as many rows as A (M = N), so the
            # default cut (every input with the first input's rows) would cut B too.
            lambda x: [roofline.gemm_bf16(x[0][:64], x[1])],
            # BF16 output rounding (2^-8 relative) plus FP32 accumulation over K = 8192 terms.
            tolerance="close:1.6e-2:0.1",
            sample_rows=64,
            reference_sees_all=True,
        ),
    ]


def formats_cases() -> list[Case]:
    mib256 = 256 << 20

    def f32_input(torch, gen, out_dtype):
        n = mib256 // 4
        return [_random_f32(torch, gen, n)], [torch.empty(n, dtype=out_dtype, device="cuda")]

    def bf16_input(torch, gen):
        n = mib256 // 2
        bits = torch.randint(-(2**15), 2**15, (n,), dtype=torch.int16, device="cuda", generator=gen)
        return [bits], [torch.empty(n, dtype=torch.float32, device="cuda")]

    def fp8_input(torch, gen):
        n = mib256
        codes = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen)
        return [codes], [torch.empty(n, dtype=torch.int16, device="cuda")]

    def cast(op, names, make, ref):
        return Case(op, "input=256MiB", names, make, lambda x: [ref(x[0])])

    return [
        cast("f32_to_bf16", ["float32", "bfloat16"],
             lambda t, g: f32_input(t, g, t.int16), lambda x: formats.f32_to_bf16(x.view(np.float32))),
        cast("bf16_to_f32", ["bfloat16", "float32"], bf16_input,
             lambda x: formats.bf16_to_f32(x).view(np.uint32)),
        cast("f32_to_e4m3", ["float32", "float8_e4m3fn"],
             lambda t, g: f32_input(t, g, t.uint8), lambda x: formats.f32_to_e4m3(x.view(np.float32))),
        cast("f32_to_e5m2", ["float32", "float8_e5m2"],
             lambda t, g: f32_input(t, g, t.uint8), lambda x: formats.f32_to_e5m2(x.view(np.float32))),
        cast("e4m3_to_bf16", ["float8_e4m3fn", "bfloat16"], fp8_input, formats.e4m3_to_bf16),
        cast("e5m2_to_bf16", ["float8_e5m2", "bfloat16"], fp8_input, formats.e5m2_to_bf16),
    ]


def int4_dequant_cases() -> list[Case]:
    """Every dequant op at 8192 x 8192, the INT4 ones also at the Llama-3-8B and -70B weight
    shapes (N, K), G = 128. The launchers infer G from the shapes (K / scales.shape[1]), so no
    params travel; the reference checks 64 sampled rows."""
    from lkw import golden

    g = 128
    llama = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]
    shapes = {op: [(8192, 8192)] for op in golden.DEQUANT_OPS}
    for op in ("int4_f16", "int4_bf16", "int4i_f16", "int4i_bf16"):
        shapes[op] += llama

    def make_for(op, n, k):
        kind, fmt, zp = golden.dequant_signature(op)

        def make(torch, gen):
            dev = {"device": "cuda", "generator": gen}
            if kind == "int4":  # random words: every nibble value, natural or interleaved alike
                w = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, **dev)
            elif kind == "int8":
                w = torch.randint(0, 256, (n, k), dtype=torch.uint8, **dev)
            else:  # E4M3 codes 0..0xFE without 0x7F: no NaN weights
                c = torch.randint(0, 254, (n, k), dtype=torch.uint8, **dev)
                w = c + (c >= 0x7F).to(torch.uint8)
            dtype = torch.float16 if fmt == "float16" else torch.bfloat16
            scales = (torch.randn(n, k // g, **dev).abs() * 0.01 + 1e-3).to(dtype)
            inputs = [w, scales]
            if zp:
                zshape = (n, k // g // 8)
                zeros = torch.randint(-(2**31), 2**31 - 1, zshape, dtype=torch.int32, **dev)
                inputs.append(zeros)
            return inputs, [torch.empty(n, k, dtype=dtype, device="cuda")]

        return make

    def expected_for(op):
        def expected(x):
            # The bench samples the first input's leading rows; scales and zero points have the
            # same N rows, so they are cut to match.
            rows = x[0].shape[0]
            return [golden.OPS[op].fn(*(a[:rows] for a in x))]

        return expected

    cases = []
    for op, op_shapes in shapes.items():
        names = [*golden.OPS[op].inputs, *golden.OPS[op].outputs]
        for n, k in op_shapes:
            cases.append(Case(op, f"n={n},k={k},g={g}", names, make_for(op, n, k), expected_for(op),
                              sample_rows=64))
    return cases


# Activation shapes of chapters 03 and 04: prefill (T = 8192 tokens, bandwidth) and decode
# (T = 1, 16, 64: latency) at the hidden sizes of Llama-3-8B (4096) and -70B (8192).
ACT_SHAPES = [(8192, 4096), (8192, 8192), (1, 4096), (16, 4096), (64, 4096)]
ACT_SAMPLE_ROWS = 64


def _activations(torch, gen, t: int, d: int):
    """BF16 [T, d]: normal values, each row times 2^u, u uniform in [-4, 4] (as lkw.golden)."""
    rows = torch.exp2(torch.empty(t, 1, device="cuda").uniform_(-4, 4, generator=gen))
    return (torch.randn(t, d, device="cuda", generator=gen) * rows).to(torch.bfloat16)


def _torch_quant(torch, y, kind: str, group: int | None = None):
    """Per-token (or per-group, or per-tensor with kind "tensor") quantization of BF16 y in torch
    ops, the way a PyTorch user writes it: FP32 absmax, scale, reciprocal, cast."""
    from lkw import quant

    y32 = y.float()
    fp8, min_scale = torch.float8_e4m3fn, float(quant.MIN_SCALE)
    if kind == "int8":
        scale = y32.abs().amax(dim=1, keepdim=True) / 127.0
        inv = torch.where(scale > 0, scale.reciprocal(), torch.zeros_like(scale))
        return torch.clamp(torch.round(y32 * inv), min=-128.0, max=127.0).to(torch.int8), scale
    if kind == "tensor":
        scale = torch.clamp(y32.abs().amax() / 448.0, min=min_scale).reshape(1)
        return torch.clamp(y32 * scale.reciprocal(), min=-448.0, max=448.0).to(fp8), scale
    if group:
        t, d = y32.shape
        g = y32.view(t, d // group, group)
        scale = torch.clamp(g.abs().amax(dim=2, keepdim=True) / 448.0, min=min_scale)
        q = torch.clamp(g * scale.reciprocal(), min=-448.0, max=448.0).to(fp8).view(t, d)
        return q, scale.view(t, d // group).t().contiguous()
    scale = torch.clamp(y32.abs().amax(dim=1, keepdim=True) / 448.0, min=min_scale)
    return torch.clamp(y32 * scale.reciprocal(), min=-448.0, max=448.0).to(fp8), scale


def _eager_and_compiled(body: Callable) -> dict[str, Callable]:
    """{"torch_eager": ..., "torch_compile": ...} peer factories of one torch function of the
    typed inputs. torch.compile (Inductor, static shapes) compiles on the verifying first call,
    which is not timed."""

    def eager(torch, inputs):
        return lambda: body(torch, *inputs)

    compiled_for: dict = {}

    def compiled(torch, inputs):
        # Every case compiles afresh: Dynamo's cache is keyed by the code object, and after its
        # recompile limit it would silently run the function eagerly. The rotated input sets of
        # one case (same shapes, dtypes and strides) share the compiled function: one compilation.
        # fullgraph: a graph break raises (the peer is then recorded as not running) instead of
        # running part of the function eagerly under the compiled name.
        key = tuple((tuple(t.shape), t.dtype, t.stride()) for t in inputs)
        if key not in compiled_for:
            compiled_for.clear()
            torch._dynamo.reset()
            compiled_for[key] = torch.compile(lambda *xs: body(torch, *xs), dynamic=False, fullgraph=True)
        fn = compiled_for[key]
        return lambda: fn(*inputs)

    return {"torch_eager": eager, "torch_compile": compiled}


def _outputs(result) -> list:
    """A reference's result as a list of outputs (one array, or a tuple of them)."""
    return list(result) if isinstance(result, tuple) else [result]


def _peers_for(peers: dict[str, Callable], t: int) -> dict[str, Callable]:
    """torch.compile only at prefill sizes: each shape is a compilation of its own (tens of
    seconds), and at decode sizes the comparison that matters is the eager launch chain."""
    return {k: v for k, v in peers.items() if t > ACT_SAMPLE_ROWS or k != "torch_compile"}


def dynamic_quant_cases() -> list[Case]:
    """Chapter 03's four ops at ACT_SHAPES; the reference checks 64 sampled rows (per-tensor:
    the scale from the whole tensor). Peers: the same quantization in torch, eager and compiled,
    and vLLM's kernels where it has the op (lkw.peers.quant_peers)."""
    from lkw import golden, quant

    def make_for(op, t, d):
        def make(torch, gen):
            x = _activations(torch, gen, t, d)
            fp8 = torch.float8_e4m3fn
            if op == "per_token_int8":
                outs = [torch.empty(t, d, dtype=torch.int8, device="cuda"), torch.empty(t, 1, device="cuda")]
            elif op == "per_tensor_fp8":
                outs = [torch.empty(t, d, dtype=fp8, device="cuda"), torch.empty(1, device="cuda")]
            elif op == "per_group_fp8":
                outs = [torch.empty(t, d, dtype=fp8, device="cuda"), torch.empty(d // 128, t, device="cuda")]
            else:
                outs = [torch.empty(t, d, dtype=fp8, device="cuda"), torch.empty(t, 1, device="cuda")]
            return [x], outs

        return make

    def per_tensor_expected(x):
        x32 = formats.bf16_to_f32(x[0])
        scale = quant.fp8_scale(np.max(np.abs(x32)).reshape(1))
        return [quant.quantize_fp8(x32[:ACT_SAMPLE_ROWS], scale), scale]

    kinds = {"per_token_fp8": ("fp8", None), "per_token_int8": ("int8", None),
             "per_tensor_fp8": ("tensor", None), "per_group_fp8": ("fp8", quant.GROUP)}
    cases = []
    for op in golden.QUANT_OPS:
        kind, group = kinds[op]
        torch_peers = _eager_and_compiled(
            lambda torch, x, kind=kind, group=group: _torch_quant(torch, x, kind, group))
        for t, d in ACT_SHAPES:
            extra = {}
            if op == "per_tensor_fp8":
                extra = {"expected": per_tensor_expected, "reference_sees_all": True}
            if op == "per_group_fp8":
                extra["cut"] = {1: lambda a, rows: a[:, :rows]}  # scales [d/128, T], column-major
            cases.append(Case(
                op, f"t={t},d={d}", [*golden.OPS[op].inputs, *golden.OPS[op].outputs], make_for(op, t, d),
                extra.pop("expected", lambda x, op=op: _outputs(golden.OPS[op].fn(*x))),
                sample_rows=ACT_SAMPLE_ROWS if t > ACT_SAMPLE_ROWS else None,
                torch_peers=_peers_for(torch_peers, t), library_peers=peers.quant_peers(op),
                # torch's q may round differently where x·(1/scale) lands within an FP32 ulp of a
                # midpoint: one E4M3 step (one INT8 step); its scale divides like ours.
                peer_tolerance=("close:0:1/close:1e-6:0" if kind == "int8"
                                else "close:0.125:0.001953125/close:1e-6:0"),
                **extra))
    return cases


def rmsnorm_cases() -> list[Case]:
    """Chapter 04's five ops at ACT_SHAPES, eps 1e-6. Peers: the Hugging Face Llama RMSNorm
    (z rounded to BF16 before the weight, as the contract) in torch eager and compiled, and
    torch.nn.functional.rms_norm; for the fused ops the add and the quant in torch too; vLLM's,
    FlashInfer's and Liger's kernels (lkw.peers.norm_peers)."""
    from lkw import golden

    eps = 1e-6

    def hf_rmsnorm(torch, v, w):
        h = v.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(torch.bfloat16)

    def add_norm(torch, x, res, w):
        r = x + res  # BF16 + BF16: computed in FP32, rounded once, as the contract's r
        return hf_rmsnorm(torch, r, w), r

    def add_norm_quant(kind, group=None):
        def body(torch, x, res, w):
            y, r = add_norm(torch, x, res, w)
            return (*_torch_quant(torch, y, kind, group), r)

        return body

    bodies = {
        "rmsnorm": lambda torch, x, w: hf_rmsnorm(torch, x, w),
        "fused_add_rmsnorm": add_norm,
        "fused_add_rmsnorm_fp8": add_norm_quant("fp8"),
        "fused_add_rmsnorm_int8": add_norm_quant("int8"),
        "fused_add_rmsnorm_fp8_group": add_norm_quant("fp8", 128),
    }

    def make_for(op, t, d):
        def make(torch, gen):
            x = _activations(torch, gen, t, d)
            w = (1 + 0.25 * torch.randn(d, device="cuda", generator=gen)).to(torch.bfloat16)
            empty = lambda dtype, *shape: torch.empty(*shape, dtype=dtype, device="cuda")
            if op == "rmsnorm":
                return [x, w], [empty(torch.bfloat16, t, d)]
            res = 4 * _activations(torch, gen, t, d)
            r = empty(torch.bfloat16, t, d)
            if op == "fused_add_rmsnorm":
                return [x, res, w], [empty(torch.bfloat16, t, d), r]
            q = empty(torch.int8 if op.endswith("int8") else torch.float8_e4m3fn, t, d)
            scales = (empty(torch.float32, d // 128, t) if op.endswith("_group")
                      else empty(torch.float32, t, 1))
            return [x, res, w], [q, scales, r]

        return make

    cases = []
    for op in golden.NORM_OPS:
        torch_peers = _eager_and_compiled(bodies[op])
        if op == "rmsnorm":
            torch_peers["torch_F_rms_norm"] = lambda torch, ins: (
                lambda: torch.nn.functional.rms_norm(ins[0], (ins[0].shape[1],), ins[1], eps))
        for t, d in ACT_SHAPES:
            cases.append(Case(
                op, f"t={t},d={d}", [*golden.OPS[op].inputs, *golden.OPS[op].outputs], make_for(op, t, d),
                lambda x, op=op: _outputs(golden.OPS[op].fn(*x, eps)),
                tolerance=golden.NORM_TOLERANCES[op],
                sample_rows=ACT_SAMPLE_ROWS if t > ACT_SAMPLE_ROWS else None,
                params={"eps": eps}, torch_peers=_peers_for(torch_peers, t),
                library_peers=peers.norm_peers(op, eps),
                # the group op's scales [d/128, T] are cut along T, their second dimension
                cut={1: lambda a, rows: a[:, :rows]} if op.endswith("_group") else {},
                # F.rms_norm rounds x·rstd·w once (no BF16 step between): within 2 ulps anyway.
                peer_tolerance=golden.NORM_TOLERANCES[op]))
    return cases


# ------------------------------------------------------------------------------------------------
# Chapter 05: the elementwise ops at the decoder shapes of issue 47: Llama-3-8B (d_ff 14336; Hq 32,
# Hk 8, D 128), Llama-3-70B (d_ff 28672; Hq 64, Hk 8, D 128), and Qwen3-8B's heads (Hq 32, Hk 8,
# D 128) for qk_norm_rope, from decode (T = 1) to prefill (T = 8192). The model's name ends each
# shape string ("t=16,d=14336,llama3_8b"), so that --shape selects by model or by field.

ELEMENTWISE_T = (1, 16, 128, 1024, 8192)
ELEMENTWISE_MODELS = {  # name -> (d_ff, Hq, Hk, D, RoPE base)
    "llama3_8b": (14336, 32, 8, 128, 500000.0),
    "llama3_70b": (28672, 64, 8, 128, 500000.0),
    "qwen3_8b": (12288, 32, 8, 128, 1000000.0),
}
ELEMENTWISE_ACT_MODELS = ("llama3_8b", "llama3_70b")  # the gated activations' d_ff: 14336, 28672
ROPE_MAX_POS = 8192  # the cos/sin cache's rows; positions uniform over them
QK_NORM_EPS = 1e-6
CACHE_BLOCK = 16
CACHE_T = (16, 1024, 8192)
# The caches hold CACHE_SPREAD times the blocks the tokens need (no padding: every token is
# written). The slots follow cache_slots: at decode sizes (T <= CACHE_DECODE_MAX_T) each token is
# the next one of its own sequence, at a slot of its own anywhere in the cache; above, a prefill
# batch of CACHE_PROMPT-token prompts, each filling blocks of its own in order from offset 0, the
# blocks scattered over the cache as an allocator's free list leaves them.
CACHE_SPREAD = 4
CACHE_DECODE_MAX_T = 128
CACHE_PROMPT = 1000  # not a multiple of the block: each prompt's last block is partly filled
# The layouts vLLM's reshape_and_cache (paged) and reshape_and_cache_flash (NHD, and HND through
# the cache's strides) write.
CACHE_LAYOUTS = ("paged", "nhd", "hnd")
CACHE_OPS = {"reshape_and_cache": "bfloat16", "reshape_and_cache_fp8": "float8_e4m3fn"}
# A torch peer rounds where the contract does not. SiLU-and-mul in torch (and vLLM's and Liger's
# kernels) rounds silu(gate) to BF16 before the multiply: two roundings of 2^-9 each, so within
# two BF16 ulps of the one-rounding reference. The fused quant peers quantize that y: a scale
# drifts by those two ulps (2^-6 relative, checked within 2^-5), q by less than one E4M3 step
# (2^-4 to 2^-3 relative above 2^-6, 2^-9 absolute below).
ACT_PEER_TOLERANCE = "ulp:2"
FP8_Q_PEER_TOLERANCE = "close:0.125:0.001953125"
FP8_SCALE_PEER_TOLERANCE = "close:0.03125:0"
# vLLM's FP8 cache divides by the scale (x / s), the contract multiplies by fp32(1 / s): one E4M3
# code now and then (lkw.elementwise, section 4). A BF16 cache is a copy: exact everywhere.
CACHE_PEER_TOLERANCE = {"bfloat16": "exact", "float8_e4m3fn": "ulp:1"}


def cache_slots(t: int, order: np.ndarray, block: int = CACHE_BLOCK,
                prompt: int = CACHE_PROMPT) -> np.ndarray:
    """slot_mapping [T] of a batch, `order` a permutation of the cache's blocks (of its slots at
    decode sizes). Decode (t <= CACHE_DECODE_MAX_T): the first t slots of `order`. Prefill: token i
    is position i % prompt of prompt i // prompt, which takes the next ceil(prompt / block) blocks
    of `order`; so the tokens of a block are consecutive, and a block's column of the paged value
    layout is written by block consecutive tokens."""
    if t <= CACHE_DECODE_MAX_T:
        return order[:t]
    per_prompt = -(-prompt // block)
    if -(-t // prompt) * per_prompt > len(order):
        raise ValueError(f"{len(order)} blocks cannot hold {t} tokens in prompts of {prompt}")
    i = np.arange(t)
    pos = i % prompt
    return order[(i // prompt) * per_prompt + pos // block] * block + pos % block


def _in_place_eager_and_compiled(body: Callable, n_outputs: int) -> dict[str, Callable]:
    """_eager_and_compiled for an op that updates its last n_outputs tensors in place (a KV
    cache): the peer's factory gets the inputs followed by the outputs' initial contents
    (Case.initial_outputs), writes copies of its own, restored by its reset (untimed), and
    body(torch, *inputs, *copies) writes them."""

    def factory(compile_it: bool):
        compiled_for: dict = {}

        def make(torch, ins):
            inputs, initial = ins[:-n_outputs], ins[-n_outputs:]
            work, reset = peers._copies(torch, initial)
            fn = lambda *xs: body(torch, *xs)
            if compile_it:
                key = tuple((tuple(t.shape), t.dtype, t.stride()) for t in ins)
                if key not in compiled_for:
                    compiled_for.clear()
                    torch._dynamo.reset()
                    compiled_for[key] = torch.compile(fn, dynamic=False, fullgraph=True)
                fn = compiled_for[key]

            def call():
                fn(*inputs, *work)
                return work

            return peers.PeerCall(call, reset=reset)

        return make

    return {"torch_eager": factory(False), "torch_compile": factory(True)}


def _torch_gate_up(torch, x):
    d = x.shape[1] // 2
    return x[:, :d], x[:, d:]


def _torch_act(torch, x, act: str):
    """act(gate) * up in BF16 torch ops, as a PyTorch model writes it (two roundings)."""
    gate, up = _torch_gate_up(torch, x)
    if act == "silu":
        return torch.nn.functional.silu(gate) * up
    return torch.nn.functional.gelu(gate, approximate="tanh" if act == "gelu_tanh" else "none") * up


def _torch_static_fp8(torch, y, scale):
    """y BF16 -> E4M3 with a given FP32 scale [1]: e4m3(fp32(y * fp32(1 / scale))), saturated."""
    return torch.clamp(y.float() * scale.reciprocal(), min=-448.0, max=448.0).to(torch.float8_e4m3fn)


def _torch_rope(torch, pos, q, k, cache, is_neox: bool = True):
    """RoPE in torch ops from the FP32 cache rows of the positions (index_select): FP32 products
    of BF16 values, one rounding to BF16, as the contract; the D - rot_dim tail copied."""
    rows = cache.index_select(0, pos)  # (T,R)
    half = rows.shape[1] // 2
    cos, sin = rows[:, None, :half], rows[:, None, half:]  # (T,1,R/2)

    def rotate(h):
        r = h[..., : 2 * half].float()
        x, y = (r[..., :half], r[..., half:]) if is_neox else (r[..., 0::2], r[..., 1::2])
        x2, y2 = x * cos - y * sin, y * cos + x * sin
        out = torch.cat([x2, y2], -1) if is_neox else torch.stack([x2, y2], -1).flatten(-2)
        return torch.cat([out.to(h.dtype), h[..., 2 * half :]], -1)

    return rotate(q), rotate(k)


def _torch_head_rmsnorm(torch, h, w, eps: float):
    """Every head of h [T, H, D] through the Hugging Face (Qwen3) RMSNorm: z = bf16(h * rstd),
    w * z in BF16, the contract's chain."""
    h32 = h.float()
    z = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)
    return w * z.to(h.dtype)


def _torch_cache_write(torch, key, value, slots, kc, vc, layout: str, scales=None):
    """Each token's key and value heads written at its slot of the caches, in place (index_put;
    an FP8 cache through byte views, FP8 having no index_put), FP8 values quantized as
    _torch_static_fp8."""
    if scales is not None:
        key, value = (_torch_static_fp8(torch, a, s).view(torch.uint8) for a, s in zip((key, value), scales))
        kc, vc = kc.view(torch.uint8), vc.view(torch.uint8)
    t, hk, d = key.shape
    if layout == "paged":  # key [blocks, Hk, D/x, block, x], value [blocks, Hk, D, block]
        block = kc.shape[3]
        b, o = slots // block, slots % block
        kc[b, :, :, o, :] = key.reshape(t, hk, d // kc.shape[4], kc.shape[4])
        vc[b, :, :, o] = value
    elif layout == "hnd":  # [blocks, Hk, block, D]
        block = kc.shape[2]
        b, o = slots // block, slots % block
        kc[b, :, o] = key
        vc[b, :, o] = value
    else:  # nhd: [blocks, block, Hk, D]
        block = kc.shape[1]
        b, o = slots // block, slots % block
        kc[b, o] = key
        vc[b, o] = value


def _gelu_tolerances(tolerance: str) -> tuple[str, str]:
    """(the versions', the peers') tolerance of a gelu op from lkw.elementwise.act_tolerance's
    close:RTOL:ATOL: the peers round gelu(gate) to BF16 first, two BF16 ulps (RTOL 2^-6), and
    cancel as the versions do (the same ATOL)."""
    return tolerance, f"close:{2.0**-6!r}:{tolerance.split(':')[2]}"


def _tolerance_from_reference(holder: list, tolerance: Callable) -> Callable:
    """A reference that also sets the case's tolerance (and peer tolerance) from the data it saw:
    tolerance(inputs, outputs) -> str, or (str, peer str)."""

    def wrap(expected):
        def run(host):
            out = expected(host)
            tol = tolerance(host, out)
            holder[0].tolerance, holder[0].peer_tolerance = tol if isinstance(tol, tuple) else (tol, None)
            return out

        return run

    return wrap


def elementwise_cases() -> list[Case]:
    """Chapter 05's ops (issue 47's shapes, ELEMENTWISE_MODELS at ELEMENTWISE_T):

    - silu_and_mul, gelu_and_mul and gelu_tanh_and_mul, and the three fused FP8 forms of
      silu_and_mul (per token, per 1 x 128 group, static per tensor), on both Llama models at
      every T (ELEMENTWISE_ACT_MODELS);
    - rope (NEOX, rot_dim 128, a [8192, 128] FP32 cos/sin cache shared by the sets) on both Llama
      models at every T; qk_norm_rope on Qwen3-8B's heads at every T (eps 1e-6);
    - reshape_and_cache and reshape_and_cache_fp8 (block 16) in the paged, NHD and HND layouts
      (CACHE_LAYOUTS) on Llama-3-8B's KV heads at CACHE_T, no padding, the slots of decode or of
      a prefill batch (cache_slots); the caches start poisoned and are updated in place
      (Case.initial_outputs).

    The reference checks 64 sampled tokens where T > 64 (the caches whole). Peers: the same math in
    torch, eager and compiled (compiled at prefill sizes), and lkw.peers' vLLM, FlashInfer and Liger
    kernels."""
    from lkw import elementwise as ew
    from lkw import golden

    cases = []
    names = lambda op: [*golden.OPS[op].inputs, *golden.OPS[op].outputs]
    rows = ACT_SAMPLE_ROWS
    sample = lambda t: rows if t > rows else None

    # Gated activations and their fused FP8 quant: x [T, 2 d_ff].
    def make_act(t, d, quant=None):
        def make(torch, gen):
            x = _activations(torch, gen, t, 2 * d)
            bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
            if quant is None:
                return [x], [torch.empty(t, d, dtype=bf16, device="cuda")]
            q = torch.empty(t, d, dtype=fp8, device="cuda")
            if quant == "per_token":
                return [x], [q, torch.empty(t, 1, device="cuda")]
            if quant == "per_group":
                return [x], [q, torch.empty(d // 128, t, device="cuda")]  # [d/128, T]: column-major
            # per tensor: a calibrated static scale, the absmax of this y / 448
            g, u = x[:, :d].float(), x[:, d:].float()
            scale = ((g / (1 + torch.exp(-g)) * u).abs().amax() / 448.0).reshape(1)
            return [x, scale], [q]

        return make

    act_runs = [(op, model, t) for op in golden.ACT_OPS for model in ELEMENTWISE_ACT_MODELS for t in ELEMENTWISE_T]
    for op, model, t in act_runs:
        d = ELEMENTWISE_MODELS[model][0]
        act = golden.ACT_OPS[op]
        holder: list[Case] = []
        expected = lambda host, act=act: [ew.act_and_mul(host[0], act)]
        if act != "silu":  # gelu's tolerance has an absolute term from the data (act_tolerance)
            expected = _tolerance_from_reference(holder, lambda host, out, act=act: _gelu_tolerances(
                ew.act_tolerance(host[0], act)))(expected)
        case = Case(
            op, f"t={t},d={d},{model}", names(op), make_act(t, d), expected,
            tolerance=ew.TOLERANCE_ACT, sample_rows=sample(t), peer_tolerance=ACT_PEER_TOLERANCE,
            torch_peers=_peers_for(_eager_and_compiled(lambda torch, x, act=act: _torch_act(torch, x, act)), t),
            library_peers=peers.act_peers(op), model_bytes=ew.act_and_mul_bytes(t, d))
        holder.append(case)
        cases.append(case)

    fp8_bodies = {
        "per_token": lambda torch, x: _torch_quant(torch, _torch_act(torch, x, "silu"), "fp8"),
        "per_group": lambda torch, x: _torch_quant(torch, _torch_act(torch, x, "silu"), "fp8", 128),
        "per_tensor": lambda torch, x, s: _torch_static_fp8(torch, _torch_act(torch, x, "silu"), s),
    }
    fp8_runs = [(op, kind, model, t) for op, kind in golden.FP8_ACT_OPS.items()
                for model in ELEMENTWISE_ACT_MODELS for t in ELEMENTWISE_T]
    for op, kind, model, t in fp8_runs:
        d = ELEMENTWISE_MODELS[model][0]

        def expected(host, op=op):
            if op == "silu_and_mul_fp8_per_tensor":
                return _outputs(ew.silu_and_mul_fp8_per_tensor(host[0], host[1].view(np.float32)))
            return _outputs(golden.OPS[op].fn(host[0]))

        peer_tol = FP8_Q_PEER_TOLERANCE + ("" if kind == "per_tensor" else "/" + FP8_SCALE_PEER_TOLERANCE)
        cases.append(Case(
            op, f"t={t},d={d},{model}", names(op), make_act(t, d, kind), expected,
            tolerance=ew.TOLERANCE_FP8[kind], sample_rows=sample(t),
            cut={1: lambda a, r: a[:, :r]} if kind == "per_group" else {},
            peer_tolerance=peer_tol, torch_peers=_peers_for(_eager_and_compiled(fp8_bodies[kind]), t),
            library_peers=peers.act_peers(op), model_bytes=ew.silu_and_mul_fp8_bytes(t, d, kind)))

    # RoPE and the fused QK norm: positions [T] over the cache, q [T, Hq, D], k [T, Hk, D].
    def make_heads(t, hq, hk, d, base, norm: bool):
        def make(torch, gen):
            pos = torch.randint(0, ROPE_MAX_POS, (t,), device="cuda", generator=gen)  # int64
            q = _activations(torch, gen, t, hq * d).view(t, hq, d)
            k = _activations(torch, gen, t, hk * d).view(t, hk, d)
            cache = torch.from_numpy(_rope_cache(ROPE_MAX_POS, d, base)).to("cuda")
            outs = [torch.empty_like(q), torch.empty_like(k)]
            if not norm:
                return [pos, q, k, cache], outs
            w = [(1 + 0.25 * torch.randn(d, device="cuda", generator=gen)).to(torch.bfloat16) for _ in "qk"]
            return [pos, q, k, *w, cache], outs

        return make

    def heads_expected(host, norm: bool, r: int):
        """The reference on the first r tokens (positions are 1-D: the bench's row cut would leave
        them whole, so the reference cuts every per-token input itself)."""
        pos, q, k = host[0].view(np.int64)[:r], host[1][:r], host[2][:r]
        cache = host[-1].view(np.float32)
        if norm:
            return _outputs(ew.qk_norm_rope(pos, q, k, host[3], host[4], cache, QK_NORM_EPS))
        return _outputs(ew.rope(pos, q, k, cache))

    head_runs = [("rope", model, t) for model in ("llama3_8b", "llama3_70b") for t in ELEMENTWISE_T]
    head_runs += [("qk_norm_rope", "qwen3_8b", t) for t in ELEMENTWISE_T]
    for op, model, t in head_runs:
        _, hq, hk, d, base = ELEMENTWISE_MODELS[model]
        norm = op == "qk_norm_rope"
        holder = []
        r = min(t, rows)  # the tokens the reference computes
        if norm:  # from the reference's outputs, as the golden cases' (lkw.elementwise)
            tolerance = lambda host, out: ew.qk_norm_rope_tolerance(*out)
            torch_body = lambda torch, pos, q, k, qw, kw, cache: _torch_rope(
                torch, pos, _torch_head_rmsnorm(torch, q, qw, QK_NORM_EPS),
                _torch_head_rmsnorm(torch, k, kw, QK_NORM_EPS), cache)
            library = peers.qk_norm_rope_peers(QK_NORM_EPS, is_neox=True)
            model_bytes = ew.qk_norm_rope_bytes(t, hq, hk, d, d)
        else:  # from the heads' absmax, of the tokens checked
            tolerance = lambda host, out, r=r: ew.rope_tolerance(host[1][:r], host[2][:r])
            torch_body = _torch_rope
            library = peers.rope_peers(is_neox=True)
            model_bytes = ew.rope_bytes(t, hq, hk, d)
        expected = _tolerance_from_reference(holder, tolerance)(
            lambda host, norm=norm, r=r: heads_expected(host, norm, r))
        case = Case(
            op, f"t={t},hq={hq},hk={hk},d={d},rot={d},neox,{model}", names(op),
            make_heads(t, hq, hk, d, base, norm), expected,
            tolerance="close:0.0078125:0",  # replaced by the reference's
            sample_rows=sample(t), reference_sees_all=True, params={"is_neox": 1, **({"eps": QK_NORM_EPS} if norm else {})},
            torch_peers=_peers_for(_eager_and_compiled(torch_body), t), library_peers=library,
            shared_inputs=(len(golden.OPS[op].inputs) - 1,), model_bytes=model_bytes)
        holder.append(case)
        cases.append(case)

    # reshape_and_cache: key, value [T, Hk, D], slot_mapping [T] (, k_scale, v_scale) -> the caches.
    _, _, hk, d, _ = ELEMENTWISE_MODELS["llama3_8b"]
    for op, kv_dtype in CACHE_OPS.items():
        for layout in CACHE_LAYOUTS:
            for t in CACHE_T:
                num_blocks = -(-t // CACHE_BLOCK) * CACHE_SPREAD

                def make(torch, gen, t=t, layout=layout, kv_dtype=kv_dtype, num_blocks=num_blocks):
                    key = _activations(torch, gen, t, hk * d).view(t, hk, d)
                    value = _activations(torch, gen, t, hk * d).view(t, hk, d)
                    decode = t <= CACHE_DECODE_MAX_T  # a permutation of the slots, else of the blocks
                    order = torch.randperm(num_blocks * (CACHE_BLOCK if decode else 1), device="cuda",
                                           generator=gen)
                    slots = torch.from_numpy(cache_slots(t, order.cpu().numpy())).to(order.device)
                    inputs = [key, value, slots]
                    fp8 = kv_dtype == "float8_e4m3fn"
                    if fp8:  # per-tensor scales at the tensors' absmax / 448: nothing saturates
                        inputs += [(a.float().abs().amax() / 448.0).reshape(1) for a in (key, value)]
                    stored = np.dtype(ew.KV_DTYPES[kv_dtype])
                    bits, typed = (torch.uint8, torch.float8_e4m3fn) if fp8 else (torch.int16, torch.bfloat16)
                    shapes = ew.cache_shapes(layout, num_blocks, CACHE_BLOCK, hk, d, kv_dtype)
                    caches = [torch.full(s, int(ew.POISON[stored]), dtype=bits, device="cuda").view(typed)
                              for s in shapes]
                    return inputs, caches

                def expected(host, layout=layout, kv_dtype=kv_dtype):
                    key, value, slots = host[0], host[1], host[2].view(np.int64)
                    scales = [a.view(np.float32) for a in host[3:5]] if kv_dtype == "float8_e4m3fn" else []
                    return _outputs(ew.reshape_and_cache(key, value, host[-2], host[-1], slots, layout, *scales))

                def body(torch, *ins, layout=layout, fp8=kv_dtype == "float8_e4m3fn"):
                    key, value, slots, *rest = ins
                    scales, (kc, vc) = (rest[:2], rest[2:]) if fp8 else (None, rest)
                    _torch_cache_write(torch, key, value, slots, kc, vc, layout, scales)

                touched = ew.reshape_and_cache_bytes(t, hk, d, kv_dtype)
                cases.append(Case(
                    op, f"t={t},hk={hk},d={d},block={CACHE_BLOCK},{layout},llama3_8b", names(op), make, expected,
                    tolerance=ew.TOLERANCE_KV, params={"layout": ew.LAYOUTS.index(layout)},
                    peer_tolerance=CACHE_PEER_TOLERANCE[kv_dtype],
                    torch_peers=_peers_for(_in_place_eager_and_compiled(body, 2), t),
                    library_peers=peers.cache_peers(layout, kv_dtype), initial_outputs=True,
                    rotation_bytes=touched, model_bytes=touched))

    # qkv_rope_cache: positions [T], qkv [T, Hq + 2 Hk, D] (one QKV GEMM's output), the cos/sin
    # cache, slot_mapping [T] -> the paged BF16 caches (block 16, updated in place) and q_out: the
    # layer's rope and cache write in one pass, on both Llama models (the layer's layout).
    for model in ("llama3_8b", "llama3_70b"):
        _, hq, hk, d, base = ELEMENTWISE_MODELS[model]
        for t in ELEMENTWISE_T:
            num_blocks = -(-t // CACHE_BLOCK) * CACHE_SPREAD

            def make(torch, gen, t=t, hq=hq, hk=hk, d=d, base=base, num_blocks=num_blocks):
                pos = torch.randint(0, ROPE_MAX_POS, (t,), device="cuda", generator=gen)  # int64
                qkv = _activations(torch, gen, t, (hq + 2 * hk) * d).view(t, hq + 2 * hk, d)
                cache = torch.from_numpy(_rope_cache(ROPE_MAX_POS, d, base)).to("cuda")
                decode = t <= CACHE_DECODE_MAX_T
                order = torch.randperm(num_blocks * (CACHE_BLOCK if decode else 1), device="cuda", generator=gen)
                slots = torch.from_numpy(cache_slots(t, order.cpu().numpy())).to(order.device)
                shapes = ew.cache_shapes("paged", num_blocks, CACHE_BLOCK, hk, d, "bfloat16")
                poison = int(ew.POISON[np.dtype(np.uint16)])
                caches = [torch.full(s, poison, dtype=torch.int16, device="cuda").view(torch.bfloat16)
                          for s in shapes]
                q_out = torch.empty(t, hq, d, dtype=torch.bfloat16, device="cuda")
                return [pos, qkv, cache, slots], [*caches, q_out]

            def qkv_expected(host):
                pos, slots = host[0].view(np.int64), host[3].view(np.int64)
                return _outputs(ew.qkv_rope_cache(pos, host[1], host[2].view(np.float32), slots,
                                                  host[4], host[5], "paged"))

            holder = []
            moved = ew.qkv_rope_cache_bytes(t, hq, hk, d, d)
            case = Case(
                "qkv_rope_cache", f"t={t},hq={hq},hk={hk},d={d},rot={d},block={CACHE_BLOCK},paged,{model}",
                names("qkv_rope_cache"), make,
                _tolerance_from_reference(holder, lambda host, out, hq=hq, hk=hk: _qkv_tolerances(
                    host[1][:, : hq + hk]))(qkv_expected),
                tolerance="close:0.0078125:0",  # replaced by the reference's
                params={"layout": 0, "is_neox": 1}, reference_sees_all=True,
                torch_peers=_peers_for(_in_place_eager_and_compiled(_torch_qkv_rope_cache, 3), t),
                library_peers=peers.qkv_rope_cache_peers(), initial_outputs=True,
                shared_inputs=(2,), rotation_bytes=moved, model_bytes=moved)
            holder.append(case)
            cases.append(case)
    return cases


def _qkv_tolerances(qk_bits) -> str:
    """qkv_rope_cache's outputs (key cache, value cache, q_out): RoPE's tolerance from the query
    and key heads' absmax for the rotated ones, the values copied exactly."""
    from lkw import elementwise as ew

    rope = ew.rope_tolerance(qk_bits)
    return "/".join([rope, ew.TOLERANCE_KV, rope])


def _torch_qkv_rope_cache(torch, pos, qkv, cache, slots, kc, vc, q_out):
    """The layer's two steps in torch: RoPE of qkv's query and key heads, the query heads into
    q_out, the rotated keys and the values index_put into the paged caches."""
    hk = kc.shape[1]
    hq = qkv.shape[1] - 2 * hk
    q, k = _torch_rope(torch, pos, qkv[:, :hq], qkv[:, hq : hq + hk], cache)
    q_out.copy_(q)
    _torch_cache_write(torch, k, qkv[:, hq + hk :], slots, kc, vc, "paged")


@functools.lru_cache(maxsize=4)
def _rope_cache(max_pos: int, rot_dim: int, base: float) -> np.ndarray:
    from lkw import elementwise

    return elementwise.cos_sin_cache(max_pos, rot_dim, base)


# Chapter 06: the decode GEMV at the Llama-3-8B and -70B weight shapes (N, K), G = 128.
GEMV_SHAPES = [
    (4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672),
]
GEMV_M = (1, 2, 4, 8, 16)
GEMV_SAMPLE_ROWS = 256  # weight rows (columns of y) the reference computes
GEMV_INV_PERM = (0, 4, 1, 5, 2, 6, 3, 7)  # element e of an interleaved word sits at nibble INV[e]


def _gemv_tolerance(op: str, m: int, k: int) -> str:
    """The golden cases' tolerance (lkw.gemv.tolerance) for a sample drawn like the bench's
    inputs, with ATOL doubled: the bench checks 256 x M outputs, the sample 32 x M, and the
    statistical term takes the largest. Drawn once per (op, M, K) on the host, seed fixed."""
    from lkw import gemv, golden, int4

    rng = np.random.default_rng([m, k])
    x = formats.f32_to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    if op == "bf16_gemv":
        w = formats.f32_to_bf16((rng.standard_normal((32, k)) * 0.05).astype(np.float32))
        tol = golden.gemm_bf16_tolerance(x, w)
    else:
        words = rng.integers(0, 2**32, (32, k // 8), dtype=np.uint32)
        s = np.abs(rng.standard_normal((32, k // 128))) * 0.01 + 1e-3
        scales = int4.round_to(s, "bfloat16")
        tol = gemv.tolerance(x, gemv.w_hat(words, scales))
    rtol, atol = tol.split(":")[1:]
    return f"close:{rtol}:{2 * float(atol):.3g}"


def _torch_nibbles(torch, words, interleaved: bool):
    """int32 words [R, K/8] -> their 4-bit values [R, K] (int32), in element order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    q = (words.unsqueeze(-1) >> shifts) & 0xF  # (R,K/8,8): nibble positions
    if interleaved:
        q = q[..., list(GEMV_INV_PERM)]
    return q.reshape(words.shape[0], -1)


_PEER_ROWS = 2048  # weight rows dequantized or packed at a time by the torch peers


def _dequantized_bf16(torch, words, interleaved: bool, scales_kn):
    """W = s * (q - 8) as BF16 [N, K], one rounding (chapter 02's W_hat), from int32 words [N, K/8]
    (natural or interleaved nibble order) and scales [K/G, N] (a transposed view of chapter 06's
    [N, K/G] does as well)."""
    n, k = words.shape[0], 8 * words.shape[1]
    g = k // scales_kn.shape[0]
    w = torch.empty(n, k, dtype=torch.bfloat16, device=words.device)
    for r in range(0, n, _PEER_ROWS):
        q = _torch_nibbles(torch, words[r : r + _PEER_ROWS], interleaved)
        s = scales_kn[:, r : r + _PEER_ROWS].t().repeat_interleave(g, dim=1)
        w[r : r + _PEER_ROWS] = (q - 8).to(torch.bfloat16) * s
    return w


def _int4pack_mm_call(torch, x, words, interleaved: bool, scales_kn):
    """torch._weight_int4pack_mm (the tinygemm kernel) on the same weights: uint8 [N, K/2] with
    element 2j in the high nibble of byte j, repacked by torch._convert_weight_to_int4pack
    (innerKTiles 8), scales and zeros [K/G, N, 2]. tinygemm dequantizes (q - 8) * scale + zero
    (its zero is a mid-point offset, not GPTQ's integer zero point), so zero 0 gives s * (q - 8):
    checked on the H200 by chapter 06's peer rows, correct against the same reference."""
    n, k = words.shape[0], 8 * words.shape[1]
    g = k // scales_kn.shape[0]
    packed = torch.empty(n, k // 2, dtype=torch.uint8, device=x.device)
    for r in range(0, n, _PEER_ROWS):
        q = _torch_nibbles(torch, words[r : r + _PEER_ROWS], interleaved)
        packed[r : r + _PEER_ROWS] = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8)
    w_int4 = torch._convert_weight_to_int4pack(packed, 8)
    scales_and_zeros = _int4pack_scales_and_zeros(torch, scales_kn)
    return lambda: torch._weight_int4pack_mm(x, w_int4, g, scales_and_zeros)


def _int4pack_scales_and_zeros(torch, scales_kn):
    """tinygemm's qScaleAndZeros [K/G, N, 2]: [..., 0] the scale, [..., 1] the zero (0 here)."""
    return torch.stack([scales_kn, torch.zeros_like(scales_kn)], dim=-1).contiguous()


def _torch_matmul_peer(torch, inputs):
    """x @ W^T with W dequantized to BF16 once, untimed (s * (q - 8), one rounding: chapter 02's
    W_hat): cuBLAS on BF16 weights, what running without the INT4 kernel costs."""
    x, words, scales = inputs
    w = _dequantized_bf16(torch, words, True, scales.t())
    return lambda: x @ w.T


def _torch_int4pack_peer(torch, inputs):
    """torch._weight_int4pack_mm on chapter 06's interleaved words (_int4pack_mm_call)."""
    x, words, scales = inputs
    return _int4pack_mm_call(torch, x, words, True, scales.t())


def int4_gemv_cases() -> list[Case]:
    """Chapter 06's ops at GEMV_SHAPES x GEMV_M, and the cuBLAS BF16 peer's op at the same shapes
    (shape strings identical across ops, so peers match up). Inputs: x ~ N(0, 1), random words,
    scales |N(0, 1)| * 0.01 + 1e-3. The reference computes GEMV_SAMPLE_ROWS columns of y from
    that many weight rows (y is [M, N]: the bench's row sampling would cut x, so the reference
    sees every input and cuts W itself; int4t_gemv's tiled words cut at whole tiles of 16 rows are
    the tiled layout of those rows). int4i_gemv carries the peers: torch's, and vLLM's Marlin and
    Machete, each on the same q packed by its own packer (lkw.peers.gemv_peers); every INT4 op is
    compared with them (PEER_OPS). int4t_gemv's sets rotate past the weights
    (Case.rotate_past_largest: its final versions copy them evict_first)."""
    from lkw import gemv, golden

    g = 128
    rows = GEMV_SAMPLE_ROWS

    def make_for(op, m, n, k):
        def make(torch, gen):
            dev = {"device": "cuda", "generator": gen}
            x = torch.randn(m, k, **dev).to(torch.bfloat16)
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            if op == "bf16_gemv":
                return [x, (torch.randn(n, k, **dev) * 0.05).to(torch.bfloat16)], [y]
            # Random words are random in any order: int4t_gemv's need only the padded shape.
            wshape = gemv.tiled_shape(n, k) if op == "int4t_gemv" else (n, k // 8)
            words = torch.randint(-(2**31), 2**31 - 1, wshape, dtype=torch.int32, **dev)
            scales = (torch.randn(n, k // g, **dev).abs() * 0.01 + 1e-3).to(torch.bfloat16)
            inputs = [x, words, scales]
            if op == "int4i_zp_gemv":
                zshape = (n, k // g // 8)
                inputs.append(torch.randint(-(2**31), 2**31 - 1, zshape, dtype=torch.int32, **dev))
            return inputs, [y]

        return make

    def expected_for(op):
        def expected(x):
            if op == "bf16_gemv":
                return [gemv.bf16_gemv(x[0], x[1][:rows])]
            return [golden.OPS[op].fn(x[0], *(a[:rows] for a in x[1:]))]

        return expected

    torch_peers = {"torch_matmul": _torch_matmul_peer, "torch_int4pack_mm": _torch_int4pack_peer}
    production = peers.gemv_peers(interleaved=True, nibbles=_torch_nibbles)
    tolerances: dict[tuple, str] = {}
    cases = []
    for op in (*golden.GEMV_OPS, "bf16_gemv"):
        names = [*golden.OPS[op].inputs, *golden.OPS[op].outputs]
        kind = "bf16" if op == "bf16_gemv" else "int4"
        for n, k in GEMV_SHAPES:
            for m in GEMV_M:
                if (kind, m, k) not in tolerances:
                    tolerances[kind, m, k] = _gemv_tolerance(op, m, k)
                cases.append(Case(
                    op, f"m={m},n={n},k={k},g={g}", names, make_for(op, m, n, k), expected_for(op),
                    tolerance=tolerances[kind, m, k], sample_rows=rows,
                    cut={0: lambda a, r: a[:, :r]}, reference_sees_all=True,
                    torch_peers=torch_peers if op == "int4i_gemv" else {},
                    library_peers=production if op == "int4i_gemv" else {},
                    rotate_past_largest=op == "int4t_gemv"))
    return cases


# Chapter 07: the W4A16 GEMM at the Llama-3-70B MLP shapes (N, K) and M from decode to prefill,
# G = 128. The default run; the rest of the matrix is EXTENDED (tools/bench.py --extended).
W4A16_SHAPES = [(28672, 8192), (8192, 28672)]
W4A16_WIDER_SHAPES = [(14336, 4096), (4096, 14336)]
W4A16_M = (1, 16, 64, 256, 1024, 4096)
# The rest of the chapter's matrix (--extended): Llama-3-70B's attention output shape, the Llama-3-8B
# MLP and attention shapes, and the M between the default ones.
W4A16_EXTENDED_SHAPES = [(10240, 8192), *W4A16_WIDER_SHAPES, (6144, 4096)]
W4A16_EXTENDED_M = (32, 128, 512)
W4A16_G = 128
W4A16_SAMPLE_ROWS = 64  # rows of x (of y) the reference computes
# torch's tinygemm is a decode kernel: 65 ms a call at M = 4096, N = 28672, K = 8192 on the H200
# (about 16 s of timed calls per case), measured up to this M only.
W4A16_INT4PACK_MAX_M = 1024
W4A16_OPS = ("w4a16_gemm", "w4a16r_gemm")
# Chapter 06's final GEMV, measured as a peer at the M it owns (M <= 16) on the same q and scales
# in its own layout (interleaved nibbles, tiled: lkw.gemv.tile_weights; scales [N, K/G]).
W4A16_GEMV_PEER = "06_int4_gemv/int4t_gemv/v7_tiled_stream"
W4A16_GEMV_PEER_NAME = "ch06 int4t_gemv v7_tiled_stream"
W4A16_GEMV_MAX_M = 16
W4A16_DTYPES = ["bfloat16", "uint32", "bfloat16", "bfloat16"]  # x, w, scales -> y
_BLOCK_N, _STEP_K = 64, 16  # lkw.w4a16.BLOCK_N, STEP_K: the repacked layout's block and k step
_REF_ELEMENTS = 1 << 25  # weights dequantized at a time (float64) by the GPU reference


def _torch_pack(torch, q, interleaved: bool):
    """4-bit values [..., W, 8] (element order) -> int32 words [..., W]; interleaved: element e
    at nibble GEMV_INV_PERM[e] (lkw.int4.pack)."""
    nibbles = GEMV_INV_PERM if interleaved else range(8)
    shifts = torch.tensor([4 * p for p in nibbles], dtype=torch.int64, device=q.device)
    words = (q.to(torch.int64) << shifts).sum(dim=-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _repack_rows(k: int) -> int:
    """Weight rows (a multiple of 64) repacked at a time: about 16 M nibbles."""
    return _BLOCK_N * max(1, (1 << 24) // (_BLOCK_N * k))


def _torch_repack(torch, words):
    """lkw.w4a16.repack on the GPU: natural int32 words [N, K/8] -> the mma fragment layout
    [N/64, 8K] (the same reshape and transpose of q, the same interleaved packing)."""
    n, k = words.shape[0], 8 * words.shape[1]
    if n % _BLOCK_N or k % _STEP_K:
        raise ValueError(f"repack needs N % {_BLOCK_N} == 0 and K % {_STEP_K} == 0: N = {n}, K = {k}")
    out = torch.empty(n // _BLOCK_N, 8 * k, dtype=torch.int32, device=words.device)
    rows = _repack_rows(k)
    for r in range(0, n, rows):
        q = _torch_nibbles(torch, words[r : r + rows], interleaved=False).to(torch.uint8)  # (R,K)
        b = q.shape[0] // _BLOCK_N
        q = q.reshape(b, 4, 2, 8, k // _STEP_K, 2, 4, 2)  # (nb,w,h,r,ks,p,c,j)
        fragments = q.permute(0, 4, 3, 6, 1, 2, 5, 7).reshape(b, 8 * k, 8)  # (nb,ks,r,c,w,h,p,j)
        out[r // _BLOCK_N : r // _BLOCK_N + b] = _torch_pack(torch, fragments, interleaved=True)
    return out


def _torch_unrepack(torch, repacked, n: int, k: int):
    """lkw.w4a16.unrepack on the GPU: [N/64, 8K] -> natural int32 words [N, K/8]."""
    if tuple(repacked.shape) != (n // _BLOCK_N, 8 * k) or n % _BLOCK_N or k % _STEP_K:
        raise ValueError(f"repacked weights for N = {n}, K = {k} must be [{n // _BLOCK_N}, {8 * k}] words")
    out = torch.empty(n, k // 8, dtype=torch.int32, device=repacked.device)
    blocks = _repack_rows(k) // _BLOCK_N
    for b0 in range(0, n // _BLOCK_N, blocks):
        f = _torch_nibbles(torch, repacked[b0 : b0 + blocks], interleaved=True).to(torch.uint8)  # (b,64K)
        b = f.shape[0]
        q = f.reshape(b, k // _STEP_K, 8, 4, 4, 2, 2, 2).permute(0, 4, 5, 2, 1, 6, 3, 7)  # (nb,w,h,r,ks,p,c,j)
        out[b0 * _BLOCK_N : (b0 + b) * _BLOCK_N] = _torch_pack(torch, q.reshape(b * _BLOCK_N, k // 8, 8), False)
    return out


def _w4a16_reference(torch, x_bits: np.ndarray, words, scales_bits: np.ndarray) -> tuple[np.ndarray, str]:
    """lkw.w4a16.w4a16_gemm and lkw.w4a16.tolerance on the GPU, for the rows of x given: y bits
    uint16 [rows, N] and the tolerance of exactly these x and W_hat.

    The same computation as the host references: W_hat = s * (q - 8) exact in float64 (natural
    int32 words [N, K/8] on the GPU, scale bits [K/G, N]), x . W_hat^T in float64 (cuBLAS DGEMM:
    another order of float64 sums than numpy's, far below a BF16 ulp), one rounding to BF16 on the
    host (lkw.formats.f64_to_bf16); the tolerance is lkw.gemv.tolerance's formula
    (gemv.tolerance_from_maxima) on its two maxima, computed alongside. On the host W_hat alone would be
    1.9 GB at 28672 x 8192, so the GPU does it in slices of _REF_ELEMENTS weights."""
    from lkw import formats, gemv

    def bf16_to_f64(bits):
        t = torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).to(words.device)
        return t.view(torch.bfloat16).to(torch.float64)

    x = bf16_to_f64(x_bits)  # (rows,K)
    s = bf16_to_f64(scales_bits)  # (K/G,N)
    n, k = words.shape[0], 8 * words.shape[1]
    g = k // s.shape[0]
    y = torch.empty(x.shape[0], n, dtype=torch.float64, device=words.device)
    x_sq, x_abs = x * x, x.abs()
    walk_sq = abs_sum = 0.0
    step = max(1, _REF_ELEMENTS // k)
    for r in range(0, n, step):
        q = _torch_nibbles(torch, words[r : r + step], interleaved=False).to(torch.float64)
        w = (q - 8) * s[:, r : r + step].t().repeat_interleave(g, dim=1)  # (step,K)
        y[:, r : r + step] = x @ w.t()
        walk_sq = max(walk_sq, float((x_sq @ (w * w).t()).max()))
        abs_sum = max(abs_sum, float((x_abs @ w.abs().t()).max()))
        del q, w
    return formats.f64_to_bf16(y.cpu().numpy()), gemv.tolerance_from_maxima(walk_sq, abs_sum, k)


def _w4a16_matmul_peer(torch, inputs):
    """cuBLAS BF16: torch.matmul(x, W_bf16^T), W_bf16 = s * (q - 8) rounded once to BF16 [N, K],
    made once, untimed: what running without the INT4 kernel costs."""
    x, words, scales = inputs
    w = _dequantized_bf16(torch, words, False, scales)
    return lambda: torch.matmul(x, w.t())


def _w4a16_int4pack_peer(torch, inputs):
    """torch._weight_int4pack_mm on the natural words (_int4pack_mm_call)."""
    x, words, scales = inputs
    return _int4pack_mm_call(torch, x, words, False, scales)


def _torch_tiled_gemv_words(torch, words):
    """Natural int32 words [N, K/8] -> chapter 06's int4t_gemv layout on the GPU: each word's
    nibbles in the interleaved order (lkw.int4.interleave), then tiles of 16 rows by steps of 32
    words, the padding zero (lkw.gemv.tile_weights)."""
    from lkw import gemv

    n, kw = words.shape
    rows, cols = gemv.tiled_shape(n, 8 * kw)
    padded = torch.zeros(rows, cols, dtype=torch.int32, device=words.device)
    for r in range(0, n, _PEER_ROWS):
        q = _torch_nibbles(torch, words[r : r + _PEER_ROWS], interleaved=False)  # (R,K)
        padded[r : r + q.shape[0], :kw] = _torch_pack(torch, q.reshape(q.shape[0], kw, 8), interleaved=True)
    tiles, steps = rows // gemv.TILE_ROWS, cols // gemv.STEP_WORDS
    blocks = padded.view(tiles, gemv.TILE_ROWS, steps, gemv.STEP_WORDS).permute(0, 2, 1, 3)
    return blocks.contiguous().view(rows, cols)


def _w4a16_gemv_peer(torch, inputs):
    """Chapter 06's final GEMV (W4A16_GEMV_PEER, launched through the registry on the current
    stream, so a CUDA graph captures it) on the case's q and scales, repacked untimed into its
    layout (_torch_tiled_gemv_words, scales transposed to [N, K/G]). Absent where the extension
    was built without chapter 06."""
    from lkw import golden

    if not any(v["name"] == W4A16_GEMV_PEER for v in ext().versions()):
        raise peers.Absent(f"{W4A16_GEMV_PEER} is not in this build of lkw._ext (chapter 06 not built)")
    x, words, scales = inputs
    tiled, scales_nk = _torch_tiled_gemv_words(torch, words), scales.t().contiguous()
    y = torch.empty(x.shape[0], scales.shape[1], dtype=torch.bfloat16, device=x.device)
    ins, outs = _raw([x, tiled, scales_nk]), _raw([y])
    dtypes = [*golden.OPS["int4t_gemv"].inputs, *golden.OPS["int4t_gemv"].outputs]

    def call():
        ext().launch(W4A16_GEMV_PEER, ins, outs, dtypes=dtypes, stream=torch.cuda.current_stream().cuda_stream)
        return (y,)

    return peers.PeerCall(call, summary=f"{W4A16_GEMV_PEER} (the registry), on its tiled layout")


def w4a16_model(m: int, n: int, k: int, g: int) -> tuple[int, int]:
    """(bytes, FLOPs) of y = x . W^T: the INT4 weights, their BF16 scales, x and y once each."""
    return n * k // 2 + n * (k // g) * 2 + m * k * 2 + m * n * 2, 2 * m * n * k


def w4a16_gemm_cases(shapes=None, ms=None) -> list[Case]:
    """Chapter 07's ops at W4A16_SHAPES x W4A16_M (shape strings identical across the two ops, so
    that the peers, measured under w4a16_gemm, meet w4a16r_gemm too: PEER_OPS). Inputs: x ~ N(0, 1)
    [M, K], random words [N, K/8] (natural; w4a16r_gemm: the same words repacked on the GPU,
    _torch_repack), scales |N(0, 1)| * 0.01 + 1e-3 [K/G, N]; the weights are drawn first, so every M
    of a shape has the same weights. The reference computes W4A16_SAMPLE_ROWS rows of y (all where
    M is smaller) on the GPU (_w4a16_reference; for w4a16r_gemm from the unrepacked words), and sets
    the case's tolerance to lkw.w4a16.tolerance of exactly those rows and weights: W has N rows,
    which may equal M, so the reference sees every input and cuts x itself. Peers: cuBLAS on BF16
    weights and torch's INT4 kernel (torch_peers; the latter up to W4A16_INT4PACK_MAX_M), Marlin,
    Machete and humming (lkw.peers.w4a16_peers), each on the same q and scales packed by its own
    packer; at M <= W4A16_GEMV_MAX_M also chapter 06's final GEMV (_w4a16_gemv_peer), the kernel
    that owns those M. With a tensor peak recorded (results.tensor_peak), run_chapter gives every
    row its % of it."""
    shapes = W4A16_SHAPES if shapes is None else shapes
    ms = W4A16_M if ms is None else ms
    g = W4A16_G

    def make_for(op, m, n, k):
        def make(torch, gen):
            dev = {"device": "cuda", "generator": gen}
            words = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, **dev)
            scales = (torch.randn(k // g, n, **dev).abs() * 0.01 + 1e-3).to(torch.bfloat16)
            x = torch.randn(m, k, **dev).to(torch.bfloat16)
            if op == "w4a16r_gemm":
                words = _torch_repack(torch, words)
            return [x, words, scales], [torch.empty(m, n, dtype=torch.bfloat16, device="cuda")]

        return make

    def expected_for(op, n, k, holder):
        def expected(host):
            import torch

            x_bits, w_bits, s_bits = host
            words = torch.from_numpy(np.ascontiguousarray(w_bits).view(np.int32)).to("cuda")
            if op == "w4a16r_gemm":
                words = _torch_unrepack(torch, words, n, k)
            y, tol = _w4a16_reference(torch, x_bits[:W4A16_SAMPLE_ROWS], words, s_bits)
            holder[0].tolerance = tol  # the tolerance of the data checked, for versions and peers
            return [y]

        return expected

    torch_peers = {"torch_matmul": _w4a16_matmul_peer, "torch_int4pack_mm": _w4a16_int4pack_peer}
    production = peers.w4a16_peers()

    def torch_peers_at(m):
        at = {k: v for k, v in torch_peers.items() if k != "torch_int4pack_mm" or m <= W4A16_INT4PACK_MAX_M}
        if m <= W4A16_GEMV_MAX_M:
            at[W4A16_GEMV_PEER_NAME] = _w4a16_gemv_peer
        return at

    cases = []
    for n, k in shapes:
        for op in W4A16_OPS:
            for m in ms:
                model_bytes, flops = w4a16_model(m, n, k, g)
                holder: list[Case] = []
                case = Case(
                    op, f"m={m},n={n},k={k},g={g}", list(W4A16_DTYPES), make_for(op, m, n, k),
                    expected_for(op, n, k, holder),
                    # Replaced by the reference with the tolerance of the data it checks.
                    tolerance="close:0.016:0",
                    sample_rows=W4A16_SAMPLE_ROWS if m > W4A16_SAMPLE_ROWS else None,
                    reference_sees_all=True,
                    torch_peers=torch_peers_at(m) if op == "w4a16_gemm" else {},
                    library_peers=production if op == "w4a16_gemm" else {},
                    model_bytes=model_bytes, flops=flops)
                holder.append(case)
                cases.append(case)
    return cases


# Chapter 08: the W8A8 FP8 GEMM, y [M, N] BF16 = (A . s_a)(B . s_b)^T with A [M, K] and B [N, K]
# in E4M3 and the granularity named by the scale shapes (lkw.fp8_gemm): op fp8_gemm for tensor
# and rowwise scales (every version), fp8_gemm_blockwise for blockwise ones (v4 on). 8192^3 at
# every granularity, 4096^3 blockwise, and DeepSeek-V3's dense projections (N, K) -- fused
# q_a/kv_a, q_b, kv_b, o, the shared expert's gate_up and down -- at decode-batch and prefill M,
# blockwise (its recipe) and, for three of them, rowwise.
FP8_SQUARE = ((8192, "tensor"), (8192, "rowwise"), (8192, "blockwise"), (4096, "blockwise"))
FP8_DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
FP8_DEEPSEEK_M = (64, 128, 4096)
FP8_ROWWISE_NK = ((2112, 7168), (24576, 1536), (7168, 16384))
FP8_ROWWISE_M = (64, 4096)
# Decode: Llama-3-8B's projections (fused QKV, O, fused gate-up, down: chapter 11's FP8 layer) at
# the M where v6's GEMV (one, two, four 8-token tiles) meets v5, blockwise; and at the layer's
# prefill (T = 2048 tokens).
FP8_DECODE_NK = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
FP8_DECODE_M = (1, 8, 16, 32)
FP8_PREFILL_M = (2048,)
FP8_SAMPLE_ROWS = 64  # rows of A (of y) the reference computes
FP8_DTYPES = ["float8_e4m3fn", "float8_e4m3fn", "float32", "float32", "bfloat16"]  # A, B, s_a, s_b -> y
FP8_CODE_SPREAD = 16.0  # E4M3 codes drawn as N(0, 16^2): mostly binades 2^0 .. 2^6, far below 448


def fp8_op(granularity: str) -> str:
    """The op of a granularity: blockwise scales act inside the K loop, the others after it."""
    return "fp8_gemm_blockwise" if granularity == "blockwise" else "fp8_gemm"


def fp8_shape(m: int, n: int, k: int, granularity: str) -> str:
    """The bench shape string; the granularity in it lets --shape 'scale=block' pick a part."""
    return f"m={m},n={n},k={k},scale={granularity}"


def fp8_sample_reference(host: list[np.ndarray], granularity: str, rows: int) -> list[np.ndarray]:
    """lkw.fp8_gemm.fp8_gemm on the first `rows` rows of A and their scales (host bits as the
    bench copies them: E4M3 codes uint8, scales FP32 as uint32) against the whole of B."""
    from lkw import fp8_gemm

    a, b = host[0][:rows], host[1]
    s_a, s_b = host[2].view(np.float32), host[3].view(np.float32)
    if granularity == "rowwise":
        s_a = s_a[:rows]  # (rows,1)
    elif granularity == "blockwise":
        s_a = np.ascontiguousarray(s_a[:, :rows])  # (K/128,rows): column-major, M contiguous
    return [fp8_gemm.fp8_gemm(a, b, s_a, s_b, granularity)]


def _fp8_make(m: int, n: int, k: int, granularity: str):
    """make(torch, gen): E4M3 codes of N(0, FP8_CODE_SPREAD^2) values (random signs: the
    products error_bound covers; nothing saturated), positive scales 2^u, u uniform in [-10, -6]
    (the magnitude of s = absmax / 448 on unit data), in the op's shapes and layouts."""
    from lkw import fp8_gemm

    def make(torch, gen):
        dev = {"device": "cuda", "generator": gen}

        def codes(rows):
            x = torch.randn(rows, k, **dev) * FP8_CODE_SPREAD
            return x.clamp_(-448, 448).to(torch.float8_e4m3fn)

        def scales(shape):
            return torch.exp2(torch.rand(shape, **dev) * 4 - 10)

        shape_a, shape_b = fp8_gemm.scale_shapes(m, n, k, granularity)
        inputs = [codes(m), codes(n), scales(shape_a), scales(shape_b)]
        return inputs, [torch.empty(m, n, dtype=torch.bfloat16, device="cuda")]

    return make


def _fp8_dequant_bf16(torch, q, s, granularity: str, operand: str):
    """A_hat or B_hat [rows, K] in BF16: the E4M3 codes times their scales in FP32, rounded once
    to BF16 (a 4-bit significand times a 24-bit scale does not fit BF16's 8 bits)."""
    rows, k = q.shape
    x = q.float()
    if granularity != "blockwise":
        return (x * s).to(torch.bfloat16)  # s (1,) or (rows,1)
    if operand == "a":
        per_block = s.t()  # (M,K/128)
    else:
        per_block = s.repeat_interleave(128, dim=0)[:rows]  # (N,K/128)
    return (x.view(rows, k // 128, 128) * per_block[:, :, None]).view(rows, k).to(torch.bfloat16)


def _fp8_cublas_bf16_peer(granularity: str):
    """cuBLAS BF16 on A_hat and B_hat dequantized once (untimed): what the GEMM costs at 16 bits."""

    def factory(torch, inputs):
        a, b, s_a, s_b = inputs
        a_hat = _fp8_dequant_bf16(torch, a, s_a, granularity, "a")
        b_hat = _fp8_dequant_bf16(torch, b, s_b, granularity, "b")
        return lambda: torch.mm(a_hat, b_hat.t())

    return factory


def _scaling_type(torch, *names):
    """torch.nn.functional.ScalingType's member under the first of `names` it has (the spelling
    changed between releases), or None."""
    enum = getattr(torch.nn.functional, "ScalingType", None)
    return next((getattr(enum, name) for name in names if enum is not None and hasattr(enum, name)), None)


def _torch_blockwise_call(torch, a, b, s_a, s_b):
    """cuBLASLt's 1 x 128 by 128 x 128 FP8 GEMM through torch, where this torch has it: the
    scaled_mm API with explicit recipes, else _scaled_mm reading the recipe from the scale
    shapes. Both take s_a as [M, K/128] with M contiguous (our [K/128, M] transposed:
    the same bytes) and the weight scales against B^T, [K/128, N/128]. Each is tried once; none
    working raises peers.Absent with what each said."""
    f = torch.nn.functional
    sa, sb = s_a.t(), s_b.t()  # (M,K/128) M-major; (K/128,ceil(N/128))
    tries = []
    one_by = _scaling_type(torch, "BlockWise1x128", "Blockwise_1x128")
    block_by = _scaling_type(torch, "BlockWise128x128", "Blockwise_128x128")
    if hasattr(f, "scaled_mm") and one_by is not None and block_by is not None:
        tries.append(("torch.nn.functional.scaled_mm", lambda: f.scaled_mm(
            a, b.t(), sa, one_by, sb, block_by, output_dtype=torch.bfloat16)))
    tries.append(("torch._scaled_mm", lambda: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)))
    errors = []
    for name, call in tries:
        try:
            call()
            torch.cuda.synchronize()
            return call
        except Exception as e:  # noqa: BLE001  (an API this torch lacks: try the next, say why)
            errors.append(f"{name}: {peers._first_line(e)}")
    raise peers.Absent(f"torch {torch.__version__} runs no blockwise FP8 GEMM here ({'; '.join(errors)})")


def _fp8_scaled_mm_peer(granularity: str, fast_accum: bool = False):
    """torch._scaled_mm (cuBLASLt): per tensor (scalar scales), per row (s_a [M, 1], s_b [1, N]),
    both with a BF16 output; fast_accum lets the tensor core accumulate the whole K, as v0 to v3
    do (without it cuBLASLt promotes). Blockwise: _torch_blockwise_call."""

    def factory(torch, inputs):
        a, b, s_a, s_b = inputs
        if granularity == "blockwise":
            return _torch_blockwise_call(torch, a, b, s_a, s_b)
        sb = s_b if granularity == "tensor" else s_b.reshape(1, -1)  # (1,) or (1,N)
        return lambda: torch._scaled_mm(a, b.t(), scale_a=s_a, scale_b=sb, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast_accum)

    return factory


def fp8_gemm_case(m: int, n: int, k: int, granularity: str) -> Case:
    """fp8_gemm at one shape and granularity: inputs made on the GPU (_fp8_make), the reference on
    FP8_SAMPLE_ROWS rows of A (fp8_sample_reference: float64, rounded once to BF16), checked with
    lkw.golden's frob bound of the granularity (the tensor core's whole-K accumulation for tensor
    and rowwise scales, 128-k promotion for blockwise); the peers at twice that bound (cuBLAS BF16
    rounds A_hat and B_hat to BF16; a production kernel may keep the whole K in the tensor core).
    Peers: cuBLASLt through torch, cuBLAS BF16, vLLM's CUTLASS and FlashInfer's DeepGEMM
    (lkw.peers.fp8_gemm_peers)."""
    from lkw import fp8_gemm, golden

    rows = min(m, FP8_SAMPLE_ROWS)
    bound = float(golden.fp8_gemm_tolerance(k, granularity)[len("frob:"):])
    torch_peers = {"torch_scaled_mm": _fp8_scaled_mm_peer(granularity)}
    if granularity != "blockwise":
        torch_peers["torch_scaled_mm_fast_accum"] = _fp8_scaled_mm_peer(granularity, fast_accum=True)
    torch_peers["cublas_bf16"] = _fp8_cublas_bf16_peer(granularity)
    model_bytes, flops = fp8_gemm.model(m, n, k, granularity)
    return Case(
        fp8_op(granularity), fp8_shape(m, n, k, granularity), list(FP8_DTYPES), _fp8_make(m, n, k, granularity),
        lambda host: fp8_sample_reference(host, granularity, rows),
        tolerance=golden.fp8_gemm_tolerance(k, granularity),
        sample_rows=FP8_SAMPLE_ROWS if m > FP8_SAMPLE_ROWS else None,
        # B may have as many rows as A (8192^3): the reference cuts A and s_a itself.
        reference_sees_all=True,
        params={"a_scales_row_major": 0} if granularity == "blockwise" else {},
        torch_peers=torch_peers, library_peers=peers.fp8_gemm_peers(granularity),
        peer_tolerance=f"frob:{golden.round_up(2 * bound)}",
        model_bytes=model_bytes, flops=flops)


def fp8_gemm_cases() -> list[Case]:
    shapes = [(s, s, s, g) for s, g in FP8_SQUARE]
    shapes += [(m, n, k, "blockwise") for n, k in FP8_DEEPSEEK_NK for m in FP8_DEEPSEEK_M]
    shapes += [(m, n, k, "rowwise") for n, k in FP8_ROWWISE_NK for m in FP8_ROWWISE_M]
    shapes += [(m, n, k, "blockwise") for n, k in FP8_DECODE_NK for m in FP8_DECODE_M + FP8_PREFILL_M]
    return [fp8_gemm_case(*shape) for shape in shapes]


# Chapter 09: MoE routing, at the routing shapes of Mixtral-8x7B (E 8, k 2), Qwen3-30B-A3B (E 128,
# k 8) and DeepSeek-V3 (E 256, k 8), BLOCK_M 64.
MOE_MODELS = {"mixtral": (8, 2), "qwen3": (128, 8), "deepseek": (256, 8)}
MOE_T = (1, 16, 128, 1024, 4096, 16384)
MOE_ROUTER_T = (1, 16, 128, 1024, 4096, 16384)
# The skewed routings (Zipf, all-to-one) of the align: every model at a decode, a mid and a
# prefill T (uniform routing runs at every MOE_T).
MOE_SKEWED_T = (16, 1024, 4096)
MOE_SKEWED = ("zipf", "one")
MOE_BLOCK_M = 64
MOE_MAX_SETS = 64  # Case.max_sets: below T = 4096 (E 256) the routing data stays in L2


def _torch_routing(torch, gen, t: int, e: int, k: int, dist: str):
    """topk_ids int32 [T, k] on the GPU, k distinct experts per token (lkw.moe.routing_ids's
    distributions: uniform k-subsets; Zipf through the Gumbel top-k trick; "one": experts 0..k-1)."""
    from lkw import moe

    if dist == "one":
        return torch.arange(k, dtype=torch.int32, device="cuda").repeat(t, 1)
    keys = -torch.log(-torch.log(torch.rand(t, e, device="cuda", generator=gen)))  # Gumbel
    if dist == "zipf":
        keys -= moe.ZIPF_EXPONENT * torch.log(torch.arange(1, e + 1, device="cuda", dtype=torch.float32))
    return keys.topk(k, dim=1).indices.to(torch.int32)


def _torch_align(torch, ids, e: int, block_m: int, cap: int):
    """The align in torch (the issue's "argsort + bincount" path): a stable sort of the slots by
    expert, each slot's row = its expert's run start + its rank in the run; graph-capturable (no
    output size depends on the data: a scatter-add counts, where bincount would ask the host)."""
    flat = ids.flatten().long()
    s = flat.numel()
    counts = torch.zeros(e, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    rows = starts[expert] + torch.arange(s, device=ids.device) - first[expert]
    sorted_ids = torch.full((cap,), s, dtype=torch.int32, device=ids.device)
    sorted_ids[rows] = order.to(torch.int32)
    ends = torch.cumsum(padded, 0) // block_m  # (E,) block index where each run ends
    blocks = torch.arange(cap // block_m, device=ids.device)
    expert_ids = torch.searchsorted(ends, blocks, right=True)
    expert_ids = torch.where(expert_ids < e, expert_ids, -1).to(torch.int32)
    return sorted_ids, expert_ids, padded.sum().to(torch.int32).reshape(1)


def _torch_topk_softmax(torch, logits, k: int, renormalize: bool):
    w, i = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, i.to(torch.int32)


def moe_cases() -> list[Case]:
    """Chapter 09's routing ops. moe_align_block_size at MOE_T tokens for every model, uniform
    routing, and Zipf-skewed and all-to-one (MOE_SKEWED) at MOE_SKEWED_T for every model;
    check_ids = 0 (the launch stays asynchronous, as a decoder's graph needs). topk_softmax and
    topk_softmax_bf16 (FP32 or BF16 logits, a row's values distinct and 1/32 apart, exact in
    BF16 too, so that the ids are exact on every side) at MOE_ROUTER_T for every model,
    renormalized. Peers: torch eager (and compiled at prefill sizes for the top-k; the BF16
    logits' softmax in FP32, as engines take it), vLLM's kernels (peers.moe_peers)."""
    from lkw import golden, moe

    cases = []
    align_runs = [(name, t, "uniform") for name in MOE_MODELS for t in MOE_T]
    align_runs += [(name, t, dist) for dist in MOE_SKEWED for name in MOE_MODELS for t in MOE_SKEWED_T]
    for name, t, dist in align_runs:
        e, k = MOE_MODELS[name]
        bm = MOE_BLOCK_M
        cap = moe.capacity(t * k, e, bm)

        def make(torch, gen, t=t, e=e, k=k, dist=dist, cap=cap, bm=bm):
            ids = _torch_routing(torch, gen, t, e, k, dist)
            empty = lambda n: torch.empty(n, dtype=torch.int32, device="cuda")
            return [ids], [empty(cap), empty(cap // bm), empty(1)]

        def expected(host, e=e, bm=bm):
            sorted_ids, expert_ids, n_post = moe.moe_align_block_size(host[0].view(np.int32), e, bm)
            return [sorted_ids.view(np.uint32), expert_ids.view(np.uint32),
                    np.array([n_post], np.int32).view(np.uint32)]

        def torch_align(torch, inputs, e=e, bm=bm, cap=cap):
            return lambda: _torch_align(torch, inputs[0], e, bm, cap)

        cases.append(Case(
            "moe_align_block_size", f"t={t},e={e},k={k},block_m={bm},{dist}",
            ["int32", "int32", "int32", "int32"], make, expected,
            tolerance=golden.align_tolerance(bm),
            params={"num_experts": e, "block_m": bm, "check_ids": 0}, max_sets=MOE_MAX_SETS,
            torch_peers={"torch_eager": torch_align},
            library_peers=peers.moe_peers("moe_align_block_size", num_experts=e, block_m=bm)))
    for op, dtype in (("topk_softmax", "float32"), ("topk_softmax_bf16", "bfloat16")):
        bf16 = dtype == "bfloat16"
        for e, k in MOE_MODELS.values():
            for t in MOE_ROUTER_T:

                def make(torch, gen, t=t, e=e, k=k, bf16=bf16):
                    # Distinct levels in a row, 1/32 apart: no tie (torch's top-k breaks ties its
                    # own way) and no decision that an FP32 rounding can turn; (level - E/2)/32 has
                    # at most 8 significant bits for E <= 256, so BF16 holds it exactly.
                    levels = torch.argsort(torch.rand(t, e, device="cuda", generator=gen), dim=1)
                    logits = (levels - e // 2).to(torch.float32) / 32
                    return [logits.to(torch.bfloat16) if bf16 else logits], [
                        torch.empty(t, k, dtype=torch.float32, device="cuda"),
                        torch.empty(t, k, dtype=torch.int32, device="cuda")]

                def expected(host, k=k, bf16=bf16):
                    x = formats.bf16_to_f32(host[0]) if bf16 else host[0].view(np.float32)
                    w, i = moe.topk_softmax(x, k, renormalize=True)
                    return [w.astype(np.float32).view(np.uint32), i.astype(np.int32).view(np.uint32)]

                body = lambda torch, x, k=k: _torch_topk_softmax(torch, x.float(), k, True)
                cases.append(Case(
                    op, f"t={t},e={e},k={k}", [dtype, "float32", "int32"], make, expected,
                    tolerance=golden.router_tolerance(e, k, False),
                    params={"k": k, "renormalize": 1}, max_sets=MOE_MAX_SETS,
                    torch_peers=_peers_for(_eager_and_compiled(body), t),
                    library_peers=peers.moe_peers(op, k=k, renormalize=True)))
    cases += deepseek_router_cases()
    return cases


DEEPSEEK_ROUTER = {"k": 8, "n_group": 8, "topk_group": 4, "renormalize": 1, "routed_scaling_factor": 2.5}


DEEPSEEK_ROUTER_E = 256


@functools.lru_cache(maxsize=1)
def _deepseek_router_inputs(t: int) -> tuple[np.ndarray, np.ndarray]:
    """(logits [T, E], bias [E]) FP32 of the deepseek_router case at T, drawn when the case is
    made (a part of the bench that runs other ops does not pay the redraws at T = 16384)."""
    from lkw import golden

    p, e = DEEPSEEK_ROUTER, DEEPSEEK_ROUTER_E
    rng = np.random.default_rng(0)
    bias = rng.normal(0, 0.1, e).astype(np.float32)
    z = rng.standard_normal((t, e)).astype(np.float32)
    for row in range(t):
        while not golden.deepseek_decisive(z[row], bias, p["k"], p["n_group"], p["topk_group"]):
            z[row] = rng.standard_normal(e).astype(np.float32)
    return z, bias


def deepseek_router_cases() -> list[Case]:
    """deepseek_router (DeepSeek-V3: E 256, k 8, 8 groups, 4 kept, renormalized, scaled by 2.5)
    at MOE_ROUTER_T tokens. Logits N(0, 1) and bias N(0, 0.1²) in FP32, drawn on the host (seed 0)
    when the case is made (_deepseek_router_inputs), each row re-drawn until every choice it makes
    is decided by more than golden's margin (golden.deepseek_decisive): continuous values have no
    exact ties, so torch's top-k, which breaks ties its own way, must agree with the reference's
    ids too. Peer: the router in torch (sigmoid, biased group scores, masked top-k, the unbiased
    weights), eager and compiled."""
    from lkw import golden, moe

    p = DEEPSEEK_ROUTER
    e, k, groups, kept = DEEPSEEK_ROUTER_E, p["k"], p["n_group"], p["topk_group"]
    cases = []
    for t in MOE_ROUTER_T:

        def make(torch, gen, t=t):
            z, bias = _deepseek_router_inputs(t)
            return [torch.from_numpy(z).to("cuda"), torch.from_numpy(bias).to("cuda")], [
                torch.empty(t, k, dtype=torch.float32, device="cuda"),
                torch.empty(t, k, dtype=torch.int32, device="cuda")]

        def expected(host):
            w, i = moe.deepseek_router(host[0].view(np.float32), host[1].view(np.float32), k, groups, kept,
                                       True, p["routed_scaling_factor"])
            return [w.astype(np.float32).view(np.uint32), i.astype(np.int32).view(np.uint32)]

        cases.append(Case(
            "deepseek_router", f"t={t},e={e},k={k},groups={groups}",
            ["float32", "float32", "float32", "int32"], make, expected,
            tolerance=golden.router_tolerance(e, k, True), params=dict(p), max_sets=MOE_MAX_SETS,
            torch_peers=_peers_for(_eager_and_compiled(_torch_deepseek_router), t)))
    return cases


def _torch_deepseek_router(torch, z, bias):
    """DeepSeek-V3's router in torch, as lkw.moe.deepseek_router states it (DEEPSEEK_ROUTER)."""
    p = DEEPSEEK_ROUTER
    t, e = z.shape
    s = torch.sigmoid(z)
    c = s + bias
    group_scores = c.view(t, p["n_group"], -1).topk(2, dim=-1).values.sum(dim=-1)
    kept = group_scores.topk(p["topk_group"], dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
    c = c.masked_fill(~mask.repeat_interleave(e // p["n_group"], dim=1), float("-inf"))
    ids = c.topk(p["k"], dim=-1).indices
    w = s.gather(1, ids)
    w = w / w.sum(dim=-1, keepdim=True) * p["routed_scaling_factor"]
    return w, ids.to(torch.int32)


# The expert half of chapter 09: (E, k, d, moe_inter) per model; the gate_up GEMM (N = 2·inter,
# K = d, with SiLU-and-mul) and the down GEMM (N = d, K = inter) from a decode to a prefill T.
MOE_GEMM_MODELS = {"mixtral": (8, 2, 4096, 14336), "qwen3": (128, 8, 2048, 768),
                   "deepseek": (256, 8, 7168, 2048)}
MOE_GEMM_T = (16, 128, 1024, 4096)
MOE_GEMM_SAMPLE = 64  # leading slots (rows of out) the reference computes


def _grouped_sample(x_bits, weight_of, slot_expert, topk: int, rows: int):
    """out, sum |x w| and sum (x w)^2 of the grouped GEMM's first `rows` slots (slot s: expert
    slot_expert[s], token s // topk), float64, one expert at a time: weight_of(e) is expert e's
    [N, K] in float64 (w [E, N, K] may be many GB)."""
    import ml_dtypes

    xv = np.asarray(x_bits).view(ml_dtypes.bfloat16)
    experts = np.asarray(slot_expert).reshape(-1)[:rows]
    out = abs_sum = walk_sq = None
    for e in np.unique(experts):
        s = np.flatnonzero(experts == e)
        xe, we = xv[s // topk].astype(np.float64), weight_of(int(e))  # (rows of e, K), (N, K)
        if out is None:
            out, abs_sum, walk_sq = (np.zeros((rows, we.shape[0])) for _ in range(3))
        out[s], abs_sum[s], walk_sq[s] = xe @ we.T, np.abs(xe) @ np.abs(we).T, (xe * xe) @ (we * we).T
    return out, abs_sum, walk_sq


def grouped_sample_reference(x_bits, w_bits, slot_expert, topk: int, rows: int, silu: bool):
    """The grouped GEMM's first `rows` output rows (slots 0 .. rows - 1) as BF16 bits, and the
    tolerance of exactly those rows (lkw.golden.grouped_tolerance_from_sums)."""
    import ml_dtypes

    from lkw import golden

    weight_of = lambda e: np.asarray(w_bits[e]).view(ml_dtypes.bfloat16).astype(np.float64)
    out, abs_sum, _ = _grouped_sample(x_bits, weight_of, slot_expert, topk, rows)
    tol = golden.grouped_tolerance_from_sums(float(abs_sum.max()), w_bits.shape[2], out if silu else None)
    if not silu:
        return formats.f64_to_bf16(out), tol
    gate, up = np.split(out, 2, axis=1)
    return formats.f64_to_bf16(gate / (1.0 + np.exp(-gate)) * up), tol


def grouped_w4a16_sample_reference(x_bits, words, scale_bits, slot_expert, topk: int, rows: int):
    """The W4A16 grouped GEMM's first `rows` rows (W_hat = s * (q - 8) of each expert's repacked
    words, exact) as BF16 bits, and their tolerance: lkw.golden.grouped_w4a16_tolerance's
    (chapter 07's, lkw.gemv.tolerance_from_maxima) on exactly these rows."""
    from lkw import gemv, w4a16

    n, k = scale_bits.shape[2], words.shape[2] // 8
    weight_of = lambda e: w4a16.w_hat(w4a16.unrepack(np.asarray(words[e]), n, k), np.asarray(scale_bits[e]))
    out, abs_sum, walk_sq = _grouped_sample(x_bits, weight_of, slot_expert, topk, rows)
    return formats.f64_to_bf16(out), gemv.tolerance_from_maxima(float(walk_sq.max()), float(abs_sum.max()), k)


def _expert_order(ids: np.ndarray, num_experts: int):
    """(slots in expert order, their tokens, rows per expert) of a routing [T, k]: what a torch
    grouped GEMM needs to gather its rows."""
    flat = ids.reshape(-1)
    slots = np.argsort(flat, kind="stable")
    return slots, slots // ids.shape[1], np.bincount(flat, minlength=num_experts)


def _grouped_torch_peers(ids: np.ndarray, num_experts: int, silu: bool) -> dict[str, Callable]:
    """torch._grouped_mm on the rows gathered in expert order (offsets from the routing, made
    untimed), and a loop of one matmul per routed expert; both gather x's rows and put each result
    row back at its slot inside the timed call, as the kernels do. With silu, SiLU-and-mul in
    torch on the BF16 gate_up (two roundings more than the kernels: the peer tolerance says so)."""
    slots_np, tokens_np, counts = _expert_order(ids, num_experts)

    def finish(torch, y):
        if not silu:
            return y
        half = y.shape[1] // 2
        return torch.nn.functional.silu(y[:, :half]) * y[:, half:]

    def grouped_mm(torch, inputs):
        x, w = inputs[0], inputs[1]
        slots = torch.from_numpy(slots_np).to(x.device)
        tokens = torch.from_numpy(tokens_np).to(x.device)
        offs = torch.from_numpy(np.cumsum(counts).astype(np.int32)).to(x.device)
        n_out = w.shape[1] // 2 if silu else w.shape[1]
        out = torch.empty(ids.size, n_out, dtype=torch.bfloat16, device=x.device)
        w_t = w.transpose(1, 2)  # [E, K, N]: each expert's matrix column-major, as it wants

        def call():
            y = torch._grouped_mm(x.index_select(0, tokens), w_t, offs=offs)
            return out.index_copy_(0, slots, finish(torch, y))

        return call

    def loop(torch, inputs):
        x, w = inputs[0], inputs[1]
        slots = torch.from_numpy(slots_np).to(x.device)
        tokens = torch.from_numpy(tokens_np).to(x.device)
        n_out = w.shape[1] // 2 if silu else w.shape[1]
        out = torch.empty(ids.size, n_out, dtype=torch.bfloat16, device=x.device)
        ends = np.cumsum(counts)
        runs = [(e, int(ends[e] - counts[e]), int(ends[e])) for e in range(num_experts) if counts[e]]

        def call():
            for e, a, b in runs:
                y = torch.matmul(x.index_select(0, tokens[a:b]), w[e].t())
                out.index_copy_(0, slots[a:b], finish(torch, y))
            return out

        return call

    return {"torch_grouped_mm": grouped_mm, "torch_loop": loop}


def _uniform_routing(t: int, e: int, k: int, block_m: int) -> tuple[np.ndarray, int, int]:
    """The grouped GEMM cases' routing, drawn on the host (lkw.moe.routing_ids, uniform, seed 0:
    the byte model's routed experts are known when the case is made): ids int32 [T, k], how many
    experts it routes to, and the align's capacity at block_m."""
    from lkw import moe

    ids = moe.routing_ids(np.random.default_rng(0), t, e, k, "uniform")  # (T,k)
    return ids, int(np.unique(ids).size), moe.capacity(t * k, e, block_m)


def _torch_topk_weights(torch, gen, t: int, k: int):
    """topk_weights FP32 [T, k] as a router makes them: a softmax's top k, renormalized."""
    p = torch.softmax(torch.randn(t, 4 * k, device="cuda", generator=gen), dim=1).topk(k, dim=1).values
    return (p / p.sum(dim=1, keepdim=True)).contiguous()


def moe_gemm_cases() -> list[Case]:
    """Chapter 09's expert half: moe_grouped_gemm_silu (gate_up, N = 2·inter, K = d) and
    moe_grouped_gemm (down, N = d, K = inter) for every MOE_GEMM_MODELS model at MOE_GEMM_T tokens,
    uniform routing drawn on the host (lkw.moe.routing_ids, seed 0: the byte model's routed
    experts are known when the case is made), BLOCK_M 64, aligned on the GPU by _torch_align; x ~
    N(0, 1), w ~ N(0, 1)/sqrt(K) in BF16. The reference computes the first MOE_GEMM_SAMPLE slots
    (grouped_sample_reference). moe_sum at the same T and d: y ~ N(0, 1) [T, k, d] BF16, weights
    a softmax's top-k renormalized. Peers: torch._grouped_mm and a per-expert matmul loop; for the
    sum torch eager and compiled."""
    from lkw import golden, moe

    cases = []
    bm = MOE_BLOCK_M
    for e, k, d, inter in MOE_GEMM_MODELS.values():
        for t in MOE_GEMM_T:
            ids, routed, cap = _uniform_routing(t, e, k, bm)
            rows = min(MOE_GEMM_SAMPLE, t * k)
            for op, n, kk in (("moe_grouped_gemm_silu", 2 * inter, d), ("moe_grouped_gemm", d, inter)):
                silu = op.endswith("silu")

                def make(torch, gen, t=t, e=e, n=n, kk=kk, ids=ids, cap=cap, silu=silu):
                    dev = {"device": "cuda", "generator": gen}
                    x = torch.randn(t, kk, **dev).to(torch.bfloat16)
                    w = torch.randn(e, n, kk, dtype=torch.bfloat16, **dev).mul_(kk**-0.5)
                    routing = torch.from_numpy(ids).to("cuda")
                    sorted_ids, expert_ids, _ = _torch_align(torch, routing, e, bm, cap)
                    out = torch.empty(ids.size, n // 2 if silu else n, dtype=torch.bfloat16, device="cuda")
                    return [x, w, sorted_ids, expert_ids], [out]

                holder: list[Case] = []

                def expected(host, ids=ids, k=k, silu=silu, holder=holder, rows=rows):
                    out, tol = grouped_sample_reference(host[0], host[1], ids, k, rows, silu)
                    holder[0].tolerance = tol  # the tolerance of the rows checked
                    return [out]

                case = Case(
                    op, f"t={t},e={e},k={k},n={n},k_dim={kk},block_m={bm}",
                    ["bfloat16", "bfloat16", "int32", "int32", "bfloat16"], make, expected,
                    tolerance="close:1.6e-2:0",  # replaced by the reference's
                    sample_rows=rows, reference_sees_all=True,
                    params={"topk": k, "block_m": bm, "routed_experts": routed},
                    torch_peers=_grouped_torch_peers(ids, e, silu),
                    # The torch chain rounds gate_up to BF16 before SiLU-and-mul, and rounds silu(g).
                    peer_tolerance="close:4e-2:1e-3" if silu else None)
                holder.append(case)
                cases.append(case)
        for t in MOE_GEMM_T:

            def make(torch, gen, t=t, k=k, d=d):
                y = torch.randn(t, k, d, device="cuda", generator=gen).to(torch.bfloat16)
                w = _torch_topk_weights(torch, gen, t, k)
                return [y, w], [torch.empty(t, d, dtype=torch.bfloat16, device="cuda")]

            holder = []

            def expected(host, holder=holder):
                import ml_dtypes

                y, w = host[0].view(ml_dtypes.bfloat16), host[1].view(np.float32)
                holder[0].tolerance = golden.moe_sum_tolerance(host[0], w)
                return [moe.moe_sum(y, w).view(np.uint16)]

            body = lambda torch, y, w: (y.float() * w[..., None]).sum(dim=1).to(torch.bfloat16)
            case = Case(
                "moe_sum", f"t={t},k={k},d={d}", ["bfloat16", "float32", "bfloat16"], make, expected,
                tolerance="close:8e-3:0",  # replaced by the reference's
                sample_rows=MOE_GEMM_SAMPLE if t > MOE_GEMM_SAMPLE else None,
                torch_peers=_peers_for(_eager_and_compiled(body), t))
            holder.append(case)
            cases.append(case)
    return cases


def moe_gemm_sum_cases() -> list[Case]:
    """moe_grouped_gemm_sum, the down GEMM with the weighted sum in its epilogue, at the down
    GEMM's shapes of moe_gemm_cases (N = d, K = inter, the same routings): h ~ N(0, 1) [T·k, K]
    (a row per slot), weights a softmax's top-k renormalized. The reference computes the tokens
    of the first MOE_GEMM_SAMPLE slots. Peers: moe_gemm_cases' down GEMM in torch (grouped_mm or
    the loop) with each slot as its own token, then the weighted sum in torch: the unfused pair."""
    from lkw import golden

    cases = []
    bm = MOE_BLOCK_M
    for e, k, d, inter in MOE_GEMM_MODELS.values():
        for t in MOE_GEMM_T:
            ids, routed, cap = _uniform_routing(t, e, k, bm)
            tokens = max(1, min(MOE_GEMM_SAMPLE, t * k) // k)

            def make(torch, gen, t=t, e=e, k=k, n=d, kk=inter, ids=ids, cap=cap):
                dev = {"device": "cuda", "generator": gen}
                h = torch.randn(t * k, kk, **dev).to(torch.bfloat16)
                w = torch.randn(e, n, kk, dtype=torch.bfloat16, **dev).mul_(kk**-0.5)
                routing = torch.from_numpy(ids).to("cuda")
                sorted_ids, expert_ids, _ = _torch_align(torch, routing, e, bm, cap)
                tw = _torch_topk_weights(torch, gen, t, k)
                return [h, w, sorted_ids, expert_ids, tw], [torch.empty(t, n, dtype=torch.bfloat16, device="cuda")]

            holder: list[Case] = []

            def expected(host, ids=ids, k=k, kk=inter, holder=holder, tokens=tokens):
                import ml_dtypes

                w_bits = host[1]
                weight_of = lambda ex: np.asarray(w_bits[ex]).view(ml_dtypes.bfloat16).astype(np.float64)
                rows, abs_rows, _ = _grouped_sample(host[0], weight_of, ids, 1, tokens * k)  # (tokens*k,N)
                weights = np.asarray(host[4]).view(np.float32)[:tokens].astype(np.float64)  # (tokens,k)
                out = np.einsum("tj,tjn->tn", weights, rows.reshape(tokens, k, -1))
                holder[0].tolerance = golden.grouped_sum_tolerance_from_sums(abs_rows, weights, kk)
                return [formats.f64_to_bf16(out)]

            case = Case(
                "moe_grouped_gemm_sum", f"t={t},e={e},k={k},n={d},k_dim={inter},block_m={bm}",
                ["bfloat16", "bfloat16", "int32", "int32", "float32", "bfloat16"], make, expected,
                tolerance="close:1.6e-2:0",  # replaced by the reference's
                sample_rows=tokens, reference_sees_all=True,
                params={"block_m": bm, "routed_experts": routed},
                torch_peers=_unfused_sum_peers(ids, e),
                # torch rounds each slot's row to BF16 before the sum, as moe_block's chain does
                peer_tolerance="close:4e-2:1e-2")
            holder.append(case)
            cases.append(case)
    return cases


def _unfused_sum_peers(ids: np.ndarray, num_experts: int) -> dict[str, Callable]:
    """The down GEMM in torch (_grouped_torch_peers, every slot its own token: h has a row per
    slot), then the weighted sum of each token's k rows in FP32, rounded once."""
    base = _grouped_torch_peers(np.asarray(ids).reshape(-1, 1), num_experts, False)

    def wrap(factory):
        def peer(torch, inputs):
            tw = inputs[4]
            inner = factory(torch, [inputs[0], inputs[1]])

            def call():
                y = inner().view(tw.shape[0], tw.shape[1], -1)
                return (y.float() * tw[..., None]).sum(dim=1).to(torch.bfloat16)

            return call

        return peer

    return {name: wrap(f) for name, f in base.items()}


MOE_W4A16_T = (1, 16, 64)  # decode: where INT4 weights pay
MOE_W4A16_G = 128
MOE_W4A16_SAMPLE_EXPERTS = 16  # experts the reference unpacks: DeepSeek's take ~1 s each in numpy


def _rows_within_experts(ids: np.ndarray, rows: int, experts: int) -> int:
    """The most leading slots, at most `rows`, whose experts number at most `experts` (at least
    one slot): the sampled reference decodes each expert's weights whole."""
    flat = np.asarray(ids).reshape(-1)[:rows]
    first = np.unique(flat, return_index=True)[1]  # where each expert first appears
    return int(np.sort(first)[experts]) if first.size > experts else int(flat.size)


def moe_w4a16_cases() -> list[Case]:
    """moe_grouped_gemm_w4a16 at decode (MOE_W4A16_T) for every MOE_GEMM_MODELS model's gate_up
    (N = 2·inter, K = d) and down (N = d, K = inter) weights, G = 128: uniformly random words
    (a permutation of uniform bits is uniform: random repacked words are the repacking of random
    natural ones, and the reference unrepacks them), scales |N(0, 1)|·0.01 + 1e-3, uniform routing
    drawn on the host as moe_gemm_cases. The reference computes the first MOE_GEMM_SAMPLE slots
    (grouped_w4a16_sample_reference). Peers: torch._grouped_mm and the per-expert matmul loop on
    the BF16 dequantized weights of the routed experts (made untimed): the issue's BF16 baseline.
    The sampled slots stop before a 17th expert (MOE_W4A16_SAMPLE_EXPERTS)."""
    cases = []
    bm = MOE_BLOCK_M
    for e, k, d, inter in MOE_GEMM_MODELS.values():
        for t in MOE_W4A16_T:
            ids, routed, cap = _uniform_routing(t, e, k, bm)
            rows = _rows_within_experts(ids, min(MOE_GEMM_SAMPLE, t * k), MOE_W4A16_SAMPLE_EXPERTS)
            for n, kk in ((2 * inter, d), (d, inter)):

                def make(torch, gen, t=t, e=e, n=n, kk=kk, ids=ids, cap=cap):
                    dev = {"device": "cuda", "generator": gen}
                    x = torch.randn(t, kk, **dev).to(torch.bfloat16)
                    words = torch.randint(-(2**31), 2**31 - 1, (e, n // 64, 8 * kk), dtype=torch.int32, **dev)
                    scales = (torch.randn(e, kk // MOE_W4A16_G, n, **dev).abs() * 0.01 + 1e-3).to(torch.bfloat16)
                    routing = torch.from_numpy(ids).to("cuda")
                    sorted_ids, expert_ids, _ = _torch_align(torch, routing, e, bm, cap)
                    out = torch.empty(ids.size, n, dtype=torch.bfloat16, device="cuda")
                    return [x, words, scales, sorted_ids, expert_ids], [out]

                holder: list[Case] = []

                def expected(host, ids=ids, k=k, holder=holder, rows=rows):
                    out, tol = grouped_w4a16_sample_reference(host[0], host[1], host[2], ids, k, rows)
                    holder[0].tolerance = tol  # the tolerance of the rows checked
                    return [out]

                case = Case(
                    "moe_grouped_gemm_w4a16", f"t={t},e={e},k={k},n={n},k_dim={kk},g={MOE_W4A16_G},block_m={bm}",
                    ["bfloat16", "uint32", "bfloat16", "int32", "int32", "bfloat16"], make, expected,
                    tolerance="close:1.6e-2:0",  # replaced by the reference's
                    sample_rows=rows, reference_sees_all=True,
                    params={"topk": k, "block_m": bm, "routed_experts": routed},
                    torch_peers=_dequantized_peers(_grouped_torch_peers(ids, e, False), np.unique(ids)))
                holder.append(case)
                cases.append(case)
    return cases


def _dequantized_peers(peers_bf16: dict[str, Callable], routed: np.ndarray) -> dict[str, Callable]:
    """The BF16 grouped peers run on W_hat = s·(q − 8) in BF16 [E, N, K], dequantized from the
    case's repacked words and scales once, untimed: what the layer costs without an INT4 kernel.
    Only the routed experts' (the peers read no other; the rest stay zero)."""

    def wrap(factory):
        def peer(torch, inputs):
            x, words, scales = inputs[0], inputs[1], inputs[2]
            e, n, kk = scales.shape[0], scales.shape[2], words.shape[2] // 8
            w = torch.zeros(e, n, kk, dtype=torch.bfloat16, device=x.device)
            for ex in (int(r) for r in routed):
                natural = _torch_unrepack(torch, words[ex].view(torch.int32), n, kk)
                w[ex] = _dequantized_bf16(torch, natural, False, scales[ex])
            return factory(torch, [x, w])

        return peer

    return {name: wrap(f) for name, f in peers_bf16.items()}


MOE_FP8_T = (16, 4096)  # decode-like and prefill
MOE_FP8_SAMPLE_EXPERTS = 16  # experts the sampled reference dequantizes (DeepSeek's: 29M weights)


def grouped_fp8_sample_reference(host, slot_expert, topk: int, rows: int, epilogue: str):
    """The FP8 grouped op's first output rows, BF16 bits, and their frob tolerance
    (lkw.golden.grouped_fp8_tolerance_from_rows on exactly these rows): slots 0 .. rows - 1
    ("store", "silu"), or the tokens of those slots ("sum": rows a multiple of topk), from the
    exact dequantized operands (lkw.moe.fp8_experts), one expert at a time."""
    from lkw import golden, moe

    x, w = np.asarray(host[0]).view(np.uint8), host[1]
    xs, ws = np.asarray(host[2]).view(np.float32), host[3]
    experts = np.asarray(slot_expert).reshape(-1)[:rows]
    out = None
    for e in np.unique(experts):
        s = np.flatnonzero(experts == e)
        xr = s if epilogue == "sum" else s // topk  # x's rows: the slot's (sum) or its token's
        x_hat, w_hat = moe.fp8_experts(x[xr], np.asarray(w[e : e + 1]).view(np.uint8),
                                       np.ascontiguousarray(xs[:, xr]),
                                       np.asarray(ws[e : e + 1]).view(np.float32))
        if out is None:
            out = np.zeros((rows, w_hat.shape[1]))
        out[s] = x_hat @ w_hat[0].T  # (rows of e,N)
    k_dim = x.shape[1]
    if epilogue == "store":
        return formats.f64_to_bf16(out), golden.grouped_fp8_tolerance_from_rows(out, k_dim)
    if epilogue == "silu":
        tol = golden.grouped_fp8_tolerance_from_rows(out, k_dim, "silu")
        return formats.f64_to_bf16(moe.silu_and_mul(out)), tol
    weights = np.asarray(host[6]).view(np.float32)[: rows // topk].astype(np.float64)  # (tokens,k)
    summed = np.einsum("tj,tjn->tn", weights, out.reshape(*weights.shape, -1))
    tol = golden.grouped_fp8_tolerance_from_rows(out, k_dim, "sum", weights)
    return formats.f64_to_bf16(summed), tol


def _fp8_grouped_peers(ids: np.ndarray, num_experts: int, epilogue: str) -> dict[str, Callable]:
    """Peers of the FP8 grouped ops: torch._scaled_mm (cuBLASLt's blockwise FP8 GEMM, where this
    torch runs it) in a loop over the routed experts, each expert's gathered rows padded to a
    multiple of 16 (cuBLASLt's FP8 rows); and the BF16 peers of the same op (torch._grouped_mm,
    the matmul loop) on the operands dequantized to BF16 once, untimed: the layer without an FP8
    kernel. SiLU-and-mul and the weighted sum in torch after the GEMM, as the BF16 peers do."""
    sum_op = epilogue == "sum"
    routing = np.asarray(ids).reshape(-1, 1) if sum_op else ids  # sum: every slot its own row
    slots_np, rows_np, counts = _expert_order(routing, num_experts)

    def dequantized(torch, inputs):
        x, w, xs, ws = inputs[:4]
        x_hat = _fp8_dequant_bf16(torch, x, xs, "blockwise", "a")
        w_hat = torch.zeros(w.shape, dtype=torch.bfloat16, device=w.device)
        for e in (int(r) for r in np.unique(ids)):
            w_hat[e] = _fp8_dequant_bf16(torch, w[e], ws[e], "blockwise", "b")
        return x_hat, w_hat

    def finish(torch, y):
        if epilogue != "silu":
            return y
        half = y.shape[1] // 2
        return torch.nn.functional.silu(y[:, :half]) * y[:, half:]

    def weighted(torch, y, tw):
        return (y.view(tw.shape[0], tw.shape[1], -1).float() * tw[..., None]).sum(dim=1).to(torch.bfloat16)

    def scaled_mm_loop(torch, inputs):
        x, w, xs, ws = inputs[:4]
        rows = torch.from_numpy(rows_np).to(x.device)
        slots = torch.from_numpy(slots_np).to(x.device)
        n_out = w.shape[1] // 2 if epilogue == "silu" else w.shape[1]
        out = torch.empty(routing.size, n_out, dtype=torch.bfloat16, device=x.device)
        ends = np.cumsum(counts)
        calls = []
        for e in range(num_experts):
            if not counts[e]:
                continue
            a, b = int(ends[e] - counts[e]), int(ends[e])
            padded = -(-(b - a) // 16) * 16
            pick = torch.cat([rows[a:b], rows[a:a + 1].expand(padded - (b - a))])
            x_e, xs_e = x.index_select(0, pick), xs.index_select(1, pick).contiguous()
            calls.append((_torch_blockwise_call(torch, x_e, w[e], xs_e, ws[e]), a, b))

        def call():
            for gemm, a, b in calls:
                out.index_copy_(0, slots[a:b], finish(torch, gemm()[: b - a]))
            return weighted(torch, out, inputs[6]) if sum_op else out

        return call

    base = _grouped_torch_peers(routing, num_experts, epilogue == "silu")

    def bf16(factory):
        def peer(torch, inputs):
            x_hat, w_hat = dequantized(torch, inputs)
            inner = factory(torch, [x_hat, w_hat])
            return (lambda: weighted(torch, inner(), inputs[6])) if sum_op else inner

        return peer

    return {"torch_scaled_mm_loop": scaled_mm_loop,
            **{f"{name}_bf16_dequantized": bf16(f) for name, f in base.items()}}


def moe_fp8_cases() -> list[Case]:
    """The FP8 grouped GEMMs (v15) at MOE_GEMM_MODELS' shapes, T in MOE_FP8_T: gate_up with
    SiLU-and-mul (N = 2·inter, K = d), down (N = d, K = inter), and down with the weighted sum (x a
    row per slot). E4M3 codes and scales as chapter 08's bench draws them (_fp8_make), in the
    ops' layouts; uniform routing drawn on the host, aligned on the GPU (_torch_align), BLOCK_M 64.
    The reference computes the first MOE_GEMM_SAMPLE slots, stopping before a 17th expert
    (grouped_fp8_sample_reference). Peers: _fp8_grouped_peers, at twice the frob bound (they round
    the GEMM to BF16 before SiLU-and-mul or the sum, or dequantize to BF16)."""
    from lkw import moe

    cases = []
    bm = MOE_BLOCK_M
    fp8_ops = (("moe_grouped_gemm_silu_fp8", "silu"), ("moe_grouped_gemm_fp8", "store"),
               ("moe_grouped_gemm_sum_fp8", "sum"))
    for e, k, d, inter in MOE_GEMM_MODELS.values():
        for t in MOE_FP8_T:
            ids, routed, cap = _uniform_routing(t, e, k, bm)
            sampled = _rows_within_experts(ids, min(MOE_GEMM_SAMPLE, t * k), MOE_FP8_SAMPLE_EXPERTS)
            for op, epilogue in fp8_ops:
                n, kk = (2 * inter, d) if epilogue == "silu" else (d, inter)
                rows = max(k, sampled // k * k) if epilogue == "sum" else sampled
                x_rows = t * k if epilogue == "sum" else t

                def make(torch, gen, t=t, e=e, k=k, n=n, kk=kk, ids=ids, cap=cap, x_rows=x_rows,
                         epilogue=epilogue):
                    dev = {"device": "cuda", "generator": gen}

                    def codes(*shape):
                        v = torch.randn(*shape, **dev) * FP8_CODE_SPREAD
                        return v.clamp_(-448, 448).to(torch.float8_e4m3fn)

                    def scales(*shape):
                        return torch.exp2(torch.rand(*shape, **dev) * 4 - 10)

                    x = codes(x_rows, kk)
                    w = torch.empty(e, n, kk, dtype=torch.float8_e4m3fn, device="cuda")
                    for i in range(e):  # one expert at a time: no [E, N, K] FP32 temporary
                        w[i] = codes(n, kk)
                    xs, ws = scales(kk // 128, x_rows), scales(e, -(-n // 128), kk // 128)
                    routing = torch.from_numpy(ids).to("cuda")
                    sorted_ids, expert_ids, _ = _torch_align(torch, routing, e, bm, cap)
                    inputs = [x, w, xs, ws, sorted_ids, expert_ids]
                    if epilogue == "sum":
                        inputs.append(_torch_topk_weights(torch, gen, t, k))
                    out_shape = (t, n) if epilogue == "sum" else (t * k, n // 2 if epilogue == "silu" else n)
                    return inputs, [torch.empty(*out_shape, dtype=torch.bfloat16, device="cuda")]

                holder: list[Case] = []

                def expected(host, ids=ids, k=k, rows=rows, epilogue=epilogue, holder=holder):
                    out, tol = grouped_fp8_sample_reference(host, ids, k, rows, epilogue)
                    bound = float(tol[len("frob:"):])
                    holder[0].tolerance = tol  # the bound of the rows checked
                    holder[0].peer_tolerance = f"frob:{2 * bound:.4g}"
                    return [out]

                dtypes = ["float8_e4m3fn", "float8_e4m3fn", "float32", "float32", "int32", "int32"]
                dtypes += ["float32"] * (epilogue == "sum") + ["bfloat16"]
                params = {"block_m": bm, "routed_experts": routed}
                if epilogue != "sum":
                    params["topk"] = k
                case = Case(
                    op, f"t={t},e={e},k={k},n={n},k_dim={kk},block_m={bm}", dtypes, make, expected,
                    tolerance="frob:0.01",  # replaced by the reference's
                    sample_rows=rows // k if epilogue == "sum" else rows, reference_sees_all=True,
                    params=params, torch_peers=_fp8_grouped_peers(ids, e, epilogue),
                    peer_tolerance="frob:0.02")
                holder.append(case)
                cases.append(case)
    return cases


MOE_BLOCK_T = (1, 16, 128)
MOE_BLOCK_SAMPLE = 8  # leading tokens the reference computes


def moe_block_cases() -> list[Case]:
    """moe_block, the whole MoE layer as the chapter's kernels chain it, for Mixtral and Qwen3 at
    MOE_BLOCK_T tokens: router logits on lkw.golden.routing_logits' grid (drawn on the host, seed
    0: every decision decisive, the routed experts known when the case is made), x ~ N(0, 1),
    w_gate_up ~ N(0, 1/d), w_down ~ N(0, 1/d_ff) in BF16. The reference computes the first
    MOE_BLOCK_SAMPLE tokens and their tolerance (lkw.golden.moe_block_rows). Peers: the same layer
    in torch, softmax-top-k then torch._grouped_mm (or a loop of per-expert matmuls) for both
    GEMMs, SiLU-and-mul and the weighted sum; they gather rows with the host's routing (known
    when the case is made) where the kernels sort on the GPU."""
    from lkw import golden, moe

    cases = []
    for name in ("mixtral", "qwen3"):
        e, k, d, d_ff = MOE_GEMM_MODELS[name]
        for t in MOE_BLOCK_T:
            logits_np = golden.routing_logits(np.random.default_rng(0), t, e, 64, 1 / 8)
            _, ids = moe.topk_softmax(logits_np, k, True)
            routed = int(np.unique(ids).size)
            tokens = min(MOE_BLOCK_SAMPLE, t)

            def make(torch, gen, t=t, e=e, d=d, d_ff=d_ff, logits_np=logits_np):
                dev = {"device": "cuda", "generator": gen}
                x = torch.randn(t, d, **dev).to(torch.bfloat16)
                z = torch.from_numpy(logits_np).to("cuda")
                w1 = torch.randn(e, 2 * d_ff, d, dtype=torch.bfloat16, **dev).mul_(d**-0.5)
                w2 = torch.randn(e, d, d_ff, dtype=torch.bfloat16, **dev).mul_(d_ff**-0.5)
                return [x, z, w1, w2], [torch.empty(t, d, dtype=torch.bfloat16, device="cuda")]

            holder: list[Case] = []

            def expected(host, k=k, tokens=tokens, holder=holder):
                logits = host[1].view(np.float32)  # host inputs are bits
                y, atol = golden.moe_block_rows(host[0], logits, host[2], host[3], k, True, tokens)
                holder[0].tolerance = f"close:8e-3:{atol:.3g}"
                return [formats.f64_to_bf16(y)]

            case = Case(
                "moe_block", f"t={t},e={e},k={k},d={d},d_ff={d_ff}",
                ["bfloat16", "float32", "bfloat16", "bfloat16", "bfloat16"], make, expected,
                tolerance="close:8e-3:0",  # replaced by the reference's
                sample_rows=tokens, reference_sees_all=True,
                params={"topk": k, "renormalize": 1, "routed_experts": routed},
                torch_peers=_block_torch_peers(ids, e, k, d_ff),
                # torch rounds gate_up to BF16 before SiLU-and-mul, and silu(gate) before the product
                peer_tolerance="close:4e-2:1e-2")
            holder.append(case)
            cases.append(case)
    return cases


def _block_torch_peers(ids: np.ndarray, num_experts: int, k: int, d_ff: int) -> dict[str, Callable]:
    """The layer in torch: softmax, top-k, renormalize; both GEMMs as torch._grouped_mm on the
    rows in expert order (or one matmul per routed expert); SiLU-and-mul; the down rows put back
    at their slots and summed with the weights in FP32. The gather order comes from the case's
    routing, made untimed (the torch ids are the same: the logits make every choice decisive)."""
    slots_np, tokens_np, counts = _expert_order(ids, num_experts)
    ends = np.cumsum(counts)
    runs = [(e, int(ends[e] - counts[e]), int(ends[e])) for e in range(num_experts) if counts[e]]

    def factory(grouped: bool):
        def peer(torch, inputs):
            x, z, w1, w2 = inputs[:4]
            t = x.shape[0]
            slots = torch.from_numpy(slots_np).to(x.device)
            tokens = torch.from_numpy(tokens_np).to(x.device)
            offs = torch.from_numpy(ends.astype(np.int32)).to(x.device)
            rows = torch.empty(t * k, x.shape[1], dtype=torch.bfloat16, device=x.device)

            def silu_mul(g):
                return torch.nn.functional.silu(g[:, :d_ff]) * g[:, d_ff:]

            def experts(xs):
                if grouped:
                    h = silu_mul(torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs))
                    return torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)
                return torch.cat([silu_mul(xs[a:b] @ w1[e].t()) @ w2[e].t() for e, a, b in runs])

            def call():
                weights, _ = torch.softmax(z, dim=1).topk(k, dim=1)
                weights = weights / weights.sum(dim=1, keepdim=True)
                rows.index_copy_(0, slots, experts(x.index_select(0, tokens)))
                return (rows.view(t, k, -1).float() * weights[..., None]).sum(dim=1).to(torch.bfloat16)

            return call

        return peer

    return {"torch_grouped_mm": factory(True), "torch_loop": factory(False)}


# ------------------------------------------------------------------------------------------------
# Chapter 10: top-k of a decode step's logits (issue 48), B rows of Llama-2's (32000), Llama-3's
# (128256) and Qwen2's (152064) vocabularies: k = 50 everywhere, k = 1024 on Llama-3 at every B,
# greedy-like k = 1 once. One k for every row of a case (the top_k tensor holds it B times): the
# torch.topk peers take it as a number, as a PyTorch sampler with one k per batch does.

SAMPLING_TOP_K_OPS = ("top_k_mask_logits", "top_k_renorm_probs")
SAMPLING_B = (1, 16, 64, 256)
SAMPLING_V = (32000, 128256, 152064)
SAMPLING_RUNS = (
    [(b, v, 50) for v in SAMPLING_V for b in SAMPLING_B]
    + [(b, 128256, 1024) for b in SAMPLING_B]
    + [(64, 128256, 1)]
)
SAMPLING_COMPILE_B = 64  # torch.compile from this B on: a compilation per shape, tens of seconds


def _torch_top_k_threshold(torch, x, k: int):
    """[B, 1]: the k-th largest value of each row by torch.topk (one k for every row), -inf where k
    disables the filter (k <= 0 or k >= V: everything is kept)."""
    if not 0 < k < x.shape[1]:
        return torch.full((x.shape[0], 1), float("-inf"), dtype=x.dtype, device=x.device)
    return torch.topk(x, k, dim=-1).values[:, -1:]


def _torch_sort_threshold(torch, x, top_k):
    """[B, 1]: the k-th largest value of each row from a full descending sort and a gather of
    position k - 1 (each row its own k; -inf where it disables the filter). What serving engines
    did first (vLLM's torch sampler still sorts where top-p is on too): the baseline of v0."""
    v = x.shape[1]
    k = top_k.long()[:, None]  # (B,1)
    kth = torch.sort(x, dim=-1, descending=True).values.gather(1, k.clamp(1, v) - 1)
    return torch.where((k > 0) & (k < v), kth, torch.full_like(kth, float("-inf")))


def _torch_mask(torch, logits, threshold):
    """Every token below its row's threshold [B, 1] to -inf: those equal to the k-th value (a
    tie) are kept, as the contract keeps them. A kept -0.0 stays -0.0 (the contract writes +0.0):
    lm_logits has no zeros."""
    return logits.masked_fill(logits < threshold, float("-inf"))


def _torch_renorm(torch, probs, threshold):
    """Every token below its row's threshold [B, 1] to 0, the rest divided by their FP32 sum."""
    kept = probs.masked_fill(probs < threshold, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _sampling_torch_peers(op: str, k: int, b: int) -> dict[str, Callable]:
    """torch_eager / torch_compile: torch.topk's k-th value as the threshold, then the mask or the
    renormalization (torch.compile from SAMPLING_COMPILE_B rows on); torch_sort: a full sort per
    row and a gather of each row's k-th value (eager)."""
    apply = _torch_mask if op == "top_k_mask_logits" else _torch_renorm
    top_k = _eager_and_compiled(
        lambda torch, x, top_k, k=k: apply(torch, x, _torch_top_k_threshold(torch, x, k)))
    if b < SAMPLING_COMPILE_B:
        del top_k["torch_compile"]

    def torch_sort(torch, inputs):
        x, k_rows = inputs
        return lambda: apply(torch, x, _torch_sort_threshold(torch, x, k_rows))

    return {**top_k, "torch_sort": torch_sort}


def sampling_cases() -> list[Case]:
    """Chapter 10's top-k ops at SAMPLING_RUNS (shape "b=B,v=V,k=K"): logits from
    lkw.sampling.lm_logits (an LM head's rows: a few peaks over a N(0, 2) bulk), drawn on the host
    from the case's seed; probs their float32 softmax (torch, on the GPU). The reference checks
    every row: it sorts each row on the host (B = 256, V = 152064: about half a second for the
    mask, three for the float64 renormalization), cheap beside the bench's own time per case.
    The torch peers are _sampling_torch_peers'; the production peer is FlashInfer's
    (lkw.peers.sampling_peers; vLLM has no kernel of this form, its sampler is torch and
    FlashInfer)."""
    from lkw import golden, sampling

    cases = []
    for op in SAMPLING_TOP_K_OPS:
        probs = op == "top_k_renorm_probs"
        for b, v, k in SAMPLING_RUNS:

            def make(torch, gen, b=b, v=v, k=k, probs=probs):
                rng = np.random.default_rng([gen.initial_seed(), b, v, k])
                x = torch.from_numpy(sampling.lm_logits(rng, b, v)).to("cuda")
                if probs:
                    x = torch.softmax(x, dim=-1)
                top_k = torch.full((b,), k, dtype=torch.int32, device="cuda")
                return [x, top_k], [torch.empty_like(x)]

            def expected(host, op=op):
                x = host[0].view(np.float32)
                return [golden.OPS[op].fn(x, host[1].view(np.int32)[: x.shape[0]])]

            cases.append(Case(
                op, f"b={b},v={v},k={k}", [*golden.OPS[op].inputs, *golden.OPS[op].outputs], make,
                expected, tolerance=golden.SAMPLING_TOLERANCES[op],
                torch_peers=_sampling_torch_peers(op, k, b), library_peers=peers.sampling_peers(op),
                model_bytes=sampling.renorm_bytes(b, v)))
    return cases


# ------------------------------------------------------------------------------------------------
# Chapter 10, the other ops: top_p_renorm_probs, sample and rejection_sample. None of them is
# compared bit for bit with a reference: a kernel's float32 sums may decide a token within
# lkw.sampling.MARGIN of a threshold either way, and a sampled token depends on random numbers
# that only the versions share with the reference (Philox). Their cases judge the outputs by a
# rule instead (Case.check).

# top_p_renorm_probs: p = 0.9 and 0.95 on Llama-3's vocabulary, p = 0.9 on the other two, every B;
# one p for every row (the top_p tensor holds it B times).
TOP_P_RUNS = (
    [(b, 128256, p) for p in (0.9, 0.95) for b in SAMPLING_B]
    + [(b, v, 0.9) for v in (32000, 152064) for b in SAMPLING_B]
)
# sample: filter set (as it reads in the shape) -> (top_k, top_p, min_p, T), the same for every row;
# top_k 0, top_p 1 and min_p 0 are the contract's "off". "k=50,p=0.9" at T = 0.7 is the headline
# case (top-k then top-p, as engines chain them); "" is pure sampling from the softmax, T = 1;
# "k=50" alone is the goal "top-k 50 >= 10x torch.topk + multinomial" (its torch peer: torch.topk's
# mask, softmax, torch.multinomial). A new filter set goes last: its index seeds its logits.
SAMPLE_FILTERS = {
    "k=50,p=0.9": (50, 0.9, 0.0, 0.7),
    "p=0.95": (0, 0.95, 0.0, 0.7),
    "k=1024": (1024, 1.0, 0.0, 0.7),
    "min_p=0.1": (0, 1.0, 0.1, 0.7),
    "": (0, 1.0, 0.0, 1.0),
    "k=50": (50, 1.0, 0.0, 0.7),
}
SAMPLE_RUNS = (
    [(b, 128256, f) for f in SAMPLE_FILTERS for b in SAMPLING_B]
    + [(64, v, "k=50,p=0.9") for v in (32000, 152064)]
)
SAMPLE_DTYPES = ["float32", "float32", "int32", "float32", "float32", "int64", "int32"]
REJECTION_S = 4  # draft tokens per request
REJECTION_RUNS = [(b, 128256) for b in SAMPLING_B] + [(64, 32000)]
REJECTION_DTYPES = ["float32", "int32", "float32", "int64", "int32", "int32"]


def _once_per_inputs(fn: Callable) -> Callable:
    """fn(host_inputs), computed again only for other host inputs. Every check of a case reads
    the one host copy measure_case made, and what a check derives from the inputs alone (the
    top-p thresholds sort every row: seconds at B = 256) is the same for every rotated set,
    timing mode and peer. The inputs are recognized by a weak reference to the first array (an
    id could be reused); the results are a few [B] arrays."""
    last: dict = {}

    def cached(host_inputs):
        ref = last.get("inputs")
        if ref is None or ref() is not host_inputs[0]:
            last.clear()
            last.update(inputs=weakref.ref(host_inputs[0]), value=fn(host_inputs))
        return last["value"]

    return cached


def _threshold(keep: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """float32 [B]: the smallest key each row keeps (+inf where it keeps none). Every filter of the
    contract keeps an upper set of the keys, so keep == (keys >= threshold)."""
    return np.where(keep, keys, np.float32(np.inf)).min(axis=1)


def _top_p_thresholds(host) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a top_p_renorm_probs case: the contract's threshold and the band [wide, narrow)
    of its uncertain tokens (lkw.sampling.uncertain_tokens: p moved by +-MARGIN), float32 [B]."""
    from lkw import sampling

    keys, mass = sampling.from_probs(host[0].view(np.float32))
    wide, keep, narrow = sampling._filter_keeps(keys, mass, None, host[1].view(np.float32), None,
                                                "top_k_first", (+1, 0, -1))
    return _threshold(keep, keys), _threshold(wide, keys), _threshold(narrow, keys)


def _top_p_renorm_check() -> Callable:
    """The check of top_p_renorm_probs: the kept set (the output's positive entries) is the
    contract's on every token of positive probability but the uncertain ones (the rule of
    lkw.sampling.keep_mismatches), and the values are the renormalization of that kept set within
    PROB_RTOL, dropped tokens exactly 0. Where the kept set is the contract's, that is
    lkw.sampling.top_p_renorm_probs itself; where a kernel decided an uncertain token the other
    way, its row is renormalized over what it kept."""
    thresholds = _once_per_inputs(_top_p_thresholds)

    def check(host, outs):
        from lkw import sampling

        if outs[0] is None:
            return ["no output"]
        tau, wide, narrow = thresholds(host)
        probs = host[0].view(np.float32)  # (B,V)
        got = outs[0].view(np.float32).reshape(probs.shape)
        kept = (got > 0) & (probs > 0)  # NaN is not > 0: compared as dropped, then fails below
        ref = probs >= tau[:, None]
        exempt = (probs >= wide[:, None]) & (probs < narrow[:, None])
        wrong = (kept != ref) & ~exempt & (probs > 0)  # (B,V)
        empty = ~kept.any(axis=1)
        want = sampling.renorm(probs.astype(np.float64), np.where(empty[:, None], ref, kept))
        off = ~(np.abs(got.astype(np.float64) - want) <= sampling.PROB_RTOL * want)  # (B,V)
        problems = []
        for r in np.flatnonzero(wrong.any(axis=1) | off.any(axis=1)):
            if wrong[r].any():
                tokens = np.flatnonzero(wrong[r])
                problems.append(f"row {r}: {tokens.size} tokens kept or dropped against the rule "
                                f"(first {tokens[0]}: {float(got[r, tokens[0]]):.9g})")
            else:
                i = np.flatnonzero(off[r])[0]
                problems.append(f"row {r}: token {i} is {float(got[r, i]):.9g}, want {float(want[r, i]):.9g}")
        return problems

    return check


def _sample_support(host) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a `sample` case: the smallest key of an admissible token, float32 [B] (kept by the
    widest reading of the filters, slack +1, and of positive mass: lkw.sampling.filter_keep, an
    upper set of the keys), and the greedy token (the lowest index of max x, for rows with T = 0)."""
    from lkw import sampling

    x = host[0].view(np.float32)
    t, top_k = host[1].view(np.float32), host[2].view(np.int32)
    top_p, min_p = host[3].view(np.float32), host[4].view(np.float32)
    keys, mass = sampling.from_logits(x, t)
    # A filter that is off in every row is left out: the top-p reading sorts every row.
    wide = sampling.filter_keep(
        keys, mass, top_k if np.any((top_k > 0) & (top_k < x.shape[1])) else None,
        top_p if np.any(top_p < 1) else None, min_p if np.any(min_p > 0) else None, slack=+1)
    return _threshold(wide & (mass > 0), keys), np.argmax(x, axis=1)


def _sample_check() -> Callable:
    """The check of `sample`, for the versions and the peers alike (their random numbers differ):
    every token in the support of its row (_sample_support: the key fp32(x / T) of the token at
    least the row's threshold), greedy rows (T = 0) exactly the greedy token. Which admissible
    token a version picks for its Philox uniform is the golden tests' to check."""
    support = _once_per_inputs(_sample_support)

    def check(host, outs):
        x, t = host[0].view(np.float32), host[1].view(np.float32)
        b, v = x.shape
        if outs[0] is None or outs[0].size != b:
            return [f"want {b} tokens, got {None if outs[0] is None else outs[0].size}"]
        tau, greedy = support(host)
        tok = outs[0].view(np.int32).reshape(b).astype(np.int64)
        inside = (tok >= 0) & (tok < v)
        z = x[np.arange(b), np.where(inside, tok, 0)] / np.where(t > 0, t, np.float32(1))  # fp32
        problems = [f"row {r}: token {tok[r]} outside 0..{v - 1}" for r in np.flatnonzero(~inside)]
        problems += [f"row {r}: greedy, token {tok[r]}, want {greedy[r]}"
                     for r in np.flatnonzero(inside & (t == 0) & (tok != greedy))]
        problems += [f"row {r}: token {tok[r]} outside the filters' support (key {float(z[r]):.9g} < {float(tau[r]):.9g})"
                     for r in np.flatnonzero(inside & (t > 0) & ~(z >= tau))]
        return problems

    return check


def _rejection_reference(host):
    """lkw.sampling.rejection_sample of a case's host inputs with the kernels' uniforms: row b's
    Philox stream from seed_offset, accept_u = u_0..u_{S-1}, sample_u = u_S; with its rows whose
    last token is uncertain."""
    from lkw import sampling

    q, drafts, p = host[0].view(np.float32), host[1].view(np.int32), host[2].view(np.float32)
    seed, offset = (int(a) for a in host[3].view(np.int64))
    b, s, _ = q.shape
    u = sampling.philox_uniforms(seed, offset, b, s + 1)  # (B,S+1)
    return sampling.rejection_sample(q, drafts, p, u[:, :s], u[:, s], with_uncertain=True)


def _rejection_structure(host, outs) -> list[str]:
    """What every rejection_sample must output, whatever its random numbers (the peers' check):
    num_accepted in 0..S, the first num_accepted tokens the drafts, then one token in 0..V-1, then
    PLACEHOLDER to the end of the row."""
    from lkw import sampling

    drafts = host[1].view(np.int32)
    b, s = drafts.shape
    v = host[0].shape[2]
    if outs[0] is None or outs[1] is None or outs[0].size != b * (s + 1) or outs[1].size != b:
        return [f"want tokens [{b}, {s + 1}] and num_accepted [{b}]"]
    tokens = outs[0].view(np.int32).reshape(b, s + 1)
    n = outs[1].view(np.int32).reshape(b)
    problems = []
    for r in range(b):
        k = int(n[r])
        if not 0 <= k <= s:
            problems.append(f"row {r}: num_accepted {k} outside 0..{s}")
        elif not np.array_equal(tokens[r, :k], drafts[r, :k]):
            problems.append(f"row {r}: accepted {tokens[r, :k].tolist()}, drafts {drafts[r, :k].tolist()}")
        elif not 0 <= tokens[r, k] < v:
            problems.append(f"row {r}: token {tokens[r, k]} after the accepted drafts outside 0..{v - 1}")
        elif np.any(tokens[r, k + 1:] != sampling.PLACEHOLDER):
            problems.append(f"row {r}: {tokens[r, k + 1:].tolist()} after the last token, "
                            f"want {sampling.PLACEHOLDER}")
    return problems


def _rejection_check() -> Callable:
    """The versions' check of rejection_sample: the structure, num_accepted (hence the accepted
    drafts) equal to _rejection_reference's, bit-exact (a float32 product and a comparison per
    draft), and the last token equal to it except in a row where u * total lies within MARGIN of
    a CDF boundary (the kernel's float32 prefix sums may pick the neighbour)."""
    reference = _once_per_inputs(_rejection_reference)

    def check(host, outs):
        problems = _rejection_structure(host, outs)
        if problems:
            return problems
        want, n_want, unsure = reference(host)
        b, width = want.shape
        tokens = outs[0].view(np.int32).reshape(b, width)
        n = outs[1].view(np.int32).reshape(b).astype(np.int64)
        problems = [f"row {r}: num_accepted {n[r]}, want {n_want[r]}" for r in np.flatnonzero(n != n_want)]
        rows = np.arange(b)
        last, last_want = tokens[rows, n], want[rows, np.minimum(n, width - 1)]
        problems += [f"row {r}: token {last[r]} after {n[r]} accepted drafts, want {last_want[r]}"
                     for r in np.flatnonzero((n == n_want) & ~unsure & (last != last_want))]
        return problems

    return check


def _torch_top_p(torch, probs, top_p):
    """probs [B, V] with every token outside its row's top-p set [B] to 0, as an engine computes it
    in torch: a descending sort, a cumulative sum, a token dropped once the mass sorted before it
    (the exclusive sum) reaches p times the row's total, scattered back. A tie group at the
    boundary may be split in sort order (the contract keeps or drops it whole)."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    through = sorted_probs.cumsum(dim=-1)  # (B,V) inclusive sums
    drop = through - sorted_probs >= top_p[:, None] * through[:, -1:]
    return torch.zeros_like(probs).scatter_(1, order, sorted_probs.masked_fill(drop, 0.0))


def _torch_top_p_renorm(torch, probs, top_p):
    kept = _torch_top_p(torch, probs, top_p)
    return kept / kept.sum(dim=-1, keepdim=True)


def _torch_sample(torch, logits, temperature, top_p, min_p, k: int, top_p_on: bool, min_p_on: bool):
    """[B] int32 tokens as an engine's torch sampler draws them: logits / T, the top-k mask at
    torch.topk's k-th value (one k for the batch), softmax, the sorted top-p mask (_torch_top_p),
    the min-p mask relative to each row's largest prob, torch.multinomial. A filter off for the
    whole batch is skipped, as engines skip it; T = 0 is not handled (the cases have no greedy row)."""
    z = logits / temperature[:, None]
    if 0 < k < z.shape[1]:
        z = _torch_mask(torch, z, _torch_top_k_threshold(torch, z, k))
    probs = torch.softmax(z, dim=-1)
    if top_p_on:
        probs = _torch_top_p(torch, probs, top_p)
    if min_p_on:
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
    return torch.multinomial(probs, 1)[:, 0].to(torch.int32)


def _torch_topk_multinomial(torch, logits, temperature, k: int):
    """[B] int32 tokens by torch.topk + torch.multinomial as written: the k largest of logits / T,
    softmax over those k, multinomial, the index gathered back (no V-wide mask or softmax)."""
    vals, idx = torch.topk(logits / temperature[:, None], k, dim=-1)
    pick = torch.multinomial(torch.softmax(vals, dim=-1), 1)
    return idx.gather(1, pick)[:, 0].to(torch.int32)


def _compiled_from(peers_: dict[str, Callable], b: int) -> dict[str, Callable]:
    """torch.compile only from SAMPLING_COMPILE_B rows on, as the top-k cases."""
    return {k: f for k, f in peers_.items() if k != "torch_compile" or b >= SAMPLING_COMPILE_B}


def _torch_rejection_sample(torch, draft_probs, draft_tokens, target_probs, seed_offset):
    """rejection_sample in torch ops over the whole batch, as an engine without a fused kernel
    runs it: q and p gathered at the drafts, a draft accepted while u * q < p (torch.rand from the
    global generator: seed_offset is not read), the count by a cumulative product, then
    torch.multinomial over the residual max(p - q, 0) at the first rejection (p itself where that
    sums to 0) or over p[S] for the bonus token, placeholders after it."""
    from lkw import sampling

    b, s, _ = draft_probs.shape
    dev = draft_probs.device
    x = draft_tokens.long()[..., None]  # (B,S,1)
    q_x = draft_probs.gather(2, x)[..., 0]  # (B,S)
    p_x = target_probs[:, :s].gather(2, x)[..., 0]  # (B,S)
    accepted = torch.rand(b, s, device=dev) * q_x < p_x
    n = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,) drafts accepted
    rows = torch.arange(b, device=dev)
    p_n = target_probs[rows, n]  # (B,V) the target row at the stop
    residual = (p_n - draft_probs[rows, n.clamp(max=s - 1)]).clamp_min(0.0)
    dist = torch.where((n == s)[:, None], p_n, residual)
    dist = torch.where(dist.sum(dim=1, keepdim=True) == 0, p_n, dist)
    last = torch.multinomial(dist, 1)  # (B,1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[:, :1], sampling.PLACEHOLDER)], dim=1)
    slots = torch.arange(s + 1, device=dev)
    tokens = torch.where(slots < n[:, None], padded, torch.full_like(padded, sampling.PLACEHOLDER))
    return tokens.scatter(1, n[:, None], last.to(tokens.dtype)), n.to(torch.int32)


def top_p_renorm_cases() -> list[Case]:
    """top_p_renorm_probs at TOP_P_RUNS (shape "b=B,v=V,p=P"): probs the float32 softmax (torch, on
    the GPU) of lkw.sampling.lm_logits drawn from the case's seed, judged by _top_p_renorm_check.
    Peers: the engines' torch path (_torch_top_p_renorm, eager, and compiled from
    SAMPLING_COMPILE_B rows on) and FlashInfer's top_p_renorm_probs (lkw.peers.sampling_peers)."""
    from lkw import sampling

    cases = []
    for b, v, p in TOP_P_RUNS:

        def make(torch, gen, b=b, v=v, p=p):
            rng = np.random.default_rng([gen.initial_seed(), b, v, round(1000 * p)])
            probs = torch.softmax(torch.from_numpy(sampling.lm_logits(rng, b, v)).to("cuda"), dim=-1)
            top_p = torch.full((b,), p, dtype=torch.float32, device="cuda")
            return [probs, top_p], [torch.empty_like(probs)]

        cases.append(Case(
            "top_p_renorm_probs", f"b={b},v={v},p={p}", ["float32"] * 3, make, None,
            check=_top_p_renorm_check(), torch_peers=_compiled_from(_eager_and_compiled(_torch_top_p_renorm), b),
            library_peers=peers.sampling_peers("top_p_renorm_probs"), model_bytes=sampling.renorm_bytes(b, v)))
    return cases


def sample_cases() -> list[Case]:
    """`sample` at SAMPLE_RUNS (shape "b=B,v=V[,filters],T=T", SAMPLE_FILTERS): logits from
    lkw.sampling.lm_logits, the row parameters the same for every row, seed_offset (a seed drawn
    from the case's seed, offset 0) fixed, so every launch of a case draws the same tokens; judged
    by _sample_check. Peers: the engines' torch sampler (_torch_sample, eager, and compiled from
    SAMPLING_COMPILE_B rows on) and FlashInfer's sampling kernels for the case's filters."""
    from lkw import sampling

    cases = []
    for b, v, filters in SAMPLE_RUNS:
        k, p, min_p, t = SAMPLE_FILTERS[filters]
        which = list(SAMPLE_FILTERS).index(filters)  # each filter set its own logits

        def make(torch, gen, b=b, v=v, k=k, p=p, min_p=min_p, t=t, which=which):
            rng = np.random.default_rng([gen.initial_seed(), b, v, which])
            x = torch.from_numpy(sampling.lm_logits(rng, b, v)).to("cuda")
            seed_offset = torch.from_numpy(np.array([rng.integers(2**63), 0], np.int64)).to("cuda")
            rows = [torch.full((b,), value, dtype=dtype, device="cuda")
                    for value, dtype in ((t, torch.float32), (k, torch.int32), (p, torch.float32),
                                         (min_p, torch.float32))]
            return [x, *rows, seed_offset], [torch.empty(b, dtype=torch.int32, device="cuda")]

        def body(torch, x, t, top_k, top_p, mp, seed_offset, k=k, p=p, min_p=min_p):
            return _torch_sample(torch, x, t, top_p, mp, k, p < 1, min_p > 0)

        on = tuple(f for f, used in (("top_k", k > 0), ("top_p", p < 1), ("min_p", min_p > 0)) if used)
        torch_peers = _compiled_from(_eager_and_compiled(body), b)
        if on == ("top_k",):  # the goal's literal baseline: multinomial over the k values only
            torch_peers["torch_topk_multinomial"] = (
                lambda torch, ins, k=k: lambda: _torch_topk_multinomial(torch, ins[0], ins[1], k))
        cases.append(Case(
            "sample", ",".join([f"b={b}", f"v={v}", *([filters] if filters else []), f"T={t:g}"]),
            SAMPLE_DTYPES, make, None, check=_sample_check(),
            torch_peers=torch_peers,
            library_peers=peers.sampling_peers("sample", on), model_bytes=sampling.sample_bytes(b, v)))
    return cases


def rejection_sample_cases() -> list[Case]:
    """rejection_sample at REJECTION_RUNS (shape "b=B,s=S,v=V", S = REJECTION_S drafts per
    request): draft and target probs and the drafts from lkw.sampling.speculative_inputs, drawn on
    the host from the case's seed (at B = 256 the target probs alone are 657 MB), seed_offset fixed.
    The versions are checked against the reference with their own Philox uniforms
    (_rejection_check), the peers, whose random numbers differ, by the structure of the output
    (_rejection_structure). Peers: the algorithm in torch ops (eager) and FlashInfer's
    chain_speculative_sampling. model_bytes: lkw.sampling.rejection_bytes' worst case (every row
    tests every draft)."""
    from lkw import sampling

    s = REJECTION_S
    cases = []
    for b, v in REJECTION_RUNS:

        def make(torch, gen, b=b, v=v):
            rng = np.random.default_rng([gen.initial_seed(), b, v, s])
            q, drafts, p = sampling.speculative_inputs(rng, b, s, v)
            seed_offset = np.array([rng.integers(2**63), 0], np.int64)
            inputs = [torch.from_numpy(a).to("cuda") for a in (q, drafts, p, seed_offset)]
            return inputs, [torch.empty((b, s + 1), dtype=torch.int32, device="cuda"),
                            torch.empty(b, dtype=torch.int32, device="cuda")]

        def torch_eager(torch, inputs):
            return lambda: _torch_rejection_sample(torch, *inputs)

        cases.append(Case(
            "rejection_sample", f"b={b},s={s},v={v}", REJECTION_DTYPES, make, None,
            check=_rejection_check(), peer_check=_rejection_structure, torch_peers={"torch_eager": torch_eager},
            library_peers=peers.sampling_peers("rejection_sample"), model_bytes=sampling.rejection_bytes(b, s, v)))
    return cases


CHAPTERS: dict[str, Callable[[], list[Case]]] = {
    "00_roofline": roofline_cases,
    "01_formats": formats_cases,
    "02_int4_dequant": int4_dequant_cases,
    "03_dynamic_quant": dynamic_quant_cases,
    "04_rmsnorm": rmsnorm_cases,
    "05_elementwise": elementwise_cases,
    "06_int4_gemv": int4_gemv_cases,
    "07_w4a16_gemm": w4a16_gemm_cases,
    "08_fp8_gemm": fp8_gemm_cases,
    "09_moe": lambda: moe_cases() + moe_gemm_cases() + moe_gemm_sum_cases() + moe_w4a16_cases()
    + moe_fp8_cases() + moe_block_cases(),
    "10_sampling": lambda: sampling_cases() + top_p_renorm_cases() + sample_cases() + rejection_sample_cases(),
}

# A chapter's full measurement matrix where it is larger than one run should be (--extended):
# measured in parts (--shape, --op) and merged into the recorded run (--write-results --merge).
EXTENDED: dict[str, Callable[[], list[Case]]] = {
    "07_w4a16_gemm": lambda: w4a16_gemm_cases(shapes=W4A16_SHAPES + W4A16_EXTENDED_SHAPES,
                                              ms=sorted(set(W4A16_M) | set(W4A16_EXTENDED_M))),
}


def cases_of(chapter: str, ops: list[str] | None = None, shape: str | None = None,
             extended: bool = False) -> list[Case]:
    """The chapter's cases (its EXTENDED matrix when asked and defined), only `ops` where given,
    only the shapes that the regular expression `shape` finds a match in where given."""
    cases = (EXTENDED[chapter] if extended and chapter in EXTENDED else CHAPTERS[chapter])()
    pattern = re.compile(shape) if shape else None
    return [c for c in cases if (not ops or c.op in ops) and (pattern is None or pattern.search(c.shape))]


@dataclass(frozen=True)
class Part:
    """One run of a chapter's matrix: its ops (all where empty), a --shape pattern, --extended."""

    ops: tuple[str, ...] = ()
    shape: str | None = None
    extended: bool = False

    def args(self) -> str:
        """The part as tools/bench.py arguments."""
        out = [f"--op {op}" for op in self.ops]
        out += [f"--shape {shlex.quote(self.shape)}"] if self.shape else []
        return " ".join(out + (["--extended"] if self.extended else []))

    def cases(self, chapter: str) -> list[Case]:
        return cases_of(chapter, list(self.ops), self.shape, self.extended)


# A chapter's matrix in parts, each a run of its own merged into the recorded results (tools/bench.py
# --chapter C --part N --write-results --merge; tools/device_check.sh: LKW_CHAPTERS=C
# LKW_BENCH_PARTS="--part N"; --parts prints the parts and that line). Together the parts of a
# chapter take every case of its matrix (EXTENDED's where it has one) exactly once. Each is sized
# to end well inside the GPU machine's 10-minute call: about 2 to 5 minutes by the estimate of the
# timing rule (55 one-launch runs, then warm-up and 5 to 15 batches of at least 20 launches back
# to back and in a graph, per row), the recorded times of the rows where a run has them, about
# 10 s per torch.compile and half a minute to start (torch, the peers, the copy ceiling).
BENCH_PARTS: dict[str, list[Part]] = {
    "05_elementwise": [
        Part(("silu_and_mul", "gelu_and_mul")),
        Part(("gelu_tanh_and_mul", "silu_and_mul_fp8_per_tensor")),
        Part(("silu_and_mul_fp8_per_token", "silu_and_mul_fp8_per_group")),
        Part(("rope", "qk_norm_rope")),
        Part(("reshape_and_cache", "reshape_and_cache_fp8")),
        # qkv_rope_cache in one part ran past 320 s on the H100 (ten shapes, each with torch.compile
        # and both libraries' peers): by model and by T.
        Part(("qkv_rope_cache",), shape=r"^t=(1|16|128),.*llama3_8b"),
        Part(("qkv_rope_cache",), shape=r"^t=(1024|8192),.*llama3_8b"),
        Part(("qkv_rope_cache",), shape=r"^t=(1|16|128),.*llama3_70b"),
        Part(("qkv_rope_cache",), shape=r"^t=(1024|8192),.*llama3_70b"),
    ],
    "07_w4a16_gemm": [  # the default run by shape (M = 4096 apart), then the extended matrix
        # On the H100, M = 4096 of one 70B shape (both ops) took about 300 s (v7, the GEMV, is
        # 225 ms a launch there); M = 128, 256 and 1024 of both shapes ended inside 170 s each.
        Part(shape=r"^m=(1|16|64|256|1024),n=28672,"),
        Part(shape=r"^m=(1|16|64|256|1024),n=8192,"),
        Part(shape=r"^m=4096,n=28672,"),
        Part(shape=r"^m=4096,n=8192,"),
        Part(shape=r"^m=(32|128|512),n=(28672|8192),", extended=True),
        Part(shape="n=10240,", extended=True),
        Part(shape="n=14336,", extended=True),
        Part(shape="n=4096,", extended=True),
        Part(shape="n=6144,", extended=True),
    ],
    "08_fp8_gemm": [  # the squares, the DeepSeek shapes by M, the rowwise ones, then decode M
        Part(shape=r"^m=(4096|8192),n=(4096|8192),k=(4096|8192),"),
        Part(shape=r"^m=4096,n=\d+,k=(7168|1536|512|16384|2048),scale=blockwise"),
        Part(shape=r"^m=(64|128),.*scale=blockwise"),
        Part(shape=r"^m=(64|4096),n=(2112|24576|7168),.*scale=rowwise"),
        Part(shape=r"^m=(1|8),.*scale=blockwise"),
        Part(shape=r"^m=(16|32),.*scale=blockwise"),
        Part(shape=r"^m=2048,.*scale=blockwise"),
    ],
    "09_moe": [
        Part(("moe_align_block_size", "deepseek_router")),
        Part(("topk_softmax",)),
        Part(("topk_softmax_bf16",)),
        Part(("moe_grouped_gemm_silu",), "e=(8|128),"),
        Part(("moe_grouped_gemm_silu",), "e=256,"),
        Part(("moe_grouped_gemm", "moe_grouped_gemm_sum"), "e=(8|128),"),
        Part(("moe_grouped_gemm", "moe_grouped_gemm_sum"), "e=256,"),
        Part(("moe_sum", "moe_block")),
        Part(("moe_grouped_gemm_w4a16",)),
        Part(("moe_grouped_gemm_silu_fp8", "moe_grouped_gemm_fp8", "moe_grouped_gemm_sum_fp8"), "e=(8|128),"),
        Part(("moe_grouped_gemm_silu_fp8", "moe_grouped_gemm_fp8", "moe_grouped_gemm_sum_fp8"), "e=256,"),
    ],
    "10_sampling": [
        Part(("top_k_mask_logits",)),
        Part(("top_k_renorm_probs",)),
        Part(("top_p_renorm_probs",), "v=128256,"),
        Part(("top_p_renorm_probs", "rejection_sample"), "v=(32000|152064)|s=4,"),
        Part(("sample",), "^b=(1|16|64),"),
        Part(("sample",), "^b=256,"),
    ],
}


def parts_text(chapters: list[str]) -> str:
    """Each chapter's parts, numbered as --part takes them, and the tools/device_check.sh line."""
    out = []
    for c in chapters:
        if c not in BENCH_PARTS:
            out.append(f"{c}: no parts (one run: tools/bench.py --chapter {c})")
            continue
        out.append(f"{c}:")
        out += [f"  --part {i}: {p.args() or '(every case)'} ({len(p.cases(c))} cases)"
                for i, p in enumerate(BENCH_PARTS[c], 1)]
        out.append(f'  one part a call, N = 1 .. {len(BENCH_PARTS[c])}: LKW_CHAPTERS={c} LKW_BENCH_PARTS="--part N" '
                   f"LKW_PART_TIMEOUT={PART_TIMEOUT} tools/device_check.sh build peers bench")
    return "\n".join(out)


# The seconds a part may run under tools/device_check.sh (its LKW_PART_TIMEOUT), inside a 10-minute
# call with the peers' setup before it.
PART_TIMEOUT = 480


# ------------------------------------------------------------------------------------------------
# Running


def ext():
    from lkw import _ext

    return _ext


def compare(got: np.ndarray, ref: np.ndarray, dtype: str, tolerance: str = "exact",
            key: np.ndarray | None = None) -> dict:
    """The harness's comparison (C++, common/lkw/compare.h) on two host arrays of the same bits;
    a multiset tolerance (multiset:KEY:WIDTH) needs `key`, the reference's int32 key output."""
    got, ref = np.ascontiguousarray(got), np.ascontiguousarray(ref)
    if got.nbytes != ref.nbytes or got.size != ref.size:
        raise ValueError(f"compare: {got.shape} {got.dtype} vs {ref.shape} {ref.dtype}")
    if key is None:
        return ext().compare(got.ctypes.data, ref.ctypes.data, got.size, dtype, tolerance)
    key = np.ascontiguousarray(key)
    return ext().compare(got.ctypes.data, ref.ctypes.data, got.size, dtype, tolerance,
                         key=key.ctypes.data, keys=key.size)


@dataclass
class Checked:
    """What `_reference` gives for a case with a check (Case.check): the host inputs (then the
    initial outputs) the check reads, in place of reference outputs."""

    host_inputs: list[np.ndarray]


CHECK_SHOWN = 3  # problems a failed check prints (then how many more)


def _run_check(case: Case, outputs, expected: Checked, peer: bool,
               only: tuple[int, ...] | None = None) -> dict:
    """A launch's outputs (host bits; None for one not produced, or not in `only`) judged by the
    case's check, or its peer_check for a peer."""
    check = (case.peer_check or case.check) if peer else case.check
    host = [None if out is None or (only is not None and i not in only) else _host_bits(out)
            for i, out in enumerate(outputs)]
    problems = check(expected.host_inputs, host)
    if not problems:
        return {"pass": True, "text": f"{'peer ' if peer and case.peer_check else ''}check passed"}
    more = f"; {len(problems) - CHECK_SHOWN} more" if len(problems) > CHECK_SHOWN else ""
    return {"pass": False, "text": "; ".join(problems[:CHECK_SHOWN]) + more}


def _verify(case: Case, inputs, outputs, expected, tolerance: str | None = None,
            only: tuple[int, ...] | None = None, peer: bool = False) -> dict:
    """Compare every output of a launch (or those in `only`) with the reference (on sampled rows
    where set), or judge them by the case's check (`expected` is then Checked; `peer` picks the
    peer check)."""
    if isinstance(expected, Checked):
        return _run_check(case, outputs, expected, peer, only)
    reports = []
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        if out is None or (only is not None and i not in only):
            continue
        got = _host_bits(out)
        dtype = case.dtypes[len(inputs) + i]
        if case.sample_rows:
            got = case.cut[i](got, case.sample_rows) if i in case.cut else got[: case.sample_rows]
        tol = tolerance_of(tolerance or case.tolerance, i)
        key = expected[int(tol.split(":")[1])] if tol.startswith("multiset:") else None
        reports.append(compare(got, ref, dtype, tol, key))
    ok = bool(reports) and all(r["pass"] for r in reports)
    return {"pass": ok, "text": "; ".join(r["text"] for r in reports) or "no output compared"}


def tolerance_of(tolerance: str, output: int) -> str:
    """Output i's tolerance from "t" (every output) or "t0/t1/..." (one per output)."""
    parts = tolerance.split("/")
    return parts[0] if len(parts) == 1 else parts[output]


def _reference(case: Case, host_inputs: list[np.ndarray], host_initial=()) -> list[np.ndarray] | Checked:
    """The case's reference outputs from the host inputs (cut to the sampled rows where the case
    samples), then the outputs' initial contents where it updates them in place; for a case with
    a check, what the check reads (Checked)."""
    if case.check is not None:
        return Checked([*host_inputs, *host_initial])
    if case.sample_rows and not case.reference_sees_all:
        # The sampled rows of every input that has the first input's rows (x, a residual), not
        # of the others (a weight vector, even one as long as T).
        rows = host_inputs[0].shape[0]
        cut = [a[: case.sample_rows] if a.ndim >= 2 and a.shape[0] == rows else a for a in host_inputs]
        return case.expected([*cut, *host_initial])
    return case.expected([*host_inputs, *host_initial])


def rotation_sets(set_bytes: int, l2_bytes: int) -> int:
    """The rotation rule on one set's bytes: enough sets that they exceed twice the L2, plus one,
    and at least two (_rotations below; chapter 11's layer copies and per-step copies)."""
    return max(2, math.ceil(2 * l2_bytes / max(1, set_bytes)) + 1)


def _rotations(inputs, outputs, l2_bytes: int, past_largest: bool = False, touched: int | None = None) -> int:
    """How many input/output sets make the rotated working set exceed twice the L2, plus one (back
    to back, no flush between launches: between two launches on one set the others read more than
    twice the L2), and at least two. past_largest (Case.rotate_past_largest): enough that the sets
    without their largest input exceed twice the L2 too. touched (Case.rotation_bytes): the bytes
    of a set one launch touches, where fewer than its tensors'. One rule for all three timing modes."""
    sizes = [t.numel() * t.element_size() for t in inputs + outputs]
    sets = rotation_sets(touched or sum(sizes), l2_bytes)
    if past_largest:
        sets = max(sets, rotation_sets(sum(sizes) - max(sizes[: len(inputs)]), l2_bytes))
    return sets


# Back to back and in a CUDA graph: launches per pair of events (at least this many, and at least
# one per input set, so that a graph, which replays the same launches, rotates over every set), and
# batches timed (their median per launch): BACK_TO_BACK_BATCHES, fewer for a long batch, never
# fewer than MIN_BATCHES.
BACK_TO_BACK = 20
BACK_TO_BACK_BATCHES = 15
MIN_BATCHES = 5
# After timing, at most this many input sets (evenly spread, first and last included) have their
# outputs checked again: a decode shape rotates thousands of sets of a few KiB.
CHECKED_SETS = 64


def _batching(sets: int) -> tuple[int, int]:
    """(launches per batch, batches) for back-to-back and graph timing over `sets` input sets."""
    batch = max(BACK_TO_BACK, sets)
    batches = max(MIN_BATCHES, min(BACK_TO_BACK_BATCHES, math.ceil(BACK_TO_BACK * BACK_TO_BACK_BATCHES / batch)))
    return batch, batches


def _spread(n: int, at_most: int = CHECKED_SETS) -> list[int]:
    """Indices of at most `at_most` of n items, evenly spread, the first and the last included."""
    if n <= at_most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (at_most - 1)) for i in range(at_most)})


_SKIPPED_PEERS: set[str] = set()
OPTIONS = {"library_peers": True}  # --no-library-peers turns the production peers off


def measure_case(case: Case, versions: list[dict], *, warmup: int, iters: int, l2_bytes: int,
                 log=print, chapter: str | None = None, only: str | None = None) -> list[dict]:
    """Every version and peer of one case, each verified, timed in the three modes (one launch after
    an L2 flush, back to back, in a CUDA graph) over the same rotated input sets, and verified again.
    The peers' rows carry the versions' byte and FLOP model (the case's where no version runs).
    only: a regular expression the peers' names must match (run_chapter's --only)."""
    import torch

    start = time.perf_counter()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(case.seed)
    typed_inputs, typed_outputs = case.make(torch, gen)
    inputs, outputs = _raw(typed_inputs), _raw(typed_outputs)
    # An in-place op's outputs as make() left them: what every set starts from (Case.initial_outputs).
    initial = [t.clone() for t in outputs] if case.initial_outputs else None
    host_inputs = [_host_bits(t) for t in inputs]
    expected = _reference(case, host_inputs, [_host_bits(t) for t in initial or []])
    made = time.perf_counter()
    shared = set(case.shared_inputs)
    rotated = [t for i, t in enumerate(inputs) if i not in shared]
    sets = _rotations(rotated, outputs, l2_bytes, case.rotate_past_largest, case.rotation_bytes)
    if case.max_sets:
        sets = min(sets, case.max_sets)
    arg_sets = [(inputs, outputs)] + [
        ([t if i in shared else t.clone() for i, t in enumerate(inputs)],
         [t.clone() if initial else torch.empty_like(t) for t in outputs]) for _ in range(sets - 1)
    ]
    rows = []
    for v in versions:
        name = v["name"]
        _prime(arg_sets, initial)
        ext().launch(name, inputs, arg_sets[0][1], params=case.params, dtypes=case.dtypes)
        torch.cuda.synchronize()
        before = _verify(case, inputs, arg_sets[0][1], expected)
        row = {
            "name": name, "op": v["op"], "version": v["id"], "kind": v["kind"],
            "summary": v["summary"], "shape": case.shape,
        }
        model = ext().model(name, inputs, outputs, params=case.params, dtypes=case.dtypes)
        row["model_bytes"] = model["bytes"]
        row["flops"] = model["flops"]
        if not before["pass"]:
            log(f"  {name}: WRONG before timing: {before['text']}")
            row.update(correct=False, time_us=None, gbps=None, tflops=None, check=before["text"])
            rows.append(row)
            continue
        # The flush also gives the host a head start: the events time the GPU's work, not the
        # launcher's argument checks (which a small kernel would otherwise wait for).
        t = ext().time(name, arg_sets, params=case.params, dtypes=case.dtypes, warmup=warmup, iters=iters, flush_l2=True)
        torch.cuda.synchronize()
        # Launch i used set i % len(arg_sets): with more sets than launches (small shapes, many
        # rotations), the sets past the last launch were never written.
        launched = arg_sets[: warmup + iters]
        after = [(i, _verify(case, *launched[i], expected)) for i in _spread(len(launched))]
        bad = [i for i, a in after if not a["pass"]]
        if bad:
            text = next(a["text"] for i, a in after if i == bad[0])
            log(f"  {name}: WRONG after timing in sets {bad} of {len(launched)}: {text[:300]}")
        row.update(correct=not bad, time_us=t["median_us"], time_min_us=t["min_us"], time_max_us=t["max_us"],
                   iters=t["iters"], rotations=sets)
        if not bad:
            row.update(_back_to_back(case, name, arg_sets, expected, warmup=warmup, log=log, initial=initial))
        _rates(row)
        rows.append(row)
    model_bytes = next((r["model_bytes"] for r in rows if r["kind"] == "version"), case.model_bytes)
    flops = next((r["flops"] for r in rows if r["kind"] == "version"), case.flops) or 0.0
    chapter = versions[0]["chapter"] if versions else chapter or "?"
    # The peers' input sets: typed views of the versions' sets (clones of set 0), never written by
    # a peer (lkw.peers works on copies where a kernel writes its inputs), followed by the initial
    # outputs of an in-place op (Case.initial_outputs), which a peer copies before writing.
    typed_initial = [r.view(to.dtype) for r, to in zip(initial, typed_outputs)] if initial else []
    typed_sets = [[*(r.view(ti.dtype) for r, ti in zip(ins, typed_inputs)), *typed_initial] for ins, _ in arg_sets]
    all_peers = [(p, f, False) for p, f in case.torch_peers.items()]
    if OPTIONS["library_peers"]:
        all_peers += [(p, f, True) for p, f in case.library_peers.items()]
    for peer, factory, production in all_peers:
        if only and not re.search(only, peer):
            continue
        row = measure_peer(case, chapter, peer, factory, typed_sets, inputs, expected, model_bytes,
                           production=production, warmup=warmup, iters=iters, log=log, flops=flops)
        if row is not None:
            rows.append(row)
        torch.cuda.empty_cache()
    del arg_sets, typed_sets, inputs, outputs, typed_inputs, typed_outputs, initial, typed_initial
    torch.cuda.empty_cache()
    # Progress, with where a long run's time goes (a device run with PYTHONUNBUFFERED shows it live).
    log(f"  {case.op} {case.shape}: inputs and reference {made - start:.1f} s, {len(rows)} rows in "
        f"{time.perf_counter() - made:.1f} s")
    return rows


# Rounds: the figures one kernel's rows give in one run spread further than the gaps between some
# versions (compute-bound FP8 shapes: clocks and power move between rows timed one after another).
# --rounds N measures every row of a case N times, round after round, so that each version and
# peer is timed next to the others in every round; a row keeps the median of its rounds.
_TIMED = [(mkey(mode, "us"), mkey(mode, "min_us"), mkey(mode, "max_us")) for mode in MODES]


def combine_rounds(rounds: list[list[dict]]) -> list[dict]:
    """The rows of a case measured in several rounds (measure_case's lists, in one order): each
    row once, in the first round's order (then any row a later round alone has), with the median
    of its rounds' figures in each timing mode, the least minimum and the greatest maximum, and the
    figures of every round (graph_us_rounds ...). A row wrong in any round is that round's row,
    as it was (a wrong row has no figures to combine); a mode timed in only some rounds takes the
    median of those."""
    if len(rounds) == 1:
        return rounds[0]
    order: list[str] = []
    by_name: dict[str, list[dict]] = {}
    for rows in rounds:
        for r in rows:
            if r["name"] not in by_name:
                order.append(r["name"])
                by_name[r["name"]] = []
            by_name[r["name"]].append(r)
    out = []
    for name in order:
        seen = by_name[name]
        wrong = next((r for r in seen if r.get("correct") is False), None)
        if wrong is not None:
            out.append({**wrong, "rounds": len(seen)})
            continue
        row = dict(seen[0])
        for us, lo, hi in _TIMED:
            figures = [r[us] for r in seen if r.get(us)]
            if not figures:
                continue
            row[us] = _median(sorted(figures))
            row[f"{us}_rounds"] = figures
            row[lo] = min(r.get(lo) or r[us] for r in seen if r.get(us))
            row[hi] = max(r.get(hi) or r[us] for r in seen if r.get(us))
        row["rounds"] = len(seen)
        _rates(row)
        out.append(row)
    return out


def _prime(arg_sets, initial: list | None) -> None:
    """Before a verified or timed run: every set's outputs poisoned, so that an element a launch
    does not write fails the check, or, for an in-place op (Case.initial_outputs), restored to the
    initial contents, which the elements no launch writes must keep."""
    for _, outs in arg_sets:
        for i, t in enumerate(outs):
            if initial is None:
                _poison(t)
            else:
                t.copy_(initial[i])


def _rates(row: dict) -> None:
    """GB/s (and TFLOP/s where the row counts FLOPs) of every mode the row was timed in."""
    for mode in MODES:
        us = row.get(mkey(mode, "us"))
        row[mkey(mode, "gbps")] = row["model_bytes"] / (us * 1e3) if us and row.get("model_bytes") else None
        row[mkey(mode, "tflops")] = row["flops"] / (us * 1e6) if us and row.get("flops") else None


def _median(sorted_us: list[float]) -> float:
    n = len(sorted_us)
    return 0.5 * (sorted_us[(n - 1) // 2] + sorted_us[n // 2])


def _as_peer_call(fn) -> peers.PeerCall:
    return fn if isinstance(fn, peers.PeerCall) else peers.PeerCall(fn)


def _outs(result) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _check_peer(case: Case, fn: peers.PeerCall, outs, inputs, expected) -> dict:
    """A peer's outputs against the reference (the outputs it produces comparably), with the case's
    peer tolerance, and the peer's own check where it has one. An in-place peer is first reset and
    called once more: its timed calls ran on what the previous call left."""
    import torch

    if fn.reset is not None:
        fn.reset()
        outs = _outs(fn())
        torch.cuda.synchronize()
    check = _verify(case, inputs, outs, expected, case.peer_tolerance, only=fn.checked, peer=True)
    if fn.extra_check is not None:
        ok, text = fn.extra_check(outs)
        check = {"pass": check["pass"] and ok, "text": f"{check['text']}; {text}"}
    return check


def measure_peer(case: Case, chapter: str, peer: str, factory: Callable, typed_sets: list, inputs, expected,
                 model_bytes: float | None, *, production: bool, warmup: int, iters: int, log=print,
                 flops: float = 0.0) -> dict | None:
    """A peer as a row, verified like a version (same reference, the case's peer tolerance) and timed
    like one: one launch after an L2 flush, back to back and in a CUDA graph, rotating over one
    prepared call per input set (a peer that packs its weights packs each set's, untimed). None for
    a production peer whose library is not here (the reason is printed once)."""
    import torch

    name = f"{chapter}/{case.op}/{peer}"
    row = {"name": name, "op": case.op, "version": peer, "kind": "peer",
           "summary": f"torch {torch.__version__}", "shape": case.shape,
           "model_bytes": model_bytes, "flops": flops}
    try:
        fns = [_as_peer_call(factory(torch, typed_sets[0]))]
        if production:
            lib = peer.split()[0]
            row["summary"] = peers.status_of(lib)
        if fns[0].summary:
            row["summary"] = fns[0].summary
        outs = _outs(fns[0]())
        torch.cuda.synchronize()
    except peers.Absent as e:
        if peer not in _SKIPPED_PEERS:
            _SKIPPED_PEERS.add(peer)
            log(f"  peer {peer}: skipped: {e}")
        return None
    except Exception as e:  # noqa: BLE001  (a peer that does not run here: no Triton, a signature)
        log(f"  {name}: does not run here: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        row.update(correct=False, time_us=None, gbps=None, tflops=None, check=f"does not run: {type(e).__name__}")
        return row
    check = _verify(case, inputs, outs, expected, case.peer_tolerance, only=fns[0].checked, peer=True)
    if fns[0].extra_check is not None:
        ok, text = fns[0].extra_check(outs)
        check = {"pass": check["pass"] and ok, "text": f"{check['text']}; {text}"}
    if not check["pass"]:
        log(f"  {name}: WRONG: {check['text'][:300]}")
        row.update(correct=False, time_us=None, gbps=None, tflops=None, check=check["text"])
        return row
    if fns[0].checked is not None or fns[0].extra_check is not None:
        row["check"] = check["text"]  # what was compared, and how
    try:
        fns += [_as_peer_call(factory(torch, ts)) for ts in typed_sets[1:]]
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (say why, do not stop the run)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        log(f"  {name}: not prepared for the {len(typed_sets)} rotated input sets: {why}")
        row.update(correct=False, time_us=None, gbps=None, tflops=None, check=f"not prepared: {why}")
        return row
    for i in range(max(warmup, len(fns))):
        fns[i % len(fns)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        ext().flush_l2()
        starts[i].record()
        outs = fns[i % len(fns)]()
        stops[i].record()
    torch.cuda.synchronize()
    us = sorted(1000.0 * a.elapsed_time(b) for a, b in zip(starts, stops))
    after = _check_peer(case, fns[(iters - 1) % len(fns)], _outs(outs), inputs, expected)
    if not after["pass"]:
        log(f"  {name}: WRONG after timing: {after['text'][:300]}")
    row.update(correct=after["pass"], time_us=_median(us), time_min_us=us[0], time_max_us=us[-1], iters=iters,
               rotations=len(fns))
    if after["pass"]:
        try:
            row.update(_peer_back_to_back(case, name, fns, inputs, expected, warmup=warmup, log=log))
        except Exception as e:  # noqa: BLE001  (say why, keep the one-launch figure)
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            log(f"  {name}: not timed back to back: {why}")
            torch.cuda.synchronize()
            row.update(back_to_back_correct=None, back_to_back_us=None, graph_correct=None, graph_us=None,
                       graph_error=f"not timed back to back: {why}")
    _rates(row)
    return row


def _back_to_back(case: Case, name: str, arg_sets, expected, *, warmup: int, log=print,
                  initial: list | None = None) -> dict:
    """Time a version back to back over the rotated sets, then the same batch captured in a CUDA
    graph; before each the outputs are poisoned (restored to `initial`, an in-place op's initial
    contents), after each the outputs of (up to CHECKED_SETS of) the sets are checked again. The row's back_to_back_* and graph_* fields, or *_correct False where
    a check failed (a version that cannot be captured keeps its back-to-back fields only)."""
    import torch

    batch, batches = _batching(len(arg_sets))

    def timed(what: str, graph: bool) -> dict | None:
        _prime(arg_sets, initial)
        t = ext().time(name, arg_sets, params=case.params, dtypes=case.dtypes, warmup=max(warmup, len(arg_sets)),
                       iters=batches, batch=batch, graph=graph)
        torch.cuda.synchronize()
        after = [(i, _verify(case, *arg_sets[i], expected)) for i in _spread(len(arg_sets))]
        bad = [i for i, a in after if not a["pass"]]
        if bad:
            text = next(a["text"] for i, a in after if i == bad[0])
            log(f"  {name}: WRONG after timing {what} in sets {bad} of {len(arg_sets)}: {text[:300]}")
            return None
        return t

    t = timed("back to back", graph=False)
    if t is None:
        return {"back_to_back_correct": False, "back_to_back_us": None, "graph_correct": None, "graph_us": None}
    row = {"back_to_back_correct": True, "back_to_back_us": t["median_us"], "back_to_back_min_us": t["min_us"],
           "back_to_back_max_us": t["max_us"], "back_to_back_batches": t["iters"], "back_to_back_batch": batch}
    try:
        g = timed("in a CUDA graph", graph=True)
    except RuntimeError as e:  # a launch that cannot be captured
        why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        log(f"  {name}: not timed in a CUDA graph: {why}")
        row.update(graph_correct=None, graph_us=None, graph_error=why)
        return row
    if g is None:
        row.update(graph_correct=False, graph_us=None)
    else:
        row.update(graph_correct=True, graph_us=g["median_us"], graph_min_us=g["min_us"], graph_max_us=g["max_us"],
                   graph_launches=g["iters"], graph_batch=batch)
    return row


def _peer_back_to_back(case: Case, name: str, fns: list[peers.PeerCall], inputs, expected, *, warmup: int,
                       log=print) -> dict:
    """A peer back to back: batches of calls between two events, rotating over one call per input
    set (_batching), the median per call; then each checked call's last outputs (up to CHECKED_SETS)
    against the reference. Then in a CUDA graph (_peer_in_graph)."""
    import torch

    batch, batches = _batching(len(fns))
    calls = 0
    for _ in range(max(warmup, len(fns))):
        fns[calls % len(fns)]()
        calls += 1
    checked = set(_spread(len(fns)))
    last: dict[int, list] = {}
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(batches)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(batches)]
    for b in range(batches):
        starts[b].record()
        for _ in range(batch):
            i = calls % len(fns)
            outs = fns[i]()
            if i in checked:
                last[i] = outs
            calls += 1
        stops[b].record()
    torch.cuda.synchronize()
    us = sorted(1000.0 * a.elapsed_time(z) / batch for a, z in zip(starts, stops))
    for i in sorted(last):
        check = _check_peer(case, fns[i], _outs(last[i]), inputs, expected)
        if not check["pass"]:
            log(f"  {name}: WRONG after back-to-back timing (set {i}): {check['text'][:300]}")
            return {"back_to_back_correct": False, "back_to_back_us": None, "graph_correct": None, "graph_us": None}
    del last
    row = {"back_to_back_correct": True, "back_to_back_us": _median(us),
           "back_to_back_min_us": us[0], "back_to_back_max_us": us[-1], "back_to_back_batches": len(us),
           "back_to_back_batch": batch}
    row.update(_peer_in_graph(case, name, fns, inputs, expected, log=log))
    return row


def _peer_in_graph(case: Case, name: str, fns: list[peers.PeerCall], inputs, expected, *, log=print) -> dict:
    """A peer in a CUDA graph, as the versions (ext's time with graph=True): a batch of calls
    rotating over the sets captured once (torch.cuda.graph, after warm-up calls on the capture's
    side stream), the graph replayed between events; then the outputs the graph rewrites on every
    replay (of up to CHECKED_SETS calls, poisoned before the replays) checked. An in-place peer is
    checked by a reset and one call outside the graph instead (_check_peer)."""
    import torch

    batch, batches = _batching(len(fns))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    checked = set(_spread(len(fns)))
    captured: dict[int, list] = {}
    try:
        with torch.cuda.stream(side):
            for fn in fns:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for j in range(batch):
                i = j % len(fns)
                outs = fns[i]()
                if i in checked:
                    captured[i] = _outs(outs)
    except Exception as e:  # noqa: BLE001  (a peer that cannot be captured)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        log(f"  {name}: not timed in a CUDA graph: {why}")
        torch.cuda.synchronize()
        return {"graph_correct": None, "graph_us": None, "graph_error": why}
    for i, outs in captured.items():
        if fns[i].reset is None:  # an in-place peer's outputs are its next call's inputs: left as they are
            for t in outs:
                if t is not None:
                    _poison(t)
    graph.replay()
    graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(batches)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(batches)]
    for b in range(batches):
        starts[b].record()
        graph.replay()
        stops[b].record()
    torch.cuda.synchronize()
    us = sorted(1000.0 * a.elapsed_time(z) / batch for a, z in zip(starts, stops))
    checks = [_check_peer(case, fns[i], outs, inputs, expected) for i, outs in sorted(captured.items())]
    del graph, captured
    bad = next((c for c in checks if not c["pass"]), None)
    if bad is not None:
        log(f"  {name}: WRONG after timing in a CUDA graph: {bad['text'][:300]}")
        return {"graph_correct": False, "graph_us": None}
    return {"graph_correct": True, "graph_us": _median(us), "graph_min_us": us[0], "graph_max_us": us[-1],
            "graph_launches": len(us), "graph_batch": batch}


def versions_of(chapter: str, op: str) -> list[dict]:
    return [v for v in ext().versions() if v["chapter"] == chapter and v["op"] == op and v["kind"] != "mutant"]


def _best_by_mode(rows: list[dict]) -> dict[str, float | None]:
    """The best GB/s of correct version rows in each timing mode."""
    best = {}
    for mode in MODES:
        rates = [r[mkey(mode, "gbps")] for r in rows
                 if r["kind"] == "version" and r["correct"] and r.get(mkey(mode, "gbps"))]
        best[mode] = max(rates) if rates else None
    return best


def measure_ceiling(*, warmup, iters, l2_bytes, log=print) -> tuple[dict[str, float | None], str, list[dict]]:
    """The run's copy ceiling in each timing mode (the best chapter-00 copy timed that way), the
    name of the copy that is best one launch at a time (the same-size copies run it), its rows."""
    chapter, op = CEILING_OP
    case = next(c for c in CHAPTERS[chapter]() if c.op == op)
    rows = measure_case(case, versions_of(chapter, op), warmup=warmup, iters=iters, l2_bytes=l2_bytes, log=log)
    best = max((r for r in rows if r["kind"] == "version" and r["correct"]), key=lambda r: r["gbps"])
    return _best_by_mode(rows), best["name"], rows


def measure_tensor_peak(*, warmup, iters, l2_bytes, log=print) -> dict[str, float]:
    """The BF16 tensor peak measured now, in each timing mode: the row the recorded peak is read
    from (results.TENSOR_PEAK_ROW, chapter 00's cuBLAS GEMM) timed and checked as the bench times
    it, for a GPU that has no chapter 00 run recorded. Modes without a correct TFLOP/s are left
    out."""
    from lkw import results

    chapter, op, version = results.TENSOR_PEAK_ROW
    case = next(c for c in CHAPTERS[chapter]() if c.op == op)
    peer = [v for v in versions_of(chapter, op) if v["id"] == version]
    rows = measure_case(case, peer, warmup=warmup, iters=iters, l2_bytes=l2_bytes, log=log)
    return {m: t for r in rows for m, t in results.peak_of_row(r).items()}


def same_size_copy(model_bytes: float | None, copy_name: str, cache: dict, *, warmup, iters,
                   l2_bytes, log=print) -> dict[str, float | None] | None:
    """GB/s of the ceiling's copy kernel moving the same bytes as a version's model (half read,
    half written), in each timing mode. The ceiling is measured on 512 MiB; a smaller transfer pays
    the ramp-up and drain of the GPU a larger share, and this is the best a kernel of that size can
    hope for."""
    if not model_bytes or model_bytes < 8 << 20 or copy_name.split("/")[0] != CEILING_OP[0]:
        return None  # below 8 MiB the rows are latency, not bandwidth
    if model_bytes > 8 * CEILING_WORDS:
        return None  # larger than the ceiling's own copy: the ceiling is the same-size copy
    words = int(model_bytes // 8) // 4 * 4
    if words not in cache:

        def make(torch, gen):
            src = torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device="cuda", generator=gen)
            return [src], [torch.empty_like(src)]

        case = Case(CEILING_OP[1], f"n={words}", ["uint32", "uint32"], make, lambda x: [roofline.copy(x[0])])
        copy = [v for v in versions_of(*CEILING_OP) if v["name"] == copy_name]
        rows = measure_case(case, copy, warmup=warmup, iters=iters, l2_bytes=l2_bytes, log=log)
        cache[words] = _best_by_mode(rows) if rows and rows[0]["correct"] else None
    return cache[words]


# Peers measured under an op of their own: every INT4 GEMV is compared with cuBLAS on BF16 weights
# (op bf16_gemv) and, but the zero-point op (a different computation), with the INT4 peers measured
# under int4i_gemv (torch's INT4 kernel, Marlin, Machete), at the same shape string.
PEER_OPS = {op: ("bf16_gemv",) if op == "int4i_zp_gemv" else ("bf16_gemv", "int4i_gemv")
            for op in ("int4_gemv", "int4i_gemv", "int4i_zp_gemv", "int4t_gemv")}
# Chapter 07: the repacked op meets the peers measured under the natural one, at the same shape.
PEER_OPS["w4a16r_gemm"] = ("w4a16_gemm",)


def _peer_ratios(rows: list[dict]) -> None:
    """Each version row gets, per peer of the same op (or of a PEER_OPS op) and shape: peer time /
    version time in each timing mode where both were timed so (graph_ratio, back_to_back_ratio,
    ratio for one launch)."""
    for r in rows:
        r["peers"] = {}
        if r["kind"] != "version":
            continue
        ops = (r["op"], *PEER_OPS.get(r["op"], ()))
        for p in rows:
            if p["kind"] != "peer" or p["op"] not in ops or p["shape"] != r["shape"]:
                continue
            entry = {}
            for mode in ("graph", "back_to_back", "one_launch"):
                mine, theirs = r.get(mkey(mode, "us")), p.get(mkey(mode, "us"))
                if mine and theirs:
                    entry[mkey(mode, "us")] = theirs
                    entry[mkey(mode, "ratio")] = theirs / mine
            if entry:
                r["peers"][p["version"]] = entry


def _gpu_slug(name: str) -> str:
    """The results folder of a GPU (lkw.results.gpu_slug; tools/device_check.sh asks it here)."""
    from lkw import results

    return results.gpu_slug(name)


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _commit() -> str:
    if os.environ.get("LKW_COMMIT"):
        return os.environ["LKW_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=False).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


# The results' version of the timing rule: every row timed one launch after a flush, back to back
# and in a CUDA graph, the graph the headline (lkw.results reads older files without these).
TIMING_MODES = ["one_launch", "back_to_back", "graph"]
HEADLINE = "graph"


def _device_answers() -> bool:
    """After a failed case: whether the device still runs work (its cached memory released)."""
    try:
        import torch
    except ImportError:
        return True
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return True
    except Exception:  # noqa: BLE001
        return False


def run_chapter(chapter: str, *, ceiling: tuple[dict, str, list[dict]], warmup: int, iters: int,
                l2_bytes: int, ops: list[str] | None = None, shape: str | None = None, extended: bool = False,
                peer_status: dict | None = None, rounds: int = 1, only: str | None = None, log=print) -> dict:
    dev = ext().device()
    ceilings, ceiling_name, ceiling_rows = ceiling
    rows = []
    case_errors: list[dict] = []
    copies: dict[int, dict | None] = {}
    for case in cases_of(chapter, ops, shape, extended):
        if chapter == CEILING_OP[0] and case.op == CEILING_OP[1]:
            rows += ceiling_rows  # already measured at the start of this run
            continue
        try:
            versions = [v for v in versions_of(chapter, case.op) if not only or re.search(only, v["id"])]
            case_rows = combine_rounds([
                measure_case(case, versions, warmup=warmup, iters=iters, l2_bytes=l2_bytes, log=log,
                             chapter=chapter, only=only) for _ in range(rounds)])
        except Exception as e:  # noqa: BLE001  (one case's make, reference or version launch: the run goes on)
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            log(f"  {case.op} {case.shape}: FAILED outside the per-row checks: {why}")
            case_errors.append({"op": case.op, "shape": case.shape, "error": why})
            if not _device_answers():  # a sticky CUDA error: keep what was measured
                log("bench: the CUDA context is lost; the rows measured so far are kept")
                break
            continue
        model_bytes = next((r["model_bytes"] for r in case_rows if r["kind"] == "version"), case.model_bytes)
        same = same_size_copy(model_bytes, ceiling_name, copies, warmup=warmup, iters=iters,
                              l2_bytes=l2_bytes, log=log) or {}
        for r in case_rows:
            for mode in MODES:
                copy = same.get(mode)
                rate = r.get(mkey(mode, "gbps"))
                r[mkey(mode, "same_size_copy_gbps")] = copy
                r[mkey(mode, "pct_same_size_copy")] = 100.0 * rate / copy if copy and rate else None
        rows += case_rows
    for r in rows:
        for mode in MODES:
            top, rate = ceilings.get(mode), r.get(mkey(mode, "gbps"))
            r[mkey(mode, "pct_ceiling")] = 100.0 * rate / top if top and rate else None
        r.setdefault("dram_bytes", None)
        r.setdefault("dram_ratio", None)
    _peer_ratios(rows)
    peak_fields = _tensor_peak_fields(chapter, dev["name"], rows, log=log)
    rt = dev["runtime_version"]
    return {
        "chapter": chapter,
        "gpu": dev["name"],
        "driver": _driver(),
        "cuda": f"{rt // 1000}.{(rt % 1000) // 10}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _commit(),
        "timing_modes": TIMING_MODES,
        "headline": HEADLINE,
        **{mkey(mode, "ceiling_gbps"): ceilings.get(mode) for mode in MODES},
        "ceiling_version": ceiling_name,
        "peer_libraries": peer_status or {},
        **peak_fields,
        **({"case_errors": case_errors} if case_errors else {}),
        "rows": rows,
    }


def _tensor_peak_fields(chapter: str, gpu_name: str, rows: list[dict], log=print) -> dict:
    """For a chapter read against the tensor cores (results.TENSOR_PEAK_CHAPTERS): the BF16 tensor
    peak recorded for this GPU (results.tensor_peak: chapter 00's cuBLAS GEMM row, read now) as the
    run's tensor_peak_tflops of each mode and tensor_peak_source, and each row's pct_tensor_peak of
    each mode it has TFLOP/s in. Where no peak is recorded, the run says why (tensor_peak_missing)
    and its rows go without. Other chapters: nothing."""
    from lkw import results

    if chapter not in results.TENSOR_PEAK_CHAPTERS:
        return {}
    peak, source = results.tensor_peak(_gpu_slug(gpu_name))
    if not peak:
        log(f"bench: no BF16 tensor peak for % of peak ({source}): skipped")
        return {"tensor_peak_missing": source}
    for r in rows:
        for mode in MODES:
            top, tflops = peak.get(mode), r.get(mkey(mode, "tflops"))
            r[mkey(mode, "pct_tensor_peak")] = 100.0 * tflops / top if top and tflops else None
    return {"tensor_peak_source": source, **{mkey(mode, "tensor_peak_tflops"): peak.get(mode) for mode in MODES}}


# ------------------------------------------------------------------------------------------------
# Nsight Compute: DRAM bytes per version


# Profiled launches per version and case, each after a flush; the median is kept. One launch at a
# time, the DRAM counters of a small working set (a few MB) wander from run to run by a few percent
# of the byte model, as if now and then a little more reached the DRAM, while at the large shapes
# they agree to a fraction of a percent: the median of a few launches steadies the small ones.
PROFILED_LAUNCHES = 3


def ncu_pass(chapters: list[str], order_file: Path, selection: dict | None = None) -> None:
    """Run under ncu: launch each version PROFILED_LAUNCHES times per case, each inside an NVTX
    range named "lkw"."""
    import torch

    # A profiled launch of the flush alone, dropped by parse_ncu: the first kernel profiled in a
    # process was seen moving several percent more DRAM bytes than its model while the same version
    # at other shapes matched (an unprofiled launch of it first did not change that), so the first
    # profiled launch of a process is not a version's.
    ext().flush_l2()
    torch.cuda.nvtx.range_push("lkw")
    ext().flush_l2()
    torch.cuda.nvtx.range_pop()
    order = [{"name": "(first profiled kernel, dropped)", "shape": "", "kernels": 0, "kernel_hints": []}]
    for chapter in chapters:
        for case in cases_of(chapter, **(selection or {})):
            gen = torch.Generator(device="cuda")
            gen.manual_seed(case.seed)
            inputs, outputs = (_raw(ts) for ts in case.make(torch, gen))
            for v in versions_of(chapter, case.op):
                if v["kernels_per_launch"] == 0:
                    continue
                # A launch outside the range first: the first launch of a kernel may load its
                # module and touch memory that the measured launch must not be charged for.
                ext().launch(v["name"], inputs, outputs, params=case.params, dtypes=case.dtypes)
                ext().flush_l2()  # nothing of the last launch left in L2 (outside the range)
                for _ in range(PROFILED_LAUNCHES):
                    torch.cuda.nvtx.range_push("lkw")
                    ext().launch(v["name"], inputs, outputs, params=case.params, dtypes=case.dtypes)
                    # The L2 is write-back: up to its 60 MB of our output may still be dirty when
                    # the kernel ends. The flush's DRAM *writes* are those lines, so they count for
                    # us (and the flush leaves the next launch an L2 without them).
                    ext().flush_l2()
                    torch.cuda.nvtx.range_pop()
                    order.append({"name": v["name"], "shape": case.shape, "kernels": v["kernels_per_launch"],
                                  "kernel_hints": [f["kernel"] for f in v["sass"]]})
            del inputs, outputs
            torch.cuda.empty_cache()
    order_file.write_text(json.dumps(order))


def ncu_dram_bytes(chapters: list[str], log=print, selection: dict | None = None) -> dict[tuple[str, str], float]:
    ncu = shutil.which("ncu")
    if not ncu:
        log("ncu not found: DRAM bytes not measured")
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        order_file = Path(tmp) / "order.json"
        # --cache-control none: ncu must not flush L2 itself, or the dirty lines a kernel leaves
        # behind would be written back by ncu, unseen; our own flush kernels do it, measured.
        cmd = [ncu, "--clock-control", "none", "--cache-control", "none", "--nvtx", "--nvtx-include", "lkw/",
               "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum", "--csv", "--print-units", "base",
               sys.executable, str(Path(REPO) / "tools" / "bench.py"), "--ncu-pass", str(order_file)]
        for c in chapters:
            cmd += ["--chapter", c]
        sel = selection or {}
        for op in sel.get("ops") or []:
            cmd += ["--op", op]
        cmd += ["--shape", sel["shape"]] if sel.get("shape") else []
        cmd += ["--extended"] if sel.get("extended") else []
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not order_file.exists():
            log(f"ncu run failed ({proc.returncode}): {proc.stderr[-2000:]}")
            return {}
        order = json.loads(order_file.read_text())
    return parse_ncu(proc.stdout, order, log)


def parse_ncu(stdout: str, order: list[dict], log=print) -> dict[tuple[str, str], float]:
    """Sum read + write DRAM bytes per kernel (ncu CSV), then per launch in `order`; where `order`
    holds several launches of one (version, shape), their median."""
    lines = stdout[stdout.find('"ID"'):] if '"ID"' in stdout else ""
    per_kernel: dict[int, dict] = {}
    for rec in csv.DictReader(io.StringIO(lines)):
        metric = {"dram__bytes_read.sum": "read", "dram__bytes_write.sum": "write"}.get(rec.get("Metric Name"))
        if metric:
            k = per_kernel.setdefault(int(rec["ID"]), {"name": rec["Kernel Name"], "read": 0.0, "write": 0.0})
            k[metric] += float(rec["Metric Value"].replace(",", ""))
    kernels = [per_kernel[i] for i in sorted(per_kernel)]
    launches: dict[tuple[str, str], list[float]] = {}
    at = 0
    for launch in order:
        if launch["kernels"] == 0:  # a flush alone: not a version's row
            at += 1
            continue
        # The version's kernels, then the flush whose writes are the version's late write-backs.
        group = kernels[at: at + launch["kernels"] + 1]
        at += launch["kernels"] + 1
        if len(group) < launch["kernels"] + 1:
            log(f"ncu: fewer kernels profiled than launched (at {launch['name']}): DRAM bytes incomplete")
            break
        *own, flush = group
        # A version's first kernel must be one its SASS facts name (a version that runs another's
        # kernels at some shapes names those too), then the flush.
        hints = [h.split("*")[0] for h in launch["kernel_hints"] if h]
        if (hints and not any(h in own[0]["name"] for h in hints)) or "flush_l2" not in flush["name"]:
            log(f"ncu: kernel order mismatch at {launch['name']} ({own[0]['name']}): DRAM bytes dropped")
            return {}
        launches.setdefault((launch["name"], launch["shape"]), []).append(
            sum(k["read"] + k["write"] for k in own) + flush["write"])
    return {key: statistics.median(b) for key, b in launches.items()}


# ------------------------------------------------------------------------------------------------
# Output


def print_table(result: dict, out=sys.stdout) -> None:
    from lkw import results

    print(results.text_table(result), file=out)


def main(argv: list[str] | None = None) -> int:
    from lkw import results

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="list chapters, ops and versions")
    ap.add_argument("--chapter", action="append", default=[], help="chapter to run (repeatable)")
    ap.add_argument("--op", action="append", default=[], help="only these ops (repeatable)")
    ap.add_argument("--shape", metavar="REGEX", help="only the cases whose shape this regular expression "
                    "finds a match in (e.g. 'n=28672,' or '^m=(1|16),')")
    ap.add_argument("--extended", action="store_true",
                    help="the chapter's full measurement matrix where it has one (EXTENDED; measure it in "
                         "parts with --shape and merge them with --write-results --merge)")
    ap.add_argument("--part", type=int, metavar="N",
                    help="with one --chapter: its N-th part (BENCH_PARTS; --parts lists them), instead of "
                         "--op / --shape / --extended")
    ap.add_argument("--parts", action="store_true", help="list the chapters' parts (BENCH_PARTS); needs no GPU")
    ap.add_argument("--all", action="store_true", help="every chapter with bench cases")
    ap.add_argument("--json", type=Path, help="write the (single chapter's) results JSON here")
    ap.add_argument("--write-results", action="store_true", help="write results/<gpu>/<chapter>.json")
    ap.add_argument("--merge", action="store_true",
                    help="with --write-results: merge this (partial, e.g. --op) run into the recorded file "
                         "instead of replacing it (results.merge_runs: its rows replace the same rows)")
    ap.add_argument("--results-dir", type=Path, default=Path(REPO) / "results")
    ap.add_argument("--ncu", action="store_true", help="also measure DRAM bytes with Nsight Compute")
    ap.add_argument("--replay", action="store_true", help="print recorded results; needs no GPU")
    ap.add_argument("--no-library-peers", action="store_true",
                    help="skip the production peers (vLLM, FlashInfer, Liger, humming: lkw.peers)")
    ap.add_argument("--compare", type=Path, metavar="BASELINE",
                    help="a results JSON (or a folder of them): print each row's change against it and "
                         "exit 1 on a row slower beyond both runs' spread (on the GPU, never in CI)")
    ap.add_argument("--replay-run", type=Path, metavar="NEW",
                    help="with --compare: compare this recorded JSON (or folder) instead of running")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", metavar="REGEX",
                    help="only the versions and peers whose id this regular expression finds a match in "
                         "(e.g. 'v5_tuned|same_phase|scaled_mm'); merge such a run with --write-results --merge")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every row of a case this many times, round after round, and keep each "
                         "row's median (combine_rounds): for versions whose gaps lie inside one run's spread")
    ap.add_argument("--ncu-pass", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    baseline = None
    if args.compare:
        try:
            baseline = results.load_runs(args.compare)
        except (OSError, ValueError) as e:
            ap.error(f"--compare {args.compare}: {e}")
        if not args.chapter and not args.all:
            args.chapter = [run["chapter"] for run in baseline if run.get("chapter") in CHAPTERS]
    if args.replay_run and not args.compare:
        ap.error("--replay-run goes with --compare")
    for flag, pattern in (("--shape", args.shape), ("--only", args.only)):
        if pattern:
            try:
                re.compile(pattern)
            except re.error as e:
                ap.error(f"{flag} {pattern!r}: {e}")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    if args.merge and not args.write_results:
        ap.error("--merge goes with --write-results")
    selection = {"ops": args.op, "shape": args.shape, "extended": args.extended}
    chapters = sorted(CHAPTERS) if args.all or not args.chapter else args.chapter
    for c in chapters:
        if c not in CHAPTERS:
            ap.error(f"no bench cases for chapter {c} (have: {', '.join(sorted(CHAPTERS))})")
    if args.parts:
        print(parts_text(chapters if args.chapter or args.all else sorted(BENCH_PARTS)))
        return 0
    if args.part is not None:
        if len(args.chapter) != 1 or args.all:
            ap.error("--part goes with exactly one --chapter")
        if args.op or args.shape or args.extended:
            ap.error("--part sets --op, --shape and --extended itself")
        parts = BENCH_PARTS.get(args.chapter[0], [])
        if not 1 <= args.part <= len(parts):
            ap.error(f"{args.chapter[0]} has {len(parts)} parts (--parts lists them), not a part {args.part}")
        part = parts[args.part - 1]
        selection = {"ops": list(part.ops), "shape": part.shape, "extended": part.extended}
        print(f"bench: {args.chapter[0]} part {args.part} of {len(parts)}: {part.args() or '(every case)'}")

    if args.compare and args.replay_run:
        try:
            current = [run for run in results.load_runs(args.replay_run) if run.get("chapter") in chapters]
        except (OSError, ValueError) as e:
            ap.error(f"--replay-run {args.replay_run}: {e}")
        text, regressions = results.compare_runs(baseline, current)
        print(text)
        return 1 if regressions else 0
    if args.replay:
        for c in chapters:
            data, whose = results.book_run(c)  # another GPU's run where this GPU's folder has none, said
            if whose:
                print(whose)
            print(results.text_table(data) if data else results.missing_message(c))
            print()
        return 0
    if args.list:
        try:
            versions = ext().versions()
        except ImportError as e:
            print(f"bench: --list needs the compiled extension lkw._ext ({e}); build it with "
                  "tools/setup.sh and cmake (README), or read the versions in the book", file=sys.stderr)
            return 2
        for v in versions:
            print(f"{v['name']:<45} {v['kind']:<8} sm_{v['min_arch']}+  {v['summary']}")
        return 0
    if args.ncu_pass:
        ncu_pass(chapters, args.ncu_pass, selection)
        return 0

    dev = ext().device()
    if not dev["present"]:
        print("bench: no CUDA device here (use --replay to print the recorded results)", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench: needs torch for device arrays", file=sys.stderr)
        return 2
    print(f"bench: {dev['name']} (sm_{dev['arch']}, {dev['sms']} SMs, L2 {dev['l2_bytes'] >> 20} MiB)")
    if args.no_library_peers:
        OPTIONS["library_peers"] = False
        peer_status = {}
        print("bench: production peers skipped (--no-library-peers)")
    else:
        peer_status = peers.status()
        for lib, st in peer_status.items():
            print(f"bench: peer library {lib}: {'loaded: ' if st['available'] else 'skipped: '}{st['detail']}")
    opts = {"warmup": args.warmup, "iters": args.iters, "l2_bytes": dev["l2_bytes"]}
    ceiling = measure_ceiling(**opts)
    shown = ", ".join(f"{MODE_WORDS[m]} {ceiling[0][m]:.1f}" for m in MODES if ceiling[0].get(m))
    print(f"bench: copy ceiling GB/s: {shown} ({ceiling[1]})")
    def write(c: str, res: dict) -> None:
        path = args.results_dir / _gpu_slug(res["gpu"]) / f"{c}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        if args.merge and path.exists():
            try:
                res = results.merge_runs(json.loads(path.read_text()), res)
            except ValueError as e:  # another GPU name in the same folder: keep this run's rows apart
                path = path.with_name(f"{c}.unmerged.json")
                print(f"bench: not merged ({e}): writing {path} instead")
            else:
                print(f"bench: merged into the recorded run ({len(res['runs'])} runs own its rows)")
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"bench: wrote {path}")

    results_by_chapter = {}
    for c in chapters:
        results_by_chapter[c] = run_chapter(c, ceiling=ceiling, peer_status=peer_status, rounds=args.rounds,
                                            only=args.only, **selection, **opts)
        if args.write_results and not args.ncu:  # each chapter as it ends: a run cut short keeps them
            write(c, results_by_chapter[c])

    if args.ncu:
        dram = ncu_dram_bytes(chapters, selection=selection)
        for res in results_by_chapter.values():
            for r in res["rows"]:
                b = dram.get((r["name"], r["shape"]))
                if b is not None:
                    r["dram_bytes"] = b
                    r["dram_ratio"] = b / r["model_bytes"] if r["model_bytes"] else None

    failed = False
    for c, res in results_by_chapter.items():
        print()
        print_table(res)
        failed |= not all(r["correct"] for r in res["rows"])
        if args.write_results and args.ncu:
            write(c, res)
        if args.json and len(results_by_chapter) == 1:
            args.json.write_text(json.dumps(res, indent=1) + "\n")
    if baseline is not None:
        text, regressions = results.compare_runs(baseline, list(results_by_chapter.values()))
        print()
        print(text)
        failed |= bool(regressions)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
