// v4_persistent_smem_x — one block per SM, x staged once in shared memory, everything a step
// reads prefetched through the ring, the −8 folded into a per-group correction.
//
// Since v3: Nsight Compute on v3 at M = 1, 28672 × 8192 finds the warps stalled most of the time
// on the first mma of each iteration, waiting for the x fragments: v3 loads x (and the scales)
// from global memory through L1 in the iteration that uses them, so every iteration waits for
// an L2 round trip that nothing covers. Every lane loads x, although at M = 1 seven of the eight
// B columns are thrown away, so L1 carries twice the weights' bytes in x. Three changes remove
// what stands between the weights and the tensor cores:
//
// 1. x in shared memory, once. A block is 16 warps, one per SM (a persistent grid of #SM
//    blocks). It copies its K slice of x (M rows) into shared memory before anything else and
//    keeps it for all its tiles; a step reads its fragments from there (LDS, no L2 round trip).
//    The rows are swizzled in 16-byte units so that the eight lanes of a 16-byte LDS phase (two
//    rows g, four lanes t) hit eight different bank groups: chunk c of row r sits at
//    (c & ~7) | ((c & 7) ^ (2·bit 3 of c) ^ (r & 1)). At M = 1 all rows are row 0: a broadcast.
// 2. The scales (and zero points) ride in the ring with the weights: each stage holds a warp's
//    weights (2 KB), the scales of its 16 rows for the step (4-byte cp.async of the aligned words
//    around them) and the zero-point words. A step waits for its stage, and that is all it
//    waits for.
// 3. The bias folded out (G = 128, no zero points): A is 128 + q, the magic-number value before
//    chapter 02's subtraction, so the unpack is one LOP3 (and a shift) per pair and nothing else.
//    Σ x·(q − 8) = Σ x·(128 + q) − 136·Σ x, and Σ x over a group is the same for every row:
//    the block computes it once per group and row of x (in FP32) when it stages x, and a step
//    subtracts 136 times it from each group's FP32 sum before the scale. The products are exact
//    (8 × 8 significant bits), the FP32 sums carry ~17× the magnitude of the unbiased ones, and
//    their rounding stays orders of magnitude inside the tolerance (reference/lkw/gemv.py).
//    With G < 128 or zero points the weights are scaled in A as in v3.
//
// Work: a warp owns whole tiles of 16 rows × its split's K and takes them in a fixed order
// (tile b + B·(w + 16·n) for block b of B in its split, warp w); its ring streams across tile
// boundaries, so a new tile starts with its weights already in flight. Split-K (the same
// workspace and deterministic last-arriver sum as v3) for two reasons: the x slice must fit next
// to the ring (M × K/S × 2 bytes), and few tiles must still give most warps work. From the
// smallest S that fits x the host takes the S that minimizes a model of the busiest block's time
// (mma::plan_splits: its tiles' steps, or its warps' chains when too few are busy), which also
// weighs how evenly the tiles fall on the blocks. M > 8 uses two n-tiles and scales in A: the
// fold's second set of sums would not fit in 128 registers.
//
// Expect: no waits on global memory inside the loop (the stalls move to the unpack's ALU work,
// the mma chains and plain issue); faster than v3 from M = 2 up at the large shapes and far
// faster at M = 16, whose x traffic v3 pays per tile; at M = 1 still short of the bound, because
// a step's unpack (7 ALU instructions per word of 8 weights) and bookkeeping for 4096 weights,
// with one tile per warp and 14–16 warps per SM, cannot be issued as fast as HBM delivers them;
// slower than v3 at the small shapes, where staging x is a visible part of a few microseconds.
// DRAM bytes within a few % of the model at M ≤ 8 (x is read once per block, from L2); at M = 16
// the split-K partial sums add to it.
// SASS: the weights, x, scales and zero points as LDGSTS, HMMA, no I2F, no local memory; the
// G = 128, M ≤ 8 kernel has no packed-BF16 arithmetic at all.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v4(const GemvArgs& a, cudaStream_t stream) {
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  const bool two_tiles = a.m > 8;
  if constexpr (kOp.zero_points) {
    return two_tiles ? launch<2, kZeroPoints>(kOp, a, stream)
                     : launch<1, kZeroPoints>(kOp, a, stream);
  } else {
    // The fold keeps a second set of sums per n-tile: with two n-tiles that no longer fits in
    // the 128 registers a thread of a 512-thread block may have (ptxas spills), so M > 8 scales
    // in A.
    if (two_tiles) return launch<2, kScaleInA>(kOp, a, stream);
    return a.group == 128 ? launch<1, kFold>(kOp, a, stream)
                          : launch<1, kScaleInA>(kOp, a, stream);
  }
}

// "persistent_kernel*ELi256ELb0ELb0EE" names every instantiation of the kernel v4 and v5 share with the
// 256-byte prefetch (all but v11's; so the instruction mix the SASS check records for either is
// that of all of them).
std::vector<SassFact> facts(bool zero_points) {
  std::vector<SassFact> f = {{"persistent_kernel*ELi256ELb0ELb0EE", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "LDGSTS.E.ZFILL", "HMMA", "LOP3"},
           {"I2F", "I2FP", "LDG.E.128"}, true,
           "weights, x, scales and zero points all through cp.async (LDGSTS; no 16-byte LDG), "
           "mma.sync (HMMA), LOP3 unpack, no integer→float convert"}};
  if (!zero_points)  // the kernel the op without zero points runs at G = 128, M ≤ 8
    f.push_back({"persistent_kernelILi1ELi0E", {}, {"HMMA"}, {"HADD2", "HFMA2", "HMUL2"}, true,
                 "G = 128: the bias folded into the per-group correction, no packed-BF16 arithmetic"});
  return f;
}

constexpr const char* kSummary =
    "one block per SM, x staged in shared memory, scales in the cp.async ring, bias folded out";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v4_persistent_smem_x", kSummary, gemv_v4<kInt4iGemv>, facts(false))};
const Register kRegisteredZp{
    gemv_version(kInt4iZpGemv, "v4_persistent_smem_x", kSummary, gemv_v4<kInt4iZpGemv>, facts(true))};

}  // namespace
}  // namespace lkw::gemv
