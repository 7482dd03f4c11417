// Chapter 09 checks of the expert half (moe_grouped_gemm, moe_grouped_gemm_silu,
// moe_grouped_gemm_w4a16, moe_grouped_gemm_sum, moe_sum) beyond the golden cases:
//   HostValidation  what the launchers refuse before launching anything: N, K, d off their
//                   multiples, BLOCK_M not whole m16 tiles, expert_ids of the wrong length, out of
//                   the wrong shape or overlapping an input, a missing param; for W4A16 also a
//                   group size other than 32, 64, 128, K, scales or words of the wrong shape,
//                   dtype or alignment; and what they accept (the smallest multiples, G = K,
//                   reach the device check, not an argument error); moe_block refuses, before
//                   its first step runs, what any of its steps would refuse
//   HostDivisor     divide(n, divisor_of(d)) is n / d for every d the kernels divide by (topk,
//                   block_m) and n up to 2^31 − 1
//   HostModels      the byte model counts the routed experts' weights only (W4A16: their INT4
//                   words and scales); the FLOP model the real rows only
//   HostSplitPlan   the live tiles the host plans v10's split-K on (a uniform routing's): at
//                   decode few, so K is split; at prefill every block slot full, so it is not
//   SumVersions (GPU)  every moe_sum version writes v9's bits (the same FP32 sum in j order)
//   GroupedBadIds (GPU)  sorted ids outside 0..T·topk − 1 and expert ids outside 0..E − 1 are
//                   skipped: the launch succeeds, nothing is written past out, the rows of skipped
//                   blocks keep their poison and the valid rows are written
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "07_w4a16_gemm/gemm_plan.h"
#include "golden.h"
#include "lkw/check.h"
#include "align.cuh"
#include "experts_w4a16.cuh"

namespace lkw::moe::test {
namespace {

std::vector<const Version*> versions_of(const std::string& op) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->op == op && v->kind != Kind::kMutant) out.push_back(v);
  return out;
}

// Fake, widely spaced addresses (never launched).
void* at(int i) { return reinterpret_cast<void*>(uintptr_t(i + 1) << 36); }

Args grouped_call(bool silu, int64_t t, int64_t topk, int64_t e, int64_t n, int64_t k,
                  int64_t block_m, int64_t rows) {
  Args a;
  a.inputs = {{at(0), DType::kBF16, {t, k}},
              {at(1), DType::kBF16, {e, n, k}},
              {at(2), DType::kI32, {rows}},
              {at(3), DType::kI32, {rows / block_m}}};
  a.outputs = {{at(4), DType::kBF16, {t * topk, silu ? n / 2 : n}}};
  a.params = {{"topk", double(topk)}, {"block_m", double(block_m)}};
  return a;
}

void expect_refused(const std::string& op, const Args& a, const std::string& words) {
  const std::vector<const Version*> versions = versions_of(op);
  ASSERT_FALSE(versions.empty()) << "no version of " << op;
  for (const Version* v : versions) {
    const Status s = v->launch(a, nullptr);
    EXPECT_EQ(s.code, Code::kInvalidArgument) << v->name() << ": " << s.str();
    EXPECT_NE(s.message.find(words), std::string::npos) << v->name() << ": " << s.str();
  }
}

// A shape the kernels take gets past every argument check: without a device the launcher stops
// at the device check, with one it launches (here on fake addresses, so never with one).
void expect_accepted(const std::string& op, const Args& a) {
  if (has_device()) return;
  for (const Version* v : versions_of(op)) {
    const Status s = v->launch(a, nullptr);
    EXPECT_NE(s.code, Code::kInvalidArgument) << v->name() << ": " << s.str();
  }
}

TEST(HostValidation, GroupedGemmRefusesWhatItCannotTile) {
  for (bool silu : {false, true}) {
    const std::string op = silu ? kGroupedSiluOp : kGroupedOp;
    const int64_t piece = silu ? 16 : 8;
    expect_accepted(op, grouped_call(silu, 1, 8, 60, piece, 8, 16, 16 * 61));
    expect_accepted(op, grouped_call(silu, 5, 1, 3, 200 * piece / 8, 136, 48, 96));
    expect_refused(op, grouped_call(silu, 4, 2, 8, piece + 4, 64, 16, 64),
                   "must be a multiple of " + std::to_string(piece));
    expect_refused(op, grouped_call(silu, 4, 2, 8, 64, 12, 16, 64), "K = 12");
    expect_refused(op, grouped_call(silu, 4, 2, 8, 64, 64, 8, 64), "block_m = 8");
    expect_refused(op, grouped_call(silu, 4, 2, 8, 64, 64, 24, 48), "block_m = 24");
    Args a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.inputs[3].shape = {5};
    expect_refused(op, a, "expert_ids");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.outputs[0].shape = {8, 72};
    expect_refused(op, a, "out must be");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.outputs[0].shape = {9, a.outputs[0].shape[1]};
    expect_refused(op, a, "out must be");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.inputs[1].shape = {8, 64, 72};
    expect_refused(op, a, "disagree on K");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.params.erase("topk");
    expect_refused(op, a, "topk");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.outputs[0].data = static_cast<char*>(a.inputs[0].data) + 64;  // inside x
    expect_refused(op, a, "overlap");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.inputs[2].dtype = DType::kI64;
    expect_refused(op, a, "int32");
    a = grouped_call(silu, 4, 2, 8, 64, 64, 16, 64);
    a.inputs[0].data = static_cast<char*>(a.inputs[0].data) + 8;  // 8-byte aligned only
    expect_refused(op, a, "16-byte aligned");
  }
}

// moe_grouped_gemm_w4a16's arguments: x [T, K], w [E, N/64, 8K], scales [E, K/G, N], the ids.
Args w4a16_call(int64_t t, int64_t topk, int64_t e, int64_t n, int64_t k, int64_t g,
                int64_t block_m, int64_t rows) {
  Args a;
  a.inputs = {{at(0), DType::kBF16, {t, k}},
              {at(1), DType::kU32, {e, n / 64, 8 * k}},
              {at(5), DType::kBF16, {e, k / g, n}},
              {at(2), DType::kI32, {rows}},
              {at(3), DType::kI32, {rows / block_m}}};
  a.outputs = {{at(4), DType::kBF16, {t * topk, n}}};
  a.params = {{"topk", double(topk)}, {"block_m", double(block_m)}};
  return a;
}

TEST(HostValidation, GroupedW4a16RefusesWhatItCannotTile) {
  const std::string op = kGroupedW4a16Op;
  expect_accepted(op, w4a16_call(1, 8, 60, 64, 128, 32, 16, 16 * 61));
  expect_accepted(op, w4a16_call(5, 1, 3, 192, 352, 352, 48, 96));  // G = K, K % 64 == 32
  expect_accepted(op, w4a16_call(64, 8, 60, 320, 2048, 128, 64, 64 * 68));
  expect_refused(op, w4a16_call(4, 2, 8, 96, 128, 32, 16, 64), "must be a multiple of 64");
  expect_refused(op, w4a16_call(4, 2, 8, 64, 48, 48, 16, 64), "K = 48");
  expect_refused(op, w4a16_call(4, 2, 8, 64, 256, 16, 16, 64), "group size");
  expect_refused(op, w4a16_call(4, 2, 8, 64, 64, 64, 8, 64), "block_m = 8");
  Args a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[2].shape = {8, 3, 64};  // K/G = 3 does not divide K = 256
  expect_refused(op, a, "scales must be [E, K/G, N]");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[1].shape = {8, 1, 256 / 8};  // natural [N, K/8]-sized rows, not repacked
  expect_refused(op, a, "w must be repacked words");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[1].shape = {7, 1, 8 * 256};  // one expert fewer than the scales
  expect_refused(op, a, "w must be repacked words");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[1].dtype = DType::kBF16;
  expect_refused(op, a, "uint32");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[2].shape = {8, 64};
  expect_refused(op, a, "scales are bfloat16 [E, K/G, N]");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs.pop_back();
  expect_refused(op, a, "takes x, w, scales");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.params.erase("block_m");
  expect_refused(op, a, "block_m");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[4].shape = {5};
  expect_refused(op, a, "expert_ids");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.outputs[0].shape = {8, 128};
  expect_refused(op, a, "out must be");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.outputs[0].data = static_cast<char*>(a.inputs[1].data) + 256;  // inside w
  expect_refused(op, a, "out and w must not overlap");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.outputs[0].data = static_cast<char*>(a.inputs[2].data) + 256;  // inside the scales
  expect_refused(op, a, "out and scales must not overlap");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[2].data = static_cast<char*>(a.inputs[2].data) + 8;
  expect_refused(op, a, "scales must be 16-byte aligned");
  a = w4a16_call(4, 2, 8, 64, 256, 64, 16, 64);
  a.inputs[1].data = static_cast<char*>(a.inputs[1].data) + 4;
  expect_refused(op, a, "w must be 16-byte aligned");
}

Args sum_call(int64_t t, int64_t k, int64_t d) {
  Args a;
  a.inputs = {{at(0), DType::kBF16, {t, k, d}}, {at(1), DType::kF32, {t, k}}};
  a.outputs = {{at(2), DType::kBF16, {t, d}}};
  return a;
}

// moe_grouped_gemm_sum's arguments: h [T·topk, K] (a row per slot), w, the ids, topk_weights
// [T, topk] → out [T, N].
Args grouped_sum_call(int64_t t, int64_t topk, int64_t e, int64_t n, int64_t k, int64_t block_m,
                      int64_t rows) {
  Args a;
  a.inputs = {{at(0), DType::kBF16, {t * topk, k}},
              {at(1), DType::kBF16, {e, n, k}},
              {at(2), DType::kI32, {rows}},
              {at(3), DType::kI32, {rows / block_m}},
              {at(5), DType::kF32, {t, topk}}};
  a.outputs = {{at(4), DType::kBF16, {t, n}}};
  a.params = {{"block_m", double(block_m)}};
  return a;
}

TEST(HostValidation, GroupedSumRefusesWhatItCannotTile) {
  expect_accepted(kGroupedSumOp, grouped_sum_call(1, 8, 60, 8, 8, 16, 16 * 61));
  expect_accepted(kGroupedSumOp, grouped_sum_call(33, 4, 60, 200, 136, 16, 16 * 70));
  expect_refused(kGroupedSumOp, grouped_sum_call(4, 2, 8, 12, 64, 16, 64), "multiples of 8");
  expect_refused(kGroupedSumOp, grouped_sum_call(4, 2, 8, 64, 12, 16, 64), "multiples of 8");
  expect_refused(kGroupedSumOp, grouped_sum_call(4, 2, 8, 64, 64, 24, 48), "block_m = 24");
  Args a = grouped_sum_call(4, 2, 8, 64, 64, 16, 64);
  a.inputs[0].shape = {4, 64};  // a row per token, not per slot
  expect_refused(kGroupedSumOp, a, "a row per slot");
  a = grouped_sum_call(4, 2, 8, 64, 64, 16, 64);
  a.outputs[0].shape = {8, 64};  // a row per slot, not per token
  expect_refused(kGroupedSumOp, a, "out must be [T, N]");
  a = grouped_sum_call(4, 2, 8, 64, 64, 16, 64);
  a.inputs[4].dtype = DType::kBF16;
  expect_refused(kGroupedSumOp, a, "topk_weights is float32");
  a = grouped_sum_call(4, 2, 8, 64, 64, 16, 64);
  a.params.erase("block_m");
  expect_refused(kGroupedSumOp, a, "block_m");
  a = grouped_sum_call(4, 2, 8, 64, 64, 16, 64);
  a.inputs[3].shape = {5};
  expect_refused(kGroupedSumOp, a, "expert_ids");
  a = grouped_sum_call(4, 2, 8, 64, 64, 16, 64);
  a.outputs[0].data = static_cast<char*>(a.inputs[4].data) + 16;  // inside topk_weights
  expect_refused(kGroupedSumOp, a, "overlap");
}

TEST(HostValidation, MoeSumRefusesRowsItCannotVectorize) {
  expect_accepted(kSumOp, sum_call(1, 8, 7168));
  expect_accepted(kSumOp, sum_call(37, 1, 8));
  expect_refused(kSumOp, sum_call(4, 2, 12), "d = 12");
  Args a = sum_call(4, 2, 64);
  a.inputs[1].shape = {4, 3};
  expect_refused(kSumOp, a, "topk_weights");
  a = sum_call(4, 2, 64);
  a.outputs[0].shape = {4, 72};
  expect_refused(kSumOp, a, "out must be");
  a = sum_call(4, 2, 64);
  a.outputs[0].data = static_cast<char*>(a.inputs[0].data) + 256;  // inside y
  expect_refused(kSumOp, a, "overlap");
}

Args block_call(int64_t t, int64_t topk, int64_t e, int64_t d, int64_t d_ff) {
  Args a;
  a.inputs = {{at(0), DType::kBF16, {t, d}},
              {at(1), DType::kF32, {t, e}},
              {at(2), DType::kBF16, {e, 2 * d_ff, d}},
              {at(3), DType::kBF16, {e, d, d_ff}}};
  a.outputs = {{at(4), DType::kBF16, {t, d}}};
  a.params = {{"topk", double(topk)}, {"renormalize", 1.0}};
  return a;
}

TEST(HostValidation, MoeBlockRefusesBeforeItsFirstStep) {
  expect_refused("moe_block", block_call(4, 9, 8, 64, 32), "topk");          // topk > E
  expect_refused("moe_block", block_call(4, 2, 600, 64, 32), "1..512");      // top-k v6's E
  expect_refused("moe_block", block_call(4, 2, 8, 60, 32), "multiples of 8");
  expect_refused("moe_block", block_call(4, 2, 8, 64, 36), "multiples of 8");
  Args a = block_call(4, 2, 8, 64, 32);
  a.inputs[3].shape = {8, 64, 40};  // w_down's d_ff differs from w_gate_up's
  expect_refused("moe_block", a, "w_gate_up must be");
  a = block_call(4, 2, 8, 64, 32);
  a.params["block_m"] = 24;
  expect_refused("moe_block", a, "block_m");
  a = block_call(4, 2, 8, 64, 32);
  a.outputs[0].data = static_cast<char*>(a.inputs[0].data) + 64;  // inside x
  expect_refused("moe_block", a, "y and x");
  expect_accepted("moe_block", block_call(4, 2, 8, 64, 32));
}

TEST(HostModels, GroupedBytesCountTheRoutedExpertsOnly) {
  const int64_t t = 16, topk = 8, e = 256, n = 4096, k = 7168, block_m = 16;
  const int64_t rows = align_capacity(t * topk, e, block_m);
  Args a = grouped_call(false, t, topk, e, n, k, block_m, rows);
  const double fixed = 2.0 * t * k + 4.0 * rows + 4.0 * (rows / block_m) + 2.0 * t * topk * n;
  for (const Version* v : versions_of(kGroupedOp)) {
    // No routed_experts: at most T·topk = 128 experts are touched, not all 256.
    EXPECT_DOUBLE_EQ(v->bytes(a), fixed + 128.0 * 2 * n * k) << v->name();
    a.params["routed_experts"] = 37;
    EXPECT_DOUBLE_EQ(v->bytes(a), fixed + 37.0 * 2 * n * k) << v->name();
    a.params.erase("routed_experts");
    EXPECT_DOUBLE_EQ(v->flops(a), 2.0 * t * topk * n * k) << v->name();
  }
  const Args silu = grouped_call(true, 1, 2, 4, n, k, block_m, 64);  // T·topk = 2 < E
  for (const Version* v : versions_of(kGroupedSiluOp))
    EXPECT_DOUBLE_EQ(v->bytes(silu), 2.0 * k + 4.0 * 64 + 4.0 * 4 + 2.0 * 2 * (n / 2) +
                                         2.0 * 2 * n * k)
        << v->name();
}

TEST(HostModels, GroupedSumBytesCountOneRowPerTokenOut) {
  const int64_t t = 16, topk = 8, e = 256, n = 7168, k = 2048, block_m = 16;
  const int64_t rows = align_capacity(t * topk, e, block_m);
  const Args a = grouped_sum_call(t, topk, e, n, k, block_m, rows);
  const double fixed =
      2.0 * t * topk * k + 4.0 * rows + 4.0 * (rows / block_m) + 4.0 * t * topk + 2.0 * t * n;
  for (const Version* v : versions_of(kGroupedSumOp)) {
    EXPECT_DOUBLE_EQ(v->bytes(a), fixed + 128.0 * 2 * n * k) << v->name();
    EXPECT_DOUBLE_EQ(v->flops(a), 2.0 * t * topk * n * k) << v->name();
  }
}

TEST(HostDivisor, MultiplyAndShiftIsTheIntegerQuotient) {
  std::mt19937 rng(lkw::test::random_seed("HostDivisor"));
  std::uniform_int_distribution<int> any(0, INT_MAX);
  std::vector<int> divisors;
  for (int d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int d : {4095, 4096, 4097, 65535, 99991, (1 << 20) - 1, 1 << 20}) divisors.push_back(d);
  for (int d : divisors) {
    const Divisor div = divisor_of(d);
    for (int n :
         {0, 1, d - 1, d, d + 1, INT_MAX - 1, INT_MAX, INT_MAX / d * d, INT_MAX / d * d - 1})
      ASSERT_EQ(divide(n, div), n / d) << n << " / " << d;
    for (int i = 0; i < 2000; ++i) {
      const int n = any(rng);
      ASSERT_EQ(divide(n, div), n / d) << n << " / " << d;
    }
  }
}

TEST(HostSplitPlan, DecodeSplitsKAndPrefillDoesNot) {
  // (T, topk, E, tile rows, N tiles): min(E, T·topk) experts, ceil(T·topk / that) rows each.
  EXPECT_EQ(uniform_live_tiles(1, 2, 8, 16, 16), 2 * 16);         // Mixtral down, T = 1
  EXPECT_EQ(uniform_live_tiles(64, 2, 8, 16, 112), 8 * 1 * 112);  // 16 rows an expert: one tile
  EXPECT_EQ(uniform_live_tiles(64, 2, 8, 16, 16), 8 * 16);
  EXPECT_EQ(uniform_live_tiles(17, 2, 8, 16, 1), 8 * 1);   // 34 rows: 5 an expert, one tile
  EXPECT_EQ(uniform_live_tiles(72, 2, 8, 16, 1), 8 * 2);   // 18 rows an expert: two tiles
  EXPECT_EQ(uniform_live_tiles(64, 8, 256, 16, 28), 256 * 28);  // T·topk = 2E: 2 rows an expert
  EXPECT_EQ(uniform_live_tiles(4096, 8, 256, 64, 28), 256 * 2 * 28);
  EXPECT_EQ(uniform_live_tiles(0, 8, 256, 16, 28), 0);
  // Chapter 07's rule on them, 132 SMs holding 4 blocks each: Mixtral's down GEMM (K = 14336,
  // 224 stages) at T = 1 splits K in 16 (528 slots / 32 tiles); at T = 64 in 4; its gate_up
  // (N = 28672: 112 tiles an expert) at T = 64 fills the slots alone; DeepSeek at T = 4096 too.
  EXPECT_EQ(w4a16::splits_for(uniform_live_tiles(1, 2, 8, 16, 16), 224, 132, 4), 16);
  EXPECT_EQ(w4a16::splits_for(uniform_live_tiles(64, 2, 8, 16, 16), 224, 132, 4), 4);
  EXPECT_EQ(w4a16::splits_for(uniform_live_tiles(64, 2, 8, 16, 112), 64, 132, 4), 1);
  EXPECT_EQ(w4a16::splits_for(uniform_live_tiles(4096, 8, 256, 64, 28), 112, 132, 2), 1);
}

TEST(HostModels, GroupedW4a16BytesCountTheRoutedExpertsInt4WordsAndScales) {
  const int64_t t = 16, topk = 8, e = 256, n = 4096, k = 7168, g = 128, block_m = 16;
  const int64_t rows = align_capacity(t * topk, e, block_m);
  Args a = w4a16_call(t, topk, e, n, k, g, block_m, rows);
  const double fixed = 2.0 * t * k + 4.0 * rows + 4.0 * (rows / block_m) + 2.0 * t * topk * n;
  const double per_expert = 0.5 * n * k + 2.0 * n * (k / g);  // 0.5 byte a weight + its scales
  for (const Version* v : versions_of(kGroupedW4a16Op)) {
    EXPECT_DOUBLE_EQ(v->bytes(a), fixed + 128.0 * per_expert) << v->name();
    a.params["routed_experts"] = 37;
    EXPECT_DOUBLE_EQ(v->bytes(a), fixed + 37.0 * per_expert) << v->name();
    a.params.erase("routed_experts");
    EXPECT_DOUBLE_EQ(v->flops(a), 2.0 * t * topk * n * k) << v->name();
  }
}

// ---------------------------------------------------------------------------------------------
// GroupedBadIds (GPU)

TEST(GroupedBadIds, AreSkippedAndNothingIsWrittenOutOfBounds) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  const int64_t t = 4, topk = 2, e = 3, k = 64, block_m = 16, rows = 3 * block_m;
  const int32_t sentinel = int32_t(t * topk);
  std::mt19937 rng(lkw::test::random_seed("GroupedBadIds"));
  std::normal_distribution<float> normal;
  for (bool silu : {false, true}) {
    const int64_t n = 32, out_n = silu ? n / 2 : n;
    std::vector<__nv_bfloat16> x(t * k), w(e * n * k);
    for (auto& v : x) v = __float2bfloat16(normal(rng));
    for (auto& v : w) v = __float2bfloat16(normal(rng));
    // Block 0 (expert 1): slots 0, 3, 5, 7 among the sentinel and ids that name no slot. Block 1
    // (expert id E) holds slots 1 and 2, block 2 (expert id −2) slots 4 and 6: both skipped.
    std::vector<int32_t> sorted(rows, sentinel);
    const std::vector<int32_t> block0 = {0, -5, 3, sentinel + 7, INT_MAX, 5, INT_MIN, 7};
    std::copy(block0.begin(), block0.end(), sorted.begin());
    sorted[block_m] = 1, sorted[block_m + 1] = 2, sorted[2 * block_m] = 4;
    sorted[2 * block_m + 1] = 6;
    const std::vector<int32_t> experts = {1, int32_t(e), -2};
    DeviceBuffer x_gl(2 * x.size()), w_gl(2 * w.size()), sorted_gl(4 * rows), experts_gl(12),
        out_gl(2 * t * topk * out_n);
    x_gl.upload(x.data());
    w_gl.upload(w.data());
    sorted_gl.upload(sorted.data());
    experts_gl.upload(experts.data());
    Args a = grouped_call(silu, t, topk, e, n, k, block_m, rows);
    a.inputs[0].data = x_gl.data();
    a.inputs[1].data = w_gl.data();
    a.inputs[2].data = sorted_gl.data();
    a.inputs[3].data = experts_gl.data();
    a.outputs[0].data = out_gl.data();
    for (const Version* v : versions_of(silu ? kGroupedSiluOp : kGroupedOp)) {
      out_gl.poison(0xFF);
      const Status s = v->launch(a, nullptr);
      LKW_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(s.ok()) << v->name() << ": " << s.str();
      EXPECT_TRUE(out_gl.guard_intact()) << v->name() << ": wrote past the end of out";
      std::vector<uint16_t> got(t * topk * out_n);
      out_gl.download(got.data());
      for (int64_t slot = 0; slot < t * topk; ++slot) {
        const bool routed = slot == 0 || slot == 3 || slot == 5 || slot == 7;
        for (int64_t c = 0; c < out_n; ++c) {
          const uint16_t bits = got[slot * out_n + c];
          if (!routed) {
            ASSERT_EQ(bits, 0xFFFF) << v->name() << ": slot " << slot << " of a skipped block";
            continue;
          }
          double gate = 0, up = 0;  // expert 1's row c (and row c + N/2) times x[slot / topk]
          for (int64_t i = 0; i < k; ++i) {
            const double xi = __bfloat162float(x[(slot / topk) * k + i]);
            gate += xi * __bfloat162float(w[(1 * n + c) * k + i]);
            if (silu) up += xi * __bfloat162float(w[(1 * n + c + n / 2) * k + i]);
          }
          const double ref = silu ? gate / (1 + std::exp(-gate)) * up : gate;
          __nv_bfloat16 value;
          std::memcpy(&value, &bits, 2);
          // A BF16 rounding of an FP32 sum of 64 products of normals (each row's sums stay
          // below ~64 in size; silu · up below ~64²): 2^-7 relative and 1e-3 absolute.
          EXPECT_NEAR(__bfloat162float(value), ref, 1e-3 + std::abs(ref) / 128)
              << v->name() << ": slot " << slot << ", column " << c;
        }
      }
    }
  }
}

// v11 keeps v9's arithmetic (FP32 fused multiply-adds in j order, one rounding): on fresh random
// rows at decode and prefill shapes, k up to 10 (two of v11's load batches), every version of
// moe_sum writes the same bits as v9.
TEST(SumVersions, AgreeBitForBitWithV9) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(lkw::test::random_seed("SumVersions"));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  const Version* v9 = Registry::get().find(std::string(kChapter) + "/" + kSumOp + "/v9_sum_vec16");
  ASSERT_NE(v9, nullptr);
  for (const auto& [t, k, d] : {std::tuple<int64_t, int, int64_t>{1, 8, 7168}, {16, 2, 4096},
                                {37, 10, 2056}, {300, 1, 8}}) {
    std::vector<__nv_bfloat16> y(t * k * d);
    std::vector<float> w(t * k);
    for (auto& v : y) v = __float2bfloat16(normal(rng));
    for (auto& v : w) v = uniform(rng);
    DeviceBuffer y_gl(2 * y.size()), w_gl(4 * w.size()), out_gl(2 * t * d);
    y_gl.upload(y.data());
    w_gl.upload(w.data());
    Args a;
    a.inputs = {{y_gl.data(), DType::kBF16, {t, k, d}}, {w_gl.data(), DType::kF32, {t, k}}};
    a.outputs = {{out_gl.data(), DType::kBF16, {t, d}}};
    std::vector<uint16_t> want(t * d), got(t * d);
    out_gl.poison(0xFF);
    ASSERT_TRUE(v9->launch(a, nullptr).ok());
    LKW_CUDA_CHECK(cudaDeviceSynchronize());
    out_gl.download(want.data());
    for (const Version* v : versions_of(kSumOp)) {
      out_gl.poison(0x3C);
      const Status s = v->launch(a, nullptr);
      LKW_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_TRUE(s.ok()) << v->name() << ": " << s.str();
      EXPECT_TRUE(out_gl.guard_intact()) << v->name() << ": wrote past the end of out";
      out_gl.download(got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), 2 * got.size()), 0)
          << v->name() << " differs from v9 at T = " << t << ", k = " << k << ", d = " << d;
    }
  }
}

}  // namespace
}  // namespace lkw::moe::test
