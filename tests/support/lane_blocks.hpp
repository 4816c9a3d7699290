// Logit blocks for the normalizer unit tests: a normalizer's absorb() works on one State of
// simd::kWidth queries (one per lane) over a [keys, ld] block. These helpers build such
// blocks and read vectors back lane by lane, the same way for every normalizer.
#pragma once

#include <attnkit/core/tensor.hpp>
#include <attnkit/simd/simd.hpp>
#include <cstddef>
#include <limits>
#include <vector>

#include "support/test_names.hpp"

namespace attnkit::test::lanes {

using test::kInf;  // the non-finite constants, for the files that use this namespace
using test::kNaN;
using test::kNegInf;

inline constexpr int W = simd::kWidth;  // queries per State, one per lane
inline constexpr Index kLd = W + 3;     // row stride of a logit block: the lanes, then padding

using Rows = std::vector<std::vector<float>>;  // [W queries][keys] logits, -inf = masked

/// rows[q][j] = logit(q, j) for W queries and `keys` keys.
template <class F>
Rows make_rows(Index keys, F logit) {
  Rows rows(W, std::vector<float>(static_cast<std::size_t>(keys)));
  for (int q = 0; q < W; ++q)
    for (Index j = 0; j < keys; ++j) rows[q][static_cast<std::size_t>(j)] = logit(q, j);
  return rows;
}

/// A [keys, kLd] block whose lane q of key j holds logit(q, j); the padding holds NaN.
template <class F>
std::vector<float> make_block(Index keys, F logit) {
  std::vector<float> block(static_cast<std::size_t>(keys * kLd),
                           std::numeric_limits<float>::quiet_NaN());
  for (Index j = 0; j < keys; ++j)
    for (int q = 0; q < W; ++q) block[static_cast<std::size_t>(j * kLd + q)] = logit(q, j);
  return block;
}

/// Lane q of key j in a block made by make_block.
inline float at(const std::vector<float>& block, Index j, int q) {
  return block[static_cast<std::size_t>(j * kLd + q)];
}

/// The W lanes of a vector.
inline std::vector<float> lanes_of(simd::Vec v) {
  std::vector<float> out(W);
  simd::store(out.data(), v);
  return out;
}

}  // namespace attnkit::test::lanes
