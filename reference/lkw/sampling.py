"""Chapter 10 reference: choosing the next token from logits [B, V], and speculative decoding's
rejection sampling. No randomness is drawn here: every op takes its uniforms as an input (the
kernels draw them from curand's Philox4_32_10, which `philox_uniforms` reproduces bit for bit),
so each output is a function of its arguments and a kernel can be compared with it token for
token.

The pipeline of `sample`, per row b (every filter optional and per row):

    x     logits [B, V] float32 or bfloat16 (bfloat16 widens to float32 exactly); NaN and +inf
          are refused, -inf is an ordinary (already masked) logit. -0.0 is read as +0.0.
    z     = fp32(x / T)        one IEEE float32 division, round to nearest even (the division
                               torch's logits.div_(T) does; x * (1/T) differs in the last bit
                               now and then and may reorder near-ties). T = 0: greedy, the
                               lowest index of max x, every filter and u ignored.
    key   = z                  what the filters COMPARE: exact float32 comparisons, so the order
                               of the tokens is decided bit for bit (sampling from probs: the
                               float32 probs themselves are the keys)
    mass  = exp(z - max z)     what the filters and the CDF SUM: float64, never rounded
                               (from probs: float64(probs); they need not sum to 1)
    K     top-k: keep i iff #{j : key_j > key_i} < k. Every token equal to the k-th largest key
          is kept, so K may hold more than k tokens when there are ties at the k-th value.
    P     top-p: keep i iff M_gt(i) < p * M(K), M_gt(i) = the mass of the tokens whose key is
          greater than key_i, M(K) = the mass of K. The token that carries the sum across p is
          kept; one whose strictly-larger mass is exactly p * M(K) is not; a tie group is kept or
          dropped as a whole. order = "joint" uses the whole row's mass instead of M(K) (top-k and
          top-p judged on the original distribution).
    N     min-p: keep i iff mass_i >= min_p * max mass (relative to the largest token, so it is
          the same before or after any renormalization).
    keep  = K & P & N          an upper set of the keys: keep = (key >= tau) for a threshold tau
    probs = mass * keep / sum(mass * keep), float64 rounded once to float32 (the *_renorm_probs)
    token = the first i in VOCABULARY order with C_i > t, where C_i is the inclusive prefix sum
          of mass * keep in index order (float64, left to right) and t = u * C_{V-1}, the target
          scaled by the prefix sum's own last element. With u in [0, 1) the search always ends
          inside the row on a token of positive mass; u = 1 (curand_uniform's range is (0, 1])
          falls through to the last kept token of positive mass. Every version, the sort-based
          v0 included, walks the CDF in index order, so equal u give equal tokens; the sort
          only finds the thresholds.

Disabled filters: top_k <= 0 or >= V, top_p >= 1, min_p <= 0, or None. Valid ranges: top_p in
(0, 1], min_p in [0, 1], T >= 0.

Why ties at a threshold keep the whole tie group. The kernels that avoid sorting find a value
(the radix-selected k-th key, a pivot), never a set of indices, and test each element against it
in one pass: "key >= threshold" is all they can decide without a second, ordered pass over the
ties. It is also the production rule: FlashInfer's pivot kernels accept a candidate iff
count(> pivot) < k and mass(> pivot) < p (exactly K and P above), and vLLM's torch path masks
logits below the k-th sorted value. (vLLM's sorted top-p may split a tie group at the boundary,
in sort order; this reference does not.) Order "top_k_first" (the default) renormalizes after
top-k before top-p, as vLLM's torch path and FlashInfer's filter_apply_order="top_k_first" do;
"joint" is FlashInfer's fused top-k + top-p rejection kernel. Min-p comes last (SGLang's order:
top-k, top-p, then min-p), so it never changes the M(K) top-p compares with, and being relative
to the maximum it reads the same before or after renormalization; a fused kernel needs only the
row maximum for it. vLLM applies min-p before top-k / top-p instead, so its top-p renormalizes
over the min-p survivors too: the two orders can part at the top-p boundary.

Rounding and what a kernel can match. Top-k, the temperature and the masks of top_k_mask_logits
are bit-exact (float32 division and comparisons). Everything that SUMS mass (top-p, min-p through
expf, the CDF search, the radix histograms of mass) is float64 here, while a kernel sums float32
in its own association (no single float32 order could serve every version, so the reference does
not emulate one). The two agree except where a decision lies within MARGIN = 2^-16 of the row's
mass from its threshold: 256 float32 roundings, more than a thread's sequential run over its
share of a 152K row (149 elements at 1024 threads) plus a block tree and a carry across chunks
can lose. `uncertain_tokens` and `uncertain_samples` name those places; the comparisons exempt
them: `keep_mismatches` (kept sets) and `sample_mismatches` (sampled tokens: in a row whose kept
set is certain, a token is admissible iff its CDF interval comes within MARGIN of u * total, so
a kernel may pick a neighbour only across a boundary it can honestly misjudge). In a 128K row
whose tail carries real mass, tail tokens are narrower than MARGIN, so a tail sample is often
uncertain; the interval rule still pins the kernel's token to within MARGIN of the target.
Renormalized probabilities agree within PROB_RTOL.

The kernels' uniforms. Row b of a sampling kernel calls curand_init(seed, subsequence = b,
offset) and then curand() for raw 32-bit words x_0, x_1, ...; round r uses u_r = (x_r >> 8) *
2^-24, the top 24 bits, which a float32 holds exactly: u_r lies in [0, 1), so inverse_cdf's
search ends inside the row. `philox4x32_10` is curand's block function, `philox_draws` the x_r of
rows 0..B-1 (draw n = philox4x32_10(counter = ((offset + n) >> 2, b), key = seed)[(offset + n)
& 3]) and `philox_uniforms` the u_r, so a test knows every uniform a kernel drew: u_r is
pivot_rejection_sample's uniforms[:, r], u_0 sample's u, u_s rejection_sample's accept_u[:, s]
(s < S) and u_S its sample_u.

Also here: the threshold search without sorting (`radix_select`: the k-th largest key, or the
top-p threshold, by histograms of 8-bit digits of an order-preserving uint32 key, pass by pass,
with the per-pass histograms a kernel can be checked against), FlashInfer-style sorting-free
rejection sampling with pivots (`pivot_rejection_sample`), speculative decoding
(`rejection_sample`), byte models, input generators and the chi-square test the statistical
checks use.
"""

import math
from typing import NamedTuple

import ml_dtypes
import numpy as np

MARGIN = 2.0**-16  # decisions this close to a threshold (relative to the row's mass) are uncertain
PROB_RTOL = 2.0**-14  # renormalized probs: expf (2 ulp), z - max z rounded (|z - max| ulp), sums
RADIX_BITS = 8  # digit width of radix_select: 4 passes over a float32 key
PLACEHOLDER = -1  # rejection_sample's output slots after the last emitted token
ORDERS = ("top_k_first", "joint")
SIGNIFICANCE = 1e-3  # chi-square: a correct sampler fails one fixed-seed test in 1000
LM_PEAKS = 8  # lm_logits: tokens per row that stand well above the bulk


# ---------------------------------------------------------------------------------------------
# Inputs and parameters


def _logits(a, name: str = "logits") -> np.ndarray:
    """A float32 / bfloat16 [B, V] array as float32 with -0.0 read as +0.0; NaN, +inf refused."""
    a = np.asarray(a)
    if a.dtype not in (np.float32, ml_dtypes.bfloat16) or a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(
            f"{name} must be a float32 or bfloat16 [B, V] array, got {a.dtype} {a.shape}"
        )
    x = a.astype(np.float32) + np.float32(0)  # -0 + 0 = +0 under round to nearest
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError(f"{name} holds NaN or +inf")
    return x


def _probs(a, name: str = "probs") -> np.ndarray:
    x = _logits(a, name)
    if (x < 0).any():
        raise ValueError(f"{name} must be non-negative")
    return x


def _per_row(value, b: int, dtype, name: str):
    """None, a scalar or a [B] array -> None or a [B] array of dtype."""
    if value is None:
        return None
    a = np.asarray(value)
    if a.ndim == 0:
        a = np.full(b, a)
    if a.shape != (b,):
        raise ValueError(f"{name} must be a scalar or have B = {b} entries, got {a.shape}")
    if dtype is np.int64:
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be integers, got {a.dtype}")
        return a.astype(np.int64)
    return a.astype(dtype)


def _uniforms(u, shape, name: str = "u", closed: bool = True) -> np.ndarray:
    """float32 uniforms of `shape` in [0, 1] (closed) or [0, 1) (not closed)."""
    a = np.asarray(u, np.float32)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if not np.all((a >= 0) & ((a <= 1) if closed else (a < 1))):
        raise ValueError(f"{name} must lie in [0, 1{']' if closed else ')'}")
    return a


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


# ---------------------------------------------------------------------------------------------
# Temperature and softmax


def apply_temperature(logits, temperature) -> np.ndarray:
    """z = fp32(x / T) per row [B, V] float32; rows with T = 0 (greedy) and T = None stay x.
    A z that overflows to +inf (a tiny T) is refused: the caller must route such rows to greedy."""
    x = _logits(logits)
    t = _per_row(temperature, x.shape[0], np.float32, "temperature")
    if t is None:
        return x
    if not np.all(np.isfinite(t) & (t >= 0)):
        raise ValueError("temperature must be finite and >= 0")
    scaled = t > 0
    with np.errstate(over="ignore"):  # reported below
        z = np.where(scaled[:, None], x / np.where(scaled, t, 1)[:, None], x)  # (B,V) fp32 div
    if np.isposinf(z).any():
        raise ValueError("x / T overflows float32: treat that row as greedy (T = 0)")
    return z.astype(np.float32)


def _mass(z: np.ndarray) -> np.ndarray:
    """exp(z - max z) in float64 [B, V]; z - max z is exact in float64 for float32 z."""
    zmax = z.max(axis=1, keepdims=True)  # (B,1)
    if np.isneginf(zmax).any():
        raise ValueError("a row is -inf everywhere: nothing to sample")
    return np.exp(z.astype(np.float64) - zmax.astype(np.float64))


def softmax(z) -> np.ndarray:
    """softmax of float32 / bfloat16 z [B, V]: float64 throughout, rounded once to float32."""
    m = _mass(_logits(z, "z"))
    return (m / m.sum(axis=1, keepdims=True)).astype(np.float32)


def from_logits(logits, temperature=None) -> tuple[np.ndarray, np.ndarray]:
    """(keys float32, mass float64) [B, V] of the logits path: z and exp(z - max z)."""
    z = apply_temperature(logits, temperature)
    return z, _mass(z)


def from_probs(probs) -> tuple[np.ndarray, np.ndarray]:
    """(keys float32, mass float64) [B, V] of the probs path: the probs and their float64 values."""
    p = _probs(probs)
    if not np.all(p.sum(axis=1) > 0):
        raise ValueError("a row of probs is all zero: nothing to sample")
    return p, p.astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Filters: boolean keep masks [B, V]


def _keys_mass(keys, mass) -> tuple[np.ndarray, np.ndarray]:
    k = _logits(keys, "keys")
    m = np.asarray(mass, np.float64)
    if m.shape != k.shape or not np.all(np.isfinite(m) & (m >= 0)):
        raise ValueError(f"mass must be finite, >= 0 and shaped like keys {k.shape}")
    return k, m


def top_k_keep(keys, top_k) -> np.ndarray:
    """keep i iff fewer than k keys of its row are greater than key_i (all ties at the k-th
    largest key kept). Exact."""
    keys = _logits(keys, "keys")
    b, v = keys.shape
    k = _per_row(top_k, b, np.int64, "top_k")
    if k is None:
        return np.ones(keys.shape, bool)
    on = (k > 0) & (k < v)  # (B,)
    desc = -np.sort(-keys, axis=1)  # (B,V) largest first
    kth = desc[np.arange(b), np.clip(k, 1, v) - 1]  # (B,)
    return ~on[:, None] | (keys >= kth[:, None])


def greater_mass(keys, mass) -> np.ndarray:
    """M_gt [B, V] float64: the mass of the tokens whose key is strictly greater than key_i,
    summed in descending key order (ties share the sum before their group)."""
    keys, mass = _keys_mass(keys, mass)
    b, v = keys.shape
    order = np.argsort(-keys, axis=1, kind="stable")  # (B,V) descending
    sk = np.take_along_axis(keys, order, axis=1)
    sm = np.take_along_axis(mass, order, axis=1)
    before = np.zeros((b, v))  # (B,V) exclusive prefix sums
    before[:, 1:] = np.cumsum(sm, axis=1)[:, :-1]
    starts = np.ones((b, v), bool)
    starts[:, 1:] = sk[:, 1:] != sk[:, :-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(v), 0), axis=1)
    out = np.empty((b, v))
    np.put_along_axis(out, order, np.take_along_axis(before, group_start, axis=1), axis=1)
    return out


def top_p_keep(keys, mass, top_p, within=None, slack: int = 0, greater=None) -> np.ndarray:
    """keep i iff M_gt(i) < p * M(within) (within: the top-k mask for top_k_first, None: the
    whole row). slack +1 / -1 moves p by +-MARGIN (see uncertain_tokens); greater: M_gt when
    already computed (greater_mass sorts the row)."""
    keys, mass = _keys_mass(keys, mass)
    p = _per_row(top_p, keys.shape[0], np.float32, "top_p")
    if p is None:
        return np.ones(keys.shape, bool)
    if not np.all((p > 0) & (p <= 1)):
        raise ValueError("top_p must lie in (0, 1]")
    total = (mass if within is None else np.where(within, mass, 0.0)).sum(axis=1)  # (B,)
    limit = (p.astype(np.float64) + slack * MARGIN) * total  # (B,)
    gt = greater_mass(keys, mass) if greater is None else greater
    keep = gt < limit[:, None]
    return keep | (p >= 1)[:, None]


def min_p_keep(mass, min_p, slack: int = 0) -> np.ndarray:
    """keep i iff mass_i >= min_p * max mass (slack +1 / -1 scales min_p by 1 -+ MARGIN). The
    tokens of the maximum mass are kept at every slack: their mass is exp(0) = 1 exactly in any
    arithmetic and min_p <= 1, so no kernel can drop them (min_p = 1 keeps exactly them)."""
    mass = np.asarray(mass, np.float64)
    mp = _per_row(min_p, mass.shape[0], np.float32, "min_p")
    if mp is None:
        return np.ones(mass.shape, bool)
    if not np.all((mp >= 0) & (mp <= 1)):
        raise ValueError("min_p must lie in [0, 1]")
    top = mass.max(axis=1)  # (B,)
    limit = mp.astype(np.float64) * (1 - slack * MARGIN) * top  # (B,)
    return (mass >= limit[:, None]) | (mass == top[:, None]) | (mp <= 0)[:, None]


def _filter_keeps(keys, mass, top_k, top_p, min_p, order, slacks) -> list[np.ndarray]:
    """filter_keep for each slack in slacks, sorting the rows once."""
    _check_order(order)
    keys, mass = _keys_mass(keys, mass)
    k = top_k_keep(keys, top_k)
    within = k if order == "top_k_first" else None
    gt = None if top_p is None else greater_mass(keys, mass)
    return [
        k & top_p_keep(keys, mass, top_p, within, s, gt) & min_p_keep(mass, min_p, s)
        for s in slacks
    ]


def filter_keep(
    keys, mass, top_k=None, top_p=None, min_p=None, order="top_k_first", slack: int = 0
) -> np.ndarray:
    """keep = K & P & N [B, V] bool, as the module docstring defines them."""
    return _filter_keeps(keys, mass, top_k, top_p, min_p, order, (slack,))[0]


def uncertain_tokens(keys, mass, top_k=None, top_p=None, min_p=None, order="top_k_first"):
    """[B, V] bool: tokens whose keep decision flips when p and min_p move by MARGIN, i.e. lies
    within float32 summation error of its threshold. Top-k alone never makes a token uncertain."""
    wide, narrow = _filter_keeps(keys, mass, top_k, top_p, min_p, order, (+1, -1))
    return wide & ~narrow


def keep_mismatches(got_keep, keys, mass, exact: bool = False, **filters) -> np.ndarray:
    """The chapter's comparison of a kept set: (row, token) pairs int64 [n, 2] where got_keep
    differs from filter_keep on a token that is not uncertain. Empty = the kernel agrees.

    exact: exempt nothing. For inputs whose sums no float32 order can round (dyadic probs such as
    1/2, 1/4, 1/8, ...; counts), where a token sitting exactly on its threshold must be decided
    by the rule itself (M_gt = p * M is dropped)."""
    got = np.asarray(got_keep, bool)
    ref = filter_keep(keys, mass, **filters)
    if got.shape != ref.shape:
        raise ValueError(f"got_keep {got.shape} must be shaped like keys {ref.shape}")
    exempt = False if exact else uncertain_tokens(keys, mass, **filters)
    return np.argwhere((got != ref) & ~exempt)


def renorm(mass, keep) -> np.ndarray:
    """mass * keep / sum(mass * keep) [B, V], float64 rounded once to float32."""
    w = np.where(keep, np.asarray(mass, np.float64), 0.0)  # (B,V)
    total = w.sum(axis=1, keepdims=True)
    if not np.all(total > 0):
        raise ValueError("a row keeps no mass")
    return (w / total).astype(np.float32)


def top_k_mask_logits(logits, top_k) -> np.ndarray:
    """logits [B, V] with every token outside top-k set to -inf (float32, bit-exact)."""
    x = _logits(logits)
    return np.where(top_k_keep(x, top_k), x, np.float32(-np.inf)).astype(np.float32)


def top_k_renorm_probs(probs, top_k) -> np.ndarray:
    """probs [B, V] kept by top-k on the probs themselves, renormalized (float32)."""
    keys, mass = from_probs(probs)
    return renorm(mass, top_k_keep(keys, top_k))


def top_p_renorm_probs(probs, top_p) -> np.ndarray:
    """probs [B, V] kept by top-p, renormalized (float32)."""
    keys, mass = from_probs(probs)
    return renorm(mass, top_p_keep(keys, mass, top_p))


# ---------------------------------------------------------------------------------------------
# Sampling by inverse CDF


def _cdf(mass, keep) -> tuple[np.ndarray, np.ndarray]:
    w = np.where(keep, np.asarray(mass, np.float64), 0.0)  # (B,V)
    c = np.cumsum(w, axis=1)  # (B,V) left to right
    if not np.all(c[:, -1] > 0):
        raise ValueError("a row keeps no mass")
    return w, c


def inverse_cdf(mass, keep, u) -> np.ndarray:
    """int32 [B]: the first i (index order) with C_i > u * C_{V-1}, C the inclusive float64
    prefix sum of mass * keep; when there is none (u = 1), the last kept token of positive mass."""
    w, c = _cdf(mass, keep)
    b, v = w.shape
    t = _uniforms(u, (b,)).astype(np.float64) * c[:, -1]  # (B,)
    hit = c > t[:, None]  # (B,V)
    last = v - 1 - np.argmax((w > 0)[:, ::-1], axis=1)
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1), last).astype(np.int32)


def uncertain_samples(mass, keep, u) -> np.ndarray:
    """[B] bool: rows whose u * total lies within MARGIN * total of a CDF boundary next to the
    chosen token, where a float32 prefix sum may pick the neighbour."""
    w, c = _cdf(mass, keep)
    b = w.shape[0]
    total = c[:, -1]
    t = _uniforms(u, (b,)).astype(np.float64) * total
    tok = inverse_cdf(mass, keep, u)
    upper = c[np.arange(b), tok]
    lower = upper - w[np.arange(b), tok]
    return (t - lower <= MARGIN * total) | (upper - t <= MARGIN * total)


def sample_mismatches(
    tokens, keys, mass, u, top_k=None, top_p=None, min_p=None, order="top_k_first"
) -> np.ndarray:
    """The chapter's comparison of sampled tokens: rows int64 [n] where a kernel's token is not
    admissible. A token must be kept (by the widest reading of the filters, slack +1) and of
    positive mass; in a row with no uncertain token it must also have its CDF interval
    [C_{i-1}, C_i] within MARGIN * total of t = u * total (the reference's own token always
    has). Greedy rows are the caller's to compare exactly. Empty = the kernel agrees."""
    keys, mass = _keys_mass(keys, mass)
    b = keys.shape[0]
    tok = np.asarray(tokens, np.int64)
    if tok.shape != (b,) or np.any((tok < 0) | (tok >= keys.shape[1])):
        raise ValueError(f"tokens must be [B = {b}] ids in 0..V-1")
    rows = np.arange(b)
    wide, keep, narrow = _filter_keeps(keys, mass, top_k, top_p, min_p, order, (+1, 0, -1))
    ok = wide[rows, tok] & (mass[rows, tok] > 0)
    w, c = _cdf(mass, keep)
    total = c[:, -1]
    t = _uniforms(u, (b,)).astype(np.float64) * total
    upper = c[rows, tok]
    lower = upper - w[rows, tok]
    near = (lower <= t + MARGIN * total) & (upper >= t - MARGIN * total) & keep[rows, tok]
    settled = ~(wide & ~narrow).any(axis=1)
    return np.flatnonzero(~ok | (settled & ~near))


def _sample(keys, mass, u, top_k, top_p, min_p, order, with_uncertain):
    wide, keep, narrow = _filter_keeps(keys, mass, top_k, top_p, min_p, order, (+1, 0, -1))
    tokens = inverse_cdf(mass, keep, u)
    if not with_uncertain:
        return tokens
    return tokens, (wide & ~narrow).any(axis=1) | uncertain_samples(mass, keep, u)


def sample(
    logits,
    u,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    order="top_k_first",
    with_uncertain=False,
):
    """Token ids int32 [B] from logits [B, V] and uniforms u [B] (module docstring's pipeline).
    Greedy rows (T = 0) take the lowest index of max x. With `with_uncertain` also returns a [B]
    bool: rows where a kernel's float32 sums may legitimately choose differently (never greedy)."""
    x = _logits(logits)
    t = _per_row(temperature, x.shape[0], np.float32, "temperature")
    keys, mass = from_logits(x, t)
    out = _sample(keys, mass, u, top_k, top_p, min_p, order, with_uncertain)
    if t is None:
        return out
    greedy = t == 0
    tokens, unsure = out if with_uncertain else (out, None)
    tokens = np.where(greedy, np.argmax(x, axis=1), tokens).astype(np.int32)
    return (tokens, unsure & ~greedy) if with_uncertain else tokens


def sample_from_probs(
    probs, u, top_k=None, top_p=None, min_p=None, order="top_k_first", with_uncertain=False
):
    """Token ids int32 [B] from probs [B, V] (keys and mass = the probs), as `sample`."""
    keys, mass = from_probs(probs)
    return _sample(keys, mass, u, top_k, top_p, min_p, order, with_uncertain)


# ---------------------------------------------------------------------------------------------
# Threshold search without sorting: radix select over order-preserving keys


def order_key(values) -> np.ndarray:
    """float32 -> uint32 with the same order (a < b iff key(a) < key(b)); -0.0 maps as +0.0.
    Non-negative floats get the sign bit set, negative ones are inverted (vLLM's ToOrdered)."""
    bits = (np.asarray(values, np.float32) + np.float32(0)).view(np.uint32)
    return np.where(bits >> 31, ~bits, bits | np.uint32(0x80000000)).astype(np.uint32)


def key_value(keys) -> np.ndarray:
    """The inverse of order_key: uint32 -> float32."""
    k = np.asarray(keys, np.uint32)
    bits = np.where(k >> 31, k & np.uint32(0x7FFFFFFF), ~k).astype(np.uint32)
    return bits.view(np.float32)


class RadixPass(NamedTuple):
    """One pass of radix_select, what a kernel's pass can be checked against."""

    shift: int  # the digit is bits shift .. shift + radix_bits - 1 of the key
    prefix: int  # the key bits above the digit chosen so far (candidates have exactly these)
    above: float  # weight of the tokens whose key is above every candidate
    hist: np.ndarray  # weight of the candidates per digit value [2^radix_bits]
    digit: int  # the chosen digit: the largest d with above + sum(hist[d:]) >= target


def radix_select(values, target, weights=None, radix_bits: int = RADIX_BITS):
    """The largest key v of a row with W(key >= v) >= target, without sorting.

    values: one row [V] float32; weights: None (each token weighs 1: v = the target-th largest
    value) or float64 [V] >= 0 (mass: with target = p * M the top-p threshold). Each pass
    histograms the digit of the candidates (tokens whose higher bits equal the prefix), scans the
    buckets from the top, keeps the bucket where the running weight reaches the target and adds
    the weight of the buckets above it to `above`. After 32 / radix_bits passes the prefix is
    the key of the threshold. Weights are summed per bucket in index order and the tail from the
    top bucket down, in float64 (int64 for counts).

    Returns (threshold float32, [RadixPass]); keep = values >= threshold.
    """
    if radix_bits < 1 or 32 % radix_bits:
        raise ValueError(f"radix_bits must divide 32, got {radix_bits}")
    keys = order_key(values)
    if keys.ndim != 1:
        raise ValueError(f"values must be one row [V], got {keys.shape}")
    w = np.ones(keys.size, np.int64) if weights is None else np.asarray(weights, np.float64)
    if w.shape != keys.shape or (w < 0).any():
        raise ValueError("weights must be >= 0 and shaped like values")
    if not 0 < target <= w.sum():
        raise ValueError(f"target must lie in (0, {w.sum()}], got {target}")
    buckets = 1 << radix_bits
    candidates = np.ones(keys.size, bool)
    prefix, above, passes = 0, w.dtype.type(0), []
    for shift in range(32 - radix_bits, -1, -radix_bits):
        digits = ((keys >> np.uint32(shift)) & np.uint32(buckets - 1)).astype(np.int64)
        hist = np.zeros(buckets, w.dtype)
        np.add.at(hist, digits[candidates], w[candidates])
        tail = np.cumsum(hist[::-1])[::-1]  # tail[d] = weight of the candidates with digit >= d
        digit = int(np.flatnonzero(above + tail >= target).max())
        passes.append(RadixPass(shift, prefix, above, hist, digit))
        above = above + (tail[digit] - hist[digit])
        prefix |= digit << shift
        candidates &= digits == digit
    return key_value(np.uint32(prefix))[()], passes


def kth_largest(values, top_k) -> np.ndarray:
    """float32 [B]: the k-th largest value of each row by radix_select (k in 1..V per row)."""
    x = _logits(values, "values")
    k = _per_row(top_k, x.shape[0], np.int64, "top_k")
    if k is None or np.any((k < 1) | (k > x.shape[1])):
        raise ValueError(f"top_k must lie in 1..V = {x.shape[1]} for every row")
    return np.array([radix_select(row, int(kk))[0] for row, kk in zip(x, k)], np.float32)


def top_p_threshold(keys, mass, top_p, within=None) -> np.ndarray:
    """float32 [B]: the top-p threshold of each row by radix_select over the mass (within: the
    top-k mask of top_k_first, whose mass is the total); top_p_keep = keys >= threshold."""
    keys, mass = _keys_mass(keys, mass)
    p = _per_row(top_p, keys.shape[0], np.float32, "top_p")
    if p is None or not np.all((p > 0) & (p <= 1)):
        raise ValueError("top_p must lie in (0, 1] for every row")
    p = p.astype(np.float64)
    w = mass if within is None else np.where(within, mass, 0.0)
    return np.array(
        [radix_select(k, pp * ww.sum(), ww)[0] for k, ww, pp in zip(keys, w, p)], np.float32
    )


# ---------------------------------------------------------------------------------------------
# Sorting-free rejection sampling with pivots (FlashInfer's approach)


def pivot_midpoint(a, b) -> np.ndarray:
    """fp32(fp32(a + b) * 0.5): the kernels' float32 midpoint of two finite keys."""
    return ((np.float32(a) + np.float32(b)) * np.float32(0.5)).astype(np.float32)


def pivot_rejection_sample(keys, mass, keep, uniforms):
    """Sample from mass * keep without building keep, one uniform per round.

    keep must be an upper set of the keys (every filter_keep is); tau = its smallest key. Per row,
    low = -inf, high = max key; round r:
        j      = inverse_cdf over the tokens with key > low, u = uniforms[:, r]
        accept j if key_j >= tau (a kernel tests count(> key_j) < k, M(> key_j) < p M, ...)
        else   m = pivot_midpoint(key_j, high); if m >= tau: low, high = key_j, m
                                                 else:        low = m
    tau stays in (low, high] and low grows every round, so the loop ends; the accepted token is
    distributed as mass * keep (a sample from a superset, conditioned on landing in the set).

    uniforms [B, R] float32 in [0, 1). Returns (tokens int32 [B], rounds int32 [B], trace) with
    trace = {"candidate": int32 [B, R] (-1 after the last round), "low", "high": float32 [B, R]
    at the start of each round (NaN after)}. A row still rejecting after R rounds raises.
    """
    keys, mass = _keys_mass(keys, mass)
    keep = np.asarray(keep, bool)
    b, _v = keys.shape
    u = _uniforms(uniforms, (b, np.asarray(uniforms).shape[-1]), "uniforms", closed=False)
    if keep.shape != keys.shape or not keep.any(axis=1).all():
        raise ValueError("keep must be shaped like keys and keep a token in every row")
    tau = np.where(keep, keys, np.float32(np.inf)).min(axis=1)  # (B,)
    if np.any(keep != (keys >= tau[:, None])):
        raise ValueError("keep is not an upper set of the keys")
    if not np.all(np.isfinite(keys[mass > 0])):
        raise ValueError("keys of tokens with mass must be finite")
    low = np.full(b, -np.inf, np.float32)
    high = np.where(mass > 0, keys, -np.inf).max(axis=1).astype(np.float32)
    tokens = np.full(b, -1, np.int32)
    rounds = np.zeros(b, np.int32)
    trace = {
        "candidate": np.full(u.shape, -1, np.int32),
        "low": np.full(u.shape, np.nan, np.float32),
        "high": np.full(u.shape, np.nan, np.float32),
    }
    active = np.arange(b)
    for r in range(u.shape[1]):
        if active.size == 0:
            break
        allowed = keys[active] > low[active, None]  # (A,V)
        j = inverse_cdf(mass[active], allowed, u[active, r])  # (A,)
        trace["candidate"][active, r] = j
        trace["low"][active, r] = low[active]
        trace["high"][active, r] = high[active]
        rounds[active] += 1
        kj = keys[active, j]
        accepted = kj >= tau[active]
        tokens[active[accepted]] = j[accepted]
        mid = pivot_midpoint(kj, high[active])
        left = mid >= tau[active]
        low[active] = np.where(accepted, low[active], np.where(left, kj, mid))
        high[active] = np.where(accepted | ~left, high[active], mid)
        active = active[~accepted]
    if active.size:
        raise ValueError(f"{active.size} rows need more than {u.shape[1]} rounds of uniforms")
    return tokens, rounds, trace


# ---------------------------------------------------------------------------------------------
# Speculative decoding: rejection sampling of a chain of draft tokens


def rejection_sample(
    draft_probs, draft_tokens, target_probs, accept_u, sample_u, with_uncertain=False
):
    """Verify S draft tokens per request against the target model, in one pass.

    draft_probs q [B, S, V] and target_probs p [B, S + 1, V] float32 (rows need not sum to 1
    exactly), draft_tokens [B, S] integers in 0..V-1, accept_u [B, S] float32 in [0, 1),
    sample_u [B] float32 in [0, 1]. For s = 0, 1, ...: draft token x = draft_tokens[b, s] is
    accepted iff fp32(accept_u[b, s] * q[b, s, x]) < p[b, s, x] -- u < p/q without a division,
    so with probability min(1, p/q); the chain stops at the first rejection. Then one token:
        rejected at s:   inverse_cdf of r = max(0, fp32(p[b, s] - q[b, s])) with sample_u[b]
                         (float32 residual, float64 sums); r summing to 0 (no p > q anywhere)
                         falls back to p[b, s]
        all S accepted:  the bonus token, inverse_cdf of p[b, S] with sample_u[b].
    Returns (tokens int32 [B, S + 1]: the accepted drafts, the resampled or bonus token, then
    PLACEHOLDER; num_accepted int32 [B] in 0..S; the row emits num_accepted + 1 tokens). With
    `with_uncertain` also a [B] bool of rows whose last token lies within MARGIN of a CDF
    boundary (the acceptances themselves are bit-exact).
    """
    q = np.asarray(draft_probs)
    p = np.asarray(target_probs)
    x = np.asarray(draft_tokens)
    if q.dtype != np.float32 or p.dtype != np.float32 or q.ndim != 3 or p.ndim != 3:
        raise ValueError(f"probs must be float32 [B, S, V] / [B, S+1, V]: {q.dtype} {p.dtype}")
    b, s, v = q.shape
    if p.shape != (b, s + 1, v) or x.shape != (b, s) or v == 0:
        raise ValueError(f"shapes disagree: q {q.shape}, p {p.shape}, draft_tokens {x.shape}")
    if not (np.all(np.isfinite(q) & (q >= 0)) and np.all(np.isfinite(p) & (p >= 0))):
        raise ValueError("probs must be finite and >= 0")
    if not np.issubdtype(x.dtype, np.integer) or np.any((x < 0) | (x >= v)):
        raise ValueError(f"draft_tokens must be integers in 0..{v - 1}")
    ua = _uniforms(accept_u, (b, s), "accept_u", closed=False)
    us = _uniforms(sample_u, (b,), "sample_u")
    x = x.astype(np.int64)
    q_x = np.take_along_axis(q, x[..., None], axis=2)[..., 0]  # (B,S)
    p_x = np.take_along_axis(p[:, :s], x[..., None], axis=2)[..., 0]  # (B,S)
    accepted = (ua * q_x).astype(np.float32) < p_x  # (B,S) float32 product, then compare
    n = np.cumprod(accepted, axis=1).sum(axis=1).astype(np.int64)  # (B,) drafts accepted
    rows = np.arange(b)
    p_n = p[rows, n]  # (B,V) target row at the stop
    if s:
        residual = np.maximum(p_n - q[rows, np.minimum(n, s - 1)], np.float32(0))  # (B,V) fp32
    else:
        residual = p_n
    dist = np.where((n == s)[:, None], p_n, residual)
    empty = dist.sum(axis=1) == 0
    dist = np.where(empty[:, None], p_n, dist).astype(np.float64)
    ones = np.ones(dist.shape, bool)
    last = inverse_cdf(dist, ones, us)
    tokens = np.full((b, s + 1), PLACEHOLDER, np.int64)
    tokens[:, :s] = np.where(np.arange(s) < n[:, None], x, PLACEHOLDER)
    tokens[rows, n] = last
    out = tokens.astype(np.int32), n.astype(np.int32)
    return (*out, uncertain_samples(dist, ones, us)) if with_uncertain else out


# ---------------------------------------------------------------------------------------------
# The kernels' random numbers: curand's Philox4_32_10, so a test knows every uniform drawn

PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers: M0 on counter word x, M1 on word z
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # Weyl constants added to the key words between rounds
PHILOX_ROUNDS = 10
UNIFORM_BITS = 24  # u = (x >> 8) * 2^-24: a float32 holds 24 bits exactly, so u is never 1


def _words(a, n: int, name: str) -> np.ndarray:
    """Integers [..., n] in 0..2^32 - 1 as uint64 (room for the 32 x 32-bit products)."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer) or a.ndim == 0 or a.shape[-1] != n:
        raise ValueError(f"{name} must be integers [..., {n}], got {a.dtype} {a.shape}")
    if np.any((a < 0) | (a > 0xFFFFFFFF)):
        raise ValueError(f"{name} words must lie in 0..2^32 - 1")
    return a.astype(np.uint64)


def philox4x32_10(counter, key) -> np.ndarray:
    """curand_Philox4x32_10 (curand_philox4x32_x.h; Random123's philox4x32 with 10 rounds):
    counter [..., 4] words (x, y, z, w), key [..., 2] (leading shapes broadcast) -> uint32
    [..., 4]. Each round multiplies x by M0 and z by M1 into 64-bit products (hi, lo) and returns
    (hi1 ^ y ^ key.x, lo1, hi0 ^ w ^ key.y, lo0); the key advances by PHILOX_W between rounds."""
    c = _words(counter, 4, "counter")
    k = _words(key, 2, "key")
    lead = np.broadcast_shapes(c.shape[:-1], k.shape[:-1])
    x, y, z, w = (np.broadcast_to(c[..., i], lead) for i in range(4))
    kx, ky = (np.broadcast_to(k[..., i], lead) for i in range(2))
    low, shift = np.uint64(0xFFFFFFFF), np.uint64(32)
    m0, m1 = (np.uint64(m) for m in PHILOX_M)
    w0, w1 = (np.uint64(m) for m in PHILOX_W)
    for r in range(PHILOX_ROUNDS):
        if r:
            kx, ky = (kx + w0) & low, (ky + w1) & low  # uint32 wrap-around
        p0, p1 = m0 * x, m1 * z  # exact in uint64: both factors < 2^32
        hi0, lo0, hi1, lo1 = p0 >> shift, p0 & low, p1 >> shift, p1 & low
        x, y, z, w = hi1 ^ y ^ kx, lo1, hi0 ^ w ^ ky, lo0
    return np.stack([x, y, z, w], axis=-1).astype(np.uint32)


def philox_draws(seed: int, offset: int, b: int, draws: int) -> np.ndarray:
    """uint32 [B, draws]: what row b = 0..B-1 of a kernel gets from curand_init(seed,
    subsequence = b, offset, &state) and `draws` calls of curand(&state).

    curand_init sets counter = (0, 0, b lo, b hi) (skipahead_sequence adds the subsequence to the
    upper 64 bits) and key = (seed lo, seed hi), then skipahead(offset) adds offset >> 2 to the
    lower 64 bits and starts inside that block at word offset & 3; curand returns the block's
    words in order and moves to the next counter after the fourth. So draw n of row b is
        philox4x32_10(((offset + n) >> 2 lo, hi, b lo, b hi), (seed lo, seed hi))[(offset + n) & 3].
    seed: 0..2^64 - 1, or a negative int64 (the cast to unsigned long long keeps its bits);
    offset: 0..2^63 - 1, the int64 of seed_offset (its block index never carries into the
    subsequence words)."""
    seed, offset, b, draws = int(seed), int(offset), int(b), int(draws)
    if not -(2**63) <= seed < 2**64 or not 0 <= offset < 2**63 or b < 0 or draws < 0:
        raise ValueError(f"seed {seed}, offset {offset}, B {b} or draws {draws} out of range")
    seed %= 2**64
    first = offset >> 2
    blocks = 0 if draws == 0 else ((offset + draws - 1) >> 2) - first + 1
    block = np.arange(blocks, dtype=np.uint64) + np.uint64(first)  # (N,) lower 64 counter bits
    row = np.arange(b, dtype=np.uint64)  # (B,) the subsequence
    counter = np.empty((b, blocks, 4), np.uint64)  # (B,N,4)
    counter[..., 0], counter[..., 1] = block & np.uint64(0xFFFFFFFF), block >> np.uint64(32)
    counter[..., 2] = (row & np.uint64(0xFFFFFFFF))[:, None]
    counter[..., 3] = (row >> np.uint64(32))[:, None]
    words = philox4x32_10(counter, [seed & 0xFFFFFFFF, seed >> 32]).reshape(b, 4 * blocks)
    start = offset & 3  # the stream of block `first` begins `start` words early
    return words[:, start : start + draws]


def philox_uniforms(seed: int, offset: int, b: int, draws: int) -> np.ndarray:
    """float32 [B, draws] in [0, 1): u_r = (x_r >> 8) * 2^-24 of philox_draws, exact."""
    x = philox_draws(seed, offset, b, draws)
    return (x >> np.uint32(32 - UNIFORM_BITS)).astype(np.float32) * np.float32(2.0**-UNIFORM_BITS)


# ---------------------------------------------------------------------------------------------
# Byte models (the roofline minimum: each input read once, each output written once)

ROW_PARAM_BYTES = 16  # temperature, top_k, top_p, min_p: 4 bytes each per row


def sample_bytes(b: int, v: int, logit_bytes: int = 4) -> int:
    """`sample` from logits: the row read once (V * logit_bytes: 513,024 B for V = 128256 in
    float32), the per-row parameters, one int32 token written. Philox draws in registers."""
    return b * (v * logit_bytes + ROW_PARAM_BYTES + 4)


def renorm_bytes(b: int, v: int, prob_bytes: int = 4) -> int:
    """top_k_mask_logits / top_k_renorm_probs / top_p_renorm_probs: the row read once and
    written once, plus the per-row parameters."""
    return b * (2 * v * prob_bytes + ROW_PARAM_BYTES)


def rejection_bytes(b: int, s: int, v: int, num_accepted=None) -> int:
    """rejection_sample: the draft tokens, q and p at each draft token tested (4 B each; DRAM
    moves them as 32 B sectors, so the measured bytes of this gather exceed the model), the rows
    the last token reads (p and q at a rejection: 2 V floats; p[S] for the bonus: V floats),
    the tokens and counts written. num_accepted: int [B] of the actual outcome; None = the
    worst case (every row tests all S drafts and rejects the last)."""
    if num_accepted is None:
        tested, rows = b * s, 2 * b * v
    else:
        n = np.asarray(num_accepted, np.int64)
        tested = int(np.minimum(n + 1, s).sum())
        rows = int(np.where(n < s, 2 * v, v).sum())
    return b * s * 4 + tested * 2 * 4 + rows * 4 + b * (s + 1) * 4 + b * 4


# ---------------------------------------------------------------------------------------------
# Inputs shaped like a language model's


def lm_logits(rng: np.random.Generator, b: int, v: int, ties: bool = False, dtype=np.float32):
    """[B, V] logits like an LM head's: a bulk N(0, 2) over the vocabulary and LM_PEAKS tokens
    per row 0..8 above the bulk's maximum, so a few tokens carry much of the mass and a long tail
    the rest; how much varies by row (at V = 128256, top-p 0.9 keeps a handful of tokens in some
    rows and thousands in others).

    ties: every value rounded to a multiple of 1/4 (exact in float32 and bfloat16, so the bulk is
    full of ties) and the row's maximum copied to one more position, so thresholds fall on tie
    groups. dtype float32 or ml_dtypes.bfloat16 (rounded to nearest even).
    """
    x = rng.normal(0.0, 2.0, (b, v))
    n = min(LM_PEAKS, v)
    for row in x:
        peaks = rng.choice(v, n, replace=False)
        row[peaks] = row.max() + rng.uniform(0.0, 8.0, n)
    if ties:
        x = np.round(x * 4) / 4
        if v > 1:
            for row in x:
                others = np.flatnonzero(row != row.max())
                if others.size:
                    row[rng.choice(others)] = row.max()
    return x.astype(dtype)


def speculative_inputs(rng: np.random.Generator, b: int, s: int, v: int, noise: float = 1.0):
    """(draft_probs q [B, S, V], draft_tokens [B, S] int32, target_probs p [B, S+1, V]): p the
    softmax of lm_logits, q the softmax of the same logits plus N(0, noise) (a draft model that
    mostly agrees), and each draft token drawn from its q row by inverse_cdf."""
    logits = lm_logits(rng, b * (s + 1), v).astype(np.float64)
    p = softmax(logits.astype(np.float32)).reshape(b, s + 1, v)
    drafted = logits.reshape(b, s + 1, v)[:, :s] + rng.normal(0, noise, (b, s, v))
    q = softmax(drafted.reshape(b * s, v).astype(np.float32)).reshape(b, s, v)
    flat = q.reshape(b * s, v)
    u = rng.random(b * s).astype(np.float32)
    tokens = inverse_cdf(flat, np.ones(flat.shape, bool), u).reshape(b, s)
    return q, tokens, p


# ---------------------------------------------------------------------------------------------
# Statistics for the sampling checks


def _chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with integer df (closed form: Poisson / erfc sums)."""
    if x <= 0:
        return 1.0
    h = x / 2
    if df % 2:  # Q(x; 1) = erfc(sqrt(x / 2)), then terms h^(i + 1/2) e^-h / Gamma(i + 3/2)
        total, offset, terms = math.erfc(math.sqrt(h)), 0.5, (df - 1) // 2
    else:  # the Poisson tail: sum of h^i e^-h / i! for i < df / 2
        total, offset, terms = 0.0, 0.0, df // 2
    for i in range(terms):
        a = i + offset
        total += math.exp(a * math.log(h) - h - math.lgamma(a + 1))
    return min(1.0, total)


def chi_square(counts, probs, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's test of observed counts [V] against probs [V] (normalized here).

    Cells expecting fewer than min_expected draws are pooled into one; a count in a cell of
    probability 0 (outside the support) gives (inf, df, 0.0). Returns (statistic, degrees of
    freedom, p-value); a sampler passes at SIGNIFICANCE when the p-value is above it.
    """
    c = np.asarray(counts, np.float64)
    pr = np.asarray(probs, np.float64)
    if c.shape != pr.shape or c.ndim != 1 or (pr < 0).any() or pr.sum() <= 0:
        raise ValueError("counts and probs must be matching [V] arrays, probs >= 0")
    e = c.sum() * pr / pr.sum()
    if np.any(c[e == 0] > 0):
        return math.inf, max(int((e > 0).sum()) - 1, 1), 0.0
    small = (e < min_expected) & (e > 0)
    obs = np.append(c[e >= min_expected], c[small].sum())
    exp = np.append(e[e >= min_expected], e[small].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    df = obs.size - 1
    if df < 1:
        return 0.0, 1, 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, df, _chi2_sf(stat, df)
