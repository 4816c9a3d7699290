// reference::attention_backward(): the gradients of reference::attention() in double, derived
// by hand and element by element, for tests (and users) to compare attention_backward()
// against. Per query row: the logits as the forward reference forms them (positions turned in
// double, raw logit, the Score's element rule, the mask), the weights by the normalizer's
// reference rule, dP_ij = dO_i . v_j, dS by the normalizer's reference_backward(), the Score's
// derivative, then dV_j += P_ij dO_i, dq'_i += dS_ij d(logit)/dq'_i, dk'_j += dS_ij
// d(logit)/dk'_j, and the turned rows' gradients turned back by the transposed rotation.
// It recomputes O and the row statistic itself: `o` and options.lse are checked as
// attention_backward() checks them, not read. Masked pairs are skipped, so whatever masked
// keys and values hold never reaches a gradient.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/reference/attention.hpp"

namespace attnkit::reference {
namespace detail {

// x[dim] in double, then turned back (transposed) by the Position's reference rule.
template <class Position>
void turn_back(const Position& position, double* x, Index dim, const RowAt& at) {
  if constexpr (attnkit::detail::transforms_rows<Position>())
    position.reference_apply_transpose(x, dim, at);
}

template <class T>
void store_row(T* out, const double* x, Index n) {
  for (Index c = 0; c < n; ++c) out[c] = static_cast<std::remove_const_t<T>>(x[c]);
}

}  // namespace detail

/// The gradients of attention(spec, q, k, v, o, options) for the loss L with dL/dO = d_o:
/// dq, dk, dv shaped as q, k, v (each may be a View<double>), and, when grads.normalizer /
/// grads.position is set, the gradient of the normalizer's per-head parameter / the
/// Position's trained parameters. Same checks as
/// attnkit::attention_backward(); serial.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                        const View<O>& o, const View<GO>& d_o, const View<GQ>& dq,
                        const View<GK>& dk, const View<GV>& dv, const Options& options = {},
                        const ParamGrads& grads = {}) {
  using Position = typename Spec::Position;
  using Normalizer = typename Spec::Normalizer;
  using Score = typename Spec::Score;
  namespace ad = attnkit::detail;
  static_assert(ad::check_backward_spec<Spec>());  // each face says what is missing
  const Problem p = ad::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, grads);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const Index lk = p.kv_len, d = p.head_dim, dvd = p.value_dim;
  const auto n = [](Index x) { return static_cast<std::size_t>(x); };
  std::vector<double> s(n(lk)), raw(n(lk)), w(n(lk)), dp(n(lk)), qt(n(d)), dqt(n(d));
  std::vector<double> kt(n(lk * d)), dkt(n(lk * d)), dvt(n(lk * dvd));
  std::vector<char> kept(n(lk));
  std::vector<double> head_grad(n(p.q_heads), 0.0);
  std::vector<double> position_grad(n(ad::position_param_count(spec.position)), 0.0);
  const auto position_share = [&](const auto* x, const double* g, const RowAt& at) {
    if constexpr (ad::has_position_param_grad<Position>::value)
      if (!grads.position.empty())
        spec.position.accumulate_param_grad(x, g, at, position_grad.data());
  };
  constexpr bool kCosine = ad::cosine_logits<Normalizer>();

  for (Index b = 0; b < p.batch; ++b)
    for (Index hk = 0; hk < p.kv_heads; ++hk) {
      std::fill(dkt.begin(), dkt.end(), 0.0);
      std::fill(dvt.begin(), dvt.end(), 0.0);
      for (Index j = 0; j < lk; ++j)
        detail::turn(spec.position, k.row(b, hk, j), kt.data() + j * d, d,
                     RowAt{b, hk, j, lk, j, Role::Key});
      for (Index h = 0; h < p.q_heads; ++h) {
        if (p.kv_head(h) != hk) continue;
        for (Index r = 0; r < p.q_len; ++r) {
          const Index i = r + p.q_offset;
          detail::turn(spec.position, q.row(b, h, r), qt.data(), d,
                       RowAt{b, h, r, p.q_len, i, Role::Query});
          double qq = 0.0;
          for (Index c = 0; c < d; ++c) qq += qt[n(c)] * qt[n(c)];
          for (Index j = 0; j < lk; ++j) {
            kept[n(j)] = spec.mask.keep(b, h, i, j);
            if (!kept[n(j)]) {
              s[n(j)] = neg_inf;
              continue;
            }
            const double* key = kt.data() + j * d;
            double dot = 0.0, kk = 0.0;
            for (Index c = 0; c < d; ++c) {
              dot += qt[n(c)] * key[c];
              kk += key[c] * key[c];
            }
            double x = double(p.scale) * dot;
            if constexpr (kCosine) x = qq == 0.0 || kk == 0.0 ? 0.0 : dot / std::sqrt(qq * kk);
            if constexpr (ad::owns_product<Position>())
              x = spec.position.reference_logit(qt.data(), key, d, i, j);
            if (std::fabs(x) > double(FLT_MAX)) x = std::copysign(HUGE_VAL, x);
            raw[n(j)] = x;
            if constexpr (ad::has_modify<Score>::value) x = spec.score.modify(x, b, h, i, j);
            s[n(j)] = x;
          }
          const Index row = (b * p.q_heads + h) * p.q_len + r;
          const auto visible = static_cast<float>(std::count(kept.begin(), kept.end(), char{1}));
          const RowContext ctx{b, h, lk, d, row, 1, &visible};
          w = s;
          const double stat = ad::reference_row(spec.normalizer, w.data(), lk, ctx);
          const GO* g = d_o.row(b, h, r);
          for (Index j = 0; j < lk; ++j) {
            dp[n(j)] = 0.0;
            if (!kept[n(j)]) continue;
            for (Index c = 0; c < dvd; ++c) dp[n(j)] += double(g[c]) * double(v.row(b, hk, j)[c]);
          }
          head_grad[n(h)] +=
              spec.normalizer.reference_backward(s.data(), w.data(), dp.data(), lk, stat, ctx);
          std::fill(dqt.begin(), dqt.end(), 0.0);
          for (Index j = 0; j < lk; ++j) {
            if (!kept[n(j)]) continue;
            double ds = dp[n(j)];
            if constexpr (!ad::unit_derivative<Score>())
              ds *= spec.score.derivative(raw[n(j)], b, h, i, j);
            for (Index c = 0; c < dvd; ++c) dvt[n(j * dvd + c)] += w[n(j)] * double(g[c]);
            const double* key = kt.data() + j * d;
            double* dkey = dkt.data() + j * d;
            if constexpr (ad::owns_product<Position>()) {
              spec.position.reference_logit_grad(qt.data(), key, d, i, j, ds, dqt.data(), dkey);
            } else if constexpr (kCosine) {  // d cos / dq = k / (|q||k|) - cos q / |q|^2
              double kk = 0.0;
              for (Index c = 0; c < d; ++c) kk += key[c] * key[c];
              if (qq == 0.0 || kk == 0.0) continue;
              const double inv = 1.0 / std::sqrt(qq * kk), cs = raw[n(j)];
              for (Index c = 0; c < d; ++c) {
                dqt[n(c)] += ds * (key[c] * inv - cs * qt[n(c)] / qq);
                dkey[c] += ds * (qt[n(c)] * inv - cs * key[c] / kk);
              }
            } else {
              for (Index c = 0; c < d; ++c) {
                dqt[n(c)] += ds * double(p.scale) * key[c];
                dkey[c] += ds * double(p.scale) * qt[n(c)];
              }
            }
          }
          const RowAt at{b, h, r, p.q_len, i, Role::Query};
          position_share(q.row(b, h, r), dqt.data(), at);
          detail::turn_back(spec.position, dqt.data(), d, at);
          detail::store_row(dq.row(b, h, r), dqt.data(), d);
        }
      }
      for (Index j = 0; j < lk; ++j) {
        double* dkey = dkt.data() + j * d;
        const RowAt at{b, hk, j, lk, j, Role::Key};
        position_share(k.row(b, hk, j), dkey, at);
        detail::turn_back(spec.position, dkey, d, at);
        detail::store_row(dk.row(b, hk, j), dkey, d);
        detail::store_row(dv.row(b, hk, j), dvt.data() + j * dvd, dvd);
      }
    }
  if (!grads.normalizer.empty())
    for (Index h = 0; h < p.q_heads; ++h)
      grads.normalizer.data()[h] = static_cast<float>(head_grad[n(h)]);
  if (!grads.position.empty())
    for (std::size_t c = 0; c < position_grad.size(); ++c)
      grads.position.data()[c] = static_cast<float>(position_grad[c]);
}

}  // namespace attnkit::reference
