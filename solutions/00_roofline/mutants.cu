// Mutants of chapter 00: deliberately wrong copies. The golden tests must catch every one of
// them (tests/cpp run them and expect a failure), which is how we know the checker checks.
#include "roofline.cuh"

namespace lkw::roofline {
namespace {

// Off by one at the end: the last word is never written (n - 1 instead of n).
__global__ void copy_mutant_drops_last_kernel(const uint32_t* src, uint32_t* dst, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n - 1) dst[i] = src[i];
}

// Vector body only: forgets the n % 4 tail words.
__global__ void copy_mutant_no_tail_kernel(const uint32_t* src, uint32_t* dst, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n / 4) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
}

Status copy_mutant_drops_last(const uint32_t* src, uint32_t* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_copy(src, dst, n, 4);
  if (!s.ok()) return s;
  copy_mutant_drops_last_kernel<<<(n + 255) / 256, 256, 0, stream>>>(src, dst, n);
  return last_launch_status("copy_mutant_drops_last_kernel");
}

Status copy_mutant_no_tail(const uint32_t* src, uint32_t* dst, int64_t n, cudaStream_t stream) {
  Status s = validate_copy(src, dst, n, 16);
  if (!s.ok()) return s;
  copy_mutant_no_tail_kernel<<<(n / 4 + 256) / 256, 256, 0, stream>>>(src, dst, n);
  return last_launch_status("copy_mutant_no_tail_kernel");
}

const Register kDropsLast{copy_version("mutant_drops_last", "off by one: last word never written",
                                       copy_mutant_drops_last, {}, Kind::kMutant)};
const Register kNoTail{copy_version("mutant_no_tail", "skips the n % 4 tail words",
                                    copy_mutant_no_tail, {}, Kind::kMutant)};

}  // namespace
}  // namespace lkw::roofline
