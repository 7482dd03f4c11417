// v3_vec16_registers — 16-byte vectors, the row kept in registers: one HBM read, one write.
//
// Since v2: each thread loads its share of the row — up to 4 units of 8 BF16, 16 bytes each —
// into registers, every load issued before the first use, and keeps them there through the
// reduction, so the normalizing pass reads no memory but the weight (an L1/L2 hit for every row
// after the first; loaded after the reduction, so that it holds no registers during it). The
// block is sized to the row (rmsnorm.cuh: row_threads, 128 threads for d = 4096, 512 for 16384):
// a thread has 64 bytes in flight, an SM about ten rows. This is the row routine that v4, v5 and
// the unfused chains share; here it stands alone. A d that is not a multiple of 8 takes the same
// routine with single elements, 32 per thread, for the whole tensor.
// Expect: ≥ 90% of the copy ceiling at T = 8192, d = 4096 and 8192 (4 B per element, weight
// aside); SASS: LDG.E.128 and STG.E.128, shuffles, no local memory (the row fits the registers).
#include "rmsnorm.cuh"

namespace lkw::rmsnorm {
namespace {

template <int kVec>
__global__ void __launch_bounds__(RowTile<kVec>::kMaxThreads)
    rmsnorm_v3_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ weight,
                      __nv_bfloat16* __restrict__ y, int64_t d, float eps) {
  const int units = int(d / kVec);
  const int64_t row_offset = blockIdx.x * d;
  RowTile<kVec> v, w;
  load_row(x + row_offset, units, v);  // (T, d)
  const float rstd = row_rstd(v, d, eps);
  load_row(weight, units, w);  // (d)
  normalize_row(v, rstd, w);
  store_row(y + row_offset, units, v);  // (T, d)
}

Status rmsnorm_v3(const NormArgs& a, cudaStream_t stream) {
  Status s = validate_norm(kRmsnorm, a, row_vec(a.d), row_max_d(a.d));
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.t)), block(row_threads(a.d));
  if (row_vec(a.d) == 8) {
    rmsnorm_v3_kernel<8><<<grid, block, 0, stream>>>(a.x, a.weight, a.y, a.d, a.eps);
  } else {
    rmsnorm_v3_kernel<1><<<grid, block, 0, stream>>>(a.x, a.weight, a.y, a.d, a.eps);
  }
  return last_launch_status(kRmsnorm.name);
}

const Register kRegistered{
    norm_version(kRmsnorm, "v3_vec16_registers",
                 "16-byte vectors, the row held in registers: one HBM read", rmsnorm_v3,
                 {{"rmsnorm_v3_kernel*Li8E",
                   {},
                   {"LDG.E.128", "STG.E.128", "SHFL.BFLY"},
                   {},
                   true,
                   "16-byte loads and stores, the row in registers (no local memory)"},
                  {"rmsnorm_v3_kernel*Li1E",
                   {},
                   {"SHFL.BFLY"},
                   {},
                   true,
                   "the scalar path (d % 8 != 0) keeps its 32 elements in registers too"}})};

}  // namespace
}  // namespace lkw::rmsnorm
