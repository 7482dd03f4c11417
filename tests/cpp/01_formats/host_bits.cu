// The bit functions of formats_bits.cuh, built for the host and run on every golden case of their
// op: all 2^16 BF16 patterns, all 256 codes of each FP8, the ties and the saturation edges.
// No GPU needed, so this is also what grades chapter 01's v0 exercise on any machine.
#include <gtest/gtest.h>

#include <cstring>

#include "formats_bits.cuh"
#include "golden.h"

namespace lkw::formats {
namespace {

using test::Case;

// Applies the host build of one bit function to the case's input, element by element.
std::vector<uint8_t> run_on_host(const std::string& op, const test::HostTensor& in) {
  const int64_t n = in.numel();
  std::vector<uint8_t> out;
  auto each = [&](auto out_type, auto fn) {
    using Out = decltype(out_type);
    out.resize(n * sizeof(Out));
    for (int64_t i = 0; i < n; ++i) {
      Out r = fn(i);
      std::memcpy(out.data() + i * sizeof(Out), &r, sizeof(Out));
    }
  };
  auto f32 = [&](int64_t i) { float x; std::memcpy(&x, in.bytes.data() + 4 * i, 4); return x; };
  auto u16 = [&](int64_t i) { uint16_t x; std::memcpy(&x, in.bytes.data() + 2 * i, 2); return x; };
  auto u8 = [&](int64_t i) { return in.bytes[i]; };
  if (op == "f32_to_bf16") each(uint16_t{}, [&](int64_t i) { return f32_to_bf16_bits(f32(i)); });
  if (op == "bf16_to_f32") each(float{}, [&](int64_t i) { return bf16_bits_to_f32(u16(i)); });
  if (op == "f32_to_e4m3") each(uint8_t{}, [&](int64_t i) { return f32_to_e4m3_bits(f32(i)); });
  if (op == "f32_to_e5m2") each(uint8_t{}, [&](int64_t i) { return f32_to_e5m2_bits(f32(i)); });
  if (op == "e4m3_to_bf16") each(uint16_t{}, [&](int64_t i) { return e4m3_to_bf16_bits(u8(i)); });
  if (op == "e5m2_to_bf16") each(uint16_t{}, [&](int64_t i) { return e5m2_to_bf16_bits(u8(i)); });
  return out;
}

std::vector<std::string> case_ids() {
  std::vector<std::string> ids;
  try {
    for (const Case& c : test::load_cases(LKW_CHAPTER)) ids.push_back(c.id);
  } catch (const std::exception&) {
    // HostGoldenData.IsPresentAndCoversEveryOp reports missing golden data.
  }
  return ids;
}

class HostBits : public testing::TestWithParam<std::string> {};

TEST_P(HostBits, MatchesReference) {
  for (const Case& c : test::load_cases(LKW_CHAPTER)) {
    if (c.id != GetParam()) continue;
    const test::CaseData d = test::load_data(c);
    const std::vector<uint8_t> got = run_on_host(c.op, d.inputs.at(0));
    ASSERT_EQ(got.size(), d.expected.at(0).bytes.size()) << "no host function for op " << c.op;
    const CompareReport r = compare(got.data(), d.expected[0].bytes.data(), d.expected[0].dtype,
                                    d.expected[0].numel(), c.tol(0));
    EXPECT_TRUE(r.pass) << c.op << " on " << c.id << ": " << r.str();
    return;
  }
  FAIL() << "no golden case " << GetParam();
}

// Test names carry <op>__v0_software_bits so the grader credits v0 with them.
std::string name(const testing::TestParamInfo<std::string>& info) {
  for (const Case& c : test::load_cases(LKW_CHAPTER))
    if (c.id == info.param) return c.op + "__v0_software_bits__" + c.id;
  return info.param;
}

INSTANTIATE_TEST_SUITE_P(Chapter, HostBits, testing::ValuesIn(case_ids()), name);

// A few values worked by hand, independent of the golden data.
TEST(HostBitsByHand, RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(1.00390625f), 0x3f80);  // 1 + 2^-8: a tie, stays on the even 1.0
  EXPECT_EQ(f32_to_bf16_bits(1.01171875f), 0x3f82);  // 1 + 3·2^-8: a tie, rounds up to even
  EXPECT_EQ(f32_to_e4m3_bits(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3_bits(1e9f), 0x7e);            // satfinite
  EXPECT_EQ(f32_to_e4m3_bits(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_e4m3_bits(0x1p-9f), 0x01);         // smallest subnormal
  EXPECT_EQ(f32_to_e4m3_bits(0x1p-10f), 0x00);        // half of it: a tie, to even zero
  EXPECT_EQ(f32_to_e5m2_bits(INFINITY), 0x7b);        // 57344
  EXPECT_EQ(e4m3_to_bf16_bits(0x01), f32_to_bf16_bits(0x1p-9f));
  EXPECT_EQ(e5m2_to_bf16_bits(0x7c), 0x7f80);         // +Inf
}

}  // namespace
}  // namespace lkw::formats
