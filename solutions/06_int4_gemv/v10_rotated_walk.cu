// v10_rotated_walk — v9 with every tile's walk along K rotated: the same kernels, the same steps,
// the same bytes, asked of the DRAM in a different order.
//
// Since v9: at 8192 × 28672 (M = 1, S = 1) each block holds four tiles of 112 steps and each of
// its 16 warps a quarter of one, 28 steps. All warps start together and keep nearly the same
// pace, so at any moment the 2112 warps read 128-byte pieces at the same four offsets of 2048
// rows, rows 14336 bytes apart: addresses that agree in their low bits. At 28672 × 8192 the rows
// are 4096 bytes apart and the warps' runs cross tiles, but every tile's walk still starts at
// step 0. A GPU spreads addresses over its memory channels and banks by a hash of their bits;
// thousands of requests that share their low bits load that hash unevenly, and some channels
// queue while others wait. The timeline tool's read-only kernels had shown it first: the weights
// read in v7's pattern of 16 rows × 128 bytes per warp step took 34.0–34.6 µs after the flush,
// front to back 29.2–29.5 (results/h200/probes/06_row_bursts.txt).
//
// Here each tile's walk starts at walk_start(tile) (persistent_gemv.cuh: the tile times 2^16/φ,
// its low 16 bits scaled to [0, iters) by a multiply and a shift) and wraps around. Nothing else
// moves: a warp's run, the tiles' parts, their sums, the workspace; each logical step reads step
// (i + start) mod iters, one add, one compare and one select per copy and per step. Tried first
// on v9 with tools/gemv_timeline (results/h200/probes/06_rotated_walk.txt, H200, 2026-12-01):
// back to back 0.74–0.76 µs faster at 8192 × 28672, 0.51–0.73 at 28672 × 8192, 1.1–1.2 µs at
// 8192 × 8192; one launch after the flush 0.9–1.6 µs at the 70B shapes. Rotating only the runs
// that lie inside one tile (the rest of 28672 × 8192's runs cross a tile) gained about as much at
// 8192 × 28672 and less at 28672 × 8192. A rotation of v8's walk had been measured before, 0.4–0.6 µs
// faster back to back at 8192 × 28672 and slower at M = 8 (06_tile_order.txt part 3); v10 keeps to
// v9's kernels (M ≤ 2, G = 128) and is v8 elsewhere, as v9.
//
// The starts are odd or even. A step reads 128 bytes of each row and the copies' L2::256B hint
// fetches the aligned 256, two steps; a walk that starts at an odd step splits one pair between
// its first step and its last, and the DRAM reads it twice (2.6% and 2.9% over the byte model at
// the 70B shapes, against v9's 1.0% and 1.3%). Starting every walk at an even step (commit cca4c62,
// results/h200/history/06_int4_gemv_cca4c62_even_starts.json) put the bytes back and took the gain
// away: 33.21 against v9's 33.29 µs back to back at 28672 × 8192, 34.25 against 34.25 at
// 8192 × 28672. One reading (not shown directly by the timeline): with every start even, every walk
// asks the DRAM for a new pair on the same steps; with the parity mixed, about half of them ask on
// the others. v10 keeps the odd starts.
//
// The bench (results/h200/history/06_int4_gemv_0d20c3f.json: H200, 2026-12-01T19:33:27Z, commit
// 0d20c3f), against v9 in the same run at M = 1: back to back 32.65 against 33.34 µs at
// 28672 × 8192 (87.5% of the copy ceiling), 33.64 against 34.27 at 8192 × 28672 (84.9%); in a CUDA
// graph 32.04 against 32.95 (89.2%) and 33.18 against 33.87 (86.1%); 1.13 µs less back to back at
// 8192 × 8192. Where the runs do not line up (4096 × 4096, 4096 × 14336, 14336 × 4096) within
// 0.22 µs of v9 either way.
//
// v11_line_prefetch found the cause: the 256-byte pairs themselves. With 128-byte copies v9's
// kernels need no rotation and are faster than v10 (v11_line_prefetch.cu).
//
// Expect: faster than v9 back to back and in a graph at the shapes where the warps' runs line up
// (the 70B shapes and 8192 × 8192, M ≤ 2), within a few tenths elsewhere; DRAM bytes within 2% of
// v9's; as v9 one launch at a time (x waits behind the ring). SASS: v9's, for v10's own (rotated)
// kernels.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v10(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v10 runs v7's kernels, which run without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_block_split<kOp, /*kRotate=*/true>(a, stream);  // persistent_gemv.cuh
}

// v10's own kernels: v9's with the rotated walk (kRotate, the fifth template argument: ...ELb1ELi256ELb0ELb0EE).
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ILi1ELi0E*ELi2ELb1ELi256ELb0ELb0EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS", "HMMA.16816.F32.BF16", "LOP3"}, {"I2F", "I2FP", "LDG.E.128"}, true,
           "v9's kernels with the walk rotated: griddepcontrol (ACQBULK, PREEXIT), cp.async, BF16 mma, "
           "LOP3 unpack, no integer→float convert (the rotation's scaling is a multiply and a shift)"}};
}

constexpr const char* kSummary = "v9 with every tile's walk along K rotated (a hash of the tile), so that "
                                 "the warps reading at the same moment read at different offsets of their rows";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v10_rotated_walk", kSummary, gemv_v10<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
