// Softcap, the score mod s -> cap * tanh(s / cap): the vectorized apply_tile() agrees with
// the element rule modify() that the reference uses, stays within (-cap, cap), leaves the
// tile's padding alone, and an invalid cap is refused. Also Dot (score/dot.hpp), the
// default score, which needs no hook: the kernel folds `scale` into the packed Q tile.
#include <attnkit/core/error.hpp>
#include <attnkit/core/slots.hpp>
#include <attnkit/detail/traits.hpp>
#include <attnkit/score/dot.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/simd/simd.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;

namespace {

// apply_tile() in f32 vs modify() in f64, relative to the cap: s * inv_cap rounds once and
// tanh is within two ulps, so a few f32 ulps of the cap.
constexpr double kSoftcapRel = 4 * std::numeric_limits<float>::epsilon();

}  // namespace

TEST_CASE("Softcap: apply_tile equals modify element by element", "[softcap]") {
  const float cap = GENERATE(0.5f, 5.f, 30.f, 50.f);
  const ak::Softcap softcap{cap};
  const Index rows = 7, cols = 3 * ak::simd::kWidth, ld = cols + 5;
  std::mt19937 rng(static_cast<std::uint32_t>(cap * 10));
  std::uniform_real_distribution<float> dist(-4.f * cap, 4.f * cap);  // through the bend
  std::vector<float> s(static_cast<std::size_t>(rows * ld));
  for (float& x : s) x = dist(rng);
  const std::vector<float> before = s;

  softcap.apply_tile(s.data(), rows, cols, ld, ak::ScoreTile{});

  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < ld; ++c) {
      const auto at = static_cast<std::size_t>(r * ld + c);
      INFO("cap " << cap << " row " << r << " col " << c << " logit " << before[at]);
      if (c < cols) {
        const double expected = softcap.modify(before[at], 0, 0, r, c);
        CHECK_THAT(s[at], WithinAbs(expected, kSoftcapRel * cap));
      } else {
        CHECK(s[at] == before[at]);  // exact: padding columns are not touched
      }
    }
}

TEST_CASE("Softcap: results stay within [-cap, cap], even for huge logits", "[softcap]") {
  const ak::Softcap softcap{5.f};
  const float big = std::numeric_limits<float>::max();
  std::vector<float> s(static_cast<std::size_t>(2 * ak::simd::kWidth));
  for (std::size_t i = 0; i < s.size(); ++i) {
    const float magnitudes[] = {1e3f, 1e30f, big, 6.f};
    s[i] = (i % 2 == 0 ? 1.f : -1.f) * magnitudes[(i / 2) % 4];
  }
  const std::vector<float> before = s;
  softcap.apply_tile(s.data(), 1, static_cast<Index>(s.size()), static_cast<Index>(s.size()),
                     ak::ScoreTile{});
  for (std::size_t i = 0; i < s.size(); ++i) {
    INFO("logit " << before[i] << " -> " << s[i]);
    CHECK(std::abs(s[i]) <= 5.f);
    CHECK(std::signbit(s[i]) == std::signbit(before[i]));
    CHECK(std::abs(softcap.modify(before[i], 0, 0, 0, 0)) <= 5.0);
  }
}

TEST_CASE("Softcap: modify is odd, near identity for small logits, and hoists 1/cap", "[softcap]") {
  const ak::Softcap softcap{20.f};
  CHECK_THAT(softcap.inv_cap, WithinAbs(1.0 / 20.0, 1e-9));
  for (const double s : {0.01, 0.5, 3.0, 19.0, 200.0}) {
    INFO("logit " << s);
    CHECK_THAT(softcap.modify(-s, 0, 0, 0, 0), WithinAbs(-softcap.modify(s, 0, 0, 0, 0), 1e-12));
    // tanh(x) = x - x^3/3 + ...: |modify(s) - s| <= s^3 / (3 cap^2).
    CHECK(std::abs(softcap.modify(s, 0, 0, 0, 0) - s) <= s * s * s / (3.0 * 20.0 * 20.0) + 1e-12);
  }
  CHECK(softcap.modify(0.0, 0, 0, 0, 0) == 0.0);  // exact
  // The element rule ignores positions: it is a pure function of the logit.
  CHECK(softcap.modify(7.0, 1, 2, 3, 4) == softcap.modify(7.0, 0, 0, 0, 0));
}

TEST_CASE("Softcap: an invalid cap throws attnkit::Error naming Softcap::cap",
          "[softcap][errors]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK_THROWS_MATCHES(ak::Softcap{0.f}, ak::Error,
                       MessageMatches(ContainsSubstring(
                           "attnkit: Softcap::cap: expected finite and >= FLT_MIN, got 0")));
  CHECK_THROWS_MATCHES(ak::Softcap{-2.f}, ak::Error,
                       MessageMatches(ContainsSubstring(
                           "attnkit: Softcap::cap: expected finite and >= FLT_MIN, got -2")));
  CHECK_THROWS_MATCHES(ak::Softcap{inf}, ak::Error,
                       MessageMatches(ContainsSubstring(
                           "attnkit: Softcap::cap: expected finite and >= FLT_MIN, got inf")));
  CHECK_THROWS_MATCHES(ak::Softcap{-inf}, ak::Error,
                       MessageMatches(ContainsSubstring(
                           "attnkit: Softcap::cap: expected finite and >= FLT_MIN, got -inf")));
  CHECK_THROWS_MATCHES(
      ak::Softcap{std::numeric_limits<float>::quiet_NaN()}, ak::Error,
      MessageMatches(ContainsSubstring(
          "attnkit: Softcap::cap: expected finite and >= FLT_MIN, got ")));  // (-)nan
  CHECK_NOTHROW(ak::Softcap{1e-3f});
  // A subnormal cap would make 1/cap infinite and 0 * (1/cap) NaN.
  CHECK_THROWS_MATCHES(
      ak::Softcap{1e-39f}, ak::Error,
      MessageMatches(ContainsSubstring("Softcap::cap: expected finite and >= FLT_MIN")));
  CHECK_NOTHROW(ak::Softcap{std::numeric_limits<float>::min()});
}

TEST_CASE("Softcap: is a Score policy with both hooks", "[softcap][hooks]") {
  STATIC_REQUIRE(std::is_same_v<ak::Softcap::slot, ak::ScoreSlot>);
  STATIC_REQUIRE(ak::detail::has_modify<ak::Softcap>::value);
  STATIC_REQUIRE(ak::detail::has_apply_tile<ak::Softcap>::value);
  STATIC_REQUIRE_FALSE(std::is_default_constructible_v<ak::Softcap>);  // a cap must be chosen
}

TEST_CASE("Dot: is the default Score and offers no modify or apply_tile hook", "[dot][hooks]") {
  STATIC_REQUIRE(std::is_same_v<ak::Dot::slot, ak::ScoreSlot>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec())::Score, ak::Dot>);
  STATIC_REQUIRE_FALSE(ak::detail::has_modify<ak::Dot>::value);
  STATIC_REQUIRE_FALSE(ak::detail::has_apply_tile<ak::Dot>::value);
  STATIC_REQUIRE(std::is_empty_v<ak::Dot>);  // no runtime data: scale lives in the Problem
}
