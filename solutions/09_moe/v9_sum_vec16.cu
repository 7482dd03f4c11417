// v9_sum_vec16 — moe_sum: each token's k expert rows, weighted and summed, 16 bytes at a time.
//
// Since v8: the last step of the MoE block. The down GEMM leaves one row per slot (y [T, k, d],
// row t·k + j for the token's j-th expert), and the token's output is Σ_j w[t, j] · y[t, j]. A
// warp owns a token: lane l takes the 8-column chunks l, l + 32, ... of the row, and for each
// chunk reads the k rows' 16-byte pieces (one uint4 each, 8 BF16), multiplies by the token's
// weights and adds in FP32 in j order, then rounds once and stores 16 bytes. Every byte of y is
// read once and out written once, in whole 16-byte pieces that a warp's lanes make into 512-byte
// runs; the k weights of a token are one 4-byte load each, the same address for the whole warp
// (a broadcast). Nothing is reused, so nothing goes through shared memory.
// d must be a multiple of 8 (whole 16-byte pieces); any T, any k.
// Expect: a copy-like kernel, (2k + 2)·d bytes a token; SASS: LDG.E.128, STG.E.128, no local
// memory.
#include "experts.cuh"

namespace lkw::moe {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads)
    sum_v9_kernel(const __nv_bfloat16* __restrict__ y, const float* __restrict__ weights,
                  __nv_bfloat16* __restrict__ out, int64_t t, int64_t d, int k) {
  const int64_t token = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (token >= t) return;  // a whole warp: no shuffle follows
  const int lane_idx = threadIdx.x % 32;
  const int64_t chunks = d / 8;
  const uint4* y_rows = reinterpret_cast<const uint4*>(y + token * k * d);  // (T, k, d) → (k, d)
  uint4* out_row = reinterpret_cast<uint4*>(out + token * d);               // (T, d)
  for (int64_t c = lane_idx; c < chunks; c += 32) {
    float acc[8] = {};
    // BEGIN SOLUTION: for j = 0 .. k − 1 in order: the 16-byte piece c of row j (y_rows[j·chunks
    //   + c]), its 8 BF16 times weights[token·k + j] added into acc (fmaf)
    for (int j = 0; j < k; ++j) {
      const float wj = weights[token * k + j];  // (T, k): the warp's one address
      const uint4 piece = y_rows[j * chunks + c];
      const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&piece);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(v[i]);
        acc[2 * i] = fmaf(wj, f.x, acc[2 * i]);
        acc[2 * i + 1] = fmaf(wj, f.y, acc[2 * i + 1]);
      }
    }
    // END SOLUTION
    uint4 packed;
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    out_row[c] = packed;
  }
}

Status sum_v9_vec16(const SumArgs& a, cudaStream_t stream) {
  Status s = validate_sum(a);
  if (!s.ok()) return s;
  const unsigned blocks = unsigned(ceil_div(a.t, kWarps));
  sum_v9_kernel<<<blocks, kThreads, 0, stream>>>(a.y, a.weights, a.out, a.t, a.d, a.k);
  return last_launch_status(kSumOp);
}

const Register kRegistered{sum_version("v9_sum_vec16",
                                       "a warp per token, 16-byte pieces, FP32 sum in j order",
                                       sum_v9_vec16,
                                       {{"sum_v9_kernel",
                                         {},
                                         {"LDG.E.128", "STG.E.128"},
                                         {},
                                         true,
                                         "16-byte loads and stores, nothing spilled"}})};

}  // namespace
}  // namespace lkw::moe
