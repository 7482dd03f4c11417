// v0_scalar — one 4-byte word per thread.
//
// The plainest copy: each thread moves one word, consecutive threads touch consecutive words,
// so every warp reads and writes whole 128-byte lines (coalesced). What it lacks is width: one
// LDG.E (4 bytes) per thread means many instructions and few bytes in flight per thread.
// Expect: close to the ceiling on an H200 only with enough threads; SASS: LDG.E, no LDG.E.128.
// Run:    python tools/bench.py --chapter 00_roofline (verifies every version, then times it).
#include "roofline.cuh"

namespace lkw::roofline {
namespace {

__global__ void copy_v0_scalar_kernel(const uint32_t* __restrict__ src, uint32_t* __restrict__ dst,
                                      int64_t n) {
  // BEGIN SOLUTION: one word per thread; guard the tail.
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = src[i];
  // END SOLUTION
}

Status copy_v0_scalar(const uint32_t* src, uint32_t* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_copy(src, dst, n, 4);
  if (!s.ok()) return s;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  copy_v0_scalar_kernel<<<blocks, kThreads, 0, stream>>>(src, dst, n);
  return last_launch_status("copy_v0_scalar_kernel");
}

const Register kRegistered{copy_version(
    "v0_scalar", "one 4-byte word per thread", copy_v0_scalar,
    {{"copy_v0_scalar_kernel", {}, {"LDG.E", "STG.E"}, {"LDG.E.128", "STG.E.128"}, true,
      "4-byte accesses only"}})};

}  // namespace
}  // namespace lkw::roofline
