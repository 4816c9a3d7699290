// Dot: the default score, logit = scale * q . k. The kernel folds `scale` into the packed
// Q tile, so the score tile leaves the GEMM already scaled and Dot needs no hook at all.
#pragma once

#include "attnkit/core/slots.hpp"

namespace attnkit {

struct Dot {
  using slot = ScoreSlot;
};

}  // namespace attnkit
