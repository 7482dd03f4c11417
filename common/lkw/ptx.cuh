// PTX wrappers, one small function per instruction, shared by every chapter. Each says why the
// kernel uses the instruction rather than what CUDA C++ offers, and guards the architecture.
//   cp.async (16 and 4 bytes, commit, wait)   global → shared copies that hold no register
//   mma.sync m16n8k16 BF16                     the tensor core with fragments we place ourselves
//   griddepcontrol                             programmatic dependent launch (sm_90)
//   discard.global.L2                          drop dead lines without writing them back
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lkw::ptx {

// Which L2 fetch a 16-byte copy asks for on a miss, and how its line is kept.
//   kPair256     L2::256B: the aligned 256-byte pair of lines, for readers that take both halves
//   kLine128     L2::128B: the copy's own line only
//   kEvictFirst  L2::128B under an evict_first policy: a line read once leaves L2 first, so it
//                does not push out lines that are read again (scales, x, earlier kernels' y)
enum class Fetch { kPair256, kLine128, kEvictFirst };

// cp.async.cg, 16 bytes: a copy in flight holds no register, so ptxas cannot sink the prefetch
// to where its data is used (it does that to plain loads to shorten register lives), and .cg
// bypasses L1 (streamed data is read once). `valid` false reads nothing and zero-fills the 16.
template <Fetch kFetch = Fetch::kPair256>
__device__ __forceinline__ void cp_async_16(void* dst_sh, const void* src_gl, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  const int bytes = valid ? 16 : 0;
  if constexpr (kFetch == Fetch::kEvictFirst) {
    // The policy is made at each copy: one held across a loop costs a register that a kernel at
    // its register limit spills.
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src_gl), "r"(bytes), "l"(policy)
                 : "memory");
  } else if constexpr (kFetch == Fetch::kLine128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_gl), "r"(bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_gl), "r"(bytes)
                 : "memory");
  }
}

// cp.async.ca, 4 bytes (the .ca form is the only one that takes 4): `bytes` of them read (0, 2 or
// 4), the rest zero-filled. For small scattered words such as a row's scales.
__device__ __forceinline__ void cp_async_4(void* dst_sh, const void* src_gl, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src_gl), "r"(bytes) : "memory");
}

// Closes the group of copies issued since the last commit. wait<n> returns once at most n groups
// are in flight: a lane waits for its own copies only, so a lane that reads back what another
// copied needs a __syncwarp (or __syncthreads) after the wait.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// mma.sync m16n8k16, BF16 × BF16 + FP32: c += A·B. Fragments (g = lane / 4, t = lane % 4):
// a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
// b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
// As PTX because CUDA C++ offers it only through WMMA, whose fragment layout is opaque, and a
// GEMV with unpacked weights chooses which weight sits in which k-slot.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.sync.m16n8k16 with BF16 needs sm_80 or newer"
#endif
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (sm_90): a kernel launched with the stream attribute may start
// before the one ahead of it has finished. wait returns once that kernel has completed and its
// writes are visible; launch_dependents lets the next kernel's blocks be scheduled as SMs free
// up, once every block of this one has issued it. Elsewhere (and without the attribute) no-ops.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Drops one 128-byte line from L2 without writing it back: for scratch data that is dead once
// read (split-K partial sums), which L2 would otherwise write to DRAM for nothing.
__device__ __forceinline__ void discard_l2_line(const void* line_gl) {
  asm volatile("discard.global.L2 [%0], 128;" ::"l"(line_gl) : "memory");
}

}  // namespace lkw::ptx
