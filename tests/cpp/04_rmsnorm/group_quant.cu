// fused_add_rmsnorm_fp8_group's contract, beyond the golden cases (GPU; skipped, visibly, without
// one):
//   GroupQuant/<op>__<version>__<shape>  its q and scales are chapter 03's per_group_fp8 (the
//                                        registered v2_vec16) of the y that v4 writes, bit for
//                                        bit, and each scale sits at [g, t] of [d/128, T]: it is
//                                        max(absmax(y[t, 128g:128g+128]) / 448, MIN_SCALE),
//                                        computed here on the host; residual_out is v4's;
//   GroupRefusal/<op>__<version>__<d>    a d that is not a multiple of 128 is refused with
//                                        kInvalidArgument, and nothing is written: every output
//                                        still holds its poison, and the residual is unchanged.
#include <algorithm>
#include <cstring>

#include "03_dynamic_quant/quant_math.cuh"
#include "04_rmsnorm/norm_test.h"

namespace lkw::rmsnorm::test {
namespace {

constexpr const char* kV4 = "04_rmsnorm/fused_add_rmsnorm/v4_fused_add";
constexpr const char* kPerGroup = "03_dynamic_quant/per_group_fp8/v2_vec16";

// Every version and peer of the group op (not the mutants), at each shape.
std::vector<Param> group_params(std::vector<Shape> shapes) {
  std::vector<Param> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->kind != Kind::kMutant && v->op == kFusedAddFp8Group.name)
      for (const Shape& s : shapes) out.push_back({v->name(), s});
  return out;
}

// Chapter 03's per-group quant of BF16 y [T, d] (host bits): q [T, d], scales [d/128, T].
std::vector<std::vector<uint8_t>> per_group_fp8(const std::vector<uint8_t>& y, int64_t t,
                                                int64_t d) {
  DeviceBuffer y_gl(y.size()), q_gl(size_t(t * d)), scales_gl(size_t(t * (d / kGroup)) * 4);
  y_gl.upload(y.data());
  q_gl.poison();
  scales_gl.poison();
  Args a;
  a.inputs = {{y_gl.data(), DType::kBF16, {t, d}}};
  a.outputs = {{q_gl.data(), DType::kE4M3, {t, d}},
               {scales_gl.data(), DType::kF32, {d / kGroup, t}}};
  const Status s = registered(kPerGroup).launch(a, nullptr);
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(s.ok()) << kPerGroup << ": " << s.str();
  return {q_gl.download(), scales_gl.download()};
}

class GroupQuant : public testing::TestWithParam<Param> {};

TEST_P(GroupQuant, IsPerGroupFp8OfV4sY) {
  std::string why;
  if (skip_without_gpu(&why)) GTEST_SKIP() << why;
  const Version& v = registered(GetParam().version);
  const Shape s = GetParam().shape;
  const Problem p = make_problem(GetParam().version + "/group", s.t, s.d, 1e-6);
  const Result v4 = run(registered(kV4), p), got = run(v, p);
  ASSERT_TRUE(v4.status.ok()) << kV4 << ": " << v4.status.str();
  ASSERT_TRUE(got.status.ok()) << v.name() << ": " << got.status.str();
  EXPECT_TRUE(got.guards_intact) << v.name() << " wrote past an output";
  const std::vector<std::vector<uint8_t>> want = per_group_fp8(v4.outputs[0], s.t, s.d);
  const char* what[] = {"q", "scales"};
  for (size_t i = 0; i < 2; ++i) {
    const CompareReport r = compare_output(got, i, want[i].data(), Tolerance::exact());
    EXPECT_TRUE(r.pass) << v.name() << " " << what[i] << " vs " << kPerGroup
                        << " of v4's y: " << r.str();
  }
  const CompareReport r = compare_output(got, 2, v4.outputs[1].data(), Tolerance::exact());
  EXPECT_TRUE(r.pass) << v.name() << " residual_out vs v4's: " << r.str();

  // The layout, from v4's y alone: scale [g, t] at g·T + t.
  const int64_t groups = s.d / kGroup;
  std::vector<uint16_t> y(size_t(s.t * s.d));
  std::memcpy(y.data(), v4.outputs[0].data(), y.size() * 2);
  std::vector<float> scales(size_t(groups * s.t));
  std::memcpy(scales.data(), got.outputs[1].data(), scales.size() * 4);
  int64_t wrong = 0;
  for (int64_t t = 0; t < s.t; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      float absmax = 0.0f;
      for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k)
        absmax = std::max(absmax, std::fabs(bf16_bits_to_f32(y[size_t(t * s.d + k)])));
      const float scale = std::max(absmax / quant::kE4m3Max, quant::kMinScale);  // RN division
      wrong += std::memcmp(&scale, &scales[size_t(g * s.t + t)], 4) != 0;
    }
  EXPECT_EQ(wrong, 0) << v.name() << ": scales not at [g, t] of [d/128, T] (" << wrong << " of "
                      << groups * s.t << ")";
}

class GroupRefusal : public testing::TestWithParam<Param> {};

TEST_P(GroupRefusal, WritesNothing) {
  std::string why;
  if (skip_without_gpu(&why)) GTEST_SKIP() << why;
  const Version& v = registered(GetParam().version);
  const Shape s = GetParam().shape;
  const Problem p = make_problem(GetParam().version + "/refused", s.t, s.d, 1e-6);
  for (bool in_place : {false, true}) {
    const Result got = run(v, p, in_place);
    ASSERT_EQ(got.status.code, Code::kInvalidArgument) << v.name() << ": " << got.status.str();
    EXPECT_NE(got.status.message.find("multiple of 128"), std::string::npos) << got.status.str();
    EXPECT_TRUE(got.guards_intact) << v.name() << " wrote past an output";
    for (size_t i = 0; i < got.outputs.size(); ++i) {
      const bool residual = i + 1 == got.outputs.size();
      std::vector<uint8_t> untouched(got.outputs[i].size(), 0xFF);  // run()'s poison
      if (residual && in_place) std::memcpy(untouched.data(), p.residual.data(), untouched.size());
      EXPECT_TRUE(got.outputs[i] == untouched)
          << v.name() << (in_place ? " (in place)" : "") << ": output " << i << " was written";
    }
  }
}

// d = 128 (one group, a half-warp of 32 threads idle), 5120 (160 threads), 32768 (1024, the
// 16-byte path's longest row); odd T, so that [d/128, T] and [T, d/128] differ.
INSTANTIATE_TEST_SUITE_P(
    Chapter, GroupQuant,
    testing::ValuesIn(group_params({{1, 4096}, {17, 5120}, {3, 32768}, {64, 128}, {1025, 1024}})),
    param_name);
// Not multiples of 128: the single-element path's d, a multiple of 8, of 64, and a short row.
INSTANTIATE_TEST_SUITE_P(Chapter, GroupRefusal,
                         testing::ValuesIn(group_params({{3, 203}, {3, 200}, {3, 4160}, {3, 64}})),
                         param_name);

}  // namespace
}  // namespace lkw::rmsnorm::test
