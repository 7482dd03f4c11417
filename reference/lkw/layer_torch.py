"""Chapter 11 in torch: the Llama-3-8B decoder layer of lkw.decoder_layer, step by step, with every
step a function that the workbook's kernel can replace.

    steps = layer_torch.torch_steps(cfg, "w4a16")            # torch's own ops (the start)
    steps |= {"act": layer_torch.workbook_steps(cfg, "w4a16", t)["act"]}   # one kernel swapped
    out, r2 = layer_torch.forward(steps, cfg, weights, x, residual, meta, cache, cos_sin)

Four sets of steps, one layer function (``forward``), the step names of lkw.decoder_layer:

- ``reference_steps``: the contract in float64 on any device (CPU included), rounding where the
  kernels round (lkw.decoder_layer's docstring): the numpy layer's numbers, in torch. FP8 adds its
  quantization points (below).
- ``torch_steps``: what a torch user writes: BF16 ops, cuBLAS through ``@``; W4A16 through
  ``torch._weight_int4pack_mm`` (tinygemm) and FP8 through ``torch._scaled_mm``'s blockwise recipe
  where this torch has them, else on weights dequantized to BF16 once (``TORCH_PATHS`` says which).
- ``workbook_steps``: the registered versions of chapters 03-08 through ``lkw._ext.launch`` on
  torch's current stream (``WORKBOOK`` lists the names, best first), so a torch CUDA graph
  captures them. BF16 projections stay cuBLAS (chapter 00's peer): the workbook teaches no BF16
  GEMM. The attention is not taught: here it is the C++ runner's paged attention (chapter 11's
  ``paged_attention/v0_runner``, reading the cache in place), in ``torch_steps`` torch's
  scaled_dot_product_attention over the gathered paged cache, in ``reference_steps`` a float64
  softmax. A prompt (``Meta.prompt``: every sequence's first tokens) takes torch's causal
  scaled_dot_product_attention in every layer but the reference (``prompt_attention``): the
  runner's kernel is a decode kernel.
- ``production_steps``: vLLM's kernels (norm, RoPE, cache, SiLU, Marlin, CUTLASS FP8) through
  lkw.peers, where they import, and the workbook layer's attention (so that the two layers differ
  by the taught kernels only).

Formats (``FORMATS``): "bf16"; "w4a16" (natural words [N, K/8], group-major scales [K/G, N],
G = 128: lkw.decoder_layer's weights; chapter 06's GEMV at T <= 16, chapter 07's GEMM above);
"fp8" W8A8 with blockwise scales (chapter 08), lkw.decoder_layer's FP8 format: weights E4M3 [N, K]
with one FP32 scale per 128 x 128 block (lkw.fp8_gemm.per_block_fp8 of the BF16 weights), every
GEMM's input E4M3 in 1 x 128 groups with FP32 scales [K/128, T]: the norms and the attention write
BF16 and the projection quantizes its input first (chapter 03's per_group_fp8: qkv, o and gate_up
run two kernels), act quantizes in its own kernel (chapter 05's silu_and_mul_fp8_per_group, the
same numbers as per_group_fp8 of its BF16 result), so down_proj gets FP8.

Batches: T new tokens in B sequences of T/B tokens each (decode: B = T sequences of one token;
prefill: B = 1). ``Meta`` holds their positions, slots and block tables in device memory, so a
CUDA graph replays with the cache growing (new positions and slots written into the same
tensors). The KV cache is the paged layout of chapter 05 (vLLM's), BF16, blocks of 16 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from lkw import decoder_layer as dl
from lkw import formats, fp8_gemm, quant

FORMATS = ("bf16", "w4a16", "fp8")
STEP_NAMES = dl.STEP_NAMES
LLAMA3_8B = dl.LLAMA3_8B
TINY = dl.TINY
BLOCK_SIZE = 16  # tokens per KV block (vLLM's default)
FP8_BLOCK = 128  # the blockwise scales' 128 (A: 1 x 128 groups, B: 128 x 128 blocks)
E4M3_MAX = 448.0
MIN_SCALE = float(quant.MIN_SCALE)

# The registered versions each workbook step calls, best first (the first one registered is
# used): chapter 04's fused norms, 05's RoPE / cache / activations, 03's per-group quant, 06's GEMV
# (T <= 16), 07's wgmma GEMM (which splits K itself where its tiles leave SMs idle), 08's blockwise GEMM.
WORKBOOK = {
    "norm": ["04_rmsnorm/fused_add_rmsnorm/v4_fused_add"],
    # FP8: the norm quantizes its output per 1 x 128 group for the GEMM after it (no BF16 y).
    "norm_fp8": ["04_rmsnorm/fused_add_rmsnorm_fp8_group/v5_fused_add_quant"],
    # RoPE and the cache write in one pass over qkv where chapter 05's fused op is built
    # (forward calls it in place of both steps), else the two kernels.
    "rope_cache": ["05_elementwise/qkv_rope_cache/v9_qkv_rope_cache"],
    "rope": ["05_elementwise/rope/v4_rope_vec16", "05_elementwise/rope/v3_rope_scalar"],
    "cache": [
        "05_elementwise/reshape_and_cache/v8_cache_staged",
        "05_elementwise/reshape_and_cache/v6_cache_scalar",
    ],
    "act": ["05_elementwise/silu_and_mul/v1_act_vec16", "05_elementwise/silu_and_mul/v0_act_scalar"],
    "act_fp8": ["05_elementwise/silu_and_mul_fp8_per_group/v2_act_fused_fp8"],
    "group_quant": ["03_dynamic_quant/per_group_fp8/v2_vec16", "03_dynamic_quant/per_group_fp8/v0_two_pass"],
    "gemv": ["06_int4_gemv/int4t_gemv/v7_tiled_stream", "06_int4_gemv/int4i_gemv/v6_pipelined"],
    "gemm_decode": ["07_w4a16_gemm/w4a16r_gemm/v8_group_scales", "07_w4a16_gemm/w4a16r_gemm/v6_wgmma"],
    "gemm": ["07_w4a16_gemm/w4a16r_gemm/v9_warp_specialized", "07_w4a16_gemm/w4a16r_gemm/v6_wgmma"],
    "fp8_gemm": ["08_fp8_gemm/fp8_gemm_blockwise/v7_swap_ab", "08_fp8_gemm/fp8_gemm_blockwise/v5_tuned"],
    "attention": ["11_decoder_layer/paged_attention/v0_runner"],  # not a lesson: the runner's
}

# Which torch path each format's torch steps took in this process ("" until first used).
TORCH_PATHS: dict[str, str] = {}


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------------------------------------
# BF16 bits <-> torch, the one float64 -> BF16 rounding


def from_bits(bits: np.ndarray, device="cpu"):
    """numpy BF16 bits (uint16) -> torch bfloat16 (the same bits)."""
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).to(device)


def to_bits(t) -> np.ndarray:
    """torch bfloat16 -> numpy BF16 bits (uint16)."""
    torch = _torch()
    return t.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def f64_to_bf16(x):
    """float64 -> bfloat16 rounded ONCE to nearest even (torch's own cast goes through FP32 and
    rounds twice): the float64 significand is rounded to BF16's 8 bits on its integer bits, the
    result is exact in FP32 and in BF16. (BF16 subnormals, below 2^-126, may round twice.)"""
    torch = _torch()
    bits = x.contiguous().view(torch.int64)
    lsb = (bits >> 45) & 1
    rounded = (bits + ((1 << 44) - 1) + lsb) & ~((1 << 45) - 1)
    finite = torch.isfinite(x)
    out = torch.where(finite, rounded.view(torch.float64), x)
    return out.to(torch.float32).to(torch.bfloat16)


def e4m3(x32):
    """FP32 -> E4M3, round to nearest even with saturation (cvt.rn.satfinite): the clamp makes
    torch's cast, which has no satfinite, give +-448 where the kernel does."""
    torch = _torch()
    return x32.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _fp8_scale(absmax32):
    """chapter 03's scale: max(fp32(absmax / 448), MIN_SCALE), FP32."""
    torch = _torch()
    return torch.clamp(absmax32 / torch.tensor(E4M3_MAX, dtype=torch.float32), min=MIN_SCALE)


def quant_per_token(yb):
    """chapter 03's per_token_fp8 of BF16 [T, d] -> (q E4M3 [T, d], scales FP32 [T, 1]) (kept for
    the tests of the rule; the layer's FP8 format quantizes per group)."""
    y32 = yb.float()
    s = _fp8_scale(y32.abs().amax(dim=1, keepdim=True))
    return e4m3(y32 * (1.0 / s)), s


def quant_per_group(yb):
    """chapter 03's per_group_fp8 of BF16 [T, d] -> (q [T, d], scales FP32 [d/128, T])."""
    t, d = yb.shape
    y32 = yb.float().view(t, d // FP8_BLOCK, FP8_BLOCK)
    s = _fp8_scale(y32.abs().amax(dim=2))  # (T,G)
    q = e4m3(y32 * (1.0 / s)[:, :, None]).view(t, d)
    return q, s.t().contiguous()


class Quantized(NamedTuple):
    """FP8 activations: q E4M3 [T, K] and FP32 scales [K/128, T] (1 x 128 groups, column-major:
    what chapter 03 writes and chapter 08 reads)."""

    q: object
    scales: object

    def dequant64(self):
        """q times its scales in float64 [T, K], exact."""
        s = self.scales.t().double().repeat_interleave(FP8_BLOCK, dim=1)  # (T,K)
        return self.q.double() * s


# ---------------------------------------------------------------------------------------------
# Weights on the device


class Proj:
    """One projection's weights: "bf16" W [N, K]; "w4a16" natural int32 words [N, K/8] and BF16
    scales [K/G, N]; "fp8" E4M3 [N, K] and FP32 scales [ceil(N/128), K/128]. The layouts other
    kernels read (repacked, tiled, Marlin's, dequantized) are made once, on first use."""

    def __init__(self, fmt: str, weight, scales, n: int, k: int):
        self.fmt, self.weight, self.scales, self.n, self.k = fmt, weight, scales, n, k
        self._derived: dict[str, object] = {}

    @property
    def group(self) -> int:
        return self.k // self.scales.shape[0] if self.fmt == "w4a16" else FP8_BLOCK

    def derived(self, key: str, make: Callable[[], object]):
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def exact(self):
        """W (W4A16: s (q - 8); FP8: e4m3(b) s) in float64 [N, K], exact, cached."""
        torch = _torch()

        def make():
            if self.fmt == "bf16":
                return self.weight.double()
            if self.fmt == "w4a16":
                return (_nibbles(self.weight).double() - 8.0) * self.scales.t().double().repeat_interleave(
                    self.group, dim=1
                )
            s = self.scales.double().repeat_interleave(FP8_BLOCK, 0)[: self.n]
            return self.weight.double() * s.repeat_interleave(FP8_BLOCK, 1)

        return self.derived("exact", lambda: make().to(torch.float64))

    def bf16(self):
        """W rounded once to BF16 (the torch fallbacks' weights)."""
        return self.derived("bf16", lambda: f64_to_bf16(self.exact()))

    def clone(self) -> Proj:
        return Proj(self.fmt, self.weight.clone(), None if self.scales is None else self.scales.clone(),
                    self.n, self.k)


def _nibbles(words):
    """int32 words [R, K/8] (natural order) -> int32 values [R, K]."""
    torch = _torch()
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 0xF).reshape(words.shape[0], -1)


@dataclass
class LayerWeights:
    fmt: str
    norm1: object  # BF16 [d]
    qkv: Proj  # [(Hq + 2 Hkv) D, d], rows q | k | v
    o: Proj  # [d, Hq D]
    norm2: object
    gate_up: Proj  # [2 d_ff, d], rows gate | up
    down: Proj  # [d, d_ff]

    def projs(self) -> list[Proj]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def clone(self) -> LayerWeights:
        return LayerWeights(self.fmt, self.norm1.clone(), self.qkv.clone(), self.o.clone(),
                            self.norm2.clone(), self.gate_up.clone(), self.down.clone())


def numpy_weights(cfg: dl.Config, fmt: str, seed: int = 0):
    """lkw.decoder_layer's seeded weights (decoder_layer.random_weights) for "bf16" and "w4a16";
    for "fp8", decoder_layer's own FP8 weights where it has the format, else the BF16 weights of
    the same seed quantized per 128 x 128 block (lkw.fp8_gemm.per_block_fp8)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    rng = np.random.default_rng(seed)
    if fmt in dl.FORMATS:
        return dl.random_weights(rng, cfg, fmt)
    w = dl.random_weights(rng, cfg, "bf16")

    def q(lin):
        codes, scales = fp8_gemm.per_block_fp8(lin.weight)
        return dl.Linear("fp8", codes, scales)

    return dl.Weights(w.norm1, q(w.qkv), q(w.o), w.norm2, q(w.gate_up), q(w.down))


def to_device(w, cfg: dl.Config, device) -> LayerWeights:
    """numpy weights (dl.Weights of dl.Linear) -> LayerWeights on `device`."""
    torch = _torch()

    def proj(lin, n, k):
        if lin.fmt == "bf16":
            return Proj("bf16", from_bits(lin.weight, device), None, n, k)
        if lin.fmt == "w4a16":
            words = torch.from_numpy(np.ascontiguousarray(lin.weight).view(np.int32)).to(device)
            return Proj("w4a16", words, from_bits(lin.scales, device), n, k)
        codes = torch.from_numpy(np.ascontiguousarray(lin.weight, np.uint8)).to(device)
        scales = torch.from_numpy(np.ascontiguousarray(lin.scales, np.float32)).to(device)
        return Proj("fp8", codes.view(torch.float8_e4m3fn), scales, n, k)

    d, hd = cfg.d, cfg.hq * cfg.head_dim
    return LayerWeights(
        w.qkv.fmt,
        from_bits(w.norm1, device),
        proj(w.qkv, cfg.qkv_n, d),
        proj(w.o, d, hd),
        from_bits(w.norm2, device),
        proj(w.gate_up, 2 * cfg.d_ff, d),
        proj(w.down, d, cfg.d_ff),
    )


def layer_weights(cfg: dl.Config, fmt: str, device, seed: int = 0) -> LayerWeights:
    return to_device(numpy_weights(cfg, fmt, seed), cfg, device)


# ---------------------------------------------------------------------------------------------
# The KV cache and the batch's metadata (device tensors, so a graph replays with new values)


@dataclass
class KVCache:
    key: object  # BF16 [blocks, Hkv, D/8, 16, 8]   chapter 05's paged layout
    value: object  # BF16 [blocks, Hkv, D, 16]

    def clone(self) -> KVCache:
        return KVCache(self.key.clone(), self.value.clone())


def new_cache(cfg: dl.Config, num_blocks: int, device, gen=None) -> KVCache:
    """A paged cache of num_blocks blocks: N(0, 1) values from `gen` (a context that is already
    there), zeros without it. Never NaN: a gathered block's unused slots are masked out of the
    softmax, and a NaN there would still poison P . V."""
    torch = _torch()
    x = 8
    ks = (num_blocks, cfg.hkv, cfg.head_dim // x, BLOCK_SIZE, x)
    vs = (num_blocks, cfg.hkv, cfg.head_dim, BLOCK_SIZE)
    if gen is None:
        return KVCache(torch.zeros(ks, dtype=torch.bfloat16, device=device),
                       torch.zeros(vs, dtype=torch.bfloat16, device=device))
    mk = lambda s: torch.randn(s, generator=gen, device=device).to(torch.bfloat16)
    return KVCache(mk(ks), mk(vs))


@dataclass
class Meta:
    """T = B * q_len new tokens: B sequences of q_len tokens each, token i of sequence b at row
    b * q_len + i. positions, slots int64 [T]; block_tables int64 [B, blocks per sequence]."""

    positions: object
    slots: object
    block_tables: object
    q_len: int
    # Every sequence's q_len tokens are its first (positions 0..q_len-1, q_len > 1): a prompt, whose
    # keys are its own new tokens, so a causal attention kernel needs no positions (prompt_attention).
    prompt: bool = False

    @property
    def batch(self) -> int:
        return self.block_tables.shape[0]


def make_meta(positions, block_tables, q_len: int, device) -> Meta:
    """Meta from host positions [T] and block tables [B, nb] (slots from the tables)."""
    torch = _torch()
    pos = np.asarray(positions, np.int64)
    tables = np.asarray(block_tables, np.int64)
    seq = np.arange(pos.size) // q_len
    slots = tables[seq, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
    prompt = q_len > 1 and bool(np.array_equal(pos, np.tile(np.arange(q_len), pos.size // q_len)))
    return Meta(t(pos), t(slots), t(tables), q_len, prompt)


def block_tables(batch: int, max_len: int, seed: int | None = 0) -> np.ndarray:
    """[B, ceil(max_len / 16)] distinct blocks, shuffled by `seed` (so a slot is not its index)."""
    nb = -(-max_len // BLOCK_SIZE)
    order = np.arange(batch * nb) if seed is None else np.random.default_rng(seed).permutation(batch * nb)
    return order.reshape(batch, nb)


def decode_meta(batch: int, context: int, device, capacity: int | None = None, seed: int = 0) -> Meta:
    """B sequences of one new token each at position context - 1 (the context counts it), block
    tables for `capacity` tokens (default: the context)."""
    tables = block_tables(batch, capacity or context, seed)
    return make_meta(np.full(batch, context - 1), tables, 1, device)


def prefill_meta(t: int, device, capacity: int | None = None, seed: int = 0) -> Meta:
    """One sequence of T tokens at positions 0..T-1."""
    return make_meta(np.arange(t), block_tables(1, capacity or t, seed), t, device)


def advance(meta: Meta) -> None:
    """Every sequence one token further (decode): positions and slots rewritten in place, on the
    device, as a captured graph's next replay needs them."""
    torch = _torch()
    meta.prompt = False  # (a graph captured for a prompt keeps its prompt path: capture another)
    meta.positions.add_(1)
    seq = torch.arange(meta.positions.numel(), device=meta.positions.device) // meta.q_len
    blk = meta.block_tables[seq, meta.positions // BLOCK_SIZE]
    meta.slots.copy_(blk * BLOCK_SIZE + meta.positions % BLOCK_SIZE)


def rope_cache(cfg: dl.Config, max_pos: int, device):
    """lkw.decoder_layer.rope_cache (FP32 [max_pos, D]: cos then sin) on the device."""
    torch = _torch()
    return torch.from_numpy(dl.rope_cache(cfg, max_pos)).to(device)


def gather_kv(cache: KVCache, meta: Meta):
    """(K, V) [B, L, Hkv, D] of every slot of each sequence's blocks, L = blocks * 16: one
    gathering copy each (the index runs over a permuted view of the paged layout)."""
    b, nb = meta.block_tables.shape
    k = cache.key.permute(0, 3, 1, 2, 4)[meta.block_tables]  # (B,nb,bs,Hkv,D/8,8)
    v = cache.value.permute(0, 3, 1, 2)[meta.block_tables]  # (B,nb,bs,Hkv,D)
    hkv = cache.key.shape[1]
    return k.reshape(b, nb * BLOCK_SIZE, hkv, -1), v.reshape(b, nb * BLOCK_SIZE, hkv, -1)


def causal_mask(meta: Meta, length: int):
    """bool [B, q_len, L]: key j is seen by the query at position p when j <= p."""
    torch = _torch()
    pos = meta.positions.view(meta.batch, meta.q_len)
    j = torch.arange(length, device=pos.device)
    return j[None, None, :] <= pos[:, :, None]


# ---------------------------------------------------------------------------------------------
# The layer


def forward(steps: dict, cfg: dl.Config, w: LayerWeights, x, residual, meta: Meta, cache: KVCache,
            cos_sin, trace: dict | None = None):
    """One decoder layer over T new tokens -> (out, r2), lkw.decoder_layer's convention. `steps`
    maps every step name to its function; `trace`, when given, receives name -> (args, output)
    of every step (cache_write: the cache before and after, cloned)."""
    missing = set(STEP_NAMES) - set(steps)
    if missing:
        raise ValueError(f"steps missing: {sorted(missing)}")
    hd = cfg.head_dim

    def call(name, *args):
        out = steps[name](*args)
        if trace is not None:
            trace[name] = (args, out)
        return out

    xn, r1 = call("attn_norm", x, residual, w.norm1)
    qkv = call("qkv_proj", xn, w.qkv)  # (T,(Hq+2Hkv)D)
    if writes_cache(steps["rope"]):
        # One kernel for steps 3 and 4 (the workbook's qkv_rope_cache): q' out, k' and v straight
        # into the cache; cache_write has nothing left to do.
        q = call("rope", meta.positions, qkv, cos_sin, cache, meta.slots)
        o = call("attention", q, cache, meta)
        return _after_attention(call, w, o, r1)
    q = qkv[:, : cfg.hq * hd].unflatten(1, (cfg.hq, hd))
    k = qkv[:, cfg.hq * hd : (cfg.hq + cfg.hkv) * hd].unflatten(1, (cfg.hkv, hd))
    v = qkv[:, (cfg.hq + cfg.hkv) * hd :].unflatten(1, (cfg.hkv, hd))
    q, k = call("rope", meta.positions, q, k, cos_sin)
    if trace is not None:
        before = cache.clone()
        steps["cache_write"](k, v, cache, meta.slots)
        trace["cache_write"] = ((k, v, before, meta.slots), cache.clone())
    else:
        steps["cache_write"](k, v, cache, meta.slots)
    o = call("attention", q, cache, meta)  # (T,Hq D)
    return _after_attention(call, w, o, r1)


def _after_attention(call, w: LayerWeights, o, r1):
    y = call("o_proj", o, w.o)
    xn2, r2 = call("ffn_norm", y, r1, w.norm2)
    gu = call("gate_up_proj", xn2, w.gate_up)  # (T,2 d_ff)
    a = call("act", gu)
    out = call("down_proj", a, w.down)
    return out, r2


def writes_cache(rope_step) -> bool:
    """Whether a rope step is the fused one: (positions, qkv, cos_sin, cache, slots) -> q', the
    cache written (workbook_steps' where chapter 05's qkv_rope_cache is built)."""
    return bool(getattr(rope_step, "writes_cache", False))


# ---------------------------------------------------------------------------------------------
# 1. The reference: float64, rounded where the kernels round


def _ref_norm(eps: float):
    torch = _torch()

    def norm(x, res, w):
        r = (x.float() + res.float()).to(torch.bfloat16)  # exact FP32 sum, one rounding
        r64 = r.double()
        rstd = (1.0 / torch.sqrt((r64 * r64).sum(1, keepdim=True) / r.shape[1]
                                 + float(np.float32(eps)))).float()  # (T,1)
        z = (r.float() * rstd).to(torch.bfloat16)  # FP32 product, then BF16
        return (z.float() * w.float()).to(torch.bfloat16), r  # exact product, one rounding

    return norm


def _ref_project(x, p: Proj):
    """bf16(x . W^T) from exact operands in float64: BF16 x, or FP8 x times its scales (a BF16
    input of an FP8 projection quantized per 1 x 128 group first)."""
    if p.fmt == "fp8" and not isinstance(x, Quantized):
        x = Quantized(*quant_per_group(x))
    x64 = x.dequant64() if isinstance(x, Quantized) else x.double()
    return f64_to_bf16(x64 @ p.exact().t())


def ref_rope(positions, q, k, cos_sin):
    """NEOX rotation in float64, one rounding per element (lkw.elementwise.rope)."""
    torch = _torch()
    rows = cos_sin[positions].double()  # (T,D)
    half = rows.shape[1] // 2
    c, s = rows[:, None, :half], rows[:, None, half:]

    def rot(h):
        h64 = h.double()
        x, y = h64[..., :half], h64[..., half:]
        return f64_to_bf16(torch.cat([x * c - y * s, y * c + x * s], dim=-1))

    return rot(q), rot(k)


def torch_cache_write(k, v, cache: KVCache, slots) -> None:
    """reshape_and_cache into the paged layout, in place (an exact copy)."""
    t, hkv, d = k.shape
    blk, off = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    cache.key[blk, :, :, off, :] = k.reshape(t, hkv, d // 8, 8)
    cache.value[blk, :, :, off] = v


def ref_attention(cfg: dl.Config):
    """Causal GQA in float64 over the gathered cache, o rounded once (decoder_layer.attention)."""
    torch = _torch()

    def attention(q, cache: KVCache, meta: Meta):
        kk, vv = gather_kv(cache, meta)  # (B,L,Hkv,D)
        b, length, hkv, d = kk.shape
        g = cfg.hq // hkv
        q64 = q.double().view(b, meta.q_len, hkv, g, d)  # (B,Q,Hkv,G,D)
        scores = torch.einsum("bqhgd,blhd->bhgql", q64, kk.double()) / math.sqrt(d)
        mask = causal_mask(meta, length)[:, None, None]  # (B,1,1,Q,L)
        scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        # slots past a sequence's last position may hold anything (a poisoned NaN): 0 * NaN is NaN
        seen = mask.reshape(b, -1, length).any(dim=1)  # (B,L)
        vv = vv.double().masked_fill(~seen[:, :, None, None], 0.0)
        o = torch.einsum("bhgql,blhd->bqhgd", p, vv)
        return f64_to_bf16(o.reshape(b * meta.q_len, cfg.hq * d))

    return attention


def _ref_act(quantize: bool):
    torch = _torch()

    def act(gu):
        d = gu.shape[1] // 2
        g, u = gu[:, :d].double(), gu[:, d:].double()
        y = f64_to_bf16(g / (1.0 + torch.exp(-g)) * u)
        return Quantized(*quant_per_group(y)) if quantize else y

    return act


def reference_steps(cfg: dl.Config, fmt: str) -> dict:
    """The contract in float64 (any device): lkw.decoder_layer's layer, FP8 included."""
    fp8 = _check_fmt(fmt) == "fp8"
    return {
        "attn_norm": _ref_norm(cfg.eps),
        "qkv_proj": _ref_project,
        "rope": ref_rope,
        "cache_write": torch_cache_write,
        "attention": ref_attention(cfg),
        "o_proj": _ref_project,
        "ffn_norm": _ref_norm(cfg.eps),
        "gate_up_proj": _ref_project,
        "act": _ref_act(fp8),
        "down_proj": _ref_project,
    }


def _check_fmt(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    return fmt


# ---------------------------------------------------------------------------------------------
# 2. torch: what a torch user writes (BF16 math, torch's own quantized kernels where it has them)


def _torch_norm(eps: float):
    torch = _torch()

    def norm(x, res, w):
        r = (x.float() + res.float()).to(torch.bfloat16)
        r32 = r.float()
        z = (r32 * torch.rsqrt(r32.pow(2).mean(1, keepdim=True) + eps)).to(torch.bfloat16)
        return z * w, r

    return norm


def torch_rope(positions, q, k, cos_sin):
    torch = _torch()
    rows = cos_sin[positions]  # (T,D) FP32
    half = rows.shape[1] // 2
    c, s = rows[:, None, :half], rows[:, None, half:]

    def rot(h):
        x, y = h[..., :half].float(), h[..., half:].float()
        return torch.cat([x * c - y * s, y * c + x * s], dim=-1).to(torch.bfloat16)

    return rot(q), rot(k)


def sdpa_attention(cfg: dl.Config):
    """torch's scaled_dot_product_attention over the gathered paged cache (not a workbook kernel:
    chapter 11 does not teach attention). GQA without repeating K and V: the G query heads of a
    KV head are G * q_len query rows of one attention head."""
    _torch()  # a clear error without torch, before the import below
    import torch.nn.functional as F

    def attention(q, cache: KVCache, meta: Meta):
        kk, vv = gather_kv(cache, meta)  # (B,L,Hkv,D)
        b, length, hkv, d = kk.shape
        g, ql = cfg.hq // hkv, meta.q_len
        qh = q.view(b, ql, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * ql, d)
        mask = causal_mask(meta, length)[:, None, None].expand(b, 1, g, ql, length)
        mask = mask.reshape(b, 1, g * ql, length)
        o = F.scaled_dot_product_attention(qh, kk.transpose(1, 2), vv.transpose(1, 2),
                                           attn_mask=mask, scale=1.0 / math.sqrt(d))  # (B,Hkv,G Q,D)
        return o.view(b, hkv, g, ql, d).permute(0, 3, 1, 2, 4).reshape(b * ql, cfg.hq * d)

    return with_prompt_attention(cfg, attention)


def prompt_attention(cfg: dl.Config):
    """A prompt's attention (Meta.prompt): torch's causal scaled_dot_product_attention over the
    prompt's own keys, gathered from the cache (a flash-attention kernel where torch has one), GQA
    by enable_gqa (torch 2.5 on). Every layer but the reference takes it for a prompt: chapter 11
    teaches no attention, and the runner's decode kernel reads a token's keys once per query
    token, so a prompt of T tokens reads about T / 2 times the cache."""
    _torch()
    import torch.nn.functional as F

    def attention(q, cache: KVCache, meta: Meta):
        ql, d = meta.q_len, cfg.head_dim
        nb = -(-ql // BLOCK_SIZE)
        kk, vv = gather_kv(cache, Meta(meta.positions, meta.slots, meta.block_tables[:, :nb], ql))
        b = kk.shape[0]
        kk, vv = kk[:, :ql].transpose(1, 2), vv[:, :ql].transpose(1, 2)  # (B,Hkv,Q,D): square
        qh = q.view(b, ql, cfg.hq, d).transpose(1, 2)  # (B,Hq,Q,D)
        o = F.scaled_dot_product_attention(qh, kk, vv, is_causal=True, scale=1.0 / math.sqrt(d),
                                           enable_gqa=True)  # (B,Hq,Q,D)
        return o.transpose(1, 2).reshape(b * ql, cfg.hq * d)

    return attention


def with_prompt_attention(cfg: dl.Config, decode):
    """`decode`'s attention, a prompt's (Meta.prompt) through prompt_attention instead."""
    prompt = prompt_attention(cfg)

    def attention(q, cache: KVCache, meta: Meta):
        return (prompt if meta.prompt else decode)(q, cache, meta)

    return attention


def _torch_int4(x, p: Proj):
    """torch._weight_int4pack_mm (tinygemm) where this torch runs it, else x @ W_hat^T on BF16
    weights dequantized once."""
    torch = _torch()

    def make():
        try:
            from lkw import bench

            q = _nibbles(p.weight)
            packed = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8)
            w_int4 = torch._convert_weight_to_int4pack(packed, 8)
            sz = bench._int4pack_scales_and_zeros(torch, p.scales)
            torch._weight_int4pack_mm(x[:1].contiguous(), w_int4, p.group, sz)
            TORCH_PATHS["w4a16"] = "torch._weight_int4pack_mm (tinygemm)"
            return lambda a: torch._weight_int4pack_mm(a, w_int4, p.group, sz)
        except Exception as e:  # noqa: BLE001  (a torch without tinygemm here: say which path)
            TORCH_PATHS["w4a16"] = f"x @ W_hat^T, BF16 weights (tinygemm: {type(e).__name__})"
            wb = p.bf16()
            return lambda a: a @ wb.t()

    return p.derived("torch_int4", make)(x.contiguous())


def _torch_fp8(x: Quantized, p: Proj):
    """torch._scaled_mm with 1 x 128 and 128 x 128 scales where this torch has it, else x_hat @
    W_hat^T in BF16 (both dequantized: the activations per call, the weights once)."""
    torch = _torch()

    def make():
        def scaled(a: Quantized):
            sa = a.scales.t()  # (T,K/128), T contiguous
            return torch._scaled_mm(a.q, p.weight.t(), sa, p.scales.t(), out_dtype=torch.bfloat16)

        try:
            scaled(x)
            TORCH_PATHS["fp8"] = "torch._scaled_mm, blockwise scales"
            return scaled
        except Exception as e:  # noqa: BLE001
            TORCH_PATHS["fp8"] = f"BF16 matmul on dequantized operands (_scaled_mm: {type(e).__name__})"
            wb = p.bf16()

            def deq(a: Quantized):
                t, k = a.q.shape
                s = a.scales.t()  # (T,K/128)
                xa = (a.q.float().view(t, k // FP8_BLOCK, FP8_BLOCK) * s[:, :, None]).view(t, k)
                return xa.to(torch.bfloat16) @ wb.t()

            return deq

    return p.derived("torch_fp8", make)(x)


def torch_project(x, p: Proj):
    if p.fmt == "bf16":
        return x @ p.weight.t()
    if p.fmt == "w4a16":
        return _torch_int4(x, p)
    if not isinstance(x, Quantized):  # a BF16 input, quantized in 1 x 128 groups
        x = Quantized(*quant_per_group(x))
    return _torch_fp8(x, p)


def _torch_act(quantize: bool):
    torch = _torch()

    def act(gu):
        d = gu.shape[1] // 2
        g = gu[:, :d].float()
        y = (g * torch.sigmoid(g) * gu[:, d:].float()).to(torch.bfloat16)
        return Quantized(*quant_per_group(y)) if quantize else y

    return act


def torch_steps(cfg: dl.Config, fmt: str) -> dict:
    """The torch layer: the start of the waterfall, and torch eager / torch.compile's peer."""
    fp8 = _check_fmt(fmt) == "fp8"
    return {
        "attn_norm": _torch_norm(cfg.eps),
        "qkv_proj": torch_project,
        "rope": torch_rope,
        "cache_write": torch_cache_write,
        "attention": sdpa_attention(cfg),
        "o_proj": torch_project,
        "ffn_norm": _torch_norm(cfg.eps),
        "gate_up_proj": torch_project,
        "act": _torch_act(fp8),
        "down_proj": torch_project,
    }


# ---------------------------------------------------------------------------------------------
# 3. The workbook's kernels, by registered name, on torch's current stream


def registered() -> set[str]:
    from lkw import _ext

    return {v["name"] for v in _ext.versions()}


def pick(role: str, names: set[str] | None = None) -> str:
    """The first registered version of WORKBOOK[role]; LookupError naming the candidates."""
    names = registered() if names is None else names
    for name in WORKBOOK[role]:
        if name in names:
            return name
    raise LookupError(f"no registered version for {role}: built without {WORKBOOK[role]}")


def launch(name: str, inputs: list, outputs: list, params: dict | None = None, dtypes=None) -> None:
    """lkw._ext.launch on torch's current stream (so a torch graph capture records it). FP8
    tensors travel as uint8 views with their dtype named; int32 words as uint32."""
    torch = _torch()
    from lkw import _ext

    names, arrays = [], []
    for t in [*inputs, *outputs]:
        if t.dtype == torch.float8_e4m3fn:
            names.append("float8_e4m3fn")
            arrays.append(t.view(torch.uint8))
        else:
            names.append("")
            arrays.append(t)
    if dtypes:
        names = [d or n for d, n in zip(dtypes, names, strict=True)]
    n_in = len(inputs)
    _ext.launch(name, arrays[:n_in], arrays[n_in:], params={k: float(v) for k, v in (params or {}).items()},
                dtypes=names if any(names) else [], stream=torch.cuda.current_stream().cuda_stream)


def _wb_norm(eps: float, names, quantize: bool = False):
    """Chapter 04's fused add + RMSNorm; `quantize` (FP8, where the group op is built): its v5,
    which writes y's 1 x 128 group codes and scales instead of y, the next GEMM's input."""
    torch = _torch()
    name = pick("norm_fp8" if quantize else "norm", names)

    def norm(x, res, w):
        r = torch.empty_like(res)
        x, res = x.contiguous(), res.contiguous()
        if quantize:
            t, d = x.shape
            q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=x.device)
            s = torch.empty(d // FP8_BLOCK, t, dtype=torch.float32, device=x.device)
            launch(name, [x, res, w], [q, s, r], {"eps": eps})
            return Quantized(q, s), r
        y = torch.empty_like(x)
        launch(name, [x, res, w], [y, r], {"eps": eps})
        return y, r

    return norm


def _wb_rope(names):
    torch = _torch()
    name = pick("rope", names)

    def rope(positions, q, k, cos_sin):
        q, k = q.contiguous(), k.contiguous()  # slices of qkv: one copy each when T > 1
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        launch(name, [positions, q, k, cos_sin], [qo, ko], {"is_neox": 1})
        return qo, ko

    return rope


def _wb_rope_cache(cfg: dl.Config, names):
    """Chapter 05's qkv_rope_cache: the query heads of qkv rotated into q', the key heads rotated
    and the value heads copied into the paged cache, one launch (no copies of qkv's slices)."""
    torch = _torch()
    name = pick("rope_cache", names)
    d = cfg.head_dim

    def rope(positions, qkv, cos_sin, cache: KVCache, slots):
        t = qkv.shape[0]
        q = torch.empty(t, cfg.hq, d, dtype=qkv.dtype, device=qkv.device)
        launch(name, [positions, qkv.view(t, -1, d), cos_sin, slots], [cache.key, cache.value, q],
               {"layout": 0, "is_neox": 1})
        return q

    rope.writes_cache = True
    return rope


def _wb_cache(names):
    name = pick("cache", names)

    def cache_write(k, v, cache: KVCache, slots) -> None:
        launch(name, [k.contiguous(), v.contiguous(), slots], [cache.key, cache.value], {"layout": 0})

    return cache_write


def _wb_attention(cfg: dl.Config, names):
    """The runner's paged attention over the cache in place (no gather), q [T, Hq D] -> o."""
    torch = _torch()
    name = pick("attention", names)

    def attention(q, cache: KVCache, meta: Meta):
        t, d = q.shape[0], cfg.head_dim
        o = torch.empty(t, cfg.hq, d, dtype=torch.bfloat16, device=q.device)
        launch(name, [q.contiguous().view(t, cfg.hq, d), cache.key, cache.value,
                      meta.block_tables.contiguous(), meta.positions], [o])
        return o.view(t, cfg.hq * d)

    return with_prompt_attention(cfg, attention)  # the runner's kernel is a decode kernel


def _wb_act(quantize: bool, names):
    torch = _torch()
    name = pick("act_fp8" if quantize else "act", names)

    def act(gu):
        t, d = gu.shape[0], gu.shape[1] // 2
        if quantize:
            q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=gu.device)
            s = torch.empty(d // FP8_BLOCK, t, dtype=torch.float32, device=gu.device)
            launch(name, [gu], [q, s])
            return Quantized(q, s)
        y = torch.empty(t, d, dtype=gu.dtype, device=gu.device)
        launch(name, [gu], [y])
        return y

    return act


def w4a16_kernel(t: int, names) -> str:
    """The W4A16 version for T tokens: chapter 06's GEMV at T <= 16, chapter 07's v8 (group scales
    on the sum, decode tiles) up to 64 and its v9 above."""
    if t <= dl.GEMV_MAX_T:
        return pick("gemv", names)
    return pick("gemm_decode" if t <= dl.GROUP_SCALES_MAX_T else "gemm", names)


def _w4a16_layout(p: Proj, name: str):
    """The weights and scales the version reads, made once per projection and layout."""
    torch = _torch()
    from lkw import bench

    if "/int4t_gemv/" in name:
        return p.derived("int4t", lambda: (bench._torch_tiled_gemv_words(torch, p.weight),
                                          p.scales.t().contiguous()))
    if "/int4i_gemv/" in name:
        def interleaved():
            q = _nibbles(p.weight).view(p.n, p.k // 8, 8)
            return bench._torch_pack(torch, q, interleaved=True), p.scales.t().contiguous()

        return p.derived("int4i", interleaved)
    if "/w4a16r_gemm/" in name:
        return p.derived("w4a16r", lambda: (bench._torch_repack(torch, p.weight), p.scales))
    return p.weight, p.scales  # w4a16_gemm: the natural words


def _wb_project(t: int, names):
    torch = _torch()
    gemv_gemm = w4a16_kernel(t, names) if _has_any(names, ("gemv", "gemm_decode", "gemm")) else None
    group_quant = pick("group_quant", names) if _has_any(names, ("group_quant",)) else None
    fp8_name = pick("fp8_gemm", names) if _has_any(names, ("fp8_gemm",)) else None

    def project(x, p: Proj):
        if p.fmt == "bf16":
            return x @ p.weight.t()  # cuBLAS: chapter 00's peer, no workbook BF16 GEMM
        y = torch.empty(x.q.shape[0] if isinstance(x, Quantized) else x.shape[0], p.n,
                        dtype=torch.bfloat16, device=p.weight.device)
        if p.fmt == "w4a16":
            if gemv_gemm is None:
                raise LookupError("no W4A16 version registered (chapters 06, 07)")
            w, s = _w4a16_layout(p, gemv_gemm)
            launch(gemv_gemm, [x.contiguous(), w, s], [y], dtypes=["", "uint32", "", ""])
            return y
        if fp8_name is None:
            raise LookupError("no FP8 blockwise GEMM registered (chapter 08)")
        if not isinstance(x, Quantized):
            if group_quant is None:
                raise LookupError("no per_group_fp8 version registered (chapter 03)")
            t_, k = x.shape
            q = torch.empty(t_, k, dtype=torch.float8_e4m3fn, device=x.device)
            s = torch.empty(k // FP8_BLOCK, t_, dtype=torch.float32, device=x.device)
            launch(group_quant, [x.contiguous()], [q, s])
            x = Quantized(q, s)
        launch(fp8_name, [x.q, p.weight, x.scales, p.scales], [y])
        return y

    return project


def _has_any(names, roles) -> bool:
    return any(n in names for r in roles for n in WORKBOOK[r])


def workbook_steps(cfg: dl.Config, fmt: str, t: int, names: set[str] | None = None) -> dict:
    """The workbook's kernels for every step (the attention the runner's, not taught here; a
    prompt's torch's, prompt_attention), for a batch of T tokens (the W4A16 kernel depends on T).
    Steps whose versions are not registered raise LookupError when built: `names` (default: the
    registry) decides."""
    fp8 = _check_fmt(fmt) == "fp8"
    names = registered() if names is None else names
    project = _wb_project(t, names)
    quantize = fp8 and _has_any(names, ["norm_fp8"])
    return {
        "attn_norm": _wb_norm(cfg.eps, names, quantize),
        "qkv_proj": project,
        "rope": _wb_rope_cache(cfg, names) if _has_any(names, ["rope_cache"]) else _wb_rope(names),
        "cache_write": _wb_cache(names),
        "attention": _wb_attention(cfg, names),
        "o_proj": project,
        "ffn_norm": _wb_norm(cfg.eps, names, quantize),
        "gate_up_proj": project,
        "act": _wb_act(fp8, names),
        "down_proj": project,
    }


PROMPT_ATTENTION = "torch scaled_dot_product_attention (causal, a prompt)"
IN_ROPE = "(in rope's kernel: qkv_rope_cache)"


def workbook_owner(fmt: str, t: int, names: set[str] | None = None, prompt: bool = False) -> dict[str, str]:
    """Step -> the registered version(s) its workbook function calls ("" for torch's); `prompt`:
    the batch is a prompt (Meta.prompt), whose attention is torch's (prompt_attention)."""
    names = registered() if names is None else names
    owner = {s: "" for s in STEP_NAMES}

    def maybe(role):
        try:
            return pick(role, names)
        except LookupError:
            return "(not registered)"

    norm = maybe("norm")
    owner.update(attn_norm=norm, ffn_norm=norm, rope=maybe("rope"), cache_write=maybe("cache"),
                 act=maybe("act_fp8" if fmt == "fp8" else "act"))
    if _has_any(names, ["rope_cache"]):
        owner.update(rope=maybe("rope_cache"), cache_write=IN_ROPE)
    if fmt == "w4a16":
        try:
            gemm = w4a16_kernel(t, names)
        except LookupError:
            gemm = "(not registered)"
    elif fmt == "fp8":
        gemm = maybe("fp8_gemm")
    else:
        gemm = "cuBLAS (torch @)"
    for s in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        owner[s] = gemm
    if fmt == "fp8":  # a BF16 input quantized first; down_proj's comes quantized from act
        fused_norm = _has_any(names, ["norm_fp8"])  # qkv_proj's, gate_up_proj's from the norms
        if fused_norm:
            owner.update(attn_norm=maybe("norm_fp8"), ffn_norm=maybe("norm_fp8"))
        for s in ("o_proj",) if fused_norm else ("qkv_proj", "o_proj", "gate_up_proj"):
            owner[s] = maybe("group_quant") + " + " + gemm
    owner["attention"] = PROMPT_ATTENTION if prompt else maybe("attention") + " (not a lesson)"
    return owner


# ---------------------------------------------------------------------------------------------
# 4. Production kernels (vLLM through lkw.peers), where they import


def production_steps(cfg: dl.Config, fmt: str) -> tuple[dict, dict[str, str]]:
    """(steps, step -> what runs) with vLLM's norm, RoPE, cache, SiLU (+ per-block FP8 quant),
    Marlin W4A16 and CUTLASS blockwise FP8 GEMMs; the attention is the workbook layer's (the
    runner's, where chapter 11 is built; torch SDPA otherwise). Raises lkw.peers.Absent when vLLM
    is not here. In-place kernels get copies of their inputs (vLLM's fused_add_rms_norm updates x
    and residual): one copy of each [T, d] per norm; but RoPE and the cache write take qkv's
    slices as they are (rotary_embedding rotates them in place, reshape_and_cache reads them
    strided), as vLLM's model code runs them."""
    torch = _torch()
    from lkw import peers

    v = peers.library("vllm")
    ops, cache_ops = v.ops, v.cache_ops
    fp8 = _check_fmt(fmt) == "fp8"
    eps = cfg.eps
    what = {s: "" for s in STEP_NAMES}

    # FP8: vLLM's norm that writes 1 x 128 group codes and scales ([d/128, T]) for the GEMM after
    # it, as the workbook's FP8 norm does, where the kit's vLLM has it.
    norm_quant = getattr(ops, "rms_norm_per_block_quant", None) if fp8 else None
    # and o_proj's input through vLLM's group quant (its scales handed over as a column-major
    # [T, K/128] view of [K/128, T], the layout it then writes), else torch ops
    group_quant = getattr(ops, "per_token_group_fp8_quant", None) if fp8 else None

    def quantize(x) -> Quantized:
        if group_quant is None:
            return Quantized(*quant_per_group(x))
        t, k = x.shape
        q = torch.empty(t, k, dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty(k // FP8_BLOCK, t, dtype=torch.float32, device=x.device)
        group_quant(x.contiguous(), q, s.t(), FP8_BLOCK, peers.GROUP_EPS, -E4M3_MAX, E4M3_MAX,
                    False, False, False)
        return Quantized(q, s)

    def norm(x, res, w):
        r = res.clone()
        if norm_quant is not None:  # r <- x + res in place; x is only read
            t, d = x.shape
            q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=x.device)
            s = torch.empty(d // FP8_BLOCK, t, dtype=torch.float32, device=x.device)
            norm_quant(q, x.contiguous(), w, s, eps, None, r, FP8_BLOCK, True)
            return Quantized(q, s), r
        y = x.clone()
        ops.fused_add_rms_norm(y, r, w, eps)
        return y, r

    def rope(positions, q, k, cos_sin):
        # In place on qkv's query and key heads, strided views, as vLLM's attention layer calls it
        # (chapter 05's bench checks that path against the reference).
        ops.rotary_embedding(positions, q, k, q.shape[-1], cos_sin, True)
        return q, k

    one = {}

    def cache_write(k, vv, cache: KVCache, slots):
        s = one.setdefault(k.device, torch.ones(1, dtype=torch.float32, device=k.device))
        cache_ops.reshape_and_cache(k, vv, cache.key, cache.value, slots, "auto", s, s)

    def act(gu):
        t, d = gu.shape[0], gu.shape[1] // 2
        if fp8:
            q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=gu.device)
            s = torch.empty(d // FP8_BLOCK, t, dtype=torch.float32, device=gu.device)
            ops.silu_and_mul_per_block_quant(q, gu, s, FP8_BLOCK, None, True)
            return Quantized(q, s)
        y = torch.empty(t, d, dtype=gu.dtype, device=gu.device)
        ops.silu_and_mul(y, gu)
        return y

    def marlin(p: Proj):
        def make():
            gptq = p.weight.t().contiguous()  # natural words transposed = GPTQ's qweight
            packed = ops.gptq_marlin_repack(gptq, p.k, p.n, 4)
            s = peers.marlin_permute_scales(torch, p.scales.contiguous(), p.k, p.n, p.group)
            sms = torch.cuda.get_device_properties(p.weight.device).multi_processor_count
            ws = torch.zeros(sms * 4, dtype=torch.int32, device=p.weight.device)
            return packed, s, ws

        return p.derived("marlin", make)

    def project(x, p: Proj):
        if p.fmt == "bf16":
            return x @ p.weight.t()
        if p.fmt == "w4a16":
            packed, s, ws = marlin(p)
            m = x.shape[0]
            return ops.marlin_gemm(x.contiguous(), None, packed, None, s, None, None, ws,
                                   v.scalar_types.uint4b8.id, m, p.n, p.k, False, True, False)
        if not isinstance(x, Quantized):
            x = quantize(x)
        out = torch.empty(x.q.shape[0], p.n, dtype=torch.bfloat16, device=x.q.device)
        ops.cutlass_scaled_mm(out, x.q, p.weight.t(), x.scales.t(), p.scales.t(), None)
        return out

    try:  # the workbook layer's attention, so that the layers differ by the taught kernels only
        names = registered()
        attention = _wb_attention(cfg, names)
        attention_name = pick("attention", names) + " (the workbook layer's)"
    except (ImportError, LookupError):
        attention, attention_name = sdpa_attention(cfg), "torch scaled_dot_product_attention"
    steps = {
        "attn_norm": norm, "qkv_proj": project, "rope": rope, "cache_write": cache_write,
        "attention": attention, "o_proj": project, "ffn_norm": norm,
        "gate_up_proj": project, "act": act, "down_proj": project,
    }
    norm_name = ("vllm rms_norm_per_block_quant" if norm_quant is not None
                 else "vllm fused_add_rms_norm")
    quant_name = ("vllm per_token_group_fp8_quant + " if group_quant is not None
                  else "torch per-group quant + ")
    gemm = {"bf16": "cuBLAS (torch @)", "w4a16": "vllm marlin_gemm",
            "fp8": "vllm cutlass_scaled_mm (blockwise)"}[fmt]
    quant_gemm = quant_name + gemm
    what.update(attn_norm=norm_name, ffn_norm=norm_name, rope="vllm rotary_embedding",
                cache_write="vllm reshape_and_cache",
                act="vllm silu_and_mul_per_block_quant" if fp8 else "vllm silu_and_mul",
                down_proj=gemm,
                o_proj=quant_gemm if fp8 else gemm,
                qkv_proj=quant_gemm if fp8 and norm_quant is None else gemm,
                gate_up_proj=quant_gemm if fp8 and norm_quant is None else gemm,
                attention=attention_name + "; a prompt: " + PROMPT_ATTENTION)
    return steps, what


# ---------------------------------------------------------------------------------------------
# The 4-layer stack and its greedy decode


VOCAB = 512
PROMPT = (1, 17, 42, 99, 7, 256, 3, 400, 12, 77, 5, 310, 64, 128, 9, 501)  # 16 fixed token ids


@dataclass
class Stack:
    cfg: dl.Config
    fmt: str
    layers: list[LayerWeights]
    embed: object  # BF16 [V, d]
    final_norm: object  # BF16 [d]
    lm_head: object  # BF16 [V, d]
    caches: list[KVCache] = field(default_factory=list)


def make_stack(cfg: dl.Config, fmt: str, device, n_layers: int = 4, seed: int = 0,
               vocab: int = VOCAB) -> Stack:
    """n_layers layers of lkw.decoder_layer's seeded weights (layer i: seed + i), a seeded
    embedding of N(0, 1) rows and an LM head of N(0, 1/d) rows (BF16), a final norm of ones."""
    torch = _torch()
    layers = [layer_weights(cfg, fmt, device, seed + i) for i in range(n_layers)]
    rng = np.random.default_rng(seed + 1000)
    embed = from_bits(formats.f32_to_bf16(rng.standard_normal((vocab, cfg.d)).astype(np.float32)), device)
    head = rng.standard_normal((vocab, cfg.d)) / np.sqrt(cfg.d)
    lm_head = from_bits(formats.f32_to_bf16(head.astype(np.float32)), device)
    return Stack(cfg, fmt, layers, embed, torch.ones(cfg.d, dtype=torch.bfloat16, device=device), lm_head)


def logits(stack: Stack, out, residual):
    """The last layer's (out, r2) -> float64 logits [T, V]: the final residual add and RMSNorm
    (the reference's), then the LM head in float64. The same function for every run."""
    y, _ = _ref_norm(stack.cfg.eps)(out, residual, stack.final_norm)
    return y.double() @ stack.lm_head.double().t()


def greedy_decode(stack: Stack, steps_for: Callable[[int], dict], prompt=PROMPT, new_tokens: int = 32,
                  forced=None):
    """Prefill the prompt (one sequence), then decode `new_tokens` tokens greedily, one at a time;
    steps_for(T) gives the steps for a batch of T tokens. Returns (token ids, top-2 logit margins
    of each step, the logits [steps, V] float64). With `forced` (token ids), step i feeds forced[i] to the next step instead of
    its own choice (teacher forcing: every step sees the same context as the run that made them),
    and still returns its own choices."""
    torch = _torch()
    cfg, device = stack.cfg, stack.embed.device
    capacity = len(prompt) + new_tokens
    tables = block_tables(1, capacity, seed=7)
    caches = [new_cache(cfg, tables.size, device) for _ in stack.layers]
    cos_sin = rope_cache(cfg, capacity, device)
    ids = torch.tensor(prompt, dtype=torch.int64, device=device)
    meta = make_meta(np.arange(len(prompt)), tables, len(prompt), device)
    tokens, margins, all_logits = [], [], []
    for step in range(new_tokens):
        x = stack.embed[ids]
        res = torch.zeros_like(x)
        steps = steps_for(x.shape[0])
        for w, cache in zip(stack.layers, caches, strict=True):
            x, res = forward(steps, cfg, w, x, res, meta, cache, cos_sin)
        lg = logits(stack, x[-1:], res[-1:])[0]
        all_logits.append(lg)
        top = torch.topk(lg, 2).values
        margins.append(float(top[0] - top[1]))
        nxt = int(torch.argmax(lg))
        tokens.append(nxt)
        fed = nxt if forced is None else int(forced[step])
        ids = torch.tensor([fed], dtype=torch.int64, device=device)
        meta = make_meta([len(prompt) + step], tables, 1, device)
    return tokens, margins, torch.stack(all_logits)
