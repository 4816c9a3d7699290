// Remapped<Mask>: a mask seen through gathered rows. Data-dependent sparsity (select/) runs
// the tiled kernel on a subset of the queries and/or keys copied together: the queries that
// chose a key block (MoBA), the queries routed to full attention (All-or-Here), the key
// columns a query block kept (stripes). In such a call query row r and key j are gathered
// rows; their true positions are q_positions[r] and k_positions[j] (ascending), and the call's
// (batch, head) may stand for another one of the whole problem. Remapped asks the inner mask
// at the true positions, with every face it has:
//   keep      exact;
//   classify  on the hulls of the gathered ranges (Full or Empty on a hull holds for every
//             pair inside it, so the answer stays sound);
//   key_ranges / runs / for_each_key_range: the inner ranges of true positions, turned back
//             into ranges of gathered keys by binary search -- exact, as k_positions ascend.
// The call must use q_offset = 0 (row r is query r of the gathered set). Positions are
// borrowed: the arrays must outlive the call. Score mods and Position policies still see
// gathered indices, so a routed call uses position-free ones (Dot, Softcap, NoPosition).
#pragma once

#include <algorithm>
#include <cstddef>

#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

template <class Inner>
struct Remapped {
  using slot = MaskSlot;

  Inner inner;
  const Index* q_positions = nullptr;  // [Lq of the call], ascending; null: row r is at r
  const Index* k_positions = nullptr;  // [Lk of the call], ascending; null: key j is at j
  Index k_count = 0;                   // length of k_positions
  Index batch = -1, head = -1;         // the inner mask's (b, h); -1: the call's own

  Index q_at(Index i) const { return q_positions != nullptr ? q_positions[i] : i; }
  Index k_at(Index j) const { return k_positions != nullptr ? k_positions[j] : j; }
  Index b_of(Index b) const { return batch >= 0 ? batch : b; }
  Index h_of(Index h) const { return head >= 0 ? head : h; }

  bool keep(Index b, Index h, Index i, Index j) const {
    return inner.keep(b_of(b), h_of(h), q_at(i), k_at(j));
  }

  TileKind classify(Index b, Index h, Range q, Range kv) const {
    if (q.end <= q.begin || kv.end <= kv.begin) return TileKind::Empty;
    return detail::tile_kind_of(inner, b_of(b), h_of(h), hull_q(q),
                                Range{k_at(kv.begin), k_at(kv.last()) + 1});
  }

  auto key_ranges(Index b, Index h, Range q) const {
    return gathered(detail::key_ranges_of(inner, b_of(b), h_of(h), hull_q(q)));
  }

  template <class I = Inner, std::enable_if_t<detail::has_runs<I>::value, int> = 0>
  auto runs(Index b, Index h, Index i) const {
    return gathered(inner.runs(b_of(b), h_of(h), q_at(i)));
  }

  template <class Visit, class I = Inner,
            std::enable_if_t<detail::has_for_each_key_range<I, Range, Visit>::value, int> = 0>
  void for_each_key_range(Index b, Index h, Range q, Visit&& visit) const {
    inner.for_each_key_range(b_of(b), h_of(h), hull_q(q), [&](Range r) { visit(gathered(r)); });
  }

 private:
  Range hull_q(Range q) const {
    if (q.end <= q.begin) return q;
    return Range{q_at(q.begin), q_at(q.last()) + 1};
  }

  // The gathered keys whose true positions fall in r.
  Range gathered(Range r) const {
    if (k_positions == nullptr) return r;
    const Index* end = k_positions + k_count;
    return Range{std::lower_bound(k_positions, end, r.begin) - k_positions,
                 std::lower_bound(k_positions, end, r.end) - k_positions};
  }

  template <int N>
  KeyRanges<N> gathered(const KeyRanges<N>& ranges) const {
    KeyRanges<N> out;
    for (const Range& r : ranges) out.add(gathered(r));
    return out;
  }
};

/// A Remapped mask; q_positions / k_positions may be null (identity).
template <class Inner>
Remapped<Inner> remap(const Inner& inner, const Index* q_positions, const Index* k_positions,
                      Index k_count, Index batch = -1, Index head = -1) {
  return Remapped<Inner>{inner, q_positions, k_positions, k_count, batch, head};
}

}  // namespace attnkit
