// Full: every query sees every key (the default mask).
#pragma once

#include "attnkit/core/slots.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

struct Full {
  using slot = MaskSlot;

  bool keep(Index /*b*/, Index /*h*/, Index /*i*/, Index /*j*/) const { return true; }
  TileKind classify(Index /*b*/, Index /*h*/, Range /*q*/, Range /*kv*/) const {
    return TileKind::Full;
  }
};

}  // namespace attnkit
