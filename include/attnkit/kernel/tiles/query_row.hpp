// The query row every kernel starts from: q's row widened to f32, turned by the Position at
// its position (RoPE; RowAt says which), then multiplied by the logit scale -- or by 1/|q|
// for normalizers with cosine logits (SoftplusL1), or left as it is where the Position forms
// the logits itself (TAPA). One step for the tile engine's query tiles
// (kernel/tiles/tile_queries.hpp), the decode row engine (kernel/decode/decode_rows.hpp) and the
// backward's (kernel/backward/backward_tiles.hpp), so the three see the same bits.
#pragma once

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/kernel/tiles/row_norms.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::detail {

/// row[0, head_dim) = the query row at src, prepared as above; returns the factor it was
/// multiplied by (the scale, 1 / |q| or 1).
template <class Spec, class Q>
float query_row(const Spec& spec, const Problem& p, const Q* src, const RowAt& at, float* row) {
  const Index dim = p.head_dim;
  row_to_f32(src, dim, row);
  if constexpr (transforms_rows<typename Spec::Position>()) spec.position.apply(row, dim, at);
  const float f = cosine_logits<typename Spec::Normalizer>() ? inverse_norm(row, dim)
                  : owns_product<typename Spec::Position>()  ? 1.f
                                                             : p.scale;
  constexpr Index kW = simd::kWidth;
  const Index whole = dim / kW * kW;
  const simd::Vec fv(f);
  for (Index c = 0; c < whole; c += kW) simd::store(row + c, simd::load(row + c) * fv);
  for (Index c = whole; c < dim; ++c) row[c] *= f;
  return f;
}

}  // namespace attnkit::detail
