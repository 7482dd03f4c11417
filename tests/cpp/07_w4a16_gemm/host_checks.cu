// Chapter 07 checks that need no GPU: the refusals the generic Validation suite does not reach
// (N not a multiple of 64, K not a multiple of 32, group sizes, the layouts' shapes, alignment,
// an output overlapping an input, zero points of the wrong kind) and the byte model the bench
// divides by, zero points included.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gemm_plan.h"
#include "lkw/tma.h"
#include "w4a16_gemm.cuh"

namespace lkw::w4a16 {
namespace {

// Fake device addresses, far apart and 256-byte aligned: every call below must be refused before
// the launcher looks at the device.
struct Fake {
  uintptr_t x = 0x1000000, w = 0x10000000, scales = 0x20000000, y = 0x40000000, zeros = 0x30000000;
};

// x, w, scales (and zeros uint8 [K/G, N] with `zeros`) -> y, at the fake addresses.
Args fake_args(const GemmOp& op, int64_t m, int64_t n, int64_t k, int64_t g, Fake at = {},
               bool zeros = false) {
  Args a;
  a.inputs.push_back({reinterpret_cast<void*>(at.x), DType::kBF16, {m, k}});
  if (op.repacked)
    a.inputs.push_back({reinterpret_cast<void*>(at.w), DType::kU32, {n / 64, 8 * k}});
  else
    a.inputs.push_back({reinterpret_cast<void*>(at.w), DType::kU32, {n, k / 8}});
  a.inputs.push_back({reinterpret_cast<void*>(at.scales), DType::kBF16, {k / g, n}});
  if (zeros) a.inputs.push_back({reinterpret_cast<void*>(at.zeros), DType::kU8, {k / g, n}});
  a.outputs.push_back({reinterpret_cast<void*>(at.y), DType::kBF16, {m, n}});
  return a;
}

std::vector<const Version*> versions_of(const GemmOp& op) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->op == op.name) out.push_back(v);
  return out;
}

const std::vector<const GemmOp*> kOps = {&kW4a16Gemm, &kW4a16rGemm};

void expect_refused(const Version& v, const Args& a, const std::string& words) {
  const Status s = v.launch(a, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << v.name() << ": " << s.str();
  EXPECT_NE(s.message.find(words), std::string::npos)
      << v.name() << ": message \"" << s.message << "\" lacks \"" << words << "\"";
}

TEST(HostValidation, EveryOpHasVersions) {
  for (const GemmOp* op : kOps) EXPECT_FALSE(versions_of(*op).empty()) << op->name;
}

TEST(HostValidation, NMustBeAMultipleOf64) {
  for (const Version* v : versions_of(kW4a16Gemm))
    expect_refused(*v, fake_args(kW4a16Gemm, 4, 100, 1024, 128), "must be a multiple of 64");
  // The repacked layout cannot even hold N = 100; its shape check says so.
  for (const Version* v : versions_of(kW4a16rGemm)) {
    Args a = fake_args(kW4a16rGemm, 4, 128, 1024, 128);
    a.inputs[2].shape = {8, 100};
    a.outputs[0].shape = {4, 100};
    expect_refused(*v, a, "w must be repacked [N/64, 8K] words");
  }
}

TEST(HostValidation, KMustBeAMultipleOf32AndOfG) {
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      expect_refused(*v, fake_args(*op, 1, 64, 1040, 1040), "must be a multiple of 32");  // G = K
      expect_refused(*v, fake_args(*op, 1, 64, 1056, 1056 / 8), "group size");              // G = 132
    }
}

TEST(HostValidation, GroupSizesOtherThan32To128OrKAreRefused) {
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      expect_refused(*v, fake_args(*op, 1, 64, 2048, 256), "group size must be 32, 64, 128 or K");
      expect_refused(*v, fake_args(*op, 1, 64, 2048, 16), "group size must be 32, 64, 128 or K");
    }
}

TEST(HostValidation, PerChannelScalesAreAccepted) {
  // G = K passes the group checks: y misaligned is then the first complaint (checked after the
  // group size), so nothing is launched on the fake addresses where there is a GPU.
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      Fake at;
      at.y += 2;
      expect_refused(*v, fake_args(*op, 1, 64, 4096, 4096, at), "y must be 16-byte aligned");
    }
}

TEST(HostValidation, MisalignedOrOverlappingTensorsAreRefused) {
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      Fake at;
      at.w += 4;  // aligned for words, not for the 16-byte copies
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, at), "w must be 16-byte aligned");
      Fake over;
      over.y = over.x + 64;  // y inside x
      expect_refused(*v, fake_args(*op, 2, 64, 1024, 128, over), "y and x");
    }
}

TEST(HostValidation, ScalesMustBeGroupMajor) {
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      Args a = fake_args(*op, 2, 128, 1024, 128);
      a.inputs[2].shape = {128, 8};  // chapter 06's [N, K/G]: N read as 8, y disagrees
      expect_refused(*v, a, "must be");
    }
}

// Zero points are an optional fourth input, uint8 [K/G, N] like the scales: anything else is
// refused with a message that names them, before any launch.
TEST(HostValidation, ZeroPointsOfTheWrongKindAreRefused) {
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      Args a = fake_args(*op, 2, 128, 1024, 128, {}, true);
      a.inputs[3].dtype = DType::kBF16;
      expect_refused(*v, a, "zeros must be uint8");
      a = fake_args(*op, 2, 128, 1024, 128, {}, true);
      a.inputs[3].shape = {128, 8};  // [N, K/G], chapter 06's scale layout
      expect_refused(*v, a, "zeros must be [K/G, N]");
      a = fake_args(*op, 2, 128, 1024, 128, {}, true);
      a.inputs[3].shape = {8, 128 / 8};  // packed 8 to a word, as checkpoints ship them
      expect_refused(*v, a, "zeros must be [K/G, N]");
      a = fake_args(*op, 2, 128, 1024, 128, {}, true);
      a.inputs[3].data = nullptr;  // present but null: never read as "no zero points"
      expect_refused(*v, a, "zeros is a null pointer");
      Fake at;
      at.zeros += 8;
      expect_refused(*v, fake_args(*op, 2, 128, 1024, 128, at, true),
                     "zeros must be 16-byte aligned");
      Fake over;
      over.zeros = over.y + 64;  // zeros inside y
      expect_refused(*v, fake_args(*op, 2, 128, 1024, 128, over, true), "y and zeros");
      a = fake_args(*op, 2, 128, 1024, 128, {}, true);
      a.inputs.push_back(a.inputs[3]);
      expect_refused(*v, a, "takes 3 or 4 inputs (x, w, scales[, zeros])");
    }
}

// Bytes = N·K/2 + N·K/G·2 + M·K·2 + M·N·2: each tensor once, the roofline minimum.
TEST(HostModel, BytesCountEveryTensorOnce) {
  const int64_t m = 16, n = 4096, k = 8192, g = 128;
  for (const GemmOp* op : kOps)
    for (const Version* v : versions_of(*op)) {
      const double want = n * k / 2.0 + n * (k / g) * 2.0 + m * k * 2.0 + m * n * 2.0;
      EXPECT_DOUBLE_EQ(v->bytes(fake_args(*op, m, n, k, g)), want) << v->name();
      EXPECT_DOUBLE_EQ(v->flops(fake_args(*op, m, n, k, g)), 2.0 * m * n * k) << v->name();
      // Zero points add N·K/G bytes (one a byte), and no FLOPs: they only change the unpack's bias.
      const Args with_zeros = fake_args(*op, m, n, k, g, {}, true);
      EXPECT_DOUBLE_EQ(v->bytes(with_zeros), want + n * (k / g)) << v->name();
      EXPECT_DOUBLE_EQ(v->flops(with_zeros), 2.0 * m * n * k) << v->name();
    }
}

// The unpack's bias for zero point z is the BF16 pair (128 + z, 128 + z); z = 8 is chapter 02's
// symmetric constant 136, so a launch without zero points does the same arithmetic as before.
TEST(HostModel, ZeroPointBiasIsTheMagicPlusZ) {
  EXPECT_EQ(zero_bias(8), kBias8);
  EXPECT_EQ(zero_bias(0), 0x43004300u);
  EXPECT_EQ(zero_bias(15), 0x430f430fu);
}

TEST(HostModel, MTilesGrowWithM) {
  EXPECT_EQ(m_tiles_for(1), 1);
  EXPECT_EQ(m_tiles_for(16), 1);
  EXPECT_EQ(m_tiles_for(17), 2);
  EXPECT_EQ(m_tiles_for(32), 2);
  EXPECT_EQ(m_tiles_for(33), 4);
  EXPECT_EQ(m_tiles_for(4096), 4);
}

TEST(HostPlan, SplitsOnlyWhereTheTilesLeaveSlotsIdle) {
  EXPECT_EQ(splits_for(7168, 128, 132, 2), 1);    // M = 4096, N = 28672: the tiles fill the GPU
  EXPECT_EQ(splits_for(112, 128, 132, 3), 3);     // M = 1, N = 28672, K = 8192: 336 of 396 slots
  EXPECT_EQ(splits_for(32, 448, 132, 3), 12);     // M = 1, N = 8192, K = 28672
  EXPECT_EQ(splits_for(1, 8, 132, 3), 2);         // a short K keeps ≥ 4 stages per split
  EXPECT_EQ(splits_for(1, 3, 132, 3), 1);
  EXPECT_EQ(splits_for(10, 1000, 132, 0), 13);    // an occupancy of 0 counts as 1
}

TEST(HostPlan, SplitRangesCoverEveryStageOnce) {
  for (int64_t k_tiles : {1, 4, 7, 128, 449})
    for (int splits : {1, 2, 3, 12, 13}) {
      if (splits > k_tiles) continue;
      const SplitCut cut = split_cut(k_tiles, splits);
      int64_t next = 0;
      for (int s = 0; s < splits; ++s) {
        int64_t b, e;
        split_range(cut, s, &b, &e);
        EXPECT_EQ(b, next) << k_tiles << " / " << splits << " split " << s;
        EXPECT_GE(e - b, k_tiles / splits);
        EXPECT_LE(e - b, k_tiles / splits + 1);
        next = e;
      }
      EXPECT_EQ(next, k_tiles) << k_tiles << " / " << splits;
    }
}

// v6 reads x, the words and the scales through tensor maps: what TMA cannot take is refused
// before the driver is asked (no GPU needed).
TEST(HostTensorMap, WhatTmaCannotTakeIsRefused) {
  CUtensorMap map;
  const auto* base = reinterpret_cast<const void*>(uintptr_t(0x10000000));
  const auto refused = [&](const void* at, int64_t rows, int64_t cols, int box_rows, int box_cols,
                           CUtensorMapSwizzle swizzle) {
    return tensor_map_2d(&map, at, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, cols, box_rows,
                         box_cols, swizzle)
               .code == Code::kInvalidArgument;
  };
  const auto none = CU_TENSOR_MAP_SWIZZLE_NONE, sw128 = CU_TENSOR_MAP_SWIZZLE_128B;
  EXPECT_TRUE(refused(reinterpret_cast<const char*>(base) + 8, 16, 64, 16, 64, none));  // base
  EXPECT_TRUE(refused(base, 16, 60, 16, 60, none));     // a 120-byte row pitch
  EXPECT_TRUE(refused(base, 16, 64, 257, 64, none));    // a box side over 256
  EXPECT_TRUE(refused(base, 0, 64, 16, 64, none));      // empty
  EXPECT_TRUE(refused(base, 16, 128, 16, 128, sw128));  // 256 bytes across a 128-byte swizzle
  EXPECT_FALSE(refused(base, 16, 64, 16, 64, sw128));   // x's box in v6
}

}  // namespace
}  // namespace lkw::w4a16
