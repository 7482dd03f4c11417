// The layer's inputs: the order of layer.h read off the generic Args (slice), and every tensor
// checked against the shape the layer implies (describe), with a message that names the tensor.
#include <cmath>
#include <string>

#include "layer.h"

namespace lkw::layer {

const char* format_name(Format f) {
  return f == Format::kBf16 ? "bf16" : f == Format::kW4a16 ? "w4a16" : "fp8";
}
int tensors_per_linear(Format f) { return f == Format::kBf16 ? 1 : f == Format::kW4a16 ? 4 : 2; }
int input_count(Format f) { return 6 + 2 + 4 * tensors_per_linear(f); }

namespace {

// "name must be DTYPE [a, b] (got DTYPE [c, d])", or ok.
Status expect(const TensorRef& t, const std::string& name, DType dtype,
              const std::vector<int64_t>& shape) {
  if (t.dtype == dtype && t.shape == shape) return {};
  return error(Code::kInvalidArgument, name + " must be " + dtype_name(dtype) + " " +
                                           shape_text(shape) + " (got " + dtype_name(t.dtype) +
                                           " " + shape_text(t.shape) + ")");
}

// A projection's tensors checked against [N, K] in the format.
Status expect_linear(Format f, const Linear& lin, const std::string& name, int64_t n, int64_t k) {
  const std::string what = name + " [N, K] = " + shape_text({n, k});
  const int64_t kg = k / kGroup;
  Status s = Check()
                 .that(f == Format::kBf16 || k % kGroup == 0,
                       what + ": K must be a multiple of 128 in format " + format_name(f))
                 .that(f != Format::kW4a16 || n % 64 == 0,
                       what + ": W4A16 needs N a multiple of 64 (chapter 07's tiles)")
                 .that(f != Format::kFp8 || n % 16 == 0, what + ": FP8 needs N a multiple of 16")
                 .status();
  if (!s.ok()) return s;
  const auto& t = lin.tensors;
  switch (f) {
    case Format::kBf16:
      return expect(t[0], name + " weight", DType::kBF16, {n, k});
    case Format::kW4a16:
      if (s = expect(t[0], name + " w_tiled", DType::kU32,
                     {ceil_div(n, 16) * 16, ceil_div(k / 8, 32) * 32});
          !s.ok())
        return s;
      if (s = expect(t[1], name + " scales_nk", DType::kBF16, {n, kg}); !s.ok()) return s;
      if (s = expect(t[2], name + " w_repacked", DType::kU32, {n / 64, 8 * k}); !s.ok()) return s;
      return expect(t[3], name + " scales_kn", DType::kBF16, {kg, n});
    case Format::kFp8:
      if (s = expect(t[0], name + " weight", DType::kE4M3, {n, k}); !s.ok()) return s;
      return expect(t[1], name + " scales", DType::kF32, {ceil_div(n, 128), kg});
  }
  return s;
}

// The [N, K] a projection's tensors claim (the first tensor's rows and columns, unpacked).
void linear_dims(Format f, Linear* lin) {
  const TensorRef& t = lin->tensors[0];
  if (t.shape.size() != 2) return;
  if (f == Format::kW4a16) {  // N, K from scales_nk [N, K/128]; the other three must agree
    const TensorRef& s = lin->tensors[1];
    if (s.shape.size() == 2) lin->n = s.dim(0), lin->k = s.dim(1) * kGroup;
  } else {
    lin->n = t.dim(0), lin->k = t.dim(1);
  }
}

}  // namespace

void slice(Format f, const Args& a, LayerTensors* out) {
  LayerTensors& l = *out;
  l.format = f;
  l.eps = float(a.param("eps", 0));
  const auto& in = a.inputs;
  l.x = in[0], l.residual = in[1], l.positions = in[2], l.slot_mapping = in[3];
  l.block_table = in[4], l.cos_sin = in[5], l.norm1 = in[6];
  const int per = tensors_per_linear(f);
  int i = 7;
  for (Linear* lin : {&l.qkv, &l.o}) {
    lin->tensors.assign(in.begin() + i, in.begin() + i + per);
    i += per;
  }
  l.norm2 = in[i++];
  for (Linear* lin : {&l.gate_up, &l.down}) {
    lin->tensors.assign(in.begin() + i, in.begin() + i + per);
    i += per;
  }
  for (Linear* lin : {&l.qkv, &l.o, &l.gate_up, &l.down}) linear_dims(f, lin);
  l.key_cache = a.outputs[0], l.value_cache = a.outputs[1];
  l.out = a.outputs[2], l.residual_out = a.outputs[3];
}

Status describe(Format f, const Args& a, LayerTensors* out) {
  const int n_in = input_count(f);
  Status s = Check()
                 .that(int(a.inputs.size()) == n_in && a.outputs.size() == 4,
                       std::string("decoder_layer_") + format_name(f) + " takes " +
                           std::to_string(n_in) + " inputs and 4 outputs (key_cache, value_cache, "
                           "out, residual_out): see layer.h for the order")
                 .that(a.params.count("eps") == 1, "decoder_layer needs the param eps")
                 .status();
  if (!s.ok()) return s;
  LayerTensors l;
  slice(f, a, &l);
  const std::vector<TensorRef>& in = a.inputs;
  // The shape, from x, the value cache and the projections.
  LayerShape& sh = l.shape;
  s = Check()
          .that(l.x.dtype == DType::kBF16 && l.x.shape.size() == 2, "x must be bfloat16 [T, d]")
          .that(l.value_cache.dtype == DType::kBF16 && l.value_cache.shape.size() == 4,
                "value_cache must be bfloat16 [blocks, Hkv, D, bs] (the paged layout)")
          .that(l.cos_sin.dtype == DType::kF32 && l.cos_sin.shape.size() == 2,
                "cos_sin_cache must be float32 [P, D]")
          .that(l.block_table.dtype == DType::kI64 && l.block_table.shape.size() == 1,
                "block_table must be int64 [B]")
          .status();
  if (!s.ok()) return s;
  sh.t = l.x.dim(0), sh.d = l.x.dim(1);
  sh.num_blocks = l.value_cache.dim(0), sh.hkv = l.value_cache.dim(1);
  sh.head_dim = l.value_cache.dim(2), sh.block_size = l.value_cache.dim(3);
  sh.table_blocks = l.block_table.dim(0), sh.max_pos = l.cos_sin.dim(0);
  const int64_t hd = sh.head_dim;
  s = Check()
          .positive(sh.t, "T")
          .positive(sh.d, "d")
          .that(sh.t <= 65535, "T must be at most 65535 (the attention grid)")
          .positive(sh.num_blocks, "the cache's blocks")
          .positive(sh.hkv, "Hkv")
          .positive(sh.block_size, "block_size")
          .that(sh.block_size % 8 == 0, "block_size must be a multiple of 8 (the attention's 16-byte value loads)")
          .positive(sh.table_blocks, "the block table's length")
          .positive(sh.max_pos, "the cos_sin_cache's rows")
          .that(hd > 0 && hd % 8 == 0 && hd <= kMaxHeadDim,
                "D (value_cache dim 2) must be a multiple of 8 up to 256")
          .that(l.cos_sin.dim(1) == hd, "cos_sin_cache must be [P, D]: RoPE over the whole head")
          .that(l.qkv.k == sh.d, "qkv's K must be d = " + std::to_string(sh.d) + " (got " +
                                     std::to_string(l.qkv.k) + ")")
          .that(hd > 0 && l.qkv.n % hd == 0 && l.qkv.n / hd > 2 * sh.hkv,
                "qkv's N must be (Hq + 2 Hkv) D with Hq >= 1")
          .status();
  if (!s.ok()) return s;
  sh.hq = l.qkv.n / hd - 2 * sh.hkv;
  sh.d_ff = l.gate_up.n / 2;
  s = Check()
          .that(sh.hq % sh.hkv == 0, "Hq = " + std::to_string(sh.hq) +
                                         " must be a multiple of Hkv = " + std::to_string(sh.hkv))
          .that(sh.d_ff > 0 && l.gate_up.n % 2 == 0, "gate_up's N must be 2 d_ff")
          .that(f == Format::kBf16 || sh.d_ff % kGroup == 0,
                "d_ff must be a multiple of 128 outside BF16 (the groups of the down GEMM's K)")
          .status();
  if (!s.ok()) return s;
  const int64_t t = sh.t, d = sh.d;
  if (s = expect_linear(f, l.qkv, "qkv", sh.qkv_n(), d); !s.ok()) return s;
  if (s = expect_linear(f, l.o, "o", d, sh.hq * hd); !s.ok()) return s;
  if (s = expect_linear(f, l.gate_up, "gate_up", 2 * sh.d_ff, d); !s.ok()) return s;
  if (s = expect_linear(f, l.down, "down", d, sh.d_ff); !s.ok()) return s;
  const struct {
    const TensorRef* t;
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  } fixed[] = {
      {&l.residual, "residual", DType::kBF16, {t, d}},
      {&l.positions, "positions", DType::kI64, {t}},
      {&l.slot_mapping, "slot_mapping", DType::kI64, {t}},
      {&l.norm1, "norm1", DType::kBF16, {d}},
      {&l.norm2, "norm2", DType::kBF16, {d}},
      {&l.key_cache, "key_cache", DType::kBF16, {sh.num_blocks, sh.hkv, hd / 8, sh.block_size, 8}},
      {&l.out, "out", DType::kBF16, {t, d}},
      {&l.residual_out, "residual_out", DType::kBF16, {t, d}},
  };
  for (const auto& e : fixed)
    if (s = expect(*e.t, e.name, e.dtype, e.shape); !s.ok()) return s;

  // Addresses: every tensor present and 16-byte aligned (the kernels' vector width); outputs
  // apart from every input and from each other, except residual_out == residual (in place).
  Check c;
  for (size_t k = 0; k < in.size(); ++k)
    c.not_null(in[k].data, ("input " + std::to_string(k)).c_str())
        .aligned(in[k].data, 16, ("input " + std::to_string(k)).c_str());
  for (size_t o = 0; o < a.outputs.size(); ++o)
    c.not_null(a.outputs[o].data, ("output " + std::to_string(o)).c_str())
        .aligned(a.outputs[o].data, 16, ("output " + std::to_string(o)).c_str());
  for (size_t o = 0; o < a.outputs.size(); ++o) {
    const TensorRef& y = a.outputs[o];
    for (size_t k = 0; k < in.size(); ++k)
      if (!(o == 3 && k == 1 && y.data == in[k].data))
        c.disjoint(y.data, y.bytes(), in[k].data, in[k].bytes(),
                   ("output " + std::to_string(o) + " and input " + std::to_string(k)).c_str());
    for (size_t p = 0; p < o; ++p)
      c.disjoint(y.data, y.bytes(), a.outputs[p].data, a.outputs[p].bytes(),
                 ("outputs " + std::to_string(p) + " and " + std::to_string(o)).c_str());
  }
  s = c.that(std::isfinite(l.eps) && l.eps >= 0, "eps must be finite and >= 0")
          .arch_at_least(f == Format::kBf16 ? 80 : 90)
          .status();
  if (!s.ok()) return s;
  *out = std::move(l);
  return {};
}

}  // namespace lkw::layer
