// Detection of the backward faces of the policies (attention_backward(),
// reference::attention_backward()). Each face is optional on the policy; the entry points
// static_assert the ones a spec needs, naming the face that is missing.
//   Normalizer: begin_backward(RowContext, Vec stat, Vec delta) -> BackwardState,
//               backward(const BackwardState&, float* s, float* ds, keys, ld) -> Vec,
//               reference_backward(const double* s, const double* p, double* dp, n, stat,
//                                  RowContext) -> double; optional row_param_grad(state)
//               and kTrainedParam (the name of its per-head parameter, for messages);
//               kBackwardPasses > 1 (LSSAR) with observe_backward(state&, pass, float* s,
//               const float* dp, keys, ld), end_backward_pass(state&, pass) and static
//               constexpr backward_pass_reads_dp(pass) for the passes before the last.
//   Score:      nothing (Dot), kUnitDerivative = true (an added bias: Alibi), or
//               derivative(double s, b, h, i, j) and derivative_tile(t, g, keys, lanes, ld,
//               ScoreTile).
//   Position:   apply_transpose(float*, dim, RowAt) and reference_apply_transpose(double*,
//               dim, RowAt) for a row transform (Rope, Fope); trained parameters (Fope):
//               param_count() and accumulate_param_grad(x, g, RowAt, double* acc); a product
//               owner (Tapa): combine_backward(s, s2, ds, ds2, keys, lanes, ld, q_begin,
//               k_begin, d, work) and reference_logit_grad(q, k, d, i, j, dlogit, dq, dk).
#pragma once

#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/normalizer/backward_faces.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// The faces a spec needs for attention_backward() and reference::attention_backward(),
/// each a static_assert naming what is missing. True when they are all there.
template <class Spec>
constexpr bool check_backward_spec() {
  using Normalizer = typename Spec::Normalizer;
  using Score = typename Spec::Score;
  using Position = typename Spec::Position;
  static_assert(has_normalizer_backward<Normalizer>::value,
                "attention_backward(): the normalizer has no backward face (begin_backward(), "
                "backward(), reference_backward(): kernel/backward/backward_traits.hpp)");
  static_assert(backward_passes<Normalizer>() == 1 || has_backward_observe<Normalizer>::value,
                "attention_backward(): kBackwardPasses > 1 needs observe_backward(), "
                "end_backward_pass() and backward_pass_reads_dp() for the passes before the last");
  static_assert(unit_derivative<Score>() ||
                    (has_derivative<Score>::value && has_derivative_tile<Score>::value),
                "attention_backward(): the Score needs derivative() and derivative_tile() (or "
                "kUnitDerivative = true for an added bias)");
  static_assert(!owns_product<Position>() || has_product_backward<Position>::value,
                "attention_backward(): a Position that owns the product needs combine_backward() "
                "and reference_logit_grad()");
  static_assert(std::is_same_v<Position, NoPosition> || owns_product<Position>() ||
                    has_apply_transpose<Position>::value,
                "attention_backward(): the Position needs apply_transpose() and "
                "reference_apply_transpose()");
  return true;
}

}  // namespace attnkit::detail
