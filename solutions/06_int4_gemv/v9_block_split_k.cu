// v9_block_split_k — v8 at M ≤ 2 with two changes at the kernel's ends: at M = 1, and at M = 2 up
// to K = 8192, the K split kept inside the block (its pieces summed in shared memory, none
// through the global workspace), and the BF16 fold with a Σx pass over the rows of x only, in
// place of v5's FP16 conversion of x.
//
// Since v8: at 8192 × 28672 (M = 1) v8's plan splits K in S = 4 across blocks, and each tile's
// four partial sums meet in the global workspace: a store, a __threadfence, an atomic count, and
// the last arrival's fence, loads and store of y. Those are round trips to L2 while the weights
// still fill its queues, and the last tile's chain is the kernel's end. tools/gemv_timeline on
// the H200 (2026-12-01, commit c6af93c with results/h200/probes/06_finish_and_fold.patch; v8 back
// to back, the tool's time, which reads v8 about 1 µs slower than the bench) took the chain
// apart: 35.9–36.4 µs as committed, 34.0–34.3 with only the partials stored (wrong results, for
// timing), 34.7–34.9 with the fence and the count but no sum; so the finish costs about 2 µs,
// half of it the last arrival's loads and store. Cheaper ways to meet in global memory did not
// help (results/h200/probes/06_finish_and_fold.txt): fence.acq_rel instead of __threadfence, an
// acq_rel atomic instead of both fences, partials with a flag in the same 64-bit word polled by
// split 0, or read by every split after a fence.sc; all 35.7–37.6 µs. Thread-block clusters would
// keep the sum on chip, but with v8's 150 KB of shared memory per block the H200 holds only 30
// clusters of four (120 SMs), 66 of two.
//
// So the split stays in the block: at M = 1 S = 1, the block's tiles' steps shared evenly over
// its 16 warps (v6's cuts at any step, persistent::run_start; at 8192 × 28672 four tiles of 112
// steps, 28 steps per warp, as with S = 4), each tile's pieces summed in shared memory after the
// block's barrier. The price is x: each block now stages the whole row (56 KB at K = 28672) and
// v5's FP16 conversion of it took 1.9 µs instead of 0.8 (two rounds of the pass instead of one);
// S = 1 alone gained 0.3–0.7 µs. The BF16 fold (v4) needs no conversion,
// only Σx per group, but its pass walked all eight columns of the mma's B for every group, the
// seven past M included, and took 3.9 µs at S = 1. With Params::lean_sums it walks only the rows
// of x (the rest zeroed): 1.0–1.2 µs at S = 1, 0.55 at S = 4 (0.8 for the FP16 conversion there).
//
// The tool's times (v8, and v9's configuration built through the probe patch's macros, as
// dependent launches back to back; one launch after the flush in brackets; same run, M, shape):
//   M = 1, 8192 × 28672    v8 36.17, 36.22 (37.92, 38.40)   v9 35.32, 35.14 (37.25, 36.80)
//   M = 1, 28672 × 8192    v8 34.31 (35.97)                  v9 33.69 (36.32)
//   M = 1, 4096 × 14336    v8 13.83 (16.26)                  v9 12.75 (15.10)
//   M = 2, 28672 × 8192    v8 35.69 (37.60)                  v9 35.14 (37.50)
//   M = 2, 8192 × 28672    v8 37.08 (40.00)                  v9 36.26 (38.85)
// At M = 2 the whole row pays only at the shorter K (results/h200/probes/06_m2_whole_row.txt).
// The bench (H200, 2026-12-01T15:37:26Z, commit e88e53f, which took S = 1 up to K = 14336) against
// the run of 1dabe1a (the plan's S), back to back / in a CUDA graph, µs: 14336 × 4096 14.07 /
// 13.33 (S = 2) → 12.06 / 11.39, 8192 × 8192 14.58 / 14.01 (S = 4) → 14.45 / 13.65,
// 4096 × 4096 7.59 / 7.46 (S = 8) → 7.65 / 7.06, but 4096 × 14336 13.03 / 12.73 (S = 8) →
// 13.56 / 12.98; and at 8192 × 28672 tools/gemv_timeline had S = 1 1.3 µs slower both ways. So
// v9 takes S = 1 at M = 2 up to K = 8192 (persistent_gemv.cuh, kWholeRowMaxK2) and otherwise
// keeps the shallow ring's plan, changing only the fold. Past M = 2, and at G other than 128, v9
// is v8 (at M = 4, S = 1 with v4's full pass paid at one shape of four, same file).
//
// The lean pass sums on the tensor cores (persistent_gemv.cuh: x in A, a one-hot B, 16 groups per
// warp, its loads one wavefront each, no zeroing pass), and what the steps need from the tile but
// not from x is set before the wait: 0.3 µs less back to back at 8192 × 28672, where the pass
// covers 224 groups; the other ways around the pass measured were slower
// (results/h200/probes/06_prologue.txt: summing each step's own groups in the step, v5's FP16 fold
// at S = 1, x by one bulk copy per row, x loaded into registers by the pass itself).
//
// The bench (results/h200/history/06_int4_gemv_af27eee.json: H200, 2026-12-01T15:48:04Z) has v9
// below v8 at all 12 shapes with M ≤ 2, by 0.52 to 2.35 µs back to back and 0.64 to 2.36 µs in a
// CUDA graph: 33.50 against 34.02 µs back to back at 28672 × 8192 (84.97% of the copy ceiling),
// 34.24 against 35.31 at 8192 × 28672 (83.1%); in a graph 32.94 against 33.97 µs (86.4%) and 33.82
// against 34.61 (84.2%). As an ordinary launch v9 was 0.4–1.3 µs slower in a graph too
// (results/h200/probes/06_graph.txt), and three ring slots instead of two gained too little at too
// few shapes to keep (the same file).
//
// Expect: back to back faster than v8 at every shape with M ≤ 2, most where v8 splits K across
// blocks at M = 1; one launch at a time still slower than v7 at most shapes (x waits behind the
// ring, as v8). The same DRAM bytes. SASS: v8's, with the BF16 fold's mma (HMMA.16816.F32.BF16)
// for v9's own kernels.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v9(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v9 runs v7's kernels, which run without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_block_split<kOp>(a, stream);  // persistent_gemv.cuh
}

// v9's own kernels: the BF16 fold (mode 0), one n-tile, two stages, balanced or whole tiles. The
// first part, "persistent_kernel", is what the bench matches against the profiled (demangled) name.
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ILi1ELi0E*ELi2ELb0ELi256ELb0ELb0EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS", "HMMA.16816.F32.BF16", "LOP3"}, {"I2F", "I2FP", "LDG.E.128"}, true,
           "the BF16 fold with the shallow ring as a dependent launch: griddepcontrol (ACQBULK, PREEXIT), "
           "cp.async, BF16 mma, LOP3 unpack, no integer→float convert"}};
}

constexpr const char* kSummary =
    "v8 with the K split kept in the block at M = 1 (M = 2: K ≤ 8192) and the BF16 fold's lean Σx "
    "pass at M ≤ 2";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v9_block_split_k", kSummary, gemv_v9<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
