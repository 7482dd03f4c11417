// Chapter 06, the dependent launch (v6 and v7): a launch that may start before the kernel ahead
// of it in the stream has finished must still read that kernel's output. A chain of two GEMVs,
// y1 = x·W1^T then y2 = y1·W2^T, queued back to back many times with x alternating between two
// random inputs (so y1 differs from one link to the next), nothing between the launches; y2 of
// every link must equal, bit for bit, what a reference launch gives for that link's x with a sync
// after each launch. A kernel that read y1 before the first GEMV had written it would see the
// previous link's y1. The knobs of v7 change no result: its ablation entries, launched plainly,
// are that reference, bit for bit. Without a device the test skips.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "int4_gemv.cuh"
#include "lkw/buffer.h"

namespace lkw::gemv {
namespace {

const Version& version(const char* id, const GemvOp& op = kInt4iGemv) {
  const Version* v = Registry::get().find(std::string(LKW_CHAPTER) + "/" + op.name + "/" + id);
  if (v == nullptr) throw std::runtime_error(std::string("no version ") + id);
  return *v;
}

uint16_t bf16_truncated(float f) {  // the upper half of f's bits (any BF16 value will do here)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return uint16_t(bits >> 16);
}

struct Gemv {  // one link's weights on the device: [N, K/8] words, [N, K/128] scales
  int64_t n, k;
  DeviceBuffer w, scales;
};

Gemv random_gemv(std::mt19937& rng, int64_t n, int64_t k) {
  std::vector<uint32_t> words(n * k / 8);
  for (auto& v : words) v = rng();
  std::vector<uint16_t> scales(n * k / 128);
  std::uniform_real_distribution<float> s(0.002f, 0.02f);
  for (auto& v : scales) v = bf16_truncated(s(rng));
  Gemv g{n, k, DeviceBuffer(words.size() * 4), DeviceBuffer(scales.size() * 2)};
  LKW_CUDA_CHECK(cudaMemcpy(g.w.data(), words.data(), words.size() * 4, cudaMemcpyHostToDevice));
  LKW_CUDA_CHECK(cudaMemcpy(g.scales.data(), scales.data(), scales.size() * 2, cudaMemcpyHostToDevice));
  return g;
}

// The words as rows ([N, K/8]) or, for int4t_gemv, as its tiled layout: at the links' shapes (N a
// multiple of 16, K of 256) the same count of random words, only read in another order.
Args args_of(const Version& v, const Gemv& g, void* x, void* y, int64_t m) {
  Args a;
  a.inputs.push_back({x, DType::kBF16, {m, g.k}});
  if (v.op == kInt4tGemv.name)
    a.inputs.push_back({g.w.data(), DType::kU32, {tiled_rows(g.n), tiled_row_words(g.k)}});
  else
    a.inputs.push_back({g.w.data(), DType::kU32, {g.n, g.k / 8}});
  a.inputs.push_back({g.scales.data(), DType::kBF16, {g.n, g.k / 128}});
  a.outputs.push_back({y, DType::kBF16, {m, g.n}});
  return a;
}

std::vector<uint16_t> to_host(const DeviceBuffer& b) {
  std::vector<uint16_t> h(b.bytes() / 2);
  LKW_CUDA_CHECK(cudaMemcpy(h.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

// (M, N1 = K2, K1, N2) per shape; `plain` gives the expected y2 of each x (a sync after each
// launch), `dependent` runs the links back to back.
void check_chain(const Version& plain, const Version& dependent, const std::vector<std::array<int64_t, 4>>& shapes,
                 const char* seed) {
  std::mt19937 rng(test::random_seed(seed));
  for (const auto& s : shapes) {
    const int64_t m = s[0], n1 = s[1], k1 = s[2], n2 = s[3];
    ASSERT_TRUE(n1 % 256 == 0 && k1 % 256 == 0 && n2 % 16 == 0) << "whole tiles and steps (args_of)";
    const Gemv g1 = random_gemv(rng, n1, k1), g2 = random_gemv(rng, n2, n1);
    DeviceBuffer x[2] = {DeviceBuffer(m * k1 * 2), DeviceBuffer(m * k1 * 2)};
    for (auto& b : x) {
      std::vector<uint16_t> h(m * k1);
      std::normal_distribution<float> nd(0, 1);
      for (auto& v : h) v = bf16_truncated(nd(rng));
      LKW_CUDA_CHECK(cudaMemcpy(b.data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    DeviceBuffer y1(m * n1 * 2), y2(m * n2 * 2);
    // The expected y2 of each x: `plain`, a sync after each launch.
    std::vector<uint16_t> want[2];
    for (int i = 0; i < 2; ++i) {
      LKW_CUDA_CHECK(cudaMemset(y2.data(), 0xff, y2.bytes()));
      ASSERT_TRUE(plain.launch(args_of(plain, g1, x[i].data(), y1.data(), m), nullptr).ok());
      LKW_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_TRUE(plain.launch(args_of(plain, g2, y1.data(), y2.data(), m), nullptr).ok());
      LKW_CUDA_CHECK(cudaDeviceSynchronize());
      want[i] = to_host(y2);
    }
    ASSERT_NE(want[0], want[1]) << "the two inputs must give different outputs";
    // `dependent`: links queued back to back; each link's y2 kept in its own buffer.
    const int links = 12;
    std::vector<DeviceBuffer> out;
    for (int l = 0; l < links; ++l) {
      out.emplace_back(m * n2 * 2);
      LKW_CUDA_CHECK(cudaMemset(out.back().data(), 0xff, out.back().bytes()));
    }
    LKW_CUDA_CHECK(cudaDeviceSynchronize());
    for (int l = 0; l < links; ++l) {
      ASSERT_TRUE(dependent.launch(args_of(dependent, g1, x[l % 2].data(), y1.data(), m), nullptr).ok());
      ASSERT_TRUE(dependent.launch(args_of(dependent, g2, y1.data(), out[l].data(), m), nullptr).ok());
    }
    LKW_CUDA_CHECK(cudaDeviceSynchronize());
    for (int l = 0; l < links; ++l)
      EXPECT_EQ(to_host(out[l]), want[l % 2]) << dependent.id << ", M = " << m << ", N1 = " << n1
                                               << ", K1 = " << k1 << ", N2 = " << n2 << ": link " << l;
  }
}

// The links: M = 1 (S = 1, the whole row, both links), M = 2 at K = 4096 (S = 1, even cuts) and past
// the whole row (K = 28672 or 14336: S > 1, runs of whole tiles and the split-K finish), M = 8 (the
// fold, no whole row), M = 16 (two n-tiles, the scale in A).
const std::vector<std::array<int64_t, 4>> kLinks = {{1, 4096, 4096, 14336}, {2, 4096, 28672, 4096},
                                                    {2, 14336, 4096, 4096}, {8, 14336, 4096, 4096},
                                                    {16, 4096, 14336, 4096}};

TEST(DependentLaunch, V6ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  const Version& v6 = version("v6_pipelined");
  check_chain(v6, v6, kLinks, "chapter 06 dependent launch, v6");
}

TEST(DependentLaunch, V7ChainMatchesItsPlainLaunch) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // The same kernels launched plainly (the pdl knob off), a sync after each launch.
  check_chain(version("ablation_v7_no_pdl", kInt4tGemv), version("v7_tiled_stream", kInt4tGemv), kLinks,
              "chapter 06 dependent launch, v7");
}

// The cache policy changes which lines L2 keeps, never what a kernel reads: v7's bits.
TEST(DependentLaunch, V7EvictFirstChangesNoBit) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  const Version& v7 = version("v7_tiled_stream", kInt4tGemv);
  check_chain(v7, version("ablation_v7_no_evict_first", kInt4tGemv), kLinks, "chapter 06 v7 evict_first knob");
}

}  // namespace
}  // namespace lkw::gemv
