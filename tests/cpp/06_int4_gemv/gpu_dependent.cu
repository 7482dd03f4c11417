// Chapter 06, v8_dependent_launch: a launch that may start before the kernel ahead of it in the
// stream has finished must still read that kernel's output. A chain of two GEMVs, y1 = x·W1^T
// then y2 = y1·W2^T, queued back to back many times with x alternating between two random
// inputs (so y1 differs from one link to the next), nothing between the launches; y2 of every
// link must equal, bit for bit, what v7 (the same kernel, launched plainly, a sync after each)
// gives for that link's x. A v8 that read y1 before the first GEMV had written it would see the
// previous link's y1. Shapes where v8 runs its split-K workspace (S > 1) and where it does not.
// v9 (also a dependent launch, with its own fold and cuts) is checked the same way against
// itself launched with a sync after each link, at M = 1 and 2 (its own paths) and 8 (v8's).
// Without a device the test skips.
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

TEST(DependentLaunch, ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v8 against v7 (the same kernel launched plainly): S = 1 at both links; long K (split-K) at
  // the second; M with two n-tiles.
  check_chain(version("v7_shallow_ring"), version("v8_dependent_launch"),
              {{1, 4096, 4096, 14336}, {8, 14336, 4096, 4096}, {16, 4096, 14336, 4096}},
              "chapter 06 dependent launch");
}

// v9's links: M = 1 (S = 1, the whole row, both links), M = 2 with one link at K = 4096 (S = 1, even
// cuts) and the other past v9's whole row at M = 2 (K = 28672 or 14336: v8's S > 1 with the lean
// fold), M = 8 (v8).
const std::vector<std::array<int64_t, 4>> kBlockSplitLinks = {
    {1, 4096, 4096, 14336}, {2, 4096, 28672, 4096}, {2, 14336, 4096, 4096}, {8, 14336, 4096, 4096}};

TEST(DependentLaunch, V9ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v9 against itself with a sync after each launch.
  const Version& v9 = version("v9_block_split_k");
  check_chain(v9, v9, kBlockSplitLinks, "chapter 06 dependent launch, v9");
}

TEST(DependentLaunch, V10ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v10 (v9's kernels with the walk rotated) against itself, at v9's links.
  const Version& v10 = version("v10_rotated_walk");
  check_chain(v10, v10, kBlockSplitLinks, "chapter 06 dependent launch, v10");
}

TEST(DependentLaunch, V11ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v11 (v9's and v8's kernels with 128-byte copies) against itself, at v9's links (v8's at M = 8).
  const Version& v11 = version("v11_line_prefetch");
  check_chain(v11, v11, kBlockSplitLinks, "chapter 06 dependent launch, v11");
}

TEST(DependentLaunch, V12ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v12 (v11's kernels on the tiled weights of int4t_gemv) against itself, at v9's links.
  const Version& v12 = version("v12_tiled_weights", kInt4tGemv);
  check_chain(v12, v12, kBlockSplitLinks, "chapter 06 dependent launch, v12");
}

TEST(DependentLaunch, V13ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v13 (v12's kernels, each block's tiles consecutive) against itself, at v9's links. (Not against
  // v12: a tile's place in its block sets where its steps are cut between warps, hence the order
  // of the FP32 sums.)
  const Version& v13 = version("v13_consecutive_tiles", kInt4tGemv);
  check_chain(v13, v13, kBlockSplitLinks, "chapter 06 dependent launch, v13");
}

TEST(DependentLaunch, V14ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v14 back to back against v13 with a sync after each link: v14 is v13's kernels and cuts with
  // the weights copied evict_first, so its sums must be v13's bit for bit (the policy changes which
  // lines L2 keeps, never what a kernel reads).
  const Version& v13 = version("v13_consecutive_tiles", kInt4tGemv);
  const Version& v14 = version("v14_evict_first", kInt4tGemv);
  check_chain(v13, v14, kBlockSplitLinks, "chapter 06 dependent launch, v14");
}

TEST(DependentLaunch, V15ChainReadsThePreviousKernelsOutput) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  // v15 back to back against v14 with a sync after each link: v15 is v14's kernels with the same
  // scales brought in blocks of 8 steps, read in the same order into the same sums, so its outputs
  // must be v14's bit for bit (a block read at the wrong step, or from the other buffer, is not).
  const Version& v14 = version("v14_evict_first", kInt4tGemv);
  const Version& v15 = version("v15_block_scales", kInt4tGemv);
  check_chain(v14, v15, kBlockSplitLinks, "chapter 06 dependent launch, v15");
}

}  // namespace
}  // namespace lkw::gemv
