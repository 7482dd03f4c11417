// lkw._ext — every registered launcher by name, for notebooks, the bench and experiments.
//
//   from lkw import _ext
//   _ext.versions()                                  # the registry, as a list of dicts
//   _ext.launch("00_roofline/copy/v2_inflight", [src], [dst])
//   _ext.launch(name, [x], [y], params={"eps": 1e-6}, dtypes=["float32", "float8_e4m3fn"])
//   _ext.time(name, [([src], [dst]), ...], warmup=5, iters=50, flush_l2=True, batch=0)
//
// Arrays arrive through DLPack (torch, CuPy, ...): dense, C-contiguous, on the GPU. A narrow
// float that the framework cannot export (FP8) is passed as a uint8 view with its dtype named in
// `dtypes` (one entry per input then output; "" = the array's own dtype). Bad arguments raise
// ValueError with the launcher's message; CUDA failures raise RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "lkw/compare.h"
#include "lkw/registry.h"
#include "timing.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<>;
using ArgSet = std::pair<std::vector<Array>, std::vector<Array>>;

lkw::DType dtype_of(const Array& a) {
  const nb::dlpack::dtype t = a.dtype();
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Float && t.bits == 32) return lkw::DType::kF32;
    if (code == Code::Float && t.bits == 16) return lkw::DType::kF16;
    if (code == Code::Bfloat && t.bits == 16) return lkw::DType::kBF16;
    if (code == Code::Int && t.bits == 8) return lkw::DType::kI8;
    if (code == Code::UInt && t.bits == 8) return lkw::DType::kU8;
    if (code == Code::Int && t.bits == 32) return lkw::DType::kI32;
    if (code == Code::UInt && t.bits == 32) return lkw::DType::kU32;
    if (code == Code::Int && t.bits == 64) return lkw::DType::kI64;
  }
  throw nb::value_error(("unsupported array dtype (DLPack code " + std::to_string(t.code) + ", " +
                         std::to_string(t.bits) + " bits): pass an integer view of the same width "
                         "and name the dtype in dtypes")
                            .c_str());
}

lkw::TensorRef to_ref(const Array& a, const std::string& dtype_name, bool need_device) {
  if (need_device && a.device_type() != nb::device::cuda::value)
    throw nb::value_error("arrays must live on the GPU (DLPack device type CUDA)");
  lkw::TensorRef ref;
  ref.data = const_cast<void*>(a.data());
  for (size_t i = 0; i < a.ndim(); ++i) ref.shape.push_back(a.shape(i));
  // C-contiguity: stride (in elements) of each dim = product of the later dims. DLPack allows
  // producers to omit the strides of a compact array (numpy does): then there is nothing to check.
  if (a.stride_ptr() != nullptr) {
    int64_t expected = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) > 1 && a.stride(i) != expected)
        throw nb::value_error("arrays must be dense and C-contiguous");
      expected *= a.shape(i);
    }
  }
  if (dtype_name.empty()) {
    ref.dtype = dtype_of(a);
    return ref;
  }
  // A named dtype reinterprets the array's bytes; only the last dim changes if widths differ.
  lkw::DType named;
  if (!lkw::dtype_from_name(dtype_name, &named))
    throw nb::value_error(("unknown dtype " + dtype_name).c_str());
  const int item = (a.dtype().bits * a.dtype().lanes + 7) / 8, want = lkw::dtype_size(named);
  if (item != want) {
    if (ref.shape.empty() || (ref.shape.back() * item) % want)
      throw nb::value_error("array size does not fit the named dtype");
    ref.shape.back() = ref.shape.back() * item / want;
  }
  ref.dtype = named;
  return ref;
}

lkw::Args to_args(const std::vector<Array>& inputs, const std::vector<Array>& outputs,
                  const std::map<std::string, double>& params,
                  const std::vector<std::string>& dtypes, bool need_device) {
  if (!dtypes.empty() && dtypes.size() != inputs.size() + outputs.size())
    throw nb::value_error("dtypes needs one entry per input and output");
  auto name = [&](size_t i) { return dtypes.empty() ? std::string() : dtypes[i]; };
  lkw::Args args;
  args.params = params;
  for (size_t i = 0; i < inputs.size(); ++i) args.inputs.push_back(to_ref(inputs[i], name(i), need_device));
  for (size_t i = 0; i < outputs.size(); ++i)
    args.outputs.push_back(to_ref(outputs[i], name(inputs.size() + i), need_device));
  return args;
}

const lkw::Version& find(const std::string& name) {
  const lkw::Version* v = lkw::Registry::get().find(name);
  if (!v) throw nb::value_error(("no registered version named " + name).c_str());
  return *v;
}

void raise_if_failed(const lkw::Status& s) {
  if (s.ok()) return;
  if (s.code == lkw::Code::kInvalidArgument) throw nb::value_error(s.str().c_str());
  throw std::runtime_error(s.str());
}

nb::dict version_dict(const lkw::Version& v) {
  nb::dict d;
  d["name"] = v.name();
  d["chapter"] = v.chapter;
  d["op"] = v.op;
  d["id"] = v.id;
  d["summary"] = v.summary;
  d["kind"] = lkw::kind_name(v.kind);
  d["min_arch"] = v.min_arch;
  d["kernels_per_launch"] = v.kernels_per_launch;
  nb::list facts;
  for (const lkw::SassFact& f : v.sass) {
    nb::dict fd;
    fd["kernel"] = f.kernel;
    fd["archs"] = f.archs;
    fd["must_have"] = f.must_have;
    fd["must_not_have"] = f.must_not_have;
    fd["no_local_memory"] = f.no_local_memory;
    fd["why"] = f.why;
    facts.append(fd);
  }
  d["sass"] = facts;
  return d;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "LLM Kernel Workbook: every registered kernel version, by name";

  m.def("versions", [] {
    nb::list out;
    for (const lkw::Version& v : lkw::Registry::get().all()) out.append(version_dict(v));
    return out;
  }, "The registry: one dict per version, peer and mutant.");

  m.def("launch",
        [](const std::string& name, const std::vector<Array>& inputs,
           const std::vector<Array>& outputs, const std::map<std::string, double>& params,
           const std::vector<std::string>& dtypes, uintptr_t stream) {
          const lkw::Version& v = find(name);
          lkw::Args args = to_args(inputs, outputs, params, dtypes, true);
          raise_if_failed(v.launch(args, reinterpret_cast<cudaStream_t>(stream)));
        },
        "name"_a, "inputs"_a, "outputs"_a, "params"_a = std::map<std::string, double>{},
        "dtypes"_a = std::vector<std::string>{}, "stream"_a = 0,
        "Launch a version on device arrays (asynchronous on `stream`).");

  m.def("model",
        [](const std::string& name, const std::vector<Array>& inputs,
           const std::vector<Array>& outputs, const std::map<std::string, double>& params,
           const std::vector<std::string>& dtypes) {
          const lkw::Version& v = find(name);
          lkw::Args args = to_args(inputs, outputs, params, dtypes, false);
          nb::dict d;
          d["bytes"] = v.bytes(args);
          d["flops"] = v.flops(args);
          return d;
        },
        "name"_a, "inputs"_a, "outputs"_a, "params"_a = std::map<std::string, double>{},
        "dtypes"_a = std::vector<std::string>{},
        "The version's byte and FLOP models for these shapes (arrays may live anywhere).");

  m.def("time",
        [](const std::string& name, const std::vector<ArgSet>& arg_sets,
           const std::map<std::string, double>& params, const std::vector<std::string>& dtypes,
           int warmup, int iters, bool flush_l2, int batch, bool graph) {
          const lkw::Version& v = find(name);
          if (arg_sets.empty()) throw nb::value_error("time needs at least one argument set");
          if (batch < 0) throw nb::value_error("time: batch must be 0 (one launch per pair of events) or more");
          if (graph && batch == 0) throw nb::value_error("time: a graph holds a batch of launches (batch > 0)");
          std::vector<lkw::Args> sets;
          for (const ArgSet& s : arg_sets) sets.push_back(to_args(s.first, s.second, params, dtypes, true));
          lkw::ext::TimeResult t;
          {
            nb::gil_scoped_release release;
            auto launch = [&](int i) { return v.launch(sets[i % sets.size()], nullptr); };
            auto launch_on = [&](int i, cudaStream_t stream) { return v.launch(sets[i % sets.size()], stream); };
            t = graph       ? lkw::ext::time_in_graph(launch_on, warmup, iters, batch)
                : batch > 0 ? lkw::ext::time_back_to_back(launch, warmup, iters, batch)
                            : lkw::ext::time_launches(launch, warmup, iters, flush_l2);
          }
          nb::dict d;
          d["median_us"] = t.median_us;
          d["min_us"] = t.min_us;
          d["max_us"] = t.max_us;
          d["iters"] = t.iters;
          return d;
        },
        "name"_a, "arg_sets"_a, "params"_a = std::map<std::string, double>{},
        "dtypes"_a = std::vector<std::string>{}, "warmup"_a = 5, "iters"_a = 50,
        "flush_l2"_a = true, "batch"_a = 0, "graph"_a = false,
        "Median time of many launches (CUDA events), rotating over the (inputs, outputs) sets; "
        "batch > 0: `iters` batches of `batch` launches back to back, the median per launch; "
        "graph: the batch captured once in a CUDA graph, `iters` launches of the graph.");

  // Host buffers come as addresses (numpy: arr.ctypes.data), not through DLPack: the harness's
  // comparison only needs the bits, and it avoids one more import path for host memory.
  m.def("compare",
        [](uintptr_t got, uintptr_t ref, int64_t count, const std::string& dtype,
           const std::string& tol, uintptr_t key, int64_t keys) {
          lkw::DType t;
          if (!lkw::dtype_from_name(dtype, &t)) throw nb::value_error(("unknown dtype " + dtype).c_str());
          if (!got || !ref || count < 0) throw nb::value_error("compare: bad buffers");
          lkw::CompareReport rep;
          try {
            rep = lkw::compare(reinterpret_cast<const void*>(got), reinterpret_cast<const void*>(ref),
                               t, count, lkw::Tolerance::parse(tol),
                               reinterpret_cast<const int32_t*>(key), keys);
          } catch (const std::invalid_argument& e) {
            throw nb::value_error(e.what());
          }
          nb::dict d;
          d["pass"] = rep.pass;
          d["count"] = rep.count;
          d["bad"] = rep.bad;
          d["first_bad"] = rep.first_bad;
          d["max_abs"] = rep.max_abs;
          d["max_rel"] = rep.max_rel;
          d["max_ulp"] = rep.max_ulp;
          d["text"] = rep.str();
          return d;
        },
        "got"_a, "ref"_a, "count"_a, "dtype"_a, "tolerance"_a = "exact", "key"_a = uintptr_t(0),
        "keys"_a = int64_t(0),
        "The harness's comparison (common/lkw/compare.h) of two host buffers of `count` `dtype`s; "
        "a multiset tolerance also takes the reference's int32 key output (`keys` elements).");

  m.def("flush_l2", [] { lkw::ext::flush_l2(); },
        "Read twice the L2's size: evicts (and writes back) whatever the last kernel left there.");

  m.def("device", [] {
    const lkw::ext::DeviceInfo i = lkw::ext::device_info();
    nb::dict d;
    d["present"] = i.present;
    d["name"] = i.name;
    d["arch"] = i.arch;
    d["sms"] = i.sms;
    d["l2_bytes"] = i.l2_bytes;
    d["memory_bytes"] = i.memory_bytes;
    d["driver_version"] = i.driver;
    d["runtime_version"] = i.runtime;
    return d;
  }, "The current GPU, or present=False without one.");
}
