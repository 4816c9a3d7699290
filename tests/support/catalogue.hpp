// The one catalogue of the policies the tests iterate: every normalizer the library has
// (for_each_normalizer), every kind of mask the tile kernel schedules differently
// (for_each_mask), and the normalizers under the masks, score mods and positions a case names
// (for_each_spec). Each visits (name, policy or spec) and takes a filter, a trait on the spec
// (HasBackward: attention_backward() takes it; OnePass: decode(), merge(), the paged and ring
// paths take it), so a policy that gains a face joins the tests that need it, unlisted.
#pragma once

#include <attnkit/kernel/backward/backward_traits.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/chunked.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/faces.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/backward_faces.hpp>
#include <attnkit/normalizer/faces.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/spec.hpp>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "support/attnkit_test.hpp"

namespace attnkit::test {

/// How much of a list a test takes. Kinds: one entry per code path (each normalizer type, with
/// its per-head form and each LSSAR power the tests distinguish; each tile schedule of a mask).
/// Variants: those and the parameter corners (exponents, biases, window and chunk sizes).
enum class Breadth { Kinds, Variants };

// Filters: Filter<Spec>::value says whether an entry is visited, Spec being the entry's spec
// (make_spec(policy) for the normalizer and mask lists).
template <class Spec>
struct AnySpec : std::true_type {};

/// Whether the spec has every face attention_backward() needs: the normalizer's backward (and
/// its pass faces when it takes several passes), the score's derivative, the position's
/// transpose; those check_backward_spec() asserts (kernel/backward/backward_traits.hpp), here as a
/// value, so that a normalizer joins the backward tests with the face, not with a list.
template <class Spec>
constexpr bool has_backward_faces() {
  using Normalizer = typename Spec::Normalizer;
  using Score = typename Spec::Score;
  using Position = typename Spec::Position;
  constexpr bool normalizer = detail::has_normalizer_backward<Normalizer>::value &&
                              (detail::backward_passes<Normalizer>() == 1 ||
                               detail::has_backward_observe<Normalizer>::value);
  constexpr bool score =
      detail::unit_derivative<Score>() ||
      (detail::has_derivative<Score>::value && detail::has_derivative_tile<Score>::value);
  constexpr bool position =
      detail::owns_product<Position>()
          ? detail::has_product_backward<Position>::value
          : std::is_same_v<Position, NoPosition> || detail::has_apply_transpose<Position>::value;
  return normalizer && score && position;
}
template <class Spec>
struct HasBackward : std::bool_constant<has_backward_faces<Spec>()> {};

/// One pass over the keys: the parts of split-KV decode, merge() and the ring merge in one round.
template <class Spec>
struct OnePass : std::bool_constant<detail::passes<typename Spec::Normalizer>() == 1> {};

/// Masks with runs() (the kernel's compare masking of Partial tiles).
template <class Spec>
struct WithRuns : detail::has_runs<typename Spec::Mask> {};

/// A named policy of the catalogue; `variant`: a parameter corner of a kind listed before it.
template <class P>
struct Entry {
  const char* name;
  P policy;
  bool variant;
};

namespace catalogue {

template <class P>
Entry<P> kind(const char* name, P policy) {
  return {name, std::move(policy), false};
}
template <class P>
Entry<P> variant(const char* name, P policy) {
  return {name, std::move(policy), true};
}

template <template <class> class Filter, class Entries, class Visit>
void visit_entries(const Entries& entries, Breadth breadth, Visit& visit) {
  std::apply(
      [&](const auto&... entry) {
        const auto one = [&](const auto& e) {
          if constexpr (Filter<decltype(make_spec(e.policy))>::value)
            if (!e.variant || breadth == Breadth::Variants) visit(std::string(e.name), e.policy);
        };
        (one(entry), ...);
      },
      entries);
}

/// Every normalizer; the per-head parameters (sinks -1, 0, 1, ..., biases -1, -1.75, ...)
/// sized for `heads` query heads.
inline auto normalizers(Index heads) {
  return std::make_tuple(kind("Softmax", Softmax{}),
                         kind("Softmax::with_sinks", Softmax::with_sinks(head_sinks(heads))),
                         kind("Sigmoid{} (-log Lk)", Sigmoid{}),
                         kind("Sigmoid::per_head", Sigmoid::per_head(head_biases(heads))),
                         kind("ReluPower{1.5, 0.3}", ReluPower{1.5f, 0.3f}),
                         kind("SoftplusL1 (LSSA)", SoftplusL1{}),
                         kind("SoftplusL1Reweighted{15} (LSSAR)", SoftplusL1Reweighted{}),
                         kind("SoftplusL1Reweighted{3}", SoftplusL1Reweighted{3.f}),
                         variant("Sigmoid{-log 2048}", Sigmoid{-std::log(2048.f)}),
                         variant("ReluPower{1, 0}", ReluPower{1.f, 0.f}),
                         variant("ReluPower{2, 0.3}", ReluPower{2.f, 0.3f}),
                         variant("ReluPower{1.5, 0}", ReluPower{1.5f, 0.f}));
}

/// The static masks beyond Full and Causal, for lengths of one to a few tiles: windows and
/// chunks shorter than a key tile, so most tiles are Partial (the runs() and keep() masking) and
/// key ranges start mid-sequence. Kinds: a two-sided window, a causal chunk, sinks or a window,
/// an or of a chunk and a window, powers of two.
inline auto masks() {
  return std::make_tuple(
      kind("SlidingWindow{30, 17}", SlidingWindow{30, 17}),
      kind("Causal & Chunked{96}", Causal{} & Chunked{96}),
      kind("Causal & (Sinks{4} | SlidingWindow{64, 0})",
           Causal{} & (Sinks{4} | SlidingWindow{64, 0})),
      kind("Chunked{64} | SlidingWindow{10, 10}", Chunked{64} | SlidingWindow{10, 10}),
      kind("PowerOfTwo{2, 8}", PowerOfTwo{2, 8}),
      variant("SlidingWindow{40, 0}", SlidingWindow{40, 0}),
      variant("Causal & SlidingWindow{100, 0}", Causal{} & SlidingWindow{100, 0}),
      variant("Chunked{50}", Chunked{50}), variant("Sinks{4}", Sinks{4}),
      variant("Causal & PowerOfTwo{0, 0}", Causal{} & PowerOfTwo{0, 0}));
}

}  // namespace catalogue

/// visit(name, normalizer) for every normalizer of `breadth` whose spec passes Filter; per-head
/// parameters sized for `heads`.
template <template <class> class Filter = AnySpec, class Visit>
void for_each_normalizer(Index heads, Visit&& visit, Breadth breadth = Breadth::Kinds) {
  catalogue::visit_entries<Filter>(catalogue::normalizers(heads), breadth, visit);
}

/// visit(name, mask) for every mask of `breadth` whose spec passes Filter.
template <template <class> class Filter = AnySpec, class Visit>
void for_each_mask(Visit&& visit, Breadth breadth = Breadth::Kinds) {
  catalogue::visit_entries<Filter>(catalogue::masks(), breadth, visit);
}

/// The policies a case puts around each normalizer (a mask, score mod, position), named.
template <class... P>
struct Setting {
  std::string name;
  std::tuple<P...> policies;
};

/// under("Causal, Softcap{5}", Causal{}, Softcap{5.f}); under("Full"): no policy.
template <class... P>
Setting<P...> under(std::string name, P... policies) {
  return {std::move(name), std::tuple<P...>(std::move(policies)...)};
}

namespace catalogue {
template <class... P, class N>
auto spec_of(const Setting<P...>& setting, const N& normalizer) {
  return std::apply([&](const auto&... p) { return make_spec(p..., normalizer); },
                    setting.policies);
}
}  // namespace catalogue

/// visit("<normalizer>, <setting>", make_spec(setting..., normalizer)) for every normalizer of
/// `breadth` under every setting, normalizer by normalizer, where the spec passes Filter.
template <template <class> class Filter = AnySpec, class Visit, class... Settings>
void for_each_spec(Index heads, Breadth breadth, Visit&& visit, const Settings&... settings) {
  for_each_normalizer(
      heads,
      [&](const std::string& name, const auto& normalizer) {
        const auto one = [&](const auto& setting) {
          if constexpr (Filter<decltype(catalogue::spec_of(setting, normalizer))>::value)
            visit(name + ", " + setting.name, catalogue::spec_of(setting, normalizer));
        };
        (one(settings), ...);
      },
      breadth);
}

}  // namespace attnkit::test
