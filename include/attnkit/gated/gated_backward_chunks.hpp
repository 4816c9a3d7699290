// The backward of one value head's chunked form (scalar gates: None, PerHead, PerToken),
// chunk by chunk from the last, on the tile GEMMs. Per chunk of n rows, with the state S
// before it and the products below kept (gated_saved.hpp: by the forward, or by a pass of
// the backward's own over the chunks) and gated_heads.hpp's forward
//   A = strictly-lower(diag(beta) (K K^T . Gamma)), T = (I + A)^-1, Bv = diag(beta) V,
//   Bk = diag(beta e) K, U = T Bv, W = T Bk, V' = U - W S, M = lower(Q K^T . Gamma),
//   O = diag(e) Q S + M V',  S_next = e_last S + K^T diag(lambda) V'
// (e_r = exp(G_r), lambda_j = exp(G_last - G_j), Gamma_rj = exp(G_r - G_j); Additive: V' = V),
// and dO, dS_next given:
//   dV' = M^T dO + diag(lambda) K dS_next            dM = lower(dO V'^T)
//   dS  = e_last dS_next + Q^T diag(e) dO - W^T dV'   dQ = diag(e) dO S^T + (dM . Gamma) K
//   dK  = (dM . Gamma)^T Q + diag(lambda) V' dS_next^T
//   dW = -dV' S^T, dBv = T^T dV', dBk = T^T dW, dT = dV' Bv^T + dW Bk^T,
//   dA = -T^T dT T^T (strictly lower), dK += (D + D^T) K with D = diag(beta) dA . Gamma,
//   dV = diag(beta) dBv, dK += diag(beta e) dBk, dbeta and the log gates' gradient from
//   every place e, lambda, Gamma and beta enter (dg_t: the sum of dG_r over r >= t).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/gated/gated_chunk_pass.hpp"
#include "attnkit/gated/gated_saved.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

class ChunkBackward : public ChunkPass {
  // The triangular factors (M, dM . Gamma and T lower; their transposes upper) as GEMM A.
  static constexpr auto kLower = gemm::Triangle::Lower;
  static constexpr auto kUpper = gemm::Triangle::Upper;

 public:
  /// Runs the head from its saved chunks (the forward's); dS [Dk, ldv]: the gradient of the
  /// state after the head (in), of the state before it (out).
  void run(const HeadRows& h, const SavedHead& saved, float* dS) {
    begin(h);
    for (Index c = (h.len + h.chunk - 1) / h.chunk - 1; c >= 0; --c) backward(saved, c, dS);
  }

  /// Runs the head after a pass of its own over the chunks that keeps what the forward
  /// would have: S0 [Dk, ldv] the starting state.
  void run(const HeadRows& h, const float* S0, float* dS) {
    begin(h);
    const SavedSizes sizes{h.len, h.chunk, h.key_dim, h.ldk, h.ldv, h.delta, true};
    own_.resize(std::size_t(sizes.floats()));
    const SavedHead own = sizes.carve(own_.data());
    std::copy_n(S0, h.key_dim * h.ldv, own.state(0));
    const Index chunks = (h.len + h.chunk - 1) / h.chunk;  // sizes.chunks() keeps 1 at len 0
    for (Index c = 0; c < chunks; ++c) keep(own, c, c + 1 < chunks);
    for (Index c = chunks - 1; c >= 0; --c) backward(own, c, dS);
  }

 private:
  // Chunk c's backward from its saved state and products; dS as in run().
  void backward(const SavedHead& saved, Index c, float* dS) {
    Index t0 = 0;
    const Index n = factors(c, t0);
    const Index Dk = h_.key_dim, Dv = h_.value_dim, ldk = h_.ldk, ldv = h_.ldv, cp = cp_;
    const float* K = h_.k + t0 * ldk;
    const float* Q = h_.q + t0 * ldk;
    // S and V' in place when their rows are as wide as the head's, else copied.
    const bool in_place = saved.ldv == ldv;
    if (!in_place) copy_rows(saved.state(c), saved.ldv, Dk, at(S_));
    const float* S = in_place ? saved.state(c) : at(S_);
    const float* M = saved.P + t0 * saved.cp;  // lower(Q K^T . Gamma)
    const float* Vp = h_.v + t0 * ldv;
    if (h_.delta) {
      Vp = saved.Vp + t0 * saved.ldv;
      if (!in_place) Vp = copy_rows(Vp, saved.ldv, n, at(Vp_));
      scaled_inputs(t0, n);
    }
    // Y = [dO; dV'] [2n, ldv] (Additive: dO), so that the products by S^T and the state's
    // gradient take both in one GEMM each.
    const Index rows = h_.delta ? 2 * n : n;
    float* dO = at(Y_);
    float* dVp = h_.delta ? dO + n * ldv : at(dVp_);
    std::copy_n(h_.d_o + t0 * ldv, n * ldv, dO);
    float* dK = at(dK_);
    for (auto* x : {&dG_, &de_, &dlam_, &dbeta_}) std::fill(x->begin(), x->end(), 0.0);
    // dV' = M^T dO + diag(lambda) K dS.
    gemm::gemm(n, ldv, n, {M, 1, cp}, dO, ldv, dVp, ldv, false, kUpper);
    gemm::gemm(n, ldv, Dk, {K, ldk, 1}, dS, ldv, at(tmp_v_), ldv, false);
    for (Index r = 0; r < n; ++r)
      for (Index i = 0; i < ldv; ++i)
        dVp[r * ldv + i] += lam_[std::size_t(r)] * tmp_v_[std::size_t(r * ldv + i)];
    // dM = lower(dO V'^T); dMG = dM . Gamma (into dM_); the Gamma gradient dM . M.
    transpose(Vp, ldv, n, Dv, at(Vpt_), cp);
    gemm::gemm(n, cp, Dv, {dO, ldv, 1}, at(Vpt_), cp, at(dM_), cp, false);
    gamma_grads(at(dM_), M, n, nullptr, nullptr);     // dGamma Gamma = dM . M
    for (Index i = 0; i < n * cp; i += simd::kWidth)  // zero past the diagonal, as Gamma
      simd::store(at(dM_) + i, simd::load(at(dM_) + i) * simd::load(at(gam_) + i));
    // [dO S^T; dV' S^T] (the second: -dW); dQ = diag(e) dO S^T + dMG K, de_r = Q_r . (dO
    // S^T)_r.
    transpose(S, ldv, Dk, Dv, at(St_), ldk);
    float* dQ = at(Z_);
    gemm::gemm(rows, ldk, Dv, {dO, ldv, 1}, at(St_), ldk, dQ, ldk, false);
    for (Index r = 0; r < n; ++r) {
      de_[std::size_t(r)] += double(simd::dot(Q + r * ldk, dQ + r * ldk, Dk));
      scale_row(dQ + r * ldk, ldk, e_[std::size_t(r)]);
    }
    gemm::gemm(n, ldk, n, {at(dM_), cp, 1}, K, ldk, dQ, ldk, true, kLower);
    // dK = dMG^T Q + diag(lambda) V' dS^T; dlambda_j = K_j . (V' dS^T)_j.
    transpose(dS, ldv, Dk, Dv, at(dSt_), ldk);
    gemm::gemm(n, ldk, n, {at(dM_), 1, cp}, Q, ldk, dK, ldk, false, kUpper);
    gemm::gemm(n, ldk, Dv, {Vp, ldv, 1}, at(dSt_), ldk, at(tmp_k_), ldk, false);
    for (Index r = 0; r < n; ++r) {
      dlam_[std::size_t(r)] = double(simd::dot(K + r * ldk, at(tmp_k_) + r * ldk, Dk));
      for (Index i = 0; i < ldk; ++i)
        dK[r * ldk + i] += lam_[std::size_t(r)] * tmp_k_[std::size_t(r * ldk + i)];
    }
    // dS_prev = e_last dS + Q^T diag(e) dO - W^T dV'; de_last += <dS, S> (f32 rows, summed in
    // double).
    double dS_S = 0;
    for (Index r = 0; r < Dk; ++r) dS_S += double(simd::dot(dS + r * ldv, S + r * ldv, ldv));
    de_[std::size_t(n - 1)] += dS_S;
    scale_row(dS, Dk * ldv, e_[std::size_t(n - 1)]);  // read no more: dS_prev in place
    // [diag(e) Q; -W]^T [dO; dV'] in one GEMM (QWs_ holds the 2n rows).
    for (Index r = 0; r < n; ++r)
      for (Index i = 0; i < ldk; ++i)
        QWs_[std::size_t(r * ldk + i)] = e_[std::size_t(r)] * Q[r * ldk + i];
    if (h_.delta) {
      const float* W = saved.W + t0 * saved.ldk;
      for (Index r = 0; r < n; ++r)
        for (Index i = 0; i < ldk; ++i)
          QWs_[std::size_t((n + r) * ldk + i)] = -W[r * saved.ldk + i];
    }
    gemm::gemm(Dk, ldv, rows, {at(QWs_), 1, ldk}, dO, ldv, dS, ldv, true);
    if (h_.delta) {
      delta_backward(saved, t0, n, dVp, dQ + n * ldk);
    } else {
      for (Index r = 0; r < n; ++r) std::copy_n(dVp + r * ldv, ldv, h_.dv + (t0 + r) * ldv);
    }
    // The log gates: e_r = exp(G_r), lambda_j = exp(G_last - G_j), then the chunk's sums.
    for (Index r = 0; r < n; ++r) {
      dG_[std::size_t(r)] += de_[std::size_t(r)] * double(e_[std::size_t(r)]);
      const double dl = dlam_[std::size_t(r)] * double(lam_[std::size_t(r)]);
      dG_[std::size_t(n - 1)] += dl;
      dG_[std::size_t(r)] -= dl;
    }
    double sum = 0;
    for (Index r = n - 1; r >= 0; --r) {
      sum += dG_[std::size_t(r)];
      if (h_.dg != nullptr) h_.dg[t0 + r] = float(sum);
      if (h_.dbeta != nullptr) h_.dbeta[t0 + r] = float(dbeta_[std::size_t(r)]);
    }
    for (Index r = 0; r < n; ++r)
      for (Index i = 0; i < Dk; ++i) {
        h_.dq[(t0 + r) * Dk + i] += dQ[r * ldk + i];
        h_.dk[(t0 + r) * Dk + i] += dK[r * ldk + i];
      }
  }

  // The Gamma gradient of X . Y over the chunk's lower triangle ([n, cp] rows, Y zero past
  // the diagonal): with x_rj = sign f_r X_rj Y_rj (f_r = factor[r], or 1), dG_r += sum_j x_rj
  // and dG_j -= sum_r x_rj; the row sums before f also go to (*rows)[r] if given. f32 SIMD
  // sums of at most a chunk's products, added to the double dG.
  void gamma_grads(const float* X, const float* Y, Index n, const float* factor,
                   std::vector<double>* rows, float sign = 1.f) {
    const Index cp = cp_;
    colsum_.assign(std::size_t(cp), 0.f);
    for (Index r = 0; r < n; ++r) {
      const float f = sign * (factor != nullptr ? factor[r] : 1.f);
      const Vec fv(f);
      Vec acc(0.f);
      for (Index j = 0; j < simd::round_up(r + 1); j += simd::kWidth) {
        const Vec x = simd::load(X + r * cp + j) * simd::load(Y + r * cp + j);
        acc = acc + x;
        simd::store(at(colsum_) + j, simd::fma(x, fv, simd::load(at(colsum_) + j)));
      }
      const float sum = simd::reduce_add(acc);
      if (rows != nullptr) (*rows)[std::size_t(r)] += double(sign) * double(sum);
      dG_[std::size_t(r)] += double(f) * double(sum);
    }
    for (Index j = 0; j < n; ++j) dG_[std::size_t(j)] -= double(colsum_[std::size_t(j)]);
  }

  // The delta rule's part: through V' = T Bv - T Bk S, T = (I + A)^-1 and A, Bv, Bk; dVp
  // [n, ldv] the gradient of V', dW [n, ldk] dV' S^T on entry (that is -dW; negated here).
  void delta_backward(const SavedHead& saved, Index t0, Index n, const float* dVp, float* dW) {
    const Index Dk = h_.key_dim, Dv = h_.value_dim, ldk = h_.ldk, ldv = h_.ldv, cp = cp_;
    const float* K = h_.k + t0 * ldk;
    const float* V = h_.v + t0 * ldv;
    const float* T = saved.T + t0 * cp;
    const float* kkg = saved.kkg + t0 * cp;
    float* dK = at(dK_);
    for (Index i = 0; i < n * ldk; ++i) dW[i] = -dW[i];
    gemm::gemm(n, ldv, n, {T, 1, cp}, dVp, ldv, at(dBv_), ldv, false, kUpper);  // dBv = T^T dU
    gemm::gemm(n, ldk, n, {T, 1, cp}, dW, ldk, at(dBk_), ldk, false, kUpper);   // dBk = T^T dW
    transpose(at(Bv_), ldv, n, Dv, at(Bvt_), cp);  // dT = dU Bv^T + dW Bk^T
    transpose(at(Bk_), ldk, n, Dk, at(Bkt_), cp);
    gemm::gemm(n, cp, Dv, {dVp, ldv, 1}, at(Bvt_), cp, at(dT_), cp, false);
    gemm::gemm(n, cp, Dk, {dW, ldk, 1}, at(Bkt_), cp, at(dT_), cp, true);
    transpose(T, cp, n, n, at(Tt_), cp);  // dA = -T^T (dT T^T)
    gemm::gemm(n, cp, n, {at(dT_), cp, 1}, at(Tt_), cp, at(X_), cp, false);
    gemm::gemm(n, cp, n, {T, 1, cp}, at(X_), cp, at(dA_), cp, false, kUpper);
    // A_rj = beta_r KKG_rj (j < r): with dA = -(dA_), dbeta_r += sum_j dA_rj KKG_rj, the
    // Gamma gradient beta_r dA . KKG, and D = beta dA . Gamma (its strict lower part read).
    float* D = at(dA_);
    gamma_grads(D, kkg, n, h_.beta + t0, &dbeta_, -1.f);
    for (Index r = 0; r < n; ++r) {
      const Vec f(-h_.beta[t0 + r]);
      float* row = D + r * cp;
      for (Index j = 0; j < r; j += simd::kWidth)
        simd::store(row + j, simd::load(row + j) * f * simd::load(at(gam_) + r * cp + j));
    }
    // dK += (D + D^T) K: the symmetric sum into X_ (read no more), one GEMM.
    float* E = at(X_);
    for (Index r = 0; r < n; ++r) {
      for (Index j = 0; j < r; ++j) E[r * cp + j] = D[std::size_t(r * cp + j)];
      E[r * cp + r] = 0.f;
      for (Index j = r + 1; j < n; ++j) E[r * cp + j] = D[std::size_t(j * cp + r)];
    }
    gemm::gemm(n, ldk, n, {E, cp, 1}, K, ldk, dK, ldk, true);
    // Bv = diag(beta) V, Bk = diag(beta e) K.
    for (Index r = 0; r < n; ++r) {
      const float beta = h_.beta[t0 + r], e = e_[std::size_t(r)];
      const float* dbv = at(dBv_) + r * ldv;
      const float* dbk = at(dBk_) + r * ldk;
      const double kdbk = double(simd::dot(K + r * ldk, dbk, Dk));
      dbeta_[std::size_t(r)] += double(simd::dot(V + r * ldv, dbv, Dv)) + double(e) * kdbk;
      de_[std::size_t(r)] += double(beta) * kdbk;
      for (Index i = 0; i < ldv; ++i) h_.dv[(t0 + r) * ldv + i] = beta * dbv[i];
      for (Index i = 0; i < ldk; ++i) dK[r * ldk + i] += beta * e * dbk[i];
    }
  }
};

}  // namespace attnkit::detail
