// v11_line_prefetch — v9's kernels (v8's past M = 2) with every 16-byte copy asking L2 for its own
// 128-byte line on a miss, where v3 to v10 ask for the aligned 256-byte pair. v10's rotation is
// not kept.
//
// Since v10: v3 chose .L2::256B because a warp reads both lines of every pair, one step after the
// other, and one DRAM request for 256 bytes seemed better than two for 128. But a warp asks for a
// new pair only every second step, and all its neighbours, started together and keeping nearly
// the same pace, ask on the same steps: the DRAM sees a burst of requests for 256 bytes per row,
// then a step with almost none. v10's rotation had found the symptom: a walk that starts at an
// odd step asks for its pairs on the other steps, and with the parity mixed over the tiles the
// requests spread out; with every start even the gain was gone (v10_rotated_walk.cu). Asking for
// 128 bytes per copy removes the cause: every step of every warp asks for its own lines, and the
// requests come as evenly as the steps.
//
// Tried first with tools/gemv_timeline (results/h200/probes/06_line_prefetch.txt, H200,
// 2026-12-01, the prefetch size switched by a macro; back to back, µs): at M = 1, v9's kernels
// with 128-byte lines took 32.19 against 32.98–33.00 at 28672 × 8192 and 33.11–33.17 against
// 34.12–34.17 at 8192 × 28672, below v10's 32.66–32.84 and 33.55–33.59; rotated as well they were
// no faster (32.63–32.66 and 33.21–33.23). v8's kernels gained more past M = 2 (M = 8 at
// 8192 × 28672: 38.29–38.34 against 41.15–41.54), v7's one launch at a time too. No prefetch size
// at all (L2 fetches the 32-byte sectors the lanes ask for) was slower than 128 bytes at every
// shape of the first run, 64 bytes slower than 128 nearly everywhere; the scales' 4-byte copies
// with a 128- or 256-byte prefetch were within the runs' spread.
//
// So v11 is v9's choice of kernel (the lean BF16 fold, the K split kept in the block at M ≤ 2 and
// G = 128; v8 elsewhere) with kPrefetch = 128 in every copy of the weights and of x
// (persistent_gemv.cuh, mma::cp_async_16). The same bytes as the model asks; the same SASS but
// for the copies' LTC128B.
//
// The bench (results/h200/history/06_int4_gemv_0ddd984.json: H200, 2026-12-01T21:03:47Z, commit
// 0ddd984), M = 1, back to back against v10 and v9 in the same run: 32.38 against 32.47 and 33.14 µs at
// 28672 × 8192 (88.4% of the copy ceiling), 33.24 against 33.62 and 34.18 at 8192 × 28672
// (86.1%); in a CUDA graph 31.77 (90.1%) and 32.69 µs (87.6%); one launch after the flush 36.72 and
// 37.25 µs. Faster than v10 at 10 of the 12 shapes with M ≤ 2 back to back (by 0.09 to 0.63 µs;
// at 4096 × 4096, 8 MB of weights, 0.13 and 0.04 µs slower) and at all 12 in a graph; faster
// than v8 at all 18 shapes past M = 2, both ways, by up to 3.09 µs (M = 8, 8192 × 28672: 37.56
// against 40.65). DRAM bytes as v9's at the 70B shapes (0.9% and 1.2% over the model at M = 1;
// v9 0.9% and 1.4%, v10 2.6% and 3.1%), 0.2–4.0% over at every shape.
//
// Expect: faster than v9 and v10 back to back and in a graph where the rows are long (at
// 4096 × 4096 within a few tenths of v10), and than v8 past M = 2; DRAM bytes as v9's (no pair
// split by a rotated walk). SASS: LDGSTS.E.BYPASS.LTC128B for the weights and x, no LTC256B, and
// v9's griddepcontrol, BF16 mma and LOP3 unpack.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v11(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v11 runs v7's kernels, which run without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_block_split<kOp, /*kRotate=*/false, /*kPrefetch=*/128>(a, stream);  // persistent_gemv.cuh
}

// v11's kernels: every instantiation with the 128-byte prefetch, the weights in rows and no cache
// policy (the last three template arguments, ...ELi128ELb0ELb0EE); the second fact its BF16 fold at
// M ≤ 2 (v9's kernels).
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2ELb0ELi128ELb0ELb0EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC128B.128", "HMMA", "LOP3"},
           {"LDGSTS.E.BYPASS.LTC256B", "I2F", "I2FP", "LDG.E.128"}, true,
           "v8's and v9's kernels with every 16-byte copy asking for its own 128-byte line "
           "(LDGSTS...LTC128B, none with LTC256B), griddepcontrol (ACQBULK, PREEXIT), mma.sync, "
           "LOP3 unpack, no integer→float convert"},
          {"persistent_kernel*ILi1ELi0E*ELi2ELb0ELi128ELb0ELb0EE", {"sm_90a"}, {"HMMA.16816.F32.BF16"}, {}, true,
           "the BF16 fold of v9's kernels (M ≤ 2, G = 128)"}};
}

constexpr const char* kSummary = "v9 (v8 past M = 2) with every copy asking L2 for its own 128-byte line "
                                 "instead of the 256-byte pair, so that the warps' DRAM requests come as "
                                 "evenly as their steps";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v11_line_prefetch", kSummary, gemv_v11<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
