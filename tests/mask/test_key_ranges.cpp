// KeyRanges<N>: sorted, disjoint key ranges. add() appends in key order and merges a range
// that touches or overlaps the last one; unite() and intersect() combine two lists into one
// of capacity A + B and A + B - 1 (the worst cases, reached here); all() stands for "every
// key" and is the neutral element of intersect.
#include <algorithm>
#include <attnkit/mask/key_ranges.hpp>
#include <catch2/catch_test_macros.hpp>
#include <initializer_list>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace ak = attnkit;
using ak::Index;
using ak::KeyRanges;
using ak::Range;

namespace {

using Pairs = std::vector<std::pair<Index, Index>>;

template <int N>
Pairs pairs(const KeyRanges<N>& r) {
  Pairs out;
  for (const Range& x : r) out.emplace_back(x.begin, x.end);
  return out;
}

template <int N>
KeyRanges<N> make(std::initializer_list<Range> list) {
  KeyRanges<N> r;
  for (const Range& x : list) r.add(x);
  return r;
}

// The positions of [0, kSpan) that r holds, one flag each.
constexpr Index kSpan = 48;
template <int N>
std::vector<bool> bitmap(const KeyRanges<N>& r) {
  std::vector<bool> bits(kSpan, false);
  for (const Range& x : r)
    for (Index j = x.begin; j < x.end; ++j) bits[static_cast<std::size_t>(j)] = true;
  return bits;
}

// Up to N random non-empty ranges inside [0, kSpan), some touching (add merges those).
template <int N>
KeyRanges<N> random_ranges(std::mt19937& rng) {
  std::uniform_int_distribution<Index> gap(0, 8), length(1, 8), count(0, N);
  KeyRanges<N> r;
  Index at = gap(rng);
  for (Index t = count(rng); t > 0 && at < kSpan; --t) {
    const Index end = std::min(at + length(rng), kSpan);
    r.add({at, end});
    at = end + gap(rng) + 1;  // a gap of at least one key: the ranges stay N at most
  }
  return r;
}

// Sorted, disjoint, non-empty and not touching: the form every KeyRanges must have.
template <int N>
bool well_formed(const KeyRanges<N>& r) {
  for (int t = 0; t < r.count; ++t) {
    if (r.ranges[t].begin >= r.ranges[t].end) return false;
    if (t > 0 && r.ranges[t - 1].end >= r.ranges[t].begin) return false;
  }
  return r.count <= N;
}

}  // namespace

TEST_CASE("KeyRanges: a default KeyRanges is empty", "[mask][key_ranges]") {
  const KeyRanges<3> r;
  CHECK(r.count == 0);
  CHECK(r.begin() == r.end());
  CHECK(KeyRanges<3>::kCapacity == 3);
}

TEST_CASE("KeyRanges: add appends ranges in key order and ignores empty ones",
          "[mask][key_ranges]") {
  KeyRanges<3> r;
  r.add({5, 5});  // empty
  r.add({7, 3});  // reversed, so empty too
  CHECK(r.count == 0);
  r.add({0, 4});
  r.add({6, 9});
  r.add({-3, -3});  // empty: ignored even out of order
  r.add({20, 21});
  CHECK(pairs(r) == Pairs{{0, 4}, {6, 9}, {20, 21}});
  CHECK(r.end() - r.begin() == 3);
}

TEST_CASE("KeyRanges: add merges a range that touches or overlaps the last one",
          "[mask][key_ranges]") {
  CHECK(pairs(make<2>({{0, 5}, {5, 8}})) == Pairs{{0, 8}});          // touching: [0, 5) + [5, 8)
  CHECK(pairs(make<2>({{0, 5}, {3, 9}})) == Pairs{{0, 9}});          // overlapping
  CHECK(pairs(make<2>({{0, 5}, {2, 4}})) == Pairs{{0, 5}});          // contained: the end stays
  CHECK(pairs(make<2>({{0, 5}, {6, 8}})) == Pairs{{0, 5}, {6, 8}});  // one key apart
  CHECK(pairs(make<1>({{-10, -2}, {-2, 3}, {1, 2}})) == Pairs{{-10, 3}});  // negative keys
}

TEST_CASE("KeyRanges: key_range builds one range, or none when it is empty", "[mask][key_ranges]") {
  CHECK(pairs(ak::key_range(3, 9)) == Pairs{{3, 9}});
  CHECK(pairs(ak::key_range(-4, 1)) == Pairs{{-4, 1}});
  CHECK(ak::key_range(4, 4).count == 0);
  CHECK(ak::key_range(5, 2).count == 0);
}

TEST_CASE("KeyRanges: all() is one range holding every key position", "[mask][key_ranges]") {
  const auto all = KeyRanges<1>::all();
  REQUIRE(all.count == 1);
  CHECK(all.ranges[0].begin < 0);
  CHECK(all.ranges[0].end >= Index{1} << 60);  // beyond any key count that fits in memory
  // The neutral element of intersect, the absorbing one of unite.
  const auto some = make<2>({{3, 9}, {40, 41}});
  CHECK(pairs(ak::intersect(all, some)) == pairs(some));
  CHECK(pairs(ak::intersect(some, all)) == pairs(some));
  CHECK(pairs(ak::unite(all, some)) == pairs(all));
  CHECK(pairs(ak::unite(some, all)) == pairs(all));
}

TEST_CASE("KeyRanges: unite merges two sorted lists into one", "[mask][key_ranges]") {
  static_assert(std::is_same_v<decltype(ak::unite(KeyRanges<2>{}, KeyRanges<3>{})), KeyRanges<5>>,
                "unite: capacity A + B");
  // Interleaved and disjoint: the worst case fills the capacity.
  const auto a = make<2>({{0, 2}, {10, 12}}), b = make<2>({{4, 6}, {20, 22}});
  const auto both = ak::unite(a, b);
  CHECK(pairs(both) == Pairs{{0, 2}, {4, 6}, {10, 12}, {20, 22}});
  CHECK(both.count == decltype(both)::kCapacity);
  // Overlapping and touching ranges merge across the two lists.
  CHECK(pairs(ak::unite(make<2>({{0, 5}, {10, 15}}), make<1>({{5, 10}}))) == Pairs{{0, 15}});
  CHECK(pairs(ak::unite(make<1>({{2, 8}}), make<1>({{0, 3}}))) == Pairs{{0, 8}});
  CHECK(pairs(ak::unite(make<1>({{0, 20}}), make<2>({{3, 4}, {8, 9}}))) == Pairs{{0, 20}});
  // Two disjoint ranges stay two ranges: never their hull.
  CHECK(pairs(ak::unite(ak::key_range(0, 4), ak::key_range(90, 101))) == Pairs{{0, 4}, {90, 101}});
}

TEST_CASE("KeyRanges: unite with an empty list is the other list", "[mask][key_ranges]") {
  const KeyRanges<2> none;
  const auto some = make<3>({{1, 2}, {5, 7}, {9, 30}});
  CHECK(pairs(ak::unite(none, some)) == pairs(some));
  CHECK(pairs(ak::unite(some, none)) == pairs(some));
  CHECK(ak::unite(none, none).count == 0);
}

TEST_CASE("KeyRanges: intersect keeps the keys both lists hold", "[mask][key_ranges]") {
  static_assert(
      std::is_same_v<decltype(ak::intersect(KeyRanges<3>{}, KeyRanges<3>{})), KeyRanges<5>>,
      "intersect: capacity A + B - 1");
  static_assert(
      std::is_same_v<decltype(ak::intersect(KeyRanges<1>{}, KeyRanges<1>{})), KeyRanges<1>>,
      "intersect of two single ranges is one range");
  // The worst case, 3 + 3 - 1 pieces: every boundary starts a new one.
  const auto a = make<3>({{0, 10}, {20, 30}, {40, 50}});
  const auto b = make<3>({{5, 25}, {28, 45}, {48, 60}});
  const auto both = ak::intersect(a, b);
  CHECK(pairs(both) == Pairs{{5, 10}, {20, 25}, {28, 30}, {40, 45}, {48, 50}});
  CHECK(both.count == decltype(both)::kCapacity);
  CHECK(pairs(ak::intersect(b, a)) == pairs(both));
  // One range against several, containment, equal ends.
  CHECK(pairs(ak::intersect(ak::key_range(0, 100), make<2>({{3, 4}, {8, 9}}))) ==
        Pairs{{3, 4}, {8, 9}});
  CHECK(pairs(ak::intersect(make<2>({{0, 5}, {7, 9}}), ak::key_range(3, 8))) ==
        Pairs{{3, 5}, {7, 8}});
  CHECK(pairs(ak::intersect(ak::key_range(0, 8), make<2>({{2, 8}, {10, 12}}))) == Pairs{{2, 8}});
  // Touching is not overlapping: [0, 5) and [5, 9) share no key.
  CHECK(ak::intersect(ak::key_range(0, 5), ak::key_range(5, 9)).count == 0);
  CHECK(ak::intersect(ak::key_range(0, 5), ak::key_range(7, 9)).count == 0);
}

TEST_CASE("KeyRanges: intersect with an empty list is empty", "[mask][key_ranges]") {
  const KeyRanges<2> none;
  const auto some = make<2>({{1, 2}, {5, 7}});
  CHECK(ak::intersect(none, some).count == 0);
  CHECK(ak::intersect(some, none).count == 0);
  CHECK(ak::intersect(none, none).count == 0);
}

TEST_CASE("KeyRanges: unite and intersect agree with sets of keys on random lists",
          "[mask][key_ranges][random]") {
  std::mt19937 rng(11);
  for (int t = 0; t < 2000; ++t) {
    const auto a = random_ranges<3>(rng);
    const auto b = random_ranges<2>(rng);
    const auto either = ak::unite(a, b);
    const auto both = ak::intersect(a, b);
    const auto bits_a = bitmap(a), bits_b = bitmap(b);
    std::vector<bool> bits_or(kSpan), bits_and(kSpan);
    for (std::size_t j = 0; j < bits_or.size(); ++j) {
      bits_or[j] = bits_a[j] || bits_b[j];
      bits_and[j] = bits_a[j] && bits_b[j];
    }
    INFO("a " << Catch::Detail::stringify(pairs(a)) << " b " << Catch::Detail::stringify(pairs(b)));
    CHECK(well_formed(either));
    CHECK(well_formed(both));
    CHECK(bitmap(either) == bits_or);
    CHECK(bitmap(both) == bits_and);
  }
}
