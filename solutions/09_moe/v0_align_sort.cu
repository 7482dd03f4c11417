// v0_align_sort — the align read as "sort the slots by expert": a library radix sort, then runs.
//
// The baseline a framework writes first (torch: argsort + bincount + cumsum). Each slot becomes a
// (key, value) pair, key = its expert id (E for a masked slot, E + 1 for an invalid one, so both
// sort to the end) and value = the slot index; CUB's DeviceRadixSort orders them, touching only
// the ceil(log2(E + 2)) low bits of the key. In the sorted keys every expert's slots form one run,
// found by binary search (where key e begins and ends: no atomics, no histogram); one block scans
// the padded run lengths; a last kernel copies each run to its padded place.
//   keys → radix sort (CUB: several kernels) → runs + scan + pad (one block) → place (grid)
// Expect: correct and simple, but the slowest: the sort moves every pair through memory once per
// radix pass plus CUB's own launches, all to order what a count already determines.
// SASS (our kernels): no atomics, no local memory.
#include <cub/device/device_radix_sort.cuh>

#include "align.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
static_assert(kScanThreads >= kMaxExperts, "the scan holds one expert per thread");

// The workspace: the pairs before and after the sort, each run's start in the sorted keys [E],
// each run's start in sorted_token_ids [E], then CUB's temporary storage.
struct Scratch {
  int32_t *keys_in, *keys_out, *slots_in, *slots_out;
  int *run_start, *offset;
  void* cub;
  size_t cub_bytes;
};

// Stage keys: one (expert, slot) pair per slot; masked → E, invalid → E + 1.
__global__ void __launch_bounds__(kThreads)
    align_v0_keys_kernel(const int32_t* __restrict__ topk_ids, int slots, int num_experts,
                         Scratch w) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= slots) return;
  const int32_t id = topk_ids[i];  // (T·k)
  // BEGIN SOLUTION: the key of slot i (id, E or E + 1) and its value i
  w.keys_in[i] = valid_id(id, num_experts) ? id : masked_id(id) ? num_experts : num_experts + 1;
  w.slots_in[i] = i;
  // END SOLUTION
}

// The first index of sorted `keys` whose key is >= `key`.
__device__ __forceinline__ int lower_bound(const int32_t* keys, int n, int key) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Stage runs + scan + pad (one block): thread e finds its run in the sorted keys, the block scans
// the padded lengths; then the padding, the expert id of every block, the total.
__global__ void __launch_bounds__(kScanThreads)
    align_v0_runs_kernel(int32_t* __restrict__ sorted_ids, int32_t* __restrict__ expert_ids,
                         int32_t* __restrict__ num_post, int slots, int num_experts, int block_m,
                         int capacity, Scratch w) {
  __shared__ int offset_sh[kMaxExperts + 1];
  __shared__ int count_sh[kMaxExperts];
  const int e = threadIdx.x;
  int count = 0, total = 0;
  // BEGIN SOLUTION: run e = [lower_bound(e), lower_bound(e + 1)); store its start and length,
  //   scan the padded lengths into offset_sh (offset_sh[E] = total) and w.offset
  if (e < num_experts) {
    const int begin = lower_bound(w.keys_out, slots, e);
    count = lower_bound(w.keys_out, slots, e + 1) - begin;
    w.run_start[e] = begin;
    count_sh[e] = count;
  }
  const int start = block_exclusive_scan<kScanThreads>(padded(count, block_m), &total);
  if (e < num_experts) offset_sh[e] = w.offset[e] = start;
  if (e == 0) offset_sh[num_experts] = total;
  // END SOLUTION
  __syncthreads();
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
  for (int x = warp_idx; x < num_experts; x += kScanThreads / 32)
    for (int row = offset_sh[x] + count_sh[x] + lane_idx; row < offset_sh[x + 1]; row += 32)
      sorted_ids[row] = slots;  // (capacity)
  for (int row = total + threadIdx.x; row < capacity; row += kScanThreads) sorted_ids[row] = slots;
  for (int b = threadIdx.x; b < capacity / block_m; b += kScanThreads)
    expert_ids[b] = expert_of_row(offset_sh, num_experts, b * block_m);  // (capacity/BLOCK_M)
  if (threadIdx.x == 0) {
    const bool bad = lower_bound(w.keys_out, slots, num_experts + 1) < slots;
    *num_post = bad ? -1 : total;
  }
}

// Stage place: sorted pair j of expert e goes to row offset[e] + (j − run_start[e]).
__global__ void __launch_bounds__(kThreads)
    align_v0_place_kernel(int32_t* __restrict__ sorted_ids, int slots, int num_experts, Scratch w) {
  const int j = blockIdx.x * kThreads + threadIdx.x;
  if (j >= slots) return;
  const int e = w.keys_out[j];  // (T·k) sorted
  if (e < num_experts) sorted_ids[w.offset[e] + j - w.run_start[e]] = w.slots_out[j];
}

Status align_v0_sort(const AlignArgs& a, cudaStream_t stream) {
  Status s = validate_align(a);
  if (!s.ok()) return s;
  const int slots = int(a.slots), grid = int(ceil_div(a.slots, kThreads));
  int end_bit = 1;  // keys go up to E + 1
  while ((1 << end_bit) <= a.num_experts + 1) ++end_bit;
  size_t cub_bytes = 0;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, (int32_t*)nullptr,
                                                  (int32_t*)nullptr, (int32_t*)nullptr,
                                                  (int32_t*)nullptr, slots, 0, end_bit, stream);
  if (e != cudaSuccess)
    return error(Code::kCudaError, std::string("CUB size query: ") + cudaGetErrorString(e));
  const int64_t pairs_bytes = 4 * (4 * int64_t(slots) + 2 * a.num_experts);
  void* base = nullptr;
  s = align_workspace(pairs_bytes + int64_t(cub_bytes) + 256, &base);
  if (!s.ok()) return s;
  int32_t* p = static_cast<int32_t*>(base);
  Scratch w{p,
            p + slots,
            p + 2 * slots,
            p + 3 * slots,
            p + 4 * slots,
            p + 4 * slots + a.num_experts,
            nullptr,
            cub_bytes};
  w.cub =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(base) + pairs_bytes + 255) / 256 * 256);
  align_v0_keys_kernel<<<grid, kThreads, 0, stream>>>(a.topk_ids, slots, a.num_experts, w);
  e = cub::DeviceRadixSort::SortPairs(w.cub, w.cub_bytes, w.keys_in, w.keys_out, w.slots_in,
                                      w.slots_out, slots, 0, end_bit, stream);
  if (e != cudaSuccess)
    return error(Code::kCudaError, std::string("CUB sort: ") + cudaGetErrorString(e));
  align_v0_runs_kernel<<<1, kScanThreads, 0, stream>>>(
      a.sorted_ids, a.expert_ids, a.num_post, slots, a.num_experts, a.block_m, int(a.capacity), w);
  align_v0_place_kernel<<<grid, kThreads, 0, stream>>>(a.sorted_ids, slots, a.num_experts, w);
  return finish_align(a, stream, "v0_align_sort");
}

const Register kRegistered{align_version(
    "v0_align_sort", "CUB radix sort of (expert, slot) pairs, runs by binary search, padded scan",
    align_v0_sort,
    {{"align_v0_", {}, {}, {"ATOMS", "ATOMG", "RED", "REDG"}, true, "a sort needs no atomics"}},
    Kind::kVersion, 0)};  // 0: CUB picks its number of kernels by size (the ncu pass skips it)

}  // namespace
}  // namespace lkw::moe
