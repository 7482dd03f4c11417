"""Chapter 11 reference: one Llama-3-8B decoder layer composed of the workbook's references.

Each step calls the reference of the chapter that owns the kernel; only attention is written here.
Tensors are BF16 bits (uint16). The steps, their owners and where they round:

  1  attn_norm    rmsnorm.fused_add_rmsnorm (04)  r1 = bf16(x + residual); the norm reads r1 (not
                                                  the FP32 sum): z = bf16(fp32(r1 * rstd)),
                                                  xn = bf16(z * w), rstd one FP32 per row
  2  qkv_proj     gemm (00 BF16 / 06-07 W4A16)    qkv = bf16(xn . W^T), float64 sums, one rounding;
                                                  W4A16: W = W_hat = s * (q - 8) exact (w4a16)
  3  rope         elementwise.rope (05), NEOX     q', k' = bf16(x c - y s), bf16(y c + x s) from
                                                  the FP32 cos_sin_cache (theta 500000, no Llama-3.1
                                                  frequency scaling: Llama-3-8B has none)
  4  cache_write  elementwise.reshape_and_cache   exact copy of k', v into a BF16 cache at the
                  (05)                            token's slot (paged or contiguous)
  5  attention    NOT a workbook kernel           plain float64 causal GQA over the cache: query
                  (torch SDPA / a carried kernel) head h reads KV head h // (Hq / Hkv), keys at
                                                  positions <= the query's, softmax and P . V in
                                                  float64, o rounded ONCE to BF16 (a flash kernel
                                                  also rounds P to BF16; its tolerance covers it)
  6  o_proj       gemm                            bf16(o . Wo^T)
  7  ffn_norm     rmsnorm.fused_add_rmsnorm (04)  r2 = bf16(attn_out + r1), then as step 1
  8  gate_up_proj gemm                            bf16(xn2 . Wgu^T), gate FIRST (w13 = w1 || w3)
  9  act          elementwise.silu_and_mul (05)   bf16(silu(g) * u) in float64, silu(g) unrounded
 10  down_proj    gemm                            out = bf16(a . Wd^T)

The layer returns (out, r2), vLLM's convention: the last residual add is the next layer's step 1
(fused_add_rmsnorm(out, r2)); ``hidden`` is that add alone, bf16(out + r2), for a last layer.
Layouts: wqkv [(Hq + 2 Hkv) D, d] rows q | k | v; wgu [2 d_ff, d] rows gate | up. W4A16 weights
are chapter 07's natural words [N, K/8] with group-major scales [K/G, N] (G = 128); chapter 06's
GEMV computes the same numbers (scales transposed), the kernel switch is at T = 16.
FP8 W8A8 (chapter 08's blockwise product): weights E4M3 [N, K] with FP32 scales per 128 x 128
block [ceil(N/128), K/128] (lkw.fp8_gemm.per_block_fp8, offline); every GEMM's BF16 input is
quantized per 1 x 128 group (chapter 03's per_group_fp8, scales [K/128, T]) and multiplied with
fp8_gemm_blockwise, rounded once to BF16. The rounding points are the kernels': chapter 04's
fused_add_rmsnorm_fp8_group is exactly per_group_fp8 of the BF16 y the norm would write, and chapter
05's silu_and_mul_fp8_per_group exactly per_group_fp8(silu_and_mul(gu)); the attention writes BF16
o, which chapter 03's kernel quantizes. An FP8 KV cache is not composed here.

``layer`` takes ``replace={step name: function}``: the chapter swaps in one kernel at a time, and
the tests swap in mutants. ``trace`` (returned) holds every step's outputs by name, in order, so
two runs are compared step by step and the first difference is named (``first_difference``).

Byte/FLOP models (``step_models``): per kernel, each input read once and each output written once
(BF16 activations; weights BF16 or INT4 + BF16 scales; the KV cache read by attention for the
whole context and written by cache_write for the new tokens). ``layer_bound`` is the fused layer's
minimum: weights + KV read and written + the layer's own inputs and outputs.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from lkw import (
    bench,
    elementwise,
    formats,
    fp8_gemm,
    gemv,
    golden,
    int4,
    quant,
    rmsnorm,
    roofline,
    w4a16,
)
from lkw.formats import f64_to_bf16

FORMATS = ("bf16", "w4a16", "fp8")
GROUP = 128  # W4A16 group size of the issue
GEMV_MAX_T = 16  # the W4A16 kernel switch: chapter 06's GEMV at T <= 16, chapter 07's GEMM above
GROUP_SCALES_MAX_T = 64  # chapter 07's v8 (decode tiles) at 16 < T <= 64, its v9 above


class Config(NamedTuple):
    d: int  # hidden size
    hq: int  # query heads
    hkv: int  # KV heads
    head_dim: int
    d_ff: int
    theta: float = 500000.0
    eps: float = 1e-5

    @property
    def group(self) -> int:  # query heads per KV head
        return self.hq // self.hkv

    @property
    def qkv_n(self) -> int:
        return (self.hq + 2 * self.hkv) * self.head_dim


LLAMA3_8B = Config(d=4096, hq=32, hkv=8, head_dim=128, d_ff=14336)
# Llama-3-8B's ratios (d = Hq D, Hq / Hkv = 4, d_ff = 3.5 d) at test size; every K a multiple
# of 128 (the W4A16 group).
TINY = Config(d=256, hq=8, hkv=2, head_dim=32, d_ff=896)
# The C++ runner's golden cases (lkw.golden): smaller still, so the golden files stay small; GQA
# with two KV heads, every K a multiple of 128, d_ff = 3 d (the full layer is the bench's job).
GOLDEN = Config(d=128, hq=4, hkv=2, head_dim=32, d_ff=384)


class Linear(NamedTuple):
    """A projection's weights: BF16 bits [N, K] ("bf16"), natural INT4 words [N, K/8] with
    BF16 scales [K/G, N] ("w4a16"), or E4M3 bits [N, K] with FP32 block scales [ceil(N/128),
    K/128] ("fp8")."""

    fmt: str
    weight: np.ndarray
    scales: np.ndarray | None = None


class Weights(NamedTuple):
    norm1: np.ndarray  # BF16 [d]
    qkv: Linear  # [(Hq + 2 Hkv) D, d]
    o: Linear  # [d, Hq D]
    norm2: np.ndarray  # BF16 [d]
    gate_up: Linear  # [2 d_ff, d]
    down: Linear  # [d, d_ff]


def w_exact(lin: Linear) -> np.ndarray:
    """The weights the product uses, float64 [N, K], exact (W_hat for W4A16, never rounded)."""
    if lin.fmt == "bf16":
        return formats.bf16_to_f32(lin.weight).astype(np.float64)
    if lin.fmt == "w4a16":
        return w4a16.w_hat(lin.weight, lin.scales)
    if lin.fmt == "fp8":
        n, k = lin.weight.shape
        per_element = np.repeat(np.repeat(lin.scales, fp8_gemm.BLOCK_N, 0)[:n], fp8_gemm.BLOCK_K, 1)
        return int4.e4m3_values(lin.weight) * per_element.astype(np.float64)
    raise ValueError(f"weight format must be one of {FORMATS}, got {lin.fmt!r}")


def project(x: np.ndarray, lin: Linear) -> np.ndarray:
    """y = bf16(x . W^T): chapter 00's BF16 GEMM reference or chapter 06/07's W4A16 one; FP8:
    x quantized per 1 x 128 group (chapter 03), then chapter 08's blockwise product."""
    if lin.fmt == "bf16":
        return roofline.gemm_bf16(x, lin.weight)
    if lin.fmt == "w4a16":
        return w4a16.w4a16_gemm(x, lin.weight, lin.scales)
    if lin.fmt == "fp8":
        xq, xs = quant.per_group_fp8(x)  # (T,K) codes, (K/128,T) scales
        return fp8_gemm.fp8_gemm_blockwise(xq, lin.weight, xs, lin.scales)
    raise ValueError(f"weight format must be one of {FORMATS}, got {lin.fmt!r}")


# ---------------------------------------------------------------------------------------------
# The KV cache of one sequence: a block table maps position p to slot table[p // bs] * bs + p % bs


@dataclass
class KVCache:
    layout: str  # elementwise.LAYOUTS: "paged" (vLLM), "nhd", "hnd"
    key: np.ndarray
    value: np.ndarray
    block_table: np.ndarray  # int64 [blocks of this sequence]
    block_size: int

    def slots(self, positions) -> np.ndarray:
        p = np.asarray(positions, np.int64)
        if np.any(p < 0) or np.any(p >= self.block_table.size * self.block_size):
            last = self.block_table.size * self.block_size - 1
            raise ValueError(f"positions must lie in 0..{last}")
        return self.block_table[p // self.block_size] * self.block_size + p % self.block_size


def new_cache(cfg: Config, max_len: int, layout: str = "paged", block_size: int = 16, rng=None):
    """An empty (poisoned: NaN codes) BF16 cache for max_len positions. "contiguous" is one nhd
    block of max_len rows; otherwise blocks of block_size, their table shuffled when rng is given
    (so a position's slot is not its index) with one spare block nobody uses."""
    if layout == "contiguous":
        key, value = elementwise.poisoned_caches(
            "nhd", 1, max_len, cfg.hkv, cfg.head_dim, "bfloat16"
        )
        return KVCache("nhd", key, value, np.zeros(1, np.int64), max_len)
    blocks = -(-max_len // block_size)
    key, value = elementwise.poisoned_caches(
        layout, blocks + 1, block_size, cfg.hkv, cfg.head_dim, "bfloat16"
    )
    order = np.arange(blocks + 1) if rng is None else rng.permutation(blocks + 1)
    return KVCache(layout, key, value, order[:blocks].astype(np.int64), block_size)


def cache_write(k, v, cache: KVCache, positions) -> KVCache:
    """Step 4: elementwise.reshape_and_cache of k, v [T, Hkv, D] at the positions' slots."""
    key, value = elementwise.reshape_and_cache(
        k, v, cache.key, cache.value, cache.slots(positions), cache.layout
    )
    return KVCache(cache.layout, key, value, cache.block_table, cache.block_size)


def attention(q, cache: KVCache, positions, hkv: int) -> np.ndarray:
    """Step 5 (not a workbook kernel): q [T, Hq, D] BF16, the context read back from the cache at
    positions 0..max(positions) -> o BF16 [T, Hq D]. float64 throughout, one rounding at the end."""
    q64 = formats.bf16_to_f32(q).astype(np.float64)  # (T,Hq,D)
    t, hq, d = q64.shape
    pos = np.asarray(positions, np.int64)
    ctx = np.arange(int(pos.max()) + 1)
    k_bits, v_bits = elementwise.gather_cache(
        cache.key, cache.value, cache.slots(ctx), cache.layout, d
    )  # (L,Hkv,D) each
    kv_head = np.arange(hq) // (hq // hkv)  # GQA: query head h reads KV head h // group
    k64 = formats.bf16_to_f32(k_bits).astype(np.float64)[:, kv_head]  # (L,Hq,D)
    v64 = formats.bf16_to_f32(v_bits).astype(np.float64)[:, kv_head]  # (L,Hq,D)
    scores = np.einsum("thd,lhd->htl", q64, k64) / np.sqrt(d)  # (Hq,T,L)
    scores = np.where(ctx[None, None, :] <= pos[None, :, None], scores, -np.inf)  # causal
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return f64_to_bf16(np.einsum("htl,lhd->thd", p, v64).reshape(t, hq * d))


def hidden(out, residual) -> np.ndarray:
    """The last residual add, bf16(out + residual): step 1 of the next layer, fused there."""
    return rmsnorm.add_residual(out, residual)


# ---------------------------------------------------------------------------------------------
# The composition


def default_steps(cfg: Config) -> dict:
    """Step name -> function, in layer order; ``layer(replace=...)`` swaps any of them."""
    return {
        "attn_norm": lambda x, res, w: rmsnorm.fused_add_rmsnorm(x, res, w, cfg.eps),
        "qkv_proj": project,
        "rope": lambda pos, q, k, cos_sin: elementwise.rope(pos, q, k, cos_sin, is_neox=True),
        "cache_write": cache_write,
        "attention": lambda q, cache, pos: attention(q, cache, pos, cfg.hkv),
        "o_proj": project,
        "ffn_norm": lambda x, res, w: rmsnorm.fused_add_rmsnorm(x, res, w, cfg.eps),
        "gate_up_proj": project,
        "act": elementwise.silu_and_mul,
        "down_proj": project,
    }


STEP_NAMES = tuple(default_steps(TINY))


@dataclass
class Result:
    out: np.ndarray  # BF16 [T, d], the down projection
    residual: np.ndarray  # BF16 [T, d], r2
    cache: KVCache
    trace: dict = field(default_factory=dict)  # step name -> output(s), in order


def layer(cfg: Config, w: Weights, x, residual, positions, cache: KVCache, cos_sin, replace=None):
    """One decoder layer over T new tokens of one sequence at `positions` (prefill: 0..T-1;
    decode: T = 1 after the earlier tokens are in `cache`). cos_sin: rope_cache(cfg, max_pos)."""
    s = default_steps(cfg) | dict(replace or {})
    unknown = set(s) - set(STEP_NAMES)
    if unknown:
        raise ValueError(f"unknown steps {sorted(unknown)}; the steps are {STEP_NAMES}")
    t, hd = np.asarray(x).shape[0], cfg.head_dim
    tr = {}
    tr["attn_norm"] = xn, r1 = s["attn_norm"](x, residual, w.norm1)
    tr["qkv_proj"] = qkv = s["qkv_proj"](xn, w.qkv)  # (T,(Hq+2Hkv)D)
    q = qkv[:, : cfg.hq * hd].reshape(t, cfg.hq, hd)
    k = qkv[:, cfg.hq * hd : (cfg.hq + cfg.hkv) * hd].reshape(t, cfg.hkv, hd)
    v = qkv[:, (cfg.hq + cfg.hkv) * hd :].reshape(t, cfg.hkv, hd)
    tr["rope"] = q, k = s["rope"](positions, q, k, cos_sin)
    cache = s["cache_write"](k, v, cache, positions)
    # what the cache holds at the new tokens' slots, read back (independent of the block table)
    tr["cache_write"] = elementwise.gather_cache(
        cache.key, cache.value, cache.slots(positions), cache.layout, hd
    )
    tr["attention"] = o = s["attention"](q, cache, positions)  # (T,Hq D)
    tr["o_proj"] = attn_out = s["o_proj"](o, w.o)
    tr["ffn_norm"] = xn2, r2 = s["ffn_norm"](attn_out, r1, w.norm2)
    tr["gate_up_proj"] = gu = s["gate_up_proj"](xn2, w.gate_up)  # (T,2 d_ff)
    tr["act"] = a = s["act"](gu)
    tr["down_proj"] = out = s["down_proj"](a, w.down)
    return Result(out, r2, cache, tr)


def first_difference(got: dict, want: dict) -> str | None:
    """The first step (layer order) whose outputs differ in any bit, or None."""
    for name in STEP_NAMES:
        a, b = got[name], want[name]
        a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
        if any(not np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(a, b, strict=True)):
            return name
    return None


def rope_cache(cfg: Config, max_pos: int) -> np.ndarray:
    """elementwise.cos_sin_cache over the whole head (rot_dim = D) with base theta."""
    return elementwise.cos_sin_cache(max_pos, cfg.head_dim, cfg.theta)


# ---------------------------------------------------------------------------------------------
# Generators: seeded random weights at Llama-like scales (unit-variance projections)


def _bf16_linear(rng, n: int, k: int) -> Linear:
    return Linear("bf16", formats.f32_to_bf16(rng.standard_normal((n, k)) / np.sqrt(k)))


def _w4a16_linear(rng, n: int, k: int, group: int = GROUP) -> Linear:
    """Random 4-bit codes and BF16 scales with s * (q - 8) of variance ~1/K (std(q - 8) ~ 4.6),
    each group's scale times 2^u, u in [-0.5, 0.5]."""
    q = rng.integers(0, 16, (n, k))
    s = np.exp2(rng.uniform(-0.5, 0.5, (k // group, n))) / (4.6 * np.sqrt(k))  # (K/G,N)
    return Linear("w4a16", int4.pack(q), formats.f32_to_bf16(s.astype(np.float32)))


def _fp8_linear(rng, n: int, k: int) -> Linear:
    """The BF16 weights of _bf16_linear quantized offline per 128 x 128 block (chapter 08)."""
    codes, scales = fp8_gemm.per_block_fp8(_bf16_linear(rng, n, k).weight)
    return Linear("fp8", codes, scales)


def random_weights(rng, cfg: Config, fmt: str = "bf16") -> Weights:
    if fmt not in FORMATS:
        raise ValueError(f"weight format must be one of {FORMATS}, got {fmt!r}")
    lin = {"bf16": _bf16_linear, "w4a16": _w4a16_linear, "fp8": _fp8_linear}[fmt]

    def norm():  # RMSNorm weights around 1, as trained ones are
        return formats.f32_to_bf16(rng.uniform(0.5, 1.5, cfg.d).astype(np.float32))

    return Weights(
        norm(),
        lin(rng, cfg.qkv_n, cfg.d),
        lin(rng, cfg.d, cfg.hq * cfg.head_dim),
        norm(),
        lin(rng, 2 * cfg.d_ff, cfg.d),
        lin(rng, cfg.d, cfg.d_ff),
    )


def random_inputs(rng, cfg: Config, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, residual) BF16 [T, d]: rows of N(0, 1) times 2^u, u in [-2, 2] (lkw.golden)."""
    return golden.activations(rng, t, cfg.d, 2.0), golden.activations(rng, t, cfg.d, 2.0)


# ---------------------------------------------------------------------------------------------
# steps(): the kernels in order with the chapter that owns each


class Step(NamedTuple):
    name: str
    kernel: str  # the reference function (lkw.<module>.<function>)
    chapter: str  # the chapter whose versions replace it; "" for attention (not taught here)


def steps(fmt: str = "bf16", t: int = 1) -> list[Step]:
    """The layer's ten steps in order. W4A16 GEMMs belong to chapter 06 (GEMV) at T <= 16 and to
    chapter 07 above; BF16 GEMMs are cuBLAS, measured by chapter 00's peer; FP8 GEMMs are chapter
    08's blockwise product, each with the group quant of its input (fused into the norms and act;
    chapter 03's kernel for o_proj's)."""
    if fmt == "bf16":
        gemm = Step("", "roofline.gemm_bf16", "00_roofline")
    elif fmt == "fp8":
        gemm = Step("", "fp8_gemm.fp8_gemm_blockwise", "08_fp8_gemm")
    elif fmt == "w4a16":
        small = t <= GEMV_MAX_T
        gemm = Step(
            "",
            "gemv.int4_gemv" if small else "w4a16.w4a16_gemm",
            "06_int4_gemv" if small else "07_w4a16_gemm",
        )
    else:
        raise ValueError(f"weight format must be one of {FORMATS}, got {fmt!r}")
    norm = Step("", "rmsnorm.fused_add_rmsnorm" + ("_fp8_group" if fmt == "fp8" else ""),
                "04_rmsnorm")
    return [
        norm._replace(name="attn_norm"),
        gemm._replace(name="qkv_proj"),
        Step("rope", "elementwise.rope", "05_elementwise"),
        Step("cache_write", "elementwise.reshape_and_cache", "05_elementwise"),
        Step("attention", "decoder_layer.attention", ""),
        gemm._replace(name="o_proj"),
        norm._replace(name="ffn_norm"),
        gemm._replace(name="gate_up_proj"),
        Step("act", "elementwise.silu_and_mul", "05_elementwise"),
        gemm._replace(name="down_proj"),
    ]


# ---------------------------------------------------------------------------------------------
# Byte and FLOP models of one step of the layer (one sequence, BF16 activations and KV cache)

BF16 = 2
KV_BYTES = BF16


class Cost(NamedTuple):
    name: str
    chapter: str
    bytes: int  # total: weights + activations + KV, each read or written once
    flops: int
    weight_bytes: int
    kv_bytes: int  # KV cache read (attention) or written (cache_write)


def weight_bytes(n: int, k: int, fmt: str, group: int = GROUP) -> int:
    """BF16: 2 B per weight; W4A16: 0.5 B per weight + one BF16 scale per group; FP8: 1 B per
    weight + one FP32 scale per 128 x 128 block."""
    if fmt == "fp8":
        return n * k + 4 * -(-n // fp8_gemm.BLOCK_N) * (k // fp8_gemm.BLOCK_K)
    return n * k * BF16 if fmt == "bf16" else n * k // 2 + n * (k // group) * BF16


def gemm_cost(name, chapter, t, n, k, fmt) -> Cost:
    wb = weight_bytes(n, k, fmt)
    # x read (FP8: its codes and group scales, as the GEMM reads them), y written
    x_bytes = t * k + 4 * t * (k // fp8_gemm.BLOCK_K) if fmt == "fp8" else t * k * BF16
    total = wb + x_bytes + t * n * BF16
    if fmt == "w4a16":
        assert (total, 2 * t * n * k) == bench.w4a16_model(t, n, k, GROUP)  # chapter 07's model
    return Cost(name, chapter, total, 2 * t * n * k, wb, 0)


def attention_pairs(t: int, context: int) -> int:
    """(query, key) pairs a causal pass computes: new tokens at positions context-T..context-1."""
    return t * (context - t) + t * (t + 1) // 2


def step_models(cfg: Config, t: int, context: int, fmt: str = "bf16") -> list[Cost]:
    """Costs of the ten steps for T new tokens with `context` tokens in the cache after the step
    (decode: T = 1, context = KV length; prefill: T = context)."""
    if not 1 <= t <= context:
        raise ValueError(f"need 1 <= T <= context, got T = {t}, context = {context}")
    d, hq, hkv, hd, dff = cfg.d, cfg.hq, cfg.hkv, cfg.head_dim, cfg.d_ff
    owner = {s.name: s.chapter for s in steps(fmt, t)}
    # fused add + RMSNorm: x, residual read, y, residual_out written (8 B per element), weight read;
    # FP8: y's group codes (1 B) and scales (4 B per 128) in y's place; FLOPs: add,
    # square-accumulate, scale, weight multiply (4 per element)
    y_bytes = t * d + 4 * t * (d // fp8_gemm.BLOCK_K) if fmt == "fp8" else t * d * BF16
    norm_bytes, norm_flops = 6 * t * d + y_bytes + BF16 * d, 4 * t * d
    kv_read = context * hkv * hd * 2 * KV_BYTES  # K and V of every context token, once
    kv_written = t * hkv * hd * 2 * KV_BYTES
    pairs = attention_pairs(t, context)
    return [
        Cost("attn_norm", owner["attn_norm"], norm_bytes, norm_flops, BF16 * d, 0),
        gemm_cost("qkv_proj", owner["qkv_proj"], t, cfg.qkv_n, d, fmt),
        # 3 FLOPs per rotated output element (x c - y s)
        Cost(
            "rope",
            owner["rope"],
            elementwise.rope_bytes(t, hq, hkv, hd),
            3 * t * (hq + hkv) * hd,
            0,
            0,
        ),
        Cost(
            "cache_write",
            owner["cache_write"],
            elementwise.reshape_and_cache_bytes(t, hkv, hd, "bfloat16"),
            0,
            0,
            kv_written,
        ),
        # q read, o written, the context's K and V read; QK^T and PV: 4 D FLOPs per pair and head
        Cost("attention", "", 2 * t * hq * hd * BF16 + kv_read, 4 * hd * hq * pairs, 0, kv_read),
        gemm_cost("o_proj", owner["o_proj"], t, d, hq * hd, fmt),
        Cost("ffn_norm", owner["ffn_norm"], norm_bytes, norm_flops, BF16 * d, 0),
        gemm_cost("gate_up_proj", owner["gate_up_proj"], t, 2 * dff, d, fmt),
        # silu(g) * u: exp, add, divide, multiply (4 FLOPs per output)
        Cost("act", owner["act"], elementwise.act_and_mul_bytes(t, dff), 4 * t * dff, 0, 0),
        gemm_cost("down_proj", owner["down_proj"], t, d, dff, fmt),
    ]


def layer_bound(cfg: Config, t: int, context: int, fmt: str = "bf16") -> tuple[int, int]:
    """(bytes, FLOPs) of the whole layer fused: all weights (norms included) once, the KV cache
    read once and the new tokens' K, V written once, x and residual read, out and r2 written,
    the positions read (int64); FLOPs are the sum of the steps'."""
    costs = step_models(cfg, t, context, fmt)
    weights = sum(c.weight_bytes for c in costs)
    kv = context * cfg.hkv * cfg.head_dim * 2 * KV_BYTES + t * cfg.hkv * cfg.head_dim * 2 * KV_BYTES
    return weights + kv + 4 * t * cfg.d * BF16 + 8 * t, sum(c.flops for c in costs)


def decode_model(fmt: str = "bf16", kv_len: int = 2048, t: int = 1, cfg: Config = LLAMA3_8B):
    """One decode step of the real Llama-3-8B layer (the issue's T = 1, KV length 2048)."""
    return step_models(cfg, t, kv_len, fmt)


def prefill_model(fmt: str = "bf16", t: int = 2048, cfg: Config = LLAMA3_8B):
    """One prefill step of T tokens (the issue's T = 2048) on an empty cache."""
    return step_models(cfg, t, t, fmt)


# ---------------------------------------------------------------------------------------------
# The C++ runner's op (solutions/11_decoder_layer/layer.h says the order; this builds it)


def op_name(fmt: str) -> str:
    """The registered runner of a format: lkw._ext.launch(op_name(fmt), inputs, outputs, ...)."""
    if fmt not in FORMATS:
        raise ValueError(f"weight format must be one of {FORMATS}, got {fmt!r}")
    return f"11_decoder_layer/decoder_layer_{fmt}/v0_runner"


def op_linear(lin: Linear) -> list[np.ndarray]:
    """One projection's tensors as the runner takes them. W4A16: chapter 06's tiled words with
    scales [N, K/G] (its GEMV, T <= 16), then chapter 07's repacked words with scales [K/G, N]
    (its GEMM, T > 16): the same W_hat in the two layouts its two kernels read."""
    if lin.fmt == "bf16":
        return [np.asarray(lin.weight, np.uint16)]
    if lin.fmt == "w4a16":
        words = np.asarray(lin.weight, np.uint32)
        scales = np.asarray(lin.scales, np.uint16)
        return [
            gemv.tile_weights(int4.interleave(words)),
            np.ascontiguousarray(scales.T),
            w4a16.repack(words),
            scales,
        ]
    if lin.fmt == "fp8":
        return [np.asarray(lin.weight, np.uint8), np.asarray(lin.scales, np.float32)]
    raise ValueError(f"weight format must be one of {FORMATS}, got {lin.fmt!r}")


def op_inputs(w: Weights, x, residual, positions, cache: KVCache, cos_sin) -> list[np.ndarray]:
    """The runner's inputs in order: x, residual, positions, slot_mapping, block_table,
    cos_sin_cache, then the weights in path order (norm1, qkv, o, norm2, gate_up, down). Its
    outputs: key_cache, value_cache (updated in place; the "paged" layout), out, residual_out."""
    if cache.layout != "paged":
        raise ValueError(f"the runner's cache is the paged layout, got {cache.layout!r}")
    pos = np.asarray(positions, np.int64)
    weights = [np.asarray(w.norm1, np.uint16), *op_linear(w.qkv), *op_linear(w.o)]
    weights += [np.asarray(w.norm2, np.uint16), *op_linear(w.gate_up), *op_linear(w.down)]
    return [
        np.asarray(x, np.uint16),
        np.asarray(residual, np.uint16),
        pos,
        cache.slots(pos),
        np.asarray(cache.block_table, np.int64),
        np.asarray(cos_sin, np.float32),
        *weights,
    ]


def op_weights(fmt: str, tensors) -> Weights:
    """The inverse of op_linear over the weight inputs (norm1, qkv, o, norm2, gate_up, down)."""
    per = {"bf16": 1, "w4a16": 4, "fp8": 2}[fmt]
    it = iter(tensors)

    def linear() -> Linear:
        t = [next(it) for _ in range(per)]
        if fmt == "bf16":
            return Linear("bf16", t[0])
        if fmt == "fp8":
            return Linear("fp8", t[0], t[1])
        scales = np.asarray(t[3], np.uint16)  # (K/G,N)
        k, n = scales.shape[0] * GROUP, scales.shape[1]
        return Linear("w4a16", w4a16.unrepack(t[2], n, k), scales)

    norm1, qkv, o = next(it), linear(), linear()
    norm2, gate_up, down = next(it), linear(), linear()
    return Weights(norm1, qkv, o, norm2, gate_up, down)


def op_reference(fmt: str, *arrays, eps: float):
    """The runner's op on numpy arrays: op_inputs(...) then the caches' contents before the step
    -> (key_cache, value_cache, out, residual_out). slot_mapping must be the slots of the
    positions through the block table (the runner writes where slot_mapping says)."""
    x, residual, positions, slot_mapping, table, cos_sin, *rest = arrays
    key_cache, value_cache = rest[-2:]
    w = op_weights(fmt, rest[:-2])
    hkv, hd, bs = value_cache.shape[1], value_cache.shape[2], value_cache.shape[3]
    n_qkv = w_exact(w.qkv).shape[0] if fmt != "w4a16" else np.asarray(w.qkv.scales).shape[1]
    d_ff = np.asarray(w.down.weight).shape[1] * (8 if fmt == "w4a16" else 1)
    cfg = Config(np.asarray(x).shape[1], n_qkv // hd - 2 * hkv, hkv, hd, d_ff, eps=eps)
    cache = KVCache("paged", np.array(key_cache), np.array(value_cache), np.asarray(table), bs)
    if not np.array_equal(cache.slots(positions), slot_mapping):
        raise ValueError("slot_mapping must be the positions' slots through the block table")
    r = layer(cfg, w, x, residual, positions, cache, cos_sin)
    return r.cache.key, r.cache.value, r.out, r.residual
