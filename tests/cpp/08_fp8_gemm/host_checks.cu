// Chapter 08 checks that need no GPU: the refusals the generic Validation suite does not reach
// (N or K not a multiple of 16, scales that name no granularity or the other op's, blockwise K,
// alignment, an output overlapping an input) and the byte model the bench divides by.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "07_w4a16_gemm/gemm_plan.h"
#include "fp8_gemm.cuh"
#include "lkw/ptx.cuh"
#include "schedule.cuh"

namespace lkw::fp8 {
namespace {

// Fake device addresses, far apart and 256-byte aligned: every call below must be refused before
// the launcher looks at the device.
struct Fake {
  uintptr_t a = 0x1000000, b = 0x10000000, sa = 0x20000000, sb = 0x30000000, y = 0x40000000;
};

enum class Scales { kTensor, kRowwise, kBlockwise };

Args fake_args(int64_t m, int64_t n, int64_t k, Scales scales, Fake at = {}) {
  Args a;
  a.inputs.push_back({reinterpret_cast<void*>(at.a), DType::kE4M3, {m, k}});
  a.inputs.push_back({reinterpret_cast<void*>(at.b), DType::kE4M3, {n, k}});
  std::vector<int64_t> sa{1}, sb{1};
  if (scales == Scales::kRowwise) sa = {m, 1}, sb = {n, 1};
  if (scales == Scales::kBlockwise) sa = {k / 128, m}, sb = {(n + 127) / 128, k / 128};
  a.inputs.push_back({reinterpret_cast<void*>(at.sa), DType::kF32, sa});
  a.inputs.push_back({reinterpret_cast<void*>(at.sb), DType::kF32, sb});
  a.outputs.push_back({reinterpret_cast<void*>(at.y), DType::kBF16, {m, n}});
  return a;
}

std::vector<const Version*> versions_of(const char* op) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->op == op) out.push_back(v);
  return out;
}

void expect_refused(const Version& v, const Args& a, const std::string& words) {
  const Status s = v.launch(a, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << v.name() << ": " << s.str();
  EXPECT_NE(s.message.find(words), std::string::npos)
      << v.name() << ": message \"" << s.message << "\" lacks \"" << words << "\"";
}

TEST(HostValidation, BothOpsHaveVersions) {
  EXPECT_GE(versions_of(kOp).size(), 5u);
  EXPECT_FALSE(versions_of(kBlockwiseOp).empty());
}

TEST(HostValidation, NAndKMustBeMultiplesOf16) {
  for (const Version* v : versions_of(kOp)) {
    expect_refused(*v, fake_args(4, 100, 256, Scales::kRowwise), "N = 100 must be a multiple of 16");
    expect_refused(*v, fake_args(4, 128, 264, Scales::kTensor), "K = 264 must be a multiple of 16");
  }
}

TEST(HostValidation, ScalesOfNoGranularityAreRefused) {
  for (const Version* v : versions_of(kOp)) {
    Args a = fake_args(8, 128, 256, Scales::kRowwise);
    a.inputs[2].shape = {8};  // per token, but flat
    expect_refused(*v, a, "name no granularity");
    a = fake_args(8, 128, 256, Scales::kRowwise);
    a.inputs[3].shape = {1, 128};  // per channel, transposed
    expect_refused(*v, a, "name no granularity");
  }
  for (const Version* v : versions_of(kBlockwiseOp)) {
    Args a = fake_args(8, 256, 512, Scales::kBlockwise);
    a.inputs[3].shape = {4, 2};  // B's blocks as [K/128, N/128]
    expect_refused(*v, a, "name no granularity");
  }
}

TEST(HostValidation, EachOpTakesItsOwnScales) {
  for (const Version* v : versions_of(kOp))
    expect_refused(*v, fake_args(8, 256, 512, Scales::kBlockwise), "fp8_gemm_blockwise");
  for (const Version* v : versions_of(kBlockwiseOp)) {
    expect_refused(*v, fake_args(8, 256, 512, Scales::kRowwise), "takes blockwise scales");
    expect_refused(*v, fake_args(8, 256, 512, Scales::kTensor), "takes blockwise scales");
  }
}

TEST(HostValidation, BlockwiseNeedsKAMultipleOf128) {
  // K = 208: K/128 rounds down, so no scale shape names it; the message says what it expects.
  for (const Version* v : versions_of(kBlockwiseOp)) {
    Args a = fake_args(8, 256, 208, Scales::kBlockwise);
    a.inputs[2].shape = {1, 8};
    a.inputs[3].shape = {2, 1};
    expect_refused(*v, a, "name no granularity");
  }
}

TEST(HostValidation, RowMajorBlockwiseScalesAreTakenByTheParam) {
  for (const Version* v : versions_of(kBlockwiseOp)) {
    Args a = fake_args(8, 256, 512, Scales::kBlockwise);
    a.inputs[2].shape = {8, 4};  // [M, K/128]
    expect_refused(*v, a, "name no granularity");  // without the param: column-major expected
    a.params["a_scales_row_major"] = 1;
    a.inputs[0].data = reinterpret_cast<void*>(0x1000001);  // now refused for alignment instead
    expect_refused(*v, a, "A must be 16-byte aligned");
  }
}

TEST(HostValidation, MisalignedOrOverlappingOperandsAreRefused) {
  for (const char* op : {kOp, kBlockwiseOp})
    for (const Version* v : versions_of(op)) {
      const Scales sc = std::string(op) == kOp ? Scales::kRowwise : Scales::kBlockwise;
      Fake at;
      at.b += 8;
      expect_refused(*v, fake_args(8, 256, 512, sc, at), "B must be 16-byte aligned");
      at = Fake{};
      at.y = at.a + 1024;  // y [8, 256] BF16 over A [8, 512]
      expect_refused(*v, fake_args(8, 256, 512, sc, at), "y and A");
      at = Fake{};
      at.sa += 2;
      expect_refused(*v, fake_args(8, 256, 512, sc, at), "s_a must be 4-byte aligned");
    }
}

TEST(HostValidation, EmptyMIsRefused) {
  for (const Version* v : versions_of(kOp))
    expect_refused(*v, fake_args(0, 128, 256, Scales::kTensor), "M must be at least 1");
}

TEST(HostValidation, ANegativeBlockCapIsRefused) {
  for (const Version* v : versions_of(kOp)) {
    Args a = fake_args(8, 128, 256, Scales::kTensor);
    a.params["max_blocks"] = -1;
    expect_refused(*v, a, "max_blocks must be >= 0");
  }
}

TEST(HostModel, BytesAreEachTensorOnceAndFlopsTwoMNK) {
  for (const char* op : {kOp, kBlockwiseOp}) {
    const Version& v = *versions_of(op).front();
    const bool block = std::string(op) == kBlockwiseOp;
    const int64_t m = 64, n = 2112, k = 7168;
    const Args a = fake_args(m, n, k, block ? Scales::kBlockwise : Scales::kRowwise);
    const double scales = block ? 4.0 * (k / 128 * m + (n + 127) / 128 * (k / 128)) : 4.0 * (m + n);
    EXPECT_DOUBLE_EQ(v.bytes(a), double(m * k + n * k + 2 * m * n) + scales) << op;
    EXPECT_DOUBLE_EQ(v.flops(a), 2.0 * m * n * k) << op;
  }
}

TEST(HostSchedule, TilesCoverTheOutputOnceMFastest) {
  const TileSchedule s = plan_tiles(300, 2112, 128, 256);
  EXPECT_EQ(s.tiles_m, 3);
  EXPECT_EQ(s.tiles_n, 9);  // 2112 = 8.25 tiles of 256
  EXPECT_EQ(s.count(), 27);
  int m0 = -1, n0 = -1;
  s.origin(4, &m0, &n0);  // one band: M-fastest
  EXPECT_EQ(m0, 128);
  EXPECT_EQ(n0, 256);
}

// Every (tile, K block) pair is one unit's exactly once, whatever the bands and splits (a last
// band of fewer tile rows, shares of K that differ by one block).
TEST(HostSchedule, BandsAndSplitsCoverEveryTileAndKBlockOnce) {
  for (int group_m : {0, 1, 4, 16})
    for (int splits : {1, 3, 7}) {
      const TileSchedule s = plan_tiles(1300, 2112, 128, 128, 7168, group_m, splits);
      std::vector<int> seen(size_t(s.tiles()) * s.k_blocks, 0);
      for (int u = 0; u < s.count(); ++u) {
        int m0, n0, kb0, kb1;
        s.origin(u, &m0, &n0);
        s.k_range(u, &kb0, &kb1);
        ASSERT_TRUE(m0 % 128 == 0 && m0 < 1300 && n0 % 128 == 0 && n0 < 2112) << m0 << " " << n0;
        EXPECT_GE(kb1 - kb0, s.k_blocks / splits);
        for (int kb = kb0; kb < kb1; ++kb) ++seen[(size_t(n0 / 128) * s.tiles_m + m0 / 128) * s.k_blocks + kb];
      }
      for (int c : seen) ASSERT_EQ(c, 1) << "group_m " << group_m << ", splits " << splits;
    }
}

// v5's plan on the H200's 132 SMs for the issue's shapes: DeepSeek-V3's decode side (M = 64) splits
// K until the SMs are full, 12 blocks a share at least; M = 128, M = 4096 and the square shapes do
// not split; tensor and rowwise scales take 256-wide tiles once those fill the SMs, blockwise ones
// 192-wide once those fill them twice.
TEST(HostSchedule, V5PlansTheIssueShapes) {
  auto plan = [](int64_t m, int64_t n, int64_t k, bool blockwise) {
    return plan_v5(m, n, k, blockwise, 132, 16);
  };
  const TileSchedule small = plan(64, 2112, 7168, true);  // 17 tiles, 56 K blocks
  EXPECT_EQ(small.block_n, 128);
  EXPECT_EQ(small.tiles(), 17);
  EXPECT_EQ(small.splits, 4);  // 56 / 12: 68 units
  EXPECT_EQ(plan(64, 4096, 7168, true).splits, 4);    // 32 tiles
  EXPECT_EQ(plan(64, 7168, 2048, true).splits, 1);    // 16 blocks: two shares of 8 lose
  EXPECT_EQ(plan(128, 2112, 7168, true).splits, 1);   // M = 128: no split
  EXPECT_EQ(plan(128, 32768, 512, true).splits, 1);   // 256 tiles already
  EXPECT_EQ(plan(128, 32768, 512, true).block_n, 128);  // 171 tiles of 192: not twice the SMs
  EXPECT_EQ(plan(64, 7168, 16384, false).splits, 2);  // 56 tiles of 128 (28 of 256 do not fill)
  EXPECT_EQ(plan(64, 7168, 16384, false).block_n, 128);
  const TileSchedule big = plan(8192, 8192, 8192, false);
  EXPECT_EQ(big.block_n, 256);
  EXPECT_EQ(big.splits, 1);
  EXPECT_EQ(big.group_m, 16);
  EXPECT_EQ(plan(8192, 8192, 8192, true).block_n, 192);
  EXPECT_EQ(plan(4096, 4096, 4096, true).block_n, 192);  // 704 tiles
  EXPECT_EQ(block_n_for(4096, 4096, true, 132, false), 128);  // v3 and v4's rule: never 192
  for (int64_t n : {2112, 24576, 32768, 7168, 4096})
    EXPECT_EQ(plan(4096, n, 2048, true).splits, 1) << n;
}

// v5's pairs: only with two tile rows at least, on tiles twice as tall at v5's width, in bands of
// half as many pair rows (the same rows of A in flight), never split.
TEST(HostSchedule, V5PairsPlanTallTilesAtLargeM) {
  EXPECT_FALSE(pairs_pay(64));
  EXPECT_FALSE(pairs_pay(128));
  EXPECT_TRUE(pairs_pay(129));
  const TileSchedule big = plan_v5_pairs(8192, 8192, 8192, 132, 16, 2);
  EXPECT_EQ(big.block_m, 256);
  EXPECT_EQ(big.block_n, 192);
  EXPECT_EQ(big.tiles_m, 32);
  EXPECT_EQ(big.group_m, 8);
  EXPECT_EQ(big.splits, 1);
  const TileSchedule odd = plan_v5_pairs(640, 992, 512, 132, 16, 2);  // 5 tile rows: 3 pairs
  EXPECT_EQ(odd.block_n, 128);
  EXPECT_EQ(odd.tiles_m, 3);
  EXPECT_EQ(odd.tiles(), 3 * 8);
}

// The plans of v5's registrations (plan_v5_variant): the version's is plan_v5's; the no-split
// ablation keeps every tile's K in one block; the wide one takes 192-wide blockwise tiles at every
// shape, with the shares for that width, and leaves tensor and rowwise scales as v5 plans them.
TEST(HostSchedule, V5VariantsPlanTheirAblations) {
  auto variant = [](int64_t m, int64_t n, int64_t k, bool blockwise, bool split_k, bool wide) {
    return plan_v5_variant(m, n, k, blockwise, 132, 16, split_k, wide);
  };
  const TileSchedule tuned = variant(64, 2112, 7168, true, true, false), v5 = plan_v5(64, 2112, 7168, true, 132, 16);
  EXPECT_EQ(tuned.block_n, v5.block_n);
  EXPECT_EQ(tuned.splits, v5.splits);
  EXPECT_EQ(variant(64, 2112, 7168, true, false, false).splits, 1);
  EXPECT_EQ(variant(64, 2112, 7168, true, false, false).block_n, 128);
  const TileSchedule wide = variant(64, 2112, 7168, true, true, true);
  EXPECT_EQ(wide.block_n, 192);
  EXPECT_EQ(wide.tiles(), 11);
  EXPECT_EQ(wide.splits, 4);  // 56 / 12 blocks a share, below 132 / 11
  EXPECT_EQ(variant(128, 32768, 512, true, true, true).block_n, 192);  // where v5 keeps 128
  EXPECT_EQ(variant(64, 7168, 16384, false, true, true).block_n, 128);
  EXPECT_EQ(variant(64, 7168, 16384, false, true, true).splits, 2);
  const TileSchedule unit = variant(64, 2112, 7168, true, true, false);
  const TileSchedule::Unit u = unit.locate(unit.tiles() + 3);  // split 1 of tile 3
  EXPECT_EQ(u.m0, 0);
  EXPECT_EQ(u.n0, 3 * 128);
  EXPECT_EQ(u.kb0, 14);
  EXPECT_EQ(u.kb1, 28);
}

// The register balance of the warp-specialized versions (lkw/ptx.cuh): a block of 384 threads is
// launched with 168 registers a thread, and the consumers' claim must fit what the producers give
// back. 48 for the producers (the first scale-warp experiment) hung every blockwise test.
TEST(HostModel, SetmaxnregClaimsFitTheLaunchPool) {
  EXPECT_EQ(ptx::launch_regs(384), 168);
  EXPECT_TRUE(ptx::setmaxnreg_fits(128, 40, 256, 232));   // v3..v5: exactly the pool
  EXPECT_FALSE(ptx::setmaxnreg_fits(128, 48, 256, 232));  // 6144 + 59392 > 64512
  EXPECT_TRUE(ptx::setmaxnreg_fits(128, 56, 256, 224));
}

}  // namespace
}  // namespace lkw::fp8
