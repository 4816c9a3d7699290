// Tapa{alpha, theta} -- TAPA (Wang et al. 2025, eq. 9-13; docs/mechanisms.md "TAPA"): each head
// vector splits into an amplitude part (its first a = round(theta d) dims) and a phase part
// (the other d - a), and
//   logit_ij = (q_A . k_A / sqrt(a)) * cos(2 pi |i - j|^alpha * q_P . k_P / sqrt(d - a)),
// with defaults alpha = 0.1, theta = 0.5 and no RoPE. The paper writes sqrt(theta d) and
// sqrt((1 - theta) d): the same when theta d is whole. theta = 1 leaves no phase part: the
// cosine is 1 and the logit is the scaled dot product. The logit has its own scale, so
// Options::scale is refused. A Position policy that owns the product: the kernel forms the
// two half-width tile products (the multiply-adds of one dot product) and combine() joins
// them; |i - j|^alpha comes from a table of the lanes + keys - 1 distances of the tile (one
// pow per distance, not per logit), leaving one cos per logit. Distances are absolute
// positions: query row r sits at r + q_offset, key j at j. Works with every mask, score mod
// and normalizer except those with cosine logits (SoftplusL1), which form their own.
#pragma once

#include <cmath>
#include <string>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct Tapa {
  using slot = PositionSlot;
  static constexpr double kTwoPi = 6.283185307179586;

  float alpha = 0.1f, theta = 0.5f;

  /// Throws Error unless alpha is finite and > 0 and theta is in (0, 1].
  explicit Tapa(float a = 0.1f, float t = 0.5f) : alpha(a), theta(t) {
    detail::require(std::isfinite(a) && a > 0.f, "Tapa.alpha", "finite and > 0", a);
    detail::require(std::isfinite(t) && t > 0.f && t <= 1.f, "Tapa.theta", "in (0, 1]", t);
  }

  /// The amplitude part's width: round(theta d), at least 1.
  Index amplitude_dims(Index head_dim) const {
    const Index a = std::lround(double(theta) * double(head_dim));
    return a < 1 ? 1 : a > head_dim ? head_dim : a;
  }

  /// s[keys, ld] (amplitude products) <- s * cos(phase term of s2), lanes a whole number of
  /// vectors; lane r is the query at q_begin + r, key row jj the key at k_begin + jj.
  void combine(float* s, const float* s2, Index keys, Index lanes, Index ld, Index q_begin,
               Index k_begin, Index head_dim, float* work) const {
    const Index a = amplitude_dims(head_dim), phase = head_dim - a;
    const simd::Vec amp(static_cast<float>(1.0 / std::sqrt(double(a))));
    if (phase == 0) {  // no phase part: cos(0) = 1
      for (Index jj = 0; jj < keys; ++jj)
        for (Index c = 0; c < lanes; c += simd::kWidth)
          simd::store(s + jj * ld + c, simd::load(s + jj * ld + c) * amp);
      return;
    }
    fill_frequencies(work, keys, lanes, q_begin, k_begin, phase);
    for (Index jj = 0; jj < keys; ++jj) {
      const float* freq = work + (keys - 1 - jj);
      for (Index c = 0; c < lanes; c += simd::kWidth) {
        const simd::Vec turn = simd::load(s2 + jj * ld + c) * simd::load(freq + c);
        simd::store(s + jj * ld + c, simd::load(s + jj * ld + c) * amp * simd::cos(turn));
      }
    }
  }

  // Backward (attention_backward()): with A = amp q_A . k_A, amp = 1 / sqrt(a), and
  // phi = w_ij q_P . k_P, w_ij = 2 pi |i - j|^alpha / sqrt(d - a), the logit A cos(phi) has
  //   d/d(q_A . k_A) = amp cos(phi),   d/d(q_P . k_P) = -A sin(phi) w_ij.

  /// ds[keys, ld]: the logits' gradient -> that of the amplitude products; ds2: <- that of
  /// the phase products; s, s2: the two products as combine() received them. Where ds is 0
  /// (a masked pair) both stay 0, whatever the products hold.
  void combine_backward(const float* s, const float* s2, float* ds, float* ds2, Index keys,
                        Index lanes, Index ld, Index q_begin, Index k_begin, Index head_dim,
                        float* work) const {
    const Index a = amplitude_dims(head_dim), phase = head_dim - a;
    const simd::Vec amp(static_cast<float>(1.0 / std::sqrt(double(a)))), zero(0.f);
    if (phase == 0) {
      for (Index jj = 0; jj < keys; ++jj)
        for (Index c = 0; c < lanes; c += simd::kWidth) {
          simd::store(ds + jj * ld + c, simd::load(ds + jj * ld + c) * amp);
          simd::store(ds2 + jj * ld + c, zero);
        }
      return;
    }
    fill_frequencies(work, keys, lanes, q_begin, k_begin, phase);
    for (Index jj = 0; jj < keys; ++jj) {
      const float* freq = work + (keys - 1 - jj);
      for (Index c = 0; c < lanes; c += simd::kWidth) {
        const simd::Vec g = simd::load(ds + jj * ld + c), w = simd::load(freq + c);
        const simd::Vec turn = simd::load(s2 + jj * ld + c) * w;
        const simd::Vec ga = g * amp * simd::cos(turn);
        // sin(phi) = cos(phi - pi / 2): the SIMD layer's cos serves both
        const simd::Vec sin_turn = simd::cos(turn - simd::Vec(1.5707963267948966f));
        const simd::Vec gp = zero - g * amp * simd::load(s + jj * ld + c) * sin_turn * w;
        const simd::Mask masked = simd::equal(g, zero);
        simd::store(ds + jj * ld + c, simd::select(masked, zero, ga));
        simd::store(ds2 + jj * ld + c, simd::select(masked, zero, gp));
      }
    }
  }

  /// The reference's rule: dq[d] += dlogit * d(logit)/dq, dk[d] += dlogit * d(logit)/dk.
  void reference_logit_grad(const double* q, const double* k, Index head_dim, Index i, Index j,
                            double dlogit, double* dq, double* dk) const {
    const Index a = amplitude_dims(head_dim), phase = head_dim - a;
    double amplitude = 0.0, phase_dot = 0.0;
    for (Index c = 0; c < a; ++c) amplitude += q[c] * k[c];
    for (Index c = a; c < head_dim; ++c) phase_dot += q[c] * k[c];
    const double amp = 1.0 / std::sqrt(double(a));
    double ga = dlogit * amp, gp = 0.0;
    if (phase > 0) {
      const double w =
          kTwoPi * std::pow(double(std::abs(i - j)), double(alpha)) / std::sqrt(double(phase));
      ga *= std::cos(w * phase_dot);
      gp = -dlogit * amp * amplitude * std::sin(w * phase_dot) * w;
    }
    for (Index c = 0; c < a; ++c) {
      dq[c] += ga * k[c];
      dk[c] += ga * q[c];
    }
    for (Index c = a; c < head_dim; ++c) {
      dq[c] += gp * k[c];
      dk[c] += gp * q[c];
    }
  }

  /// work[t] = 2 pi |d|^alpha / sqrt(d - a) for the distance d = (q_begin - k_begin) -
  /// (keys - 1) + t: key row jj and lane r read work[keys - 1 - jj + r], contiguous in r.
  void fill_frequencies(float* work, Index keys, Index lanes, Index q_begin, Index k_begin,
                        Index phase) const {
    const double per_dim = kTwoPi / std::sqrt(double(phase));
    const Index first = q_begin - k_begin - (keys - 1);
    for (Index t = 0; t < lanes + keys - 1; ++t)
      work[t] = static_cast<float>(per_dim * std::pow(double(std::abs(first + t)), double(alpha)));
  }

  /// The logit of query i and key j in double, the obvious way.
  double reference_logit(const double* q, const double* k, Index head_dim, Index i, Index j) const {
    const Index a = amplitude_dims(head_dim), phase = head_dim - a;
    double amplitude = 0.0, phase_dot = 0.0;
    for (Index c = 0; c < a; ++c) amplitude += q[c] * k[c];
    for (Index c = a; c < head_dim; ++c) phase_dot += q[c] * k[c];
    if (phase == 0) return amplitude / std::sqrt(double(a));
    const double distance = std::pow(double(std::abs(i - j)), double(alpha));
    return amplitude / std::sqrt(double(a)) *
           std::cos(kTwoPi * distance * phase_dot / std::sqrt(double(phase)));
  }
};

}  // namespace attnkit
