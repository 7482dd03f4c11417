// v1_align_global_atomics — a counting sort in three kernels: histogram, scan, scatter.
//
// Since v0: no sort at all. A slot only needs to know how many slots of its expert exist (the
// histogram, a global atomic per slot), where its expert's run starts (an exclusive scan of the
// padded counts, one block: E ≤ 1024) and a free row in that run (a second global atomic on the
// expert's cursor). Each stage is its own kernel because each needs all of the previous one:
// the kernel boundary is the grid-wide barrier. The histogram is zeroed by a memset first.
//   memset → count (grid) → scan + pad (one block) → scatter (grid)
// Expect: O(T·k) work instead of the sort's passes, but four nodes in the stream, and every
// atomic a round trip to L2 — on a skewed routing, thousands of them on the same word.
// SASS: global atomics (RED/REDG for the histogram, ATOMG for the cursors), no local memory.
#include "align.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
static_assert(kScanThreads >= kMaxExperts, "the scan holds one expert per thread");

// The workspace: counts [E] and a bad-id flag (zeroed by the launcher), cursors [E].
struct Scratch {
  int* count;
  int* bad;
  int* cursor;
};

// Stage count: one global atomic per valid slot.
__global__ void __launch_bounds__(kThreads)
    align_v1_count_kernel(const int32_t* __restrict__ topk_ids, int slots, int num_experts,
                          Scratch w) {
  // BEGIN SOLUTION: one slot per thread: atomicAdd on w.count for a valid id, w.bad for others
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= slots) return;
  const int32_t id = topk_ids[i];  // (T·k)
  if (valid_id(id, num_experts))
    atomicAdd(&w.count[id], 1);
  else if (!masked_id(id))
    *w.bad = 1;
  // END SOLUTION
}

// Stage scan (one block): run starts, the cursors, and everything that needs only the counts —
// the padding after each run and after all runs, the expert id of every block, the total.
__global__ void __launch_bounds__(kScanThreads)
    align_v1_scan_kernel(int32_t* __restrict__ sorted_ids, int32_t* __restrict__ expert_ids,
                         int32_t* __restrict__ num_post, int slots, int num_experts, int block_m,
                         int capacity, Scratch w) {
  __shared__ int offset_sh[kMaxExperts + 1];
  const int e = threadIdx.x;
  const int count = e < num_experts ? w.count[e] : 0;
  int total = 0;
  // BEGIN SOLUTION: scan the padded counts into offset_sh (offset_sh[E] = total); cursor = start
  const int start = block_exclusive_scan<kScanThreads>(padded(count, block_m), &total);
  if (e < num_experts) offset_sh[e] = w.cursor[e] = start;
  if (e == 0) offset_sh[num_experts] = total;
  // END SOLUTION
  __syncthreads();
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
  for (int x = warp_idx; x < num_experts; x += kScanThreads / 32)
    for (int row = offset_sh[x] + w.count[x] + lane_idx; row < offset_sh[x + 1]; row += 32)
      sorted_ids[row] = slots;  // (capacity)
  for (int row = total + threadIdx.x; row < capacity; row += kScanThreads) sorted_ids[row] = slots;
  for (int b = threadIdx.x; b < capacity / block_m; b += kScanThreads)
    expert_ids[b] = expert_of_row(offset_sh, num_experts, b * block_m);  // (capacity/BLOCK_M)
  if (threadIdx.x == 0) *num_post = *w.bad ? -1 : total;
}

// Stage scatter: each slot takes the next row of its expert's run.
__global__ void __launch_bounds__(kThreads)
    align_v1_scatter_kernel(const int32_t* __restrict__ topk_ids, int32_t* __restrict__ sorted_ids,
                            int slots, int num_experts, Scratch w) {
  // BEGIN SOLUTION: one slot per thread: row = atomicAdd on w.cursor; write the slot there
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= slots) return;
  const int32_t id = topk_ids[i];  // (T·k)
  if (valid_id(id, num_experts)) sorted_ids[atomicAdd(&w.cursor[id], 1)] = i;
  // END SOLUTION
}

Status align_v1_global_atomics(const AlignArgs& a, cudaStream_t stream) {
  Status s = validate_align(a);
  void* base = nullptr;
  if (s.ok()) s = align_workspace(4 * (2 * int64_t(a.num_experts) + 1), &base);
  if (!s.ok()) return s;
  const Scratch w{static_cast<int*>(base), static_cast<int*>(base) + a.num_experts,
                  static_cast<int*>(base) + a.num_experts + 1};
  const int slots = int(a.slots), grid = int(ceil_div(a.slots, kThreads));
  cudaError_t e = cudaMemsetAsync(base, 0, 4 * (int64_t(a.num_experts) + 1), stream);
  if (e != cudaSuccess)
    return error(Code::kCudaError, std::string("memset: ") + cudaGetErrorString(e));
  align_v1_count_kernel<<<grid, kThreads, 0, stream>>>(a.topk_ids, slots, a.num_experts, w);
  align_v1_scan_kernel<<<1, kScanThreads, 0, stream>>>(
      a.sorted_ids, a.expert_ids, a.num_post, slots, a.num_experts, a.block_m, int(a.capacity), w);
  align_v1_scatter_kernel<<<grid, kThreads, 0, stream>>>(a.topk_ids, a.sorted_ids, slots,
                                                         a.num_experts, w);
  return finish_align(a, stream, "v1_align_global_atomics");
}

const Register kRegistered{align_version(
    "v1_align_global_atomics", "histogram, one-block scan, scatter: three kernels, global atomics",
    align_v1_global_atomics,
    {{"align_v1_count_kernel",
      {"sm_80", "sm_89"},
      {"RED"},
      {"ATOMS"},
      true,
      "a global atomic per slot (a reduction: RED, REDG on sm_90)"},
     {"align_v1_count_kernel", {"sm_90a"}, {"REDG"}, {"ATOMS"}, true, "a global atomic per slot"},
     {"align_v1_scatter_kernel",
      {},
      {"ATOMG"},
      {"ATOMS"},
      true,
      "a global atomic per slot, its old value used"}},
    Kind::kVersion, 3)};

}  // namespace
}  // namespace lkw::moe
