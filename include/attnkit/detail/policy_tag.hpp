// The identity of a policy or a storage type as a 64-bit tag, for the ranks of a distributed
// call to check that they run the same call (dist/agreement.hpp). policy_tag(p) is p.tag()
// when the policy has one -- its type and the runtime parameters that change its result,
// hashed with TagHash (SlidingWindow's sizes, Softcap's cap, Softmax's sinks, a Rope table's
// frequencies) -- else type_tag<P>(): a policy without such parameters is its type. Storage
// types are told apart the same way (type_tag<Eigen::bfloat16>() != type_tag<Eigen::half>(),
// though both are 2 bytes). Types hash by the name the compiler spells them with (no RTTI needed):
// the ranks of one call run the same binary. A parameter that legitimately differs by rank
// (SoftplusL1's key counts, given for a rank's own rows) stays out of the tag. Equal tags do not
// prove equal policies (a 64-bit hash), unequal tags prove different ones.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace attnkit::detail {

/// FNV-1a over the bytes of the values added, in order.
class TagHash {
 public:
  /// A hash that starts from the type T's identity.
  template <class T>
  static TagHash of() {
    TagHash h;
    const char* name = name_of<T>();
    h.bytes(name, std::strlen(name));
    return h;
  }

  /// Adds a number (integers by value, floating-point values by their bits, enums by their
  /// underlying value), an optional (whether set, then its value), a vector (its size, then
  /// its elements) or another tag.
  template <class T>
  TagHash& add(const T& v) {
    if constexpr (std::is_enum_v<T>) {
      return add(static_cast<std::underlying_type_t<T>>(v));
    } else {
      static_assert(std::is_arithmetic_v<T>, "TagHash::add(): a number, optional or vector");
      bytes(&v, sizeof v);
      return *this;
    }
  }
  template <class T>
  TagHash& add(const std::optional<T>& v) {
    add(v.has_value());
    return v ? add(*v) : *this;
  }
  template <class T>
  TagHash& add(const std::vector<T>& v) {
    add(v.size());
    for (const T& x : v) add(x);
    return *this;
  }

  std::uint64_t value() const { return h_; }

 private:
  // The function's own name, which spells T out: a name per type without RTTI (typeid), so
  // the policies' headers also build with -fno-rtti.
  template <class T>
  static const char* name_of() {
#if defined(_MSC_VER) && !defined(__clang__)
    return __FUNCSIG__;
#else
    return __PRETTY_FUNCTION__;
#endif
  }

  void bytes(const void* p, std::size_t n) {
    const auto* at = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ at[i]) * 0x100000001b3ULL;
  }
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

/// The tag of a type: a storage type's, or a policy's without runtime parameters.
template <class T>
std::uint64_t type_tag() {
  return TagHash::of<std::remove_cv_t<T>>().value();
}

template <class P, class = void>
struct has_tag : std::false_type {};
template <class P>
struct has_tag<P, std::void_t<decltype(std::declval<const P&>().tag())>> : std::true_type {};

/// The tag of a policy value: p.tag() when it has one, else its type's.
template <class P>
std::uint64_t policy_tag(const P& p) {
  if constexpr (has_tag<P>::value)
    return p.tag();
  else
    return type_tag<P>();
}

}  // namespace attnkit::detail
