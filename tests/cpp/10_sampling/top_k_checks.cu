// Chapter 10's own checks:
//   HostOrderKey/*     order_key maps FP32 to uint32 in the same order (−0.0 and +0.0 to one key,
//                      −inf lowest), key_value inverts it: on the host, where CI runs
//   HostTopKRules/*    bad arguments refused before any launch
//   TopKVersions/*     v0 (sort), v1 (radix select) and v2 (the aggregated select) find the same
//                      threshold, so their outputs are equal bit for bit, on fresh random rows with ties, −inf, ±0 and every
//                      kind of k (GPU; skipped, visibly, without one)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "sampling.cuh"

namespace lkw::sampling::test {
namespace {

using lkw::test::host_tensor;
using lkw::test::HostTensor;

TEST(HostOrderKey, KeepsTheOrderAndInverts) {
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs"));
  std::vector<float> values = {-INFINITY, -3e38f, -1.0f, -1e-45f, -0.0f, 0.0f, 1e-45f, 1.0f, 3e38f};
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 2000; ++i) values.push_back(normal(rng));
  for (float a : values) {
    EXPECT_EQ(key_value(order_key(a)), a + 0.0f) << a;
    for (float b : {values[size_t(rng() % values.size())], 0.0f, -0.0f}) {
      EXPECT_EQ(a < b, order_key(a) < order_key(b)) << a << " vs " << b;
      EXPECT_EQ(a == b, order_key(a) == order_key(b)) << a << " vs " << b;
    }
  }
  EXPECT_EQ(order_key(-0.0f), order_key(0.0f));
  EXPECT_EQ(order_key(-INFINITY), 0x007fffffu);  // the lowest key of any non-NaN float
}

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

TEST(HostTopKRules, RefusesBadArguments) {
  for (const char* op : {"top_k_mask_logits", "top_k_renorm_probs"})
    for (const char* id : {"v0_sort_cub", "v1_radix_select", "v2_threshold_search"}) {
      const Version* v = Registry::get().find(std::string(kChapter) + "/" + op + "/" + id);
      ASSERT_NE(v, nullptr) << op << "/" << id;
      auto args = [](std::vector<int64_t> x, std::vector<int64_t> k, DType kd = DType::kI32) {
        Args a;
        a.inputs = {{at(0x100000), DType::kF32, x}, {at(0x200000), kd, k}};
        a.outputs = {{at(0x40000000), DType::kF32, x}};
        return a;
      };
      EXPECT_EQ(v->launch(args({4, 100}, {3}), nullptr).code, Code::kInvalidArgument) << "k not [B]";
      EXPECT_EQ(v->launch(args({4, 100}, {4}, DType::kI64), nullptr).code, Code::kInvalidArgument)
          << "int64 k";
      Args overlap = args({4, 100}, {4});
      overlap.outputs[0].data = at(0x100000 + 64);
      EXPECT_EQ(v->launch(overlap, nullptr).code, Code::kInvalidArgument) << "out overlaps x";
      Args wrong = args({4, 100}, {4});
      wrong.outputs[0].shape = {4, 99};
      EXPECT_EQ(v->launch(wrong, nullptr).code, Code::kInvalidArgument) << "out not [B, V]";
    }
}

// Rows of N(0, 4) rounded to a few values (many ties), with −inf, −0.0 and +0.0 here and there.
std::vector<float> rows(std::mt19937& rng, int64_t b, int64_t v, bool probs) {
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> x(static_cast<size_t>(b * v));
  for (float& f : x) f = std::round(normal(rng) * 2.0f) / 2.0f;
  for (int64_t i = 0; i < b * v; i += 7) x[size_t(i)] = (i / 7) % 3 == 0 ? -INFINITY : (i % 2 ? -0.0f : 0.0f);
  if (probs)
    for (float& f : x) f = std::isinf(f) ? 0.0f : std::exp(f / 4.0f);
  return x;
}

struct Outcome {
  Status status;
  std::vector<uint8_t> out;
};
Outcome run(const Version& v, const HostTensor& x, const HostTensor& k) {
  DeviceBuffer dx(x.bytes.size()), dk(k.bytes.size()), dy(x.bytes.size());
  dx.upload(x.bytes.data());
  dk.upload(k.bytes.data());
  dy.poison();
  Args a;
  a.inputs = {{dx.data(), DType::kF32, x.shape}, {dk.data(), DType::kI32, k.shape}};
  a.outputs = {{dy.data(), DType::kF32, x.shape}};
  Outcome r{v.launch(a, nullptr), {}};
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  r.out = dy.download();
  EXPECT_TRUE(dy.guard_intact()) << v.name() << " wrote past its output";
  return r;
}

TEST(TopKVersions, SortAndSelectAgreeBitForBit) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs") + 1);
  for (const char* op : {"top_k_mask_logits", "top_k_renorm_probs"})
    for (const auto& [b, v] : {std::pair<int64_t, int64_t>{5, 1000}, {3, 32000}, {2, 131}, {1, 128256}}) {
      const std::vector<float> x = rows(rng, b, v, std::string(op) == "top_k_renorm_probs");
      std::vector<int32_t> k(static_cast<size_t>(b));
      const int32_t choices[] = {1, 2, 50, int32_t(v) - 1, int32_t(v), 0, -3, int32_t(v / 2)};
      for (int64_t i = 0; i < b; ++i) k[size_t(i)] = choices[(size_t(i) + rng()) % 8];
      const HostTensor hx = host_tensor(DType::kF32, {b, v}, x), hk = host_tensor(DType::kI32, {b}, k);
      const std::string base = std::string(kChapter) + "/" + op + "/";
      const Outcome sorted = run(*Registry::get().find(base + "v0_sort_cub"), hx, hk);
      const Outcome selected = run(*Registry::get().find(base + "v1_radix_select"), hx, hk);
      const Outcome searched = run(*Registry::get().find(base + "v2_threshold_search"), hx, hk);
      ASSERT_TRUE(sorted.status.ok() && selected.status.ok() && searched.status.ok())
          << sorted.status.str() << " " << selected.status.str() << " " << searched.status.str();
      EXPECT_TRUE(sorted.out == selected.out) << op << " v1, B = " << b << ", V = " << v;
      EXPECT_TRUE(sorted.out == searched.out) << op << " v2, B = " << b << ", V = " << v;
    }
}

}  // namespace
}  // namespace lkw::sampling::test
