// reference::gated_attention(): the plain per-token recurrence of gated_spec.hpp in double,
// one (batch, value head) at a time: S' = Diag(a_t) S; u = S'^T k_t; S = S' + k_t d_t^T with
// d_t = beta_t (v_t - u) (Delta) or v_t (Additive); o_t = S^T (s q_t). O(L Dk Dv): the slow,
// obvious twin the chunked and recurrent forms are tested against.
#pragma once

#include <cmath>
#include <vector>

#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/options.hpp"

namespace attnkit::reference {

namespace detail_gated {

// Row t of x as double, l2-normalized as transformers' l2norm when asked, times `factor`.
template <class T>
void load_row(const View<T>& x, Index b, Index h, Index t, bool l2, double factor,
              std::vector<double>& out) {
  double sum = 0;
  for (Index c = 0; c < x.dim; ++c) {
    out[std::size_t(c)] = double(x.row(b, h, t)[c]);
    sum += out[std::size_t(c)] * out[std::size_t(c)];
  }
  const double f = l2 ? factor / std::sqrt(sum + 1e-6) : factor;
  for (Index c = 0; c < x.dim; ++c) out[std::size_t(c)] *= f;
}

// out += dx for the gradient dy of load_row()'s result: y = factor x r with
// r = (|x|^2 + 1e-6)^-1/2 when l2 (dx = factor r (dy - y0 (y0 . dy)), y0 = x r), else factor x.
template <class T>
void row_backward(const View<T>& x, Index b, Index h, Index t, bool l2, double factor,
                  const std::vector<double>& dy, double* out) {
  if (!l2) {
    for (Index c = 0; c < x.dim; ++c) out[c] += factor * dy[std::size_t(c)];
    return;
  }
  double sum = 0, dot = 0;
  for (Index c = 0; c < x.dim; ++c) sum += double(x.row(b, h, t)[c]) * double(x.row(b, h, t)[c]);
  const double r = 1.0 / std::sqrt(sum + 1e-6);
  for (Index c = 0; c < x.dim; ++c) dot += double(x.row(b, h, t)[c]) * r * dy[std::size_t(c)];
  for (Index c = 0; c < x.dim; ++c)
    out[c] += factor * r * (dy[std::size_t(c)] - double(x.row(b, h, t)[c]) * r * dot);
}

// The log decay of key channel c at token t of head (b, h).
inline double log_gate(const GatedSpec& spec, const GateInputs& gates, Index b, Index h, Index t,
                       Index c) {
  switch (spec.gate) {
    case GateShape::None:
      return 0.0;
    case GateShape::PerHead:
      return double(spec.head_gates[std::size_t(h)]);
    case GateShape::PerToken:
      return double(gates.g.row(b, h, t)[0]);
    case GateShape::PerChannel:
      return double(gates.g.row(b, h, t)[c]);
  }
  return 0.0;
}

}  // namespace detail_gated

/// o[B, Hv, L, Dv] (any storage, double included) of gated attention under `spec`, starting
/// from *state ([B, Hv, Dk, Dv] in double; zero when null) and leaving the final state in it.
/// The same checks as gated_attention().
template <class Q, class K, class V, class O>
void gated_attention(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                     const GateInputs& gates, const View<O>& o, const View<double>* state = nullptr,
                     const Options& options = {}) {
  const attnkit::detail::GatedShape s =
      attnkit::detail::check_gated(spec, q, k, v, gates, o, nullptr, options);
  if (state != nullptr) {
    attnkit::detail::require_dim(state->batch, s.batch, "state.batch", "q.batch");
    attnkit::detail::require_dim(state->heads, s.v_heads, "state.heads", "v.heads");
    attnkit::detail::require_dim(state->seq, s.key_dim, "state.seq", "q.dim");
    attnkit::detail::require_dim(state->dim, s.value_dim, "state.dim", "v.dim");
  }
  const double scale = double(options.scale.value_or(1.f / std::sqrt(float(s.key_dim))));
  const auto Dk = std::size_t(s.key_dim), Dv = std::size_t(s.value_dim);
  std::vector<double> S(Dk * Dv), qr(Dk), kr(Dk), u(Dv), d(Dv);
  for (Index b = 0; b < s.batch; ++b)
    for (Index h = 0; h < s.v_heads; ++h) {
      const Index kh = s.k_head(h);
      for (std::size_t c = 0; c < Dk; ++c)
        for (std::size_t e = 0; e < Dv; ++e)
          S[c * Dv + e] = state != nullptr ? state->row(b, h, Index(c))[e] : 0.0;
      for (Index t = 0; t < s.len; ++t) {
        detail_gated::load_row(q, b, kh, t, spec.l2_normalize, scale, qr);
        detail_gated::load_row(k, b, kh, t, spec.l2_normalize, 1.0, kr);
        for (std::size_t c = 0; c < Dk; ++c) {
          const double a = std::exp(detail_gated::log_gate(spec, gates, b, h, t, Index(c)));
          for (std::size_t e = 0; e < Dv; ++e) S[c * Dv + e] *= a;
        }
        std::fill(u.begin(), u.end(), 0.0);
        if (spec.delta())
          for (std::size_t c = 0; c < Dk; ++c)
            for (std::size_t e = 0; e < Dv; ++e) u[e] += S[c * Dv + e] * kr[c];
        const double beta = spec.delta() ? double(gates.beta.row(b, h, t)[0]) : 1.0;
        for (std::size_t e = 0; e < Dv; ++e)
          d[e] = beta * (double(v.row(b, h, t)[e]) - u[e]);  // u = 0: Additive
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) S[c * Dv + e] += kr[c] * d[e];
        using Out = typename View<O>::value_type;
        for (std::size_t e = 0; e < Dv; ++e) {
          double acc = 0;
          for (std::size_t c = 0; c < Dk; ++c) acc += S[c * Dv + e] * qr[c];
          o.row(b, h, t)[e] = static_cast<Out>(acc);
        }
      }
      if (state != nullptr)
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) state->row(b, h, Index(c))[e] = S[c * Dv + e];
    }
}

}  // namespace attnkit::reference
