"""Chapter 10's samplers on the GPU, judged by what a sampler promises: 200,000 draws of one row
pass a chi-square test against the exact filtered distribution (lkw.sampling.renorm of
filter_keep), and the same test fails the draws of a deliberately wrong sampler (the filters off,
the temperature ignored, top-p judged on the whole row instead of after top-k); every draw lies in
the support and every likely token is drawn, ties at the k-th value and inside the top-p boundary
included; v0 (sorted thresholds) and v4 with its cluster ablations (4 and 16 CTAs) draw the
reference's token for their Philox uniform u_0 (lkw.sampling.sample_mismatches) and v3 the token
of lkw.sampling.pivot_rejection_sample wherever no float32 sum can tip one of its decisions; a
seed_offset replays bit for bit and offset + 68 draws anew; rejection_sample emits the target's
distribution (the speculative decoding guarantee) where the q/p-swapped mutant does not, and
decides token for token as lkw.sampling.rejection_sample does.

Every input and every Philox seed_offset below is fixed, so a failure repeats. Without the
extension, torch or a GPU (or with chapter 10 not built) the GPU tests skip and say why; the checks
that the statistical cases can fail at all need no GPU. GPU cost: about 120 launches, 92 of them
of 200,000 rows of at most 100 tokens (seconds on an H200, most of it v4's eight-CTA clusters).
"""

import functools
import importlib
from typing import NamedTuple

import numpy as np
import pytest
from lkw import sampling

CHAPTER = "10_sampling"


def _optional(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


ext = _optional("lkw._ext")
torch = _optional("torch")


def _why_no_gpu() -> str:
    if ext is None:
        return "lkw._ext is not built (tools/setup.sh builds it)"
    if torch is None:
        return "device arrays come from torch, which is not installed"
    if not ext.device()["present"] or not torch.cuda.is_available():
        return "no GPU"
    return ""


NO_GPU = _why_no_gpu()
ARCH = 0 if NO_GPU else ext.device()["arch"]


def _versions(op: str, kinds=("version",), ids=None) -> list:
    """The registered versions of CHAPTER/op (of `kinds`; `ids`: only these), as parameters; where
    one cannot run here it is marked skip with the reason."""
    if NO_GPU:
        return [pytest.param(None, id=op, marks=pytest.mark.skip(reason=NO_GPU))]
    found = [
        v
        for v in ext.versions()
        if v["chapter"] == CHAPTER
        and v["op"] == op
        and v["kind"] in kinds
        and (ids is None or v["id"] in ids)
    ]
    if not found:
        which = f"{'/'.join(kinds)} {ids or ''}".strip()
        why = f"no {which} of {CHAPTER}/{op} is registered (chapter not built?)"
        return [pytest.param(None, id=op, marks=pytest.mark.skip(reason=why))]
    return [
        pytest.param(
            v["name"],
            id=v["id"],
            marks=pytest.mark.skipif(
                v["min_arch"] > ARCH,
                reason=f"{v['name']} needs sm_{v['min_arch']}, the device is sm_{ARCH}",
            ),
        )
        for v in found
    ]


def _to_gpu(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _seed_offset(seed_offset: tuple[int, int]):
    return _to_gpu(np.array(seed_offset, np.int64))


def _launch_sample(name, logits, temperature, top_k, top_p, min_p, seed_offset) -> np.ndarray:
    """tokens int32 [B] of one launch. logits: a [B, V] float32 tensor on the GPU; the filters: a
    scalar (every row) or a [B] array each."""
    b, v = logits.shape
    rows = [
        _to_gpu(np.broadcast_to(np.asarray(value, dtype), (b,)))
        for value, dtype in (
            (temperature, np.float32),
            (top_k, np.int32),
            (top_p, np.float32),
            (min_p, np.float32),
        )
    ]
    tokens = _to_gpu(np.full(b, -7, np.int32))  # a row the kernel never writes stays -7
    ext.launch(name, [logits, *rows, _seed_offset(seed_offset)], [tokens])
    torch.cuda.synchronize()
    out = tokens.cpu().numpy()
    bad = np.flatnonzero((out < 0) | (out >= v))
    assert bad.size == 0, f"{name}: rows {bad[:8]} hold tokens {out[bad[:8]]}, outside 0..{v - 1}"
    return out


def _launch_rejection(name, q, draft, p, seed_offset) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [B, S+1], num_accepted int32 [B]) of one launch on host arrays, after checking
    their shape: a row emits n + 1 tokens in 0..V-1, then PLACEHOLDER."""
    b, s, v = q.shape
    tokens = _to_gpu(np.full((b, s + 1), -7, np.int32))
    accepted = _to_gpu(np.full(b, -7, np.int32))
    inputs = [_to_gpu(q), _to_gpu(draft.astype(np.int32)), _to_gpu(p), _seed_offset(seed_offset)]
    ext.launch(name, inputs, [tokens, accepted])
    torch.cuda.synchronize()
    tokens, n = tokens.cpu().numpy(), accepted.cpu().numpy()
    assert ((n >= 0) & (n <= s)).all(), f"{name}: num_accepted outside 0..{s}: {np.unique(n)}"
    emitted = np.arange(s + 1) <= n[:, None]  # (B,S+1)
    assert ((tokens >= 0) & (tokens < v))[emitted].all(), f"{name}: an emitted token is not a token"
    assert (tokens[~emitted] == sampling.PLACEHOLDER).all(), f"{name}: a slot after the last token"
    return tokens, n


# ---------------------------------------------------------------------------------------------
# The statistical cases: one row drawn N_DRAWS times in one launch (B = N_DRAWS identical rows,
# each row its own Philox subsequence), per temperature and filter set.

N_DRAWS = 200_000
STAT_SEED_OFFSET = (10, 0)  # the Philox (seed, offset) of every statistical launch
ROW_SEED = 112  # lm_logits rows where every filter set bites and none is uncertain (checked below)
LIKELY = 30  # a token expected >= 30 times is drawn at least once but with probability e^-30
TEMPERATURES = (1.0, 0.7)
FILTERS = {  # name -> (top_k, top_p, min_p); 0, 1.0 and 0.0 are the contract's "off"
    "none": (0, 1.0, 0.0),
    "top_k=5": (5, 1.0, 0.0),
    "top_p=0.8": (0, 0.8, 0.0),
    "min_p=0.05": (0, 1.0, 0.05),
    "top_k=3,top_p=0.7": (3, 0.7, 0.0),  # top-p within top-k keeps fewer than on the whole row
}
# On a grid of 1/4 (exact in float32; z = x / T keeps the ties): two maxima, three tokens at 2.5,
# three at 1.5. k = 1 and 4 fall inside a tie group, kept whole (2 and 5 tokens); top-p 0.6
# carries its sum across p inside the 2.5 group, kept whole too; k = 7 (9 tokens, to the 1.5 group)
# with top-p 0.75 keeps 5 at T = 1, where top-p judged on the whole row would keep 6.
TIE_ROW = np.float32(
    [3.0, 1.5, 2.5, 0.5, 3.0, 1.5, -1.0, 2.5, 0.0, 1.5, 2.5, -0.5, 1.0, 0.25, 2.0, -2.0]
)
TIE_FILTERS = {
    "none": (0, 1.0, 0.0),
    "top_k=1": (1, 1.0, 0.0),
    "top_k=4": (4, 1.0, 0.0),
    "top_p=0.6": (0, 0.6, 0.0),
    "top_k=7,top_p=0.75": (7, 0.75, 0.0),
}
ROWS = {
    "V=16": sampling.lm_logits(np.random.default_rng(ROW_SEED), 1, 16)[0],
    "V=100": sampling.lm_logits(np.random.default_rng(ROW_SEED), 1, 100)[0],
    "V=16,ties": TIE_ROW,
}
ROW_FILTERS = {"V=16": FILTERS, "V=100": FILTERS, "V=16,ties": TIE_FILTERS}


class Exact(NamedTuple):
    probs: np.ndarray  # float64 [V]: the filtered distribution (renorm of filter_keep)
    wide: np.ndarray  # bool [V]: kept by the widest reading (slack +1) with positive mass
    uncertain: bool  # a token within float32 summing error of a threshold


@functools.cache
def _exact(row: str, t: float, filt: str, order: str = "top_k_first") -> Exact:
    k, p, min_p = ROW_FILTERS[row][filt]
    keys, mass = sampling.from_logits(ROWS[row][None], t)
    keep = sampling.filter_keep(keys, mass, k, p, min_p, order=order)
    wide = sampling.filter_keep(keys, mass, k, p, min_p, order=order, slack=+1) & (mass > 0)
    unsure = sampling.uncertain_tokens(keys, mass, k, p, min_p, order=order).any()
    return Exact(sampling.renorm(mass, keep)[0].astype(np.float64), wide[0], bool(unsure))


def _detectable(wrong: np.ndarray, probs: np.ndarray, n: int = N_DRAWS) -> bool:
    """Would n draws from `wrong` fail the chi-square test against `probs` all but surely? Either >= LIKELY draws are expected outside the support (chi_square's p-value is
    then 0), or the noncentrality lam = n * sum((w - p)^2 / p) is >= 150 + 4 df: the statistic's
    mean df + lam then stands >= 5 standard deviations (sqrt(2 (df + 2 lam))) above the
    critical value of SIGNIFICANCE."""
    wrong, probs = wrong / wrong.sum(), probs / probs.sum()
    inside = probs > 0
    if n * wrong[~inside].sum() >= LIKELY:
        return True
    lam = n * float((((wrong - probs)[inside]) ** 2 / probs[inside]).sum())
    return lam >= 150 + 4 * (int(inside.sum()) - 1)


STAT_CASES = [(r, t, f) for r in ROWS for t in TEMPERATURES for f in ROW_FILTERS[r]]
FILTERED_CASES = [c for c in STAT_CASES if c[2] != "none"]
# top_k=1 on the two tied maxima draws each with 1/2 at every temperature: nothing to detect
T_BLIND = {("V=16,ties", "top_k=1")}
T_CASES = [(r, f) for r in ROWS for f in ROW_FILTERS[r] if (r, f) not in T_BLIND]
# both top-k and top-p on, where top-p judged on the whole row (order "joint": the top-k
# renormalization skipped) keeps another set
JOINT_CASES = [
    (r, t, f)
    for r, t, f in STAT_CASES
    if ROW_FILTERS[r][f][0] > 0
    and ROW_FILTERS[r][f][1] < 1
    and not np.array_equal(_exact(r, t, f).probs > 0, _exact(r, t, f, "joint").probs > 0)
]


def _case_id(case) -> str:
    return "-".join(str(x) if not isinstance(x, float) else f"T={x}" for x in case)


@functools.cache
def _identical_rows(row: str):
    """The row N_DRAWS times, on the GPU (80 MB at V = 100)."""
    return _to_gpu(np.broadcast_to(ROWS[row], (N_DRAWS, ROWS[row].size)))


@functools.cache
def _counts(name: str, row: str, t: float, filt: str) -> np.ndarray:
    """int64 [V]: how often each token came out of one launch of N_DRAWS identical rows."""
    k, p, min_p = ROW_FILTERS[row][filt]
    tokens = _launch_sample(name, _identical_rows(row), t, k, p, min_p, STAT_SEED_OFFSET)
    return np.bincount(tokens, minlength=ROWS[row].size)


def _verdict(name, case, counts, probs) -> tuple[float, str]:
    stat, df, pvalue = sampling.chi_square(counts, probs)
    top = np.argsort(-probs)[:6]
    return pvalue, (
        f"{name} {_case_id(case)}: chi-square {stat:.1f} on {df} df, p-value {pvalue:.3g}; "
        f"tokens {top}: drawn {counts[top]}, expected {np.round(probs[top] * counts.sum())}"
    )


def test_every_statistical_case_is_certain_and_every_wrong_sampler_detectable():
    """The data, not a kernel: no token of a case lies within float32 summing error of a
    threshold (a kernel may decide it either way, and the exact distribution would be wrong), every
    filter drops mass, and each wrong sampler the tests below feed to the chi-square test deviates
    from the filtered distribution far beyond the test's noise."""
    for case in STAT_CASES:
        exact = _exact(*case)
        assert not exact.uncertain, f"{_case_id(case)} has an uncertain token"
        if case[2] != "none":
            none = _exact(case[0], case[1], "none").probs
            assert (exact.probs == 0).any(), f"{_case_id(case)} keeps the whole row"
            assert _detectable(none, exact.probs), f"{_case_id(case)}: filters off undetectable"
    for row, filt in T_CASES:
        wrong, probs = _exact(row, 1.0, filt).probs, _exact(row, 0.7, filt).probs
        assert _detectable(wrong, probs), f"{row} {filt}: T ignored undetectable"
    for row, filt in T_BLIND:
        np.testing.assert_allclose(_exact(row, 1.0, filt).probs, _exact(row, 0.7, filt).probs)
    assert {r for r, _, _ in JOINT_CASES} == set(ROWS), "each row needs an order-sensitive case"
    for case in JOINT_CASES:
        assert _detectable(_exact(*case, "joint").probs, _exact(*case).probs), case
    # the ties: k = 1 keeps both maxima, k = 4 the whole 2.5 group, top-p 0.6 too (not 2 of 3)
    assert np.flatnonzero(_exact("V=16,ties", 0.7, "top_k=1").probs).tolist() == [0, 4]
    assert np.flatnonzero(_exact("V=16,ties", 0.7, "top_k=4").probs).tolist() == [0, 2, 4, 7, 10]
    assert np.flatnonzero(_exact("V=16,ties", 1.0, "top_p=0.6").probs).tolist() == [0, 2, 4, 7, 10]


@pytest.mark.parametrize("case", STAT_CASES, ids=_case_id)
@pytest.mark.parametrize("name", _versions("sample"))
def test_draws_pass_a_chi_square_test_against_the_filtered_distribution(name, case):
    pvalue, why = _verdict(name, case, _counts(name, *case), _exact(*case).probs)
    assert pvalue > sampling.SIGNIFICANCE, why


@pytest.mark.parametrize("case", STAT_CASES, ids=_case_id)
@pytest.mark.parametrize("name", _versions("sample"))
def test_every_draw_lies_in_the_support_and_every_likely_token_is_drawn(name, case):
    """Tokens tied with the k-th value, or inside the tie group that carries top-p's sum across p,
    are kept: they must be drawn, and nothing outside the widest reading of the filters may be."""
    counts, exact = _counts(name, *case), _exact(*case)
    drawn = np.flatnonzero(counts)
    outside = drawn[~exact.wide[drawn]]
    assert outside.size == 0, (
        f"{name} {_case_id(case)}: drew tokens {outside} ({counts[outside]} times), outside the "
        f"support {np.flatnonzero(exact.wide)}"
    )
    likely = np.flatnonzero(exact.probs * N_DRAWS >= LIKELY)
    missed = likely[counts[likely] == 0]
    assert missed.size == 0, f"{name} {_case_id(case)}: never drew the kept tokens {missed}"


@pytest.mark.parametrize("case", FILTERED_CASES, ids=_case_id)
@pytest.mark.parametrize("name", _versions("sample"))
def test_the_chi_square_test_fails_draws_with_the_filters_off(name, case):
    row, t, _ = case
    pvalue, why = _verdict(name, case, _counts(name, row, t, "none"), _exact(*case).probs)
    assert pvalue < sampling.SIGNIFICANCE, "the test cannot tell the filters off: " + why


@pytest.mark.parametrize("row,filt", T_CASES, ids=lambda x: x)
@pytest.mark.parametrize("name", _versions("sample"))
def test_the_chi_square_test_fails_draws_that_ignore_the_temperature(name, row, filt):
    """The draws at T = 1 where the test expects T = 0.7."""
    case = (row, 0.7, filt)
    pvalue, why = _verdict(name, case, _counts(name, row, 1.0, filt), _exact(*case).probs)
    assert pvalue < sampling.SIGNIFICANCE, "the test cannot tell T ignored: " + why


@pytest.mark.parametrize("case", JOINT_CASES, ids=_case_id)
@pytest.mark.parametrize("name", _versions("sample"))
def test_draws_fail_the_chi_square_test_against_top_p_judged_on_the_whole_row(name, case):
    """top_k_first renormalizes after top-k: the distribution of order "joint" (top-p against the
    whole row's mass, the renormalization skipped) is a wrong one, and the draws must fail it."""
    pvalue, why = _verdict(name, case, _counts(name, *case), _exact(*case, "joint").probs)
    assert pvalue < sampling.SIGNIFICANCE, "the draws follow order 'joint': " + why


# ---------------------------------------------------------------------------------------------
# Token for token: each version's draw rule on an LM's rows with mixed filters per row.

TOKEN_B, TOKEN_V = 256, 32000
TOKEN_SEED = 11  # the logits and the per-row filters
TOKEN_SEED_OFFSET = (12, 68 * 5)
PIVOT_ROUNDS = 64  # v3's rounds (MAX_ROUNDS); a row needing more makes the reference raise
# How each version's token follows from its row's Philox uniforms (the kernels' headers):
# inverse_cdf: lkw.sampling.sample with u_0; pivot: lkw.sampling.pivot_rejection_sample with u_r.
DRAW_RULES = {
    "v0_sort_cub": "inverse_cdf",
    "v3_pivot_rejection": "pivot",
    "v4_fused_cluster": "inverse_cdf",
    "ablation_v4_cluster4": "inverse_cdf",
    "ablation_v4_cluster16": "inverse_cdf",
}
SAMPLERS = ("version", "ablation")  # the token-for-token, greedy and replay tests take both


class TokenInputs(NamedTuple):
    x: np.ndarray  # float32 [B, V]
    t: np.ndarray  # float32 [B], 0 = greedy
    top_k: np.ndarray  # int32 [B]
    top_p: np.ndarray  # float32 [B]
    min_p: np.ndarray  # float32 [B]

    def filters(self, rows=slice(None)) -> dict:
        return {"top_k": self.top_k[rows], "top_p": self.top_p[rows], "min_p": self.min_p[rows]}


@functools.cache
def _token_inputs() -> TokenInputs:
    rng = np.random.default_rng(TOKEN_SEED)
    x = sampling.lm_logits(rng, TOKEN_B, TOKEN_V)
    t = rng.choice(np.float32([0.0, 0.5, 0.7, 1.0, 1.3]), TOKEN_B)
    top_k = rng.choice(np.int32([0, -1, 1, 20, 50, 1000, TOKEN_V]), TOKEN_B)  # -1, 0, V: off
    top_p = rng.choice(np.float32([1.0, 0.95, 0.8, 0.5]), TOKEN_B)
    min_p = rng.choice(np.float32([0.0, 0.0, 0.02, 0.1]), TOKEN_B)
    return TokenInputs(x, t, top_k, top_p, min_p)


@functools.cache
def _token_logits():
    return _to_gpu(_token_inputs().x)


def _sample_tokens(name: str, seed_offset=TOKEN_SEED_OFFSET) -> np.ndarray:
    a = _token_inputs()
    return _launch_sample(name, _token_logits(), a.t, a.top_k, a.top_p, a.min_p, seed_offset)


def _versions_drawing_by(rule: str) -> list:
    """The sample versions whose DRAW_RULES entry is `rule`; with "inverse_cdf" also those without
    an entry, marked skip (visible until their rule is added)."""
    params = []
    for param in _versions("sample", SAMPLERS):
        name = param.values[0]
        vid = name.rsplit("/", 1)[-1] if name else None
        if name is None or DRAW_RULES.get(vid) == rule:
            params.append(param)
        elif vid not in DRAW_RULES and rule == "inverse_cdf":
            why = f"{name} has no draw rule to compare token for token: add it to DRAW_RULES"
            params.append(pytest.param(name, id=vid, marks=pytest.mark.skip(reason=why)))
    if not params:
        why = f"no registered sample version draws by {rule!r}"
        params.append(pytest.param(None, id=rule, marks=pytest.mark.skip(reason=why)))
    return params


class PivotReference(NamedTuple):
    sampled: np.ndarray  # int [n]: the rows with T > 0
    tokens: np.ndarray  # int32 [n]: pivot_rejection_sample's token of each
    exact: np.ndarray  # bool [n]: rows where the kernel must draw that very token
    wide: np.ndarray  # bool [n, V]: the support (widest reading of the filters, mass > 0)


@functools.cache
def _pivot_reference() -> PivotReference:
    """pivot_rejection_sample on the sampled rows with v3's uniforms (round r: u_r), and the rows
    where v3's float32 sums cannot tip a decision: no uncertain token (the accept tests, and the
    pivot tests, which judge a pivot as the largest key at or below it), and no round's draw
    within MARGIN of a CDF boundary (uncertain_samples over the tokens above `low`)."""
    a = _token_inputs()
    sampled = np.flatnonzero(a.t > 0)
    keys, mass = sampling.from_logits(a.x[sampled], a.t[sampled])
    filters = a.filters(sampled)
    keep = sampling.filter_keep(keys, mass, **filters)
    wide = sampling.filter_keep(keys, mass, slack=+1, **filters) & (mass > 0)
    u = sampling.philox_uniforms(*TOKEN_SEED_OFFSET, TOKEN_B, PIVOT_ROUNDS)[sampled]
    tokens, rounds, trace = sampling.pivot_rejection_sample(keys, mass, keep, u)
    unsure = sampling.uncertain_tokens(keys, mass, **filters).any(axis=1)
    for r in range(int(rounds.max())):
        live = np.flatnonzero(rounds > r)
        allowed = keys[live] > trace["low"][live, r][:, None]  # (L,V)
        unsure[live] |= sampling.uncertain_samples(mass[live], allowed, u[live, r])
    return PivotReference(sampled, tokens, ~unsure, wide)


def test_the_token_cases_mix_the_filters_and_compare_most_rows_token_for_token():
    """The data, not a kernel: greedy rows and every filter in many rows, most rows certain enough
    for v3's token-for-token comparison, and sample_mismatches catches a draw from u_1."""
    a = _token_inputs()
    greedy = a.t == 0
    assert 20 <= greedy.sum() <= TOKEN_B - 150
    sampled = ~greedy
    for on in ((a.top_k > 0) & (a.top_k < TOKEN_V), a.top_p < 1, a.min_p > 0):
        assert (sampled & on).sum() >= 30
    ref = _pivot_reference()
    assert ref.exact.sum() >= 0.8 * ref.sampled.size, f"only {ref.exact.sum()} rows exact"
    keys, mass = sampling.from_logits(a.x[sampled], a.t[sampled])
    keep = sampling.filter_keep(keys, mass, **a.filters(sampled))
    u = sampling.philox_uniforms(*TOKEN_SEED_OFFSET, TOKEN_B, 2)[sampled]
    shifted = sampling.inverse_cdf(mass, keep, u[:, 1])
    assert sampling.sample_mismatches(shifted, keys, mass, u[:, 0], **a.filters(sampled)).size >= 30


@pytest.mark.parametrize("name", _versions("sample", SAMPLERS))
def test_greedy_rows_take_the_lowest_index_of_the_largest_logit(name):
    a = _token_inputs()
    greedy = np.flatnonzero(a.t == 0)
    got = _sample_tokens(name)[greedy]
    want = np.argmax(a.x[greedy], axis=1)
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, f"{name}: rows {greedy[wrong]} drew {got[wrong]}, want {want[wrong]}"


@pytest.mark.parametrize("name", _versions_drawing_by("inverse_cdf"))
def test_inverse_cdf_versions_draw_the_reference_token_of_u0(name):
    a = _token_inputs()
    sampled = np.flatnonzero(a.t > 0)
    keys, mass = sampling.from_logits(a.x[sampled], a.t[sampled])
    u0 = sampling.philox_uniforms(*TOKEN_SEED_OFFSET, TOKEN_B, 1)[sampled, 0]
    got = _sample_tokens(name)[sampled]
    bad = sampling.sample_mismatches(got, keys, mass, u0, **a.filters(sampled))
    want = sampling.sample(a.x[sampled], u0, a.t[sampled], **a.filters(sampled))
    assert bad.size == 0, (
        f"{name}: rows {sampled[bad][:8]} drew {got[bad][:8]}, the reference {want[bad][:8]} "
        f"(u_0 = {u0[bad][:8]})"
    )


@pytest.mark.parametrize("name", _versions_drawing_by("pivot"))
def test_pivot_versions_draw_the_token_of_pivot_rejection_sample(name):
    """Token for token on the rows where no float32 sum can tip a decision (_pivot_reference);
    on the others, in the support."""
    ref = _pivot_reference()
    got = _sample_tokens(name)[ref.sampled]
    differ = np.flatnonzero(ref.exact & (got != ref.tokens))
    assert differ.size == 0, (
        f"{name}: rows {ref.sampled[differ][:8]} drew {got[differ][:8]}, "
        f"pivot_rejection_sample {ref.tokens[differ][:8]}"
    )
    outside = np.flatnonzero(~ref.wide[np.arange(got.size), got])
    assert outside.size == 0, f"{name}: rows {ref.sampled[outside]} drew outside the support"


@pytest.mark.parametrize("name", _versions("sample", SAMPLERS))
def test_a_seed_offset_replays_bit_for_bit_and_the_next_offset_draws_anew(name):
    seed, offset = TOKEN_SEED_OFFSET
    first = _sample_tokens(name)
    again = _sample_tokens(name)
    np.testing.assert_array_equal(again, first, err_msg=f"{name}: the same seed_offset")
    moved = _sample_tokens(name, (seed, offset + 68))
    assert (moved != first).any(), f"{name}: offset + 68 drew the same {TOKEN_B} tokens"


# ---------------------------------------------------------------------------------------------
# rejection_sample: the speculative decoding guarantee, and token for token.

SPEC_SEED = 13  # q, p and the draft tokens
SPEC_S, SPEC_V = 2, 12  # the distribution case: B = N_DRAWS requests of one (q, p)
SPEC_SEED_OFFSET = (14, 68 * 7)
SPEC_TOKEN_B, SPEC_TOKEN_S, SPEC_TOKEN_V = 64, 4, 1000


@functools.cache
def _spec_case():
    """(q [1, S, V], p [1, S+1, V], drafts int32 [N_DRAWS, S]): one request's probs, and each
    request's draft tokens drawn from its q rows (the guarantee needs x ~ q)."""
    rng = np.random.default_rng(SPEC_SEED)
    q, _, p = sampling.speculative_inputs(rng, 1, SPEC_S, SPEC_V)
    u = rng.random((SPEC_S, N_DRAWS)).astype(np.float32)
    ones = np.ones((N_DRAWS, SPEC_V), bool)
    drafts = np.stack(
        [
            sampling.inverse_cdf(np.broadcast_to(q[0, s], (N_DRAWS, SPEC_V)), ones, u[s])
            for s in range(SPEC_S)
        ],
        axis=1,
    )
    return q, p, drafts.astype(np.int32)


def _first_token_of_swapped(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """float64 [V]: the first emitted token's distribution with q and p exchanged and the drafts
    drawn from q: x accepted with probability min(1, q/p), else (q - p)+ renormalized."""
    q, p = q.astype(np.float64) / q.sum(), p.astype(np.float64) / p.sum()
    accept = q * np.minimum(1.0, q / p)
    residual = np.maximum(q - p, 0.0)
    return accept + (1.0 - accept.sum()) * residual / residual.sum()


@functools.cache
def _spec_draws(name: str):
    q, p, drafts = _spec_case()
    b = N_DRAWS
    qs = np.broadcast_to(q, (b, SPEC_S, SPEC_V))
    ps = np.broadcast_to(p, (b, SPEC_S + 1, SPEC_V))
    return _launch_rejection(name, qs, drafts, ps, SPEC_SEED_OFFSET)


def test_the_speculative_cases_can_tell_the_mutant_and_stop_at_every_draft():
    q, p, _ = _spec_case()
    swapped = _first_token_of_swapped(q[0, 0], p[0, 0])
    assert _detectable(swapped, p[0, 0].astype(np.float64)), "the mutant is undetectable"
    s = SPEC_TOKEN_S
    u = sampling.philox_uniforms(*SPEC_SEED_OFFSET, SPEC_TOKEN_B, s + 1)
    _, n, unsure = sampling.rejection_sample(*_spec_token_case(), u[:, :s], u[:, s], True)
    assert np.unique(n).tolist() == list(range(s + 1)), "every num_accepted 0..S occurs"
    assert unsure.sum() <= SPEC_TOKEN_B // 8


@pytest.mark.parametrize("name", _versions("rejection_sample"))
def test_rejection_sample_emits_the_target_distribution(name):
    """Each emitted token, where emitted (slot j of the rows that accepted j drafts), is
    distributed as p[j] whatever q is: min(q, p) accepted plus the residual (p - q)+ resampled."""
    _, p, _ = _spec_case()
    tokens, n = _spec_draws(name)
    for j in range(SPEC_S + 1):
        emitted = tokens[n >= j, j]
        assert emitted.size >= N_DRAWS // 10
        counts = np.bincount(emitted, minlength=SPEC_V)
        pvalue, why = _verdict(name, ("slot", j), counts, p[0, j].astype(np.float64))
        assert pvalue > sampling.SIGNIFICANCE, why


@pytest.mark.parametrize("name", _versions("rejection_sample", ("mutant",), ["mutant_q_p_swapped"]))
def test_the_chi_square_test_fails_the_q_p_swapped_mutant(name):
    _, p, _ = _spec_case()
    tokens, _ = _spec_draws(name)
    counts = np.bincount(tokens[:, 0], minlength=SPEC_V)
    pvalue, why = _verdict(name, ("slot", 0), counts, p[0, 0].astype(np.float64))
    assert pvalue < sampling.SIGNIFICANCE, "the mutant passes: " + why


@functools.cache
def _spec_token_case():
    rng = np.random.default_rng(SPEC_SEED + 1)
    return sampling.speculative_inputs(rng, SPEC_TOKEN_B, SPEC_TOKEN_S, SPEC_TOKEN_V)


@pytest.mark.parametrize("name", _versions("rejection_sample"))
def test_rejection_sample_decides_token_for_token_as_the_reference(name):
    """Acceptances are bit-exact (u * q < p in float32): num_accepted and the accepted drafts in
    every row; the last token equal where it lies beyond MARGIN of a CDF boundary, elsewhere one
    of positive weight in the distribution it is drawn from (the residual, or p)."""
    q, draft, p = _spec_token_case()
    s = SPEC_TOKEN_S
    u = sampling.philox_uniforms(*SPEC_SEED_OFFSET, SPEC_TOKEN_B, s + 1)
    want, want_n, unsure = sampling.rejection_sample(q, draft, p, u[:, :s], u[:, s], True)
    got, n = _launch_rejection(name, q, draft, p, SPEC_SEED_OFFSET)
    np.testing.assert_array_equal(n, want_n, err_msg=f"{name}: num_accepted")
    rows = np.arange(SPEC_TOKEN_B)
    last = np.arange(s + 1) == n[:, None]  # (B,S+1)
    np.testing.assert_array_equal(
        np.where(last, -2, got), np.where(last, -2, want), err_msg=f"{name}: the accepted drafts"
    )
    differ = np.flatnonzero((got[rows, n] != want[rows, n]) & ~unsure)
    assert differ.size == 0, f"{name}: rows {differ} drew {got[differ, n[differ]]}"
    p_n = p[rows, n]
    residual = np.maximum(p_n - q[rows, np.minimum(n, s - 1)], np.float32(0))
    dist = np.where((n == s)[:, None] | (residual.sum(axis=1) == 0)[:, None], p_n, residual)
    assert (dist[rows, got[rows, n]] > 0).all(), f"{name}: a last token of no weight"


@pytest.mark.parametrize("name", _versions("rejection_sample"))
def test_rejection_sample_replays_bit_for_bit_and_the_next_offset_draws_anew(name):
    q, draft, p = _spec_token_case()
    seed, offset = SPEC_SEED_OFFSET
    first = _launch_rejection(name, q, draft, p, SPEC_SEED_OFFSET)
    again = _launch_rejection(name, q, draft, p, SPEC_SEED_OFFSET)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: the same seed_offset")
    moved = _launch_rejection(name, q, draft, p, (seed, offset + 68))
    assert any((a != b).any() for a, b in zip(first, moved)), f"{name}: offset + 68 drew the same"
