// The backward of one value head's chunked form (scalar gates: None, PerHead, PerToken),
// chunk by chunk from the last, on the tile GEMMs. Per chunk of n rows, with the state S
// before it (kept by a forward pass) and gated_heads.hpp's forward
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

#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// One value head's rows, as GatedBackward loads them, and where its gradients go.
struct HeadRows {
  Index len, key_dim, value_dim, ldk, ldv, chunk;
  bool delta;
  const float *q, *k, *v, *d_o, *gate, *beta;  // [L, ldk], [L, ldk], [L, ldv], [L, ldv], [L], [L]
  float *dq, *dk;                              // [L, Dk]: added to
  float *dv, *dg, *dbeta;                      // [L, ldv], [L], [L]: written
};

class ChunkBackward {
 public:
  /// Runs the head: S0 [Dk, ldv] the state before it (in: the start; destroyed), dS [Dk, ldv]
  /// the gradient of the state after it (in), of the state before it (out).
  void run(const HeadRows& h, float* S0, float* dS) {
    h_ = h;
    const Index L = h.len, C = h.chunk, area = h.key_dim * h.ldv;
    cp_ = simd::round_up(C);
    const Index chunks = (L + C - 1) / C;
    size_buffers();
    if (h.delta) {
      const auto rows = std::size_t(chunks * C);
      saved_kk_.resize(rows * std::size_t(cp_));
      saved_T_.resize(rows * std::size_t(cp_));
      saved_W_.resize(rows * std::size_t(h.ldk));
      saved_Vp_.resize(rows * std::size_t(h.ldv));
    }
    states_.resize(std::size_t((chunks + 1) * area));
    std::copy_n(S0, area, states_.data());
    for (Index c = 0; c < chunks; ++c) {  // the state before each chunk
      float* next = states_.data() + (c + 1) * area;
      std::copy_n(next - area, area, next);
      forward(c * C, std::min(C, L - c * C), next, true);
    }
    for (Index c = chunks - 1; c >= 0; --c) {
      const Index t0 = c * C, n = std::min(C, L - t0);
      std::copy_n(states_.data() + c * area, area, S_.data());
      forward(t0, n, S_.data(), false);
      backward(t0, n, dS);
    }
  }

 private:
  using Vec = simd::Vec;
  static float* at(std::vector<float>& x) { return x.data(); }

  // The chunk buffers, sized (and zeroed) once per worker: every value read is written first
  // for each chunk, and padding past the real rows and columns never enters a result (the dots
  // below run over the real lengths), so stale values from an earlier head are never read.
  void size_buffers() {
    const Index C = h_.chunk, ldk = h_.ldk, ldv = h_.ldv, Dk = h_.key_dim, cp = cp_;
    const Index dvp = simd::round_up(h_.value_dim);
    const auto size = [](std::vector<float>& x, Index n) {
      if (x.size() != std::size_t(n)) x.assign(std::size_t(n), 0.f);
    };
    for (auto* x : {&kk_, &qk_, &gam_, &T_, &M_, &dM_, &dT_, &X_, &dA_, &Tt_}) size(*x, C * cp);
    for (auto* x : {&Bv_, &U_, &Vp_, &dVp_, &dBv_, &tmp_v_}) size(*x, C * ldv);
    for (auto* x : {&Bk_, &W_, &dW_, &dBk_, &dQ_, &dK_, &tmp_k_}) size(*x, C * ldk);
    for (auto* x : {&Kt_, &Bkt_}) size(*x, ldk * cp);
    for (auto* x : {&Vpt_, &Bvt_}) size(*x, dvp * cp);
    for (auto* x : {&St_, &dSt_}) size(*x, std::max(dvp * ldk, Dk * ldv));
    size(S_, Dk * ldv);
    size(dS_next_, Dk * ldv);
    e_.resize(std::size_t(C));
    lam_.resize(std::size_t(C));
    G_.resize(std::size_t(C));
    dG_.resize(std::size_t(C));
  }

  // dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (dst zero elsewhere as sized).
  // Whole SIMD blocks go through registers, the edges one by one.
  static void transpose(const float* src, Index lds, Index rows, Index cols, float* dst,
                        Index ldd) {
    const Index W = simd::kWidth, rb = rows / W * W, cb = cols / W * W;
    for (Index r = 0; r < rb; r += W)
      for (Index c = 0; c < cb; c += W)
        simd::transpose_block(src + r * lds + c, lds, dst + c * ldd + r, ldd);
    for (Index r = 0; r < rows; ++r)
      for (Index c = r < rb ? cb : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
  }

  // The chunk's forward. With `advance` (run()'s pass over the chunks): its factors, K K^T, T,
  // U, W and V', the last four saved for the backward, and S (in place) becomes the state after
  // the chunk. Without: the factors, the saved K K^T, T, W, V', Bv, Bk and M = lower(Q K^T .
  // Gamma), for backward().
  void forward(Index t0, Index n, float* S, bool advance) {
    const Index Dk = h_.key_dim, ldk = h_.ldk, ldv = h_.ldv, cp = cp_;
    const float* K = h_.k + t0 * ldk;
    const float* Q = h_.q + t0 * ldk;
    const float* V = h_.v + t0 * ldv;
    double G = 0;
    for (Index r = 0; r < n; ++r) G_[std::size_t(r)] = G += double(h_.gate[t0 + r]);
    for (Index r = 0; r < n; ++r) {
      e_[std::size_t(r)] = float(std::exp(G_[std::size_t(r)]));
      lam_[std::size_t(r)] = float(std::exp(G_[std::size_t(n - 1)] - G_[std::size_t(r)]));
      for (Index j = 0; j < cp; ++j)
        gam_[std::size_t(r * cp + j)] =
            j <= r ? float(std::exp(G_[std::size_t(r)] - G_[std::size_t(j)])) : 0.f;
    }
    std::fill(Kt_.begin(), Kt_.end(), 0.f);
    transpose(K, ldk, n, Dk, at(Kt_), cp);
    float* Vp = at(Vp_);
    // The chunk's K K^T, T, W and V' from the boundary pass (saved_: chunk c at c * C rows).
    const std::size_t chunk = std::size_t(t0 / h_.chunk), C = std::size_t(h_.chunk);
    float* saved_kk = at(saved_kk_) + chunk * C * std::size_t(cp);
    float* saved_T = at(saved_T_) + chunk * C * std::size_t(cp);
    float* saved_W = at(saved_W_) + chunk * C * std::size_t(ldk);
    float* saved_Vp = at(saved_Vp_) + chunk * C * std::size_t(ldv);
    if (h_.delta && !advance) {
      std::copy_n(saved_kk, n * cp, at(kk_));
      std::copy_n(saved_T, n * cp, at(T_));
      std::copy_n(saved_W, n * ldk, at(W_));
      std::copy_n(saved_Vp, n * ldv, Vp);
      for (Index r = 0; r < n; ++r) {
        const float beta = h_.beta[t0 + r], be = beta * e_[std::size_t(r)];
        for (Index i = 0; i < ldv; ++i) Bv_[std::size_t(r * ldv + i)] = beta * V[r * ldv + i];
        for (Index i = 0; i < ldk; ++i) Bk_[std::size_t(r * ldk + i)] = be * K[r * ldk + i];
      }
    } else if (h_.delta) {
      gemm::gemm(n, cp, Dk, {K, ldk, 1}, at(Kt_), cp, at(kk_), cp, false);
      float* T = at(T_);  // T = (I + A)^-1, A = strictly-lower(beta_r KK . Gamma)
      for (Index r = 0; r < n; ++r) {
        float* row = T + r * cp;
        std::fill(row, row + cp, 0.f);
        row[r] = 1.f;
        const float beta = h_.beta[t0 + r];
        for (Index j = 0; j < r; ++j) {  // T's row j is zero past j: whole vectors up to it
          const Vec a(-beta * kk_[std::size_t(r * cp + j)] * gam_[std::size_t(r * cp + j)]);
          for (Index i = 0; i <= j; i += simd::kWidth)
            simd::store(row + i, simd::fma(simd::load(T + j * cp + i), a, simd::load(row + i)));
        }
      }
      for (Index r = 0; r < n; ++r) {
        const float beta = h_.beta[t0 + r], be = beta * e_[std::size_t(r)];
        for (Index c = 0; c < ldv; ++c) Bv_[std::size_t(r * ldv + c)] = beta * V[r * ldv + c];
        for (Index c = 0; c < ldk; ++c) Bk_[std::size_t(r * ldk + c)] = be * K[r * ldk + c];
      }
      gemm::gemm(n, ldv, n, {T, cp, 1}, at(Bv_), ldv, at(U_), ldv, false);
      gemm::gemm(n, ldk, n, {T, cp, 1}, at(Bk_), ldk, at(W_), ldk, false);
      gemm::gemm(n, ldv, Dk, {at(W_), ldk, 1}, S, ldv, Vp, ldv, false);  // W S
      for (Index i = 0; i < n * ldv; ++i) Vp[i] = U_[std::size_t(i)] - Vp[i];
      std::copy_n(at(kk_), n * cp, saved_kk);
      std::copy_n(at(T_), n * cp, saved_T);
      std::copy_n(at(W_), n * ldk, saved_W);
      std::copy_n(Vp, n * ldv, saved_Vp);
    } else {
      std::copy_n(V, n * ldv, Vp);
    }
    if (advance) {  // S = e_last S + K^T diag(lambda) V'
      const float el = e_[std::size_t(n - 1)];
      for (Index i = 0; i < Dk * ldv; ++i) S[i] *= el;
      for (Index r = 0; r < n; ++r)
        for (Index c = 0; c < ldv; ++c)
          tmp_v_[std::size_t(r * ldv + c)] = lam_[std::size_t(r)] * Vp[r * ldv + c];
      gemm::gemm(Dk, ldv, n, {K, 1, ldk}, at(tmp_v_), ldv, S, ldv, true);
      return;
    }
    gemm::gemm(n, cp, Dk, {Q, ldk, 1}, at(Kt_), cp, at(qk_), cp, false);
    for (Index i = 0; i < n * cp; ++i)
      M_[std::size_t(i)] = qk_[std::size_t(i)] * gam_[std::size_t(i)];
  }

  void backward(Index t0, Index n, float* dS) {
    const Index Dk = h_.key_dim, Dv = h_.value_dim, ldk = h_.ldk, ldv = h_.ldv, cp = cp_;
    const float* K = h_.k + t0 * ldk;
    const float* Q = h_.q + t0 * ldk;
    const float* V = h_.v + t0 * ldv;
    const float* dO = h_.d_o + t0 * ldv;
    const float* S = at(S_);
    float *dVp = at(dVp_), *Vp = at(Vp_), *dQ = at(dQ_), *dK = at(dK_);
    std::fill(dG_.begin(), dG_.end(), 0.0);
    std::vector<double> de(std::size_t(n), 0.0), dlam(std::size_t(n), 0.0),
        dbeta(std::size_t(n), 0.0);
    // dV' = M^T dO + diag(lambda) K dS.
    gemm::gemm(n, ldv, n, {at(M_), 1, cp}, dO, ldv, dVp, ldv, false);
    gemm::gemm(n, ldv, Dk, {K, ldk, 1}, dS, ldv, at(tmp_v_), ldv, false);
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < ldv; ++c)
        dVp[r * ldv + c] += lam_[std::size_t(r)] * tmp_v_[std::size_t(r * ldv + c)];
    // dM = lower(dO V'^T); dMG = dM . Gamma (into dM_); the Gamma gradient dM QK.
    transpose(Vp, ldv, n, Dv, at(Vpt_), cp);
    gemm::gemm(n, cp, Dv, {dO, ldv, 1}, at(Vpt_), cp, at(dM_), cp, false);
    for (Index r = 0; r < n; ++r)
      for (Index j = 0; j <= r; ++j) {
        const std::size_t i = std::size_t(r * cp + j);
        const double g = double(dM_[i]) * double(qk_[i]) * double(gam_[i]);  // dGamma Gamma
        dG_[std::size_t(r)] += g;
        dG_[std::size_t(j)] -= g;
        dM_[i] *= gam_[i];
      }
    for (Index r = 0; r < n; ++r) std::fill(at(dM_) + r * cp + r + 1, at(dM_) + (r + 1) * cp, 0.f);
    // dQ = diag(e) dO S^T + dMG K; de_r = Q_r . (dO S^T)_r.
    transpose(S, ldv, Dk, Dv, at(St_), ldk);
    gemm::gemm(n, ldk, Dv, {dO, ldv, 1}, at(St_), ldk, dQ, ldk, false);
    for (Index r = 0; r < n; ++r) {
      de[std::size_t(r)] += double(simd::dot(Q + r * ldk, dQ + r * ldk, Dk));
      for (Index c = 0; c < ldk; ++c) dQ[r * ldk + c] *= e_[std::size_t(r)];
    }
    gemm::gemm(n, ldk, n, {at(dM_), cp, 1}, K, ldk, dQ, ldk, true);
    // dK = dMG^T Q + diag(lambda) V' dS^T; dlambda_j = K_j . (V' dS^T)_j.
    transpose(dS, ldv, Dk, Dv, at(dSt_), ldk);
    gemm::gemm(n, ldk, n, {at(dM_), 1, cp}, Q, ldk, dK, ldk, false);
    gemm::gemm(n, ldk, Dv, {Vp, ldv, 1}, at(dSt_), ldk, at(tmp_k_), ldk, false);
    for (Index r = 0; r < n; ++r) {
      dlam[std::size_t(r)] = double(simd::dot(K + r * ldk, at(tmp_k_) + r * ldk, Dk));
      for (Index c = 0; c < ldk; ++c)
        dK[r * ldk + c] += lam_[std::size_t(r)] * tmp_k_[std::size_t(r * ldk + c)];
    }
    // dS_prev = e_last dS + Q^T diag(e) dO - W^T dV'; de_last += <dS, S>.
    double dS_S = 0;
    for (Index i = 0; i < Dk * ldv; ++i) dS_S += double(dS[i]) * double(S[i]);
    de[std::size_t(n - 1)] += dS_S;
    float* next = at(dS_next_);
    for (Index i = 0; i < Dk * ldv; ++i) next[i] = e_[std::size_t(n - 1)] * dS[i];
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < ldk; ++c)
        tmp_k_[std::size_t(r * ldk + c)] = e_[std::size_t(r)] * Q[r * ldk + c];
    gemm::gemm(Dk, ldv, n, {at(tmp_k_), 1, ldk}, dO, ldv, next, ldv, true);
    if (h_.delta) {
      gemm::gemm(Dk, ldv, n, {at(W_), 1, ldk}, dVp, ldv, at(St_) /* scratch */, ldv, false);
      for (Index i = 0; i < Dk * ldv; ++i) next[i] -= St_[std::size_t(i)];
      delta_backward(t0, n, de, dbeta);
    } else {
      for (Index r = 0; r < n; ++r) std::copy_n(dVp + r * ldv, ldv, h_.dv + (t0 + r) * ldv);
    }
    std::copy_n(next, Dk * ldv, dS);
    // The log gates: e_r = exp(G_r), lambda_j = exp(G_last - G_j), then the chunk's sums.
    for (Index r = 0; r < n; ++r) {
      dG_[std::size_t(r)] += de[std::size_t(r)] * double(e_[std::size_t(r)]);
      const double dl = dlam[std::size_t(r)] * double(lam_[std::size_t(r)]);
      dG_[std::size_t(n - 1)] += dl;
      dG_[std::size_t(r)] -= dl;
    }
    double sum = 0;
    for (Index r = n - 1; r >= 0; --r) {
      sum += dG_[std::size_t(r)];
      if (h_.dg != nullptr) h_.dg[t0 + r] = float(sum);
      if (h_.dbeta != nullptr) h_.dbeta[t0 + r] = float(dbeta[std::size_t(r)]);
    }
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < Dk; ++c) {
        h_.dq[(t0 + r) * Dk + c] += dQ[r * ldk + c];
        h_.dk[(t0 + r) * Dk + c] += dK[r * ldk + c];
      }
    (void)V;
  }

  // The delta rule's part: through V' = T Bv - T Bk S, T = (I + A)^-1 and A, Bv, Bk.
  void delta_backward(Index t0, Index n, std::vector<double>& de, std::vector<double>& dbeta) {
    const Index Dk = h_.key_dim, Dv = h_.value_dim, ldk = h_.ldk, ldv = h_.ldv, cp = cp_;
    const float* K = h_.k + t0 * ldk;
    const float* V = h_.v + t0 * ldv;
    float *dVp = at(dVp_), *dW = at(dW_), *T = at(T_), *dK = at(dK_);
    // dW = -dV' S^T (St_ holds S^T? no: it was reused; transpose again).
    transpose(at(S_), ldv, Dk, Dv, at(St_), ldk);
    gemm::gemm(n, ldk, Dv, {dVp, ldv, 1}, at(St_), ldk, dW, ldk, false);
    for (Index i = 0; i < n * ldk; ++i) dW[i] = -dW[i];
    gemm::gemm(n, ldv, n, {T, 1, cp}, dVp, ldv, at(dBv_), ldv, false);  // dBv = T^T dU
    gemm::gemm(n, ldk, n, {T, 1, cp}, dW, ldk, at(dBk_), ldk, false);   // dBk = T^T dW
    transpose(at(Bv_), ldv, n, Dv, at(Bvt_), cp);                       // dT = dU Bv^T + dW Bk^T
    transpose(at(Bk_), ldk, n, Dk, at(Bkt_), cp);
    gemm::gemm(n, cp, Dv, {dVp, ldv, 1}, at(Bvt_), cp, at(dT_), cp, false);
    gemm::gemm(n, cp, Dk, {dW, ldk, 1}, at(Bkt_), cp, at(dT_), cp, true);
    transpose(T, cp, n, n, at(Tt_), cp);  // dA = -T^T (dT T^T)
    gemm::gemm(n, cp, n, {at(dT_), cp, 1}, at(Tt_), cp, at(X_), cp, false);
    gemm::gemm(n, cp, n, {T, 1, cp}, at(X_), cp, at(dA_), cp, false);
    // A_rj = beta_r KK_rj Gamma_rj (j < r): dbeta, the Gamma gradient, D = beta dA . Gamma.
    float* D = at(dA_);
    for (Index r = 0; r < n; ++r) {
      const float beta = h_.beta[t0 + r];
      for (Index j = 0; j < cp; ++j) {
        const std::size_t i = std::size_t(r * cp + j);
        if (j >= r) {
          D[i] = 0.f;
          continue;
        }
        const double da = -double(D[i]);
        dbeta[std::size_t(r)] += da * double(kk_[i]) * double(gam_[i]);
        const double g = double(beta) * da * double(kk_[i]) * double(gam_[i]);
        dG_[std::size_t(r)] += g;
        dG_[std::size_t(j)] -= g;
        D[i] = float(double(beta) * da * double(gam_[i]));
      }
    }
    gemm::gemm(n, ldk, n, {D, cp, 1}, K, ldk, dK, ldk, true);  // dK += (D + D^T) K
    gemm::gemm(n, ldk, n, {D, 1, cp}, K, ldk, dK, ldk, true);
    // Bv = diag(beta) V, Bk = diag(beta e) K.
    for (Index r = 0; r < n; ++r) {
      const float beta = h_.beta[t0 + r], e = e_[std::size_t(r)];
      const float* dbv = at(dBv_) + r * ldv;
      const float* dbk = at(dBk_) + r * ldk;
      dbeta[std::size_t(r)] += double(simd::dot(V + r * ldv, dbv, Dv)) +
                               double(e) * double(simd::dot(K + r * ldk, dbk, Dk));
      de[std::size_t(r)] += double(beta) * double(simd::dot(K + r * ldk, dbk, Dk));
      for (Index c = 0; c < ldv; ++c) h_.dv[(t0 + r) * ldv + c] = beta * dbv[c];
      for (Index c = 0; c < ldk; ++c) dK[r * ldk + c] += beta * e * dbk[c];
    }
  }

  HeadRows h_{};
  Index cp_ = 0;
  std::vector<float> states_, S_, dS_next_, kk_, qk_, gam_, T_, M_, dM_, dT_, X_, dA_, Tt_;
  std::vector<float> Bv_, U_, Vp_, dVp_, dBv_, tmp_v_, Bk_, W_, dW_, dBk_, dQ_, dK_, tmp_k_;
  std::vector<float> Kt_, Bkt_, Vpt_, Bvt_, St_, dSt_, e_, lam_;
  std::vector<float> saved_kk_, saved_T_, saved_W_, saved_Vp_;  // per chunk, from run()'s pass
  std::vector<double> G_, dG_;
};

}  // namespace attnkit::detail
