// v5_f16_activations — v4 with x in FP16: the fold's unpack in five instructions per word.
//
// Since v4: the tools/gemv_probe.cu experiment runs v4's grid, tile order and cp.async ring with
// less and less of its arithmetic. On the H200 at 28672 × 8192 the bare stream takes about
// 30 µs, the stream with the fold's unpack about 32, with the mma about 33; v4 itself about 41.
// Nsight Compute on v4 finds the schedulers idle half the time with a third of the stalls on the
// ALU pipe being busy ("math pipe throttle") and the most sampled instructions the unpack's LOP3
// and SHF: the step's 4096 weights cost 16 words × (4 LOP3 + 3 SHF) on the ALU pipe, which runs
// at half the rate of the FMA pipe. The shifts are there because BF16 has 7 mantissa bits: a
// nibble fits in bits 0..3 of a half word under the magic 128, but one in bits 4..7 would run into
// the exponent, so each of the four pairs of a word needs its own shift. FP16 has 10 mantissa
// bits, room for two nibbles under the magic 1024 (chapter 02's FP16 unpack): one mask takes
// nibbles 0 and 4 (1024 + q), another nibbles 1 and 5 in place (1024 + 16q), one shift by 8 brings
// the other four. Four LOP3 and one SHF per word.
//
// But the mma multiplies like types: with FP16 weights, x must be FP16 too. BF16 → FP16 is exact
// for every value with 8 significant bits inside FP16's exponent range, so each block scales every
// group of 128 of its slice of x by a power of two, 2^s with the group's largest |x|·2^s in
// [2^15, 2^16), and converts it once in shared memory, in one pass that also finds the largest
// |x| (four lanes per group, two shuffles); each group's sums are multiplied by its 2^−s together
// with the weight scale, also exact. What FP16 cannot hold exactly are values below 2^−17 after
// scaling, i.e. smaller than 2^−32 of the group's largest: rounded to FP16's subnormal grid, an
// error below 2^−40 of the group's largest |x| per element, far under the FP32 sum's own rounding.
//
// The fold becomes two chains per group: pairs 0 and 2 of every word (1024 + q, with x pairs 0
// and 2) and pairs 1 and 3 (1024 + 16q, with x pairs 1 and 3): the k order within the mma is
// free, so the word's pairs are sorted by their factor and x's registers follow. With
// A = Σ₀₂ x(1024 + q), B = Σ₁₃ x(1024 + 16q), the group's Σ x(q − 8) = A + B/16 − 1032·Σ₀₂x − 72·Σ₁₃x:
// the block computes the correction per group and row of x while it converts the slice and stores
// it as the first chain's C fragment, so per group a lane adds B/16 and scales: two FMA per sum.
// Only the G = 128 path for M ≤ 2 changes (kF16MaxM in persistent_gemv.cuh: at larger M the
// conversion costs what the unpack saves); everything else is v4's kernel, shared through
// persistent_gemv.cuh.
//
// Expect: at M ≤ 2 and G = 128 fewer ALU-pipe instructions per step (80 instead of 112 for the
// unpack), the ALU pipe less busy and the time a few percent shorter than v4; the same DRAM bytes;
// elsewhere v4's numbers. The FP32 sums carry values ~130× the unbiased ones (v4: ~17×), still
// far inside the tolerance (reference/lkw/gemv.py).
// SASS: the fold kernel's mma in FP16 (HMMA.16816.F32 without .BF16), x converted by F2FP, no
// integer→float convert, no local memory.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v5(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v5 changes only the fold, which runs without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_v5_modes<kOp>(a, stream);  // the FP16 fold at G = 128, M ≤ kF16MaxM; else v4's
}

// The first fact names every kernel of the version (the bench matches it against the profiled
// kernel's name; with v4's kernel shared, it names v4's instantiations too, and the instruction
// mix the SASS check records is that of all of them); the second the FP16 fold's.
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi256ELb0ELb0EE", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "LDGSTS.E.ZFILL", "HMMA", "LOP3"},
           {"I2F", "I2FP", "LDG.E.128"}, true,
           "weights, x, scales through cp.async (LDGSTS; no 16-byte LDG), mma.sync (HMMA), LOP3 "
           "unpack, no integer→float convert"},
          {"persistent_kernelILi1ELi3E", {}, {"HMMA.16816.F32", "F2FP", "LOP3", "LDGSTS"},
           {"HMMA.16816.F32.BF16", "I2F", "I2FP", "LDG.E.128"}, true,
           "the FP16 fold: mma on FP16 (no BF16 HMMA), x converted by F2FP, LOP3 unpack, no "
           "integer→float convert, the copies through cp.async"}};
}

constexpr const char* kSummary =
    "v4 with x scaled by 2^s and converted to FP16: the fold's unpack in 4 LOP3 + 1 SHF per word";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v5_f16_activations", kSummary, gemv_v5<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
