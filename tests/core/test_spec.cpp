// make_spec() and AttentionSpec: defaults for missing slots, any argument order giving one
// type, runtime members carried through. Also the small headers around a spec: slots.hpp
// (each policy's slot), options.hpp (chainable setters) and version.hpp.
#include <attnkit/core/slots.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/options.hpp>
#include <attnkit/position/no_position.hpp>
#include <attnkit/score/dot.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/spec.hpp>
#include <attnkit/version.hpp>
#include <catch2/catch_test_macros.hpp>
#include <type_traits>

#include "support/matchers.hpp"

namespace ak = attnkit;
using Catch::Matchers::WithinULP;

namespace {

using DefaultSpec = ak::AttentionSpec<ak::Dot, ak::Full, ak::Softmax, ak::NoPosition>;

// A user-written mask with runtime data: only its nested slot tells make_spec where it goes.
struct EveryOtherKey {
  using slot = ak::MaskSlot;
  int phase = 0;
  bool keep(ak::Index, ak::Index, ak::Index, ak::Index j) const { return j % 2 == phase; }
};

}  // namespace

TEST_CASE("AttentionSpec: make_spec() without arguments is Dot, Full, Softmax, NoPosition",
          "[spec][defaults]") {
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec()), DefaultSpec>);
  STATIC_REQUIRE(std::is_same_v<ak::AttentionSpec<>, DefaultSpec>);
  using S = decltype(ak::make_spec());
  STATIC_REQUIRE(std::is_same_v<S::Score, ak::Dot>);
  STATIC_REQUIRE(std::is_same_v<S::Mask, ak::Full>);
  STATIC_REQUIRE(std::is_same_v<S::Normalizer, ak::Softmax>);
  STATIC_REQUIRE(std::is_same_v<S::Position, ak::NoPosition>);
}

TEST_CASE("AttentionSpec: one policy fills its slot and the others keep their defaults",
          "[spec][defaults]") {
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec(ak::Causal{})),
                                ak::AttentionSpec<ak::Dot, ak::Causal>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec(ak::Softcap{1.f})),
                                ak::AttentionSpec<ak::Softcap, ak::Full>>);
  // Naming a default explicitly changes nothing.
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec(ak::Full{}, ak::Softmax{})), DefaultSpec>);
}

TEST_CASE("AttentionSpec: any argument order gives the same type", "[spec][order]") {
  const ak::Softcap cap{30.f};
  using Expected = ak::AttentionSpec<ak::Softcap, ak::Causal, ak::Softmax, ak::NoPosition>;
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec(ak::Causal{}, cap)), Expected>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec(cap, ak::Causal{})), Expected>);
  STATIC_REQUIRE(
      std::is_same_v<decltype(ak::make_spec(ak::NoPosition{}, ak::Softmax{}, ak::Causal{}, cap)),
                     decltype(ak::make_spec(cap, ak::Causal{}, ak::Softmax{}, ak::NoPosition{}))>);
  STATIC_REQUIRE(
      std::is_same_v<decltype(ak::make_spec(ak::Softmax{}, cap, ak::NoPosition{}, ak::Causal{})),
                     decltype(ak::make_spec(ak::Causal{}, ak::NoPosition{}, cap, ak::Softmax{}))>);
  STATIC_REQUIRE(
      std::is_same_v<decltype(ak::make_spec(ak::NoPosition{}, ak::Causal{}, ak::Softmax{}, cap)),
                     Expected>);
}

TEST_CASE("AttentionSpec: runtime members of the policies are preserved", "[spec][runtime]") {
  // Exact comparisons: the values are copied, never recomputed.
  const auto a = ak::make_spec(ak::Causal{}, ak::Softcap{30.f});
  const auto b = ak::make_spec(ak::Softcap{30.f}, ak::Causal{});
  CHECK_THAT(a.score.cap, WithinULP(30.f, 0));
  CHECK_THAT(b.score.cap, WithinULP(30.f, 0));
  CHECK_THAT(a.score.inv_cap, WithinRel(1.f / 30.f, 1e-7f));

  const auto user = ak::make_spec(ak::Softcap{2.5f}, EveryOtherKey{1});
  STATIC_REQUIRE(std::is_same_v<decltype(user)::Mask, EveryOtherKey>);
  CHECK(user.mask.phase == 1);
  CHECK(user.mask.keep(0, 0, 0, 3));
  CHECK_FALSE(user.mask.keep(0, 0, 0, 4));
  CHECK_THAT(user.score.cap, WithinULP(2.5f, 0));
}

TEST_CASE("Slots: every shipped policy declares its slot, and the slots are distinct",
          "[spec][slots]") {
  STATIC_REQUIRE(std::is_same_v<ak::Dot::slot, ak::ScoreSlot>);
  STATIC_REQUIRE(std::is_same_v<ak::Softcap::slot, ak::ScoreSlot>);
  STATIC_REQUIRE(std::is_same_v<ak::Full::slot, ak::MaskSlot>);
  STATIC_REQUIRE(std::is_same_v<ak::Causal::slot, ak::MaskSlot>);
  STATIC_REQUIRE(std::is_same_v<ak::Softmax::slot, ak::NormalizerSlot>);
  STATIC_REQUIRE(std::is_same_v<ak::NoPosition::slot, ak::PositionSlot>);
  STATIC_REQUIRE_FALSE(std::is_same_v<ak::ScoreSlot, ak::MaskSlot>);
  STATIC_REQUIRE_FALSE(std::is_same_v<ak::MaskSlot, ak::NormalizerSlot>);
  STATIC_REQUIRE_FALSE(std::is_same_v<ak::NormalizerSlot, ak::PositionSlot>);
  STATIC_REQUIRE_FALSE(std::is_same_v<ak::PositionSlot, ak::ScoreSlot>);
  // make_spec's detection: a type without a nested slot is not a policy.
  STATIC_REQUIRE(ak::detail::has_slot<ak::Causal>::value);
  STATIC_REQUIRE(ak::detail::has_slot<EveryOtherKey>::value);
  STATIC_REQUIRE_FALSE(ak::detail::has_slot<int>::value);
}

TEST_CASE("Options: defaults leave scale and q_offset unset", "[options]") {
  const ak::Options o;
  CHECK_FALSE(o.scale.has_value());
  CHECK_FALSE(o.q_offset.has_value());
  CHECK(o.threads == 0);
  CHECK(o.lse.empty());
}

TEST_CASE("Options: setters chain, set each field and leave the original alone", "[options]") {
  float lse[4] = {};
  const ak::Options base;
  const ak::Options o = base.with_scale(0.25f).with_q_offset(-7).with_threads(3).with_lse(lse);
  CHECK_FALSE(base.scale.has_value());  // setters return a modified copy
  CHECK(base.lse.empty());
  REQUIRE(o.scale.has_value());
  CHECK_THAT(*o.scale, WithinULP(0.25f, 0));
  REQUIRE(o.q_offset.has_value());
  CHECK(*o.q_offset == -7);
  CHECK(o.threads == 3);
  CHECK(o.lse.data() == lse);
  CHECK(o.lse.size() == 4);  // the array's size travels with it
  // A chain on a temporary copies out whole, the usual way to pass Options to a call.
  const ak::Options copy = ak::Options{}.with_threads(1).with_q_offset(0);
  CHECK(copy.threads == 1);
  REQUIRE(copy.q_offset.has_value());
  CHECK(*copy.q_offset == 0);
  CHECK_FALSE(copy.scale.has_value());
}

TEST_CASE("version: ATTNKIT_VERSION_* macros exist and read 0.1.0", "[version]") {
#if !defined(ATTNKIT_VERSION_MAJOR) || !defined(ATTNKIT_VERSION_MINOR) || \
    !defined(ATTNKIT_VERSION_PATCH)
#error "version.hpp must define ATTNKIT_VERSION_MAJOR, _MINOR and _PATCH"
#endif
  // Preprocessor-usable, as version checks in user code need.
#if ATTNKIT_VERSION_MAJOR != 0 || ATTNKIT_VERSION_MINOR != 1 || ATTNKIT_VERSION_PATCH != 0
  FAIL("version.hpp does not read 0.1.0 (the CMake project version)");
#endif
  STATIC_REQUIRE(ATTNKIT_VERSION_MAJOR == 0);
  STATIC_REQUIRE(ATTNKIT_VERSION_MINOR == 1);
  STATIC_REQUIRE(ATTNKIT_VERSION_PATCH == 0);
}
