// reference::linear_attention(): linear attention from its explicit [Lq, Lk] weights in
// double, w_ij = gamma^(i - j) phi(s q_i) . phi(k_j) for j <= i (causal) or
// gamma^(Lk - 1 - j) phi(s q_i) . phi(k_j) for every j (non-causal), from the empty
// history: o_i = sum_j w_ij v_j / (sum_j w_ij + eps) (or the numerator alone). O(L^2): the
// slow, obvious twin that the chunked and recurrent forms are tested against.
#pragma once

#include <cmath>
#include <vector>

#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_attention.hpp"
#include "attnkit/linear/linear_spec.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"

namespace attnkit::reference {

namespace detail_linear {

// phi(factor * rows) of one head, [seq, F] in double.
template <class Map, class T>
std::vector<double> features(const Map& map, const View<T>& x, Index b, Index h, double factor,
                             Index count) {
  std::vector<double> row(static_cast<std::size_t>(x.dim));
  std::vector<double> out(static_cast<std::size_t>(x.seq * count));
  for (Index s = 0; s < x.seq; ++s) {
    for (Index c = 0; c < x.dim; ++c) row[std::size_t(c)] = factor * double(x.row(b, h, s)[c]);
    attnkit::detail::feature_row(map, row.data(), x.dim, out.data() + s * count);
  }
  return out;
}

}  // namespace detail_linear

/// o[B, Hq, Lq, Dv] (any storage, double included) = linear attention of q, k, v under
/// `spec` with a zero initial state; the same checks and options as linear_attention().
template <class Map, class Q, class K, class V, class O>
void linear_attention(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                      const View<V>& v, const View<O>& o, const Options& options = {}) {
  const Problem p = make_problem(q, k, v, o, options);
  attnkit::detail::validate_linear(spec, p, options, nullptr);
  const double scale = double(options.scale.value_or(1.f));
  const Index f = attnkit::detail::feature_count(spec.map, p.head_dim);
  std::vector<double> acc(static_cast<std::size_t>(p.value_dim));
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h) {
      const Index kvh = p.kv_head(h);
      const double gamma = spec.gamma(h);
      const auto qf = detail_linear::features(spec.map, q, b, h, scale, f);
      const auto kf = detail_linear::features(spec.map, k, b, kvh, 1.0, f);
      for (Index i = 0; i < p.q_len; ++i) {
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        const Index last = spec.causal ? i : p.kv_len - 1;
        for (Index j = 0; j <= last; ++j) {
          double w = 0;
          for (Index c = 0; c < f; ++c)
            w += qf[std::size_t(i * f + c)] * kf[std::size_t(j * f + c)];
          w *= std::pow(gamma, double(last - j));
          sum += w;
          for (Index c = 0; c < p.value_dim; ++c)
            acc[std::size_t(c)] += w * double(v.row(b, kvh, j)[c]);
        }
        const double factor = spec.normalize ? 1.0 / (sum + spec.eps) : 1.0;
        using Out = typename View<O>::value_type;
        for (Index c = 0; c < p.value_dim; ++c)
          o.row(b, h, i)[c] = static_cast<Out>(acc[std::size_t(c)] * factor);
      }
    }
}

}  // namespace attnkit::reference
