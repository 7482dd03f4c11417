// v12_tiled_weights — v11's kernels reading the weights stored in the order they are read: a new
// op, int4t_gemv, whose words are int4i_gemv's repacked once, offline, as
// [tile of 16 rows][step of 256 k][row][32 words] (int4_gemv.cuh's tiled_word;
// lkw.gemv.tile_weights in Python).
//
// Since v11: at every step a warp of v11 copies 128 bytes from each of its tile's 16 rows, and
// the rows lie K/2 bytes apart (14 KB at K = 28672). The DRAM sees 2 KB asked for in 16 places at
// once, every warp of the GPU doing the same at its own 16 places. In the tiled layout those
// 2 KB are one contiguous block and the next step's block follows it: a warp streams through
// memory as a copy kernel does. Nothing else changes: the same copies (one 16-byte cp.async per
// lane and chunk, 128-byte lines), the same unpack, mma, fold, splits and dependent launch, the
// same bytes; only the address of each copy (persistent_gemv.cuh, kTiled: the tile's block, then
// 2 KB per step where the rows advance 128 bytes).
//
// Marlin and the other fast W4A16 kernels store their weights so too: in the order the kernel
// consumes them, repacked once when the model is loaded. The price is a layout of its own: the
// words are no longer chapter 02's rows, hence a new op with its own reference (lkw.gemv
// un-tiles and calls int4i_gemv's) and its own checks of the shape (padded to whole tiles of 16
// rows and whole steps of 256 k; the padding is never written out: rows past N are computed and
// dropped, k past K meets zero x).
//
// Measured first with tools/gemv_timeline (results/h200/probes/06_tiled_layout.txt, H200,
// 2026-12-01, v11's kernel with the probe's addresses, the same words uploaded permuted; µs, back
// to back): 32.35–32.37 against 33.21–33.22 at 8192 × 28672 and 31.91–31.97 against 32.18–32.36 at
// 28672 × 8192, M = 1; about 0.1 µs at 8192 × 8192 and 4096 × 14336, where the rows are short.
//
// Expect: faster than v11 where the rows are long (K = 14336 and 28672 most), about the same where
// they are short; the DRAM bytes of the model, as v11's. SASS as v11's: LDGSTS.E.BYPASS.LTC128B,
// no LTC256B, griddepcontrol, BF16 mma and LOP3 unpack, no integer→float convert.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v12(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kOp.tiled && !kOp.zero_points, "v12 reads the tiled layout, without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_block_split<kOp, /*kRotate=*/false, /*kPrefetch=*/128>(a, stream);  // persistent_gemv.cuh
}

// v12's kernels: every instantiation with the 128-byte prefetch, the tiled weights and no cache
// policy (the last three template arguments, ...ELi128ELb1ELb0EE); the second fact its BF16 fold at
// M ≤ 2 (v9's kernels).
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2ELb0ELi128ELb1ELb0EE", {"sm_90a"},
           {"ACQBULK", "PREEXIT", "LDGSTS.E.BYPASS.LTC128B.128", "HMMA", "LOP3"},
           {"LDGSTS.E.BYPASS.LTC256B", "I2F", "I2FP", "LDG.E.128"}, true,
           "v11's kernels on the tiled weights: LDGSTS...LTC128B, none with LTC256B, griddepcontrol "
           "(ACQBULK, PREEXIT), mma.sync, LOP3 unpack, no integer→float convert"},
          {"persistent_kernel*ILi1ELi0E*ELi2ELb0ELi128ELb1ELb0EE", {"sm_90a"}, {"HMMA.16816.F32.BF16"}, {}, true,
           "the BF16 fold of v9's kernels (M ≤ 2, G = 128) on the tiled weights"}};
}

constexpr const char* kSummary = "v11's kernels on weights repacked once into the order they are read "
                                 "(tiles of 16 rows, steps of 256 k): each warp step 2 KB of contiguous "
                                 "memory instead of 16 rows' 128 bytes";
const Register kRegistered{
    gemv_version(kInt4tGemv, "v12_tiled_weights", kSummary, gemv_v12<kInt4tGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
