// v14_evict_first — v13 with the weights copied under an L2 evict_first policy.
//
// Since v13: every 16-byte copy of the weights carries a cache policy (createpolicy.fractional
// .L2::evict_first, fraction 1.0; mma_gemv.cuh's cp_async_16). The weights are read once per
// launch, yet under the default policy each of their lines enters L2 as an equal of everything
// else there, and L2 makes room for them among the lines the kernel reads again: the scale words
// (a row's 64 scales at K = 8192 sit in one 128-byte line that the row's steps read 4 bytes at a
// time over the whole run), x (read by every block) and the y the earlier kernels left. With
// evict_first the weights' lines are the first to go, and those lines stay. The scale and
// zero-point copies keep the default policy: their lines are read again by the row's next steps,
// and the scales under evict_first too were no faster (below). Same kernels, steps, layout and
// placement as v13.
//
// Measured first with tools/gemv_timeline (results/h200/probes/06_evict_first.txt, H200,
// 2026-12-02, v13's kernel with the policy switched by a macro; µs, two rounds each):
// - The tool's usual 3 rotated copies at M = 1, 28672 × 8192: 30.43–30.57 back to back against
//   31.98–32.05 for v13. Most of that is not the kernel: with the weights evict_first, the three
//   copies' scales (11 MB) stay in L2 from one launch to the next, and Nsight Compute reads
//   117.44 MB per launch from DRAM, the weights alone. A decoder reads every other layer's weights
//   and scales between two launches of this one, so its scales come from DRAM.
// - So measured over 40 copies (the scales alone then 147 MB, over twice the L2): at M = 1,
//   28672 × 8192 31.20–31.33 back to back against 31.98–32.04 and 30.62–30.67 in a graph against
//   31.27–31.31; at 8192 × 28672 0.4–0.5 faster back to back, 0.3–0.4 in a graph; at M = 2 and
//   M = 8 (28672 × 8192) 0.6–0.9 faster; one launch at a time 0.2–0.4 faster. Nsight Compute over
//   40 copies: 121.11–121.14 MB read per launch (the weights and scales once), 0.00–0.08 MB
//   written, against 121.93–122.23 MB read and 0.02–0.52 MB written for v13: under the default
//   policy about 0.9 MB of lines are read twice in one launch, and dirty lines of earlier kernels
//   written back while it runs.
// - The scales evict_first too: level with v13 or slower (their lines dropped between steps).
// The bench rotates the tiled op's inputs accordingly: enough sets that its inputs other than the
// weights exceed twice the L2 on their own (reference/lkw/bench.py, _rotations).
//
// An attempt on v4 and v5 (the book's v14 section: the bench at commit 66a9327, 2026-11-30) put
// the same policy on their 256-byte pairs and measured them slower, 6–39% over the byte model:
// there a step's copy brings the row's next 128 bytes into L2 for a later copy, and evict_first
// lets them go first. With v11's 128-byte lines every line a copy brings in is its own.
//
// The bench (results/h200/history/06_int4_gemv_9b072d6.json: H200, 2026-12-02T10:52:09Z, the sets
// rotated past the weights), v14 against v13 in the same run: M = 1, 28672 × 8192, 35.89 against
// 35.90 µs one launch at a time, 31.08 against 31.37 back to back (92.2% of the copy ceiling),
// 30.57 against 30.70 in a graph (93.7%); 8192 × 28672 0.22–0.25 µs faster all three ways; M = 2
// there 0.18–0.27 faster back to back. DRAM bytes 0.1% over the model at M = 1 on the 70B shapes
// (v13 0.9% and 1.2%). Past M = 2, where v14 runs v8's kernels with the policy, mixed: 0.16–0.25 µs
// slower back to back at M = 4 to 16 on 28672 × 8192, 0.32 faster at M = 4 on 8192 × 28672. The
// repeat three minutes later (history/06_int4_gemv_9b072d6_repeat.json) the same within 0.1 µs.
// A third to a half of the probe's gain: the tool then kept one x, which the policy kept in L2
// between launches (a decoder's x, just written, is there under either policy); the bench rotates
// x too. With x rotated (06_scales_last.txt) the tool has v14 0.3-0.6 µs ahead back to back.
//
// Expect: faster than v13 at M ≤ 2 on the 70B shapes by a few tenths of a µs; DRAM bytes at the
// model to a tenth of a percent; level at the short shapes, mixed past M = 2. SASS as v12's (the
// policy is an operand of the copy's memory descriptor, not a different instruction), and no spill:
// the policy is made at each copy (cp_async_16), where one made once and held across the loop cost
// the M ≤ 2 kernel a 4-byte spill at its 128 registers (the probe's builds).
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v14(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kOp.tiled && !kOp.zero_points, "v14 reads the tiled layout, without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_block_split<kOp, /*kRotate=*/false, /*kPrefetch=*/128, /*kEvictFirst=*/true>(a, stream,
                                                                                          /*consecutive=*/true);
}

// v14's kernels: v12's instructions, every instantiation with the policy (the last template
// argument, ...ELb1ELb1EE). That the policy reaches the memory system the recorded run's DRAM bytes
// show (test_bench).
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2ELb0ELi128ELb1ELb1EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC128B.128", "HMMA", "LOP3"},
           {"LDGSTS.E.BYPASS.LTC256B", "I2F", "I2FP", "LDG.E.128"}, true,
           "v12's kernels with the evict_first weight copies: LDGSTS...LTC128B, none with LTC256B, "
           "griddepcontrol (ACQBULK, PREEXIT), mma.sync, LOP3 unpack, no integer→float convert"},
          {"persistent_kernel*ILi1ELi0E*ELi2ELb0ELi128ELb1ELb1EE", {"sm_90a"}, {"HMMA.16816.F32.BF16"}, {}, true,
           "the BF16 fold of v9's kernels (M ≤ 2, G = 128) with the evict_first weight copies"}};
}

constexpr const char* kSummary = "v13 with the weights copied under an L2 evict_first policy: the lines "
                                 "read again (scales, x) stay in L2";
const Register kRegistered{gemv_version(kInt4tGemv, "v14_evict_first", kSummary, gemv_v14<kInt4tGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
