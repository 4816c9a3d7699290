// Softmax: weights a_ij = exp(s_ij - m_i) / sum_j exp(s_ij - m_i), computed online over key
// tiles: a running max m and sum l per query, and the output accumulator rescaled by
// alpha = exp(m_old - m_new) when m grows. exp is exp2 with log2(e) folded into one FMA.
// Masked logits are -inf and weigh 0; a query with no visible key finalizes to 0, LSE -inf.
// A NaN or +inf logit among a query's visible keys makes that query's output and LSE NaN:
// "no key" (LSE -inf) is never reported for a row that saw a key, so a merge cannot drop it.
// Visible keys whose logits are all -inf (f32 products that overflowed) cannot be weighed:
// the kernel, which knows from the mask that the row saw keys, makes its output NaN and
// keeps LSE -inf (beside any finite part their weight is 0, in f64 too).
// Optional sink logits, one per query head (gpt-oss; all 0 is "softmax off by one"): the
// sink adds exp(sink - m) to the denominator and nothing to the output. It is compared with
// the scaled logits as it is (it is not multiplied by the scale); the online state starts at
// m = sink, l = 1, so a row that sees no key gives 0 and LSE = sink.
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
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct Softmax {
  using slot = NormalizerSlot;

  std::vector<float> sinks;  // [q_heads] sink logits; empty: plain softmax

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const { return detail::TagHash::of<Softmax>().add(sinks).value(); }

  Softmax() = default;
  /// Softmax with one sink logit per query head.
  static Softmax with_sinks(std::vector<float> per_head) {
    Softmax s;
    s.sinks = std::move(per_head);
    return s;
  }

  /// A part of the keys (split-KV, pages, ring steps) runs without sinks: the merge adds
  /// them once (normalizer/faces.hpp, KeyPart).
  Softmax part(const KeyPart& /*part*/) const { return Softmax{}; }
  /// A one-head gathered call standing for head h keeps head h's sink.
  Softmax for_head(Index h) const {
    return sinks.empty() ? *this : with_sinks({sinks[static_cast<std::size_t>(h)]});
  }

  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  /// Running statistics of simd::kWidth queries, one per lane.
  struct State {
    simd::Vec m = simd::Vec(kNegInf);  // max logit seen
    simd::Vec l = simd::Vec(0.f);      // sum of exp(s - m)
  };

  State begin() const { return State{}; }

  /// The state of rows of head ctx.head: empty, or holding the head's sink.
  State begin(const RowContext& ctx) const {
    if (sinks.empty()) return State{};
    return State{simd::Vec(sinks[static_cast<std::size_t>(ctx.head)]), simd::Vec(1.f)};
  }

  /// s is a [keys, ld] block of logits whose kWidth columns are this State's queries
  /// (masked = -inf). Overwrites the logits with unnormalized weights and returns, per
  /// query, the factor by which its output accumulator must be rescaled.
  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    using simd::Vec;
    Vec tile_max(kNegInf);
    for (Index j = 0; j < keys; ++j) tile_max = simd::max(tile_max, simd::load(s + j * ld));
    const Vec m_new = simd::max(st.m, tile_max);
    // exp(s - m) = exp2((s - m) * log2e). Subtracting first keeps the exponent exact for
    // huge logits (s * log2e - m * log2e would round each product at |s| ~ 1e4, and
    // without an FMA instruction lose ~1e-3). A query with nothing visible yet keeps
    // m = -inf; subtracting 0 there makes every weight exp2(-inf) = 0 instead of NaN.
    const Vec log2e(kLog2e);
    const Vec m_safe = simd::zero_if_neg_inf(m_new);
    Vec sum(0.f);
    for (Index j = 0; j < keys; ++j) {
      const Vec p = simd::exp2((simd::load(s + j * ld) - m_safe) * log2e);
      simd::store(s + j * ld, p);
      sum = sum + p;
    }
    const Vec alpha = simd::exp2((st.m - m_safe) * log2e);  // exp2(-inf) = 0
    st.l = simd::fma(st.l, alpha, sum);
    st.m = m_new;
    return alpha;
  }

  /// Per-query factor that turns the accumulator into the output: 1 / l, or 0 for a query
  /// that saw no key (l = 0). A NaN logit made l NaN (exp2 of NaN), and a +inf one made
  /// s - m = inf - inf = NaN: 1 / NaN keeps that query NaN.
  simd::Vec finalize(const State& st) const { return simd::inverse_or_zero(st.l); }

  /// Natural-log log-sum-exp per query: m + log(l); -inf for a query that saw no key, NaN
  /// for one whose logits held a NaN or +inf.
  simd::Vec lse(const State& st) const {
    alignas(64) float m[simd::kWidth], l[simd::kWidth];
    simd::store(m, st.m);
    simd::store(l, st.l);
    for (int i = 0; i < simd::kWidth; ++i) m[i] = l[i] == 0.f ? kNegInf : m[i] + std::log(l[i]);
    return simd::load(m);
  }

  /// Reference rule in double for one query of head ctx.head: logits s[n] (masked = -inf)
  /// -> weights in place; returns the LSE (sink included). A NaN or +inf logit makes every
  /// weight and the LSE NaN; a row whose visible keys (ctx.visible_keys) all have logit -inf
  /// gets NaN weights and LSE -inf.
  double reference_row(double* s, Index n, const RowContext& ctx) const {
    const double neg_inf = -std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (std::any_of(s, s + n, [](double x) { return std::isnan(x) || x == HUGE_VAL; })) {
      std::fill(s, s + n, nan);
      return nan;
    }
    const double sink = sinks.empty() ? neg_inf : double(sinks[static_cast<std::size_t>(ctx.head)]);
    const double m = std::max(n > 0 ? *std::max_element(s, s + n) : neg_inf, sink);
    if (m == neg_inf) {
      const bool saw_keys = ctx.visible_keys != nullptr && ctx.visible_keys[0] > 0.f;
      std::fill(s, s + n, saw_keys ? nan : 0.0);
      return neg_inf;
    }
    double l = sink == neg_inf ? 0.0 : std::exp(sink - m);
    for (Index j = 0; j < n; ++j) l += (s[j] = std::exp(s[j] - m));
    for (Index j = 0; j < n; ++j) s[j] /= l;
    return m + std::log(l);
  }

  /// The same without a sink (the rule of plain softmax, for callers without a context).
  double reference_row(double* s, Index n) const { return Softmax{}.reference_row(s, n, {}); }

  // Backward (attention_backward(); the faces are listed in kernel/backward/backward_tiles.hpp).
  // With the forward's LSE the weights are rebuilt as P = exp(s - LSE), and
  // dS = P (dP - D), D_i = dO_i . O_i. A sink logit's gradient is -P_sink D_i per row,
  // P_sink = exp(sink - LSE_i).
  static constexpr const char* kTrainedParam = "sinks";  // ParamGrads::normalizer
  struct BackwardState {
    simd::Vec lse;    // the rows' LSE; 0 where it is -inf (a row that saw nothing)
    simd::Vec delta;  // D_i
    simd::Vec sink;   // the head's sink logit, -inf without sinks
  };

  BackwardState begin_backward(const RowContext& ctx, simd::Vec stat, simd::Vec delta) const {
    const float sink = sinks.empty() ? kNegInf : sinks[static_cast<std::size_t>(ctx.head)];
    return BackwardState{simd::zero_if_neg_inf(stat), delta, simd::Vec(sink)};
  }

  /// s[keys, ld]: logits (masked -inf) -> weights P; ds[keys, ld]: dP -> dS. Returns 0:
  /// no per-head parameter gradient comes from keys.
  simd::Vec backward(const BackwardState& st, float* s, float* ds, Index keys, Index ld) const {
    const simd::Vec log2e(kLog2e);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec p = simd::exp2((simd::load(s + j * ld) - st.lse) * log2e);
      simd::store(s + j * ld, p);
      simd::store(ds + j * ld, p * (simd::load(ds + j * ld) - st.delta));
    }
    return simd::Vec(0.f);
  }

  /// The rows' share of the sink logit's gradient, -P_sink D_i (0 without sinks).
  simd::Vec row_param_grad(const BackwardState& st) const {
    return simd::Vec(0.f) - simd::exp2((st.sink - st.lse) * simd::Vec(kLog2e)) * st.delta;
  }

  /// Reference backward in double for one row: s[n] logits (masked -inf), p[n] the
  /// weights reference_row() made of them, dp[n] (masked entries 0) -> dS in place; `stat`
  /// the row's LSE. Returns the row's share of its sink logit's gradient.
  double reference_backward(const double* /*s*/, const double* p, double* dp, Index n, double stat,
                            const RowContext& ctx) const {
    double d = 0.0;
    for (Index j = 0; j < n; ++j) d += p[j] * dp[j];
    for (Index j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - d);
    if (sinks.empty() || std::isinf(stat)) return 0.0;
    return -std::exp(double(sinks[static_cast<std::size_t>(ctx.head)]) - stat) * d;
  }

  /// Throws Error when the sinks do not cover the call's heads.
  void validate(Index /*q_len*/, Index /*kv_len*/, Index /*q_offset*/, Index /*batch*/,
                Index q_heads) const {
    detail::require(sinks.empty() || static_cast<Index>(sinks.size()) == q_heads,
                    "Softmax.sinks.size()", detail::cat("q_heads = ", q_heads), sinks.size());
  }
};

}  // namespace attnkit
