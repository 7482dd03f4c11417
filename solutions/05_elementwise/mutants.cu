// Mutants of chapter 05, each a plausible slip that the golden cases must catch:
//   silu_and_mul/mutant_gate_up_swapped          the halves of x taken the other way round
//                                                (v1 with act_first flipped)
//   rope/mutant_gptj_pairing                     NEOX asked, GPT-J's pairs rotated (and back)
//   rope/mutant_sin_flipped                      the sin's sign flipped: the inverse rotation
//   qk_norm_rope/mutant_weights_swapped          k's norm weight on q's heads and q's on k's
//                                                (v5 with the two weight inputs exchanged)
//   reshape_and_cache/mutant_padding_written     a padding token (slot −1) written to the
//                                                cache's last slot instead of skipped
// Each runs a registered version on altered arguments, so it is that version plus one slip.
#include "lkw/workspace.h"
#include "cache.cuh"

namespace lkw::elementwise {
namespace {

Version altered(const char* op, const char* id, const char* summary, const char* target,
                std::function<Status(Args&, cudaStream_t)> alter) {
  Version v = version_of(kChapter, op, id, summary, Kind::kMutant, {});
  const std::string name = std::string(kChapter) + "/" + op + "/" + target;
  v.launch = [name, alter](const Args& a, cudaStream_t stream) -> Status {
    const Version* t = nullptr;
    Status s = Registry::get().require(name, "a mutant", &t);
    Args b = a;
    if (s.ok()) s = alter(b, stream);
    return s.ok() ? t->launch(b, stream) : s;
  };
  v.bytes = io_bytes;
  v.flops = [](const Args&) { return 0.0; };
  return v;
}

Status flip(Args& a, const char* param, double fallback) {
  a.params[param] = a.param(param, fallback) != 0 ? 0.0 : 1.0;
  return {};
}

// Every −1 of the slot mapping becomes the cache's last slot.
__global__ void pad_to_last_slot(const int64_t* slots, int64_t* out, int64_t t, int64_t last) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < t) out[i] = slots[i] == -1 ? last : slots[i];
}

Status write_padding(Args& a, cudaStream_t stream) {
  CacheArgs ca;
  Status s = cache_args(kCacheBf16, a, &ca);
  if (s.ok()) s = validate_cache(kCacheBf16, ca, 1);  // before the slot kernel reads anything
  if (!s.ok()) return s;
  static Workspace workspace("mutant_padding_written slots");
  void* slots = nullptr;
  s = workspace.get(8 * ca.t, &slots);
  if (!s.ok()) return s;
  pad_to_last_slot<<<unsigned((ca.t + 255) / 256), 256, 0, stream>>>(
      ca.slots, static_cast<int64_t*>(slots), ca.t, ca.num_blocks * ca.block_size - 1);
  a.inputs[2].data = slots;
  return last_launch_status("pad_to_last_slot");
}

const Register kGateUp{altered("silu_and_mul", "mutant_gate_up_swapped",
                               "gate and up swapped (v1, act_first flipped)", "v1_act_vec16",
                               [](Args& a, cudaStream_t) { return flip(a, "act_first", 1); })};
const Register kPairing{altered("rope", "mutant_gptj_pairing",
                                "the other style's pairs (v4, is_neox flipped)", "v4_rope_vec16",
                                [](Args& a, cudaStream_t) { return flip(a, "is_neox", 1); })};
const Register kSin{altered("rope", "mutant_sin_flipped",
                            "sin negated: the inverse rotation (v4, inverse flipped)",
                            "v4_rope_vec16",
                            [](Args& a, cudaStream_t) { return flip(a, "inverse", 0); })};
const Register kWeights{altered("qk_norm_rope", "mutant_weights_swapped",
                                "q_weight and k_weight exchanged (v5)", "v5_qk_norm_rope",
                                [](Args& a, cudaStream_t) -> Status {
                                  if (a.inputs.size() == 6) std::swap(a.inputs[3], a.inputs[4]);
                                  return {};
                                })};
const Register kPadding{altered("reshape_and_cache", "mutant_padding_written",
                                "padding tokens written to the last slot (v7)", "v7_cache_vec16",
                                write_padding)};

}  // namespace
}  // namespace lkw::elementwise
