// v15_block_scales — v14 with the scales copied 8 steps at a time.
//
// Since v14: at each step v14 copies its 16 rows' scales for that step, 4 bytes from each row
// (two groups of 128), one cp.async of 4 bytes per lane. Nsight Compute
// (results/h200/probes/06_whole_lines.txt, part 1) puts a price on that beside its 64 bytes: the
// 16 rows are 16 lines, so 16 L2 requests a step (the weights' 2 KB take 32), and the 4-byte
// copies land in shared memory 16 wavefronts an instruction where 1 would do. v15 copies a block
// of 8 steps' scales at once: 16 rows × 16 groups, 32 bytes of each row, one 16-byte copy per lane
// (lane 2r + h: row r, groups 8h to 8h + 7), into a buffer of the warp's own (two per warp, one
// being read while the next is filled, 1 KB a warp beside the ring). A block starts at a step
// whose first group is a multiple of 16, at a tile's first step, and at the warp's first step;
// the copy goes out with that step's weights, in the same cp.async group, one step ahead of its
// use as the ring's other copies do. Same kernels, steps, layout and placement as v14 otherwise.
//
// Where: the kernels of v9's block split (M ≤ 2, G = 128) where they leave K whole (S = 1), with
// the scales' rows 16-byte aligned (K/128 a multiple of 8: 4096, 8192, 14336, 28672 are) and the
// scales' base too; elsewhere v14's kernels. Split in K (S = 4 at M = 2, 8192 × 28672) the blocks
// were 0.4-0.5 µs slower back to back and 0.3-0.4 µs in a graph in tools/gemv_timeline (H200,
// 2026-12-03). At M = 8 (v8's kernels, S = 2) the blocks were 0.5-0.7 µs slower in tools/gemv_timeline
// (H200, 2026-12-02), so M > 2 keeps v14's.
//
// Bench (results/h200/06_int4_gemv.json: H200, 2026-12-03T13:56Z, commit 58c3917), v15 against v14
// back to back / in a graph: M = 1, 28672 × 8192 31.17 / 30.67 against 31.60 / 31.07 µs; M = 1,
// 8192 × 28672 32.13 / 31.69 against 32.42 / 32.00; M = 2, 28672 × 8192 32.46 / 31.94 against
// 32.99 / 32.35; one launch at a time level (0.05 µs faster to 0.14 slower); the DRAM bytes 0.1-0.3%
// over the model. The run before (history/06_int4_gemv_87c1cce.json, the same kernels): 0.20-0.42 µs
// faster back to back, 0.20-0.45 in a graph.
//
// Measured first as tiled scales (06_whole_lines.txt part 2, a layout of their own, 64 bytes a
// step): the scales' requests and wavefronts were most of what that probe took away.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v15(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kOp.tiled && !kOp.zero_points, "v15 reads the tiled layout, without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  // The blocks where they apply (M ≤ 2, G = 128, S = 1, the scales' rows 16-byte aligned: the
  // header above), v14's kernels elsewhere: launch_block_split decides.
  return launch_block_split<kOp, /*kRotate=*/false, /*kPrefetch=*/128, /*kEvictFirst=*/true, /*kBlockScales=*/true>(
      a, stream, /*consecutive=*/true);
}

// v15's own kernels (persistent_blk_kernel, the BF16 fold): v14's instructions, and no 4-byte
// copy left (LDGSTS.E$: the plain opcode, not its 16-byte variants): the scales come 16 bytes a lane.
// Elsewhere it runs v14's kernels, named too (the bench's profiler pass matches a launch's kernel
// against the facts' names).
std::vector<SassFact> facts() {
  return {{"persistent_blk_kernel*ILi1ELi0E*ELi2ELb0ELi128ELb1ELb1EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC128B.128", "HMMA.16816.F32.BF16", "LOP3"},
           {"LDGSTS.E$", "LDGSTS.E.ZFILL", "LDGSTS.E.BYPASS.LTC256B", "I2F", "I2FP", "LDG.E.128"}, true,
           "v14's fold with the scales copied 8 steps at a time: 16-byte copies only (no 4-byte LDGSTS.E), "
           "griddepcontrol, mma.sync, LOP3 unpack, no integer→float convert, no spill"},
          {"persistent_kernel*ELi2ELb0ELi128ELb1ELb1EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC128B.128", "HMMA", "LOP3"},
           {"LDGSTS.E.BYPASS.LTC256B", "I2F", "I2FP", "LDG.E.128"}, true,
           "where the blocks do not apply (M > 2, G = 64, K split (S > 1), unaligned scales): v14's kernels, unchanged"}};
}

constexpr const char* kSummary = "v14 with the scales copied 8 steps at a time, 16 bytes a lane, into a "
                                 "buffer of the warp's own: fewer L2 requests and shared wavefronts per step";
const Register kRegistered{gemv_version(kInt4tGemv, "v15_block_scales", kSummary, gemv_v15<kInt4tGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
