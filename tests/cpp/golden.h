// Golden cases: the Python reference (python -m lkw.golden) writes, per chapter, a manifest and
// .npy files with fresh random inputs and the expected outputs; the tests here run every
// registered version on every case of its op and compare.
//
// manifest.txt, one record per line:
//   case <id> <op> <tolerance> <params>     tolerance: exact | ulp:N | close:RTOL:ATOL |
//                                            multiset:KEY:WIDTH (compare.h), or one per output
//                                            joined by '/' (e.g. ulp:2/exact)
//                                            params: - | name=value,name=value
//   in   <id> <index> <dtype> <file>         dtype as numpy/ml_dtypes names it; narrow floats
//   out  <id> <index> <dtype> <file>         are stored as their raw bits (uint8/uint16)
//   init <id> <index> <dtype> <file>         output <index> starts as this file instead of
//                                            poison (an op that updates an output in place, as
//                                            reshape_and_cache updates a KV cache)
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "lkw/buffer.h"
#include "lkw/compare.h"
#include "lkw/npy.h"
#include "lkw/registry.h"

namespace lkw::test {

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A host tensor holding the bytes of v: for checks that build their cases in C++.
template <class T>
HostTensor host_tensor(DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  HostTensor h;
  h.dtype = dtype;
  h.shape = std::move(shape);
  h.bytes.resize(v.size() * sizeof(T));
  std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
  return h;
}

// The seed of such checks' random inputs: LKW_SEED when set, else a fresh one; printed (with
// `what`, the first caller's name for them) once per process.
inline uint32_t random_seed(const char* what) {
  static const uint32_t s = [what] {
    const char* env = std::getenv("LKW_SEED");
    const uint32_t value = env ? uint32_t(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("LKW: %s, seed %u (set LKW_SEED to repeat)\n", what, value);
    return value;
  }();
  return s;
}

struct Case {
  std::string id, op;
  std::vector<Tolerance> tols;  // one per output, or one for all
  const Tolerance& tol(size_t output) const { return tols.size() == 1 ? tols[0] : tols.at(output); }
  std::map<std::string, double> params;
  std::vector<std::string> input_files, output_files;
  std::vector<DType> input_dtypes, output_dtypes;
  std::map<size_t, std::string> init_files;  // output index -> its contents before the launch
};

inline std::string golden_dir() {
  const char* d = std::getenv("LKW_GOLDEN_DIR");
  return d ? d : "golden";
}

// All cases of a chapter, in manifest order. Missing golden data is an error, not a skip.
inline std::vector<Case> load_cases_from(const std::string& dir);
inline std::vector<Case> load_cases(const std::string& chapter) {
  return load_cases_from(golden_dir() + "/" + chapter);
}

inline std::vector<Case> load_cases_from(const std::string& dir) {
  std::ifstream f(dir + "/manifest.txt");
  if (!f) {
    throw std::runtime_error("no golden data at " + dir +
                             " (run: PYTHONPATH=reference python -m lkw.golden --out " +
                             golden_dir() + ")");
  }
  std::vector<Case> cases;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind, id;
    in >> kind >> id;
    if (kind == "case") {
      Case c;
      std::string tol, params;
      c.id = id;
      in >> c.op >> tol >> params;
      std::stringstream ts(tol);
      std::string one;
      while (std::getline(ts, one, '/')) c.tols.push_back(Tolerance::parse(one));
      if (params != "-") {
        std::stringstream ps(params);
        std::string kv;
        while (std::getline(ps, kv, ',')) {
          auto eq = kv.find('=');
          c.params[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
        }
      }
      cases.push_back(c);
    } else if (kind == "in" || kind == "out") {
      int index = 0;
      std::string dtype, file;
      in >> index >> dtype >> file;
      if (cases.empty() || cases.back().id != id) throw std::runtime_error("manifest: orphan " + line);
      DType t;
      if (!dtype_from_name(dtype, &t)) throw std::runtime_error("manifest: unknown dtype " + dtype);
      Case& c = cases.back();
      (kind == "in" ? c.input_files : c.output_files).push_back(dir + "/" + file);
      (kind == "in" ? c.input_dtypes : c.output_dtypes).push_back(t);
    } else if (kind == "init") {
      int index = 0;
      std::string dtype, file;
      in >> index >> dtype >> file;
      if (cases.empty() || cases.back().id != id) throw std::runtime_error("manifest: orphan " + line);
      if (index < 0 || !cases.back().init_files.emplace(size_t(index), dir + "/" + file).second)
        throw std::runtime_error("manifest: bad or repeated init in " + line);
    }
  }
  for (const Case& c : cases)
    for (const auto& [index, file] : c.init_files)
      if (index >= c.output_files.size())
        throw std::runtime_error("manifest: case " + c.id + " has an init for output " +
                                 std::to_string(index) + " of " +
                                 std::to_string(c.output_files.size()));
  for (const Case& c : cases)
    if (c.tols.size() != 1 && c.tols.size() != c.output_files.size())
      throw std::runtime_error("manifest: case " + c.id + " has " + std::to_string(c.tols.size()) +
                               " tolerances for " + std::to_string(c.output_files.size()) +
                               " outputs");
  return cases;
}

inline HostTensor load_tensor(const std::string& file, DType dtype) {
  NpyArray a = npy_read(file);
  HostTensor t;
  t.dtype = dtype;
  t.shape = a.shape;
  t.bytes = std::move(a.bytes);
  if (static_cast<int64_t>(t.bytes.size()) != t.numel() * dtype_size(dtype))
    throw std::runtime_error(file + ": size does not match dtype " + dtype_name(dtype));
  return t;
}

struct CaseData {
  std::vector<HostTensor> inputs, expected;
  std::map<size_t, HostTensor> init;  // outputs that start with given contents
};

inline CaseData load_data(const Case& c) {
  CaseData d;
  for (size_t i = 0; i < c.input_files.size(); ++i)
    d.inputs.push_back(load_tensor(c.input_files[i], c.input_dtypes[i]));
  for (size_t i = 0; i < c.output_files.size(); ++i)
    d.expected.push_back(load_tensor(c.output_files[i], c.output_dtypes[i]));
  for (const auto& [index, file] : c.init_files) {
    HostTensor t = load_tensor(file, c.output_dtypes[index]);
    if (t.bytes.size() != d.expected[index].bytes.size())
      throw std::runtime_error(file + ": the init of output " + std::to_string(index) +
                               " is not the output's size");
    d.init.emplace(index, std::move(t));
  }
  return d;
}

struct RunResult {
  Status status;
  std::vector<CompareReport> reports;
  std::vector<std::string> tolerances;  // per output, as checked
  bool guards_intact = true;
  bool pass() const {
    if (!status.ok() || !guards_intact) return false;
    for (const auto& r : reports)
      if (!r.pass) return false;
    return true;
  }
  std::string str() const {
    std::ostringstream s;
    s << "status " << status.str() << (guards_intact ? "" : "; WROTE PAST THE END of an output");
    for (size_t i = 0; i < reports.size(); ++i)
      s << "\n  out" << i << " (" << tolerances[i] << "): " << reports[i].str();
    return s.str();
  }
};

// Output i of a run against the case's expected output i, under its tolerance. A multiset
// tolerance cuts the rows into runs by the expected value of another output (its key).
inline CompareReport compare_output(const std::vector<uint8_t>& got, const CaseData& d, size_t i,
                                    const Tolerance& tol) {
  const HostTensor& ref = d.expected[i];
  if (tol.mode != Tolerance::Mode::kMultiset)
    return compare(got.data(), ref.bytes.data(), ref.dtype, ref.numel(), tol);
  const size_t key = size_t(tol.key_output);
  if (key >= d.expected.size() || key == i || ref.dtype != DType::kI32 ||
      d.expected[key].dtype != DType::kI32)
    throw std::runtime_error("manifest: a multiset output and its key output must be two "
                             "different int32 outputs");
  return compare(got.data(), ref.bytes.data(), ref.dtype, ref.numel(), tol,
                 reinterpret_cast<const int32_t*>(d.expected[key].bytes.data()),
                 d.expected[key].numel());
}

// Runs version v on the case on the GPU: outputs poisoned with `poison` first (or set to their
// init contents), guard bands checked after.
inline RunResult run_on_gpu(const Version& v, const Case& c, const CaseData& d, uint8_t poison) {
  std::vector<DeviceBuffer> in_bufs, out_bufs;
  Args args;
  args.params = c.params;
  for (const HostTensor& t : d.inputs) {
    in_bufs.emplace_back(t.bytes.size());
    in_bufs.back().upload(t.bytes.data());
    args.inputs.push_back({in_bufs.back().data(), t.dtype, t.shape});
  }
  for (const HostTensor& t : d.expected) {
    out_bufs.emplace_back(t.bytes.size());
    const auto init = d.init.find(out_bufs.size() - 1);
    if (init != d.init.end()) {
      out_bufs.back().upload(init->second.bytes.data());
    } else {
      out_bufs.back().poison(poison);
    }
    args.outputs.push_back({out_bufs.back().data(), t.dtype, t.shape});
  }
  RunResult r;
  r.status = v.launch(args, nullptr);
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  for (size_t i = 0; i < d.expected.size(); ++i) {
    std::vector<uint8_t> got = out_bufs[i].download();
    r.reports.push_back(compare_output(got, d, i, c.tol(i)));
    r.tolerances.push_back(c.tol(i).str());
    r.guards_intact &= out_bufs[i].guard_intact();
  }
  return r;
}

// Arguments with every shape and dtype of the case but the given fake addresses: for checks
// that must be refused before anything is launched.
inline Args fake_args(const Case& c, const CaseData& d, uintptr_t in_addr, uintptr_t out_addr) {
  Args args;
  args.params = c.params;
  for (const HostTensor& t : d.inputs)
    args.inputs.push_back({reinterpret_cast<void*>(in_addr), t.dtype, t.shape});
  for (const HostTensor& t : d.expected)
    args.outputs.push_back({reinterpret_cast<void*>(out_addr), t.dtype, t.shape});
  return args;
}

}  // namespace lkw::test
