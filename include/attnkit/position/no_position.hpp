// NoPosition: the default Position policy; queries and keys are used as given.
#pragma once

#include "attnkit/core/slots.hpp"

namespace attnkit {

struct NoPosition {
  using slot = PositionSlot;
};

}  // namespace attnkit
