"""lkw.golden's chapter 10 cases (top_k_mask_logits, top_k_renorm_probs): both ops with the
signature the C++ registry declares and the tolerances of the contract, the edges the chapter
promises (disabled k of every spelling, k = 1 and V - 1, ties at the k-th value, -inf and a k past
the finite tokens, -0.0 beside +0.0, all-equal rows, V of 1, 2, 5 and not a multiple of 4 or 256,
Llama-3's V = 128256), drawn from the session seed so that every seed is checked in time; the data
catch the usual mistakes (a tie split by index, k >= V read as a filter, -0.0 copied); and a
chapter that stays small on disk."""

import re
import zlib

import numpy as np
import pytest
from conftest import SEED
from lkw import golden, sampling

F32, I32 = "float32", "int32"
MASK, RENORM = "top_k_mask_logits", "top_k_renorm_probs"
SIGNATURES = {MASK: ([F32, I32], [F32]), RENORM: ([F32, I32], [F32])}


@pytest.fixture(scope="module")
def cases():
    return golden.sampling_cases(np.random.default_rng([SEED, zlib.crc32(b"10_sampling")]))


@pytest.fixture(scope="module")
def outputs(cases):
    return {c.id: golden.expected_outputs(c)[0] for c in cases}


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


def test_both_ops_have_cases_the_contracted_signature_and_tolerance(cases, outputs):
    assert {c.op for c in cases} == set(SIGNATURES) == set(golden.SAMPLING_OPS)
    assert golden.CHAPTERS["10_sampling"] is golden.sampling_cases
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-z0-9_]+", i) for i in ids)
    for op, (ins, outs) in SIGNATURES.items():
        assert list(golden.OPS[op].inputs) == ins and list(golden.OPS[op].outputs) == outs
        assert golden.OPS[op].params == () and golden.OPS[op].init == 0
    # .scratch/ch10_spec.md: the mask bit-exact, the renormalized probs within 2^-14 relative.
    assert sampling.PROB_RTOL == 2.0**-14
    assert golden.SAMPLING_TOLERANCES == {MASK: "exact", RENORM: "close:6.103515625e-05:0"}
    for c in cases:
        assert c.tolerance == golden.SAMPLING_TOLERANCES[c.op] and c.params == {}
        golden.check_case(c, [outputs[c.id]])  # stored dtypes, no all-zero input


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


def test_the_chapter_is_a_few_megabytes_on_disk(tmp_path):
    """About 3 MB: the two V = 128256 rows the chapter promises are 2 MB of it."""
    golden.write_chapter(tmp_path, "10_sampling", 7)
    files = list((tmp_path / "10_sampling").iterdir())
    total = sum(f.stat().st_size for f in files)
    assert total < 3_500_000, f"{total / 1e6:.1f} MB"
    assert sum(f.name.endswith(".npy") for f in files) == 3 * 2 * len(golden.SAMPLING_CASES)
