// v13_consecutive_tiles — v12's kernels with each block's tiles next to one another in memory,
// instead of `blocks` tiles apart.
//
// Since v12: the persistent grid hands out tiles round robin. Block b of 132 holds tiles b,
// b + 132, b + 264, ...; at M = 1 and 28672 × 8192 that is 13 or 14 tiles of 64 KB (16 rows of
// 4 KB in the tiled layout), each 8.4 MB from the next, and the block's 16 warps read in 13 or 14
// places of a 117 MB tensor. Nothing in the kernel needs that order: a block's steps are cut
// evenly over its warps whichever tiles they are, and every tile is summed inside its block. v13
// gives block b the tiles first, first + 1, ... (first = b·base + min(b, extra), the same counts
// as before): one run of 0.9 MB, read by its warps in 16 pieces. Same kernels, same steps per
// warp, same bytes; only the tile a block starts from and the stride to its next (p.consecutive,
// persistent_gemv.cuh).
//
// Measured first with tools/gemv_timeline (results/h200/probes/06_tile_placement.txt, H200,
// 2026-12-02, v12's kernel with the placement switched by a macro; two commands, means of two and
// three rounds, µs in a CUDA graph): 0.34–0.39 faster at M = 1, 28672 × 8192 (14 or 13 tiles a
// block), 0.42–0.50 at M = 2 there, 0.17 at 14336 × 4096 (6 or 7 tiles), about 0.1 at 8192 × 8192
// and 4096 × 14336, 0.0–0.14 at 8192 × 28672 (3 or 4 tiles), level past M = 2 (S > 1: each split
// spreads its blocks over all tiles, whichever order). The gain grows with the tiles a block
// holds. What in the memory system charges for the spread (DRAM pages, address translation, L2)
// the probe does not tell apart. The same probe cut the steps of all tiles evenly over the blocks
// instead (no block with a 14th tile), the tiles shared by two blocks summed through global
// memory: 1.5–2.8 µs slower, the meetings' round trips at the end of the run costing far more
// than the balance gave.
//
// The bench (results/h200/history/06_int4_gemv_ad7d2d5.json: H200, 2026-12-02T03:25:15Z, commit ad7d2d5), v13 against
// v12 in the same run, M = 1, 28672 × 8192: 35.97 against 36.53 µs one launch at a time, 31.91
// against 32.47 back to back (89.2% of the copy ceiling), 31.24 against 31.84 in a graph (91.2%);
// at M = 2 there 0.38 to 0.70 µs faster; at 8192 × 28672 level back to back and in a graph;
// elsewhere from 0.42 µs faster to 0.37 µs slower. DRAM bytes within 2.5% of the model. Adding the
// field moved the other kernels of the header little (the probe's part 4: v12's within 0.07 µs,
// v11's within 0.2).
//
// So v13 is v12's launch (persistent::launch_block_split on the tiled weights, 128-byte copies)
// with consecutive = true: at M ≤ 2 and G = 128, where the balanced kernel runs (S = 1), the
// blocks hold consecutive tiles; elsewhere (S > 1, whole tiles per warp; past M = 2 v8's kernels)
// it is v12.
//
// Expect: faster than v12 at M ≤ 2 where a block holds many tiles (28672 × 8192 most), level
// where it holds few and past M = 2; the DRAM bytes of the model, as v12's. SASS as v12's (the
// same kernels).
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v13(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kOp.tiled && !kOp.zero_points, "v13 reads the tiled layout, without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_block_split<kOp, /*kRotate=*/false, /*kPrefetch=*/128>(a, stream, /*consecutive=*/true);
}

// v13's kernels are v12's (the placement is a launch parameter): the same facts.
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2ELb0ELi128ELb1ELb0EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC128B.128", "HMMA", "LOP3"},
           {"LDGSTS.E.BYPASS.LTC256B", "I2F", "I2FP", "LDG.E.128"}, true,
           "v12's kernels: LDGSTS...LTC128B, none with LTC256B, griddepcontrol (ACQBULK, PREEXIT), "
           "mma.sync, LOP3 unpack, no integer→float convert"},
          {"persistent_kernel*ILi1ELi0E*ELi2ELb0ELi128ELb1ELb0EE", {"sm_90a"}, {"HMMA.16816.F32.BF16"}, {}, true,
           "the BF16 fold of v9's kernels (M ≤ 2, G = 128) on the tiled weights"}};
}

constexpr const char* kSummary = "v12's kernels with each block's tiles consecutive in memory "
                                 "instead of strided by the grid: one run of memory per block";
const Register kRegistered{
    gemv_version(kInt4tGemv, "v13_consecutive_tiles", kSummary, gemv_v13<kInt4tGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
