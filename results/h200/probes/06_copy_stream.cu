// 06_copy_stream.cu — v12's weight stream alone, by four copy mechanisms (results/h200/probes/06_v12_parts.txt).
//
// The tiled weights of int4t_gemv (tiles of 16 rows, K/256 steps of 2 KB each), a block's tiles b, b + 132, ...,
// each of its 16 warps an even cut of the block's steps, as v12 walks them, copied into a per-warp ring of
// shared memory by (0) cp.async, 16 bytes a lane with the 128-byte L2 hint (v12's copies), (1) one
// cp.async.bulk of 2 KB per step completing on an mbarrier, (3) one cp.async.bulk of 4 KB (two steps) per
// stage; or (2) read by plain 16-byte loads into registers, two steps in flight. The consumer folds the
// stage's words into a checksum; no x, no scales, no arithmetic. Launched as programmatic dependents, the
// first stages issued before griddepcontrol.wait as v12 does. Times: back to back over rotated copies (the
// median of 10 batches of 20) and in a CUDA graph of 20 launches (the median of 10), us.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a 06_copy_stream.cu -o copy_stream
//   ./copy_stream 28672 8192 57344 8192 8192 28672 16384 28672     # N K pairs
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e = (x);                                                          \
    if (e != cudaSuccess) {                                                       \
      std::printf("%s: %s (line %d)\n", #x, cudaGetErrorString(e), __LINE__);     \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

constexpr int kWarps = 16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int kMode, int kStages>
__global__ void __launch_bounds__(kWarps * 32, 1)
    stream_kernel(const uint4* w, int tiles, int steps_per_tile, uint32_t* sink) {
  constexpr int kStepBytes = kMode == 3 ? 4096 : 2048;
  constexpr int kSub = kStepBytes / 2048;  // 2-KB steps per stage
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* ring = smem + warp * kStages * kStepBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kWarps * kStages * kStepBytes) + warp * kStages;
  // The block's steps: tile b + blocks·(j / spt), step j % spt; warp w an even cut.
  const int blocks = gridDim.x, b = blockIdx.x;
  const int my_tiles = b < tiles ? (tiles - b + blocks - 1) / blocks : 0;
  const int total = my_tiles * steps_per_tile / kSub;  // stages of the block
  const int lo = int(int64_t(total) * warp / kWarps), hi = int(int64_t(total) * (warp + 1) / kWarps);
  auto src = [&](int j) {  // first uint4 of the block's stage j
    const int s = j * kSub;
    const int tile = b + blocks * (s / steps_per_tile);
    return w + (int64_t(tile) * steps_per_tile + s % steps_per_tile) * 128;
  };
  if constexpr (kMode == 1 || kMode == 3) {
    if (lane < kStages) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[lane])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
  }
  uint32_t acc = 0;
  auto issue = [&](int j) {
    if (j >= hi) {
      if constexpr (kMode == 0) asm volatile("cp.async.commit_group;" ::: "memory");
      return;
    }
    unsigned char* st = ring + (j - lo) % kStages * kStepBytes;
    if constexpr (kMode == 0) {
      const uint4* s = src(j);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(smem_addr(st + (c * 32 + lane) * 16)),
                     "l"(s + c * 32 + lane)
                     : "memory");
      asm volatile("cp.async.commit_group;" ::: "memory");
    } else if constexpr (kMode == 1 || kMode == 3) {
      if (lane == 0) {
        const uint32_t bar = smem_addr(&bars[(j - lo) % kStages]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kStepBytes) : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_addr(st)),
            "l"(src(j)), "r"(kStepBytes), "r"(bar)
            : "memory");
      }
    }
  };
  if constexpr (kMode == 2) {
    // Registers: two steps in flight (8 loads per lane), consumed in order.
    uint4 r[2][4];
    auto load = [&](int j, uint4* d) {
      if (j < hi) {
        const uint4* s = src(j);
#pragma unroll
        for (int c = 0; c < 4; ++c) d[c] = __ldcs(s + c * 32 + lane);
      }
    };
    load(lo, r[0]);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int j = lo; j < hi; j += 2) {
      load(j + 1, r[1]);
#pragma unroll
      for (int c = 0; c < 4; ++c) acc ^= r[0][c].x ^ r[0][c].y ^ r[0][c].z ^ r[0][c].w;
      load(j + 2, r[0]);
      if (j + 1 < hi) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc ^= r[1][c].x ^ r[1][c].y ^ r[1][c].z ^ r[1][c].w;
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(lo + s);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int j = lo; j < hi; ++j) {
      __syncwarp();
      issue(j + kStages - 1);
      const int slot = (j - lo) % kStages;
      if constexpr (kMode == 0) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
      } else {
        const uint32_t bar = smem_addr(&bars[slot]);
        const uint32_t parity = ((j - lo) / kStages) & 1;
        uint32_t done = 0;
        while (!done) {
          asm volatile(
              "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
              : "=r"(done)
              : "r"(bar), "r"(parity)
              : "memory");
        }
      }
      __syncwarp();
      const uint4* st = reinterpret_cast<const uint4*>(ring + slot * kStepBytes);
#pragma unroll
      for (int c = 0; c < 4 * kSub; ++c) {
        const uint4 v = st[c * 32 + lane];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
  }
  if (acc == 0x12345678u) sink[blockIdx.x * kWarps + warp] = acc;  // keeps the reads
}

struct Bench {
  std::vector<uint4*> sets;
  int tiles, spt;
  uint32_t* sink;
  cudaStream_t stream;
};

template <int kMode, int kStages>
void launch(const Bench& B, int i, cudaStream_t s) {
  constexpr int kStepBytes = kMode == 3 ? 4096 : 2048;
  const int smem = kWarps * kStages * kStepBytes + kWarps * kStages * 8;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(stream_kernel<kMode, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    set = true;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(132);
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = kMode == 2 ? 0 : smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, stream_kernel<kMode, kStages>, (const uint4*)B.sets[i % B.sets.size()], B.tiles, B.spt,
                        B.sink));
}

template <int kMode, int kStages>
void measure(const Bench& B, const char* name, double bytes) {
  cudaStream_t s = B.stream;
  for (int i = 0; i < 10; ++i) launch<kMode, kStages>(B, i, s);
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> b2b, gr;
  for (int rep = 0; rep < 10; ++rep) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 20; ++i) launch<kMode, kStages>(B, i, s);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    b2b.push_back(ms * 1e3f / 20);
  }
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) launch<kMode, kStages>(B, i, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  for (int rep = 0; rep < 10; ++rep) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    gr.push_back(ms * 1e3f / 20);
  }
  CK(cudaGetLastError());
  std::sort(b2b.begin(), b2b.end());
  std::sort(gr.begin(), gr.end());
  std::printf("  %-34s b2b %7.2f us (%6.1f GB/s)  graph %7.2f us (%6.1f GB/s)\n", name, b2b[5], bytes / (b2b[5] * 1e3),
              gr[5], bytes / (gr[5] * 1e3));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
}

int main(int argc, char** argv) {
  CK(cudaFree(nullptr));
  for (int i = 1; i + 1 < argc; i += 2) {
    const int64_t n = std::atoll(argv[i]), k = std::atoll(argv[i + 1]);
    Bench B;
    B.spt = int(k / 256);
    B.tiles = int(n / 16);
    const size_t bytes = size_t(n) * k / 2;
    const int sets = int(std::max<size_t>(2, (2 * 60 * (1 << 20) + bytes - 1) / bytes + 1));
    for (int s = 0; s < sets; ++s) {
      uint4* p;
      CK(cudaMalloc(&p, bytes));
      CK(cudaMemset(p, 0x11 * (s + 1), bytes));
      B.sets.push_back(p);
    }
    CK(cudaMalloc(&B.sink, 132 * kWarps * 4));
    CK(cudaStreamCreateWithFlags(&B.stream, cudaStreamNonBlocking));
    std::printf("N = %lld, K = %lld: %.1f MB of tiled weights, %d copies\n", (long long)n, (long long)k, bytes / 1e6,
                sets);
    for (int r = 0; r < 2; ++r) {
      measure<0, 2>(B, "cp.async 16 B x 4 per lane, 2 stages", double(bytes));
      measure<0, 3>(B, "cp.async 16 B x 4 per lane, 3 stages", double(bytes));
      measure<1, 2>(B, "bulk 2 KB per step, 2 stages", double(bytes));
      measure<1, 3>(B, "bulk 2 KB per step, 3 stages", double(bytes));
      measure<1, 4>(B, "bulk 2 KB per step, 4 stages", double(bytes));
      measure<3, 2>(B, "bulk 4 KB per stage, 2 stages", double(bytes));
      measure<2, 2>(B, "registers, 2 steps in flight", double(bytes));
    }
    for (auto p : B.sets) CK(cudaFree(p));
    CK(cudaFree(B.sink));
    CK(cudaStreamDestroy(B.stream));
  }
  return 0;
}
