// Causal: query at absolute position i sees keys j <= i. Positions are absolute: the kernel
// passes i = row + q_offset, so with the default q_offset = Lk - Lq the mask is
// bottom-right aligned (queries sit at the end of the keys, as in decode).
#pragma once

#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/slots.hpp"

namespace attnkit {

struct Causal {
  using slot = MaskSlot;

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const { return j <= i; }

  /// Keys any query of q may see: [0, q.last()] (the kernel clips the key loop to it).
  Range visible_keys(Index /*b*/, Index /*h*/, Range q) const { return {0, q.last() + 1}; }

  TileKind classify(Index /*b*/, Index /*h*/, Range q, Range kv) const {
    if (kv.begin > q.last()) return TileKind::Empty;  // every key is in every row's future
    if (kv.last() <= q.begin) return TileKind::Full;  // every key is in every row's past
    return TileKind::Partial;
  }
};

}  // namespace attnkit
