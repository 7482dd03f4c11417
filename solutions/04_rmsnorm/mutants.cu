// Mutants of chapter 04, each a plausible slip that the golden cases must catch:
//   rmsnorm/mutant_no_eps                          eps left out of the rstd (caught by the
//                                                  "small" rows, whose mean square is eps-sized)
//   fused_add_rmsnorm/mutant_variance_before_add   the sum of squares taken over x, before the
//                                                  add (the residual, 4× x, missing from rstd)
//   fused_add_rmsnorm/mutant_no_residual_write     residual_out never written (its poison stays)
//   fused_add_rmsnorm_fp8/mutant_int8_max_scale    FP8 scale = absmax / 127, the INT8 constant
//                                                  (scales 3.5× too large, codes 3.5× too small)
//   fused_add_rmsnorm_fp8_group/mutant_scales_row_major  the group scales stored [T, d/128], the
//                                                  layout per_group_fp8's scales_row_major writes
//                                                  (the same bytes only when T = 1 or d = 128)
// The rounding point of the add is deliberately NOT a mutant here: taking the variance of the
// unrounded FP32 sum moves rstd by at most 2^-8 relative (BF16 rounds to half an ulp), so z by at
// most one BF16 ulp and y by at most two — inside y's 2-ulp tolerance on every golden case. The
// exact fused-versus-chain test (tests/cpp/04_rmsnorm) is what pins that rounding point down.
#include "03_dynamic_quant/quant_math.cuh"
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

Status no_eps(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kRmsnorm, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const Version* v3 = Registry::get().find("04_rmsnorm/rmsnorm/v3_vec16_registers");
  if (!v3) return error(Code::kInvalidArgument, "mutant_no_eps runs v3, which is not registered");
  Args b;
  b.inputs = {{const_cast<__nv_bfloat16*>(a.x), DType::kBF16, {a.t, a.d}},
              {const_cast<__nv_bfloat16*>(a.weight), DType::kBF16, {a.d}}};
  b.outputs = {{a.y, DType::kBF16, {a.t, a.d}}};
  b.params = {{"eps", 0.0}};
  return v3->launch(b, stream);
}

template <int kVec>
__global__ void __launch_bounds__(RowTile<kVec>::kMaxThreads)
    variance_before_add_kernel(const __nv_bfloat16* x, const __nv_bfloat16* residual_in,
                               __nv_bfloat16* residual_out, const __nv_bfloat16* weight,
                               __nv_bfloat16* y, int64_t d, float eps) {
  const int units = int(d / kVec);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<kVec> r, residual, w;
  load_row(x + row_offset, units, r);
  load_row(residual_in + row_offset, units, residual);
  const float rstd = row_rstd(r, d, eps);  // wrong: x alone
  add_residual(r, residual);
  store_row(residual_out + row_offset, units, r);
  load_row(weight, units, w);
  normalize_row(r, rstd, w);
  store_row(y + row_offset, units, r);
}

template <int kVec>
__global__ void __launch_bounds__(RowTile<kVec>::kMaxThreads)
    no_residual_write_kernel(const __nv_bfloat16* x, const __nv_bfloat16* residual_in,
                             const __nv_bfloat16* weight, __nv_bfloat16* y, int64_t d, float eps) {
  const int units = int(d / kVec);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<kVec> r, residual, w;
  load_row(x + row_offset, units, r);
  load_row(residual_in + row_offset, units, residual);
  add_residual(r, residual);
  const float rstd = row_rstd(r, d, eps);
  load_row(weight, units, w);
  normalize_row(r, rstd, w);
  store_row(y + row_offset, units, r);
}

template <int kVec>
__global__ void __launch_bounds__(RowTile<kVec>::kMaxThreads)
    int8_max_scale_kernel(const __nv_bfloat16* x, const __nv_bfloat16* residual_in,
                          __nv_bfloat16* residual_out, const __nv_bfloat16* weight, uint8_t* q,
                          float* scales, int64_t d, float eps) {
  const int units = int(d / kVec);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<kVec> r, residual, w;
  load_row(x + row_offset, units, r);
  load_row(residual_in + row_offset, units, residual);
  add_residual(r, residual);
  store_row(residual_out + row_offset, units, r);
  const float rstd = row_rstd(r, d, eps);
  load_row(weight, units, w);
  normalize_row(r, rstd, w);
  const float absmax = row_absmax(r);
  const float scale = fmaxf(__fdiv_rn(absmax, quant::kInt8Max), quant::kMinScale);  // wrong: 127
  const float inv = quant::fp8_inverse(scale);
#pragma unroll
  for (int u = 0; u < RowTile<kVec>::kUnits; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (i < units)
        q[row_offset + i * kVec + j] = uint8_t(quant::quantize_e4m3x2(r.get(u, j), 0.0f, inv));
  }
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
}

__global__ void __launch_bounds__(RowTile<8>::kMaxThreads)
    scales_row_major_kernel(const __nv_bfloat16* x, const __nv_bfloat16* residual_in,
                            __nv_bfloat16* residual_out, const __nv_bfloat16* weight, uint8_t* q,
                            float* scales, int64_t d, float eps) {
  const int units = int(d / 8), groups = int(d / kGroup);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<8> r, residual, w;
  load_row(x + row_offset, units, r);
  load_row(residual_in + row_offset, units, residual);
  add_residual(r, residual);
  store_row(residual_out + row_offset, units, r);
  const float rstd = row_rstd(r, d, eps);
  load_row(weight, units, w);
  normalize_row(r, rstd, w);
#pragma unroll
  for (int u = 0; u < RowTile<8>::kUnits; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(r.get(u, j)));
    const float scale = quant::fp8_scale(warp_reduce<Max, 16>(m), 0.0f);
    const float inv = quant::fp8_inverse(scale);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (i < units)
        q[row_offset + i * 8 + j] = uint8_t(quant::quantize_e4m3x2(r.get(u, j), 0.0f, inv));
    if (i < units && threadIdx.x % 16 == 0)
      scales[int64_t(blockIdx.x) * groups + i / 16] = scale;  // wrong: [T, d/128]
  }
}

Status variance_before_add(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAdd, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.t)), block(row_threads(a.d));
  if (row_vec(a.d) == 8) {
    variance_before_add_kernel<8>
        <<<grid, block, 0, stream>>>(a.x, a.residual_in, a.residual_out, a.weight, a.y, a.d, a.eps);
  } else {
    variance_before_add_kernel<1>
        <<<grid, block, 0, stream>>>(a.x, a.residual_in, a.residual_out, a.weight, a.y, a.d, a.eps);
  }
  return last_launch_status("variance_before_add_kernel");
}

Status no_residual_write(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAdd, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.t)), block(row_threads(a.d));
  if (row_vec(a.d) == 8) {
    no_residual_write_kernel<8>
        <<<grid, block, 0, stream>>>(a.x, a.residual_in, a.weight, a.y, a.d, a.eps);
  } else {
    no_residual_write_kernel<1>
        <<<grid, block, 0, stream>>>(a.x, a.residual_in, a.weight, a.y, a.d, a.eps);
  }
  return last_launch_status("no_residual_write_kernel");
}

Status int8_max_scale(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAddFp8, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.t)), block(row_threads(a.d));
  uint8_t* q = static_cast<uint8_t*>(a.q);
  if (row_vec(a.d) == 8) {
    int8_max_scale_kernel<8><<<grid, block, 0, stream>>>(a.x, a.residual_in, a.residual_out,
                                                         a.weight, q, a.scales, a.d, a.eps);
  } else {
    int8_max_scale_kernel<1><<<grid, block, 0, stream>>>(a.x, a.residual_in, a.residual_out,
                                                         a.weight, q, a.scales, a.d, a.eps);
  }
  return last_launch_status("int8_max_scale_kernel");
}

Status scales_row_major(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAddFp8Group, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  scales_row_major_kernel<<<unsigned(a.t), row_threads(a.d), 0, stream>>>(
      a.x, a.residual_in, a.residual_out, a.weight, static_cast<uint8_t*>(a.q), a.scales, a.d,
      a.eps);
  return last_launch_status("scales_row_major_kernel");
}

const Register kNoEps{
    norm_version(kRmsnorm, "mutant_no_eps", "eps left out of the rstd", no_eps, {}, Kind::kMutant)};
const Register kBeforeAdd{norm_version(kFusedAdd, "mutant_variance_before_add",
                                       "variance of x, taken before the residual add",
                                       variance_before_add, {}, Kind::kMutant)};
const Register kNoWrite{norm_version(kFusedAdd, "mutant_no_residual_write",
                                     "residual_out never written", no_residual_write, {},
                                     Kind::kMutant)};
const Register kInt8Max{norm_version(kFusedAddFp8, "mutant_int8_max_scale",
                                     "FP8 scale from absmax / 127 (the INT8 constant)",
                                     int8_max_scale, {}, Kind::kMutant)};
const Register kRowMajor{norm_version(kFusedAddFp8Group, "mutant_scales_row_major",
                                      "group scales stored row-major [T, d/128]", scales_row_major,
                                      {}, Kind::kMutant)};

}  // namespace
}  // namespace lkw::rmsnorm
