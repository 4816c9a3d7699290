// The backward tests' vocabulary: one Case's inputs, the forward call that saves O and the
// row statistic, attention_backward() on them, and reference::attention_backward() in f64;
// gradients compared relative to each gradient's largest element (gradient magnitudes vary
// with the shape and the normalizer), with tolerances named per storage type. And the
// reference's own check: central finite differences of the f64 forward (loss sum dO * O).
#pragma once

#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/attention_backward.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/reference/attention_backward.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/case.hpp"

namespace attnkit::test {

namespace tol {
// Gradients of an f32 kernel against the f64 reference, relative to the largest |element| of
// the same gradient: a few hundred f32 roundings per element (the recomputed logit, exp, the
// sums over keys and queries).
inline constexpr double kGradF32 = 2e-4;
// The same with gradients stored in bf16 / f16: the storage rounding (2^-8, 2^-11 relative)
// of elements up to the largest one.
inline constexpr double kGradBf16 = 8e-3;
inline constexpr double kGradHalf = 1e-3;
// The f64 reference against central differences with step kFdStep: truncation (h^2 times
// the third derivative) and cancellation (1e-16 / h) both far below it.
inline constexpr double kFdStep = 1e-5;
inline constexpr double kFdRel = 1e-6;
}  // namespace tol

template <class T>
double grad_tolerance() {
  if constexpr (std::is_same_v<T, float>) return tol::kGradF32;
  return std::numeric_limits<T>::digits == 8 ? tol::kGradBf16 : tol::kGradHalf;
}

/// Worst |got - want| over max(|want|) (1e-30 floor) of two views of one shape.
template <class A, class B>
double relative_error(const View<A>& got, const View<B>& want) {
  double scale = 1e-30;
  for (Index b = 0; b < want.batch; ++b)
    for (Index h = 0; h < want.heads; ++h)
      for (Index s = 0; s < want.seq; ++s)
        for (Index c = 0; c < want.dim; ++c)
          scale = std::max(scale, std::abs(double(want.row(b, h, s)[c])));
  return max_abs_diff(got, want) / scale;
}

/// Inputs in storage T, O (f32) with its row statistic as the forward saves them, and dO.
template <class T = float>
struct BackwardCase {
  Case c;
  Tensor<T> q, k, v, d_o;
  Tensor<float> o;
  std::vector<float> stat;
  template <class Spec>
  BackwardCase(const Spec& spec, const Case& c_, std::uint32_t seed = 11)
      : c(c_),
        q(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        d_o(c.layout, c.batch, c.q_heads, c.q_len, c.dv()),
        o(c.layout, c.batch, c.q_heads, c.q_len, c.dv()),
        stat(static_cast<std::size_t>(c.rows())) {
    q.randomize(seed, c.stddev);
    k.randomize(seed + 1, c.stddev);
    v.randomize(seed + 2);
    d_o.randomize(seed + 3);
    forward(spec);
  }
  /// O and its statistic as a forward call saves them (again, after a test changed the
  /// inputs); from the reference (rounded to f32), which keeps the tile kernel's forward out
  /// of these tests' instantiations (the forward is tested on its own; here the backward's
  /// inputs only need to be a consistent pair).
  template <class Spec>
  void forward(const Spec& spec) {
    reference::attention(spec, q.cview(), k.cview(), v.cview(), o.view, options_for(spec));
  }
  /// The case's options, with the statistic's buffer when the normalizer has one.
  template <class Spec>
  Options options_for(const Spec&) {
    if constexpr (detail::row_stat_kind<typename Spec::Normalizer>() == RowStat::None)
      return c.options();
    else
      return c.options().with_lse(stat);
  }
};

/// The gradients of one call: dq, dk, dv in storage G and the parameter gradient.
template <class G>
struct Grads {
  Tensor<G> dq, dk, dv;
  std::vector<float> param, position;  // the normalizer's [Hq]; the Position's [param_count]
  explicit Grads(const Case& c, Layout layout)
      : dq(layout, c.batch, c.q_heads, c.q_len, c.dim),
        dk(layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        dv(layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        param(static_cast<std::size_t>(c.q_heads), 42.f) {}
  ParamGrads param_grads() { return ParamGrads{}.with_normalizer(param); }
};

template <class Spec>
constexpr bool trains_param() {
  return detail::has_trained_param<typename Spec::Normalizer>::value;
}

/// ParamGrads into g: the normalizer's and the Position's, where they have trained parameters.
template <class Spec, class G>
ParamGrads param_grads_for(const Spec& spec, Grads<G>& g) {
  ParamGrads pg = trains_param<Spec>() ? g.param_grads() : ParamGrads{};
  g.position.assign(static_cast<std::size_t>(detail::position_param_count(spec.position)), 42.f);
  if (!g.position.empty()) pg = pg.with_position(g.position);
  return pg;
}

/// Worst |got - want| over max(|want|) of two parameter gradients.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 1e-30, worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(double(want[i])));
    const double d = std::abs(double(got[i]) - double(want[i]));
    worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d);
  }
  return worst / scale;
}

/// attention_backward(spec) on one case's inputs into g (gradients in storage G).
template <class G, class Spec, class T>
void run_backward(const Spec& spec, BackwardCase<T>& in, Grads<G>& g) {
  const Options options = in.options_for(spec);
  const ParamGrads pg = param_grads_for(spec, g);
  attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.o.cview(), in.d_o.cview(),
                     g.dq.view, g.dk.view, g.dv.view, options, pg);
}

/// attention_backward(spec) against reference::attention_backward(spec) on the inputs `in`
/// (storage T) with gradients in storage G, each gradient CHECKed.
template <class G = float, class Spec, class T>
void check_backward(const std::string& name, const Spec& spec, BackwardCase<T>& in) {
  const Case& c = in.c;
  INFO(name << ", " << describe(c) << ", inputs " << storage_name<T>() << ", gradients "
            << storage_name<G>());
  Grads<G> got(c, c.layout);
  run_backward(spec, in, got);
  Grads<double> want(c, Layout::Bhsd);
  reference::attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.o.cview(),
                                in.d_o.cview(), want.dq.view, want.dk.view, want.dv.view,
                                in.options_for(spec), param_grads_for(spec, want));
  const double allowed = grad_tolerance<G>();
  CHECK(relative_error(got.dq.view, want.dq.view) <= allowed);
  CHECK(relative_error(got.dk.view, want.dk.view) <= allowed);
  CHECK(relative_error(got.dv.view, want.dv.view) <= allowed);
  if constexpr (trains_param<Spec>()) CHECK(relative_error(got.param, want.param) <= tol::kGradF32);
  CHECK(relative_error(got.position, want.position) <= tol::kGradF32);
}

/// The same on case c's random inputs.
template <class T = float, class G = float, class Spec>
void check_backward(const std::string& name, const Spec& spec, const Case& c) {
  BackwardCase<T> in(spec, c);
  check_backward<G>(name, spec, in);
}

}  // namespace attnkit::test
