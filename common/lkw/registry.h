// The version registry: the one table that tests, bench, Python extension and results read.
//
// Each version file ends with one registration line:
//   const lkw::Register kRegistered{copy_version("v1_vec16", "16-byte loads and stores", ...)};
// The chapter header provides that helper (here copy_version): it fills in the chapter, the op,
// the byte and FLOP models and the adapter from the generic Args to the version's raw-pointer
// launcher. Nothing else keeps a list of versions.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "lkw/status.h"
#include "lkw/tensor.h"

namespace lkw {

// kAblation: a version with one knob turned off (a launcher argument or trait that changes no
// result), tested and benched beside it, never graded.
enum class Kind { kVersion, kPeer, kMutant, kAblation };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kVersion: return "version";
    case Kind::kPeer: return "peer";
    case Kind::kMutant: return "mutant";
    case Kind::kAblation: return "ablation";
  }
  return "?";
}

// What the compiled machine code of a kernel must (not) contain, for each listed arch
// ("sm_80", "sm_89", "sm_90a"; empty = every arch that was built). Opcodes match as prefixes
// of SASS mnemonics with modifiers, e.g. "LDG.E.128", "F2FP", "I2F".
struct SassFact {
  std::string kernel;  // substring of the (mangled) kernel name
  std::vector<std::string> archs;
  std::vector<std::string> must_have;
  std::vector<std::string> must_not_have;
  bool no_local_memory = true;  // no LDL/STL: nothing spilled or indexed at run time
  std::string why;              // the promise in words, shown when the check fails
};

using GenericLaunch = std::function<Status(const Args&, cudaStream_t)>;
using Model = std::function<double(const Args&)>;

struct Version {
  std::string chapter;  // "00_roofline"
  std::string op;       // "copy"
  std::string id;       // "v1_vec16"
  std::string summary;  // one line: what this version changes
  Kind kind = Kind::kVersion;
  int min_arch = 80;
  GenericLaunch launch;
  Model bytes;  // roofline minimum: each input read once, each output written once
  Model flops;
  std::vector<SassFact> sass;
  int kernels_per_launch = 1;  // how many kernels one launch runs (the ncu pass maps by order)

  std::string name() const { return chapter + "/" + op + "/" + id; }
};

// The byte model of most ops: each input read once, each output written once.
inline double io_bytes(const Args& a) {
  double b = 0;
  for (const TensorRef& t : a.inputs) b += double(t.bytes());
  for (const TensorRef& t : a.outputs) b += double(t.bytes());
  return b;
}

// A version's identity, for the chapter helpers (copy_version, cast_version, ...) to complete
// with the launcher and the models.
inline Version version_of(const char* chapter, std::string op, const char* id, const char* summary,
                          Kind kind, std::vector<SassFact> sass) {
  Version v;
  v.chapter = chapter;
  v.op = std::move(op);
  v.id = id;
  v.summary = summary;
  v.kind = kind;
  v.sass = std::move(sass);
  return v;
}

class Registry {
 public:
  static Registry& get() {
    static Registry registry;
    return registry;
  }
  // The bench, the tests and the ncu pass call every version's launcher and both models: a
  // version without one is refused where it is registered (at start-up), in every chapter.
  void add(Version v) {
    if (find(v.name())) throw std::logic_error("version registered twice: " + v.name());
    if (!v.launch || !v.bytes || !v.flops)
      throw std::logic_error("version registered without its launcher or models: " + v.name());
    versions_.push_back(std::move(v));
    std::sort(versions_.begin(), versions_.end(),
              [](const Version& a, const Version& b) { return a.name() < b.name(); });
  }
  const std::vector<Version>& all() const { return versions_; }
  const Version* find(const std::string& name) const {
    for (const Version& v : versions_)
      if (v.name() == name) return &v;
    return nullptr;
  }
  // A version that runs another (a chain of versions, a mutant on altered inputs) finds it here,
  // or says why it cannot run: `user` names the one that needs it.
  Status require(const std::string& name, const std::string& user, const Version** v) const {
    *v = find(name);
    if (*v) return {};
    return error(Code::kInvalidArgument, user + " runs " + name + ", which this build does not register");
  }
  std::vector<const Version*> chapter(const std::string& chapter) const {
    std::vector<const Version*> out;
    for (const Version& v : versions_)
      if (v.chapter == chapter) out.push_back(&v);
    return out;
  }

 private:
  std::vector<Version> versions_;
};

struct Register {
  explicit Register(Version v) { Registry::get().add(std::move(v)); }
};

}  // namespace lkw
