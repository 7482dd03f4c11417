// Chapter 06 GPU checks beyond the golden cases: activations far from 1. v4 to v6 fold 128 + q and
// 136·Σx into FP32 sums (v6's Σx on the tensor cores); v3 scales the FP32 sums per group.
// Here rows of x live around 2^100, around 2^−100 (products still FP32 normals), or spread over
// 2^±40 within the row, and every G = 128 version of int4i_gemv at M = 1 and 2 must still match a
// float64 reference within the chapter's tolerance (reference/lkw/gemv.py's formula, here in C++).
// K = 4096 and 32768: v6 holds the whole row in the block (S = 1) at M = 1 and at M = 2 up to
// K = 8192, and splits K across blocks at M = 2 past it, so both of its paths see every range.
// Fresh random inputs each run (LKW_SEED repeats one). Without a device the tests skip.
//
// Each word repeats one nibble eight times, so the reference needs no interleave table: whatever
// the order of a word's nibbles, its eight weights are the same.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "int4_gemv.cuh"

namespace lkw::gemv {
namespace {

uint16_t bf16_of(double v) {  // round to nearest even, through FP32
  float f = float(v);
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7f800000u) == 0x7f800000u) return uint16_t(b >> 16);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

enum class Rows { kHuge, kTiny, kWide };

// x [M, K] as BF16 bits: |x| = 2^u with u uniform in the regime's range, random signs.
std::vector<uint16_t> activations(std::mt19937& rng, Rows rows, int64_t m, int64_t k) {
  std::uniform_real_distribution<double> u_huge(90, 110), u_tiny(-110, -90), u_wide(-40, 40);
  std::vector<uint16_t> x(m * k);
  for (auto& v : x) {
    const double u = rows == Rows::kHuge ? u_huge(rng) : rows == Rows::kTiny ? u_tiny(rng) : u_wide(rng);
    v = bf16_of((rng() & 1 ? -1.0 : 1.0) * std::exp2(u));
  }
  return x;
}

std::vector<std::string> g128_versions() {
  std::vector<std::string> names;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->kind == Kind::kVersion && v->op == kInt4iGemv.name) names.push_back(v->name());
  return names;
}

class ActivationRangeGolden : public testing::TestWithParam<std::string> {};

TEST_P(ActivationRangeGolden, MatchesFloat64Reference) {
  const Version& v = *Registry::get().find(GetParam());
  const int arch = device_arch();
  if (arch < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  if (arch < v.min_arch) GTEST_SKIP() << "device is sm_" << arch << ", version needs sm_" << v.min_arch;
  std::mt19937 rng(test::random_seed("chapter 06 range checks"));
  const int64_t n = 80, g = 128;
  for (const int64_t k : {4096, 32768}) {
    for (const Rows rows : {Rows::kHuge, Rows::kTiny, Rows::kWide}) {
      for (const int64_t m : {1, 2}) {
        const std::vector<uint16_t> x = activations(rng, rows, m, k);
        std::vector<uint32_t> words(n * k / 8);
        std::vector<int> q(words.size());
        for (size_t i = 0; i < words.size(); ++i) {
          q[i] = int(rng() % 16);
          words[i] = 0x11111111u * uint32_t(q[i]);
        }
        std::vector<uint16_t> scales(n * k / g);
        std::uniform_real_distribution<double> log_scale(-8, -2);
        for (auto& s : scales) s = bf16_of(std::exp2(log_scale(rng)));
        // The float64 reference and gemv.py's tolerance: RTOL 1.6e-2, ATOL from the walk of
        // BF16-rounded weights and the FP32 accumulation of sum |x w|.
        std::vector<uint16_t> y(m * n);
        double walk = 0, total = 0;
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t c = 0; c < n; ++c) {
            double sum = 0, sq = 0, abs_sum = 0;
            for (int64_t kk = 0; kk < k; ++kk) {
              const double w = double(bf16_bits_to_f32(scales[c * (k / g) + kk / g])) *
                               (q[(c * k + kk) / 8] - 8);
              const double p = double(bf16_bits_to_f32(x[r * k + kk])) * w;
              sum += p;
              sq += p * p;
              abs_sum += std::fabs(p);
            }
            y[r * n + c] = bf16_of(sum);
            walk = std::max(walk, std::sqrt(sq));
            total = std::max(total, abs_sum);
          }
        }
        const double atol = 14 * std::exp2(-9) * walk + 8 * std::sqrt(double(k)) * std::exp2(-24) * total;
        test::Case c;
        c.id = std::string(rows == Rows::kHuge ? "huge" : rows == Rows::kTiny ? "tiny" : "wide") +
               "_m" + std::to_string(m) + "_k" + std::to_string(k);
        c.op = v.op;
        c.tols = {Tolerance::close(1.6e-2, atol)};
        test::CaseData d;
        d.inputs.push_back(test::host_tensor(DType::kBF16, {m, k}, x));
        d.inputs.push_back(test::host_tensor(DType::kU32, {n, k / 8}, words));
        d.inputs.push_back(test::host_tensor(DType::kBF16, {n, k / g}, scales));
        d.expected.push_back(test::host_tensor(DType::kBF16, {m, n}, y));
        const test::RunResult r = test::run_on_gpu(v, c, d, 0xFF);
        EXPECT_TRUE(r.pass()) << v.name() << " on " << c.id << ": " << r.str();
      }
    }
  }
}

std::string version_param_name(const testing::TestParamInfo<std::string>& info) {
  return Registry::get().find(info.param)->id;
}

INSTANTIATE_TEST_SUITE_P(Chapter, ActivationRangeGolden, testing::ValuesIn(g128_versions()),
                         version_param_name);

}  // namespace
}  // namespace lkw::gemv
