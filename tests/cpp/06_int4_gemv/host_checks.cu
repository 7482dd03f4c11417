// Chapter 06 checks that need no GPU: the refusals the generic Validation suite does not reach
// (M past 16, a group size that is none, zero points without whole words, the 16-byte alignment
// of the vectorized versions, an output overlapping an input, shapes that disagree), the byte
// model, which the bench divides by, and the persistent versions' choice of split.
#include <algorithm>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "int4_gemv.cuh"
#include "gemv_plan.h"
#include "persistent.cuh"

namespace lkw::gemv {
namespace {

// Fake device addresses, far apart and 256-byte aligned: every call below must be refused before
// the launcher looks at the device, so nothing ever touches them.
struct Fake {
  uintptr_t x = 0x1000000, w = 0x10000000, scales = 0x20000000, zeros = 0x30000000,
            y = 0x40000000;
};

Args fake_args(const GemvOp& op, int64_t m, int64_t n, int64_t k, int64_t g, Fake at = {}) {
  Args a;
  a.inputs.push_back({reinterpret_cast<void*>(at.x), DType::kBF16, {m, k}});
  if (op.tiled)  // int4t_gemv: padded to whole tiles of 16 rows and steps of 256 k
    a.inputs.push_back({reinterpret_cast<void*>(at.w), DType::kU32, {tiled_rows(n), tiled_row_words(k)}});
  else
    a.inputs.push_back({reinterpret_cast<void*>(at.w), DType::kU32, {n, k / 8}});
  a.inputs.push_back({reinterpret_cast<void*>(at.scales), DType::kBF16, {n, k / g}});
  if (op.zero_points)
    a.inputs.push_back({reinterpret_cast<void*>(at.zeros), DType::kU32, {n, k / g / 8}});
  a.outputs.push_back({reinterpret_cast<void*>(at.y), DType::kBF16, {m, n}});
  return a;
}

std::vector<const Version*> versions_of(const GemvOp& op) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->op == op.name) out.push_back(v);
  return out;
}

const std::vector<const GemvOp*> kOps = {&kInt4Gemv, &kInt4iGemv, &kInt4iZpGemv, &kInt4tGemv};

void expect_refused(const Version& v, const Args& a, const std::string& words) {
  const Status s = v.launch(a, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << v.name() << ": " << s.str();
  EXPECT_NE(s.message.find(words), std::string::npos)
      << v.name() << ": message \"" << s.message << "\" lacks \"" << words << "\"";
}

TEST(HostValidation, EveryOpHasVersions) {
  for (const GemvOp* op : kOps) EXPECT_FALSE(versions_of(*op).empty()) << op->name;
}

TEST(HostValidation, MAbove16IsRefused) {
  for (const GemvOp* op : kOps)
    for (const Version* v : versions_of(*op))
      expect_refused(*v, fake_args(*op, 17, 64, 1024, 128), "M must be in 1..16");
}

TEST(HostValidation, GroupSizesOtherThan32To128AreRefused) {
  for (const GemvOp* op : kOps) {
    for (const Version* v : versions_of(*op)) {
      expect_refused(*v, fake_args(*op, 1, 64, 2048, 256), "group size must be 32, 64 or 128");
      expect_refused(*v, fake_args(*op, 1, 64, 2000, 125), "group size must be 32, 64 or 128");
    }
  }
}

TEST(HostValidation, ZeroPointsNeedWholeWords) {
  for (const Version* v : versions_of(kInt4iZpGemv)) {
    Args a = fake_args(kInt4iZpGemv, 1, 64, 512, 128);  // K/G = 4 zero points: half a word
    a.inputs[3].shape = {64, 1};
    expect_refused(*v, a, "zero points must be [N, K/G/8]");
  }
}

// v2 on read the weights 16 bytes at a time; v4 on (and v7's ablations) copy the scales in
// 4-byte words.
bool reads_16_bytes(const Version& v) {
  return v.kind != Kind::kMutant && v.id != "v0_warp_per_column" && v.id != "v1_lop3_magic";
}
bool persistent_version(const Version& v) {
  return reads_16_bytes(v) && v.id != "v2_vec16_rows" && v.id != "v3_mma_split_k";
}

TEST(HostValidation, SixteenByteVersionsNeedAlignedWeights) {
  for (const GemvOp* op : {&kInt4iGemv, &kInt4iZpGemv, &kInt4tGemv}) {
    for (const Version* v : versions_of(*op)) {
      if (!reads_16_bytes(*v)) continue;
      Fake at;
      at.w += 4;  // aligned for 4-byte words, not for 16-byte loads
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "w must be 16-byte aligned");
    }
  }
}

TEST(HostValidation, PersistentVersionsNeedScalesInWholeWords) {
  int checked = 0;
  for (const GemvOp* op : {&kInt4iGemv, &kInt4iZpGemv, &kInt4tGemv}) {
    for (const Version* v : versions_of(*op)) {
      if (!persistent_version(*v)) continue;
      Fake at;
      at.scales += 2;  // aligned for BF16, not for the 4-byte copies
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "scales must be 4-byte aligned");
      ++checked;
    }
  }
  EXPECT_GE(checked, 4) << "v4 to v7 and v7's ablations";
}

TEST(HostValidation, TheCublasPeerRefusesMismatchedK) {
  const Version* v = Registry::get().find(std::string(LKW_CHAPTER) + "/bf16_gemv/cublas");
  ASSERT_NE(v, nullptr);
  Args a;
  a.inputs.push_back({reinterpret_cast<void*>(0x1000000), DType::kBF16, {2, 1024}});
  a.inputs.push_back({reinterpret_cast<void*>(0x10000000), DType::kBF16, {64, 1000}});
  a.outputs.push_back({reinterpret_cast<void*>(0x40000000), DType::kBF16, {2, 64}});
  const Status s = v->launch(a, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.str();
}

// Bytes = N·K/2 + scales + zero points + M·K·2 + M·N·2: each tensor once, the roofline minimum.
TEST(HostModel, BytesCountEveryTensorOnce) {
  const int64_t m = 4, n = 4096, k = 8192, g = 128;
  for (const GemvOp* op : kOps) {
    for (const Version* v : versions_of(*op)) {
      if (v->kind == Kind::kMutant) continue;
      const double want = n * k / 2.0 + n * (k / g) * 2.0 +
                          (op->zero_points ? n * k / g / 2.0 : 0) + m * k * 2.0 + m * n * 2.0;
      EXPECT_DOUBLE_EQ(v->bytes(fake_args(*op, m, n, k, g)), want) << v->name();
      EXPECT_DOUBLE_EQ(v->flops(fake_args(*op, m, n, k, g)), 2.0 * m * n * k) << v->name();
    }
  }
}

// v3's plan_split_k(n, k, wave, warps): a wave of 1056 blocks (132 SMs × 8), 4 warps a block.
TEST(HostPlan, V3SplitsToHalfFillOneWaveAndNeverStartsASecond) {
  // 8192 × 28672: 512 tiles, half a wave: two splits fill it, 56 steps each.
  SplitK p = plan_split_k(8192, 28672, 1056, 4);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(p.k_split, 56 * kIterK);
  // Four tiles: as many splits as the warps' turns along K allow (32 steps / 4 warps).
  p = plan_split_k(64, 8192, 1056, 4);
  EXPECT_EQ(p.splits, 8);
  EXPECT_EQ(p.k_split, 4 * kIterK);
  // 1792 tiles, between one and two waves: S = 1, 2, 3 use 85% of their waves' slots, S = 4 97%.
  EXPECT_EQ(plan_split_k(28672, 8192, 1056, 4).splits, 4);
  // Two waves of tiles or more: the last wave is a small part, no split.
  EXPECT_EQ(plan_split_k(2 * 1056 * kTileRows, 28672, 1056, 4).splits, 1);
}

TEST(HostPlan, V3SplitsCoverKWithWholeStepsAndNoEmptySplit) {
  for (int64_t n : {16, 64, 1024, 8192, 14336, 28672})
    for (int64_t k : {256, 1024, 4096, 8192, 28672, 57344})
      for (int64_t wave : {132, 1056, 2112}) {
        const SplitK p = plan_split_k(n, k, wave, 4);
        const int64_t tiles = (n + kTileRows - 1) / kTileRows, iters = (k + kIterK - 1) / kIterK;
        EXPECT_EQ(p.k_split % kIterK, 0) << n << " " << k << " " << wave;
        EXPECT_GE(p.splits * p.k_split, k) << n << " " << k << " " << wave;
        EXPECT_LT((p.splits - 1) * p.k_split, k) << n << " " << k << " " << wave;  // none empty
        EXPECT_LE(p.splits, std::max<int64_t>(1, std::min<int64_t>(iters / 4, kMaxSplits)));
        if (tiles <= wave) EXPECT_LE(tiles * p.splits, wave) << n << " " << k << " " << wave;
        if (tiles >= 2 * wave) EXPECT_EQ(p.splits, 1) << n << " " << k << " " << wave;
      }
}

// plan_splits(tiles, iters, sms, warps, s_min, s_max) on the H200's 132 SMs, 16 warps a block.
TEST(HostPlan, SplitsOnlyWhereTheTilesLeaveWarpsIdle) {
  // 28672 × 8192: 1792 tiles already give every block 14 tiles: no split.
  EXPECT_EQ(plan_splits(1792, 32, 132, 16, 1, 32), 1);
  // 8192 × 28672: 512 tiles leave most warps idle: split until each block has about 8 (eight
  // busy warps keep an SM streaming, kWarpsToStream).
  EXPECT_EQ(plan_splits(512, 112, 132, 16, 1, 64), 2);
  // A handful of tiles: split far, but never past the steps there are.
  EXPECT_GT(plan_splits(3, 16, 132, 16, 1, 16), 8);
  EXPECT_LE(plan_splits(3, 16, 132, 16, 1, 16), 16);
}

TEST(HostPlan, PrefersSplitsThatFillTheBlocksEvenly) {
  // 512 tiles and a slice that fits only from S = 7: 7 splits give 18 blocks each, 29 tiles on the
  // busiest (16 steps); 8 give 16 blocks of exactly 32 tiles (14 steps), less time on the busiest.
  EXPECT_EQ(plan_splits(512, 112, 132, 16, 7, 64), 8);
  // s_min is a floor, whatever the model says.
  EXPECT_GE(plan_splits(1792, 32, 132, 16, 4, 32), 4);
}

// v6's model (balanced steps, the x slice weighed at M·steps/4): S = 1 where the tiles fill the
// blocks and little x is staged, splits as the x slice grows.
TEST(HostPlan, BalancedStepsSplitLessAndWeighX) {
  EXPECT_EQ(plan_splits(1792, 32, 132, 16, 1, 32, true, 1), 1);  // 28672 × 8192, M = 1
  EXPECT_EQ(plan_splits(1792, 32, 132, 16, 1, 32, true, 2), 1);  // M = 2
  EXPECT_EQ(plan_splits(1792, 32, 132, 16, 1, 32, true, 4), 2);  // M = 4
  EXPECT_EQ(plan_splits(1792, 32, 132, 16, 2, 32, true, 8), 2);  // M = 8: x fits from S = 2
  EXPECT_EQ(plan_splits(256, 16, 132, 16, 1, 16, true, 1), 1);   // 4096 × 4096, M = 1
  EXPECT_EQ(plan_splits(512, 112, 132, 16, 1, 64, true, 1), 2);  // 8192 × 28672, M = 1
  EXPECT_EQ(plan_splits(512, 112, 132, 16, 1, 64, true, 2), 4);  // M = 2
  EXPECT_EQ(plan_splits(512, 112, 132, 16, 1, 64, true, 0), 1);  // ... without the x term
}

// v7's model (two stages: whole rounds of 16 tiles per block, the x slice at one unit per row
// and step, 48 per round with S > 1). The S it picks at each (M, shape) of the H200 sweep in the
// book's v7 section; s_min is where x fits beside the two-stage ring.
TEST(HostPlan, ShallowRingPlansWholeRounds) {
  // 28672 × 8192: one round of 14 tiles at S = 1 (16 · 33 + M · 32) against two of 28 at S = 2.
  EXPECT_EQ(rounds_time(1792, 32, 132, 16, 1, 1), 16 * 33 + 32);
  EXPECT_EQ(rounds_time(1792, 32, 132, 16, 2, 1), 32 * 17 + 16 + 2 * 48);
  EXPECT_EQ(plan_rounds(1792, 32, 132, 16, 1, 32, 1), 1);   // M = 1
  EXPECT_EQ(plan_rounds(1792, 32, 132, 16, 1, 32, 8), 2);   // M = 8: the x slice tips it
  EXPECT_EQ(plan_rounds(1792, 32, 132, 16, 2, 32, 16), 2);  // M = 16 (a tie with S = 4)
  // 8192 × 28672: S = 4 puts 16 tiles on 33 blocks, one whole round; S = 2 half a round.
  EXPECT_EQ(plan_rounds(512, 112, 132, 16, 1, 64, 1), 4);
  EXPECT_EQ(plan_rounds(512, 112, 132, 16, 2, 64, 4), 4);
  EXPECT_EQ(plan_rounds(512, 112, 132, 16, 7, 64, 16), 8);
  EXPECT_GE(plan_rounds(1792, 32, 132, 16, 5, 32, 1), 5);  // s_min is a floor
}

// v6's plan on the H200 (132 SMs, 227 KB of shared memory per block, v6's footprint): the whole
// row of x in the block (S = 1) at M = 1 wherever it fits, at M = 2 up to K = 8192; past that the
// shallow ring's S.
TEST(HostPlan, V6HoldsTheWholeRowWhereItPays) {
  const size_t h200_smem = 227 * 1024;
  auto plan = [&](int64_t m, int64_t n, int64_t k) {
    auto smem_of = [&](int64_t ks) {
      return size_t(kBlockWarps) * 2 * sizeof(persistent::Stage) + size_t(m) * (ks + 8) * 2 + size_t(ks / 128) * 32;
    };
    const int64_t force = m <= 2 ? whole_row_force(m, k) : 0;
    Plan p = plan_persistent(m, n, k, 132, h200_smem, SplitModel::kRounds, smem_of, force);
    if (force && p.splits != 1) p = plan_persistent(m, n, k, 132, h200_smem, SplitModel::kRounds, smem_of);
    return p;
  };
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {4096, 4096}, {14336, 4096}, {4096, 14336}, {8192, 8192}, {28672, 8192}, {8192, 28672}}) {
    EXPECT_EQ(plan(1, n, k).splits, 1) << n << " x " << k;
    if (k <= kWholeRowMaxK2) EXPECT_EQ(plan(2, n, k).splits, 1) << n << " x " << k;
    EXPECT_LE(plan(2, n, k).smem, h200_smem);
  }
  EXPECT_GT(plan(2, 4096, 14336).splits, 1);  // the shallow ring's S
  EXPECT_GT(plan(2, 8192, 28672).splits, 1);
  EXPECT_GT(plan(1, 4096, 131072).splits, 1);  // a row too long to fit: the plan's own S
}

// The runs of v5 to v7: with S = 1 cut at any step, with S > 1 at whole tiles. The runs cover
// the block's T·iters steps in order; even cuts leave the warps' shares one step apart at most,
// whole-tile cuts one tile apart, and every boundary then falls at a tile's start.
TEST(HostPlan, RunsCoverTheBlockEvenly) {
  for (unsigned tiles : {1u, 2u, 13u, 14u, 16u, 27u, 28u, 33u}) {
    for (unsigned iters : {1u, 9u, 14u, 32u}) {
      for (bool whole : {false, true}) {
        EXPECT_EQ(run_start(0, tiles, iters, whole), 0u);
        EXPECT_EQ(run_start(16, tiles, iters, whole), tiles * iters);
        unsigned most = 0, least = ~0u;
        for (unsigned w = 0; w < 16; ++w) {
          const unsigned lo = run_start(w, tiles, iters, whole), hi = run_start(w + 1, tiles, iters, whole);
          EXPECT_LE(lo, hi);
          if (whole) EXPECT_EQ(lo % iters, 0u) << tiles << " tiles, " << iters << " steps, warp " << w;
          most = std::max(most, hi - lo);
          least = std::min(least, hi - lo);
        }
        EXPECT_LE(most - least, whole ? iters : 1u) << tiles << " tiles, " << iters << " steps";
      }
    }
  }
  // 14 tiles of 32 steps cut evenly: 28 steps a warp.
  EXPECT_EQ(run_start(1, 14, 32, false), 28u);
  EXPECT_EQ(run_start(15, 14, 32, false), 15u * 28);
}

}  // namespace
}  // namespace lkw::gemv
