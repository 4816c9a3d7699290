// Mask combinators: `a & b` keeps a pair when both masks keep it, `a | b` when either does
// (named forms mask_and, mask_or for masks outside namespace attnkit). Every face derives
// from the operands' exactly: tile kinds combine (Empty & x = Empty, Full | x = Full), key
// ranges intersect or unite (an `|` of two ranges is two ranges, not their hull), and
// runs() exists when both operands have it, so windows of windows stay on the SIMD path.
// When an operand has gathered columns (mask/key_columns.hpp), so does the pair: its range
// part is the operands' range parts combined, its columns those of either that the pair keeps
// outside that range part.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attnkit/core/slots.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {
namespace detail {

template <class M>
TileKind tile_kind_of(const M& m, Index b, Index h, Range q, Range kv) {
  if constexpr (has_classify<M, Range>::value)
    return m.classify(b, h, q, kv);
  else
    return TileKind::Partial;  // says nothing: correct for any mask
}

template <class M>
auto key_ranges_of(const M& m, Index b, Index h, Range q) {
  if constexpr (has_key_ranges<M, Range>::value)
    return m.key_ranges(b, h, q);
  else
    return KeyRanges<1>::all();
}

// SFINAE-friendly: the operators below must not break `x & y` for other class types.
template <class P, class = void>
struct is_mask_t : std::false_type {};
template <class P>
struct is_mask_t<P, std::void_t<typename P::slot>> : std::is_same<typename P::slot, MaskSlot> {};
template <class P>
constexpr bool is_mask() {
  return is_mask_t<P>::value;
}

}  // namespace detail

/// How `&` combines: a pair, tile or key range survives when both operands keep it.
struct AndRule {
  static bool keep(bool x, bool y) { return x && y; }
  // Columns of a & b: a's that b keeps, and b's that a keeps (none is in both range parts).
  template <class A, class B, class CA, class CB>
  static auto columns(const A& a, const B& b, const CA& ca, const CB& cb, Index bi, Index h,
                      Index i) {
    return detail::merge_columns(
        ca, cb, [&](Index j) { return b.keep(bi, h, i, j); },
        [&](Index j) { return a.keep(bi, h, i, j); });
  }
  static TileKind kind(TileKind x, TileKind y) {
    if (x == TileKind::Empty || y == TileKind::Empty) return TileKind::Empty;
    return x == TileKind::Full && y == TileKind::Full ? TileKind::Full : TileKind::Partial;
  }
  template <class X, class Y>
  static auto ranges(const X& x, const Y& y) {
    return intersect(x, y);
  }
};

/// How `|` combines: a pair, tile or key range survives when either operand keeps it.
struct OrRule {
  static bool keep(bool x, bool y) { return x || y; }
  // Columns of a | b: either's, except those the other's range part keeps.
  template <class A, class B, class CA, class CB>
  static auto columns(const A& a, const B& b, const CA& ca, const CB& cb, Index bi, Index h,
                      Index i) {
    return detail::merge_columns(
        ca, cb, [&](Index j) { return !detail::range_part_keeps(b, bi, h, i, j); },
        [&](Index j) { return !detail::range_part_keeps(a, bi, h, i, j); });
  }
  static TileKind kind(TileKind x, TileKind y) {
    if (x == TileKind::Full || y == TileKind::Full) return TileKind::Full;
    return x == TileKind::Empty && y == TileKind::Empty ? TileKind::Empty : TileKind::Partial;
  }
  template <class X, class Y>
  static auto ranges(const X& x, const Y& y) {
    return unite(x, y);
  }
};

/// Two masks combined by Rule (AndRule, OrRule): every face of the pair from the operands'.
template <class Rule, class A, class B>
struct MaskCombination {
  using slot = MaskSlot;
  A a;
  B b;

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<MaskCombination>()
        .add(detail::policy_tag(a))
        .add(detail::policy_tag(b))
        .value();
  }

  bool keep(Index bi, Index h, Index i, Index j) const {
    return Rule::keep(a.keep(bi, h, i, j), b.keep(bi, h, i, j));
  }

  TileKind classify(Index bi, Index h, Range q, Range kv) const {
    return Rule::kind(detail::tile_kind_of(a, bi, h, q, kv), detail::tile_kind_of(b, bi, h, q, kv));
  }

  auto key_ranges(Index bi, Index h, Range q) const {
    return Rule::ranges(detail::key_ranges_of(a, bi, h, q), detail::key_ranges_of(b, bi, h, q));
  }

  template <class A_ = A, class B_ = B,
            std::enable_if_t<detail::has_runs<A_>::value && detail::has_runs<B_>::value, int> = 0>
  auto runs(Index bi, Index h, Index i) const {
    return Rule::ranges(a.runs(bi, h, i), b.runs(bi, h, i));
  }

  template <
      class A_ = A, class B_ = B,
      std::enable_if_t<detail::has_columns<A_>::value || detail::has_columns<B_>::value, int> = 0>
  auto range_part() const {
    const auto part = [](const auto& m) {
      if constexpr (detail::has_columns<std::decay_t<decltype(m)>>::value)
        return m.range_part();
      else
        return m;
    };
    using RA = decltype(part(a));
    using RB = decltype(part(b));
    return MaskCombination<Rule, RA, RB>{part(a), part(b)};
  }

  template <
      class A_ = A, class B_ = B,
      std::enable_if_t<detail::has_columns<A_>::value || detail::has_columns<B_>::value, int> = 0>
  auto columns(Index bi, Index h, Index i) const {
    return Rule::columns(a, b, detail::columns_of(a, bi, h, i), detail::columns_of(b, bi, h, i), bi,
                         h, i);
  }

  /// Operands that carry data (a BlockMask in `Causal{} & blocks`) check it against the call.
  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index q_heads) const {
    if constexpr (detail::has_validate<A>::value)
      a.validate(q_len, kv_len, q_offset, batch, q_heads);
    if constexpr (detail::has_validate<B>::value)
      b.validate(q_len, kv_len, q_offset, batch, q_heads);
  }
};

/// Pairs both masks keep.
template <class A, class B>
using MaskAnd = MaskCombination<AndRule, A, B>;

/// Pairs either mask keeps.
template <class A, class B>
using MaskOr = MaskCombination<OrRule, A, B>;

/// a & b for any two masks.
template <class A, class B>
MaskAnd<A, B> mask_and(A a, B b) {
  static_assert(detail::is_mask<A>() && detail::is_mask<B>(), "mask_and: both must be masks");
  return {a, b};
}

/// a | b for any two masks.
template <class A, class B>
MaskOr<A, B> mask_or(A a, B b) {
  static_assert(detail::is_mask<A>() && detail::is_mask<B>(), "mask_or: both must be masks");
  return {a, b};
}

template <class A, class B, std::enable_if_t<detail::is_mask<A>() && detail::is_mask<B>(), int> = 0>
MaskAnd<A, B> operator&(A a, B b) {
  return {a, b};
}

template <class A, class B, std::enable_if_t<detail::is_mask<A>() && detail::is_mask<B>(), int> = 0>
MaskOr<A, B> operator|(A a, B b) {
  return {a, b};
}

}  // namespace attnkit
