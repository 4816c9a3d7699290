// AttentionSpec: a variant as four policies (Score, Mask, Normalizer, Position), and
// make_spec(), which sorts policies given in any order into their slots and fills the
// missing ones with defaults (Dot, Full, Softmax, NoPosition).
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "attnkit/core/slots.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/score/dot.hpp"

namespace attnkit {

template <class ScoreT = Dot, class MaskT = Full, class NormalizerT = Softmax,
          class PositionT = NoPosition>
struct AttentionSpec {
  using Score = ScoreT;
  using Mask = MaskT;
  using Normalizer = NormalizerT;
  using Position = PositionT;

  Score score{};
  Mask mask{};
  Normalizer normalizer{};
  Position position{};
};

namespace detail {

template <class P, class = void>
struct has_slot : std::false_type {};
template <class P>
struct has_slot<P, std::void_t<typename P::slot>> : std::true_type {};

template <class Slot, class P>
constexpr bool in_slot() {
  if constexpr (has_slot<P>::value)
    return std::is_same_v<typename P::slot, Slot>;
  else
    return false;
}

template <class Slot, class... Ps>
constexpr int count_slot = (0 + ... + static_cast<int>(in_slot<Slot, Ps>()));

// The policy of `Slot` among ps..., or `fallback` when none is.
template <class Slot, class Default, std::size_t I = 0, class Tuple>
auto pick(Default fallback, Tuple& ps) {
  if constexpr (I == std::tuple_size_v<Tuple>) {
    return fallback;
  } else if constexpr (in_slot<Slot, std::tuple_element_t<I, Tuple>>()) {
    return std::get<I>(ps);
  } else {
    return pick<Slot, Default, I + 1>(fallback, ps);
  }
}

}  // namespace detail

/// Builds an AttentionSpec from policies in any order, e.g.
/// make_spec(Causal{}, Softcap{30.f}); missing slots take the defaults.
template <class... Ps>
auto make_spec(Ps... policies) {
  static_assert((detail::has_slot<Ps>::value && ...),
                "make_spec: every argument must be a policy with a nested `using slot = ...`");
  static_assert(detail::count_slot<ScoreSlot, Ps...> <= 1,
                "make_spec: more than one policy for the Score slot");
  static_assert(detail::count_slot<MaskSlot, Ps...> <= 1,
                "make_spec: more than one policy for the Mask slot (combine masks instead)");
  static_assert(detail::count_slot<NormalizerSlot, Ps...> <= 1,
                "make_spec: more than one policy for the Normalizer slot");
  static_assert(detail::count_slot<PositionSlot, Ps...> <= 1,
                "make_spec: more than one policy for the Position slot");
  std::tuple<Ps...> all{std::move(policies)...};
  auto score = detail::pick<ScoreSlot>(Dot{}, all);
  auto mask = detail::pick<MaskSlot>(Full{}, all);
  auto normalizer = detail::pick<NormalizerSlot>(Softmax{}, all);
  auto position = detail::pick<PositionSlot>(NoPosition{}, all);
  return AttentionSpec<decltype(score), decltype(mask), decltype(normalizer), decltype(position)>{
      score, mask, normalizer, position};
}

}  // namespace attnkit
