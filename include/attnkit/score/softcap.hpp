// Softcap: logit -> cap * tanh(logit / cap) (Gemma 2, Grok). Bounds logits to (-cap, cap)
// before masking and normalization. A Score policy: Dot followed by this modification.
#pragma once

#include <cmath>

#include "attnkit/error.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/slots.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit {

struct Softcap {
  using slot = ScoreSlot;

  float cap;
  float inv_cap;  // hoisted: the tile loop multiplies, never divides

  explicit Softcap(float cap_) : cap(cap_), inv_cap(1.f / cap_) {
    detail::require(std::isfinite(cap_) && cap_ > 0.f, "Softcap::cap", "finite and > 0", cap_);
  }

  /// Element rule (the reference uses it): s -> cap * tanh(s / cap).
  double modify(double s, Index /*b*/, Index /*h*/, Index /*i*/, Index /*j*/) const {
    return cap * std::tanh(s / cap);
  }

  /// Tile form: s[rows, cols] with row stride ld, cols a whole number of vectors.
  void apply_tile(float* s, Index rows, Index cols, Index ld) const {
    const simd::Vec c(cap), ic(inv_cap);
    for (Index r = 0; r < rows; ++r)
      for (Index j = 0; j < cols; j += simd::kWidth) {
        float* p = s + r * ld + j;
        simd::store(p, c * simd::tanh(simd::load(p) * ic));
      }
  }
};

}  // namespace attnkit
