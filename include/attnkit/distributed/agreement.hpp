// What the ranks of a distributed call must agree on, as the fields require_same_on_all_ranks()
// (dist/collective.hpp) compares: the views' shared sizes and storage types, the options'
// scale and products, the spec's four policies by their tags (detail/policy_tag.hpp). Every
// field is read from the raw arguments -- a view's fields, an option as given -- so building
// the list cannot throw, and the comparison runs first in each entry point's validation:
//   1. require_same_on_all_ranks(): the fields (one Error on every rank, naming the field);
//   2. validate_together(): each rank's own checks (one Error on every rank);
//   3. checks of values derived from agreed or gathered ones (the same on every rank).
// Nothing is sent before 3, and no check before 1 or 2 can throw on one rank alone.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/distributed/collective.hpp"
#include "attnkit/options.hpp"

namespace attnkit::dist {

/// A field compared by identity (a tag), not by order.
inline Agreed identity_field(std::string name, std::uint64_t tag) {
  long long value = 0;
  std::memcpy(&value, &tag, sizeof value);
  return Agreed{std::move(name), value, true};
}

/// View `name`'s sizes every rank shares -- batch, heads and dim, and seq when `with_seq`
/// (a shard's length differs by rank) -- and its storage type ("the storage of q").
template <class T>
void agree_on_view(std::vector<Agreed>& fields, const std::string& name, const View<T>& v,
                   bool with_seq = false) {
  fields.push_back({name + ".batch", v.batch});
  fields.push_back({name + ".heads", v.heads});
  if (with_seq) fields.push_back({name + ".seq", v.seq});
  fields.push_back({name + ".dim", v.dim});
  fields.push_back(identity_field("the storage of " + name, detail::type_tag<T>()));
}

/// The views of a call, q, k, v and o, in that order.
template <class Q, class K, class V, class O>
void agree_on_qkvo(std::vector<Agreed>& fields, const View<Q>& q, const View<K>& k,
                   const View<V>& v, const View<O>& o) {
  agree_on_view(fields, "q", q);
  agree_on_view(fields, "k", k);
  agree_on_view(fields, "v", v);
  agree_on_view(fields, "o", o);
}

/// The spec's policies by their tags: "the spec's score", "... mask", "... normalizer",
/// "... position".
template <class Spec>
void agree_on_spec(std::vector<Agreed>& fields, const Spec& spec) {
  fields.push_back(identity_field("the spec's score", detail::policy_tag(spec.score)));
  fields.push_back(identity_field("the spec's mask", detail::policy_tag(spec.mask)));
  fields.push_back(identity_field("the spec's normalizer", detail::policy_tag(spec.normalizer)));
  fields.push_back(identity_field("the spec's position", detail::policy_tag(spec.position)));
}

/// The options every rank's result depends on: the scale as given (its bits; -1 unset: then
/// every rank derives it from the agreed head dim) and how the products are formed.
inline void agree_on_options(std::vector<Agreed>& fields, const std::string& name,
                             const Options& options) {
  std::uint32_t bits = 0;
  if (options.scale) std::memcpy(&bits, &*options.scale, sizeof bits);
  fields.push_back({name + ".scale (its bits, -1 unset)", options.scale ? bits : -1LL});
  fields.push_back({name + ".products", static_cast<long long>(options.products)});
}

}  // namespace attnkit::dist
