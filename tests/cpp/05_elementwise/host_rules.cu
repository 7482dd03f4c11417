// Chapter 05's argument rules and host planning (no GPU needed: every launcher refuses before
// it asks for a device):
//   act ops    valid arguments reach the launcher (only the device is missing); x's last dim must be even; per-group quant needs d % 128 == 0; the per-token
//              fused kernel holds at most 32768 outputs a row (4096 for d % 8 != 0); the fused
//              ops are SiLU of the first half, unclamped (no act_first, no limit)
//   rope       q and k both in place or both not; an output overlapping an input is refused;
//              qk_norm_rope has no inverse;
//              rot_dim (the cache's width) even and <= D; D within the version's registers
//   cache      the layout param; the caches' shapes for that layout; D % x for the paged key;
//              fewer than 2^31 slots (the kernels' block and offset are 32-bit)
//   qkv        qkv holds Hq + 2·Hk heads (Hk the caches'), q_out [T, Hq, D]; the layout's cache
//              shapes, BF16 only; v9's 16-byte items (rot_dim % 16); no inverse; no overlaps
//   rope_lanes a power of two, at most 32, enough for every item and tail unit
#include "05_elementwise/elementwise_test.h"
#include "rope.cuh"

namespace lkw::elementwise::test {
namespace {

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }
constexpr uintptr_t kIn = 0x100000, kOut = 0x40000000;

Status launch(const std::string& version, Args a) {
  const Version* v = Registry::get().find(version);
  if (!v) throw std::runtime_error("not registered: " + version);
  return v->launch(a, nullptr);
}

void expect_refused(const std::string& version, const Args& a, const std::string& why) {
  const Status s = launch(version, a);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << version << ", " << why << ": " << s.str();
}

Args act(int64_t t, int64_t two_d, DType out = DType::kBF16) {
  Args a;
  a.inputs = {{at(kIn), DType::kBF16, {t, two_d}}};
  a.outputs = {{at(kOut), out, {t, two_d / 2}}};
  return a;
}

TEST(HostActRules, RefusesBadShapes) {
  expect_refused(name("silu_and_mul", "v1_act_vec16"), act(4, 7), "odd last dim");
  Args y_shape = act(4, 16);
  y_shape.outputs[0].shape = {4, 7};
  expect_refused(name("silu_and_mul", "v1_act_vec16"), y_shape, "y not [T, d]");
  Args group = act(4, 2 * 200, DType::kE4M3);
  group.outputs.push_back({at(kOut + 0x100000), DType::kF32, {1, 4}});
  expect_refused(name("silu_and_mul_fp8_per_group", "v2_act_fused_fp8"), group, "d % 128");
  Args token = act(2, 2 * 40960, DType::kE4M3);
  token.outputs.push_back({at(kOut + 0x1000000), DType::kF32, {2, 1}});
  expect_refused(name("silu_and_mul_fp8_per_token", "v2_act_fused_fp8"), token, "d too large");
  Args scales = act(2, 256, DType::kE4M3);
  scales.outputs.push_back({at(kOut + 0x100000), DType::kF32, {1, 2}});  // [T, 1] expected
  expect_refused(name("silu_and_mul_fp8_per_token", "v2_act_fused_fp8"), scales, "scales shape");
  Args overlap = act(4, 16);
  overlap.outputs[0].data = at(kIn + 16);  // y inside x
  expect_refused(name("silu_and_mul", "v1_act_vec16"), overlap, "y overlaps x");
  Args clamp = act(4, 16);
  clamp.params["limit"] = -1.0;
  expect_refused(name("silu_and_mul", "v0_act_scalar"), clamp, "negative limit");
  Args fused_order = act(4, 256, DType::kE4M3);
  fused_order.outputs.push_back({at(kOut + 0x100000), DType::kF32, {4, 1}});
  fused_order.params["act_first"] = 0;
  expect_refused(name("silu_and_mul_fp8_per_token", "v2_act_fused_fp8"), fused_order,
                 "the fused quant takes no act_first");
}

// Valid arguments reach the launcher intact: without a GPU the only complaint left is the device
// (an adapter that fills its args but never hands them over fails here with a bogus shape).
TEST(HostActRules, AcceptsValidArgumentsUpToTheDevice) {
  if (device_arch() >= 0) GTEST_SKIP() << "a GPU is present: the golden tests launch these";
  for (const char* id : {"v0_act_scalar", "v1_act_vec16"})
    EXPECT_EQ(launch(name("silu_and_mul", id), act(4, 256)).code, Code::kNoDevice) << id;
  Args token = act(4, 256, DType::kE4M3);
  token.outputs.push_back({at(kOut + 0x100000), DType::kF32, {4, 1}});
  EXPECT_EQ(launch(name("silu_and_mul_fp8_per_token", "v2_act_fused_fp8"), token).code,
            Code::kNoDevice);
}

Args rope(int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t rot, bool norm = false) {
  Args a;
  a.inputs = {{at(kIn), DType::kI64, {t}},
              {at(kIn + 0x10000), DType::kBF16, {t, hq, d}},
              {at(kIn + 0x20000), DType::kBF16, {t, hk, d}}};
  if (norm) {
    a.inputs.push_back({at(kIn + 0x30000), DType::kBF16, {d}});
    a.inputs.push_back({at(kIn + 0x31000), DType::kBF16, {d}});
    a.params["eps"] = 1e-6;
  }
  a.inputs.push_back({at(kIn + 0x40000), DType::kF32, {64, rot}});
  a.outputs = {{at(kOut), DType::kBF16, {t, hq, d}}, {at(kOut + 0x10000), DType::kBF16, {t, hk, d}}};
  return a;
}

TEST(HostRopeRules, RefusesBadArguments) {
  for (const char* id : {"v3_rope_scalar", "v4_rope_vec16"}) {
    const std::string v = name("rope", id);
    Args half_in_place = rope(4, 4, 2, 128, 128);
    half_in_place.outputs[0].data = half_in_place.inputs[1].data;  // q in place, k not
    expect_refused(v, half_in_place, "q in place, k out of place");
    Args overlap = rope(4, 4, 2, 128, 128);
    overlap.outputs[1].data = at(kIn + 0x10000 + 256);  // k_out inside q
    expect_refused(v, overlap, "k_out overlaps q");
    expect_refused(v, rope(4, 4, 2, 64, 128), "rot_dim > D");
    expect_refused(v, rope(4, 4, 2, 64, 33), "odd rot_dim");
    Args no_k = rope(4, 4, 2, 128, 128);
    no_k.inputs[2].shape = {5, 2, 128};
    expect_refused(v, no_k, "k's T differs");
  }
  expect_refused(name("rope", "v4_rope_vec16"), rope(2, 1, 1, 1024, 1024), "D beyond registers");
  Args no_eps = rope(4, 4, 2, 128, 128, true);
  no_eps.params.erase("eps");
  expect_refused(name("qk_norm_rope", "v5_qk_norm_rope"), no_eps, "no eps");
  Args inverse = rope(4, 4, 2, 128, 128, true);
  inverse.params["inverse"] = 1;
  expect_refused(name("qk_norm_rope", "v5_qk_norm_rope"), inverse, "qk_norm_rope has no inverse");
  Args weight = rope(4, 4, 2, 128, 128, true);
  weight.inputs[3].shape = {64};
  expect_refused(name("qk_norm_rope", "v5_qk_norm_rope"), weight, "weight not [D]");
}

Args cache(int64_t layout, std::vector<int64_t> k_shape, std::vector<int64_t> v_shape,
           int64_t t = 4, int64_t hk = 2, int64_t d = 128, bool fp8 = false) {
  Args a;
  a.inputs = {{at(kIn), DType::kBF16, {t, hk, d}},
              {at(kIn + 0x10000), DType::kBF16, {t, hk, d}},
              {at(kIn + 0x20000), DType::kI64, {t}}};
  if (fp8) {
    a.inputs.push_back({at(kIn + 0x30000), DType::kF32, {1}});
    a.inputs.push_back({at(kIn + 0x30010), DType::kF32, {1}});
  }
  const DType c = fp8 ? DType::kE4M3 : DType::kBF16;
  a.outputs = {{at(kOut), c, std::move(k_shape)}, {at(kOut + 0x1000000), c, std::move(v_shape)}};
  a.params["layout"] = double(layout);
  return a;
}

TEST(HostCacheRules, RefusesBadLayouts) {
  for (const char* id : {"v6_cache_scalar", "v7_cache_vec16", "v8_cache_staged"}) {
    const std::string v = name("reshape_and_cache", id);
    expect_refused(v, cache(3, {3, 2, 16, 16, 8}, {3, 2, 128, 16}), "layout 3");
    Args no_layout = cache(0, {3, 2, 16, 16, 8}, {3, 2, 128, 16});
    no_layout.params.clear();
    expect_refused(v, no_layout, "no layout param");
    expect_refused(v, cache(0, {3, 2, 16, 16, 8}, {3, 2, 16, 128}), "value transposed");
    expect_refused(v, cache(1, {3, 2, 16, 128}, {3, 2, 16, 128}), "HND shapes as NHD");
    expect_refused(v, cache(0, {3, 2, 2, 16, 6}, {3, 2, 12, 16}, 4, 2, 12), "D % 8 paged");
    Args fp8_as_bf16 = cache(1, {3, 16, 2, 128}, {3, 16, 2, 128});
    fp8_as_bf16.outputs[0].dtype = fp8_as_bf16.outputs[1].dtype = DType::kE4M3;
    expect_refused(v, fp8_as_bf16, "E4M3 caches for the BF16 op");
    Args overlap = cache(1, {3, 16, 2, 128}, {3, 16, 2, 128});
    overlap.outputs[1].data = at(kOut + 64);
    expect_refused(v, overlap, "key and value caches overlap");
    const int64_t huge = int64_t(1) << 27;  // blocks of 16 slots: 2^31 slots
    expect_refused(v, cache(1, {huge, 16, 2, 128}, {huge, 16, 2, 128}), "2^31 slots");
  }
  expect_refused(name("reshape_and_cache", "v8_cache_staged"),
                 cache(0, {3, 2, 1024 / 8, 16, 8}, {3, 2, 1024, 16}, 4, 2, 1024),
                 "a paged head of 1024 elements: more than the staged tile holds");
  expect_refused(name("reshape_and_cache_fp8", "v7_cache_vec16"),
                 cache(0, {3, 2, 16, 16, 8}, {3, 2, 128, 16}, 4, 2, 128, true),
                 "FP8 paged key with x = 8 (it must be 16)");
}

// qkv_rope_cache: positions, qkv [T, Hq + 2·Hk, D], cos/sin [64, rot], slots -> NHD caches of
// Hk heads, q_out [T, Hq, D].
Args qkv(int64_t hq, int64_t hk, int64_t d = 128, int64_t rot = 128, int64_t t = 4) {
  Args a;
  a.inputs = {{at(kIn), DType::kI64, {t}},
              {at(kIn + 0x10000), DType::kBF16, {t, hq + 2 * hk, d}},
              {at(kIn + 0x40000), DType::kF32, {64, rot}},
              {at(kIn + 0x80000), DType::kI64, {t}}};
  a.outputs = {{at(kOut), DType::kBF16, {3, 16, hk, d}},
               {at(kOut + 0x1000000), DType::kBF16, {3, 16, hk, d}},
               {at(kOut + 0x2000000), DType::kBF16, {t, hq, d}}};
  a.params["layout"] = 1;
  return a;
}

TEST(HostQkvRules, RefusesBadHeadsShapesAndOverlaps) {
  const std::string v = name("qkv_rope_cache", "v9_qkv_rope_cache");
  Args no_query = qkv(4, 2);
  no_query.inputs[1].shape = {4, 4, 128};  // Hk = 2 from the caches: no query head left
  no_query.outputs[2].shape = {4, 0, 128};
  expect_refused(v, no_query, "qkv without query heads");
  Args q_shape = qkv(4, 2);
  q_shape.outputs[2].shape = {4, 5, 128};
  expect_refused(v, q_shape, "q_out not [T, Hq, D]");
  Args paged_as_nhd = qkv(4, 2);
  paged_as_nhd.params["layout"] = 0;
  expect_refused(v, paged_as_nhd, "NHD caches for the paged layout");
  expect_refused(v, qkv(4, 2, 128, 72), "rot_dim % 16 != 0 (v9's items)");
  expect_refused(v, qkv(4, 2, 128, 130), "rot_dim > D");
  Args fp8 = qkv(4, 2);
  fp8.outputs[0].dtype = fp8.outputs[1].dtype = DType::kE4M3;
  expect_refused(v, fp8, "FP8 caches");
  Args inverse = qkv(4, 2);
  inverse.params["inverse"] = 1;
  expect_refused(v, inverse, "the inverse rotation");
  Args overlap = qkv(4, 2);
  overlap.outputs[2].data = at(kIn + 0x10000 + 256);  // q_out inside qkv
  expect_refused(v, overlap, "q_out overlaps qkv");
  Args three = qkv(4, 2);
  three.inputs.pop_back();
  expect_refused(v, three, "no slot_mapping");
  if (device_arch() < 0)
    EXPECT_EQ(launch(v, qkv(5, 2)).code, Code::kNoDevice) << "valid arguments reach the device";
}

// The bench and the tests call every version's launcher and models: none may be left empty.
TEST(HostRegistry, EveryVersionHasItsLauncherAndModels) {
  int seen = 0;
  for (const Version* v : Registry::get().chapter(kChapter)) {
    ++seen;
    EXPECT_TRUE(v->launch && v->bytes && v->flops) << v->name();
  }
  EXPECT_GE(seen, 20);
}

// ... because the registry refuses, where a version is registered, one that lacks any of them
// (the chain peer once registered without its FLOP model, and the bench failed on it).
TEST(HostRegistry, RefusesAVersionWithoutItsLauncherOrModels) {
  const Version* v9 = Registry::get().find("05_elementwise/qkv_rope_cache/v9_qkv_rope_cache");
  ASSERT_NE(v9, nullptr);
  for (int lack = 0; lack < 3; ++lack) {
    Version v = *v9;
    v.id = "lacking";
    if (lack == 0) v.launch = nullptr;
    if (lack == 1) v.bytes = nullptr;
    if (lack == 2) v.flops = nullptr;
    Registry local;
    EXPECT_THROW(local.add(v), std::logic_error) << "lacking " << lack;
  }
  Registry local;
  EXPECT_NO_THROW(local.add(*v9));
  EXPECT_THROW(local.add(*v9), std::logic_error);  // twice
}

TEST(HostRopePlan, LanesCoverItemsAndTail) {
  EXPECT_EQ(rope_lanes(8, 0), 8);    // D = 128, full rotation: 8 items of 8 pairs
  EXPECT_EQ(rope_lanes(4, 8), 8);    // rot 64 of 128, out of place: 8 tail units
  EXPECT_EQ(rope_lanes(1, 62), 32);  // rot 16 of 512: at most 2 tail units a lane
  EXPECT_EQ(rope_lanes(64, 0), 32);  // the scalar path, rot 128: 2 pairs a lane
  EXPECT_EQ(rope_lanes(0, 0), 1);
  for (int items = 1; items <= 128; ++items)
    for (int tail : {0, 3, 64, 256}) {
      const int lanes = rope_lanes(items, tail);
      EXPECT_EQ(lanes & (lanes - 1), 0) << "a power of two";
      EXPECT_LE((items + lanes - 1) / lanes, RopeTile<1>::kMaxItems) << items;
      EXPECT_LE((tail + lanes - 1) / lanes, RopeTile<1>::kMaxTail) << tail;
    }
  EXPECT_EQ(rope_pairs(128, 128), 8);
  EXPECT_EQ(rope_pairs(128, 72), 1);  // rot/2 = 36 pairs: not whole 16-byte items
  EXPECT_EQ(rope_pairs(100, 96), 1);  // rows of 200 bytes: not 16-byte aligned
}

}  // namespace
}  // namespace lkw::elementwise::test
