// Alibi: attention with linear biases (Press et al., 2022): logit_ij = s_ij - slope_h |i - j|,
// one slope per query head. A Score policy: Dot followed by this bias, applied before the
// mask, so masked pairs are -inf whatever their distance.
//
// Why |i - j| and not the authors' code: theirs adds slope_h * j to every row (a bias that
// grows towards the newest key), which differs from -slope_h (i - j) by slope_h * i, a
// constant per row. Softmax cancels it; the row's LSE and sigmoid (no normalization) do
// not, so the distance form is the one whose LSE and sigmoid weights mean something. The
// absolute value makes it symmetric, so Full (encoder, non-causal) use is defined too.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct Alibi {
  using slot = ScoreSlot;
  static constexpr bool kReadsPositions = true;  // a bias by distance i - j
  // The bias is added: d(modified logit) / d(logit) = 1 (attention_backward() needs no
  // derivative face; the slopes are fixed, not trained).
  static constexpr bool kUnitDerivative = true;

  std::vector<float> slopes;  // [Hq], one per query head

  /// Explicit slopes, one per query head (validated: finite).
  explicit Alibi(std::vector<float> slopes_) : slopes(std::move(slopes_)) {
    for (std::size_t h = 0; h < slopes.size(); ++h)
      detail::require(std::isfinite(slopes[h]), detail::cat("Alibi.slopes[", h, "]"), "finite",
                      slopes[h]);
  }

  /// The authors' slopes for `heads` query heads (get_slopes in the ALiBi repository, HF
  /// BLOOM's build_alibi_tensor): for H a power of two 2^(-8 (h + 1) / H); otherwise the
  /// slopes of the power of two P just below H, then the odd-numbered slopes of 2P
  /// (2^(-8 k / 2P), k = 1, 3, 5, ...) for the remaining H - P heads.
  static Alibi standard(Index heads) {
    detail::require(heads >= 1, "Alibi::standard(heads)", ">= 1", heads);
    Index p = 1;
    while (2 * p <= heads) p *= 2;  // the closest power of two at or below `heads`
    std::vector<float> s;
    for (Index h = 1; h <= p; ++h)
      s.push_back(static_cast<float>(std::exp2(-8.0 * double(h) / double(p))));
    for (Index k = 1; Index(s.size()) < heads; k += 2)
      s.push_back(static_cast<float>(std::exp2(-8.0 * double(k) / double(2 * p))));
    return Alibi(std::move(s));
  }

  /// attention() calls this: one slope per query head of the call.
  void validate(Index /*q_len*/, Index /*kv_len*/, Index /*q_offset*/, Index /*batch*/,
                Index q_heads) const {
    detail::require(Index(slopes.size()) == q_heads, "Alibi.slopes.size()",
                    detail::cat("q_heads = ", q_heads), slopes.size());
  }

  /// Element rule (the reference uses it): s -> s - slope_h |i - j|, absolute positions.
  double modify(double s, Index /*b*/, Index h, Index i, Index j) const {
    const auto distance = static_cast<double>(i > j ? i - j : j - i);
    return s - static_cast<double>(slopes[static_cast<std::size_t>(h)]) * distance;
  }

  /// Tile form: s[keys, lanes] with row stride ld, lanes a whole number of vectors; lane l
  /// is query where.q_begin + l, row r is key where.k_begin + r. Distances are formed in
  /// f32, exact below 2^24 positions; one fma per logit rounds the bias once.
  void apply_tile(float* s, Index keys, Index lanes, Index ld, const ScoreTile& where) const {
    float lane_index[simd::kWidth];  // [kWidth]: 0, 1, ..., kWidth - 1
    for (int l = 0; l < simd::kWidth; ++l) lane_index[l] = static_cast<float>(l);
    const simd::Vec iota = simd::load(lane_index), step(static_cast<float>(simd::kWidth));
    const simd::Vec neg_slope(-slopes[static_cast<std::size_t>(where.head)]);
    for (Index r = 0; r < keys; ++r) {
      // (q_begin + lane) - (k_begin + r) for the lanes of the first vector, then + kWidth.
      simd::Vec distance = iota + simd::Vec(static_cast<float>(where.q_begin - where.k_begin - r));
      float* row = s + r * ld;
      for (Index j = 0; j < lanes; j += simd::kWidth, distance = distance + step)
        simd::store(row + j, simd::fma(simd::abs(distance), neg_slope, simd::load(row + j)));
    }
  }
};

}  // namespace attnkit
