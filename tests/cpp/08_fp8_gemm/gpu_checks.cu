// Chapter 08 GPU checks beyond the golden cases (no Host or Validation in the names: the chapter's
// gpu test runs them; without a device they skip):
//   LastWaveGolden/<op>__<version>  every v5 registration at (300, 400, 6144), 3 × 4 tiles of 128
//       (the last tile row 44 rows, the last column 16), on a grid capped by max_blocks to 7, 8 and
//       9 blocks: v5's plan keeps the first 7, 8 or 9 tiles whole and splits the last wave's 5, 4
//       or 3 in 4, 2 or 3 shares (schedule.cuh's v5_last_wave; the no-split ablation keeps all
//       whole), so whole tiles and reduced split tiles leave one launch through the same epilogue.
//       y against a float64 reference rounded to BF16, within the golden cases' bound, over the
//       whole output and over the split tiles alone, under two poisons (an element left unwritten
//       cannot match both; the second run also finds the arrival counters re-armed).
// Fresh random inputs each run (LKW_SEED repeats one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fp8_gemm.cuh"
#include "golden.h"
#include "lkw/buffer.h"
#include "lkw/check.h"
#include "lkw/launch.h"
#include "lkw/numeric.h"
#include "schedule.cuh"

namespace lkw::fp8 {
namespace {

constexpr int64_t kM = 300, kN = 400, kK = 6144, kKB = kK / 128, kNB = (kN + 127) / 128;

uint16_t bf16_of(double v) {  // round to nearest even, through FP32
  uint32_t b = f32_to_bits(float(v));
  if ((b & 0x7f800000u) == 0x7f800000u) return uint16_t(b >> 16);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

// The golden cases' bound (golden.fp8_gemm_tolerance): lkw.fp8_gemm.error_bound(K, run) plus the
// reference's own BF16 rounding, 2^-8 + 4·sqrt(run / 32)·2^-13 + 8·sqrt(K)·2^-24 + 2^-8, where
// run = 128 for blockwise scales (promoted every K block), K for rowwise ones (never promoted).
double frob_bound(bool blockwise) {
  const double run = blockwise ? 128.0 : double(kK);
  return 2 * std::exp2(-8.0) + 4 * std::sqrt(run / 32) * std::exp2(-13.0) +
         8 * std::sqrt(double(kK)) * std::exp2(-24.0);
}

// A, B [rows, K] E4M3 of random sign and magnitude 0.25 to 3.75 (exponent fields 5 to 8): products
// of random sign, which the bound covers. Scales 2^-4 to 1, each its own.
struct Problem {
  std::vector<uint8_t> a, b;
  std::vector<float> s_a, s_b;  // blockwise [K/128, M] and [ceil(N/128), K/128]; rowwise [M], [N]
  std::vector<uint16_t> y;      // the reference, BF16 bits
};

const Problem& problem(bool blockwise) {
  static std::map<bool, Problem> made;
  if (made.count(blockwise)) return made[blockwise];
  std::mt19937 rng(test::random_seed("chapter 08 GPU checks") + (blockwise ? 1 : 0));
  std::uniform_real_distribution<float> log_scale(-4, 0);
  Problem p;
  for (auto* v : {&p.a, &p.b}) {
    v->resize((v == &p.a ? kM : kN) * kK);
    for (uint8_t& x : *v) x = uint8_t((rng() & 0x80u) | ((5 + rng() % 4) << 3) | (rng() % 8));
  }
  p.s_a.resize(blockwise ? kKB * kM : kM);
  p.s_b.resize(blockwise ? kNB * kKB : kN);
  for (auto* v : {&p.s_a, &p.s_b})
    for (float& s : *v) s = std::exp2(log_scale(rng));
  std::vector<double> a(p.a.size()), b(p.b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = e4m3_bits_to_f64(p.a[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = e4m3_bits_to_f64(p.b[i]);
  p.y.resize(kM * kN);
  for (int64_t m = 0; m < kM; ++m)
    for (int64_t n = 0; n < kN; ++n) {
      double y = 0;
      for (int64_t kb = 0; kb < kKB; ++kb) {
        double block = 0;
        for (int64_t k = kb * 128; k < kb * 128 + 128; ++k) block += a[m * kK + k] * b[n * kK + k];
        y += blockwise ? block * p.s_a[kb * kM + m] * p.s_b[(n / 128) * kKB + kb] : block;
      }
      p.y[m * kN + n] = bf16_of(blockwise ? y : y * p.s_a[m] * p.s_b[n]);
    }
  return made[blockwise] = std::move(p);
}

// The plan the registration takes (schedule.cuh's plan_v5_variant, by its id) on `max_blocks`.
TileSchedule plan_of(const Version& v, bool blockwise, int max_blocks) {
  return plan_v5_variant(kM, kN, kK, blockwise, sm_count(), 16, v.id != "ablation_v5_no_split",
                         v.id == "ablation_v5_wide_blockwise", max_blocks);
}

// The elements of the split tiles (units whole.. of share 0), in tile order.
std::vector<uint16_t> split_tiles(const TileSchedule& s, const std::vector<uint16_t>& y) {
  std::vector<uint16_t> out;
  for (int u = s.whole; u < s.count() && !s.whole_unit(u); ++u) {
    if (s.share_index(u) != 0) continue;
    int m0, n0;
    s.origin(u, &m0, &n0);
    for (int64_t m = m0; m < std::min<int64_t>(m0 + s.block_m, kM); ++m)
      for (int64_t n = n0; n < std::min<int64_t>(n0 + s.block_n, kN); ++n)
        out.push_back(y[m * kN + n]);
  }
  return out;
}

std::vector<std::string> v5_versions() {
  std::vector<std::string> names;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->id == "v5_tuned" || v->id.rfind("ablation_v5_", 0) == 0) names.push_back(v->name());
  return names;
}

class LastWaveGolden : public testing::TestWithParam<std::string> {};

TEST_P(LastWaveGolden, MatchesFloat64Reference) {
  const Version& v = *Registry::get().find(GetParam());
  const int arch = device_arch();
  if (arch < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  if (arch < v.min_arch)
    GTEST_SKIP() << "device is sm_" << arch << ", version needs sm_" << v.min_arch;
  const bool blockwise = v.op == kBlockwiseOp;
  const Problem& p = problem(blockwise);
  const Tolerance tol = Tolerance::frobenius(frob_bound(blockwise));
  DeviceBuffer a_buf(p.a.size()), b_buf(p.b.size()), sa_buf(4 * p.s_a.size()),
      sb_buf(4 * p.s_b.size());
  DeviceBuffer y_buf(2 * p.y.size());
  a_buf.upload(p.a.data());
  b_buf.upload(p.b.data());
  sa_buf.upload(p.s_a.data());
  sb_buf.upload(p.s_b.data());
  Args args;
  args.inputs = {{a_buf.data(), DType::kE4M3, {kM, kK}},
                 {b_buf.data(), DType::kE4M3, {kN, kK}},
                 {sa_buf.data(), DType::kF32,
                  blockwise ? std::vector<int64_t>{kKB, kM} : std::vector<int64_t>{kM, 1}},
                 {sb_buf.data(), DType::kF32,
                  blockwise ? std::vector<int64_t>{kNB, kKB} : std::vector<int64_t>{kN, 1}}};
  args.outputs = {{y_buf.data(), DType::kBF16, {kM, kN}}};
  if (blockwise) args.params["a_scales_row_major"] = 0;
  for (int max_blocks : {7, 8, 9}) {
    const TileSchedule plan = plan_of(v, blockwise, max_blocks);
    if (v.id != "ablation_v5_no_split" && max_blocks == 7)  // the check is only worth its plan
      ASSERT_TRUE(plan.whole > 0 && plan.splits > 1) << "no last wave split: whole " << plan.whole;
    args.params["max_blocks"] = max_blocks;
    for (uint8_t poison : {uint8_t(0xFF), uint8_t(0x3C)}) {
      const std::string what = v.name() + ", max_blocks " + std::to_string(max_blocks) +
                               " (whole " + std::to_string(plan.whole) + ", splits " +
                               std::to_string(plan.splits) + "), poison " + std::to_string(poison);
      y_buf.poison(poison);
      const Status st = v.launch(args, nullptr);
      LKW_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_TRUE(st.ok()) << what << ": " << st.str();
      std::vector<uint16_t> y(p.y.size());
      y_buf.download(y.data());
      EXPECT_TRUE(y_buf.guard_intact()) << what << ": wrote past the end of y";
      const CompareReport all = compare(y.data(), p.y.data(), DType::kBF16, int64_t(y.size()), tol);
      EXPECT_TRUE(all.pass) << what << ": " << all.str();
      const std::vector<uint16_t> got = split_tiles(plan, y), want = split_tiles(plan, p.y);
      if (got.empty()) continue;  // a plan of whole tiles
      const CompareReport split =
          compare(got.data(), want.data(), DType::kBF16, int64_t(got.size()), tol);
      EXPECT_TRUE(split.pass) << what << ", the split tiles alone: " << split.str();
    }
  }
}

std::string version_param_name(const testing::TestParamInfo<std::string>& info) {
  const Version* v = Registry::get().find(info.param);
  return v->op + "__" + v->id;
}

INSTANTIATE_TEST_SUITE_P(Chapter, LastWaveGolden, testing::ValuesIn(v5_versions()),
                         version_param_name);

}  // namespace
}  // namespace lkw::fp8
