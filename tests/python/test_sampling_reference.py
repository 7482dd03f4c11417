"""lkw.sampling, chapter 10's reference: the filters agree with a full sort walked tie group by
tie group (and, on small rows, with their pairwise definitions), the sampled token with a direct
CDF search on the same u, the radix select with sorting, the speculative rejection sampler with
a slow loop written from its docstring, v0's sort-based sampler (a float32 emulation) with the
contract and not its sorted-order shortcut; the samplers' output distributions pass a fixed-seed
chi-square test that the mutants (renormalization skipped, top-p one token off, q and p swapped)
fail; keep_mismatches catches the boundary and tie mutants; a float32 emulation of a kernel's
CDF agrees wherever the reference calls the row certain; the Philox model gives Random123's known
answers and curand_init's offset and subsequence bookkeeping, and, where libcurand is installed,
the words of curand's own host generator."""

import ctypes
import itertools
import math
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from lkw import sampling

STAT_SEED = 10  # statistical tests use a fixed seed: reproducible, never flaky
N_STAT = 100_000  # draws per statistical test (the issue asks for >= 10^5)


def per_row(value, r):
    if value is None:
        return None
    a = np.asarray(value)
    return a.item() if a.ndim == 0 else a[r].item()


# ---------------------------------------------------------------------------------------------
# Oracles: one row at a time, from a full sort


def oracle_keep(keys, mass, top_k=None, top_p=None, min_p=None, order="top_k_first"):
    """sorted() by key, largest first, walked tie group by tie group with a float64 running sum."""
    out = np.zeros(keys.shape, bool)
    for r, (krow, mrow) in enumerate(zip(keys.tolist(), mass.tolist())):
        v = len(krow)
        ranked = sorted(range(v), key=lambda i: -krow[i])
        k, p, mp = per_row(top_k, r), per_row(top_p, r), per_row(min_p, r)
        in_k = set(range(v))
        if k is not None and 0 < k < v:
            in_k = {i for i in range(v) if krow[i] >= krow[ranked[k - 1]]}
        keep = set(in_k)
        if p is not None and p < 1:
            total = sum(mrow[i] for i in ranked if order == "joint" or i in in_k)
            running, kept = 0.0, set()
            for _, group in itertools.groupby(ranked, key=lambda i: krow[i]):
                group = list(group)
                if running < float(np.float32(p)) * total:
                    kept |= set(group)
                running += sum(mrow[i] for i in group)
            keep &= kept
        if mp is not None and mp > 0:
            keep &= {i for i in range(v) if mrow[i] >= float(np.float32(mp)) * max(mrow)}
        out[r, sorted(keep)] = True
    return out


def definition_keep(keys, mass, top_k, top_p, order="top_k_first"):
    """The docstring's formulas, pairwise (count and fsum of the strictly greater): O(V^2)."""
    out = np.zeros(keys.shape, bool)
    for r, (krow, mrow) in enumerate(zip(keys.tolist(), mass.tolist())):
        v = len(krow)
        in_k = [sum(kj > ki for kj in krow) < top_k for ki in krow]
        total = math.fsum(m for m, kk in zip(mrow, in_k) if kk or order == "joint")
        for i in range(v):
            greater = math.fsum(m for kj, m in zip(krow, mrow) if kj > krow[i])
            out[r, i] = in_k[i] and greater < float(np.float32(top_p)) * total
    return out


def cdf_search(mass, keep, u):
    """Per row: the float64 running sum left to right, the first index past u * total."""
    out = []
    for mrow, krow, uu in zip(mass.tolist(), keep.tolist(), np.asarray(u).tolist()):
        w = [m if k else 0.0 for m, k in zip(mrow, krow)]
        c = list(itertools.accumulate(w))
        t = float(np.float32(uu)) * c[-1]
        hit = [i for i, ci in enumerate(c) if ci > t]
        out.append(hit[0] if hit else max(i for i, wi in enumerate(w) if wi > 0))
    return np.array(out, np.int32)


def tied_rows(rng, b, v, levels=5):
    """float32 [B, V] drawn from a few values: every threshold falls on a tie group."""
    return rng.integers(-levels, levels, (b, v)).astype(np.float32) / 2


def dirichlet_probs(rng, b, v):
    return rng.dirichlet(np.ones(v), b).astype(np.float32)


INPUTS = {  # name: (keys, mass) maker
    "lm_logits": lambda rng: sampling.from_logits(sampling.lm_logits(rng, 6, 300)),
    "lm_ties": lambda rng: sampling.from_logits(sampling.lm_logits(rng, 6, 300, ties=True)),
    "tied_logits": lambda rng: sampling.from_logits(tied_rows(rng, 8, 40)),
    "probs": lambda rng: sampling.from_probs(dirichlet_probs(rng, 8, 50)),
    "tied_probs": lambda rng: sampling.from_probs(
        np.round(dirichlet_probs(rng, 8, 50) * 64) / np.float32(64) + np.float32(1 / 64)
    ),
}


# ---------------------------------------------------------------------------------------------
# Temperature and softmax


def test_temperature_is_one_float32_division(rng):
    x = sampling.lm_logits(rng, 5, 257)
    t = np.array([1.0, 0.7, 0.0, 1.3, 1e-3], np.float32)
    z = sampling.apply_temperature(x, t)
    assert z.dtype == np.float32
    for r in range(5):
        want = x[r] if t[r] == 0 else np.array([np.float32(a) / t[r] for a in x[r]], np.float32)
        assert np.array_equal(z[r].view(np.uint32), want.view(np.uint32))
    assert np.array_equal(sampling.apply_temperature(x, None), x)
    bf = x.astype(ml_dtypes.bfloat16)
    assert np.array_equal(sampling.apply_temperature(bf, 0.5), bf.astype(np.float32) / 0.5)
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(ValueError):
            sampling.apply_temperature(x, bad)
    with pytest.raises(ValueError):  # 30 / 1e-38 overflows float32: such a row is greedy
        sampling.apply_temperature(np.full((1, 4), 30, np.float32), 1e-38)
    with pytest.raises(ValueError):
        sampling.apply_temperature(x.astype(np.float64), 1.0)


def test_softmax_rounds_once(rng):
    z = sampling.lm_logits(rng, 4, 100)
    got = sampling.softmax(z)
    for r, row in enumerate(z.astype(np.float64)):
        e = [math.exp(v - max(row)) for v in row]
        want = np.array([v / math.fsum(e) for v in e], np.float32)
        np.testing.assert_allclose(got[r], want, rtol=2.0**-23, atol=0)
    masked = np.array([[0.0, -np.inf, np.log(3)]], np.float32)
    np.testing.assert_allclose(sampling.softmax(masked), [[0.25, 0, 0.75]], rtol=1e-7)
    with pytest.raises(ValueError):
        sampling.softmax(np.full((1, 3), -np.inf, np.float32))


# ---------------------------------------------------------------------------------------------
# Filters against the full sort


def test_top_k_keeps_every_tie_at_the_kth_value():
    keys = np.array([[1, 3, 2, 3, 2, 0], [5, 5, 5, 5, 5, 5]], np.float32)
    keep = sampling.top_k_keep(keys, [2, 1])
    assert keep.astype(int).tolist() == [[0, 1, 0, 1, 0, 0], [1] * 6]
    keep = sampling.top_k_keep(keys, [3, 0])  # third largest is 2, held by two tokens; 0 = off
    assert keep.astype(int).tolist() == [[0, 1, 1, 1, 1, 0], [1] * 6]
    assert sampling.top_k_keep(keys, 6).all() and sampling.top_k_keep(keys, None).all()
    logits = np.array([[0.5, -np.inf, 2.0, 2.0, -0.0, 0.0]], np.float32)
    masked = sampling.top_k_mask_logits(logits, 4)  # -0.0 and +0.0 tie at the 4th value
    assert masked.tolist() == [[0.5, -np.inf, 2.0, 2.0, 0.0, 0.0]]
    two = sampling.top_k_mask_logits(logits, 2)
    assert two.tolist() == [[-np.inf, -np.inf, 2.0, 2.0, -np.inf, -np.inf]]


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize(
    "top_k,top_p,min_p,order",
    [
        (7, None, None, "top_k_first"),
        (None, 0.9, None, "top_k_first"),
        (None, None, 0.05, "top_k_first"),
        (20, 0.8, None, "top_k_first"),
        (20, 0.8, None, "joint"),
        (10, 0.95, 0.02, "top_k_first"),
        ([1, 0, 5, 3, 50, 300, 2, 9], [0.5, 1.0, 0.3, 0.99, 0.7, 0.2, 1.0, 0.6], 0.1, "joint"),
    ],
)
def test_filters_are_the_full_sort(rng, inputs, top_k, top_p, min_p, order):
    keys, mass = INPUTS[inputs](rng)
    b = keys.shape[0]
    cut = lambda a: a if a is None or np.ndim(a) == 0 else a[:b]
    filters = {"top_k": cut(top_k), "top_p": cut(top_p), "min_p": min_p, "order": order}
    keep = sampling.filter_keep(keys, mass, **filters)
    assert np.array_equal(keep, oracle_keep(keys, mass, **filters))
    assert keep.any(axis=1).all()
    tau = np.where(keep, keys, np.inf).min(axis=1, keepdims=True)
    assert np.array_equal(keep, keys >= tau)  # always an upper set of the keys


@pytest.mark.parametrize("order", sampling.ORDERS)
def test_filters_are_their_pairwise_definitions(rng, order):
    for keys, mass in (
        sampling.from_logits(tied_rows(rng, 10, 12, levels=3)),
        sampling.from_probs(dirichlet_probs(rng, 10, 9)),
    ):
        for k, p in ((3, 0.6), (5, 0.9), (1, 0.3), (9, 0.75)):
            keep = sampling.filter_keep(keys, mass, top_k=k, top_p=p, order=order)
            assert np.array_equal(keep, definition_keep(keys, mass, k, p, order))


def test_the_top_p_boundary_by_hand():
    probs = np.array([[0.125, 0.5, 0.0625, 0.25, 0.0625]], np.float32)  # sums are exact
    keys, mass = sampling.from_probs(probs)
    kept = lambda p: np.flatnonzero(sampling.top_p_keep(keys, mass, p)[0]).tolist()
    assert kept(0.5) == [1]  # M_gt(0.25) = 0.5 is not < 0.5: the boundary token is dropped
    assert kept(0.6) == [1, 3]  # 0.25 carries the sum across 0.6: kept
    assert kept(0.75) == [1, 3]
    assert kept(0.8) == [0, 1, 3]
    assert kept(0.9) == [0, 1, 2, 3, 4]  # the two 1/16 tie: kept as a group
    assert kept(1.0) == [0, 1, 2, 3, 4]
    assert sampling.greater_mass(keys, mass).tolist() == [[0.75, 0, 0.875, 0.5, 0.875]]
    want = np.float32([[0.125 / 0.875, 0.5 / 0.875, 0, 0.25 / 0.875, 0]])  # rounded once
    np.testing.assert_array_equal(sampling.top_p_renorm_probs(probs, 0.8), want)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError):
            sampling.top_p_keep(keys, mass, bad)


def test_top_k_first_and_joint_differ_by_hand():
    """k = 3 keeps mass 0.75, so top_k_first compares M_gt with p * 0.75 (the renormalized
    distribution) and keeps fewer tokens than joint, which compares with p."""
    probs = np.array([[0.3, 0.25, 0.2, 0.15, 0.1]], np.float32)
    keys, mass = sampling.from_probs(probs)
    cases = [(0.35, [1, 0, 0, 0, 0], [1, 1, 0, 0, 0])]  # M_gt(0.25) = 0.3 vs 0.2625 / 0.35
    cases += [(0.7, [1, 1, 0, 0, 0], [1, 1, 1, 0, 0])]  # M_gt(0.2) = 0.55 vs 0.525 / 0.7
    for p, first, joint in cases:
        for order, want in (("top_k_first", first), ("joint", joint)):
            keep = sampling.filter_keep(keys, mass, top_k=3, top_p=p, order=order)
            assert keep[0].astype(int).tolist() == want


def test_min_p_is_relative_to_the_top_token():
    probs = np.array([[0.4, 0.04, 0.039, 0.521], [0.25, 0.25, 0.25, 0.25]], np.float32)
    _keys, mass = sampling.from_probs(probs)
    keep = sampling.min_p_keep(mass, 0.1)
    assert keep.astype(int).tolist() == [[1, 0, 0, 1], [1, 1, 1, 1]]
    assert sampling.min_p_keep(mass, [0.0, 1.0]).all()
    z = np.log(probs.astype(np.float64)).astype(np.float32)  # the logits path, same decision
    assert np.array_equal(sampling.filter_keep(*sampling.from_logits(z), min_p=0.1), keep)
    with pytest.raises(ValueError):
        sampling.min_p_keep(mass, 1.5)


def test_renormalized_probs_are_the_oracle(rng):
    probs = dirichlet_probs(rng, 6, 64)
    keys, mass = sampling.from_probs(probs)
    for got, keep in (
        (sampling.top_k_renorm_probs(probs, 10), oracle_keep(keys, mass, top_k=10)),
        (sampling.top_p_renorm_probs(probs, 0.7), oracle_keep(keys, mass, top_p=0.7)),
    ):
        w = np.where(keep, mass, 0)
        assert got.dtype == np.float32 and np.array_equal(got > 0, keep)
        np.testing.assert_allclose(got, w / w.sum(axis=1, keepdims=True), rtol=2.0**-23)


# ---------------------------------------------------------------------------------------------
# The named comparison and its mutants


def mutant_ties_by_lowest_index(keys, mass, top_k):
    """Exactly k tokens, ties at the k-th value broken by the lower index (not the contract)."""
    ranked = np.argsort(-keys, axis=1, kind="stable")[:, :top_k]
    keep = np.zeros(keys.shape, bool)
    np.put_along_axis(keep, ranked, True, axis=1)
    return keep


def mutant_inclusive_boundary(keys, mass, top_p):
    """keep iff M_gt <= p * M (a token exactly on the boundary kept)."""
    return sampling.greater_mass(keys, mass) <= np.float32(top_p) * mass.sum(axis=1, keepdims=True)


def mutant_splits_tie_groups(keys, mass, top_p):
    """vLLM's sorted top-p: the exclusive prefix by POSITION in the sort, so a tie group on the
    boundary is cut in sort order."""
    order = np.argsort(-keys, axis=1, kind="stable")
    m = np.take_along_axis(mass, order, axis=1)
    before = np.cumsum(m, axis=1) - m
    keep = np.zeros(keys.shape, bool)
    limit = np.float32(top_p) * mass.sum(axis=1, keepdims=True)
    np.put_along_axis(keep, order, before < limit, axis=1)
    return keep


def one_token_off(keys, keep, extra: bool):
    """The kept set one token too large (the best dropped token added) or too small (the worst
    kept token removed)."""
    keep = keep.copy()
    for r in range(keys.shape[0]):
        if extra:
            keep[r, np.argmax(np.where(keep[r], -np.inf, keys[r]))] = True
        elif keep[r].sum() > 1:
            keep[r, np.argmin(np.where(keep[r], keys[r], np.inf))] = False
    return keep


def test_keep_mismatches_accepts_the_reference_and_forgives_uncertain_tokens(rng):
    keys, mass = sampling.from_logits(sampling.lm_logits(rng, 8, 500, ties=True))
    filters = {"top_k": 40, "top_p": 0.9, "min_p": 0.01}
    ref = sampling.filter_keep(keys, mass, **filters)
    assert sampling.keep_mismatches(ref, keys, mass, **filters).size == 0
    probs = np.array([[0.5, 0.3, 0.2]], np.float32)
    keys, mass = sampling.from_probs(probs)
    p = float(np.float32(0.8 + sampling.MARGIN / 4))  # M_gt(0.2) = 0.8 sits within MARGIN of p
    unsure = sampling.uncertain_tokens(keys, mass, top_p=p)
    assert unsure[0].tolist() == [False, False, True]
    flipped = sampling.top_p_keep(keys, mass, p) ^ unsure
    assert sampling.keep_mismatches(flipped, keys, mass, top_p=p).size == 0
    assert sampling.keep_mismatches(flipped, keys, mass, exact=True, top_p=p).tolist() == [[0, 2]]


def test_keep_mismatches_catches_ties_broken_by_index(rng):
    keys, mass = sampling.from_logits(tied_rows(rng, 8, 40))
    got = mutant_ties_by_lowest_index(keys, mass, 5)
    assert sampling.keep_mismatches(got, keys, mass, top_k=5).size > 0
    logits = np.array([[1, 3, 2, 3, 2, 0]], np.float32)
    keys, mass = sampling.from_logits(logits)
    bad = sampling.keep_mismatches(mutant_ties_by_lowest_index(keys, mass, 3), keys, mass, top_k=3)
    assert bad.tolist() == [[0, 4]]


def test_keep_mismatches_catches_the_inclusive_boundary():
    probs = np.array([[0.125, 0.5, 0.0625, 0.25, 0.0625]], np.float32)
    keys, mass = sampling.from_probs(probs)
    got = mutant_inclusive_boundary(keys, mass, 0.75)
    bad = sampling.keep_mismatches(got, keys, mass, exact=True, top_p=0.75)
    assert bad.tolist() == [[0, 0]]  # 0.125: M_gt = 0.75 exactly, which the contract drops


def test_keep_mismatches_catches_split_tie_groups():
    probs = np.array([[0.25, 0.125, 0.25, 0.125, 0.125, 0.125]], np.float32)
    keys, mass = sampling.from_probs(probs)
    got = mutant_splits_tie_groups(keys, mass, 0.6)  # 0.5 + one of the four 1/8 tokens
    assert got.sum() == 3
    bad = sampling.keep_mismatches(got, keys, mass, top_p=0.6)
    assert bad.tolist() == [[0, 3], [0, 4], [0, 5]]  # the whole group belongs in


@pytest.mark.parametrize("extra", [True, False])
def test_keep_mismatches_catches_top_p_one_token_off(rng, extra):
    keys, mass = sampling.from_probs(dirichlet_probs(rng, 16, 12))
    ref = sampling.top_p_keep(keys, mass, 0.8)
    got = one_token_off(keys, ref, extra)
    changed = got != ref
    certain = ~sampling.uncertain_tokens(keys, mass, top_p=0.8)
    assert (changed & certain).any()  # Dirichlet rows: the boundary is never that close
    assert len(sampling.keep_mismatches(got, keys, mass, top_p=0.8)) == (changed & certain).sum()


# ---------------------------------------------------------------------------------------------
# Sampling by inverse CDF


def test_inverse_cdf_is_the_direct_search(rng):
    keys, mass = sampling.from_logits(sampling.lm_logits(rng, 40, 200, ties=True))
    keep = sampling.filter_keep(keys, mass, top_k=30, top_p=0.9)
    u = rng.random(40).astype(np.float32)
    u[:3] = [0.0, 1.0, np.nextafter(np.float32(1), np.float32(0))]
    got = sampling.inverse_cdf(mass, keep, u)
    assert got.dtype == np.int32 and np.array_equal(got, cdf_search(mass, keep, u))
    assert keep[np.arange(40), got].all()


def test_inverse_cdf_never_lands_outside_the_support():
    mass = np.array([[0.0, 2.0, 0.0, 1.0, 0.0, 5.0, 0.0]])
    keep = np.array([[1, 1, 1, 1, 1, 0, 1]], bool)
    for u, want in ((0.0, 1), (0.66, 1), (0.67, 3), (0.999, 3), (1.0, 3)):
        assert sampling.inverse_cdf(mass, keep, [u]).tolist() == [want]
    three = (np.repeat(mass, 3, axis=0), np.repeat(keep, 3, axis=0))
    unsure = sampling.uncertain_samples(*three, np.float32([2 / 3, 0.5, 1.0]))
    assert unsure.tolist() == [True, False, True]  # on a boundary, clear of it, the fall-through
    with pytest.raises(ValueError):
        sampling.inverse_cdf(mass, np.zeros_like(keep), [0.5])
    with pytest.raises(ValueError):
        sampling.inverse_cdf(mass, keep, [1.5])


def test_sample_is_the_pipeline(rng):
    x = sampling.lm_logits(rng, 12, 400, ties=True)
    t = np.array([1.0, 0.0, 0.6, 1.5] * 3, np.float32)
    u = rng.random(12).astype(np.float32)
    filters = {"top_k": 50, "top_p": 0.9, "min_p": 0.02}
    tokens, unsure = sampling.sample(x, u, t, with_uncertain=True, **filters)
    z = np.where(t[:, None] > 0, x / np.where(t > 0, t, 1)[:, None], x)
    e = np.exp(z.astype(np.float64) - z.max(axis=1, keepdims=True))
    want = cdf_search(e, oracle_keep(z, e, **filters), u)
    want[t == 0] = np.argmax(x[t == 0], axis=1)
    assert tokens.dtype == np.int32 and np.array_equal(tokens, want) and not unsure[t == 0].any()
    assert np.array_equal(sampling.sample(x, u, t, **filters), tokens)
    probs = sampling.softmax(z.astype(np.float32))
    got = sampling.sample_from_probs(probs, u, **filters)
    keys, mass = sampling.from_probs(probs)
    assert np.array_equal(got, cdf_search(mass, oracle_keep(keys, mass, **filters), u))
    one = sampling.sample(x, u, top_k=1)  # the limit: the top tie group
    assert np.all(x[np.arange(12), one] == x.max(axis=1))


def kernel_like_sample(x, u, chunk=4096):
    """A float32 kernel's arithmetic: expf of fp32 z - max, a prefix sum carried chunk by chunk
    in float32, t = u * the prefix's last value."""
    z = x - x.max(axis=1, keepdims=True)  # fp32 subtraction
    w = np.exp(z)  # fp32
    c = np.empty_like(w)
    carry = np.zeros(w.shape[0], np.float32)
    for s in range(0, w.shape[1], chunk):
        part = np.cumsum(w[:, s : s + chunk], axis=1, dtype=np.float32)
        c[:, s : s + chunk] = part + carry[:, None]
        carry = c[:, min(s + chunk, w.shape[1]) - 1]
    t = u * c[:, -1]
    return np.argmax(c > t[:, None], axis=1)


def test_a_float32_kernel_agrees_wherever_the_row_is_certain(rng):
    x = sampling.lm_logits(rng, 48, 128256)
    u = rng.random(48).astype(np.float32)
    tokens, unsure = sampling.sample(x, u, with_uncertain=True)
    got = kernel_like_sample(x, u)
    assert np.array_equal(got[~unsure], tokens[~unsure])
    keys, mass = sampling.from_logits(x)
    assert sampling.sample_mismatches(got, keys, mass, u).size == 0


def test_sample_mismatches_catches_the_mutants(rng):
    x = sampling.lm_logits(rng, 256, 4096)
    u = rng.random(256).astype(np.float32)
    keys, mass = sampling.from_logits(x)
    tokens = sampling.sample(x, u)
    flipped = kernel_like_sample(x, 1 - u)  # reads curand's (0, 1] the wrong way round
    bad = sampling.sample_mismatches(flipped, keys, mass, u)
    assert bad.size >= 16 and np.all(flipped[bad] != tokens[bad])
    keep = sampling.filter_keep(keys, mass, top_k=3)  # skips the filter: outside the support,
    outside = np.flatnonzero(~keep[np.arange(256), tokens])  # or inside at the wrong CDF place
    bad = sampling.sample_mismatches(tokens, keys, mass, u, top_k=3)
    assert outside.size >= 8 and np.isin(outside, bad).all()
    with pytest.raises(ValueError):
        sampling.sample_mismatches(tokens[:-1], keys, mass, u)


def sort_based_sample(x, u, t, top_k, top_p, min_p, sorted_draw=False):
    """v0_sort_cub's `sample` in float32 numpy, row by row: z = x / T sorted descending; top-k's
    cut the k-th sorted key; top-p's the key at the first sorted position whose float32 running
    mass expf(z - max z) of the keys top-k kept reaches p * M(K); min-p on each token's own mass;
    the draw the first index of the kept masses' float32 prefix sum in INDEX order past u * total
    (sorted_draw: the same search over the sorted row, the obvious shortcut). Greedy rows (T = 0)
    take the lowest index of max x. Returns (tokens int64 [B], keep bool [B, V])."""
    b, v = x.shape
    tokens, keep = np.argmax(x, axis=1), np.zeros(x.shape, bool)
    for r in range(b):
        if not t[r] > 0:
            continue
        z = (x[r] / t[r]).astype(np.float32)
        order = np.argsort(-z, kind="stable")
        s = z[order]
        mass = np.exp(z - s[0]).astype(np.float32)  # (V,) index order
        tau = s[top_k[r] - 1] if 0 < top_k[r] < v else np.float32(-np.inf)
        if top_p[r] < 1:
            c = np.cumsum(np.where(s >= tau, mass[order], np.float32(0)), dtype=np.float32)
            tau = max(tau, s[np.flatnonzero(c >= top_p[r] * c[-1])[0]])
        w = np.where((z >= tau) & (mass >= min_p[r]), mass, np.float32(0))  # (V,)
        keep[r] = w > 0
        ids = order if sorted_draw else np.arange(v)
        c = np.cumsum(w[ids], dtype=np.float32)
        tokens[r] = ids[np.flatnonzero((c > u[r] * c[-1]) & (w[ids] > 0))[0]]
    return tokens, keep


def test_thresholds_read_off_a_sorted_row_and_an_index_order_draw_are_the_contract(rng):
    """v0's rule: its kept set is filter_keep but for uncertain tokens, on LM rows with ties too,
    and its token is admissible (sample_mismatches) for the same u; walking the sorted row
    instead draws from the same set but, for the same u, other tokens in most rows."""
    b, v = 96, 3000
    x = np.concatenate([sampling.lm_logits(rng, b // 2, v),
                        sampling.lm_logits(rng, b // 2, v, ties=True)])
    t = rng.choice(np.float32([0.0, 0.6, 1.0, 1.4]), b)
    top_k = rng.choice(np.int32([0, -1, 1, 7, 50, v]), b)
    top_p = rng.choice(np.float32([1.0, 0.9, 0.6]), b)
    min_p = rng.choice(np.float32([0.0, 0.0, 0.05]), b)
    u = rng.random(b).astype(np.float32)
    filters = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
    tokens, keep = sort_based_sample(x, u, t, **filters)
    greedy, sampled = t == 0, np.flatnonzero(t > 0)
    assert 10 <= greedy.sum() <= b - 48
    assert np.array_equal(tokens[greedy], np.argmax(x[greedy], axis=1))
    keys, mass = sampling.from_logits(x[sampled], t[sampled])
    rows = {f: a[sampled] for f, a in filters.items()}
    assert sampling.keep_mismatches(keep[sampled], keys, mass, **rows).size == 0
    assert sampling.sample_mismatches(tokens[sampled], keys, mass, u[sampled], **rows).size == 0
    by_rank, _ = sort_based_sample(x, u, t, sorted_draw=True, **filters)
    assert keep[sampled, by_rank[sampled]].all()  # the same support
    differ = np.flatnonzero(by_rank[sampled] != tokens[sampled])
    assert differ.size >= sampled.size // 10, "the sorted walk should draw other tokens"
    bad = sampling.sample_mismatches(by_rank[sampled], keys, mass, u[sampled], **rows)
    assert np.isin(bad, differ).all() and bad.size >= differ.size * 3 // 4  # caught, not forgiven


def test_sampled_distribution_passes_chi_square_and_mutants_fail():
    rng = np.random.default_rng(STAT_SEED)
    row = np.array([[3.0, 1.0, 2.5, 0.2, 2.0, -1.0, 1.5, 2.5, 0.5, 1.8, 0.0, 2.2]], np.float32)
    x = np.repeat(row, N_STAT, axis=0)
    u = rng.random(N_STAT).astype(np.float32)
    filters = {"top_k": 8, "top_p": 0.85, "temperature": 0.8}
    tokens = sampling.sample(x, u, **filters)
    keys, mass = sampling.from_logits(row, 0.8)
    keep = sampling.filter_keep(keys, mass, top_k=8, top_p=0.85)
    exact = np.where(keep, mass, 0)[0]
    assert 2 < keep.sum() < 8  # both filters bite
    counts = np.bincount(tokens, minlength=12)
    assert sampling.chi_square(counts, exact)[2] > sampling.SIGNIFICANCE
    unfiltered = sampling.inverse_cdf(np.repeat(mass, N_STAT, 0), np.ones(x.shape, bool), u)
    for wrong in (one_token_off(keys, keep, True), one_token_off(keys, keep, False)):
        mutant = sampling.inverse_cdf(np.repeat(mass, N_STAT, 0), np.repeat(wrong, N_STAT, 0), u)
        assert sampling.chi_square(np.bincount(mutant, minlength=12), exact)[2] < 1e-12
    assert sampling.chi_square(np.bincount(unfiltered, minlength=12), exact)[2] == 0.0


# ---------------------------------------------------------------------------------------------
# Radix select against sorting


def test_order_key_keeps_the_order(rng):
    x = np.concatenate(
        [rng.normal(0, 10, 500), [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38]]
    ).astype(np.float32)
    keys = sampling.order_key(x)
    a, b = np.meshgrid(np.arange(x.size), np.arange(x.size))
    assert np.array_equal(x[a] < x[b], keys[a] < keys[b])  # -0.0 and +0.0 share a key
    back = sampling.key_value(keys)
    assert np.array_equal(back.view(np.uint32), (x + np.float32(0)).view(np.uint32))
    assert sampling.order_key(np.float32(0.0)) == 0x80000000


@pytest.mark.parametrize("radix_bits", [8, 4, 16])
def test_radix_select_is_the_kth_largest(rng, radix_bits):
    rows = [
        rng.normal(0, 3, 1000).astype(np.float32),
        tied_rows(rng, 1, 300)[0],
        np.array([-np.inf, -1, -0.0, 0.0, -np.inf, 2, -1, 5], np.float32),
        sampling.lm_logits(rng, 1, 5000, ties=True)[0],
    ]
    for row in rows:
        desc = -np.sort(-row)
        for k in {1, 2, 3, len(row) // 2, len(row) - 1, len(row)}:
            got, passes = sampling.radix_select(row, k, radix_bits=radix_bits)
            assert got == desc[k - 1] and len(passes) == 32 // radix_bits
            keys = sampling.order_key(row)
            assert passes[0].hist.sum() == row.size and passes[0].above == 0
            for before, after in itertools.pairwise(passes):  # a pass histograms its candidates
                assert after.hist.sum() == before.hist[before.digit]
                assert after.above == before.above + before.hist[before.digit + 1 :].sum()
                shift = after.shift + radix_bits
                high = keys >> np.uint32(shift)
                assert after.hist.sum() == np.sum(high == after.prefix >> shift)
            assert (row >= got).sum() >= k > (row > got).sum()
    assert np.array_equal(sampling.kth_largest(tied_rows(rng, 4, 50), [1, 5, 17, 50]).shape, [4])


def test_radix_select_finds_the_top_p_threshold(rng):
    for keys, mass in (INPUTS["lm_ties"](rng), INPUTS["probs"](rng), INPUTS["tied_probs"](rng)):
        for p in (0.3, 0.9, 0.99):
            tau = sampling.top_p_threshold(keys, mass, p)
            assert np.array_equal(keys >= tau[:, None], sampling.top_p_keep(keys, mass, p))
        within = sampling.top_k_keep(keys, 10)
        tau = sampling.top_p_threshold(keys, mass, 0.8, within)
        want = sampling.filter_keep(keys, mass, top_k=10, top_p=0.8)
        assert np.array_equal(keys >= tau[:, None], want)
    weights = np.array([0.5, 0.25, 0.25])
    _, passes = sampling.radix_select(weights.astype(np.float32), 0.6, weights)
    assert passes[-1].above == 0.5 and passes[-1].hist.max() == 0.5  # both 0.25 in one bucket
    for bad in (0, 4):
        with pytest.raises(ValueError):
            sampling.radix_select(np.float32([1, 2, 3]), bad)


# ---------------------------------------------------------------------------------------------
# Sorting-free rejection sampling with pivots


def test_pivot_sampler_stays_in_the_support_and_narrows(rng):
    keys, mass = sampling.from_logits(sampling.lm_logits(rng, 64, 2000, ties=True))
    keep = sampling.filter_keep(keys, mass, top_k=20, top_p=0.7)
    u = rng.random((64, 200)).astype(np.float32)
    tokens, rounds, trace = sampling.pivot_rejection_sample(keys, mass, keep, u)
    assert keep[np.arange(64), tokens].all() and rounds.min() >= 1
    first = sampling.inverse_cdf(mass, np.ones(keep.shape, bool), u[:, 0])
    assert np.array_equal(trace["candidate"][:, 0], first)  # round 0 samples the whole row
    tau = np.where(keep, keys, np.inf).min(axis=1)
    for r in range(64):
        n = rounds[r]
        low, high = trace["low"][r, :n], trace["high"][r, :n]
        assert np.all((low < tau[r]) & (tau[r] <= high))
        assert np.all(np.diff(low) > 0) and np.all(np.diff(high) <= 0)
        assert trace["candidate"][r, n - 1] == tokens[r] and np.all(trace["candidate"][r, n:] == -1)
    with pytest.raises(ValueError):
        sampling.pivot_rejection_sample(keys, mass, keep, u[:, :1])
    with pytest.raises(ValueError):
        sampling.pivot_rejection_sample(keys, mass, ~keep, u)


def test_pivot_sampler_distribution_is_the_filtered_one():
    rng = np.random.default_rng(STAT_SEED)
    probs = np.float32([[0.3, 0.02, 0.15, 0.05, 0.2, 0.01, 0.12, 0.15]])
    keys, mass = sampling.from_probs(probs)
    keep = sampling.filter_keep(keys, mass, top_k=5, top_p=0.75)
    n = 30_000
    rep = lambda a: np.repeat(a, n, axis=0)
    tokens, rounds, _ = sampling.pivot_rejection_sample(
        rep(keys), rep(mass), rep(keep), rng.random((n, 64)).astype(np.float32)
    )
    exact = np.where(keep, mass, 0)[0]
    assert sampling.chi_square(np.bincount(tokens, minlength=8), exact)[2] > sampling.SIGNIFICANCE
    assert rounds.max() > 1


# ---------------------------------------------------------------------------------------------
# Speculative decoding


def spec_rejection(q, draft, p, accept_u, sample_u):
    """One request at a time, from the docstring."""
    b, s, v = q.shape
    tokens, counts = np.full((b, s + 1), -1, np.int32), np.zeros(b, np.int32)
    for r in range(b):
        n = 0
        while n < s and np.float32(accept_u[r, n]) * q[r, n, draft[r, n]] < p[r, n, draft[r, n]]:
            tokens[r, n] = draft[r, n]
            n += 1
        if n == s:
            dist = [float(x) for x in p[r, s]]
        else:
            dist = [max(0.0, float(p[r, n, i] - q[r, n, i])) for i in range(v)]  # fp32 minus
            if sum(dist) == 0:
                dist = [float(x) for x in p[r, n]]
        tokens[r, n] = cdf_search(np.array([dist]), np.ones((1, v), bool), [sample_u[r]])[0]
        counts[r] = n
    return tokens, counts


@pytest.mark.parametrize("s", [0, 1, 4])
def test_rejection_sample_is_the_slow_loop(rng, s):
    q, draft, p = sampling.speculative_inputs(rng, 40, s, 64)
    accept_u = rng.random((40, s)).astype(np.float32)
    sample_u = rng.random(40).astype(np.float32)
    tokens, counts = sampling.rejection_sample(q, draft, p, accept_u, sample_u)
    want_tokens, want_counts = spec_rejection(q, draft, p, accept_u, sample_u)
    assert tokens.dtype == np.int32 and counts.dtype == np.int32
    assert np.array_equal(tokens, want_tokens) and np.array_equal(counts, want_counts)
    if s:
        assert 0 < counts.mean() < s  # some accepted, some rejected
    emitted = np.arange(s + 1) <= counts[:, None]
    assert np.all((tokens >= 0) == emitted)


def test_rejection_sample_by_hand():
    q = np.float32([[[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]]])
    p = np.float32([[[0.25, 0.75, 0.0], [0.6, 0.2, 0.2], [0.0, 0.0, 1.0]]])
    draft = np.array([[0, 1]])
    run = lambda ua, us: sampling.rejection_sample(q, draft, p, np.float32([ua]), [us])
    tokens, n = run([0.49, 0.0], 0.3)  # 0.49 * 0.5 < 0.25; then 0 * 0.8 < 0.2
    assert tokens.tolist() == [[0, 1, 2]] and n.tolist() == [2]  # bonus from p[2]
    tokens, n = run([0.5, 0.0], 0.3)  # 0.5 * 0.5 = 0.25 is not < 0.25: rejected
    assert tokens.tolist() == [[1, -1, -1]] and n.tolist() == [0]  # max(0, p - q) = [0, .25, 0]
    tokens, n = run([0.1, 0.3], 0.99)  # 0.3 * 0.8 >= 0.2: residual [0.4, 0, 0.2]
    assert tokens.tolist() == [[0, 2, -1]] and n.tolist() == [1]
    same = sampling.rejection_sample(p[:, :2], draft, p, np.float32([[0.999, 0.999]]), [0.5])
    assert same[1].tolist() == [2]  # q == p: always accepted
    with pytest.raises(ValueError):
        sampling.rejection_sample(q, draft + 2, p, np.float32([[0.1, 0.1]]), [0.5])
    with pytest.raises(ValueError):
        sampling.rejection_sample(q, draft, p, np.float32([[1.0, 0.1]]), [0.5])


def test_rejection_sample_outputs_the_target_distribution():
    """The speculative decoding guarantee: each emitted token is distributed as p at its place,
    whatever q is; with q and p swapped (a mutant) it is not."""
    rng = np.random.default_rng(STAT_SEED)
    v, s = 6, 2
    p_rows = rng.dirichlet(np.ones(v), s + 1).astype(np.float32)  # (S+1,V)
    q_rows = rng.dirichlet(np.ones(v), s).astype(np.float32)  # (S,V)
    p = np.ascontiguousarray(np.broadcast_to(p_rows, (N_STAT, s + 1, v)))
    q = np.ascontiguousarray(np.broadcast_to(q_rows, (N_STAT, s, v)))
    ones = np.ones((N_STAT, v), bool)
    draws = rng.random((s, N_STAT)).astype(np.float32)
    draft = np.stack([sampling.inverse_cdf(q[:, j], ones, draws[j]) for j in range(s)], axis=1)
    accept_u = rng.random((N_STAT, s)).astype(np.float32)
    sample_u = rng.random(N_STAT).astype(np.float32)
    tokens, n = sampling.rejection_sample(q, draft, p, accept_u, sample_u)
    for j in range(s + 1):
        emitted = tokens[n >= j, j]
        assert emitted.size > 10_000
        counts = np.bincount(emitted, minlength=v)
        assert sampling.chi_square(counts, p_rows[j])[2] > sampling.SIGNIFICANCE
    swapped_p = np.concatenate([q, p[:, s:]], axis=1)
    tokens, _ = sampling.rejection_sample(p[:, :s], draft, swapped_p, accept_u, sample_u)
    counts = np.bincount(tokens[:, 0], minlength=v)
    assert sampling.chi_square(counts, p_rows[0])[2] < 1e-12


# ---------------------------------------------------------------------------------------------
# Philox: the uniforms the kernels draw

# Random123's known answers for philox4x32 with 10 rounds (its kat_vectors): (counter, key, out).
PHILOX_KAT = (
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
)
PHILOX_SEED = 0x0123456789ABCDEF  # both key words non-zero


def test_philox_matches_random123_known_answers():
    for counter, key, want in PHILOX_KAT:
        got = sampling.philox4x32_10(np.array(counter, np.uint32), np.array(key, np.uint32))
        assert got.dtype == np.uint32 and got.tolist() == list(want)
    counters, keys, wants = (np.array(a, np.uint32) for a in zip(*PHILOX_KAT))
    assert np.array_equal(sampling.philox4x32_10(counters, keys), wants)  # vectorized [3, 4]
    shared = sampling.philox4x32_10(counters, keys[2])  # one key broadcast over the counters
    assert np.array_equal(shared[2], wants[2])
    with pytest.raises(ValueError, match="0..2"):
        sampling.philox4x32_10([2**32, 0, 0, 0], [0, 0])


def one_draw(seed: int, subsequence: int, position: int) -> int:
    """curand's word at `position` of a subsequence, one block at a time from the formula."""
    block = position >> 2
    counter = [block & 0xFFFFFFFF, block >> 32, subsequence & 0xFFFFFFFF, subsequence >> 32]
    words = sampling.philox4x32_10(np.array(counter, np.uint64), [seed & 0xFFFFFFFF, seed >> 32])
    return int(words[position & 3])


@pytest.mark.parametrize("offset", [0, 1, 3, 4, 70, 4 * (2**32 - 1) + 2, 2**62 + 5])
def test_philox_draws_are_curand_init_then_curand(offset):
    """Draw n of row b is the block at counter ((offset + n) >> 2, b), word (offset + n) & 3:
    across blocks, across the carry from counter word x into y, per row."""
    draws = sampling.philox_draws(PHILOX_SEED, offset, 3, 9)
    assert draws.dtype == np.uint32 and draws.shape == (3, 9)
    for b, n in itertools.product(range(3), range(9)):
        assert draws[b, n] == one_draw(PHILOX_SEED, b, offset + n), (b, n)


def test_philox_offset_shifts_the_stream_and_rows_are_independent():
    base = sampling.philox_draws(PHILOX_SEED, 0, 5, 80)
    for offset in (1, 2, 3, 4, 5, 68):
        assert np.array_equal(
            sampling.philox_draws(PHILOX_SEED, offset, 5, 80 - offset), base[:, offset:]
        )
    carry = 4 * (2**32 - 1)  # the last block before counter word x wraps
    across = sampling.philox_draws(PHILOX_SEED, carry, 2, 8)
    assert np.array_equal(sampling.philox_draws(PHILOX_SEED, carry + 3, 2, 5), across[:, 3:])
    assert across[0, 4] == one_draw(PHILOX_SEED, 0, 2**34), "word x wrapped, word y carried"
    # A row's stream does not depend on how many rows there are; rows and seeds differ.
    assert np.array_equal(
        sampling.philox_draws(PHILOX_SEED, 7, 2, 80),
        sampling.philox_draws(PHILOX_SEED, 7, 5, 80)[:2],
    )
    assert len({row.tobytes() for row in base}) == 5
    assert not np.array_equal(sampling.philox_draws(PHILOX_SEED + 1, 0, 5, 80), base)
    # An int64 seed_offset's negative seed is its 64 bits, as the cast to unsigned long long.
    assert np.array_equal(
        sampling.philox_draws(-1, 0, 2, 6), sampling.philox_draws(2**64 - 1, 0, 2, 6)
    )
    assert sampling.philox_draws(PHILOX_SEED, 5, 3, 0).shape == (3, 0)
    for bad in ((2**64, 0), (PHILOX_SEED, -1), (PHILOX_SEED, 2**63)):
        with pytest.raises(ValueError, match="out of range"):
            sampling.philox_draws(*bad, 1, 1)


def test_philox_uniforms_are_the_top_24_bits():
    x = sampling.philox_draws(PHILOX_SEED, 12, 4, 1000)
    u = sampling.philox_uniforms(PHILOX_SEED, 12, 4, 1000)
    assert u.dtype == np.float32 and u.shape == (4, 1000)
    assert np.array_equal(u.astype(np.float64) * 2.0**24, (x >> 8).astype(np.float64))  # exact
    assert np.all((u >= 0) & (u < 1))
    assert abs(u.mean() - 0.5) < 0.02  # 4000 uniforms: the mean's sd is 0.0046


def libcurand():
    """ctypes handle on libcurand (the CUDA toolkit's or a pip nvidia-curand's), else None."""
    places = sorted(Path("/usr/local").glob("cuda*/lib64/libcurand.so*"))
    places += sorted(Path(sys.prefix).glob("lib/python*/site-packages/nvidia/*/lib/libcurand.so*"))
    for place in places:
        try:
            return ctypes.CDLL(str(place))
        except OSError:
            continue
    return None


def curand_host_generate(lib, seed: int, offset: int, n: int) -> np.ndarray:
    """n words of curand's host Philox4_32_10 generator (no GPU needed) at a global offset."""
    philox = 161  # CURAND_RNG_PSEUDO_PHILOX4_32_10
    gen = ctypes.c_void_p()
    out = np.zeros(n, np.uint32)
    assert lib.curandCreateGeneratorHost(ctypes.byref(gen), philox) == 0
    try:
        assert lib.curandSetPseudoRandomGeneratorSeed(gen, ctypes.c_ulonglong(seed)) == 0
        assert lib.curandSetGeneratorOffset(gen, ctypes.c_ulonglong(offset)) == 0
        assert lib.curandGenerate(gen, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(n)) == 0
    finally:
        lib.curandDestroyGenerator(gen)
    return out


def test_philox_draws_are_libcurand_s():
    """curandGenerate lays the subsequences out interleaved (its default, legacy ordering): the
    4 words of block 0 of subsequence 0, of subsequence 1, ... of subsequence T - 1, then block 1
    of each; the generator's offset counts words of that layout. T is the library's choice, so it
    is read off the output: where subsequence 0's block 1 lands."""
    lib = libcurand()
    if lib is None:
        pytest.skip("libcurand not found (no CUDA toolkit under /usr/local, no nvidia-curand)")
    out = curand_host_generate(lib, PHILOX_SEED, 0, 2**20)
    block1 = sampling.philox_draws(PHILOX_SEED, 4, 1, 4)[0]
    starts = [i for i in np.flatnonzero(out == block1[0]) if np.array_equal(out[i : i + 4], block1)]
    assert starts and starts[0] % 4 == 0, "subsequence 0's second block is in the output"
    t = starts[0] // 4
    want = (
        sampling.philox_draws(PHILOX_SEED, 0, t, 8).reshape(t, 2, 4).transpose(1, 0, 2)
    )  # (2,T,4)
    assert np.array_equal(out[: 8 * t], want.reshape(-1)), f"{t} subsequences, 2 blocks each"
    # Subsequence 0 alone: a global offset of j rounds of T blocks plus w words starts inside its
    # block j at word w, across the carry from counter word x into y.
    for j, w in ((1, 3), (2**32 - 1, 2), (2**32, 0), (2**40 + 3, 1)):
        got = curand_host_generate(lib, PHILOX_SEED, 4 * t * j + w, 4 - w)
        assert np.array_equal(got, sampling.philox_draws(PHILOX_SEED, 4 * j + w, 1, 4 - w)[0]), (
            j,
            w,
        )


# ---------------------------------------------------------------------------------------------
# Byte models, generators, statistics


def test_byte_models_by_hand():
    assert sampling.sample_bytes(256, 128256) == 256 * (128256 * 4 + 16 + 4)
    assert sampling.sample_bytes(1, 32000, logit_bytes=2) == 64000 + 20
    assert sampling.renorm_bytes(4, 1000) == 4 * (8000 + 16)
    # worst case: 4 draft ids, 4 x (q, p) at them, p and q rows, 5 tokens + 1 count written
    assert sampling.rejection_bytes(1, 4, 100) == 16 + 32 + 800 + 20 + 4
    # row 0 accepts all 4 (bonus: one row), row 1 rejects its second draft (tests 2, reads 2 rows)
    assert sampling.rejection_bytes(2, 4, 100, [4, 1]) == 32 + 6 * 8 + 300 * 4 + 40 + 8


def test_lm_logits_look_like_a_language_model(rng):
    x = sampling.lm_logits(rng, 4, 128256)
    assert x.dtype == np.float32 and x.shape == (4, 128256)
    top = -np.sort(-x, axis=1)
    assert np.all(top[:, 0] - np.median(x, axis=1) > 8)  # a few tokens stand far above
    assert np.all(np.abs(np.median(x, axis=1)) < 0.1)  # the bulk sits at 0
    tied = sampling.lm_logits(rng, 4, 2000, ties=True, dtype=ml_dtypes.bfloat16)
    f = tied.astype(np.float32)
    assert np.all(f * 4 == np.round(f * 4))
    assert np.all((f == f.max(axis=1, keepdims=True)).sum(axis=1) >= 2)
    q, draft, p = sampling.speculative_inputs(rng, 3, 2, 50)
    assert q.shape == (3, 2, 50) and p.shape == (3, 3, 50) and draft.shape == (3, 2)
    np.testing.assert_allclose(p.sum(axis=2), 1, rtol=1e-6)


def test_chi_square_matches_the_tables():
    table = [(3.841459, 1, 0.05), (18.307038, 10, 0.05), (6.634897, 1, 0.01)]
    table += [(124.342113, 100, 0.05), (9.210340, 2, 0.01)]
    for stat, df, p in table:
        assert sampling._chi2_sf(stat, df) == pytest.approx(p, rel=1e-5)
    assert sampling.chi_square([50, 50], [0.5, 0.5]) == (0.0, 1, 1.0)
    assert sampling.chi_square([10, 90, 1], [0.1, 0.9, 0.0])[2] == 0.0  # outside the support
    stat, df, _ = sampling.chi_square([100, 200, 3, 2], [0.33, 0.66, 0.005, 0.005])
    assert df == 2  # the two cells expecting 1.5 each pooled into one
