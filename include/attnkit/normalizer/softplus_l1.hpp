// SoftplusL1 -- LSSA (Gao & Spratling 2025; docs/mechanisms.md "LSSA"):
//   w_ij = softplus(log(d) * log(N_i) * cos(q_i, k_j)),   a_ij = w_ij / sum_j w_ij,
// over the keys query i sees, N_i of them: the logit scale grows with the context the query
// has, which keeps the attention entropy nearly constant as the context grows (the paper's
// length generalization). The logits are cosines (kCosineLogits: the kernel normalizes the
// rows of q and k once; a zero row has cosine 0, and Options::scale is refused), bounded, so
// there is no running maximum and no rescale: one pass, with the row sum as the statistic
// (RowStat::Sum: parts over disjoint keys merge in one round). A Score mod such as softcap
// acts on the cosine.
// N_i comes from the mask (RowContext::visible_keys, mask/visible_keys.hpp). Split-KV parts
// must use the N_i of the whole call, not of their slice: with_key_counts(visible_key_counts(
// mask, ...)) of the whole call. Guard: the scale is at least FLT_MIN, so N_i = 1 or d = 1
// (log 1 = 0) gives uniform weights, and a masked -inf logit still weighs exactly 0.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct SoftplusL1 {
  using slot = NormalizerSlot;
  static constexpr bool kRescales = false;
  static constexpr bool kCosineLogits = true;
  static constexpr bool kCountsKeys = true;
  static constexpr RowStat kRowStat = RowStat::Sum;

  std::vector<float> key_counts;  // [B * Hq * Lq] N_i of each row; empty: from the mask

  SoftplusL1() = default;
  /// LSSA with given key counts N_i, indexed like the row statistics (for split-KV parts).
  /// Throws Error unless every count is finite and >= 0.
  static SoftplusL1 with_key_counts(std::vector<float> counts) {
    SoftplusL1 s;
    s.key_counts = std::move(counts);
    s.check_key_counts();
    return s;
  }

  /// A part that runs as a call of its own (pages, ring steps) needs each row's N_i over
  /// the whole call, not over its own keys: the counts given for its rows, else the part's
  /// (normalizer/faces.hpp, KeyPart).
  SoftplusL1 part(const KeyPart& part) const {
    if (!part.own_call) return *this;
    if (key_counts.empty()) return with_key_counts(part.visible_keys());
    if (part.rows < 0) return *this;  // given for the part's own rows
    detail::require(static_cast<Index>(key_counts.size()) >= part.first_row + part.rows,
                    "SoftplusL1.key_counts.size()", "q.batch * q.heads * q.seq", key_counts.size());
    const auto first = key_counts.begin() + part.first_row;
    return with_key_counts(std::vector<float>(first, first + part.rows));
  }

  /// Throws Error naming the first key count that is NaN, infinite or negative (a NaN makes
  /// its row NaN, a negative one a finite but wrong row).
  void check_key_counts() const {
    for (std::size_t r = 0; r < key_counts.size(); ++r)
      detail::require(std::isfinite(key_counts[r]) && key_counts[r] >= 0.f,
                      detail::cat("SoftplusL1.key_counts[", r, "]"), "finite and >= 0",
                      key_counts[r]);
  }

  struct State {
    simd::Vec c;                   // logit scale log(d) log(N_i), per row
    simd::Vec n;                   // N_i, per row
    simd::Vec l = simd::Vec(0.f);  // row sum of the weights
  };

  /// N_i of the row ctx.row + lane: given, else the mask's count, else (a context without
  /// counts) the call's key count.
  float key_count(const RowContext& ctx, Index lane) const {
    if (!key_counts.empty()) return key_counts[static_cast<std::size_t>(ctx.row + lane)];
    if (ctx.visible_keys != nullptr) return ctx.visible_keys[lane];
    return static_cast<float>(ctx.kv_len);
  }

  /// log(d) log(N), at least FLT_MIN (see the guard above); double, for the reference.
  static double logit_scale(double head_dim, double n) {
    return std::max(std::log(head_dim) * std::log(std::max(n, 1.0)), double(FLT_MIN));
  }

  State begin(const RowContext& ctx) const {
    alignas(64) float c[simd::kWidth], n[simd::kWidth];
    for (int lane = 0; lane < simd::kWidth; ++lane) {
      n[lane] = lane < ctx.rows ? key_count(ctx, lane) : 0.f;  // padding lanes: no keys
      c[lane] = static_cast<float>(logit_scale(double(ctx.head_dim), double(n[lane])));
    }
    return State{simd::load(c), simd::load(n)};
  }

  /// s[keys, ld] of cosines -> softplus(c s) in place; adds them to the row sums.
  void weigh(State& st, float* s, Index keys, Index ld) const {
    simd::Vec sum(0.f);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec w = simd::softplus(st.c * simd::load(s + j * ld));
      simd::store(s + j * ld, w);
      sum = sum + w;
    }
    st.l = st.l + sum;
  }

  /// Weighs the tile; returns 1: nothing to rescale (kRescales = false).
  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    weigh(st, s, keys, ld);
    return simd::Vec(1.f);
  }

  /// 1 / l, or 0 for a row that saw no key.
  simd::Vec finalize(const State& st) const { return simd::inverse_or_zero(st.l); }

  simd::Vec row_sum(const State& st) const { return st.l; }

  // Backward (attention_backward()): with the row's scale c and the forward's row sum L,
  // P = softplus(c s) / L and dS = c sigmoid(c s) / L (dP - D) on the cosine s; the kernel
  // carries dS on through the normalization of q and k.
  struct BackwardState {
    simd::Vec c, inv_l, delta;
  };

  BackwardState begin_backward(const RowContext& ctx, simd::Vec stat, simd::Vec delta) const {
    return BackwardState{begin(ctx).c, simd::inverse_or_zero(stat), delta};
  }

  /// s: cosines -> P; ds: dP -> dS (on the cosine). Returns 0: no parameter.
  simd::Vec backward(const BackwardState& st, float* s, float* ds, Index keys, Index ld) const {
    const simd::Vec one(1.f), neg_log2e(-1.4426950408889634f);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec x = st.c * simd::load(s + j * ld);
      const simd::Vec sig = one / (one + simd::exp2(x * neg_log2e));
      simd::store(s + j * ld, simd::softplus(x) * st.inv_l);
      simd::store(ds + j * ld, st.c * sig * st.inv_l * (simd::load(ds + j * ld) - st.delta));
    }
    return simd::Vec(0.f);
  }

  /// Reference backward in double (see Softmax::reference_backward); `stat` is the row sum.
  double reference_backward(const double* s, const double* p, double* dp, Index n, double stat,
                            const RowContext& ctx) const {
    const double c = logit_scale(double(ctx.head_dim), double(key_count(ctx, 0)));
    double d = 0.0;
    for (Index j = 0; j < n; ++j) d += p[j] * dp[j];
    for (Index j = 0; j < n; ++j)
      dp[j] = stat == 0.0 ? 0.0 : c / (1.0 + std::exp(-c * s[j])) / stat * (dp[j] - d);
    return 0.0;
  }

  /// Reference rule in double for one row: cosines s[n] (masked = -inf) -> weights in place;
  /// returns the row sum.
  double reference_row(double* s, Index n, const RowContext& ctx) const {
    const double c = logit_scale(double(ctx.head_dim), double(key_count(ctx, 0)));
    double l = 0.0;
    for (Index j = 0; j < n; ++j) {
      const double x = c * s[j];
      l += (s[j] = std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))));
    }
    for (Index j = 0; j < n; ++j) s[j] = l == 0.0 ? 0.0 : s[j] / l;
    return l;
  }

  /// Throws Error when given key counts do not cover the call's rows or one is not finite
  /// and >= 0 (the members are public).
  void validate(Index q_len, Index /*kv_len*/, Index /*q_offset*/, Index batch,
                Index q_heads) const {
    const Index rows = batch * q_heads * q_len;  // Problem checked the product
    detail::require(key_counts.empty() || static_cast<Index>(key_counts.size()) == rows,
                    "SoftplusL1.key_counts.size()",
                    detail::cat("empty or batch * q_heads * q_len = ", rows), key_counts.size());
    check_key_counts();
  }
};

/// The paper's name for it.
using Lssa = SoftplusL1;

}  // namespace attnkit
