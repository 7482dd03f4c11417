// lkw_sass_check — checks every registered version's SASS facts in the machine code of this very
// binary (which links every kernel), for every architecture the build targeted. No GPU needed.
//
//   build/lkw_sass_check                 check all facts, print one line per fact and arch
//   build/lkw_sass_check --mix FILE      also write each version's instruction mix as JSON
//   build/lkw_sass_check --mix-check F   fail if F (the committed mix, which the book shows) is stale
//
// A fact names a kernel (substrings joined by '*', in order, matched against the mangled name),
// the opcodes that must / must not appear (matched as a prefix of the mnemonic at a '.'
// boundary: "LDG.E" matches LDG.E.128), and whether local memory (LDL/STL) is forbidden.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lkw/registry.h"

namespace {

using Sass = std::map<std::string, std::vector<std::string>>;  // kernel → mnemonics, in order

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Runs cuobjdump on this executable for one arch and splits its output by function.
Sass read_sass(const std::string& arch) {
  // Our own path: /proc/self/exe inside popen's shell would name the shell.
  char self[4096] = {0};
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) throw std::runtime_error("cannot find this executable's path");
  const std::string cmd = std::string("'") + LKW_CUOBJDUMP + "' -sass -arch " + arch + " '" +
                          std::string(self, len) + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  Sass sass;
  std::string current;
  char buf[8192];
  while (fgets(buf, sizeof(buf), pipe.get())) {
    std::string line(buf);
    auto f = line.find("Function : ");
    if (f != std::string::npos) {
      current = line.substr(f + 11);
      current.erase(current.find_last_not_of(" \r\n") + 1);
      sass[current];
      continue;
    }
    // Instruction lines look like: /*0040*/   @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;
    auto c = line.find("*/");
    if (current.empty() || line.find("/*") == std::string::npos || c == std::string::npos) continue;
    std::istringstream in(line.substr(c + 2));
    std::string tok;
    in >> tok;
    if (!tok.empty() && tok[0] == '@') in >> tok;  // predicate
    if (tok.empty() || tok[0] == '/' || tok == "{" || tok == "}") continue;
    if (tok.back() == ';') tok.pop_back();
    sass[current].push_back(tok);
  }
  return sass;
}

bool kernel_matches(const std::string& mangled, const std::string& pattern) {
  size_t at = 0;
  for (const std::string& part : split(pattern, '*')) {
    at = mangled.find(part, at);
    if (at == std::string::npos) return false;
    at += part.size();
  }
  return true;
}

// op matches the opcode and its variants ("LDGSTS.E" also LDGSTS.E.BYPASS.128), or, ending in
// '$', that opcode alone ("LDGSTS.E$": the plain 4-byte copy, not the 16-byte ones).
bool has_opcode(const std::vector<std::string>& code, const std::string& op) {
  if (!op.empty() && op.back() == '$') {
    const std::string exact = op.substr(0, op.size() - 1);
    for (const std::string& m : code)
      if (m == exact) return true;
    return false;
  }
  for (const std::string& m : code)
    if (m == op || (m.compare(0, op.size(), op) == 0 && m[op.size()] == '.')) return true;
  return false;
}

std::string base_opcode(const std::string& m) { return m.substr(0, m.find('.')); }

// What is wrong with one fact in one arch's SASS (empty: the fact holds).
std::vector<std::string> check_fact(const lkw::SassFact& fact, const Sass& sass) {
  std::vector<std::string> problems;
  int kernels = 0;
  for (const auto& [name, code] : sass) {
    if (!kernel_matches(name, fact.kernel)) continue;
    ++kernels;
    for (const std::string& op : fact.must_have)
      if (!has_opcode(code, op)) problems.push_back("lacks " + op);
    for (const std::string& op : fact.must_not_have)
      if (has_opcode(code, op)) problems.push_back("has " + op);
    if (fact.no_local_memory && (has_opcode(code, "LDL") || has_opcode(code, "STL")))
      problems.push_back("uses local memory (LDL/STL)");
  }
  if (kernels == 0) problems.push_back("no kernel matches '" + fact.kernel + "'");
  return problems;
}

// The checker checks: false facts about kernels we know must be reported.
bool checker_catches_false_facts(const Sass& sass) {
  const lkw::SassFact wide_v0{"copy_v0_scalar_kernel", {}, {"LDG.E.128"}, {}, true, ""};
  const lkw::SassFact narrow_v1{"copy_v1_vec16_kernel", {}, {}, {"LDG.E.128"}, true, ""};
  const lkw::SassFact missing{"no_such_kernel", {}, {}, {}, true, ""};
  // '$': v0 stores with STG.E itself, and loads only with LDG.E.CONSTANT, which "LDG.E$" must not take
  const lkw::SassFact exact_store{"copy_v0_scalar_kernel", {}, {}, {"STG.E$"}, true, ""};
  const lkw::SassFact exact_load{"copy_v0_scalar_kernel", {}, {"LDG.E$"}, {}, true, ""};
  return !check_fact(wide_v0, sass).empty() && !check_fact(narrow_v1, sass).empty() &&
         !check_fact(missing, sass).empty() && !check_fact(exact_store, sass).empty() &&
         !check_fact(exact_load, sass).empty();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mix_path, mix_check_path;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--mix") mix_path = argv[i + 1];
    if (std::string(argv[i]) == "--mix-check") mix_check_path = argv[i + 1];
  }
  if (std::string(LKW_CUOBJDUMP).empty() || std::string(LKW_CUOBJDUMP).find("NOTFOUND") != std::string::npos) {
    std::printf("FAIL: cuobjdump was not found at configure time (install nvidia-cuda-cuobjdump)\n");
    return 1;
  }
  std::vector<std::string> archs;
  for (const std::string& a : split(LKW_CUDA_ARCHS, ','))
    archs.push_back("sm_" + split(a, '-')[0]);  // "90a-real" → sm_90a

  int checked = 0, failed = 0;
  std::ostringstream mix;
  mix << "{";
  for (size_t ai = 0; ai < archs.size(); ++ai) {
    const std::string& arch = archs[ai];
    const Sass sass = read_sass(arch);
    if (sass.empty()) {
      std::printf("FAIL %s: cuobjdump found no SASS in this binary\n", arch.c_str());
      ++failed;
      continue;
    }
    ++checked;
    if (!checker_catches_false_facts(sass)) {
      std::printf("FAIL %s: the checker accepted false facts about the chapter 00 copies\n", arch.c_str());
      ++failed;
    }
    for (const lkw::Version& v : lkw::Registry::get().all()) {
      for (const lkw::SassFact& fact : v.sass) {
        bool applies = fact.archs.empty();
        for (const std::string& a : fact.archs) applies |= (a == arch);
        if (!applies) continue;
        const std::vector<std::string> problems = check_fact(fact, sass);
        ++checked;
        failed += !problems.empty();
        std::string detail;
        for (const std::string& p : problems) detail += (detail.empty() ? "" : ", ") + p;
        std::printf("%s %-6s %-40s %s%s%s\n", problems.empty() ? "ok  " : "FAIL", arch.c_str(),
                    v.name().c_str(), fact.why.c_str(), problems.empty() ? "" : ": ",
                    detail.c_str());
      }
    }
    // The instruction mix of each version's kernels (those its first fact names), by opcode.
    mix << (ai ? "," : "") << "\n \"" << arch << "\": {";
    bool first = true;
    for (const lkw::Version& v : lkw::Registry::get().all()) {
      if (v.sass.empty()) continue;
      std::map<std::string, int> counts;
      for (const auto& [name, code] : sass)
        if (kernel_matches(name, v.sass[0].kernel))
          for (const std::string& m : code) ++counts[base_opcode(m)];
      mix << (first ? "" : ",") << "\n  \"" << v.name() << "\": {";
      bool f2 = true;
      for (const auto& [op, n] : counts) {
        mix << (f2 ? "" : ", ") << "\"" << op << "\": " << n;
        f2 = false;
      }
      mix << "}";
      first = false;
    }
    mix << "}";
  }
  mix << "\n}\n";
  if (!mix_path.empty()) std::ofstream(mix_path) << mix.str();
  if (!mix_check_path.empty()) {
    std::ifstream committed(mix_check_path);
    std::stringstream text;
    text << committed.rdbuf();
    ++checked;
    if (text.str() != mix.str()) {
      std::printf("FAIL the instruction mix in %s is stale: rewrite it with lkw_sass_check --mix\n",
                  mix_check_path.c_str());
      ++failed;
    }
  }
  std::printf("%d passed, %d failed\n", checked - failed, failed);
  return failed == 0 && checked > 0 ? 0 : 1;
}
