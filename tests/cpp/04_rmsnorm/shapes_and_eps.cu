// Beyond the golden shapes, against the contract computed on the host (GPU; skipped, visibly,
// without one):
//   LargeShapes/<op>__<version>__<shape>  many rows (T = 16384) and long rows (d up to 32768 on
//                                         the 16-byte path, 16383 on the single-element path):
//                                         y within 2 BF16 ulps (reference/lkw/rmsnorm.py says
//                                         why 2), residual_out exact;
//   Eps/<op>__<version>__<shape>          rows whose mean square is the size of eps: two eps
//                                         values must give different results (eps is really
//                                         used), each one the contract's.
#include <cstring>

#include "04_rmsnorm/norm_test.h"

namespace lkw::rmsnorm::test {
namespace {

// The versions of the ops that `keep` selects, each at those of the shapes its op takes.
template <class Keep>
std::vector<Param> params(Keep keep, std::vector<Shape> shapes) {
  std::vector<Param> out;
  for (const std::string& v : versions_where(keep))
    for (const Shape& s : shapes)
      if (takes(norm_op(registered(v).op), s.d)) out.push_back({v, s});
  return out;
}

// y within 2 BF16 ulps of the contract (the FP32 sum of squares may run in any order, and rsqrtf
// is within 2 FP32 ulps: z can land on the other side of a rounding boundary, which can move y
// by 2 ulps); residual_out exact (no reduction involved).
void expect_contract(const Version& v, const Problem& p, const Result& got) {
  const NormOp& op = norm_op(v.op);
  const Expected e = reference(p, op.residual);
  const CompareReport y = compare_output(got, 0, e.y.data(), Tolerance::ulp(2));
  EXPECT_TRUE(y.pass) << v.name() << " y at eps " << p.eps << ": " << y.str();
  if (op.residual) {
    const CompareReport r = compare_output(got, 1, e.residual_out.data(), Tolerance::exact());
    EXPECT_TRUE(r.pass) << v.name() << " residual_out: " << r.str();
  }
}

class LargeShapes : public testing::TestWithParam<Param> {};

TEST_P(LargeShapes, MatchTheContract) {
  std::string why;
  if (skip_without_gpu(&why)) GTEST_SKIP() << why;
  const Version& v = registered(GetParam().version);
  const Shape s = GetParam().shape;
  const Problem p = make_problem(GetParam().version + "/large", s.t, s.d, 1e-6);
  const Result got = run(v, p);
  ASSERT_TRUE(got.status.ok()) << v.name() << ": " << got.status.str();
  EXPECT_TRUE(got.guards_intact) << v.name() << " wrote past an output";
  expect_contract(v, p, got);
}

class Eps : public testing::TestWithParam<Param> {};

TEST_P(Eps, IsUsed) {
  std::string why;
  if (skip_without_gpu(&why)) GTEST_SKIP() << why;
  const Version& v = registered(GetParam().version);
  const NormOp& op = norm_op(v.op);
  const Shape s = GetParam().shape;
  Problem p = make_problem(GetParam().version + "/eps", s.t, s.d, 1e-5, /*small=*/true);
  const Result large_eps = run(v, p);
  ASSERT_TRUE(large_eps.status.ok()) << v.name() << ": " << large_eps.status.str();
  if (op.quant == Quant::kNone) expect_contract(v, p, large_eps);
  p.eps = 1e-6;
  const Result small_eps = run(v, p);
  ASSERT_TRUE(small_eps.status.ok()) << v.name() << ": " << small_eps.status.str();
  if (op.quant == Quant::kNone) {
    expect_contract(v, p, small_eps);
    const std::vector<uint8_t>&a = large_eps.outputs[0], &b = small_eps.outputs[0];
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); i += 2) differ += a[i] != b[i] || a[i + 1] != b[i + 1];
    EXPECT_GT(differ, int64_t(a.size() / 2) / 2) << v.name() << ": y barely depends on eps";
  } else {
    // The codes hardly move (the scale absorbs rstd); every row's (every group's) scale must.
    const size_t n = size_t(numel(large_eps.specs[1]));
    std::vector<float> a(n), b(n);
    std::memcpy(a.data(), large_eps.outputs[1].data(), n * 4);
    std::memcpy(b.data(), small_eps.outputs[1].data(), n * 4);
    for (size_t i = 0; i < n; ++i)
      EXPECT_NE(a[i], b[i]) << v.name() << ": scale " << i << " ignores eps";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Chapter, LargeShapes,
    testing::ValuesIn(params([](const NormOp& op) { return op.quant == Quant::kNone; },
                             {{16384, 128}, {3, 16384}, {2, 16383}, {1, 32768}})),
    param_name);
INSTANTIATE_TEST_SUITE_P(Chapter, Eps,
                         testing::ValuesIn(params([](const NormOp&) { return true; },
                                                  {{5, 4096}, {5, 203}})),
                         param_name);

}  // namespace
}  // namespace lkw::rmsnorm::test
