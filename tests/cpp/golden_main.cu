// The generic tests of one chapter (LKW_CHAPTER), instantiated from the registry:
//   Golden/<version>__<case>   every version and peer on every golden case of its op (GPU)
//   Mutant/<mutant>__<case>    every mutant must FAIL at least one case of its op (GPU); a race
//                              mutant (mutant_race_*: its outputs may still match when the copies
//                              land in time) is racecheck's to catch: skipped here, and run by
//                              tools/device_check.sh under racecheck with LKW_RACE_MUTANTS=1,
//                              which must report hazards
//   Validation/<version>       bad arguments are refused before anything is launched (host)
// Chapter-specific tests (host-built bit functions, ...) live beside this file in tests/cpp/NN_*/.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "golden.h"
#include "lkw/check.h"

namespace lkw::test {
namespace {

const std::vector<Case>& chapter_cases() {
  static const std::vector<Case> cases = [] {
    try {
      return load_cases(LKW_CHAPTER);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "LKW: %s\n", e.what());
      return std::vector<Case>{};
    }
  }();
  return cases;
}

struct Param {
  std::string version;
  std::string case_id;  // empty for per-version tests
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.version << (p.case_id.empty() ? "" : " on ") << p.case_id;
}

std::string sanitize(std::string s) {
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::vector<Param> pairs(Kind want) {
  std::vector<Param> out;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER)) {
    if ((want == Kind::kMutant) != (v->kind == Kind::kMutant)) continue;
    for (const Case& c : chapter_cases())
      if (c.op == v->op) out.push_back({v->name(), want == Kind::kMutant ? "" : c.id});
  }
  // A mutant appears once: it must be caught by at least one case of its op.
  if (want == Kind::kMutant) {
    std::vector<Param> unique;
    std::set<std::string> seen;
    for (const Param& p : out)
      if (seen.insert(p.version).second) unique.push_back(p);
    return unique;
  }
  return out;
}

std::vector<Param> versions_with_cases() {
  std::vector<Param> out;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER))
    for (const Case& c : chapter_cases())
      if (c.op == v->op) {
        out.push_back({v->name(), c.id});
        break;
      }
  return out;
}

std::string param_name(const testing::TestParamInfo<Param>& info) {
  const Version* v = Registry::get().find(info.param.version);
  std::string name = v->op + "__" + v->id;
  if (!info.param.case_id.empty()) name += "__" + info.param.case_id;
  return sanitize(name);
}

const Case& find_case(const std::string& id) {
  for (const Case& c : chapter_cases())
    if (c.id == id) return c;
  throw std::runtime_error("no golden case " + id);
}

// Skips (visibly) when this machine cannot run the version.
bool skip_without_gpu(const Version& v, std::string* why) {
  int arch = device_arch();
  if (arch < 0) {
    *why = "no CUDA device on this machine: GPU test skipped";
    return true;
  }
  if (arch < v.min_arch) {
    *why = "device is sm_" + std::to_string(arch) + ", version needs sm_" +
           std::to_string(v.min_arch);
    return true;
  }
  return false;
}

class Golden : public testing::TestWithParam<Param> {};

TEST_P(Golden, MatchesReference) {
  const Version& v = *Registry::get().find(GetParam().version);
  std::string why;
  if (skip_without_gpu(v, &why)) GTEST_SKIP() << why;
  const Case& c = find_case(GetParam().case_id);
  const CaseData d = load_data(c);
  // Two poison patterns: an element left unwritten cannot match the reference under both.
  for (uint8_t poison : {uint8_t(0xFF), uint8_t(0x3C)}) {
    RunResult r = run_on_gpu(v, c, d, poison);
    EXPECT_TRUE(r.pass()) << v.name() << " on " << c.id << " (poison 0x"
                          << std::hex << int(poison) << std::dec << "): " << r.str();
  }
}

class Mutant : public testing::TestWithParam<Param> {};

bool is_race_mutant(const Version& v) { return v.id.rfind("mutant_race_", 0) == 0; }

TEST_P(Mutant, IsCaught) {
  const Version& v = *Registry::get().find(GetParam().version);
  std::string why;
  if (skip_without_gpu(v, &why)) GTEST_SKIP() << why;
  const bool racecheck_run = std::getenv("LKW_RACE_MUTANTS") != nullptr;
  if (is_race_mutant(v) != racecheck_run)
    GTEST_SKIP() << (racecheck_run ? "not a race mutant"
                                   : "a race: racecheck catches it (tools/device_check.sh sanitize)");
  if (racecheck_run) {  // the sanitizer is the judge: run every case, assert nothing
    for (const Case& c : chapter_cases())
      if (c.op == v.op) run_on_gpu(v, c, load_data(c), 0xFF);
    return;
  }
  int caught = 0, cases = 0;
  for (const Case& c : chapter_cases()) {
    if (c.op != v.op) continue;
    ++cases;
    RunResult r = run_on_gpu(v, c, load_data(c), 0xFF);
    if (!r.pass()) ++caught;
  }
  ASSERT_GT(cases, 0) << "no golden case for op " << v.op;
  EXPECT_GT(caught, 0) << "mutant " << v.name() << " passed all " << cases
                       << " cases: the tests cannot tell it from a correct version";
  std::printf("mutant %s caught by %d of %d cases\n", v.name().c_str(), caught, cases);
}

class Validation : public testing::TestWithParam<Param> {};

// These never reach a kernel: the launcher must refuse first, so they run on any machine.
TEST_P(Validation, RefusesBadArguments) {
  const Version& v = *Registry::get().find(GetParam().version);
  const Case& c = find_case(GetParam().case_id);
  const CaseData d = load_data(c);

  Status none = v.launch(Args{}, nullptr);
  EXPECT_EQ(none.code, Code::kInvalidArgument) << "no tensors: " << none.str();

  Status null_in = v.launch(fake_args(c, d, 0, 0x10000), nullptr);
  EXPECT_EQ(null_in.code, Code::kInvalidArgument) << "null input: " << null_in.str();

  Status null_out = v.launch(fake_args(c, d, 0x10000, 0), nullptr);
  EXPECT_EQ(null_out.code, Code::kInvalidArgument) << "null output: " << null_out.str();

  // 0x10001 is aligned for nothing wider than a byte; every case has a tensor wider than that.
  Status misaligned = v.launch(fake_args(c, d, 0x10001, 0x20001), nullptr);
  EXPECT_EQ(misaligned.code, Code::kInvalidArgument) << "misaligned: " << misaligned.str();

  Args wrong_dtype = fake_args(c, d, 0x10000, 0x8000000);
  wrong_dtype.outputs[0].dtype = wrong_dtype.outputs[0].dtype == DType::kI64 ? DType::kU8 : DType::kI64;
  Status dt = v.launch(wrong_dtype, nullptr);
  EXPECT_EQ(dt.code, Code::kInvalidArgument) << "wrong output dtype: " << dt.str();

  Args empty = fake_args(c, d, 0x10000, 0x8000000);
  for (auto& t : empty.inputs) t.shape.assign(t.shape.size(), 0);
  for (auto& t : empty.outputs) t.shape.assign(t.shape.size(), 0);
  Status zero = v.launch(empty, nullptr);
  EXPECT_EQ(zero.code, Code::kInvalidArgument) << "empty tensors: " << zero.str();
}

INSTANTIATE_TEST_SUITE_P(Chapter, Golden, testing::ValuesIn(pairs(Kind::kVersion)), param_name);
INSTANTIATE_TEST_SUITE_P(Chapter, Mutant, testing::ValuesIn(pairs(Kind::kMutant)), param_name);
INSTANTIATE_TEST_SUITE_P(Chapter, Validation, testing::ValuesIn(versions_with_cases()),
                         param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Mutant);

TEST(HostGoldenData, IsPresentAndCoversEveryOp) {
  ASSERT_FALSE(chapter_cases().empty()) << "no golden cases for " << LKW_CHAPTER;
  for (const Version* v : Registry::get().chapter(LKW_CHAPTER)) {
    bool covered = false;
    for (const Case& c : chapter_cases()) covered |= c.op == v->op;
    EXPECT_TRUE(covered) << v->name() << ": no golden case for op " << v->op;
  }
}

// The manifest reader: one tolerance per output, or one for all; a count that fits neither is
// refused.
TEST(HostManifest, ReadsOneToleranceForEachOutput) {
  char tmpl[] = "/tmp/lkw_manifest_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  auto write = [&](const std::string& tolerance) {
    std::ofstream(dir + "/manifest.txt")
        << "# lkw golden v1\n"
        << "case c1 op " << tolerance << " eps=1e-06\n"
        << "in c1 0 bfloat16 c1.in0.npy\nout c1 0 bfloat16 c1.out0.npy\n"
        << "out c1 1 bfloat16 c1.out1.npy\n";
  };
  write("ulp:2/exact");
  const std::vector<Case> cases = load_cases_from(dir);
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].tol(0).mode, Tolerance::Mode::kUlp);
  EXPECT_EQ(cases[0].tol(0).max_ulp, 2);
  EXPECT_EQ(cases[0].tol(1).mode, Tolerance::Mode::kExact);
  EXPECT_DOUBLE_EQ(cases[0].params.at("eps"), 1e-6);
  write("exact");
  EXPECT_EQ(load_cases_from(dir)[0].tol(1).mode, Tolerance::Mode::kExact);  // one for all
  write("exact/exact/exact");
  EXPECT_THROW(load_cases_from(dir), std::runtime_error);
  std::remove((dir + "/manifest.txt").c_str());
  rmdir(dir.c_str());
}

// An init record gives an output's contents before the launch; one for an output the case does
// not have, or a repeated one, is refused.
TEST(HostManifest, ReadsInitRecords) {
  char tmpl[] = "/tmp/lkw_manifest_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  auto write = [&](const std::string& inits) {
    std::ofstream(dir + "/manifest.txt")
        << "# lkw golden v1\n"
        << "case c1 op exact -\n"
        << "in c1 0 bfloat16 c1.in0.npy\n" << inits
        << "out c1 0 bfloat16 c1.out0.npy\nout c1 1 bfloat16 c1.out1.npy\n";
  };
  write("init c1 1 bfloat16 c1.init1.npy\n");
  const std::vector<Case> cases = load_cases_from(dir);
  ASSERT_EQ(cases.size(), 1u);
  ASSERT_EQ(cases[0].init_files.size(), 1u);
  EXPECT_EQ(cases[0].init_files.at(1), dir + "/c1.init1.npy");
  write("init c1 2 bfloat16 c1.init2.npy\n");
  EXPECT_THROW(load_cases_from(dir), std::runtime_error);
  write("init c1 1 bfloat16 a.npy\ninit c1 1 bfloat16 b.npy\n");
  EXPECT_THROW(load_cases_from(dir), std::runtime_error);
  write("init c2 0 bfloat16 c2.init0.npy\n");
  EXPECT_THROW(load_cases_from(dir), std::runtime_error);
  std::remove((dir + "/manifest.txt").c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace lkw::test

int main(int argc, char** argv) {
  // Read before the parametrized suites are expanded (InitGoogleTest expands them).
  const char* seed = std::getenv("LKW_SEED");
  std::printf("LKW: chapter %s, golden data %s/%s%s%s\n", LKW_CHAPTER,
              lkw::test::golden_dir().c_str(), LKW_CHAPTER, seed ? ", LKW_SEED=" : "",
              seed ? seed : "");
  if (!lkw::has_device()) std::printf("LKW: no CUDA device, every GPU test skipped\n");
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
