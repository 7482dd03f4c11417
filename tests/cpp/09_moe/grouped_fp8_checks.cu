// Chapter 09 checks of the FP8 grouped GEMMs (moe_grouped_gemm_fp8, _silu_fp8, _sum_fp8) beyond
// the golden cases:
//   HostValidation  what the launchers refuse before launching anything: scales of the wrong
//                   shape (x_scales row-major or per token, w_scales of one expert or with K/128
//                   and N/128 swapped) or dtype, K off 128, N off 16, out of the wrong shape or
//                   overlapping a scale tensor, a missing input or param; and what they accept
//                   (the smallest shapes, N ending inside a scale block) reaches the device check
//   HostModels      the byte model counts x, its scales and the routed experts' FP8 weights and
//                   block scales once; the FLOP model the real rows only
#include <gtest/gtest.h>

#include <string>

#include "experts_fp8.cuh"
#include "golden.h"
#include "lkw/check.h"

namespace lkw::moe::test {
namespace {

std::vector<const Version*> fp8_versions_of(const std::string& op) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->op == op && v->kind != Kind::kMutant) out.push_back(v);
  return out;
}

void* fake(int i) { return reinterpret_cast<void*>(uintptr_t(i + 1) << 36); }  // never launched

// The op's arguments for T tokens: x [T, K] (sum: [T·topk, K]) and x_scales [K/128, rows of x],
// w [E, N, K], w_scales [E, ceil(N/128), K/128], the ids (rows of them), topk_weights for sum.
Args fp8_call(Fp8Epilogue epi, int64_t t, int64_t topk, int64_t e, int64_t n, int64_t k,
              int64_t block_m, int64_t rows) {
  const bool sum = epi == Fp8Epilogue::kSum;
  const int64_t x_rows = sum ? t * topk : t, kb = k / 128, nb = (n + 127) / 128;
  Args a;
  a.inputs = {{fake(0), DType::kE4M3, {x_rows, k}},     {fake(1), DType::kE4M3, {e, n, k}},
              {fake(2), DType::kF32, {kb, x_rows}},     {fake(3), DType::kF32, {e, nb, kb}},
              {fake(4), DType::kI32, {rows}},           {fake(5), DType::kI32, {rows / block_m}}};
  if (sum) a.inputs.push_back({fake(6), DType::kF32, {t, topk}});
  const int64_t out_n = epi == Fp8Epilogue::kSilu ? n / 2 : n;
  a.outputs = {{fake(7), DType::kBF16, {sum ? t : t * topk, out_n}}};
  a.params = {{"block_m", double(block_m)}};
  if (!sum) a.params["topk"] = double(topk);
  return a;
}

void expect_fp8_refused(const std::string& op, const Args& a, const std::string& words) {
  const std::vector<const Version*> versions = fp8_versions_of(op);
  ASSERT_FALSE(versions.empty()) << "no version of " << op;
  for (const Version* v : versions) {
    const Status s = v->launch(a, nullptr);
    EXPECT_EQ(s.code, Code::kInvalidArgument) << v->name() << ": " << s.str();
    EXPECT_NE(s.message.find(words), std::string::npos) << v->name() << ": " << s.str();
  }
}

void expect_fp8_accepted(const std::string& op, const Args& a) {
  if (has_device()) return;  // with a device it would launch on the fake addresses
  for (const Version* v : fp8_versions_of(op)) {
    const Status s = v->launch(a, nullptr);
    EXPECT_NE(s.code, Code::kInvalidArgument) << v->name() << ": " << s.str();
  }
}

constexpr Fp8Epilogue kEpilogues[] = {Fp8Epilogue::kStore, Fp8Epilogue::kSilu, Fp8Epilogue::kSum};

TEST(HostValidation, GroupedFp8RefusesScalesOfTheWrongShape) {
  for (Fp8Epilogue epi : kEpilogues) {
    const std::string op = fp8_op_name(epi);
    const bool sum = epi == Fp8Epilogue::kSum;
    const int64_t x_rows = sum ? 5 * 2 : 5;  // T = 5: its scales' two layouts differ in shape
    expect_fp8_accepted(op, fp8_call(epi, 1, 8, 60, 16, 128, 16, 16 * 61));
    expect_fp8_accepted(op, fp8_call(epi, 33, 4, 60, 272, 384, 16, 16 * 70));
    // x_scales row-major [rows, K/128] (chapter 08's a_scales_row_major layout): refused by shape
    Args a = fp8_call(epi, 5, 2, 8, 256, 512, 16, 64);
    a.inputs[2].shape = {x_rows, 4};
    expect_fp8_refused(op, a, "x_scales must be float32 [4, " + std::to_string(x_rows) + "]");
    a = fp8_call(epi, 5, 2, 8, 256, 512, 16, 64);
    a.inputs[2].shape = {x_rows, 1};  // per token
    expect_fp8_refused(op, a, "x_scales must be");
    a = fp8_call(epi, 5, 2, 8, 256, 512, 16, 64);
    a.inputs[3].shape = {2, 4};  // one expert's
    expect_fp8_refused(op, a, "w_scales must be float32 [8, 2, 4]");
    a = fp8_call(epi, 5, 2, 8, 256, 512, 16, 64);
    a.inputs[3].shape = {8, 4, 2};  // K/128 and N/128 swapped
    expect_fp8_refused(op, a, "w_scales must be");
    a = fp8_call(epi, 5, 2, 8, 272, 512, 16, 64);
    a.inputs[3].shape = {8, 2, 4};  // N/128 rounded down: 272 needs 3 blocks
    expect_fp8_refused(op, a, "ceil(N/128)");
    a = fp8_call(epi, 5, 2, 8, 256, 512, 16, 64);
    a.inputs[3].dtype = DType::kBF16;
    expect_fp8_refused(op, a, "float32");
    a = fp8_call(epi, 5, 2, 8, 256, 512, 16, 64);
    a.inputs[0].dtype = DType::kBF16;
    expect_fp8_refused(op, a, "float8_e4m3fn");
  }
}

TEST(HostValidation, GroupedFp8RefusesWhatItCannotTile) {
  for (Fp8Epilogue epi : kEpilogues) {
    const std::string op = fp8_op_name(epi);
    expect_fp8_refused(op, fp8_call(epi, 4, 2, 8, 256, 192, 16, 64), "K = 192");
    expect_fp8_refused(op, fp8_call(epi, 4, 2, 8, 264, 256, 16, 64), "multiple of 16");
    expect_fp8_refused(op, fp8_call(epi, 4, 2, 8, 256, 256, 24, 48), "block_m = 24");
    Args a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.inputs[5].shape = {5};
    expect_fp8_refused(op, a, "expert_ids");
    a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.outputs[0].shape = {a.outputs[0].shape[0] + 1, a.outputs[0].shape[1]};
    expect_fp8_refused(op, a, "out must be");
    a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.inputs[1].shape = {8, 256, 384};
    expect_fp8_refused(op, a, "disagree on K");
    a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.inputs.pop_back();
    expect_fp8_refused(op, a, "takes x, w, x_scales, w_scales");
    a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.params.erase("block_m");
    expect_fp8_refused(op, a, "block_m");
    a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.outputs[0].data = static_cast<char*>(a.inputs[2].data) + 16;  // inside x_scales
    expect_fp8_refused(op, a, "out and x_scales");
    a = fp8_call(epi, 4, 2, 8, 256, 256, 16, 64);
    a.inputs[3].data = static_cast<char*>(a.inputs[3].data) + 2;  // a float 2 bytes off
    expect_fp8_refused(op, a, "w_scales");
  }
  // sum: x holds a row per slot
  Args a = fp8_call(Fp8Epilogue::kSum, 4, 2, 8, 256, 256, 16, 64);
  a.inputs[0].shape = {4, 256};
  a.inputs[2].shape = {2, 4};
  expect_fp8_refused(kGroupedSumFp8Op, a, "a row per slot");
}

TEST(HostModels, GroupedFp8BytesCountTheRoutedExpertsWeightsAndScales) {
  const int64_t t = 16, topk = 8, e = 256, n = 4096, k = 7168, bm = 64, rows = 64 * 300;
  for (Fp8Epilogue epi : kEpilogues) {
    Args a = fp8_call(epi, t, topk, e, n, k, bm, rows);
    a.params["routed_experts"] = 100;
    const Version* v = fp8_versions_of(fp8_op_name(epi)).at(0);
    const bool sum = epi == Fp8Epilogue::kSum;
    const double out_n = epi == Fp8Epilogue::kSilu ? n / 2 : n;
    const double x_rows = sum ? t * topk : t, out = 2.0 * (sum ? t : t * topk) * out_n;
    const double want = x_rows * k + 4.0 * (k / 128) * x_rows + 4.0 * rows + 4.0 * (rows / bm) +
                        out + (sum ? 4.0 * t * topk : 0.0) +
                        100.0 * (double(n) * k + 4.0 * (n / 128) * (k / 128));
    EXPECT_DOUBLE_EQ(v->bytes(a), want) << v->name();
    EXPECT_DOUBLE_EQ(v->flops(a), 2.0 * t * topk * n * k) << v->name();
  }
}

}  // namespace
}  // namespace lkw::moe::test
