// Chapter 03 GPU checks beyond the golden cases (suite names end in "Golden", so the chapter's
// gpu test runs them; without a device they skip):
//   BigShapesGolden/<op>__<version>  every version against the host reference (host_quant.h),
//       bit for bit, on rows of 16383 and 16384, 16384 short rows, row lengths that are not
//       a multiple of 8 (v2's scalar path: the golden "tail" d = 200 is a multiple of 8), and
//       per tensor a tensor large enough for the grid-stride loops to go round several times;
//       each input has one all-zero row, and per_token_fp8 runs with and without a scale_ub.
//   OutliersGolden  eight elements ×100 in [64, 4096]: the dequantized per-token FP8 result is
//       closer to x than the per-tensor one (the best version of each).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dynamic_quant.cuh"
#include "golden.h"
#include "host_quant.h"

namespace lkw::quant {
namespace {

const QuantOp& op_named(const std::string& name) {
  for (const QuantOp* op : {&kPerTokenFp8, &kPerTokenInt8, &kPerTensorFp8, &kPerGroupFp8})
    if (name == op->name) return *op;
  throw std::invalid_argument("not a chapter 03 op: " + name);
}

std::vector<int64_t> scales_shape(const QuantOp& op, int64_t t, int64_t d) {
  switch (op.granularity) {
    case Granularity::kToken:
      return {t, 1};
    case Granularity::kTensor:
      return {1};
    case Granularity::kGroup:
      return {d / kGroup, t};
  }
  return {};
}

struct Shape {
  int64_t t, d;
};
constexpr Shape kShapes[] = {{3, 16384}, {5, 16383}, {16384, 128}, {7, 1001}, {33, 2056}};
constexpr Shape kLargeTensor{4096, 4096};  // per tensor: 2M chunks, several grid strides

std::vector<std::string> chapter_versions() {
  std::vector<std::string> names;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->kind == Kind::kVersion) names.push_back(v->name());
  return names;
}

class BigShapesGolden : public testing::TestWithParam<std::string> {};

TEST_P(BigShapesGolden, MatchesCppReference) {
  const Version& v = *Registry::get().find(GetParam());
  const int arch = device_arch();
  if (arch < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  if (arch < v.min_arch)
    GTEST_SKIP() << "device is sm_" << arch << ", version needs sm_" << v.min_arch;
  const QuantOp& op = op_named(v.op);
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  if (op.granularity == Granularity::kTensor) shapes.push_back(kLargeTensor);
  std::mt19937 rng(test::random_seed("chapter 03 GPU checks"));
  for (const Shape& s : shapes) {
    if (op.granularity == Granularity::kGroup && s.d % kGroup != 0) continue;
    for (const float scale_ub : {0.0f, 1.0f}) {
      if (scale_ub > 0.0f && &op != &kPerTokenFp8) continue;
      std::vector<uint16_t> x = host::activations(rng, s.t, s.d);
      if (s.t > 1) std::fill(x.begin() + s.d, x.begin() + 2 * s.d, uint16_t(0));  // row 1
      const host::Quantized ref = host::reference(op.name, x, s.t, s.d, scale_ub);
      test::Case c;
      c.id =
          "t" + std::to_string(s.t) + "_d" + std::to_string(s.d) + (scale_ub > 0.0f ? "_ub1" : "");
      c.op = op.name;
      c.tols = {Tolerance::exact()};
      if (scale_ub > 0.0f) c.params["scale_ub"] = scale_ub;
      test::CaseData data;
      data.inputs.push_back(test::host_tensor(DType::kBF16, {s.t, s.d}, x));
      data.expected.push_back(test::host_tensor(op.code, {s.t, s.d}, ref.q));
      data.expected.push_back(test::host_tensor(DType::kF32, scales_shape(op, s.t, s.d), ref.scales));
      const test::RunResult r = test::run_on_gpu(v, c, data, 0xFF);
      EXPECT_TRUE(r.pass()) << v.name() << " on " << c.id << ": " << r.str();
    }
  }
}

std::string version_param_name(const testing::TestParamInfo<std::string>& info) {
  const Version* v = Registry::get().find(info.param);
  return v->op + "__" + v->id;
}

INSTANTIATE_TEST_SUITE_P(Chapter, BigShapesGolden, testing::ValuesIn(chapter_versions()),
                         version_param_name);

// The highest version of an op: ids sort by their number.
const Version& best_version(const QuantOp& op) {
  const Version* best = nullptr;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->op == op.name && v->kind == Kind::kVersion && (!best || v->id > best->id)) best = v;
  if (!best) throw std::runtime_error(std::string("no version of ") + op.name);
  return *best;
}

struct Error {
  double mean_relative;  // mean of |dq − x| / |x| over the nonzero x
  double flushed;        // fraction of the nonzero x that came back as 0
};

// Runs an FP8 op on x [t, d] and measures its dequantized result against x.
Error fp8_error(const QuantOp& op, const std::vector<uint16_t>& x, int64_t t, int64_t d) {
  const Version& v = best_version(op);
  const std::vector<int64_t> s_shape = scales_shape(op, t, d);
  const int64_t n_scales = op.granularity == Granularity::kToken ? t : 1;
  DeviceBuffer x_buf(x.size() * 2), q_buf(t * d), s_buf(n_scales * 4);
  x_buf.upload(x.data());
  q_buf.poison();
  s_buf.poison();
  Args args;
  args.inputs.push_back({x_buf.data(), DType::kBF16, {t, d}});
  args.outputs.push_back({q_buf.data(), op.code, {t, d}});
  args.outputs.push_back({s_buf.data(), DType::kF32, s_shape});
  LKW_STATUS_CHECK(v.launch(args, nullptr));
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> q = q_buf.download();
  std::vector<float> scales(n_scales);
  s_buf.download(scales.data());
  double sum = 0;
  int64_t nonzero = 0, flushed = 0;
  for (int64_t i = 0; i < t * d; ++i) {
    const double xi = bf16_bits_to_f32(x[i]);
    if (xi == 0) continue;
    const double dq = e4m3_bits_to_f64(q[i]) * scales[n_scales == 1 ? 0 : i / d];
    sum += std::fabs(dq - xi) / std::fabs(xi);
    flushed += dq == 0;
    ++nonzero;
  }
  return {sum / nonzero, double(flushed) / nonzero};
}

// A norm-wise error ‖dq − x‖ / ‖x‖ would barely tell the two apart: E4M3 is a floating format,
// whose relative precision does not depend on the scale until values turn subnormal. What the
// per-tensor scale does to the rows far below the outliers is push them into the subnormals or
// to zero, which the elementwise relative error and the flushed count show
// (tests/python/test_quant_reference.py measures the same on the reference).
TEST(OutliersGolden, PerTokenBeatsPerTensor) {
  if (device_arch() < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(test::random_seed("chapter 03 GPU checks") + 1);
  const int64_t t = 64, d = 4096;
  std::vector<uint16_t> x = host::activations(rng, t, d);
  std::uniform_int_distribution<int64_t> anywhere(0, t * d - 1);
  std::set<int64_t> outliers;
  while (outliers.size() < 8) outliers.insert(anywhere(rng));
  for (int64_t i : outliers) x[i] = formats::f32_to_bf16_bits(bf16_bits_to_f32(x[i]) * 100.0f);
  const Error token = fp8_error(kPerTokenFp8, x, t, d);
  const Error tensor = fp8_error(kPerTensorFp8, x, t, d);
  std::printf(
      "outliers: mean relative error per token %.4g, per tensor %.4g; flushed to zero "
      "per token %.3g%%, per tensor %.3g%%\n",
      token.mean_relative, tensor.mean_relative, 100 * token.flushed, 100 * tensor.flushed);
  EXPECT_LT(token.mean_relative, tensor.mean_relative);
  EXPECT_LT(token.flushed, tensor.flushed);
}

}  // namespace
}  // namespace lkw::quant
