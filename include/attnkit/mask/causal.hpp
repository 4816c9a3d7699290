// Causal: query at absolute position i sees keys j <= i. Positions are absolute: the kernel
// passes i = row + q_offset, so with the default q_offset = Lk - Lq the mask is
// bottom-right aligned (queries sit at the end of the keys, as in decode).
#pragma once

#include "attnkit/core/slots.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

struct Causal {
  using slot = MaskSlot;

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const { return j <= i; }

  /// The keys query i sees: [0, i].
  KeyRanges<1> runs(Index /*b*/, Index /*h*/, Index i) const { return key_range(0, i + 1); }

  /// Keys any query of q may see: [0, q.last()] (the kernel walks only these).
  KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, Range q) const {
    return key_range(0, q.last() + 1);
  }

  TileKind classify(Index /*b*/, Index /*h*/, Range q, Range kv) const {
    if (kv.begin > q.last()) return TileKind::Empty;  // every key is in every row's future
    if (kv.last() <= q.begin) return TileKind::Full;  // every key is in every row's past
    return TileKind::Partial;
  }
};

}  // namespace attnkit
