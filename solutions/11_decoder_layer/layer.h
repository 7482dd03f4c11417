// Chapter 11 — decoder_layer: a Llama-shaped decoder layer run from the workbook's registered
// kernels (Llama-3-8B: d 4096, Hq 32, Hkv 8, D 128, d_ff 14336), in three weight formats. The
// numbers are reference/lkw/decoder_layer.py's; this is the runner, not a lesson.
//
// ops (one per weight format; version "v0_runner", the only one so far; param eps):
//   decoder_layer_bf16   GEMMs by cuBLAS (chapter 00's peer)
//   decoder_layer_w4a16  G = 128: chapter 06's GEMV (v7, tiled words) at T <= 16, chapter 07's
//                        GEMM (v7, repacked words) above
//   decoder_layer_fp8    W8A8, chapter 08's blockwise GEMM; each GEMM input quantized per 1 x 128
//                        group (by chapter 04's fused norm, chapter 03 after the attention,
//                        chapter 05's fused act)
//
// THE INPUT ORDER (the one place it is written; lkw.decoder_layer.op_inputs builds it):
//   0 x              bf16  [T, d]      the layer's input (one sequence, T new tokens)
//   1 residual       bf16  [T, d]
//   2 positions      int64 [T]         each token's position; it attends to positions 0..its own
//   3 slot_mapping   int64 [T]         its cache slot, block_table[p / bs] * bs + p % bs
//   4 block_table    int64 [B]         the sequence's cache blocks (B * bs > every position)
//   5 cos_sin_cache  f32   [P, D]      row p: cos of the D/2 angles, then their sin (RoPE, NEOX)
//   6 norm1 bf16 [d]; then qkv [(Hq + 2 Hkv) D, d] (rows q | k | v), o [d, Hq D]; norm2 bf16 [d];
//     gate_up [2 d_ff, d] (rows gate | up), down [d, d_ff]; each projection [N, K] as
//       bf16   w bf16 [N, K]                                          (1 tensor)
//       w4a16  w_tiled u32 [ceil(N/16)*16, ceil(K/256)*32] (chapter 06's int4t), scales_nk bf16
//              [N, K/128], w_repacked u32 [N/64, 8K] (chapter 07's w4a16r), scales_kn bf16
//              [K/128, N]                                             (4 tensors)
//       fp8    w e4m3 [N, K], scales f32 [ceil(N/128), K/128]         (2 tensors)
// OUTPUTS: 0 key_cache bf16 [blocks, Hkv, D/8, bs, 8], 1 value_cache bf16 [blocks, Hkv, D, bs]
//   (vLLM's paged layout, updated in place at slot_mapping), 2 out bf16 [T, d] (the down
//   projection), 3 residual_out bf16 [T, d] (r2; it may be residual itself). The next layer's
//   first step adds out and residual_out.
// Positions and slots are read on the device, so a CUDA graph of a decode step is replayed with
// new values written into the same buffers (LayerRunner::capture).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lkw/registry.h"

namespace lkw::layer {

constexpr const char* kChapter = "11_decoder_layer";
constexpr int kGroup = 128;      // W4A16 group, FP8 activation groups and weight blocks
constexpr int kGemvMaxT = 16;    // W4A16: chapter 06's GEMV up to here, chapter 07's GEMM above
constexpr int kGroupScalesMaxT = 64;  // chapter 07's v8 up to here (its tiles: 64 tokens), v9 above
constexpr int kMaxHeadDim = 256;  // the attention kernel's q row in shared memory

enum class Format { kBf16, kW4a16, kFp8 };
const char* format_name(Format f);
int tensors_per_linear(Format f);  // 1, 4, 2
int input_count(Format f);         // 6 + 2 norms + 4 projections

// The shapes every tensor must agree on, read from the tensors themselves.
struct LayerShape {
  int64_t t = 0, d = 0, hq = 0, hkv = 0, head_dim = 0, d_ff = 0;
  int64_t num_blocks = 0, block_size = 0, table_blocks = 0, max_pos = 0;
  int64_t qkv_n() const { return (hq + 2 * hkv) * head_dim; }
};

// One projection's device tensors, [N, K] of the format.
struct Linear {
  std::vector<TensorRef> tensors;  // in the order above
  int64_t n = 0, k = 0;
};

// The op's tensors by role, checked.
struct LayerTensors {
  Format format = Format::kBf16;
  LayerShape shape;
  TensorRef x, residual, positions, slot_mapping, block_table, cos_sin;
  TensorRef norm1, norm2;
  Linear qkv, o, gate_up, down;
  TensorRef key_cache, value_cache, out, residual_out;
  float eps = 0;
};

// The op's tensors by role, unchecked (Args with the format's tensor counts).
void slice(Format f, const Args& a, LayerTensors* out);

// Reads and checks Args (counts, dtypes, shapes, alignment, null pointers, overlaps) before
// anything runs: a mismatched shape or format comes back as a message naming the tensor.
Status describe(Format f, const Args& a, LayerTensors* out);

// The runner's own scratch (intermediate activations, attention partials), in bytes.
int64_t scratch_bytes(const LayerTensors& l);

// The attention of the runner (attention.cu): NOT taught here. Paged causal GQA over vLLM's
// cache layout, FP32 softmax; long contexts split over `splits` blocks and combined. T tokens are
// T / q_len sequences of q_len tokens each (the runner: one sequence, q_len = T; a batch of
// decode steps: q_len = 1), sequence b reading the keys of block_table row b.
struct AttentionArgs {
  const void* q;              // bf16 [T, Hq, D]
  const void* key_cache;      // bf16 [blocks, Hkv, D/8, bs, 8]
  const void* value_cache;    // bf16 [blocks, Hkv, D, bs]
  const int64_t* block_table;  // [T / q_len, table_blocks]
  const int64_t* positions;   // [T]
  void* o;                    // bf16 [T, Hq D]
  float* partials;            // [T, Hq, splits, D + 2] when splits > 1
  int64_t t, hq, hkv, d, num_blocks, block_size, table_blocks, q_len;
  int splits;
};
int attention_splits(int64_t t, int64_t hq, int64_t hkv, int64_t capacity);
Status check_attention(const AttentionArgs& a);  // what paged_attention refuses, before a launch
Status paged_attention(const AttentionArgs& a, cudaStream_t stream);

// One launch of the layer: a registered version (or the runner's attention) and its Args.
struct Step {
  std::string name;     // the layer's step ("qkv_proj", ...)
  std::string version;  // "04_rmsnorm/fused_add_rmsnorm/v4_fused_add", "runner/attention", ...
  Args args;
  GenericLaunch launch;
};

class LayerRunner {
 public:
  // Builds the step list over the checked tensors and `scratch` (scratch_bytes(l) bytes, 256-byte
  // aligned). Every registered version is found by name first: a build without one is an error.
  static Status build(const LayerTensors& l, void* scratch, LayerRunner* out);

  // Runs every step on `stream` (nothing synchronizes, nothing is allocated once the kernels'
  // own plans have seen these shapes: the first run before a capture sees to that).
  Status run(cudaStream_t stream) const;

  // Captures run() once into a graph on `stream` (not the legacy default stream). Replays see new
  // positions, slots and inputs written into the same device buffers.
  Status capture(cudaStream_t stream, cudaGraphExec_t* exec) const;

  const std::vector<Step>& steps() const { return steps_; }

 private:
  std::vector<Step> steps_;
};

}  // namespace lkw::layer
