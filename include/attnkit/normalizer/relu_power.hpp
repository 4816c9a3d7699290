// ReluPower{alpha, bias} (reconstructed; docs/mechanisms.md "ReluPower"):
//   a_ij = ReLU(s_ij - b)^alpha / sum_j ReLU(s_ij - b)^alpha,
// an l1-normalized power of the shifted logits. The weights
// need no running maximum (kRescales = false): they are summed as they come, and the row
// sum is the row statistic (RowStat::Sum, written through Options::lse). A row whose
// weights are all 0 (nothing visible, or every logit <= b) gives 0, never NaN.
#pragma once

#include <cmath>
#include <cstdint>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct ReluPower {
  using slot = NormalizerSlot;
  static constexpr bool kRescales = false;
  static constexpr RowStat kRowStat = RowStat::Sum;

  float alpha = 1.f, bias = 0.f;

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<ReluPower>().add(alpha).add(bias).value();
  }

  /// Throws Error unless alpha is finite and > 0 and bias is finite.
  ReluPower(float power, float shift) : alpha(power), bias(shift) {
    detail::require(std::isfinite(power) && power > 0.f, "ReluPower.alpha", "finite and > 0",
                    power);
    detail::require(std::isfinite(shift), "ReluPower.bias", "finite", shift);
  }

  struct State {
    simd::Vec l = simd::Vec(0.f);  // row sum of the weights
  };

  State begin() const { return State{}; }

  /// s[keys, ld] -> ReLU(s - b)^alpha = 2^(alpha log2(max(s - b, 0))) (log2(0) = -inf
  /// gives exactly 0, so masked -inf logits weigh 0). max() may drop a NaN, so NaN logits
  /// are put back: NaN in gives NaN out. Returns 1: nothing to rescale.
  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    const simd::Vec b(bias), a(alpha), zero(0.f);
    simd::Vec sum(0.f);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec shifted = simd::load(s + j * ld) - b;
      const simd::Vec x = simd::max(shifted, zero);
      const simd::Vec w =
          simd::select(simd::is_nan(shifted), shifted, simd::exp2(a * simd::log2(x)));
      simd::store(s + j * ld, w);
      sum = sum + w;
    }
    st.l = st.l + sum;
    return simd::Vec(1.f);
  }

  /// 1 / l, or 0 for a row whose weights are all 0 (never NaN from an empty row).
  simd::Vec finalize(const State& st) const { return simd::inverse_or_zero(st.l); }

  simd::Vec row_sum(const State& st) const { return st.l; }

  // Backward (attention_backward()): with x = s - b and the forward's row sum L,
  // P = ReLU(x)^alpha / L and dS = alpha x^(alpha - 1) / L (dP - D) where x > 0, else 0
  // (the subgradient below the threshold); the bias's gradient is -sum_j dS.
  static constexpr const char* kTrainedParam = "bias";  // ParamGrads::normalizer
  struct BackwardState {
    simd::Vec inv_l;  // 1 / L, 0 for a row whose weights were all 0
    simd::Vec delta;  // D_i = dO_i . O_i
  };

  BackwardState begin_backward(const RowContext& /*ctx*/, simd::Vec stat, simd::Vec delta) const {
    return BackwardState{simd::inverse_or_zero(stat), delta};
  }

  /// s: logits -> P; ds: dP -> dS. Returns -sum_j dS per lane (the bias's gradient).
  simd::Vec backward(const BackwardState& st, float* s, float* ds, Index keys, Index ld) const {
    const simd::Vec b(bias), a(alpha), am1(alpha - 1.f), zero(0.f);
    simd::Vec sum(0.f);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec shifted = simd::load(s + j * ld) - b;
      const simd::Vec l2 = simd::log2(simd::max(shifted, zero));
      const simd::Vec p = simd::exp2(a * l2) * st.inv_l;
      const simd::Vec slope = a * simd::exp2(am1 * l2) * st.inv_l;
      const simd::Vec g = slope * (simd::load(ds + j * ld) - st.delta);
      const simd::Vec dsj = simd::select(simd::greater(shifted, zero), g, zero);
      simd::store(s + j * ld, simd::select(simd::is_nan(shifted), shifted, p));
      simd::store(ds + j * ld, simd::select(simd::is_nan(shifted), shifted, dsj));
      sum = sum + dsj;
    }
    return zero - sum;
  }

  /// Reference backward in double (see Softmax::reference_backward); `stat` is the row sum.
  /// Returns the row's share of the bias's gradient.
  double reference_backward(const double* s, const double* p, double* dp, Index n, double stat,
                            const RowContext& /*ctx*/) const {
    double d = 0.0, sum = 0.0;
    for (Index j = 0; j < n; ++j) d += p[j] * dp[j];
    for (Index j = 0; j < n; ++j) {
      const double x = s[j] - double(bias);
      dp[j] = x > 0.0 && stat != 0.0
                  ? double(alpha) * std::pow(x, double(alpha) - 1.0) / stat * (dp[j] - d)
                  : 0.0;
      sum += dp[j];
    }
    return -sum;
  }

  /// Reference rule in double: weights in place; returns the row sum.
  double reference_row(double* s, Index n) const {
    double l = 0.0;
    for (Index j = 0; j < n; ++j) {
      const double x = s[j] - double(bias);
      s[j] = std::isnan(x) ? x : x > 0.0 ? std::pow(x, double(alpha)) : 0.0;
      l += s[j];
    }
    for (Index j = 0; j < n; ++j) s[j] = l == 0.0 ? 0.0 : s[j] / l;
    return l;
  }
};

}  // namespace attnkit
