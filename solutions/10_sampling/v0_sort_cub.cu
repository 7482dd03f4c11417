// v0_sort_cub — the obvious answer: sort every row, read the k-th value, filter.
//
// CUB's segmented radix sort (a segment per row, descending) writes a sorted copy of every row
// to a workspace; an output kernel, a block per row, reads the k-th value of its sorted row as the
// threshold and writes the filtered row (sampling.cuh: write_row). This is how engines began: it
// is correct and simple, and it pays for an order the filter never uses. A radix sort of 32-bit
// keys makes several passes over the data, each a read and a write of the whole row (the keys
// alone: no indices are needed, a threshold is enough), before the output kernel reads the row a
// final time.
// Expect: many times the model's bytes (CUB's passes), far from the copy ceiling at every shape;
// slowest at B = 1, where one segment is one block of the sort.
#include <cub/device/device_segmented_radix_sort.cuh>

#include "lkw/workspace.h"
#include "sampling.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 1024;

__global__ void row_offsets_kernel(int* offsets, int b, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= b) offsets[i] = i * v;  // row i starts at i·V; offsets[B] ends the last row
}

template <bool kRenorm>
__global__ void __launch_bounds__(kThreads)
    filter_sorted_kernel(const float* __restrict__ x, const float* __restrict__ sorted,
                         const int32_t* __restrict__ top_k, float* __restrict__ out, int64_t v) {
  const int64_t row = blockIdx.x;
  const int32_t k = top_k[row];  // (B)
  // BEGIN SOLUTION: v0 — the k-th largest of the sorted row (descending), or −inf when off
  const float threshold = top_k_on(k, v) ? sorted[row * v + k - 1] : -INFINITY;  // (B, V)
  // STUB: const float threshold = -INFINITY;
  // END SOLUTION
  write_row<kRenorm>(x + row * v, out + row * v, v, threshold);
}

template <const FilterOp& kOp>
Status top_k_v0(const TopKArgs& a, cudaStream_t stream) {
  Status s = validate_top_k(a);
  if (!s.ok()) return s;
  s = Check()
          .that(a.b * a.v <= std::numeric_limits<int32_t>::max(),
                "B · V must be below 2^31 (CUB's segmented sort counts items in int)")
          .status();
  if (!s.ok()) return s;
  const int b = int(a.b), v = int(a.v), n = b * v;
  // The workspace: the sorted rows, the B + 1 row offsets, then CUB's own temporary storage.
  size_t cub_bytes = 0;
  cudaError_t e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, cub_bytes, a.x, static_cast<float*>(nullptr), n, b, static_cast<int*>(nullptr),
      static_cast<int*>(nullptr) + 1, 0, 32, stream);
  if (e != cudaSuccess) return error(Code::kCudaError, std::string("CUB: ") + cudaGetErrorString(e));
  const int64_t sorted_bytes = 4 * int64_t(n), offsets_bytes = (4 * int64_t(b + 1) + 255) / 256 * 256;
  static Workspace workspace("v0_sort_cub sorted rows");
  void* base = nullptr;
  s = workspace.get(sorted_bytes + offsets_bytes + int64_t(cub_bytes), &base);
  if (!s.ok()) return s;
  auto* sorted = static_cast<float*>(base);
  auto* offsets = reinterpret_cast<int*>(static_cast<char*>(base) + sorted_bytes);
  void* cub_temp = static_cast<char*>(base) + sorted_bytes + offsets_bytes;
  row_offsets_kernel<<<(b + 1 + 255) / 256, 256, 0, stream>>>(offsets, b, v);
  e = cub::DeviceSegmentedRadixSort::SortKeysDescending(cub_temp, cub_bytes, a.x, sorted, n, b,
                                                        offsets, offsets + 1, 0, 32, stream);
  if (e != cudaSuccess) return error(Code::kCudaError, std::string("CUB: ") + cudaGetErrorString(e));
  filter_sorted_kernel<kOp.renorm><<<b, kThreads, 0, stream>>>(a.x, sorted, a.top_k, a.out, a.v);
  return last_launch_status(kOp.name);
}

constexpr const char* kSummary = "CUB segmented radix sort of every row, the k-th sorted value";
std::vector<SassFact> facts(const char* kernel) {
  return {{kernel, {}, {}, {}, true, "the filter pass: nothing spilled"}};
}
Version v0(const FilterOp& op, TopKLaunch launch, const char* kernel) {
  Version v = top_k_version(op, "v0_sort_cub", kSummary, launch, facts(kernel));
  v.kernels_per_launch = 0;  // CUB picks its own kernels per shape: the ncu pass cannot map them
  return v;
}
const Register kMask{v0(kTopKMask, top_k_v0<kTopKMask>, "filter_sorted_kernelILb0E")};
const Register kRenorm{v0(kTopKRenorm, top_k_v0<kTopKRenorm>, "filter_sorted_kernelILb1E")};

}  // namespace
}  // namespace lkw::sampling
