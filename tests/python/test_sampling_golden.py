"""lkw.golden's chapter 10 cases (top_k_mask_logits, top_k_renorm_probs, top_p_renorm_probs,
sample, rejection_sample): the ops with the signature the C++ registry declares and the tolerances
of the contract, the edges the chapter promises (disabled k of every spelling, k = 1 and V - 1, ties
at the k-th value, -inf and a k past the finite tokens, -0.0 beside +0.0, all-equal rows, V of 1, 2,
5 and not a multiple of 4 or 256, Llama-3's V = 128256; for top-p: p = 1, p keeping only the top tie
group, p cut from the rows, cuts after tie groups, zeros, rows not summing to 1, no token a float32
sum could misjudge, and a dyadic case whose tokens exactly on the boundary are dropped; for sample:
rows that admit one token whatever the uniforms, greedy with and without filters, ties and -inf,
k = 1, min_p = 1, a p keeping the top token, bfloat16 logits; for rejection_sample: the uniforms the
kernel draws, all drafts accepted, a rejection at p = 0, an acceptance at q = 0, an empty residual),
drawn from the session seed so that every seed is checked in time; the data catch the usual
mistakes (a tie split by index, k >= V read as a filter, -0.0 copied, an inclusive top-p boundary,
the crossing token dropped, p not scaled by the row's sum, a greedy tie to the last index, q and p
swapped); and a chapter that stays small on disk."""

import re
import zlib
from collections import Counter

import ml_dtypes
import numpy as np
import pytest
from conftest import SEED
from lkw import golden, sampling

F32, I32, I64 = "float32", "int32", "int64"
MASK, RENORM, TOP_P = "top_k_mask_logits", "top_k_renorm_probs", "top_p_renorm_probs"
SAMPLE, REJECTION = "sample", "rejection_sample"
SIGNATURES = {
    MASK: ([F32, I32], [F32]),
    RENORM: ([F32, I32], [F32]),
    TOP_P: ([F32, F32], [F32]),
    SAMPLE: (["float32|bfloat16", F32, I32, F32, F32, I64], [I32]),
    REJECTION: ([F32, I32, F32, I64], [I32, I32]),
}


def chapter_rng():
    return np.random.default_rng([SEED, zlib.crc32(b"10_sampling")])


@pytest.fixture(scope="module")
def cases():
    return golden.sampling_cases(chapter_rng())


@pytest.fixture(scope="module")
def expected(cases):
    return {c.id: golden.expected_outputs(c) for c in cases}


@pytest.fixture(scope="module")
def outputs(expected):
    return {case_id: out[0] for case_id, out in expected.items()}


def by_op(cases, op):
    return [c for c in cases if c.op == op]


def rows(cases, op):
    """(case, row index, x row, k, kept count) of every row of the op's cases."""
    out = []
    for c in by_op(cases, op):
        x, top_k = c.inputs
        keep = sampling.top_k_keep(x, top_k)
        out += [(c, r, x[r], int(top_k[r]), int(keep[r].sum())) for r in range(x.shape[0])]
    return out


def enabled(k: int, v: int) -> bool:
    return 0 < k < v


def test_the_ops_have_cases_the_contracted_signature_and_tolerance(cases, expected):
    assert {c.op for c in cases} == set(SIGNATURES) == set(golden.SAMPLING_OPS)
    assert golden.CHAPTERS["10_sampling"] is golden.sampling_cases
    assert golden.OPS[TOP_P].fn is sampling.top_p_renorm_probs
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-z0-9_]+", i) for i in ids)
    for op, (ins, outs) in SIGNATURES.items():
        assert list(golden.OPS[op].inputs) == ins and list(golden.OPS[op].outputs) == outs
        assert golden.OPS[op].params == () and golden.OPS[op].init == 0
    # .scratch/ch10_spec.md: the mask bit-exact, the renormalized probs within 2^-14 relative,
    # tokens and counts exact.
    assert sampling.PROB_RTOL == 2.0**-14
    renorm = "close:6.103515625e-05:0"
    assert golden.SAMPLING_TOLERANCES == {
        MASK: "exact",
        RENORM: renorm,
        TOP_P: renorm,
        SAMPLE: "exact",
        REJECTION: "exact/exact",
    }
    for c in cases:
        assert c.tolerance == golden.SAMPLING_TOLERANCES[c.op] and c.params == {}
        golden.check_case(c, expected[c.id])  # stored dtypes, no all-zero input


def test_each_op_s_cases_come_after_the_earlier_ops_whose_data_they_leave_unchanged(cases):
    """One rng stream per chapter: top-k draws first, then top-p, then sample, then
    rejection_sample, so that adding an op left the earlier ops' files byte for byte as before."""
    rng = chapter_rng()
    top_k = [(op, v, rows) for op in golden.TOP_K_OPS for _, v, rows in golden.SAMPLING_CASES]
    ops = [op for op, _, _ in top_k] + [TOP_P] * (len(golden.TOP_P_CASES) + 1)
    ops += [SAMPLE] * len(golden.SAMPLE_CASES) + [REJECTION] * len(golden.REJECTION_CASES)
    assert [c.op for c in cases] == ops
    replayed = [golden.sampling_inputs(rng, op, v, rows) for op, v, rows in top_k]
    replayed += [golden.top_p_inputs(rng, v, rows) for _, v, rows in golden.TOP_P_CASES]
    replayed.append(golden.top_p_dyadic_inputs(rng))
    for c, inputs in zip(cases, replayed, strict=False):
        for want, got in zip(inputs, c.inputs, strict=True):
            assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), c.id


@pytest.mark.parametrize("op", [MASK, RENORM])
def test_shapes_cover_small_odd_and_llama_vocabularies(cases, outputs, op):
    shapes = set()
    for c in by_op(cases, op):
        x, top_k = c.inputs
        b, v = x.shape
        assert x.dtype == np.float32 and top_k.dtype == np.int32 and top_k.shape == (b,)
        assert outputs[c.id].shape == (b, v) and outputs[c.id].dtype == np.float32
        assert c.id.endswith(f"_b{b}_v{v}")
        shapes.add((b, v))
    assert {b for b, _ in shapes} == {1, 3, 7}
    assert {1, 2, 5, 1000, 32000, 128256} <= {v for _, v in shapes}
    assert {b for b, v in shapes if v == 128256} == {1}
    assert any(v % 4 and v > 1024 for _, v in shapes), "a long row that is not whole 16-byte units"
    assert any(v % 256 and v > 256 for _, v in shapes), "a row that is not whole 256-bin passes"


@pytest.mark.parametrize("op", [MASK, RENORM])
def test_k_mixes_every_disabled_spelling_one_v_minus_one_and_mid_values(cases, op):
    ks = [(k, x.size) for _, _, x, k, _ in rows(cases, op)]
    assert {0, -1} <= {k for k, _ in ks}
    assert any(k == v for k, v in ks) and any(k == v + 5 for k, v in ks), "k = V, k > V"
    assert any(k == 1 and v > 2 for k, v in ks), "k = 1"
    assert any(k == v - 1 and v > 2 for k, v in ks), "k = V - 1"
    assert any(1 < k < v - 1 for k, v in ks), "mid values"
    assert {1024, 50} <= {k for k, _ in ks}, "the bench's k"
    for c, r, x, k, kept in rows(cases, op):
        if not enabled(k, x.size):
            assert kept == x.size, f"{c.id} row {r}: a disabled k keeps the row"


@pytest.mark.parametrize("op", [MASK, RENORM])
def test_ties_at_the_kth_value_keep_more_than_k(cases, op):
    tied = [
        (c, x, k, kept) for c, _, x, k, kept in rows(cases, op) if enabled(k, x.size) and kept > k
    ]
    assert any(k == 1 and kept == 2 for _, _, k, kept in tied), "the maximum twice, k = 1"
    assert any(k > 1 and x.size >= 1000 for _, x, k, _ in tied), "a tie group inside a long row"
    assert any(x.size == 128256 for _, x, _, _ in tied), "ties in the V = 128256 row"
    for c, x, k, kept in tied:
        kth = -np.sort(-x)[k - 1]
        assert kept == np.sum(x >= kth) and np.sum(x > kth) < k, c.id
    equal = [
        (x, k, kept)
        for _, _, x, k, kept in rows(cases, op)
        if np.all(x == x[0]) and x.size > 2 and enabled(k, x.size)
    ]
    assert equal and all(kept == x.size for x, _, kept in equal), "an all-equal row is kept whole"


def test_logits_hold_neg_inf_and_a_k_past_the_finite_tokens(cases, outputs):
    mine = rows(cases, MASK)
    assert sum(np.isneginf(x).any() for _, _, x, _, _ in mine) >= 3
    past = [(c, r, x) for c, r, x, k, _ in mine if enabled(k, x.size) and np.isfinite(x).sum() < k]
    assert any(x.size >= 1000 and np.isneginf(x).mean() > 0.9 for _, _, x in past), "mostly -inf"
    for c, r, x in past:  # the k-th value is -inf: every token is kept, -inf stays -inf
        assert np.array_equal(outputs[c.id][r], x + np.float32(0)), c.id
    for c in by_op(cases, MASK):
        x, out = c.inputs[0], outputs[c.id]
        assert not np.isnan(x).any() and not np.isposinf(x).any()
        kept = out != -np.inf
        assert np.array_equal(out[kept], x[kept] + np.float32(0)), "kept tokens copied"
        assert np.array_equal(
            kept | np.isneginf(x), sampling.top_k_keep(x, c.inputs[1]) | np.isneginf(x)
        )


def test_a_kept_negative_zero_is_written_as_positive_zero(cases, outputs):
    seen = 0
    for c in by_op(cases, MASK):
        x, out = c.inputs[0], outputs[c.id]
        zero = x == 0
        kept_negative = np.any(zero & np.signbit(x) & (out == 0), axis=1)  # (B,)
        seen += int(np.sum(kept_negative & np.any(zero & ~np.signbit(x), axis=1)))
        assert not np.any(np.signbit(out) & (out == 0)), f"{c.id}: -0.0 in the expected output"
    assert seen >= 2, "rows holding +0.0 and -0.0 with a -0.0 kept"
    # A row whose k-th value is a zero: both signs kept.
    at_zero = [
        (x, k)
        for _, _, x, k, _ in rows(cases, MASK)
        if enabled(k, x.size) and -np.sort(-x)[k - 1] == 0 and np.signbit(x[x == 0]).any()
    ]
    assert any(x.size >= 1000 for x, _ in at_zero) and any(x.size <= 5 for x, _ in at_zero)


def test_probs_are_float32_softmax_rows_with_exact_and_negative_zeros(cases, outputs):
    mine = by_op(cases, RENORM)
    zeros = negative = past = 0
    for c in mine:
        p, top_k = c.inputs
        assert np.all(np.isfinite(p)) and not np.any(p < 0)
        if p.shape[1] > 1:  # one token's probs are scaled: they need not sum to 1
            assert np.allclose(p.astype(np.float64).sum(axis=1), 1, rtol=1e-5)
        zeros += int(np.sum(p == 0))
        negative += int(np.sum((p == 0) & np.signbit(p)))
        past += sum(enabled(int(k), p.shape[1]) and np.sum(row > 0) < k for row, k in zip(p, top_k))
        out = outputs[c.id]
        keep = sampling.top_k_keep(p, top_k)
        assert np.all(out[~keep] == 0), "dropped tokens exactly 0"
        assert np.allclose(out.astype(np.float64).sum(axis=1), 1, rtol=1e-5)
    assert zeros >= 100 and negative >= 2 and past >= 2


def test_the_cases_catch_a_split_tie_a_filter_at_k_ge_v_and_a_copied_negative_zero(cases, outputs):
    """What a kernel gets wrong, and the data must show: keeping exactly k (ties cut by index),
    reading k >= V as a filter (clamped to V - 1) or k <= 0 as k = 1, and copying -0.0."""

    def mask_of(x, keep):
        return np.where(keep, x + np.float32(0), np.float32(-np.inf)).astype(np.float32)

    def exactly_k(x, top_k):
        keep = np.ones(x.shape, bool)
        for r, k in enumerate(top_k):
            if 0 < k < x.shape[1]:
                keep[r] = False
                keep[r, np.argsort(-x[r], kind="stable")[:k]] = True
        return keep

    def clamped(x, top_k):
        return sampling.top_k_keep(
            x, np.clip(top_k, 1, x.shape[1] - 1) if x.shape[1] > 1 else top_k
        )

    def differs(c, got):
        want = outputs[c.id]
        if c.op == MASK:
            return not np.array_equal(got.view(np.uint32), want.view(np.uint32))
        return not np.all(
            np.abs(got.astype(np.float64) - want) <= sampling.PROB_RTOL * np.abs(want)
        )

    for op in (MASK, RENORM):
        for mutant in (exactly_k, clamped):
            caught = []
            for c in by_op(cases, op):
                x, top_k = c.inputs
                keep = mutant(x, top_k)
                got = (
                    mask_of(x, keep) if op == MASK else sampling.renorm(x.astype(np.float64), keep)
                )
                caught.append(differs(c, got))
            assert any(caught), f"{op}: {mutant.__name__} passes every case"
    copied = [
        c
        for c in by_op(cases, MASK)
        if differs(c, np.where(outputs[c.id] == 0, c.inputs[0], outputs[c.id]))
    ]
    assert copied, "a kernel that copies -0.0 passes every case"


# ---------------------------------------------------------------------------------------------
# top_p_renorm_probs


def top_p_rows(cases, dyadic=False):
    """(case, row index, probs row, p, keep row) of every row of the top-p cases, the dyadic case's
    alone (dyadic) or every other case's."""
    out = []
    for c in by_op(cases, TOP_P):
        if ("_dyadic_" in c.id) == dyadic:
            probs, top_p = c.inputs
            keep = sampling.top_p_keep(*sampling.from_probs(probs), top_p)
            out += [(c, r, probs[r], float(top_p[r]), keep[r]) for r in range(probs.shape[0])]
    return out


def groups_kept(row, keep):
    """(tie groups kept, groups of positive mass, size of the last group kept)."""
    values, sizes, _ = golden.tie_groups(row)
    kept = int(np.sum(values >= row[keep].min()))
    return kept, int(np.sum(values > 0)), int(sizes[kept - 1])


def renorm_differs(want, got) -> bool:
    return not np.all(np.abs(got.astype(np.float64) - want) <= sampling.PROB_RTOL * np.abs(want))


def test_top_p_shapes_cover_small_odd_and_llama_vocabularies(cases, outputs):
    shapes = set()
    for c in by_op(cases, TOP_P):
        probs, top_p = c.inputs
        b, v = probs.shape
        assert probs.dtype == np.float32 and top_p.dtype == np.float32 and top_p.shape == (b,)
        assert outputs[c.id].shape == (b, v) and outputs[c.id].dtype == np.float32
        assert c.id.endswith(f"_b{b}_v{v}")
        assert np.all((top_p > 0) & (top_p <= 1)), "the reference refuses other p"
        shapes.add((b, v))
    assert {1, 2, 5, 1000, 4099, 32000, 128256} <= {v for _, v in shapes}
    assert {b for b, v in shapes if v == 128256} == {1}


def test_top_p_mixes_disabled_top_group_only_and_cuts_from_the_rows(cases, outputs):
    found = {"disabled": 0, "top group only": 0, "cut inside the row": 0}
    for c, r, row, p, keep in top_p_rows(cases):
        kept, positive, _ = groups_kept(row, keep)
        if p == 1:
            found["disabled"] += 1
            assert keep.all(), f"{c.id} row {r}: p = 1 keeps the row, zeros included"
        elif kept == 1:
            found["top group only"] += 1
        elif kept < positive:
            found["cut inside the row"] += int(row.size >= 1000)
        out = outputs[c.id][r]
        assert np.all(out[~keep] == 0), "dropped tokens exactly 0"
        assert out.astype(np.float64).sum() == pytest.approx(1, rel=1e-5)
    assert found["disabled"] >= 3 and found["top group only"] >= 5, found
    assert found["cut inside the row"] >= 8, found
    # p from the rows: across the range of p, and past the first few groups (over 200 seeds the
    # smallest p was at most 0.36, the largest at least 0.95, the deepest cut 5 groups or more).
    ps = [p for _, _, _, p, _ in top_p_rows(cases) if p < 1]
    assert min(ps) < 0.45 and max(ps) > 0.9
    assert any(groups_kept(row, keep)[0] >= 4 for _, _, row, p, keep in top_p_rows(cases))


def test_top_p_cases_hold_no_uncertain_token_and_p_sits_mid_gap(cases):
    """Outside the dyadic case, every p lies at least TOP_P_GAP / 2 (less p's own float32
    rounding) from each cumulative mass of its row's tie groups, so no float32 summation can move
    a token across (the golden compare has no exemption)."""
    for c in by_op(cases, TOP_P):
        if "_dyadic_" not in c.id:
            probs, top_p = c.inputs
            keys, mass = sampling.from_probs(probs)
            assert not sampling.uncertain_tokens(keys, mass, top_p=top_p).any(), c.id
    for c, r, row, p, _ in top_p_rows(cases):
        if p < 1:
            _, _, cum = golden.tie_groups(row)
            edges = np.r_[0.0, cum]
            assert np.min(np.abs(edges - p)) >= golden.TOP_P_GAP / 2 - 2.0**-25, (c.id, r)


def test_top_p_cuts_after_tie_groups(cases):
    tied = []
    for c, _, row, p, keep in top_p_rows(cases):
        kept, positive, last = groups_kept(row, keep)
        if p < 1 and kept < positive and last >= 2:
            tied.append((row.size, kept))
    assert any(kept == 1 for _, kept in tied), "the top group, the maximum twice"
    assert any(kept > 1 and v >= 1000 for v, kept in tied), "a tie group inside a long row"
    assert any(v == 128256 for v, _ in tied), "a cut after a tie group at V = 128256"
    equal = [k for _, _, row, p, k in top_p_rows(cases) if p < 1 and np.all(row == row[0])]
    assert equal and all(k.all() for k in equal), "an all-equal row is kept whole"


def test_top_p_rows_hold_zeros_negative_zeros_and_sums_other_than_one(cases):
    zeros = negative = unnormalized = 0
    for _, _, row, p, keep in top_p_rows(cases):
        assert np.all(np.isfinite(row)) and not np.any(row < 0)
        zeros += int(np.sum(row == 0))
        negative += int(np.sum((row == 0) & np.signbit(row)))
        total = row.astype(np.float64).sum()
        unnormalized += abs(total - 1) > 0.1
        assert p == 1 or not np.any(keep & (row == 0)), "p < 1 never keeps a zero"
    assert zeros >= 1000 and negative >= 500 and unnormalized >= 6
    assert any(abs(row.sum() - 1) > 0.1 for _, _, row, _, _ in top_p_rows(cases) if row.size == 1)


def test_the_dyadic_case_drops_the_tokens_on_the_boundary(cases, outputs):
    """Dyadic probs: every float32 sum is exact in any order, so the tokens whose strictly
    larger mass is exactly p * M must be dropped by every kernel (the only case where the
    reference calls tokens uncertain)."""
    (c,) = [c for c in by_op(cases, TOP_P) if "_dyadic_" in c.id]
    probs, top_p = c.inputs
    keys, mass = sampling.from_probs(probs)
    gt = sampling.greater_mass(keys, mass)
    limit = top_p.astype(np.float64) * mass.sum(axis=1)  # (B,)
    on = gt == limit[:, None]  # (B,V) exactly on the boundary
    assert np.all(mass * 2**9 == np.round(mass * 2**9)) and np.all(probs.sum(axis=1) <= 2)
    rng = np.random.default_rng(0)
    for row, m in zip(probs, mass):  # float32 sums in three orders, all exact
        for order in (np.argsort(row), np.argsort(-row), rng.permutation(row.size)):
            assert np.cumsum(row[order], dtype=np.float32)[-1] == m.sum()
    out = outputs[c.id]
    assert on[:5].any(axis=1).all(), "rows 0-4 put tokens on the boundary"
    assert np.all(out[on] == 0) and not np.any(sampling.top_p_keep(keys, mass, top_p) & on)
    assert (on.sum(axis=1)[2:4] >= [3, 256]).all(), "tie groups of 3 and 256 on the boundary"
    assert sampling.uncertain_tokens(keys, mass, top_p=top_p)[on].all()
    keep = out > 0
    assert keep[5].sum() == 2 and gt[5][keep[5]].max() == 0.5 < limit[5], "the crossing token"
    assert keep[6].sum() == 2 and np.all(probs[6][keep[6]] == probs[6].max()), "p = 2^-24"
    assert sampling.keep_mismatches(keep, keys, mass, exact=True, top_p=top_p).size == 0


def test_top_p_cases_catch_the_usual_mistakes(cases, outputs):
    """An inclusive boundary (M_gt <= p M: only the dyadic case can show it), tie groups split by
    index, the token carrying the sum across p dropped, p not scaled by the row's mass."""

    def inclusive(keys, mass, gt, p):
        return (gt <= p[:, None] * mass.sum(axis=1, keepdims=True)) | (p >= 1)[:, None]

    def split_ties(keys, mass, gt, p):
        keep = np.ones(keys.shape, bool)
        for r in np.flatnonzero(p < 1):
            order = np.argsort(-keys[r], kind="stable")
            before = np.cumsum(mass[r, order]) - mass[r, order]
            keep[r, order] = before < p[r] * mass[r].sum()
        return keep

    def drops_crossing(keys, mass, gt, p):
        top = keys == keys.max(axis=1, keepdims=True)
        reached = gt + mass < p[:, None] * mass.sum(axis=1, keepdims=True)
        return top | reached | (p >= 1)[:, None]

    def unscaled(keys, mass, gt, p):
        return (gt < p[:, None]) | (p >= 1)[:, None]

    for mutant in (inclusive, split_ties, drops_crossing, unscaled):
        caught = []
        for c in by_op(cases, TOP_P):
            probs, top_p = c.inputs
            keys, mass = sampling.from_probs(probs)
            keep = mutant(keys, mass, sampling.greater_mass(keys, mass), top_p.astype(np.float64))
            caught.append((c.id, renorm_differs(outputs[c.id], sampling.renorm(mass, keep))))
        assert any(hit for _, hit in caught), f"{mutant.__name__} passes every case"
        if mutant is inclusive:
            assert [i for i, hit in caught if hit] == [i for i, _ in caught if "_dyadic_" in i]


# ---------------------------------------------------------------------------------------------
# sample

U_HIGH = np.float32(0.999999)  # the far end of [0, 1) from u = 0: another token if there is one


def sample_logits(c) -> np.ndarray:
    """A sample case's logits as float32 [B, V] (bfloat16 bits widened)."""
    logits = c.inputs[0]
    if logits.dtype == np.uint16:
        return logits.view(ml_dtypes.bfloat16).astype(np.float32)
    return logits


def sample_rows(cases, outputs):
    """(case, logits row [V] float32, T, k, p, min_p, expected token) of every sample row."""
    out = []
    for c in by_op(cases, SAMPLE):
        x, (t, k, p, mp) = sample_logits(c), c.inputs[1:5]
        out += [(c, x[r], t[r], int(k[r]), p[r], mp[r], outputs[c.id][r]) for r in range(len(t))]
    return out


def filters_off(v, k, p, mp) -> bool:
    return not enabled(k, v) and p == 1 and mp == 0


def test_sample_shapes_dtypes_and_vocabularies(cases, outputs):
    shapes, dtypes = set(), []
    for c in by_op(cases, SAMPLE):
        logits, *params, seed_offset = c.inputs
        b, v = logits.shape
        assert c.id.endswith(f"_b{b}_v{v}")
        assert [a.dtype for a in params] == [np.float32, np.int32, np.float32, np.float32]
        assert all(a.shape == (b,) for a in params)
        assert seed_offset.dtype == np.int64 and seed_offset.shape == (2,) and seed_offset[1] >= 0
        assert outputs[c.id].shape == (b,) and outputs[c.id].dtype == np.int32
        dtypes.append(golden.record_dtypes(golden.OPS[SAMPLE].inputs, c.inputs)[0])
        assert logits.dtype == golden.DTYPES[dtypes[-1]][0]
        shapes.add((b, v))
    assert {1, 2, 5, 1000, 4099, 32000, 128256} <= {v for _, v in shapes}
    assert {b for b, v in shapes if v == 128256} == {1}
    assert dtypes.count("bfloat16") == 1 and dtypes.count("float32") == len(dtypes) - 1


def test_sample_rows_admit_one_token_whatever_the_uniforms(cases, outputs):
    """v3 spends a uniform per round and v4 one on its inverse CDF: the golden token must be the
    only one either could return. Greedy rows take the lowest index of max x; every other row
    keeps exactly one token of positive mass, with no token near a threshold, so u = 0, u near 1,
    the kernel's first Philox uniform (v4) and its rounds of them (v3, the pivot sampler) agree."""
    for c in by_op(cases, SAMPLE):
        x, (t, k, p, mp, seed_offset) = sample_logits(c), c.inputs[1:]
        filters = {"top_k": k, "top_p": p, "min_p": mp}
        b, want = x.shape[0], outputs[c.id]
        assert golden.sample_determined(x, t, **filters).all(), c.id
        u_kernel = sampling.philox_uniforms(*seed_offset, b, 64)  # (B,64) the row's stream
        for u in (np.zeros(b, np.float32), np.full(b, U_HIGH), u_kernel[:, 0]):
            assert np.array_equal(sampling.sample(x, u, t, **filters), want), c.id
        greedy = t == 0
        assert np.array_equal(want[greedy], np.argmax(x[greedy], axis=1)), c.id
        keys, mass = sampling.from_logits(x[~greedy], t[~greedy])
        hot = {name: f[~greedy] for name, f in filters.items()}
        keep = sampling.filter_keep(keys, mass, **hot)
        assert not sampling.uncertain_tokens(keys, mass, **hot).any(), c.id
        single = keep & (mass > 0)  # (B',V) the tokens a sampled row can return
        assert np.array_equal(
            np.flatnonzero(single),
            np.ravel_multi_index((np.arange(len(keys)), want[~greedy]), single.shape),
        ), c.id
        tokens, _, _ = sampling.pivot_rejection_sample(keys, mass, keep, u_kernel[~greedy])
        assert np.array_equal(tokens, want[~greedy]), c.id


def test_sample_rows_cover_greedy_filters_ties_neg_inf_and_one_token_filters(cases, outputs):
    found = Counter()
    for c, x, t, k, p, mp, token in sample_rows(cases, outputs):
        v, bf16 = x.size, c.inputs[0].dtype == np.uint16
        off = filters_off(v, k, p, mp)
        if t == 0:
            found["greedy"] += off
            found["greedy, every filter set"] += enabled(k, v) and p < 1 and mp > 0
            ties = np.flatnonzero(x == x.max())
            assert token == ties[0], c.id
            found["greedy tie"] += ties.size >= 2
            found["greedy tie, V >= 1000"] += ties.size >= 2 and v >= 1000
            found["greedy tie, bfloat16"] += ties.size >= 2 and bf16
            found["greedy with -inf"] += bool(np.isneginf(x).any())
            continue
        assert golden.SAMPLE_TEMPERATURE[0] <= t < golden.SAMPLE_TEMPERATURE[1]
        if v == 1:
            found["V = 1"] += 1
            continue
        found["k = 1"] += k == 1 and p == 1 and mp == 0
        found["k = 1 with -inf"] += k == 1 and bool(np.isneginf(x).any())
        found["min_p = 1"] += mp == 1 and p == 1 and not enabled(k, v)
        found["top_p alone"] += p < 1 and mp == 0 and not enabled(k, v)
        found["k, p and min_p"] += enabled(k, v) and p < 1 and mp > 0
        found["k, p and min_p at V = 128256"] += enabled(k, v) and p < 1 and v == 128256
        found["bfloat16 sampled"] += bf16
        if np.isfinite(x).sum() == 1:
            assert token == np.flatnonzero(np.isfinite(x))[0]
            found["one finite logit, no filter"] += off
    assert len(found) == 15 and all(found.values()), found
    ks = [(k, x.size) for _, x, _, k, p, mp, _ in sample_rows(cases, outputs) if x.size > 1]
    assert any(k <= 0 for k, _ in ks) and any(k >= v for k, v in ks), "k off, both spellings"


def test_sample_cases_catch_a_greedy_tie_broken_to_the_last_index(cases, outputs):
    caught = False
    for c in by_op(cases, SAMPLE):
        x, t = sample_logits(c), c.inputs[1]
        last = x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1)
        caught |= not np.array_equal(np.where(t == 0, last, outputs[c.id]), outputs[c.id])
    assert caught


# ---------------------------------------------------------------------------------------------
# rejection_sample


def requests(cases, expected):
    """(case, q [S, V], draft tokens [S], p [S + 1, V], tokens [S + 1], num_accepted) of every
    request of the rejection_sample cases."""
    out = []
    for c in by_op(cases, REJECTION):
        q, drafts, p, _ = c.inputs
        tokens, n = expected[c.id]
        out += [(c, q[r], drafts[r], p[r], tokens[r], int(n[r])) for r in range(len(n))]
    return out


def swapped(c):
    """The mutant's output: rejection_sample with draft and target exchanged (the C++ mutant runs
    v5 on q' = p[:, :S], p' = [q, p[:, S]]): accept iff u p < q, the residual (q - p)+, an empty
    one falling back to q, the bonus token still from p[S]."""
    q, drafts, p, seed_offset = c.inputs
    s = drafts.shape[1]
    return golden.rejection_expected(
        p[:, :s], drafts, np.concatenate([q, p[:, s:]], 1), seed_offset
    )


def test_rejection_shapes_dtypes_and_vocabularies(cases, expected):
    shapes = set()
    for c in by_op(cases, REJECTION):
        q, drafts, p, seed_offset = c.inputs
        b, s, v = q.shape
        assert c.id.endswith(f"_b{b}_s{s}_v{v}") and b <= 8
        assert q.dtype == p.dtype == np.float32 and drafts.dtype == np.int32
        assert drafts.shape == (b, s) and p.shape == (b, s + 1, v)
        assert seed_offset.dtype == np.int64 and seed_offset.shape == (2,) and seed_offset[1] >= 0
        assert np.all((drafts >= 0) & (drafts < v))
        assert np.all(np.isfinite(q) & (q >= 0)) and np.all(np.isfinite(p) & (p >= 0))
        tokens, n = expected[c.id]
        assert (
            tokens.dtype == n.dtype == np.int32 and tokens.shape == (b, s + 1) and n.shape == (b,)
        )
        shapes.add((s, v))
    assert {s for s, _ in shapes} == {1, 4, 7} and {v for _, v in shapes} == {5, 1000, 4099, 32000}


def test_rejection_expectations_are_the_reference_on_the_kernel_s_uniforms(cases, expected):
    """Request b draws u_0 .. u_S from Philox subsequence b (lkw.sampling.philox_uniforms): u_s
    tests draft s, u_S picks the last token; no request's last token lies within MARGIN of a CDF
    boundary, where a float32 prefix sum could pick its neighbour."""
    for c in by_op(cases, REJECTION):
        q, drafts, p, (seed, offset) = c.inputs
        b, s, v = q.shape
        u = sampling.philox_uniforms(seed, offset, b, s + 1)  # (B,S+1)
        tokens, n, unsure = sampling.rejection_sample(
            q, drafts, p, u[:, :s], u[:, s], with_uncertain=True
        )
        assert not unsure.any(), c.id
        assert np.array_equal(tokens, expected[c.id][0]) and np.array_equal(n, expected[c.id][1])
        for row, count, draft in zip(tokens, n, drafts):
            assert np.array_equal(row[:count], draft[:count]) and 0 <= row[count] < v
            assert np.all(row[count + 1 :] == sampling.PLACEHOLDER), c.id


def test_rejection_requests_accept_reject_and_fall_back_as_the_contract_says(cases, expected):
    found = Counter()
    for c, q, drafts, p, tokens, n in requests(cases, expected):
        s = drafts.size
        q_x, p_x = q[np.arange(s), drafts], p[np.arange(s), drafts]  # (S,) at the drafts
        last = tokens[n]
        if n == s:
            assert p[s, last] > 0, "the bonus token from p[S]"
        else:
            residual = np.maximum(p[n] - q[n], np.float32(0))
            empty = not residual.any()
            assert (p[n, last] if empty else residual[last]) > 0, c.id
            found["empty residual: p[s0]"] += empty
            found["rejected where p > 0"] += bool(p_x[n] > 0)
            found["stopped inside the chain"] += n > 0
        if np.array_equal(q, p[:s]):
            assert n == s, c.id
            found["q = p: all accepted"] += 1
        if np.all(q_x == 0) and np.all(p_x > 0):
            assert n == s, c.id
            found["q = 0, p > 0: accepted"] += 1
        zero = np.flatnonzero(p_x == 0)
        if zero.size and np.array_equal(q[: zero[0]], p[: zero[0]]):
            assert n == zero[0], c.id
            found["p = 0: rejected"] += 1
        found["accepted with q > p"] += bool(np.any((q_x > p_x)[:n]))
    assert len(found) == 7 and all(found.values()), found
    built = ("q = p: all accepted", "q = 0, p > 0: accepted", "p = 0: rejected")
    assert all(found[name] >= 3 for name in built), found  # REJECTION_CASES build 3 or more


def test_rejection_cases_catch_q_and_p_swapped(cases, expected):
    """The mutant's acceptances differ from the contract's (they are decided bit for bit, so a
    kernel of it cannot pass by rounding): a q = 0 draft with p > 0 is rejected, a p = 0 one
    accepted."""
    caught = [not np.array_equal(swapped(c)[1], expected[c.id][1]) for c in by_op(cases, REJECTION)]
    assert sum(caught) >= 3, caught


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    golden.write_chapter(out, "10_sampling", 7)
    return out / "10_sampling"


def test_the_manifest_names_each_sample_case_s_logits_dtype(written):
    lines = (written / "manifest.txt").read_text().splitlines()
    logits = {
        f[1]: f[3]
        for f in map(str.split, lines)
        if f[0] == "in" and f[1].startswith("sample_") and f[2] == "0"
    }
    assert logits == {
        f"sample_{tag}_b{len(rows)}_v{v}": dtype for tag, v, dtype, rows in golden.SAMPLE_CASES
    }
    assert any(f"in   {i} 5 int64 {i}.in5.npy" in lines for i in logits), "seed_offset int64"


def test_the_chapter_is_a_few_megabytes_on_disk(written):
    """About 6.5 MB: the four V = 128256 rows the chapter promises (the renormalizing ops' in and
    out, sample's logits) are 3.6 MB of it, rejection_sample's q and p 0.75 MB."""
    files = list(written.iterdir())
    total = sum(f.stat().st_size for f in files)
    assert total < 7_000_000, f"{total / 1e6:.1f} MB"
    n_cases = 2 * len(golden.SAMPLING_CASES) + len(golden.TOP_P_CASES) + 1  # + the dyadic case
    records = 3 * n_cases + 7 * len(golden.SAMPLE_CASES) + 6 * len(golden.REJECTION_CASES)
    assert sum(f.name.endswith(".npy") for f in files) == records
