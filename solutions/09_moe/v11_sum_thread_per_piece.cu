// v11_sum_thread_per_piece — moe_sum at decode: a thread per 16-byte piece of the output, its k
// loads in flight before the sum.
//
// Since v9: v9 gives a token to a warp, and at decode that is the whole problem's parallelism:
// T = 16 is 16 warps on a few SMs, each lane walking its ~28 chunks of a 7168-wide row one after
// the other, and for each chunk the k rows' loads one after the other (k is a run-time value: the
// loop is not unrolled, each load waits for the one before it to be used). The time is a chain of
// DRAM latencies, not bytes. v11 gives each 16-byte piece of the output (token t, chunk c) its own
// thread: T·d/8 threads, 14336 at T = 16, d = 7168; a thread issues the loads of up to kBatch
// rows before it adds any, so a batch costs one DRAM latency. The sum is v9's: FP32 fused
// multiply-adds in j order, one rounding, so v9 and v11 agree bit for bit. The thread's token and
// chunk come from its index by one Divisor (a multiply and a shift), not a 64-bit division.
// Expect: decode (T ≤ 16) a few µs, a launch and one or two DRAM round trips; prefill as v9, the
// same bytes in the same 16-byte pieces. SASS: LDG.E.128, STG.E.128, no local memory.
#include "experts.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 8;  // rows whose loads are in flight together (k ≤ 8 is one batch)

__global__ void __launch_bounds__(kThreads)
    sum_v11_kernel(const __nv_bfloat16* __restrict__ y, const float* __restrict__ weights,
                   __nv_bfloat16* __restrict__ out, int pieces, int chunks, Divisor per_token,
                   int k) {
  const int i = blockIdx.x * kThreads + threadIdx.x;  // T·d/8 < 2^31: the launcher checks
  if (i >= pieces) return;
  const int token = divide(i, per_token), c = i - token * chunks;
  const uint4* rows = reinterpret_cast<const uint4*>(y) + int64_t(token) * k * chunks + c;
  const float* w = weights + int64_t(token) * k;  // (T, k)

  float acc[8] = {};
  for (int j0 = 0; j0 < k; j0 += kBatch) {
    // BEGIN SOLUTION: load: the batch's pieces (row j = j0 + b at rows[j · chunks]) and weights,
    //   every load before any use; then add them in j order, as v9 does (fmaf into acc)
    uint4 piece[kBatch];
    float wj[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (j0 + b < k) {
        piece[b] = rows[int64_t(j0 + b) * chunks];
        wj[b] = w[j0 + b];
      }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (j0 + b >= k) break;
      const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&piece[b]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(v[q]);
        acc[2 * q] = fmaf(wj[b], f.x, acc[2 * q]);
        acc[2 * q + 1] = fmaf(wj[b], f.y, acc[2 * q + 1]);
      }
    }
    // STUB: (void)rows; (void)w;
    // END SOLUTION
  }

  // Store: one rounding, 16 bytes.
  uint4 packed;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int q = 0; q < 4; ++q) p[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  reinterpret_cast<uint4*>(out)[i] = packed;  // (T, d): piece i is token·chunks + c
}

Status sum_v11(const SumArgs& a, cudaStream_t stream) {
  Status s = validate_sum(a);
  if (s.ok())
    s = Check()
            .that(a.t * (a.d / 8) < (int64_t(1) << 31) && a.d / 8 <= (1 << 20),
                  "v11 indexes the T·d/8 pieces in 32 bits: T·d/8 must be below 2^31 and d/8 "
                  "at most 2^20")
            .status();
  if (!s.ok()) return s;
  const int64_t pieces = a.t * (a.d / 8);
  sum_v11_kernel<<<unsigned(ceil_div(pieces, kThreads)), kThreads, 0, stream>>>(
      a.y, a.weights, a.out, int(pieces), int(a.d / 8), divisor_of(int(a.d / 8)), a.k);
  return last_launch_status(kSumOp);
}

const Register kRegistered{sum_version("v11_sum_thread_per_piece",
                                       "a thread per 16-byte output piece, its k loads in flight",
                                       sum_v11,
                                       {{"sum_v11_kernel",
                                         {},
                                         {"LDG.E.128", "STG.E.128"},
                                         {"I2F"},
                                         true,
                                         "16-byte loads and stores, no division sequence, nothing "
                                         "spilled"}})};

}  // namespace
}  // namespace lkw::moe
