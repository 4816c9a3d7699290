// Small stages of the backward tile (kernel/backward/backward_tiles.hpp) that need none of its
// state: masked pairs out of dP, rows times a per-key factor, and a normalization's projection.
#pragma once

#include <algorithm>
#include <limits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// Masked pairs and padding lanes (lanes nq .. lanes) of s[nk, ld]: logit -inf (weight 0)
/// and dp 0, so that whatever a masked value row holds never reaches dS (dp null: s only).
inline void drop_masked(float* s, float* dp, Index ld, Index nk, Index nq, Index lanes) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const simd::Vec neg_inf(kNegInf), zero(0.f);
  for (Index jj = 0; jj < nk; ++jj) {
    float* row = s + jj * ld;
    std::fill(row + nq, row + lanes, kNegInf);
    if (dp == nullptr) continue;
    for (Index c = 0; c < lanes; c += simd::kWidth) {
      const simd::Mask masked = simd::equal(simd::load(row + c), neg_inf);
      simd::store(dp + jj * ld + c, simd::select(masked, zero, simd::load(dp + jj * ld + c)));
    }
  }
}

/// Rows jj of t[nk, ld] (lanes wide) times f[jj]; exact zeros stay zero, so a masked pair's
/// dS stays 0 even where a key's factor is not finite (the inverse norm of a NaN key row).
inline void scale_rows(float* t, Index ld, const float* f, Index nk, Index lanes) {
  const simd::Vec zero(0.f);
  for (Index jj = 0; jj < nk; ++jj) {
    const simd::Vec x(f[jj]);
    for (Index c = 0; c < lanes; c += simd::kWidth) {
      const simd::Vec y = simd::load(t + jj * ld + c);
      simd::store(t + jj * ld + c, simd::select(simd::equal(y, zero), y, y * x));
    }
  }
}

/// x -= (x . u) u for the unit row u: the derivative of a normalization x / |x| applied to a
/// gradient (a zero u leaves x alone).
inline void project_out(float* x, const float* u, Index dim) {
  float dot = 0.f;
  for (Index c = 0; c < dim; ++c) dot += x[c] * u[c];
  for (Index c = 0; c < dim; ++c) x[c] -= dot * u[c];
}

}  // namespace attnkit::detail
