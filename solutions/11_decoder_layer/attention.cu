// The decoder layer's attention — NOT a lesson: the workbook does not teach attention. A plain,
// correct paged causal GQA attention so that the runner (and its CUDA graph) needs no Python, and
// so that the workbook's layers in Python read the paged cache in place (paged_attention below).
//
// Query token t (position p) of head h reads KV head h / (Hq / Hkv), keys 0..p through its
// sequence's row of the block table (vLLM's paged layout), softmax in FP32 (running max and sum,
// exp of differences), P.V in FP32, o rounded once to BF16. A block owns (split, KV head, token)
// and the query heads that share the KV head (up to kMaxGroup of them: the cache is read once for
// the group, not once a head). Its keys are a contiguous share of the cache's capacity, 128 at a
// time: a thread per key for the scores, then a thread per dimension for P.V, reading 8 keys'
// values of its dimension (16 bytes, contiguous in the [blocks, Hkv, D, bs] layout) at a time.
// With splits > 1 each block writes (max, sum, unnormalized o) per head in FP32 and a second
// kernel combines them. The context length is read from positions on the device, so the grid
// depends only on the capacity: a captured decode step stays valid as the cache grows. A block
// owns one query token, so a prompt of T tokens reads its keys about T / 2 times: the Python
// layers give a prompt to torch's flash attention (lkw.layer_torch.prompt_attention).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "layer.h"

namespace lkw::layer {
namespace {

constexpr int kThreads = 128;  // keys per tile, and dimensions per pass of P.V
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;  // query heads a block (a larger group takes several blocks)
// 16-byte loads a thread keeps in flight: a block streams a few thousand keys at most, so what it
// waits for is each dependent round trip to memory, not bandwidth. Half a key (D = 128) a round,
// and 64 keys' values of a dimension issued with the key's first pieces (their cache blocks read
// with the key's), so that the scores and the softmax's barriers wait with them. Sixteen (a whole
// key, a whole tile) doubles the registers: two blocks an SM, and the decode steps of many
// sequences lose more than one sequence gains.
constexpr int kKeyLoads = 8;
constexpr int kValueLoads = 8;
// The split rule (attention_splits): about kSplitBlocks blocks in all (four a Hopper SM: a block
// streams its keys with few loads in flight, so a decode step needs many blocks to cover the
// memory latency), each at least kMinSplitKeys keys, at most kMaxSplits splits; a split's keys a
// multiple of kSplitKeys (so an 8-key chunk of P.V never straddles two splits).
constexpr int64_t kSplitBlocks = 512, kMinSplitKeys = 64, kMaxSplits = 32, kSplitKeys = 32;
static_assert(kMaxSplits <= kThreads, "the combine kernel: a thread a split");

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Every thread gets the block's max (or sum) of each of the group's heads; one barrier. `red_sh`
// is this reduction's own array, so the next reduction of the other kind cannot overwrite it while
// it is read.
template <bool kMax, int kG>
__device__ __forceinline__ void block_reduce(float (&v)[kG], float (*red_sh)[kWarps]) {
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float w = kMax ? warp_max(v[g]) : warp_sum(v[g]);
    if (threadIdx.x % 32 == 0) red_sh[g][threadIdx.x / 32] = w;
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float r = red_sh[g][0];
    for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, red_sh[g][w]) : r + red_sh[g][w];
    v[g] = r;
  }
}

// 8 BF16 (one 16-byte load) to floats, in memory order.
__device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8]) {
  const auto* e = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(e[i]);
    x[2 * i] = f.x, x[2 * i + 1] = f.y;
  }
}

// 8 floats of shared memory (two 16-byte reads; the address a multiple of 8 floats).
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

// The split count's share of the keys, rounded up to kSplitKeys.
__host__ __device__ inline int64_t keys_per_split(int64_t capacity, int splits) {
  return ((capacity + splits - 1) / splits + kSplitKeys - 1) / kSplitKeys * kSplitKeys;
}

// kG: query heads a block holds (4 where the group is at most 4, as Llama-3's is; else 8), kDims:
// dimensions a thread owns in P.V (D up to 128: one). Arrays sized to the shape, not to the
// largest one, keep the registers few and the blocks an SM holds many.
// Blocks an SM: 3 (kG 4) or 2 (kG 8), what the registers of the values and key pieces in flight
// together allow without spilling.
template <int kG, int kDims>
__global__ void __launch_bounds__(kThreads, kG == 4 ? 3 : 2)
    attention_kernel(AttentionArgs a, float scale) {
  __shared__ __align__(16) float q_sh[kG][kDims * kThreads];  // read 8 floats at a time
  __shared__ __align__(16) float p_sh[kG][kThreads];
  __shared__ float max_sh[kG][kWarps], sum_sh[kG][kWarps];
  const int64_t group = a.hq / a.hkv, chunks = (group + kG - 1) / kG;
  const int split = blockIdx.x;
  const int64_t kvh = blockIdx.y / chunks, first = blockIdx.y % chunks * kG, h0 = kvh * group + first;
  const int heads = int(group - first < kG ? group - first : kG);
  const int64_t t = blockIdx.z;
  // Keys, D and the block size in 32 bits (the host refuses a capacity past 2^31 keys): a key's
  // block and offset are an inline 32-bit division, not a 64-bit one's call, and the loop's
  // counters take one register each.
  const int d = int(a.d);
  const uint32_t bs = uint32_t(a.block_size);
  // The position first: its load and the q row's are in flight together.
  const int64_t* table = a.block_table + t / a.q_len * a.table_blocks;  // this token's sequence
  const int64_t capacity = a.table_blocks * a.block_size, pos = a.positions[t];
  const auto* q = static_cast<const __nv_bfloat16*>(a.q) + (t * a.hq + h0) * d;  // (T,Hq,D)
  for (int i = threadIdx.x; i < kG * d; i += kThreads)
    q_sh[i / d][i % d] = i / d < heads ? __bfloat162float(q[i]) * scale : 0.0f;
  __syncthreads();

  // This block's keys: its share of the capacity, cut at the token's own position (causal).
  const int len = int(pos < 0 ? 0 : (pos + 1 < capacity ? pos + 1 : capacity));
  const int per_split = int(keys_per_split(capacity, a.splits));
  const int begin = split * per_split;
  const int end = begin + per_split < len ? begin + per_split : len;
  const auto* kc = static_cast<const uint4*>(a.key_cache);    // 8 BF16 of a key per uint4
  const auto* vc = static_cast<const uint4*>(a.value_cache);  // 8 keys' BF16 of a dimension per uint4

  // The values of keys base + c0 .. + 8 kValueChunks - 1, 8 a load (a chunk: its first key a
  // multiple of 8, bs one too, so its 8 keys share a cache block). First every chunk's block (-1
  // past the tile), all in flight together; then dimension r's values (zeros in a block outside
  // the cache or past D).
  constexpr int kValueChunks = kValueLoads / kDims > 0 ? kValueLoads / kDims : 1;
  // A chunk's table row and 16-byte offset in its block step along from the first chunk's (one
  // division a call; at most one wrap a step).
  const uint32_t cb = bs / 8;                                  // chunks a cache block
  const int64_t v_block = a.hkv * d * cb, v_head = kvh * d * cb;  // 16-byte units
  auto value_blocks = [&](int base, int tile, int c0, int64_t (&blk)[kValueChunks],
                          uint32_t (&at)[kValueChunks]) {
    const uint32_t c = uint32_t(base + c0) / 8;
    uint32_t row = c / cb, o = c - row * cb;
#pragma unroll
    for (int u = 0; u < kValueChunks; ++u) {
      blk[u] = c0 + 8 * u < tile ? table[row] : -1;
      at[u] = o;
      if (++o == cb) o = 0, ++row;
    }
  };
  auto load_values = [&](int r, const int64_t (&blk)[kValueChunks], const uint32_t (&at)[kValueChunks],
                         uint4 (&v)[kValueChunks]) {
    const int dim = threadIdx.x + r * kThreads;
    const uint4* vd = vc + v_head + dim * cb;  // (B,Hkv,D,bs): dimension dim's keys, 8 a load
#pragma unroll
    for (int u = 0; u < kValueChunks; ++u)
      v[u] = blk[u] >= 0 && blk[u] < a.num_blocks && dim < d ? vd[blk[u] * v_block + at[u]]
                                                             : make_uint4(0, 0, 0, 0);
  };

  float m[kG], l[kG], acc[kG][kDims] = {};
#pragma unroll
  for (int g = 0; g < kG; ++g) m[g] = -INFINITY, l[g] = 0.0f;
  for (int base = begin; base < end; base += kThreads) {
    const int tile = end - base < kThreads ? end - base : kThreads;
    // Load: the cache blocks of thread i's key (base + i) and of the tile's first value chunks,
    // in flight together; then those values, in flight through the scores and the softmax's
    // barriers, and the key, kKeyLoads of its 16-byte pieces at a time.
    const int j = base + threadIdx.x;
    const uint32_t off = uint32_t(j) % bs;
    const int64_t blk = j < end ? table[uint32_t(j) / bs] : -1;
    int64_t vblk[kValueChunks];
    uint32_t vat[kValueChunks];
    value_blocks(base, tile, 0, vblk, vat);
    uint4 vv[kDims][kValueChunks];
#pragma unroll
    for (int r = 0; r < kDims; ++r) load_values(r, vblk, vat, vv[r]);
    float s[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) s[g] = -INFINITY;
    const bool valid = blk >= 0 && blk < a.num_blocks;
    if (valid) {
#pragma unroll
      for (int g = 0; g < kG; ++g) s[g] = 0.0f;
      const uint4* key = kc + (blk * a.hkv + kvh) * (d / 8) * a.block_size + off;  // (B,Hkv,D/8,bs)
      for (int c0 = 0; c0 < d / 8; c0 += kKeyLoads) {
        uint4 v[kKeyLoads];
#pragma unroll
        for (int u = 0; u < kKeyLoads; ++u)
          if (c0 + u < d / 8) v[u] = key[(c0 + u) * bs];
        // Compute: the scores of every head of the group.
#pragma unroll
        for (int u = 0; u < kKeyLoads; ++u) {
          if (c0 + u >= d / 8) break;
          float x[8];
          unpack8(v[u], x);
          const int dim = 8 * int(c0 + u);
          // Every one of the kG heads (q rows past the group are zeros): kG independent chains.
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            float qv[8];
            load8(&q_sh[g][dim], qv);
#pragma unroll
            for (int i = 0; i < 8; ++i) s[g] = fmaf(qv[i], x[i], s[g]);
          }
        }
      }
    }
    if (!__syncthreads_or(valid)) continue;  // the same in every thread: no valid key in the tile
    // Reduce: the tile's softmax against the running max, rescaling what came before. The previous
    // tile's readers of p_sh passed the max's barrier; the sum's barrier publishes this tile's p.
    float m_new[kG], p[kG], alpha[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) m_new[g] = s[g];
    block_reduce<true>(m_new, max_sh);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      m_new[g] = fmaxf(m[g], m_new[g]);
      alpha[g] = g < heads ? expf(m[g] - m_new[g]) : 0.0f;  // 0 while m is -inf
      p[g] = s[g] == -INFINITY || g >= heads ? 0.0f : expf(s[g] - m_new[g]);
      p_sh[g][threadIdx.x] = p[g];
      m[g] = m_new[g];
    }
    block_reduce<false>(p, sum_sh);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      l[g] = l[g] * alpha[g] + p[g];
#pragma unroll
      for (int r = 0; r < kDims; ++r) acc[g][r] *= alpha[g];
    }
    // Compute: P.V, thread i owns dimensions i, i + 128; the loaded values first, then the rest
    // of the tile kValueChunks loads at a time.
#pragma unroll
    for (int r = 0; r < kDims; ++r) {
      if (threadIdx.x + r * kThreads >= d) continue;
      for (int c0 = 0; c0 < tile; c0 += 8 * kValueChunks) {
        if (c0 > 0) {
          value_blocks(base, tile, c0, vblk, vat);
          load_values(r, vblk, vat, vv[r]);
        }
#pragma unroll
        for (int u = 0; u < kValueChunks; ++u) {
          const int j0 = int(c0) + 8 * u;
          if (j0 >= tile) break;
          float x[8];
          unpack8(vv[r][u], x);
          // Past the context the cache holds whatever it held: its values are zeroed, never
          // multiplied by a zero weight (0 x NaN). Every kG head, as for the scores (p is 0 past
          // the group).
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] = j0 + i < tile ? x[i] : 0.0f;
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            float pv[8];
            load8(&p_sh[g][j0], pv);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][r] = fmaf(pv[i], x[i], acc[g][r]);
          }
        }
      }
    }
  }

  // Store: o, or this split's (max, sum, unnormalized o) of each head.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g >= heads) break;
    const int64_t h = h0 + g;
    if (a.splits == 1) {
      auto* o = static_cast<__nv_bfloat16*>(a.o) + (t * a.hq + h) * d;  // (T,Hq D)
#pragma unroll
      for (int r = 0; r < kDims; ++r) {
        const int64_t dim = threadIdx.x + r * kThreads;
        if (dim < d) o[dim] = __float2bfloat16_rn(l[g] > 0.0f ? acc[g][r] / l[g] : 0.0f);
      }
      continue;
    }
    float* part = a.partials + ((t * a.hq + h) * a.splits + split) * (d + 2);  // (T,Hq,S,D+2)
    if (threadIdx.x == 0) {
      part[0] = m[g];
      part[1] = l[g];
    }
#pragma unroll
    for (int r = 0; r < kDims; ++r) {
      const int64_t dim = threadIdx.x + r * kThreads;
      if (dim < d) part[2 + dim] = acc[g][r];
    }
  }
}

// o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, M the largest m_s; a split without keys
// (m_s = -inf) weighs nothing. A thread a split reads its (m_s, l_s) and the block reduces them,
// so that each split's pair is one load in flight, not one a step of a loop; then each dimension
// sums the splits with their weights from shared memory.
__global__ void __launch_bounds__(kThreads) combine_kernel(AttentionArgs a) {
  __shared__ float w_sh[kMaxSplits];
  __shared__ float red_sh[2][1][kWarps];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y, d = a.d;
  const float* part = a.partials + (t * a.hq + h) * a.splits * (d + 2);
  const int s = threadIdx.x;  // kMaxSplits <= kThreads
  const float ms = s < a.splits ? part[s * (d + 2)] : -INFINITY;
  const float ls = s < a.splits ? part[s * (d + 2) + 1] : 0.0f;
  float big[1] = {ms};
  block_reduce<true>(big, red_sh[0]);
  const float w = ms == -INFINITY ? 0.0f : expf(ms - big[0]);
  if (s < a.splits) w_sh[s] = w;
  float l[1] = {w * ls};
  block_reduce<false>(l, red_sh[1]);  // its barrier publishes w_sh
  auto* o = static_cast<__nv_bfloat16*>(a.o) + (t * a.hq + h) * d;  // (T,Hq D)
  for (int64_t dim = threadIdx.x; dim < d; dim += kThreads) {
    float acc = 0.0f;
#pragma unroll 8
    for (int k = 0; k < a.splits; ++k)
      if (w_sh[k] != 0.0f) acc = fmaf(w_sh[k], part[k * (d + 2) + 2 + dim], acc);
    o[dim] = __float2bfloat16_rn(l[0] > 0.0f ? acc / l[0] : 0.0f);
  }
}

}  // namespace

// A row is (token, KV head, group chunk): the blocks a split-less grid has. Split each row's keys
// until the grid holds about kSplitBlocks blocks (Llama-3-8B, 8 rows a token: 32 splits at T = 1,
// 8 at T = 8, 2 at T = 32, none from T = 64), each split at least kMinSplitKeys keys.
int attention_splits(int64_t t, int64_t hq, int64_t hkv, int64_t capacity) {
  const int64_t group = hkv > 0 ? hq / hkv : 1;
  const int64_t rows = t * hkv * ((group + kMaxGroup - 1) / kMaxGroup);
  if (rows <= 0 || rows >= kSplitBlocks) return 1;  // no rows: the launcher refuses the shape
  const int64_t by_keys = capacity / kMinSplitKeys, by_blocks = (kSplitBlocks + rows - 1) / rows;
  const int64_t s = std::min({by_keys, by_blocks, kMaxSplits});
  return int(s < 1 ? 1 : s);
}

Status check_attention(const AttentionArgs& a) {
  return Check()
          .not_null(a.q, "q")
          .not_null(a.key_cache, "key_cache")
          .not_null(a.value_cache, "value_cache")
          .not_null(a.block_table, "block_table")
          .not_null(a.positions, "positions")
          .not_null(a.o, "o")
          .that(a.splits == 1 || a.partials, "partials are needed for splits > 1")
          .positive(a.t, "T")
          .positive(a.hkv, "Hkv")
          .that(a.hkv > 0 && a.hq > 0 && a.hq % a.hkv == 0, "Hq must be a multiple of Hkv")
          .that(a.d > 0 && a.d % 8 == 0 && a.d <= kMaxHeadDim,
                "D must be a multiple of 8 up to " + std::to_string(kMaxHeadDim))
          .that(a.splits >= 1 && a.splits <= kMaxSplits,
                "splits must be in 1.." + std::to_string(kMaxSplits) + " (a combining thread a split)")
          .that(a.t <= 65535 && a.hq <= 65535, "T and Hq must be at most 65535 (grid)")
          .that(a.q_len > 0 && a.t % a.q_len == 0, "T must be whole sequences of q_len tokens")
          .positive(a.block_size, "block_size")
          .that(a.block_size % 8 == 0, "block_size must be a multiple of 8 (16-byte value loads)")
          .that(a.table_blocks <= (int64_t(1) << 31) / std::max<int64_t>(a.block_size, 1),
                "a sequence's keys (table_blocks x block_size) must fit in 31 bits")
          .aligned(a.q, 2, "q")
          .aligned(a.o, 2, "o")
          .aligned(a.block_table, 8, "block_table")
          .aligned(a.positions, 8, "positions")
          .aligned(a.key_cache, 16, "key_cache")
          .aligned(a.value_cache, 16, "value_cache")
          .arch_at_least(80)
          .status();
}

Status paged_attention(const AttentionArgs& a, cudaStream_t stream) {
  if (Status s = check_attention(a); !s.ok()) return s;
  // The grid's chunks of a group must be the kernel's (ceil(group / kG)); attention_splits counts
  // ceil(group / kMaxGroup), the same number for either kG picked here.
  const int64_t group = a.hq / a.hkv, kg = group <= 4 ? 4 : kMaxGroup, chunks = (group + kg - 1) / kg;
  const dim3 grid(unsigned(a.splits), unsigned(a.hkv * chunks), unsigned(a.t));
  const float scale = 1.0f / std::sqrt(float(a.d));
  const bool narrow = a.d <= kThreads;
  if (kg == 4) {
    (narrow ? attention_kernel<4, 1> : attention_kernel<4, 2>)<<<grid, kThreads, 0, stream>>>(a, scale);
  } else {
    (narrow ? attention_kernel<8, 1> : attention_kernel<8, 2>)<<<grid, kThreads, 0, stream>>>(a, scale);
  }
  if (a.splits > 1) combine_kernel<<<dim3(unsigned(a.hq), unsigned(a.t)), kThreads, 0, stream>>>(a);
  return last_launch_status("decoder layer attention");
}

}  // namespace lkw::layer
