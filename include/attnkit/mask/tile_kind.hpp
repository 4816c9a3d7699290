// TileKind and Range: the tile-level face of a mask. A mask's classify() says whether a
// (query range, key range) tile is Empty (skipped), Full (keep() never evaluated) or
// Partial (keep() evaluated per element).
#pragma once

#include "attnkit/core/tensor.hpp"

namespace attnkit {

enum class TileKind { Empty, Full, Partial };

/// Half-open range of absolute positions [begin, end).
struct Range {
  Index begin = 0, end = 0;
  Index last() const { return end - 1; }
};

}  // namespace attnkit
