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

#include "attnkit/gated/gated_saved.hpp"
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
    const Index chunks = sizes.chunks();
    for (Index c = 0; c < chunks; ++c) keep(own, c, c + 1 < chunks);
    for (Index c = chunks - 1; c >= 0; --c) backward(own, c, dS);
  }

 private:
  using Vec = simd::Vec;
  static float* at(std::vector<float>& x) { return x.data(); }

  // The chunk buffers, sized (and zeroed) once per worker: every value read is written first
  // for each chunk, and padding past the real rows and columns never enters a result (the dots
  // below run over the real lengths), so stale values from an earlier head are never read.
  void begin(const HeadRows& h) {
    h_ = h;
    cp_ = simd::round_up(h.chunk);
    const Index C = h_.chunk, ldk = h_.ldk, ldv = h_.ldv, Dk = h_.key_dim, cp = cp_;
    const Index dvp = simd::round_up(h_.value_dim);
    const auto size = [](std::vector<float>& x, Index n) {
      if (x.size() != std::size_t(n)) x.assign(std::size_t(n), 0.f);
    };
    for (auto* x : {&gam_, &dM_, &dT_, &X_, &dA_, &Tt_}) size(*x, C * cp);
    for (auto* x : {&Bv_, &U_, &Vp_, &dVp_, &dBv_, &tmp_v_}) size(*x, C * ldv);
    for (auto* x : {&Bk_, &dBk_, &dK_, &tmp_k_}) size(*x, C * ldk);
    for (auto* x : {&Y_, &Z_, &QWs_}) size(*x, 2 * C * std::max(ldk, ldv));
    for (auto* x : {&Kt_, &Bkt_}) size(*x, ldk * cp);
    for (auto* x : {&Vpt_, &Bvt_}) size(*x, dvp * cp);
    for (auto* x : {&St_, &dSt_}) size(*x, std::max(dvp * ldk, Dk * ldv));
    size(S_, Dk * ldv);
    e_.resize(std::size_t(C));
    lam_.resize(std::size_t(C));
    for (auto* x : {&G_, &dG_, &de_, &dlam_, &dbeta_}) x->resize(std::size_t(C));
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

  // Chunk c's decay factors from the log gates: G (double sums), e_r = exp(G_r), lambda_r =
  // exp(G_last - G_r), Gamma_rj = exp(G_r - G_j) (j <= r, zero past; the SIMD exp2 of the
  // difference times log2(e) rounded to f32 once). Returns its rows.
  Index factors(Index c, Index& t0) {
    t0 = c * h_.chunk;
    const Index n = std::min(h_.chunk, h_.len - t0), cp = cp_;
    constexpr double kLog2e = 1.4426950408889634;
    double G = 0;
    for (Index r = 0; r < n; ++r) G_[std::size_t(r)] = G += double(h_.gate[t0 + r]);
    for (Index r = 0; r < n; ++r) {
      e_[std::size_t(r)] = float(std::exp(G_[std::size_t(r)]));
      lam_[std::size_t(r)] = float(std::exp(G_[std::size_t(n - 1)] - G_[std::size_t(r)]));
      float* row = at(gam_) + r * cp;
      const Index whole = simd::round_up(r + 1);
      for (Index j = 0; j <= r; ++j)
        row[j] = float((G_[std::size_t(r)] - G_[std::size_t(j)]) * kLog2e);
      std::fill(row + r + 1, row + cp, -1000.f);  // exp2: 0
      for (Index j = 0; j < whole; j += simd::kWidth)
        simd::store(row + j, simd::exp2(simd::load(row + j)));
      std::fill(row + whole, row + cp, 0.f);
    }
    return n;
  }

  // run()'s own pass, chunk c (gated_heads.hpp's chunk()): P, and for the delta rule K K^T .
  // Gamma, T, W and V' into `own`; with `advance` the state after it into own.state(c + 1).
  void keep(const SavedHead& own, Index c, bool advance) {
    Index t0 = 0;
    const Index n = factors(c, t0);
    const Index Dk = h_.key_dim, ldk = h_.ldk, ldv = h_.ldv, cp = cp_;
    const float* K = h_.k + t0 * ldk;
    const float* Q = h_.q + t0 * ldk;
    const float* S = own.state(c);
    std::fill(Kt_.begin(), Kt_.end(), 0.f);
    transpose(K, ldk, n, Dk, at(Kt_), cp);
    float* P = own.P + t0 * cp;  // lower(Q K^T . Gamma)
    gemm::gemm(n, cp, Dk, {Q, ldk, 1}, at(Kt_), cp, P, cp, false);
    for (Index i = 0; i < n * cp; ++i) P[i] *= gam_[std::size_t(i)];
    const float* Vp = h_.v + t0 * ldv;
    if (h_.delta) {
      float* kkg = own.kkg + t0 * cp;  // strictly-lower(K K^T . Gamma)
      gemm::gemm(n, cp, Dk, {K, ldk, 1}, at(Kt_), cp, kkg, cp, false);
      for (Index r = 0; r < n; ++r)
        for (Index j = 0; j < cp; ++j)
          kkg[r * cp + j] *= j < r ? gam_[std::size_t(r * cp + j)] : 0.f;
      float* T = own.T + t0 * cp;  // T = (I + A)^-1, A = diag(beta) KKG
      for (Index r = 0; r < n; ++r) {
        float* row = T + r * cp;
        std::fill(row, row + cp, 0.f);
        row[r] = 1.f;
        const float beta = h_.beta[t0 + r];
        for (Index j = 0; j < r; ++j) {  // T's row j is zero past j: whole vectors up to it
          const Vec a(-beta * kkg[r * cp + j]);
          for (Index i = 0; i <= j; i += simd::kWidth)
            simd::store(row + i, simd::fma(simd::load(T + j * cp + i), a, simd::load(row + i)));
        }
      }
      scaled_inputs(t0, n);
      float* W = own.W + t0 * ldk;
      float* Vk = own.Vp + t0 * ldv;
      gemm::gemm(n, ldv, n, {T, cp, 1}, at(Bv_), ldv, at(U_), ldv, false, kLower);
      gemm::gemm(n, ldk, n, {T, cp, 1}, at(Bk_), ldk, W, ldk, false, kLower);
      gemm::gemm(n, ldv, Dk, {W, ldk, 1}, S, ldv, Vk, ldv, false);  // W S
      for (Index i = 0; i < n * ldv; ++i) Vk[i] = U_[std::size_t(i)] - Vk[i];
      Vp = Vk;
    }
    if (!advance) return;  // S_next = e_last S + K^T diag(lambda) V'
    float* next = own.state(c + 1);
    const float el = e_[std::size_t(n - 1)];
    for (Index i = 0; i < Dk * ldv; ++i) next[i] = el * S[i];
    for (Index r = 0; r < n; ++r)
      for (Index i = 0; i < ldv; ++i)
        tmp_v_[std::size_t(r * ldv + i)] = lam_[std::size_t(r)] * Vp[r * ldv + i];
    gemm::gemm(Dk, ldv, n, {K, 1, ldk}, at(tmp_v_), ldv, next, ldv, true);
  }

  // Bv = diag(beta) V, Bk = diag(beta e) K of the chunk's rows.
  void scaled_inputs(Index t0, Index n) {
    const Index ldk = h_.ldk, ldv = h_.ldv;
    for (Index r = 0; r < n; ++r) {
      const float beta = h_.beta[t0 + r], be = beta * e_[std::size_t(r)];
      const float* V = h_.v + (t0 + r) * ldv;
      const float* K = h_.k + (t0 + r) * ldk;
      for (Index i = 0; i < ldv; ++i) Bv_[std::size_t(r * ldv + i)] = beta * V[i];
      for (Index i = 0; i < ldk; ++i) Bk_[std::size_t(r * ldk + i)] = be * K[i];
    }
  }

  // x's rows [rows, ld_from] into to [rows, ldv], each Dv wide and zero-padded; returns to.
  float* copy_rows(const float* x, Index ld_from, Index rows, float* to) const {
    const Index Dv = h_.value_dim, ld = h_.ldv;
    for (Index r = 0; r < rows; ++r)
      std::fill(std::copy_n(x + r * ld_from, Dv, to + r * ld), to + (r + 1) * ld, 0.f);
    return to;
  }

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

  static void scale_row(float* x, Index n, float f) {  // n a whole number of vectors
    const Vec v(f);
    for (Index i = 0; i < n; i += simd::kWidth) simd::store(x + i, simd::load(x + i) * v);
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

  HeadRows h_{};
  Index cp_ = 0;
  std::vector<float> own_;  // run()'s own pass: the head's kept chunks (gated_saved.hpp)
  std::vector<float> S_, gam_, dM_, dT_, X_, dA_, Tt_;
  std::vector<float> Bv_, U_, Vp_, dVp_, dBv_, tmp_v_, Bk_, dBk_, dK_, tmp_k_;
  std::vector<float> Y_, Z_, QWs_, colsum_;  // [dO; dV'], [dO S^T; dV' S^T], [diag(e) Q; -W]
  std::vector<float> Kt_, Bkt_, Vpt_, Bvt_, St_, dSt_, e_, lam_;
  std::vector<double> G_, dG_, de_, dlam_, dbeta_;  // per row of the chunk
};

}  // namespace attnkit::detail
