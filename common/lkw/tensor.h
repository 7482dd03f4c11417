// TensorRef and Args: the one generic calling convention of the registry. A version's own
// launcher takes raw device pointers and sizes; its chapter's adapter maps Args onto that call.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lkw {

enum class DType { kF32, kF16, kBF16, kE4M3, kE5M2, kI8, kU8, kI32, kU32, kI64 };

inline int dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kE4M3: case DType::kE5M2: case DType::kI8: case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

// Names as numpy / ml_dtypes spell them (the golden files and the Python side use these).
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kE4M3: return "float8_e4m3fn";
    case DType::kE5M2: return "float8_e5m2";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kU32: return "uint32";
    case DType::kI64: return "int64";
  }
  return "?";
}

inline bool dtype_from_name(const std::string& name, DType* out) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2, DType::kI8,
                  DType::kU8, DType::kI32, DType::kU32, DType::kI64}) {
    if (name == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

inline bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kE4M3 ||
         t == DType::kE5M2;
}

// ceil(a / b) for b > 0: the blocks, tiles and groups that cover a length.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// "[a, b, c]": a shape as the launchers' error messages print it.
inline std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// A dense row-major tensor in device memory (or host memory, for host-side checks).
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t bytes() const { return numel() * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
};

// Everything a launch needs: inputs, outputs and named scalar parameters (eps, group size, ...).
struct Args {
  std::vector<TensorRef> inputs;
  std::vector<TensorRef> outputs;
  std::map<std::string, double> params;

  double param(const std::string& name, double fallback) const {
    auto it = params.find(name);
    return it == params.end() ? fallback : it->second;
  }
};

}  // namespace lkw
