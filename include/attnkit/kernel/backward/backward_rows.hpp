// The normalizer side of one query tile of attention_backward()'s tile engine
// (kernel/backward/backward_tiles.hpp), as kernel/tiles/tile_rows.hpp is the forward's: one
// BackwardState per kWidth rows (a SIMD lane per query), begun from the forward's row statistic and
// D_i, fed the passes before the last where the normalizer makes several (LSSAR: row statistics
// only), and in the last pass turning each key tile's logits into weights P and dP into dS.
#pragma once

#include <cstddef>
#include <vector>

#include "attnkit/kernel/backward/backward_traits.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/backward_faces.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

template <class Normalizer>
class BackwardRows {
 public:
  using State = typename Normalizer::BackwardState;
  static constexpr Index kW = simd::kWidth;

  explicit BackwardRows(Index max_rows) : states_(static_cast<std::size_t>(max_rows / kW)) {}

  /// The states of rows [q0, q0 + nq) of head h in batch b (positions from i0): stat and delta
  /// [B, Hq, Lq] the forward's statistics (stat null: none) and D_i, read for the real rows (0
  /// in padding lanes); for a normalizer that counts keys (kCountsKeys), the rows' visible keys
  /// under `mask` in counts [nq].
  template <class Mask>
  void begin(const Normalizer& n, const Mask& mask, const Problem& p, const float* stat,
             const float* delta, Index b, Index h, Index q0, Index nq, Index lanes, Index i0,
             float* counts) {
    constexpr bool kCounts = counts_keys<Normalizer>();
    if constexpr (kCounts)
      for (Index r = 0; r < nq; ++r)
        counts[r] = static_cast<float>(visible_key_count(mask, b, h, i0 + r, p.kv_len));
    const Index row0 = (b * p.q_heads + h) * p.q_len + q0;
    alignas(64) float st[kW], d[kW];
    for (Index c = 0; c < lanes; c += kW) {
      for (Index lane = 0; lane < kW; ++lane) {
        const bool real = c + lane < nq;
        st[lane] = real && stat != nullptr ? stat[row0 + c + lane] : 0.f;
        d[lane] = real ? delta[row0 + c + lane] : 0.f;
      }
      const RowContext ctx{
          b, h, p.kv_len, p.head_dim, row0 + c, nq - c, kCounts ? counts + c : nullptr};
      at(c) = n.begin_backward(ctx, simd::load(st), simd::load(d));
    }
  }

  /// A pass before the last over one tile: s [nk, ld] logits (masked -inf, padding lanes too),
  /// dp [nk, ld] dP (masked 0), null when the pass reads none.
  void observe(const Normalizer& n, int pass, float* s, const float* dp, Index nk, Index lanes,
               Index ld) {
    for (Index c = 0; c < lanes; c += kW)
      n.observe_backward(at(c), pass, s + c, dp == nullptr ? nullptr : dp + c, nk, ld);
  }
  void end_pass(const Normalizer& n, int pass, Index lanes) {
    for (Index c = 0; c < lanes; c += kW) n.end_backward_pass(at(c), pass);
  }

  /// The last pass over one tile: s -> P, dp -> dS; each row's parameter gradient from these
  /// keys added to lane_grad [lanes].
  void backward(const Normalizer& n, float* s, float* dp, Index nk, Index lanes, Index ld,
                float* lane_grad) {
    for (Index c = 0; c < lanes; c += kW) {
      const simd::Vec g = n.backward(at(c), s + c, dp + c, nk, ld);
      simd::store(lane_grad + c, simd::load(lane_grad + c) + g);
    }
  }

  /// The rows' parameter gradient that no key carries (softmax sinks) over the first nq rows,
  /// in row order (0 for a normalizer without one); staging [lanes].
  double row_param_grad(const Normalizer& n, Index nq, Index lanes, float* staging) const {
    if constexpr (!has_row_param_grad<Normalizer>::value) {
      (void)n, (void)nq, (void)lanes, (void)staging;
      return 0.0;
    } else {
      for (Index c = 0; c < lanes; c += kW)
        simd::store(staging + c, n.row_param_grad(states_[static_cast<std::size_t>(c / kW)]));
      double grad = 0.0;
      for (Index r = 0; r < nq; ++r) grad += double(staging[r]);
      return grad;
    }
  }

 private:
  State& at(Index lane) { return states_[static_cast<std::size_t>(lane / kW)]; }

  std::vector<State> states_;  // [max_rows / kWidth] one lane per query
};

}  // namespace attnkit::detail
