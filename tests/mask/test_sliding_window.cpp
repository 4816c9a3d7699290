// SlidingWindow{left, right}: query i keeps keys i - left <= j <= i + right. Its faces are
// all exact: classify() is tight (a Partial tile really is mixed, since the windows of a
// query range are contiguous and their union has no hole), key_ranges() is the union of the
// windows of a query range, and runs() is one query's window.
#include <attnkit/core/error.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <limits>

#include "support/error_checks.hpp"
#include "support/mask_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::Range;
using ak::SlidingWindow;
using ak::TileKind;

TEST_CASE("SlidingWindow: a query keeps the keys from i - left to i + right",
          "[mask][sliding_window]") {
  const SlidingWindow w{3, 2};
  CHECK_FALSE(w.keep(0, 0, 10, 6));
  for (Index j = 7; j <= 12; ++j) CHECK(w.keep(0, 0, 10, j));  // both ends are inside
  CHECK_FALSE(w.keep(0, 0, 10, 13));
  // A query before key 0 (q_offset < 0) reaches forward into the keys by `right`.
  CHECK(w.keep(0, 0, -2, 0));
  CHECK_FALSE(w.keep(0, 0, -3, 0));
  // Batch and head do not matter.
  CHECK(w.keep(5, 9, 10, 8) == w.keep(0, 0, 10, 8));
  CHECK(w.keep(5, 9, 10, 13) == w.keep(0, 0, 10, 13));
}

TEST_CASE("SlidingWindow: {0, 0} is the diagonal and {w, 0} looks back w keys",
          "[mask][sliding_window]") {
  const SlidingWindow diagonal{0, 0}, back{4, 0};
  for (Index i = -3; i < 20; ++i)
    for (Index j = 0; j < 25; ++j) {
      INFO("query " << i << " key " << j);
      CHECK(diagonal.keep(0, 0, i, j) == (j == i));
      CHECK(back.keep(0, 0, i, j) == (j <= i && i - j <= 4));  // never a future key
    }
}

TEST_CASE("SlidingWindow::last(W): the W keys j > i - W up to i, as transformers' window",
          "[mask][sliding_window]") {
  for (const Index W : {Index{1}, Index{2}, Index{7}, Index{512}}) {
    const SlidingWindow last = SlidingWindow::last(W);
    CHECK(last.left == W - 1);
    CHECK(last.right == 0);
    for (Index i = 0; i < 600; i += 37)
      for (Index j = 0; j <= i; ++j) {
        INFO("window " << W << " query " << i << " key " << j);
        // transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window
        CHECK(last.keep(0, 0, i, j) == (j > i - W));
      }
  }
  ak::test::check_error([] { (void)SlidingWindow::last(0); },
                        {"SlidingWindow::last(window)", ">= 1", "0"});
}

TEST_CASE("SlidingWindow: classify on hand-picked tiles", "[mask][sliding_window]") {
  const SlidingWindow w{20, 0};
  const Range q{100, 110};                                         // windows [80, 100] .. [89, 109]
  CHECK(w.classify(0, 0, q, Range{60, 80}) == TileKind::Empty);    // before every window
  CHECK(w.classify(0, 0, q, Range{60, 81}) == TileKind::Partial);  // key 80: query 100 only
  CHECK(w.classify(0, 0, q, Range{89, 101}) == TileKind::Full);    // in every window
  CHECK(w.classify(0, 0, q, Range{88, 101}) == TileKind::Partial);  // key 88 left of 109's
  CHECK(w.classify(0, 0, q, Range{89, 102}) == TileKind::Partial);  // key 101 after 100
  CHECK(w.classify(0, 0, q, Range{110, 120}) == TileKind::Empty);   // the future of all
  const SlidingWindow both{2, 3};
  CHECK(both.classify(0, 0, Range{10, 12}, Range{9, 14}) == TileKind::Full);
  CHECK(both.classify(0, 0, Range{10, 12}, Range{14, 20}) == TileKind::Partial);  // 11 sees 14
  CHECK(both.classify(0, 0, Range{10, 12}, Range{15, 20}) == TileKind::Empty);
  CHECK(both.classify(0, 0, Range{-10, -5}, Range{0, 64}) == TileKind::Empty);
}

TEST_CASE("SlidingWindow: classify agrees with keep and is tight (Partial tiles are mixed)",
          "[mask][sliding_window][random]") {
  const auto [left, right] = GENERATE(table<Index, Index>(
      {{0, 0}, {1, 0}, {5, 0}, {30, 0}, {3, 7}, {0, 12}, {17, 17}, {300, 300}}));
  INFO("SlidingWindow{" << left << ", " << right << "}");
  ak::test::check_classify_agrees_with_keep(SlidingWindow{left, right},
                                            /*partial_means_mixed=*/true);
}

TEST_CASE("SlidingWindow: key_ranges is the union of a query range's windows",
          "[mask][sliding_window]") {
  const auto [left, right] =
      GENERATE(table<Index, Index>({{0, 0}, {5, 0}, {30, 0}, {3, 7}, {0, 12}, {300, 300}}));
  const SlidingWindow w{left, right};
  INFO("SlidingWindow{" << left << ", " << right << "}");
  ak::test::check_key_ranges_cover(w);
  for (Index qb = -50; qb < 150; qb += 7)
    for (Index len : {1, 2, 64}) {
      const auto keys = w.key_ranges(0, 0, Range{qb, qb + len});
      REQUIRE(keys.count == 1);  // consecutive windows overlap: one range, exactly
      CHECK(keys.ranges[0].begin == qb - left);
      CHECK(keys.ranges[0].end == qb + len - 1 + right + 1);
    }
}

TEST_CASE("SlidingWindow: runs lists exactly the keys each query keeps", "[mask][sliding_window]") {
  const auto [left, right] =
      GENERATE(table<Index, Index>({{0, 0}, {5, 0}, {30, 0}, {3, 7}, {0, 12}}));
  INFO("SlidingWindow{" << left << ", " << right << "}");
  ak::test::check_runs_equal_keep(SlidingWindow{left, right});
}

TEST_CASE("SlidingWindow: a negative reach throws attnkit::Error naming it",
          "[mask][sliding_window][errors]") {
  ak::test::check_error([] { (void)SlidingWindow(-1, 0); },
                        {"SlidingWindow.left: expected >= 0, got -1"});
  ak::test::check_error([] { (void)SlidingWindow(0, -5); },
                        {"SlidingWindow.right: expected >= 0, got -5"});
  CHECK_THROWS_AS(SlidingWindow(std::numeric_limits<Index>::min(), 0), ak::Error);
  CHECK_NOTHROW(SlidingWindow(0, 0));
}

TEST_CASE("SlidingWindow: reaches above 2^60 are clamped, so no position overflows",
          "[mask][sliding_window]") {
  constexpr Index kMax = std::numeric_limits<Index>::max();
  const SlidingWindow w{kMax, kMax};
  CHECK(w.left == SlidingWindow::kMaxReach);
  CHECK(w.right == SlidingWindow::kMaxReach);
  CHECK(SlidingWindow{Index{1} << 60, 7}.left == Index{1} << 60);  // the cap itself is kept
  // Positions at the extremes of q_offset (+-2^62, plus a query count) stay exact.
  const Index far = Index{1} << 62;
  CHECK(w.keep(0, 0, far + 100, far + 100 - SlidingWindow::kMaxReach));
  CHECK_FALSE(w.keep(0, 0, far + 100, far + 99 - SlidingWindow::kMaxReach));
  CHECK(w.keep(0, 0, -far, -far + SlidingWindow::kMaxReach));
  const auto keys = w.key_ranges(0, 0, Range{far, far + 64});
  REQUIRE(keys.count == 1);
  CHECK(keys.ranges[0].begin == far - SlidingWindow::kMaxReach);
  CHECK(keys.ranges[0].end == far + 64 + SlidingWindow::kMaxReach);
  CHECK(w.classify(0, 0, Range{-far, -far + 64}, Range{0, 256}) == TileKind::Empty);
}
