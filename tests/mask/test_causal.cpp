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

namespace ak = attnkit;
using ak::Index;
using ak::Range;
using ak::TileKind;

namespace {

const char* name(TileKind k) {
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

// Detects the optional visible_keys(b, h, Range q) -> Range hook without naming the
// library's trait, so this file does not depend on where that trait lives.
template <class M, class = void>
struct offers_visible_keys : std::false_type {};
template <class M>
struct offers_visible_keys<
    M, std::void_t<decltype(std::declval<const M&>().visible_keys(Index{}, Index{}, Range{}))>>
    : std::true_type {};

}  // namespace

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
  check_classify_agrees_with_keep(ak::Causal{}, /*partial_means_mixed=*/true);
}

TEST_CASE("Causal: visible_keys, when offered, covers every kept key and no more",
          "[mask][causal]") {
  if constexpr (offers_visible_keys<ak::Causal>::value) {
    const ak::Causal causal;
    for (Index qb = -10; qb < 40; qb += 3)
      for (Index len = 1; len < 9; ++len) {
        const Range q{qb, qb + len};
        const Range keys = causal.visible_keys(0, 0, q);
        INFO("q [" << q.begin << ", " << q.end << ") -> keys [" << keys.begin << ", " << keys.end
                   << ")");
        // Every key in [0, 60) kept by some query of q lies inside `keys`...
        for (Index j = 0; j < 60; ++j)
          if (kept_pairs(causal, q, Range{j, j + 1}) > 0) CHECK((keys.begin <= j && j < keys.end));
        // ... and the last key of `keys` is really kept (the range is tight at the end).
        if (keys.end > 0 && keys.end > keys.begin)
          CHECK(kept_pairs(causal, q, Range{keys.last(), keys.end}) > 0);
      }
  } else {
    SUCCEED("Causal offers no visible_keys hook");
  }
}

TEST_CASE("Full: keeps every pair and classifies every tile Full", "[mask][full]") {
  const ak::Full full;
  CHECK(full.keep(0, 0, 0, 0));
  CHECK(full.keep(0, 0, 0, 1000));  // keys after the query too
  CHECK(full.keep(1, 2, -7, 3));
  CHECK(full.classify(0, 0, Range{0, 64}, Range{64, 128}) == TileKind::Full);
  check_classify_agrees_with_keep(full, /*partial_means_mixed=*/true);
}
