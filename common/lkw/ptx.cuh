// PTX wrappers, one small function per instruction, shared by every chapter. Each says why the
// kernel uses the instruction rather than what CUDA C++ offers, and guards the architecture.
//   cp.async (16 and 4 bytes, commit, wait)   global → shared copies that hold no register
//   mma.sync m16n8k16 BF16                     the tensor core with fragments we place ourselves
//   mma.sync m16n8k32 E4M3 (sm_89)             the FP8 form of the same
//   ldmatrix x4                                four 8×8 BF16 tiles from shared memory into mma fragments
//   wgmma (m64nNk16 BF16, A in registers)       Hopper's warpgroup tensor core, B read from shared memory
//   wgmma (m64nNk32 E4M3, both from shared)     the FP8 form: both operands through descriptors
//   setmaxnreg                                  a warpgroup hands registers to another (sm_90a)
//   mbarrier (init, arrive.expect_tx, wait)    a shared-memory barrier that counts bytes in flight
//   cp.async.bulk.tensor (TMA, 2D)             a whole tile copied by the copy engine, swizzled
//   cp.async.bulk (1D)                          a contiguous run of bytes copied by the copy engine
//   cp.async.bulk.tensor store (TMA, 2D)       a tile from shared memory to global, clipped at the edges
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

// The mbarrier counts this thread's cp.async copies issued so far: one arrival, made once they
// have all landed (.noinc: the arrival is one of those the barrier was initialized to expect).
// Copies by plain threads can so complete a stage that TMA fills too (chapter 08's block scales).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar_sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
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

// mma.sync m16n8k16, FP16 × FP16 + FP32: fragments as mma_bf16_16816's. For E4M3 data that the
// caller converted to FP16 once (exact: every E4M3 value is an FP16 one) and reuses across
// several mmas, where mma_e4m3_16832 on sm_90a converts its operands again at every instruction.
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.sync.m16n8k16 with FP16 and FP32 accumulation is used from sm_80 on here"
#endif
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma.sync m16n8k32, E4M3 × E4M3 + FP32: c += A·B, four FP8 values per 32-bit register. In bytes
// the fragments are m16n8k16 BF16's (k counts bytes there): a0 = A[g][4t..4t+3], a1 = A[g+8][..],
// a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; c as BF16's.
// So ldmatrix fills them unchanged. sm_89 runs it natively (QMMA); sm_90a has no FP8 mma.sync in
// hardware: ptxas converts the operands to FP16 and issues HMMA.16816 (chapter 08's v0 shows it).
__device__ __forceinline__ void mma_e4m3_16832(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // sm_89 and later: the launchers check the device first
#endif
}

// ldmatrix.x4: lane l names the 16-byte row (l % 8) of 8×8 matrix l / 8; each lane gets one
// 32-bit pair of each matrix, r[i] from matrix i, in the mma's fragment order (lane l holds row
// l / 4, columns 2·(l % 4) and 2·(l % 4) + 1). One instruction replaces four 4-byte shared loads
// per lane, and the rows a warp names may lie anywhere (no transposition in registers).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_sh) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row_sh));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
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

// ---------------------------------------------------------------------------------------------
// Hopper warpgroup MMA (sm_90a). A warpgroup (4 warps, 128 threads) multiplies a 64 × 16 A tile by
// a 16 × N B tile into 64 × N FP32 accumulators spread over its threads; the instruction is
// asynchronous: issue, commit a group, wait. These wrappers are the register-A form: A comes from
// the threads' registers in mma.sync's m16n8k16 layout (warp w of the group holds rows 16w..16w+15:
// a0 = A[g][2t, 2t+1], a1 = A[g+8][..], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][..]), so a kernel may
// compute A (dequantize it) right before the instruction; B is read by the tensor core itself from
// shared memory through a descriptor. Accumulator j of a thread: row 16w + g + 8·((j / 2) % 2),
// column 8·(j / 4) + 2t + j % 2. As PTX: CUDA C++ has no wgmma.

// The shared-memory descriptor of a K-major B tile (each of its N rows holds 64 BF16 of k = 128
// bytes) stored with the 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8), and
// 8-row atoms (1024 bytes, 1024-aligned) follow one another. Start address and strides in 16-byte
// units; k-step s of the tile starts 32·s bytes further (the swizzle is applied by the hardware on
// the full address, which is why the atoms must be 1024-aligned).
__device__ __forceinline__ uint64_t wgmma_desc_k_major_sw128(const void* tile_sh) {
  const uint64_t addr = static_cast<unsigned>(__cvta_generic_to_shared(tile_sh));
  return ((addr & 0x3FFFF) >> 4)   // start address
         | (uint64_t(1) << 16)     // leading byte offset: unused by swizzled K-major layouts
         | (uint64_t(1024 >> 4) << 32)  // stride byte offset: from one 8-row atom to the next
         | (uint64_t(1) << 62);    // layout: 128-byte swizzle
}

// Orders this thread's earlier register writes (the A operands, the accumulators) before the
// wgmma that follows; required before the first wgmma and whenever those registers were touched.
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Ties the accumulators to their registers at this point of the program, so that the compiler
// neither moves nor reads them between a wgmma and the wait that ends it (ptxas would then
// serialize the wgmmas). An empty asm statement that "writes" each one.
// The same for register A operands: "used" after the wait that retires their wgmma, they stay in
// their registers until then, and nothing overwrites them under the tensor core's feet.
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// Returns once at most kPending committed groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// d (64 × N, FP32) += A (64 × 16, registers) · B (16 × N, K-major in shared memory), N = 16, 32, 64,
// 128 or 256 (d = A · B when `accumulate` is false: a new sum without zeroing the registers first).
template <int N>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                              bool accumulate = true);
template <>
__device__ __forceinline__ void wgmma_bf16_rs<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b,
                                                  bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b,
                                                  bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                  bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                  bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

// N = 256: 128 accumulators a thread, what a warp-specialized kernel's consumer can hold
// (setmaxnreg) and where each A fragment feeds the most tokens.
template <>
__device__ __forceinline__ void wgmma_bf16_rs<256>(float (&d)[128], const uint32_t (&a)[4],
                                                   uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

// The shared-memory form: A (64 × 16) read by the tensor core too, through its own descriptor (a
// K-major tile in the same 128-byte swizzle as B: 64 rows of 64 BF16). Nothing of A in registers:
// the form for BF16 weights, which need no unpacking. N = 16, 32 or 64.
template <int N>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b);
template <>
__device__ __forceinline__ void wgmma_bf16_ss<16>(float (&d)[8], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_bf16_ss<32>(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_bf16_ss<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

// FP8 wgmma, both operands from shared memory: d (64 × N, FP32) = A (64 × 32 E4M3) · B (32 × N)
// (+ d when `accumulate`; false starts a new sum without zeroing registers first, which chapter
// 08's v4 does at every 128-k block). FP8 operands must be K-major (the transpose bits exist only
// for 16-bit types); both descriptors are wgmma_desc_k_major_sw128's: a 128-byte swizzled row is
// 128 FP8 values, and k-step s of a stage starts 32·s bytes further, as BF16's k16 does. The
// accumulator layout is the BF16 form's. N = 16 or 32 (a few gathered rows: chapter 09's v15),
// 64, 128, 192 or 256.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                              bool accumulate);
template <>
__device__ __forceinline__ void wgmma_e4m3_ss<16>(float (&d)[8], uint64_t desc_a, uint64_t desc_b,
                                                  bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_e4m3_ss<32>(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                  bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}
template <>
__device__ __forceinline__ void wgmma_e4m3_ss<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<192>(float (&d)[96], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<256>(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();  // sm_90a only: the launchers check the device first
#endif
}

// setmaxnreg: a warp-specialized kernel's producer warpgroup needs few registers (it issues TMA
// copies) and its consumers many (wgmma accumulators); the block is compiled for the average and
// each warpgroup then releases (dec) or claims (inc) registers. Counts are multiples of 8 in
// 24..256; every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, multiple of 8");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, multiple of 8");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// The register budget those moves live in: setmaxnreg moves registers within the pool the block
// was launched with, not the register file. A block of more than 256 threads, one an SM
// (__launch_bounds__(threads, 1)), gets 65536 / threads a thread in units of 8 (what ptxas
// compiles such a kernel to when it needs them all). setmaxnreg.inc waits until the decs have
// returned enough: where the counts after the moves exceed the pool it waits for ever.
constexpr int launch_regs(int threads) { return 65536 / threads / 8 * 8; }
constexpr bool setmaxnreg_fits(int producer_threads, int producer_regs, int consumer_threads,
                               int consumer_regs) {
  return producer_threads * producer_regs + consumer_threads * consumer_regs <=
         (producer_threads + consumer_threads) * launch_regs(producer_threads + consumer_threads);
}

// A barrier among some warps of the block (bar.sync id, threads): a warp-specialized kernel's
// consumer warpgroups meet without the producer, which __syncthreads would wait for. id 0 is
// __syncthreads' own; threads a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async once waited for)
// visible to the async proxy that wgmma and TMA read through: after a cp.async stage lands and
// before the wgmma that reads it (with a barrier between, for the other threads' copies).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- mbarrier and TMA (sm_90) ------------------------------------------------------------------
// The tensor-memory accelerator copies a whole tile (a box of a CUtensorMap) into shared memory on
// the async proxy, the proxy that wgmma reads through: its data needs no proxy fence (cp.async's
// does, and fence.proxy.async compiles to a CTA-wide memory barrier, MEMBAR, in every stage).
// Completion is counted in bytes on an mbarrier in shared memory.

// One arrival per phase (the thread that issues the copy); made visible to the async proxy before
// any copy signals it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar_sh, unsigned arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives and announces the bytes the phase still waits for (the copies' transaction count).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar_sh, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// One arrival (a consumer saying it is done with the data the barrier guards).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar_sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Returns once the phase of this parity has completed (every arrival in, every byte landed). On a
// fresh barrier parity 1 counts as completed: a producer's first wait on an empty ring passes.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar_sh, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// copy engine, counted on the mbarrier like a TMA box: one thread moves a whole row slice, and no
// register of any thread holds it on the way (chapter 10's fused sampler loads its row so).
__device__ __forceinline__ void bulk_load(void* dst_sh, const void* src_gl, unsigned bytes,
                                          uint64_t* bar_sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src_gl), "r"(bytes), "r"(bar)
               : "memory");
#endif
}
// The box at (c0, c1) (innermost coordinate first, in elements) of `map` into dst_sh; rows and
// columns outside the tensor arrive as zeros and still count in the transaction bytes. `map` is a
// __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_2d(void* dst_sh, const void* map, int c0, int c1,
                                            uint64_t* bar_sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}

// The box at (c0, c1) of `map` written from src_sh (laid out as the map's swizzle says) by the
// copy engine: the threads that filled src_sh go on while it drains, and rows and columns past
// the tensor's edge are not written (the tails need no mask). The writes were made by threads on
// the generic proxy: each writer runs fence_proxy_async_shared, then a barrier, before the issue.
__device__ __forceinline__ void tma_store_2d(const void* map, const void* src_sh, int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned src = static_cast<unsigned>(__cvta_generic_to_shared(src_sh));
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
#endif
}
// Closes the bulk group of the stores issued so far by this thread.
__device__ __forceinline__ void bulk_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Returns once at most kPending of this thread's bulk groups still read their shared memory: the
// source of an older store may then be written again (and the block may exit, which frees it).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ---- clusters (sm_90) ---------------------------------------------------------------------------
// A cluster's CTAs run at once on one GPC and reach each other's shared memory. Chapter 08's v5
// pairs two CTAs: one TMA load lands in both (multicast), and each consumer releases a stage in
// both CTAs' rings, since both CTAs' producers write into it.

// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
// Every thread of every CTA of the cluster meets here; shared-memory writes before it (mbarrier
// inits among them) are seen across the cluster after it.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// One arrival on the mbarrier at bar_sh's offset in CTA `cta` of the cluster (this one included).
// CTA-scope release, the default: `.release.cluster` puts a cluster-wide fence (MEMBAR) in every
// release of a stage, and the reads it orders are wgmma's, already waited for (lab notes 08).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar_sh, unsigned cta) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
#endif
}
// The float at p_sh's offset in CTA `cta` of the cluster (distributed shared memory: mapa gives
// the address there, ld.shared::cluster reads it), written there before a cluster_sync both passed.
__device__ __forceinline__ float ld_shared_cluster_f32(const float* p_sh, unsigned cta) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned p = static_cast<unsigned>(__cvta_generic_to_shared(p_sh));
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %1, %2;\n"
      "ld.shared::cluster.f32 %0, [remote];\n}\n"
      : "=f"(v)
      : "r"(p), "r"(cta)
      : "memory");
#endif
  return v;
}
// tma_load_2d into every CTA of `ctas` (a bit mask of ranks): the box lands at dst_sh's offset in
// each, and each one's mbarrier at bar_sh's offset counts its bytes. One L2 read feeds them all.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst_sh, const void* map, int c0, int c1,
                                                      uint64_t* bar_sh, uint16_t ctas) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_sh));
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bar_sh));
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(ctas)
      : "memory");
#endif
}

}  // namespace lkw::ptx
