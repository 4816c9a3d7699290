// ParamGrads: where attention_backward() writes the gradients of the policies' own trained
// parameters, beside dQ, dK and dV. Every pointer is optional (nullptr: not computed).
#pragma once

namespace attnkit {

struct ParamGrads {
  // [q_heads]: the gradient of the normalizer's per-head parameter (its kTrainedParam):
  // Softmax's sink logits, Sigmoid's or ReluPower's bias. A bias shared by every head has
  // the sum over heads as its gradient. A normalizer without one refuses a buffer.
  float* normalizer = nullptr;

  // [the Position's param_count()]: the gradient of the Position's trained parameters (Fope:
  // per KV head its C coefficients [F, d/2], then its S coefficients). A Position without
  // them refuses a buffer.
  float* position = nullptr;

  ParamGrads with_position(float* out) const {
    ParamGrads g = *this;
    g.position = out;
    return g;
  }
  ParamGrads with_normalizer(float* out) const {
    ParamGrads g = *this;
    g.normalizer = out;
    return g;
  }
};

}  // namespace attnkit
