// Comparison of a result with its reference, both on the host. Reports max abs/rel error, ulp
// distance and the first bad index. It fails on any NaN/Inf mismatch, and on an all-zero
// result where the reference is not all zero (the classic unwritten or unlaunched output).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "lkw/numeric.h"
#include "lkw/tensor.h"

namespace lkw {

// printf-style formatting into a std::string (the harness avoids iostreams in library code).
inline std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

struct Tolerance {
  // kMultiset: an int32 output whose order inside runs is unspecified (the MoE align): the rows
  // are cut into runs by another output of the reference, the key (one key element per `width`
  // rows; a run is a maximal stretch of equal keys), and each run must hold the same multiset of
  // values. Exact otherwise. compare_runs does it; compare() alone cannot (it lacks the key).
  // kFrobenius: the FP8 GEMM's rule (SPEC): ||got - ref||_F / ||ref||_F <= bound over the whole
  // output, every element finite; single elements may stray (a cancelling sum has no relative
  // accuracy), the norm may not.
  enum class Mode { kExact, kUlp, kClose, kMultiset, kFrobenius };
  Mode mode = Mode::kExact;
  int64_t max_ulp = 0;  // kUlp
  double rtol = 0, atol = 0;  // kClose: |got - ref| <= atol + rtol * |ref|
  int key_output = 0;   // kMultiset: the output that holds the keys
  int64_t width = 1;    // kMultiset: rows per key element
  double bound = 0;     // kFrobenius

  static Tolerance exact() { return {}; }
  static Tolerance ulp(int64_t n) { return {Mode::kUlp, n, 0, 0}; }
  static Tolerance close(double rtol, double atol) { return {Mode::kClose, 0, rtol, atol}; }
  static Tolerance multiset(int key_output, int64_t width) {
    return {Mode::kMultiset, 0, 0, 0, key_output, width};
  }
  static Tolerance frobenius(double bound) {
    Tolerance t;
    t.mode = Mode::kFrobenius;
    t.bound = bound;
    return t;
  }
  // The spelling of golden manifests and the bench: exact | ulp:N | close:RTOL:ATOL |
  // multiset:KEY_OUTPUT:WIDTH | frob:BOUND.
  static Tolerance parse(const std::string& s) {
    if (s == "exact") return exact();
    if (s.rfind("ulp:", 0) == 0) return ulp(std::stoll(s.substr(4)));
    if (s.rfind("frob:", 0) == 0 && s.size() > 5) {
      const double bound = std::stod(s.substr(5));
      if (bound > 0) return frobenius(bound);
    }
    const size_t colon = s.find(':', 6);
    if (s.rfind("close:", 0) == 0 && colon != std::string::npos)
      return close(std::stod(s.substr(6, colon - 6)), std::stod(s.substr(colon + 1)));
    const size_t key_end = s.find(':', 9);
    if (s.rfind("multiset:", 0) == 0 && key_end != std::string::npos) {
      const Tolerance t = multiset(std::stoi(s.substr(9, key_end - 9)), std::stoll(s.substr(key_end + 1)));
      if (t.key_output >= 0 && t.width >= 1) return t;
    }
    throw std::invalid_argument("bad tolerance '" + s +
                                "' (exact | ulp:N | close:RTOL:ATOL | multiset:KEY:WIDTH | frob:BOUND)");
  }
  std::string str() const {
    if (mode == Mode::kExact) return "bit-exact";
    if (mode == Mode::kUlp) return format("<= %lld ulp", static_cast<long long>(max_ulp));
    if (mode == Mode::kFrobenius)
      return format("relative Frobenius error <= %g, every element finite", bound);
    if (mode == Mode::kMultiset)
      return format("a multiset per run of %lld-row blocks with equal keys (output %d)",
                    static_cast<long long>(width), key_output);
    return format("rtol %g, atol %g", rtol, atol);
  }
};

struct CompareReport {
  bool pass = true;
  int64_t count = 0, bad = 0, first_bad = -1;
  double max_abs = 0, max_rel = 0;
  int64_t max_ulp = 0;
  std::string reason;  // why the first bad element is bad
  double frobenius = 0;  // ||got - ref||_F / ||ref||_F (kFrobenius only)
  std::string str() const {
    std::string s = format("%s: %lld/%lld bad, max abs %g, max rel %g, max ulp %lld",
                           pass ? "PASS" : "FAIL", static_cast<long long>(bad),
                           static_cast<long long>(count), max_abs, max_rel,
                           static_cast<long long>(max_ulp));
    if (frobenius > 0) s += format(", relative Frobenius error %g", frobenius);
    if (first_bad >= 0)
      s += format("; first bad index %lld (", static_cast<long long>(first_bad)) + reason + ")";
    else if (!reason.empty())
      s += "; " + reason;
    return s;
  }
};

// got and ref are host arrays of the same dtype and element count.
inline CompareReport compare(const void* got, const void* ref, DType t, int64_t n,
                             const Tolerance& tol) {
  CompareReport r;
  r.count = n;
  if (tol.mode == Tolerance::Mode::kMultiset) {
    r.pass = false;
    r.bad = n;
    r.reason = "a multiset tolerance needs its key output: use compare_runs";
    return r;
  }
  // Identical bits are within any tolerance (and NaN matches NaN): skip the element walk.
  if (std::memcmp(got, ref, static_cast<size_t>(n) * dtype_size(t)) == 0) return r;
  const bool frob = tol.mode == Tolerance::Mode::kFrobenius;
  double diff2 = 0, ref2 = 0;  // kFrobenius: the squared norms, in float64
  bool got_all_zero = true, ref_all_zero = true;
  for (int64_t i = 0; i < n; ++i) {
    const double g = element_as_f64(got, t, i), e = element_as_f64(ref, t, i);
    const uint64_t gb = element_bits(got, t, i), eb = element_bits(ref, t, i);
    got_all_zero &= (g == 0);
    // A reference within atol of zero everywhere (a lone tiny value: gelu far in its negative
    // tail) may legitimately come back as zeros; the guard is for outputs never computed.
    ref_all_zero &= tol.mode == Tolerance::Mode::kClose ? std::fabs(e) <= tol.atol : e == 0;
    std::string why;
    if (std::isnan(g) || std::isnan(e)) {
      if (std::isnan(g) != std::isnan(e)) why = std::isnan(g) ? "NaN, expected a number" : "expected NaN";
    } else if (std::isinf(g) || std::isinf(e)) {
      if (g != e) why = "Inf mismatch";
    } else {
      const double abs_err = std::fabs(g - e);
      const double rel_err = e != 0 ? abs_err / std::fabs(e) : (abs_err != 0 ? INFINITY : 0);
      r.max_abs = std::max(r.max_abs, abs_err);
      r.max_rel = std::max(r.max_rel, rel_err);
      int64_t ulp = 0;
      if (is_float(t)) ulp = std::llabs(ordered_key(gb, t) - ordered_key(eb, t));
      else ulp = static_cast<int64_t>(abs_err);
      r.max_ulp = std::max(r.max_ulp, ulp);
      diff2 += abs_err * abs_err;
      ref2 += e * e;
      switch (tol.mode) {
        case Tolerance::Mode::kExact:
          if (gb != eb) why = "bits differ";
          break;
        case Tolerance::Mode::kUlp:
          if (ulp > tol.max_ulp) why = std::to_string(ulp) + " ulp apart";
          break;
        case Tolerance::Mode::kClose:
          if (!(abs_err <= tol.atol + tol.rtol * std::fabs(e))) why = "outside rtol/atol";
          break;
        default:  // kFrobenius: judged on the whole output below
          break;
      }
    }
    if (!why.empty()) {
      if (r.first_bad < 0) {
        r.first_bad = i;
        r.reason = format("got %g (0x%llx), expected %g (0x%llx): ", g,
                          static_cast<unsigned long long>(gb), e,
                          static_cast<unsigned long long>(eb)) + why;
      }
      ++r.bad;
    }
  }
  if (frob && r.bad == 0) {
    r.frobenius = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0);
    if (!(r.frobenius <= tol.bound)) {
      r.reason = format("relative Frobenius error %g above the bound %g", r.frobenius, tol.bound);
      r.bad = n;
    }
  }
  if (got_all_zero && !ref_all_zero && n > 0) {
    r.reason = "the whole result is zero and the reference is not" +
               (r.reason.empty() ? "" : "; " + r.reason);
    ++r.bad;
  }
  r.pass = r.bad == 0;
  return r;
}

// The runs of `n` rows cut by the reference's keys (key_ref, int32, one element per tol.width
// rows): [begin, end) of each maximal stretch of equal keys. Rows past the last key element
// form one more run.
inline std::vector<std::pair<int64_t, int64_t>> key_runs(const int32_t* key_ref, int64_t keys,
                                                         int64_t width, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t begin = 0;
  for (int64_t b = 1; b <= keys; ++b) {
    if (b == keys || key_ref[b] != key_ref[b - 1]) {
      const int64_t end = std::min(n, b * width);
      if (end > begin) runs.push_back({begin, end});
      begin = end;
    }
  }
  if (begin < n) runs.push_back({begin, n});
  return runs;
}

// An int32 output compared as a multiset inside each run of the reference's keys: both sides
// sorted inside each run (the canonical form of lkw.moe.canonical_align), then compared exactly.
// The first bad index is in that sorted order; the reason names the run.
inline CompareReport compare_runs(const int32_t* got, const int32_t* ref, int64_t n,
                                  const int32_t* key_ref, int64_t keys, const Tolerance& tol) {
  std::vector<int32_t> g(got, got + n), e(ref, ref + n);
  const auto runs = key_runs(key_ref, keys, tol.width, n);
  for (const auto& [begin, end] : runs) {
    std::sort(g.begin() + begin, g.begin() + end);
    std::sort(e.begin() + begin, e.begin() + end);
  }
  CompareReport r = compare(g.data(), e.data(), DType::kI32, n, Tolerance::exact());
  if (r.first_bad >= 0) {
    for (const auto& [begin, end] : runs)
      if (r.first_bad >= begin && r.first_bad < end)
        r.reason = format("run [%lld, %lld) of key %d differs as a multiset: ",
                          static_cast<long long>(begin), static_cast<long long>(end),
                          begin / tol.width < keys ? key_ref[begin / tol.width] : -1) +
                   r.reason;
  }
  return r;
}

// The comparison a tolerance names: element by element, or for a multiset tolerance by runs of
// `key` (the reference's key output: int32, `keys` elements), which it then requires.
inline CompareReport compare(const void* got, const void* ref, DType t, int64_t n,
                             const Tolerance& tol, const int32_t* key, int64_t keys) {
  if (tol.mode != Tolerance::Mode::kMultiset) return compare(got, ref, t, n, tol);
  if (t != DType::kI32 || key == nullptr || keys < 0)
    throw std::invalid_argument("a multiset tolerance compares int32 values by an int32 key");
  return compare_runs(static_cast<const int32_t*>(got), static_cast<const int32_t*>(ref), n, key,
                      keys, tol);
}

}  // namespace lkw
