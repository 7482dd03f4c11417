// The runner's paged attention alone (GPU): against a float64 softmax(q k / sqrt(D)) v over the
// token's context, on shapes the layer's golden cases do not reach: a group of 32 query heads (4
// blocks a KV head), D = 256 with 8-token blocks, a padding token (position -1: zeros), prefill
// rows of different lengths, a context split over many blocks (splits shorter than a tile, one
// starting inside a block), groups of 6 and 12 with D = 192, and batches of sequences (each with its own block table row and length; decode and
// two-token steps). The value cache is NaN outside the context (a kernel that multiplies a zero
// weight by it fails), the output is poisoned, and the guard bytes past each buffer must stay
// intact. The registered op
// (paged_attention/v0_runner, what lkw.layer_torch calls) refuses bad arguments on the host.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "layer.h"
#include "lkw/buffer.h"
#include "lkw/check.h"

namespace lkw::test {
namespace {

struct AttentionCase {
  const char* name;
  int64_t t, hq, hkv, d, bs, table;  // table: blocks a sequence
  std::vector<int64_t> positions;
  int64_t q_len = 0;  // tokens a sequence (0: one sequence of T)
};

float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

class RunnerAttention : public testing::TestWithParam<AttentionCase> {};

TEST_P(RunnerAttention, MatchesTheFloat64Reference) {
  if (device_arch() < 80) GTEST_SKIP() << "no CUDA device of sm_80 or later here: GPU test skipped";
  const AttentionCase& c = GetParam();
  const int64_t q_len = c.q_len > 0 ? c.q_len : c.t, seqs = c.t / q_len;
  const int64_t blocks = seqs * c.table + 3, capacity = c.table * c.bs;
  std::mt19937 gen(11);
  std::normal_distribution<float> n01;
  std::vector<__nv_bfloat16> q(c.t * c.hq * c.d), kc(blocks * c.hkv * c.d * c.bs), vc(kc.size());
  for (auto& x : q) x = __float2bfloat16(n01(gen));
  for (auto& x : kc) x = __float2bfloat16(n01(gen));
  std::fill(vc.begin(), vc.end(), __float2bfloat16(std::nanf("")));
  std::vector<int64_t> order(blocks), table(seqs * c.table);  // [seqs, c.table], no block shared
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  std::copy(order.begin(), order.begin() + table.size(), table.begin());
  // The paged layouts: key (blocks, Hkv, D/8, bs, 8), value (blocks, Hkv, D, bs); key j of
  // sequence b lies in block table[b][j / bs].
  auto block_of = [&](int64_t b, int64_t j) { return table[b * c.table + j / c.bs]; };
  auto key_at = [&](int64_t b, int64_t j, int64_t h, int64_t i) {
    return (((block_of(b, j) * c.hkv + h) * (c.d / 8) + i / 8) * c.bs + j % c.bs) * 8 + i % 8;
  };
  auto value_at = [&](int64_t b, int64_t j, int64_t h, int64_t i) {
    return ((block_of(b, j) * c.hkv + h) * c.d + i) * c.bs + j % c.bs;
  };
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t last = *std::max_element(c.positions.begin() + b * q_len, c.positions.begin() + (b + 1) * q_len);
    for (int64_t j = 0; j <= std::min(last, capacity - 1); ++j)
      for (int64_t h = 0; h < c.hkv; ++h)
        for (int64_t i = 0; i < c.d; ++i) vc[value_at(b, j, h, i)] = __float2bfloat16(n01(gen));
  }

  const int splits = layer::attention_splits(c.t, c.hq, c.hkv, capacity);
  DeviceBuffer dq(q.size() * 2), dk(kc.size() * 2), dv(vc.size() * 2), dtable(table.size() * 8),
      dpos(c.positions.size() * 8), dout(q.size() * 2), dpart(c.t * c.hq * splits * (c.d + 2) * 4);
  dq.upload(q.data()), dk.upload(kc.data()), dv.upload(vc.data()), dtable.upload(table.data());
  dpos.upload(c.positions.data());
  dout.poison();
  const layer::AttentionArgs a{dq.data(), dk.data(), dv.data(), static_cast<const int64_t*>(dtable.data()),
                               static_cast<const int64_t*>(dpos.data()), dout.data(),
                               static_cast<float*>(dpart.data()), c.t, c.hq, c.hkv, c.d, blocks, c.bs,
                               c.table, q_len, splits};
  ASSERT_TRUE(layer::paged_attention(a, nullptr).ok());
  std::vector<__nv_bfloat16> o(q.size());
  dout.download(o.data());
  for (const DeviceBuffer* b : {&dq, &dk, &dv, &dtable, &dpos, &dout, &dpart}) EXPECT_TRUE(b->guard_intact());

  int bad = 0;
  for (int64_t t = 0; t < c.t; ++t)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t b = t / q_len, kvh = h / (c.hq / c.hkv);
      const int64_t len = std::clamp<int64_t>(c.positions[t] + 1, 0, capacity);
      std::vector<double> p(len);
      double big = -INFINITY, sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        double s = 0;
        for (int64_t i = 0; i < c.d; ++i) s += double(to_f(q[(t * c.hq + h) * c.d + i])) * to_f(kc[key_at(b, j, kvh, i)]);
        p[j] = s / std::sqrt(double(c.d));
        big = std::max(big, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - big));
      for (int64_t i = 0; i < c.d; ++i) {
        double want = 0;
        for (int64_t j = 0; j < len; ++j) want += p[j] * to_f(vc[value_at(b, j, kvh, i)]);
        want = len > 0 ? want / sum : 0.0;
        const double got = to_f(o[(t * c.hq + h) * c.d + i]);
        // o is rounded once to BF16 (2^-9 relative); FP32 sums over the context add less.
        if (!(std::fabs(got - want) <= 4e-3 + 8e-3 * std::fabs(want)) && bad++ < 5)
          ADD_FAILURE() << "token " << t << " head " << h << " dim " << i << ": " << got << ", want " << want;
      }
    }
  EXPECT_EQ(bad, 0) << c.name << " (splits " << splits << ")";
}

// Bad shapes are refused before anything is launched (host only: the checks come before the
// device's): a zero or negative block size (the kernel divides by it), one not a multiple of 8,
// no KV heads (Hq % Hkv would divide by zero), a split count the combine cannot take, and the
// split count for an empty shape.
TEST(RunnerAttentionHost, RefusesBadShapes) {
  alignas(16) static unsigned char cache[16];
  int64_t table = 0, pos = 0;
  const layer::AttentionArgs good{cache, cache, cache, &table, &pos, cache, nullptr, 1, 8, 2, 64, 1, 16, 1, 1, 1};
  auto refused = [&](layer::AttentionArgs a, const char* what) {
    const Status s = layer::paged_attention(a, nullptr);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
  };
  for (int64_t bs : {0, -8}) {
    layer::AttentionArgs a = good;
    a.block_size = bs;
    refused(a, "block_size");
  }
  layer::AttentionArgs a = good;
  a.block_size = 12;
  refused(a, "16-byte value loads");
  a = good;
  a.hkv = 0;
  refused(a, "Hkv");
  for (int64_t q_len : {0, 2}) {  // no sequence; T = 1 is not whole sequences of 2
    a = good;
    a.q_len = q_len;
    refused(a, "q_len");
  }
  for (int splits : {0, 33}) {  // the combine kernel has a thread a split, 32 at most
    a = good;
    a.splits = splits;
    a.partials = reinterpret_cast<float*>(cache);
    refused(a, "splits must be in 1..32");
  }
  EXPECT_EQ(layer::attention_splits(0, 8, 2, 2048), 1);
  EXPECT_EQ(layer::attention_splits(1, 8, 0, 2048), 1);
  EXPECT_EQ(layer::attention_splits(1, 1, 2, 2048), 1);  // Hq < Hkv: no group
}

// The registered op (what lkw.layer_torch launches) names what is wrong before any launch.
TEST(RunnerAttentionHost, TheOpRefusesBadArguments) {
  const Version* v = Registry::get().find("11_decoder_layer/paged_attention/v0_runner");
  ASSERT_NE(v, nullptr);
  alignas(16) static unsigned char mem[64];
  auto ref = [&](DType t, std::vector<int64_t> shape) { return TensorRef{mem, t, std::move(shape)}; };
  // T = 4 tokens of 2 sequences, Hq 8, Hkv 2, D 64, 16-token blocks, 3 blocks a table.
  const Args good{{ref(DType::kBF16, {4, 8, 64}), ref(DType::kBF16, {10, 2, 8, 16, 8}),
                   ref(DType::kBF16, {10, 2, 64, 16}), ref(DType::kI64, {2, 3}), ref(DType::kI64, {4})},
                  {ref(DType::kBF16, {4, 8, 64})},
                  {}};
  auto refused = [&](Args a, const char* what) {
    const Status s = v->launch(a, nullptr);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
  };
  Args a = good;
  a.outputs.pop_back();
  refused(a, "takes 5 inputs");
  a = good;
  a.inputs[0].dtype = DType::kF32;
  refused(a, "q must be");
  a = good;
  a.inputs[2].shape = {10, 2, 64, 8};  // a block size unlike the key cache's
  refused(a, "the caches must be");
  a = good;
  a.inputs[4].shape = {3};
  refused(a, "positions must have T");
  a = good;
  a.inputs[3].shape = {3, 2};  // 4 tokens are not 3 sequences
  refused(a, "B sequences");
  a = good;
  a.outputs[0].shape = {4, 512};
  refused(a, "o must be");
}

std::vector<int64_t> first_positions(int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RunnerAttention,
    testing::Values(AttentionCase{"llama_decode_2048", 1, 32, 8, 128, 16, 128, {2047}},
                    AttentionCase{"llama_decode_short", 1, 32, 8, 128, 16, 128, {130}},
                    AttentionCase{"group_of_32", 2, 64, 2, 128, 32, 40, {1000, 37}},
                    AttentionCase{"d256_blocks_of_8", 1, 8, 8, 256, 8, 30, {200}},
                    AttentionCase{"padding_token", 2, 12, 4, 64, 16, 10, {-1, 77}},
                    AttentionCase{"prefill_24", 24, 4, 2, 32, 16, 2, first_positions(24)},
                    AttentionCase{"batch_decode_4", 4, 32, 8, 128, 16, 20, {319, 0, 150, 17}, 1},
                    AttentionCase{"batch_split_3", 3, 16, 4, 64, 16, 64, {1023, 500, 1}, 1},
                    AttentionCase{"batch_two_tokens", 6, 8, 2, 64, 16, 4, {40, 41, 9, 10, -1, 63}, 2},
                    // 296 keys in 4 splits of 96, shorter than a tile (the last one 8 keys)
                    AttentionCase{"split_granule", 1, 8, 8, 64, 8, 37, {295}},
                    AttentionCase{"split_granule_batch", 2, 8, 4, 64, 8, 37, {150, 260}, 1},
                    // 40-token blocks: 5 splits of 64 keys, split 1 starts inside block 1
                    AttentionCase{"split_inside_block", 1, 8, 8, 64, 40, 8, {300}},
                    // a group of 6 (8 heads a block, 6 used) and of 12 (two chunks, the second of
                    // 4), D = 192 (two dimensions a thread, the second only for 64 of them)
                    AttentionCase{"group_6_d192", 2, 48, 8, 192, 16, 20, {300, 17}, 1},
                    AttentionCase{"group_12", 1, 24, 2, 64, 16, 10, {150}}),
    [](const testing::TestParamInfo<AttentionCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace lkw::test
