// Chapter 11's own tests. The layer against the reference, per format and case, is the generic
// Golden test (Golden/decoder_layer_<format>__v0_runner__<case>: decode T = 1 over a context of 300,
// T = 3, prefill T = 24, at lkw.decoder_layer.GOLDEN size; tolerances in lkw.golden).
//   HostLayerRunner  the step list (each step a registered version) per format and T; mismatched
//                    shapes and formats refused with a message naming the tensor (no GPU needed)
//   LayerGraph       a decode step captured once, replayed for 100 steps (LKW_GRAPH_STEPS: fewer,
//                    step 0 checked only; the sanitizer runs) with positions, slots
//                    and inputs written into the same buffers and the cache growing; the first
//                    and last steps' outputs and the final caches checked (GPU)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "golden.h"
#include "layer.h"
#include "lkw/check.h"

namespace lkw::test {
namespace {

using layer::Format;

// The runner's Args for a small layer with fake, disjoint, aligned addresses (never launched).
struct Fake {
  int64_t t = 1, d = 128, hq = 4, hkv = 2, hd = 32, d_ff = 384, blocks = 9, bs = 16, table = 8;
  Format f = Format::kBf16;
  uintptr_t next = uintptr_t(1) << 32;

  TensorRef tensor(DType dtype, std::vector<int64_t> shape) {
    TensorRef r{reinterpret_cast<void*>(next), dtype, std::move(shape)};
    next += uintptr_t(1) << 28;  // far apart: no two tensors overlap
    return r;
  }
  std::vector<TensorRef> linear(int64_t n, int64_t k) {
    auto up = [](int64_t a, int64_t b) { return (a + b - 1) / b * b; };
    switch (f) {
      case Format::kBf16: return {tensor(DType::kBF16, {n, k})};
      case Format::kW4a16:
        return {tensor(DType::kU32, {up(n, 16), up(k / 8, 32)}), tensor(DType::kBF16, {n, k / 128}),
                tensor(DType::kU32, {n / 64, 8 * k}), tensor(DType::kBF16, {k / 128, n})};
      case Format::kFp8:
        return {tensor(DType::kE4M3, {n, k}), tensor(DType::kF32, {(n + 127) / 128, k / 128})};
    }
    return {};
  }
  Args args() {
    Args a;
    a.params["eps"] = 1e-5;
    a.inputs = {tensor(DType::kBF16, {t, d}), tensor(DType::kBF16, {t, d}),
                tensor(DType::kI64, {t}),     tensor(DType::kI64, {t}),
                tensor(DType::kI64, {table}), tensor(DType::kF32, {512, hd}),
                tensor(DType::kBF16, {d})};
    for (auto& w : linear((hq + 2 * hkv) * hd, d)) a.inputs.push_back(w);
    for (auto& w : linear(d, hq * hd)) a.inputs.push_back(w);
    a.inputs.push_back(tensor(DType::kBF16, {d}));
    for (auto& w : linear(2 * d_ff, d)) a.inputs.push_back(w);
    for (auto& w : linear(d, d_ff)) a.inputs.push_back(w);
    a.outputs = {tensor(DType::kBF16, {blocks, hkv, hd / 8, bs, 8}),
                 tensor(DType::kBF16, {blocks, hkv, hd, bs}), tensor(DType::kBF16, {t, d}),
                 tensor(DType::kBF16, {t, d})};
    return a;
  }
};

// Every check but the device's passes: ok on a GPU machine, "no device" without one.
bool passes_checks(const Status& s) {
  return s.ok() || s.code == Code::kNoDevice || s.code == Code::kUnsupportedArch;
}

Status describe(Format f, const Args& a) {
  layer::LayerTensors l;
  return layer::describe(f, a, &l);
}

void expect_refused(Format f, const Args& a, const std::string& mentions) {
  const Status s = describe(f, a);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.str();
  EXPECT_NE(s.message.find(mentions), std::string::npos)
      << "the message should name '" << mentions << "': " << s.message;
}

std::vector<std::string> step_list(Format f, int64_t t) {
  Fake fake;
  fake.f = f;
  fake.t = t;
  const Args a = fake.args();
  layer::LayerTensors l;
  layer::slice(f, a, &l);
  EXPECT_TRUE(passes_checks(layer::describe(f, a, &l)));
  layer::slice(f, a, &l);  // describe stops before filling in the shape without a device
  l.shape = {t,           fake.d,      fake.hq, fake.hkv,   fake.hd,
             fake.d_ff,   fake.blocks, fake.bs, fake.table, 512};
  l.eps = 1e-5f;
  layer::LayerRunner runner;
  void* scratch = reinterpret_cast<void*>(uintptr_t(1) << 40);  // never touched by a build
  const Status s = layer::LayerRunner::build(l, scratch, &runner);
  EXPECT_TRUE(s.ok()) << s.str();
  std::vector<std::string> out;
  for (const auto& step : runner.steps()) out.push_back(step.name + "=" + step.version);
  return out;
}

TEST(HostLayerRunner, EachStepIsARegisteredVersion) {
  const std::vector<std::string> bf16 = step_list(Format::kBf16, 1);
  const std::vector<std::string> want = {
      "attn_norm=04_rmsnorm/fused_add_rmsnorm/v4_fused_add",
      "qkv_proj=00_roofline/gemm_bf16/cublas",
      "rope=05_elementwise/qkv_rope_cache/v9_qkv_rope_cache",  // and the cache write
      "attention=11_decoder_layer/runner/paged_attention",
      "o_proj=00_roofline/gemm_bf16/cublas",
      "ffn_norm=04_rmsnorm/fused_add_rmsnorm/v4_fused_add",
      "gate_up_proj=00_roofline/gemm_bf16/cublas",
      "act=05_elementwise/silu_and_mul/v1_act_vec16",
      "down_proj=00_roofline/gemm_bf16/cublas"};
  EXPECT_EQ(bf16, want);
  for (const auto& s : bf16) {  // every step but the runner's own names a registered version
    const std::string version = s.substr(s.find('=') + 1);
    if (version.rfind("11_decoder_layer/runner/", 0) != 0)
      EXPECT_NE(Registry::get().find(version), nullptr) << version;
  }
  // T > 1: the same steps (the fused rope reads the QKV output's heads where they are: no copies).
  EXPECT_EQ(step_list(Format::kBf16, 3), want);
}

TEST(HostLayerRunner, W4a16SwitchesKernelsAtSixteenAndSixtyFourTokens) {
  const auto at16 = step_list(Format::kW4a16, 16), at17 = step_list(Format::kW4a16, 17);
  ASSERT_EQ(at16.size(), 9u);
  ASSERT_EQ(at17.size(), 9u);
  EXPECT_EQ(at16[1], "qkv_proj=06_int4_gemv/int4t_gemv/v7_tiled_stream");
  EXPECT_EQ(at16.back(), "down_proj=06_int4_gemv/int4t_gemv/v7_tiled_stream");
  EXPECT_EQ(at17[1], "qkv_proj=07_w4a16_gemm/w4a16r_gemm/v8_group_scales");
  EXPECT_EQ(at17.back(), "down_proj=07_w4a16_gemm/w4a16r_gemm/v8_group_scales");
  // v8's widest tile is 64 tokens; above that v9's 128- and 256-token tiles take over (prefill).
  const auto at64 = step_list(Format::kW4a16, 64), at65 = step_list(Format::kW4a16, 65);
  EXPECT_EQ(at64[1], "qkv_proj=07_w4a16_gemm/w4a16r_gemm/v8_group_scales");
  EXPECT_EQ(at65[1], "qkv_proj=07_w4a16_gemm/w4a16r_gemm/v9_warp_specialized");
  EXPECT_EQ(at65.back(), "down_proj=07_w4a16_gemm/w4a16r_gemm/v9_warp_specialized");
}

// Every FP8 GEMM input is quantized per 1 x 128 group: by the norms (chapter 04's fused v5) and
// the act themselves, and by chapter 03's kernel after the attention.
TEST(HostLayerRunner, Fp8QuantizesEveryGemmInput) {
  const auto s = step_list(Format::kFp8, 1);
  const std::vector<std::string> names = {"attn_norm", "qkv_proj", "rope",         "attention",
                                          "o_quant",   "o_proj",   "ffn_norm",     "gate_up_proj",
                                          "act",       "down_proj"};
  ASSERT_EQ(s.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(s[i].substr(0, s[i].find('=')), names[i]);
  EXPECT_EQ(s[0], "attn_norm=04_rmsnorm/fused_add_rmsnorm_fp8_group/v5_fused_add_quant");
  EXPECT_EQ(s[1], "qkv_proj=08_fp8_gemm/fp8_gemm_blockwise/v7_swap_ab");
  EXPECT_EQ(s[4], "o_quant=03_dynamic_quant/per_group_fp8/v2_vec16");
  EXPECT_EQ(s[6], "ffn_norm=04_rmsnorm/fused_add_rmsnorm_fp8_group/v5_fused_add_quant");
  EXPECT_EQ(s[8], "act=05_elementwise/silu_and_mul_fp8_per_group/v2_act_fused_fp8");
}

TEST(HostLayerRunner, WellFormedArgsPassEveryCheck) {
  for (Format f : {Format::kBf16, Format::kW4a16, Format::kFp8}) {
    Fake fake;
    fake.f = f;
    const Status s = describe(f, fake.args());
    EXPECT_TRUE(passes_checks(s)) << layer::format_name(f) << ": " << s.str();
    // residual_out may be residual itself (in place)
    Args a = fake.args();
    a.outputs[3].data = a.inputs[1].data;
    EXPECT_TRUE(passes_checks(describe(f, a))) << describe(f, a).str();
  }
}

TEST(HostLayerRunner, RefusesMismatchedShapesAndFormats) {
  Fake bf16;
  Args a = bf16.args();
  // Another format's tensors: the count says which op takes what.
  expect_refused(Format::kW4a16, a, "inputs and 4 outputs");
  expect_refused(Format::kFp8, a, "inputs and 4 outputs");
  Fake w4;
  w4.f = Format::kW4a16;
  expect_refused(Format::kBf16, w4.args(), "inputs and 4 outputs");
  // The right count in the wrong dtype: FP8 weights given as BF16.
  Fake fp8;
  fp8.f = Format::kFp8;
  a = fp8.args();
  a.inputs[7].dtype = DType::kBF16;
  expect_refused(Format::kFp8, a, "qkv weight");

  a = bf16.args();
  a.inputs[7].shape = {256, 64};  // qkv's K is not d
  expect_refused(Format::kBf16, a, "qkv's K");
  a = bf16.args();
  a.inputs[8].shape = {128, 96};  // o [d, Hq D]
  expect_refused(Format::kBf16, a, "o weight");
  a = bf16.args();
  a.inputs[11].shape = {128, 256};  // down [d, d_ff]
  expect_refused(Format::kBf16, a, "down weight");
  a = bf16.args();
  a.inputs[7].shape = {288, 128};  // (Hq + 2 Hkv) D = 9 · 32: Hq = 5, not a multiple of Hkv = 2
  expect_refused(Format::kBf16, a, "multiple of Hkv");
  a = bf16.args();
  a.outputs[0].shape = {9, 2, 8, 16, 4};  // key cache: not the paged layout of D = 32
  expect_refused(Format::kBf16, a, "key_cache");
  a = bf16.args();
  a.outputs[0].shape = {9, 2, 4, 12, 8};  // 12-token blocks: the attention loads 8 keys' values at once
  a.outputs[1].shape = {9, 2, 32, 12};
  expect_refused(Format::kBf16, a, "16-byte value loads");
  a = bf16.args();
  a.inputs[5].shape = {512, 16};  // RoPE over part of the head
  expect_refused(Format::kBf16, a, "cos_sin_cache");
  a = bf16.args();
  a.inputs[2].dtype = DType::kI32;
  expect_refused(Format::kBf16, a, "positions");
  a = bf16.args();
  a.outputs[2].shape = {2, 128};
  expect_refused(Format::kBf16, a, "out");
  a = bf16.args();
  a.params.clear();
  expect_refused(Format::kBf16, a, "eps");

  Fake w4b;
  w4b.f = Format::kW4a16;
  a = w4b.args();
  a.inputs[10].shape = {128, 1};  // qkv scales_kn must be [K/128, N] = [1, 256]
  expect_refused(Format::kW4a16, a, "scales_kn");
  a = w4b.args();
  a.inputs[7].shape = {256, 16};  // w_tiled padded to whole 256-k steps: [256, 32]
  expect_refused(Format::kW4a16, a, "w_tiled");
  a = fp8.args();
  a.inputs[8].dtype = DType::kBF16;  // FP8 block scales are float32
  expect_refused(Format::kFp8, a, "qkv scales");
  // Outside BF16 every K is a multiple of 128: d_ff = 320 is not.
  Fake odd;
  odd.f = Format::kFp8;
  odd.d_ff = 320;
  expect_refused(Format::kFp8, odd.args(), "d_ff");
}

TEST(HostLayerRunner, RefusesBadAddresses) {
  Fake fake;
  Args a = fake.args();
  a.outputs[2].data = a.inputs[0].data;  // out over x
  expect_refused(Format::kBf16, a, "overlap");
  a = fake.args();
  a.outputs[0].data = a.outputs[1].data;  // the two caches
  expect_refused(Format::kBf16, a, "overlap");
  a = fake.args();
  a.inputs[9].data = static_cast<char*>(a.inputs[9].data) + 8;  // norm2 not 16-byte aligned
  expect_refused(Format::kBf16, a, "input 9");
  a = fake.args();
  a.inputs[3].data = nullptr;
  expect_refused(Format::kBf16, a, "input 3");
}

TEST(HostLayerRunner, AttentionSplitsFollowTheWork) {
  // A row is a KV head's query heads (up to 8) of one token; rows x splits about 512 blocks.
  EXPECT_EQ(layer::attention_splits(1, 32, 8, 2048), 32);    // decode: 8 rows, 2048 keys in 32 of 64
  EXPECT_EQ(layer::attention_splits(8, 32, 8, 2048), 8);     // 64 rows
  EXPECT_EQ(layer::attention_splits(32, 32, 8, 2048), 2);    // 256 rows
  EXPECT_EQ(layer::attention_splits(63, 32, 8, 2048), 2);    // 504 rows
  EXPECT_EQ(layer::attention_splits(64, 32, 8, 2048), 1);    // 512 rows fill the GPU four times
  EXPECT_EQ(layer::attention_splits(1, 4, 2, 384), 6);       // at least 64 keys a split
  EXPECT_EQ(layer::attention_splits(1, 4, 2, 63), 1);
  EXPECT_EQ(layer::attention_splits(1, 64, 2, 16384), 32);   // a group of 32: 4 rows a KV head
  EXPECT_EQ(layer::attention_splits(1, 64, 2, 1024), 16);    // ... each over 64 keys
  EXPECT_EQ(layer::attention_splits(2048, 32, 8, 4096), 1);  // prefill: rows fill the GPU
  EXPECT_EQ(layer::attention_splits(1, 1, 1, 1 << 20), 32);  // at most 32
}

// ---------------------------------------------------------------------------------------------
// The CUDA graph of a decode step, replayed 100 times.

class LayerGraph : public testing::TestWithParam<std::string> {};

TEST_P(LayerGraph, ReplaysDecodeStepsWithoutRecapture) {
  const std::string fmt = GetParam();
  const Format f = fmt == "bf16" ? Format::kBf16 : fmt == "w4a16" ? Format::kW4a16 : Format::kFp8;
  const int arch = device_arch();
  if (arch < 0) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  if (arch < (f == Format::kBf16 ? 80 : 90)) GTEST_SKIP() << "needs sm_90 for " << fmt;
  const Case* c = nullptr;
  const std::vector<Case> cases = load_cases(LKW_CHAPTER);
  for (const Case& k : cases)
    if (k.id == fmt + "_graph") c = &k;
  ASSERT_NE(c, nullptr) << "no golden case " << fmt << "_graph";
  const CaseData d = load_data(*c);
  const int64_t steps = d.inputs[2].numel(), dm = d.inputs[0].shape[1];

  // Device copies: the weights and tables as given, the per-step tensors one row long.
  std::vector<DeviceBuffer> bufs;
  Args a;
  a.params = c->params;
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const HostTensor& h = d.inputs[i];
    std::vector<int64_t> shape = h.shape;
    if (i < 4) shape[0] = 1;  // x, residual, positions, slot_mapping: one step's row
    bufs.emplace_back(h.bytes.size());
    if (i >= 4) bufs.back().upload(h.bytes.data());
    a.inputs.push_back({bufs.back().data(), h.dtype, shape});
  }
  std::vector<DeviceBuffer> outs;
  for (size_t o = 0; o < 4; ++o) {
    const HostTensor& e = d.expected[o];
    std::vector<int64_t> shape = e.shape;
    outs.emplace_back(e.bytes.size());
    if (o < 2) {
      outs.back().upload(d.init.at(o).bytes.data());
    } else {
      outs.back().poison(0xFF);
    }
    a.outputs.push_back({outs.back().data(), e.dtype, shape});
  }
  layer::LayerTensors l;
  Status s = layer::describe(f, a, &l);
  ASSERT_TRUE(s.ok()) << s.str();
  DeviceBuffer scratch(size_t(layer::scratch_bytes(l)));
  layer::LayerRunner runner;
  s = layer::LayerRunner::build(l, scratch.data(), &runner);
  ASSERT_TRUE(s.ok()) << s.str();

  cudaStream_t stream = nullptr;
  LKW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto load_step = [&](int64_t i) {
    for (int k = 0; k < 4; ++k) {
      const size_t row = d.inputs[k].bytes.size() / size_t(steps);
      LKW_CUDA_CHECK(cudaMemcpyAsync(a.inputs[k].data, d.inputs[k].bytes.data() + i * row, row,
                                     cudaMemcpyHostToDevice, stream));
    }
  };
  // Step 0 once outside the graph: the kernels' plans allocate on first use, never in a capture.
  // Replaying step 0 writes the same K and V into the same slot.
  load_step(0);
  s = runner.run(stream);
  ASSERT_TRUE(s.ok()) << s.str();
  LKW_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraphExec_t exec = nullptr;
  s = runner.capture(stream, &exec);
  ASSERT_TRUE(s.ok()) << s.str();

  // LKW_GRAPH_STEPS=n replays only the first n steps (the sanitizers' runs: racecheck's host
  // memory grows with every replay); then only step 0's outputs are checked.
  const char* cap = std::getenv("LKW_GRAPH_STEPS");
  const int64_t replays = cap && *cap ? std::clamp<int64_t>(std::atoll(cap), 1, steps) : steps;
  std::vector<std::vector<uint8_t>> got(6);
  for (int64_t i = 0; i < replays; ++i) {
    load_step(i);
    LKW_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    if (i == 0 || i == steps - 1) {
      LKW_CUDA_CHECK(cudaStreamSynchronize(stream));
      got[i == 0 ? 2 : 4] = outs[2].download();
      got[i == 0 ? 3 : 5] = outs[3].download();
      for (int o : {2, 3})  // the last step must write its own (ordered on the replay's stream)
        LKW_CUDA_CHECK(cudaMemsetAsync(outs[o].data(), 0xFF, outs[o].bytes(), stream));
    }
  }
  LKW_CUDA_CHECK(cudaStreamSynchronize(stream));
  got[0] = outs[0].download();
  got[1] = outs[1].download();
  LKW_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LKW_CUDA_CHECK(cudaStreamDestroy(stream));
  const char* what[] = {"key_cache after 100 steps", "value_cache after 100 steps",
                        "out of step 0",            "residual_out of step 0",
                        "out of the last step",     "residual_out of the last step"};
  for (size_t o = 0; o < 6; ++o) {
    if (replays < steps && o != 2 && o != 3) continue;  // the cache and the last step need all
    const CompareReport r = compare_output(got[o], d, o, c->tol(o));
    EXPECT_TRUE(r.pass) << fmt << " graph, " << what[o] << " (" << c->tol(o).str()
                        << "): " << r.str();
  }
  EXPECT_TRUE(outs[2].guard_intact() && outs[3].guard_intact()) << "wrote past an output";
  EXPECT_EQ(dm, d.expected[2].shape[1]);
}

INSTANTIATE_TEST_SUITE_P(Formats, LayerGraph, testing::Values("bf16", "w4a16", "fp8"));

}  // namespace
}  // namespace lkw::test
