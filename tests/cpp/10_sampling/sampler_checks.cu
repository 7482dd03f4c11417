// Chapter 10's checks of the ops that draw (the distributions themselves are tested in Python,
// tests/python/test_sampling_gpu.py, against the reference):
//   HostSampleRules/*      bad calls of top_p_renorm_probs, sample and rejection_sample refused
//                          before any launch (on the host, where CI runs)
//   TopPVersions/*         v0 (sort + scan) and v2 (radix select of the integer mass) keep the same
//                          tokens, so write the same bits, on rows whose sums are exact in FP32
//   SampleVersions/*       every sampler (versions and ablations: v0's sort, v4's clusters of 4
//                          and 16): greedy rows exact, rows with one admissible token exact,
//                          top-k and min-p support, BF16 as FP32, replay bit for bit with the same
//                          seed and offset, another offset another draw; nothing written outside;
//                          a non-portable cluster runs or is refused as such, never a CUDA error
//   RejectionVersions/*    the accepted prefix is the drafts, then one token, then −1; a draft
//                          the target never picks is rejected; a draft model equal to the target
//                          has every draft accepted; the replacement lies where p > q
// GPU tests skip, visibly, without a GPU (or below the version's architecture).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "sampling.cuh"

namespace lkw::sampling::test {
namespace {

using lkw::test::host_tensor;
using lkw::test::HostTensor;

const Version& version(const std::string& op, const std::string& id) {
  const Version* v = Registry::get().find(std::string(kChapter) + "/" + op + "/" + id);
  if (!v) throw std::runtime_error("no version " + op + "/" + id);
  return *v;
}

std::vector<const Version*> versions_of(const char* op, bool ablations = false) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->op == op && (v->kind == Kind::kVersion || (ablations && v->kind == Kind::kAblation)))
      out.push_back(v);
  return out;
}

// The samplers: every version of `sample` and its ablations (a knob changes no promise).
std::vector<const Version*> samplers() { return versions_of(kSample, true); }

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

// ---------------------------------------------------------------------------------------------
// Host rules

Args sample_args(int64_t b, int64_t v) {
  Args a;
  a.inputs = {{at(0x100000), DType::kF32, {b, v}}, {at(0x200000), DType::kF32, {b}},
              {at(0x210000), DType::kI32, {b}},    {at(0x220000), DType::kF32, {b}},
              {at(0x230000), DType::kF32, {b}},    {at(0x240000), DType::kI64, {2}}};
  a.outputs = {{at(0x40000000), DType::kI32, {b}}};
  return a;
}

Args rejection_args(int64_t b, int64_t s, int64_t v) {
  Args a;
  a.inputs = {{at(0x1000000), DType::kF32, {b, s, v}}, {at(0x200000), DType::kI32, {b, s}},
              {at(0x8000000), DType::kF32, {b, s + 1, v}}, {at(0x240000), DType::kI64, {2}}};
  a.outputs = {{at(0x40000000), DType::kI32, {b, s + 1}}, {at(0x40100000), DType::kI32, {b}}};
  return a;
}

TEST(HostSampleRules, RefusesBadArguments) {
  for (const Version* v : versions_of(kTopPRenorm.name)) {
    Args a;
    a.inputs = {{at(0x100000), DType::kF32, {4, 100}}, {at(0x200000), DType::kI32, {4}}};
    a.outputs = {{at(0x40000000), DType::kF32, {4, 100}}};
    EXPECT_EQ(v->launch(a, nullptr).code, Code::kInvalidArgument) << v->name() << ": int top_p";
    a.inputs[1].dtype = DType::kF32;
    a.inputs[1].shape = {3};
    EXPECT_EQ(v->launch(a, nullptr).code, Code::kInvalidArgument) << v->name() << ": p not [B]";
    a.inputs[1].shape = {4};
    a.outputs[0].data = at(0x100000 + 256);
    EXPECT_EQ(v->launch(a, nullptr).code, Code::kInvalidArgument) << v->name() << ": overlap";
  }
  for (const Version* v : samplers()) {
    auto bad = [&](Args a, const char* what) {
      EXPECT_EQ(v->launch(a, nullptr).code, Code::kInvalidArgument) << v->name() << ": " << what;
    };
    Args a = sample_args(4, 100);
    a.inputs[0].dtype = DType::kF16;
    bad(a, "FP16 logits");
    a = sample_args(4, 100);
    a.inputs[2].dtype = DType::kI64;
    bad(a, "int64 top_k");
    a = sample_args(4, 100);
    a.inputs[3].shape = {5};
    bad(a, "top_p not [B]");
    a = sample_args(4, 100);
    a.inputs[5].shape = {1};
    bad(a, "seed_offset not [2]");
    a = sample_args(4, 100);
    a.inputs.pop_back();
    bad(a, "five inputs");
    a = sample_args(4, 100);
    a.outputs[0].data = at(0x100000 + 64);
    bad(a, "tokens overlap the logits");
    bad(sample_args(2, (int64_t(1) << 19) + 1), "V above 2^19");
  }
  for (const Version* v : versions_of(kRejection)) {
    auto bad = [&](Args a, const char* what) {
      EXPECT_EQ(v->launch(a, nullptr).code, Code::kInvalidArgument) << v->name() << ": " << what;
    };
    Args a = rejection_args(2, 4, 100);
    a.inputs[2].shape = {2, 4, 100};
    bad(a, "target probs with S rows");
    a = rejection_args(2, 4, 100);
    a.inputs[1].dtype = DType::kI64;
    bad(a, "int64 drafts");
    a = rejection_args(2, 4, 100);
    a.outputs[1].data = a.outputs[0].data;
    bad(a, "tokens and num_accepted overlap");
    bad(rejection_args(2, 65, 100), "S above 64");
  }
}

// ---------------------------------------------------------------------------------------------
// Running a version on host data

struct Tensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // inputs: the data; outputs: filled by run()
};
template <class T>
Tensor tensor(DType d, std::vector<int64_t> shape, const std::vector<T>& v) {
  const HostTensor h = host_tensor(d, std::move(shape), v);
  return {h.dtype, h.shape, h.bytes};
}
template <class T>
std::vector<T> values(const Tensor& t) {
  std::vector<T> out(t.bytes.size() / sizeof(T));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// Runs v on the inputs; the outputs start poisoned and must not be written past.
Status run(const Version& v, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
  std::vector<DeviceBuffer> in, out;
  Args a;
  for (const Tensor& t : inputs) {
    in.emplace_back(t.bytes.size());
    in.back().upload(t.bytes.data());
    a.inputs.push_back({in.back().data(), t.dtype, t.shape});
  }
  for (Tensor& t : outputs) {
    int64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= d;
    out.emplace_back(size_t(n));
    out.back().poison();
    a.outputs.push_back({out.back().data(), t.dtype, t.shape});
  }
  const Status s = v.launch(a, nullptr);
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].bytes = out[i].download();
    EXPECT_TRUE(out[i].guard_intact()) << v.name() << " wrote past output " << i;
  }
  return s;
}

bool skip(const Version& v) { return device_arch() < v.min_arch; }

// ---------------------------------------------------------------------------------------------
// top_p_renorm_probs: v0 and v2 agree where FP32 sums are exact

TEST(TopPVersions, SortAndSelectAgreeBitForBitOnExactSums) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs") + 2);
  for (const auto& [b, v] : {std::pair<int64_t, int64_t>{8, 1000}, {3, 4099}, {2, 128256}, {4, 1}}) {
    // Probs on a grid of 2^-10 (0..64 of them, a third zeros, many ties): every sum of a row is
    // exact in FP32 (at most 2^13 in steps of 2^-10: 23 bits), and so is p·M for p a power of
    // two, so both versions decide every token by the rule itself.
    std::vector<float> x(size_t(b * v));
    for (float& f : x) f = rng() % 3 == 0 ? 0.0f : float(rng() % 65) * 0x1p-10f;
    const float choices[] = {0.5f, 0.25f, 0.125f, 0.0625f, 1.0f, 0.0f, 0x1p-20f, 2.0f};
    std::vector<float> p(static_cast<size_t>(b));
    for (float& f : p) f = choices[rng() % 8];
    x[0] = std::max(x[0], 0x1p-10f);  // no all-zero row
    for (int64_t r = 1; r < b; ++r) x[size_t(r * v)] = std::max(x[size_t(r * v)], 0x1p-10f);
    const std::vector<Tensor> in = {tensor(DType::kF32, {b, v}, x), tensor(DType::kF32, {b}, p)};
    std::vector<Tensor> sorted = {{DType::kF32, {b, v}, {}}}, selected = sorted;
    ASSERT_TRUE(run(version(kTopPRenorm.name, "v0_sort_cub"), in, sorted).ok());
    ASSERT_TRUE(run(version(kTopPRenorm.name, "v2_threshold_search"), in, selected).ok());
    EXPECT_TRUE(sorted[0].bytes == selected[0].bytes) << "B = " << b << ", V = " << v;
  }
}

// ---------------------------------------------------------------------------------------------
// sample

struct SampleCase {
  int64_t b, v;
  std::vector<float> x, t, p, min_p;
  std::vector<int32_t> k;
  int64_t seed, offset;
  bool bf16 = false;

  std::vector<Tensor> inputs() const {
    std::vector<Tensor> in;
    if (bf16) {
      std::vector<uint16_t> bits(x.size());
      for (size_t i = 0; i < x.size(); ++i) bits[i] = uint16_t(to_bits(x[i]) >> 16);
      in.push_back(tensor(DType::kBF16, {b, v}, bits));
    } else {
      in.push_back(tensor(DType::kF32, {b, v}, x));
    }
    in.push_back(tensor(DType::kF32, {b}, t));
    in.push_back(tensor(DType::kI32, {b}, k));
    in.push_back(tensor(DType::kF32, {b}, p));
    in.push_back(tensor(DType::kF32, {b}, min_p));
    in.push_back(tensor(DType::kI64, {2}, std::vector<int64_t>{seed, offset}));
    return in;
  }
  static uint32_t to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  float z(int64_t row, int64_t i) const { return x[size_t(row * v + i)] / t[size_t(row)]; }
};

// Logits on a BF16 grid (so the BF16 run sees the same values), N(0, 2), no ties at the top.
SampleCase sample_case(std::mt19937& rng, int64_t b, int64_t v) {
  SampleCase c{b, v, std::vector<float>(size_t(b * v)), std::vector<float>(size_t(b), 1.0f),
               std::vector<float>(size_t(b), 1.0f), std::vector<float>(size_t(b), 0.0f),
               std::vector<int32_t>(size_t(b), 0), int64_t(rng()), int64_t(rng() % 1000) * 4};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& f : c.x) f = float(__float2bfloat16_rn(normal(rng)));
  for (int64_t r = 0; r < b; ++r) {  // a unique maximum, well above the rest
    float* row = &c.x[size_t(r * v)];
    row[rng() % v] = *std::max_element(row, row + v) + 4.0f;
  }
  return c;
}

std::vector<int32_t> sample_tokens(const Version& v, const SampleCase& c) {
  std::vector<Tensor> out = {{DType::kI32, {c.b}, {}}};
  const Status s = run(v, c.inputs(), out);
  EXPECT_TRUE(s.ok()) << v.name() << ": " << s.str();
  return values<int32_t>(out[0]);
}

int64_t argmax(const SampleCase& c, int64_t row) {
  const float* x = &c.x[size_t(row * c.v)];
  return std::max_element(x, x + c.v) - x;  // the first of the largest
}

TEST(SampleVersions, GreedyAndSingleTokenRowsAreExact) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs") + 3);
  for (const Version* ver : samplers()) {
    if (skip(*ver)) continue;
    for (const auto& [b, v] : {std::pair<int64_t, int64_t>{12, 1000}, {6, 4099}, {6, 1}, {6, 128256}})
      for (bool bf16 : {false, true}) {
        SampleCase c = sample_case(rng, b, v);
        c.bf16 = bf16;
        for (int64_t r = 0; r < b; ++r) {
          switch (r % 6) {  // each row admits exactly one token
            case 0: c.t[size_t(r)] = 0.0f; break;                                // greedy
            case 1: c.t[size_t(r)] = 0.0f, c.k[size_t(r)] = 5; break;            // greedy wins
            case 2: c.k[size_t(r)] = 1, c.t[size_t(r)] = 0.7f; break;             // top-1
            case 3: c.min_p[size_t(r)] = 1.0f; break;                            // the max only
            case 4: c.p[size_t(r)] = 1e-9f, c.t[size_t(r)] = 1.5f; break;         // top group
            case 5: {                                                           // a tie, greedy
              float* row = &c.x[size_t(r * v)];
              row[v - 1] = row[argmax(c, r)];
              c.t[size_t(r)] = 0.0f;
              break;
            }
          }
        }
        const std::vector<int32_t> got = sample_tokens(*ver, c);
        for (int64_t r = 0; r < b; ++r)
          EXPECT_EQ(got[size_t(r)], argmax(c, r))
              << ver->name() << (bf16 ? " BF16" : " FP32") << " V = " << v << ", row " << r;
      }
  }
}

TEST(SampleVersions, SupportReplayAndOffsets) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs") + 4);
  for (const Version* ver : samplers()) {
    if (skip(*ver)) continue;
    for (const auto& [b, v] : {std::pair<int64_t, int64_t>{64, 1000}, {16, 4099}, {8, 32000}}) {
      SampleCase c = sample_case(rng, b, v);
      for (int64_t r = 0; r < b; ++r) {
        c.t[size_t(r)] = 0.5f + float(r % 4) * 0.5f;
        if (r % 3 == 0) c.k[size_t(r)] = int32_t(1 + r % 60);
        if (r % 3 == 1) c.min_p[size_t(r)] = 0.01f * float(r % 7);
        if (r % 3 == 2) c.p[size_t(r)] = 0.5f + 0.05f * float(r % 10), c.k[size_t(r)] = 200;
      }
      const std::vector<int32_t> first = sample_tokens(*ver, c), again = sample_tokens(*ver, c);
      EXPECT_EQ(first, again) << ver->name() << ": the same seed and offset must replay";
      c.offset += 68;  // past every draw a call makes
      EXPECT_NE(first, sample_tokens(*ver, c)) << ver->name() << ": another offset, the same draws";
      for (int64_t r = 0; r < b; ++r) {
        const int32_t tok = first[size_t(r)];
        ASSERT_TRUE(tok >= 0 && tok < v) << ver->name() << " row " << r << ": token " << tok;
        const float zt = c.z(r, tok), zmax = c.z(r, argmax(c, r));
        int64_t greater = 0;
        for (int64_t i = 0; i < v; ++i) greater += c.z(r, i) > zt;
        const int32_t k = c.k[size_t(r)];
        if (k > 0 && k < v) EXPECT_LT(greater, k) << ver->name() << " row " << r << ": outside top-k";
        const double mass = std::exp(double(zt) - double(zmax));
        EXPECT_GE(mass, double(c.min_p[size_t(r)]) * (1 - 0x1p-16))
            << ver->name() << " row " << r << ": below min-p";
      }
    }
  }
}

// A cluster of 16 CTAs is non-portable: the device may not co-schedule it. The ablation must then
// say so (kUnsupportedArch, naming the occupancy query) before launching, never fail as a launch.
// Where it runs, it draws v4's token in every row that admits one token (the golden cases check
// the rest).
TEST(SampleVersions, NonPortableClusterRunsOrIsRefusedAsSuch) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  const Version& v16 = version(kSample, "ablation_v4_cluster16");
  if (skip(v16)) GTEST_SKIP() << v16.name() << " needs sm_" << v16.min_arch;
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs") + 6);
  for (const int64_t v : {int64_t(1), int64_t(4099), int64_t(1) << 19}) {  // slices of 1 to 32K
    SampleCase c = sample_case(rng, 4, v);
    c.t = {0.0f, 0.8f, 1.2f, 0.5f};
    c.k = {0, 1, 0, 0};
    c.min_p = {0.0f, 0.0f, 1.0f, 0.0f};
    c.p = {1.0f, 1.0f, 1.0f, 1e-9f};  // each row one admissible token: the argmax
    std::vector<Tensor> out = {{DType::kI32, {c.b}, {}}};
    const Status s = run(v16, c.inputs(), out);
    if (s.code == Code::kUnsupportedArch) {
      EXPECT_NE(s.message.find("cudaOccupancyMaxActiveClusters"), std::string::npos) << s.str();
      GTEST_SKIP() << "refused, as it must be where 16 CTAs cannot be co-scheduled: " << s.str();
    }
    ASSERT_TRUE(s.ok()) << v16.name() << " V = " << v << ": " << s.str();
    const std::vector<int32_t> got = values<int32_t>(out[0]);
    for (int64_t r = 0; r < c.b; ++r)
      EXPECT_EQ(got[size_t(r)], argmax(c, r)) << v16.name() << " V = " << v << ", row " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// rejection_sample

TEST(RejectionVersions, AcceptsRejectsAndWritesTheLayout) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(lkw::test::random_seed("chapter 10 random inputs") + 5);
  const int64_t b = 6, s = 4, v = 5000;
  std::vector<float> q(size_t(b * s * v)), p(size_t(b * (s + 1) * v));
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (float& f : q) f = uniform(rng) * 1e-3f;
  for (float& f : p) f = uniform(rng) * 1e-3f;
  std::vector<int32_t> drafts(size_t(b * s));
  for (int32_t& d : drafts) d = int32_t(rng() % v);
  // Row 0: q equal to p, so every draft passes u·q < q; row 1: draft 0 has p = 0 (rejected at 0,
  // and the replacement never is that token); row 2: draft 2 has q = 0 < p (accepted).
  for (int64_t j = 0; j < s * v; ++j) q[size_t(j)] = p[size_t(j)];
  p[size_t((1 * (s + 1) + 0) * v + drafts[size_t(1 * s)])] = 0.0f;
  q[size_t((2 * s + 2) * v + drafts[size_t(2 * s + 2)])] = 0.0f;
  const std::vector<Tensor> in = {tensor(DType::kF32, {b, s, v}, q), tensor(DType::kI32, {b, s}, drafts),
                                  tensor(DType::kF32, {b, s + 1, v}, p),
                                  tensor(DType::kI64, {2}, std::vector<int64_t>{int64_t(rng()), 0})};
  for (const Version* ver : versions_of(kRejection)) {
    if (skip(*ver)) continue;
    std::vector<Tensor> out = {{DType::kI32, {b, s + 1}, {}}, {DType::kI32, {b}, {}}}, again = out;
    ASSERT_TRUE(run(*ver, in, out).ok());
    ASSERT_TRUE(run(*ver, in, again).ok());
    EXPECT_TRUE(out[0].bytes == again[0].bytes && out[1].bytes == again[1].bytes) << "replay";
    const std::vector<int32_t> tokens = values<int32_t>(out[0]), n = values<int32_t>(out[1]);
    EXPECT_EQ(n[0], s) << "q == p: every draft accepted";
    EXPECT_EQ(n[1], 0) << "p = 0 at draft 0: rejected";
    EXPECT_NE(tokens[size_t(1 * (s + 1))], drafts[size_t(1 * s)]) << "the replacement has p − q = 0";
    EXPECT_NE(n[2], 2) << "q = 0 < p at draft 2: it cannot be the first rejection";
    for (int64_t r = 0; r < b; ++r) {
      const int32_t m = n[size_t(r)];
      ASSERT_TRUE(m >= 0 && m <= s) << "row " << r;
      for (int64_t j = 0; j < m; ++j)
        EXPECT_EQ(tokens[size_t(r * (s + 1) + j)], drafts[size_t(r * s + j)]) << "row " << r;
      const int32_t last = tokens[size_t(r * (s + 1) + m)];
      ASSERT_TRUE(last >= 0 && last < v) << "row " << r << ": last token " << last;
      const float pl = p[size_t((r * (s + 1) + m) * v + last)];
      const float ql = m < s ? q[size_t((r * s + m) * v + last)] : 0.0f;
      EXPECT_GT(pl - ql, 0.0f) << "row " << r << ": the last token must have p > q there";
      for (int64_t j = m + 1; j <= s; ++j) EXPECT_EQ(tokens[size_t(r * (s + 1) + j)], -1);
    }
  }
}

}  // namespace
}  // namespace lkw::sampling::test
