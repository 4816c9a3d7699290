// fuzz_grads: what the runs of fuzz_grads.cpp (attention_backward(), quantized caches) and
// fuzz_linear.cpp (linear attention and its backward) share: the largest finite element,
// the comparison of one result tensor with its reference, the options with the Products
// defect, the placement of one non-finite value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries_check.hpp"

namespace attnkit_fuzz {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline const float kGradSpecials[] = {kNaN, std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity(), kNaN};

inline double finite_max(const std::vector<float>& x, std::size_t n) {
  double m = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) m = std::max(m, double(std::abs(x[i])));
  return m;
}
template <class T>
double finite_max(const Buf<T>& b) {
  return finite_max(b.data, static_cast<std::size_t>(b.B * b.H * b.S * b.D));
}
inline double finite_max(const Buf<double>& b) {
  double m = 0.0;
  for (Index i = 0; i < b.B * b.H * b.S * b.D; ++i)
    if (std::isfinite(b.data[static_cast<std::size_t>(i)]))
      m = std::max(m, std::abs(b.data[static_cast<std::size_t>(i)]));
  return m;
}

// One result tensor against its reference: where the reference is finite, within `tol`
// (NaN and unwritten elements fail); where it is not, non-finite too when `both_ways`.
inline void check_tensor(const Case& c, const std::string& what, Buf<float>& fast, Buf<double>& ref,
                         double tol, bool both_ways) {
  for (Index b = 0; b < ref.B; ++b)
    for (Index h = 0; h < ref.H; ++h)
      for (Index s = 0; s < ref.S; ++s)
        for (Index d = 0; d < ref.D; ++d) {
          const double f = fast.at(b, h, s, d), r = ref.at(b, h, s, d);
          const bool bad =
              std::isfinite(r) ? !(std::abs(f - r) <= tol) : both_ways && std::isfinite(f);
          if (bad)
            violated(c, what + ": " + std::to_string(f) + " vs reference " + std::to_string(r) +
                            " (tolerance " + std::to_string(tol) + ") at b=" + std::to_string(b) +
                            " h=" + std::to_string(h) + " s=" + std::to_string(s) +
                            " d=" + std::to_string(d));
        }
  if (!fast.guard_intact()) violated(c, what + ": a write past the tensor");
}

inline bool same_bits(const Buf<float>& a, const Buf<float>& b) {
  return std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

// The options of a call: the case's, or an invalid Products with the defect.
inline ak::Options call_options(const Case& c) {
  const ak::Options o = options_of(c);
  return c.defect == Defect::ProductsInvalid ? o.with_products(static_cast<ak::Products>(5)) : o;
}

// e[0] (non-zero: 1 + the element) and e[1] (the value; NaN only with `nan_only`) place one
// non-finite value.
template <class T>
void place_special(const Case& c, Buf<T>& x, bool nan_only = false) {
  const Index n = x.B * x.H * x.S * x.D;
  if (c.e[0] == 0 || n == 0) return;
  x.data[static_cast<std::size_t>((c.e[0] - 1) % n)] =
      T(nan_only ? kNaN : kGradSpecials[c.e[1] % std::size(kGradSpecials)]);
}

}  // namespace attnkit_fuzz
