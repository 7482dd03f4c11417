// Chapter 06 probe (results/h200/probes/06_prologue.txt, part 5): the cost of v9's Σx pass and zeroing alone,
// in clock64 cycles per warp. nvcc -O3 -gencode=arch=compute_90a,code=sm_90a 06_prologue_pass.cu && ./a.out
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ int x_chunk(int r, int c, int row_chunks) { return r * (row_chunks + 1) + (c ^ (((c >> 3) & 1) << 1)); }
__global__ void k(const uint4* xg, long long* out, int k_split, int reps, int mode) {
  extern __shared__ uint4 smem[];
  uint4* x_sh = smem + 80 * 1024 / 16;
  const int row_chunks = k_split / 8, groups = k_split / 128;
  float* xsum = reinterpret_cast<float*>(x_sh + row_chunks + 1);
  for (int c = threadIdx.x; c < row_chunks; c += blockDim.x) x_sh[x_chunk(0, c, row_chunks)] = xg[c];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  long long t0 = clock64(), t1 = 0, t2 = 0;
  for (int rep = 0; rep < reps; ++rep) {
    t0 = clock64();
    if (mode & 1) for (int idx = threadIdx.x; idx < groups * 8; idx += blockDim.x) if (idx % 8 >= 1) xsum[idx] = 0.0f;
    t1 = clock64();
    if (mode & 2) {
      const int sixteens = (groups + 15) / 16;
      const uint32_t ones = 0x3f803f80u;
      for (int q = warp; q < sixteens; q += blockDim.x / 32) {
        const int lo = 16 * q + g, hi = lo + 8;
        float d[2][4] = {};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint4 zero = make_uint4(0, 0, 0, 0);
          const uint4 a = lo < groups ? x_sh[x_chunk(0, 16 * lo + 4 * c + t, row_chunks)] : zero;
          const uint4 b = hi < groups ? x_sh[x_chunk(0, 16 * hi + 4 * c + t, row_chunks)] : zero;
          const uint32_t a0[4] = {a.x, b.x, a.y, b.y}, a1[4] = {a.z, b.z, a.w, b.w};
          mma(d[c % 2], a0, ones, ones);
          mma(d[c % 2], a1, ones, ones);
        }
        if (t == 0) {
          if (lo < groups) xsum[lo * 8] = d[0][0] + d[1][0];
          if (hi < groups) xsum[hi * 8] = d[0][2] + d[1][2];
        }
      }
    }
    t2 = clock64();
  }
  __syncthreads();
  long long t3 = clock64();
  if (lane == 0) {
    long long* o = out + (blockIdx.x * 16 + warp) * 4;
    o[0] = t1 - t0; o[1] = t2 - t1; o[2] = t3 - t2; o[3] = (long long)__float_as_int(xsum[0]);
  }
}
int main() {
  const int ks[2] = {28672, 8192};
  uint4* xg; long long* out;
  cudaMalloc(&xg, 28672 * 2); cudaMemset(xg, 0x3f, 28672 * 2);
  cudaMalloc(&out, 132 * 16 * 4 * 8);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  for (int kk : ks) for (int mode = 1; mode <= 3; ++mode) for (int reps = 1; reps <= 2; ++reps) {
    for (int it = 0; it < 3; ++it) k<<<132, 512, 200 * 1024>>>(xg, out, kk, reps, mode);
    cudaDeviceSynchronize();
    std::vector<long long> h(132 * 16 * 4);
    cudaMemcpy(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost);
    for (int f = 0; f < 3; ++f) {
      std::vector<long long> v; for (int i = 0; i < 132 * 16; ++i) v.push_back(h[i * 4 + f]);
      std::sort(v.begin(), v.end());
      printf("K=%d mode=%d reps=%d field%d: median %lld max %lld cycles\n", kk, mode, reps, f, v[v.size() / 2], v.back());
    }
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
