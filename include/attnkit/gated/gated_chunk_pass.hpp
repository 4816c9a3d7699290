// ChunkPass: what the chunked backward of scalar gates shares with its own walk over the chunks
// (gated_backward_chunks.hpp): one value head's rows (HeadRows), the chunk buffers, the decay
// factors of a chunk from the log gates (G, e, lambda, Gamma), and keep(): the forward's
// products of a chunk (P, K K^T . Gamma, T, W, V') and the state after it, into the layout a
// GatedSaved keeps (gated_saved.hpp), for a backward called without one.
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

class ChunkPass {
 protected:
  static constexpr auto kLower = gemm::Triangle::Lower;  // T as GEMM A
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

  static void scale_row(float* x, Index n, float f) {  // n a whole number of vectors
    const Vec v(f);
    for (Index i = 0; i < n; i += simd::kWidth) simd::store(x + i, simd::load(x + i) * v);
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
