// Shared test support: named tolerances, tensors in the three tested layouts (with NaN in
// every padding element, so a stray read poisons the result), and comparisons against the
// f64 reference.
#pragma once

#include <algorithm>
#include <attnkit/core/tensor.hpp>
#include <attnkit/storage/quantize.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace attnkit::test {

// Tolerances, named per storage type. Outputs are convex combinations of values of order 1.
namespace tol {
inline constexpr double kF32 = 2e-5;     // f32 kernel vs f64 reference, f32 storage
inline constexpr double kLseF32 = 2e-5;  // LSE (natural log) vs the f64 reference
inline constexpr double kBf16 = 1.6e-2;  // result rounded to bf16 (8-bit mantissa) storage
inline constexpr double kHalf = 2e-3;    // result rounded to f16 (11-bit mantissa) storage
// A row sum (ReluPower's, SoftplusL1's l1 statistic) adds up to Lk positive f32 terms: relative.
inline constexpr double kRowSumRel = 1e-5;
}  // namespace tol

enum class Layout { Bhsd, Bshd, Padded };

inline const char* name(Layout l) {
  return l == Layout::Bhsd ? "bhsd" : l == Layout::Bshd ? "bshd" : "padded";
}

/// "f32", "f64", "bf16", "f16" (Eigen's 16-bit types by their mantissa, without Eigen), "q8_0"
/// or "q4_0".
template <class T>
const char* storage_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, double>) return "f64";
  if constexpr (std::is_same_v<T, BlockQ8_0>) return "q8_0";
  if constexpr (std::is_same_v<T, BlockQ4_0>) return "q4_0";
  return std::numeric_limits<T>::digits == 8 ? "bf16" : "f16";
}

/// n values drawn from N(0, stddev^2) by mt19937(seed), in f32: random_values<float>'s draws.
/// Defined in support.cpp, which is compiled with optimization: drawing the inputs at the
/// tests' -Og was most of the run time of some tests (the libm calls of the Box-Muller step).
std::vector<float> normal_values(std::uint32_t seed, float stddev, std::size_t n);

/// n values drawn from N(0, stddev^2) by mt19937(seed).
template <class T = float>
std::vector<T> random_values(std::size_t n, std::uint32_t seed, double stddev = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<T> dist(T(0), T(stddev));
  std::vector<T> v(n);
  for (T& x : v) x = dist(rng);
  return v;
}

/// Per-head sink logits -1, 0, 1, -1, ... for `heads` heads (0: the sink weighs like one more
/// key of logit 0, the off-by-one softmax).
inline std::vector<float> head_sinks(Index heads) {
  std::vector<float> sinks;
  for (Index h = 0; h < heads; ++h) sinks.push_back(float(h % 3) - 1.f);
  return sinks;
}

/// Per-head sigmoid biases -1, -1.75, -2.5, ... for `heads` heads.
inline std::vector<float> head_biases(Index heads) {
  std::vector<float> biases;
  for (Index h = 0; h < heads; ++h) biases.push_back(-1.f - 0.75f * float(h));
  return biases;
}

/// Cut points 0 = c_0 < c_1 < ... < c_parts = n of [0, n), the inner ones drawn at random by
/// mt19937(seed) (parts <= n).
inline std::vector<Index> random_cuts(Index n, int parts, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Index> c{0, n};
  std::uniform_int_distribution<Index> at(1, n - 1);
  while (static_cast<int>(c.size()) < parts + 1) {
    const Index x = at(rng);
    if (std::find(c.begin(), c.end(), x) == c.end()) c.push_back(x);
  }
  std::sort(c.begin(), c.end());
  return c;
}

/// Whether every element of v equals x (a sentinel a refused call must leave in place).
template <class T>
bool all_equal_to(const std::vector<T>& v, T x) {
  return std::all_of(v.begin(), v.end(), [x](T y) { return y == x; });
}

/// Owns the memory behind a View<T> in one of the tested layouts.
template <class T>
struct Tensor {
  std::vector<T> memory;
  View<T> view;

  Tensor(const Tensor&) = delete;  // the view points into `memory`
  Tensor& operator=(const Tensor&) = delete;

  // For the quantized blocks (attnkit/storage/blocks.hpp) the elements are blocks of 32 values:
  // strides count blocks, for_each() visits blocks, randomize() quantizes its draws.
  static constexpr bool kBlocks = detail::is_block_quantized<T>();

  Tensor(Layout layout, Index B, Index H, Index S, Index D) {
    const Index e = detail::row_elements<T>(D), n = B * H * S * e;
    switch (layout) {
      case Layout::Bhsd:
        memory.assign(static_cast<std::size_t>(n), zero());
        view = bhsd(memory.data(), B, H, S, D);
        break;
      case Layout::Bshd:
        memory.assign(static_cast<std::size_t>(n), zero());
        view = bshd(memory.data(), B, S, H, D);
        break;
      case Layout::Padded: {  // every stride padded; padding holds NaN
        const Index ss = e + 3, hs = S * ss + 5, bs = H * hs + 7;
        memory.assign(static_cast<std::size_t>(B * bs + 1), not_a_number());
        view = strided(memory.data(), {B, H, S, D}, {bs, hs, ss});
        for (Index b = 0; b < B; ++b)
          for (Index h = 0; h < H; ++h)
            for (Index s = 0; s < S; ++s)
              std::fill(view.row(b, h, s), view.row(b, h, s) + e, zero());
        break;
      }
    }
  }

  template <class F>
  void for_each(F f) const {
    const Index e = detail::row_elements<T>(view.dim);
    for (Index b = 0; b < view.batch; ++b)
      for (Index h = 0; h < view.heads; ++h)
        for (Index s = 0; s < view.seq; ++s)
          for (Index c = 0; c < e; ++c) f(view.row(b, h, s)[c]);
  }

  /// Every element (not the padding) set to x.
  Tensor& fill(T x) {
    for_each([x](T& y) { y = x; });
    return *this;
  }

  /// Whether every element (not the padding) equals x.
  bool holds(T x) const {
    bool all = true;
    for_each([&](const T& y) { all = all && y == x; });
    return all;
  }

  /// Every element (not the padding) drawn from N(0, stddev^2), in for_each order.
  /// For blocks: each row's draws, quantized (a Tensor<float> randomized alike holds them).
  Tensor& randomize(std::uint32_t seed, float stddev = 1.f) {
    const auto n = static_cast<std::size_t>(view.batch * view.heads * view.seq * view.dim);
    const std::vector<float> values = normal_values(seed, stddev, n);
    if constexpr (kBlocks) {
      const float* row = values.data();
      for (Index b = 0; b < view.batch; ++b)
        for (Index h = 0; h < view.heads; ++h)
          for (Index s = 0; s < view.seq; ++s, row += view.dim)
            quantize_row(row, view.dim, view.row(b, h, s));
    } else {
      std::size_t next = 0;
      for_each([&](T& x) { x = T(values[next++]); });
    }
    return *this;
  }

  View<const T> cview() const { return view; }

  /// The elements as the f32 values a kernel reads (blocks dequantized), [B, H, S, D] row-major.
  std::vector<float> values() const {
    std::vector<float> out(static_cast<std::size_t>(view.batch * view.heads * view.seq * view.dim));
    float* next = out.data();
    for (Index b = 0; b < view.batch; ++b)
      for (Index h = 0; h < view.heads; ++h)
        for (Index s = 0; s < view.seq; ++s, next += view.dim) {
          const T* row = view.row(b, h, s);
          if constexpr (kBlocks)
            dequantize_row(row, view.dim, next);
          else
            std::transform(row, row + view.dim, next, [](T x) { return float(x); });
        }
    return out;
  }

 private:
  static T zero() {
    if constexpr (kBlocks)
      return T{};  // scale 0
    else
      return T(0);
  }
  static T not_a_number() {
    if constexpr (kBlocks) {
      T blk{};
      blk.d = 0x7E00;  // a NaN scale: every value NaN
      return blk;
    } else {
      return T(std::numeric_limits<float>::quiet_NaN());
    }
  }
};

/// Largest |a - b| over all elements of two views of the same shape.
template <class A, class B>
double max_abs_diff(const View<A>& a, const View<B>& b) {
  double worst = 0.0;
  for (Index i = 0; i < a.batch; ++i)
    for (Index h = 0; h < a.heads; ++h)
      for (Index s = 0; s < a.seq; ++s)
        for (Index c = 0; c < a.dim; ++c) {
          const double d = std::abs(double(a.row(i, h, s)[c]) - double(b.row(i, h, s)[c]));
          worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
        }
  return worst;
}

/// Largest |a - b| over two LSE vectors; equal infinities count as 0, NaN as infinity.
inline double max_lse_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    const double d = std::abs(double(a[i]) - double(b[i]));
    worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
  }
  return worst;
}

}  // namespace attnkit::test
