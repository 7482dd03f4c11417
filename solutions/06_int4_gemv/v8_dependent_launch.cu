// v8_dependent_launch — v7's kernel launched as a programmatic dependent of the kernel before it
// in the stream (Hopper's PDL): its launch, its setup and the first weights it copies overlap
// the end of that kernel.
//
// Since v7: at M = 1, 28672 × 8192 v7's weights stream at about the copy ceiling from its first
// step to its last, and what the bench's time holds besides are the ends: the launch, the setup
// before x is issued (0.8 µs), x's round trip and its conversion to FP16 (about 2 µs), the first
// stage's round trip, and at the end the warps that finish after the others (tools/gemv_timeline,
// results/h200/probes/06_gemv_timeline.txt, commit 358fb3d). Those ends are the kernel's, not the
// bytes': a kernel that only reads the same 117 MB of weights takes 29.5–29.9 µs after the flush
// and 27.3–27.6 µs back to back (same file): 92% of the ceiling and more. A decoder runs its
// kernels back to back in one stream, and even there a kernel's blocks go out only once the last
// block of the one before has exited, and its start (setup, x, the first round trip) follows.
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
// Tried and dropped (results/h200/probes/06_dependent_launch.txt, the H200, 2026-11-30): bringing
// further steps of each warp into L2 (cp.async.bulk.prefetch.L2), before the wait or after it,
// 1 to 31 steps: slower with every step, both ways of timing (the queues v7 shortened fill up
// again); both ring stages filled before x: no change. In the back-to-back timeline (marks of
// the last of three launches) v8's blocks enter as the blocks before them exit, and leave the
// wait about 1.5 µs after the last of those has exited; x, its conversion and the first stage
// take 2.5 µs more.
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
  if (Status s = validate_persistent(kOp, a); !s.ok()) return s;
  return launch_shallow<kOp>(a, stream, /*pdl=*/true);
}

std::vector<SassFact> facts() {
  return {{"persistent_kernel*ELi2ELb0ELi256ELb0ELb0EE", {"sm_90a"}, {"ACQBULK", "PREEXIT", "LDGSTS", "HMMA", "LOP3"}, {"I2F", "I2FP", "LDG.E.128"},
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
