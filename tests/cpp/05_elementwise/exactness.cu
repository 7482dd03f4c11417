// The chapter's exactness claims, on fresh random inputs (GPU; skipped, visibly, without one):
//   HostFree...Act/*            v0 and v1 share act_and_mul: bit-equal outputs for every act,
//                               order and clamp, the vector and the single-element path
//   FusedVsChain/*              v2's codes and scales equal the unfused chain's (v1 then chapter
//                               03's quantizer) bit for bit; the per-tensor codes equal chapter
//                               03's rule applied on the host to v1's y; per token, a row split
//                               over a cluster (decode T) equals one block a row
//   Rope/*                      v3 and v4 share rotate_pair: bit-equal for both styles, partial
//                               rotation, the inverse and the single-pair path; in place equals
//                               out of place and leaves the tail as it was; a token whose
//                               position lies outside the cache is not written (v3, v4, v5)
//   Cache/*                     v6 and v7 bit-equal for every layout and dtype; slots that are
//                               padding or outside the cache change nothing
//   QkvRopeCache/*              v9 equals the chain it replaces (v4 out of place on qkv's query
//                               and key heads, then v8 of the rotated keys and the values) bit
//                               for bit in every layout and pairing, run step by step here and
//                               as the registered chain_unfused peer; a position outside the
//                               cos/sin cache writes nothing of its token, a slot that is not
//                               one writes q_out only
#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>

#include "05_elementwise/elementwise_test.h"

namespace lkw::elementwise::test {
namespace {

#define SKIP_WITHOUT_GPU()                      \
  do {                                          \
    std::string why_;                           \
    if (skip_without_gpu(&why_)) GTEST_SKIP() << why_; \
  } while (0)

void expect_same(const Outputs& a, const Outputs& b, const std::string& what) {
  ASSERT_TRUE(a.status.ok()) << what << ": " << a.status.str();
  ASSERT_TRUE(b.status.ok()) << what << ": " << b.status.str();
  EXPECT_TRUE(a.guards_intact && b.guards_intact) << what << ": wrote past an output";
  ASSERT_EQ(a.bytes.size(), b.bytes.size());
  for (size_t i = 0; i < a.bytes.size(); ++i)
    EXPECT_TRUE(a.bytes[i] == b.bytes[i]) << what << ": output " << i << " differs";
}

HostTensor bf16(std::vector<int64_t> shape, const std::vector<uint16_t>& v) {
  return host_tensor(DType::kBF16, std::move(shape), v);
}

TEST(ActScalarVsVec, BitEqual) {
  SKIP_WITHOUT_GPU();
  for (const char* op : {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"})
    for (const auto& [t, d] : {std::pair<int64_t, int64_t>{3, 4096}, {5, 203}, {64, 8}})
      for (double act_first : {1.0, 0.0})
        for (double limit : {0.0, 5.0}) {
          auto rng = rng_for(std::string(op) + std::to_string(d));
          const HostTensor x = bf16({t, 2 * d}, random_bf16(rng, t * 2 * d, d));
          const std::map<std::string, double> p{{"act_first", act_first}, {"limit", limit}};
          const HostTensor y = poisoned(DType::kBF16, {t, d});
          expect_same(run(name(op, "v0_act_scalar"), {x}, {y}, p),
                      run(name(op, "v1_act_vec16"), {x}, {y}, p),
                      std::string(op) + " d = " + std::to_string(d));
        }
}

TEST(FusedVsChain, BitForBit) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    const char* op;
    int64_t t, d;
    std::map<std::string, double> params;
  };
  const Shape shapes[] = {{"silu_and_mul_fp8_per_token", 7, 14336, {}},
                          {"silu_and_mul_fp8_per_token", 3, 28672, {{"scale_ub", 2.0}}},
                          {"silu_and_mul_fp8_per_group", 9, 4096, {}},
                          {"silu_and_mul_fp8_per_group", 33, 1024, {{"scales_row_major", 1.0}}}};
  for (const Shape& s : shapes) {
    auto rng = rng_for(std::string(s.op) + std::to_string(s.d));
    const HostTensor x = bf16({s.t, 2 * s.d}, random_bf16(rng, s.t * 2 * s.d, s.d));
    const bool per_token = std::string(s.op).find("per_token") != std::string::npos;
    const std::vector<int64_t> scale_shape =
        per_token                       ? std::vector<int64_t>{s.t, 1}
        : s.params.count("scales_row_major") ? std::vector<int64_t>{s.t, s.d / 128}
                                             : std::vector<int64_t>{s.d / 128, s.t};
    const std::vector<HostTensor> outs{poisoned(DType::kE4M3, {s.t, s.d}),
                                       poisoned(DType::kF32, scale_shape)};
    expect_same(run(name(s.op, "chain_unfused"), {x}, outs, s.params),
                run(name(s.op, "v2_act_fused_fp8"), {x}, outs, s.params), s.op);
  }
  // Per tensor: chapter 03's rule, e4m3_satfinite(fp32(yb · fp32(1 / scale))), on v1's y.
  const int64_t t = 5, d = 4104;
  auto rng = rng_for("per_tensor");
  const HostTensor x = bf16({t, 2 * d}, random_bf16(rng, t * 2 * d, d));
  const float scale = 0.0371f;
  const Outputs y = run(name("silu_and_mul", "v1_act_vec16"), {x},
                        {poisoned(DType::kBF16, {t, d})}, {});
  const Outputs q = run(name("silu_and_mul_fp8_per_tensor", "v2_act_fused_fp8"),
                        {x, host_tensor(DType::kF32, {1}, std::vector<float>{scale})},
                        {poisoned(DType::kE4M3, {t, d})}, {});
  ASSERT_TRUE(y.status.ok() && q.status.ok()) << y.status.str() << " " << q.status.str();
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < t * d; ++i) {
    uint16_t bits;
    std::memcpy(&bits, y.bytes[0].data() + 2 * i, 2);
    const float v = bf16_bits_to_f32(bits) * inv;
    const uint8_t want = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    ASSERT_EQ(q.bytes[0][size_t(i)], want) << "element " << i;
  }
}

TEST(FusedVsChain, ClusterRowsEqualOneBlockRows) {
  SKIP_WITHOUT_GPU();
  // T = 1 and 16 take clusters of 8, 32 of 4, 64 of 2, 200 one block a row (on 132 SMs); d = 4104
  // leaves the last CTA of a cluster a shorter slice, d = 256 keeps 32 units a slice at most 4.
  for (const int64_t d : {int64_t(14336), int64_t(4104), int64_t(256)})
    for (const int64_t t : {1, 16, 32, 64, 200}) {
      auto rng = rng_for("cluster" + std::to_string(t) + "_" + std::to_string(d));
      const HostTensor x = bf16({t, 2 * d}, random_bf16(rng, t * 2 * d, d));
      const std::vector<HostTensor> outs{poisoned(DType::kE4M3, {t, d}), poisoned(DType::kF32, {t, 1})};
      const std::string what = "per token T = " + std::to_string(t) + " d = " + std::to_string(d);
      expect_same(run(name("silu_and_mul_fp8_per_token", "v2_act_fused_fp8"), {x}, outs, {}),
                  run(name("silu_and_mul_fp8_per_token", "ablation_v2_one_block_a_row"), {x}, outs, {}), what);
    }
}

struct RopeShape {
  int64_t t, hq, hk, d, rot;
};
const RopeShape kRopeShapes[] = {{5, 4, 2, 128, 128}, {3, 3, 1, 128, 64}, {4, 2, 2, 10, 6},
                                 {2, 8, 8, 64, 48}};

std::vector<HostTensor> rope_inputs(const RopeShape& s, const std::string& salt, int64_t max_pos,
                                    std::vector<int64_t> positions = {}) {
  auto rng = rng_for(salt);
  if (positions.empty()) {
    std::uniform_int_distribution<int64_t> pos(0, max_pos - 1);
    for (int64_t i = 0; i < s.t; ++i) positions.push_back(pos(rng));
  }
  return {host_tensor(DType::kI64, {s.t}, positions),
          bf16({s.t, s.hq, s.d}, random_bf16(rng, s.t * s.hq * s.d, s.d)),
          bf16({s.t, s.hk, s.d}, random_bf16(rng, s.t * s.hk * s.d, s.d)),
          host_tensor(DType::kF32, {max_pos, s.rot}, cos_sin_cache(max_pos, s.rot))};
}

std::vector<HostTensor> rope_outputs(const RopeShape& s) {
  return {poisoned(DType::kBF16, {s.t, s.hq, s.d}), poisoned(DType::kBF16, {s.t, s.hk, s.d})};
}

TEST(Rope, ScalarVsVecInPlaceAndTail) {
  SKIP_WITHOUT_GPU();
  for (const RopeShape& s : kRopeShapes)
    for (double neox : {1.0, 0.0})
      for (double inverse : {0.0, 1.0}) {
        const std::string what = "D " + std::to_string(s.d) + " rot " + std::to_string(s.rot) +
                                 (neox ? " NEOX" : " GPT-J") + (inverse ? " inverse" : "");
        const auto in = rope_inputs(s, what, 4096);
        const std::map<std::string, double> p{{"is_neox", neox}, {"inverse", inverse}};
        const Outputs v3 = run(name("rope", "v3_rope_scalar"), in, rope_outputs(s), p);
        const Outputs v4 = run(name("rope", "v4_rope_vec16"), in, rope_outputs(s), p);
        expect_same(v3, v4, what);
        for (const char* id : {"v3_rope_scalar", "v4_rope_vec16"}) {
          const Outputs in_place = run(name("rope", id), in, rope_outputs(s), p, {{0, 1}, {1, 2}});
          expect_same(in_place, v4, std::string(id) + " in place, " + what);
        }
        // The tail is the input's, bit for bit.
        for (int kv = 0; kv < 2; ++kv) {
          const int64_t heads = s.t * (kv ? s.hk : s.hq);
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = s.rot; i < s.d; ++i)
              ASSERT_EQ(std::memcmp(v4.bytes[kv].data() + 2 * (h * s.d + i),
                                    in[1 + kv].bytes.data() + 2 * (h * s.d + i), 2),
                        0)
                  << what << ": tail element " << i << " of head " << h;
        }
      }
}

TEST(Rope, SkipsPositionsOutsideTheCache) {
  SKIP_WITHOUT_GPU();
  const RopeShape s{4, 4, 2, 128, 128};
  const int64_t max_pos = 100;
  for (const char* op : {"rope", "qk_norm_rope"}) {
    for (const char* id : {"v3_rope_scalar", "v4_rope_vec16", "v5_qk_norm_rope"}) {
      if (Registry::get().find(name(op, id)) == nullptr) continue;
      auto bad = rope_inputs(s, id, max_pos, {7, -1, max_pos, 99});
      auto good = rope_inputs(s, id, max_pos, {7, 0, 0, 99});
      std::map<std::string, double> p;
      if (std::string(op) == "qk_norm_rope") {
        auto rng = rng_for("weights");
        const HostTensor q_weight = bf16({s.d}, random_bf16(rng, s.d, s.d));
        const HostTensor k_weight = bf16({s.d}, random_bf16(rng, s.d, s.d));
        for (auto* in : {&bad, &good}) in->insert(in->begin() + 3, {q_weight, k_weight});
        p["eps"] = 1e-6;
      }
      const Outputs got = run(name(op, id), bad, rope_outputs(s), p);
      const Outputs want = run(name(op, id), good, rope_outputs(s), p);
      ASSERT_TRUE(got.status.ok() && want.status.ok()) << got.status.str();
      for (int kv = 0; kv < 2; ++kv) {
        const size_t token_bytes = size_t(2 * (kv ? s.hk : s.hq) * s.d);
        for (int64_t token = 0; token < s.t; ++token) {
          const uint8_t* g = got.bytes[kv].data() + token * token_bytes;
          const bool outside = token == 1 || token == 2;
          if (outside) {
            for (size_t b = 0; b < token_bytes; ++b)
              ASSERT_EQ(g[b], 0xFF) << id << ": token " << token << " was written";
          } else {
            EXPECT_EQ(std::memcmp(g, want.bytes[kv].data() + token * token_bytes, token_bytes), 0)
                << id << ": token " << token;
          }
        }
      }
    }
  }
}

TEST(Cache, ScalarVsVecAndBadSlots) {
  SKIP_WITHOUT_GPU();
  const int64_t t = 37, hk = 3, blocks = 9, bs = 16;
  for (const bool prompt : {false, true})  // slots at random (decode), or filling blocks in order
    for (const bool fp8 : {false, true})
      for (const int64_t d : {128, 16, 6})
        for (int layout = 0; layout < 3; ++layout) {
          const int64_t x = fp8 ? 16 : 8;
          if (layout == 0 && d % x) continue;
          const std::string what = std::string(prompt ? "prompt " : "") + (fp8 ? "FP8" : "BF16") +
                                   " layout " + std::to_string(layout) + " D " + std::to_string(d);
          auto rng = rng_for(what);
          std::vector<int64_t> slots(size_t(blocks * bs)), order(static_cast<size_t>(blocks));
          for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t(i);
          for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
          std::shuffle(slots.begin(), slots.end(), rng);
          std::shuffle(order.begin(), order.end(), rng);
          if (prompt)  // token i at offset i % bs of the (i / bs)-th block of the order
            for (size_t i = 0; i < slots.size(); ++i)
              slots[i] = order[i / bs] * bs + int64_t(i) % bs;
          slots.resize(size_t(t));
          slots[3] = slots[10] = -1;  // padding
          std::vector<int64_t> bad = slots;
          bad[20] = -2, bad[21] = blocks * bs, bad[22] = blocks * bs + 1000;  // not slots
          std::vector<int64_t> skipped = slots;
          skipped[20] = skipped[21] = skipped[22] = -1;
          const DType c = fp8 ? DType::kE4M3 : DType::kBF16;
          std::vector<int64_t> k_shape, v_shape;
          if (layout == 0) {
            k_shape = {blocks, hk, d / x, bs, x};
            v_shape = {blocks, hk, d, bs};
          } else {
            k_shape = v_shape = layout == 1 ? std::vector<int64_t>{blocks, bs, hk, d}
                                            : std::vector<int64_t>{blocks, hk, bs, d};
          }
          // Initial caches of random finite bits: what no token writes must keep them.
          const int64_t cache_bytes = blocks * bs * hk * d * (fp8 ? 1 : 2);
          std::vector<uint8_t> init(static_cast<size_t>(cache_bytes));
          for (uint8_t& b : init) b = uint8_t(rng() % 0x70);
          HostTensor kc{c, k_shape, init}, vc{c, v_shape, init};
          std::vector<HostTensor> in{bf16({t, hk, d}, random_bf16(rng, t * hk * d, d)),
                                     bf16({t, hk, d}, random_bf16(rng, t * hk * d, d)),
                                     host_tensor(DType::kI64, {t}, slots)};
          if (fp8) {
            in.push_back(host_tensor(DType::kF32, {1}, std::vector<float>{0.02f}));
            in.push_back(host_tensor(DType::kF32, {1}, std::vector<float>{0.5f}));
          }
          const std::string op = fp8 ? "reshape_and_cache_fp8" : "reshape_and_cache";
          const std::map<std::string, double> p{{"layout", double(layout)}};
          const Outputs v6 = run(name(op, "v6_cache_scalar"), in, {kc, vc}, p);
          const Outputs v7 = run(name(op, "v7_cache_vec16"), in, {kc, vc}, p);
          const Outputs v8 = run(name(op, "v8_cache_staged"), in, {kc, vc}, p);
          expect_same(v6, v7, what);
          expect_same(v6, v8, "v8 " + what);
          for (const char* id : {"v6_cache_scalar", "v7_cache_vec16", "v8_cache_staged"}) {
            in[2] = host_tensor(DType::kI64, {t}, bad);
            const Outputs with_bad = run(name(op, id), in, {kc, vc}, p);
            in[2] = host_tensor(DType::kI64, {t}, skipped);
            const Outputs with_padding = run(name(op, id), in, {kc, vc}, p);
            expect_same(with_bad, with_padding, std::string(id) + " bad slots, " + what);
          }
        }
}

TEST(QkvRopeCache, EqualsTheChainOfRopeAndCache) {
  SKIP_WITHOUT_GPU();
  const int64_t t = 37, hq = 5, hk = 2, h = hq + 2 * hk, blocks = 6, bs = 16, max_pos = 64;
  for (const auto [d, rot] : {std::pair<int64_t, int64_t>{128, 128}, {64, 32}})
    for (const int neox : {1, 0})
      for (int layout = 0; layout < 3; ++layout) {
        const std::string what = "layout " + std::to_string(layout) + (neox ? " NEOX" : " GPT-J") +
                                 " D " + std::to_string(d) + " rot " + std::to_string(rot);
        auto rng = rng_for(what);
        const std::vector<uint16_t> qkv = random_bf16(rng, t * h * d, d);
        std::vector<int64_t> pos(static_cast<size_t>(t)), slots(size_t(blocks * bs));
        for (int64_t& p : pos) p = int64_t(rng() % max_pos);
        for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t(i);
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(size_t(t));
        slots[3] = -1, slots[11] = -2, slots[12] = blocks * bs;  // padding and two non-slots
        // The heads of qkv as tensors of their own, for the chain.
        std::vector<uint16_t> q, k, v;
        for (int64_t i = 0; i < t; ++i) {
          const auto row = qkv.begin() + i * h * d;
          q.insert(q.end(), row, row + hq * d);
          k.insert(k.end(), row + hq * d, row + (hq + hk) * d);
          v.insert(v.end(), row + (hq + hk) * d, row + h * d);
        }
        std::vector<int64_t> k_shape, v_shape;
        if (layout == 0) {
          k_shape = {blocks, hk, d / 8, bs, 8};
          v_shape = {blocks, hk, d, bs};
        } else {
          k_shape = v_shape = layout == 1 ? std::vector<int64_t>{blocks, bs, hk, d}
                                          : std::vector<int64_t>{blocks, hk, bs, d};
        }
        std::vector<uint8_t> init(static_cast<size_t>(blocks * bs * hk * d * 2));
        for (uint8_t& b : init) b = uint8_t(rng() % 0x70);
        const HostTensor kc{DType::kBF16, k_shape, init}, vc{DType::kBF16, v_shape, init};
        const HostTensor cos_sin = host_tensor(DType::kF32, {max_pos, rot}, cos_sin_cache(max_pos, rot));
        const std::map<std::string, double> p{{"layout", double(layout)}, {"is_neox", double(neox)}};
        auto fused = [&](const std::vector<int64_t>& positions,
                         const char* id = "v9_qkv_rope_cache") {
          return run(name("qkv_rope_cache", id),
                     {host_tensor(DType::kI64, {t}, positions), bf16({t, h, d}, qkv), cos_sin,
                      host_tensor(DType::kI64, {t}, slots)},
                     {kc, vc, poisoned(DType::kBF16, {t, hq, d})}, p);
        };
        const Outputs got = fused(pos);
        const Outputs rot_qk = run(name("rope", "v4_rope_vec16"),
                                   {host_tensor(DType::kI64, {t}, pos), bf16({t, hq, d}, q),
                                    bf16({t, hk, d}, k), cos_sin},
                                   {poisoned(DType::kBF16, {t, hq, d}), poisoned(DType::kBF16, {t, hk, d})},
                                   {{"is_neox", double(neox)}});
        ASSERT_TRUE(rot_qk.status.ok()) << rot_qk.status.str();
        std::vector<uint16_t> k_rot(k.size());
        std::memcpy(k_rot.data(), rot_qk.bytes[1].data(), 2 * k_rot.size());
        const Outputs cached = run(name("reshape_and_cache", "v8_cache_staged"),
                                   {bf16({t, hk, d}, k_rot), bf16({t, hk, d}, v),
                                    host_tensor(DType::kI64, {t}, slots)},
                                   {kc, vc}, {{"layout", double(layout)}});
        Outputs chain = cached;
        chain.bytes.push_back(rot_qk.bytes[0]);
        expect_same(got, chain, what);
        expect_same(got, fused(pos, "chain_unfused"), "the registered chain, " + what);
        // Positions outside the cos/sin cache: their tokens write nothing, as if padding with
        // q_out's rows left as they were.
        std::vector<int64_t> bad = pos;
        bad[5] = -1, bad[6] = max_pos;
        const Outputs skipped = fused(bad);
        ASSERT_TRUE(skipped.status.ok()) << skipped.status.str();
        const size_t row = size_t(hq * d * 2);
        for (size_t i = 0; i < size_t(t); ++i) {
          const bool dead = i == 5 || i == 6;
          const auto a = skipped.bytes[2].begin() + i * row, b = got.bytes[2].begin() + i * row;
          EXPECT_EQ(dead, !std::equal(a, a + row, b)) << what << " q_out row " << i;
          if (dead) EXPECT_TRUE(std::all_of(a, a + row, [](uint8_t x) { return x == 0xFF; }));
        }
        std::vector<int64_t> unwritten = slots;
        unwritten[5] = unwritten[6] = -1;
        const Outputs want = run(name("reshape_and_cache", "v8_cache_staged"),
                                 {bf16({t, hk, d}, k_rot), bf16({t, hk, d}, v),
                                  host_tensor(DType::kI64, {t}, unwritten)},
                                 {kc, vc}, {{"layout", double(layout)}});
        EXPECT_TRUE(skipped.bytes[0] == want.bytes[0] && skipped.bytes[1] == want.bytes[1]) << what;
      }
}

}  // namespace
}  // namespace lkw::elementwise::test
