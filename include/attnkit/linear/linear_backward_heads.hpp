// LinearBackwardHeads: one thread's engine of linear_attention_backward(), run per KV head
// group (b, kvh) on validated inputs. Per query head of the group, with g_i = d_o_i / den_i,
// delta_i = -(d_o_i . o_i) / den_i (g = d_o, delta = 0 unnormalized), R / r the gradients
// of S / z:
//   d phi(q_i) = S_i g_i + delta_i z_i                       (S_i, z_i: after key i)
//   R_j = phi(q_j) g_j^T + gamma R_{j+1},  r_j likewise with delta_j; R_L = d_state_out
//   dv_j = R_j^T phi(k_j),  d phi(k_j) = R_j v_j + r_j,  d_state_in = gamma R_0
// in the forward's chunks: pass 1 walks the chunks forward, rebuilding S (kept transposed,
// [Dv, F]) and z, and per chunk
//   Z   = diag(gamma^(r+1)) 1 z^T + D phi(K)              (z_i of every row; den = phi(Q) . Z)
//   U   = diag(gamma^(r+1)) G S^T + ((G V^T) . D) phi(K)   (S_i g_i, through tile GEMMs)
//   d phi(Q) = U + diag(delta) Z, delta_i = -(phi(q_i) . u_i) / den_i (u_i . phi(q_i) is
//   g_i . numerator_i, so o is never read); pass 2 walks them backward with R, r:
//   dV = diag(w) phi(K) R + (phi(Q) phi(K)^T . D)^T G,     w_j = gamma^(n-1-j)
//   d phi(K)^T = (R V^T + r 1^T) diag(w) + phi(Q)^T ((G V^T + delta 1^T) . D)
//   R = gamma^n R + phi(Q)^T diag(gamma^(r+1)) G,  r = gamma^n r + phi(Q)^T (gamma^(r+1) delta)
// Non-causal calls read S_last only: R = d_state_out + phi(Q)^T G, and each key gets
// w_j = gamma^(Lk-1-j). dk and dv of the group are summed in f32 rows [Lk, D], [Lk, Dv] over
// its query heads in order, then stored once.
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/scratch.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_backward_rows.hpp"
#include "attnkit/linear/linear_spec.hpp"
#include "attnkit/linear/linear_state.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// The state arguments of one backward call (any may be null: zero state, zero gradient,
/// not wanted).
struct LinearBackwardStates {
  const LinearState* state_in = nullptr;
  const LinearState* d_state_out = nullptr;
  LinearState* d_state_in = nullptr;
};

template <class Map, class Q, class K, class V, class GO, class GQ, class GK, class GV>
class LinearBackwardHeads : LinearBackwardRows<Map, Q, K, V, GO> {
  using Rows = LinearBackwardRows<Map, Q, K, V, GO>;
  using Rows::c_, Rows::cp_, Rows::d_, Rows::dvd_, Rows::f_, Rows::fp_, Rows::ld_, Rows::p_,
      Rows::spec_, Rows::scale_, Rows::scratch_, Rows::decays_, Rows::powers_, Rows::qa_, Rows::ka_,
      Rows::qf_, Rows::kf_, Rows::kft_, Rows::va_, Rows::vt_, Rows::g_, Rows::den_;
  using Rows::load_queries, Rows::load_keys, Rows::load_values, Rows::load_grads, Rows::mask_row,
      Rows::set_gamma, Rows::store, Rows::scale_row;

  // The floats of this class's buffers, carved in the constructor in this order.
  static Index own_floats(const LinearSpec<Map>& spec, const Problem& p) {
    const Index d = p.head_dim, dv = p.value_dim, f = feature_count(spec.map, d);
    const Index fp = simd::round_up(f), ld = simd::round_up(dv), c = spec.chunk;
    const Index cp = simd::round_up(c);
    return Scratch::size_for(d, c * fp, c * fp, c * cp, c * cp, f * cp, c * ld, dv * fp, fp, f * ld,
                             fp, p.q_len, p.kv_len * d, p.kv_len * dv, cp, fp);
  }

 public:
  LinearBackwardHeads(const LinearSpec<Map>& spec, const Problem& p, float scale, const View<Q>& q,
                      const View<K>& k, const View<V>& v, const View<GO>& d_o, const View<GQ>& dq,
                      const View<GK>& dk, const View<GV>& dv, const LinearBackwardStates& states)
      : Rows(spec, p, scale, q, k, v, d_o, own_floats(spec, p)),
        dq_(dq),
        dk_(dk),
        dv_(dv),
        states_(states) {
    dx_ = scratch_.carve(d_);                   // [D]      one row's input gradient
    zr_ = scratch_.carve(c_ * fp_);             // [C, Fp]  z_i of each row
    u_ = scratch_.carve(c_ * fp_);              // [C, Fp]  S_i g_i, then d phi(Q)
    mat_ = scratch_.carve(c_ * cp_);            // [C, Cp]  (G V^T (+ delta)) . D
    scores_ = scratch_.carve(c_ * cp_);         // [C, Cp]  phi(Q) phi(K)^T . D
    dkt_ = scratch_.carve(f_ * cp_);            // [F, Cp]  d phi(K)^T
    dvb_ = scratch_.carve(c_ * ld_);            // [C, ld]  dV of the chunk
    st_ = scratch_.carve(dvd_ * fp_);           // [Dv, Fp] S^T of the forward
    z_ = scratch_.carve(fp_);                   // [Fp]     z of the forward
    rs_ = scratch_.carve(f_ * ld_);             // [F, ld]  R
    rz_ = scratch_.carve(fp_);                  // [Fp]     r
    delta_ = scratch_.carve(p.q_len);           // [Lq]     delta
    dk_acc_ = scratch_.carve(p.kv_len * d_);    // [Lk, D]  dk of the group
    dv_acc_ = scratch_.carve(p.kv_len * dvd_);  // [Lk, Dv] dv of the group
    w_ = scratch_.carve(cp_);                   // [Cp]     key weights, 0 past the chunk
    drow_ = scratch_.carve(fp_);                // [Fp]     d phi(k_j)
  }

  /// Every gradient of KV head kvh of batch b: dq of its query heads, dk, dv, d_state_in.
  void run(Index b, Index kvh) {
    std::fill(dk_acc_, dk_acc_ + p_.kv_len * d_, 0.f);
    std::fill(dv_acc_, dv_acc_ + p_.kv_len * dvd_, 0.f);
    const Index group = p_.q_heads / p_.kv_heads;
    for (Index h = kvh * group; h < (kvh + 1) * group; ++h) head(b, h, kvh);
    for (Index t = 0; t < p_.kv_len; ++t) {
      store(dk_.row(b, kvh, t), dk_acc_ + t * d_, d_, 1.f);
      store(dv_.row(b, kvh, t), dv_acc_ + t * dvd_, dvd_, 1.f);
    }
  }

 private:
  void head(Index b, Index h, Index kvh) {
    const float gamma = set_gamma(h);
    load_states(b, h);
    if (spec_.causal) {
      for (Index t0 = 0; t0 < p_.q_len; t0 += c_) forward_chunk(b, h, kvh, t0);
      for (Index t0 = (p_.q_len - 1) / c_ * c_; t0 >= 0 && p_.q_len > 0; t0 -= c_)
        reverse_chunk(b, h, kvh, t0);
    } else {
      non_causal(b, h, kvh, gamma);
    }
    if (states_.d_state_in == nullptr) return;
    float* out = states_.d_state_in->head(b, h);
    std::copy(rs_, rs_ + f_ * ld_, out);
    std::copy(rz_, rz_ + f_, out + f_ * ld_);
  }

  // st_ = S_in^T, z_ = z_in, rs_ = dS_out, rz_ = dz_out (zero when absent), padding 0.
  void load_states(Index b, Index h) {
    std::fill(st_, st_ + dvd_ * fp_, 0.f);
    std::fill(z_, z_ + fp_, 0.f);
    std::fill(rs_, rs_ + f_ * ld_, 0.f);
    std::fill(rz_, rz_ + fp_, 0.f);
    if (const LinearState* s = states_.state_in)
      for (Index f = 0; f < f_; ++f) {
        for (Index c = 0; c < dvd_; ++c) st_[c * fp_ + f] = s->s(b, h, f, c);
        z_[f] = s->z(b, h, f);
      }
    if (const LinearState* s = states_.d_state_out)
      for (Index f = 0; f < f_; ++f) {
        for (Index c = 0; c < dvd_; ++c) rs_[f * ld_ + c] = s->s(b, h, f, c);
        rz_[f] = s->z(b, h, f);
      }
  }

  // Pass 1 of a causal chunk: den, delta, dq of its rows; then S and z advance past it.
  void forward_chunk(Index b, Index h, Index kvh, Index t0) {
    const Index n = std::min(c_, p_.q_len - t0), np = simd::round_up(n);
    load_queries(b, h, t0, n);
    load_keys(b, kvh, t0, n);
    load_values(b, kvh, t0, n);
    for (Index r = 0; r < n; ++r) {  // the causal decay mask D
      for (Index j = 0; j <= r; ++j) mat_[r * cp_ + j] = powers_[r - j];
      std::fill(mat_ + r * cp_ + r + 1, mat_ + r * cp_ + np, 0.f);
    }
    gemm::gemm(n, fp_, n, {mat_, cp_, 1}, kf_, fp_, zr_, fp_, false);
    for (Index r = 0; r < n; ++r) {
      float* zr = zr_ + r * fp_;
      for (Index f = 0; f < f_; ++f) zr[f] += powers_[r + 1] * z_[f];
      den_[t0 + r] = spec_.normalize ? simd::dot(qf_ + r * fp_, zr, fp_) + spec_.eps : 1.f;
    }
    load_grads(b, h, t0, n);
    gemm::gemm(n, fp_, dvd_, {g_, ld_, 1}, st_, fp_, u_, fp_, false);
    if (decays_)
      for (Index r = 0; r < n; ++r) scale_row(u_ + r * fp_, fp_, powers_[r + 1]);
    gemm::gemm(n, np, dvd_, {g_, ld_, 1}, vt_, cp_, mat_, cp_, false);
    for (Index r = 0; r < n; ++r) mask_row(mat_ + r * cp_, r, np, 0.f);
    gemm::gemm(n, fp_, n, {mat_, cp_, 1}, kf_, fp_, u_, fp_, true);
    query_grads(b, h, t0, n, zr_, fp_);
    advance_state(n);
  }

  // Pass 2 of a causal chunk: dk, dv of its keys from R, r, then R, r step back past it.
  void reverse_chunk(Index b, Index h, Index kvh, Index t0) {
    const Index n = std::min(c_, p_.q_len - t0), np = simd::round_up(n);
    load_queries(b, h, t0, n);
    load_keys(b, kvh, t0, n);
    load_values(b, kvh, t0, n);
    load_grads(b, h, t0, n);
    gemm::gemm(n, np, f_, {qf_, fp_, 1}, kft_, cp_, scores_, cp_, false);
    for (Index r = 0; r < n; ++r) mask_row(scores_ + r * cp_, r, np, 0.f);
    gemm::gemm(n, np, dvd_, {g_, ld_, 1}, vt_, cp_, mat_, cp_, false);
    for (Index r = 0; r < n; ++r) mask_row(mat_ + r * cp_, r, np, delta_[t0 + r]);
    for (Index j = 0; j < cp_; ++j) w_[j] = j < n ? powers_[n - 1 - j] : 0.f;
    key_state_grads(n, np);
    gemm::gemm(n, ld_, n, {scores_, 1, cp_}, g_, ld_, dvb_, ld_, true);
    gemm::gemm(f_, np, n, {qf_, 1, fp_}, mat_, cp_, dkt_, cp_, true);
    accumulate_keys(t0, n);
    for (Index f = 0; f < f_; ++f) rz_[f] *= powers_[n];
    for (Index r = 0; r < n; ++r) {
      const float coef = powers_[r + 1] * delta_[t0 + r];
      for (Index f = 0; f < f_; ++f) rz_[f] += coef * qf_[r * fp_ + f];
      if (decays_) scale_row(g_ + r * ld_, ld_, powers_[r + 1]);
    }
    if (decays_) scale_row(rs_, f_ * ld_, powers_[n]);
    gemm::gemm(f_, ld_, n, {qf_, 1, fp_}, g_, ld_, rs_, ld_, true);
  }

  void non_causal(Index b, Index h, Index kvh, float gamma) {
    for (Index t0 = 0; t0 < p_.kv_len; t0 += c_) {  // S_last, z_last
      const Index n = std::min(c_, p_.kv_len - t0);
      load_keys(b, kvh, t0, n);
      load_values(b, kvh, t0, n);
      advance_state(n);
    }
    for (Index t0 = 0; t0 < p_.q_len; t0 += c_) {  // every query reads S_last
      const Index n = std::min(c_, p_.q_len - t0);
      load_queries(b, h, t0, n);
      for (Index r = 0; r < n; ++r)
        den_[t0 + r] = spec_.normalize ? simd::dot(qf_ + r * fp_, z_, fp_) + spec_.eps : 1.f;
      load_grads(b, h, t0, n);
      gemm::gemm(n, fp_, dvd_, {g_, ld_, 1}, st_, fp_, u_, fp_, false);
      query_grads(b, h, t0, n, z_, 0);
      for (Index r = 0; r < n; ++r)
        for (Index f = 0; f < f_; ++f) rz_[f] += delta_[t0 + r] * qf_[r * fp_ + f];
      gemm::gemm(f_, ld_, n, {qf_, 1, fp_}, g_, ld_, rs_, ld_, true);
    }
    for (Index t0 = 0; t0 < p_.kv_len; t0 += c_) {  // keys: w_j = gamma^(Lk-1-j)
      const Index n = std::min(c_, p_.kv_len - t0), np = simd::round_up(n);
      load_keys(b, kvh, t0, n);
      load_values(b, kvh, t0, n);
      const float base = float(std::pow(double(gamma), double(p_.kv_len - t0 - n)));
      for (Index j = 0; j < cp_; ++j) w_[j] = j < n ? base * powers_[n - 1 - j] : 0.f;
      key_state_grads(n, np);
      accumulate_keys(t0, n);
    }
    const float all = float(std::pow(double(gamma), double(p_.kv_len)));
    scale_row(rs_, f_ * ld_, all);
    for (Index f = 0; f < f_; ++f) rz_[f] *= all;
  }

  // u_ holds S_i g_i; delta_i and d phi(q_i) = u_i + delta_i z_i (z row i of `z`, stride
  // `z_stride`, 0: one z for all), then dq = s J^T d phi(q).
  void query_grads(Index b, Index h, Index t0, Index n, const float* z, Index z_stride) {
    for (Index r = 0; r < n; ++r) {
      float* u = u_ + r * fp_;
      const float* zr = z + r * z_stride;
      const float delta = spec_.normalize ? -simd::dot(qf_ + r * fp_, u, fp_) / den_[t0 + r] : 0.f;
      delta_[t0 + r] = delta;
      for (Index f = 0; f < f_; ++f) u[f] += delta * zr[f];
      feature_backward_row(spec_.map, static_cast<const float*>(qa_ + r * d_),
                           static_cast<const float*>(u), d_, dx_);
      store(dq_.row(b, h, t0 + r), dx_, d_, scale_);
    }
  }

  // The part of the key gradients the state after the chunk carries: dvb_ = diag(w) phi(K)
  // R and dkt_ = (R V^T + r 1^T) diag(w).
  void key_state_grads(Index n, Index np) {
    gemm::gemm(n, ld_, f_, {kf_, fp_, 1}, rs_, ld_, dvb_, ld_, false);
    for (Index j = 0; j < n; ++j) scale_row(dvb_ + j * ld_, ld_, w_[j]);
    gemm::gemm(f_, np, dvd_, {rs_, ld_, 1}, vt_, cp_, dkt_, cp_, false);
    for (Index f = 0; f < f_; ++f)
      for (Index j = 0; j < n; ++j) dkt_[f * cp_ + j] = (dkt_[f * cp_ + j] + rz_[f]) * w_[j];
  }

  // dk_acc += J^T d phi(k_j), dv_acc += dvb_ rows.
  void accumulate_keys(Index t0, Index n) {
    for (Index j = 0; j < n; ++j) {
      for (Index f = 0; f < f_; ++f) drow_[f] = dkt_[f * cp_ + j];
      feature_backward_row(spec_.map, static_cast<const float*>(ka_ + j * d_),
                           static_cast<const float*>(drow_), d_, dx_);
      float* dk = dk_acc_ + (t0 + j) * d_;
      for (Index c = 0; c < d_; ++c) dk[c] += dx_[c];
      float* dv = dv_acc_ + (t0 + j) * dvd_;
      for (Index c = 0; c < dvd_; ++c) dv[c] += dvb_[j * ld_ + c];
    }
  }

  // S^T = gamma^n S^T + V^T diag(w) phi(K), z = gamma^n z + phi(K)^T w (scales va_ rows).
  void advance_state(Index n) {
    for (Index j = 0; j < cp_; ++j) w_[j] = j < n ? powers_[n - 1 - j] : 0.f;
    for (Index f = 0; f < f_; ++f) z_[f] = z_[f] * powers_[n] + simd::dot(kft_ + f * cp_, w_, cp_);
    if (decays_) {
      scale_row(st_, dvd_ * fp_, powers_[n]);
      for (Index j = 0; j < n; ++j) scale_row(va_ + j * ld_, ld_, powers_[n - 1 - j]);
    }
    gemm::gemm(dvd_, fp_, n, {va_, 1, ld_}, kf_, fp_, st_, fp_, true);
  }

  View<GQ> dq_;
  View<GK> dk_;
  View<GV> dv_;
  LinearBackwardStates states_;
  float *dx_, *zr_, *u_, *mat_, *scores_, *dkt_, *dvb_, *st_, *z_, *rs_, *rz_, *delta_, *dk_acc_,
      *dv_acc_, *w_, *drow_;
};

}  // namespace attnkit::detail
