// reference::gated_attention_backward(): the gradients of reference::gated_attention() by
// hand through the per-token recurrence, in double. Per token t, backward from the last, with
// the running gradient dS of the state after t (d_state_out at the end):
//   forward:  S' = Diag(a) S_(t-1), u = S'^T k, d = beta (v - u) (Additive: d = v, beta 1),
//             S_t = S' + k d^T, o = S_t^T q      (q, k: normalized and scaled rows)
//   backward: dq = S_t do;  dS += q do^T;  dk = dS d;  dd = dS^T k;  dv = beta dd;
//             dbeta = dd . (v - u);  du = -beta dd;  dS' = dS + k du^T;  dk += S' du;
//             dg_c = sum_e dS'_ce S'_ce (summed over c for a per-token gate);  dS = Diag(a) dS'
// then through the l2 normalization (y = x r, r = (|x|^2 + 1e-6)^-1/2: dx = r (dy - y (y . dy)))
// and the scale; dq and dk of a key head sum over the value heads that read it.
#pragma once

#include <cmath>
#include <vector>

#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/gated/reference.hpp"

namespace attnkit::reference {

/// Where reference::gated_attention_backward() writes the gradients of the gates (double,
/// shaped as gates.g and gates.beta; an empty view: not wanted) and of the starting state.
struct GatedGradsF64 {
  View<double> dg, dbeta, d_state_in;
};

/// dq, dk [B, Hk, L, Dk], dv [B, Hv, L, Dv] (double) of a loss whose gradient with respect to
/// o is d_o, through gated_attention(spec, q, k, v, gates, o, state_in); d_state_out: the
/// gradient with respect to the state the call left (null: zero).
template <class Q, class K, class V, class G>
void gated_attention_backward(const GatedSpec& spec, const View<Q>& q, const View<K>& k,
                              const View<V>& v, const GateInputs& gates, const View<G>& d_o,
                              const View<double>& dq, const View<double>& dk,
                              const View<double>& dv, const GatedGradsF64& grads = {},
                              const View<const double>* state_in = nullptr,
                              const View<const double>* d_state_out = nullptr,
                              const Options& options = {}) {
  const attnkit::detail::GatedShape s =
      attnkit::detail::check_gated(spec, q, k, v, gates, d_o, nullptr, options);
  const double scale = double(options.scale.value_or(1.f / std::sqrt(float(s.key_dim))));
  const auto Dk = std::size_t(s.key_dim), Dv = std::size_t(s.value_dim), L = std::size_t(s.len);
  const bool channel = spec.gate == GateShape::PerChannel;
  for (Index b = 0; b < s.batch; ++b) {
    for (Index kh = 0; kh < s.k_heads; ++kh)
      for (Index t = 0; t < s.len; ++t) {
        std::fill(dq.row(b, kh, t), dq.row(b, kh, t) + Dk, 0.0);
        std::fill(dk.row(b, kh, t), dk.row(b, kh, t) + Dk, 0.0);
      }
    for (Index h = 0; h < s.v_heads; ++h) {
      const Index kh = s.k_head(h);
      // The forward, keeping the state before each token: states[t] = S_(t-1).
      std::vector<std::vector<double>> qn(L), kn(L), before(L + 1);
      std::vector<double> S(Dk * Dv, 0.0), raw(Dk);
      if (state_in != nullptr)
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) S[c * Dv + e] = state_in->row(b, h, Index(c))[e];
      std::vector<double> a(Dk), u(Dv), d(Dv);
      const auto gates_at = [&](Index t) {
        for (std::size_t c = 0; c < Dk; ++c)
          a[c] = std::exp(detail_gated::log_gate(spec, gates, b, h, t, Index(c)));
      };
      for (Index t = 0; t < s.len; ++t) {
        qn[std::size_t(t)].resize(Dk);
        kn[std::size_t(t)].resize(Dk);
        detail_gated::load_row(q, b, kh, t, spec.l2_normalize, scale, qn[std::size_t(t)]);
        detail_gated::load_row(k, b, kh, t, spec.l2_normalize, 1.0, kn[std::size_t(t)]);
        before[std::size_t(t)] = S;
        gates_at(t);
        std::fill(u.begin(), u.end(), 0.0);
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) {
            S[c * Dv + e] *= a[c];
            if (spec.delta()) u[e] += S[c * Dv + e] * kn[std::size_t(t)][c];
          }
        const double beta = spec.delta() ? double(gates.beta.row(b, h, t)[0]) : 1.0;
        for (std::size_t e = 0; e < Dv; ++e) d[e] = beta * (double(v.row(b, h, t)[e]) - u[e]);
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) S[c * Dv + e] += kn[std::size_t(t)][c] * d[e];
      }
      // Backward.
      std::vector<double> dS(Dk * Dv, 0.0), Sp(Dk * Dv), dqn(Dk), dkn(Dk), dd(Dv), du(Dv);
      if (d_state_out != nullptr)
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) dS[c * Dv + e] = d_state_out->row(b, h, Index(c))[e];
      for (Index t = s.len - 1; t >= 0; --t) {
        const std::vector<double>& qt = qn[std::size_t(t)];
        const std::vector<double>& kt = kn[std::size_t(t)];
        gates_at(t);
        std::fill(u.begin(), u.end(), 0.0);
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e) {
            Sp[c * Dv + e] = a[c] * before[std::size_t(t)][c * Dv + e];
            u[e] += Sp[c * Dv + e] * kt[c];
          }
        const double beta = spec.delta() ? double(gates.beta.row(b, h, t)[0]) : 1.0;
        for (std::size_t e = 0; e < Dv; ++e)
          d[e] = beta * (double(v.row(b, h, t)[e]) - (spec.delta() ? u[e] : 0.0));
        const G* dot = d_o.row(b, h, t);
        // dq = S_t do with S_t = S' + k d^T; dS += q do^T; dk = dS d; dd = dS^T k.
        double d_do = 0;
        for (std::size_t e = 0; e < Dv; ++e) d_do += d[e] * double(dot[e]);
        std::fill(dd.begin(), dd.end(), 0.0);
        for (std::size_t c = 0; c < Dk; ++c) {
          double acc = kt[c] * d_do, dk_c = 0;
          for (std::size_t e = 0; e < Dv; ++e) {
            acc += Sp[c * Dv + e] * double(dot[e]);
            dS[c * Dv + e] += qt[c] * double(dot[e]);
            dk_c += dS[c * Dv + e] * d[e];
            dd[e] += dS[c * Dv + e] * kt[c];
          }
          dqn[c] = acc;
          dkn[c] = dk_c;
        }
        for (std::size_t e = 0; e < Dv; ++e) {
          dv.row(b, h, t)[e] = beta * dd[e];
          du[e] = spec.delta() ? -beta * dd[e] : 0.0;
        }
        if (spec.delta() && grads.dbeta.data != nullptr) {
          double db = 0;
          for (std::size_t e = 0; e < Dv; ++e) db += dd[e] * (double(v.row(b, h, t)[e]) - u[e]);
          grads.dbeta.row(b, h, t)[0] = db;
        }
        // dS' = dS + k du^T; dk += S' du; dg; dS = Diag(a) dS'.
        double dg_token = 0;
        for (std::size_t c = 0; c < Dk; ++c) {
          double dg_c = 0, dk_c = 0;
          for (std::size_t e = 0; e < Dv; ++e) {
            const double dsp = dS[c * Dv + e] + kt[c] * du[e];
            dk_c += Sp[c * Dv + e] * du[e];
            dg_c += dsp * Sp[c * Dv + e];
            dS[c * Dv + e] = a[c] * dsp;
          }
          dkn[c] += dk_c;
          if (channel && grads.dg.data != nullptr) grads.dg.row(b, h, t)[c] = dg_c;
          dg_token += dg_c;
        }
        if (spec.gate == GateShape::PerToken && grads.dg.data != nullptr)
          grads.dg.row(b, h, t)[0] = dg_token;
        // Through the normalization and the scale, summed into the key head's rows.
        detail_gated::row_backward(q, b, kh, t, spec.l2_normalize, scale, dqn, dq.row(b, kh, t));
        detail_gated::row_backward(k, b, kh, t, spec.l2_normalize, 1.0, dkn, dk.row(b, kh, t));
      }
      if (grads.d_state_in.data != nullptr)
        for (std::size_t c = 0; c < Dk; ++c)
          for (std::size_t e = 0; e < Dv; ++e)
            grads.d_state_in.row(b, h, Index(c))[e] = dS[c * Dv + e];
    }
  }
}

}  // namespace attnkit::reference
