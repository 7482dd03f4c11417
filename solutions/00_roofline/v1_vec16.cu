// v1_vec16 — 16-byte vectors: each thread moves one uint4 (four words).
//
// Since v0: one LDG.E.128 / STG.E.128 pair replaces four 4-byte pairs, so a quarter of the
// memory instructions move the same bytes. The pointers must be 16-byte aligned (checked);
// the last n % 4 words are moved one by one by the first threads.
// Expect: at or near the ceiling; SASS: LDG.E.128 and STG.E.128.
#include "roofline.cuh"

namespace lkw::roofline {
namespace {

__global__ void copy_v1_vec16_kernel(const uint32_t* __restrict__ src, uint32_t* __restrict__ dst,
                                     int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t n_vec = n / 4;
  // BEGIN SOLUTION: copy vector i as one uint4, then let thread i < n % 4 copy tail word i.
  if (i < n_vec) {
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  }
  const int64_t tail = 4 * n_vec + i;
  if (tail < n) dst[tail] = src[tail];
  // END SOLUTION
}

Status copy_v1_vec16(const uint32_t* src, uint32_t* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_copy(src, dst, n, 16);
  if (!s.ok()) return s;
  constexpr int kThreads = 256;
  const int64_t threads = n / 4 > 0 ? n / 4 : 1;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  copy_v1_vec16_kernel<<<blocks, kThreads, 0, stream>>>(src, dst, n);
  return last_launch_status("copy_v1_vec16_kernel");
}

const Register kRegistered{copy_version(
    "v1_vec16", "16-byte vectors: one uint4 per thread", copy_v1_vec16,
    {{"copy_v1_vec16_kernel", {}, {"LDG.E.128", "STG.E.128"}, {}, true, "16-byte accesses"}})};

}  // namespace
}  // namespace lkw::roofline
