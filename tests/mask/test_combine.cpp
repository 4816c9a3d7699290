// Mask combinators: `a & b` (MaskAnd, mask_and) keeps a pair when both masks keep it,
// `a | b` (MaskOr, mask_or) when either does. Every face derives from the operands' exactly:
// classify() combines the two kinds (Empty & x = Empty, Full | x = Full, Partial otherwise),
// key_ranges() intersects or unites, runs() exists only when both operands have it, and the
// gathered-columns face exists when either has it (range parts combined, columns kept by the
// pair outside that range part: checked against keep() for & and |, nested, both sides). The
// combined classification is correct but not tight in general (two Partial operands may
// leave a tile with no pair, or every pair), so mixedness is asserted only where it is
// proven: Causal & SlidingWindow{w, 0} classifies exactly like SlidingWindow{w, 0}.
#include <attnkit/detail/traits.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/score/softcap.hpp>
#include <bitset>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cstddef>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/mask_checks.hpp"

namespace ak = attnkit;
using ak::Causal;
using ak::Chunked;
using ak::Index;
using ak::PowerOfTwo;
using ak::Range;
using ak::Sinks;
using ak::SlidingWindow;
using ak::TileKind;

// A mask written outside namespace attnkit with only the element rule: no classify, no
// key_ranges, no runs. Operators reach it only through an attnkit operand (ADL).
namespace user {
struct EvenKeys {
  using slot = ak::MaskSlot;
  bool keep(Index /*b*/, Index /*h*/, Index /*i*/, Index j) const { return j % 2 == 0; }
};

// A type with its own operator& and operator|, which must keep working.
struct Flags {
  unsigned bits = 0;
};
inline Flags operator&(Flags a, Flags b) { return {a.bits & b.bits}; }
inline Flags operator|(Flags a, Flags b) { return {a.bits | b.bits}; }
}  // namespace user

// A user who writes `using namespace attnkit;` still gets their own & and | and the
// built-in ones (checked without templates, where every compiler looks the same way).
namespace with_attnkit {
using namespace attnkit;
inline user::Flags flags_and(user::Flags a, user::Flags b) { return a & b; }
inline std::bitset<8> bits_or(std::bitset<8> a, std::bitset<8> b) { return a | b; }
inline int ints_and(int a, int b) { return a & b; }
}  // namespace with_attnkit

namespace {

using Pairs = std::vector<std::pair<Index, Index>>;

// Whether `a & b` or `a | b` compiles. With an attnkit type among the operands, ADL puts
// attnkit's operators in the overload set, so these see whether they drop out.
template <class A, class B, class = void>
struct has_and : std::false_type {};
template <class A, class B>
struct has_and<A, B, std::void_t<decltype(std::declval<A>() & std::declval<B>())>>
    : std::true_type {};
template <class A, class B, class = void>
struct has_or : std::false_type {};
template <class A, class B>
struct has_or<A, B, std::void_t<decltype(std::declval<A>() | std::declval<B>())>> : std::true_type {
};

template <class R>
Pairs pairs(const R& ranges) {
  Pairs out;
  for (const Range& x : ranges) out.emplace_back(x.begin, x.end);
  return out;
}

TileKind and_kind(TileKind x, TileKind y) {
  if (x == TileKind::Empty || y == TileKind::Empty) return TileKind::Empty;
  return x == TileKind::Full && y == TileKind::Full ? TileKind::Full : TileKind::Partial;
}

TileKind or_kind(TileKind x, TileKind y) {
  if (x == TileKind::Full || y == TileKind::Full) return TileKind::Full;
  return x == TileKind::Empty && y == TileKind::Empty ? TileKind::Empty : TileKind::Partial;
}

// `m` combines a and b (m = a & b when is_and, else a | b): checks keep, classify,
// key_ranges and runs against the operands' faces, then the shared property checks.
template <class M, class A, class B>
void check_derived(const M& m, const A& a, const B& b, bool is_and) {
  namespace det = ak::detail;
  for (Index i = -20; i < 150; ++i)
    for (Index j = 0; j < 200; ++j) {
      const bool x = a.keep(0, 0, i, j), y = b.keep(0, 0, i, j);
      if (m.keep(0, 0, i, j) != (is_and ? x && y : x || y)) {  // report mismatches only
        INFO("query " << i << " key " << j);
        CHECK(m.keep(0, 0, i, j) == (is_and ? x && y : x || y));
      }
    }
  std::mt19937 rng(5);
  std::uniform_int_distribution<Index> q_start(-40, 120), kv_start(0, 120), length(1, 40);
  for (int t = 0; t < 2000; ++t) {
    const Index qb = q_start(rng), kb = kv_start(rng);
    const Range q{qb, qb + length(rng)}, kv{kb, kb + length(rng)};
    const TileKind x = det::tile_kind_of(a, 0, 0, q, kv), y = det::tile_kind_of(b, 0, 0, q, kv);
    INFO("q [" << q.begin << ", " << q.end << ") kv [" << kv.begin << ", " << kv.end << ")");
    CHECK(m.classify(0, 0, q, kv) == (is_and ? and_kind(x, y) : or_kind(x, y)));
  }
  for (Index qb = -20; qb < 150; qb += 9) {
    const Range q{qb, qb + 1 + qb % 37 + 20};
    const auto x = det::key_ranges_of(a, 0, 0, q);
    const auto y = det::key_ranges_of(b, 0, 0, q);
    INFO("q [" << q.begin << ", " << q.end << ")");
    CHECK(pairs(m.key_ranges(0, 0, q)) ==
          (is_and ? pairs(ak::intersect(x, y)) : pairs(ak::unite(x, y))));
  }
  if constexpr (det::has_runs<M>::value) {
    for (Index i = -20; i < 150; ++i) {
      const auto x = a.runs(0, 0, i);
      const auto y = b.runs(0, 0, i);
      INFO("query " << i);
      CHECK(pairs(m.runs(0, 0, i)) ==
            (is_and ? pairs(ak::intersect(x, y)) : pairs(ak::unite(x, y))));
    }
    ak::test::check_runs_equal_keep(m);
  }
  ak::test::check_classify_agrees_with_keep(m, /*partial_means_mixed=*/false);
  ak::test::check_key_ranges_cover(m);
}

}  // namespace

TEST_CASE("MaskAnd: the operator and mask_and build the same MaskAnd", "[mask][combine]") {
  STATIC_REQUIRE(
      std::is_same_v<decltype(Causal{} & SlidingWindow{4, 0}), ak::MaskAnd<Causal, SlidingWindow>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::mask_and(Causal{}, SlidingWindow{4, 0})),
                                ak::MaskAnd<Causal, SlidingWindow>>);
  STATIC_REQUIRE(
      std::is_same_v<decltype(Sinks{4} | SlidingWindow{4, 0}), ak::MaskOr<Sinks, SlidingWindow>>);
  STATIC_REQUIRE(std::is_same_v<decltype(Causal{} & (Sinks{4} | SlidingWindow{4, 0})),
                                ak::MaskAnd<Causal, ak::MaskOr<Sinks, SlidingWindow>>>);
  STATIC_REQUIRE(ak::detail::is_mask<ak::MaskAnd<Causal, Sinks>>());  // combines again
  const auto m = Causal{} & SlidingWindow{4, 2};
  CHECK(m.b.left == 4);  // the operands are kept by value
  CHECK(m.b.right == 2);
}

TEST_CASE("MaskAnd: every face derives from the operands' exactly", "[mask][combine]") {
  check_derived(Causal{} & SlidingWindow{5, 0}, Causal{}, SlidingWindow{5, 0}, true);
  check_derived(Causal{} & SlidingWindow{30, 0}, Causal{}, SlidingWindow{30, 0}, true);
  check_derived(Causal{} & Chunked{16}, Causal{}, Chunked{16}, true);
  check_derived(Causal{} & Chunked{7}, Causal{}, Chunked{7}, true);
  check_derived(Sinks{4} & SlidingWindow{2, 0}, Sinks{4}, SlidingWindow{2, 0}, true);
  check_derived(SlidingWindow{6, 9} & Chunked{10}, SlidingWindow{6, 9}, Chunked{10}, true);
  check_derived(Causal{} & PowerOfTwo{2, 3}, Causal{}, PowerOfTwo{2, 3}, true);
  const auto streaming = Sinks{4} | SlidingWindow{12, 0};
  check_derived(Causal{} & streaming, Causal{}, streaming, true);
}

TEST_CASE("MaskOr: every face derives from the operands' exactly", "[mask][combine]") {
  check_derived(Sinks{4} | SlidingWindow{12, 0}, Sinks{4}, SlidingWindow{12, 0}, false);
  check_derived(Chunked{16} | SlidingWindow{3, 3}, Chunked{16}, SlidingWindow{3, 3}, false);
  check_derived(Causal{} | Sinks{100}, Causal{}, Sinks{100}, false);
  check_derived(PowerOfTwo{0, 0} | Sinks{3}, PowerOfTwo{0, 0}, Sinks{3}, false);
  check_derived(SlidingWindow{0, 0} | SlidingWindow{40, 0}, SlidingWindow{0, 0},
                SlidingWindow{40, 0}, false);
  const auto local = Causal{} & Chunked{20};
  check_derived(local | Sinks{2}, local, Sinks{2}, false);
}

TEST_CASE("MaskAnd: Causal & SlidingWindow{w, 0} classifies like the window alone (tight)",
          "[mask][combine]") {
  // SlidingWindow{w, 0} already excludes future keys, so the two keep the same pairs; its
  // Empty and Full tiles are Causal's Empty and Full too, hence the same classification.
  const Index w = GENERATE(0, 3, 30, 300);
  const auto m = Causal{} & SlidingWindow{w, 0};
  const SlidingWindow window{w, 0};
  std::mt19937 rng(3);
  std::uniform_int_distribution<Index> start(-40, 120), length(1, 40);
  for (int t = 0; t < 2000; ++t) {
    const Index qb = start(rng), kb = start(rng) + 40;
    const Range q{qb, qb + length(rng)}, kv{kb, kb + length(rng)};
    CHECK(m.classify(0, 0, q, kv) == window.classify(0, 0, q, kv));
  }
  ak::test::check_classify_agrees_with_keep(m, /*partial_means_mixed=*/true);
}

TEST_CASE("MaskAnd: a combined Partial tile may keep no pair (the rule is not tight)",
          "[mask][combine]") {
  // Sinks{4} and SlidingWindow{2, 0} are each Partial on this tile, their intersection
  // is empty: the combinator cannot know, and Partial stays correct.
  const auto m = Sinks{4} & SlidingWindow{2, 0};
  const Range q{10, 12}, kv{0, 20};
  CHECK(m.classify(0, 0, q, kv) == TileKind::Partial);
  CHECK(ak::test::kept_pairs(m, q, kv) == 0);
  CHECK(m.key_ranges(0, 0, q).count == 0);  // the key schedule, though, skips it entirely
}

TEST_CASE("MaskOr: `|` of two disjoint ranges gives two ranges, not their hull",
          "[mask][combine]") {
  const auto streaming = Sinks{4} | SlidingWindow{8, 0};
  CHECK(pairs(streaming.key_ranges(0, 0, Range{100, 110})) == Pairs{{0, 4}, {92, 110}});
  CHECK(pairs(streaming.runs(0, 0, 100)) == Pairs{{0, 4}, {92, 101}});
  CHECK(pairs(streaming.runs(0, 0, 10)) == Pairs{{0, 11}});  // touching ranges merge
  const auto causal_streaming = Causal{} & streaming;
  CHECK(pairs(causal_streaming.key_ranges(0, 0, Range{100, 110})) == Pairs{{0, 4}, {92, 110}});
  CHECK(pairs(causal_streaming.runs(0, 0, 100)) == Pairs{{0, 4}, {92, 101}});
  CHECK(pairs(causal_streaming.runs(0, 0, 2)) == Pairs{{0, 3}});  // no future sink
  const auto far = SlidingWindow{1, 1} | Chunked{10};
  CHECK(pairs(far.runs(0, 0, 35)) == Pairs{{30, 40}});
  CHECK(pairs((SlidingWindow{0, 0} | Sinks{2}).runs(0, 0, 50)) == Pairs{{0, 2}, {50, 51}});
}

TEST_CASE("MaskAnd: runs exists only when both operands have it", "[mask][combine]") {
  using ak::detail::has_runs;
  using Stream = ak::MaskOr<Sinks, SlidingWindow>;
  STATIC_REQUIRE(has_runs<ak::MaskAnd<Causal, SlidingWindow>>::value);
  STATIC_REQUIRE(has_runs<ak::MaskOr<Sinks, SlidingWindow>>::value);
  STATIC_REQUIRE(has_runs<ak::MaskAnd<Causal, Stream>>::value);  // nested
  STATIC_REQUIRE(has_runs<ak::MaskAnd<Causal, Chunked>>::value);
  STATIC_REQUIRE_FALSE(has_runs<ak::MaskAnd<Causal, PowerOfTwo>>::value);
  STATIC_REQUIRE_FALSE(has_runs<ak::MaskOr<PowerOfTwo, Sinks>>::value);
  STATIC_REQUIRE_FALSE(has_runs<ak::MaskAnd<Causal, user::EvenKeys>>::value);
  STATIC_REQUIRE_FALSE(has_runs<ak::MaskOr<user::EvenKeys, Causal>>::value);
  STATIC_REQUIRE_FALSE(has_runs<ak::MaskAnd<ak::Full, Causal>>::value);  // Full has no runs
  STATIC_REQUIRE_FALSE(has_runs<ak::MaskAnd<Causal, ak::MaskAnd<Sinks, PowerOfTwo>>>::value);
  // Capacities add up: a union of two single ranges holds two, an intersection one.
  using CausalStream = ak::MaskAnd<Causal, Stream>;
  STATIC_REQUIRE(
      std::is_same_v<decltype(std::declval<const Stream&>().runs(0, 0, 0)), ak::KeyRanges<2>>);
  STATIC_REQUIRE(std::is_same_v<decltype(std::declval<const CausalStream&>().runs(0, 0, 0)),
                                ak::KeyRanges<2>>);
}

TEST_CASE("MaskAnd: a mask with only keep combines with one that has every face",
          "[mask][combine]") {
  // Without classify the operand counts as Partial everywhere, without key_ranges as every
  // key: the combination is still exact, only less sparse.
  const user::EvenKeys even;
  const auto both = Causal{} & even;  // found by ADL through Causal
  STATIC_REQUIRE(std::is_same_v<decltype(both), const ak::MaskAnd<Causal, user::EvenKeys>>);
  CHECK(both.classify(0, 0, Range{10, 20}, Range{30, 40}) == TileKind::Empty);  // Causal's
  CHECK(both.classify(0, 0, Range{10, 20}, Range{0, 5}) == TileKind::Partial);
  CHECK(pairs(both.key_ranges(0, 0, Range{10, 20})) == Pairs{{0, 20}});  // Causal's
  check_derived(both, Causal{}, even, true);
  const auto either = ak::mask_or(even, Sinks{3});
  CHECK(either.classify(0, 0, Range{10, 20}, Range{0, 3}) == TileKind::Full);  // Sinks'
  CHECK(either.classify(0, 0, Range{10, 20}, Range{30, 40}) == TileKind::Partial);
  CHECK(pairs(either.key_ranges(0, 0, Range{10, 20})) ==
        pairs(ak::KeyRanges<1>::all()));  // every key
  check_derived(either, even, Sinks{3}, false);
  const auto two_users = ak::mask_and(even, even);  // the named form for masks outside attnkit
  CHECK(two_users.keep(0, 0, 0, 4));
  CHECK_FALSE(two_users.keep(0, 0, 0, 5));
  CHECK(two_users.classify(0, 0, Range{0, 1}, Range{0, 1}) == TileKind::Partial);
}

TEST_CASE("MaskAnd: the operators do not hijack & and | of other types", "[mask][combine]") {
  STATIC_REQUIRE(has_and<Causal, Sinks>::value);
  STATIC_REQUIRE(has_or<Causal, Sinks>::value);
  STATIC_REQUIRE(has_and<Causal, user::EvenKeys>::value);  // ADL through Causal
  STATIC_REQUIRE(has_or<user::EvenKeys, Causal>::value);
  // attnkit types that are not masks, and a mask with a non-mask: attnkit's templates drop
  // out, so no operator exists at all (no MaskAnd of a Range, no error inside attnkit).
  STATIC_REQUIRE_FALSE(has_and<Range, Range>::value);
  STATIC_REQUIRE_FALSE(has_or<TileKind, TileKind>::value);
  STATIC_REQUIRE_FALSE(has_and<ak::KeyRanges<1>, ak::KeyRanges<1>>::value);
  STATIC_REQUIRE_FALSE(has_and<Causal, int>::value);
  STATIC_REQUIRE_FALSE(has_or<int, Causal>::value);
  STATIC_REQUIRE_FALSE(has_and<Causal, Range>::value);
  STATIC_REQUIRE_FALSE(has_and<ak::Softcap, Causal>::value);  // a policy of another slot
  STATIC_REQUIRE_FALSE(has_or<Causal, ak::Softcap>::value);
  // Types with & and | of their own keep them, even under `using namespace attnkit`.
  STATIC_REQUIRE(std::is_same_v<decltype(std::declval<user::Flags>() & std::declval<user::Flags>()),
                                user::Flags>);
  CHECK(with_attnkit::flags_and({6}, {3}).bits == 2u);
  CHECK(with_attnkit::bits_or(std::bitset<8>{0b0101}, std::bitset<8>{0b0011}).to_ulong() == 7u);
  CHECK(with_attnkit::ints_and(6, 3) == 2);
  STATIC_REQUIRE(has_or<std::byte, std::byte>::value);
}

TEST_CASE("MaskAnd, MaskOr: gathered columns derive from either operand's, exactly",
          "[mask][combine]") {
  using ak::detail::has_columns;
  STATIC_REQUIRE(has_columns<ak::MaskAnd<Causal, PowerOfTwo>>::value);
  STATIC_REQUIRE(has_columns<ak::MaskOr<PowerOfTwo, Sinks>>::value);
  STATIC_REQUIRE(has_columns<ak::MaskAnd<ak::MaskOr<PowerOfTwo, Sinks>, Causal>>::value);
  STATIC_REQUIRE_FALSE(has_columns<ak::MaskAnd<Causal, SlidingWindow>>::value);
  std::vector<Index> positions;
  for (Index i = -10; i < 260; i += 3) positions.push_back(i);
  const Index keys = 260;
  ak::test::check_columns_split_keep(Causal{} & PowerOfTwo{2, 3}, positions, keys);
  ak::test::check_columns_split_keep(PowerOfTwo{0, 4} | Sinks{9}, positions, keys);
  ak::test::check_columns_split_keep(Sinks{9} | PowerOfTwo{0, 4}, positions, keys);
  ak::test::check_columns_split_keep(SlidingWindow{20, 0} & PowerOfTwo{1, 2}, positions, keys);
  ak::test::check_columns_split_keep((PowerOfTwo{0, 4} | Sinks{9}) & Chunked{100}, positions, keys);
  // Both operands with columns: their range parts overlap the other's columns.
  ak::test::check_columns_split_keep(PowerOfTwo{0, 2} | PowerOfTwo{5, 20}, positions, keys);
  ak::test::check_columns_split_keep(PowerOfTwo{0, 2} & PowerOfTwo{5, 20}, positions, keys);
  ak::test::check_columns_split_keep(PowerOfTwo{0, 30} | user::EvenKeys{}, positions, keys);
}
