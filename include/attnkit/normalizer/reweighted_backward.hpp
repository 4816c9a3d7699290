// ReweightedGrad: the backward of LSSAR's sharpening (SoftplusL1Reweighted; the derivation is
// in docs/mechanisms.md "LSSAR"), per block of kWidth rows: cosines s_ij and dP_ij to dS_ij.
// With w = softplus(c s), a = w / W, u = N a - 1 and a' = exp(x - LSE), x = p ln u:
//   dx = a' (dP - D),  da = N p dx / u (0 where u <= 0),
//   E = sum_k a_k da_k,  dS = c sigmoid(c s) (da - E) / W.
// W_i needs every key before any u exists, and E_i every key before any dS: three passes over
// the keys (W, E, dS); the forward keeps only its LSE, so W is summed again. A row that fell
// back to the LSSA weights (statistic -inf) takes LSSA's backward, which is the same chain with
// da = dP and E = D.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/normalizer/softplus_l1.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// The backward state of kWidth LSSAR rows (one lane each).
struct ReweightedGrad {
  SoftplusL1::State w;                  // c_i, N_i and, after pass one, W_i
  simd::Vec lse = simd::Vec(0.f);       // the forward's LSE, 0 where it is -inf
  simd::Vec delta = simd::Vec(0.f);     // D_i
  simd::Vec fallback = simd::Vec(0.f);  // 1 in rows that took the LSSA weights (LSE -inf)
  simd::Vec gain = simd::Vec(0.f);      // N_i / W_i (0 in fallback rows: every u = -1)
  simd::Vec inv_w = simd::Vec(0.f);     // 1 / W_i, 0 for a row without keys
  simd::Vec p_keys = simd::Vec(0.f);    // p N_i
  simd::Vec e = simd::Vec(0.f);         // E_i (pass two); D_i in fallback rows
  simd::Vec p_ln2 = simd::Vec(0.f);     // p ln 2: x = p_ln2 log2 u, as the forward forms it
  static constexpr float kLog2e = 1.4426950408889634f;

  ReweightedGrad() = default;
  ReweightedGrad(const SoftplusL1::State& weights, simd::Vec stat, simd::Vec d, float power)
      : w(weights),
        lse(simd::zero_if_neg_inf(stat)),
        delta(d),
        fallback(
            simd::select(simd::equal(stat, simd::Vec(-HUGE_VALF)), simd::Vec(1.f), simd::Vec(0.f))),
        p_ln2(power * 0.6931471805599453f) {}

  /// After pass one (w.l = W_i): the rows' constants.
  void end_weight_sums(float power) {
    const simd::Mask lssa = simd::either(falls_back(), simd::equal(w.l, simd::Vec(0.f)));
    gain = simd::select(lssa, simd::Vec(0.f), w.n / w.l);
    inv_w = simd::inverse_or_zero(w.l);
    p_keys = simd::Vec(power) * w.n;
  }

  /// Pass two: E_i += sum over the tile's keys of a_ij da_ij; s [keys, ld] cosines, dp dP.
  void sum_da(const float* s, const float* dp, Index keys, Index ld) {
    simd::Vec sum(0.f);
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec wx = simd::softplus(w.c * simd::load(s + j * ld));
      sum = sum + wx * inv_w * sharpened(gain * wx, simd::load(dp + j * ld)).da;
    }
    e = e + sum;
  }

  /// After pass two: E_i, or D_i in the rows that take LSSA's backward.
  void end_da_sums() { e = simd::select(falls_back(), delta, e); }

  /// The last pass: s [keys, ld] cosines -> the forward's weights P; ds: dP -> dS.
  void grads(float* s, float* ds, Index keys, Index ld) const {
    const simd::Mask lssa = falls_back();
    const simd::Vec log2e(kLog2e), c_over_w = w.c * inv_w;
    for (Index j = 0; j < keys; ++j) {
      const simd::Vec x = w.c * simd::load(s + j * ld);
      const simd::Vec wx = simd::softplus(x);
      // sigmoid(x) = e^x / (1 + e^x) = e^(x - softplus(x)): no division
      const simd::Vec sigmoid = simd::exp2((x - wx) * log2e);
      const simd::Vec dp = simd::load(ds + j * ld);
      const Sharpened g = sharpened(gain * wx, dp);
      simd::store(s + j * ld, simd::select(lssa, wx * inv_w, g.weight));
      simd::store(ds + j * ld, c_over_w * sigmoid * (simd::select(lssa, dp, g.da) - e));
    }
  }

 private:
  struct Sharpened {
    simd::Vec weight, da;  // a'_ij; da_ij = N_i p a'_ij (dP_ij - D_i) / u_ij, 0 where u <= 0
  };

  // One key vector from N_i a_ij and dP_ij. a' = 2^(log2 a'), a' / u = 2^(log2 a' - log2 u):
  // no division. Where u <= 0, log2 u = -inf: a' = 0, and da (NaN there) is selected to 0.
  Sharpened sharpened(simd::Vec na, simd::Vec dp) const {
    const simd::Vec zero(0.f), u = na - simd::Vec(1.f);
    const simd::Vec lu = simd::log2(simd::max(u, zero));
    const simd::Vec y = (p_ln2 * lu - lse) * simd::Vec(kLog2e);  // log2 a'
    const simd::Vec da = p_keys * simd::exp2(y - lu) * (dp - delta);
    return {simd::select(simd::is_nan(u), u, simd::exp2(y)),
            simd::select(simd::greater(u, zero), da, zero)};
  }

  simd::Mask falls_back() const { return simd::equal(fallback, simd::Vec(1.f)); }
};

/// The f64 rule of a row that kept its reweighted weights: s[n] cosines (masked -inf), p[n]
/// its weights a'_ij, dp[n] dP_ij (masked 0) -> dS_ij in place; c the row's logit scale,
/// keys its N_i.
inline void reference_reweighted_grads(const double* s, const double* p, double* dp, Index n,
                                       double c, double keys, float power) {
  const auto at = [](Index j) { return static_cast<std::size_t>(j); };
  std::vector<double> w(at(n)), da(at(n));
  double total = 0.0, d = 0.0;
  for (Index j = 0; j < n; ++j) {
    const double x = c * s[j];
    total += (w[at(j)] = std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))));
    d += p[j] * dp[j];
  }
  double e = 0.0;
  for (Index j = 0; j < n; ++j) {
    const double u = keys * w[at(j)] / total - 1.0;
    da[at(j)] = u > 0.0 ? keys * double(power) * p[j] * (dp[j] - d) / u : 0.0;
    e += w[at(j)] / total * da[at(j)];
  }
  for (Index j = 0; j < n; ++j) dp[j] = c / (1.0 + std::exp(-c * s[j])) * (da[at(j)] - e) / total;
}

}  // namespace attnkit::detail
