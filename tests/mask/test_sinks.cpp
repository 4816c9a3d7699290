// Sinks{n}: every query keeps the first n keys, 0 .. n-1, and nothing else, whatever its
// position (alone it is not causal; StreamingLLM combines it: Causal & (Sinks | window)).
// Its faces are exact: classify() is tight for key tiles (keys are never negative),
// key_ranges() and runs() are [0, n).
#include <attnkit/core/error.hpp>
#include <attnkit/mask/sinks.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "support/mask_checks.hpp"
#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::Range;
using ak::Sinks;
using ak::TileKind;

TEST_CASE("Sinks: every query keeps the first n keys and no other", "[mask][sinks]") {
  const Sinks s{4};
  for (const Index i : {-100, -1, 0, 2, 3, 4, 1000}) {
    INFO("query " << i);
    for (Index j = 0; j < 4; ++j) CHECK(s.keep(0, 0, i, j));  // future sinks too
    CHECK_FALSE(s.keep(0, 0, i, 4));
    CHECK_FALSE(s.keep(0, 0, i, 5));
    CHECK_FALSE(s.keep(0, 0, i, -1));  // not a key
  }
  CHECK(s.keep(1, 7, 0, 3) == s.keep(0, 0, 0, 3));  // batch and head do not matter
}

TEST_CASE("Sinks: {0} keeps nothing and every key tile is Empty", "[mask][sinks]") {
  const Sinks none{0};
  for (Index j = 0; j < 10; ++j) CHECK_FALSE(none.keep(0, 0, 5, j));
  CHECK(none.classify(0, 0, Range{0, 64}, Range{0, 256}) == TileKind::Empty);
  CHECK(none.key_ranges(0, 0, Range{0, 64}).count == 0);
  CHECK(none.runs(0, 0, 7).count == 0);
  ak::test::check_classify_agrees_with_keep(none, /*partial_means_mixed=*/true);
}

TEST_CASE("Sinks: classify on hand-picked tiles", "[mask][sinks]") {
  const Sinks s{4};
  const Range q{100, 164};
  CHECK(s.classify(0, 0, q, Range{0, 4}) == TileKind::Full);
  CHECK(s.classify(0, 0, q, Range{1, 3}) == TileKind::Full);
  CHECK(s.classify(0, 0, q, Range{0, 5}) == TileKind::Partial);
  CHECK(s.classify(0, 0, q, Range{3, 300}) == TileKind::Partial);
  CHECK(s.classify(0, 0, q, Range{4, 300}) == TileKind::Empty);
  CHECK(s.classify(0, 0, Range{-64, 0}, Range{0, 4}) == TileKind::Full);  // any query
}

TEST_CASE("Sinks: classify agrees with keep and is tight (Partial tiles are mixed)",
          "[mask][sinks][random]") {
  const Index n = GENERATE(1, 4, 64, 1000);
  INFO("Sinks{" << n << "}");
  ak::test::check_classify_agrees_with_keep(Sinks{n}, /*partial_means_mixed=*/true);
}

TEST_CASE("Sinks: key_ranges and runs are the first n keys", "[mask][sinks]") {
  const Index n = GENERATE(1, 4, 64, 1000);
  const Sinks s{n};
  INFO("Sinks{" << n << "}");
  ak::test::check_key_ranges_cover(s);
  ak::test::check_runs_equal_keep(s);
  for (const Range q : {Range{-64, 0}, Range{0, 1}, Range{500, 564}}) {
    const auto keys = s.key_ranges(0, 0, q);
    REQUIRE(keys.count == 1);
    CHECK(keys.ranges[0].begin == 0);
    CHECK(keys.ranges[0].end == n);
  }
}

TEST_CASE("Sinks: a negative count throws attnkit::Error naming it", "[mask][sinks][errors]") {
  CHECK_THROWS_MATCHES(Sinks(-1), ak::Error,
                       MessageMatches(ContainsSubstring("Sinks.count: expected >= 0, got -1")));
  CHECK_NOTHROW(Sinks(0));
}
