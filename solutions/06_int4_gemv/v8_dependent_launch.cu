// v8_dependent_launch — v7's kernel launched as a programmatic dependent of the kernel before it
// in the stream (Hopper's PDL): its launch, its setup and the first weights it copies overlap
// the end of that kernel.
//
// Since v7: at M = 1, 28672 × 8192 v7's weights stream at about the copy ceiling from its first
// step to its last, and what the bench's time holds besides are the ends: the launch (an empty
// kernel of the same shape, events around it after the flush: 2.8 µs), the setup before x is
// issued (0.8 µs), x's round trip and its conversion to FP16 (2 µs), the first stage's round
// trip, and at the end the warps that finish after the others. A decoder runs its kernels back
// to back in one stream, and on an H200 even there an empty kernel of this shape (227 KB of
// shared memory per block) takes 3.6–4.8 µs per launch when 20 are queued one after another
// (tools/gemv_timeline.cu): the next kernel's blocks go out only once the last block of the one
// before has exited. A kernel that only reads the same 112 MB of weights takes 29.4 µs after the
// flush and 27.0 µs back to back: the bytes alone leave room for 85% of the ceiling; v7's ends
// do not.
//
// Programmatic dependent launch (sm_90, the launch attribute
// cudaLaunchAttributeProgrammaticStreamSerialization) lets the runtime start a kernel before the
// one ahead of it in the stream has finished: once every block of that kernel has executed
// griddepcontrol.launch_dependents (or exited), the dependent's blocks are scheduled as SMs free
// up, and griddepcontrol.wait in the dependent returns once the kernel before has completed and
// its writes are visible. What may come before the wait is only what does not depend on that
// kernel: here the weights and scales (inputs no kernel of a decoder's layer writes), never x
// (the previous kernel's output), y or the split-K workspace (the previous GEMV may still be
// using them). So v8 issues its ring's first stage first, lets its own dependents go
// (launch_dependents), waits, and only then copies x; the rest is v7. Without the attribute,
// or when the kernel before is not a dependent-aware one (the bench's L2 flush), the wait returns
// at once and the only change is the order: the ring's first stage before x, which costs time
// there (v7's section of the book: x lands later).
//
// Bringing further steps into L2 before the wait (cp.async.bulk.prefetch.L2) was tried and made
// every shape slower, more with every step prefetched (2 to 31 steps per warp; the H200,
// 2026-11-30, results/h200/probes/06_dependent_launch.txt): the same queues v7 shortened fill
// up again.
//
// The bench times every version both ways: each launch alone after an L2 flush (time_us), and
// back to back (back_to_back_us: 20 launches between two events over rotated copies of the
// inputs, nothing between them), the way a decoder's stream runs them. v8 is for the second.
//
// Expect: back to back faster than v7 at every M and shape that fills the GPU, most where v7's
// start is long (M = 8); alone after the flush slower than v7 (x after the ring). SASS: as v7,
// plus the grid-dependency control instructions on sm_90a.
#include "persistent_gemv.cuh"

namespace lkw::gemv {
namespace {

using namespace persistent;

template <const GemvOp& kOp>
Status gemv_v8(const GemvArgs& a, cudaStream_t stream) {
  static_assert(!kOp.zero_points, "v8 runs v7's kernels, which run without zero points");
  Status s = Check().aligned(a.scales, 4, "scales").status();  // copied in 4-byte words
  if (s.ok()) s = validate_gemv(kOp, a, 16);
  if (!s.ok()) return s;
  return launch_shallow<kOp>(a, stream, /*pdl=*/true);
}

std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2EE", {"sm_90a"}, {"ACQBULK", "PREEXIT", "LDGSTS", "HMMA", "LOP3"}, {"I2F", "I2FP", "LDG.E.128"},
           true,
           "v7's kernel (cp.async, mma.sync, LOP3, no integer→float convert) with griddepcontrol.wait "
           "(ACQBULK) and launch_dependents (PREEXIT) on sm_90a"}};
}

constexpr const char* kSummary =
    "v7 launched as a programmatic dependent: its launch and first weight copies overlap the kernel before";
const Register kRegistered{
    gemv_version(kInt4iGemv, "v8_dependent_launch", kSummary, gemv_v8<kInt4iGemv>, facts())};

}  // namespace
}  // namespace lkw::gemv
