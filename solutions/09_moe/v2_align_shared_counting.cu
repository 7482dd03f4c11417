// v2_align_shared_counting — the whole align in one block: a counting sort in shared memory.
//
// Since v1: the histogram, the scan and the cursors live in shared memory, so the atomics are
// shared-memory atomics (ATOMS: a few cycles, on the SM) instead of global ones in L2, and the
// three kernels become four stages of one kernel with a __syncthreads() between them:
//   count → scan → scatter → pad.
// The counts turn into the cursors in place: after the scatter, expert e's cursor stands where
// its padding begins. One block of 1024 threads reads the ids twice (the second pass from L1/L2);
// nothing else runs, so it is one launch and no workspace. One block is also its limit: for
// large T·k a single SM's bandwidth and its atomics on a few hot experts are the bottleneck (v3).
// Expect: one kernel, no memset, no global atomics; SASS: ATOMS, no ATOMG/RED, no local memory.
#include "align.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 1024;
static_assert(kThreads >= kMaxExperts, "the scan holds one expert per thread");

__global__ void __launch_bounds__(kThreads)
    align_v2_shared_counting_kernel(const int32_t* __restrict__ topk_ids,
                                    int32_t* __restrict__ sorted_ids,
                                    int32_t* __restrict__ expert_ids,
                                    int32_t* __restrict__ num_post, int slots, int num_experts,
                                    int block_m, int capacity) {
  __shared__ int cursor_sh[kMaxExperts];      // counts, then each expert's next free row
  __shared__ int offset_sh[kMaxExperts + 1];  // run starts; offset_sh[E] = rows of all runs
  __shared__ int bad_sh;
  const int e = threadIdx.x;  // the expert this thread scans for
  if (e < num_experts) cursor_sh[e] = 0;
  if (e == 0) bad_sh = 0;
  __syncthreads();

  // Stage count: one shared atomic per slot; masked slots (−1) are skipped, others flagged.
  // BEGIN SOLUTION: count each valid id with atomicAdd on cursor_sh; set bad_sh for the others
  for (int i = threadIdx.x; i < slots; i += kThreads) {
    const int32_t id = topk_ids[i];  // (T·k)
    if (valid_id(id, num_experts))
      atomicAdd(&cursor_sh[id], 1);
    else if (!masked_id(id))
      bad_sh = 1;
  }
  // END SOLUTION
  __syncthreads();

  // Stage scan: run starts from the padded counts; each cursor starts at its run.
  const int count = e < num_experts ? cursor_sh[e] : 0;
  int total = 0;
  // BEGIN SOLUTION: scan the padded counts; fill offset_sh[e], offset_sh[E] and cursor_sh[e]
  const int start = block_exclusive_scan<kThreads>(padded(count, block_m), &total);
  if (e < num_experts) offset_sh[e] = cursor_sh[e] = start;
  if (e == 0) offset_sh[num_experts] = total;
  // END SOLUTION
  __syncthreads();

  // Stage scatter: each slot takes the next row of its expert's run (any order inside a run).
  // BEGIN SOLUTION: read the ids again; row = atomicAdd on the cursor; write the slot there
  for (int i = threadIdx.x; i < slots; i += kThreads) {
    const int32_t id = topk_ids[i];  // (T·k)
    if (valid_id(id, num_experts)) sorted_ids[atomicAdd(&cursor_sh[id], 1)] = i;
  }
  // END SOLUTION
  __syncthreads();

  // Stage pad: the sentinel from each cursor to the end of its run (a warp per expert) and
  // after the runs; every block's expert id.
  const int lane_idx = threadIdx.x % 32, warp_idx = threadIdx.x / 32;
  for (int x = warp_idx; x < num_experts; x += kThreads / 32)
    for (int row = cursor_sh[x] + lane_idx; row < offset_sh[x + 1]; row += 32)
      sorted_ids[row] = slots;  // (capacity)
  for (int row = total + threadIdx.x; row < capacity; row += kThreads) sorted_ids[row] = slots;
  for (int b = threadIdx.x; b < capacity / block_m; b += kThreads)
    expert_ids[b] = expert_of_row(offset_sh, num_experts, b * block_m);  // (capacity/BLOCK_M)
  if (threadIdx.x == 0) *num_post = bad_sh ? -1 : total;
}

Status align_v2_shared_counting(const AlignArgs& a, cudaStream_t stream) {
  Status s = validate_align(a);
  if (!s.ok()) return s;
  align_v2_shared_counting_kernel<<<1, kThreads, 0, stream>>>(
      a.topk_ids, a.sorted_ids, a.expert_ids, a.num_post, int(a.slots), a.num_experts, a.block_m,
      int(a.capacity));
  return finish_align(a, stream, "v2_align_shared_counting");
}

const Register kRegistered{align_version("v2_align_shared_counting",
                                         "one block: count, scan, scatter, pad in shared memory",
                                         align_v2_shared_counting,
                                         {{"align_v2_shared_counting_kernel",
                                           {},
                                           {"ATOMS"},
                                           {"ATOMG", "RED", "REDG"},
                                           true,
                                           "shared-memory atomics only, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
