// KeyGrads: the dK and dV accumulators of one item of attention_backward()'s tile engine
// (kernel/backward/backward_tiles.hpp) -- rows [Lk, d_pad] and [Lk, dv_pad] the key tiles add into.
// Rows are zeroed only as far as the key tiles reach, so a part of an item (a range of its
// query tiles: kernel/attention_backward.hpp, backward_parts()) need not clear the rows of
// keys it never reaches; an item's parts are summed in part order, so the gradients do not
// depend on which thread ran which part.
#pragma once

#include <algorithm>

#include "attnkit/core/tensor.hpp"

namespace attnkit::detail {

struct KeyGrads {
  float* k = nullptr;  // [Lk, d_pad]  dK rows
  float* v = nullptr;  // [Lk, dv_pad] dV rows
  Index d_pad = 0, dv_pad = 0;
  Index zeroed = 0;  // rows [0, zeroed) zeroed since begin()

  /// Accumulate into these rows from now on, none zeroed yet.
  void begin(float* k_rows, float* v_rows) { k = k_rows, v = v_rows, zeroed = 0; }

  /// Rows [zeroed, end) zeroed: the key tiles have reached key end - 1.
  void reach(Index end) {
    if (end <= zeroed) return;
    std::fill(k + zeroed * d_pad, k + end * d_pad, 0.f);
    std::fill(v + zeroed * dv_pad, v + end * dv_pad, 0.f);
    zeroed = end;
  }

  /// These rows [0, len) = the sum of `parts` parts of len rows each (k_parts, v_parts: one
  /// after another; the first written[s] rows of part s hold its gradients), in part order.
  void sum_parts(const float* k_parts, const float* v_parts, Index parts, Index len,
                 const Index* written) {
    zeroed = 0;
    reach(len);
    for (Index s = 0; s < parts; ++s) {
      const float* pk = k_parts + s * len * d_pad;
      const float* pv = v_parts + s * len * dv_pad;
      for (Index i = 0; i < written[s] * d_pad; ++i) k[i] += pk[i];
      for (Index i = 0; i < written[s] * dv_pad; ++i) v[i] += pv[i];
    }
  }
};

}  // namespace attnkit::detail
