"""lkw.moe, chapter 09's reference: every function agrees with a slow loop written from its
docstring (routing with its tie rules, DeepSeek's group masking and bias, the align's runs,
padding and sentinel, the grouped GEMM (BF16 and INT4 experts), the weighted sum's one rounding,
the whole layer), the
align comparison tolerates what kernels may do (another order inside an expert) and catches
three mutants, and the experiment helpers give the hand-computed numbers."""

import math

import ml_dtypes
import numpy as np
import pytest
from lkw import formats, int4, moe, w4a16

# ---------------------------------------------------------------------------------------------
# Routing


def spec_topk_softmax(logits: np.ndarray, k: int, renormalize: bool):
    """One row at a time with math.exp and sorted(key=(-p, id))."""
    weights, ids = [], []
    for row in logits.astype(np.float64):
        m = max(row)
        e = [math.exp(v - m) for v in row]
        p = [np.float32(v / math.fsum(e)) for v in e]
        chosen = sorted(range(len(row)), key=lambda i: (-p[i], i))[:k]
        w = [float(p[i]) for i in chosen]
        if renormalize:
            w = [v / math.fsum(w) for v in w]
        weights.append(w)
        ids.append(chosen)
    return np.array(weights, np.float32), np.array(ids, np.int32)


# float64 sums in another order may land a float32 rounding on the other side: one ulp.
ONE_ULP = 2.0**-23


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("t,e,k", [(37, 8, 2), (5, 64, 6), (1, 60, 4), (9, 16, 1)])
def test_topk_softmax_is_the_spec(rng, t, e, k, renormalize):
    logits = rng.normal(0, 2, (t, e)).astype(np.float32)
    weights, ids = moe.topk_softmax(logits, k, renormalize)
    ref_w, ref_ids = spec_topk_softmax(logits, k, renormalize)
    assert weights.dtype == np.float32 and ids.dtype == np.int32 and ids.shape == (t, k)
    assert np.array_equal(ids, ref_ids)
    np.testing.assert_allclose(weights, ref_w, rtol=ONE_ULP, atol=0)
    if renormalize:
        np.testing.assert_allclose(weights.sum(axis=1, dtype=np.float64), 1.0, rtol=4 * ONE_ULP)


def test_topk_softmax_takes_bfloat16_values(rng):
    logits = rng.normal(0, 2, (11, 32)).astype(ml_dtypes.bfloat16)
    got = moe.topk_softmax(logits, 4, True)
    same = moe.topk_softmax(logits.astype(np.float32), 4, True)
    assert all(np.array_equal(a, b) for a, b in zip(got, same))


def test_topk_softmax_breaks_ties_by_the_lower_id(rng):
    logits = np.array([[1, 3, 3, 0, 3], [0, 0, 0, 0, 0], [2, 5, 2, 5, 2]], np.float32)
    weights, ids = moe.topk_softmax(logits, 3)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2], [1, 3, 0]]
    assert np.all(weights[1] == np.float32(0.2))
    with pytest.raises(ValueError):
        moe.topk_softmax(logits, 6)
    with pytest.raises(ValueError):
        moe.topk_softmax(logits.astype(np.int32), 2)


def spec_deepseek(logits, bias, k, n_group, topk_group, renormalize, factor):
    """One token at a time: groups by the sum of their two best biased scores, then experts."""
    _, e = logits.shape
    per = e // n_group
    weights, ids = [], []
    for row in logits.astype(np.float64):
        s = [1 / (1 + math.exp(-v)) for v in row]
        c = [s[i] + float(bias[i]) for i in range(e)]
        score = [sum(sorted(c[g * per : (g + 1) * per])[-2:]) for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: (-score[g], g))[:topk_group]
        allowed = [i for i in range(e) if i // per in groups]
        chosen = sorted(allowed, key=lambda i: (-c[i], i))[:k]
        w = [s[i] for i in chosen]
        if renormalize:
            w = [v / math.fsum(w) for v in w]
        weights.append([v * factor for v in w])
        ids.append(chosen)
    return np.array(weights, np.float32), np.array(ids, np.int32)


@pytest.mark.parametrize(
    "e,k,n_group,topk_group,renormalize",
    [(256, 8, 8, 4, True), (64, 6, 8, 3, False), (16, 4, 4, 2, True), (32, 8, 1, 1, True)],
)
def test_deepseek_router_is_the_spec(rng, e, k, n_group, topk_group, renormalize):
    logits = rng.normal(0, 2, (23, e)).astype(np.float32)
    bias = rng.normal(0, 0.3, e).astype(np.float32)
    args = (k, n_group, topk_group, renormalize, 2.5)
    weights, ids = moe.deepseek_router(logits, bias, *args)
    ref_w, ref_ids = spec_deepseek(logits, bias, *args)
    assert weights.dtype == np.float32 and ids.dtype == np.int32
    assert np.array_equal(ids, ref_ids)
    np.testing.assert_allclose(weights, ref_w, rtol=ONE_ULP, atol=0)


def test_the_bias_moves_ids_but_not_weights(rng):
    logits = rng.normal(0, 1, (16, 64)).astype(np.float32)
    bias = np.zeros(64, np.float32)
    _, plain = moe.deepseek_router(logits, bias, k=4, n_group=8, topk_group=8)
    bias[[5, 40]] = 10.0  # experts 5 and 40 now win every token's choice
    weights, ids = moe.deepseek_router(logits, bias, k=4, n_group=8, topk_group=8)
    assert not np.array_equal(ids, plain) and np.all(np.sort(ids[:, :2], axis=1) == [5, 40])
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    chosen = np.take_along_axis(s, ids, axis=1)
    expected = (chosen / chosen.sum(axis=1, keepdims=True) * 2.5).astype(np.float32)
    np.testing.assert_allclose(weights, expected, rtol=ONE_ULP, atol=0)


def test_group_masking_drops_a_lone_star():
    """Expert 0 has the best score, but its group's top-2 sum is low: the group is masked."""
    logits = np.full((1, 16), -10.0, np.float32)
    logits[0, 0] = 10.0  # group 0: one star, three duds
    logits[0, 4:12] = 1.0  # groups 1 and 2: solid
    bias = np.zeros(16, np.float32)
    _, ids = moe.deepseek_router(logits, bias, k=4, n_group=4, topk_group=2)
    assert ids.tolist() == [[4, 5, 6, 7]]
    _, ids = moe.deepseek_router(logits, bias, k=4, n_group=4, topk_group=4)
    assert ids[0, 0] == 0  # nothing masked: the star wins
    _, ids = moe.deepseek_router(np.zeros((1, 16), np.float32), bias, 6, 4, 2)
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5]]  # all tied: groups 0, 1, then lower ids
    for bad in ((3, 5, 2), (3, 16, 2), (9, 4, 2), (3, 4, 5)):  # (k, n_group, topk_group)
        with pytest.raises(ValueError):
            moe.deepseek_router(logits, bias, *bad)


# ---------------------------------------------------------------------------------------------
# moe_align_block_size


def spec_align(topk_ids: np.ndarray, e: int, block_m: int):
    """From the docstring, one slot at a time."""
    flat = [int(v) for v in topk_ids.reshape(-1)]
    sentinel = len(flat)
    worst = sentinel + e * (block_m - 1)
    cap = (worst + block_m - 1) // block_m * block_m
    runs, blocks = [], []
    for expert in range(e):
        run = [i for i, v in enumerate(flat) if v == expert]
        while len(run) % block_m:
            run.append(sentinel)
        runs += run
        blocks += [expert] * (len(run) // block_m)
    n_post = len(runs)
    sorted_ids = runs + [sentinel] * (cap - n_post)
    expert_ids = blocks + [-1] * (cap // block_m - len(blocks))
    return np.array(sorted_ids, np.int32), np.array(expert_ids, np.int32), n_post


def align_matches(got, topk_ids, e, block_m) -> bool:
    """The chapter's comparison: n_post and expert_ids exactly, sorted ids as a multiset per
    expert (canonical_align), the tail beyond n_post included."""
    ref = spec_align(topk_ids, e, block_m)
    sentinel = topk_ids.size
    if got[2] != ref[2] or not np.array_equal(got[1], ref[1]) or got[0].shape != ref[0].shape:
        return False
    return np.array_equal(
        moe.canonical_align(got[0], got[1], got[2], block_m, sentinel),
        moe.canonical_align(ref[0], ref[1], ref[2], block_m, sentinel),
    )


def masked(rng, ids: np.ndarray, share: float) -> np.ndarray:
    ids = ids.copy()
    ids[rng.random(ids.shape) < share] = -1
    return ids


CASES = {  # name: (T, E, k, block_m, dist, share of masked slots)
    "random": (37, 8, 4, 16, "uniform", 0.0),
    "masked": (50, 16, 4, 8, "zipf", 0.3),
    "k1": (33, 8, 1, 4, "uniform", 0.0),
    "t1": (1, 8, 2, 16, "uniform", 0.0),
    "e60": (100, 60, 6, 16, "zipf", 0.0),
    "one_expert": (64, 8, 1, 16, "one", 0.0),
    "block1": (20, 5, 2, 1, "uniform", 0.1),
}


@pytest.mark.parametrize("case", CASES)
def test_align_is_the_spec(rng, case):
    t, e, k, block_m, dist, share = CASES[case]
    ids = masked(rng, moe.routing_ids(rng, t, e, k, dist), share)
    got = moe.moe_align_block_size(ids, e, block_m)
    ref = spec_align(ids, e, block_m)
    assert got[0].dtype == np.int32 and got[1].dtype == np.int32 and isinstance(got[2], int)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref))  # the canonical order itself
    assert got[0].size == moe.capacity(t * k, e, block_m) == got[1].size * block_m
    assert got[2] <= got[0].size and np.all(got[1][got[2] // block_m :] == -1)
    assert align_matches(got, ids, e, block_m)


def test_the_hand_example():
    """T = 5, k = 2, E = 3, BLOCK_M = 4: counts 5, 3, 2 -> runs 8, 4, 4; capacity 19 -> 20."""
    ids = np.array([[0, 1], [0, 2], [1, 0], [0, 2], [1, 0]], np.int32)
    sorted_ids, expert_ids, n_post = moe.moe_align_block_size(ids, 3, 4)
    s = 10
    assert sorted_ids.tolist() == [0, 2, 5, 6, 9, s, s, s, 1, 4, 8, s, 3, 7, s, s, s, s, s, s]
    assert expert_ids.tolist() == [0, 0, 1, 2, -1] and n_post == 16


def test_experts_without_tokens_take_no_blocks():
    ids = np.array([[3, 59], [59, 3], [7, 3]], np.int32)
    sorted_ids, expert_ids, n_post = moe.moe_align_block_size(ids, 60, 4)
    assert n_post == 12 and expert_ids[:3].tolist() == [3, 7, 59]
    assert np.all(expert_ids[3:] == -1) and sorted_ids[:4].tolist() == [0, 3, 5, 6]


def test_the_capacity_holds_the_worst_case():
    """Every expert one slot past a multiple of BLOCK_M: each wastes BLOCK_M - 1 rows."""
    e, block_m = 12, 8
    ids = np.repeat(np.arange(e, dtype=np.int32), block_m + 1).reshape(-1, 1)
    sorted_ids, _, n_post = moe.moe_align_block_size(ids, e, block_m)
    assert n_post == e * 2 * block_m == ids.size + e * (block_m - 1)
    assert sorted_ids.size == moe.capacity(ids.size, e, block_m) == n_post


@pytest.mark.parametrize("bad", [8, 100, -2])
def test_align_refuses_unknown_ids(bad):
    ids = np.array([[0, 1], [2, bad]], np.int32)
    with pytest.raises(ValueError, match=str(bad)):
        moe.moe_align_block_size(ids, 8, 4)
    with pytest.raises(ValueError):
        moe.padding_waste(ids, 8, 4)


def shuffled_runs(rng, align, block_m):
    """What a kernel's atomics may do: any order of the slots inside an expert's run."""
    sorted_ids, expert_ids, n_post = (a.copy() if isinstance(a, np.ndarray) else a for a in align)
    for e in np.unique(expert_ids[expert_ids >= 0]):
        where = np.flatnonzero(np.repeat(expert_ids, block_m) == e)
        sorted_ids[where] = rng.permutation(sorted_ids[where])
    return sorted_ids, expert_ids, n_post


def test_canonical_align_forgives_the_order_inside_an_expert(rng):
    ids = masked(rng, moe.routing_ids(rng, 40, 8, 3, "zipf"), 0.1)
    align = moe.moe_align_block_size(ids, 8, 4)
    shuffled = shuffled_runs(rng, align, 4)
    assert not np.array_equal(shuffled[0], align[0])  # 120 slots in 8 runs: some moved
    assert align_matches(shuffled, ids, 8, 4)
    canon = moe.canonical_align(*shuffled, 4, ids.size)
    assert np.array_equal(canon, align[0])  # the reference's order is already canonical


# Mutants: each is a plausible kernel bug, and align_matches must reject it.


def mutant_short_total(ids, e, block_m):
    """num_tokens_post_padded written one short (the exclusive scan read one expert early)."""
    sorted_ids, expert_ids, n_post = moe.moe_align_block_size(ids, e, block_m)
    return sorted_ids, expert_ids, n_post - 1


def mutant_sentinel_zero(ids, e, block_m):
    """Padding left at 0 (an unfilled buffer): the GEMM would compute slot 0 again."""
    sorted_ids, expert_ids, n_post = moe.moe_align_block_size(ids, e, block_m)
    return np.where(sorted_ids == ids.size, 0, sorted_ids).astype(np.int32), expert_ids, n_post


def mutant_padded_off_by_one(ids, e, block_m):
    """Runs padded to (count // BLOCK_M + 1) * BLOCK_M: an extra empty block for full runs."""
    flat = ids.reshape(-1)
    sorted_ids = np.full(moe.capacity(ids.size, e, block_m), ids.size, np.int32)
    expert_ids = np.full(sorted_ids.size // block_m, -1, np.int32)
    start = 0
    for x in range(e):
        slots = np.flatnonzero(flat == x)
        run = (slots.size // block_m + 1) * block_m if slots.size else 0
        sorted_ids[start : start + slots.size] = slots
        expert_ids[start // block_m : (start + run) // block_m] = x
        start += run
    return sorted_ids, expert_ids, start


@pytest.mark.parametrize("mutant", [mutant_short_total, mutant_sentinel_zero])
def test_align_matches_catches_the_mutants(rng, mutant):
    ids = moe.routing_ids(rng, 30, 8, 2, "uniform")
    assert align_matches(moe.moe_align_block_size(ids, 8, 16), ids, 8, 16)
    assert not align_matches(mutant(ids, 8, 16), ids, 8, 16)


def test_align_matches_catches_the_off_by_one_padding(rng):
    ids = moe.routing_ids(rng, 32, 8, 2, "one")  # experts 0 and 1 hold 32 = 2 BLOCK_M each
    assert not align_matches(mutant_padded_off_by_one(ids, 8, 16), ids, 8, 16)


# ---------------------------------------------------------------------------------------------
# Grouped GEMM, moe_sum, the layer


def test_grouped_gemm_is_a_loop_over_slots(rng):
    t, e, k, d, n, block_m = 21, 6, 3, 40, 24, 8
    ids = masked(rng, moe.routing_ids(rng, t, e, k, "zipf"), 0.2)
    x = rng.normal(size=(t, d)).astype(ml_dtypes.bfloat16)
    w = rng.normal(size=(e, n, d)).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = np.zeros((t * k, n))
    for tok in range(t):
        for j in range(k):
            if ids[tok, j] >= 0:
                for c in range(n):
                    ref[tok * k + j, c] = math.fsum(x64[tok] * w64[ids[tok, j], c])
    align = moe.moe_align_block_size(ids, e, block_m)
    got = moe.grouped_gemm(x, w, align[0], align[1], block_m, k)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    shuffled = shuffled_runs(rng, align, block_m)  # the order inside an expert does not matter
    again = moe.grouped_gemm(x, w, *shuffled[:2], block_m, k)
    np.testing.assert_allclose(again, got, rtol=1e-13, atol=1e-13)


def test_grouped_gemm_skips_the_ids_a_kernel_skips(rng):
    """Sorted ids outside 0..T*topk-1 and expert ids outside 0..E-1 name nothing: the kernels
    skip them (no read or write out of bounds), and so does the reference."""
    t, e, k, d, n, block_m = 4, 3, 2, 16, 8, 4
    x = rng.normal(size=(t, d)).astype(ml_dtypes.bfloat16)
    w = rng.normal(size=(e, n, d)).astype(np.float32)
    sorted_ids = np.array([0, -5, 3, 99, 1, 2, 8, 8, 4, 6, 8, 8], np.int32)
    expert_ids = np.array([1, e, -2], np.int32)
    got = moe.grouped_gemm(x, w, sorted_ids, expert_ids, block_m, k)
    ref = np.zeros((t * k, n))
    for slot in (0, 3):
        ref[slot] = x[slot // k].astype(np.float64) @ w[1].astype(np.float64).T
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-13)


def test_grouped_gemm_bf16_rounds_the_exact_sum_once(rng):
    t, e, k, d, n, block_m = 9, 4, 2, 24, 16, 8
    ids = moe.routing_ids(rng, t, e, k, "uniform")
    align = moe.moe_align_block_size(ids, e, block_m)
    x = rng.normal(size=(t, d)).astype(ml_dtypes.bfloat16)
    w = rng.normal(size=(e, n, d)).astype(ml_dtypes.bfloat16)
    exact = moe.grouped_gemm(x, w, align[0], align[1], block_m, k)
    got = moe.grouped_gemm_bf16(x, w, align[0], align[1], block_m, k)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (t * k, n)
    assert np.array_equal(got.view(np.uint16), formats.f64_to_bf16(exact))


def test_grouped_gemm_silu_is_silu_of_the_unrounded_gate_and_up(rng):
    """gate = the first N/2 rows of w[e], up the last; silu(gate) * up from the exact (never
    rounded) gate and up, rounded once; the unfused chain silu_and_mul(bf16(gate_up)) rounds
    three times and lands an ulp away somewhere."""
    t, e, k, d, d_ff, block_m = 40, 4, 2, 64, 32, 16
    ids = moe.routing_ids(rng, t, e, k, "zipf")
    align = moe.moe_align_block_size(ids, e, block_m)
    x = rng.normal(size=(t, d)).astype(ml_dtypes.bfloat16)
    w = rng.normal(0, d**-0.5, (e, 2 * d_ff, d)).astype(ml_dtypes.bfloat16)
    got = moe.grouped_gemm_silu_bf16(x, w, align[0], align[1], block_m, k)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (t * k, d_ff)
    ref = np.zeros((t * k, d_ff))
    for tok in range(t):
        for j in range(k):
            w_e = w[ids[tok, j]].astype(np.float64)
            gate = w_e[:d_ff] @ x[tok].astype(np.float64)
            up = w_e[d_ff:] @ x[tok].astype(np.float64)
            ref[tok * k + j] = gate / (1 + np.exp(-gate)) * up
    assert np.array_equal(got.view(np.uint16), formats.f64_to_bf16(ref))
    gate_up = moe.grouped_gemm_bf16(x, w, align[0], align[1], block_m, k)
    d2 = gate_up.astype(np.float64)
    chain = formats.f64_to_bf16(d2[:, :d_ff] / (1 + np.exp(-d2[:, :d_ff])) * d2[:, d_ff:])
    assert not np.array_equal(chain, got.view(np.uint16))
    with pytest.raises(ValueError, match="odd"):
        moe.grouped_gemm_silu_bf16(x, w[:, :-1], align[0], align[1], block_m, k)


def int4_experts(rng, e, n, k, g):
    """Random 4-bit q [E, N, K], each expert's words repacked (uint32 [E, N/64, 8K]), and BF16
    scale bits [E, K/G, N]."""
    q = rng.integers(0, 16, (e, n, k))
    w = np.stack([w4a16.repack(int4.pack(q[i])) for i in range(e)])
    s = formats.f32_to_bf16(rng.uniform(0.005, 0.05, (e, k // g, n)).astype(np.float32))
    return q, w, s


@pytest.mark.parametrize("g", [32, 64, 128, 256])
def test_grouped_gemm_w4a16_dequantizes_each_expert_then_rounds_once(rng, g):
    """W_hat[e][n, k] = s[e][k // G, n] * (q[e][n, k] - 8), written as a loop over the elements
    (G = K = 256: one scale per channel); the op is grouped_gemm on it, rounded once to BF16,
    and every expert multiplies by its own weights and scales."""
    t, e, topk, n, k, block_m = 9, 5, 2, 64, 256, 16
    q, w, scale_bits = int4_experts(rng, e, n, k, g)
    s = formats.bf16_to_f32(scale_bits).astype(np.float64)  # (E,K/G,N)
    w_hat = np.zeros((e, n, k))
    for i in range(e):
        for c in range(n):
            for j in range(k):
                w_hat[i, c, j] = s[i, j // g, c] * (q[i, c, j] - 8)
    assert np.array_equal(moe.w_hat_experts(w, scale_bits), w_hat)
    ids = masked(rng, moe.routing_ids(rng, t, e, topk, "uniform"), 0.2)
    align = moe.moe_align_block_size(ids, e, block_m)
    x = rng.normal(size=(t, k)).astype(ml_dtypes.bfloat16)
    got = moe.grouped_gemm_w4a16(x, w, scale_bits, align[0], align[1], block_m, topk)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (t * topk, n)
    exact = moe.grouped_gemm(x, w_hat, align[0], align[1], block_m, topk)
    assert np.array_equal(got.view(np.uint16), formats.f64_to_bf16(exact))
    for tok, j in zip(*np.nonzero(ids >= 0)):  # each slot with its own expert's W_hat
        row = x[tok].astype(np.float64) @ w_hat[ids[tok, j]].T
        np.testing.assert_allclose(exact[tok * topk + j], row, rtol=1e-12, atol=1e-12)
    assert not np.any(exact[(ids < 0).reshape(-1)])  # masked slots stay zero


def test_grouped_gemm_w4a16_refuses_mismatched_weights(rng):
    _, w, s = int4_experts(rng, 3, 64, 64, 32)
    x = np.ones((2, 64), ml_dtypes.bfloat16)
    ids, experts = np.array([0, 1] + [2] * 14, np.int32), np.array([0], np.int32)
    with pytest.raises(ValueError, match="agree on E"):
        moe.grouped_gemm_w4a16(x, w[:2], s, ids, experts, 16, 1)
    with pytest.raises(ValueError, match="disagree on d"):
        moe.grouped_gemm_w4a16(np.ones((2, 128), ml_dtypes.bfloat16), w, s, ids, experts, 16, 1)


def test_routed_experts_and_the_byte_model():
    expert_ids = np.array([3, 3, 0, 7, -1, -1], np.int32)
    assert moe.routed_experts(expert_ids) == 3
    assert moe.routed_experts(expert_ids, num_experts=5) == 2  # an id past E is skipped
    assert moe.routed_experts(np.full(4, -1, np.int32)) == 0
    # T 16, topk 8, N 4096, d 7168, 37 routed experts, 1024 rows of blocks of 16
    got = moe.grouped_gemm_bytes(16, 8, 4096, 7168, 37, 1024, 16)
    assert got == 2 * 16 * 7168 + 37 * 2 * 4096 * 7168 + 4 * 1024 + 4 * 64 + 2 * 128 * 4096
    silu = moe.grouped_gemm_bytes(16, 8, 4096, 7168, 37, 1024, 16, silu=True)
    assert got - silu == 2 * 128 * 2048
    # INT4 experts: half a byte a weight and a BF16 scale per 128 of them, for the routed 37
    int4_bytes = moe.grouped_gemm_w4a16_bytes(16, 8, 4096, 7168, 128, 37, 1024, 16)
    assert got - int4_bytes == 37 * (2 * 4096 * 7168 - 4096 * 7168 // 2 - 2 * 4096 * 56)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_moe_sum_rounds_once_to_the_input_dtype(rng, dtype):
    t, k, d = 13, 4, 96
    out = rng.normal(size=(t, k, d)).astype(dtype)
    w = rng.random((t, k)).astype(np.float32)
    y = moe.moe_sum(out, w)
    assert y.dtype == dtype and y.shape == (t, d)
    exact = np.array(
        [
            [math.fsum(float(w[i, j]) * float(out[i, j, c]) for j in range(k)) for c in range(d)]
            for i in range(t)
        ]
    )
    if dtype == ml_dtypes.bfloat16:
        expected = formats.f64_to_bf16(exact).view(ml_dtypes.bfloat16)
        running = np.zeros((t, d), dtype)  # a kernel that rounds after every add: not this
        for j in range(k):
            running = (running.astype(np.float32) + w[:, j, None] * out[:, j]).astype(dtype)
        assert not np.array_equal(running, y)
    else:
        expected = exact.astype(np.float32)
    assert np.array_equal(y.view(np.uint8), expected.view(np.uint8))


def test_moe_sum_rounds_bfloat16_once_not_through_float32():
    """1 + 2^-8 + 2^-30 is just above a BF16 tie: once rounded it is 1 + 2^-7 (ml_dtypes' cast
    through FP32 would give 1.0)."""
    out = np.array([[[1.0], [2.0**-8], [2.0**-30]]]).astype(ml_dtypes.bfloat16)
    y = moe.moe_sum(out, np.ones((1, 3), np.float32))
    assert float(y[0, 0]) == 1 + 2.0**-7


@pytest.mark.parametrize("renormalize", [False, True])
def test_the_layer_is_the_per_token_composition(rng, renormalize):
    t, e, k, d, d_ff = 17, 8, 2, 32, 48
    x = rng.normal(size=(t, d)).astype(ml_dtypes.bfloat16)
    logits = rng.normal(size=(t, e)).astype(np.float32)
    w_gate_up = rng.normal(0, d**-0.5, (e, 2 * d_ff, d)).astype(np.float32)
    w_down = rng.normal(0, d_ff**-0.5, (e, d, d_ff)).astype(np.float32)
    got = moe.moe_layer_reference(x, logits, w_gate_up, w_down, k, renormalize)
    weights, ids = moe.topk_softmax(logits, k, renormalize)
    ref = np.zeros((t, d))
    for tok in range(t):
        xt = x[tok].astype(np.float64)
        for j in range(k):
            w1 = w_gate_up[ids[tok, j]].astype(np.float64)
            gate, up = w1[:d_ff] @ xt, w1[d_ff:] @ xt
            h = gate * (1 / (1 + np.exp(-gate))) * up
            ref[tok] += float(weights[tok, j]) * (w_down[ids[tok, j]].astype(np.float64) @ h)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Routing distributions, padding waste, imbalance


@pytest.mark.parametrize("dist", moe.DISTRIBUTIONS)
def test_routing_ids_pick_k_distinct_experts(rng, dist):
    ids = moe.routing_ids(rng, 500, 16, 4, dist)
    assert ids.dtype == np.int32 and ids.shape == (500, 4)
    assert ids.min() >= 0 and ids.max() < 16
    assert all(len(set(row)) == 4 for row in ids.tolist())


def test_routing_distributions_have_their_shape(rng):
    counts = np.bincount(moe.routing_ids(rng, 4000, 16, 2, "zipf").reshape(-1), minlength=16)
    assert counts[0] == counts.max() and counts[0] > 3 * counts[15]
    uniform = np.bincount(moe.routing_ids(rng, 4000, 16, 2, "uniform").reshape(-1), minlength=16)
    assert uniform.max() < 1.3 * uniform.mean()  # 500 expected, sigma about 21
    assert moe.routing_ids(rng, 3, 8, 3, "one").tolist() == [[0, 1, 2]] * 3
    with pytest.raises(ValueError):
        moe.routing_ids(rng, 3, 8, 3, "normal")
    with pytest.raises(ValueError):
        moe.routing_ids(rng, 3, 8, 9, "uniform")


def test_waste_and_imbalance_by_hand(rng):
    ids = np.array([[0, 1], [0, 2], [1, 0], [0, 2], [1, 0]], np.int32)  # counts 5, 3, 2
    assert moe.padding_waste(ids, 3, 4) == pytest.approx(6 / 10)  # 16 rows for 10
    assert moe.imbalance(ids, 3) == pytest.approx(5 / (10 / 3))
    one = moe.routing_ids(rng, 64, 8, 2, "one")  # experts 0 and 1, 64 rows each
    assert moe.padding_waste(one, 8, 16) == 0.0 and moe.imbalance(one, 8) == 4.0
    assert moe.padding_waste(one, 8, 48) == pytest.approx((96 - 64) * 2 / 128)
    ids[0, 0] = -1  # a masked slot is no row: counts 4, 3, 2
    assert moe.padding_waste(ids, 3, 4) == pytest.approx(3 / 9)
    assert moe.imbalance(ids, 3) == pytest.approx(4 / 3)


# ---------------------------------------------------------------------------------------------
# The FP8 grouped GEMMs: chapter 08's blockwise GEMM per expert, on chapter 09's schedule


def fp8_problem(rng, rows, e, n, k):
    from lkw import golden

    return golden.grouped_fp8_inputs(rng, rows, e, n, k)


def test_grouped_gemm_fp8_is_chapter_08s_blockwise_gemm_per_run(rng):
    """Each run's rows are fp8_gemm_blockwise of the run's tokens and its expert, bit for bit
    (both round the same float64 product once); rows of a masked slot stay 0."""
    from lkw import fp8_gemm

    t, topk, e, n, k, bm = 9, 2, 4, 144, 256, 16
    x, w, xs, ws = fp8_problem(rng, t, e, n, k)
    ids = moe.routing_ids(rng, t, e, topk, "uniform")
    ids[0, 0] = -1  # a masked slot
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, bm)
    out = moe.grouped_gemm_fp8(x, w, xs, ws, sorted_ids, expert_ids, bm, topk).view(np.uint16)
    assert out.shape == (t * topk, n) and np.all(out[0] == 0)
    for slot in range(1, t * topk):
        tok, ex = slot // topk, int(ids.reshape(-1)[slot])
        want = fp8_gemm.fp8_gemm_blockwise(x[tok : tok + 1], w[ex], xs[:, tok : tok + 1], ws[ex])
        assert np.array_equal(out[slot], want[0]), slot


def test_grouped_gemm_silu_and_sum_fp8_round_the_exact_result_once(rng):
    t, topk, e, n, k, bm = 6, 3, 5, 272, 384, 16
    x, w, xs, ws = fp8_problem(rng, t, e, n, k)
    ids = moe.routing_ids(rng, t, e, topk, "uniform")
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, bm)
    x_hat, w_hat = moe.fp8_experts(x, w, xs, ws)
    exact = moe.grouped_gemm(x_hat, w_hat, sorted_ids, expert_ids, bm, topk)  # (T*k,N)
    silu = moe.grouped_gemm_silu_fp8(x, w, xs, ws, sorted_ids, expert_ids, bm, topk)
    assert np.array_equal(silu.view(np.uint16), formats.f64_to_bf16(moe.silu_and_mul(exact)))
    h, _, hs, _ = fp8_problem(rng, t * topk, 1, 16, k)  # a row per slot
    ids[1] = -1  # token 1 fully masked: its row is 0
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, bm)
    tw = rng.random((t, topk)).astype(np.float32)
    got = moe.grouped_gemm_sum_fp8(h, w, hs, ws, sorted_ids, expert_ids, tw, bm).view(np.uint16)
    h_hat, _ = moe.fp8_experts(h, w, hs, ws)
    rows = moe.grouped_gemm(h_hat, w_hat, sorted_ids, expert_ids, bm, 1).reshape(t, topk, n)
    want = np.einsum("tj,tjn->tn", tw.astype(np.float64), rows)
    assert np.array_equal(got, formats.f64_to_bf16(want))
    assert np.all(got[1] == 0)


def test_fp8_experts_refuse_scales_of_the_wrong_layout(rng):
    x, w, xs, ws = fp8_problem(rng, 5, 3, 144, 256)
    with pytest.raises(ValueError):
        moe.fp8_experts(x, w, np.ascontiguousarray(xs.T), ws)  # row-major x_scales
    with pytest.raises(ValueError):
        moe.fp8_experts(x, w, xs, ws[:2])  # scales of two experts for three
    with pytest.raises(ValueError):
        moe.fp8_experts(x, w, xs, ws[:, :1])  # ceil(N/128) = 2 rows of blocks


def test_the_bench_sample_is_the_golden_reference(rng):
    """lkw.bench's sampled FP8 reference (one expert at a time, the leading slots) gives the
    golden reference's leading rows, for each epilogue."""
    from lkw import bench

    t, topk, e, n, k, bm = 7, 2, 4, 272, 256, 16
    x, w, xs, ws = fp8_problem(rng, t, e, n, k)
    ids = moe.routing_ids(rng, t, e, topk, "uniform")
    sorted_ids, expert_ids, _ = moe.moe_align_block_size(ids, e, bm)
    host = [x, w, xs, ws, sorted_ids, expert_ids]
    full = moe.grouped_gemm_fp8(x, w, xs, ws, sorted_ids, expert_ids, bm, topk).view(np.uint16)
    got, tol = bench.grouped_fp8_sample_reference(host, ids, topk, 6, "store")
    assert np.array_equal(got, full[:6]) and tol.startswith("frob:")
    full = moe.grouped_gemm_silu_fp8(x, w, xs, ws, sorted_ids, expert_ids, bm, topk)
    got, _ = bench.grouped_fp8_sample_reference(host, ids, topk, 6, "silu")
    assert np.array_equal(got, full.view(np.uint16)[:6])
    h, _, hs, _ = fp8_problem(rng, t * topk, 1, 16, k)
    tw = rng.random((t, topk)).astype(np.float32)
    full = moe.grouped_gemm_sum_fp8(h, w, hs, ws, sorted_ids, expert_ids, tw, bm).view(np.uint16)
    got, _ = bench.grouped_fp8_sample_reference([h, w, hs, ws, sorted_ids, expert_ids, tw], ids,
                                                topk, 6, "sum")
    assert np.array_equal(got, full[:3])
