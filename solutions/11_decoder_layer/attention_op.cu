// The runner's paged attention as a registered op, so that the workbook's layers in Python
// (lkw.layer_torch) read the paged cache in place: NOT a lesson (attention.cu says why). Args:
//   inputs  q bf16 [T, Hq, D], key_cache bf16 [blocks, Hkv, D/8, bs, 8], value_cache bf16
//           [blocks, Hkv, D, bs], block_tables int64 [B, table_blocks], positions int64 [T]
//           (B sequences of T / B tokens each, token t of sequence t / (T / B));
//   outputs o bf16 [T, Hq, D].
// The split partials live in a scratch of the op's own, allocated once at the size that bounds
// every split attention_splits picks (so a captured graph never sees it move).
#include <string>
#include <vector>

#include "layer.h"
#include "lkw/workspace.h"

namespace lkw::layer {
namespace {

Status attention_args(const Args& a, AttentionArgs* out) {
  Status s = Check()
                 .that(a.inputs.size() == 5 && a.outputs.size() == 1,
                       "paged_attention takes 5 inputs (q, key_cache, value_cache, block_tables, "
                       "positions) and 1 output (o)")
                 .status();
  if (!s.ok()) return s;
  const TensorRef& q = a.inputs[0];
  const TensorRef& kc = a.inputs[1];
  const TensorRef& vc = a.inputs[2];
  const TensorRef& table = a.inputs[3];
  const TensorRef& pos = a.inputs[4];
  const TensorRef& o = a.outputs[0];
  s = Check()
          .that(q.dtype == DType::kBF16 && q.shape.size() == 3, "q must be bfloat16 [T, Hq, D]")
          .that(kc.dtype == DType::kBF16 && kc.shape.size() == 5,
                "key_cache must be bfloat16 [blocks, Hkv, D/8, bs, 8]")
          .that(vc.dtype == DType::kBF16 && vc.shape.size() == 4,
                "value_cache must be bfloat16 [blocks, Hkv, D, bs]")
          .that(table.dtype == DType::kI64 && table.shape.size() == 2,
                "block_tables must be int64 [B, table_blocks]")
          .that(pos.dtype == DType::kI64 && pos.shape.size() == 1, "positions must be int64 [T]")
          .that(o.dtype == DType::kBF16 && o.shape == q.shape, "o must be bfloat16 [T, Hq, D], q's shape")
          .status();
  if (!s.ok()) return s;
  const int64_t t = q.dim(0), d = q.dim(2), batch = table.dim(0);
  s = Check()
          .that(kc.dim(4) == 8 && kc.dim(2) * 8 == d &&
                    vc.shape == std::vector<int64_t>{kc.dim(0), kc.dim(1), d, kc.dim(3)},
                "the caches must be [blocks, Hkv, D/8, bs, 8] and [blocks, Hkv, D, bs] for q's D")
          .that(pos.dim(0) == t, "positions must have T entries")
          .that(batch > 0 && t % batch == 0, "T must be B sequences of one length (B = block_tables rows)")
          .status();
  if (!s.ok()) return s;
  AttentionArgs r{q.data, kc.data, vc.data, static_cast<const int64_t*>(table.data),
                  static_cast<const int64_t*>(pos.data), o.data, nullptr,
                  t, q.dim(1), kc.dim(1), d, kc.dim(0), kc.dim(3), table.dim(1), t / batch, 1};
  if (s = check_attention(r); !s.ok()) return s;  // null, misaligned, bad shapes: before any CUDA call
  r.splits = attention_splits(t, r.hq, r.hkv, r.table_blocks * r.block_size);
  if (r.splits > 1) {
    // splits x rows < 1024 (attention_splits: a split only below 512 rows, at most
    // ceil(512 / rows) of them) and a row is a KV head's group of at most 8 query heads:
    // T Hq splits < 8192.
    constexpr int64_t kBound = 8192 * (kMaxHeadDim + 2) * 4;
    const int64_t need = t * r.hq * r.splits * (d + 2) * 4;
    static Workspace scratch("paged attention partials");
    void* p = nullptr;
    s = Check().that(need <= kBound, "paged attention partials past their bound").status();
    if (s.ok()) s = scratch.get(kBound, &p);
    if (!s.ok()) return s;
    r.partials = static_cast<float*>(p);
  }
  *out = r;
  return {};
}

// Every input once and o once, the cache as if every table were full (the context lives on the
// device: lkw.decoder_layer's attention model counts it from the positions).
double attention_bytes(const Args& a) {
  const TensorRef& kc = a.inputs.at(1);
  const TensorRef& table = a.inputs.at(3);
  const double per_block = 2.0 * double(kc.numel()) / double(kc.dim(0));  // K and V of one block
  return double(a.inputs.at(0).bytes()) + double(table.bytes()) + double(a.inputs.at(4).bytes()) +
         double(a.outputs.at(0).bytes()) + double(table.numel()) * per_block * 2.0;
}

Version attention_version() {
  Version v = version_of(kChapter, "paged_attention", "v0_runner",
                         "the runner's paged causal GQA attention (not a lesson): the cache read in "
                         "place, the context split where the grid is small",
                         Kind::kVersion,
                         {{"attention_kernel", {}, {"MUFU.EX2"}, {}, true,
                           "attention: the softmax's exponentials on the SFU, nothing spilled"},
                          {"combine_kernel", {}, {}, {}, true, "split combine: nothing spilled"}});
  v.kernels_per_launch = 0;  // one kernel, or two with a split
  v.launch = [](const Args& a, cudaStream_t stream) -> Status {
    AttentionArgs r{};
    Status s = attention_args(a, &r);
    return s.ok() ? paged_attention(r, stream) : s;
  };
  v.bytes = attention_bytes;
  // q.k and p.v over the tables' capacity: 4 T Hq D keys.
  v.flops = [](const Args& a) {
    const TensorRef& q = a.inputs.at(0);
    const TensorRef& kc = a.inputs.at(1);
    return 4.0 * double(q.numel()) * double(a.inputs.at(3).dim(1)) * double(kc.dim(3));
  };
  return v;
}

const Register kPagedAttention{attention_version()};

}  // namespace
}  // namespace lkw::layer
