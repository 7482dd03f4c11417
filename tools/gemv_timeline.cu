// gemv_timeline — where chapter 06's persistent kernel spends its microseconds, warp by warp.
//
// The bench gives one number per launch; Nsight Compute gives averages over it. This tool builds
// the kernel of v4 to v7 (solutions/06_int4_gemv/persistent_gemv.cuh) with its timeline marks
// switched on: lane 0 of every warp writes %globaltimer when it passes each mark (entry, x issued,
// ring issued, x landed, prologue done, first stage landed, loop end, done). It runs v5's choice
// of mode for each shape and M, with whole tiles per warp (v5), with the steps shared evenly
// (the balanced kernel; it says which of the two v6 runs there) and with v7's two-stage ring
// and its plan; each timed
// as the bench times it (the L2 flushed by a read of twice its size before each launch, CUDA
// events around the launch, the median of 25), then one more launch with the marks recorded, and
// prints for each mark the spread over the warps (from the first warp's entry), the mean loop end
// of the warps by scheduler (warp index mod 4) with their count, and the spread of loop ends
// within a block. Before timing it checks the output against a float64 reference on 256 rows (the
// chapter's tolerance, reference/lkw/gemv.py). With the marks off (a null pointer) the kernel
// tests one global pointer per mark and is otherwise the version's kernel. Each kernel is also
// timed back to back (20 launches between two events over rotated copies of the weights, no
// flush), and v7's kernel once more as v8 runs it (a programmatic dependent launch), then v9's
// choice (persistent::launch_block_split: at M ≤ 2 the lean BF16 fold, S = 1 at M = 1), v10's
// (the same with every tile's walk rotated), v11's (the same with 128-byte line copies), v12's
// (v11's on the weights uploaded in int4t_gemv's tiled layout, where N is a multiple of 16 and K of
// 256), v13's (v12's with each block's tiles consecutive), v14's (v13's with the weights copied
// under an L2 evict_first policy) and v15's (v14's with the scales copied 8 steps at a time, where
// K/128 is a multiple of 8), and so is an empty kernel of the same shape.
//
//   build/lkw_gemv_timeline [M N K]...   # default: M = 1 and 8 at 28672 × 8192 and 8192 × 28672
//   LKW_TIMELINE_SPLITS=4 build/lkw_gemv_timeline ...   # K split in 4 (or the least that fits)
//   LKW_TIMELINE_KERNELS=sd build/lkw_gemv_timeline ... # only v7 and v8 (of "wbsdnrltcef": v5 to v15;
//                                                        # time v10 in a build with -DLKW_TIMELINE_NO_MARKS)
//   LKW_TIMELINE_READ=1 build/lkw_gemv_timeline ...     # also kernels that only read the weights: front to
//                                                        # back, in v7's pattern of 16 rows × 128 bytes per
//                                                        # warp step, in bursts of 128 to 1024 bytes per row,
//                                                        # and copied to shared memory in 512-byte bursts
//                                                        # (results/h200/probes/06_row_bursts.txt); and in
//                                                        # tiles of 16 to 1 rows, 2 KB per warp step, 1 to 4
//                                                        # steps in flight (results/h200/probes/06_long_rows.txt)
//   LKW_TIMELINE_READ=1 LKW_TIMELINE_READ_NARROW_ONLY=1 ...  # only the last, nothing else timed
//   LKW_TIMELINE_MARKS_BACK_TO_BACK=1 ...                # marks of the last of three launches back to back
//   (built with -DLKW_TIMELINE_V7_LINES: kind s runs v7's kernel with v11's 128-byte copies;
//    with -DLKW_TIMELINE_V12_PREFETCH=256: kind t with 256-byte prefetches instead of v12's 128)
//   LKW_TIMELINE_WARM_CODE=1 ...                         # the kernel's code back in L2 after each flush
//   LKW_TIMELINE_PER_SM=8 ...                            # 8 more marked launches: per launch and block its SM
//                                                        # and its warps' median and last loop end
//                                                        # ("persm launch block sm median max warps" lines;
//                                                        # results/h200/probes/06_per_sm.txt)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace lkw::gemv::timeline {
__device__ unsigned long long* g_marks;  // [block][warp][kSlots] nanoseconds, or null
constexpr int kSmSlot = 8;  // after the kernel's marks: the SM the warp ran on (%smid + 1)
constexpr int kSlots = kSmSlot + 1, kMaxWarps = 16;
__device__ __forceinline__ void mark(int point) {
  unsigned long long* marks = g_marks;
  if (marks != nullptr && threadIdx.x % 32 == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const size_t warp = (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * kMaxWarps + threadIdx.x / 32;
    marks[warp * kSlots + point] = t;
    if (point == 0) {  // entry
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      marks[warp * kSlots + kSmSlot] = sm + 1;
    }
  }
}
}  // namespace lkw::gemv::timeline

// -DLKW_TIMELINE_NO_MARKS compiles the marks out (the kernels exactly as the bench builds them; the
// marks' lines are then meaningless): with them in, v10's balanced kernel spills 4 bytes, which
// costs it time the bench's build does not pay.
#ifndef LKW_TIMELINE_NO_MARKS
#define LKW_GEMV_MARK(point) ::lkw::gemv::timeline::mark(point)
#endif
#include "06_int4_gemv/persistent_gemv.cuh"
#include "01_formats/formats_bits.cuh"
#include "lkw/numeric.h"

namespace {

using namespace lkw;
using namespace lkw::gemv;
namespace pk = lkw::gemv::persistent;
static_assert(pk::kMarks <= timeline::kSmSlot, "one slot per mark, then the SM's");
static_assert(pk::kWarps <= timeline::kMaxWarps, "one row per warp");

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gemv_timeline: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void flush_kernel(const uint4* buf, int64_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc ^= buf[i].x ^ buf[i].w;
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the reads
}

__global__ void empty_kernel() {}

// A kernel that only reads: kUnroll 16-byte loads in flight per thread, the XOR of all kept.
template <int kUnroll>
__global__ void read_kernel(const uint4* buf, int64_t n, unsigned* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(buf + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].w;
  }
  for (; i < n; i += stride) acc ^= buf[i].x;
  if (acc == 0x9e3779b9u) *sink = acc;
}

// A kernel that only reads, in the persistent kernel's pattern: warps of 16 rows (a tile), lane
// (g, t) the 16-byte chunks t and 4 + t of each 128-byte step of rows g and g + 8, kDepth steps
// loaded before any is used. Tiles per warp as v7's whole tiles (block + blocks·(warp + 16n)) or,
// kContiguous, a block's tiles one run of ⌈tiles / blocks⌉ with its warps on consecutive tiles.
template <int kDepth, bool kContiguous, bool kStagger = false>
__global__ void tile_read_kernel(const uint4* w, int tiles, int k, unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row_words = k / 32;  // 16-byte words per row
  const int iters = k / 256;
  int first = blockIdx.x + gridDim.x * warp, last = tiles, stride = gridDim.x * (blockDim.x / 32);
  if (kContiguous) {
    const int per = (tiles + gridDim.x - 1) / gridDim.x;
    first = blockIdx.x * per + warp;
    last = min(tiles, int(blockIdx.x + 1) * per);
    stride = blockDim.x / 32;
  }
  uint32_t acc = 0;
  for (int tile = first; tile < last; tile += stride) {
    const uint4* r0 = w + (int64_t(tile) * 16 + g) * row_words + t;
    const uint4* r1 = r0 + 8 * row_words;
    const int start = kStagger ? tile % iters : 0;  // kStagger: the walk along K starts at step tile mod iters
    for (int it = 0; it + kDepth <= iters; it += kDepth) {
      uint4 v[kDepth][4];
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        int step = it + d + start;
        if (step >= iters) step -= iters;
        v[d][0] = __ldcs(r0 + step * 8);
        v[d][1] = __ldcs(r0 + step * 8 + 4);
        v[d][2] = __ldcs(r1 + step * 8);
        v[d][3] = __ldcs(r1 + step * 8 + 4);
      }
#pragma unroll
      for (int d = 0; d < kDepth; ++d)
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[d][u].x ^ v[d][u].w;
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Steps of kRows rows × kRowWords 16-byte words, the lanes on consecutive words of the step, one row
// after the other (load instruction j on words 32j .. 32j + 31), kDepth steps loaded before any is
// used; tiles of kRows rows strided as v7's whole tiles; kStagger: the walk along K starts at step
// tile mod K-steps. Wider steps of v7's tiles: 16 rows × 8·kWide words (what the DRAM sees of a row
// at a time grows with kWide). Narrow tiles: kRows rows × 128/kRows words, 2 KB per step as v7's
// (with 16 rows an instruction reads 4 rows × 128 B; from 4 rows on, 512 B of one row).
template <int kRows, int kRowWords, int kDepth = 1, bool kStagger = false>
__global__ void rows_read_kernel(const uint4* w, int tiles, int k, unsigned* sink) {
  constexpr int kLoads = kRows * kRowWords / 32;  // per lane and step
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_words = k / 32;
  const int steps = int(row_words / kRowWords);
  uint32_t acc = 0;
  for (int tile = blockIdx.x + gridDim.x * warp; tile < tiles; tile += gridDim.x * (blockDim.x / 32)) {
    const uint4* base = w + int64_t(tile) * kRows * row_words;
    const int start = kStagger ? tile % steps : 0;
    for (int it = 0; it < steps; it += kDepth) {
      uint4 v[kDepth][kLoads];
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        int step = it + d + start;
        step -= step >= steps ? steps : 0;
        if (it + d >= steps) step = start;  // past the end: reload the first (cached), keep the shape
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int f = j * 32 + lane, row = f / kRowWords, col = f % kRowWords;
          v[d][j] = __ldcs(base + row * row_words + step * kRowWords + col);
        }
      }
#pragma unroll
      for (int d = 0; d < kDepth; ++d)
#pragma unroll
        for (int j = 0; j < kLoads; ++j) acc ^= v[d][j].x ^ v[d][j].w;
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Bursts of 512 bytes of one row (16 rows per warp step, one step in flight per warp) into shared
// memory: kBulk, one cp.async.bulk per row (lanes 0..15) completing on the warp's mbarrier; else
// 16 cp.async of 16 bytes per lane (one row per instruction). Rows 576 bytes apart in shared memory.
// sm_90 only (elsewhere the kernel does nothing).
template <bool kBulk>
__global__ void burst_copy_kernel(const uint4* w, int tiles, int k, unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // bulk copies and mbarriers: sm_90
  extern __shared__ uint4 sm[];
  __shared__ uint64_t bars[16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_words = k / 32;
  const int steps = k / 1024;
  uint4* st = sm + warp * 16 * 36;
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(&bars[warp]));
  if (lane == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncwarp();
  unsigned phase = 0;
  uint32_t acc = 0;
  for (int tile = blockIdx.x + gridDim.x * warp; tile < tiles; tile += gridDim.x * (blockDim.x / 32)) {
    const uint4* base = w + int64_t(tile) * 16 * row_words;
    for (int it = 0; it < steps; ++it) {
      if (kBulk) {
        if (lane == 0)
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(16 * 512) : "memory");
        __syncwarp();
        if (lane < 16) {
          const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(st + lane * 36));
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 512, [%2];" ::"r"(dst),
              "l"(base + lane * row_words + it * 32), "r"(bar)
              : "memory");
        }
        asm volatile(
            "{\n.reg .pred p;\nWAIT%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT%=;\n}" ::"r"(bar),
            "r"(phase)
            : "memory");
        phase ^= 1;
      } else {
#pragma unroll
        for (int r = 0; r < 16; ++r) lkw::gemv::mma::cp_async_16(st + r * 36 + lane, base + r * row_words + it * 32 + lane, true);
        lkw::gemv::mma::cp_async_commit();
        lkw::gemv::mma::cp_async_wait<0>();
        __syncwarp();
      }
#pragma unroll
      for (int r = 0; r < 16; ++r) acc ^= st[r * 36 + lane].x;
      __syncwarp();
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;
#endif
}

// The tool's two ways of timing a launch, CUDA events on the default stream: as the bench times
// one launch (the L2 flushed by a read of twice its size before each, events around it, the
// median of 25 after 3 unmeasured), and back to back (20 launches between two events with
// nothing between them, the median per launch of 10 batches after 2 unmeasured).
struct Times {
  float median, lo, hi;
  size_t count;
};
Times summary(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back(), t.size()};
}
class Clock {
 public:
  explicit Clock(const cudaDeviceProp& prop)
      : words_(2 * int64_t(prop.l2CacheSize) / 16), blocks_(4 * prop.multiProcessorCount) {
    check(cudaMalloc(&flush_, words_ * 16), "cudaMalloc flush");
    check(cudaMemset(flush_, 1, words_ * 16), "memset flush");
    check(cudaMalloc(&sink_, 4), "cudaMalloc sink");
    check(cudaEventCreate(&start_), "event");
    check(cudaEventCreate(&stop_), "event");
  }
  ~Clock() {
    cudaFree(flush_), cudaFree(sink_);
    cudaEventDestroy(start_), cudaEventDestroy(stop_);
  }
  unsigned* sink() const { return sink_; }
  void flush() const { flush_kernel<<<blocks_, 256>>>(flush_, words_, sink_); }
  // launch(i) the i-th launch; before(i), if given, runs after the flush, outside the events.
  Times after_flush(const std::function<void(int)>& launch,
                    const std::function<void(int)>& before = nullptr) const {
    std::vector<float> t;
    for (int i = 0; i < 28; ++i) {
      flush();
      if (before) before(i);
      const float us = timed([&] { launch(i); });
      if (i >= 3) t.push_back(us);
    }
    return summary(t);
  }
  Times back_to_back(const std::function<void(int)>& launch) const {
    std::vector<float> t;
    for (int b = 0, i = 0; b < 12; ++b) {
      const float us = timed([&] {
        for (int j = 0; j < 20; ++j) launch(i++);
      });
      if (b >= 2) t.push_back(us / 20);
    }
    return summary(t);
  }
  // In a CUDA graph: 20 launches (launch(i, stream) the i-th) captured once, the graph launched
  // 12 times, the first two dropped; per launch. Dependent launches keep their programmatic
  // edges in the graph.
  Times in_graph(const std::function<void(int, cudaStream_t)>& launch) const {
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    for (int j = 0; j < 20; ++j) launch(j, s);
    check(cudaStreamEndCapture(s, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    std::vector<float> t;
    for (int b = 0; b < 12; ++b) {
      const float us = timed([&] { check(cudaGraphLaunch(exec, 0), "graph launch"); });
      if (b >= 2) t.push_back(us / 20);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    return summary(t);
  }

 private:
  template <class F>
  float timed(F&& work) const {
    check(cudaEventRecord(start_), "record");
    work();
    check(cudaEventRecord(stop_), "record");
    check(cudaEventSynchronize(stop_), "timed launches");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
    return 1e3f * ms;
  }
  uint4* flush_;
  int64_t words_;
  int blocks_;
  unsigned* sink_;
  cudaEvent_t start_, stop_;
};

// What a launch costs with nothing in it: an empty kernel in the persistent kernel's shape (one
// block of 512 threads per SM), timed like the kernel (after the same flush), with no shared
// memory and with all an SM can give a block; then the same with the flush kernel asking for
// the same carve-out, so that no L1/shared-memory reconfiguration falls between the two kernels.
void launch_overhead(const cudaDeviceProp& prop) {
  const Clock clock(prop);
  const int smem = int(pk::smem_optin());
  check(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attr");
  auto time = [&](int bytes) {
    return clock.after_flush([&](int) { empty_kernel<<<prop.multiProcessorCount, pk::kWarps * 32, bytes>>>(); })
        .median;
  };
  const float none = time(0), full = time(smem);
  check(cudaFuncSetAttribute(flush_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             int(cudaSharedmemCarveoutMaxShared)), "carveout");
  const float same = time(smem);
  check(cudaFuncSetAttribute(flush_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             int(cudaSharedmemCarveoutDefault)), "carveout");
  // Back to back and in a CUDA graph: plain launches and launches as programmatic dependents.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(prop.multiProcessorCount);
  config.blockDim = dim3(pk::kWarps * 32);
  config.dynamicSmemBytes = smem;
  config.attrs = &attr;
  auto launch_empty = [&](bool dependent, cudaStream_t s) {
    config.numAttrs = dependent ? 1 : 0;
    config.stream = s;
    check(cudaLaunchKernelEx(&config, empty_kernel), "empty launch");
  };
  auto back_to_back = [&](bool dependent) {
    return clock.back_to_back([&](int) { launch_empty(dependent, nullptr); }).median;
  };
  auto graph = [&](bool dependent) {
    return clock.in_graph([&](int, cudaStream_t s) { launch_empty(dependent, s); }).median;
  };
  const float b2b = back_to_back(false), b2b_dependent = back_to_back(true);
  std::printf("# the empty kernel in a CUDA graph of 20 launches: %.2f us per launch, %.2f us as dependent launches\n",
              graph(false), graph(true));
  std::printf("# an empty kernel of %d blocks × %d threads after the flush, median of 25: %.2f us with no "
              "shared memory, %.2f us with %d KB per block, %.2f us with the flush asking for the same carve-out; "
              "back to back (%d KB per block) %.2f us per launch, %.2f us as dependent launches\n",
              prop.multiProcessorCount, pk::kWarps * 32, none, full, smem / 1024, same, smem / 1024, b2b,
              b2b_dependent);
}

uint16_t bf16_of(double v) { return formats::f32_to_bf16_bits(float(v)); }
double bf16_value(uint16_t bits) { return bf16_bits_to_f32(bits); }

const char* path_name(int64_t m, int group) {
  switch (pk::v5_path(m, group)) {
    case pk::V5Path::kFoldF16: return "FP16 fold";
    case pk::V5Path::kFold: return "BF16 fold";
    default: return "scale in A";
  }
}
// v5's kernel (whole tiles per warp), the balanced kernel v6 runs where its model says it pays
// (the same modes, the block's steps shared out evenly over its warps), or v7's (v5's with the
// shallow ring and its plan).
enum class Kernel {
  kWhole, kBalanced, kShallow, kDependent, kBlockSplit, kRotated, kLines, kTiled, kConsecutive, kEvictFirst,
  kBlockScales
};
// v12 to v15 read the weights in int4t_gemv's tiled layout (uploaded so, N a multiple of 16, K of 256).
bool reads_tiled(Kernel k) {
  return k == Kernel::kTiled || k == Kernel::kConsecutive || k == Kernel::kEvictFirst || k == Kernel::kBlockScales;
}
#ifndef LKW_TIMELINE_V12_PREFETCH
#define LKW_TIMELINE_V12_PREFETCH 128  // v12's
#endif
Kernel g_kernel = Kernel::kWhole;
template <int kNTiles, int kMode>
Status launch_mode(const GemvArgs& a, cudaStream_t stream) {
  switch (g_kernel) {
    case Kernel::kBalanced: return pk::launch<kNTiles, kMode, true>(kInt4iGemv, a, stream);
#ifdef LKW_TIMELINE_V7_LINES  // v7's kernel with v11's 128-byte copies (kind s only)
    case Kernel::kShallow: return pk::launch_v7_mode<kNTiles, kMode, 128>(kInt4iGemv, a, stream);
#else
    case Kernel::kShallow: return pk::launch_v7_mode<kNTiles, kMode>(kInt4iGemv, a, stream);
#endif
    case Kernel::kDependent: return pk::launch_v7_mode<kNTiles, kMode>(kInt4iGemv, a, stream, true);
    case Kernel::kBlockSplit: return pk::launch_block_split<kInt4iGemv>(a, stream);
    case Kernel::kRotated: return pk::launch_block_split<kInt4iGemv, true>(a, stream);
    case Kernel::kLines: return pk::launch_block_split<kInt4iGemv, false, 128>(a, stream);
    case Kernel::kTiled:  // the weights uploaded tiled (run)
      return pk::launch_block_split<kInt4tGemv, false, LKW_TIMELINE_V12_PREFETCH>(a, stream);
    case Kernel::kConsecutive:  // v13: v12's launch with each block's tiles consecutive
      return pk::launch_block_split<kInt4tGemv, false, LKW_TIMELINE_V12_PREFETCH>(a, stream, /*consecutive=*/true);
    case Kernel::kBlockScales:  // v15: v14 with the scales in blocks of 8 steps where they apply
      return pk::launch_block_split<kInt4tGemv, false, 128, true, true>(a, stream, /*consecutive=*/true);
    case Kernel::kEvictFirst:  // v14: v13 with the weights copied evict_first
      return pk::launch_block_split<kInt4tGemv, false, 128, true>(a, stream, /*consecutive=*/true);
    case Kernel::kWhole: break;
  }
  return pk::launch<kNTiles, kMode, false>(kInt4iGemv, a, stream);
}
Status launch_v5(const GemvArgs& a, cudaStream_t stream) {
  return pk::with_v5_mode(a.m, a.group, [&](auto tiles, auto mode) {
    return launch_mode<decltype(tiles)::value, decltype(mode)::value>(a, stream);
  });
}

template <bool kBalanced, int kStages = 0>
int splits_of(int64_t m, int64_t n, int64_t k, int sms) {
  return pk::with_v5_mode(m, 128, [&](auto tiles, auto mode) {
    constexpr int kT = decltype(tiles)::value, kM = decltype(mode)::value;
    constexpr int kS = kStages > 0 ? kStages : pk::stages_for<kT>();
    return pk::plan_for<kT, kM, kBalanced, kS>(m, n, k, sms, pk::smem_optin()).splits;
  });
}

// Whether v7 cuts its runs at half tiles at this shape (pk::v7_halves for v5's mode).
bool v7_picks_halves(const GemvArgs& a) {
  return pk::with_v5_mode(a.m, a.group, [&](auto tiles, auto mode) {
    return pk::v7_halves<decltype(tiles)::value, decltype(mode)::value>(a);
  });
}

// Whether v6 runs the balanced kernel at this shape (pk::v6_balances for v5's mode).
bool v6_picks_balanced(const GemvArgs& a) {
  return pk::with_v5_mode(a.m, a.group, [&](auto tiles, auto mode) {
    return pk::v6_balances<decltype(tiles)::value, decltype(mode)::value>(a);
  });
}

// LKW_TIMELINE_WARM_CODE: after each flush, before the timed or marked launch, four launches of
// the kernel's instantiations for this M (whole tiles and balanced, both ring depths) on 16 rows,
// so that the kernel's code is back in L2 (and its constants) while its data is not.
bool g_warm_code = false;
void warm_code(const GemvArgs& a) {
  GemvArgs tiny = a;
  tiny.n = 16;
  pk::with_v5_mode(a.m, a.group, [&](auto tiles, auto mode) {
    constexpr int kT = decltype(tiles)::value, kM = decltype(mode)::value;
    pk::launch<kT, kM, false>(kInt4iGemv, tiny, nullptr);
    pk::launch<kT, kM, true>(kInt4iGemv, tiny, nullptr);
    pk::launch<kT, kM, false, pk::kShallowStages>(kInt4iGemv, tiny, nullptr);
    return pk::launch<kT, kM, true, pk::kShallowStages>(kInt4iGemv, tiny, nullptr);
  });
}

void run(int64_t m, int64_t n, int64_t k, const cudaDeviceProp& prop) {
  constexpr int64_t g = 128;
  std::mt19937 rng(1234 + uint32_t(m * 7 + n + k));
  // Each word repeats one random nibble, so the reference needs no interleave table.
  std::vector<uint32_t> words(n * k / 8);
  std::vector<uint8_t> q(words.size());
  for (size_t i = 0; i < words.size(); ++i) {
    q[i] = uint8_t(rng() % 16);
    words[i] = 0x11111111u * q[i];
  }
  std::uniform_real_distribution<double> unit(-1, 1), log_scale(-8, -5);
  std::vector<uint16_t> x(m * k), scales(n * k / g);
  for (auto& v : x) v = bf16_of(unit(rng));
  for (auto& s : scales) s = bf16_of(std::exp2(log_scale(rng)));
  // v12 reads int4t_gemv's tiled layout: the same words, uploaded in that order (q stays by row).
  std::vector<uint32_t> upload = words;
  if (reads_tiled(g_kernel))
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k / 8; ++j) upload[tiled_word(r, j, k)] = words[r * (k / 8) + j];

  // Copies of x, the weights and the scales, used in turn (as the bench rotates its input sets):
  // enough that the launches back to back (below) read more than twice the L2 between two reads of
  // one copy; at least two. For the tiled op's kernels (v12 to v15), as the bench's
  // Case.rotate_past_largest, enough that x and the scales alone exceed twice the L2: v14 copies the
  // weights evict_first, and the rest of a few copies would stay in L2 from launch to launch.
  // LKW_TIMELINE_SETS=n asks for at least n.
  const int64_t rest_bytes = int64_t(x.size()) * 2 + int64_t(scales.size()) * 2;
  const int64_t set_bytes = int64_t(words.size()) * 4 + rest_bytes;
  const int64_t rotated_bytes = reads_tiled(g_kernel) ? rest_bytes : set_bytes;
  int sets = int(std::max<int64_t>(2, (2 * int64_t(prop.l2CacheSize) + rotated_bytes - 1) / rotated_bytes + 1));
  if (const char* least = std::getenv("LKW_TIMELINE_SETS")) sets = std::max(sets, std::atoi(least));
  std::vector<uint32_t*> w_d(sets);
  std::vector<__nv_bfloat16*> s_d(sets), x_d(sets);
  __nv_bfloat16* y_d;
  for (int i = 0; i < sets; ++i) {
    check(cudaMalloc(&w_d[i], words.size() * 4), "cudaMalloc w");
    check(cudaMemcpy(w_d[i], upload.data(), upload.size() * 4, cudaMemcpyHostToDevice), "copy w");
    check(cudaMalloc(&s_d[i], scales.size() * 2), "cudaMalloc scales");
    check(cudaMemcpy(s_d[i], scales.data(), scales.size() * 2, cudaMemcpyHostToDevice), "copy scales");
    check(cudaMalloc(&x_d[i], x.size() * 2), "cudaMalloc x");
    check(cudaMemcpy(x_d[i], x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy x");
  }
  check(cudaMalloc(&y_d, m * n * 2), "cudaMalloc y");
  const Clock clock(prop);
  const size_t slots = size_t(prop.multiProcessorCount) * timeline::kMaxWarps * timeline::kSlots;
  unsigned long long* marks_d;
  check(cudaMalloc(&marks_d, slots * 8), "cudaMalloc marks");
  auto args = [&](int i) {
    return GemvArgs{x_d[i % sets], w_d[i % sets], s_d[i % sets], nullptr, y_d, m, n, k, int(g)};
  };

  // Verify first: 256 rows against float64, the chapter's tolerance.
  check(cudaMemset(y_d, 0xff, m * n * 2), "poison y");
  Status st = launch_v5(args(0), nullptr);
  if (!st.ok()) {
    std::fprintf(stderr, "gemv_timeline: launch failed: %s\n", st.str().c_str());
    std::exit(1);
  }
  std::vector<uint16_t> y(m * n);
  check(cudaMemcpy(y.data(), y_d, y.size() * 2, cudaMemcpyDeviceToHost), "copy y");
  int64_t bad = 0, checked = 0;
  for (int64_t i = 0; i < 256; ++i) {
    const int64_t c = int64_t(rng() % uint64_t(n));
    for (int64_t r = 0; r < m; ++r) {
      double sum = 0, sq = 0, abs_sum = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = bf16_value(x[r * k + kk]) * bf16_value(scales[c * (k / g) + kk / g]) *
                         (int(q[(c * k + kk) / 8]) - 8);
        sum += p, sq += p * p, abs_sum += std::fabs(p);
      }
      const double atol = 14 * std::exp2(-9) * std::sqrt(sq) + 8 * std::sqrt(double(k)) * std::exp2(-24) * abs_sum;
      const double got = bf16_value(y[r * n + c]);
      if (!(std::fabs(got - sum) <= 1.6e-2 * std::fabs(sum) + atol)) ++bad;
      ++checked;
    }
  }
  if (bad) {
    std::printf("M=%lld %lld x %lld: %lld of %lld checked outputs WRONG, nothing timed\n", (long long)m,
                (long long)n, (long long)k, (long long)bad, (long long)checked);
    std::exit(1);
  }

  // Time as the bench does (with LKW_TIMELINE_WARM_CODE the code warmed after each flush).
  const Times times = clock.after_flush([&](int i) { launch_v5(args(i), nullptr); },
                                        g_warm_code ? std::function<void(int)>([&](int i) { warm_code(args(i + 1)); })
                                                    : nullptr);

  // What a kernel that only reads these weights and scales takes (the weights' bytes of the
  // copies in turn, each launch one copy): after the flush, and back to back.
  static std::vector<std::pair<int64_t, int64_t>> read_done;  // once per N × K
  if (std::getenv("LKW_TIMELINE_READ") &&
      std::find(read_done.begin(), read_done.end(), std::make_pair(n, k)) == read_done.end()) {
    read_done.emplace_back(n, k);
    const double bytes = double(words.size()) * 4;
    auto time_read = [&](const std::string& what, const std::function<void(int)>& read) {
      const float alone = clock.after_flush(read).median, b2b = clock.back_to_back(read).median;
      std::printf("# %lld x %lld: %s: %.2f us after the flush (%.1f GB/s), %.2f us back to back (%.1f GB/s)\n",
                  (long long)n, (long long)k, what.c_str(), alone, bytes / (alone * 1e3), b2b, bytes / (b2b * 1e3));
    };
    auto weights = [&](int i) { return reinterpret_cast<const uint4*>(w_d[i % sets]); };
    const int sms = prop.multiProcessorCount;
    for (int blocks_per_sm : {2, 4, 8})
      time_read("read only, " + std::to_string(words.size() * 4 >> 20) + " MB of weights, " +
                    std::to_string(blocks_per_sm) + " blocks of 512 per SM, 4 loads in flight per thread",
                [&](int i) {
                  read_kernel<4><<<blocks_per_sm * sms, 512>>>(weights(i), int64_t(words.size()) / 4, clock.sink());
                });
    // Narrow tiles of 16, 4, 2, 1 rows, 2 KB per warp step (results/h200/probes/06_long_rows.txt).
    auto narrow_read = [&](auto rows, auto depth, auto stagger) {
      constexpr int kR = decltype(rows)::value, kD = decltype(depth)::value;
      constexpr bool kS = decltype(stagger)::value;
      if ((k / 2) % (2048 / kR) != 0) return;
      time_read("read only in tiles of " + std::to_string(kR) + " rows (strided as v7" +
                    (kS ? ", the walk along K staggered" : "") + "), steps of " + std::to_string(kR) + " rows x " +
                    std::to_string(2048 / kR) + " B, " + std::to_string(kD) + " in flight per warp",
                [&](int i) {
                  rows_read_kernel<kR, 128 / kR, kD, kS><<<sms, 512>>>(weights(i), int(n / kR), int(k), clock.sink());
                });
    };
    {
      using std::integral_constant;
      const std::false_type no;
      const std::true_type yes;
      narrow_read(integral_constant<int, 16>{}, integral_constant<int, 1>{}, no);
      narrow_read(integral_constant<int, 4>{}, integral_constant<int, 1>{}, no);
      narrow_read(integral_constant<int, 4>{}, integral_constant<int, 2>{}, no);
      narrow_read(integral_constant<int, 2>{}, integral_constant<int, 1>{}, no);
      narrow_read(integral_constant<int, 2>{}, integral_constant<int, 2>{}, no);
      narrow_read(integral_constant<int, 2>{}, integral_constant<int, 3>{}, no);
      narrow_read(integral_constant<int, 2>{}, integral_constant<int, 4>{}, no);
      narrow_read(integral_constant<int, 2>{}, integral_constant<int, 1>{}, yes);
      narrow_read(integral_constant<int, 2>{}, integral_constant<int, 2>{}, yes);
      narrow_read(integral_constant<int, 1>{}, integral_constant<int, 2>{}, no);
    }
    if (std::getenv("LKW_TIMELINE_READ_NARROW_ONLY")) return;
    // The patterns of whole tiles (results/h200/probes/06_row_bursts.txt): only where at least half
    // the warps (16 per SM) have a tile.
    const int tiles = int(n / 16);
    if (2 * tiles >= pk::kWarps * sms) {
      auto burst_copy = [&](auto bulk) {
        constexpr bool kB = decltype(bulk)::value;
        const int smem = 16 * 16 * 36 * 16;
        check(cudaFuncSetAttribute(burst_copy_kernel<kB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
        time_read(std::string("copied to shared memory in steps of 16 rows x 512 B (") +
                      (kB ? "cp.async.bulk per row" : "cp.async, a row per instruction") + "), one in flight per warp",
                  [&](int i) { burst_copy_kernel<kB><<<sms, 512, smem>>>(weights(i), tiles, int(k), clock.sink()); });
      };
      auto wide_read = [&](auto wide) {
        constexpr int kW = decltype(wide)::value;
        time_read("read only in tiles of 16 rows (tiles strided as v7), steps of 16 rows x " +
                      std::to_string(128 * kW) + " B, one in flight per warp",
                  [&](int i) { rows_read_kernel<16, 8 * kW><<<sms, 512>>>(weights(i), tiles, int(k), clock.sink()); });
      };
      auto tile_read = [&](auto depth, auto contiguous, auto stagger) {
        constexpr int kD = decltype(depth)::value;
        constexpr bool kC = decltype(contiguous)::value, kS = decltype(stagger)::value;
        time_read(std::string("read only in tiles of 16 rows (") +
                      (kC ? "a block's tiles contiguous" : "tiles strided as v7") +
                      (kS ? ", the walk along K from step tile mod K/256" : "") + "), " + std::to_string(kD) +
                      " steps of 2 KB per warp in flight",
                  [&](int i) { tile_read_kernel<kD, kC, kS><<<sms, 512>>>(weights(i), tiles, int(k), clock.sink()); });
      };
      using std::integral_constant;
      const std::false_type no;
      const std::true_type yes;
      burst_copy(yes);
      burst_copy(no);
      wide_read(integral_constant<int, 1>{});
      wide_read(integral_constant<int, 2>{});
      wide_read(integral_constant<int, 4>{});
      wide_read(integral_constant<int, 8>{});
      tile_read(integral_constant<int, 1>{}, no, no);
      tile_read(integral_constant<int, 2>{}, no, no);
      tile_read(integral_constant<int, 1>{}, no, yes);
      tile_read(integral_constant<int, 2>{}, no, yes);
      tile_read(integral_constant<int, 4>{}, no, yes);
      tile_read(integral_constant<int, 1>{}, yes, yes);
      tile_read(integral_constant<int, 2>{}, yes, yes);
    }
  }

  // Back to back, as in a decoder's stream, over the rotated copies.
  const Times stream_times = clock.back_to_back([&](int i) { launch_v5(args(i), nullptr); });

  // Launches with the marks on: `launches` runs them, then the marks are copied into h; returns
  // the first warp's entry, the origin of every time printed.
  std::vector<unsigned long long> h(slots);
  const size_t warps = slots / timeline::kSlots;
  auto at = [&](size_t w, int mk) { return h[w * timeline::kSlots + mk]; };
  auto record = [&](auto&& launches) {
    check(cudaMemset(marks_d, 0, slots * 8), "memset marks");
    check(cudaMemcpyToSymbol(timeline::g_marks, &marks_d, sizeof(marks_d)), "marks on");
    launches();
    check(cudaDeviceSynchronize(), "marked launch");
    unsigned long long* off = nullptr;
    check(cudaMemcpyToSymbol(timeline::g_marks, &off, sizeof(off)), "marks off");
    check(cudaMemcpy(h.data(), marks_d, slots * 8, cudaMemcpyDeviceToHost), "copy marks");
    unsigned long long first = ~0ull;
    for (size_t w = 0; w < warps; ++w)
      if (at(w, pk::kMarkEntry)) first = std::min(first, at(w, pk::kMarkEntry));
    return first;
  };
  // LKW_TIMELINE_MARKS_BACK_TO_BACK: the last of three launches back to back (each overwrites
  // the marks of the one before), no flush; else one launch after the flush.
  const bool marks_b2b = std::getenv("LKW_TIMELINE_MARKS_BACK_TO_BACK") != nullptr;
  const unsigned long long t0 = record([&] {
    if (marks_b2b) {
      for (int i = 0; i < 3; ++i) launch_v5(args(i), nullptr);
    } else {
      clock.flush();
      if (g_warm_code) warm_code(args(2));
      launch_v5(args(1), nullptr);
    }
  });
  const int sms = prop.multiProcessorCount;
  // v7's ring: v7, v8, and v9 (which runs v8's kernels past M = 2).
  const bool block_split =
      g_kernel == Kernel::kBlockSplit || g_kernel == Kernel::kRotated || g_kernel == Kernel::kLines ||
      reads_tiled(g_kernel);  // v9 to v15
  const bool shallow = g_kernel == Kernel::kShallow || g_kernel == Kernel::kDependent || block_split;
  // v9 at M ≤ 2: the lean BF16 fold, S = 1 at M = 1 where the row fits (pk::launch_block_split).
  const bool v9_own = block_split && m <= 2;
  int v9_force = 0;
  const int splits = g_kernel == Kernel::kBalanced ? splits_of<true>(m, n, k, sms)
                     : v9_own                      ? pk::block_split_plan(m, n, k, &v9_force).splits
                     : shallow                     ? splits_of<false, pk::kShallowStages>(m, n, k, sms)
                                                   : splits_of<false>(m, n, k, sms);
  const bool v6_balanced = v6_picks_balanced(args(0));
  const bool v6_runs = !shallow && (g_kernel == Kernel::kBalanced) == v6_balanced;
  const char* halves = v9_own                              ? (splits == 1 ? ", even cuts" : "")
                      : shallow && v7_picks_halves(args(0)) ? ", half tiles"
                                                            : "";
  std::printf("\nM = %lld, N = %lld, K = %lld (%s%s: %s, S = %d%s): %.2f us median of %zu launches (%.2f .. %.2f); "
              "back to back over %d copies %.2f us per launch (median of %zu batches, %.2f .. %.2f)\n",
              (long long)m, (long long)n, (long long)k,
              g_kernel == Kernel::kBalanced    ? "balanced steps"
              : g_kernel == Kernel::kShallow   ? "shallow ring (v7)"
              : g_kernel == Kernel::kDependent ? "shallow ring as a dependent launch (v8)"
              : g_kernel == Kernel::kBlockSplit ? "K split in the block (v9)"
              : g_kernel == Kernel::kRotated    ? "v9 with the walk rotated (v10)"
              : g_kernel == Kernel::kLines      ? "v9 with 128-byte line copies (v11)"
              : g_kernel == Kernel::kTiled      ? (LKW_TIMELINE_V12_PREFETCH == 128 ? "v11 on tiled weights (v12)"
                                                                                    : "v12 with 256-byte prefetches")
              : g_kernel == Kernel::kConsecutive ? "v12 with each block's tiles consecutive (v13)"
              : g_kernel == Kernel::kEvictFirst  ? "v13 with the weights copied evict_first (v14)"
              : g_kernel == Kernel::kBlockScales ? "v14 with the scales in blocks of 8 steps (v15)"
                                               : "whole tiles (v5)",
              halves, v9_own ? "lean BF16 fold" : path_name(m, int(g)), splits, v6_runs ? "; v6 runs this" : "",
              times.median, times.count, times.lo, times.hi, sets, stream_times.median, stream_times.count,
              stream_times.lo, stream_times.hi);
  const Times graph_times = clock.in_graph([&](int i, cudaStream_t s) { launch_v5(args(i), s); });
  std::printf("  in a CUDA graph of 20 launches: %.2f us per launch (median of %zu graph launches, %.2f .. %.2f)\n",
              graph_times.median, graph_times.count, graph_times.lo, graph_times.hi);
  std::printf("  marks of the recorded launch%s, us from the first warp's entry (warps that reached them)\n",
              marks_b2b ? " (the last of three back to back)" : "");
  const char* names[pk::kMarks] = {"entry", "x issued", "ring issued", "x landed", "prologue done",
                                   "first stage", "loop end", "done"};
  for (int mk = 0; mk < pk::kMarks; ++mk) {
    std::vector<double> v;
    for (size_t w = 0; w < warps; ++w)
      if (at(w, mk)) v.push_back((at(w, mk) - t0) * 1e-3);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("  %-14s %5zu warps  min %6.2f  median %6.2f  p90 %6.2f  max %6.2f\n", names[mk], v.size(),
                v.front(), v[v.size() / 2], v[v.size() * 9 / 10], v.back());
  }
  // Warps with work (they reached their first stage), by scheduler: warp w issues from SMSP w % 4.
  std::printf("  loop end of the warps with work, by scheduler (warp %% 4): ");
  for (int sp = 0; sp < 4; ++sp) {
    double sum = 0;
    int count = 0;
    for (size_t w = 0; w < warps; ++w)
      if (int(w % timeline::kMaxWarps) % 4 == sp && at(w, pk::kMarkFirstStage) && at(w, pk::kMarkLoopEnd)) {
        sum += (at(w, pk::kMarkLoopEnd) - t0) * 1e-3;
        ++count;
      }
    if (count) std::printf(" %d: %.2f us (%d warps)", sp, sum / count, count);
  }
  std::printf("\n");
  // Within a block: the spread of its warps' loop ends (last − first), over the blocks.
  std::vector<double> spread;
  for (size_t b = 0; b < warps / timeline::kMaxWarps; ++b) {
    double lo = 1e30, hi = -1;
    for (int w = 0; w < timeline::kMaxWarps; ++w) {
      const auto t = at(b * timeline::kMaxWarps + w, pk::kMarkLoopEnd);
      if (t) lo = std::min(lo, (t - t0) * 1e-3), hi = std::max(hi, (t - t0) * 1e-3);
    }
    if (hi >= 0) spread.push_back(hi - lo);
  }
  if (!spread.empty()) {
    std::sort(spread.begin(), spread.end());
    std::printf("  loop end, last − first warp of a block: median %.2f  p90 %.2f  max %.2f us (%zu blocks)\n",
                spread[spread.size() / 2], spread[spread.size() * 9 / 10], spread.back(), spread.size());
  }
  // LKW_TIMELINE_PER_SM=R: R more marked launches after the flush; per launch and block, the SM it
  // ran on and its working warps' median and last loop end, one line per block.
  if (const char* reps = std::getenv("LKW_TIMELINE_PER_SM")) {
    for (int rep = 0; rep < std::atoi(reps); ++rep) {
      const unsigned long long r0 = record([&] {
        clock.flush();
        launch_v5(args(rep + 1), nullptr);
      });
      for (size_t b = 0; b < warps / timeline::kMaxWarps; ++b) {
        std::vector<double> ends;
        unsigned long long sm = 0;
        for (int w = 0; w < timeline::kMaxWarps; ++w) {
          const size_t ww = b * timeline::kMaxWarps + w;
          if (at(ww, timeline::kSmSlot)) sm = at(ww, timeline::kSmSlot) - 1;
          if (at(ww, pk::kMarkFirstStage) && at(ww, pk::kMarkLoopEnd)) ends.push_back((at(ww, pk::kMarkLoopEnd) - r0) * 1e-3);
        }
        if (ends.empty()) continue;
        std::sort(ends.begin(), ends.end());
        std::printf("  persm %d %zu %llu %.2f %.2f %zu\n", rep, b, sm, ends[ends.size() / 2], ends.back(), ends.size());
      }
    }
  }
  for (int i = 0; i < sets; ++i) cudaFree(w_d[i]), cudaFree(s_d[i]), cudaFree(x_d[i]);
  cudaFree(y_d), cudaFree(marks_d);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> shapes;  // M, N, K triples
  for (int i = 1; i < argc; ++i) shapes.push_back(std::atoll(argv[i]));
  if (shapes.empty()) shapes = {1, 28672, 8192, 8, 28672, 8192, 1, 8192, 28672, 8, 8192, 28672};
  if (shapes.size() % 3 != 0) {
    std::fprintf(stderr, "usage: lkw_gemv_timeline [M N K]...\n");
    return 2;
  }
  for (size_t i = 0; i < shapes.size(); i += 3) {
    const int64_t m = shapes[i], n = shapes[i + 1], k = shapes[i + 2];
    if (m < 1 || m > kMaxM || n < 1 || k < 128 || k % 128 != 0) {
      std::fprintf(stderr, "gemv_timeline: M in 1..16, N ≥ 1, K a multiple of 128 (G = 128)\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("gemv_timeline: no CUDA device, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  g_warm_code = std::getenv("LKW_TIMELINE_WARM_CODE") != nullptr;
  if (g_warm_code) std::printf("# the kernel's code warmed after each flush (16-row launches)\n");
  const char* kinds = std::getenv("LKW_TIMELINE_KERNELS");  // a subset of "wbsdnrltcef" (v5 to v15)
  if (const char* splits = std::getenv("LKW_TIMELINE_SPLITS")) {  // force S (where x fits)
    pk::g_force_splits = std::atoi(splits);
    std::printf("# S forced to %d where the x slice fits\n", pk::g_force_splits);
  }

  std::printf("# %s, %d SMs, %d MB L2; chapter 06's persistent kernel with whole tiles (v5), balanced steps (v6 where its model picks them), the shallow ring (v7), v7 as a dependent launch (v8), v9's K split in the block, v10's rotated walk, v11's 128-byte line copies, v12's tiled weights, v13's consecutive tiles and v14's evict_first weight copies, INT4 interleaved, G = 128\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  launch_overhead(prop);
  for (size_t i = 0; i < shapes.size(); i += 3) {
    for (const Kernel kernel :
         {Kernel::kWhole, Kernel::kBalanced, Kernel::kShallow, Kernel::kDependent, Kernel::kBlockSplit,
          Kernel::kRotated, Kernel::kLines, Kernel::kTiled, Kernel::kConsecutive, Kernel::kEvictFirst,
          Kernel::kBlockScales}) {
      if (kinds && !std::strchr(kinds, "wbsdnrltcef"[int(kernel)])) continue;
      if (reads_tiled(kernel) && (shapes[i + 1] % 16 || shapes[i + 2] % 256)) {
        std::printf("\n(v12 to v15 skipped at %lld x %lld: the tool tiles whole tiles and steps only)\n",
                    (long long)shapes[i + 1], (long long)shapes[i + 2]);
        continue;
      }
      g_kernel = kernel;
      run(shapes[i], shapes[i + 1], shapes[i + 2], prop);
    }
  }
  return 0;
}
