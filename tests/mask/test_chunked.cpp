// Chunked{size}: query i keeps the keys of its own chunk, floor(i / size) == floor(j / size),
// with floor (not C++'s truncation) for negative positions, so the chunk [-size, 0) is a
// chunk like any other. Its faces are exact: classify() is tight (a query range covers a
// contiguous run of chunks), key_ranges() is those chunks, runs() one query's chunk.
#include <attnkit/core/error.hpp>
#include <attnkit/mask/chunked.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <limits>

#include "support/mask_checks.hpp"
#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Chunked;
using ak::Index;
using ak::Range;
using ak::TileKind;

TEST_CASE("Chunked: a query keeps exactly the keys of its own chunk", "[mask][chunked]") {
  const Chunked c{4};
  CHECK_FALSE(c.keep(0, 0, 5, 3));
  for (Index j = 4; j < 8; ++j) CHECK(c.keep(0, 0, 5, j));  // keys after the query too
  CHECK_FALSE(c.keep(0, 0, 5, 8));
  CHECK(c.keep(0, 0, 0, 3));
  CHECK_FALSE(c.keep(0, 0, 3, 4));
  CHECK(c.keep(2, 3, 5, 6) == c.keep(0, 0, 5, 6));  // batch and head do not matter
}

TEST_CASE("Chunked: negative positions use floor division", "[mask][chunked]") {
  const Chunked c{4};
  // Chunks ..., [-8, -4), [-4, 0), [0, 4), ...: -1 and 0 are in different chunks.
  CHECK(c.chunk_begin(-1) == -4);
  CHECK(c.chunk_begin(-4) == -4);
  CHECK(c.chunk_begin(-5) == -8);
  CHECK(c.chunk_begin(-8) == -8);
  CHECK(c.chunk_begin(-9) == -12);
  CHECK(c.chunk_begin(0) == 0);
  CHECK(c.chunk_begin(3) == 0);
  CHECK(c.chunk_begin(4) == 4);
  CHECK_FALSE(c.keep(0, 0, -1, 0));  // truncation would put -1 and 0 in one chunk
  CHECK_FALSE(c.keep(0, 0, -3, 1));
  CHECK(c.keep(0, 0, -1, -4));
  CHECK_FALSE(c.keep(0, 0, -5, -4));
  // Against floating-point floor, across both signs and several sizes.
  for (const Index size : {1, 2, 3, 7, 64})
    for (Index p = -200; p <= 200; ++p) {
      const auto floor_chunk =
          static_cast<Index>(std::floor(static_cast<double>(p) / static_cast<double>(size)));
      INFO("size " << size << " position " << p);
      CHECK(Chunked{size}.chunk_begin(p) == floor_chunk * size);
    }
}

TEST_CASE("Chunked: chunk_begin is exact at the extreme positions", "[mask][chunked]") {
  const Index far = (Index{1} << 62) + 1000;  // |q_offset| <= 2^62, plus a query count
  for (const Index size : {Index{3}, Index{1000003}, Index{1} << 60})
    for (const Index p : {far, far - 1, -far, -far + 1, Index{1} << 62, -(Index{1} << 62)}) {
      const Index begin = Chunked{size}.chunk_begin(p);
      INFO("size " << size << " position " << p);
      CHECK(begin <= p);
      CHECK(p - begin < size);
      CHECK(begin % size == 0);
    }
}

TEST_CASE("Chunked: {1} keeps only the diagonal", "[mask][chunked]") {
  const Chunked c{1};
  for (Index i = -3; i < 10; ++i)
    for (Index j = 0; j < 12; ++j) CHECK(c.keep(0, 0, i, j) == (i == j));
}

TEST_CASE("Chunked: classify on hand-picked tiles", "[mask][chunked]") {
  const Chunked c{10};
  CHECK(c.classify(0, 0, Range{12, 18}, Range{10, 20}) == TileKind::Full);  // one chunk
  CHECK(c.classify(0, 0, Range{12, 18}, Range{14, 15}) == TileKind::Full);
  CHECK(c.classify(0, 0, Range{12, 18}, Range{9, 15}) == TileKind::Partial);   // key 9 outside
  CHECK(c.classify(0, 0, Range{12, 18}, Range{15, 21}) == TileKind::Partial);  // key 20 outside
  CHECK(c.classify(0, 0, Range{12, 18}, Range{0, 10}) == TileKind::Empty);
  CHECK(c.classify(0, 0, Range{12, 18}, Range{20, 30}) == TileKind::Empty);
  CHECK(c.classify(0, 0, Range{8, 12}, Range{8, 12}) == TileKind::Partial);  // two chunks
  CHECK(c.classify(0, 0, Range{8, 12}, Range{0, 30}) == TileKind::Partial);
  CHECK(c.classify(0, 0, Range{8, 22}, Range{30, 40}) == TileKind::Empty);
  CHECK(c.classify(0, 0, Range{-5, -1}, Range{0, 64}) == TileKind::Empty);  // chunk [-10, 0)
  CHECK(c.classify(0, 0, Range{-5, 1}, Range{0, 64}) == TileKind::Partial);
}

TEST_CASE("Chunked: classify agrees with keep and is tight (Partial tiles are mixed)",
          "[mask][chunked][random]") {
  const Index size = GENERATE(1, 2, 7, 16, 33, 500);
  INFO("Chunked{" << size << "}");
  ak::test::check_classify_agrees_with_keep(Chunked{size}, /*partial_means_mixed=*/true);
}

TEST_CASE("Chunked: key_ranges is the chunks a query range falls in", "[mask][chunked]") {
  const Index size = GENERATE(1, 2, 7, 16, 33, 500);
  const Chunked c{size};
  INFO("Chunked{" << size << "}");
  ak::test::check_key_ranges_cover(c);
  for (Index qb = -50; qb < 150; qb += 7)
    for (Index len : {1, 2, 64}) {
      const auto keys = c.key_ranges(0, 0, Range{qb, qb + len});
      REQUIRE(keys.count == 1);  // the chunks of consecutive positions are contiguous
      CHECK(keys.ranges[0].begin == c.chunk_begin(qb));
      CHECK(keys.ranges[0].end == c.chunk_begin(qb + len - 1) + size);
    }
}

TEST_CASE("Chunked: runs lists exactly the keys each query keeps", "[mask][chunked]") {
  const Index size = GENERATE(1, 2, 7, 16, 33, 500);
  INFO("Chunked{" << size << "}");
  ak::test::check_runs_equal_keep(Chunked{size});
}

TEST_CASE("Chunked: a size below 1 or above 2^60 throws attnkit::Error naming it",
          "[mask][chunked][errors]") {
  CHECK_THROWS_MATCHES(
      Chunked(0), ak::Error,
      MessageMatches(ContainsSubstring("Chunked.size: expected 1 to 2^60, got 0")));
  CHECK_THROWS_MATCHES(
      Chunked(-4), ak::Error,
      MessageMatches(ContainsSubstring("Chunked.size: expected 1 to 2^60, got -4")));
  CHECK_THROWS_AS(Chunked((Index{1} << 60) + 1), ak::Error);
  CHECK_THROWS_AS(Chunked(std::numeric_limits<Index>::max()), ak::Error);
  CHECK(Chunked(Index{1} << 60).size == Index{1} << 60);
  CHECK(Chunked(1).size == 1);
}
