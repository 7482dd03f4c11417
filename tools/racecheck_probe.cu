// racecheck_probe — does compute-sanitizer's racecheck follow mbarrier ordering?
//
// A two-slot ring in one block: warp 0 fills a slot (mode 0: plain stores and an mbarrier arrive;
// mode 1: 4-byte cp.async and cp.async.mbarrier.arrive.noinc, chapter 08 v5's scale warp) and
// arrives on its full barrier; warp 1 waits on it, reads the slot, meets at __syncwarp, and lane 0
// arrives on the empty barrier that warp 0 waits on before it writes the slot again. Modes 0 and 1
// are correct: the arrive releases, the wait acquires. Mode 2 releases the slot before reading it,
// a real write-after-read race: the control.
//
// Run: compute-sanitizer --tool racecheck --error-exitcode 9 build/lkw_racecheck_probe MODE.
// tools/device_check.sh runs modes 0 and 2 before its racecheck stage: where mode 0 is flagged
// too, the tool cannot tell a correct mbarrier ring from a racy one, and the kernels whose
// thread-written shared memory is ordered only by mbarriers (v5's blockwise scale slots) are
// memchecked, not racechecked (book 08, lab notes). Exit 1: the ring summed the wrong values.
#include <cstdio>
#include <cstdlib>

#include "lkw/ptx.cuh"

using namespace lkw;

__global__ void ring(const float* src, float* out, int mode) {
  __shared__ float slot_sh[2][32];
  __shared__ uint64_t full_sh[2], empty_sh[2];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0)
    for (int s = 0; s < 2; ++s) ptx::mbarrier_init(&full_sh[s], 32), ptx::mbarrier_init(&empty_sh[s], 1);
  __syncthreads();
  float acc = 0.f;
  for (int it = 0; it < 64; ++it) {
    const int s = it % 2;
    const unsigned phase = (it / 2) & 1;
    if (warp == 0) {
      ptx::mbarrier_wait(&empty_sh[s], phase ^ 1);
      if (mode == 1) {
        ptx::cp_async_4(&slot_sh[s][lane], src + it * 32 + lane, 4);
        ptx::cp_async_mbarrier_arrive_noinc(&full_sh[s]);
      } else {
        slot_sh[s][lane] = src[it * 32 + lane];
        ptx::mbarrier_arrive(&full_sh[s]);
      }
    } else {
      ptx::mbarrier_wait(&full_sh[s], phase);
      if (mode == 2 && lane == 0) ptx::mbarrier_arrive(&empty_sh[s]);  // released before the read
      __syncwarp();
      acc += slot_sh[s][lane];
      __syncwarp();
      if (mode != 2 && lane == 0) ptx::mbarrier_arrive(&empty_sh[s]);
    }
  }
  if (warp == 1) out[lane] = acc;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  float host[64 * 32], got[32];
  for (int i = 0; i < 64 * 32; ++i) host[i] = float(i % 7);
  float *src = nullptr, *out = nullptr;
  cudaMalloc(&src, sizeof(host));
  cudaMalloc(&out, sizeof(got));
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  ring<<<1, 64>>>(src, out, mode);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int lane = 0; lane < 32; ++lane) {
    float want = 0.f;
    for (int it = 0; it < 64; ++it) want += host[it * 32 + lane];
    bad += got[lane] != want;
  }
  std::printf("mode %d: %s, %d of 32 sums wrong\n", mode, cudaGetErrorString(e), bad);
  return e == cudaSuccess && (mode == 2 || bad == 0) ? 0 : 1;
}
