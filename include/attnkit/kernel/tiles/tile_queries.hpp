// The query tile of the tile engine (kernel/tiles/attention_tiles.hpp): the rows of one query tile,
// transposed into the layout both products read, with everything that happens to a query row
// before its products -- the Position's transform (RoPE: each row turned at its position),
// the logit scale or, for cosine logits, 1/|q_i|, and with bf16 products (Options::products)
// the rounding to bf16, last.
#pragma once

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/kernel/tiles/pack.hpp"
#include "attnkit/kernel/tiles/query_row.hpp"
#include "attnkit/kernel/tiles/row_norms.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/storage/bf16_round.hpp"

namespace attnkit::detail {

/// qt[D, ld] = query rows [q0, q0 + nq) of head h in batch b, transposed, as above; columns
/// nq .. lanes are 0. row [D] and factor [nq] are scratch (a row being turned, the rows'
/// inverse norms). A Position that owns the product (TAPA) scales its own logits. With
/// `rows` [nq, D], the same rows are also left there in row form (the row-by-row products
/// read them): formed in rows first, then transposed, bit for bit the same qt.
template <class Spec, class Q>
void pack_query_tile(const Spec& spec, const Problem& p, const View<Q>& q, Index b, Index h,
                     Index q0, Index nq, Index lanes, bool bf16, float* qt, Index ld, float* row,
                     float* factor, float* rows = nullptr) {
  constexpr bool kCosine = cosine_logits<typename Spec::Normalizer>();
  const Index dim = p.head_dim;
  const auto at = [&](Index r) {
    return RowAt{b, h, q0 + r, p.q_len, q0 + r + p.q_offset, Role::Query};
  };
  if (rows != nullptr) {
    for (Index r = 0; r < nq; ++r) query_row(spec, p, q.row(b, h, q0 + r), at(r), rows + r * dim);
    if (bf16) round_rows_to_bf16(rows, nq, dim, dim);
    zero_padding_lanes(qt, ld, dim, nq, lanes);
    transpose_rows(rows, dim, nq, dim, qt, ld);
    return;
  }
  if constexpr (transforms_rows<typename Spec::Position>()) {
    zero_padding_lanes(qt, ld, dim, nq, lanes);
    for (Index r = 0; r < nq; ++r) {
      query_row(spec, p, q.row(b, h, q0 + r), at(r), row);
      for (Index c = 0; c < dim; ++c) qt[c * ld + r] = row[c];
    }
  } else if constexpr (kCosine) {  // q_i / |q_i|: the logits are cosines
    for (Index r = 0; r < nq; ++r) factor[r] = inverse_norm(q.row(b, h, q0 + r), dim);
    pack_q_transposed(q, b, h, q0, nq, lanes, factor, qt, ld);
  } else {
    const float scale = owns_product<typename Spec::Position>() ? 1.f : p.scale;
    pack_q_transposed(q, b, h, q0, nq, lanes, scale, qt, ld);
  }
  if (bf16) round_rows_to_bf16(qt, dim, lanes, ld);
}

}  // namespace attnkit::detail
