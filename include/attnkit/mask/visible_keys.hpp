// How many keys a query may see under a mask: N_i of the softplus (LSSA) normalizer, whose
// logit scale is log(d) * log(N_i). A mask with runs() answers in O(runs); any other mask
// is counted over the key tiles its schedule visits: a Full tile counts whole, a Partial
// one key by key through keep().
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/key_schedule.hpp"

namespace attnkit {

/// The number of keys j in [0, kv_len) with mask.keep(b, h, i, j), i the absolute query
/// position (query row + q_offset); `within` (default: all keys) counts only keys there.
template <class Mask>
Index visible_key_count(const Mask& mask, Index b, Index h, Index i, Index kv_len,
                        Range within = {0, -1}) {
  Index count = 0;
  if constexpr (detail::has_columns<Mask>::value) {  // its range part, then its columns
    const Index lo = std::max<Index>(within.begin, 0);
    const Index hi = within.end < 0 ? kv_len : std::min(within.end, kv_len);
    for (const Index j : mask.columns(b, h, i)) count += lo <= j && j < hi ? 1 : 0;
    return count + visible_key_count(mask.range_part(), b, h, i, kv_len, within);
  } else if constexpr (detail::has_runs<Mask>::value) {
    const Index lo = std::max<Index>(within.begin, 0);
    const Index hi = within.end < 0 ? kv_len : std::min(within.end, kv_len);
    for (const Range& r : mask.runs(b, h, i))
      count += std::max<Index>(0, std::min(r.end, hi) - std::max(r.begin, lo));
  } else {
    constexpr Index kTile = 256;
    detail::for_each_key_tile(
        mask, b, h, Range{i, i + 1}, kv_len, kTile,
        [&](Range kv, TileKind kind) {
          if (kind == TileKind::Full) {
            count += kv.end - kv.begin;
            return;
          }
          for (Index j = kv.begin; j < kv.end; ++j) count += mask.keep(b, h, i, j) ? 1 : 0;
        },
        within);
  }
  return count;
}

/// visible_key_count() of every query row of a call, indexed like the row statistics:
/// [(b * q_heads + h) * q_len + r] for the query at position r + q_offset. Split-KV callers
/// pass the counts of the whole call to each part (SoftplusL1::with_key_counts). Counts are
/// floats, exact up to 2^24 keys (beyond, log(N_i) is what they feed, and it barely moves).
template <class Mask>
std::vector<float> visible_key_counts(const Mask& mask, Index batch, Index q_heads, Index q_len,
                                      Index kv_len, Index q_offset = 0) {
  Index rows = 0;
  detail::require(detail::checked_product({batch, q_heads, q_len}, &rows) && rows >= 0,
                  "visible_key_counts(batch * q_heads * q_len)", "a representable size >= 0",
                  "an overflow or a negative size");
  std::vector<float> counts(static_cast<std::size_t>(rows));
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < q_heads; ++h)
      for (Index r = 0; r < q_len; ++r)
        counts[static_cast<std::size_t>((b * q_heads + h) * q_len + r)] =
            static_cast<float>(visible_key_count(mask, b, h, r + q_offset, kv_len));
  return counts;
}

}  // namespace attnkit
