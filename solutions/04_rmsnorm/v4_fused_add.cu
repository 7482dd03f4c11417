// v4_fused_add — the residual add fused into the norm: 8 B per element instead of 10.
//
// Since v3: the row of x and the row of the residual are loaded into registers together, added
// and rounded to BF16 (add_residual in rmsnorm.cuh: the rounded r, not the FP32 sum, is what the
// variance sees), and r is written to residual_out at once — its store overlaps the reduction.
// The norm of r is v3's row routine unchanged, so y equals, bit for bit, what the unfused chain
// (an add kernel writing r, then v3 reading it back) produces. residual_out may be the residual
// buffer itself, updated in place: each element is read and then written by the same thread,
// so those two pointers are the only ones not declared __restrict__.
// Expect: 8 B per element against the chain's 10 (chain_unfused, measured beside it), at the
// same fraction of the ceiling as v3; SASS: LDG.E.128 and STG.E.128, no local memory.
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

template <int kVec>
__global__ void __launch_bounds__(RowTile<kVec>::kMaxThreads)
    fused_add_rmsnorm_v4_kernel(const __nv_bfloat16* __restrict__ x,
                                const __nv_bfloat16* residual_in, __nv_bfloat16* residual_out,
                                const __nv_bfloat16* __restrict__ weight,
                                __nv_bfloat16* __restrict__ y, int64_t d, float eps) {
  const int units = int(d / kVec);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<kVec> r, residual, w;
  load_row(x + row_offset, units, r);                   // (T, d)
  load_row(residual_in + row_offset, units, residual);  // (T, d)
  add_residual(r, residual);
  store_row(residual_out + row_offset, units, r);  // (T, d)
  const float rstd = row_rstd(r, d, eps);
  load_row(weight, units, w);  // (d)
  normalize_row(r, rstd, w);
  store_row(y + row_offset, units, r);  // (T, d)
}

Status fused_add_rmsnorm_v4(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kFusedAdd, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.t)), block(row_threads(a.d));
  if (row_vec(a.d) == 8) {
    fused_add_rmsnorm_v4_kernel<8>
        <<<grid, block, 0, stream>>>(a.x, a.residual_in, a.residual_out, a.weight, a.y, a.d, a.eps);
  } else {
    fused_add_rmsnorm_v4_kernel<1>
        <<<grid, block, 0, stream>>>(a.x, a.residual_in, a.residual_out, a.weight, a.y, a.d, a.eps);
  }
  return last_launch_status(kFusedAdd.name);
}

const Register kRegistered{norm_version(
    kFusedAdd, "v4_fused_add", "residual add fused: r rounded, stored, normalized from registers",
    fused_add_rmsnorm_v4,
    {{"fused_add_rmsnorm_v4_kernel*Li8E",
      {},
      {"LDG.E.128", "STG.E.128"},
      {},
      true,
      "16-byte loads and stores of x, residual, r and y; no local memory"},
     {"fused_add_rmsnorm_v4_kernel*Li1E", {}, {}, {}, true, "the scalar path: no local memory"}})};

}  // namespace
}  // namespace lkw::rmsnorm
