// v7_shallow_ring — v5's kernel with a ring of two stages per warp instead of four (three with
// two n-tiles), the split count planned for it, and a partial last round cut at half tiles.
//
// Since v6: tools/gemv_timeline.cu showed where M = 8 loses against M = 1. Before its first step a
// warp waits 7 to 9 µs at M = 8 (4 to 5 at M = 1): the copies of its ring's first stages are
// issued only 5 to 6 µs after the kernel starts, behind the block's x slice. After its last step
// a warp that finishes a tile through the split-K workspace at S = 8 needs 5 to 8 µs from its
// count to its stores, and taking that apart (the H200, 2026-11-30, uncommitted experiments on top
// of commit 89d9d32) showed no single culprit: without the acquire fence, without the discards,
// with the loads of all splits in flight at once, even with no loads at all, the stores alone
// came 3.3 µs (median) after the count. Every one of those accesses waits in the same queues as
// the weights' copies.
//
// Those queues are long because the ring is deep. Little's law: the bytes in flight equal the
// bandwidth times the latency. A warp of v4 to v6 keeps three steps (2 KB each) in flight, 16
// warps per SM, 132 SMs: about 13 MB, where 4.2 TB/s times a microsecond of unloaded latency is
// about 4 MB. The rest does not make DRAM faster; it waits in queues, and so does anything
// else the SM asks for (the x slice, the partial sums, the counters). With one step in flight
// per warp (about 4 MB in all), the same weights arrive as fast and the other accesses wait less.
// A sweep of the timeline tool (uncommitted, on top of commit 89d9d32; whole tiles and balanced
// steps, every S, two and three stages; results/h200/probes/06_ring_depth_sweep.txt) gave at
// M = 8 and 8192 × 28672 42.50 µs with two stages at S = 4, where the unchanged kernel took
// 49.02 µs in the same session (v6's choice: four stages, S = 8); at M = 1 and 28672 × 8192
// 35.84 µs against 38.05 µs. Five stages, tried on v4, were slower than four (the book's v6
// section).
//
// The smaller ring also leaves more shared memory for x, so fewer splits fit (S = 4 at M = 8,
// 8192 × 28672, where v4 to v6 needed 8; S = 8 at M = 16 instead of 16), and the split count's
// model changes: with one step in flight a warp cannot stream on its own, a block streams at full
// rate only while all 16 warps are busy, so its tiles go in whole rounds of 16
// (mma::rounds_time), plus the x slice and, with S > 1, a cost per round for the tiles' finish
// through the workspace (two weights fitted to the sweep). The sweep's best S at each of the
// eight (M, shape) pairs it covered is the one the model picks, or within 1 µs of it.
//
// What whole tiles still leave uneven is the last round of a block when it is partial: at
// 28672 × 8192 and S = 1 a block holds 13 or 14 tiles for 16 warps, four warps' worth on two
// schedulers and three on the others. v6's balanced steps (every warp the same number of steps,
// cut anywhere) measured no better with the shallow ring in the sweep: nearly every tile is cut
// and summed after the loop. v7 cuts at half tiles instead (persistent::run_start with
// half_cuts): the block's 2T halves shared out over the 16 warps, at most one half apart, so 14
// tiles become 12 whole tiles and two tiles in halves, 3.5 tiles per scheduler, and only the two
// cut tiles wait for the block's barrier after the loop. It does so where its plan gives S = 1
// and T is not a multiple of 16 (persistent::v7_halves); with S > 1 the balanced kernel counts
// its splits after the loop, which the finish measurements above say not to do (and half
// tiles at S > 1 measured slower, with the counts deferred or not: the book's v7 section). In
// the timeline tool (H200, 2026-11-30, two runs each, uncommitted on top of commit f63b5ae,
// results/h200/probes/06_v7_half_tiles.txt) at 28672 × 8192:
// 35.84–36.00 µs against 36.10 at M = 1, 37.76–37.79 against 38.43–38.62 at M = 2, 39.97–40.06
// against 42.02–42.37 at M = 4. At M = 1 the window from the first step to the last then holds
// the weights at about the ceiling; what is left is the start and the launch.
//
// Expect: faster than v6 at most shapes, most at M = 8 and 16 and where K is long, and at M = 2
// and 4 where the half tiles apply; the same DRAM bytes as v5. SASS: as v5 (the FP16 fold's mma
// in FP16, no integer→float convert, copies through cp.async).
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v7(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v7 runs v5's kernels, which run without zero points");
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_shallow<kOp>(a, stream);  // v5's choice of mode, two stages, plan_rounds
}

// The first fact names v7's kernels only (two stages, the walk not rotated, the 256-byte
// prefetch, rows, no cache policy: ...ELi2ELb0ELi256ELb0ELb0EE; whole or half tiles).
std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2ELb0ELi256ELb0ELb0EE", {}, {"LDGSTS.E.BYPASS.LTC256B.128", "LDGSTS.E.ZFILL", "HMMA", "LOP3"},
           {"I2F", "I2FP", "LDG.E.128"}, true,
           "weights, x, scales through cp.async (LDGSTS; no 16-byte LDG), mma.sync (HMMA), LOP3 "
           "unpack, no integer→float convert"},
          {"persistent_kernelILi1ELi3E*ELi2ELb0ELi256ELb0ELb0EE", {}, {"HMMA.16816.F32", "F2FP", "LOP3", "LDGSTS"},
           {"HMMA.16816.F32.BF16", "I2F", "I2FP", "LDG.E.128"}, true,
           "the FP16 fold: mma on FP16 (no BF16 HMMA), x converted by F2FP, LOP3 unpack, no "
           "integer→float convert, the copies through cp.async"}};
}

constexpr const char* kSummary =
    "v5 with one step in flight per warp instead of three: shorter queues, S in whole rounds, half tiles";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v7_shallow_ring", kSummary, gemv_v7<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
