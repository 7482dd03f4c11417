"""lkw.golden's chapter 09 cases: the align cases cover the edges the issue names, their
tolerance is the multiset spelling, and the routing inputs make every decision decisive, so that
a kernel computing in FP32 must return the reference's ids (checked here by an FP32 emulation of
the kernels' arithmetic). The grouped GEMM (BF16 and INT4 experts) and moe_sum cases cover their
edges, route every slot, and an FP32 emulation of the kernels' arithmetic stays inside their
tolerances."""

import itertools

import numpy as np
import pytest
from lkw import formats, fp8_gemm, golden, moe


@pytest.fixture(scope="module")
def cases():
    return golden.moe_cases(np.random.default_rng(2024))


def by_op(cases, op):
    return [c for c in cases if c.op == op]


def test_align_cases_cover_the_edges(cases):
    align = by_op(cases, "moe_align_block_size")
    shapes = {(c.inputs[0].shape, c.params["num_experts"], c.params["block_m"]) for c in align}
    assert any(e == 60 for _, e, _ in shapes), "E not a power of two"
    assert any(s[1] == 1 for s, _, _ in shapes), "k = 1"
    assert {1, 65536} <= {s[0] for s, _, _ in shapes}, "T = 1 and 65536"
    assert {1, 256} <= {m for _, _, m in shapes}, "BLOCK_M 1 (no padding) and 256"
    assert any(np.all(c.inputs[0] == c.inputs[0].flat[0]) for c in align), "all to one expert"
    assert any(np.any(c.inputs[0] == -1) for c in align), "masked slots"
    for c in align:
        assert c.tolerance == f"multiset:1:{c.params['block_m']}/exact/exact"
        ids = c.inputs[0]
        assert ids.dtype == np.int32 and np.all((ids >= -1) & (ids < c.params["num_experts"]))


def test_align_outputs_are_the_reference_and_its_capacity(cases):
    for c in by_op(cases, "moe_align_block_size"):
        sorted_ids, expert_ids, post = golden.expected_outputs(c)
        e, m = int(c.params["num_experts"]), int(c.params["block_m"])
        assert sorted_ids.size == moe.capacity(c.inputs[0].size, e, m)
        assert expert_ids.size == sorted_ids.size // m and post.shape == (1,)
        assert post.dtype == expert_ids.dtype == sorted_ids.dtype == np.int32


def test_multiset_runs_are_canonical_align(cases):
    """The C++ comparison (runs of equal keys in expert_ids, sorted) is lkw.moe.canonical_align:
    a shuffled run still matches, a slot moved to the next run does not."""
    rng = np.random.default_rng(7)
    c = by_op(cases, "moe_align_block_size")[0]
    sorted_ids, expert_ids, post = golden.expected_outputs(c)
    m, sentinel = int(c.params["block_m"]), c.inputs[0].size
    shuffled = sorted_ids.copy()
    bounds = np.flatnonzero(np.diff(np.r_[-2, expert_ids[: post[0] // m], -2])) * m
    for a, b in itertools.pairwise(bounds):
        shuffled[a:b] = rng.permutation(shuffled[a:b])
    canon = [moe.canonical_align(x, expert_ids, int(post[0]), m, sentinel) for x in (sorted_ids, shuffled)]
    assert np.array_equal(*canon)
    moved = sorted_ids.copy()
    moved[[bounds[1] - 1, bounds[1]]] = moved[[bounds[1], bounds[1] - 1]]
    if moved[bounds[1] - 1] != moved[bounds[1]]:
        canon_moved = moe.canonical_align(moved, expert_ids, int(post[0]), m, sentinel)
        assert not np.array_equal(canon[0], canon_moved)


def test_tolerance_spelling_is_accepted_and_bad_spellings_are_not():
    ids = np.array([[1, 2]], np.int32)
    good = golden.Case("a", "moe_align_block_size", "multiset:1:4/exact/exact", [ids],
                       {"num_experts": 4, "block_m": 4})
    golden.check_case(good, golden.expected_outputs(good))
    for bad in ("multiset:1/exact/exact", "multiset:a:4/exact/exact"):
        case = golden.Case("a", "moe_align_block_size", bad, [ids], {"num_experts": 4, "block_m": 4})
        with pytest.raises(ValueError, match="tolerance"):
            golden.check_case(case, golden.expected_outputs(case))


def _fp32_softmax_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The kernels' arithmetic in float32: p = exp(x - max) * (1 / sum); top-k by (-p, id)."""
    x = logits.astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e * (np.float32(1) / e.sum(axis=1, dtype=np.float32, keepdims=True))
    return np.argsort(-p, axis=1, kind="stable")[:, :k]


def test_softmax_ids_do_not_depend_on_fp32_rounding(cases):
    for op in ("topk_softmax", "topk_softmax_bf16"):
        for c in by_op(cases, op):
            x = c.inputs[0]
            x = formats.bf16_to_f32(x) if op.endswith("bf16") else x
            _, ids = golden.expected_outputs(c)
            assert np.array_equal(_fp32_softmax_ids(x, int(c.params["k"])), ids), c.id


def _fp32_deepseek_ids(z, bias, k, n_group, topk_group):
    s = np.float32(1) / (np.float32(1) + np.exp(-z.astype(np.float32)))
    c = (s + bias.astype(np.float32)).astype(np.float32)
    t, e = c.shape
    top2 = np.sort(c.reshape(t, n_group, -1), axis=-1)[..., -2:]
    group = (top2[..., 1] + top2[..., 0]).astype(np.float32)
    kept = np.argsort(-group, axis=1, kind="stable")[:, :topk_group]
    mask = np.zeros((t, n_group), bool)
    np.put_along_axis(mask, kept, True, axis=1)
    masked = np.where(np.repeat(mask, e // n_group, axis=1), c, -np.inf)
    return np.argsort(-masked, axis=1, kind="stable")[:, :k]


def test_deepseek_ids_do_not_depend_on_fp32_rounding(cases):
    deepseek = by_op(cases, "deepseek_router")
    assert any("ties" in c.id for c in deepseek)
    for c in deepseek:
        z, bias = c.inputs
        p = {name: int(c.params[name]) for name in ("k", "n_group", "topk_group")}
        _, ids = golden.expected_outputs(c)
        assert np.array_equal(_fp32_deepseek_ids(z, bias, **p), ids), c.id


def test_decisive_rows_keep_exact_ties_and_refuse_near_ones():
    e, n_group = 16, 4
    bias = np.zeros(e, np.float32)
    z = np.linspace(-2, 2, e).astype(np.float32)
    assert golden.deepseek_decisive(z, bias, 4, n_group, n_group)
    tie = z.copy()
    tie[1] = tie[15]  # an exact tie of identical inputs with the best expert
    assert golden.deepseek_decisive(tie, bias, 4, n_group, n_group)
    near = z.copy()
    near[1] = np.nextafter(z[15], np.float32(0))  # one ulp below the best: rounding decides
    assert not golden.deepseek_decisive(near, bias, 4, n_group, n_group)
    # ... unless its group is dropped: expert 1's group 0 ranks below groups 3 and 2
    assert golden.deepseek_decisive(near, bias, 4, n_group, 2)


def test_ties_cases_hold_ties(cases):
    c = next(c for c in cases if c.id.startswith("topk_softmax_ties"))
    x = c.inputs[0]
    assert all(len(np.unique(row)) < row.size for row in x)
    _, ids = golden.expected_outputs(c)
    values = np.take_along_axis(x, ids, axis=1)
    tied = values[:, 1:] == values[:, :-1]
    assert tied.any() and np.all(ids[:, 1:][tied] > ids[:, :-1][tied]), "lower id first"


def test_router_tolerance_grows_with_e_and_k():
    assert golden.router_tolerance(256, 8, False) == f"close:{280 * 2.0**-24:.3g}:0/exact"
    assert golden.router_tolerance(256, 8, True) == f"close:{28 * 2.0**-24:.3g}:0/exact"


# ---------------------------------------------------------------------------------------------
# The expert half: grouped GEMM (plain and gate_up + SiLU) and moe_sum


def test_grouped_cases_cover_the_edges(cases):
    for op in ("moe_grouped_gemm", "moe_grouped_gemm_silu"):
        grouped = by_op(cases, op)
        t = {c.inputs[0].shape[0] for c in grouped}
        topk = {c.params["topk"] for c in grouped}
        e = {c.inputs[1].shape[0] for c in grouped}
        n = {c.inputs[1].shape[1] for c in grouped}
        k = {c.inputs[0].shape[1] for c in grouped}
        piece = 16 if op.endswith("silu") else 8
        assert 1 in t and 60 in e and piece in n and 8 in k, op
        assert any(v % 64 for v in k), f"{op}: a K tail past the last 64-k stage"
        assert any((v // (2 if piece == 16 else 1)) % 64 for v in n), f"{op}: a partial block"
        assert all(v % piece == 0 for v in n) and all(v % 8 == 0 for v in k)
        if op == "moe_grouped_gemm":
            assert 1 in topk and {16, 48, 64, 128} <= {c.params["block_m"] for c in grouped}
        for c in grouped:
            x, w, sorted_ids, expert_ids = c.inputs
            slots = x.shape[0] * int(c.params["topk"])
            routed = sorted_ids[(sorted_ids >= 0) & (sorted_ids < slots)]
            # every slot routed exactly once: a row the kernel never writes keeps its poison
            assert np.array_equal(np.sort(routed), np.arange(slots)), c.id
            assert sorted_ids.size == expert_ids.size * c.params["block_m"]
            used = moe.routed_experts(expert_ids, w.shape[0])
            if "hot" in c.id:
                assert used == 1, c.id
            if "skip" in c.id:
                assert used < w.shape[0], f"{c.id}: an expert with no rows"
                tail = sorted_ids[-2 * int(c.params["block_m"]) :]
                assert np.all(tail == slots) and expert_ids[-1] == -1 and expert_ids[-2] >= 0


def test_grouped_tolerance_grows_with_sqrt_k():
    atol = []
    for k in (256, 1024, 4096):
        x = formats.f32_to_bf16(np.ones((2, k), np.float32))
        w = formats.f32_to_bf16(np.full((1, 8, k), 1 / k, np.float32))
        ids, experts = np.array([0, 1] + [2] * 14, np.int32), np.array([0], np.int32)
        tol = golden.grouped_tolerance(x, w, ids, experts, 16, 1, False)
        assert tol.startswith("close:1.6e-2:")
        atol.append(float(tol.split(":")[2]))
    assert atol[1] / atol[0] == pytest.approx(2, rel=0.02)
    assert atol[2] / atol[1] == pytest.approx(2, rel=0.02)


def test_grouped_outputs_stay_inside_their_tolerance_under_fp32_sums(cases):
    """An FP32 emulation of the kernels' arithmetic (products exact, FP32 sums in k order, one
    BF16 rounding; SiLU on FP32 gate and up) lands within each case's tolerance."""
    for c in by_op(cases, "moe_grouped_gemm") + by_op(cases, "moe_grouped_gemm_silu"):
        if c.inputs[1].size > 2**20:
            continue  # the emulation is a Python loop over k: small cases only
        x, w, sorted_ids, expert_ids = c.inputs
        topk, block_m = int(c.params["topk"]), int(c.params["block_m"])
        xv, wv = formats.bf16_to_f32(x), formats.bf16_to_f32(w)
        acc = np.zeros((x.shape[0] * topk, w.shape[1]), np.float32)
        for b, e in enumerate(expert_ids):
            rows = sorted_ids[b * block_m : (b + 1) * block_m]
            rows = rows[(rows >= 0) & (rows < acc.shape[0])]
            if e < 0 or e >= w.shape[0] or rows.size == 0:
                continue
            part = np.zeros((rows.size, w.shape[1]), np.float32)
            for i in range(x.shape[1]):
                part += np.outer(xv[rows // topk, i], wv[e, :, i]).astype(np.float32)
            acc[rows] = part
        if c.op.endswith("silu"):
            gate, up = np.split(acc, 2, axis=1)
            acc = gate / (np.float32(1) + np.exp(-gate)) * up
        got = formats.bf16_to_f32(formats.f32_to_bf16(acc)).astype(np.float64)
        ref = golden.values("bfloat16", golden.expected_outputs(c)[0])
        _, rtol, atol = c.tolerance.split(":")
        assert np.all(np.abs(got - ref) <= float(atol) + float(rtol) * np.abs(ref)), c.id


def test_grouped_w4a16_cases_cover_the_edges(cases):
    """E = 60 at T = 1, topk = 1, an expert with no slot, G = 32, 64, 128 and K, a K tail, N
    ending inside a 256-channel block, every tile of rows (16, 32, 64: the average rows an
    expert gets decide), every slot routed once, and the weights in the repacked layout."""
    grouped = by_op(cases, "moe_grouped_gemm_w4a16")
    groups = set()
    tiles = set()
    for c in grouped:
        x, w, scales, sorted_ids, expert_ids = c.inputs
        t, k = x.shape
        e, groups_k, n = scales.shape
        topk, block_m = int(c.params["topk"]), int(c.params["block_m"])
        assert w.dtype == np.uint32 and w.shape == (e, n // 64, 8 * k), c.id
        assert scales.dtype == np.uint16 and k % groups_k == 0 and k % 32 == 0, c.id
        groups.add(k // groups_k if groups_k > 1 else "K")
        per_expert = -(-t * topk // e)
        tiles.add(16 if per_expert <= 16 else 32 if per_expert <= 32 else 64)
        slots = t * topk
        routed = sorted_ids[(sorted_ids >= 0) & (sorted_ids < slots)]
        assert np.array_equal(np.sort(routed), np.arange(slots)), c.id
        if "skip" in c.id:
            assert moe.routed_experts(expert_ids, e) < e
    shapes = [(c.inputs[0].shape, c.inputs[2].shape, c.params["topk"]) for c in grouped]
    assert any(x[0] == 1 and s[0] == 60 for x, s, _ in shapes), "E = 60 at T = 1"
    assert any(topk == 1 for _, _, topk in shapes), "topk = 1"
    assert {32, 64, 128, "K"} <= groups and tiles == {16, 32, 64}
    assert any(x[1] % 64 for x, _, _ in shapes), "a K tail past the last 64-k stage"
    assert any(s[2] % 256 for _, s, _ in shapes), "N ending inside a block"


def _w4a16_kernel_emulation(c, scales=None):
    """The kernels' arithmetic: W_hat rounded to BF16 per weight (HMUL2 of the exact q - 8 by
    the scale), exact products, FP32 sums in k order, one BF16 rounding."""
    x, w, scale_bits, sorted_ids, expert_ids = c.inputs
    scale_bits = scale_bits if scales is None else scales
    topk, block_m = int(c.params["topk"]), int(c.params["block_m"])
    w_bf16 = formats.bf16_to_f32(formats.f64_to_bf16(moe.w_hat_experts(w, scale_bits)))
    xv = formats.bf16_to_f32(x)
    acc = np.zeros((x.shape[0] * topk, w_bf16.shape[1]), np.float32)
    for b, e in enumerate(expert_ids):
        rows = sorted_ids[b * block_m : (b + 1) * block_m]
        rows = rows[(rows >= 0) & (rows < acc.shape[0])]
        if e < 0 or e >= w_bf16.shape[0] or rows.size == 0:
            continue
        part = np.zeros((rows.size, w_bf16.shape[1]), np.float32)
        for i in range(x.shape[1]):
            part += np.outer(xv[rows // topk, i], w_bf16[e, :, i]).astype(np.float32)
        acc[rows] = part
    return formats.bf16_to_f32(formats.f32_to_bf16(acc)).astype(np.float64)


def _within(c, got) -> bool:
    ref = golden.values("bfloat16", golden.expected_outputs(c)[0])
    _, rtol, atol = c.tolerance.split(":")
    return bool(np.all(np.abs(got - ref) <= float(atol) + float(rtol) * np.abs(ref)))


def test_grouped_w4a16_outputs_stay_inside_their_tolerance_and_a_wrong_group_does_not(cases):
    """The FP32 emulation of the kernels lands within each case's tolerance; the mutant's slip
    (each group multiplied by the next group's scale) lands outside wherever there are two
    groups or more."""
    for c in by_op(cases, "moe_grouped_gemm_w4a16"):
        assert _within(c, _w4a16_kernel_emulation(c)), c.id
        scales = c.inputs[2]
        if scales.shape[1] > 1:
            rotated = np.roll(scales, -1, axis=1)  # group g gets group g + 1's scales
            assert not _within(c, _w4a16_kernel_emulation(c, rotated)), c.id


def test_moe_sum_cases_and_tolerance(cases):
    sums = by_op(cases, "moe_sum")
    shapes = {c.inputs[0].shape for c in sums}
    assert any(s[1] == 1 for s in shapes) and any(s[0] == 1 for s in shapes)
    assert any(s[2] == 8 for s in shapes) and any(s[2] % 256 for s in shapes)
    for c in sums:
        y, w = c.inputs
        assert y.dtype == np.uint16 and w.dtype == np.float32 and w.shape == y.shape[:2]
        # the kernel's arithmetic: FP32 fused multiply-adds in j order, one rounding
        yv = formats.bf16_to_f32(y)
        acc = np.zeros((y.shape[0], y.shape[2]), np.float32)
        for j in range(y.shape[1]):
            acc = (acc.astype(np.float64) + w[:, j, None].astype(np.float64) * yv[:, j]).astype(
                np.float32
            )
        got = formats.bf16_to_f32(formats.f32_to_bf16(acc)).astype(np.float64)
        ref = golden.values("bfloat16", golden.expected_outputs(c)[0])
        _, rtol, atol = c.tolerance.split(":")
        assert np.all(np.abs(got - ref) <= float(atol) + float(rtol) * np.abs(ref)), c.id


def _grouped_sum_emulation(c, order_seed, reverse_weights=False):
    """The fused down GEMM's arithmetic: each routed slot's row in FP32 (sums in k order), times
    its weight in FP32, added into its token's FP32 row in an order the seed picks (blocks finish
    in any order), one BF16 rounding. reverse_weights: weight k − 1 − j on slot j's row."""
    h, w, sorted_ids, expert_ids, tw = c.inputs
    block_m = int(c.params["block_m"])
    t, topk = tw.shape
    weights = tw[:, ::-1] if reverse_weights else tw
    hv, wv = formats.bf16_to_f32(h), formats.bf16_to_f32(w)
    rows = {}
    for b, e in enumerate(expert_ids):
        slots = sorted_ids[b * block_m : (b + 1) * block_m]
        slots = slots[(slots >= 0) & (slots < t * topk)]
        if 0 <= e < w.shape[0] and slots.size:
            part = np.zeros((slots.size, w.shape[1]), np.float32)
            for i in range(h.shape[1]):
                part += np.outer(hv[slots, i], wv[e, :, i]).astype(np.float32)
            rows.update({int(s): part[r] for r, s in enumerate(slots)})
    acc = np.zeros((t, w.shape[1]), np.float32)
    for s in np.random.default_rng(order_seed).permutation(sorted(rows)):
        acc[s // topk] += np.float32(weights[s // topk, s % topk]) * rows[int(s)]
    return formats.bf16_to_f32(formats.f32_to_bf16(acc)).astype(np.float64)


def test_grouped_sum_cases_and_tolerance(cases):
    """moe_grouped_gemm_sum: the edges (decode's eight rows into one token, a masked token, N no
    multiple of 256), the fused arithmetic in two add orders inside the tolerance, the reversed
    weights outside it, and a masked token's row exactly 0."""
    sums = by_op(cases, "moe_grouped_gemm_sum")
    assert {"decode", "masked", "n200", "min"} <= {c.id.split("_")[4] for c in sums}
    for c in sums:
        h, w, _, _, tw = c.inputs
        assert h.shape[0] == tw.size and tw.dtype == np.float32 and c.params.keys() == {"block_m"}
        ref = golden.values("bfloat16", golden.expected_outputs(c)[0])
        assert ref.shape == (tw.shape[0], w.shape[1])
        if "masked" in c.id:
            assert np.all(ref[0] == 0), "token 0 has every slot masked"
        if w.size > 2**20:
            continue
        for seed in (0, 1):
            assert _within_ref(c, _grouped_sum_emulation(c, seed), ref), c.id
        if tw.shape[1] > 1:
            assert not _within_ref(c, _grouped_sum_emulation(c, 0, reverse_weights=True), ref), c.id


def _within_ref(c, got, ref):
    _, rtol, atol = c.tolerance.split(":")
    return bool(np.all(np.abs(got - ref) <= float(atol) + float(rtol) * np.abs(ref)))


def _block_chain_emulation(c, reverse_weights=False):
    """The chain's arithmetic: FP32 router weights (the reference's), gate_up in FP32, h =
    silu(gate)·up rounded to BF16, the down GEMM's rows in FP32 rounded to BF16, the weighted sum
    in FP32 in j order rounded to BF16. reverse_weights: the sum applies weight k − 1 − j to row j
    (the block's mutant)."""
    x, logits, w1, w2 = c.inputs
    topk = int(c.params["topk"])
    weights, ids = moe.topk_softmax(logits, topk, bool(c.params["renormalize"]))
    if reverse_weights:
        weights = weights[:, ::-1]
    xv, w1v, w2v = (formats.bf16_to_f32(a) for a in (x, w1, w2))
    d_ff = w2.shape[2]

    def rnd(a):
        return formats.bf16_to_f32(formats.f32_to_bf16(np.asarray(a, np.float32)))

    y = np.zeros((x.shape[0], x.shape[1]), np.float32)
    for j in range(topk):
        gate_up = np.einsum("tk,tnk->tn", xv, w1v[ids[:, j]]).astype(np.float32)
        gate, up = gate_up[:, :d_ff], gate_up[:, d_ff:]
        h = rnd(gate / (np.float32(1) + np.exp(-gate)) * up)
        down = rnd(np.einsum("tk,tnk->tn", h, w2v[ids[:, j]]).astype(np.float32))
        y = (y + weights[:, j, None] * down).astype(np.float32)
    return rnd(y).astype(np.float64)


def test_block_cases_cover_the_edges_and_the_chain_stays_inside_their_tolerance(cases):
    """moe_block: decode, E = 60, topk = 1 and a prefill-like T, renormalized or not; the chain's
    arithmetic (emulated) lands within each case's tolerance, the tolerance is a few per cent of
    the outputs at most (not vacuous), and the sum with its weights reversed lands outside
    wherever topk > 1."""
    blocks = by_op(cases, "moe_block")
    shapes = {(c.inputs[0].shape[0], int(c.params["topk"]), c.inputs[1].shape[1]) for c in blocks}
    assert {1, 300} <= {t for t, _, _ in shapes} and any(k == 1 for _, k, _ in shapes)
    assert any(e == 60 for _, _, e in shapes)
    assert {0.0, 1.0} == {c.params["renormalize"] for c in blocks}
    for c in blocks:
        ref = golden.values("bfloat16", golden.expected_outputs(c)[0])
        _, rtol, atol = c.tolerance.split(":")
        assert float(atol) < 0.05 * np.abs(ref).max(), c.id

        def within(got, ref=ref, rtol=float(rtol), atol=float(atol)):
            return np.all(np.abs(got - ref) <= atol + rtol * np.abs(ref))

        assert within(_block_chain_emulation(c)), c.id
        if c.params["topk"] > 1:
            assert not within(_block_chain_emulation(c, reverse_weights=True)), c.id


def test_block_rows_per_token_are_the_layer_reference(cases):
    """golden.moe_block_rows (the bench's sampled reference: per token, experts decoded when
    used) gives the layer reference's rounded outputs and the case's tolerance, on all rows and
    on a leading few."""
    for c in by_op(cases, "moe_block"):
        topk, renorm = int(c.params["topk"]), bool(c.params["renormalize"])
        want = golden.expected_outputs(c)[0]
        y, atol = golden.moe_block_rows(*c.inputs, topk, renorm, want.shape[0])
        np.testing.assert_array_equal(formats.f64_to_bf16(y), want)
        assert c.tolerance == f"close:8e-3:{atol:.3g}"
        few, _ = golden.moe_block_rows(*c.inputs, topk, renorm, 1)
        np.testing.assert_array_equal(formats.f64_to_bf16(few), want[:1])


# ---------------------------------------------------------------------------------------------
# The FP8 grouped GEMMs (v15): chapter 08's blockwise scales on chapter 09's schedule

FP8_OPS = {
    "moe_grouped_gemm_fp8": "store",
    "moe_grouped_gemm_silu_fp8": "silu",
    "moe_grouped_gemm_sum_fp8": "sum",
}


def _fp8_kernel_emulation(c, w_scales=None):
    """v15's arithmetic on a case: each 128-k block's sum in the tensor core as chapter 08's model
    has it (fp8_gemm.tc_accumulate, 32 products a step, 13 fraction bits), times the FP32 product
    x_scale * w_scale, added into an FP32 total; then the op's epilogue in FP32 (silu(g) * u; the
    weighted rows added into the token's FP32 row) and one BF16 rounding. w_scales: a replacement
    (the mutant's rotated copy)."""
    x, w, xs, ws = c.inputs[:4]
    sorted_ids, expert_ids = c.inputs[4], c.inputs[5]
    ws = ws if w_scales is None else w_scales
    epilogue = FP8_OPS[c.op]
    block_m = int(c.params["block_m"])
    tw = c.inputs[6] if epilogue == "sum" else None
    topk = tw.shape[1] if epilogue == "sum" else int(c.params["topk"])
    slots = (tw.shape[0] if epilogue == "sum" else x.shape[0]) * topk
    xv = formats.decode(x, formats.E4M3)  # (rows,K)
    k = x.shape[1]
    rows = np.zeros((slots, w.shape[1]), np.float32)
    for b, e in enumerate(expert_ids):
        run = sorted_ids[b * block_m : (b + 1) * block_m]
        run = run[(run >= 0) & (run < slots)]
        if not 0 <= e < w.shape[0] or run.size == 0:
            continue
        x_rows = run if epilogue == "sum" else run // topk
        wv = formats.decode(w[e], formats.E4M3)  # (N,K)
        w_scale = np.repeat(ws[e], fp8_gemm.BLOCK_N, axis=0)[: w.shape[1]]  # (N,KB)
        total = np.zeros((run.size, w.shape[1]), np.float32)
        for kb in range(k // fp8_gemm.BLOCK_K):
            acc = np.zeros_like(total)
            for k0 in range(kb * 128, kb * 128 + 128, fp8_gemm.MMA_K):
                products = xv[x_rows, None, k0 : k0 + 32] * wv[None, :, k0 : k0 + 32]
                acc = fp8_gemm.tc_accumulate(acc, products, fp8_gemm.TC_ACC_BITS)
            scale = (xs[kb, x_rows][:, None] * w_scale[None, :, kb]).astype(np.float32)
            total = (total + scale.astype(np.float64) * acc).astype(np.float32)
        rows[run] = total
    if epilogue == "store":
        out = rows
    elif epilogue == "silu":
        gate, up = np.split(rows, 2, axis=1)
        out = (gate / (np.float32(1) + np.exp(-gate)) * up).astype(np.float32)
    else:
        out = np.einsum("tj,tjn->tn", tw.astype(np.float32), rows.reshape(*tw.shape, -1))
    return formats.f32_to_bf16(out.astype(np.float32))


def test_grouped_fp8_cases_cover_the_edges(cases):
    """Each FP8 op has decode's few rows, T·topk no multiple of BLOCK_M, N ending inside a 128-row
    scale block (gate_up: up rows starting inside one), K of several blocks; the sum a masked
    token; every case routes each slot (but the masked ones) and holds chapter 08's layouts."""
    for op, epilogue in FP8_OPS.items():
        got = by_op(cases, op)
        assert got, op
        tags = {c.id[len(op) + 1 :].split("_")[0] for c in got}
        assert "decode" in tags and "min" in tags, op
        for c in got:
            x, w, xs, ws = c.inputs[:4]
            t_k = c.inputs[6].size if epilogue == "sum" else x.shape[0] * int(c.params["topk"])
            n, k = w.shape[1], w.shape[2]
            assert x.dtype == w.dtype == np.uint8 and xs.dtype == ws.dtype == np.float32, c.id
            assert xs.shape == (k // 128, x.shape[0]), c.id
            assert ws.shape == (w.shape[0], -(-n // 128), k // 128), c.id
            routed = c.inputs[4][(c.inputs[4] >= 0) & (c.inputs[4] < t_k)]
            if "masked" not in c.id:
                assert np.array_equal(np.sort(routed), np.arange(t_k)), c.id
        assert any(c.inputs[1].shape[1] % 128 for c in got), f"{op}: N inside a scale block"
        assert any(c.inputs[1].shape[2] >= 512 for c in got), f"{op}: several K blocks"
        assert any(
            (c.inputs[6].size if epilogue == "sum" else c.inputs[0].shape[0] * c.params["topk"])
            % c.params["block_m"] for c in got
        ), f"{op}: T·topk no multiple of BLOCK_M"
    silu = by_op(cases, "moe_grouped_gemm_silu_fp8")
    assert any((c.inputs[1].shape[1] // 2) % 128 for c in silu), "up rows start inside a block"
    masked = [c for c in by_op(cases, "moe_grouped_gemm_sum_fp8") if "masked" in c.id]
    assert masked and np.all(golden.expected_outputs(masked[0])[0][0] == 0)


def test_grouped_fp8_emulation_stays_inside_and_the_mutant_falls_outside(cases):
    """v15's arithmetic (chapter 08's tensor-core model, promotion every 128 k) lands inside each
    case's frob bound; the mutant's slip (each K block multiplied by the next block's weight
    scale, mutant_next_k_block_scale) lands far outside wherever K holds two blocks or more."""
    for op in FP8_OPS:
        for c in by_op(cases, op):
            if c.inputs[1].size > 2**21:
                continue
            ref = golden.expected_outputs(c)[0]
            bound = float(c.tolerance[len("frob:") :])
            ref = golden.values("bfloat16", ref)
            error = fp8_gemm.rel_frobenius_error(_fp8_kernel_emulation(c), ref)
            assert error <= bound, (c.id, error, bound)
            if op == "moe_grouped_gemm_fp8" and c.inputs[3].shape[2] > 1:
                rotated = np.roll(c.inputs[3], -1, axis=2)  # block kb gets block kb + 1's scale
                slip = fp8_gemm.rel_frobenius_error(_fp8_kernel_emulation(c, rotated), ref)
                assert slip > 10 * bound, (c.id, slip, bound)


def test_grouped_fp8_tolerance_gain_is_one_for_the_store_and_grows_with_silu():
    """The store passes the GEMM's error on unchanged; SiLU-and-mul weighs it by silu'(g)·u and
    silu(g) (a gain above 1 on N(0, 1) gate and up); the bound never drops below the two
    roundings."""
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((40, 64))
    plain = float(golden.grouped_fp8_tolerance_from_rows(rows, 512)[5:])
    silu = float(golden.grouped_fp8_tolerance_from_rows(rows, 512, "silu")[5:])
    e = fp8_gemm.error_bound(512) - fp8_gemm.BF16_TERM
    assert abs(plain - (2 * 2.0**-8 + e)) < 1e-6
    assert silu > plain
    weights = np.full((10, 4), 0.25)
    summed = float(golden.grouped_fp8_tolerance_from_rows(rows, 512, "sum", weights)[5:])
    assert summed >= 2 * 2.0**-8
