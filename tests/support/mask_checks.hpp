// Property checks shared by the mask tests: a mask's faces must agree with its element rule
// keep(). classify() is checked tile by tile (Empty keeps nothing, Full keeps everything,
// Partial is mixed where the mask promises a tight classification), key_ranges() must cover
// every kept key of a query range, runs() must list exactly the keys a query keeps, and the
// gathered-columns face (range_part() and columns()) must split keep() in two, exactly.
#pragma once

#include <attnkit/detail/traits.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/tile_kind.hpp>
#include <catch2/catch_test_macros.hpp>
#include <random>
#include <vector>

#include "support/case.hpp"

namespace attnkit::test {

inline const char* name(TileKind k) {
  return k == TileKind::Empty ? "Empty" : k == TileKind::Full ? "Full" : "Partial";
}

// How many (i, j) pairs of the tile the element rule keeps.
template <class Mask>
Index kept_pairs(const Mask& mask, Range q, Range kv) {
  Index kept = 0;
  for (Index i = q.begin; i < q.end; ++i)
    for (Index j = kv.begin; j < kv.end; ++j) kept += mask.keep(0, 0, i, j) ? 1 : 0;
  return kept;
}

// Classifies many random non-empty tiles and checks each against keep() pair by pair.
// Query positions may be negative (q_offset < 0 puts rows before key 0).
template <class Mask>
void check_classify_agrees_with_keep(const Mask& mask, bool partial_means_mixed) {
  std::mt19937 rng(2024);
  std::uniform_int_distribution<Index> q_start(-40, 120), kv_start(0, 120), length(1, 40);
  int seen[3] = {0, 0, 0};
  for (int t = 0; t < 5000; ++t) {
    const Index qb = q_start(rng), kb = kv_start(rng);
    const Range q{qb, qb + length(rng)}, kv{kb, kb + length(rng)};
    const TileKind kind = mask.classify(0, 0, q, kv);
    const Index kept = kept_pairs(mask, q, kv);
    const Index pairs = (q.end - q.begin) * (kv.end - kv.begin);
    ++seen[static_cast<int>(kind)];
    INFO("q [" << q.begin << ", " << q.end << ") kv [" << kv.begin << ", " << kv.end << ") -> "
               << name(kind) << ", keeps " << kept << " of " << pairs);
    switch (kind) {
      case TileKind::Empty:
        CHECK(kept == 0);
        break;
      case TileKind::Full:
        CHECK(kept == pairs);
        break;
      case TileKind::Partial:
        if (partial_means_mixed) CHECK((kept > 0 && kept < pairs));
        break;
    }
  }
  UNSCOPED_INFO("Empty " << seen[0] << ", Full " << seen[1] << ", Partial " << seen[2]);
}

// key_ranges(q), clipped to the keys [0, 200), holds every key in that window that some query of q
// keeps, for query ranges across negative and positive positions.
template <class Mask>
void check_key_ranges_cover(const Mask& mask) {
  for (Index qb = -20; qb < 150; qb += 7)
    for (Index len : {1, 3, 16, 40}) {
      const Range q{qb, qb + len};
      const auto ranges = mask.key_ranges(0, 0, q);
      for (Index j = 0; j < 200; ++j) {
        if (kept_pairs(mask, q, Range{j, j + 1}) == 0) continue;
        bool covered = false;
        for (const Range& r : ranges) covered = covered || (r.begin <= j && j < r.end);
        INFO("q [" << q.begin << ", " << q.end << ") key " << j);
        CHECK(covered);
      }
    }
}

// runs(i) lists exactly the keys query i keeps, as sorted, disjoint, non-empty ranges.
template <class Mask>
void check_runs_equal_keep(const Mask& mask) {
  for (Index i = -20; i < 150; ++i) {
    const auto runs = mask.runs(0, 0, i);
    Index previous_end = -(Index{1} << 62);
    for (const Range& r : runs) {
      CHECK(r.begin < r.end);
      CHECK(previous_end < r.begin);  // sorted, disjoint and not touching (merged)
      previous_end = r.end;
    }
    for (Index j = 0; j < 200; ++j) {
      bool in_runs = false;
      for (const Range& r : runs) in_runs = in_runs || (r.begin <= j && j < r.end);
      INFO("query " << i << " key " << j);
      CHECK(in_runs == mask.keep(0, 0, i, j));
    }
  }
}

// keep(i, j) == range_part().keep(i, j) || j in columns(i), for queries at `positions`
// (any, beyond 2^k distances too) and keys [0, keys): columns ascending, none kept by the
// range part, and (with the range part's runs) the range part's own faces agree with it.
template <class Mask>
void check_columns_split_keep(const Mask& mask, const std::vector<Index>& positions, Index keys) {
  const auto part = mask.range_part();
  for (const Index i : positions) {
    const auto columns = mask.columns(0, 0, i);
    INFO("query " << i);
    CHECK(columns.count <= columns.kCapacity);
    std::vector<char> is_column(static_cast<std::size_t>(keys), 0);
    for (int t = 0; t < columns.count; ++t) {
      const Index j = columns.keys[t];
      INFO("column " << j);
      if (t > 0) CHECK(columns.keys[t - 1] < j);
      CHECK(!part.keep(0, 0, i, j));
      CHECK(mask.keep(0, 0, i, j));
      if (0 <= j && j < keys) is_column[static_cast<std::size_t>(j)] = 1;
    }
    Index mismatches = 0;
    for (Index j = 0; j < keys; ++j)
      mismatches += mask.keep(0, 0, i, j) !=
                    (part.keep(0, 0, i, j) || is_column[static_cast<std::size_t>(j)] != 0);
    CHECK(mismatches == 0);
  }
}

// A BlockMask layout for the call `c`: shared across heads, or one pattern per query head.
inline BlockMaskLayout block_layout(const Case& c, Index block_q, Index block_k,
                                    bool per_head = false) {
  BlockMaskLayout l;
  l.batch = c.batch;
  l.heads = per_head ? c.q_heads : 1;
  l.q_len = c.q_len;
  l.kv_len = c.kv_len;
  l.block_q = block_q;
  l.block_k = block_k;
  l.q_offset = c.offset();
  return l;
}

}  // namespace attnkit::test
