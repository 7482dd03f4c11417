// Chapter 03 checks that need no GPU: the C++ host reference against every golden case, the
// launchers' refusals that the generic Validation suite does not reach (each version's row
// limit, per-group divisibility, scale_ub on the wrong op, overlapping outputs, the alignment
// the vector paths need), and the byte model.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dynamic_quant.cuh"
#include "golden.h"
#include "host_quant.h"

namespace lkw::quant {
namespace {

TEST(HostReference, MatchesEveryGoldenCase) {
  const std::vector<test::Case> cases = test::load_cases(LKW_CHAPTER);
  ASSERT_FALSE(cases.empty());
  for (const test::Case& c : cases) {
    const test::CaseData data = test::load_data(c);
    const test::HostTensor& in = data.inputs.at(0);
    std::vector<uint16_t> x(in.numel());
    std::memcpy(x.data(), in.bytes.data(), in.bytes.size());
    const auto ub = c.params.find("scale_ub");
    const auto row_major = c.params.find("scales_row_major");
    const host::Quantized r = host::reference(
        c.op, x, in.shape.at(0), in.shape.at(1), ub == c.params.end() ? 0.0f : float(ub->second),
        row_major != c.params.end() && row_major->second != 0.0);
    const test::HostTensor &q = data.expected.at(0), &scales = data.expected.at(1);
    ASSERT_EQ(r.q.size(), q.bytes.size()) << c.id;
    ASSERT_EQ(int64_t(r.scales.size()), scales.numel()) << c.id;
    const CompareReport rq = compare(r.q.data(), q.bytes.data(), q.dtype, q.numel(), c.tol(0));
    const CompareReport rs =
        compare(r.scales.data(), scales.bytes.data(), scales.dtype, scales.numel(), c.tol(1));
    EXPECT_TRUE(rq.pass) << c.id << " q: " << rq.str();
    EXPECT_TRUE(rs.pass) << c.id << " scales: " << rs.str();
  }
}

// Arguments for an op at fake device addresses: every test below must be refused before the
// launcher looks at the device, so nothing ever touches them.
struct Fake {
  uintptr_t x = 0x100000, q = 0x10000000, scales = 0x20000000;
};
Args fake_args(const QuantOp& op, int64_t t, int64_t d, Fake at = {}) {
  Args a;
  a.inputs.push_back({reinterpret_cast<void*>(at.x), DType::kBF16, {t, d}});
  a.outputs.push_back({reinterpret_cast<void*>(at.q), op.code, {t, d}});
  std::vector<int64_t> scales_shape =
      op.granularity == Granularity::kToken    ? std::vector<int64_t>{t, 1}
      : op.granularity == Granularity::kTensor ? std::vector<int64_t>{1}
                                               : std::vector<int64_t>{d / kGroup, t};
  a.outputs.push_back({reinterpret_cast<void*>(at.scales), DType::kF32, scales_shape});
  return a;
}

std::vector<const Version*> versions_of(const QuantOp& op) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    if (v->op == op.name) out.push_back(v);
  return out;
}

void expect_refused(const Version& v, const Args& a, const std::string& words) {
  const Status s = v.launch(a, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << v.name() << ": " << s.str();
  EXPECT_NE(s.message.find(words), std::string::npos)
      << v.name() << ": message \"" << s.message << "\" lacks \"" << words << "\"";
}

TEST(HostValidation, PerGroupNeedsWholeGroups) {
  for (const Version* v : versions_of(kPerGroupFp8))
    expect_refused(*v, fake_args(kPerGroupFp8, 4, 200), "multiple of 128");
}

TEST(HostValidation, RowsLongerThanTheRegistersHoldAreRefused) {
  for (const QuantOp* op : {&kPerTokenFp8, &kPerTokenInt8}) {
    for (const Version* v : versions_of(*op)) {
      if (v->id == "v1_row_in_registers") {
        expect_refused(*v, fake_args(*op, 2, 16385), "d <= 16384");
      } else if (v->id == "v2_vec16") {
        expect_refused(*v, fake_args(*op, 2, 32776), "d <= 32768");  // vector path
        expect_refused(*v, fake_args(*op, 2, 16385), "d <= 16384");  // scalar path: d % 8 != 0
      }
    }
  }
}

TEST(HostValidation, OnlyPerTokenFp8TakesScaleUb) {
  for (const QuantOp* op : {&kPerTokenInt8, &kPerTensorFp8, &kPerGroupFp8}) {
    for (const Version* v : versions_of(*op)) {
      Args a = fake_args(*op, 4, 256);
      a.params["scale_ub"] = 1.0;
      expect_refused(*v, a, "takes no scale_ub");
    }
  }
}

TEST(HostValidation, RowMajorGroupScalesNeedTheirShapeAndOnlyPerGroupTakesThem) {
  for (const QuantOp* op : {&kPerTokenFp8, &kPerTokenInt8, &kPerTensorFp8}) {
    for (const Version* v : versions_of(*op)) {
      Args a = fake_args(*op, 4, 256);
      a.params["scales_row_major"] = 1.0;
      expect_refused(*v, a, "takes no scales_row_major");
    }
  }
  for (const Version* v : versions_of(kPerGroupFp8)) {
    Args a = fake_args(kPerGroupFp8, 4, 256);  // scales [2, 4]: column-major
    a.params["scales_row_major"] = 1.0;
    expect_refused(*v, a, "[T, d/128]");
  }
}

TEST(HostValidation, OutputsMustNotOverlap) {
  for (const QuantOp* op : {&kPerTokenFp8, &kPerTokenInt8, &kPerTensorFp8, &kPerGroupFp8}) {
    for (const Version* v : Registry::get().chapter(LKW_CHAPTER)) {
      if (v->op != op->name) continue;
      Fake at;
      at.scales = at.q + 4 * 256 - 16;  // inside q's last row
      expect_refused(*v, fake_args(*op, 4, 256, at), "q and scales must not overlap");
      at = Fake{};
      at.q = at.x + 1024;  // inside x
      expect_refused(*v, fake_args(*op, 4, 256, at), "x and q must not overlap");
    }
  }
}

// Per tensor and per group the vector kernels have no scalar path: x must be 16-byte aligned.
// (Per token, v2 takes its scalar path instead, so it is not refused and not tested here.)
TEST(HostValidation, VectorKernelsNeedAlignedRows) {
  for (const QuantOp* op : {&kPerTensorFp8, &kPerGroupFp8}) {
    for (const Version* v : versions_of(*op)) {
      if (v->id != "v2_vec16" && v->id != "v3_grid_sync") continue;
      Fake at;
      at.x += 2;
      expect_refused(*v, fake_args(*op, 4, 256, at), "x must be 16-byte aligned");
    }
  }
}

TEST(HostByteModel, TwoBytesInOneOutFourPerScale) {
  const int64_t t = 4, d = 256, elems = t * d;
  const std::map<std::string, int64_t> scales{{kPerTokenFp8.name, t},
                                              {kPerTokenInt8.name, t},
                                              {kPerTensorFp8.name, 1},
                                              {kPerGroupFp8.name, t * d / kGroup}};
  for (const QuantOp* op : {&kPerTokenFp8, &kPerTokenInt8, &kPerTensorFp8, &kPerGroupFp8})
    for (const Version* v : versions_of(*op)) {
      EXPECT_EQ(v->bytes(fake_args(*op, t, d)), double(3 * elems + 4 * scales.at(op->name)))
          << v->name();
      EXPECT_EQ(v->flops(fake_args(*op, t, d)), 0.0) << v->name();
    }
}

}  // namespace
}  // namespace lkw::quant
