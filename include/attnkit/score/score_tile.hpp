// ScoreTile: where a tile of logits sits, handed to a Score policy's apply_tile(). The
// kernel's logit tiles are transposed: s[key, lane] with row stride ld, one SIMD lane per
// query, so that mods depending on (i, j) (ALiBi, user lambdas) can find their positions.
#pragma once

#include "attnkit/tensor.hpp"

namespace attnkit {

struct ScoreTile {
  Index batch = 0, head = 0;  // query head
  Index q_begin = 0;          // absolute position of lane 0's query (row + q_offset)
  Index k_begin = 0;          // position of key row 0
};

}  // namespace attnkit
