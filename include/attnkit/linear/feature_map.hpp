// Feature maps of linear attention: phi(x) such that phi(q) . phi(k) stands in for the
// softmax kernel exp(q . k). A map is a plain struct. An elementwise map (phi(x)_c =
// f(x_c)) gives `double element(double)` (the rule, used by the reference) and
// `simd::Vec vec(simd::Vec)` (the same rule on a register); a map that mixes coordinates
// (Taylor2) gives `features(dim)` and `map_row(x, dim, out)` for float and double.
// `kNormalizes` is the default of LinearSpec::normalize (the denominator phi(q) . z + eps).
// Backward face (linear_attention_backward()): an elementwise map gives `double
// derivative(double)` (f'(x)) and may give `simd::Vec derivative_vec(simd::Vec)` (the same
// on a register, used by the kernel when present); a mixing map gives `backward_row(x,
// d_phi, dim, dx)`, dx = J_phi(x)^T d_phi, for float and double.
#pragma once

#include <cmath>
#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

/// elu(x) + 1 (Katharopoulos et al. 2020): positive, so every denominator is > 0.
struct EluPlusOne {
  static constexpr bool kNormalizes = true;
  double element(double x) const { return x > 0 ? x + 1 : std::exp(x); }
  simd::Vec vec(simd::Vec x) const {
    constexpr float kLog2e = 1.4426950408889634f;
    const simd::Vec zero(0.f);
    const simd::Mask positive = simd::greater(x, zero);
    // exp2 of x where x <= 0 or NaN, of 0 elsewhere (the select's unused lanes stay finite).
    // Not min(x, 0): x86's min gives 0 for a NaN x, so phi(NaN) would be 1, not NaN.
    return simd::select(positive, x + simd::Vec(1.f),
                        simd::exp2(simd::select(positive, zero, x) * simd::Vec(kLog2e)));
  }
  double derivative(double x) const { return x > 0 ? 1 : std::exp(x); }
  simd::Vec derivative_vec(simd::Vec x) const {
    constexpr float kLog2e = 1.4426950408889634f;
    const simd::Vec zero(0.f);
    const simd::Mask positive = simd::greater(x, zero);
    return simd::select(positive, simd::Vec(1.f),
                        simd::exp2(simd::select(positive, zero, x) * simd::Vec(kLog2e)));
  }
};

/// max(x, 0): non-negative, a row may see a zero denominator (eps then keeps it finite).
struct Relu {
  static constexpr bool kNormalizes = true;
  double element(double x) const { return x > 0 ? x : 0; }
  simd::Vec vec(simd::Vec x) const { return simd::max(x, simd::Vec(0.f)); }
  double derivative(double x) const { return x > 0 ? 1 : 0; }  // 0 at the kink
  simd::Vec derivative_vec(simd::Vec x) const {
    return simd::select(simd::greater(x, simd::Vec(0.f)), simd::Vec(1.f), simd::Vec(0.f));
  }
};

/// phi(x) = x and no denominator: RetNet-style retention when combined with a decay.
struct Identity {
  static constexpr bool kNormalizes = false;
  double element(double x) const { return x; }
  simd::Vec vec(simd::Vec x) const { return x; }
  double derivative(double) const { return 1; }
  simd::Vec derivative_vec(simd::Vec) const { return simd::Vec(1.f); }
};

/// (1, x, x (x) x / sqrt 2): phi(q) . phi(k) = 1 + q.k + (q.k)^2 / 2, the second-order
/// Taylor term of exp(q.k) ("softmax as an RNN"), always > 0. The state grows as d^2:
/// 1 + d + d^2 features.
struct Taylor2 {
  static constexpr bool kNormalizes = true;
  Index features(Index dim) const { return 1 + dim + dim * dim; }
  /// out[1 + dim + dim^2] = phi(x[dim]).
  template <class T>
  void map_row(const T* x, Index dim, T* out) const {
    const T inv_sqrt2 = T(0.70710678118654752440);
    out[0] = T(1);
    for (Index c = 0; c < dim; ++c) out[1 + c] = x[c];
    T* outer = out + 1 + dim;
    for (Index a = 0; a < dim; ++a) {
      const T xa = x[a] * inv_sqrt2;
      for (Index c = 0; c < dim; ++c) outer[a * dim + c] = xa * x[c];
    }
  }
  /// dx[dim] = J_phi(x)^T d_phi[1 + dim + dim^2]: dx_m = d_phi[1 + m] + sum_c (d_outer[m, c]
  /// + d_outer[c, m]) x_c / sqrt 2.
  template <class T>
  void backward_row(const T* x, const T* d_phi, Index dim, T* dx) const {
    const T inv_sqrt2 = T(0.70710678118654752440);
    const T* d_outer = d_phi + 1 + dim;
    for (Index m = 0; m < dim; ++m) {
      T sum = T(0);
      for (Index c = 0; c < dim; ++c) sum += (d_outer[m * dim + c] + d_outer[c * dim + m]) * x[c];
      dx[m] = d_phi[1 + m] + sum * inv_sqrt2;
    }
  }
};

namespace detail {

template <class Map, class = void>
struct mixes_coordinates : std::false_type {};
template <class Map>
struct mixes_coordinates<Map, std::void_t<decltype(std::declval<const Map&>().features(Index{}))>>
    : std::true_type {};

/// The number of features phi gives for a head dimension `dim`.
template <class Map>
Index feature_count(const Map& map, Index dim) {
  if constexpr (mixes_coordinates<Map>::value)
    return map.features(dim);
  else
    return dim;
}

/// out[feature_count(dim)] = phi(x[dim]), in float (the kernel) or double (the reference).
template <class Map, class T>
void feature_row(const Map& map, const T* x, Index dim, T* out) {
  if constexpr (mixes_coordinates<Map>::value) {
    map.map_row(x, dim, out);
  } else if constexpr (std::is_same_v<T, float>) {
    Index c = 0;
    for (; c + simd::kWidth <= dim; c += simd::kWidth)
      simd::store(out + c, map.vec(simd::load(x + c)));
    for (; c < dim; ++c) out[c] = static_cast<float>(map.element(double(x[c])));
  } else {
    for (Index c = 0; c < dim; ++c) out[c] = static_cast<T>(map.element(x[c]));
  }
}

template <class Map, class = void>
struct has_element_derivative : std::false_type {};
template <class Map>
struct has_element_derivative<Map,
                              std::void_t<decltype(std::declval<const Map&>().derivative(0.0))>>
    : std::true_type {};
template <class Map, class = void>
struct has_derivative_vec : std::false_type {};
template <class Map>
struct has_derivative_vec<
    Map, std::void_t<decltype(std::declval<const Map&>().derivative_vec(simd::Vec(0.f)))>>
    : std::true_type {};
template <class Map, class T, class = void>
struct has_backward_row : std::false_type {};
template <class Map, class T>
struct has_backward_row<
    Map, T,
    std::void_t<decltype(std::declval<const Map&>().backward_row(
        std::declval<const T*>(), std::declval<const T*>(), Index{}, std::declval<T*>()))>>
    : std::true_type {};

/// Whether the map has the backward face its kind needs (see the file comment).
template <class Map>
constexpr bool has_feature_backward() {
  if constexpr (mixes_coordinates<Map>::value)
    return has_backward_row<Map, float>::value && has_backward_row<Map, double>::value;
  else
    return has_element_derivative<Map>::value;
}

/// dx[dim] = J_phi(x)^T d_phi (d_phi[feature_count(dim)]), in float or double.
template <class Map, class T>
void feature_backward_row(const Map& map, const T* x, const T* d_phi, Index dim, T* dx) {
  if constexpr (mixes_coordinates<Map>::value) {
    map.backward_row(x, d_phi, dim, dx);
  } else {
    Index c = 0;
    if constexpr (std::is_same_v<T, float> && has_derivative_vec<Map>::value)
      for (; c + simd::kWidth <= dim; c += simd::kWidth)
        simd::store(dx + c, map.derivative_vec(simd::load(x + c)) * simd::load(d_phi + c));
    for (; c < dim; ++c) dx[c] = static_cast<T>(map.derivative(double(x[c])) * double(d_phi[c]));
  }
}

}  // namespace detail
}  // namespace attnkit
