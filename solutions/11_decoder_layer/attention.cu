// The decoder layer's attention — NOT a lesson: the workbook does not teach attention. A plain,
// correct paged causal GQA attention so that the runner (and its CUDA graph) needs no Python;
// the bench compares the layer with torch's SDPA / production attention where it matters.
//
// Query token t (position p) of head h reads KV head h / (Hq / Hkv), keys 0..p through the block
// table (vLLM's paged layout), softmax in FP32 (running max and sum, exp of differences), P.V in
// FP32, o rounded once to BF16. A block owns (split, head, token): its keys are a contiguous
// share of the cache's capacity, 128 at a time (a thread per key for the scores, a thread per
// dimension for P.V). With splits > 1 each block writes (max, sum, unnormalized o) in FP32 and a
// second kernel combines them. The context length is read from positions on the device, so the
// grid depends only on the capacity: a captured decode step stays valid as the cache grows.
// Also here: split_qkv, the copy that makes q, k, v dense for chapter 05's RoPE when T > 1.
#include <cuda_bf16.h>

#include <cmath>

#include "layer.h"

namespace lkw::layer {
namespace {

constexpr int kThreads = 128;  // keys per tile, and dimensions per pass of P.V
constexpr int kWarps = kThreads / 32;
constexpr int kDimsPerThread = kMaxHeadDim / kThreads;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Every thread gets the block's max (or sum); one barrier. `red_sh` is this reduction's own array,
// so the next reduction of the other kind cannot overwrite it while it is read.
__device__ __forceinline__ float block_max(float v, float* red_sh) {
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) red_sh[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red_sh[0];
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, red_sh[w]);
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* red_sh) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) red_sh[threadIdx.x / 32] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kWarps; ++w) r += red_sh[w];
  return r;
}

__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a, float scale) {
  __shared__ float q_sh[kMaxHeadDim];
  __shared__ float p_sh[kThreads];
  __shared__ float max_sh[kWarps], sum_sh[kWarps];
  const int split = blockIdx.x, h = blockIdx.y;
  const int64_t t = blockIdx.z;
  const int64_t kvh = h / (a.hq / a.hkv);
  const int64_t d = a.d;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q) + (t * a.hq + h) * d;  // (T,Hq,D)
  for (int i = threadIdx.x; i < d; i += kThreads) q_sh[i] = __bfloat162float(q[i]) * scale;
  __syncthreads();

  // This block's keys: its share of the capacity, cut at the token's own position (causal).
  const int64_t capacity = a.table_blocks * a.block_size, pos = a.positions[t];
  const int64_t len = pos < 0 ? 0 : (pos + 1 < capacity ? pos + 1 : capacity);
  const int64_t per_split = (capacity + a.splits - 1) / a.splits;
  const int64_t begin = split * per_split;
  const int64_t end = begin + per_split < len ? begin + per_split : len;
  const auto* kc = static_cast<const uint4*>(a.key_cache);  // 8 BF16 of a key per uint4
  const auto* vc = static_cast<const __nv_bfloat16*>(a.value_cache);

  float m = -INFINITY, l = 0.0f, acc[kDimsPerThread] = {};
  for (int64_t base = begin; base < end; base += kThreads) {
    // Scores: thread i takes key base + i.
    const int64_t j = base + threadIdx.x;
    float s = -INFINITY;
    if (j < end) {
      const int64_t blk = a.block_table[j / a.block_size], off = j % a.block_size;
      if (blk >= 0 && blk < a.num_blocks) {
        s = 0.0f;
        for (int64_t c = 0; c < d / 8; ++c) {
          // (B,Hkv,D/8,bs) units of 8 BF16
          const uint4 v = kc[((blk * a.hkv + kvh) * (d / 8) + c) * a.block_size + off];
          const auto* e = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(e[i]);
            s = fmaf(q_sh[8 * c + 2 * i], f.x, s);
            s = fmaf(q_sh[8 * c + 2 * i + 1], f.y, s);
          }
        }
      }
    }
    // Softmax of the tile against the running max: rescale what came before.
    const float m_new = fmaxf(m, block_max(s, max_sh));
    if (m_new == -INFINITY) continue;  // the same in every thread: no valid key yet
    const float alpha = expf(m - m_new);  // 0 while m is -inf
    const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
    p_sh[threadIdx.x] = p;  // the previous tile's readers passed block_max's barrier
    l = l * alpha + block_sum(p, sum_sh);  // its barrier publishes p_sh
    m = m_new;
    // P.V: thread i owns dimensions i, i + 128.
    const int64_t tile = end - base < kThreads ? end - base : kThreads;
#pragma unroll
    for (int r = 0; r < kDimsPerThread; ++r) acc[r] *= alpha;
    for (int64_t jj = 0; jj < tile; ++jj) {
      const float pj = p_sh[jj];
      if (pj == 0.0f) continue;
      const int64_t key = base + jj;
      const int64_t blk = a.block_table[key / a.block_size], off = key % a.block_size;
#pragma unroll
      for (int r = 0; r < kDimsPerThread; ++r) {
        const int64_t dim = threadIdx.x + r * kThreads;
        if (dim < d) {
          const int64_t at = ((blk * a.hkv + kvh) * d + dim) * a.block_size + off;  // (B,Hkv,D,bs)
          acc[r] = fmaf(pj, __bfloat162float(vc[at]), acc[r]);
        }
      }
    }
  }

  if (a.splits == 1) {
    auto* o = static_cast<__nv_bfloat16*>(a.o) + (t * a.hq + h) * d;  // (T,Hq D)
#pragma unroll
    for (int r = 0; r < kDimsPerThread; ++r) {
      const int64_t dim = threadIdx.x + r * kThreads;
      if (dim < d) o[dim] = __float2bfloat16_rn(l > 0.0f ? acc[r] / l : 0.0f);
    }
    return;
  }
  float* part = a.partials + ((t * a.hq + h) * a.splits + split) * (d + 2);  // (T,Hq,S,D+2)
  if (threadIdx.x == 0) {
    part[0] = m;
    part[1] = l;
  }
#pragma unroll
  for (int r = 0; r < kDimsPerThread; ++r) {
    const int64_t dim = threadIdx.x + r * kThreads;
    if (dim < d) part[2 + dim] = acc[r];
  }
}

// o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, M the largest m_s; a split without keys
// (m_s = -inf) weighs nothing.
__global__ void __launch_bounds__(kThreads) combine_kernel(AttentionArgs a) {
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y, d = a.d;
  const float* part = a.partials + (t * a.hq + h) * a.splits * (d + 2);
  float big = -INFINITY;
  for (int s = 0; s < a.splits; ++s) big = fmaxf(big, part[s * (d + 2)]);
  float l = 0.0f;
  for (int s = 0; s < a.splits; ++s)
    if (part[s * (d + 2)] != -INFINITY) l += expf(part[s * (d + 2)] - big) * part[s * (d + 2) + 1];
  auto* o = static_cast<__nv_bfloat16*>(a.o) + (t * a.hq + h) * d;  // (T,Hq D)
  for (int64_t dim = threadIdx.x; dim < d; dim += kThreads) {
    float acc = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const float ms = part[s * (d + 2)];
      if (ms != -INFINITY) acc = fmaf(expf(ms - big), part[s * (d + 2) + 2 + dim], acc);
    }
    o[dim] = __float2bfloat16_rn(l > 0.0f ? acc / l : 0.0f);
  }
}

__global__ void split_qkv_kernel(const uint4* qkv, uint4* q, uint4* k, uint4* v, int64_t t,
                                 int64_t q_vecs, int64_t kv_vecs) {
  const int64_t row_vecs = q_vecs + 2 * kv_vecs, n = t * row_vecs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, c = i % row_vecs;
    const uint4 x = qkv[i];  // (T,(Hq+2Hkv)D/8)
    if (c < q_vecs) {
      q[row * q_vecs + c] = x;
    } else if (c < q_vecs + kv_vecs) {
      k[row * kv_vecs + c - q_vecs] = x;
    } else {
      v[row * kv_vecs + c - q_vecs - kv_vecs] = x;
    }
  }
}

}  // namespace

// Enough blocks to fill the GPU at decode (about 512), none below 256 keys each, at most 32.
int attention_splits(int64_t t, int64_t hq, int64_t capacity) {
  const int64_t rows = t * hq;
  if (rows >= 256) return 1;
  const int64_t by_keys = (capacity + 255) / 256, by_blocks = (512 + rows - 1) / rows;
  int64_t s = by_keys < by_blocks ? by_keys : by_blocks;
  return int(s < 1 ? 1 : s > 32 ? 32 : s);
}

Status paged_attention(const AttentionArgs& a, cudaStream_t stream) {
  Status s = Check()
                 .not_null(a.q, "q")
                 .not_null(a.key_cache, "key_cache")
                 .not_null(a.value_cache, "value_cache")
                 .not_null(a.block_table, "block_table")
                 .not_null(a.positions, "positions")
                 .not_null(a.o, "o")
                 .that(a.splits == 1 || a.partials, "partials are needed for splits > 1")
                 .positive(a.t, "T")
                 .positive(a.hkv, "Hkv")
                 .that(a.hq > 0 && a.hq % a.hkv == 0, "Hq must be a multiple of Hkv")
                 .that(a.d > 0 && a.d % 8 == 0 && a.d <= kMaxHeadDim,
                       "D must be a multiple of 8 up to " + std::to_string(kMaxHeadDim))
                 .that(a.splits >= 1 && a.splits <= 65535, "splits must be in 1..65535")
                 .that(a.t <= 65535 && a.hq <= 65535, "T and Hq must be at most 65535 (grid)")
                 .aligned(a.key_cache, 16, "key_cache")
                 .arch_at_least(80)
                 .status();
  if (!s.ok()) return s;
  const dim3 grid(unsigned(a.splits), unsigned(a.hq), unsigned(a.t));
  attention_kernel<<<grid, kThreads, 0, stream>>>(a, 1.0f / std::sqrt(float(a.d)));
  if (a.splits > 1) combine_kernel<<<dim3(unsigned(a.hq), unsigned(a.t)), kThreads, 0, stream>>>(a);
  return last_launch_status("decoder layer attention");
}

Status split_qkv(const void* qkv, void* q, void* k, void* v, int64_t t, int64_t q_cols,
                 int64_t kv_cols, cudaStream_t stream) {
  Status s = Check()
                 .that(qkv && q && k && v, "split_qkv: a null pointer")
                 .that(q_cols % 8 == 0 && kv_cols % 8 == 0, "split_qkv: columns in 16-byte units")
                 .that(reinterpret_cast<uintptr_t>(qkv) % 16 == 0, "split_qkv: qkv 16-byte aligned")
                 .status();
  if (!s.ok()) return s;
  const int64_t vecs = t * (q_cols + 2 * kv_cols) / 8;
  const unsigned blocks = unsigned(vecs / 256 + 1 < 4096 ? vecs / 256 + 1 : 4096);
  split_qkv_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(qkv),
                                               static_cast<uint4*>(q), static_cast<uint4*>(k),
                                               static_cast<uint4*>(v), t, q_cols / 8, kv_cols / 8);
  return last_launch_status("split_qkv");
}

}  // namespace lkw::layer
