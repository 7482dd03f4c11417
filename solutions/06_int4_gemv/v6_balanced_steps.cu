// v6_balanced_steps — v5 with the block's steps shared out evenly over its 16 warps, whatever
// tiles they fall in.
//
// Since v5: tools/gemv_timeline.cu records when each warp of v5's kernel passes its marks. At
// M = 1, 28672 × 8192 the 1792 tiles give an SM 13 or 14 busy warps: three or four per scheduler
// (warp index mod 4), and the warps of the schedulers with four end about 4 µs after the others,
// while the SM's last two or three warps have nothing to do from the start. At M = 4 and 8 a warp
// holds one or two tiles of its split: the warps with two are still streaming long after those
// with one have stopped. A warp owning whole tiles makes the SM's share of the work lumpy, in
// steps of a whole tile (32 steps at K = 8192), and the last lump sets the time.
//
// A block holds T tiles (block b of B in its split: tiles b + B·j), T·iters steps in all. Warp w
// takes steps ⌊w·T·iters/16⌋ to ⌊(w + 1)·T·iters/16⌋ of them, in order, across tile boundaries;
// every warp gets the same number of steps, give or take one. Its ring streams through them as
// v4's does through whole tiles. A tile whose steps all fall to one warp is stored as before. A
// tile split between warps leaves a partial sum with each: the warp that holds the tile's first
// step keeps its part in registers; the others (their runs start inside the tile) keep theirs in
// registers until their loop ends and then write them into their own ring, whose copies are done;
// after one __syncthreads the first warp adds the others' in warp order, so the sum is the same
// from launch to launch, and stores the tile (through split-K when S > 1). A warp has at most one
// part of each kind, so the cost is 4 (or 8) registers, one barrier and a few shared-memory reads
// per block.
//
// With the work even, the split count's model changes (mma::plan_splits, balanced): a warp's chain
// is its share of the block's steps, not ⌈T/16⌉ whole tiles, so S = 1 becomes the usual choice;
// and it now weighs the block's x slice too (staged before the first step; one step's time per
// 2 KB, fitted): at 8192 × 28672 and M = 1, S = 1 stages 57 KB of x per block, and the median
// warp's first step came 2.95 µs later than with S = 4.
//
// With S > 1 the splits' counts move too: v4 counts a tile's split-K arrival after a
// __threadfence when the tile ends, a bubble in the warp's ring that falls alike on every warp;
// with tiles ending anywhere in a run the bubbles set a block's warps apart, so v6 (one n-tile)
// writes a tile's partials when it ends and counts up to three tiles after one fence, at the
// latest after the loop.
//
// Balancing has a price: after the loop a block waits for its last warp, sums its cut tiles and,
// with S > 1, counts and sums the splits, round trips to L2 that nothing hides. Where v5's whole
// tiles already fall evenly on the schedulers that price buys nothing (the bench run of commit
// 433965d, which ran the balanced kernel at every shape: 37.58 µs for v5 against 40.93 at
// 8192 × 28672, M = 1, with 8 tiles per block on 16 warps, two per scheduler). So v6 chooses per
// shape (persistent::v6_balances): it compares the model of whole tiles seen scheduler by
// scheduler (mma::whole_tiles_time) at v5's plan with the balanced model at its own, and runs
// v5's kernel and plan where balancing is not strictly faster.
//
// Expect: v6 as fast as the faster of v5 and the balanced kernel at most shapes; the balanced
// kernel where v5's warps held uneven numbers of tiles (28672 × 8192 at M = 1 to 4 and 16,
// 14336 × 4096 up to M = 8), v5's kernel where N is small beside K. The same DRAM bytes as v5.
// SASS: as v5 (the FP16 fold's mma in FP16, no integer→float convert), plus the block barrier
// after the loop.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v6(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v6 balances v5's kernels, which run without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_v5_modes<kOp, true>(a, stream);  // v5's choice of mode; balanced where it pays
}

std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi256ELb0ELb0EE", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "LDGSTS.E.ZFILL", "HMMA", "LOP3", "BAR.SYNC"},
           {"I2F", "I2FP", "LDG.E.128"}, true,
           "weights, x, scales through cp.async (LDGSTS; no 16-byte LDG), mma.sync (HMMA), LOP3 "
           "unpack, no integer→float convert; the block barrier before the split tiles are summed"},
          {"persistent_kernelILi1ELi3ELb1E", {}, {"HMMA.16816.F32", "F2FP", "LOP3", "LDGSTS"},
           {"HMMA.16816.F32.BF16", "I2F", "I2FP", "LDG.E.128"}, true,
           "the FP16 fold: mma on FP16 (no BF16 HMMA), x converted by F2FP, LOP3 unpack, no "
           "integer→float convert, the copies through cp.async"}};
}

constexpr const char* kSummary =
    "v5, with the block's steps shared evenly over its warps where whole tiles fall unevenly";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v6_balanced_steps", kSummary, gemv_v6<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
