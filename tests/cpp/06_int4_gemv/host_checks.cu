// Chapter 06 checks that need no GPU: the refusals the generic Validation suite does not reach
// (M past 16, a group size that is none, zero points without whole words, the 16-byte alignment
// of the vectorized versions, an output overlapping an input, shapes that disagree), the byte
// model, which the bench divides by, and the persistent versions' choice of split.
#include <algorithm>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "int4_gemv.cuh"
#include "mma_gemv.cuh"
#include "persistent_gemv.cuh"

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

TEST(HostValidation, SixteenByteVersionsNeedAlignedWeights) {
  for (const GemvOp* op : {&kInt4iGemv, &kInt4iZpGemv, &kInt4tGemv}) {
    for (const Version* v : versions_of(*op)) {
      if (v->id != "v2_vec16_rows" && v->id != "v3_mma_split_k" && v->id != "v4_persistent_smem_x" &&
          v->id != "v5_f16_activations" && v->id != "v6_balanced_steps" && v->id != "v7_shallow_ring" &&
          v->id != "v8_dependent_launch" && v->id != "v9_block_split_k" && v->id != "v10_rotated_walk" &&
          v->id != "v11_line_prefetch" && v->id != "v12_tiled_weights" && v->id != "v13_consecutive_tiles" &&
          v->id != "v14_evict_first" && v->id != "v15_block_scales")
        continue;
      Fake at;
      at.w += 4;  // aligned for 4-byte words, not for 16-byte loads
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "w must be 16-byte aligned");
    }
  }
}

TEST(HostValidation, V4NeedsScalesInWholeWords) {
  for (const GemvOp* op : {&kInt4iGemv, &kInt4iZpGemv, &kInt4tGemv}) {
    for (const Version* v : versions_of(*op)) {
      if (v->id != "v4_persistent_smem_x" && v->id != "v5_f16_activations" && v->id != "v6_balanced_steps" &&
          v->id != "v7_shallow_ring" && v->id != "v8_dependent_launch" && v->id != "v9_block_split_k" &&
          v->id != "v10_rotated_walk" && v->id != "v11_line_prefetch" && v->id != "v12_tiled_weights" &&
          v->id != "v13_consecutive_tiles" && v->id != "v14_evict_first" && v->id != "v15_block_scales")
        continue;
      Fake at;
      at.scales += 2;  // aligned for BF16, not for the 4-byte copies of v4
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "scales must be 4-byte aligned");
    }
  }
}

TEST(HostValidation, ActivationsMustBe16ByteAligned) {
  for (const GemvOp* op : kOps) {
    for (const Version* v : versions_of(*op)) {
      Fake at;
      at.x += 4;
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "x must be 16-byte aligned");
    }
  }
}

TEST(HostValidation, OutputMustNotOverlapAnInput) {
  for (const GemvOp* op : kOps) {
    for (const Version* v : versions_of(*op)) {
      Fake at;
      at.y = at.x + 256;  // inside x
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "y and x must not overlap");
      at = Fake{};
      at.y = at.w + 1024;  // inside w
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "y and w must not overlap");
    }
  }
}

TEST(HostValidation, ShapesMustAgree) {
  for (const GemvOp* op : kOps) {
    for (const Version* v : versions_of(*op)) {
      Args a = fake_args(*op, 2, 64, 1024, 128);
      a.outputs[0].shape = {2, 65};
      expect_refused(*v, a, "y must be [M, N]");
      a = fake_args(*op, 2, 64, 1024, 128);
      a.inputs[1].shape = {64, 127};
      expect_refused(*v, a, op->tiled ? "w must be tiled" : "w must be [N, K/8] words");
      a = fake_args(*op, 2, 64, 1024, 128);
      a.inputs[2].shape = {63, 8};
      // Tiled, N is the scales' rows (w's are padded): the scales and y disagree.
      expect_refused(*v, a, op->tiled ? "y must be [M, N], N the scales' rows (63)" : "scales must be [N, K/G]");
    }
  }
}

// int4t_gemv: N comes from the scales, and w must be padded to whole tiles and steps; an output
// inside the padding overlaps w.
TEST(HostValidation, TiledWeightsMustBePaddedToWholeTilesAndSteps) {
  EXPECT_EQ(tiled_rows(37), 48);
  EXPECT_EQ(tiled_row_words(1152), 160);  // 4.5 steps of 32 words → 5
  EXPECT_EQ(tiled_word(0, 0, 1152), 0);
  EXPECT_EQ(tiled_word(1, 0, 1152), 32);          // the next row of the same step
  EXPECT_EQ(tiled_word(0, 32, 1152), 16 * 32);    // the next step: after the tile's 16 rows
  EXPECT_EQ(tiled_word(16, 0, 1152), 5 * 16 * 32);  // the next tile: after its 5 steps
  EXPECT_EQ(tiled_word(37, 143, 1152), (2 * 5 + 4) * 16 * 32 + 5 * 32 + 15);
  for (const Version* v : versions_of(kInt4tGemv)) {
    Args a = fake_args(kInt4tGemv, 1, 37, 1152, 128);
    a.inputs[1].shape = {37, 144};  // rows, unpadded
    expect_refused(*v, a, "w must be tiled");
    a = fake_args(kInt4tGemv, 1, 37, 1152, 128);
    a.inputs[1].shape = {48, 144};  // K not padded to whole steps
    expect_refused(*v, a, "w must be tiled");
    Fake at;
    at.y = at.w + 37 * 1152 / 2 + 64;  // past N·K/2 bytes, inside the padding
    expect_refused(*v, fake_args(kInt4tGemv, 1, 37, 1152, 128, at), "y and w must not overlap");
    // The model counts N·K/2 bytes of weights and 2·M·N·K FLOPs, the padding in neither.
    EXPECT_DOUBLE_EQ(v->bytes(fake_args(kInt4tGemv, 1, 37, 1152, 128)),
                     37 * 1152 / 2.0 + 37 * 9 * 2.0 + 1152 * 2.0 + 37 * 2.0);
    EXPECT_DOUBLE_EQ(v->flops(fake_args(kInt4tGemv, 1, 37, 1152, 128)), 2.0 * 37 * 1152);
  }
}

// A persistent kernel reads one layout: launched with an op whose weights are in the other, it is
// refused before anything reaches the device.
TEST(HostValidation, PersistentKernelsRefuseTheOtherLayout) {
  const GemvArgs a{reinterpret_cast<const __nv_bfloat16*>(0x1000000), reinterpret_cast<const uint32_t*>(0x10000000),
                   reinterpret_cast<const __nv_bfloat16*>(0x20000000), nullptr,
                   reinterpret_cast<__nv_bfloat16*>(0x40000000), 1, 64, 1024, 128};
  using namespace persistent;
  const Status rows_on_tiled =
      launch<1, kFold, false, kShallowStages, false, 128, false>(kInt4tGemv, a, nullptr, Options{});
  EXPECT_EQ(rows_on_tiled.code, Code::kInvalidArgument) << rows_on_tiled.str();
  EXPECT_NE(rows_on_tiled.message.find("row layout launched on the other"), std::string::npos) << rows_on_tiled.str();
  const Status tiled_on_rows =
      launch<1, kFold, false, kShallowStages, false, 128, true>(kInt4iGemv, a, nullptr, Options{});
  EXPECT_EQ(tiled_on_rows.code, Code::kInvalidArgument) << tiled_on_rows.str();
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

// plan_splits(tiles, iters, sms, warps, s_min, s_max) on the H200's 132 SMs, 16 warps a block.
TEST(HostPlan, SplitsOnlyWhereTheTilesLeaveWarpsIdle) {
  // 28672 × 8192: 1792 tiles already give every block 14 tiles: no split.
  EXPECT_EQ(mma::plan_splits(1792, 32, 132, 16, 1, 32), 1);
  // 8192 × 28672: 512 tiles leave most warps idle: split until each block has about 8 (eight
  // busy warps keep an SM streaming, kWarpsToStream).
  EXPECT_EQ(mma::plan_splits(512, 112, 132, 16, 1, 64), 2);
  // A handful of tiles: split far, but never past the steps there are.
  EXPECT_GT(mma::plan_splits(3, 16, 132, 16, 1, 16), 8);
  EXPECT_LE(mma::plan_splits(3, 16, 132, 16, 1, 16), 16);
}

TEST(HostPlan, PrefersSplitsThatFillTheBlocksEvenly) {
  // 512 tiles and a slice that fits only from S = 7: 7 splits give 18 blocks each, 29 tiles on the
  // busiest (16 steps); 8 give 16 blocks of exactly 32 tiles (14 steps), less time on the busiest.
  EXPECT_EQ(mma::plan_splits(512, 112, 132, 16, 7, 64), 8);
  // s_min is a floor, whatever the model says.
  EXPECT_GE(mma::plan_splits(1792, 32, 132, 16, 4, 32), 4);
}

// v6's model (balanced steps, the x slice weighed at M·steps/4): S = 1 where the tiles fill the
// blocks and little x is staged, splits as the x slice grows.
TEST(HostPlan, BalancedStepsSplitLessAndWeighX) {
  EXPECT_EQ(mma::plan_splits(1792, 32, 132, 16, 1, 32, true, 1), 1);  // 28672 × 8192, M = 1
  EXPECT_EQ(mma::plan_splits(1792, 32, 132, 16, 1, 32, true, 2), 1);  // M = 2
  EXPECT_EQ(mma::plan_splits(1792, 32, 132, 16, 1, 32, true, 4), 2);  // M = 4
  EXPECT_EQ(mma::plan_splits(1792, 32, 132, 16, 2, 32, true, 8), 2);  // M = 8: x fits from S = 2
  EXPECT_EQ(mma::plan_splits(256, 16, 132, 16, 1, 16, true, 1), 1);   // 4096 × 4096, M = 1
  EXPECT_EQ(mma::plan_splits(512, 112, 132, 16, 1, 64, true, 1), 2);  // 8192 × 28672, M = 1
  EXPECT_EQ(mma::plan_splits(512, 112, 132, 16, 1, 64, true, 2), 4);  // M = 2
  EXPECT_EQ(mma::plan_splits(512, 112, 132, 16, 1, 64, true, 0), 1);  // ... without the x term
}

// v7's model (two stages: whole rounds of 16 tiles per block, the x slice at one unit per row
// and step, 48 per round with S > 1). The S it picks at each (M, shape) of the H200 sweep in the
// book's v7 section; s_min is where x fits beside the two-stage ring.
TEST(HostPlan, ShallowRingPlansWholeRounds) {
  // 28672 × 8192: one round of 14 tiles at S = 1 (16 · 33 + M · 32) against two of 28 at S = 2.
  EXPECT_EQ(mma::rounds_time(1792, 32, 132, 16, 1, 1), 16 * 33 + 32);
  EXPECT_EQ(mma::rounds_time(1792, 32, 132, 16, 2, 1), 32 * 17 + 16 + 2 * 48);
  EXPECT_EQ(mma::plan_rounds(1792, 32, 132, 16, 1, 32, 1), 1);   // M = 1
  EXPECT_EQ(mma::plan_rounds(1792, 32, 132, 16, 1, 32, 8), 2);   // M = 8: the x slice tips it
  EXPECT_EQ(mma::plan_rounds(1792, 32, 132, 16, 2, 32, 16), 2);  // M = 16 (a tie with S = 4)
  // 8192 × 28672: S = 4 puts 16 tiles on 33 blocks, one whole round; S = 2 half a round.
  EXPECT_EQ(mma::plan_rounds(512, 112, 132, 16, 1, 64, 1), 4);
  EXPECT_EQ(mma::plan_rounds(512, 112, 132, 16, 2, 64, 4), 4);
  EXPECT_EQ(mma::plan_rounds(512, 112, 132, 16, 7, 64, 16), 8);
  EXPECT_GE(mma::plan_rounds(1792, 32, 132, 16, 5, 32, 1), 5);  // s_min is a floor
}

// v9's plan on the H200 (132 SMs, 227 KB of shared memory per block): the whole row of x in the
// block (S = 1) at M = 1 wherever it fits, at M = 2 up to K = 8192; past that the shallow ring's S.
TEST(HostPlan, V9HoldsTheWholeRowWhereItPays) {
  const size_t h200_smem = 227 * 1024;
  auto plan = [&](int64_t m, int64_t n, int64_t k, int* force) {
    return persistent::block_split_plan(m, n, k, force, 132, h200_smem);
  };
  int force = -1;
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {4096, 4096}, {14336, 4096}, {4096, 14336}, {8192, 8192}, {28672, 8192}, {8192, 28672}}) {
    EXPECT_EQ(plan(1, n, k, &force).splits, 1) << n << " x " << k;
    EXPECT_EQ(force, 1);
    const persistent::Plan two = plan(2, n, k, &force);
    EXPECT_EQ(force, k <= persistent::kWholeRowMaxK2 ? 1 : 0) << n << " x " << k;
    if (k <= persistent::kWholeRowMaxK2) EXPECT_EQ(two.splits, 1) << n << " x " << k;
  }
  EXPECT_GT(plan(2, 4096, 14336, &force).splits, 1);  // the shallow ring's S = 8
  EXPECT_GT(plan(2, 8192, 28672, &force).splits, 1);  // S = 4
  EXPECT_EQ(plan(2, 14336, 4096, &force).splits, 1);  // the plan's S was 2
  // A row too long to fit beside the ring at M = 1: the plan's own S.
  EXPECT_GT(plan(1, 4096, 131072, &force).splits, 1);
  EXPECT_EQ(force, 0);
}

// The balanced kernel's runs: v6 cuts at any step, v7 at half tiles. Every run boundary is a
// step of the block, the runs cover its T·iters steps in order, and with half tiles each
// scheduler's (warp mod 4) share is within one half of the others'.
TEST(HostPlan, RunsCoverTheBlockAndHalfTilesEvenTheSchedulers) {
  using persistent::run_start;
  for (unsigned tiles : {1u, 2u, 13u, 14u, 16u, 27u, 28u, 33u}) {
    for (unsigned iters : {1u, 9u, 14u, 32u}) {
      for (bool halves : {false, true}) {
        EXPECT_EQ(run_start(0, tiles, iters, halves), 0u);
        EXPECT_EQ(run_start(16, tiles, iters, halves), tiles * iters);
        unsigned share[4] = {};
        for (unsigned w = 0; w < 16; ++w) {
          const unsigned lo = run_start(w, tiles, iters, halves), hi = run_start(w + 1, tiles, iters, halves);
          EXPECT_LE(lo, hi);
          share[w % 4] += hi - lo;
        }
        const unsigned most = *std::max_element(share, share + 4), least = *std::min_element(share, share + 4);
        // One half apart (odd iters: halves of ⌊iters/2⌋ and ⌈iters/2⌉ steps, a tile at most;
        // one step per tile: halves of 0 and 1 step, nothing to even out).
        if (iters > 1)
          EXPECT_LE(most - least, halves ? (iters % 2 ? iters : iters / 2) : 4u) << tiles << " tiles, " << iters << " steps";
      }
    }
  }
  // 14 tiles of 32 steps: warps 0..11 one whole tile each, warps 12..15 one half each.
  EXPECT_EQ(persistent::run_start(12, 14, 32, true), 12u * 32);
  EXPECT_EQ(persistent::run_start(13, 14, 32, true), 12u * 32 + 16);
}

// v6's choice: whole tiles seen by scheduler against balanced steps. 28672 × 8192, M = 1: 14 tiles
// on 16 warps put 4, 4, 3, 3 on the schedulers (4·4·33 = 528 against 14·33 + 8 = 470): balance.
// 8192 × 28672, M = 1, S = 2: 8 tiles, 2 per scheduler (4·2·57 = 456 against 8·57 + 14 = 470):
// whole tiles.
TEST(HostPlan, V6BalancesWhereWholeTilesFallUnevenly) {
  EXPECT_EQ(mma::whole_tiles_time(1792, 32, 132, 16, 1), 528);
  EXPECT_EQ(mma::split_time(1792, 32, 132, 16, 1, true, 1), 470);
  EXPECT_EQ(mma::whole_tiles_time(512, 112, 132, 16, 2), 456);
  EXPECT_EQ(mma::split_time(512, 112, 132, 16, 2, true, 1), 470);
  // 32 tiles on 16 warps: two per warp, eight per scheduler, as even as balanced steps.
  EXPECT_EQ(mma::whole_tiles_time(512, 112, 132, 16, 8), 4 * 8 * 15);
  EXPECT_EQ(mma::split_time(512, 112, 132, 16, 8, true, 0), 32 * 15);
  // Three tiles: a chain, never less than the unbalanced model's own time.
  EXPECT_EQ(mma::whole_tiles_time(3, 16, 132, 16, 1), mma::split_time(3, 16, 132, 16, 1, false, 0));
}

}  // namespace
}  // namespace lkw::gemv
