// Chapter 09 checks beyond the golden cases:
//   HostMultiset     the multiset comparison of the align (compare.h's compare_runs): a run's
//                    order does not matter, a slot moved to another run, a wrong sentinel or a
//                    missing slot does; the manifest spelling
//   HostValidation   what the align and router launchers refuse before launching anything:
//                    a capacity that is not the reference's, E or BLOCK_M out of range, k > E,
//                    a DeepSeek grouping that does not divide E, overlapping outputs
//   BadIds (GPU)     an id >= E or < -1: every align version reports it as an invalid-argument
//                    Status, writes num_tokens_post_padded = -1 and nothing past its outputs
//                    (guard bands); with check_ids = 0 the launch stays asynchronous and the
//                    flag is only in num_tokens_post_padded
#include <gtest/gtest.h>

#include <climits>
#include <random>

#include "golden.h"
#include "lkw/check.h"
#include "align.cuh"
#include "router.cuh"

namespace lkw::moe::test {
namespace {

using lkw::test::random_seed;

std::vector<const Version*> versions_of(const std::string& op, bool mutants = false) {
  std::vector<const Version*> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->op == op && (v->kind == Kind::kMutant) == mutants) out.push_back(v);
  return out;
}

// ---------------------------------------------------------------------------------------------
// HostMultiset

TEST(HostMultiset, ParsesAndPrints) {
  const Tolerance t = Tolerance::parse("multiset:1:64");
  EXPECT_EQ(t.mode, Tolerance::Mode::kMultiset);
  EXPECT_EQ(t.key_output, 1);
  EXPECT_EQ(t.width, 64);
  EXPECT_NE(t.str().find("multiset"), std::string::npos);
  EXPECT_THROW(Tolerance::parse("multiset:1"), std::invalid_argument);
  EXPECT_THROW(Tolerance::parse("multiset:1:0"), std::invalid_argument);
}

// Two experts' runs of 4 rows (block 2: keys 0 0 1 1), then a tail block with key -1.
const std::vector<int32_t> kKeys = {0, 0, 1, 1, -1};
const std::vector<int32_t> kRef = {0, 3, 5, 9, 1, 2, 9, 9, 9, 9};  // sentinel 9

CompareReport runs(std::vector<int32_t> got) {
  return compare_runs(got.data(), kRef.data(), int64_t(kRef.size()), kKeys.data(),
                      int64_t(kKeys.size()), Tolerance::multiset(1, 2));
}

TEST(HostMultiset, OrderInsideARunIsFree) {
  EXPECT_TRUE(runs({5, 0, 9, 3, 9, 2, 1, 9, 9, 9}).pass);
  EXPECT_TRUE(runs(kRef).pass);
}

TEST(HostMultiset, EverythingElseCounts) {
  EXPECT_FALSE(runs({0, 3, 5, 1, 9, 2, 9, 9, 9, 9}).pass) << "slots swapped between runs";
  EXPECT_FALSE(runs({0, 3, 5, 0, 1, 2, 9, 9, 9, 9}).pass) << "sentinel written as 0";
  EXPECT_FALSE(runs({0, 3, 5, 9, 1, 9, 9, 9, 9, 9}).pass) << "a slot lost";
  EXPECT_FALSE(runs({0, 3, 5, 9, 1, 2, 9, 9, 9, 4}).pass) << "a slot in the tail";
  const CompareReport r = runs({0, 3, 5, 9, 2, 2, 9, 9, 9, 9});
  EXPECT_NE(r.reason.find("run [4, 8) of key 1"), std::string::npos) << r.str();
}

TEST(HostMultiset, RunsFollowTheKeys) {
  const auto r = key_runs(kKeys.data(), int64_t(kKeys.size()), 2, 10);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], std::make_pair(int64_t(0), int64_t(4)));
  EXPECT_EQ(r[1], std::make_pair(int64_t(4), int64_t(8)));
  EXPECT_EQ(r[2], std::make_pair(int64_t(8), int64_t(10)));
}

// ---------------------------------------------------------------------------------------------
// HostValidation: fake, widely spaced addresses (never launched).

void* at(int i) { return reinterpret_cast<void*>(uintptr_t(i + 1) << 32); }

Args align_call(int64_t t, int64_t k, int e, int block_m, int64_t capacity = -1) {
  if (capacity < 0) capacity = align_capacity(t * k, e, block_m);
  Args a;
  a.inputs = {{at(0), DType::kI32, {t, k}}};
  a.outputs = {{at(1), DType::kI32, {capacity}},
               {at(2), DType::kI32, {capacity / block_m}},
               {at(3), DType::kI32, {1}}};
  a.params = {{"num_experts", double(e)}, {"block_m", double(block_m)}};
  return a;
}

void expect_refused(const Args& a, const std::string& words) {
  for (const Version* v : versions_of(kAlignOp)) {
    const Status s = v->launch(a, nullptr);
    EXPECT_EQ(s.code, Code::kInvalidArgument) << v->name() << ": " << s.str();
    EXPECT_NE(s.message.find(words), std::string::npos) << v->name() << ": " << s.str();
  }
}

TEST(HostValidation, AlignRefusesWhatItCannotSort) {
  EXPECT_EQ(align_capacity(4096 * 8, 256, 64), 48896);
  EXPECT_EQ(align_capacity(1, 8, 16), 128);
  expect_refused(align_call(16, 2, 8, 16, 128 + 16), "capacity");
  expect_refused(align_call(16, 2, 0, 16), "num_experts");
  expect_refused(align_call(16, 2, 1025, 16), "num_experts");
  expect_refused(align_call(16, 2, 8, 2048), "block_m");
  Args a = align_call(16, 2, 8, 16);
  a.params.erase("block_m");
  expect_refused(a, "block_m");
  a = align_call(16, 2, 8, 16);
  a.outputs[1].shape = {a.outputs[1].shape[0] + 1};
  expect_refused(a, "expert_ids");
  a = align_call(16, 2, 8, 16);
  a.outputs[2].data = static_cast<char*>(a.outputs[0].data) + 8;  // inside sorted_token_ids
  expect_refused(a, "overlap");
  a = align_call(16, 2, 8, 16);
  a.inputs[0].dtype = DType::kI64;
  expect_refused(a, "int32");
}

Args router_call(const RouterOp& op, int64_t t, int e, int k) {
  Args a;
  a.inputs = {{at(0), op.logits, {t, e}}};
  if (op.router == Router::kDeepseek) {
    a.inputs.push_back({at(4), DType::kF32, {e}});
    a.params = {{"n_group", 8}, {"topk_group", 4}, {"routed_scaling_factor", 2.5}};
  }
  a.outputs = {{at(1), DType::kF32, {t, k}}, {at(2), DType::kI32, {t, k}}};
  return a;
}

TEST(HostValidation, RoutersRefuseImpossibleChoices) {
  for (const RouterOp* op : {&kTopkSoftmax, &kTopkSoftmaxBf16, &kDeepseek}) {
    for (const Version* v : versions_of(op->name)) {
      EXPECT_EQ(v->launch(router_call(*op, 4, 64, 65), nullptr).code, Code::kInvalidArgument)
          << v->name() << ": k > E";
      EXPECT_EQ(v->launch(router_call(*op, 4, 256, 33), nullptr).code, Code::kInvalidArgument)
          << v->name() << ": k > 32";
      EXPECT_EQ(v->launch(router_call(*op, 4, 2048, 8), nullptr).code, Code::kInvalidArgument)
          << v->name() << ": E > 1024";
      Args mismatched = router_call(*op, 4, 256, 8);
      mismatched.outputs[1].shape = {4, 7};
      EXPECT_EQ(v->launch(mismatched, nullptr).code, Code::kInvalidArgument)
          << v->name() << ": weights and ids of different k";
      if (op->router == Router::kDeepseek) {
        const Status s = v->launch(router_call(*op, 4, 60, 8), nullptr);  // 60 % 8 != 0
        EXPECT_EQ(s.code, Code::kInvalidArgument) << v->name() << ": " << s.str();
        EXPECT_NE(s.message.find("n_group"), std::string::npos) << s.str();
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// BadIds (GPU)

struct AlignRun {
  Status status;
  std::vector<int32_t> sorted, experts;
  int32_t post = 0;
  bool guards = true;
};

AlignRun run_align(const Version& v, const std::vector<int32_t>& ids, int64_t k, int e, int block_m,
                   bool check_ids) {
  const int64_t slots = int64_t(ids.size()), capacity = align_capacity(slots, e, block_m);
  DeviceBuffer ids_gl(4 * slots), sorted_gl(4 * capacity), experts_gl(4 * (capacity / block_m)),
      post_gl(4);
  ids_gl.upload(ids.data());
  for (DeviceBuffer* b : {&sorted_gl, &experts_gl, &post_gl}) b->poison(0x3C);
  Args a;
  a.inputs = {{ids_gl.data(), DType::kI32, {slots / k, k}}};
  a.outputs = {{sorted_gl.data(), DType::kI32, {capacity}},
               {experts_gl.data(), DType::kI32, {capacity / block_m}},
               {post_gl.data(), DType::kI32, {1}}};
  a.params = {{"num_experts", double(e)},
              {"block_m", double(block_m)},
              {"check_ids", check_ids ? 1.0 : 0.0}};
  AlignRun r;
  r.status = v.launch(a, nullptr);
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  r.sorted.resize(capacity);
  r.experts.resize(capacity / block_m);
  sorted_gl.download(r.sorted.data());
  experts_gl.download(r.experts.data());
  post_gl.download(&r.post);
  r.guards = sorted_gl.guard_intact() && experts_gl.guard_intact() && post_gl.guard_intact();
  return r;
}

TEST(BadIds, AreReportedAndNothingIsWrittenOutOfBounds) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::mt19937 rng(random_seed("BadIds"));
  const int e = 60, block_m = 16, k = 4, t = 3000;
  std::vector<int32_t> ids(t * k);
  for (int32_t& id : ids) id = int32_t(rng() % e);
  for (int32_t bad : {e, INT_MAX, -2, INT_MIN}) {
    std::vector<int32_t> with_bad = ids;
    with_bad[rng() % with_bad.size()] = bad;
    for (const Version* v : versions_of(kAlignOp)) {
      for (bool check : {true, false}) {
        const AlignRun r = run_align(*v, with_bad, k, e, block_m, check);
        const std::string what =
            v->name() + " with id " + std::to_string(bad) + (check ? "" : " (check_ids = 0)");
        EXPECT_TRUE(r.guards) << what << ": wrote past the end of an output";
        EXPECT_EQ(r.post, -1) << what << ": num_tokens_post_padded must be -1";
        if (check) {
          EXPECT_EQ(r.status.code, Code::kInvalidArgument) << what << ": " << r.status.str();
          EXPECT_NE(r.status.message.find("expert id"), std::string::npos) << r.status.str();
        } else {
          EXPECT_TRUE(r.status.ok()) << what << ": " << r.status.str();
        }
        for (int32_t row : r.sorted)
          ASSERT_TRUE(row >= 0 && row <= t * k) << what << ": row value " << row;
      }
    }
  }
}

TEST(BadIds, ValidIdsStillPassWithTheCheckOff) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  const std::vector<int32_t> ids = {3, -1, 0, 3, 7, -1, 3, 2};
  for (const Version* v : versions_of(kAlignOp)) {
    const AlignRun r = run_align(*v, ids, 2, 8, 4, false);
    EXPECT_TRUE(r.status.ok()) << v->name() << ": " << r.status.str();
    EXPECT_EQ(r.post, 16) << v->name() << ": experts 0, 2, 3, 7 take a block of 4 each";
    EXPECT_TRUE(r.guards) << v->name();
  }
}

}  // namespace
}  // namespace lkw::moe::test
