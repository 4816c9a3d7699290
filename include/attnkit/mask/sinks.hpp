// Sinks{n}: the first n keys (positions 0 .. n-1), which every query sees. Alone it is
// rarely useful; StreamingLLM is `Causal{} & (Sinks{4} | SlidingWindow{w, 0})`.
#pragma once

#include <cstdint>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

struct Sinks {
  using slot = MaskSlot;

  Index count = 0;

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const { return detail::TagHash::of<Sinks>().add(count).value(); }

  /// Throws Error for a negative count.
  explicit Sinks(Index n) : count(n) { detail::require(n >= 0, "Sinks.count", ">= 0", n); }

  bool keep(Index /*b*/, Index /*h*/, Index /*i*/, Index j) const { return 0 <= j && j < count; }

  KeyRanges<1> runs(Index /*b*/, Index /*h*/, Index /*i*/) const { return key_range(0, count); }

  KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, Range /*q*/) const {
    return key_range(0, count);
  }

  TileKind classify(Index /*b*/, Index /*h*/, Range /*q*/, Range kv) const {
    if (kv.begin >= count || kv.end <= 0) return TileKind::Empty;
    return kv.begin >= 0 && kv.end <= count ? TileKind::Full : TileKind::Partial;
  }
};

}  // namespace attnkit
