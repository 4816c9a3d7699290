// PowerOfTwo{sinks, window}: query i keeps the keys at distance 2^k behind it, the keys of
// the window i - window <= j <= i, and the first `sinks` keys, never a future key. Its
// classify() is correct but not tight: a Partial tile may in fact keep every pair or none
// (the points at distance 2^k are not tracked per tile), so mixedness is never asserted.
// key_ranges() is exact (every listed key is kept by some query) and sparse; there is no
// runs() face. Its gathered-columns face splits keep() into the sinks and the window (a mask
// of ranges) and the keys at distances 2^k beyond the window, per query.
#include <attnkit/core/error.hpp>
#include <attnkit/detail/traits.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <limits>
#include <vector>

#include "support/error_checks.hpp"
#include "support/mask_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::PowerOfTwo;
using ak::Range;
using ak::TileKind;

namespace {

bool is_power_of_two(Index d) {
  for (int k = 0; k < 63; ++k)
    if (d == Index{1} << k) return true;
  return false;
}

// The keys of [0, 200) that query i keeps.
std::vector<Index> kept_keys(const PowerOfTwo& m, Index i) {
  std::vector<Index> keys;
  for (Index j = 0; j < 200; ++j)
    if (m.keep(0, 0, i, j)) keys.push_back(j);
  return keys;
}

// key_ranges(q) is sorted, disjoint and not touching, and each of its keys in [0, 200) is
// kept by some query of q: the kernel walks no key in vain.
void check_key_ranges_exact(const PowerOfTwo& m) {
  for (Index qb = -20; qb < 150; qb += 7)
    for (Index len : {1, 3, 16, 40}) {
      const Range q{qb, qb + len};
      const auto ranges = m.key_ranges(0, 0, q);
      INFO("q [" << q.begin << ", " << q.end << ")");
      CHECK(ranges.count <= ranges.kCapacity);
      for (int t = 0; t < ranges.count; ++t) {
        const Range r = ranges.ranges[t];
        CHECK(r.begin >= 0);  // clipped at key 0
        CHECK(r.begin < r.end);
        if (t > 0) CHECK(ranges.ranges[t - 1].end < r.begin);
        for (Index j = r.begin; j < std::min<Index>(r.end, 200); ++j) {
          INFO("key " << j);
          CHECK(ak::test::kept_pairs(m, q, Range{j, j + 1}) > 0);
        }
      }
    }
}

}  // namespace

TEST_CASE("PowerOfTwo: a query keeps the keys at distance 2^k and itself", "[mask][power_of_two]") {
  const PowerOfTwo m{0, 0};
  CHECK(kept_keys(m, 100) == std::vector<Index>{36, 68, 84, 92, 96, 98, 99, 100});
  CHECK(kept_keys(m, 0) == std::vector<Index>{0});
  CHECK(kept_keys(m, 1) == std::vector<Index>{0, 1});
  CHECK(kept_keys(m, 5) == std::vector<Index>{1, 3, 4, 5});
  CHECK(m.keep(3, 1, 100, 36) == m.keep(0, 0, 100, 36));  // batch and head do not matter
  // O(log i) keys per query: 1000 keeps itself and 1000 - 2^k for 2^k <= 1000.
  Index count = 0;
  for (Index j = 0; j <= 1000; ++j) count += m.keep(0, 0, 1000, j) ? 1 : 0;
  CHECK(count == 11);
}

TEST_CASE("PowerOfTwo: the window and the sinks add their keys", "[mask][power_of_two]") {
  CHECK(kept_keys(PowerOfTwo{0, 5}, 100) ==
        std::vector<Index>{36, 68, 84, 92, 95, 96, 97, 98, 99, 100});
  CHECK(kept_keys(PowerOfTwo{3, 0}, 100) ==
        std::vector<Index>{0, 1, 2, 36, 68, 84, 92, 96, 98, 99, 100});
  CHECK(kept_keys(PowerOfTwo{3, 0}, 1) == std::vector<Index>{0, 1});  // sink 2 is in the future
}

TEST_CASE("PowerOfTwo: keep is the rule of sinks, window and powers, never a future key",
          "[mask][power_of_two]") {
  const auto [sinks, window] = GENERATE(table<Index, Index>({{0, 0}, {4, 0}, {0, 7}, {5, 7}}));
  const PowerOfTwo m{sinks, window};
  for (Index i = -20; i < 300; ++i)
    for (Index j = 0; j < 300; ++j) {
      const Index d = i - j;
      const bool expected = d >= 0 && (j < sinks || d <= window || is_power_of_two(d));
      if (m.keep(0, 0, i, j) != expected) {  // one CHECK per mismatch, not per pair
        INFO("PowerOfTwo{" << sinks << ", " << window << "} query " << i << " key " << j);
        CHECK(m.keep(0, 0, i, j) == expected);
      }
    }
}

TEST_CASE("PowerOfTwo: classify on hand-picked tiles, Partial is not always mixed",
          "[mask][power_of_two]") {
  const PowerOfTwo m{4, 15};
  const Range q{100, 110};
  CHECK(m.classify(0, 0, q, Range{0, 4}) == TileKind::Full);         // the sinks
  CHECK(m.classify(0, 0, q, Range{95, 101}) == TileKind::Full);      // in every window
  CHECK(m.classify(0, 0, q, Range{101, 102}) == TileKind::Partial);  // future of 100 only
  CHECK(m.classify(0, 0, q, Range{110, 120}) == TileKind::Empty);    // future of all
  CHECK(m.classify(0, 0, q, Range{40, 50}) == TileKind::Partial);    // 104 - 64 = 40 only
  CHECK(ak::test::kept_pairs(m, q, Range{40, 50}) > 0);
  // Not tight: key 93 is in the window of 100..108 and at distance 16 from 109, so this
  // Partial tile keeps every pair; and 81..90 behind query 100 holds no power of two.
  CHECK(m.classify(0, 0, q, Range{93, 100}) == TileKind::Partial);
  CHECK(ak::test::kept_pairs(m, q, Range{93, 100}) == 10 * 7);
  const PowerOfTwo bare{0, 0};
  CHECK(bare.classify(0, 0, Range{100, 101}, Range{10, 20}) == TileKind::Partial);
  CHECK(ak::test::kept_pairs(bare, Range{100, 101}, Range{10, 20}) == 0);
}

TEST_CASE("PowerOfTwo: classify agrees with keep on random tiles", "[mask][power_of_two][random]") {
  const auto [sinks, window] =
      GENERATE(table<Index, Index>({{0, 0}, {4, 0}, {0, 16}, {3, 10}, {50, 40}}));
  INFO("PowerOfTwo{" << sinks << ", " << window << "}");
  ak::test::check_classify_agrees_with_keep(PowerOfTwo{sinks, window},
                                            /*partial_means_mixed=*/false);
}

TEST_CASE("PowerOfTwo: key_ranges covers every kept key and lists no other",
          "[mask][power_of_two]") {
  const auto [sinks, window] =
      GENERATE(table<Index, Index>({{0, 0}, {4, 0}, {0, 16}, {3, 10}, {50, 40}}));
  const PowerOfTwo m{sinks, window};
  INFO("PowerOfTwo{" << sinks << ", " << window << "}");
  ak::test::check_key_ranges_cover(m);
  check_key_ranges_exact(m);
}

TEST_CASE("PowerOfTwo: key_ranges of a far query tile is a few narrow bands",
          "[mask][power_of_two]") {
  // 64 queries at 10000: sinks, one 64-key band per 2^k with 8 < 2^k <= 10063, the window.
  const PowerOfTwo m{4, 8};
  const Range q{10000, 10064};
  const auto ranges = m.key_ranges(0, 0, q);
  Index keys = 0;
  for (const Range& r : ranges) keys += r.end - r.begin;
  CHECK(ranges.count <= 1 + 10 + 1);
  CHECK(keys <= 4 + 10 * 64 + (64 + 8));
  CHECK(ranges.ranges[0].begin == 0);
  CHECK(ranges.ranges[0].end == 4);
  CHECK(ranges.ranges[ranges.count - 1].end == q.end);
}

TEST_CASE("PowerOfTwo: has no runs face, so the kernel masks its Partial tiles with keep",
          "[mask][power_of_two]") {
  STATIC_REQUIRE_FALSE(ak::detail::has_runs<PowerOfTwo>::value);
  STATIC_REQUIRE(ak::detail::has_columns<PowerOfTwo>::value);
  STATIC_REQUIRE(ak::detail::has_key_ranges<PowerOfTwo, Range>::value);
  STATIC_REQUIRE(ak::detail::has_classify<PowerOfTwo, Range>::value);
}

TEST_CASE("PowerOfTwo: negative sizes throw attnkit::Error naming them, large windows clamp",
          "[mask][power_of_two][errors]") {
  ak::test::check_error([] { (void)PowerOfTwo(-1, 0); },
                        {"PowerOfTwo.sinks: expected >= 0, got -1"});
  ak::test::check_error([] { (void)PowerOfTwo(0, -2); },
                        {"PowerOfTwo.window: expected >= 0, got -2"});
  CHECK(PowerOfTwo(0, std::numeric_limits<Index>::max()).window == Index{1} << 60);
  CHECK_NOTHROW(PowerOfTwo(0, 0));
}

TEST_CASE("PowerOfTwo: key_ranges holds the key at distance 2^62 (q_offset = 2^62)",
          "[mask][power_of_two]") {
  // Regression: keep() keeps distance 2^62 (a query at q_offset = 2^62, the largest valid
  // offset, and key 0); key_ranges() once stopped at 2^61, so the kernel skipped key 0.
  const PowerOfTwo m{0, 0};
  const Index far = Index{1} << 62;
  REQUIRE(m.keep(0, 0, far, 0));
  const auto ranges = m.key_ranges(0, 0, Range{far, far + 1});
  bool covered = false;
  for (const Range& r : ranges) covered = covered || (r.begin <= 0 && 0 < r.end);
  CHECK(covered);
}

TEST_CASE("PowerOfTwo: range part and columns split keep() exactly", "[mask][power_of_two]") {
  const auto [sinks, window] = GENERATE(table<Index, Index>(
      {{0, 0}, {4, 0}, {0, 16}, {3, 10}, {50, 40}, {4, 64}, {16, 20}, {17, 20}}));
  INFO("PowerOfTwo{" << sinks << ", " << window << "}");
  std::vector<Index> positions;
  for (Index i = -20; i < 300; ++i) positions.push_back(i);
  ak::test::check_columns_split_keep(PowerOfTwo{sinks, window}, positions, 300);
}

TEST_CASE("PowerOfTwo: the columns of a query are its distances 2^k past the window",
          "[mask][power_of_two]") {
  const auto list = [](const PowerOfTwo& m, Index i) {
    const auto c = m.columns(0, 0, i);
    return std::vector<Index>(c.begin(), c.end());
  };
  CHECK(list(PowerOfTwo{0, 5}, 100) == std::vector<Index>{36, 68, 84, 92});  // 64, 32, 16, 8
  CHECK(list(PowerOfTwo{40, 5}, 100) == std::vector<Index>{68, 84, 92});     // 36 is a sink
  // Up to kGatheredSinks sinks are columns too (those before the window), and the range part
  // then leaves them out; one more and they stay a range of the range part.
  constexpr Index kFew = PowerOfTwo::kGatheredSinks;
  CHECK(list(PowerOfTwo{4, 5}, 100) == std::vector<Index>{0, 1, 2, 3, 36, 68, 84, 92});
  CHECK(list(PowerOfTwo{4, 5}, 7) == std::vector<Index>{0, 1});  // 2 and 3 are in the window
  CHECK_FALSE(PowerOfTwo{4, 5}.range_part().keep(0, 0, 100, 2));
  CHECK(list(PowerOfTwo{kFew, 5}, 100).size() == std::size_t(kFew) + 4);  // + 36 68 84 92
  CHECK(list(PowerOfTwo{kFew + 1, 5}, 100) == std::vector<Index>{36, 68, 84, 92});
  CHECK(PowerOfTwo{kFew + 1, 5}.range_part().keep(0, 0, 100, 2));
  CHECK(list(PowerOfTwo{0, 64}, 100).empty());  // every power of two <= 100 is in the window
  CHECK(list(PowerOfTwo{0, 0}, 0).empty());
  CHECK(list(PowerOfTwo{0, 0}, -7).empty());
  // All keys sinks, a query before key 0: no column, and no signed overflow forming i - sinks
  // (UBSan flagged it before).
  CHECK(list(PowerOfTwo{std::numeric_limits<Index>::max(), 4}, -5).empty());
  CHECK(list(PowerOfTwo{std::numeric_limits<Index>::max(), 4}, 1000).empty());
  // The farthest: distance 2^62 from a query at 2^62 + 5 reaches key 5; 63 columns at most.
  const Index far = (Index{1} << 62) + 5;
  const auto c = PowerOfTwo{0, 0}.columns(0, 0, far);
  CHECK(c.count == 63);  // 2^62 .. 2^0 (the window of 0 holds distance 0 only): the capacity
  CHECK(c.keys[0] == 5);
  CHECK(c.keys[c.count - 1] == far - 1);
  ak::test::check_columns_split_keep(PowerOfTwo{2, 3}, {far, far - 100, Index{1} << 40}, 200);
}
