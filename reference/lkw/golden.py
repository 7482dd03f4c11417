"""Golden-data writer: fresh random inputs and their expected outputs for the C++ tests.

    PYTHONPATH=reference python -m lkw.golden --out DIR [--seed S] [--chapter NAME ...]

The seed comes from --seed, else $LKW_SEED, else a fresh random one; it is always printed, and
the same seed writes the same files. Each chapter draws from its own stream (seed, chapter name),
so writing one chapter alone gives the same data as writing all of them.

Per chapter this writes DIR/<chapter>/manifest.txt and one .npy per tensor
(<id>.in<i>.npy, <id>.init<i>.npy, <id>.out<i>.npy; narrow floats as their raw bits, C order,
little endian):

    # lkw golden v1 chapter=<chapter> seed=<seed>
    case <id> <op> <tolerance> <params>    tolerance: exact | ulp:N | close:RTOL:ATOL |
                                           multiset:KEY:WIDTH (the rows of that output as a
                                           multiset per run of WIDTH-row blocks with equal values
                                           of output KEY) | frob:BOUND (relative Frobenius error
                                           of the whole output <= BOUND, every element finite),
                                           or one per output joined by "/"
    in   <id> <index> <dtype> <file>       params: - | name=value,name=value
    init <id> <index> <dtype> <file>       output <index> starts as this file (not poisoned)
    out  <id> <index> <dtype> <file>

A case's records come in this order: its "case" line, its "in" lines, its "init" lines (only for
an op that updates outputs in place, Op.init of them: the first Op.init outputs, indices 0, 1, ...,
each with that output's dtype and shape), its "out" lines. The "out" files hold the expected
outputs, computed by the op's reference function from the inputs followed by the init arrays
(fn(*inputs, *init, **params)). A new chapter adds its ops to OPS, a function returning its
cases, and one CHAPTERS entry.
"""

import argparse
import functools
import itertools
import os
import re
import secrets
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from lkw import (
    elementwise,
    formats,
    fp8_gemm,
    gemv,
    int4,
    moe,
    quant,
    rmsnorm,
    roofline,
    sampling,
    w4a16,
)

# Manifest dtype name -> (dtype stored in the .npy, dtype the bits mean).
DTYPES = {
    "float32": (np.float32, np.float32),
    "float16": (np.uint16, np.float16),
    "bfloat16": (np.uint16, ml_dtypes.bfloat16),
    "float8_e4m3fn": (np.uint8, ml_dtypes.float8_e4m3fn),
    "float8_e5m2": (np.uint8, ml_dtypes.float8_e5m2),
    "int8": (np.int8, np.int8),
    "uint8": (np.uint8, np.uint8),
    "int32": (np.int32, np.int32),
    "uint32": (np.uint32, np.uint32),
    "int64": (np.int64, np.int64),
}


def _layer_inputs(fmt: str) -> tuple[str, ...]:
    """Manifest dtypes of the decoder layer runner's inputs (lkw.decoder_layer.op_inputs)."""
    lin = {
        "bf16": ("bfloat16",),
        "w4a16": ("uint32", "bfloat16", "uint32", "bfloat16"),
        "fp8": ("float8_e4m3fn", "float32"),
    }[fmt]
    head = ("bfloat16", "bfloat16", "int64", "int64", "int64", "float32", "bfloat16")
    return head + lin + lin + ("bfloat16",) + lin + lin


LAYER_INPUTS = {fmt: _layer_inputs(fmt) for fmt in ("bf16", "w4a16", "fp8")}


def layer_expected(fmt: str, *arrays, eps: float):
    """lkw.decoder_layer.op_reference (imported here: that module imports this one)."""
    from lkw import decoder_layer

    return decoder_layer.op_reference(fmt, *arrays, eps=eps)


def paged_attention_expected(q, key_cache, value_cache, tables, positions):
    """11_decoder_layer's paged_attention (the runner's, not a lesson): each sequence, a row of
    the block tables with T / B tokens, through lkw.decoder_layer.attention on its own view of
    the paged cache; o [T, Hq, D] BF16."""
    from lkw import decoder_layer

    t, batch = q.shape[0], tables.shape[0]
    ql, hkv, block_size = t // batch, value_cache.shape[1], value_cache.shape[3]
    out = [decoder_layer.attention(q[b * ql:(b + 1) * ql], decoder_layer.KVCache(
               "paged", key_cache, value_cache, tables[b], block_size), positions[b * ql:(b + 1) * ql], hkv)
           for b in range(batch)]
    return np.concatenate(out).reshape(q.shape)


def layer_graph_expected(fmt: str, *arrays, eps: float):
    """Decode steps one token at a time (x, residual, positions, slot_mapping hold one row per
    step), each over the cache the step before left: -> the final caches, then out and
    residual_out of the first and of the last step."""
    x, residual, positions, slots, *rest = arrays
    key, value = rest[-2], rest[-1]
    firsts = lasts = None
    for i in range(len(positions)):
        step = [x[i : i + 1], residual[i : i + 1], positions[i : i + 1], slots[i : i + 1]]
        key, value, out, r2 = layer_expected(fmt, *step, *rest[:-2], key, value, eps=eps)
        if i == 0:
            firsts = (out, r2)
        lasts = (out, r2)
    return key, value, *firsts, *lasts


@dataclass(frozen=True)
class Op:
    """A reference function on stored arrays, with the manifest dtypes of its inputs and outputs."""

    fn: Callable[..., np.ndarray]
    # Manifest dtypes; "float32|bfloat16": an input the op takes in either dtype, each case's
    # array in one of them (record_dtypes), so the alternatives must be stored differently.
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...] = ()  # case params passed to fn as keyword arguments (if present)
    # The first `init` outputs are updated in place (a KV cache): their contents before the launch
    # matter, every case gives them (Case.init) and fn takes them after the inputs.
    init: int = 0
    # The last `optional` inputs may be left out (chapter 07's zero points): a case gives between
    # len(inputs) - optional and len(inputs) arrays, the first ones of `inputs`.
    optional: int = 0

    def input_names(self, given: int) -> tuple[str, ...]:
        """The manifest dtypes of a case that gives `given` inputs (all of them where that many
        are not allowed: check_case then refuses the count)."""
        if len(self.inputs) - self.optional <= given <= len(self.inputs):
            return self.inputs[:given]
        return self.inputs


OPS = {
    "copy": Op(roofline.copy, ("uint32",), ("uint32",)),
    "gemm_bf16": Op(roofline.gemm_bf16, ("bfloat16", "bfloat16"), ("bfloat16",)),
    "f32_to_bf16": Op(formats.f32_to_bf16, ("float32",), ("bfloat16",)),
    "bf16_to_f32": Op(formats.bf16_to_f32, ("bfloat16",), ("float32",)),
    "f32_to_e4m3": Op(formats.f32_to_e4m3, ("float32",), ("float8_e4m3fn",)),
    "f32_to_e5m2": Op(formats.f32_to_e5m2, ("float32",), ("float8_e5m2",)),
    "e4m3_to_bf16": Op(formats.e4m3_to_bf16, ("float8_e4m3fn",), ("bfloat16",)),
    "e5m2_to_bf16": Op(formats.e5m2_to_bf16, ("float8_e5m2",), ("bfloat16",)),
    "int4_f16": Op(int4.int4_f16, ("uint32", "float16"), ("float16",)),
    "int4_bf16": Op(int4.int4_bf16, ("uint32", "bfloat16"), ("bfloat16",)),
    "int4i_f16": Op(int4.int4i_f16, ("uint32", "float16"), ("float16",)),
    "int4i_bf16": Op(int4.int4i_bf16, ("uint32", "bfloat16"), ("bfloat16",)),
    "int4i_zp_f16": Op(int4.int4i_zp_f16, ("uint32", "float16", "uint32"), ("float16",)),
    "int4i_zp_bf16": Op(int4.int4i_zp_bf16, ("uint32", "bfloat16", "uint32"), ("bfloat16",)),
    "int8_f16": Op(int4.int8_f16, ("uint8", "float16"), ("float16",)),
    "e4m3_f16": Op(int4.e4m3_f16, ("float8_e4m3fn", "float16"), ("float16",)),
    "e4m3_bf16": Op(int4.e4m3_bf16, ("float8_e4m3fn", "bfloat16"), ("bfloat16",)),
    # 03_dynamic_quant (lkw.quant: scales [T, 1], [1], or [d/128, T] column-major)
    "per_token_fp8": Op(
        quant.per_token_fp8, ("bfloat16",), ("float8_e4m3fn", "float32"), ("scale_ub",)
    ),
    "per_token_int8": Op(quant.per_token_int8, ("bfloat16",), ("int8", "float32")),
    "per_tensor_fp8": Op(quant.per_tensor_fp8, ("bfloat16",), ("float8_e4m3fn", "float32")),
    "per_group_fp8": Op(
        quant.per_group_fp8, ("bfloat16",), ("float8_e4m3fn", "float32"), ("scales_row_major",)
    ),
    # 04_rmsnorm (lkw.rmsnorm: x, [residual,] weight; outputs end with residual_out)
    "rmsnorm": Op(rmsnorm.rmsnorm, ("bfloat16", "bfloat16"), ("bfloat16",), ("eps",)),
    "fused_add_rmsnorm": Op(
        rmsnorm.fused_add_rmsnorm, ("bfloat16",) * 3, ("bfloat16", "bfloat16"), ("eps",)
    ),
    "fused_add_rmsnorm_fp8": Op(
        rmsnorm.fused_add_rmsnorm_fp8,
        ("bfloat16",) * 3,
        ("float8_e4m3fn", "float32", "bfloat16"),
        ("eps",),
    ),
    "fused_add_rmsnorm_int8": Op(
        rmsnorm.fused_add_rmsnorm_int8,
        ("bfloat16",) * 3,
        ("int8", "float32", "bfloat16"),
        ("eps",),
    ),
    "fused_add_rmsnorm_fp8_group": Op(  # scales [d/128, T], column-major
        rmsnorm.fused_add_rmsnorm_fp8_group,
        ("bfloat16",) * 3,
        ("float8_e4m3fn", "float32", "bfloat16"),
        ("eps",),
    ),
    # 05_elementwise (lkw.elementwise through the wrappers below: float params become flags and
    # layout names; BF16 bits in and out)
    **{
        op: Op(lambda x, act_first=1, limit=0, act=act: _act_and_mul(x, act, act_first, limit),
               ("bfloat16",), ("bfloat16",), ("act_first", "limit"))
        for op, act in (("silu_and_mul", "silu"), ("gelu_and_mul", "gelu"),
                        ("gelu_tanh_and_mul", "gelu_tanh"))
    },
    "silu_and_mul_fp8_per_token": Op(
        lambda x, scale_ub=0: elementwise.silu_and_mul_fp8_per_token(x, scale_ub or None),
        ("bfloat16",), ("float8_e4m3fn", "float32"), ("scale_ub",),
    ),
    "silu_and_mul_fp8_per_group": Op(
        elementwise.silu_and_mul_fp8_per_group, ("bfloat16",), ("float8_e4m3fn", "float32"),
        ("scales_row_major",),
    ),
    "silu_and_mul_fp8_per_tensor": Op(
        elementwise.silu_and_mul_fp8_per_tensor, ("bfloat16", "float32"), ("float8_e4m3fn",)
    ),
    # positions, q, k, cos_sin_cache -> q_out, k_out
    "rope": Op(
        lambda pos, q, k, cache, is_neox=1, inverse=0: elementwise.rope(
            pos, q, k, cache, bool(is_neox), bool(inverse)),
        ("int64", "bfloat16", "bfloat16", "float32"), ("bfloat16", "bfloat16"),
        ("is_neox", "inverse"),
    ),
    # positions, q, k, q_weight, k_weight, cos_sin_cache -> q_out, k_out
    "qk_norm_rope": Op(
        lambda pos, q, k, qw, kw, cache, eps, is_neox=1: elementwise.qk_norm_rope(
            pos, q, k, qw, kw, cache, eps, bool(is_neox)),
        ("int64", "bfloat16", "bfloat16", "bfloat16", "bfloat16", "float32"),
        ("bfloat16", "bfloat16"), ("eps", "is_neox"),
    ),
    # key, value, slot_mapping [, k_scale, v_scale], then the caches' initial contents -> the
    # caches updated in place (param layout: 0 paged, 1 nhd, 2 hnd)
    "reshape_and_cache": Op(
        lambda k, v, slots, kc, vc, layout: _cache(k, v, slots, kc, vc, layout),
        ("bfloat16", "bfloat16", "int64"), ("bfloat16", "bfloat16"), ("layout",), init=2,
    ),
    "reshape_and_cache_fp8": Op(
        lambda k, v, slots, ks, vs, kc, vc, layout: _cache(k, v, slots, kc, vc, layout, ks, vs),
        ("bfloat16", "bfloat16", "int64", "float32", "float32"), ("float8_e4m3fn",) * 2,
        ("layout",), init=2,
    ),
    # positions, qkv, cos_sin_cache, slot_mapping, then the BF16 caches' initial contents -> the
    # caches updated in place, then q_out (param layout as reshape_and_cache's)
    "qkv_rope_cache": Op(
        lambda pos, qkv, cache, slots, kc, vc, layout, is_neox=1: elementwise.qkv_rope_cache(
            pos, qkv, cache, slots, kc, vc, elementwise.LAYOUTS[int(layout)], bool(is_neox)),
        ("int64", "bfloat16", "float32", "int64"), ("bfloat16",) * 3, ("layout", "is_neox"),
        init=2,
    ),
    # 06_int4_gemv (lkw.gemv: x, w, scales [, zeros] -> y; the cuBLAS peer's bf16_gemv)
    "int4_gemv": Op(gemv.int4_gemv, ("bfloat16", "uint32", "bfloat16"), ("bfloat16",)),
    "int4i_gemv": Op(gemv.int4i_gemv, ("bfloat16", "uint32", "bfloat16"), ("bfloat16",)),
    "int4i_zp_gemv": Op(
        gemv.int4i_zp_gemv, ("bfloat16", "uint32", "bfloat16", "uint32"), ("bfloat16",)
    ),
    "int4t_gemv": Op(gemv.int4t_gemv, ("bfloat16", "uint32", "bfloat16"), ("bfloat16",)),
    "bf16_gemv": Op(gemv.bf16_gemv, ("bfloat16", "bfloat16"), ("bfloat16",)),
    # 07_w4a16_gemm (lkw.w4a16: x, w, scales [K/G, N] [, zeros [K/G, N]] -> y; w natural or
    # repacked for mma; without zeros z = 8)
    **{
        op: Op(fn, ("bfloat16", "uint32", "bfloat16", "uint8"), ("bfloat16",), optional=1)
        for op, fn in (("w4a16_gemm", w4a16.w4a16_gemm), ("w4a16r_gemm", w4a16.w4a16r_gemm))
    },
    # 08_fp8_gemm (lkw.fp8_gemm: A [M, K], B [N, K] E4M3, s_a, s_b whose shapes name the
    # granularity -> y [M, N]): tensor and rowwise scales, which act in the epilogue, or
    # blockwise ones, whose s_a layout a_scales_row_major picks
    **{
        op: Op(
            functools.partial(fp8_gemm.fp8_gemm_any, takes=takes),
            ("float8_e4m3fn", "float8_e4m3fn", "float32", "float32"),
            ("bfloat16",),
            ("a_scales_row_major",),
        )
        for op, takes in (("fp8_gemm", ("tensor", "rowwise")), ("fp8_gemm_blockwise", ("blockwise",)))
    },
    # 09_moe (lkw.moe through the wrappers below: float params become ints and flags)
    "moe_align_block_size": Op(
        lambda ids, **p: _align(ids, **p), ("int32",), ("int32",) * 3, ("num_experts", "block_m")
    ),
    "topk_softmax": Op(
        lambda x, **p: _topk(x, **p), ("float32",), ("float32", "int32"), ("k", "renormalize")
    ),
    "topk_softmax_bf16": Op(
        lambda x, **p: _topk(formats.bf16_to_f32(x), **p),
        ("bfloat16",),
        ("float32", "int32"),
        ("k", "renormalize"),
    ),
    "deepseek_router": Op(
        lambda x, b, **p: _deepseek(x, b, **p),
        ("float32", "float32"),
        ("float32", "int32"),
        ("k", "n_group", "topk_group", "renormalize", "routed_scaling_factor"),
    ),
    "moe_grouped_gemm": Op(
        lambda x, w, s, e, **p: _grouped(moe.grouped_gemm_bf16, x, w, s, e, **p),
        ("bfloat16", "bfloat16", "int32", "int32"),
        ("bfloat16",),
        ("topk", "block_m"),
    ),
    "moe_grouped_gemm_silu": Op(
        lambda x, w, s, e, **p: _grouped(moe.grouped_gemm_silu_bf16, x, w, s, e, **p),
        ("bfloat16", "bfloat16", "int32", "int32"),
        ("bfloat16",),
        ("topk", "block_m"),
    ),
    # The down GEMM with moe_sum in its epilogue: h [T k, K] (a row per slot), w, the align's
    # arrays, topk_weights [T, k] -> out [T, N].
    "moe_grouped_gemm_sum": Op(
        lambda h, w, s, e, tw, **p: moe.grouped_gemm_sum_bf16(
            h.view(ml_dtypes.bfloat16), w.view(ml_dtypes.bfloat16), s, e, tw, int(p["block_m"])
        ).view(np.uint16),
        ("bfloat16", "bfloat16", "int32", "int32", "float32"),
        ("bfloat16",),
        ("block_m",),
    ),
    "moe_grouped_gemm_w4a16": Op(
        lambda x, w, sc, s, e, **p: _grouped_w4a16(x, w, sc, s, e, **p),
        ("bfloat16", "uint32", "bfloat16", "int32", "int32"),
        ("bfloat16",),
        ("topk", "block_m"),
    ),
    # FP8 experts (chapter 08's blockwise scales): x, w E4M3, x_scales [K/128, rows of x], w_scales
    # [E, ceil(N/128), K/128], the align's arrays (, topk_weights) -> out, as the BF16 three.
    **{
        op: Op(
            lambda x, w, xs, ws, s, e, fn=fn, **p: fn(
                x, w, xs, ws, s, e, int(p["block_m"]), int(p["topk"])
            ).view(np.uint16),
            ("float8_e4m3fn", "float8_e4m3fn", "float32", "float32", "int32", "int32"),
            ("bfloat16",),
            ("topk", "block_m"),
        )
        for op, fn in (
            ("moe_grouped_gemm_fp8", moe.grouped_gemm_fp8),
            ("moe_grouped_gemm_silu_fp8", moe.grouped_gemm_silu_fp8),
        )
    },
    "moe_grouped_gemm_sum_fp8": Op(
        lambda h, w, hs, ws, s, e, tw, **p: moe.grouped_gemm_sum_fp8(
            h, w, hs, ws, s, e, tw, int(p["block_m"])
        ).view(np.uint16),
        ("float8_e4m3fn", "float8_e4m3fn", "float32", "float32", "int32", "int32", "float32"),
        ("bfloat16",),
        ("block_m",),
    ),
    "moe_sum": Op(
        lambda y, w: moe.moe_sum(y.view(ml_dtypes.bfloat16), w).view(np.uint16),
        ("bfloat16", "float32"),
        ("bfloat16",),
    ),
    # The whole block: x [T, d], router logits [T, E], w_gate_up [E, 2 d_ff, d], w_down [E, d, d_ff]
    # -> y [T, d]; the float64 layer (lkw.moe.moe_layer_reference) rounded once.
    "moe_block": Op(
        lambda x, z, w1, w2, **p: _moe_block(x, z, w1, w2, **p),
        ("bfloat16", "float32", "bfloat16", "bfloat16"),
        ("bfloat16",),
        ("topk", "renormalize"),
    ),
    # 10_sampling (lkw.sampling: x [B, V] float32, top_k [B] int32 -> [B, V] float32; a row's k
    # <= 0 or >= V keeps the whole row. top_p_renorm_probs: probs [B, V], top_p [B] float32 in
    # (0, 1], 1 keeps the whole row)
    "top_k_mask_logits": Op(sampling.top_k_mask_logits, ("float32", "int32"), ("float32",)),
    "top_k_renorm_probs": Op(sampling.top_k_renorm_probs, ("float32", "int32"), ("float32",)),
    "top_p_renorm_probs": Op(sampling.top_p_renorm_probs, ("float32", "float32"), ("float32",)),
    # sample: logits [B, V], temperature, top_k, top_p, min_p [B], seed_offset int64 [2] -> tokens
    # [B] int32, for rows that admit one token only (sample_determined). rejection_sample: q
    # [B, S, V], draft tokens [B, S], p [B, S + 1, V], seed_offset -> tokens [B, S + 1],
    # num_accepted [B], with the uniforms the kernel draws from seed_offset (rejection_expected).
    "sample": Op(
        lambda *a: sample_expected(*a),
        ("float32|bfloat16", "float32", "int32", "float32", "float32", "int64"),
        ("int32",),
    ),
    "rejection_sample": Op(
        lambda *a: rejection_expected(*a),
        ("float32", "int32", "float32", "int64"),
        ("int32", "int32"),
    ),
    # 11_decoder_layer (lkw.decoder_layer.op_inputs: the runner's order, layer.h) -> the caches
    # updated in place, out, residual_out; and the graph cases (decode steps replayed). The
    # runner's attention alone: q, key_cache, value_cache, block_tables [B, n], positions -> o.
    "paged_attention": Op(paged_attention_expected, ("bfloat16",) * 3 + ("int64", "int64"), ("bfloat16",)),
    **{
        f"decoder_layer_{fmt}": Op(
            functools.partial(layer_expected, fmt),
            LAYER_INPUTS[fmt], ("bfloat16",) * 4, ("eps",), init=2,
        )
        for fmt in LAYER_INPUTS
    },
    **{
        f"decoder_layer_graph_{fmt}": Op(
            functools.partial(layer_graph_expected, fmt),
            LAYER_INPUTS[fmt], ("bfloat16",) * 6, ("eps",), init=2,
        )
        for fmt in LAYER_INPUTS
    },
}


@dataclass
class Case:
    """One golden case: inputs as stored (raw bits for narrow floats); outputs come from OPS."""

    id: str
    op: str
    tolerance: str
    inputs: list[np.ndarray]
    params: dict[str, float] = field(default_factory=dict)
    # The initial contents of the op's first Op.init outputs (updated in place), as stored.
    init: list[np.ndarray] = field(default_factory=list)


def reference(
    op: str, inputs: list[np.ndarray], params: dict[str, float], init: list[np.ndarray] = ()
) -> list[np.ndarray]:
    """The op's reference function on the inputs (then the init arrays of an op that updates
    outputs in place), with the params it takes, as a list."""
    kwargs = {name: params[name] for name in OPS[op].params if name in params}
    out = OPS[op].fn(*inputs, *init, **kwargs)
    return list(out) if isinstance(out, tuple) else [out]


def parse_params(text: str) -> dict[str, float]:
    """The manifest's params field ("-" or name=value,...) back to a dict."""
    if text == "-":
        return {}
    return {k: float(v) for k, v in (kv.split("=") for kv in text.split(","))}


def expected_outputs(case: Case) -> list[np.ndarray]:
    """The op's reference function applied to the case's inputs (and params, and init arrays)."""
    return reference(case.op, case.inputs, case.params, case.init)


@np.errstate(invalid="ignore")  # signalling NaNs are valid inputs
def values(dtype: str, stored: np.ndarray) -> np.ndarray:
    """What the stored array means, as float64 (narrow floats decoded from their bits)."""
    return stored.view(DTYPES[dtype][1]).astype(np.float64)


def check_case(case: Case, outputs: list[np.ndarray]) -> None:
    """Refuses a case the C++ side could misread, or one that tests nothing (all-zero input)."""
    if not re.fullmatch(r"[a-z0-9_]+", case.id):
        raise ValueError(f"case id {case.id!r}: use [a-z0-9_] only")
    tolerances = case.tolerance.split("/")
    for tol in tolerances:
        if not re.fullmatch(
            r"exact|ulp:\d+|close:[^:\s/]+:[^:\s/]+|multiset:\d+:\d+|frob:" + FLOAT, tol
        ) or (tol.startswith("frob:") and not float(tol[5:]) > 0):
            raise ValueError(f"{case.id}: bad tolerance {case.tolerance!r}")
    if len(tolerances) not in (1, len(outputs)):
        raise ValueError(f"{case.id}: {len(tolerances)} tolerances for {len(outputs)} outputs")
    op = OPS[case.op]
    for kind, dtypes, arrays in _records(op, case.inputs, case.init, outputs):
        if len(arrays) != len(dtypes):
            raise ValueError(f"{case.id}: {case.op} takes {len(dtypes)} {kind}, got {len(arrays)}")
        for dtype, array in zip(dtypes, arrays, strict=True):
            if np.asarray(array).dtype != DTYPES[dtype][0]:
                raise ValueError(f"{case.id}: {kind} {dtype} must be stored as {DTYPES[dtype][0]}")
    for index, (start, end) in enumerate(zip(case.init, outputs, strict=False)):
        if np.shape(start) != np.shape(end):
            raise ValueError(
                f"{case.id}: init {index} has shape {np.shape(start)}, its output {np.shape(end)}"
            )
    names = op.input_names(len(case.inputs))
    for dtype, array in zip(record_dtypes(names, case.inputs), case.inputs, strict=True):
        if not np.any(values(dtype, array) != 0):
            raise ValueError(f"{case.id}: an input is all zeros")


def record_dtypes(names: tuple[str, ...], arrays) -> tuple[str, ...]:
    """The manifest dtype of each array: its name in `names`, or where the op takes either of two
    ("float32|bfloat16") the one the array is stored as. Arrays that do not match in number, or
    are stored as none of the alternatives, keep the first name: check_case refuses them."""
    if len(names) != len(arrays):
        return tuple(names)
    out = []
    for name, array in zip(names, arrays, strict=True):
        options = name.split("|")
        stored = [o for o in options if np.asarray(array).dtype == DTYPES[o][0]]
        if len(stored) > 1:
            raise ValueError(f"{name}: alternatives stored alike cannot be told apart")
        out.append(stored[0] if stored else options[0])
    return tuple(out)


def _records(op: Op, inputs, init, outputs) -> tuple[tuple[str, tuple[str, ...], list], ...]:
    """(kind, dtypes, arrays) of a case's tensor records in manifest order: in, init, out. The
    init records are the first op.init outputs' (their dtypes)."""
    return (
        ("in", record_dtypes(op.input_names(len(inputs)), inputs), list(inputs)),
        ("init", op.outputs[: op.init], list(init)),
        ("out", op.outputs, list(outputs)),
    )


# A positive decimal as C++'s std::stod reads it whole (frob's BOUND).
FLOAT = r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"


def _params(params: dict[str, float]) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items()) or "-"


def write_chapter(out_dir: Path, chapter: str, seed: int) -> list[Case]:
    """Writes DIR/<chapter>: the .npy files first, the manifest last."""
    rng = np.random.default_rng([seed, zlib.crc32(chapter.encode())])
    cases = CHAPTERS[chapter](rng)
    chapter_dir = Path(out_dir) / chapter
    chapter_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# lkw golden v1 chapter={chapter} seed={seed}"]
    for case in cases:
        outputs = expected_outputs(case)
        check_case(case, outputs)
        op = OPS[case.op]
        lines.append(f"case {case.id} {case.op} {case.tolerance} {_params(case.params)}")
        for kind, dtypes, arrays in _records(op, case.inputs, case.init, outputs):
            for index, (dtype, array) in enumerate(zip(dtypes, arrays, strict=True)):
                name = f"{case.id}.{kind}{index}.npy"
                little_endian = np.dtype(DTYPES[dtype][0]).newbyteorder("<")
                np.save(chapter_dir / name, np.ascontiguousarray(array, little_endian))
                lines.append(f"{kind:<4} {case.id} {index} {dtype} {name}")
    (chapter_dir / "manifest.txt").write_text("\n".join(lines) + "\n")
    return cases


# ---------------------------------------------------------------------------------------------
# 00_roofline


def gemm_bf16_tolerance(a: np.ndarray, b: np.ndarray) -> str:
    """close:RTOL:ATOL for C = A . B^T with BF16 inputs, FP32 accumulation and a BF16 output."""
    # RTOL: the kernel rounds its FP32 sum to BF16 (<= 2^-9 relative), and an FP32 sum a hair
    # away from the exact one can round to the neighbouring BF16, so kernel and reference may be
    # one BF16 ulp (<= 2^-8 relative) apart. 1.6e-2, PyTorch's BF16 default, covers that.
    # ATOL: an output that cancels to near zero keeps no relative accuracy; what is left is the
    # FP32 accumulation error: K roundings, each <= 2^-24 of a partial sum, adding up like a
    # random walk, ~sqrt(K) * 2^-24 * |partial sum|. No partial sum exceeds S = max over outputs
    # of sum_k |a_k b_k|, so sqrt(K) * 2^-24 * S; times 8 for accumulators that truncate or sum
    # in another order (tensor-core trees, split-K). BF16 products are exact in FP32, so the
    # inputs add no error of their own.
    k = a.shape[1]
    s = np.max(np.abs(formats.bf16_to_f32(a)) @ np.abs(formats.bf16_to_f32(b)).T)
    atol = 8 * np.sqrt(k) * 2.0**-24 * s
    return f"close:1.6e-2:{atol:.3g}"


def roofline_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for n in (1, 7, 4099, 65536, 1000003):
        words = rng.integers(1, 2**32, n, dtype=np.uint32)
        cases.append(Case(f"copy_n{n}", "copy", "exact", [words]))
    for m, n, k in ((64, 128, 256), (33, 77, 130)):
        a = formats.f32_to_bf16(rng.standard_normal((m, k), np.float32))  # (M,K)
        b = formats.f32_to_bf16(rng.standard_normal((n, k), np.float32))  # (N,K)
        tol = gemm_bf16_tolerance(a, b)
        cases.append(Case(f"gemm_m{m}_n{n}_k{k}", "gemm_bf16", tol, [a, b]))
    return cases


# ---------------------------------------------------------------------------------------------
# 01_formats


def _f32(bits: list[int]) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


# NaNs that a careless bit trick turns into something else: the smallest payload (adding the
# rounding bias leaves 0x7f80 = Inf), all ones (the bias carries into the sign bit), quiet,
# signalling, negative.
NAN_BITS = [
    *(0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001),
    *(0x7FBFFFFF, 0x7F808000, 0x7FFFFFFF, 0xFFFFFFFF),
]

BF16_SPECIAL_BITS = [
    *(0x00000000, 0x80000000, 0x7F800000, 0xFF800000),  # +-0, +-Inf
    *(0x3F800000, 0xBF800000, 0x40490FDB, 0x3EAAAAAB),  # 1, -1, pi, 1/3
    # Exact ties: an even upper half stays, an odd one rounds up (carrying into the next binade
    # for 0x3f7f and 0x3fff); one below and one above a tie.
    *(0x3F808000, 0xBF808000, 0x3F818000, 0xBF818000, 0x3F7F8000, 0x3FFF8000, 0xC0FF8000),
    *(0x3F807FFF, 0x3F808001, 0xBF817FFF, 0xBF818001),
    # The largest finite BF16 (0x7f7f); its tie and the largest FP32 round to Inf.
    *(0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F7E8000, 0xFF7F7FFF, 0xFF7F8000),
    0xFF7FFFFF,
    # FP32 subnormals (BF16 has the same exponent range, so it keeps them) and smallest normals.
    *(0x00000001, 0x80000001, 0x00008000, 0x00008001, 0x00018000, 0x80018000, 0x00400000),
    *(0x007F8000, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000, 0x00800001, 0x00807FFF),
    0x00808000,
    *NAN_BITS,
]


def _f32_to_bf16_cases(rng: np.random.Generator) -> list[Case]:
    special = _f32(BF16_SPECIAL_BITS)
    # Every upper half with the low halves that decide the rounding: none, just below the tie,
    # the tie, just above it, and one random.
    upper = np.arange(1 << 16, dtype=np.uint32)[:, None] << 16  # (65536,1)
    fixed_lows = np.tile(np.array([0x0000, 0x7FFF, 0x8000, 0x8001], np.uint32), (1 << 16, 1))
    random_low = rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32)
    lows = np.column_stack([fixed_lows, random_low])  # (65536,5)
    neighbourhood = (upper | lows).reshape(-1).view(np.float32)
    # Half typical data over 40 binades, half random bit patterns (every magnitude, Inf, NaN).
    n = 1000003
    typical = rng.standard_normal(n // 2) * np.exp2(rng.uniform(-20, 20, n // 2))
    patterns = rng.integers(0, 2**32, n - n // 2, dtype=np.uint32).view(np.float32)
    mixed = rng.permutation(np.concatenate([typical.astype(np.float32), patterns]))
    return [
        Case("f32_to_bf16_special", "f32_to_bf16", "exact", [special]),
        Case("f32_to_bf16_neighbourhood", "f32_to_bf16", "exact", [neighbourhood]),
        Case(f"f32_to_bf16_random_n{n}", "f32_to_bf16", "exact", [mixed]),
    ]


def fp8_special_inputs(fp8: type, max_finite: float) -> np.ndarray:
    """FP32 inputs that pin down an FP32 -> FP8 satfinite cast: every FP8 value, every midpoint
    between neighbours (and one FP32 ulp either side), values beyond the maximum up to Inf, NaNs,
    and tiny values down to FP32 subnormals; both signs."""
    every = np.arange(256, dtype=np.uint8).view(fp8).astype(np.float32)  # both signs, NaN
    finite = np.unique(np.abs(every[np.isfinite(every)]))  # 0 ... max_finite
    step_at_top = finite[-1] - finite[-2]
    mids = np.append((finite[:-1] + finite[1:]) / 2, max_finite + step_at_top / 2)
    near_mids = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    beyond = [np.nextafter(np.float32(max_finite), np.inf), 1.01 * max_finite, 2 * max_finite]
    beyond += [1e10, 1e30, np.finfo(np.float32).max, np.inf]
    smallest = finite[1]  # the smallest subnormal; half of it is the first midpoint
    tiny = [smallest / 4, 0.75 * smallest, 1.25 * smallest, np.finfo(np.float32).tiny]
    f32_subnormals = _f32([0x00000001, 0x00400000, 0x007FFFFF])
    magnitudes = np.concatenate([near_mids, np.float32(beyond + tiny), f32_subnormals])
    return np.concatenate([every, magnitudes, -magnitudes, _f32(NAN_BITS)])


def fp8_random_inputs(rng: np.random.Generator, fp8: type, n: int) -> np.ndarray:
    """Normal samples times a log-uniform magnitude from below the smallest subnormal to above
    the largest finite value, so every binade, the underflow and the saturation are hit."""
    info = ml_dtypes.finfo(fp8)
    lo = np.log2(float(info.smallest_subnormal)) - 4
    hi = np.log2(float(info.max)) + 4
    return (rng.standard_normal(n) * np.exp2(rng.uniform(lo, hi, n))).astype(np.float32)


def formats_cases(rng: np.random.Generator) -> list[Case]:
    cases = _f32_to_bf16_cases(rng)
    all_bf16 = np.arange(1 << 16, dtype=np.uint16)
    random_bf16 = rng.integers(0, 1 << 16, 777, dtype=np.uint16)
    cases += [
        Case("bf16_to_f32_all_codes", "bf16_to_f32", "exact", [all_bf16]),
        Case("bf16_to_f32_random_n777", "bf16_to_f32", "exact", [random_bf16]),
    ]
    for short, fp8, max_finite in (
        ("e4m3", ml_dtypes.float8_e4m3fn, formats.E4M3_MAX),
        ("e5m2", ml_dtypes.float8_e5m2, formats.E5M2_MAX),
    ):
        special = fp8_special_inputs(fp8, max_finite)
        random_f32 = fp8_random_inputs(rng, fp8, 1000003)
        all_codes = np.arange(256, dtype=np.uint8)
        random_codes = rng.integers(0, 256, 100003, dtype=np.uint8)
        cases += [
            Case(f"f32_to_{short}_special", f"f32_to_{short}", "exact", [special]),
            Case(f"f32_to_{short}_random_n1000003", f"f32_to_{short}", "exact", [random_f32]),
            Case(f"{short}_to_bf16_all_codes", f"{short}_to_bf16", "exact", [all_codes]),
            Case(f"{short}_to_bf16_random_n100003", f"{short}_to_bf16", "exact", [random_codes]),
        ]
    return cases


# ---------------------------------------------------------------------------------------------
# 02_int4_dequant

DEQUANT_OPS = [
    *("int4_f16", "int4_bf16", "int4i_f16", "int4i_bf16", "int4i_zp_f16", "int4i_zp_bf16"),
    *("int8_f16", "e4m3_f16", "e4m3_bf16"),
]
# E4M3FN codes that are weights: all but the NaNs 0x7F and 0xFF (never produced by quantizers,
# and the bit-shift kernels turn them into +-480 instead of NaN).
E4M3_FINITE_CODES = np.array([c for c in range(256) if c not in int4.E4M3_NAN_CODES], np.uint8)
# Scale exponent ranges [lo, hi] of the "wide" cases: s = u * 2^e, u in [1, 2), e in [lo, hi].
# The FP16 ranges reach below 2^-14 (subnormal results) and stop where the largest product,
# |q - z| <= 15, |b - 128| <= 128 or |e4m3| <= 448 times s, is still finite.
WIDE_SCALE_EXPONENTS = {
    ("int4", "float16"): (-18, 11),
    ("int8", "float16"): (-20, 7),
    ("e4m3", "float16"): (-12, 6),
    ("int4", "bfloat16"): (-40, 40),
    ("e4m3", "bfloat16"): (-40, 40),
}


def dequant_signature(op: str) -> tuple[str, str, bool]:
    """(weights "int4" | "int8" | "e4m3", scale/output format, zero points) of a dequant op."""
    weights = "int4" if op.startswith("int4") else op.split("_")[0]
    return weights, "bfloat16" if op.endswith("_bf16") else "float16", "_zp_" in op


def dequant_scales(rng: np.random.Generator, n: int, groups: int, fmt: str, wide=None):
    """Positive scales [n, groups] as FP16/BF16 bits: realistic ones (|N(0,1)| * 0.01 + 1e-3),
    or, with `wide` = (lo, hi), u * 2^e over many binades."""
    if wide is None:
        s = np.abs(rng.standard_normal((n, groups))) * 0.01 + 1e-3
    else:
        lo, hi = wide
        s = rng.uniform(1, 2, (n, groups)) * np.exp2(rng.integers(lo, hi + 1, (n, groups)))
    return int4.round_to(s, fmt)


def _dequant_case(rng, op, tag, n, k, g, *, weights=None, zeros=None, wide=False) -> Case:
    """One case of a dequant op; random weights and zero points unless given."""
    kind, fmt, zp = dequant_signature(op)
    if weights is None:
        if kind == "int4":
            weights = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)  # (N,K/8)
        elif kind == "int8":
            weights = rng.integers(0, 256, (n, k), dtype=np.uint8)  # (N,K)
        else:
            weights = rng.choice(E4M3_FINITE_CODES, (n, k))  # (N,K)
    scales = dequant_scales(rng, n, k // g, fmt, WIDE_SCALE_EXPONENTS[kind, fmt] if wide else None)
    inputs = [weights, scales]  # (N,K/8) or (N,K); (N,K/G)
    if zp:
        if zeros is None:
            zeros = rng.integers(0, 2**32, (n, k // g // 8), dtype=np.uint32)  # (N,K/G/8)
        inputs.append(zeros)
    case_id = "_".join([op, *([tag] if tag else []), f"n{n}_k{k}_g{g}"])
    return Case(case_id, op, "exact", inputs, {"group_size": g})


def int4_dequant_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op in DEQUANT_OPS:
        kind, _, zp = dequant_signature(op)
        cases.append(_dequant_case(rng, op, "", 64, 1024, 128))
        # Tail: odd N and an odd number of groups (zero points need K/G to be a multiple of 8).
        cases.append(_dequant_case(rng, op, "tail", *((5, 256, 32) if zp else (3, 96, 32))))
        # Wide: scales over many binades, so results land in every binade (and FP16 subnormals).
        cases.append(_dequant_case(rng, op, "wide", 16, 512, 64, wide=True))
        if kind == "int4" and not zp:
            # Every 16-bit pattern, so every nibble pair and every byte, in both halves of a word.
            words = int4.every_half_word(rng).reshape(256, 256)  # (N,K/8)
            cases.append(_dequant_case(rng, op, "exhaustive", 256, 2048, 128, weights=words))
        if zp:
            # All 16 zero points x all 16 values: 128 groups of 32, each zero point in 8 groups,
            # each group holding every value twice.
            n, k, g = 16, 256, 32
            z = rng.permutation(np.repeat(np.arange(16), (n * k // g) // 16)).reshape(n, k // g)
            q = rng.permuted(np.tile(np.arange(16), (n * k // g, g // 16)), axis=1)
            words = int4.pack(q.reshape(n, k), interleaved=True)
            cases.append(
                _dequant_case(rng, op, "all_zq", n, k, g, weights=words, zeros=int4.pack(z))
            )
        if kind == "int8":
            bytes_ = rng.permuted(np.tile(np.arange(256, dtype=np.uint8), (8, 1)), axis=1)
            cases.append(_dequant_case(rng, op, "all_bytes", 8, 256, 128, weights=bytes_))
        if kind == "e4m3":
            # Every finite code in every row (plus two random ones), shuffled along the row.
            extra = rng.choice(E4M3_FINITE_CODES, (8, 2))
            rows = np.hstack([np.tile(E4M3_FINITE_CODES, (8, 1)), extra])
            codes = rng.permuted(rows, axis=1)  # (8,256)
            cases.append(_dequant_case(rng, op, "all_codes", 8, 256, 128, weights=codes))
    return cases


# ---------------------------------------------------------------------------------------------
# 03_dynamic_quant

QUANT_OPS = ("per_token_fp8", "per_token_int8", "per_tensor_fp8", "per_group_fp8")
QUANT_SHAPES = ((1, 128), (5, 5120), (64, 4096))  # (T, d); 5120 is not a power of two
OUTLIER_FACTOR = 100
OUTLIERS = 8  # elements per tensor multiplied by OUTLIER_FACTOR


def activations(rng: np.random.Generator, t: int, d: int, spread: float = 4.0) -> np.ndarray:
    """BF16 bits [T, d]: normal samples, each row times 2^u, u uniform in [-spread, spread]
    (rows of different magnitude, as real activations have)."""
    rows = np.exp2(rng.uniform(-spread, spread, (t, 1)))
    return formats.f32_to_bf16((rng.standard_normal((t, d)) * rows).astype(np.float32))


def with_outliers(rng: np.random.Generator, x: np.ndarray, n: int = OUTLIERS) -> np.ndarray:
    """x with n distinct random elements multiplied by OUTLIER_FACTOR (rounded to BF16)."""
    flat = formats.bf16_to_f32(x).reshape(-1)
    at = rng.choice(flat.size, n, replace=False)
    flat[at] *= OUTLIER_FACTOR
    return formats.f32_to_bf16(flat.reshape(x.shape))


def dynamic_quant_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op in QUANT_OPS:
        for t, d in QUANT_SHAPES:
            cases.append(Case(f"{op}_t{t}_d{d}", op, "exact", [activations(rng, t, d)]))
        if op != "per_group_fp8":  # 1 x 128 groups need d % 128 == 0
            # d = 203: odd, so no row after the first starts on a 16-byte (or 4-byte) boundary:
            # a vectorized kernel must take its scalar path.
            cases.append(Case(f"{op}_tail_t5_d203", op, "exact", [activations(rng, 5, 203)]))
        # A few x100 elements: the per-tensor scale follows the largest, and small rows of the
        # tensor sink into E4M3's subnormals (tests/python/test_quant_reference.py).
        x = with_outliers(rng, activations(rng, 64, 4096))
        cases.append(Case(f"{op}_outliers_t64_d4096", op, "exact", [x]))
        # One all-zero row: FP8 scale MIN_SCALE, INT8 scale 0, q 0.
        x = activations(rng, 5, 4096)
        x[2] = 0
        cases.append(Case(f"{op}_zero_row_t5_d4096", op, "exact", [x]))
    # scale_ub below the absmax of some rows: those rows clamp the absmax and saturate at +-448.
    x = activations(rng, 5, 4096, spread=2)
    absmax = np.max(np.abs(formats.bf16_to_f32(x)), axis=1)
    scale_ub = float(formats.bf16_to_f32(formats.f32_to_bf16(np.median(absmax))))  # exact in FP32
    cases.append(
        Case("per_token_fp8_ub_t5_d4096", "per_token_fp8", "exact", [x], {"scale_ub": scale_ub})
    )
    # Row-major group scales [T, d/128]. T = d/128 = 40, so both layouts have the same shape and
    # only the param can tell a kernel which one to write.
    x = activations(rng, 40, 5120)
    cases.append(
        Case("per_group_fp8_row_major_t40_d5120", "per_group_fp8", "exact", [x], {"scales_row_major": 1})
    )
    return cases


# ---------------------------------------------------------------------------------------------
# 04_rmsnorm

NORM_OPS = (
    "rmsnorm",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_fp8",
    "fused_add_rmsnorm_int8",
    "fused_add_rmsnorm_fp8_group",
)
# (tag, T, d, eps): d = 203 is odd (a vectorized kernel takes its scalar path); "small" rows
# have mean(x^2) ~ 1e-6, the size of eps, so eps and its FP32 rounding matter.
NORM_SHAPES = (
    ("", 1, 4096, 1e-6),
    ("", 5, 5120, 1e-5),
    ("", 64, 4096, 1e-6),
    ("", 64, 128, 1e-5),
    ("tail", 5, 203, 1e-6),
    ("small", 5, 4096, 1e-5),
)
# The group op's (d a multiple of 128): odd T, so that its [d/128, T] scales and a row-major
# [T, d/128] differ wherever T > 1 and d > 128; d = 128 (one group a row), 5120 (160 threads a
# row), 32768 (the longest row the 16-byte row routine holds: 1024 threads).
NORM_GROUP_SHAPES = (
    ("", 1, 4096, 1e-6),
    ("", 3, 128, 1e-5),
    ("", 17, 5120, 1e-6),
    ("", 64, 4096, 1e-6),
    ("small", 5, 4096, 1e-5),
    ("", 3, 32768, 1e-6),
)
# One tolerance per output (see lkw.rmsnorm): residual_out is exact; y within 2 BF16 ulps (rstd
# depends on the summation order); the fused quant ops' q and scales
# follow the reference's own yb, which a kernel's yb matches only within those 2 ulps:
# FP8: RTOL 2^-2 = one E4M3 step (<= 2^-3 relative) plus the scale's and yb's drift (<= 2^-5),
# ATOL 2^-9 = one E4M3 subnormal step; INT8: RTOL 2^-4 covers the drift, ATOL 1 one step. A
# group's scale and codes follow its own 128 elements of yb exactly as a row's follow the row's:
# the FP8 bounds hold per group.
NORM_TOLERANCES = {
    "rmsnorm": rmsnorm.TOLERANCE_Y,
    "fused_add_rmsnorm": f"{rmsnorm.TOLERANCE_Y}/exact",  # y, residual_out
    "fused_add_rmsnorm_fp8": "close:0.25:0.001953125/close:0.25:0.001953125/exact",  # q, scales, r
    "fused_add_rmsnorm_int8": "close:0.0625:1/close:0.0625:1/exact",
    "fused_add_rmsnorm_fp8_group": "close:0.25:0.001953125/close:0.25:0.001953125/exact",
}


def norm_weight(rng: np.random.Generator, d: int) -> np.ndarray:
    """BF16 bits [d]: weights around 1 (N(1, 0.25)), none zero."""
    w = rng.normal(1.0, 0.25, d)
    return formats.f32_to_bf16(np.where(np.abs(w) < 1e-2, 1.0, w).astype(np.float32))


def rmsnorm_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op in NORM_OPS:
        for tag, t, d, eps in NORM_GROUP_SHAPES if op.endswith("_group") else NORM_SHAPES:
            spread = 0 if tag == "small" else 4.0
            x = activations(rng, t, d, spread)
            if tag == "small":
                x = formats.f32_to_bf16(formats.bf16_to_f32(x) * np.float32(1e-3))
            inputs = [x]
            if op != "rmsnorm":
                # A residual stream larger than the update, so bf16(x + residual) rounds.
                residual = formats.f32_to_bf16(formats.bf16_to_f32(activations(rng, t, d)) * 4)
                if tag == "small":
                    residual = formats.f32_to_bf16(formats.bf16_to_f32(x) * np.float32(0.5))
                inputs.append(residual)
            inputs.append(norm_weight(rng, d))
            case_id = "_".join([op, *([tag] if tag else []), f"t{t}_d{d}"])
            cases.append(Case(case_id, op, NORM_TOLERANCES[op], inputs, {"eps": eps}))
    return cases


# ---------------------------------------------------------------------------------------------
# 05_elementwise


def _act_and_mul(x, act: str, act_first: float = 1, limit: float = 0) -> np.ndarray:
    return elementwise.act_and_mul(x, act, bool(act_first), limit if limit > 0 else None)


def _cache(key, value, slots, key_cache, value_cache, layout: float, k_scale=None, v_scale=None):
    return elementwise.reshape_and_cache(
        key, value, key_cache, value_cache, slots, elementwise.LAYOUTS[int(layout)], k_scale,
        v_scale,
    )


ACT_OPS = {"silu_and_mul": "silu", "gelu_and_mul": "gelu", "gelu_tanh_and_mul": "gelu_tanh"}
# (tag, T, d, params), for every activation: d = 1 (one element a row), 7 and 203 (odd: no row
# after the first starts on a 16-byte boundary, a vectorized kernel takes its scalar path),
# multiples of 8 up to Llama-3-8B's d_ff 14336 at decode (T = 1); the halves swapped
# (act_first 0, vLLM's mul_and_silu); the gpt-oss clamp (limit 7 on N(0, 4^2) values: about one
# gate and one up in twelve beyond +-7).
ACT_CASES = (
    ("", 1, 1, {}),
    ("", 5, 7, {}),
    ("", 64, 203, {}),
    ("", 64, 128, {}),
    ("", 3, 4096, {}),
    ("", 1, 14336, {}),
    ("up_first", 5, 203, {"act_first": 0}),
    ("up_first", 5, 128, {"act_first": 0}),
    ("clamp", 5, 1024, {"limit": 7.0}),
    ("extreme", 3, 64, {}),
)
# "extreme": gates from -130 to 30, where exp(-gate) overflows FP32 (below -88.7) while silu's
# result, gate * e^gate, is still a normal number down to -91.9 and a BF16 subnormal to -97.5.
EXTREME_GATES = (-130.0, 30.0)
FP8_ACT_OPS = {
    "silu_and_mul_fp8_per_token": "per_token",
    "silu_and_mul_fp8_per_group": "per_group",
    "silu_and_mul_fp8_per_tensor": "per_tensor",
}
# (op, tag, T, d): the fused quant forms; per group needs d % 128 == 0. "ub": scale_ub below some
# rows' absmax (they clamp and saturate at +-448); "zero_row": a row of zeros (y 0: scale
# MIN_SCALE, q 0); "row_major": group scales [T, d/128] with T = d/128, so that both layouts have
# one shape and only the param tells them apart; "saturate": a static scale from the median row's
# absmax, so the larger rows saturate.
FP8_ACT_CASES = (
    *(("silu_and_mul_fp8_per_token", "", t, d) for t, d in ((1, 128), (5, 203), (5, 4096))),
    ("silu_and_mul_fp8_per_token", "ub", 5, 4096),
    ("silu_and_mul_fp8_per_token", "zero_row", 5, 128),
    *(("silu_and_mul_fp8_per_group", "", t, d) for t, d in ((1, 128), (5, 4096), (16, 512))),
    ("silu_and_mul_fp8_per_group", "row_major", 8, 1024),
    *(("silu_and_mul_fp8_per_tensor", "", t, d) for t, d in ((1, 128), (5, 203), (16, 512))),
    ("silu_and_mul_fp8_per_tensor", "saturate", 5, 4096),
)
# (tag, T, Hq, Hk, D, rot_dim, is_neox, inverse, max_pos, base): Hq != Hk (GQA), whole and partial
# rotations of both pairings, the inverse rotation, decode (T = 1), positions up to 8191 (near
# p = 8192 the angle's FP32 rounding is part of the contract), and D = 6 and 10 (heads not a
# whole number of 16-byte vectors: a kernel's scalar path), whole and partial.
ROPE_CASES = (
    ("neox", 5, 4, 2, 128, 128, 1, 0, 128, 500000.0),
    ("gptj", 5, 4, 2, 128, 128, 0, 0, 128, 10000.0),
    ("neox_partial", 7, 4, 4, 128, 64, 1, 0, 128, 10000.0),
    ("gptj_partial", 3, 2, 1, 32, 16, 0, 0, 8192, 10000.0),
    ("inverse", 5, 4, 2, 128, 128, 1, 1, 128, 500000.0),
    ("decode", 1, 8, 1, 128, 128, 1, 0, 128, 500000.0),
    ("d6", 5, 3, 1, 6, 6, 1, 0, 4096, 10000.0),
    ("d10_partial", 7, 2, 2, 10, 6, 0, 0, 4096, 10000.0),
)
# (tag, T, Hq, Hk, D, rot_dim, is_neox, max_pos, base), eps 1e-6: Qwen3's heads (D 128, base 1e6)
# in both pairings, at decode, partially rotated, and D = 10.
QK_NORM_ROPE_CASES = (
    ("neox", 5, 4, 2, 128, 128, 1, 128, 1e6),
    ("gptj", 3, 4, 2, 128, 128, 0, 128, 1e6),
    ("decode", 1, 4, 2, 128, 128, 1, 128, 1e6),
    ("partial", 5, 4, 2, 128, 64, 1, 128, 1e6),
    ("d10", 7, 3, 1, 10, 10, 0, 4096, 10000.0),
)
QK_NORM_EPS = 1e-6
CACHE_OPS = {"reshape_and_cache": "bfloat16", "reshape_and_cache_fp8": "float8_e4m3fn"}
# (tag, T, Hk, D, block_size, num_blocks, padding) for every layout and both cache dtypes. D None:
# the smallest D of the layout ("paged": x = 16 bytes of one head, 8 BF16 or 16 FP8 elements;
# "nhd" and "hnd": 6, less than one 16-byte vector). A quarter of the tokens are padding (slot -1)
# but at decode; the slots scattered over twice the tokens (or more) so that most slots keep the
# poison the initial caches hold (lkw.elementwise.poisoned_caches).
CACHE_CASES = (
    ("", 37, 2, 128, 16, 4, 0.25),
    ("decode", 1, 2, 128, 16, 2, 0.0),
    ("bs5", 23, 8, None, 5, 8, 0.25),
    ("bs32", 40, 2, 32, 32, 2, 0.25),
)


# (tag, T, Hq, Hk, D, rot_dim, is_neox, block_size, num_blocks, padding, max_pos, base) for every
# layout: Llama-like heads with padding; GPT-J, partially rotated, Hq not a multiple of Hk (the
# kernel's head groups) at block 5; decode; a 32-token block. Small cos/sin caches: rope's
# cases try positions near 8192.
QKV_ROPE_CACHE_CASES = (
    ("neox", 37, 4, 2, 128, 128, 1, 16, 4, 0.25, 128, 500000.0),
    ("gptj_partial", 23, 5, 2, 64, 32, 0, 5, 12, 0.25, 256, 10000.0),
    ("decode", 1, 8, 1, 128, 128, 1, 16, 2, 0.0, 128, 500000.0),
    ("bs32", 40, 4, 2, 128, 64, 1, 32, 3, 0.25, 512, 500000.0),
)


def _nonzero(draw: Callable[[], np.ndarray]) -> np.ndarray:
    """draw() again until the result is not all zeros (a case with an all-zero input is refused:
    T = 1 may draw position 0 or slot 0)."""
    while not np.any(out := draw()):
        pass
    return out


def rope_positions(rng: np.random.Generator, t: int, max_pos: int) -> np.ndarray:
    """int64 [T] in 0..max_pos-1; with T >= 2 the first is the cache's last row and the second 0
    (cos 1, sin 0: the rotation leaves the head as it is)."""
    pos = _nonzero(lambda: elementwise.positions(rng, t, max_pos))
    if t >= 2:
        pos[:2] = max_pos - 1, 0
    return pos


def _fp32_scale(a: float) -> np.ndarray:
    return np.array([a], np.float32)


def elementwise_act_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op, act in ACT_OPS.items():
        for tag, t, d, params in ACT_CASES:
            if tag == "clamp":
                x = formats.f32_to_bf16(4 * formats.bf16_to_f32(elementwise.gate_up(rng, t, d, 0)))
            else:
                x = elementwise.gate_up(rng, t, d)  # (T,2d)
            if tag == "extreme":
                gates = np.linspace(*EXTREME_GATES, t * d, dtype=np.float32).reshape(t, d)
                x[:, :d] = formats.f32_to_bf16(gates)
            tol = elementwise.act_tolerance(
                x, act, bool(params.get("act_first", 1)), params.get("limit")
            )
            case_id = "_".join([op, *([tag] if tag else []), f"t{t}_d{d}"])
            cases.append(Case(case_id, op, tol, [x], dict(params)))
    for op, tag, t, d in FP8_ACT_CASES:
        kind = FP8_ACT_OPS[op]
        x = elementwise.gate_up(rng, t, d)  # (T,2d)
        if tag == "zero_row":
            x[2] = 0
        y = formats.bf16_to_f32(elementwise.silu_and_mul(x))  # (T,d): the fused chain's yb
        inputs, params = [x], {}
        if tag == "ub":  # exact in FP32: a BF16 value
            row_max = np.max(np.abs(y), axis=1)
            params["scale_ub"] = float(formats.bf16_to_f32(formats.f32_to_bf16(np.median(row_max))))
        if tag == "row_major":
            params["scales_row_major"] = 1
        if kind == "per_tensor":  # a calibrated scale: the tensor's absmax / 448, or the median row's
            top = np.median(np.max(np.abs(y), axis=1)) if tag == "saturate" else np.max(np.abs(y))
            inputs.append(_fp32_scale(top / 448))
        case_id = "_".join([op, *([tag] if tag else []), f"t{t}_d{d}"])
        cases.append(Case(case_id, op, elementwise.TOLERANCE_FP8[kind], inputs, params))
    return cases


def elementwise_rope_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for tag, t, hq, hk, d, rot, is_neox, inverse, max_pos, base in ROPE_CASES:
        pos = rope_positions(rng, t, max_pos)
        q, k = elementwise.heads(rng, t, hq, d), elementwise.heads(rng, t, hk, d)
        cache = elementwise.cos_sin_cache(max_pos, rot, base)
        params = {"is_neox": is_neox, **({"inverse": 1} if inverse else {})}
        case_id = f"rope_{tag}_t{t}_hq{hq}_hk{hk}_d{d}_r{rot}"
        tol = elementwise.rope_tolerance(q, k)
        cases.append(Case(case_id, "rope", tol, [pos, q, k, cache], params))
    for tag, t, hq, hk, d, rot, is_neox, max_pos, base in QK_NORM_ROPE_CASES:
        pos = rope_positions(rng, t, max_pos)
        q, k = elementwise.heads(rng, t, hq, d), elementwise.heads(rng, t, hk, d)
        qw, kw = norm_weight(rng, d), norm_weight(rng, d)
        cache = elementwise.cos_sin_cache(max_pos, rot, base)
        inputs = [pos, q, k, qw, kw, cache]
        params = {"eps": QK_NORM_EPS, "is_neox": is_neox}
        outputs = reference("qk_norm_rope", inputs, params)
        case_id = f"qk_norm_rope_{tag}_t{t}_hq{hq}_hk{hk}_d{d}_r{rot}"
        tol = elementwise.qk_norm_rope_tolerance(*outputs)
        cases.append(Case(case_id, "qk_norm_rope", tol, inputs, params))
    return cases


def cache_head_size(layout: str, kv_dtype: str, d: int | None) -> int:
    """D of a cache case: as given, or the layout's smallest (CACHE_CASES)."""
    if d is not None:
        return d
    return elementwise.cache_x(kv_dtype) if layout == "paged" else 6


def elementwise_cache_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op, kv_dtype in CACHE_OPS.items():
        for layout_id, layout in enumerate(elementwise.LAYOUTS):
            for tag, t, hk, d, block_size, num_blocks, padding in CACHE_CASES:
                d = cache_head_size(layout, kv_dtype, d)
                key, value = elementwise.heads(rng, t, hk, d), elementwise.heads(rng, t, hk, d)
                slots = _nonzero(
                    lambda t=t, n=num_blocks * block_size, p=padding: elementwise.slot_mapping(
                        rng, t, n, p
                    )
                )
                inputs = [key, value, slots]
                if kv_dtype == "float8_e4m3fn":
                    # k_scale a little below the written keys' absmax / 448 (the largest saturate),
                    # v_scale 4x above it (the smaller values land in E4M3's subnormals).
                    kmax = np.max(np.abs(formats.bf16_to_f32(key[slots >= 0])))
                    vmax = np.max(np.abs(formats.bf16_to_f32(value[slots >= 0])))
                    inputs += [_fp32_scale(0.75 * kmax / 448), _fp32_scale(4 * vmax / 448)]
                init = list(elementwise.poisoned_caches(layout, num_blocks, block_size, hk, d,
                                                        kv_dtype))
                case_id = "_".join(
                    [op, layout, *([tag] if tag else []), f"t{t}_h{hk}_d{d}_b{block_size}"]
                )
                cases.append(Case(case_id, op, elementwise.TOLERANCE_KV, inputs,
                                  {"layout": layout_id}, init))
    return cases


def elementwise_qkv_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for layout_id, layout in enumerate(elementwise.LAYOUTS):
        for tag, t, hq, hk, d, rot, is_neox, bs, blocks, padding, max_pos, base in QKV_ROPE_CACHE_CASES:
            pos = rope_positions(rng, t, max_pos)
            qkv = elementwise.heads(rng, t, hq + 2 * hk, d)
            slots = _nonzero(lambda t=t, n=blocks * bs, p=padding: elementwise.slot_mapping(rng, t, n, p))
            cache = elementwise.cos_sin_cache(max_pos, rot, base)
            init = list(elementwise.poisoned_caches(layout, blocks, bs, hk, d, "bfloat16"))
            rope_tol = elementwise.rope_tolerance(qkv[:, : hq + hk])
            tol = "/".join([rope_tol, elementwise.TOLERANCE_KV, rope_tol])
            case_id = f"qkv_rope_cache_{layout}_{tag}_t{t}_hq{hq}_hk{hk}_d{d}_r{rot}_b{bs}"
            cases.append(Case(case_id, "qkv_rope_cache", tol, [pos, qkv, cache, slots],
                              {"layout": layout_id, "is_neox": is_neox}, init))
    return cases


def elementwise_cases(rng: np.random.Generator) -> list[Case]:
    return (elementwise_act_cases(rng) + elementwise_rope_cases(rng) + elementwise_cache_cases(rng)
            + elementwise_qkv_cases(rng))


# ---------------------------------------------------------------------------------------------
# 06_int4_gemv

GEMV_OPS = ("int4_gemv", "int4i_gemv", "int4i_zp_gemv", "int4t_gemv")
# (M, N, K, G): every M path of the kernels (1 and 2..8: one mma column tile; 9..16: two), odd N
# and N past one block of rows, every group size (G = 128 scales the FP32 sums in v3, G < 128 the
# weights), K = 352, 1152 and 4192 not multiples of 256 (the 16-byte versions' K tail, alone and
# in the last of several K splits), N = 1. The launchers split K by the shape, so N = 37 with
# K = 4096 also runs the split-K path. N = 4104 (257 tiles: one or two per block) with 9 steps per
# tile cuts tiles between v5's to v7's warps at every boundary, some into three parts; N = 4104
# with K = 3072 (12 steps) has runs that start and end inside tiles.
GEMV_SHAPES = (
    (1, 37, 4096, 128),
    (2, 4104, 3072, 128),
    (2, 4104, 2304, 128),
    (4, 37, 1152, 128),
    (3, 200, 1024, 64),
    (8, 37, 256, 32),
    (16, 37, 4096, 128),
    (9, 64, 1024, 64),
    (5, 37, 352, 32),
    (2, 37, 4192, 32),
    (1, 1, 1024, 128),
)
# Zero points need K/G to be a multiple of 8, hence K a multiple of 256: no K tail here.
GEMV_ZP_SHAPES = (
    (1, 37, 1024, 128),
    (3, 200, 512, 64),
    (8, 37, 256, 32),
    (16, 37, 4096, 128),
    (11, 64, 2048, 32),
)
BF16_GEMV_SHAPES = ((1, 37, 4096), (8, 200, 1024), (16, 37, 256))


def gemv_activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """BF16 bits [M, K]: normal samples, each row times 2^u, u uniform in [-2, 2]."""
    rows = np.exp2(rng.uniform(-2, 2, (m, 1)))
    return formats.f32_to_bf16((rng.standard_normal((m, k)) * rows).astype(np.float32))


def _gemv_case(rng: np.random.Generator, op: str, m: int, n: int, k: int, g: int) -> Case:
    x = gemv_activations(rng, m, k)  # (M,K)
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)  # (N,K/8): every nibble value
    scales = dequant_scales(rng, n, k // g, "bfloat16")  # (N,K/G)
    inputs = [x, words, scales]
    zeros = None
    if op == "int4i_zp_gemv":
        zeros = rng.integers(0, 2**32, (n, k // g // 8), dtype=np.uint32)  # (N,K/G/8)
        inputs.append(zeros)
    w = gemv.w_hat(words, scales, zeros, interleaved=op != "int4_gemv")
    tol = gemv.tolerance(x, w)
    if op == "int4t_gemv":  # tiled, the padding random: a kernel that used it would be caught
        padded = gemv.tiled_shape(n, k)
        inputs[1] = gemv.tile_weights(words, rng.integers(0, 2**32, padded, dtype=np.uint32))
    return Case(f"{op}_m{m}_n{n}_k{k}_g{g}", op, tol, inputs, {"group_size": g})


def int4_gemv_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op in GEMV_OPS:
        for m, n, k, g in GEMV_ZP_SHAPES if op == "int4i_zp_gemv" else GEMV_SHAPES:
            cases.append(_gemv_case(rng, op, m, n, k, g))
    for m, n, k in BF16_GEMV_SHAPES:
        x = gemv_activations(rng, m, k)  # (M,K)
        w = formats.f32_to_bf16((rng.standard_normal((n, k)) * 0.05).astype(np.float32))  # (N,K)
        tol = gemm_bf16_tolerance(x, w)
        cases.append(Case(f"bf16_gemv_m{m}_n{n}_k{k}", "bf16_gemv", tol, [x, w]))
    return cases


# ---------------------------------------------------------------------------------------------
# 07_w4a16_gemm

W4A16_OPS = ("w4a16_gemm", "w4a16r_gemm")
# (M, N, K, G), the same for both ops: M = 1 to 130 (one and several m16 tiles, partial ones, past
# a 128-row block); N = 64 (one n64 block of the repacked layout), 192 (an odd number of them),
# 320 (not a multiple of 256), 512; K = 1056, 2080 and 4192 have K % 64 == 32, a k16 tail past
# the last k64 (so only G = 32 or G = K divides them); G = K is one scale per output channel
# (scales [1, N]). M = 29 takes the wgmma version's 32-token tile with K split 16 ways, an odd row
# count in the last token pair. M = 1100 is nine 128-token tiles: the wgmma version's raster runs
# them in two groups of eight.
W4A16_SHAPES = (
    (1, 64, 256, 32),
    (5, 192, 1056, 32),
    (16, 320, 4096, 128),
    (17, 512, 256, 64),
    (29, 320, 4192, 32),
    (33, 64, 4192, 32),
    (64, 192, 2080, 32),
    (130, 320, 1056, 1056),
    (1, 512, 4096, 4096),
    (5, 64, 2080, 2080),
    (16, 512, 4192, 32),
    (64, 192, 4096, 64),
    (130, 64, 256, 128),
    (1100, 64, 256, 64),
)


# The zero-point cases (a fourth input, uint8 [K/G, N] in 0..15), for both ops: G = 32 with a
# stage of 64 k spanning two groups (what mutant_zero_points gets wrong), G = 64, 128 and K (zero
# points [1, N]), K % 64 == 32 tails, M = 1 (the GEMV, the 16-token wgmma tile), split-K shapes
# (few tiles, long K) and M = 130 (two 128-token tiles, a partial one).
W4A16_ZP_SHAPES = (
    (1, 64, 256, 32),
    (5, 192, 1056, 32),
    (17, 320, 2080, 2080),
    (33, 512, 4096, 128),
    (1, 512, 4192, 32),
    (64, 64, 1024, 64),
    (130, 192, 512, 32),
)


def _w4a16_case(
    rng: np.random.Generator, op: str, m: int, n: int, k: int, g: int, zero_points: bool = False
) -> Case:
    x = gemv_activations(rng, m, k)  # (M,K)
    words = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)  # (N,K/8): every nibble value
    scales = dequant_scales(rng, k // g, n, "bfloat16")  # (K/G,N): group-major, drawn as such
    weights = w4a16.repack(words) if op == "w4a16r_gemm" else words  # (N/64,8K) or (N,K/8)
    if not zero_points:
        tol = w4a16.tolerance(x, w4a16.w_hat(words, scales))
        return Case(f"{op}_m{m}_n{n}_k{k}_g{g}", op, tol, [x, weights, scales], {"group_size": g})
    zeros = rng.integers(0, 16, (k // g, n), dtype=np.uint8)  # (K/G,N): every 4-bit value
    tol = w4a16.tolerance(x, w4a16.w_hat_zp(words, scales, zeros))
    inputs = [x, weights, scales, zeros]
    return Case(f"{op}_zp_m{m}_n{n}_k{k}_g{g}", op, tol, inputs, {"group_size": g})


def w4a16_gemm_cases(rng: np.random.Generator) -> list[Case]:
    # The zero-point cases after the symmetric ones: adding them left those draws unchanged.
    symmetric = [_w4a16_case(rng, op, *shape) for op in W4A16_OPS for shape in W4A16_SHAPES]
    return symmetric + [
        _w4a16_case(rng, op, *shape, zero_points=True)
        for op in W4A16_OPS
        for shape in W4A16_ZP_SHAPES
    ]


# ---------------------------------------------------------------------------------------------
# 08_fp8_gemm

# The tensor core's accumulation may run over the whole K for tensor and rowwise scales (the
# versions that scale in the epilogue keep one sum; a promoting one is well inside that bound)
# and over one 128-k block for blockwise ones, which every version that takes them promotes
# (lkw.fp8_gemm.error_bound).
FP8_PROMOTE_K = {"tensor": None, "rowwise": None, "blockwise": fp8_gemm.PROMOTE_K}
# (granularity, tag, M, N, K, a_scales_row_major, shift); blockwise cases are op
# fp8_gemm_blockwise's, the others fp8_gemm's. M = 1, 7, 65, 130, 257 end inside a tile; N = 16
# and 48 are less than one 128-channel block, 144 and 272 end a sixteenth into a block, 2112 is
# DeepSeek-V3's 16.5; K = 16, 48, 208 end inside a 32-k MMA step, a 64-k stage and a 128-k block
# (tensor and rowwise only: blockwise scales need K % 128 == 0); K = 16384 is the longest
# unpromoted accumulation. 128 x 256 x 512 is whole tiles only. Blockwise s_a in both layouts;
# M = K/128 = 16 gives both layouts one shape, so only the param can tell a kernel which it
# holds. "positive" (shift 1: products of one sign) is where an accumulator that is never
# promoted drifts (lkw.fp8_gemm.promotion_sweep); blockwise only, since the epilogue-scaling
# versions accumulate tensor and rowwise sums unpromoted by design.
FP8_GEMM_CASES = (
    ("tensor", "", 1, 16, 16, 0, 0.0),
    ("tensor", "", 7, 272, 48, 0, 0.0),
    ("tensor", "", 257, 48, 208, 0, 0.0),
    ("tensor", "", 65, 272, 384, 0, 0.0),
    ("tensor", "tiles", 128, 256, 512, 0, 0.0),
    ("rowwise", "", 1, 48, 48, 0, 0.0),
    ("rowwise", "", 7, 16, 208, 0, 0.0),
    ("rowwise", "", 130, 48, 2048, 0, 0.0),
    ("rowwise", "", 65, 2112, 128, 0, 0.0),
    ("rowwise", "", 4, 16, 16384, 0, 0.0),
    ("rowwise", "tiles", 128, 256, 512, 0, 0.0),
    ("blockwise", "", 1, 16, 128, 0, 0.0),
    ("blockwise", "row_major", 7, 48, 384, 1, 0.0),
    ("blockwise", "", 65, 272, 384, 0, 0.0),
    ("blockwise", "", 65, 2112, 128, 0, 0.0),
    ("blockwise", "row_major", 130, 272, 256, 1, 0.0),
    ("blockwise", "", 257, 48, 384, 0, 0.0),
    ("blockwise", "", 16, 16, 2048, 0, 0.0),
    ("blockwise", "row_major", 16, 144, 2048, 1, 0.0),
    ("blockwise", "tiles", 128, 256, 512, 0, 0.0),
    ("blockwise", "positive", 65, 144, 2048, 0, 1.0),
    ("blockwise", "", 4, 48, 16384, 0, 0.0),  # 128 K blocks promoted: the long end of the range
    # v6's GEMV (its gemv_only ablation above M = 16) takes one, two or four 8-token tiles: M = 9 .. 16 and 17 .. 32 as well,
    # with a K that ends inside a 128-byte block (tensor, rowwise) and K blocks for every warp.
    ("tensor", "", 11, 32, 208, 0, 0.0),
    ("rowwise", "", 23, 48, 1200, 0, 0.0),
    ("blockwise", "", 29, 48, 1024, 0, 0.0),
    # v7's swapped ring takes 16, 32 or 64 tokens a tile: 33 .. 64 as well, its last tile of B with
    # one live warpgroup (N = 272).
    ("blockwise", "", 47, 272, 768, 0, 0.0),
)
# Persistent walks (the param max_blocks: at most that many blocks, where the SMs would give each
# unit a block of its own): every block of v3 to v5 takes several tiles, or several K shares of
# one tile (v5), and the stage ring runs on from one tile into the next.
FP8_GEMM_WALKS = (
    ("tensor", "walk", 130, 512, 256, 0, 0.0, 2),
    ("rowwise", "walk", 257, 272, 384, 0, 0.0, 3),
    ("blockwise", "walk", 257, 272, 384, 0, 0.0, 3),
    ("blockwise", "walk", 16, 16, 2048, 0, 0.0, 2),
    ("blockwise", "walk", 40, 400, 640, 0, 0.0, 2),  # v7: 4 tiles of B on 2 blocks, its 9-stage ring wrapping
)


def round_up(x: float, digits: int = 4) -> str:
    """x to `digits` significant digits, rounded up: a bound printed never tightens."""
    text = f"{x:.{digits}g}"
    if float(text) < x:
        text = f"{float(text) + 10.0 ** (np.floor(np.log10(x)) - digits + 1):.{digits}g}"
    return text


# The golden output's own error: one rounding to nearest BF16 moves a value by up to half an ulp,
# which is 2^-8 of a value just above a power of two (8 significant bits), so up to 2^-8 in the
# Frobenius norm too (2^-9 is only its typical size: few outputs exceed it, test_fp8_gemm_golden).
FP8_GOLDEN_ROUNDING = 2.0**-8


def fp8_gemm_tolerance(k: int, granularity: str) -> str:
    """frob:BOUND for fp8_gemm against the golden output, which is the float64 product rounded
    to BF16: lkw.fp8_gemm.error_bound (the kernel's error against the float64 product, at the
    granularity's accumulation run, FP8_PROMOTE_K) plus FP8_GOLDEN_ROUNDING (the triangle
    inequality: kernel to product, product to its BF16 rounding)."""
    bound = fp8_gemm.error_bound(k, FP8_PROMOTE_K[granularity]) + FP8_GOLDEN_ROUNDING
    return f"frob:{round_up(bound)}"


# Weight magnitudes vary by up to 2^+-1 between 128-wide K blocks (lkw.fp8_gemm.weights): the
# weight scales of neighbouring K blocks must differ for a kernel that reads the wrong one to fail.
FP8_K_BLOCK_SPREAD = 1.0


def fp8_gemm_case(
    rng, granularity, tag, m, n, k, a_scales_row_major=0, shift=0.0, max_blocks=0
) -> Case:
    """One fp8_gemm case on lkw.fp8_gemm.problem's data (activation rows of different
    magnitude with x100 outliers, weight channels and K blocks of different magnitude),
    quantized at the granularity; blockwise s_a transposed to row-major where asked."""
    a, b, s_a, s_b = fp8_gemm.problem(rng, m, n, k, granularity, shift, FP8_K_BLOCK_SPREAD)
    params = {}
    if granularity == "blockwise":
        params["a_scales_row_major"] = a_scales_row_major
        if a_scales_row_major:
            s_a = np.ascontiguousarray(s_a.T)  # (K/128,M) -> (M,K/128)
    if max_blocks:
        params["max_blocks"] = max_blocks
    op = "fp8_gemm_blockwise" if granularity == "blockwise" else "fp8_gemm"
    case_id = "_".join(["fp8_gemm", granularity, *([tag] if tag else []), f"m{m}_n{n}_k{k}"])
    return Case(case_id, op, fp8_gemm_tolerance(k, granularity), [a, b, s_a, s_b], params)


def fp8_gemm_cases(rng: np.random.Generator) -> list[Case]:
    return [fp8_gemm_case(rng, *row) for row in FP8_GEMM_CASES + FP8_GEMM_WALKS]


# ---------------------------------------------------------------------------------------------
# 09_moe


def _align(ids: np.ndarray, num_experts: float, block_m: float) -> tuple[np.ndarray, ...]:
    sorted_ids, expert_ids, n_post = moe.moe_align_block_size(ids, int(num_experts), int(block_m))
    return sorted_ids, expert_ids, np.array([n_post], np.int32)


def _topk(logits: np.ndarray, k: float, renormalize: float = 0) -> tuple[np.ndarray, ...]:
    return moe.topk_softmax(logits, int(k), bool(renormalize))


def _deepseek(logits, bias, k, n_group, topk_group, renormalize=1, routed_scaling_factor=1.0):
    return moe.deepseek_router(
        logits, bias, int(k), int(n_group), int(topk_group), bool(renormalize),
        routed_scaling_factor,
    )


def align_tolerance(block_m: int) -> str:
    """sorted_token_ids as a multiset per expert run (the runs cut by expert_ids, output 1, one
    id per block_m rows); expert_ids and num_tokens_post_padded exact."""
    return f"multiset:1:{block_m}/exact/exact"


def router_tolerance(e: int, k: int, deepseek: bool) -> str:
    """Weights within what FP32 arithmetic can differ by (relative, in units u = 2^-24); ids exact.

    Softmax: expf is within 2 ulp (4u) in the numerator and in each term of the sum, the sum of E
    terms adds at most E - 1 roundings of <= u of the total in any order, the reciprocal of the
    sum (MUFU.RCP, 2 ulp: 4u) and the product u; a renormalization adds k - 1 roundings, a
    reciprocal and a product: (E + k + 16) u in all. DeepSeek: the sigmoid (expf, an add, a
    reciprocal: 9u), the sum of k weights, its reciprocal and two products: (k + 20) u. The golden logits make every decision decisive (see routing_logits), so
    the ids are the reference's exactly, ties included."""
    units = k + 20 if deepseek else e + k + 16
    return f"close:{units * 2.0**-24:.3g}:0/exact"


def routing_logits(rng: np.random.Generator, t: int, e: int, levels: int, step: float) -> np.ndarray:
    """float32 [T, E] on a grid: integers in [-levels/2, levels/2) times `step` (exact in BF16 for
    levels <= 256). Equal logits are exact ties on both sides (broken by the lower id); distinct
    ones differ by `step` at least, so their probabilities differ by a factor e^step, far beyond
    any FP32 rounding: no comparison depends on how a kernel rounds."""
    return (rng.integers(-levels // 2, levels // 2, (t, e)) * step).astype(np.float32)


DEEPSEEK_MARGIN = 1e-5  # a kernel's FP32 choice scores are within ~1e-6 of the float64 ones


def deepseek_decisive(z: np.ndarray, bias: np.ndarray, k: int, n_group: int, topk_group: int) -> bool:
    """Whether every comparison deepseek_router makes on this row (float32 logits z [E]) is
    decided by more than DEEPSEEK_MARGIN or is an exact tie of identical inputs (then a kernel
    ties too and picks the lower id). Checked: the kept groups against the best dropped one, and
    the order of the k chosen experts and the first one left out."""
    s = 1.0 / (1.0 + np.exp(-z.astype(np.float64)))
    c = s + bias.astype(np.float64)
    per = z.size // n_group
    pairs = [tuple(sorted(zip(c[g * per:(g + 1) * per], z[g * per:(g + 1) * per], bias[g * per:(g + 1) * per]))[-2:]) for g in range(n_group)]
    score = np.array([p[0][0] + p[1][0] for p in pairs])
    order = np.argsort(-score, kind="stable")
    if topk_group < n_group:
        a, b = order[topk_group - 1], order[topk_group]
        same = [q[1:] for q in pairs[a]] == [q[1:] for q in pairs[b]]
        if score[a] - score[b] < DEEPSEEK_MARGIN and not same:
            return False
    kept = np.repeat(np.isin(np.arange(n_group), order[:topk_group]), per)
    chosen = np.argsort(-np.where(kept, c, -np.inf), kind="stable")[: k + 1]
    chosen = chosen[np.isfinite(np.where(kept, c, -np.inf)[chosen])]
    for a, b in itertools.pairwise(chosen):
        same = z[a] == z[b] and bias[a] == bias[b]
        if c[a] - c[b] < DEEPSEEK_MARGIN and not same:
            return False
    return True


def deepseek_inputs(rng, t, e, k, n_group, topk_group, levels=256, bias_levels=16):
    """Grid logits (step 1/32) and a grid bias (multiples of 1/64 around 0), rows re-drawn until
    deepseek_decisive holds (a few percent of rows need it)."""
    bias = (rng.integers(-bias_levels // 2, bias_levels // 2, e) / 64).astype(np.float32)
    z = routing_logits(rng, t, e, levels, 1 / 32)
    for row in range(t):
        while not deepseek_decisive(z[row], bias, k, n_group, topk_group):
            z[row] = routing_logits(rng, 1, e, levels, 1 / 32)[0]
    return z, bias


# (tag, T, k, E, BLOCK_M, distribution): E = 60 is no power of two; T = 1 and 65536; k = 1;
# BLOCK_M = 1 (no padding at all) and 256 (more padding than rows); "one": every token on the
# same k experts; "hot": every slot on one expert; "masked": a third of the slots -1.
ALIGN_CASES = (
    ("uniform", 4096, 8, 256, 64, "uniform"),
    ("zipf", 4096, 8, 256, 64, "zipf"),
    ("uniform", 1, 8, 256, 64, "uniform"),
    ("uniform", 65536, 1, 60, 16, "uniform"),
    ("zipf", 3001, 6, 60, 64, "zipf"),
    ("one", 3000, 8, 64, 64, "one"),
    ("hot", 2000, 1, 128, 64, "hot"),
    ("masked", 777, 4, 64, 16, "masked"),
    ("uniform", 100, 2, 16, 1, "uniform"),
    ("uniform", 5, 2, 8, 256, "uniform"),
    ("uniform", 1, 1, 256, 16, "uniform"),
)

# (tag, T, E, k, renormalize, levels, step): Mixtral E 8 k 2, Qwen3 E 128 k 8, DeepSeek's E 256;
# E = 60; k = 1; "ties": 4 distinct logits a row (ties everywhere, the lower id must win);
# "wide": step 1/4 over [-32, 32), so most probabilities are tiny.
TOPK_CASES = (
    ("", 1, 8, 2, 1, 256, 1 / 32),
    ("", 1000, 8, 2, 1, 256, 1 / 32),
    ("", 128, 128, 8, 1, 256, 1 / 32),
    ("", 333, 60, 4, 0, 256, 1 / 32),
    ("", 64, 256, 8, 0, 256, 1 / 32),
    ("", 37, 256, 1, 0, 256, 1 / 32),
    ("", 9, 512, 32, 1, 256, 1 / 32),
    ("ties", 200, 64, 8, 0, 4, 1 / 32),
    ("wide", 50, 96, 6, 1, 256, 1 / 4),
)
# (tag, T, E, k, n_group, topk_group, renormalize, routed_scaling_factor, logit levels)
DEEPSEEK_CASES = (
    ("", 64, 256, 8, 8, 4, 1, 2.5, 256),
    ("", 1, 256, 8, 8, 4, 1, 2.5, 256),
    ("", 300, 64, 6, 4, 2, 1, 1.0, 256),
    ("", 100, 60, 4, 6, 3, 0, 1.0, 256),
    ("", 50, 128, 8, 8, 4, 0, 2.5, 256),
    ("ties", 100, 256, 8, 8, 4, 1, 2.5, 8),
)


def _align_ids(rng: np.random.Generator, t: int, k: int, e: int, dist: str) -> np.ndarray:
    if dist == "hot":
        return np.full((t, k), rng.integers(1, e), np.int32)
    ids = moe.routing_ids(rng, t, e, k, "uniform" if dist == "masked" else dist)  # (T,k)
    if dist == "one":  # the same k experts for every token, which k the seed decides
        ids = rng.permutation(e).astype(np.int32)[ids]
    if dist == "masked":
        ids[rng.random(ids.shape) < 1 / 3] = -1
    if not np.any(ids):  # T·k = 1 draws expert 0 one time in E: an all-zero input tests nothing
        ids[...] = e - 1
    return ids


def _grouped(fn, x, w, sorted_ids, expert_ids, topk, block_m) -> np.ndarray:
    bf16 = ml_dtypes.bfloat16
    out = fn(x.view(bf16), w.view(bf16), sorted_ids, expert_ids, int(block_m), int(topk))
    return out.view(np.uint16)


def _grouped_w4a16(x, w, scales, sorted_ids, expert_ids, topk, block_m) -> np.ndarray:
    out = moe.grouped_gemm_w4a16(
        x.view(ml_dtypes.bfloat16), w, scales, sorted_ids, expert_ids, int(block_m), int(topk)
    )
    return out.view(np.uint16)


def grouped_tolerance(x, w, sorted_ids, expert_ids, block_m: int, topk: int, silu: bool) -> str:
    """close:RTOL:ATOL for the grouped GEMM (BF16 bits x [T, K], w [E, N, K]), as
    gemm_bf16_tolerance: RTOL 1.6e-2 for the one BF16 rounding (kernel and reference may land on
    neighbouring BF16 values), ATOL for the FP32 accumulation, eps = 8 sqrt(K) 2^-24 S with S the
    largest sum_k |x_k w_k| of a routed row: it grows with sqrt(K).

    With silu, g and u (gate, up) each carry that FP32 error eps and are not rounded to BF16;
    silu(g) u moves by |silu'(g) u| eps + |silu(g)| eps, and |silu'| <= 1.1, so ATOL is
    eps (1.1 max |u| + max |silu(g)|) over the routed rows. SiLU's own FP32 error (a few ulp of
    FP32) is far inside RTOL."""
    bf16 = ml_dtypes.bfloat16
    xv, wv = x.view(bf16).astype(np.float64), w.view(bf16).astype(np.float64)
    abs_sum = moe.grouped_gemm(np.abs(xv), np.abs(wv), sorted_ids, expert_ids, block_m, topk)
    gate_up = moe.grouped_gemm(xv, wv, sorted_ids, expert_ids, block_m, topk) if silu else None
    return grouped_tolerance_from_sums(float(abs_sum.max()), xv.shape[1], gate_up)


def grouped_tolerance_from_sums(abs_sum: float, k: int, gate_up=None) -> str:
    """grouped_tolerance from what it is made of, for callers that compute it on some rows only
    (the bench): abs_sum = the largest sum_k |x_k w_k| of the rows checked; gate_up = their exact
    gate || up rows (float64 [rows, N]) for the SiLU op, None otherwise."""
    eps = 8 * np.sqrt(k) * 2.0**-24 * abs_sum
    if gate_up is None:
        return f"close:1.6e-2:{eps:.3g}"
    gate, up = np.split(gate_up, 2, axis=1)
    silu_gate = gate / (1.0 + np.exp(-gate))
    atol = eps * (1.1 * float(np.abs(up).max()) + float(np.abs(silu_gate).max()))
    return f"close:1.6e-2:{atol:.3g}"


def grouped_sum_tolerance(h, w, sorted_ids, expert_ids, weights, block_m: int) -> str:
    """close:RTOL:ATOL for moe_grouped_gemm_sum (h BF16 bits [T k, K], w [E, N, K], weights FP32
    [T, k]): grouped_sum_tolerance_from_sums on every slot's row."""
    bf16 = ml_dtypes.bfloat16
    hv, wv = h.view(bf16).astype(np.float64), w.view(bf16).astype(np.float64)
    abs_rows = moe.grouped_gemm(np.abs(hv), np.abs(wv), sorted_ids, expert_ids, block_m, 1)  # (T*k,N)
    return grouped_sum_tolerance_from_sums(abs_rows, weights, hv.shape[1])


def grouped_sum_tolerance_from_sums(abs_rows, weights, k_dim: int) -> str:
    """grouped_sum_tolerance from what it is made of, for callers that compute some tokens only
    (the bench): abs_rows = sum_k |h_k w_k| of each slot's row (float64 [tokens k, N]), weights
    the same tokens' [tokens, k]. Each row carries grouped_tolerance's FP32 error, at most eps =
    8 sqrt(K) 2^-24 S (S the largest abs_rows), and reaches out[t] times |w_tj|; the weighting and
    the k atomic FP32 adds, in any order, add at most 2 (k + 1) 2^-24 A, A the largest sum_j
    |w_tj| abs_rows_j (moe_sum_tolerance's term). ATOL is their sum with the largest sum_j |w_tj|
    for the first; RTOL 1.6e-2 for the one BF16 rounding, as the grouped GEMM's."""
    tw = np.abs(np.asarray(weights, dtype=np.float64))  # (T,k)
    t, k = tw.shape
    eps = 8 * np.sqrt(k_dim) * 2.0**-24 * float(abs_rows.max())
    a = float(np.einsum("tj,tjn->tn", tw, abs_rows.reshape(t, k, -1)).max())
    atol = eps * float(tw.sum(axis=1).max()) + 2 * (k + 1) * 2.0**-24 * a
    return f"close:1.6e-2:{atol:.3g}"


def grouped_w4a16_tolerance(x, w, scales, sorted_ids, expert_ids, block_m: int, topk: int) -> str:
    """close:RTOL:ATOL for moe_grouped_gemm_w4a16: chapter 07's W4A16 tolerance (lkw.gemv's
    formula, w4a16.tolerance) over the routed rows, with W_hat the exact dequantized weights
    (moe.w_hat_experts). It is grouped_tolerance's (RTOL 1.6e-2 for the one BF16 rounding, an
    ATOL for FP32 sums growing with sqrt(K)) on W_hat plus the term for what grouped_tolerance
    has no need of: the kernels round each s * (q - 8) to BF16 before the multiply (HMUL2), a
    random walk of 2^-8 relative errors per product, bounded at 8 sigma of the largest row's."""
    xv = x.view(ml_dtypes.bfloat16).astype(np.float64)  # (T,K)
    wv = moe.w_hat_experts(w, scales)  # (E,N,K)
    walk_sq = moe.grouped_gemm(xv * xv, wv * wv, sorted_ids, expert_ids, block_m, topk).max()
    abs_sum = moe.grouped_gemm(np.abs(xv), np.abs(wv), sorted_ids, expert_ids, block_m, topk).max()
    return gemv.tolerance_from_maxima(float(walk_sq), float(abs_sum), xv.shape[1])


def moe_sum_tolerance(y, weights) -> str:
    """close:RTOL:ATOL for moe_sum (y BF16 bits [T, k, d], weights FP32 [T, k]). The kernel's
    FP32 sum of k fused multiply-adds is off the exact one by delta, |delta| <= k 2^-24 A (A =
    sum_j |w_j y_j|, the largest over the outputs); it is then rounded once, as the reference
    rounds the exact sum: the two BF16 values are at most half an ulp each (2^-8 relative) from
    what they round, so |got - ref| <= 2^-7 |ref| + |delta| (times a hair). RTOL 8e-3 > 2^-7,
    ATOL 2 (k + 1) 2^-24 A."""
    yv = y.view(ml_dtypes.bfloat16).astype(np.float64)
    a = float(np.einsum("tj,tjd->td", np.abs(weights.astype(np.float64)), np.abs(yv)).max())
    return f"close:8e-3:{2 * (y.shape[1] + 1) * 2.0**-24 * a:.3g}"


def _moe_block(x, logits, w_gate_up, w_down, topk, renormalize) -> np.ndarray:
    y = moe.moe_layer_reference(values("bfloat16", x), logits, values("bfloat16", w_gate_up),
                                values("bfloat16", w_down), int(topk), bool(renormalize))
    return formats.f64_to_bf16(y)


def moe_block_rows(x, logits, w_gate_up, w_down, topk: int, renormalize: bool, tokens: int):
    """The block's first `tokens` rows of y, float64 [tokens, d] (the layer computed per token,
    each routed expert's weights decoded when first used), and their ATOL (moe_block_tolerance)."""
    weights, ids = moe.topk_softmax(np.asarray(logits)[:tokens], topk, bool(renormalize))  # (tokens,k)
    xv = values("bfloat16", np.asarray(x)[:tokens])
    d_ff = w_down.shape[2]
    d = xv.shape[1]
    u = 2.0**-24
    experts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    y = np.zeros((tokens, d))
    atol = 0.0
    for tok in range(tokens):
        bound = np.zeros(d)
        for j in range(topk):
            e = int(ids[tok, j])
            if e not in experts:
                experts[e] = (values("bfloat16", np.asarray(w_gate_up[e])),
                              values("bfloat16", np.asarray(w_down[e])))
            w1, w2 = experts[e]
            gate_up = w1 @ xv[tok]  # (2 d_ff,)
            gate, up = gate_up[:d_ff], gate_up[d_ff:]
            h = gate / (1.0 + np.exp(-gate)) * up
            down = w2 @ h  # (d,)
            y[tok] += float(weights[tok, j]) * down
            dh_fp32 = 8 * np.sqrt(d) * u * (np.abs(w1) @ np.abs(xv[tok])).max() * (
                1.1 * np.abs(up).max() + np.abs(gate).max())
            walk = 8 * 2.0**-8 * np.sqrt((w2**2) @ (h**2))
            fp32 = 8 * np.sqrt(d_ff) * u * (np.abs(w2) @ np.abs(h)) + dh_fp32 * np.abs(w2).sum(1)
            bound += float(weights[tok, j]) * (walk + 2.0**-8 * np.abs(down) + fp32 + 2 * (topk + 1) * u * np.abs(down))
        atol = max(atol, float(bound.max()))
    return y, atol


def moe_block_tolerance(x, logits, w_gate_up, w_down, topk: int, renormalize: bool) -> str:
    """close:RTOL:ATOL for moe_block, the chain top-k -> align -> gate_up with SiLU-and-mul ->
    down -> weighted sum against the float64 layer. The chain rounds three times where the layer
    does not: h = silu(gate)·up to BF16 (each h_i off by at most 2^-8 |h_i|), the down GEMM's
    rows to BF16 (2^-8 |down|), and y; its FP32 sums and weights add grouped_tolerance's and
    moe_sum's terms. The h roundings reach a down output through sum_i W2[n, i] dh_i, a random
    walk bounded at 8 sigma: 8 · 2^-8 sqrt(sum_i W2[n, i]^2 h_i^2). ATOL is the largest over the
    outputs of sum_j w_j (that walk + 2^-8 |down_j| + the FP32 terms) (moe_block_rows); RTOL
    8e-3 > 2^-7 covers y's two roundings (the chain's and the reference's), as for moe_sum."""
    _, atol = moe_block_rows(x, logits, w_gate_up, w_down, topk, renormalize, np.asarray(x).shape[0])
    return f"close:8e-3:{atol:.3g}"


# (tag, T, topk, E, d, d_ff, renormalize): decode (T = 1, two of eight experts), E = 60 (not a
# power of two, most experts empty at T = 16), topk = 1 (no sum to speak of), prefill-like
# T = 300 (64-row tiles, the multi-block align). d and d_ff multiples of 16 (the SiLU GEMM's gate
# and up halves of whole n8 tiles) and of 8 (moe_sum's 16-byte pieces).
BLOCK_CASES = (
    ("decode", 1, 2, 8, 256, 128, 1),
    ("e60", 16, 4, 60, 128, 64, 1),
    ("k1", 64, 1, 16, 128, 96, 0),
    ("prefill", 300, 2, 8, 192, 128, 0),
)


def block_inputs(rng, t, topk, e, d, d_ff):
    """x ~ N(0, 1) [T, d] (rows of one scale: the ATOL, a maximum over the outputs, then fits
    every row), router logits on routing_logits' grid, w_gate_up [E, 2 d_ff, d] ~ N(0, 1/d),
    w_down [E, d, d_ff] ~ N(0, 1/d_ff); BF16 bits. A row whose k + 1 largest logits are not all
    distinct is drawn again: equal chosen weights would hide a sum that swaps them (the block's
    mutant), and a tie at the k-th would leave the choice to the tie rule alone."""
    x = formats.f32_to_bf16(rng.standard_normal((t, d)).astype(np.float32))
    logits = routing_logits(rng, t, e, 64, 1 / 8)
    top = min(topk + 1, e)
    while len(tied := [i for i, row in enumerate(logits) if np.unique(np.sort(row)[-top:]).size < top]):
        logits[tied] = routing_logits(rng, len(tied), e, 64, 1 / 8)
    w1 = formats.f32_to_bf16((rng.standard_normal((e, 2 * d_ff, d)) / np.sqrt(d)).astype(np.float32))
    w2 = formats.f32_to_bf16((rng.standard_normal((e, d, d_ff)) / np.sqrt(d_ff)).astype(np.float32))
    return x, logits, w1, w2


# (tag, T, topk, E, N, K, BLOCK_M, routing): E = 60; T = 1 (decode: most experts empty); topk =
# 1; N = 8 and K = 8 (the smallest multiples), N = 200 (past a 128-channel block), K = 136 and
# 72 (a 64-k stage plus a half k16 step); BLOCK_M 16, 48 (tiles of 16 only), 64, 128 (two tiles
# a block); "hot": every slot on one expert; "skip": one expert gets no slot, and two blocks of
# sentinels only are appended, of a real expert and of -1. Average rows per expert decide the
# kernels' tile (16, 32 or 64 rows): uniform_t128 (32), hot, bm128 and big (64) run the wider ones.
GROUPED_CASES = (
    ("uniform", 128, 2, 8, 256, 512, 64, "uniform"),
    ("e60", 33, 4, 60, 200, 136, 16, "uniform"),
    ("decode", 1, 8, 64, 128, 256, 64, "uniform"),
    ("k1", 100, 1, 16, 64, 64, 32, "zipf"),
    ("hot", 300, 1, 8, 136, 72, 64, "hot"),
    ("min", 5, 2, 4, 8, 8, 16, "uniform"),
    ("bm128", 200, 2, 8, 64, 192, 128, "uniform"),
    ("bm48", 50, 3, 12, 72, 88, 48, "zipf"),
    ("skip", 40, 2, 6, 96, 128, 16, "skip"),
    ("big", 256, 4, 8, 384, 1024, 64, "uniform"),
)
# The down GEMM with the sum in its epilogue: the routings above, N a multiple of 8 (16-byte
# pieces); "masked" masks slots (-1 ids; token 0 has none left and must come out 0), "decode"
# sums eight experts' rows into one token, "min" the smallest N, "n200" N no multiple of 256
# (the last block's channels past N).
GROUPED_SUM_CASES = (
    ("uniform", 128, 2, 8, 256, 512, 64, "uniform"),
    ("decode", 1, 8, 64, 128, 256, 64, "uniform"),
    ("k1", 100, 1, 16, 64, 64, 32, "zipf"),
    ("skip", 40, 2, 6, 96, 128, 16, "skip"),
    ("masked", 50, 3, 12, 72, 88, 16, "masked"),
    ("min", 5, 2, 4, 8, 8, 16, "uniform"),
    ("n200", 33, 4, 60, 200, 136, 16, "uniform"),
)
# The same routings for the gate_up GEMM, N a multiple of 16: N / 2 = 104 is no multiple of 64
# (the last block's warps past N / 2), N = 16 the smallest.
GROUPED_SILU_CASES = (
    ("uniform", 128, 2, 8, 256, 512, 64, "uniform"),
    ("e60", 33, 4, 60, 208, 136, 16, "uniform"),
    ("decode", 1, 8, 64, 128, 256, 64, "uniform"),
    ("hot", 300, 1, 8, 144, 72, 64, "hot"),
    ("min", 5, 2, 4, 16, 8, 16, "uniform"),
    ("skip", 40, 2, 6, 96, 128, 16, "skip"),
    ("big", 256, 4, 8, 384, 1024, 64, "uniform"),
)
# moe_grouped_gemm_w4a16, decode-like (tag, T, topk, E, N, K, G, BLOCK_M, routing): E = 60 at
# T = 1 (52 experts or more empty) and T = 64 (about 9 rows an expert), topk = 1, "skip" (an
# expert with no slot, sentinel-only blocks), G = 32, 64, 128 and K (per channel); K = 1056 and
# 352 have K % 64 == 32 (the last stage's second half past K); N = 128, 192 and 320 end inside a
# 256-channel block (idle warps); "hot" (300 rows on one expert) and "uniform" (32 rows an
# expert) run the 64- and 32-row tiles.
GROUPED_W4A16_CASES = (
    ("decode", 1, 8, 60, 256, 512, 128, 64, "uniform"),
    ("decode64", 64, 8, 60, 128, 256, 32, 16, "uniform"),
    ("k1", 48, 1, 16, 192, 1056, 32, 16, "zipf"),
    ("skip", 40, 2, 6, 320, 256, 64, 16, "skip"),
    ("perchannel", 5, 2, 4, 64, 352, 352, 16, "uniform"),
    ("hot", 300, 1, 8, 128, 512, 128, 64, "hot"),
    ("uniform", 128, 2, 8, 256, 384, 64, 32, "uniform"),
    ("pairs", 16, 2, 16, 128, 256, 64, 16, "uniform"),  # two rows an expert: v14's kRows = 2
)

# The FP8 grouped GEMMs (tag, T, topk, E, N, K, BLOCK_M, routing), on chapter 08's data
# (fp8_gemm.activations: rows of different magnitude, x100 outliers; fp8_gemm.weights with
# FP8_K_BLOCK_SPREAD: K blocks of different magnitude, so a wrong K block's scale shows). Chapter
# 08's rules: N a multiple of 16, K of 128; K = 128 (one block) in "min" and "skip" only. N = 144
# and 272 end inside a 128-row scale block; gate_up N = 272 and 144 put the up rows' start (136,
# 72) inside a block shared with gate rows; T·topk = 132, 300 and 150 are no multiple of BLOCK_M;
# "decode" is one token on eight of 64 experts; tiles of 16, 32 and 64 rows all run.
GROUPED_FP8_CASES = (
    ("uniform", 128, 2, 8, 256, 512, 64, "uniform"),
    ("decode", 1, 8, 64, 144, 256, 64, "uniform"),
    ("e60", 33, 4, 60, 272, 384, 16, "uniform"),
    ("hot", 300, 1, 8, 144, 256, 64, "hot"),
    ("k1", 100, 1, 16, 64, 256, 32, "zipf"),
    ("skip", 40, 2, 6, 96, 128, 16, "skip"),
    ("min", 5, 2, 4, 16, 128, 16, "uniform"),
    ("big", 256, 4, 8, 384, 1024, 64, "uniform"),
)
GROUPED_SILU_FP8_CASES = (
    ("uniform", 128, 2, 8, 256, 512, 64, "uniform"),
    ("decode", 1, 8, 64, 272, 256, 64, "uniform"),
    ("e60", 33, 4, 60, 144, 384, 16, "uniform"),
    ("hot", 300, 1, 8, 272, 256, 64, "hot"),
    ("min", 5, 2, 4, 16, 128, 16, "uniform"),
    ("big", 256, 4, 8, 528, 1024, 64, "uniform"),
)
# The sum: "masked" masks a third of the slots (-1) and every slot of token 0 (its row must come
# out 0), T·topk = 150; "decode" sums eight experts' rows into one token.
GROUPED_SUM_FP8_CASES = (
    ("uniform", 128, 2, 8, 256, 512, 64, "uniform"),
    ("decode", 1, 8, 64, 144, 256, 64, "uniform"),
    ("masked", 50, 3, 12, 80, 384, 16, "masked"),
    ("n272", 33, 4, 60, 272, 256, 16, "uniform"),
    ("min", 5, 2, 4, 16, 128, 16, "uniform"),
)


def grouped_fp8_inputs(rng, rows: int, e: int, n: int, k: int):
    """x E4M3 bits [rows, K] with x_scales [K/128, rows] (chapter 03's per_group_fp8 of
    fp8_gemm.activations), w E4M3 bits [E, N, K] with w_scales [E, ceil(N/128), K/128]
    (fp8_gemm.per_block_fp8 of each expert's fp8_gemm.weights, K blocks spread)."""
    x, x_scales = fp8_gemm.quantize_a(fp8_gemm.activations(rng, rows, k), "blockwise")
    experts = [
        fp8_gemm.quantize_b(fp8_gemm.weights(rng, n, k, 0.0, FP8_K_BLOCK_SPREAD), "blockwise")
        for _ in range(e)
    ]
    w = np.stack([q for q, _ in experts])  # (E,N,K)
    w_scales = np.stack([s for _, s in experts]).astype(np.float32)  # (E,NB,KB)
    return x, w, x_scales, w_scales


def grouped_fp8_tolerance(x, w, x_scales, w_scales, sorted_ids, expert_ids, block_m: int,
                          topk: int, epilogue: str = "store", weights=None) -> str:
    """frob:BOUND for the FP8 grouped ops: grouped_fp8_tolerance_from_rows on the exact GEMM
    rows (every slot's, of the dequantized operands)."""
    x_hat, w_hat = moe.fp8_experts(x, w, x_scales, w_scales)
    rows = moe.grouped_gemm(
        x_hat, w_hat, sorted_ids, expert_ids, block_m, 1 if epilogue == "sum" else topk
    )  # (T*k,N)
    return grouped_fp8_tolerance_from_rows(rows, x.shape[1], epilogue, weights)


def grouped_fp8_tolerance_from_rows(rows, k_dim: int, epilogue: str = "store", weights=None) -> str:
    """frob:BOUND for an FP8 grouped op against its golden output (the float64 result rounded
    once to BF16), from the exact GEMM rows rows [slots, N] (gate || up for "silu"; the slots of
    weights [T, k] for "sum"; rows no run names are 0). The kernels' GEMM carries chapter 08's
    error without its output rounding, e = error_bound(K) - 2^-8 (128-k promotion) of the rows'
    Frobenius norm, a random walk of each row's own size: about e rms(row i) in each element of
    row i. The epilogue passes it on with gain G: 1 for "store"; for "silu", h = silu(g) u moves
    by silu'(g) u dg + silu(g) du, so G = sqrt(sum_i rms_i^2 sum_n (silu'(g)^2 u^2 + silu(g)^2))
    / ||h||; for "sum", out[t] = sum_j w_tj row_tj, G = sqrt(N sum_tj w_tj^2 rms_tj^2) / ||out||
    (the FP32 atomic adds are far below e). BOUND = 2^-8 (the kernel's one rounding) + G e +
    FP8_GOLDEN_ROUNDING."""
    rows = np.asarray(rows, np.float64)
    e_gemm = fp8_gemm.error_bound(k_dim) - fp8_gemm.BF16_TERM
    if epilogue == "silu":
        gate, up = np.split(rows, 2, axis=1)
        rms_sq = np.mean(rows * rows, axis=1, keepdims=True)  # (slots,1)
        sig = 1.0 / (1.0 + np.exp(-gate))
        silu, dsilu = gate * sig, sig * (1.0 + gate * (1.0 - sig))
        gain = np.sqrt(np.sum(rms_sq * (dsilu**2 * up**2 + silu**2))) / np.linalg.norm(silu * up)
    elif epilogue == "sum":
        w = np.asarray(weights, np.float64)  # (T,k)
        rms_sq = np.mean(rows * rows, axis=1).reshape(w.shape)  # (T,k)
        out = np.einsum("tj,tjn->tn", w, rows.reshape(*w.shape, -1))
        gain = np.sqrt(rows.shape[1] * np.sum(w * w * rms_sq)) / np.linalg.norm(out)
    else:
        gain = 1.0
    return f"frob:{round_up(fp8_gemm.BF16_TERM + gain * e_gemm + FP8_GOLDEN_ROUNDING)}"


# (T, k, d): DeepSeek's d = 7168 at T = 1, k = 1, d = 8 (one piece), d = 2056 (not a multiple of
# 256: lanes with fewer pieces), T = 513 (a partial block of 8 warps).
SUM_CASES = ((1, 8, 7168), (37, 1, 8), (100, 6, 2056), (513, 2, 4096), (64, 8, 2048))


def grouped_align(rng, t, topk, e, block_m, routing):
    """sorted_token_ids and expert_ids of a routing where every slot is routed (an unrouted
    slot's row is never written)."""
    if routing == "skip":  # expert `hole` gets nothing
        hole = int(rng.integers(0, e))
        ids = moe.routing_ids(rng, t, e - 1, topk, "uniform")
        ids = (ids + (ids >= hole)).astype(np.int32)
    else:
        ids = _align_ids(rng, t, topk, e, routing)
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, block_m)
    if routing == "skip":
        sentinel = np.full(2 * block_m, t * topk, np.int32)
        sorted_ids = np.concatenate([sorted_ids, sentinel])
        expert_ids = np.concatenate([expert_ids, np.array([int(ids[0, 0]), -1], np.int32)])
    return sorted_ids, expert_ids


def grouped_inputs(rng, t, topk, e, n, k, block_m, routing):
    """x BF16 bits [T, K], w BF16 bits [E, N, K] (normal / sqrt(K): outputs of order one), and
    grouped_align's ids."""
    sorted_ids, expert_ids = grouped_align(rng, t, topk, e, block_m, routing)
    x = gemv_activations(rng, t, k)  # (T,K)
    w = formats.f32_to_bf16((rng.standard_normal((e, n, k)) / np.sqrt(k)).astype(np.float32))
    return x, w, sorted_ids, expert_ids


def grouped_w4a16_inputs(rng, t, topk, e, n, k, g, block_m, routing):
    """grouped_inputs with INT4 experts: x BF16 bits [T, K], words with every nibble value, each
    expert repacked (uint32 [E, N/64, 8K]), BF16 scale bits [E, K/G, N] (chapter 07's draw)."""
    sorted_ids, expert_ids = grouped_align(rng, t, topk, e, block_m, routing)
    x = gemv_activations(rng, t, k)  # (T,K)
    words = rng.integers(0, 2**32, (e, n, k // 8), dtype=np.uint32)  # (E,N,K/8)
    w = np.stack([w4a16.repack(words[i]) for i in range(e)])  # (E,N/64,8K)
    scales = np.stack([dequant_scales(rng, k // g, n, "bfloat16") for _ in range(e)])
    return x, w, scales, sorted_ids, expert_ids


def moe_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for tag, t, k, e, block_m, dist in ALIGN_CASES:
        ids = _align_ids(rng, t, k, e, dist)
        params = {"num_experts": e, "block_m": block_m}
        case_id = f"align_{tag}_t{t}_k{k}_e{e}_m{block_m}"
        cases.append(Case(case_id, "moe_align_block_size", align_tolerance(block_m), [ids], params))
    for op in ("topk_softmax", "topk_softmax_bf16"):
        for tag, t, e, k, renorm, levels, step in TOPK_CASES:
            x = routing_logits(rng, t, e, levels, step)  # (T,E)
            x = formats.f32_to_bf16(x) if op == "topk_softmax_bf16" else x
            case_id = "_".join([op, *([tag] if tag else []), f"t{t}_e{e}_k{k}_r{renorm}"])
            params = {"k": k, "renormalize": renorm}
            cases.append(Case(case_id, op, router_tolerance(e, k, False), [x], params))
    for tag, t, e, k, n_group, topk_group, renorm, scale, levels in DEEPSEEK_CASES:
        z, bias = deepseek_inputs(rng, t, e, k, n_group, topk_group, levels)
        params = {"k": k, "n_group": n_group, "topk_group": topk_group, "renormalize": renorm,
                  "routed_scaling_factor": scale}
        case_id = "_".join(["deepseek", *([tag] if tag else []), f"t{t}_e{e}_k{k}_g{n_group}"])
        cases.append(Case(case_id, "deepseek_router", router_tolerance(e, k, True), [z, bias], params))
    for op, table in (("moe_grouped_gemm", GROUPED_CASES), ("moe_grouped_gemm_silu", GROUPED_SILU_CASES)):
        for tag, t, topk, e, n, k, block_m, routing in table:
            inputs = grouped_inputs(rng, t, topk, e, n, k, block_m, routing)
            tol = grouped_tolerance(*inputs, block_m, topk, op.endswith("silu"))
            case_id = f"{op}_{tag}_t{t}_top{topk}_e{e}_n{n}_k{k}_m{block_m}"
            cases.append(Case(case_id, op, tol, list(inputs), {"topk": topk, "block_m": block_m}))
    for tag, t, topk, e, n, k, block_m, routing in GROUPED_SUM_CASES:
        if routing == "masked":  # a third of the slots masked (-1), and every slot of token 0
            ids = _align_ids(rng, t, topk, e, "masked")
            ids[0] = -1
            sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, block_m)
        else:
            sorted_ids, expert_ids = grouped_align(rng, t, topk, e, block_m, routing)
        h = gemv_activations(rng, t * topk, k)  # (T*k,K): a row per slot
        w = formats.f32_to_bf16((rng.standard_normal((e, n, k)) / np.sqrt(k)).astype(np.float32))
        tw = rng.random((t, topk)).astype(np.float32) + np.float32(0.05)
        tw = (tw / tw.sum(axis=1, keepdims=True)).astype(np.float32)  # (T,k)
        tol = grouped_sum_tolerance(h, w, sorted_ids, expert_ids, tw, block_m)
        case_id = f"moe_grouped_gemm_sum_{tag}_t{t}_top{topk}_e{e}_n{n}_k{k}_m{block_m}"
        cases.append(Case(case_id, "moe_grouped_gemm_sum", tol, [h, w, sorted_ids, expert_ids, tw],
                          {"block_m": block_m}))
    for tag, t, topk, e, n, k, g, block_m, routing in GROUPED_W4A16_CASES:
        inputs = grouped_w4a16_inputs(rng, t, topk, e, n, k, g, block_m, routing)
        tol = grouped_w4a16_tolerance(*inputs, block_m, topk)
        case_id = f"moe_grouped_gemm_w4a16_{tag}_t{t}_top{topk}_e{e}_n{n}_k{k}_g{g}_m{block_m}"
        params = {"topk": topk, "block_m": block_m, "group_size": g}
        cases.append(Case(case_id, "moe_grouped_gemm_w4a16", tol, list(inputs), params))
    fp8_tables = (("moe_grouped_gemm_fp8", "store", GROUPED_FP8_CASES),
                  ("moe_grouped_gemm_silu_fp8", "silu", GROUPED_SILU_FP8_CASES),
                  ("moe_grouped_gemm_sum_fp8", "sum", GROUPED_SUM_FP8_CASES))
    for op, epilogue, table in fp8_tables:
        for tag, t, topk, e, n, k, block_m, routing in table:
            if routing == "masked":  # a third of the slots masked (-1), and every slot of token 0
                ids = _align_ids(rng, t, topk, e, "masked")
                ids[0] = -1
                sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, block_m)
            else:
                sorted_ids, expert_ids = grouped_align(rng, t, topk, e, block_m, routing)
            x_rows = t * topk if epilogue == "sum" else t
            x, w, xs, ws = grouped_fp8_inputs(rng, x_rows, e, n, k)
            inputs = [x, w, xs, ws, sorted_ids, expert_ids]
            params = {"block_m": block_m}
            if epilogue != "sum":
                params["topk"] = topk
            tw = None
            if epilogue == "sum":
                tw = rng.random((t, topk)).astype(np.float32) + np.float32(0.05)
                tw = (tw / tw.sum(axis=1, keepdims=True)).astype(np.float32)  # (T,k)
                inputs.append(tw)
            tol = grouped_fp8_tolerance(x, w, xs, ws, sorted_ids, expert_ids, block_m, topk,
                                        epilogue, tw)
            case_id = f"{op}_{tag}_t{t}_top{topk}_e{e}_n{n}_k{k}_m{block_m}"
            cases.append(Case(case_id, op, tol, inputs, params))
    for t, k, d in SUM_CASES:
        y = gemv_activations(rng, t * k, d).reshape(t, k, d)  # (T,k,d)
        w = rng.random((t, k)).astype(np.float32) + np.float32(0.05)
        w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)  # (T,k) routing weights
        cases.append(Case(f"moe_sum_t{t}_k{k}_d{d}", "moe_sum", moe_sum_tolerance(y, w), [y, w]))
    for tag, t, topk, e, d, d_ff, renorm in BLOCK_CASES:
        inputs = block_inputs(rng, t, topk, e, d, d_ff)
        tol = moe_block_tolerance(*inputs, topk, bool(renorm))
        case_id = f"moe_block_{tag}_t{t}_top{topk}_e{e}_d{d}_f{d_ff}"
        cases.append(Case(case_id, "moe_block", tol, list(inputs), {"topk": topk, "renormalize": renorm}))
    return cases


# ---------------------------------------------------------------------------------------------
# 10_sampling

SAMPLING_OPS = (
    "top_k_mask_logits", "top_k_renorm_probs", "top_p_renorm_probs", "sample", "rejection_sample"
)
TOP_K_OPS = SAMPLING_OPS[:2]  # the ops of SAMPLING_CASES; the others have a table each
# The mask is bit-exact (float32 comparisons only); renormalized probs within lkw.sampling's
# PROB_RTOL (2^-14) relative, ATOL 0: a dropped token must be exactly 0. (Top-p's kept set is
# exact too: its cases hold no token a float32 sum could misjudge, lkw.sampling.uncertain_tokens.)
# Tokens and counts are exact: sample's rows admit one token only, and rejection_sample's cases
# draw seeds until no row's last token lies within MARGIN of a CDF boundary.
SAMPLING_TOLERANCES = {
    "top_k_mask_logits": "exact",
    "top_k_renorm_probs": f"close:{sampling.PROB_RTOL!r}:0",
    "top_p_renorm_probs": f"close:{sampling.PROB_RTOL!r}:0",
    "sample": "exact",
    "rejection_sample": "exact/exact",
}
# (tag, V, rows), one (kind, k) per row, B = len(rows). Kinds (sampling_row): "lm" an LM head's
# row (lkw.sampling.lm_logits), "ties" the same on a grid of 1/4 with its maximum twice, "equal"
# one value everywhere, "neginf_most" all but max(1, V // 100) tokens -inf, "neginf_some" a tenth
# -inf, "zeros" positives, +0.0 and -0.0 (a fifth of the row, at least one of each) and negatives.
# k: a number, "V", "V+5", "V-1" (k <= 0 and k >= V disable the filter), or one set by the row
# (sampling_k): "tie" the k-th value inside a tie group, so more than k tokens are kept;
# "over_finite" more than the finite tokens, so the k-th value is -inf (a probs row: 0);
# "at_zero" the k-th value a zero, so -0.0 is kept (and written +0.0).
SAMPLING_CASES = (
    ("disabled", 1, (("lm", -1), ("lm", "V"), ("lm", "V+5"))),
    ("tiny", 2, (("lm", 1), ("equal", 1), ("neginf_most", 1), ("zeros", "at_zero"), ("lm", 0),
                 ("lm", "V"), ("lm", -1))),
    ("tiny", 5, (("ties", "tie"), ("lm", "V-1"), ("neginf_most", "over_finite"),
                 ("zeros", "at_zero"), ("equal", 2), ("lm", "V+5"), ("neginf_some", 2))),
    ("edges", 1000, (("ties", "tie"), ("neginf_most", "over_finite"), ("neginf_some", 50),
                     ("zeros", "at_zero"), ("equal", 1), ("lm", "V-1"), ("ties", 1))),
    ("kmix", 1000, (("lm", 0), ("lm", -1), ("lm", "V"), ("lm", "V+5"), ("lm", 1), ("lm", "V-1"),
                    ("lm", 37))),
    ("tail", 4099, (("ties", "tie"), ("lm", 1024), ("neginf_some", 300))),
    ("lm", 32000, (("lm", 50),)),
    ("lm_ties", 128256, (("ties", "tie"),)),
)
TIE_RANK = 50  # "tie": the first tie group reaching past this rank (V // 4 in short rows)


def sampling_row(rng: np.random.Generator, kind: str, v: int) -> np.ndarray:
    """One float32 row [V] of logits of the given kind (SAMPLING_CASES)."""
    if kind in ("lm", "ties"):
        return sampling.lm_logits(rng, 1, v, ties=kind == "ties")[0]
    if kind == "equal":
        return np.full(v, rng.uniform(0.5, 4.0) * rng.choice([-1, 1]), np.float32)
    if kind == "zeros":
        z = max(2, v // 5)
        p = (v - z) // 2
        signs = np.r_[1.0, -1.0, rng.choice([-1.0, 1.0], z - 2)]
        row = np.r_[rng.uniform(0.25, 8.0, p), signs * 0.0, -rng.uniform(0.25, 8.0, v - p - z)]
        return rng.permutation(row).astype(np.float32)
    x = sampling.lm_logits(rng, 1, v)[0]
    if kind == "neginf_most":
        out = np.full(v, -np.inf, np.float32)
        finite = rng.choice(v, max(1, v // 100), replace=False)
        out[finite] = x[finite]
        return out
    if kind == "neginf_some":
        x[rng.choice(v, max(1, v // 10), replace=False)] = -np.inf
        return x
    raise ValueError(f"unknown row kind {kind!r}")


def sampling_k(spec, row: np.ndarray) -> int:
    """A row's top_k from its SAMPLING_CASES spec."""
    v = row.size
    if isinstance(spec, int):
        return spec
    if spec in ("V", "V+5", "V-1"):
        return {"V": v, "V+5": v + 5, "V-1": v - 1}[spec]
    if spec == "over_finite":
        return min(int(np.isfinite(row).sum()) + 3, v - 1)
    if spec == "at_zero":  # the positives, then into the zeros: the k-th value is a zero
        return int((row > 0).sum()) + max(1, int((row == 0).sum()) // 2)
    if spec == "tie":  # the k-th largest inside a run of equal values [s, e): e > k tokens kept
        desc = -np.sort(-row)
        starts = np.flatnonzero(np.r_[True, desc[1:] != desc[:-1]])
        runs = [(s, e) for s, e in zip(starts, np.r_[starts[1:], v]) if e - s >= 2]
        target = min(TIE_RANK, v // 4)
        s, e = next((r for r in runs if r[1] > target), runs[0])  # "ties" rows: the max twice
        return int(s + (e - s) // 2)
    raise ValueError(f"unknown k {spec!r}")


def sampling_inputs(rng: np.random.Generator, op: str, v: int, rows) -> list[np.ndarray]:
    """[x [B, V] float32, top_k [B] int32]: the logits of the rows, or for top_k_renorm_probs
    their float32 softmax (lkw.sampling.softmax: exact zeros where the logits are -inf, half of
    them -0.0 in the "neginf_most" rows), and each row's k. Rows of one token, whose softmax is 1
    whatever the logit, are scaled by a random factor in [1/2, 1) (probs need not sum to 1)."""
    logits = np.stack([sampling_row(rng, kind, v) for kind, _ in rows])  # (B,V)
    top_k = np.array([sampling_k(spec, row) for (_, spec), row in zip(rows, logits)], np.int32)
    if op == "top_k_mask_logits":
        return [logits, top_k]
    probs = sampling.softmax(logits)  # (B,V)
    if v == 1:
        probs = (probs * rng.uniform(0.5, 1.0, (len(rows), 1))).astype(np.float32)
    for (kind, _), row in zip(rows, probs):
        if kind == "neginf_most":
            row[np.flatnonzero(row == 0)[::2]] = -0.0
    return [probs, top_k]


# (tag, V, rows) of top_p_renorm_probs, one (kind, p) per row, B = len(rows). Kinds: sampling_row's
# (their float32 softmax, every other exact zero made -0.0) and "scaled", an "lm" row's probs times
# a factor in [1/4, 4), so the row does not sum to 1. p: 1.0 (disabled), "top" (only the top tie
# group kept), "tie" (the cut after a tie group of >= 2 tokens), or a number q (the cut nearest
# the mass fraction q). top_p_of puts every p in the middle of a gap between two consecutive
# cumulative masses of the row's tie groups, so that no token is uncertain.
TOP_P_CASES = (
    ("disabled", 1, (("scaled", 1.0), ("scaled", "top"), ("scaled", 0.5))),
    ("tiny", 2, (("lm", 1.0), ("lm", "top"), ("equal", "top"), ("scaled", 0.9),
                 ("neginf_most", 0.5))),
    ("tiny", 5, (("ties", "tie"), ("lm", 0.5), ("neginf_some", 0.9), ("equal", 0.5),
                 ("scaled", 0.9), ("lm", 1.0), ("ties", "top"))),
    ("edges", 1000, (("ties", "tie"), ("ties", "top"), ("neginf_most", 0.9),
                     ("neginf_some", 0.5), ("scaled", 0.7), ("neginf_most", 1.0), ("lm", "top"))),
    ("pmix", 1000, (("lm", 0.1), ("lm", 0.3), ("lm", 0.5), ("lm", 0.7), ("lm", 0.9),
                    ("lm", 0.95), ("lm", 0.99))),
    ("tail", 4099, (("ties", "tie"), ("lm", 0.9), ("neginf_some", 0.95), ("scaled", 0.8))),
    ("lm", 32000, (("lm", 0.9), ("scaled", 0.95))),
    ("lm_ties", 128256, (("ties", "tie"),)),
)
# p's gap between two cumulative masses, at least this wide (relative to the row's mass): its
# middle then lies 2 MARGIN from either edge, where the float32 rounding of p (2^-24) and of a
# kernel's sums (within MARGIN) cannot move a token across.
TOP_P_GAP = 4 * sampling.MARGIN
TOP_P_TIE_TARGET = 0.9  # "tie": the tie group whose cut lies nearest this mass fraction
# Dyadic rows, ((value, count), ...) and p, scattered over TOP_P_DYADIC_V tokens of zeros: every
# float32 sum of them and p * M are exact in any order, so a kernel must decide a token lying
# exactly on the boundary (M_gt = p * M) by the rule itself: dropped. Rows: the boundary on one
# token (p = 3/4, then 1/2), on a tie group of 3 and one of 256, in a row summing to 2, just past
# the boundary (p = 513/1024: the token carrying the sum across p is kept), p = 2^-24 (only the
# top tie group).
TOP_P_DYADIC = (
    (((1 / 2, 1), (1 / 4, 1), (1 / 8, 1), (1 / 16, 1), (1 / 32, 2)), 3 / 4),
    (((1 / 2, 1), (1 / 4, 1), (1 / 8, 1), (1 / 16, 1), (1 / 32, 2)), 1 / 2),
    (((1 / 4, 2), (1 / 8, 3), (1 / 16, 2)), 1 / 2),
    (((1 / 4, 1), (1 / 8, 1), (1 / 16, 2), (2.0**-9, 256)), 1 / 2),
    (((1, 1), (1 / 2, 1), (1 / 4, 1), (1 / 8, 2)), 3 / 4),
    (((1 / 2, 1), (1 / 4, 1), (1 / 8, 2)), 513 / 1024),
    (((1 / 4, 2), (1 / 8, 2), (1 / 16, 4)), 2.0**-24),
)
TOP_P_DYADIC_V = 301


def tie_groups(row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A probs row's tie groups, largest first: (value float32 [G], size [G], C / M float64 [G]),
    C_j the float64 mass of groups 0..j and M the row's. A p in (C_{j-1}, C_j] / M keeps exactly
    groups 0..j (M_gt < p M; a tie group is kept or dropped whole). -0.0 groups with +0.0."""
    keys, mass = sampling.from_probs(row[None])
    neg, group, sizes = np.unique(-keys[0], return_inverse=True, return_counts=True)
    group_mass = np.bincount(group, weights=mass[0])  # (G,) descending by value
    return -neg, sizes, np.cumsum(group_mass) / mass.sum()


def top_p_of(spec, row: np.ndarray) -> np.float32:
    """A row's top_p from its TOP_P_CASES spec: 1, or the middle (float64, rounded to float32) of
    the interval of p that keeps groups 0..j, for the group j the spec picks among those whose
    interval is at least TOP_P_GAP wide."""
    if spec == 1.0:
        return np.float32(1)
    _, sizes, cum = tie_groups(row)
    lower = np.r_[0.0, cum[:-1]]  # (G,) C_{j-1} / M
    candidates = cum - lower >= TOP_P_GAP  # (G,) wide enough
    if spec == "top":
        candidates &= np.arange(cum.size) == 0
    elif spec == "tie":  # a tie group below the top one where the row has one wide enough
        candidates &= sizes >= 2
        below_top = candidates & (np.arange(cum.size) > 0)
        candidates = below_top if below_top.any() else candidates
    target = TOP_P_TIE_TARGET if spec in ("top", "tie") else float(spec)
    distance = np.where(candidates, np.maximum(lower - target, target - cum), np.inf)
    if not candidates.any():
        raise ValueError(f"no tie group fits p spec {spec!r} (V = {row.size})")
    j = int(np.argmin(distance))  # the interval holding the target if it is wide, else the nearest
    return np.float32((lower[j] + cum[j]) / 2)


def top_p_row(rng: np.random.Generator, kind: str, v: int) -> np.ndarray:
    """One float32 probs row [V] of a TOP_P_CASES kind."""
    if kind == "scaled":
        # a factor in [1/4, 1/sqrt(2)] or [sqrt(2), 4]: the row's sum is never close to 1
        factor = 2.0 ** (rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 2.0))
        probs = sampling.softmax(sampling.lm_logits(rng, 1, v)) * factor
        return probs[0].astype(np.float32)
    row = sampling.softmax(sampling_row(rng, kind, v)[None])[0]
    row[np.flatnonzero(row == 0)[::2]] = -0.0
    return row


def top_p_inputs(rng: np.random.Generator, v: int, rows) -> list[np.ndarray]:
    """[probs [B, V] float32, top_p [B] float32] of TOP_P_CASES rows; refuses an uncertain token."""
    probs = np.stack([top_p_row(rng, kind, v) for kind, _ in rows])  # (B,V)
    top_p = np.array([top_p_of(spec, row) for (_, spec), row in zip(rows, probs)], np.float32)
    if sampling.uncertain_tokens(*sampling.from_probs(probs), top_p=top_p).any():
        raise ValueError(f"a top-p row of V = {v} holds a token within MARGIN of its cut")
    return [probs, top_p]


def top_p_dyadic_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """[probs [B, TOP_P_DYADIC_V] float32, top_p [B] float32] of the TOP_P_DYADIC rows, their
    values at random positions, every other zero -0.0."""
    probs = np.zeros((len(TOP_P_DYADIC), TOP_P_DYADIC_V), np.float32)
    for row, (groups, _) in zip(probs, TOP_P_DYADIC):
        values = np.concatenate([np.full(n, x) for x, n in groups])
        row[rng.choice(TOP_P_DYADIC_V, values.size, replace=False)] = values
        row[np.flatnonzero(row == 0)[::2]] = -0.0
    return [probs, np.array([p for _, p in TOP_P_DYADIC], np.float32)]


def draw_seed_offset(rng: np.random.Generator) -> np.ndarray:
    """seed_offset int64 [2]: a Philox seed (any int64: the kernels read its bits as unsigned)
    and an offset below 2^40 (so its block index, offset >> 2, spills into the counter's second
    word)."""
    seed = rng.integers(-(2**63), 2**63 - 1, dtype=np.int64, endpoint=True)
    return np.array([seed, rng.integers(0, 2**40)], np.int64)


def read_seed_offset(seed_offset) -> tuple[int, int]:
    """(seed, offset) of a seed_offset input: int64 [2] with offset >= 0."""
    a = np.asarray(seed_offset)
    if a.dtype != np.int64 or a.shape != (2,) or a[1] < 0:
        raise ValueError(f"seed_offset must be int64 [2] with offset >= 0, got {a.dtype} {a}")
    return int(a[0]), int(a[1])


# (tag, V, logits dtype, rows) of `sample`, one rule per row, B = len(rows). v3 spends a uniform
# per rejection round and v4 one on an inverse CDF, so they share no sampled token: every row
# admits exactly one token whatever the uniforms (sample_determined). Rules (sample_row):
# "greedy" T = 0, no filter; "greedy_filtered" T = 0 with every filter set (ignored); "greedy_tie"
# T = 0, the maximum at two places or more (the lowest index wins); "greedy_neginf" T = 0, a tenth
# of the row -inf; "top_k1" k = 1; "top_k1_neginf" the same with -inf; "min_p1" min_p = 1 (the
# tokens of the maximum's mass); "top_p_top" p half the top token's share of the row; "all_filters"
# k = min(50, V - 1), p half the top token's share of the top k, min_p = 1/2; "one_finite" one
# finite logit, no filter. Filters off are spelled at random (k in {0, -1, V, V + 5}, p = 1,
# min_p = 0); T > 0 rows have T in SAMPLE_TEMPERATURE and their maximum SAMPLE_LEAD above the rest.
SAMPLE_CASES = (
    ("tiny", 1, "float32", ("greedy", "greedy_filtered", "top_k1", "min_p1", "top_p_top",
                            "one_finite")),
    ("tiny", 2, "float32", ("greedy_tie", "greedy_neginf", "top_k1", "min_p1", "top_p_top",
                            "all_filters", "one_finite")),
    ("tiny", 5, "float32", ("greedy_tie", "greedy_filtered", "top_k1", "top_k1_neginf", "min_p1",
                            "top_p_top", "all_filters", "one_finite")),
    ("edges", 1000, "float32", ("greedy", "greedy_filtered", "greedy_tie", "greedy_neginf",
                                "top_k1", "top_k1_neginf", "min_p1", "top_p_top", "all_filters",
                                "one_finite")),
    ("tail", 4099, "float32", ("greedy_tie", "top_k1", "min_p1", "top_p_top", "one_finite")),
    ("lm", 32000, "float32", ("greedy_filtered", "top_p_top")),
    ("lm", 128256, "float32", ("all_filters",)),
    ("bf16", 4099, "bfloat16", ("greedy", "greedy_tie", "top_k1", "min_p1", "top_p_top",
                                "all_filters")),
)
SAMPLE_TEMPERATURE = (0.1, 2.0)
# The unique maximum's lead over the next logit: z = x / T keeps it (no two logits round to one
# z), and min_p = 1 or a p of half the top share stay far from their thresholds.
SAMPLE_LEAD = (0.5, 2.0)


def sample_row(rng: np.random.Generator, rule: str, v: int, dtype: str = "float32"):
    """One row of a SAMPLE_CASES rule: (logits float32 [V], holding values of dtype, temperature,
    top_k, top_p, min_p)."""
    off_k = int(rng.choice([0, -1, v, v + 5]))
    if rule.startswith("greedy"):
        kind = {"greedy_tie": "ties", "greedy_neginf": "neginf_some"}.get(rule, "lm")
        x = sampling_row(rng, kind, v).astype(DTYPES[dtype][1]).astype(np.float32)
        if rule == "greedy_filtered":  # set, and ignored: T = 0 returns the maximum
            return x, 0.0, max(1, v // 3), 0.9, 0.01
        return x, 0.0, off_k, 1.0, 0.0
    t = float(rng.uniform(*SAMPLE_TEMPERATURE))
    if rule == "one_finite":
        x = np.full(v, -np.inf, np.float32)
        x[rng.integers(v)] = rng.normal(0.0, 4.0)
        return x.astype(DTYPES[dtype][1]).astype(np.float32), t, off_k, 1.0, 0.0
    x = sampling_row(rng, "neginf_some" if rule == "top_k1_neginf" else "lm", v)
    if v > 1:  # the maximum SAMPLE_LEAD above every other logit
        top = int(np.argmax(x))
        x[top] = max(x[top], np.delete(x, top).max() + rng.uniform(*SAMPLE_LEAD))
    x = x.astype(DTYPES[dtype][1]).astype(np.float32)
    if rule in ("top_k1", "top_k1_neginf"):
        return x, t, 1, 1.0, 0.0
    if rule == "min_p1":
        return x, t, off_k, 1.0, 1.0
    k = min(50, v - 1) if rule == "all_filters" else off_k
    keys, mass = sampling.from_logits(x[None], np.float32(t))  # the top token's mass is 1
    share = 1.0 / mass[sampling.top_k_keep(keys, k)].sum()
    return x, t, k, share / 2, 0.5 if rule == "all_filters" else 0.0


def sample_inputs(rng: np.random.Generator, v: int, dtype: str, rules) -> list[np.ndarray]:
    """[logits [B, V] float32 or bfloat16 bits, temperature, top_k, top_p, min_p [B], seed_offset
    int64 [2]] of SAMPLE_CASES rows."""
    x, temperature, top_k, top_p, min_p = zip(*(sample_row(rng, r, v, dtype) for r in rules))
    logits = np.stack(x)  # (B,V)
    if dtype == "bfloat16":
        logits = logits.astype(ml_dtypes.bfloat16).view(np.uint16)  # exact: bfloat16 values
    return [
        logits,
        np.array(temperature, np.float32),
        np.array(top_k, np.int32),
        np.array(top_p, np.float32),
        np.array(min_p, np.float32),
        draw_seed_offset(rng),
    ]


def sample_determined(logits, temperature, top_k, top_p, min_p) -> np.ndarray:
    """[B] bool: the rows whose token no uniform and no float32 sum can change: greedy (T = 0),
    or the filters keep exactly one token of positive mass and no token lies within MARGIN of a
    threshold (lkw.sampling.uncertain_tokens)."""
    keys, mass = sampling.from_logits(logits, temperature)
    filters = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
    keep = sampling.filter_keep(keys, mass, **filters)
    unsure = sampling.uncertain_tokens(keys, mass, **filters).any(axis=1)
    one = np.sum(keep & (mass > 0), axis=1) == 1
    return (np.asarray(temperature) == 0) | (one & ~unsure)


def sample_expected(logits, temperature, top_k, top_p, min_p, seed_offset) -> np.ndarray:
    """`sample`'s golden tokens int32 [B]: lkw.sampling.sample with u = 0 (any u gives the same
    token: every row must be sample_determined). logits float32 or bfloat16 bits (uint16);
    seed_offset is checked, and not needed."""
    read_seed_offset(seed_offset)
    x = logits.view(ml_dtypes.bfloat16) if logits.dtype == np.uint16 else logits
    determined = sample_determined(x, temperature, top_k, top_p, min_p)
    if not determined.all():
        raise ValueError(f"sample rows {np.flatnonzero(~determined)} admit more than one token")
    u = np.zeros(x.shape[0], np.float32)
    return sampling.sample(x, u, temperature, top_k, top_p, min_p)


# (tag, S, V, rows) of rejection_sample, one kind per request, B = len(rows). Kinds
# (rejection_row): "spec" lkw.sampling.speculative_inputs' (a draft model that mostly agrees);
# "equal" q = p at every draft (all accepted, then the bonus token from p[S]); "q_zero" q = 0 at
# every draft token, p > 0 there (all accepted: u q < p); "p_zero" the drafts before a random s0
# with q = p (accepted) and p = 0 at draft s0 (rejected there: the last token from (p - q)+);
# "residual_empty" the same with q >= p over row s0 (no residual: the last token from p[s0]).
REJECTION_CASES = (
    ("tiny", 1, 5, ("equal", "p_zero", "q_zero", "residual_empty", "spec", "spec")),
    ("tiny", 7, 5, ("equal", "p_zero", "q_zero", "residual_empty", "spec", "spec", "spec",
                    "spec")),
    ("edges", 4, 1000, ("equal", "p_zero", "q_zero", "residual_empty", "spec", "spec")),
    ("tail", 1, 4099, ("p_zero", "residual_empty", "spec")),
    ("lm", 1, 32000, ("spec",)),
)
# Seeds a case tries for uniforms under which no request's last token lies within MARGIN of a CDF
# boundary (where a kernel's float32 prefix sum may pick the neighbour): most seeds do.
REJECTION_SEEDS = 100


def rejection_row(rng: np.random.Generator, kind: str, s: int, v: int):
    """One request of a REJECTION_CASES kind: (q [S, V], draft tokens [S] int32, p [S + 1, V])."""
    q, drafts, p = (a[0] for a in sampling.speculative_inputs(rng, 1, s, v))
    if kind == "equal":
        q = p[:s].copy()
    elif kind == "q_zero":
        q[np.arange(s), drafts] = 0
    elif kind in ("p_zero", "residual_empty"):
        stop = int(rng.integers(s))
        q[:stop] = p[:stop]
        p[stop, drafts[stop]] = 0
        if kind == "residual_empty":
            q[stop] = np.maximum(q[stop], p[stop])
    elif kind != "spec":
        raise ValueError(f"unknown request kind {kind!r}")
    return q, drafts.astype(np.int32), p


def rejection_expected(draft_probs, draft_tokens, target_probs, seed_offset, with_uncertain=False):
    """`rejection_sample`'s golden (tokens [B, S + 1], num_accepted [B]) int32: lkw.sampling's
    with the uniforms the kernel draws, u = philox_uniforms(seed, offset, B, S + 1) (request b
    reads subsequence b): accept_u = u[:, :S], sample_u = u[:, S]. with_uncertain: also the [B]
    bool of requests whose last token a float32 prefix sum may move."""
    seed, offset = read_seed_offset(seed_offset)
    b, s = np.shape(draft_tokens)
    u = sampling.philox_uniforms(seed, offset, b, s + 1)  # (B,S+1)
    return sampling.rejection_sample(
        draft_probs, draft_tokens, target_probs, u[:, :s], u[:, s], with_uncertain
    )


def rejection_inputs(rng: np.random.Generator, s: int, v: int, kinds) -> list[np.ndarray]:
    """[q [B, S, V], draft tokens [B, S] int32, p [B, S + 1, V], seed_offset int64 [2]] of
    REJECTION_CASES requests, the seed drawn again until no request is uncertain."""
    q, drafts, p = (np.stack(a) for a in zip(*(rejection_row(rng, k, s, v) for k in kinds)))
    for _ in range(REJECTION_SEEDS):
        seed_offset = draw_seed_offset(rng)
        if not rejection_expected(q, drafts, p, seed_offset, with_uncertain=True)[2].any():
            return [q, drafts, p, seed_offset]
    raise ValueError(f"no seed of {REJECTION_SEEDS} left every request of S = {s}, V = {v} certain")


def sampling_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op in TOP_K_OPS:
        for tag, v, rows in SAMPLING_CASES:
            inputs = sampling_inputs(rng, op, v, rows)
            case_id = f"{op}_{tag}_b{len(rows)}_v{v}"
            cases.append(Case(case_id, op, SAMPLING_TOLERANCES[op], inputs))
    # Top-p after the top-k cases, so that adding it left their draws from rng unchanged.
    op = "top_p_renorm_probs"
    for tag, v, rows in TOP_P_CASES:
        case_id = f"{op}_{tag}_b{len(rows)}_v{v}"
        cases.append(Case(case_id, op, SAMPLING_TOLERANCES[op], top_p_inputs(rng, v, rows)))
    dyadic = top_p_dyadic_inputs(rng)
    case_id = f"{op}_dyadic_b{len(TOP_P_DYADIC)}_v{TOP_P_DYADIC_V}"
    cases.append(Case(case_id, op, SAMPLING_TOLERANCES[op], dyadic))
    # The sampled ops after top-p, for the same reason.
    for tag, v, dtype, rules in SAMPLE_CASES:
        case_id = f"sample_{tag}_b{len(rules)}_v{v}"
        inputs = sample_inputs(rng, v, dtype, rules)
        cases.append(Case(case_id, "sample", SAMPLING_TOLERANCES["sample"], inputs))
    op = "rejection_sample"
    for tag, s, v, kinds in REJECTION_CASES:
        case_id = f"{op}_{tag}_b{len(kinds)}_s{s}_v{v}"
        cases.append(Case(case_id, op, SAMPLING_TOLERANCES[op], rejection_inputs(rng, s, v, kinds)))
    return cases


# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# 11_decoder_layer: the whole layer at decoder_layer.GOLDEN size (the full layer is the bench's)

# out and residual_out: relative Frobenius error. A correct runner differs from the float64
# reference only where a value lands on the other side of a rounding (FP32 sums, rsqrtf,
# tensor-core accumulation, the FP32 softmax): a one-ulp step (2^-8) on some elements, carried
# through at most four more roundings, stays under 2^-8 x 4 ~ 0.016 even if every element moved;
# FP8 adds the E4M3 codes (2^-4 each) such a step flips: at this size one 1 x 128 group is a
# whole row, so a norm's rstd an FP32 ulp off moves codes across the row, and torch's own FP8
# layer is a few % off at a reduced shape. A wrong head, mask, slot, residual or rounding point
# is O(0.1) and more.
LAYER_FROB = {"bf16": 0.02, "w4a16": 0.02, "fp8": 0.08}
# The caches, element by element (the new tokens' K after RoPE and V, the rest unchanged): a few
# BF16 ulps of the value, or of the largest pair member after a rotation near cancellation.
LAYER_CACHE = {"bf16": "close:0.016:0.03", "w4a16": "close:0.016:0.03", "fp8": "close:0.03:0.06"}


def _layer_setup(rng, fmt: str, t: int, table_blocks: int, block_size: int = 16):
    """(weights, x, residual, cache): every cache slot holds random finite K and V (earlier
    tokens, and junk past the context that a causal read must never touch); the block table is
    shuffled with one spare block."""
    from lkw import decoder_layer

    cfg = decoder_layer.GOLDEN
    w = decoder_layer.random_weights(rng, cfg, fmt)
    x, res = decoder_layer.random_inputs(rng, cfg, t)
    cache = decoder_layer.new_cache(cfg, table_blocks * block_size, "paged", block_size, rng)
    for c in (cache.key, cache.value):
        c[...] = formats.f32_to_bf16(rng.standard_normal(c.shape).astype(np.float32))
    return w, x, res, cache


def decoder_layer_cases(rng: np.random.Generator) -> list[Case]:
    from lkw import decoder_layer

    cfg = decoder_layer.GOLDEN
    cos_sin = decoder_layer.rope_cache(cfg, 512)
    cases = []
    # (id, T, first position, table blocks of 16): decode over a context of 300 (the attention in
    # 6 splits of 64 keys, the fifth partial, the last empty), three tokens whose last splits are
    # empty, a prefill T > 16 (chapter 07's GEMM for W4A16).
    for tag, t, first, blocks in (("decode_t1", 1, 300, 24), ("decode_t3", 3, 150, 24),
                                  ("prefill_t24", 24, 0, 8)):
        for fmt in decoder_layer.FORMATS:
            w, x, res, cache = _layer_setup(rng, fmt, t, blocks)
            pos = np.arange(first, first + t)
            inputs = decoder_layer.op_inputs(w, x, res, pos, cache, cos_sin)
            tol = "/".join([LAYER_CACHE[fmt]] * 2 + [f"frob:{LAYER_FROB[fmt]}"] * 2)
            cases.append(Case(f"{fmt}_{tag}", f"decoder_layer_{fmt}", tol, inputs,
                              {"eps": cfg.eps}, [cache.key, cache.value]))
    # The attention alone (the op the Python layers call): B sequences, each its own row of the
    # block tables, of different lengths: a decode batch (splits partial, splits empty past the
    # first key), two tokens a sequence, one prefill of 24 tokens. Every slot past
    # a context holds random values a causal read must not touch. o: a BF16 ulp of the value
    # (FP32 sums against float64, one rounding each), or 2^-8 near zero.
    for tag, q_len, lengths, blocks in (("decode_b4", 1, (300, 1, 129, 16), 20),
                                        ("two_tokens_b3", 2, (40, 2, 255), 16), ("prefill_t24", 24, (24,), 2)):
        cache = decoder_layer.new_cache(cfg, len(lengths) * blocks * 16, "paged", 16, rng)
        for c in (cache.key, cache.value):
            c[...] = formats.f32_to_bf16(rng.standard_normal(c.shape).astype(np.float32))
        tables = rng.permutation(len(lengths) * blocks).reshape(len(lengths), blocks).astype(np.int64)
        pos = np.concatenate([np.arange(n - q_len, n) for n in lengths]).astype(np.int64)
        q = formats.f32_to_bf16(rng.standard_normal((pos.size, cfg.hq, cfg.head_dim)).astype(np.float32))
        cases.append(Case(f"attention_{tag}", "paged_attention", "close:0.008:0.004",
                          [q, cache.key, cache.value, tables, pos]))
    # The graph: 100 decode steps from position 200 (crossing a split boundary at 256).
    steps = 100
    for fmt in decoder_layer.FORMATS:
        w, x, res, cache = _layer_setup(rng, fmt, steps, 24)
        pos = np.arange(200, 200 + steps)
        inputs = decoder_layer.op_inputs(w, x, res, pos, cache, cos_sin)
        frob = f"frob:{LAYER_FROB[fmt]}"
        tol = "/".join([LAYER_CACHE[fmt]] * 2 + [frob] * 4)
        cases.append(Case(f"{fmt}_graph", f"decoder_layer_graph_{fmt}", tol, inputs,
                          {"eps": cfg.eps}, [cache.key, cache.value]))
    return cases


CHAPTERS: dict[str, Callable[[np.random.Generator], list[Case]]] = {
    "00_roofline": roofline_cases,
    "01_formats": formats_cases,
    "02_int4_dequant": int4_dequant_cases,
    "03_dynamic_quant": dynamic_quant_cases,
    "04_rmsnorm": rmsnorm_cases,
    "05_elementwise": elementwise_cases,
    "06_int4_gemv": int4_gemv_cases,
    "07_w4a16_gemm": w4a16_gemm_cases,
    "08_fp8_gemm": fp8_gemm_cases,
    "09_moe": moe_cases,
    "10_sampling": sampling_cases,
    "11_decoder_layer": decoder_layer_cases,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lkw.golden", description="Writes golden inputs and expected outputs."
    )
    parser.add_argument("--out", required=True, type=Path, help="directory, one folder per chapter")
    parser.add_argument("--seed", type=int, help="random seed (default: $LKW_SEED, else fresh)")
    parser.add_argument(
        "--chapter",
        nargs="+",
        action="extend",
        choices=list(CHAPTERS),
        help="chapters to write (default: all)",
    )
    args = parser.parse_args(argv)
    seed = args.seed
    if seed is None and os.environ.get("LKW_SEED"):
        if not os.environ["LKW_SEED"].isdigit():
            parser.error(f"LKW_SEED={os.environ['LKW_SEED']!r} is not a non-negative integer")
        seed = int(os.environ["LKW_SEED"])
    if seed is None:
        seed = secrets.randbelow(2**32)
    if seed < 0:
        parser.error("--seed must be a non-negative integer")
    print(f"lkw.golden: seed {seed} (set LKW_SEED to repeat)", flush=True)
    for chapter in args.chapter or list(CHAPTERS):
        cases = write_chapter(args.out, chapter, seed)
        print(f"lkw.golden: {chapter}: {len(cases)} cases in {args.out / chapter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
