// select_topk(): the exact top k of one query's row of indexer scores (DeepSeek Sparse
// Attention's selection; dsa/indexer.hpp fills the row). Order: a higher score first, on
// equal scores the lower key. The k-th largest score is found by a radix select on the
// scores' bits mapped to unsigned integers that order as the floats do (a histogram of the
// top 11 bits over the row, then of the next 11 and the last 10 over the keys of the chosen
// bucket only), then one pass in key order keeps every key
// above it and, of the keys equal to it, the lowest ones: O(n) work, the output in
// increasing key order, the same bits for any thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attnkit/core/index.hpp"

namespace attnkit::detail {

/// A float's bits as an unsigned integer in the floats' order, -0 as +0 (they compare
/// equal); NaN is unordered (the scores are finite).
inline std::uint32_t ordered_bits(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) == 0) return 0x80000000u;  // either zero
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

/// out[0, k) = the keys of the k highest of scores[0, n) (ties: the lower key) in increasing
/// order, -1 past n. `bits` and `candidates` are scratch.
inline void select_topk(const float* scores, Index n, Index k, std::int32_t* out,
                        std::vector<std::uint32_t>& bits, std::vector<Index>& candidates) {
  if (n <= k) {
    for (Index i = 0; i < k; ++i) out[i] = i < n ? std::int32_t(i) : -1;
    return;
  }
  // Pass 1 over the row: the bits and the histogram of their top 11.
  bits.resize(std::size_t(n));
  std::array<Index, 2048> hist{};
  for (Index i = 0; i < n; ++i) {
    const std::uint32_t u = ordered_bits(scores[i]);
    bits[std::size_t(i)] = u;
    ++hist[u >> 21];
  }
  Index wanted = k;  // how many of the keys matching the prefix are still to be kept
  const auto choose = [&](std::uint32_t digits) {  // the bucket holding the wanted-th highest
    Index above = 0;
    std::uint32_t bucket = digits;
    for (;; --bucket) {
      if (above + hist[bucket] >= wanted) break;
      above += hist[bucket];
    }
    wanted -= above;
    return bucket;
  };
  std::uint32_t prefix = choose(0x7FF) << 21, mask = 0x7FFu << 21;
  // The keys in that bucket (few, for spread scores); passes 2 and 3 read only them.
  candidates.clear();
  for (Index i = 0; i < n; ++i)
    if ((bits[std::size_t(i)] & mask) == prefix) candidates.push_back(i);
  constexpr int kShifts[2] = {10, 0};
  constexpr std::uint32_t kDigits[2] = {0x7FF, 0x3FF};
  for (int pass = 0; pass < 2; ++pass) {
    const int shift = kShifts[pass];
    const std::uint32_t digits = kDigits[pass];
    std::fill(hist.begin(), hist.end(), Index{0});
    for (const Index i : candidates) {
      const std::uint32_t u = bits[std::size_t(i)];
      if ((u & mask) == prefix) ++hist[(u >> shift) & digits];
    }
    prefix |= choose(digits) << shift;
    mask |= digits << shift;
  }
  // prefix is the k-th highest value; `wanted` of the keys equal to it are kept (the lowest).
  Index j = 0;
  for (Index i = 0; i < n && j < k; ++i) {
    const std::uint32_t u = bits[std::size_t(i)];
    if (u > prefix || (u == prefix && wanted-- > 0)) out[j++] = std::int32_t(i);
  }
}

}  // namespace attnkit::detail
