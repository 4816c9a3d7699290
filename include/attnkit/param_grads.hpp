// ParamGrads: where attention_backward() writes the gradients of the policies' own trained
// parameters, beside dQ, dK and dV. Every buffer is optional (empty: not computed) and
// carries its size, checked against what the call writes before anything is written.
#pragma once

#include "attnkit/core/span.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/options.hpp"

namespace attnkit {

struct ParamGrads {
  // [q_heads]: the gradient of the normalizer's per-head parameter (its kTrainedParam):
  // Softmax's sink logits, Sigmoid's or ReluPower's bias. A bias shared by every head has
  // the sum over heads as its gradient. A normalizer without one refuses a buffer.
  Span<float> normalizer;

  // [the Position's param_count()]: the gradient of the Position's trained parameters (Fope:
  // per KV head its C coefficients [F, d/2], then its S coefficients). A Position without
  // them refuses a buffer.
  Span<float> position;

  ParamGrads with_position(Span<float> out) const {
    return detail::with_field(*this, &ParamGrads::position, out);
  }
  ParamGrads with_position(float* out, Index size) const {
    return with_position(Span<float>(out, size));
  }
  ParamGrads with_normalizer(Span<float> out) const {
    return detail::with_field(*this, &ParamGrads::normalizer, out);
  }
  ParamGrads with_normalizer(float* out, Index size) const {
    return with_normalizer(Span<float>(out, size));
  }
};

}  // namespace attnkit
