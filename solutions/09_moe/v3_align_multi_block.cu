// v3_align_multi_block — v2's counting sort spread over many blocks, in one cooperative kernel.
//
// Since v2: block b counts only its chunk of the slots (shared atomics, as v2) and publishes its
// histogram [E] to global memory; grid.sync() waits for every block; then each block reads all
// the histograms (thread e reads column e: coalesced) to get expert e's total and how many of
// its slots the blocks before it hold. The totals give the same run starts in every block (each
// block scans them itself: cheaper than another barrier), and a block's cursors start after the
// rows of the blocks before it, so the blocks scatter into disjoint rows with no global atomics.
// Padding, expert ids and the tail are shared out over the whole grid.
//   count (per block) → publish → grid.sync → scan → scatter → pad
// The grid is at most what is resident at once (grid.sync needs that), with ~2048 slots a block.
// Expect: the SMs share the reads and writes that v2's one SM did alone, one launch; its cost is
// the barrier and every block's read of B·E counts (from L2). SASS: ATOMS, no ATOMG/RED for the
// counting, no local memory.
#include <cooperative_groups.h>

#include <algorithm>

#include "align.cuh"

namespace lkw::moe {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kSlotsPerBlock = 2048;
static_assert(kThreads >= kMaxExperts, "the scan holds one expert per thread");

__global__ void __launch_bounds__(kThreads)
    align_v3_multi_block_kernel(const int32_t* __restrict__ topk_ids,
                                int32_t* __restrict__ sorted_ids, int32_t* __restrict__ expert_ids,
                                int32_t* __restrict__ num_post, int slots, int num_experts,
                                int block_m, int capacity, int* block_count_gl, int* block_bad_gl) {
  __shared__ int cursor_sh[kMaxExperts];      // this chunk's counts, then its next free rows
  __shared__ int count_sh[kMaxExperts];       // each expert's count over all blocks
  __shared__ int offset_sh[kMaxExperts + 1];  // run starts; offset_sh[E] = rows of all runs
  __shared__ int bad_sh;
  cg::grid_group grid = cg::this_grid();
  const int e = threadIdx.x;  // the expert this thread scans for
  const int chunk = (slots + gridDim.x - 1) / gridDim.x;
  const int begin = blockIdx.x * chunk, end = min(slots, begin + chunk);
  if (e < num_experts) cursor_sh[e] = 0;
  if (e == 0) bad_sh = 0;
  __syncthreads();

  // Stage count: this block's chunk, shared atomics as in v2.
  for (int i = begin + threadIdx.x; i < end; i += kThreads) {
    const int32_t id = topk_ids[i];  // (T·k)
    if (valid_id(id, num_experts))
      atomicAdd(&cursor_sh[id], 1);
    else if (!masked_id(id))
      bad_sh = 1;
  }
  __syncthreads();

  // Stage publish: this block's histogram, row blockIdx.x of [grid, E]; then every block waits.
  // BEGIN SOLUTION: write cursor_sh to row blockIdx.x of block_count_gl, bad_sh to block_bad_gl;
  //   grid.sync()
  if (e < num_experts) block_count_gl[blockIdx.x * num_experts + e] = cursor_sh[e];
  if (e == 0) block_bad_gl[blockIdx.x] = bad_sh;
  grid.sync();
  // END SOLUTION

  // Stage scan: expert e's total and the part of it in the blocks before this one (read from
  // L2 with __ldcg: other SMs wrote them, and this SM's L1 is not coherent with theirs).
  int count = 0, before = 0, bad = 0;
  // BEGIN SOLUTION: sum column e of block_count_gl (all rows; rows < blockIdx.x into before);
  //   OR block_bad_gl into bad
  if (e < num_experts) {
    for (int b = 0; b < gridDim.x; ++b) {
      const int c = __ldcg(&block_count_gl[b * num_experts + e]);  // (grid, E)
      count += c;
      before += b < blockIdx.x ? c : 0;
    }
  }
  for (int b = threadIdx.x; b < gridDim.x; b += kThreads) bad |= __ldcg(&block_bad_gl[b]);
  // END SOLUTION
  int total = 0;
  const int start = block_exclusive_scan<kThreads>(padded(count, block_m), &total);
  if (e < num_experts) {
    offset_sh[e] = start;
    count_sh[e] = count;
    cursor_sh[e] = start + before;
  }
  if (e == 0) offset_sh[num_experts] = total;
  const bool any_bad = __syncthreads_or(bad);  // also the barrier before the scatter

  // Stage scatter: this chunk again; rows after those of the blocks before it.
  for (int i = begin + threadIdx.x; i < end; i += kThreads) {
    const int32_t id = topk_ids[i];  // (T·k)
    if (valid_id(id, num_experts)) sorted_ids[atomicAdd(&cursor_sh[id], 1)] = i;
  }

  // Stage pad, shared out over the grid: a warp per expert's padding, threads over the tail
  // and the blocks' expert ids.
  const int lane_idx = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32),
            warp = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  const int threads = gridDim.x * kThreads, thread = blockIdx.x * kThreads + threadIdx.x;
  // BEGIN SOLUTION: the sentinel after each run's count (warp `warp` takes experts warp,
  //   warp + warps, ...) and after all runs; expert_ids; thread 0 of the grid writes num_post
  for (int x = warp; x < num_experts; x += warps)
    for (int row = offset_sh[x] + count_sh[x] + lane_idx; row < offset_sh[x + 1]; row += 32)
      sorted_ids[row] = slots;  // (capacity)
  for (int row = total + thread; row < capacity; row += threads) sorted_ids[row] = slots;
  for (int b = thread; b < capacity / block_m; b += threads)
    expert_ids[b] = expert_of_row(offset_sh, num_experts, b * block_m);  // (capacity/BLOCK_M)
  if (thread == 0) *num_post = any_bad ? -1 : total;
  // END SOLUTION
}

Status align_v3_multi_block(const AlignArgs& a, cudaStream_t stream) {
  Status s = validate_align(a);
  if (!s.ok()) return s;
  int dev = 0, cooperative = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, align_v3_multi_block_kernel,
                                                      kThreads, 0);
  if (e != cudaSuccess)
    return error(Code::kCudaError, std::string("device query: ") + cudaGetErrorString(e));
  if (!cooperative || per_sm < 1)
    return error(Code::kUnsupportedArch, "the device cannot run this cooperative kernel");
  // A larger grid than what is resident could never pass grid.sync(): the launch refuses it.
  const int blocks = int(std::min<int64_t>(
      int64_t(sms) * per_sm, std::max<int64_t>(1, ceil_div(a.slots, kSlotsPerBlock))));
  void* base = nullptr;
  s = align_workspace(4 * (int64_t(blocks) * a.num_experts + blocks), &base);
  if (!s.ok()) return s;
  int* block_count = static_cast<int*>(base);
  int* block_bad = block_count + int64_t(blocks) * a.num_experts;
  const int32_t* ids = a.topk_ids;
  int32_t *sorted = a.sorted_ids, *experts = a.expert_ids, *post = a.num_post;
  int slots = int(a.slots), num_experts = a.num_experts, block_m = a.block_m,
      capacity = int(a.capacity);
  void* args[] = {&ids,         &sorted,  &experts,  &post,        &slots,
                  &num_experts, &block_m, &capacity, &block_count, &block_bad};
  e = cudaLaunchCooperativeKernel(align_v3_multi_block_kernel, dim3(unsigned(blocks)),
                                  dim3(kThreads), args, 0, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();  // reported here; it must not linger for the next launch to pick up
    return error(Code::kCudaError, std::string("v3 cooperative launch: ") + cudaGetErrorString(e));
  }
  return finish_align(a, stream, "v3_align_multi_block");
}

const Register kRegistered{align_version(
    "v3_align_multi_block", "per-block counts, grid.sync, per-block scan and scatter: one launch",
    align_v3_multi_block,
    {{"align_v3_multi_block_kernel",
      {},
      {"ATOMS"},
      {},
      true,
      "shared-memory atomics for the counting, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
