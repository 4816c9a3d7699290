// Softcap: logit -> cap * tanh(logit / cap) (Gemma 2, Grok). Bounds logits to (-cap, cap)
// before masking and normalization. A Score policy: Dot followed by this modification.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

struct Softcap {
  using slot = ScoreSlot;
  static constexpr bool kReadsPositions = false;  // c tanh(s / c): the logit alone

  float cap;
  float inv_cap;  // hoisted: the tile loop multiplies, never divides

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const { return detail::TagHash::of<Softcap>().add(cap).value(); }

  explicit Softcap(float cap_) : cap(cap_), inv_cap(1.f / cap_) {
    // A cap below FLT_MIN would make inv_cap infinite and 0 * inv_cap NaN.
    detail::require(std::isfinite(cap_) && cap_ >= std::numeric_limits<float>::min(),
                    "Softcap::cap", "finite and >= FLT_MIN", cap_);
  }

  /// Element rule (the reference uses it): s -> cap * tanh(s / cap).
  double modify(double s, Index /*b*/, Index /*h*/, Index /*i*/, Index /*j*/) const {
    const double c = static_cast<double>(cap);  // the reference computes in double
    return c * std::tanh(s / c);
  }

  /// Tile form: s[keys, lanes] with row stride ld, lanes a whole number of vectors. The
  /// cap does not depend on positions, so `where` is unused.
  void apply_tile(float* s, Index keys, Index lanes, Index ld, const ScoreTile& /*where*/) const {
    const simd::Vec c(cap), ic(inv_cap);
    for (Index r = 0; r < keys; ++r)
      for (Index j = 0; j < lanes; j += simd::kWidth) {
        float* p = s + r * ld + j;
        simd::store(p, c * simd::tanh(simd::load(p) * ic));
      }
  }

  // Backward (attention_backward()): d/ds cap tanh(s / cap) = 1 - tanh^2 = 1 - (t / cap)^2
  // of the capped logit t.
  /// Element rule: the derivative at the uncapped logit s.
  double derivative(double s, Index /*b*/, Index /*h*/, Index /*i*/, Index /*j*/) const {
    const double t = std::tanh(s / static_cast<double>(cap));
    return 1.0 - t * t;
  }

  /// Tile form: g[keys, lanes] = the derivative, from the capped logits t[keys, lanes].
  void derivative_tile(const float* t, float* g, Index keys, Index lanes, Index ld,
                       const ScoreTile& /*where*/) const {
    const simd::Vec one(1.f), ic(inv_cap);
    for (Index r = 0; r < keys; ++r)
      for (Index j = 0; j < lanes; j += simd::kWidth) {
        const simd::Vec x = simd::load(t + r * ld + j) * ic;
        simd::store(g + r * ld + j, one - x * x);
      }
  }
};

}  // namespace attnkit
