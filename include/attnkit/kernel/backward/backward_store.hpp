// The last stage of attention_backward()'s tile engine (kernel/backward/backward_tiles.hpp): the
// f32 rows of dQ (one query tile's) and of dK, dV (one item's, kernel/backward/backward_keys.hpp)
// taken back through what the forward did to Q and K before the products -- the scale, a cosine
// normalization's projection, the Position's turn (its transpose) -- with the Position's own
// parameter gradient taken on the way, and stored in the gradients' storage.
#pragma once

#include <algorithm>

#include "attnkit/detail/traits.hpp"
#include "attnkit/kernel/backward/backward_keys.hpp"
#include "attnkit/kernel/backward/backward_stages.hpp"  // project_out
#include "attnkit/kernel/backward/backward_traits.hpp"
#include "attnkit/kernel/tiles/row_norms.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/problem.hpp"

namespace attnkit::detail {

/// dq rows q0 .. q0 + nq - 1 of head h from dq_tile [nq, d_pad]: times the scale (cosine
/// logits: the projection off the unit query qrow [nq, d_pad], times inv_q[r] = 1 / |q_r|),
/// the Position's parameter gradient added to position_grad (when not null), turned back.
template <class Spec, class Q, class GQ>
void store_query_grads(const Spec& spec, const Problem& p, const View<Q>& q, const View<GQ>& dq,
                       Index b, Index h, Index q0, Index nq, float* dq_tile, Index d_pad,
                       const float* qrow, const float* inv_q, double* position_grad) {
  using Position = typename Spec::Position;
  const Index dim = p.head_dim;
  for (Index r = 0; r < nq; ++r) {
    float* x = dq_tile + r * d_pad;
    if constexpr (cosine_logits<typename Spec::Normalizer>()) {
      project_out(x, qrow + r * d_pad, dim);
      for (Index c = 0; c < dim; ++c) x[c] *= inv_q[r];
    } else if constexpr (!owns_product<Position>()) {  // a Tapa-like Position scales its own
      for (Index c = 0; c < dim; ++c) x[c] *= p.scale;
    }
    const RowAt at{b, h, q0 + r, p.q_len, q0 + r + p.q_offset, Role::Query};
    if constexpr (has_position_param_grad<Position>::value)
      if (position_grad != nullptr)
        spec.position.accumulate_param_grad(q.row(b, h, q0 + r), x, at, position_grad);
    if constexpr (transforms_rows<Position>()) spec.position.apply_transpose(x, dim, at);
    GQ* out = dq.row(b, h, q0 + r);
    for (Index c = 0; c < dim; ++c) out[c] = static_cast<GQ>(x[c]);
  }
}

/// dk, dv rows of KV head hk in batch b from acc: dK through the projection off the unit key
/// (cosine logits: k's rows times key_scale, the keys' inverse norms; row: scratch [d]), the
/// Position's parameter gradient (k_raw: the keys before the turn) and its turn back.
template <class Spec, class K, class KR, class GK, class GV>
void store_key_grads(const Spec& spec, const Problem& p, const View<K>& k, const View<KR>& k_raw,
                     const View<GK>& dk, const View<GV>& dv, Index b, Index hk, const KeyGrads& acc,
                     const float* key_scale, float* row, double* position_grad) {
  using Position = typename Spec::Position;
  const Index dim = p.head_dim;
  for (Index j = 0; j < p.kv_len; ++j) {
    float* x = acc.k + j * acc.d_pad;
    if constexpr (cosine_logits<typename Spec::Normalizer>()) {  // its inverse norm is in dS
      const float inv = key_scale[(b * p.kv_heads + hk) * p.kv_len + j];
      const K* key = k.row(b, hk, j);
      if (std::any_of(x, x + dim, [](float y) { return y != 0.f; })) {
        for (Index c = 0; c < dim; ++c) row[c] = static_cast<float>(key[c]) * inv;
        project_out(x, row, dim);
      }
    }
    const RowAt at{b, hk, j, p.kv_len, j, Role::Key};
    if constexpr (has_position_param_grad<Position>::value)
      if (position_grad != nullptr)
        spec.position.accumulate_param_grad(k_raw.row(b, hk, j), x, at, position_grad);
    if constexpr (transforms_rows<Position>()) spec.position.apply_transpose(x, dim, at);
    GK* out = dk.row(b, hk, j);
    for (Index c = 0; c < dim; ++c) out[c] = static_cast<GK>(x[c]);
    const float* y = acc.v + j * acc.dv_pad;
    GV* vout = dv.row(b, hk, j);
    for (Index c = 0; c < p.value_dim; ++c) vout[c] = static_cast<GV>(y[c]);
  }
}

}  // namespace attnkit::detail
