// Shared by chapter 04's own tests: fresh random problems, the contract computed on the host, and
// one call that runs a registered version on a problem through the harness (inputs uploaded,
// outputs poisoned, guard bands checked).
#pragma once
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "rmsnorm.cuh"

namespace lkw::rmsnorm::test {

// The seed of this process's random inputs: LKW_SEED when set, else a fresh one; printed once.
inline uint64_t seed() {
  static const uint64_t value = [] {
    const char* env = std::getenv("LKW_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("LKW: chapter 04 random inputs from seed %llu (set LKW_SEED to repeat)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return value;
}

inline const NormOp& norm_op(const std::string& name) {
  for (const NormOp* op :
       {&kRmsnorm, &kFusedAdd, &kFusedAddFp8, &kFusedAddInt8, &kFusedAddFp8Group})
    if (name == op->name) return *op;
  throw std::invalid_argument("not a chapter 04 op: " + name);
}

// Whether the op takes rows of d elements at all (a group op: d a multiple of its group).
inline bool takes(const NormOp& op, int64_t d) { return !op.group || d % op.group == 0; }

inline uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
inline float bf16_round(float f) { return bf16_bits_to_f32(bf16_bits(f)); }

// One problem: BF16 bits of x, residual and weight, as the golden cases draw them.
struct Problem {
  int64_t t = 0, d = 0;
  double eps = 1e-6;
  std::vector<uint16_t> x, residual, weight;
};

// x: normal samples, each row times 2^u with u uniform in [-4, 4] (rows of different size);
// residual: the same kind of rows times 4 (so that bf16(x + residual) rounds). "small": rows with
// mean(x²) ≈ 1e-6, the size of eps, and residual = x / 2. weight: N(1, 0.25), never near 0.
inline Problem make_problem(const std::string& salt, int64_t t, int64_t d, double eps,
                            bool small = false) {
  std::mt19937_64 rng(seed() ^ std::hash<std::string>{}(salt));
  std::normal_distribution<float> normal(0.0f, 1.0f), weight(1.0f, 0.25f);
  std::uniform_real_distribution<float> spread(-4.0f, 4.0f);
  auto rows = [&](float factor) {
    std::vector<uint16_t> v(size_t(t * d));
    for (int64_t r = 0; r < t; ++r) {
      const float row_scale = small ? 1.0f : std::exp2(spread(rng));
      for (int64_t k = 0; k < d; ++k)
        v[r * d + k] = bf16_bits(bf16_round(normal(rng) * row_scale) * factor);
    }
    return v;
  };
  Problem p;
  p.t = t, p.d = d, p.eps = eps;
  p.x = rows(small ? 1e-3f : 1.0f);
  if (small) {
    p.residual.resize(p.x.size());
    for (size_t i = 0; i < p.x.size(); ++i)
      p.residual[i] = bf16_bits(bf16_bits_to_f32(p.x[i]) * 0.5f);
  } else {
    p.residual = rows(4.0f);
  }
  p.weight.resize(size_t(d));
  for (uint16_t& w : p.weight) {
    const float v = weight(rng);
    w = bf16_bits(std::fabs(v) < 1e-2f ? 1.0f : v);
  }
  return p;
}

// The contract (reference/lkw/rmsnorm.py) on the host: the sum of squares in FP64, then the same
// FP32 roundings as the kernels.
struct Expected {
  std::vector<uint16_t> y, residual_out;
};
inline Expected reference(const Problem& p, bool fused) {
  Expected e;
  e.y.resize(p.x.size());
  if (fused) e.residual_out.resize(p.x.size());
  std::vector<float> v(size_t(p.d));
  for (int64_t r = 0; r < p.t; ++r) {
    double ss = 0;
    for (int64_t k = 0; k < p.d; ++k) {
      const size_t i = size_t(r * p.d + k);
      float value = bf16_bits_to_f32(p.x[i]);
      if (fused) {
        e.residual_out[i] = bf16_bits(value + bf16_bits_to_f32(p.residual[i]));
        value = bf16_bits_to_f32(e.residual_out[i]);
      }
      v[size_t(k)] = value;
      ss += double(value) * value;
    }
    const float rstd = float(1.0 / std::sqrt(ss / double(p.d) + double(float(p.eps))));
    for (int64_t k = 0; k < p.d; ++k) {
      const float z = bf16_round(v[size_t(k)] * rstd);
      e.y[size_t(r * p.d + k)] = bf16_bits(z * bf16_bits_to_f32(p.weight[size_t(k)]));
    }
  }
  return e;
}

// The op's outputs in registry order, with their dtypes and shapes.
struct OutputSpec {
  DType dtype;
  std::vector<int64_t> shape;
};
inline std::vector<OutputSpec> output_specs(const NormOp& op, int64_t t, int64_t d) {
  std::vector<OutputSpec> out;
  if (op.quant == Quant::kNone) out.push_back({DType::kBF16, {t, d}});
  if (op.quant != Quant::kNone) {
    out.push_back({op.quant == Quant::kFp8 ? DType::kE4M3 : DType::kI8, {t, d}});
    out.push_back({DType::kF32, scales_shape(op, t, d)});
  }
  if (op.residual) out.push_back({DType::kBF16, {t, d}});
  return out;
}

struct Result {
  Status status;
  std::vector<std::vector<uint8_t>> outputs;  // in registry order, host bytes (also if refused)
  std::vector<OutputSpec> specs;
  bool guards_intact = true;
};

// Runs version `v` on the problem (with p.eps) on the GPU. Outputs are poisoned (0xFF) first and
// downloaded even when the launch is refused (a refusal must write nothing); with `in_place`,
// residual_out is the residual input buffer itself.
inline Result run(const Version& v, const Problem& p, bool in_place = false) {
  const NormOp& op = norm_op(v.op);
  Result result;
  result.specs = output_specs(op, p.t, p.d);
  std::vector<DeviceBuffer> inputs, outputs;
  Args args;
  args.params["eps"] = p.eps;
  auto input = [&](const std::vector<uint16_t>& host, std::vector<int64_t> shape) {
    inputs.emplace_back(host.size() * 2);
    inputs.back().upload(host.data());
    args.inputs.push_back({inputs.back().data(), DType::kBF16, std::move(shape)});
  };
  input(p.x, {p.t, p.d});
  if (op.residual) input(p.residual, {p.t, p.d});
  input(p.weight, {p.d});
  for (size_t i = 0; i < result.specs.size(); ++i) {
    const OutputSpec& spec = result.specs[i];
    const bool residual_out = op.residual && i + 1 == result.specs.size();
    if (residual_out && in_place) {
      args.outputs.push_back({args.inputs[1].data, spec.dtype, spec.shape});
      continue;
    }
    int64_t n = 1;
    for (int64_t extent : spec.shape) n *= extent;
    outputs.emplace_back(size_t(n) * dtype_size(spec.dtype));
    outputs.back().poison();
    args.outputs.push_back({outputs.back().data(), spec.dtype, spec.shape});
  }
  result.status = v.launch(args, nullptr);
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  size_t next = 0;
  for (size_t i = 0; i < result.specs.size(); ++i) {
    const bool residual_out = op.residual && i + 1 == result.specs.size();
    const DeviceBuffer& buffer = residual_out && in_place ? inputs[1] : outputs[next++];
    result.outputs.push_back(buffer.download());
    result.guards_intact &= buffer.guard_intact();
  }
  return result;
}

inline int64_t numel(const OutputSpec& spec) {
  int64_t n = 1;
  for (int64_t extent : spec.shape) n *= extent;
  return n;
}

// The harness's comparison of one output with expected host bytes.
inline CompareReport compare_output(const Result& r, size_t i, const void* expected,
                                    const Tolerance& tol) {
  return compare(r.outputs.at(i).data(), expected, r.specs.at(i).dtype, numel(r.specs[i]), tol);
}

inline const Version& registered(const std::string& name) {
  const Version* v = Registry::get().find(name);
  if (!v) throw std::runtime_error("not registered: " + name);
  return *v;
}

// "<op>__<version>__t<T>_d<d>": the grader reads op and version from a test's name.
inline std::string case_name(const std::string& version, int64_t t, int64_t d) {
  const Version& v = registered(version);
  return v.op + "__" + v.id + "__t" + std::to_string(t) + "_d" + std::to_string(d);
}

// A parameterized case of the GPU tests: a version at a shape (T rows of d), named by case_name.
struct Shape {
  int64_t t, d;
};
struct Param {
  std::string version;
  Shape shape;
};
inline void PrintTo(const Param& p, std::ostream* os) {
  *os << p.version << " at T = " << p.shape.t << ", d = " << p.shape.d;
}
inline std::string param_name(const testing::TestParamInfo<Param>& info) {
  return case_name(info.param.version, info.param.shape.t, info.param.shape.d);
}

inline bool skip_without_gpu(std::string* why) {
  if (device_arch() >= 0) return false;
  *why = "no CUDA device on this machine: GPU test skipped";
  return true;
}

// Every registered version (not peer, not mutant) of chapter 04 whose op passes `keep`.
template <class Keep>
std::vector<std::string> versions_where(Keep keep) {
  std::vector<std::string> out;
  for (const Version* v : Registry::get().chapter(kChapter))
    if (v->kind == Kind::kVersion && keep(norm_op(v->op))) out.push_back(v->name());
  return out;
}

}  // namespace lkw::rmsnorm::test
