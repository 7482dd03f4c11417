// Chapter 04 checks that need no GPU:
//   HostRowRoutine   the shared row routine's thread count holds the row in whole warps, within
//                    each path's register budget, and puts each 128-group of a row (d a multiple
//                    of 128) in one slot of one aligned half-warp (v5's group quant relies on it);
//   HostByteModels   the registered byte models are the chapter's table: 4, 8 and 7 B per element
//                    for the versions, 10 and 13 for the unfused chains (+ weight, + scales);
//   HostValidation   what the launchers must refuse before launching anything: overlaps other
//                    than the exact in-place residual, a d beyond the register budget, a 16-byte
//                    path on pointers that are not 16-byte aligned, a bad eps, bad shapes, and
//                    for the group op a d that is not a multiple of 128 or row-major scales.
#include "04_rmsnorm/norm_test.h"

namespace lkw::rmsnorm::test {
namespace {

TEST(HostRowRoutine, ThreadsHoldTheRowInWholeWarps) {
  EXPECT_EQ(RowTile<8>::kMaxD, 32768);
  EXPECT_EQ(RowTile<1>::kMaxD, 16384);
  EXPECT_EQ(row_threads(4096), 128);
  EXPECT_EQ(row_threads(8192), 256);
  EXPECT_EQ(row_threads(16384), 512);
  EXPECT_EQ(row_threads(5120), 160);
  for (int64_t d = 1; d <= 32768; ++d) {
    if (d > row_max_d(d)) continue;
    const bool vector = d % 8 == 0;
    const int64_t per_thread = vector ? 8 * RowTile<8>::kUnits : RowTile<1>::kUnits;
    const int max_threads = vector ? RowTile<8>::kMaxThreads : RowTile<1>::kMaxThreads;
    const int threads = row_threads(d);
    ASSERT_EQ(threads % 32, 0) << "d = " << d;
    ASSERT_TRUE(threads >= 32 && threads <= max_threads) << "d = " << d << ": " << threads;
    ASSERT_GE(threads * per_thread, d) << "d = " << d << ": the row does not fit";
    ASSERT_TRUE(threads == 32 || (threads - 32) * per_thread < d)
        << "d = " << d << ": " << threads << " threads, a warp more than needed";
  }
}

// Unit i of a row is slot i / threads of thread i % threads; a group is units 16g .. 16g + 15.
// Each group must lie in one slot (u < kUnits) of the 16 threads of one aligned half-warp, so that
// a half-warp shuffle (xor offsets 8, 4, 2, 1) reduces exactly that group.
TEST(HostRowRoutine, GroupsLieInOneSlotOfAnAlignedHalfWarp) {
  for (int64_t d = kGroup; d <= RowTile<8>::kMaxD; d += kGroup) {
    ASSERT_EQ(row_vec(d), 8) << "d = " << d;
    const int threads = row_threads(d);
    ASSERT_EQ(threads % 16, 0) << "d = " << d;
    for (int64_t first = 0; first < d / 8; first += 16) {
      const int64_t slot = first / threads, lane0 = first % threads;
      ASSERT_LT(slot, RowTile<8>::kUnits) << "d = " << d;
      ASSERT_EQ(lane0 % 16, 0) << "d = " << d << ", group " << first / 16;
      for (int64_t i = first; i < first + 16; ++i)
        ASSERT_TRUE(i / threads == slot && i % threads == lane0 + (i - first))
            << "d = " << d << ": unit " << i << " leaves its group's half-warp";
    }
  }
}

// Args with the op's tensors at fake, widely spaced 256-byte-aligned addresses (never launched).
Args fake(const NormOp& op, int64_t t, int64_t d, uintptr_t spacing = uintptr_t(1) << 32) {
  Args a;
  a.params["eps"] = 1e-6;
  uintptr_t next = spacing;
  auto at = [&]() { return reinterpret_cast<void*>(next += spacing); };
  a.inputs.push_back({at(), DType::kBF16, {t, d}});
  if (op.residual) a.inputs.push_back({at(), DType::kBF16, {t, d}});
  a.inputs.push_back({at(), DType::kBF16, {d}});
  for (const OutputSpec& spec : output_specs(op, t, d))
    a.outputs.push_back({at(), spec.dtype, spec.shape});
  return a;
}

TEST(HostByteModels, MatchTheChapterTable) {
  const int64_t t = 64, d = 4096;
  const double elems = double(t * d), weight = 2.0 * d, scales = 4.0 * t;
  const double group_scales = 4.0 * t * (d / kGroup);
  struct Row {
    const NormOp& op;
    const char* id;
    double bytes;
    int kernels;
  };
  const Row table[] = {
      {kRmsnorm, "v3_vec16_registers", 4 * elems + weight, 1},
      {kFusedAdd, "v4_fused_add", 8 * elems + weight, 1},
      {kFusedAdd, "chain_unfused", 10 * elems + weight, 2},
      {kFusedAddFp8, "v5_fused_add_quant", 7 * elems + weight + scales, 1},
      {kFusedAddFp8, "chain_unfused", 13 * elems + weight + scales, 3},
      {kFusedAddInt8, "v5_fused_add_quant", 7 * elems + weight + scales, 1},
      {kFusedAddInt8, "chain_unfused", 13 * elems + weight + scales, 3},
      {kFusedAddFp8Group, "v5_fused_add_quant", 7 * elems + weight + group_scales, 1},
      {kFusedAddFp8Group, "chain_unfused", 13 * elems + weight + group_scales, 3},
  };
  for (const Row& row : table) {
    const Version& v = registered(std::string(kChapter) + "/" + row.op.name + "/" + row.id);
    EXPECT_DOUBLE_EQ(v.bytes(fake(row.op, t, d)), row.bytes) << v.name();
    EXPECT_EQ(v.kernels_per_launch, row.kernels) << v.name();
  }
}

// Every version and peer (mutants too: they must be as safe) refuses each of these.
TEST(HostValidation, RefusesBeforeLaunching) {
  for (const Version* v : Registry::get().chapter(kChapter)) {
    const NormOp& op = norm_op(v->op);
    auto refused = [&](const Args& a, const char* what) {
      const Status s = v->launch(a, nullptr);
      EXPECT_EQ(s.code, Code::kInvalidArgument) << v->name() << ", " << what << ": " << s.str();
    };
    const Args good = fake(op, 4, 4096);
    Args a = good;
    a.outputs[0].data = static_cast<char*>(a.inputs[0].data) + 2 * 4096;  // inside x's row 1
    refused(a, "first output overlapping x");
    if (op.residual) {
      a = good;
      a.outputs.back().data = static_cast<char*>(a.inputs[1].data) + 16;
      refused(a, "residual_out 16 bytes into residual (in place means the same pointer)");
      a = good;
      a.outputs.back().data = a.outputs[0].data;
      refused(a, "residual_out on the first output");
    }
    a = good;
    a.params.clear();
    refused(a, "no eps");
    a = good;
    a.params["eps"] = -1e-6;
    refused(a, "negative eps");
    a = good;
    a.inputs.back().shape = {4095};
    refused(a, "weight of the wrong length");
    if (op.quant != Quant::kNone) {
      a = good;
      a.outputs[1].shape = {4, 2};
      refused(a, "scales [T, 2]");
      a = good;
      a.outputs[1].dtype = DType::kBF16;
      refused(a, "BF16 scales");
    }
    if (op.group) {
      a = good;
      a.outputs[1].shape = {4, 4096 / kGroup};
      refused(a, "row-major group scales [T, d/128]");
      for (int64_t d : {64, 200, 4160, 4096 + 8}) {
        const Status s = v->launch(fake(op, 4, d), nullptr);
        EXPECT_EQ(s.code, Code::kInvalidArgument) << v->name() << ", d = " << d << ": " << s.str();
        EXPECT_NE(s.message.find("multiple of 128"), std::string::npos)
            << v->name() << ", d = " << d << ": " << s.str();
      }
    }
    const bool row_routine = v->id != "v0_scalar" && v->id != "v1_block_tree" &&
                             v->id != "v2_warp_shuffle";  // the rest hold rows in registers
    if (row_routine) {
      refused(fake(op, 1, RowTile<8>::kMaxD + 8), "d beyond the 16-byte path's registers");
      refused(fake(op, 1, RowTile<1>::kMaxD + 1), "d beyond the single-element path's");
      a = fake(op, 4, 4096);
      for (TensorRef& in : a.inputs) in.data = static_cast<char*>(in.data) + 8;
      refused(a, "16-byte path, inputs only 8-byte aligned");
    }
    refused(fake(op, int64_t(1) << 31, 8, uintptr_t(1) << 40), "T = 2^31 (rows are blockIdx.x)");
  }
}

}  // namespace
}  // namespace lkw::rmsnorm::test
