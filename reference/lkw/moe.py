"""Chapter 09 reference: the MoE pipeline of a decoder layer, one function per kernel.

    router logits [T, E] -> topk_softmax / deepseek_router -> weights [T, k], ids [T, k]
    ids -> moe_align_block_size -> sorted_token_ids, expert_ids, num_tokens_post_padded
    x [T, d] -> grouped_gemm (W1 = gate || up) -> SiLU(gate) * up -> grouped_gemm (W2)
    -> moe_sum (the k rows of a token, weighted) -> y [T, d]
    (grouped_gemm_w4a16: the same GEMM with INT4 expert weights in chapter 07's layout;
    grouped_gemm_fp8, _silu_fp8, _sum_fp8: the three GEMMs with FP8 operands and chapter 08's
    blockwise scales)

A token's k choices are named by the flat index i = t * k + j of topk_ids (the slot); row i of
every [T * k, ...] intermediate belongs to slot i. The align step is a counting sort of the slots
by expert, each expert's run padded to a multiple of BLOCK_M with the sentinel T * k, so that
every BLOCK_M-row tile of the grouped GEMM reads the weights of exactly one expert.

Arrays are numpy values, not bits: float32, float64 or ml_dtypes.bfloat16 (a golden file's BF16
bits are ``a.view(np.uint16)``). Sums are float64 and rounded once, where the kernels round; the
rounding points are stated in each docstring. What is bit-exact for a kernel: the top-k ids and
the align outputs (the latter as a multiset per expert, see ``canonical_align``).

The last section generates routing distributions (uniform, Zipf, all to one expert) and measures
what they cost the grouped GEMM: padding waste and load imbalance.
"""

import ml_dtypes
import numpy as np

from lkw import fp8_gemm, w4a16
from lkw.formats import f64_to_bf16

FLOAT_DTYPES = (np.float32, np.float64, ml_dtypes.bfloat16)
DEFAULT_BLOCK_M = 64  # the tile moe_layer_reference aligns to; any tile gives the same result
ZIPF_EXPONENT = 1.2  # routing_ids("zipf"): expert e is chosen with weight (e + 1)^-1.2


def _float64(a, name: str, ndim: int) -> np.ndarray:
    """A float32 / float64 / bfloat16 array of `ndim` dimensions as float64 (exact)."""
    a = np.asarray(a)
    if a.dtype not in FLOAT_DTYPES or a.ndim != ndim:
        raise ValueError(
            f"{name} must be a {ndim}-D float32, float64 or bfloat16 array, got {a.dtype} {a.shape}"
        )
    return a.astype(np.float64)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries of each row, largest first; equal entries in
    increasing column order (a stable sort of -scores). -inf entries come last."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


# ---------------------------------------------------------------------------------------------
# Routing


def topk_softmax(logits, k: int, renormalize: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Softmax routing (Mixtral, Qwen-MoE): each token picks its k most probable experts.

    logits: [T, E] float32 or bfloat16. Per row, p = softmax(logits) in float64, rounded once to
    float32; the k largest p in descending order, equal p broken by the LOWER expert id. Ties are
    decided on the float32 p, the value a kernel compares. With `renormalize` the k weights are
    divided by their sum (float64, rounded once to float32), so they sum to 1 within an ulp.

    Returns (weights float32 [T, k], ids int32 [T, k]).
    """
    z = _float64(logits, "logits", 2)  # (T,E)
    if not 1 <= k <= z.shape[1]:
        raise ValueError(f"k must be in 1..E = {z.shape[1]}, got {k}")
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)  # (T,E) the one rounding
    ids = _top_k(p, k)  # (T,k)
    weights = np.take_along_axis(p, ids, axis=1).astype(np.float64)  # (T,k)
    if renormalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return weights.astype(np.float32), ids.astype(np.int32)


def deepseek_router(
    logits,
    bias,
    k: int = 8,
    n_group: int = 8,
    topk_group: int = 4,
    renormalize: bool = True,
    routed_scaling_factor: float = 2.5,
) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V3's grouped sigmoid routing (vLLM's grouped_topk with a correction bias).

    logits [T, E] float32 / bfloat16, bias [E] (the e_score_correction_bias). In float64:
        s      = sigmoid(logits)                                         # (T,E)
        c      = s + bias       the choice scores: the bias steers WHICH experts win, never
                                how much they weigh
        group  = sum of the two largest c of each of the n_group groups of E / n_group
                 consecutive experts                                      # (T,n_group)
        keep the topk_group largest groups (equal group scores: lower group id), set c = -inf
        in the others, and choose the k largest c (equal c: lower expert id)
        w      = s[chosen]  (unbiased), / sum(w) if renormalize, * routed_scaling_factor,
                 rounded once to float32
    Needs E % n_group == 0, at least 2 experts per group, topk_group <= n_group and
    k <= topk_group * E / n_group.

    Returns (weights float32 [T, k], ids int32 [T, k]).
    """
    z = _float64(logits, "logits", 2)  # (T,E)
    t, n_experts = z.shape
    b = _float64(bias, "bias", 1)  # (E,)
    if b.shape != (n_experts,):
        raise ValueError(f"bias must have E = {n_experts} entries, got {b.shape}")
    per_group = n_experts // n_group if n_group > 0 and n_experts % n_group == 0 else 0
    if per_group < 2 or not 1 <= topk_group <= n_group or not 1 <= k <= topk_group * per_group:
        raise ValueError(
            f"E = {n_experts}, n_group = {n_group}, topk_group = {topk_group}, k = {k}: need "
            f"E % n_group == 0, >= 2 experts per group, topk_group <= n_group and "
            f"k <= topk_group * E / n_group"
        )
    s = 1.0 / (1.0 + np.exp(-z))  # (T,E)
    c = s + b  # (T,E)
    grouped = c.reshape(t, n_group, per_group)  # (T,G,E/G)
    group_score = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)  # (T,G)
    kept = _top_k(group_score, topk_group)  # (T,topk_group)
    mask = np.zeros((t, n_group), bool)
    np.put_along_axis(mask, kept, True, axis=1)
    masked = np.where(np.repeat(mask, per_group, axis=1), c, -np.inf)  # (T,E)
    ids = _top_k(masked, k)  # (T,k)
    weights = np.take_along_axis(s, ids, axis=1)  # (T,k)
    if renormalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return (weights * routed_scaling_factor).astype(np.float32), ids.astype(np.int32)


# ---------------------------------------------------------------------------------------------
# moe_align_block_size


def _expert_counts(topk_ids, num_experts: int) -> np.ndarray:
    """Slots per expert [E] (int64); -1 entries are masked slots and count for no expert."""
    ids = np.asarray(topk_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"topk_ids must be an integer array [T, k], got {ids.dtype} {ids.shape}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    bad = ids[(ids < -1) | (ids >= num_experts)]
    if bad.size:
        raise ValueError(
            f"topk_ids holds expert id {int(bad.flat[0])}: ids must be -1 (masked) or in "
            f"0..{num_experts - 1}"
        )
    flat = ids.reshape(-1)
    return np.bincount(flat[flat >= 0], minlength=num_experts)


def _padded(counts: np.ndarray, block_m: int) -> np.ndarray:
    """Each expert's run length: its count rounded up to a multiple of block_m (0 stays 0)."""
    return -(-counts // block_m) * block_m


def capacity(num_slots: int, num_experts: int, block_m: int) -> int:
    """The sorted_token_ids length a caller allocates before knowing the routing (vLLM's
    max_num_tokens_padded, rounded up to block_m): every expert wastes at most block_m - 1 rows,
    so T * k + E * (block_m - 1) always suffices."""
    worst = num_slots + num_experts * (block_m - 1)
    return -(-worst // block_m) * block_m


def moe_align_block_size(topk_ids, num_experts: int, block_m: int):
    """Sort the T * k slots by expert and pad each expert's run to a multiple of block_m.

    topk_ids: [T, k] integers in 0..E-1, or -1 for a masked slot (skipped: it lands in no run);
    anything else raises ValueError naming the id. With S = T * k (also the sentinel value):

        sorted_token_ids  int32 [capacity(S, E, block_m)]: expert 0's run, expert 1's run, ...;
                          expert e's run holds the slots i with topk_ids.flat[i] == e, in
                          increasing i (this reference's order; a kernel's order inside a run is
                          unspecified, compare through canonical_align), then the sentinel S up
                          to a multiple of block_m. An expert with no slots has an empty run.
                          Everything after the runs is the sentinel.
        expert_ids        int32 [capacity // block_m]: the expert of each block_m-row block;
                          -1 for the unused blocks after the runs (the GEMM skips them).
        num_tokens_post_padded  int: the total length of the runs.
    """
    counts = _expert_counts(topk_ids, num_experts)  # (E,)
    if block_m < 1:
        raise ValueError(f"block_m must be >= 1, got {block_m}")
    flat = np.asarray(topk_ids).reshape(-1)
    sentinel = flat.size
    sorted_ids = np.full(capacity(flat.size, num_experts, block_m), sentinel, np.int32)
    expert_ids = np.full(sorted_ids.size // block_m, -1, np.int32)
    start = 0
    for e, run in enumerate(_padded(counts, block_m)):
        sorted_ids[start : start + counts[e]] = np.flatnonzero(flat == e)
        expert_ids[start // block_m : (start + run) // block_m] = e
        start += run
    return sorted_ids, expert_ids, int(start)


def canonical_align(sorted_ids, expert_ids, n_post: int, block_m: int, sentinel: int):
    """sorted_token_ids with each expert's run sorted ascending (the sentinel, the largest value,
    goes last): two aligns of the same routing are equal as multisets per expert iff their
    canonical forms and expert_ids are equal. A run is a maximal stretch of blocks with the same
    expert id in expert_ids[:n_post // block_m]; entries from n_post on are left as given (the
    contract says: sentinel). Returns a new int32 array."""
    out = np.array(sorted_ids, np.int32)
    blocks = np.asarray(expert_ids)
    if n_post % block_m or n_post > out.size or n_post // block_m > blocks.size:
        raise ValueError(f"n_post = {n_post} is no multiple of {block_m} within the buffers")
    if np.any(out[:n_post] > sentinel):
        raise ValueError(f"sorted ids above the sentinel {sentinel}")
    start = 0
    for b in range(1, n_post // block_m + 1):
        if b == n_post // block_m or blocks[b] != blocks[start // block_m]:
            out[start : b * block_m] = np.sort(out[start : b * block_m])
            start = b * block_m
    return out


# ---------------------------------------------------------------------------------------------
# The grouped GEMM, the sum, the layer


def grouped_gemm(x, w, sorted_token_ids, expert_ids, block_m: int, topk: int) -> np.ndarray:
    """What the grouped GEMM computes from an align: out[i] = x[i // topk] . w[e]^T for every slot
    i in expert e's run.

    x [T, d] (row t serves the slots t * topk .. t * topk + topk - 1), w [E, N, d]. Blocks with
    an expert id outside 0..E-1 (-1: no expert) and sorted ids outside 0..T*topk-1 (the sentinel
    T * topk) are skipped, as the kernels skip them. Returns float64 [T * topk, N]; rows of slots
    no run names (masked slots) stay 0.
    """
    x64 = _float64(x, "x", 2)  # (T,d)
    w64 = _float64(w, "w", 3)  # (E,N,d)
    if w64.shape[2] != x64.shape[1]:
        raise ValueError(f"x [T, d] and w [E, N, d] disagree on d: {x64.shape}, {w64.shape}")
    n_slots = x64.shape[0] * topk
    rows = np.asarray(sorted_token_ids)
    out = np.zeros((n_slots, w64.shape[1]))  # (T*k,N)
    for block, e in enumerate(np.asarray(expert_ids)):
        if not 0 <= e < w64.shape[0]:
            continue
        slots = rows[block * block_m : (block + 1) * block_m]  # (BLOCK_M,)
        slots = slots[(slots >= 0) & (slots < n_slots)]
        out[slots] = x64[slots // topk] @ w64[e].T  # (rows,N)
    return out


def grouped_gemm_bf16(x, w, sorted_token_ids, expert_ids, block_m: int, topk: int):
    """The moe_grouped_gemm kernels' output: grouped_gemm (exact sums; the kernels sum in FP32)
    rounded ONCE to bfloat16 [T * topk, N]."""
    out = grouped_gemm(x, w, sorted_token_ids, expert_ids, block_m, topk)  # (T*k,N)
    return f64_to_bf16(out).view(ml_dtypes.bfloat16)


def grouped_gemm_sum_bf16(h, w, sorted_token_ids, expert_ids, topk_weights, block_m: int):
    """The moe_grouped_gemm_sum kernels' output: the down GEMM with moe_sum in its epilogue,
    bfloat16 [T, N] = sum_j topk_weights[t, j] * (h[t * k + j] . w[e]^T), h a row per slot
    [T * k, d]; a slot no run names adds nothing. Exact, rounded ONCE: the kernels add the
    weighted FP32 rows in whatever order their blocks finish, so they are within FP32 error of
    this (lkw.golden.grouped_sum_tolerance), never bit-exact."""
    weights = np.asarray(topk_weights, dtype=np.float64)  # (T,k)
    t, k = weights.shape
    rows = grouped_gemm(h, w, sorted_token_ids, expert_ids, block_m, 1)  # (T*k,N)
    out = np.einsum("tj,tjn->tn", weights, rows.reshape(t, k, -1))
    return f64_to_bf16(out).view(ml_dtypes.bfloat16)


def grouped_gemm_silu_bf16(x, w, sorted_token_ids, expert_ids, block_m: int, topk: int):
    """The moe_grouped_gemm_silu kernels' output: the gate_up GEMM with SiLU-and-mul in its
    epilogue, bfloat16 [T * topk, N / 2] = silu(gate) * up, gate the first N / 2 rows of each
    expert's w (vLLM's w13 = w1 || w3).

    Rounding: gate and up are NOT rounded to bfloat16 (the kernels keep their FP32 sums in
    registers and apply SiLU to them); the product is rounded once. So this differs from the
    unfused chain silu_and_mul(bf16(gate_up)) (lkw.elementwise.silu_and_mul) by up to about an
    ulp: two roundings fewer.
    """
    out = grouped_gemm(x, w, sorted_token_ids, expert_ids, block_m, topk)  # (T*k,N)
    if out.shape[1] % 2:
        raise ValueError(f"w must hold gate || up rows: N = {out.shape[1]} is odd")
    return f64_to_bf16(silu_and_mul(out)).view(ml_dtypes.bfloat16)


def w_hat_experts(w, scales) -> np.ndarray:
    """Every expert's dequantized weights [E, N, K] in float64, exact: W_hat[e] = s * (q - 8)
    (lkw.w4a16.w_hat) of expert e's repacked words w[e] (uint32 [N/64, 8K], unrepacked first)
    and scale bits scales[e] (uint16 [K/G, N]). N comes from the scales, K from the words."""
    words, s = np.asarray(w), np.asarray(scales)
    if words.ndim != 3 or s.ndim != 3 or words.shape[0] != s.shape[0]:
        raise ValueError(
            f"w [E, N/64, 8K] and scales [E, K/G, N] must agree on E: {words.shape}, {s.shape}"
        )
    n, k = s.shape[2], words.shape[2] // 8
    return np.stack([w4a16.w_hat(w4a16.unrepack(words[e], n, k), s[e]) for e in range(s.shape[0])])


def grouped_gemm_w4a16(x, w, scales, sorted_token_ids, expert_ids, block_m: int, topk: int):
    """The moe_grouped_gemm_w4a16 kernels' output: moe_grouped_gemm with INT4 weights, bfloat16
    [T * topk, N]. w uint32 [E, N/64, 8K] (each expert in chapter 07's repacked layout), scales
    BF16 bits uint16 [E, K/G, N]: out[i] = x[i // topk] . W_hat[e]^T with W_hat = s * (q - 8)
    exact (w_hat_experts), float64 sums, ONE rounding to bfloat16. The kernels round each
    s * (q - 8) to BF16 before the multiply and sum in FP32: lkw.golden's tolerance covers both."""
    out = grouped_gemm(x, w_hat_experts(w, scales), sorted_token_ids, expert_ids, block_m, topk)
    return f64_to_bf16(out).view(ml_dtypes.bfloat16)


def fp8_experts(x, w, x_scales, w_scales) -> tuple[np.ndarray, np.ndarray]:
    """(x_hat [rows, K], w_hat [E, N, K]) in float64, exact: chapter 08's blockwise dequantization
    (lkw.fp8_gemm.dequant_a, dequant_b) of E4M3 bits x uint8 [rows, K] with x_scales float32
    [K/128, rows] (1 x 128 groups, column-major as chapter 03's per_group_fp8 writes them) and of
    each expert's w[e] uint8 [N, K] with w_scales[e] float32 [ceil(N/128), K/128]. Shapes outside
    chapter 08's contract (N, K multiples of 16, K of 128) raise ValueError."""
    w, w_scales = np.asarray(w), np.asarray(w_scales)
    if w.ndim != 3 or w_scales.ndim != 3 or w.shape[0] != w_scales.shape[0]:
        raise ValueError(
            "w [E, N, K] and w_scales [E, N/128, K/128] must agree on E: "
            f"{w.shape}, {w_scales.shape}"
        )
    x_hat = fp8_gemm.dequant_a(x, w[0], x_scales, w_scales[0], "blockwise")  # (rows,K)
    w_hat = np.stack(
        [fp8_gemm.dequant_b(x, w[e], x_scales, w_scales[e], "blockwise") for e in range(w.shape[0])]
    )  # (E,N,K)
    return x_hat, w_hat


def grouped_gemm_fp8(x, w, x_scales, w_scales, sorted_token_ids, expert_ids, block_m: int,
                     topk: int):
    """The moe_grouped_gemm_fp8 kernels' output: grouped_gemm on the exact dequantized operands
    (fp8_experts), rounded ONCE to bfloat16 [T * topk, N]. The kernels sum each 128-k block in the
    tensor core and promote it, scaled, into FP32 (chapter 08's v4): the comparison is chapter
    08's relative Frobenius error (lkw.golden.grouped_fp8_tolerance)."""
    x_hat, w_hat = fp8_experts(x, w, x_scales, w_scales)
    out = grouped_gemm(x_hat, w_hat, sorted_token_ids, expert_ids, block_m, topk)  # (T*k,N)
    return f64_to_bf16(out).view(ml_dtypes.bfloat16)


def grouped_gemm_silu_fp8(x, w, x_scales, w_scales, sorted_token_ids, expert_ids, block_m: int,
                          topk: int):
    """The moe_grouped_gemm_silu_fp8 kernels' output: silu(gate) * up of the exact dequantized
    gate_up (w = gate || up, its block scales over the whole [N, K] matrix, so a 128-row block may
    hold gate and up rows), rounded ONCE to bfloat16 [T * topk, N / 2]."""
    x_hat, w_hat = fp8_experts(x, w, x_scales, w_scales)
    out = grouped_gemm(x_hat, w_hat, sorted_token_ids, expert_ids, block_m, topk)  # (T*k,N)
    return f64_to_bf16(silu_and_mul(out)).view(ml_dtypes.bfloat16)


def grouped_gemm_sum_fp8(h, w, h_scales, w_scales, sorted_token_ids, expert_ids, topk_weights,
                         block_m: int):
    """The moe_grouped_gemm_sum_fp8 kernels' output: grouped_gemm_sum_bf16 on the exact
    dequantized operands, h E4M3 bits [T * k, K] (a row per slot) with h_scales [K/128, T * k]:
    bfloat16 [T, N], rounded ONCE; a masked slot adds nothing."""
    h_hat, w_hat = fp8_experts(h, w, h_scales, w_scales)
    weights = np.asarray(topk_weights, dtype=np.float64)  # (T,k)
    t, k = weights.shape
    rows = grouped_gemm(h_hat, w_hat, sorted_token_ids, expert_ids, block_m, 1)  # (T*k,N)
    out = np.einsum("tj,tjn->tn", weights, rows.reshape(t, k, -1))
    return f64_to_bf16(out).view(ml_dtypes.bfloat16)


def routed_experts(expert_ids, num_experts: int | None = None) -> int:
    """How many distinct experts the blocks of an align name (ids >= 0, and < num_experts when
    given): the experts whose weights a grouped GEMM reads (its byte model's param
    routed_experts)."""
    ids = np.asarray(expert_ids).reshape(-1)
    ids = ids[(ids >= 0) & (ids < (num_experts if num_experts is not None else np.inf))]
    return int(np.unique(ids).size)


def grouped_gemm_bytes(t: int, topk: int, n: int, d: int, routed: int, rows: int, block_m: int,
                       silu: bool = False) -> int:
    """The grouped GEMM's roofline bytes (the registry's model): x [T, d], the routed experts'
    weights [routed, N, d], sorted_token_ids [rows] and expert_ids [rows / block_m] read once,
    out [T * topk, N] (N / 2 with silu) written once; BF16 values, int32 ids."""
    out_n = n // 2 if silu else n
    return 2 * t * d + 2 * routed * n * d + 4 * rows + 4 * (rows // block_m) + 2 * t * topk * out_n


def grouped_gemm_w4a16_bytes(t: int, topk: int, n: int, d: int, group: int, routed: int,
                             rows: int, block_m: int) -> int:
    """grouped_gemm_bytes with the routed experts' weights as stored: INT4 words (N * d / 2 bytes
    an expert) and BF16 scales (N * d / G * 2), instead of BF16 weights (2 N d)."""
    dense = grouped_gemm_bytes(t, topk, n, d, 0, rows, block_m)
    return dense + routed * (n * d // 2 + 2 * n * (d // group))


def grouped_gemm_fp8_bytes(t: int, topk: int, n: int, d: int, routed: int, rows: int,
                           block_m: int, silu: bool = False) -> int:
    """grouped_gemm_bytes with FP8 operands: x [T, d] and the routed experts' weights one byte an
    element, plus their FP32 blockwise scales (x: [d/128, T]; an expert's: [ceil(N/128), d/128])."""
    out_n = n // 2 if silu else n
    scales = 4 * (d // 128) * (t + routed * -(-n // 128))
    return t * d + routed * n * d + scales + 4 * rows + 4 * (rows // block_m) + 2 * t * topk * out_n


def silu_and_mul(gate_up: np.ndarray) -> np.ndarray:
    """[..., 2 d_ff] -> [..., d_ff]: SiLU(gate) * up, gate the first half (vLLM's w13 = w1 || w3),
    in float64."""
    d_ff = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :d_ff], gate_up[..., d_ff:]
    return gate / (1.0 + np.exp(-gate)) * up


def moe_sum(expert_out, topk_weights) -> np.ndarray:
    """y[t] = sum_j topk_weights[t, j] * expert_out[t, j, :], in float64, rounded once to
    expert_out's dtype (float32, or bfloat16 round-to-nearest-even). The moe_sum kernel sums in
    FP32 in j order and rounds once: within FP32 error of this sum (lkw.golden.moe_sum_tolerance).

    expert_out [T, k, d], topk_weights [T, k]. vLLM applies the weights in the second GEMM's
    epilogue and then sums unweighted: pass weights of 1 for that kernel.
    """
    out = np.asarray(expert_out)
    o64 = _float64(out, "expert_out", 3)  # (T,k,d)
    w64 = _float64(topk_weights, "topk_weights", 2)  # (T,k)
    if w64.shape != o64.shape[:2]:
        raise ValueError(f"topk_weights {w64.shape} must be expert_out's [T, k] {o64.shape[:2]}")
    y = np.einsum("tj,tjd->td", w64, o64)  # (T,d)
    if out.dtype == ml_dtypes.bfloat16:
        return f64_to_bf16(y).view(ml_dtypes.bfloat16)  # once; ml_dtypes would round twice
    return y.astype(out.dtype)


def moe_layer_reference(
    x, router_logits, w_gate_up, w_down, k: int, renormalize: bool
) -> np.ndarray:
    """The whole MoE block, float64 throughout and never rounded (a spec, not a kernel chain):

        weights, ids = topk_softmax(router_logits, k, renormalize)  # (T,k) float32 weights
        h[i]  = SiLU(x[t] . W1_gate[e]^T) * (x[t] . W1_up[e]^T)    # slot i = t k + j, e = ids
        y[t]  = sum_j weights[t, j] * (h[t k + j] . W2[e]^T)

    x [T, d], router_logits [T, E], w_gate_up [E, 2 d_ff, d] (gate rows first), w_down
    [E, d, d_ff]; computed as the kernels are chained: align, grouped GEMM, SiLU-and-mul,
    grouped GEMM, weighted sum. Returns float64 [T, d].
    """
    x64 = _float64(x, "x", 2)  # (T,d)
    n_experts = np.asarray(w_gate_up).shape[0]
    weights, ids = topk_softmax(router_logits, k, renormalize)  # (T,k)
    align = moe_align_block_size(ids, n_experts, DEFAULT_BLOCK_M)[:2]
    gate_up = grouped_gemm(x64, w_gate_up, *align, DEFAULT_BLOCK_M, k)  # (T*k,2*d_ff)
    h = silu_and_mul(gate_up)  # (T*k,d_ff)
    # Row i of h stands for slot i: the second GEMM reads it directly (topk = 1).
    down = grouped_gemm(h, w_down, *align, DEFAULT_BLOCK_M, 1)  # (T*k,d)
    return moe_sum(down.reshape(x64.shape[0], k, -1), weights.astype(np.float64))


# ---------------------------------------------------------------------------------------------
# Routing distributions for experiments

DISTRIBUTIONS = ("uniform", "zipf", "one")


def routing_ids(rng: np.random.Generator, t: int, e: int, k: int, dist: str) -> np.ndarray:
    """topk_ids int32 [T, k], k distinct experts per token, drawn from `dist`:

    - "uniform": every k-subset equally likely;
    - "zipf": experts drawn without replacement with weight (e + 1)^-ZIPF_EXPONENT, so expert 0
      is the hottest (the Gumbel top-k trick: argmax of log weight + Gumbel noise, k times);
    - "one": every token picks experts 0, 1, ..., k - 1: all tokens on expert 0 (and k - 1 more).
    """
    if not 1 <= k <= e or t < 0:
        raise ValueError(f"need 1 <= k <= E and T >= 0: T = {t}, E = {e}, k = {k}")
    if dist == "one":
        return np.tile(np.arange(k, dtype=np.int32), (t, 1))
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got {dist!r}")
    log_w = np.zeros(e) if dist == "uniform" else -ZIPF_EXPONENT * np.log(np.arange(1, e + 1))
    keys = log_w + rng.gumbel(size=(t, e))  # (T,E)
    return _top_k(keys, k).astype(np.int32)


def padding_waste(ids, num_experts: int, block_m: int) -> float:
    """Padding rows / real rows of the align of `ids` (0 = no waste): the share of mma rows the
    grouped GEMM spends on the sentinel. Masked (-1) slots are no rows."""
    counts = _expert_counts(ids, num_experts)
    real = int(counts.sum())
    return float(_padded(counts, block_m).sum() - real) / real if real else 0.0


def imbalance(ids, num_experts: int) -> float:
    """Rows of the busiest expert / mean rows per expert (over all E experts; 1 = balanced)."""
    counts = _expert_counts(ids, num_experts)
    return float(counts.max() * num_experts / counts.sum()) if counts.sum() else 1.0
