// The chapter's exactness claims, on fresh random inputs (GPU; skipped, visibly, without one):
//   FusedVsChain/<op>__<version>__<shape>  v4's y, v5's codes and scales (per token and per
//                                          group), and their residual_out equal the unfused
//                                          chain's bit for bit (memcmp-exact), because both run
//                                          the one row routine of rmsnorm.cuh;
//   InPlace/<op>__<version>__<shape>       residual_out == residual (vLLM's in-place update) gives
//                                          the same outputs as separate buffers, and the updated
//                                          residual is bf16(x + residual) exactly.
#include "04_rmsnorm/norm_test.h"

namespace lkw::rmsnorm::test {
namespace {

// T = 1 (decode), the bandwidth shape, d = 16384 (512 threads), d = 32768 (1024), d = 5120 (160
// threads), d = 200 (the single-element path), many short rows. An op takes the shapes its d
// suits (the group op: d a multiple of 128).
const Shape kShapes[] = {{1, 4096},  {64, 8192}, {3, 16384}, {3, 32768},
                         {16, 5120}, {5, 200},   {5, 203},   {16384, 128}};

std::vector<Param> fused_params() {
  std::vector<Param> out;
  for (const std::string& v : versions_where([](const NormOp& op) { return op.residual; }))
    for (const Shape& s : kShapes)
      if (takes(norm_op(registered(v).op), s.d)) out.push_back({v, s});
  return out;
}

std::vector<Param> in_place_params() {
  std::vector<Param> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->kind != Kind::kMutant && norm_op(v->op).residual)
      for (const Shape& s : {Shape{7, 4096}, Shape{5, 203}})
        if (takes(norm_op(v->op), s.d)) out.push_back({v->name(), s});
  return out;
}

class FusedVsChain : public testing::TestWithParam<Param> {};

TEST_P(FusedVsChain, BitForBit) {
  std::string why;
  if (skip_without_gpu(&why)) GTEST_SKIP() << why;
  const Version& fused = registered(GetParam().version);
  const Version& chain = registered(std::string(kChapter) + "/" + fused.op + "/chain_unfused");
  const Shape s = GetParam().shape;
  const Problem p = make_problem(GetParam().version + "/chain", s.t, s.d, 1e-6);
  const Result want = run(chain, p), got = run(fused, p);
  ASSERT_TRUE(want.status.ok()) << chain.name() << ": " << want.status.str();
  ASSERT_TRUE(got.status.ok()) << fused.name() << ": " << got.status.str();
  EXPECT_TRUE(want.guards_intact && got.guards_intact) << "a kernel wrote past an output";
  for (size_t i = 0; i < got.outputs.size(); ++i) {
    const CompareReport r = compare_output(got, i, want.outputs[i].data(), Tolerance::exact());
    EXPECT_TRUE(r.pass) << fused.name() << " output " << i << " vs " << chain.name() << ": "
                        << r.str();
  }
}

class InPlace : public testing::TestWithParam<Param> {};

TEST_P(InPlace, MatchesSeparateBuffers) {
  std::string why;
  if (skip_without_gpu(&why)) GTEST_SKIP() << why;
  const Version& v = registered(GetParam().version);
  const Shape s = GetParam().shape;
  const Problem p = make_problem(GetParam().version + "/in_place", s.t, s.d, 1e-5);
  const Result apart = run(v, p), in_place = run(v, p, true);
  ASSERT_TRUE(apart.status.ok()) << apart.status.str();
  ASSERT_TRUE(in_place.status.ok()) << in_place.status.str();
  EXPECT_TRUE(apart.guards_intact && in_place.guards_intact) << "a kernel wrote past an output";
  for (size_t i = 0; i < apart.outputs.size(); ++i) {
    const CompareReport r =
        compare_output(in_place, i, apart.outputs[i].data(), Tolerance::exact());
    EXPECT_TRUE(r.pass) << v.name() << " output " << i << ", in place vs apart: " << r.str();
  }
  const Expected e = reference(p, true);
  const CompareReport r = compare_output(in_place, in_place.outputs.size() - 1,
                                         e.residual_out.data(), Tolerance::exact());
  EXPECT_TRUE(r.pass) << v.name() << ": the residual updated in place: " << r.str();
}

INSTANTIATE_TEST_SUITE_P(Chapter, FusedVsChain, testing::ValuesIn(fused_params()), param_name);
INSTANTIATE_TEST_SUITE_P(Chapter, InPlace, testing::ValuesIn(in_place_params()), param_name);

}  // namespace
}  // namespace lkw::rmsnorm::test
