"""lkw.golden's chapter 05 cases: every op with the signature the C++ registry declares, the edges
the chapter promises (odd and tail sizes, both halves first, the clamp, partial and inverse
rotations, heads that are no whole 16-byte vector, positions near 8192, every cache layout with
padding slots and poisoned initial caches), the tolerances lkw.elementwise sets, and a chapter that
stays small on disk."""

import re

import numpy as np
import pytest
from lkw import elementwise as ew
from lkw import formats, golden

# The contract with the C++ side (.scratch/ch05_spec.md): each op's input, init and output dtypes.
BF16, FP8, F32, I64 = "bfloat16", "float8_e4m3fn", "float32", "int64"
SIGNATURES = {
    "silu_and_mul": ([BF16], [], [BF16]),
    "gelu_and_mul": ([BF16], [], [BF16]),
    "gelu_tanh_and_mul": ([BF16], [], [BF16]),
    "silu_and_mul_fp8_per_token": ([BF16], [], [FP8, F32]),
    "silu_and_mul_fp8_per_group": ([BF16], [], [FP8, F32]),
    "silu_and_mul_fp8_per_tensor": ([BF16, F32], [], [FP8]),
    "rope": ([I64, BF16, BF16, F32], [], [BF16, BF16]),
    "qk_norm_rope": ([I64, BF16, BF16, BF16, BF16, F32], [], [BF16, BF16]),
    "reshape_and_cache": ([BF16, BF16, I64], [BF16, BF16], [BF16, BF16]),
    "reshape_and_cache_fp8": ([BF16, BF16, I64, F32, F32], [FP8, FP8], [FP8, FP8]),
    "qkv_rope_cache": ([I64, BF16, F32, I64], [BF16, BF16], [BF16, BF16, BF16]),
}


@pytest.fixture(scope="module")
def cases():
    return golden.elementwise_cases(np.random.default_rng(2025))


@pytest.fixture(scope="module")
def outputs(cases):
    return {c.id: golden.expected_outputs(c) for c in cases}


def by_op(cases, *ops):
    return [c for c in cases if c.op in ops]


def f32(bits):
    return formats.bf16_to_f32(np.asarray(bits))


def test_every_op_has_cases_and_the_contracted_signature(cases, outputs):
    assert {c.op for c in cases} == set(SIGNATURES)
    assert golden.CHAPTERS["05_elementwise"] is golden.elementwise_cases
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-z0-9_]+", i) for i in ids)
    for op, (ins, init, outs) in SIGNATURES.items():
        spec = golden.OPS[op]
        assert list(spec.inputs) == ins and list(spec.outputs) == outs, op
        assert list(spec.outputs[: spec.init]) == init, op
    for c in cases:
        golden.check_case(c, outputs[c.id])  # stored dtypes, init shapes, no all-zero input


def test_act_cases_cover_odd_tail_and_wide_rows_both_halves_and_the_clamp(cases, outputs):
    for op, act in golden.ACT_OPS.items():
        mine = by_op(cases, op)
        shapes = {(c.inputs[0].shape[0], c.inputs[0].shape[1] // 2) for c in mine}
        ds = {d for _, d in shapes}
        assert {1, 7, 203} <= ds and {128, 4096, 14336} <= ds, "odd d and multiples of 8"
        assert {1, 5, 64} <= {t for t, _ in shapes}
        assert any(c.params.get("act_first") == 0 for c in mine), "up first"
        (clamp,) = [c for c in mine if "limit" in c.params]
        clamped = np.abs(f32(clamp.inputs[0])) > clamp.params["limit"]
        assert np.mean(clamped) > 0.02, "nothing clamped"
        for c in mine:
            t, two_d = c.inputs[0].shape
            assert outputs[c.id][0].shape == (t, two_d // 2)
            assert c.id.endswith(f"_t{t}_d{two_d // 2}")
            want = ew.act_tolerance(
                c.inputs[0], act, bool(c.params.get("act_first", 1)), c.params.get("limit")
            )
            assert c.tolerance == want


def test_fp8_cases_cover_the_bound_a_zero_row_both_scale_layouts_and_saturation(cases, outputs):
    fp8 = by_op(cases, *golden.FP8_ACT_OPS)
    for c in fp8:
        assert c.tolerance == ew.TOLERANCE_FP8[golden.FP8_ACT_OPS[c.op]]
    for c in by_op(cases, "silu_and_mul_fp8_per_group"):
        t, d = c.inputs[0].shape[0], c.inputs[0].shape[1] // 2
        assert d % 128 == 0
        want = (t, d // 128) if c.params.get("scales_row_major") else (d // 128, t)
        assert outputs[c.id][1].shape == want
    (row_major,) = [c for c in fp8 if c.params.get("scales_row_major")]
    t, d = row_major.inputs[0].shape[0], row_major.inputs[0].shape[1] // 2
    assert t == d // 128, "both layouts one shape: only the param tells them apart"
    (ub,) = [c for c in fp8 if "scale_ub" in c.params]
    y = f32(ew.silu_and_mul(ub.inputs[0]))
    assert np.sum(np.max(np.abs(y), axis=1) > ub.params["scale_ub"]) >= 1, "no row clamped"
    (zero,) = [c for c in fp8 if "zero_row" in c.id]
    q, scales = outputs[zero.id]
    assert not np.any(q[2]) and scales[2, 0] == np.float32(1 / (448 * 512))
    for c in by_op(cases, "silu_and_mul_fp8_per_tensor"):
        scale = c.inputs[1]
        assert scale.dtype == np.float32 and scale.shape == (1,) and scale[0] > 0
    saturated = [c for c in fp8 if "saturate" in c.id]
    assert saturated and all(np.any((outputs[c.id][0] & 0x7F) == 0x7E) for c in saturated)  # +-448


def test_rope_cases_cover_pairings_partial_inverse_gqa_tails_and_long_positions(cases):
    rope = by_op(cases, "rope")
    shapes = []
    for c in rope:
        pos, q, k, cache = c.inputs
        t, hq, d = q.shape
        rot = cache.shape[1]
        assert pos.shape == (t,) and k.shape[::2] == (t, d) and rot % 2 == 0 and rot <= d
        assert c.tolerance == ew.rope_tolerance(q, k)
        assert np.all(pos < cache.shape[0])
        if t >= 2:
            assert pos[0] == cache.shape[0] - 1 and pos[1] == 0
        # The cache is lkw.elementwise's, for the base named in ROPE_CASES.
        tag = c.id.split("_t")[0].removeprefix("rope_")
        base = next(row[9] for row in golden.ROPE_CASES if row[0] == tag)
        assert np.array_equal(cache, ew.cos_sin_cache(cache.shape[0], rot, base))
        shapes.append((t, hq, k.shape[1], d, rot, c.params["is_neox"], c.params.get("inverse", 0)))
    assert {s[5] for s in shapes} == {0, 1}, "NEOX and GPT-J"
    assert {s[5] for s in shapes if s[4] < s[3]} == {0, 1}, "partial rotations of both pairings"
    assert any(s[6] for s in shapes), "inverse"
    assert any(s[1] != s[2] for s in shapes), "Hq != Hk"
    assert any(s[0] % 2 for s in shapes) and 1 in {s[0] for s in shapes}, "odd T, decode"
    tails = [s for s in shapes if s[3] % 8]
    assert any(s[4] == s[3] for s in tails) and any(s[4] < s[3] for s in tails), "D % 8 != 0"
    assert max(c.inputs[0].max() for c in rope) >= 8000, "positions near 8192"


def test_qk_norm_rope_cases_are_qwen3_like_in_both_pairings_and_an_odd_size(cases, outputs):
    mine = by_op(cases, "qk_norm_rope")
    assert all(c.params["eps"] == 1e-6 for c in mine)
    assert {c.params["is_neox"] for c in mine} == {0, 1}
    assert any(c.inputs[1].shape[1:] == (4, 128) and c.inputs[2].shape[1] == 2 for c in mine)
    assert any(c.inputs[1].shape[2] % 8 for c in mine)
    for c in mine:
        d = c.inputs[1].shape[2]
        assert c.inputs[3].shape == c.inputs[4].shape == (d,)
        assert c.tolerance == ew.qk_norm_rope_tolerance(*outputs[c.id])


def test_cache_cases_cover_every_layout_block_size_and_head_size_with_padding(cases, outputs):
    mine = by_op(cases, *golden.CACHE_OPS)
    seen = set()
    for c in mine:
        kv_dtype = golden.CACHE_OPS[c.op]
        layout = ew.LAYOUTS[c.params["layout"]]
        key, slots = c.inputs[0], c.inputs[2]
        t, hk, d = key.shape
        block_size = c.init[0].shape[ew.BLOCK_AXIS[layout]]
        num_blocks = c.init[0].shape[0]
        assert 2 <= hk <= 8 and c.tolerance == "exact"
        assert (c.init[0].shape, c.init[1].shape) == ew.cache_shapes(
            layout, num_blocks, block_size, hk, d, kv_dtype
        )
        stored = np.dtype(ew.KV_DTYPES[kv_dtype])
        assert all(np.all(a == ew.POISON[stored]) for a in c.init), "the initial caches are poison"
        valid = slots[slots >= 0]
        assert valid.size >= 1 and np.unique(valid).size == valid.size
        # Exactly the valid tokens' elements changed; the rest keeps the poison.
        for before, after in zip(c.init, outputs[c.id], strict=True):
            assert np.sum(before != after) <= valid.size * hk * d
            assert np.sum(after != ew.POISON[stored]) >= 0.9 * valid.size * hk * d
        seen.add((c.op, layout, block_size, d))
        if t > 1:
            assert np.any(slots == -1), "padding"
        if kv_dtype == "float8_e4m3fn":
            k_bits = outputs[c.id][0][outputs[c.id][0] != 0x7F]
            if key.size >= 1000:
                assert np.any((k_bits & 0x7F) == 0x7E), "no key saturated"
    for op, kv_dtype in golden.CACHE_OPS.items():
        for layout in ew.LAYOUTS:
            mine_here = {(b, d) for o, lay, b, d in seen if o == op and lay == layout}
            assert {16, 5, 32} <= {b for b, _ in mine_here}
            assert 128 in {d for _, d in mine_here}
            small = min(d for _, d in mine_here)
            assert small == (ew.cache_x(kv_dtype) if layout == "paged" else 6)


def test_the_chapter_is_a_few_megabytes_on_disk(tmp_path):
    golden.write_chapter(tmp_path, "05_elementwise", 7)
    files = list((tmp_path / "05_elementwise").iterdir())
    total = sum(f.stat().st_size for f in files)
    assert total < 8_000_000, f"{total / 1e6:.1f} MB"
    assert sum(f.name.endswith(".npy") and ".init" in f.name for f in files) == 2 * 3 * (
        2 * len(golden.CACHE_CASES) + len(golden.QKV_ROPE_CACHE_CASES)
    )


def test_qkv_cases_are_the_chain_of_rope_and_cache_in_every_layout(cases, outputs):
    """Each case's outputs are rope's then reshape_and_cache's of the same heads; every layout,
    both pairings, a partial rotation, Hq not a multiple of Hk, decode, padding slots."""
    mine = by_op(cases, "qkv_rope_cache")
    seen = set()
    for c in mine:
        pos, qkv, cache, slots = c.inputs
        layout = ew.LAYOUTS[c.params["layout"]]
        hk = ew.cache_kv_heads(layout, c.init[0])
        q, k, v = ew.split_qkv(qkv, hk)
        q_rot, k_rot = ew.rope(pos, q, k, cache, bool(c.params["is_neox"]))
        kc, vc = ew.reshape_and_cache(k_rot, v, *c.init, slots, layout)
        got = outputs[c.id]
        assert np.array_equal(got[0], kc) and np.array_equal(got[1], vc)
        assert np.array_equal(got[2], q_rot)
        assert not np.array_equal(q_rot, q), "the query heads rotate"
        assert np.all(got[0] == c.init[0]) == (not np.any(slots >= 0))
        seen.add((layout, c.params["is_neox"], cache.shape[1] < qkv.shape[2], q.shape[1] % hk != 0,
                  qkv.shape[0] == 1, bool(np.any(slots < 0))))
    for layout in ew.LAYOUTS:
        here = [s[1:] for s in seen if s[0] == layout]
        assert {s[0] for s in here} == {0, 1} and any(s[1] for s in here) and any(s[2] for s in here)
        assert any(s[3] for s in here) and any(s[4] for s in here)
