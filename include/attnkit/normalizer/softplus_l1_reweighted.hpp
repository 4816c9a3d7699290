// SoftplusL1Reweighted -- LSSAR (Gao & Spratling 2025; docs/mechanisms.md "LSSAR"): the
// LSSA weights a_ij (softplus_l1.hpp) sharpened by a power p (default 15):
//   r_ij = ReLU(N_i a_ij - 1)^p,   a'_ij = r_ij / sum_j r_ij,
// which keeps only the keys weighted above the uniform 1/N_i. a_ij needs the row sum first,
// so the kernel makes two passes over the keys (kPasses = 2): the first sums the LSSA
// weights, the second forms r and accumulates r v. r^p under- and overflows f32 (N_i a - 1
// runs from 0 to N_i - 1), so the second pass is a softmax over p log r: the same online
// maximum and rescale as Softmax, and the row statistic is its LSE, log sum_j r_ij.
// Fallback (documented choice): a row whose r are all 0 -- every a_ij <= 1/N_i, i.e. uniform
// LSSA weights, or one visible key -- takes the LSSA weights a_ij; its statistic is -inf. The
// kernel makes a third pass, over the query tiles holding such rows only. Uniform rows are
// found exactly -- all the visible keys' w equal (a zero query, identical keys) -- because
// N_i a_ij - 1 of a uniform row is rounding noise around 0, positive for some keys.
// In the two-round form a part cannot see that the whole row is uniform: such a row (all w
// equal) still gets the right output -- every r is the same -- but a finite statistic.
// Split-KV cannot merge LSSAR in one round (the ReLU needs the whole row's sum): round one
// runs SoftplusL1 on each part and merges the row sums; round two runs second_round(sums)
// on each part -- one pass, no fallback, LSE statistic -- and merge_reweighted() combines the
// parts and applies the fallback from round one's result (kernel/merge_reweighted.hpp).
// Backward: three passes over the keys (W_i, then a sum over the row, then dS), the math in
// reweighted_backward.hpp; a row with statistic -inf takes LSSA's backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/normalizer/reweighted_backward.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/normalizer/softplus_l1.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

// s[keys, ld] of cosines -> p log r, r = ReLU(gain * softplus(c s) - 1), gain = N_i / W_i
// (so that gain * w = N_i a_ij). r = 0 gives -inf; a NaN stays NaN.
inline void reweighted_logits(const SoftplusL1::State& w, simd::Vec gain, float power, float* s,
                              Index keys, Index ld) {
  constexpr float kLn2 = 0.6931471805599453f;
  const simd::Vec one(1.f), zero(0.f), p_ln2(power * kLn2);
  for (Index j = 0; j < keys; ++j) {
    const simd::Vec r = gain * simd::softplus(w.c * simd::load(s + j * ld)) - one;
    const simd::Vec x = p_ln2 * simd::log2(simd::max(r, zero));
    simd::store(s + j * ld, simd::select(simd::is_nan(r), r, x));
  }
}

// The reference rule of both forms: s[n] holds the LSSA weights a_ij of one row with N_i keys.
// Overwrites them with r_ij / sum_j r_ij and returns log sum_j r_ij; a row whose r are all 0
// keeps a_ij and returns -inf.
inline double reference_reweight(double* s, Index n, double keys, float power) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> x(static_cast<std::size_t>(n));
  for (Index j = 0; j < n; ++j) {
    const double r = keys * s[j] - 1.0;
    x[static_cast<std::size_t>(j)] = std::isnan(r) ? r
                                     : r > 0.0     ? double(power) * std::log(r)
                                                   : neg_inf;
  }
  double* xs = x.data();
  const double lse = Softmax{}.reference_row(xs, n);
  if (lse == neg_inf) return neg_inf;  // fallback: keep the LSSA weights
  std::copy(xs, xs + n, s);
  return lse;
}

}  // namespace detail

/// LSSAR, self-contained: two passes (three for query tiles with a fallback row).
struct SoftplusL1Reweighted {
  using slot = NormalizerSlot;
  static constexpr bool kCosineLogits = true;
  static constexpr bool kCountsKeys = true;
  static constexpr int kPasses = 2;
  static constexpr RowStat kRowStat = RowStat::LogSumExp;

  float power = 15.f;
  SoftplusL1 lssa;  // its key counts, if given

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  /// (The LSSA's key counts, given for a rank's own rows, are not part of it.)
  std::uint64_t tag() const {
    return detail::TagHash::of<SoftplusL1Reweighted>().add(power).value();
  }

  /// Throws Error unless p is finite and > 0 (the paper: 15 for long context, 3 for short).
  explicit SoftplusL1Reweighted(float p = 15.f, SoftplusL1 weights = {})
      : power(p), lssa(std::move(weights)) {
    detail::require(std::isfinite(p) && p > 0.f, "SoftplusL1Reweighted.power", "finite and > 0", p);
  }

  struct State {
    SoftplusL1::State w;               // the LSSA row: scale, N_i, row sum W_i (pass one)
    simd::Vec w_max = simd::Vec(0.f);  // largest and smallest w of a visible key (pass one)
    simd::Vec w_min = simd::Vec(HUGE_VALF);
    simd::Vec gain = simd::Vec(0.f);      // N_i / W_i
    Softmax::State r;                     // online softmax over p log r (pass two)
    simd::Vec fallback = simd::Vec(0.f);  // 1 in rows that take the LSSA weights
    bool fallback_pass = false;
  };

  State begin(const RowContext& ctx) const {
    State st;
    st.w = lssa.begin(ctx);
    return st;
  }

  /// Pass one: sums the LSSA weights and tracks their extremes over the visible keys.
  void observe(State& st, float* s, Index keys, Index ld) const {
    const simd::Vec neg_inf(-HUGE_VALF), pos_inf(HUGE_VALF);
    simd::Vec sum(0.f), hi = st.w_max, lo = st.w_min;
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec x = simd::load(s + j * ld);
      const simd::Vec w = simd::softplus(st.w.c * x);
      sum = sum + w;
      hi = simd::max(hi, w);
      lo = simd::min(lo, simd::select(simd::equal(x, neg_inf), pos_inf, w));
    }
    st.w.l = st.w.l + sum;
    st.w_max = hi;
    st.w_min = lo;
  }

  /// gain = N_i / W_i, or 0 -- every r = 0, hence the fallback -- for a uniform row.
  void end_pass(State& st) const {
    const simd::Mask none =
        simd::either(simd::equal(st.w.l, simd::Vec(0.f)), simd::equal(st.w_max, st.w_min));
    st.gain = simd::select(none, simd::Vec(0.f), st.w.n / st.w.l);
  }

  /// Pass two: weights r_ij (in the log domain, rescaled online like softmax). The fallback
  /// pass: the LSSA weights in fallback rows, 0 elsewhere, nothing to rescale.
  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    if (st.fallback_pass) {
      const simd::Mask keep = simd::equal(st.fallback, simd::Vec(1.f));
      for (Index j = 0; j < keys; ++j) {
        const simd::Vec w = simd::softplus(st.w.c * simd::load(s + j * ld));
        simd::store(s + j * ld, simd::select(keep, w, simd::Vec(0.f)));
      }
      return simd::Vec(1.f);
    }
    detail::reweighted_logits(st.w, st.gain, power, s, keys, ld);
    return Softmax{}.absorb(st.r, s, keys, ld);
  }

  /// After pass two: rows that saw keys (W_i > 0) but whose r were all 0 fall back; true
  /// when some did (the kernel then runs the last pass once more).
  bool another_pass(State& st) const {
    if (st.fallback_pass) return false;
    const simd::Mask falls =
        simd::both(simd::equal(st.r.l, simd::Vec(0.f)), simd::greater(st.w.l, simd::Vec(0.f)));
    st.fallback = simd::select(falls, simd::Vec(1.f), simd::Vec(0.f));
    st.fallback_pass = true;  // a repeated pass adds 0 to every other row, in every State
    return simd::any(falls);
  }

  simd::Vec finalize(const State& st) const {
    return simd::select(simd::equal(st.fallback, simd::Vec(1.f)), simd::inverse_or_zero(st.w.l),
                        simd::inverse_or_zero(st.r.l));
  }

  /// log sum_j r_ij; -inf for a row that saw no key or fell back.
  simd::Vec lse(const State& st) const { return Softmax{}.lse(st.r); }

  /// Reference rule in double: cosines s[n] (masked = -inf) -> weights in place; a row
  /// whose visible keys all weigh the same keeps the LSSA weights (statistic -inf).
  double reference_row(double* s, Index n, const RowContext& ctx) const {
    std::vector<double> visible;
    for (Index j = 0; j < n; ++j)
      if (s[j] != -HUGE_VAL) visible.push_back(s[j]);
    const bool uniform = !visible.empty() && std::all_of(visible.begin(), visible.end(),
                                                         [&](double x) { return x == visible[0]; });
    lssa.reference_row(s, n, ctx);
    if (uniform) return -std::numeric_limits<double>::infinity();
    return detail::reference_reweight(s, n, double(lssa.key_count(ctx, 0)), power);
  }

  // Backward (attention_backward(); the math in reweighted_backward.hpp): three passes over
  // the keys -- the LSSA row sums W_i, then E_i = sum_j a_ij da_ij, then dS -- as the forward
  // keeps only its LSE. A row with LSE -inf took the LSSA weights and takes LSSA's backward.
  static constexpr int kBackwardPasses = 3;
  using BackwardState = detail::ReweightedGrad;

  BackwardState begin_backward(const RowContext& ctx, simd::Vec stat, simd::Vec delta) const {
    return BackwardState(lssa.begin(ctx), stat, delta, power);
  }

  /// Pass 0 (W_i) reads the logits only; pass 1 (E_i) dP too.
  static constexpr bool backward_pass_reads_dp(int pass) { return pass == 1; }

  /// A pass before the last over one tile: s [keys, ld] cosines (masked -inf; pass 0 leaves
  /// the weights w_ij there), dp dP (masked 0; null in pass 0).
  void observe_backward(BackwardState& st, int pass, float* s, const float* dp, Index keys,
                        Index ld) const {
    if (pass == 0)
      lssa.weigh(st.w, s, keys, ld);
    else
      st.sum_da(s, dp, keys, ld);
  }

  void end_backward_pass(BackwardState& st, int pass) const {
    if (pass == 0)
      st.end_weight_sums(power);
    else
      st.end_da_sums();
  }

  /// The last pass: s: cosines -> P; ds: dP -> dS (on the cosine). Returns 0: no parameter.
  simd::Vec backward(const BackwardState& st, float* s, float* ds, Index keys, Index ld) const {
    st.grads(s, ds, keys, ld);
    return simd::Vec(0.f);
  }

  /// Reference backward in double (see Softmax::reference_backward); `stat` the row's LSE.
  double reference_backward(const double* s, const double* p, double* dp, Index n, double stat,
                            const RowContext& ctx) const {
    const double keys = double(lssa.key_count(ctx, 0));
    const double c = SoftplusL1::logit_scale(double(ctx.head_dim), keys);
    if (stat != -std::numeric_limits<double>::infinity()) {
      detail::reference_reweighted_grads(s, p, dp, n, c, keys, power);
      return 0.0;
    }
    double sum = 0.0;  // the LSSA weights' row sum, LSSA's statistic
    for (Index j = 0; j < n; ++j)
      sum += std::max(c * s[j], 0.0) + std::log1p(std::exp(-std::fabs(c * s[j])));
    return lssa.reference_backward(s, p, dp, n, sum, ctx);
  }

  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index q_heads) const {
    lssa.validate(q_len, kv_len, q_offset, batch, q_heads);
  }

  /// Round two of the split-KV form, given the whole call's LSSA row sums W_i
  /// ([B * Hq * Lq], merged from round one) -- see the header comment.
  struct SecondRound;
  SecondRound second_round(std::vector<float> row_sums) const;
};

/// LSSAR round two on one part of the keys: r_ij from the whole call's W_i and N_i, one
/// pass, no fallback; statistic log sum_j r_ij over the part (-inf where all r are 0).
struct SoftplusL1Reweighted::SecondRound {
  using slot = NormalizerSlot;
  static constexpr bool kCosineLogits = true;
  static constexpr bool kCountsKeys = true;
  static constexpr RowStat kRowStat = RowStat::LogSumExp;

  float power = 15.f;
  SoftplusL1 lssa;              // must hold the whole call's key counts
  std::vector<float> row_sums;  // [B * Hq * Lq] W_i of the whole call

  struct State {
    SoftplusL1::State w;
    simd::Vec gain;
    Softmax::State r;
  };

  State begin(const RowContext& ctx) const {
    alignas(64) float gain[simd::kWidth] = {};
    const SoftplusL1::State w = lssa.begin(ctx);
    alignas(64) float n[simd::kWidth];
    simd::store(n, w.n);
    for (int lane = 0; lane < simd::kWidth && lane < ctx.rows; ++lane) {
      const float sum = row_sums[static_cast<std::size_t>(ctx.row + lane)];
      gain[lane] = sum == 0.f ? 0.f : n[lane] / sum;
    }
    return State{w, simd::load(gain), {}};
  }

  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    detail::reweighted_logits(st.w, st.gain, power, s, keys, ld);
    return Softmax{}.absorb(st.r, s, keys, ld);
  }

  simd::Vec finalize(const State& st) const { return Softmax{}.finalize(st.r); }
  simd::Vec lse(const State& st) const { return Softmax{}.lse(st.r); }

  /// Reference rule in double: the part's cosines -> r_ij / sum over the part; returns the
  /// log of that sum (-inf and weights 0 where every r is 0: the merge falls back).
  double reference_row(double* s, Index n, const RowContext& ctx) const {
    const double c = SoftplusL1::logit_scale(double(ctx.head_dim), double(lssa.key_count(ctx, 0)));
    const double sum = double(row_sums[static_cast<std::size_t>(ctx.row)]);
    for (Index j = 0; j < n; ++j) {
      const double x = c * s[j];
      s[j] = sum == 0.0 ? 0.0 : (std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x)))) / sum;
    }
    const double lse = detail::reference_reweight(s, n, double(lssa.key_count(ctx, 0)), power);
    if (lse == -std::numeric_limits<double>::infinity()) std::fill(s, s + n, 0.0);
    return lse;
  }

  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index q_heads) const {
    lssa.validate(q_len, kv_len, q_offset, batch, q_heads);
    const Index rows = batch * q_heads * q_len;
    detail::require(static_cast<Index>(row_sums.size()) == rows,
                    "SoftplusL1Reweighted::SecondRound.row_sums.size()",
                    detail::cat("batch * q_heads * q_len = ", rows), row_sums.size());
  }
};

inline SoftplusL1Reweighted::SecondRound SoftplusL1Reweighted::second_round(
    std::vector<float> row_sums) const {
  return SecondRound{power, lssa, std::move(row_sums)};
}

/// The paper's name for it.
using Lssar = SoftplusL1Reweighted;

}  // namespace attnkit
