// Causal (and Full, the default mask): the element rule keep() and the tile rule
// classify(), which must agree: Empty tiles keep no pair, Full tiles keep every pair, and
// for Causal a Partial tile really is mixed (the classification is tight). Range::last()
// (tile_kind.hpp) is the last position of a half-open range.
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/mask/tile_kind.hpp>
#include <catch2/catch_test_macros.hpp>
#include <random>
#include <type_traits>
#include <utility>

#include "support/mask_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::Range;
using ak::TileKind;

TEST_CASE("Range: is half-open and last() is end - 1", "[mask][range]") {
  CHECK(Range{3, 8}.last() == 7);
  CHECK(Range{0, 1}.last() == 0);
  CHECK(Range{-5, -2}.last() == -3);
  const Range r;
  CHECK(r.begin == 0);
  CHECK(r.end == 0);
}

TEST_CASE("Causal: a query keeps the keys at or before its absolute position", "[mask][causal]") {
  const ak::Causal causal;
  CHECK(causal.keep(0, 0, 5, 0));
  CHECK(causal.keep(0, 0, 5, 4));
  CHECK(causal.keep(0, 0, 5, 5));  // the diagonal is visible
  CHECK_FALSE(causal.keep(0, 0, 5, 6));
  CHECK_FALSE(causal.keep(0, 0, 0, 1));
  CHECK(causal.keep(0, 0, 0, 0));
  // A query before key 0 (negative q_offset) sees nothing.
  CHECK_FALSE(causal.keep(0, 0, -1, 0));
  // Batch and head do not matter.
  CHECK(causal.keep(3, 7, 10, 10) == causal.keep(0, 0, 10, 10));
  CHECK(causal.keep(3, 7, 10, 11) == causal.keep(0, 0, 10, 11));
}

TEST_CASE("Causal: classify on hand-picked tiles around the diagonal", "[mask][causal]") {
  const ak::Causal causal;
  const Range q{10, 20};                                            // queries at positions 10..19
  CHECK(causal.classify(0, 0, q, Range{0, 10}) == TileKind::Full);  // all keys <= 9
  CHECK(causal.classify(0, 0, q, Range{0, 11}) == TileKind::Full);  // key 10 <= query 10
  CHECK(causal.classify(0, 0, q, Range{0, 12}) == TileKind::Partial);   // key 11 > query 10
  CHECK(causal.classify(0, 0, q, Range{10, 20}) == TileKind::Partial);  // the diagonal tile
  CHECK(causal.classify(0, 0, q, Range{19, 30}) == TileKind::Partial);  // key 19 <= query 19
  CHECK(causal.classify(0, 0, q, Range{20, 30}) == TileKind::Empty);    // every key in the future
  CHECK(causal.classify(0, 0, Range{-8, -1}, Range{0, 64}) == TileKind::Empty);
  CHECK(causal.classify(0, 0, Range{100, 101}, Range{0, 101}) == TileKind::Full);  // one row
}

TEST_CASE("Causal: classify agrees with keep on random tiles, and Partial tiles are mixed",
          "[mask][causal][random]") {
  // Empty => no pair kept, Full => every pair kept, and Partial => some pairs kept and some
  // not: Causal's classification is tight, so the kernel never evaluates keep() on a tile
  // that is in fact uniform.
  ak::test::check_classify_agrees_with_keep(ak::Causal{}, /*partial_means_mixed=*/true);
}

TEST_CASE("Causal: key_ranges covers every kept key and ends at the last one", "[mask][causal]") {
  const ak::Causal causal;
  ak::test::check_key_ranges_cover(causal);
  for (Index qb = -10; qb < 40; qb += 3) {
    const Range q{qb, qb + 5};
    const auto keys = causal.key_ranges(0, 0, q);
    if (q.last() < 0) {  // every query before key 0: nothing to walk
      CHECK(keys.count == 0);
      continue;
    }
    REQUIRE(keys.count == 1);
    CHECK(keys.ranges[0].end == q.last() + 1);  // tight: the kernel stops at the last key
  }
}

TEST_CASE("Causal: runs lists exactly the keys each query keeps", "[mask][causal]") {
  ak::test::check_runs_equal_keep(ak::Causal{});
}

TEST_CASE("Full: keeps every pair and classifies every tile Full", "[mask][full]") {
  const ak::Full full;
  CHECK(full.keep(0, 0, 0, 0));
  CHECK(full.keep(0, 0, 0, 1000));  // keys after the query too
  CHECK(full.keep(1, 2, -7, 3));
  CHECK(full.classify(0, 0, Range{0, 64}, Range{64, 128}) == TileKind::Full);
  ak::test::check_classify_agrees_with_keep(full, /*partial_means_mixed=*/true);
}
