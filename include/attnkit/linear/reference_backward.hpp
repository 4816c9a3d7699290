// The f64 references of linear attention with a carried state, from the explicit weights
// (reference.hpp's form, plus the state the call starts from): with last_i = i (causal) or
// Lk - 1 (non-causal), w_ij = gamma^(last_i - j) phi(s q_i) . phi(k_j) for j <= last_i,
//   n_i = sum_j w_ij v_j + gamma^(last_i + 1) phi(s q_i)^T S0
//   d_i = sum_j w_ij + gamma^(last_i + 1) phi(s q_i) . z0 + eps,   o_i = n_i / d_i
//   S_last = gamma^Lk S0 + sum_j gamma^(Lk-1-j) phi(k_j) v_j^T   (z_last with 1 for v_j).
// reference::linear_attention_backward() differentiates exactly these sums by hand: with
// g_i = d_o_i / d_i and e_i = -(d_o_i . n_i) / d_i^2 (g_i = d_o_i, e_i = 0 unnormalized),
// dw_ij = g_i . v_j + e_i, and
//   d phi(q_i) = sum_j dw_ij gamma^(last_i-j) phi(k_j) + gamma^(last_i+1) (S0 g_i + z0 e_i)
//   d phi(k_j) = sum_i dw_ij gamma^(last_i-j) phi(q_i) + gamma^(Lk-1-j) (dS v_j + dz)
//   dv_j       = sum_i w_ij g_i + gamma^(Lk-1-j) dS^T phi(k_j)
//   dS0 = sum_i gamma^(last_i+1) phi(q_i) g_i^T + gamma^Lk dS,  dz0 likewise with e_i, dz
// (dS, dz: the gradient of the final state), then dq = s J_phi(s q)^T d phi(q) and
// dk = J_phi(k)^T d phi(k), summed over each GQA group. O(L^2), all in double.
#pragma once

#include <cmath>
#include <vector>

#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_attention_backward.hpp"
#include "attnkit/linear/linear_state.hpp"
#include "attnkit/linear/reference.hpp"

namespace attnkit::reference {

/// A linear-attention state (or its gradient) in double: S [B, H, F, Dv], z [B, H, F].
struct LinearStateF64 {
  Index batch = 0, heads = 0, features = 0, value_dim = 0;
  std::vector<double> s_data, z_data;

  LinearStateF64(Index b, Index h, Index f, Index dv)
      : batch(b),
        heads(h),
        features(f),
        value_dim(dv),
        s_data(static_cast<std::size_t>(b * h * f * dv), 0.0),
        z_data(static_cast<std::size_t>(b * h * f), 0.0) {}
  /// The exact widening of a LinearState.
  explicit LinearStateF64(const LinearState& st)
      : LinearStateF64(st.batch(), st.heads(), st.features(), st.value_dim()) {
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads; ++h)
        for (Index f = 0; f < features; ++f) {
          for (Index c = 0; c < value_dim; ++c) s(b, h, f, c) = double(st.s(b, h, f, c));
          z(b, h, f) = double(st.z(b, h, f));
        }
  }
  double& s(Index b, Index h, Index f, Index c) { return s_data[s_at(b, h, f, c)]; }
  double s(Index b, Index h, Index f, Index c) const { return s_data[s_at(b, h, f, c)]; }
  double& z(Index b, Index h, Index f) { return z_data[z_at(b, h, f)]; }
  double z(Index b, Index h, Index f) const { return z_data[z_at(b, h, f)]; }

 private:
  std::size_t s_at(Index b, Index h, Index f, Index c) const {
    return static_cast<std::size_t>(((b * heads + h) * features + f) * value_dim + c);
  }
  std::size_t z_at(Index b, Index h, Index f) const {
    return static_cast<std::size_t>((b * heads + h) * features + f);
  }
};

namespace detail_linear {

inline void require_state(const LinearStateF64& s, const Problem& p, Index f, const char* name) {
  attnkit::detail::require(
      s.batch == p.batch && s.heads == p.q_heads && s.features == f && s.value_dim == p.value_dim,
      name, "sized (q.batch, q.heads, features, v.dim)", "other sizes");
}

// Visits each (batch, query head) with its KV head, decay and the features of its queries
// (scaled) and keys, [L, f] each: visit(b, h, kvh, gamma, qf, kf).
template <class Map, class Q, class K, class Visit>
void for_each_head(const LinearSpec<Map>& spec, const Problem& p, const View<Q>& q,
                   const View<K>& k, double scale, Index f, Visit&& visit) {
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h) {
      const Index kvh = p.kv_head(h);
      visit(b, h, kvh, double(spec.gamma(h)), features(spec.map, q, b, h, scale, f),
            features(spec.map, k, b, kvh, 1.0, f));
    }
}

}  // namespace detail_linear

/// linear_attention() in double from `state` (S0, z0), leaving in it the state after the
/// last key: the explicit sums above.
template <class Map, class Q, class K, class V, class O>
void linear_attention(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                      const View<V>& v, const View<O>& o, LinearStateF64& state,
                      const Options& options = {}) {
  const Problem p = make_problem(q, k, v, o, options);
  attnkit::detail::validate_linear(spec, p, options, nullptr);
  const double scale = double(options.scale.value_or(1.f));
  const Index f = attnkit::detail::feature_count(spec.map, p.head_dim), dv = p.value_dim;
  detail_linear::require_state(state, p, f, "state");
  using Out = typename View<O>::value_type;
  detail_linear::for_each_head(
      spec, p, q, k, scale, f,
      [&](Index b, Index h, Index kvh, double gamma, const std::vector<double>& qf,
          const std::vector<double>& kf) {
        const auto phi = [&](const std::vector<double>& x, Index row, Index c) {
          return x[static_cast<std::size_t>(row * f + c)];
        };
        for (Index i = 0; i < p.q_len; ++i) {
          const Index last = spec.causal ? i : p.kv_len - 1;
          const double carry = std::pow(gamma, double(last + 1));
          std::vector<double> num(static_cast<std::size_t>(dv), 0.0);
          double den = 0;
          for (Index j = 0; j <= last; ++j) {
            double w = 0;
            for (Index c = 0; c < f; ++c) w += phi(qf, i, c) * phi(kf, j, c);
            w *= std::pow(gamma, double(last - j));
            den += w;
            for (Index c = 0; c < dv; ++c) num[std::size_t(c)] += w * double(v.row(b, kvh, j)[c]);
          }
          for (Index c = 0; c < f; ++c) {
            den += carry * phi(qf, i, c) * state.z(b, h, c);
            for (Index e = 0; e < dv; ++e)
              num[std::size_t(e)] += carry * phi(qf, i, c) * state.s(b, h, c, e);
          }
          const double factor = spec.normalize ? 1.0 / (den + double(spec.eps)) : 1.0;
          for (Index c = 0; c < dv; ++c)
            o.row(b, h, i)[c] = static_cast<Out>(num[std::size_t(c)] * factor);
        }
        const double all = std::pow(gamma, double(p.kv_len));
        for (Index c = 0; c < f; ++c) {
          double z = all * state.z(b, h, c);
          for (Index j = 0; j < p.kv_len; ++j)
            z += std::pow(gamma, double(p.kv_len - 1 - j)) * phi(kf, j, c);
          state.z(b, h, c) = z;
          for (Index e = 0; e < dv; ++e) {
            double s = all * state.s(b, h, c, e);
            for (Index j = 0; j < p.kv_len; ++j)
              s += std::pow(gamma, double(p.kv_len - 1 - j)) * phi(kf, j, c) *
                   double(v.row(b, kvh, j)[e]);
            state.s(b, h, c, e) = s;
          }
        }
      });
}

/// dq, dk, dv (any storage, double included) and, when d_state_in is set, the gradient of
/// the initial state, from the explicit sums above; state_in and d_state_out may be null
/// (zero). The same checks as attnkit::linear_attention_backward().
template <class Map, class Q, class K, class V, class GO, class GQ, class GK, class GV>
void linear_attention_backward(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                               const View<V>& v, const View<GO>& d_o, const View<GQ>& dq,
                               const View<GK>& dk, const View<GV>& dv,
                               const LinearStateF64* state_in, const LinearStateF64* d_state_out,
                               LinearStateF64* d_state_in, const Options& options = {}) {
  static_assert(attnkit::detail::has_feature_backward<Map>(),
                "reference::linear_attention_backward(): the feature map has no backward face "
                "(derivative(double), or backward_row() for a map with features(dim))");
  const Problem p =
      attnkit::detail::make_linear_backward_problem(spec, q, k, v, d_o, dq, dk, dv, options);
  const double scale = double(options.scale.value_or(1.f));
  const Index f = attnkit::detail::feature_count(spec.map, p.head_dim), dvd = p.value_dim,
              d = p.head_dim;
  if (state_in) detail_linear::require_state(*state_in, p, f, "state_in");
  if (d_state_out) detail_linear::require_state(*d_state_out, p, f, "d_state_out");
  if (d_state_in) detail_linear::require_state(*d_state_in, p, f, "d_state_in");
  const auto sz = [](Index n) { return static_cast<std::size_t>(n); };
  std::vector<double> dk_acc(sz(p.batch * p.kv_heads * p.kv_len * d), 0.0);
  std::vector<double> dv_acc(sz(p.batch * p.kv_heads * p.kv_len * dvd), 0.0);
  std::vector<double> x(sz(d)), dx(sz(d));
  detail_linear::for_each_head(
      spec, p, q, k, scale, f,
      [&](Index b, Index h, Index kvh, double gamma, const std::vector<double>& qf,
          const std::vector<double>& kf) {
        const auto s0 = [&](Index c, Index e) { return state_in ? state_in->s(b, h, c, e) : 0.0; };
        const auto z0 = [&](Index c) { return state_in ? state_in->z(b, h, c) : 0.0; };
        const auto vv = [&](Index j, Index e) { return double(v.row(b, kvh, j)[e]); };
        std::vector<double> dqf(sz(p.q_len * f), 0.0), dkf(sz(p.kv_len * f), 0.0);
        std::vector<double> ds0(sz(f * dvd), 0.0), dz0(sz(f), 0.0), num(sz(dvd)), g(sz(dvd));
        double* dv_rows = dv_acc.data() + (b * p.kv_heads + kvh) * p.kv_len * dvd;
        for (Index i = 0; i < p.q_len; ++i) {
          const Index last = spec.causal ? i : p.kv_len - 1;
          const double carry = std::pow(gamma, double(last + 1));
          const double* fq = qf.data() + i * f;
          std::fill(num.begin(), num.end(), 0.0);
          double den = double(spec.eps);
          for (Index j = 0; j <= last; ++j) {
            double w = 0;
            for (Index c = 0; c < f; ++c) w += fq[c] * kf[sz(j * f + c)];
            w *= std::pow(gamma, double(last - j));
            den += w;
            for (Index e = 0; e < dvd; ++e) num[sz(e)] += w * vv(j, e);
          }
          for (Index c = 0; c < f; ++c) {
            den += carry * fq[c] * z0(c);
            for (Index e = 0; e < dvd; ++e) num[sz(e)] += carry * fq[c] * s0(c, e);
          }
          double dot = 0;
          for (Index e = 0; e < dvd; ++e) dot += double(d_o.row(b, h, i)[e]) * num[sz(e)];
          const double inv = spec.normalize ? 1.0 / den : 1.0;
          const double e_i = spec.normalize ? -dot * inv * inv : 0.0;
          for (Index e = 0; e < dvd; ++e) g[sz(e)] = double(d_o.row(b, h, i)[e]) * inv;
          for (Index j = 0; j <= last; ++j) {
            const double decay = std::pow(gamma, double(last - j));
            double w = 0, dw = e_i;
            for (Index c = 0; c < f; ++c) w += fq[c] * kf[sz(j * f + c)];
            for (Index e = 0; e < dvd; ++e) dw += g[sz(e)] * vv(j, e);
            for (Index c = 0; c < f; ++c) {
              dqf[sz(i * f + c)] += dw * decay * kf[sz(j * f + c)];
              dkf[sz(j * f + c)] += dw * decay * fq[c];
            }
            for (Index e = 0; e < dvd; ++e) dv_rows[j * dvd + e] += w * decay * g[sz(e)];
          }
          for (Index c = 0; c < f; ++c) {
            double sg = 0;
            for (Index e = 0; e < dvd; ++e) {
              sg += s0(c, e) * g[sz(e)];
              ds0[sz(c * dvd + e)] += carry * fq[c] * g[sz(e)];
            }
            dqf[sz(i * f + c)] += carry * (sg + z0(c) * e_i);
            dz0[sz(c)] += carry * fq[c] * e_i;
          }
        }
        const auto dso = [&](Index c, Index e) {
          return d_state_out ? d_state_out->s(b, h, c, e) : 0.0;
        };
        const auto dzo = [&](Index c) { return d_state_out ? d_state_out->z(b, h, c) : 0.0; };
        for (Index j = 0; j < p.kv_len; ++j) {  // the final state's terms
          const double decay = std::pow(gamma, double(p.kv_len - 1 - j));
          for (Index c = 0; c < f; ++c) {
            double sv = dzo(c);
            for (Index e = 0; e < dvd; ++e) {
              sv += dso(c, e) * vv(j, e);
              dv_rows[j * dvd + e] += decay * dso(c, e) * kf[sz(j * f + c)];
            }
            dkf[sz(j * f + c)] += decay * sv;
          }
        }
        const double all = std::pow(gamma, double(p.kv_len));
        for (Index i = 0; i < p.q_len; ++i) {  // dq = s J^T d phi(q)
          for (Index c = 0; c < d; ++c) x[sz(c)] = scale * double(q.row(b, h, i)[c]);
          attnkit::detail::feature_backward_row(spec.map, static_cast<const double*>(x.data()),
                                                static_cast<const double*>(dqf.data() + i * f), d,
                                                dx.data());
          using DQ = typename View<GQ>::value_type;
          for (Index c = 0; c < d; ++c) dq.row(b, h, i)[c] = static_cast<DQ>(scale * dx[sz(c)]);
        }
        double* dk_rows = dk_acc.data() + (b * p.kv_heads + kvh) * p.kv_len * d;
        for (Index j = 0; j < p.kv_len; ++j) {
          for (Index c = 0; c < d; ++c) x[sz(c)] = double(k.row(b, kvh, j)[c]);
          attnkit::detail::feature_backward_row(spec.map, static_cast<const double*>(x.data()),
                                                static_cast<const double*>(dkf.data() + j * f), d,
                                                dx.data());
          for (Index c = 0; c < d; ++c) dk_rows[j * d + c] += dx[sz(c)];
        }
        if (d_state_in == nullptr) return;  // the next head
        for (Index c = 0; c < f; ++c) {
          for (Index e = 0; e < dvd; ++e)
            d_state_in->s(b, h, c, e) = ds0[sz(c * dvd + e)] + all * dso(c, e);
          d_state_in->z(b, h, c) = dz0[sz(c)] + all * dzo(c);
        }
      });
  using DK = typename View<GK>::value_type;
  using DV = typename View<GV>::value_type;
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.kv_heads; ++h)
      for (Index j = 0; j < p.kv_len; ++j) {
        const Index row = (b * p.kv_heads + h) * p.kv_len + j;
        for (Index c = 0; c < d; ++c) dk.row(b, h, j)[c] = static_cast<DK>(dk_acc[sz(row * d + c)]);
        for (Index c = 0; c < dvd; ++c)
          dv.row(b, h, j)[c] = static_cast<DV>(dv_acc[sz(row * dvd + c)]);
      }
}

}  // namespace attnkit::reference
