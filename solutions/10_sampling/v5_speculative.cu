// v5_speculative — speculative decoding's verification in one kernel: a block per request walks
// its S draft tokens, accepting each with probability min(1, p/q), and at the first rejection
// draws the replacement from max(0, p − q) renormalized; with every draft accepted, the bonus token
// from the target's last row.
//
// Since v3: a new op, rejection_sample. The test u < p/q is written u·q < p (no division; a
// draft of q = 0 is accepted iff p > 0, as the limit says). Draw s of the row's Philox stream is
// the acceptance test of draft s, draw S the last token's, whatever the outcome, so a run replays
// and the reference (lkw.sampling.rejection_sample) reproduces it. The residual is never stored:
// the prefix search (select.cuh) reads p and q and subtracts as it goes. Why this samples exactly
// from p (the guarantee that makes drafts free): P(x) = min(q, p) + (1 − Σ min(q, p))·r(x), and
// (p − q)⁺ / Σ (p − q)⁺ = r, so the two terms sum to p. A draft token outside 0..V−1 is rejected.
// Expect: the drafts are a gather of 2·S floats; the bytes are the one or two rows the last
// token reads (p, and q at a rejection): at B = 1 one SM reads them.
// SASS: the prefix search's shuffles; no division.
#include "select.cuh"

namespace lkw::sampling {
namespace {

constexpr int kThreads = 512, kItems = 16;
using Search = PrefixSearch<kThreads, kItems>;

__global__ void __launch_bounds__(kThreads) speculative_kernel(RejectionArgs a) {
  __shared__ typename Search::Shared search_sh;
  const int64_t row = blockIdx.x, s_count = a.s, v = a.v;
  const float* q_row = a.q + row * s_count * v;        // (B, S, V)
  const float* p_row = a.p + row * (s_count + 1) * v;  // (B, S + 1, V)
  const int32_t* drafts = a.draft + row * s_count;     // (B, S)
  RowStream stream(a.seed_offset, row);

  // Stage: the drafts in order, up to the first rejection (every thread decides the same).
  int64_t n = 0;
  bool stopped = false;
  float u_last = 0.0f;
  for (int64_t s = 0; s <= s_count; ++s) {
    const float u = stream.uniform();
    if (s == s_count) {
      u_last = u;
    } else if (!stopped) {
      const int32_t x = drafts[s];
      // BEGIN SOLUTION: v5 — accept draft s iff u·q < p at its token (out of range: rejected)
      const bool in_range = x >= 0 && x < v;
      const bool accept = in_range && __fmul_rn(u, q_row[s * v + x]) < p_row[s * v + x];
      // STUB: const bool accept = in_range;
      // END SOLUTION
      if (accept) ++n;
      else stopped = true;
    }
  }

  // Stage: the last token, from the residual (p − q)⁺ at the rejection, else the bonus row p_S;
  // a residual of no mass (q >= p everywhere) falls back to p itself.
  const float* p_n = p_row + n * v;
  const float* q_n = q_row + (n < s_count ? n : 0) * v;
  const bool bonus = n == s_count;
  auto residual = [&](int64_t i) { return bonus ? p_n[i] : fmaxf(__fsub_rn(p_n[i], q_n[i]), 0.0f); };
  auto target = [&](int64_t i) { return p_n[i]; };
  float total = Search::totals(search_sh, v, residual);
  int64_t last;
  if (total > 0.0f) {
    last = Search::search<true>(search_sh, v, __fmul_rn(u_last, total), residual);
  } else {
    total = Search::totals(search_sh, v, target);
    last = Search::search<true>(search_sh, v, __fmul_rn(u_last, total), target);
  }

  // Stage: the accepted drafts, the last token, then −1.
  for (int64_t s = threadIdx.x; s <= s_count; s += kThreads)
    a.tokens[row * (s_count + 1) + s] = s < n ? drafts[s] : s == n ? int32_t(last) : -1;
  if (threadIdx.x == 0) a.accepted[row] = int32_t(n);
}

Status rejection_v5(const RejectionArgs& a, cudaStream_t stream) {
  Status s = validate_rejection(a);
  if (!s.ok()) return s;
  speculative_kernel<<<unsigned(a.b), kThreads, 0, stream>>>(a);
  return last_launch_status(kRejection);
}

const Register kV5{rejection_version(
    "v5_speculative", "a block per request: accept drafts with min(1, p/q), resample the residual",
    rejection_v5, {{"speculative_kernel", {}, {"SHFL"}, {"MUFU.RCP"}, true,
                    "no division (u·q < p), nothing spilled"}})};

}  // namespace
}  // namespace lkw::sampling
