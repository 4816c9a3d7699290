// Index arithmetic that reports overflow instead of wrapping: view factories and
// validation use it on sizes and strides that come from the caller. (Spelled with
// std::ptrdiff_t, which attnkit::Index names, because tensor.hpp includes this header.)
#pragma once

#include <cstddef>
#include <initializer_list>

namespace attnkit::detail {

/// *out = a * b; false when the product overflows.
inline bool checked_mul(std::ptrdiff_t a, std::ptrdiff_t b, std::ptrdiff_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

/// *out = a + b; false when the sum overflows.
inline bool checked_add(std::ptrdiff_t a, std::ptrdiff_t b, std::ptrdiff_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

/// *out = the product of `factors`; false when any partial product overflows.
inline bool checked_product(std::initializer_list<std::ptrdiff_t> factors, std::ptrdiff_t* out) {
  std::ptrdiff_t p = 1;
  for (std::ptrdiff_t f : factors)
    if (!checked_mul(p, f, &p)) return false;
  *out = p;
  return true;
}

}  // namespace attnkit::detail
