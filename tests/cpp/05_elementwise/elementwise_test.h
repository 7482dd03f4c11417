// Shared by chapter 05's own tests: fresh random inputs and one call that runs a registered
// version through the harness (inputs uploaded, outputs poisoned or given their initial
// contents, an output optionally the very buffer of an input, guard bands checked).
#pragma once
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "elementwise.cuh"
#include "golden.h"

namespace lkw::elementwise::test {

using lkw::test::HostTensor;
using lkw::test::host_tensor;

inline std::mt19937_64 rng_for(const std::string& salt) {
  return std::mt19937_64(lkw::test::random_seed("chapter 05 random inputs") ^
                         std::hash<std::string>{}(salt));
}

inline uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// BF16 [n]: N(0, 1) times 2^u per row of `row` elements, u uniform in [-3, 3].
inline std::vector<uint16_t> random_bf16(std::mt19937_64& rng, int64_t n, int64_t row) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> spread(-3.0f, 3.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  float scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % row == 0) scale = std::exp2(spread(rng));
    v[size_t(i)] = bf16_bits(normal(rng) * scale);
  }
  return v;
}

// The cos/sin cache as elementwise.py builds it (FP32 angle p · inv_freq, cos and sin rounded
// once): the host computes them in double, which is what matters for the tests here (both
// versions under comparison read the same cache).
inline std::vector<float> cos_sin_cache(int64_t max_pos, int64_t rot_dim) {
  std::vector<float> c(size_t(max_pos * rot_dim));
  const int64_t half = rot_dim / 2;
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t j = 0; j < half; ++j) {
      const float inv = float(std::pow(10000.0, -2.0 * double(j) / double(rot_dim)));
      const double angle = double(float(p) * inv);
      c[size_t(p * rot_dim + j)] = float(std::cos(angle));
      c[size_t(p * rot_dim + half + j)] = float(std::sin(angle));
    }
  return c;
}

struct Outputs {
  Status status;
  std::vector<std::vector<uint8_t>> bytes;  // every output, host copies
  bool guards_intact = true;
};

// Runs `version` (its full registry name). `outputs`: a tensor with bytes starts with them,
// one without is poisoned (0xFF). `alias`: output index -> input index whose buffer it is.
inline Outputs run(const std::string& version, const std::vector<HostTensor>& inputs,
                   const std::vector<HostTensor>& outputs, std::map<std::string, double> params,
                   const std::map<size_t, size_t>& alias = {}) {
  const Version* v = Registry::get().find(version);
  if (!v) throw std::runtime_error("not registered: " + version);
  std::vector<DeviceBuffer> in_bufs, out_bufs;
  in_bufs.reserve(inputs.size());
  out_bufs.reserve(outputs.size());
  Args args;
  args.params = std::move(params);
  for (const HostTensor& t : inputs) {
    in_bufs.emplace_back(t.bytes.size());
    in_bufs.back().upload(t.bytes.data());
    args.inputs.push_back({in_bufs.back().data(), t.dtype, t.shape});
  }
  std::vector<DeviceBuffer*> out_of(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const HostTensor& t = outputs[i];
    if (alias.count(i)) {
      out_of[i] = &in_bufs[alias.at(i)];
    } else {
      out_bufs.emplace_back(size_t(t.numel()) * dtype_size(t.dtype));
      out_of[i] = &out_bufs.back();
      if (t.bytes.empty()) {
        out_of[i]->poison();
      } else {
        out_of[i]->upload(t.bytes.data());
      }
    }
    args.outputs.push_back({out_of[i]->data(), t.dtype, t.shape});
  }
  Outputs r;
  r.status = v->launch(args, nullptr);
  LKW_CUDA_CHECK(cudaDeviceSynchronize());
  for (DeviceBuffer* b : out_of) {
    r.bytes.push_back(b->download());
    r.guards_intact &= b->guard_intact();
  }
  return r;
}

// An output of the given dtype and shape that starts poisoned.
inline HostTensor poisoned(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

inline bool skip_without_gpu(std::string* why) {
  if (device_arch() >= 0) return false;
  *why = "no CUDA device on this machine: GPU test skipped";
  return true;
}

inline std::string name(const std::string& op, const std::string& id) {
  return std::string(kChapter) + "/" + op + "/" + id;
}

}  // namespace lkw::elementwise::test
