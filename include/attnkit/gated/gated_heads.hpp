// GatedHeads: one (batch, value head) of gated attention, in either form.
//
// Recurrent (decode): per token and block of columns of the state S [Dk, Dv] two passes: the
// first reads u = S'^T k and w = S'^T q (S' = Diag(a) S, never formed), the second writes
// S = S' + k d^T with d = beta (v - u) (Delta) or v (Additive); o = w + (q . k) d.
//
// Chunked (prefill, training): per chunk of n rows, with G the gates' cumulative sums inside
// the chunk (double) and Gamma_rj = exp(G_r - G_j) (per channel for PerChannel):
//   A = strictly-lower(diag(beta) (K K^T . Gamma))             [n, n]          (Delta)
//   U = (I + A)^-1 diag(beta) V,  W = (I + A)^-1 diag(beta) (K . exp(G))  (forward substitution)
//   V' = U - W S                     (Additive: V' = V)
//   O = (Q . exp(G)) S + lower(Q K^T . Gamma) V'
//   S = Diag(exp(G_last)) S + (K . exp(G_last - G))^T V'
// the WY / UT form of Yang et al. (2024) and transformers' torch_chunk_gated_delta_rule, on
// the tile GEMMs. Scalar gates form Gamma as a mask on the products; per-channel gates scale
// the rows by exp(G_r - G_m) and exp(G_m - G_j) around the chunk's middle row m, with the chunk
// halved until no factor passes exp(+-80) (f32 holds exp(+-87)).
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/gated/gated_rows.hpp"
#include "attnkit/gated/gated_saved.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/simd/stream.hpp"

namespace attnkit::detail {

template <class Q, class K, class V, class O>
class GatedHeads : public GatedRows<Q, K, V, O> {
  using Base = GatedRows<Q, K, V, O>;

 public:
  /// With `saved`: each item keeps its head's part of it (gated_saved.hpp), which the caller
  /// sized for this call (scalar gates: the spec's chunked form).
  GatedHeads(const GatedSpec& spec, const GatedShape& s, float scale, const View<Q>& q,
             const View<K>& k, const View<V>& v, const GateInputs& gates, const View<O>& o,
             const View<float>* state, GatedSaved* saved)
      : Base(spec, s, scale, q, k, v, gates, o, state), saved_(saved) {}

  void run(Index b, Index h) {
    Index ld = 0;
    float* S = this->load_state(b, h, ld);
    keep_ = saved_ != nullptr ? SavedAccess::head(*saved_, b, h) : SavedHead{};
    // The starting state is kept here without products (or without chunks), else by chunk().
    if (keep_.states != nullptr && (keep_.P == nullptr || this->s_.len == 0)) keep_state(S, ld, 0);
    const Index kh = this->s_.k_head(h);
    for (Index t0 = 0; t0 < this->s_.len;) {
      Index n = std::min(this->c_, this->s_.len - t0);
      this->load_rows(b, kh, h, t0, n);
      n = safe_rows(n);
      if (n == 1 && keep_.P == nullptr)  // kept chunks have their products, even of one row
        step(S, ld);
      else
        chunk(S, ld, n, t0 / this->c_);
      this->write_rows(b, h, t0, n);
      t0 += n;
    }
    this->store_state(b, h, S);
    if (keep_.states != nullptr) simd::stream_fence();
  }

 private:
  bool per_channel() const { return this->spec_.gate == GateShape::PerChannel; }
  Index gate_width() const { return per_channel() ? this->s_.key_dim : 1; }

  // Cumulative log gates of the first n loaded rows, G_[r * width + c], in double.
  void cumulate(Index n) {
    const Index w = gate_width();
    cum_.assign(std::size_t(n * w), 0.0);
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < w; ++c)
        cum_[std::size_t(r * w + c)] = (r > 0 ? cum_[std::size_t((r - 1) * w + c)] : 0.0) +
                                       double(this->gate_[std::size_t(r * w + c)]);
  }

  // The rows of a chunk whose per-channel factors stay within exp(+-80): n, halved while a
  // channel's gates fall by more than 80 over the chunk (the rows are loaded; fewer are used;
  // one row is the recurrent step, which forms no factor).
  Index safe_rows(Index n) {
    if (!per_channel()) return n;
    for (;; n = (n + 1) / 2) {
      cumulate(n);
      double range = 0;
      const Index w = gate_width();
      for (Index c = 0; c < w; ++c)
        range = std::max(range, cum_[std::size_t(c)] - cum_[std::size_t((n - 1) * w + c)]);
      if (range <= 80.0 || n == 1) return n;
    }
  }

  // One token (the loaded row 0): the recurrent step. Every column e of the update reads
  // only column e of S (u_e, w_e, d_e, o_e), so S goes by blocks of columns: the first pass
  // over a block's rows reads them, the second writes them while they are still in L1, and
  // S crosses the memory hierarchy once per token.
  void step(float* S, Index ld) {
    const Index Dk = this->s_.key_dim, ldv = this->ldv_;
    const float* q = this->qc_;
    const float* k = this->kc_;
    const float a_token = std::exp(this->gate_[0]);
    factors_.resize(std::size_t(3 * Dk));
    float* ak = factors_.data();  // a_c k_c, a_c q_c and a_c
    float* aq = ak + Dk;
    float* a = aq + Dk;
    float qk = 0;
    for (Index c = 0; c < Dk; ++c) {
      a[c] = per_channel() ? std::exp(this->gate_[std::size_t(c)]) : a_token;
      ak[c] = a[c] * k[c];
      aq[c] = a[c] * q[c];
      qk += q[c] * k[c];
    }
    // Blocks of 8 vectors (a whole 128-float row on AVX-512): at H 16, Dk = Dv = 128 (Intel
    // Xeon, one thread) 44 us a step against 60 with blocks of 4 or 2 vectors, whose rows
    // are read 512 bytes apart.
    Index e = 0;
    for (; e + 8 * simd::kWidth <= ldv; e += 8 * simd::kWidth) step_columns<8>(S + e, ld, e, qk);
    for (; e + 4 * simd::kWidth <= ldv; e += 4 * simd::kWidth) step_columns<4>(S + e, ld, e, qk);
    for (; e < ldv; e += simd::kWidth) step_columns<1>(S + e, ld, e, qk);
  }

  // The step on NV vectors of columns from e: S points at column e of row 0.
  template <int NV>
  void step_columns(float* S, Index ld, Index e, float qk) {
    using simd::Vec;
    const Index Dk = this->s_.key_dim, W = simd::kWidth;
    const float *ak = factors_.data(), *aq = ak + Dk, *a = aq + Dk, *k = this->kc_;
    Vec u[std::size_t{NV}], w[std::size_t{NV}], d[std::size_t{NV}];  // unsigned bounds
    for (int i = 0; i < NV; ++i) u[i] = w[i] = Vec(0.f);
    for (Index c = 0; c < Dk; ++c) {
      const float* row = S + c * ld;
      for (int i = 0; i < NV; ++i) {
        const Vec x = simd::load(row + i * W);
        u[i] = simd::fma(x, Vec(ak[c]), u[i]);
        w[i] = simd::fma(x, Vec(aq[c]), w[i]);
      }
    }
    const Vec beta(this->beta_[0]);
    for (int i = 0; i < NV; ++i) {
      const Vec v = simd::load(this->vc_ + e + i * W);
      d[i] = this->spec_.delta() ? beta * (v - u[i]) : v;
      simd::store(this->oc_ + e + i * W, simd::fma(d[i], Vec(qk), w[i]));  // o = w + (q.k) d
    }
    for (Index c = 0; c < Dk; ++c) {
      float* row = S + c * ld;
      for (int i = 0; i < NV; ++i)
        simd::store(row + i * W, simd::fma(d[i], Vec(k[c]), simd::load(row + i * W) * Vec(a[c])));
    }
  }

  // exp(G_r - G_j) for channel c (0 for scalar gates).
  double gap(Index r, Index j, Index c) const {
    const Index w = gate_width();
    return cum_[std::size_t(r * w + c)] - cum_[std::size_t(j * w + c)];
  }
  double total(Index r, Index c) const { return cum_[std::size_t(r * gate_width() + c)]; }

  // The decay factors of a chunk of n rows, each exp of a difference of the double sums G:
  // scalar gates er_[r] = exp(G_r), el_[j] = exp(G_last - G_j) and gamma_[r, j] = exp(G_r -
  // G_j) for j <= r (double exp, n^2 / 2 + 2 n of them); per-channel gates, per row and
  // channel, fr_ = exp(G_r - G_m), fj_ = exp(G_m - G_j), er_ and el_ (4 n Dk of them, by the
  // SIMD exp2 of the difference times log2(e) rounded to f32 once).
  void factors(Index n, Index m) {
    const Index Dk = this->s_.key_dim, ldk = this->ldk_, cp = this->cp_;
    if (!per_channel()) {
      er_.resize(std::size_t(n));
      el_.resize(std::size_t(n));
      gamma_.resize(std::size_t(n * cp));
      for (Index r = 0; r < n; ++r) {
        er_[std::size_t(r)] = float(std::exp(total(r, 0)));
        el_[std::size_t(r)] = float(std::exp(gap(n - 1, r, 0)));
        for (Index j = 0; j <= r; ++j)
          gamma_[std::size_t(r * cp + j)] = float(std::exp(gap(r, j, 0)));
      }
      return;
    }
    for (auto* f : {&fr_, &fj_, &er_, &el_}) f->assign(std::size_t(n * ldk), 0.f);
    constexpr double kLog2e = 1.4426950408889634;
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < Dk; ++c) {
        const std::size_t i = std::size_t(r * ldk + c);
        fr_[i] = float(gap(r, m, c) * kLog2e);
        fj_[i] = float(gap(m, r, c) * kLog2e);
        er_[i] = float(total(r, c) * kLog2e);
        el_[i] = float(gap(n - 1, r, c) * kLog2e);
      }
    for (auto* f : {&fr_, &fj_, &er_, &el_})
      for (std::size_t i = 0; i < f->size(); i += simd::kWidth)
        simd::store(f->data() + i, simd::exp2(simd::load(f->data() + i)));
  }
  // The factor of row r, channel c in a per-row array (f32 per channel, or one per row).
  float at(const std::vector<float>& f, Index r, Index c) const {
    return per_channel() ? f[std::size_t(r * this->ldk_ + c)] : f[std::size_t(r)];
  }

  // Chunk number `number` of n rows; kept (saved_) with its starting state and products.
  void chunk(float* S, Index ld, Index n, Index number) {
    if (keep_.P != nullptr) keep_state(S, ld, number);
    if (!per_channel()) cumulate(n);
    const Index Dk = this->s_.key_dim, ldk = this->ldk_, ldv = this->ldv_, cp = this->cp_;
    float *q = this->qc_, *k = this->kc_, *kt = this->kt_, *v = this->vc_;
    const Index m = per_channel() ? n / 2 : 0;
    factors(n, m);
    // kt = K^T [Dk, cp] (per channel: columns scaled by exp(G_m - G_j)); qs, ks: Q and K
    // scaled by exp(G_r - G_m) per channel.
    float* kj = this->kj_;  // K (per channel: times exp(G_m - G_j)), rows n .. cp zero
    if (per_channel())
      scaled(k, fj_, kj, n);
    else
      std::copy_n(k, n * ldk, kj);
    std::fill(kj + n * ldk, kj + cp * ldk, 0.f);
    for (Index j = 0; j < cp; j += simd::kWidth)  // kt = kj^T, whole SIMD blocks
      for (Index c = 0; c < ldk; c += simd::kWidth)
        simd::transpose_block(kj + j * ldk + c, ldk, kt + c * cp + j, cp);
    const float* qs = per_channel() ? scaled(q, fr_, this->qs_, n) : q;
    const float* ks = per_channel() ? scaled(k, fr_, this->wc_, n) : k;  // W's place, read first
    // P = lower(Q K^T . Gamma) [n, cp].
    float* P = this->pc_;
    gemm::gemm(n, cp, Dk, {qs, ldk, 1}, kt, cp, P, cp, false);
    mask(P, n, true);
    keep(keep_.P, number, P, n, cp);
    if (this->spec_.delta()) {
      float* A = this->ac_;  // strictly-lower(diag(beta) (K K^T . Gamma))
      gemm::gemm(n, cp, Dk, {ks, ldk, 1}, kt, cp, A, cp, false);
      mask(A, n, false);
      keep(keep_.kkg, number, A, n, cp);
      for (Index r = 0; r < n; ++r)
        for (Index j = 0; j < r; ++j) A[r * cp + j] *= this->beta_[std::size_t(r)];
      // W rows: beta_r K_r . exp(G_r) (overwrites ks, read no more); U rows: beta_r V_r.
      float* W = this->wc_;
      std::copy_n(k, n * ldk, W);
      scale_rows(W, n, er_);
      for (Index r = 0; r < n; ++r) {
        Base::scale_row(W + r * ldk, ldk, this->beta_[std::size_t(r)]);
        Base::scale_row(v + r * ldv, ldv, this->beta_[std::size_t(r)]);
      }
      // T = (I + A)^-1 (unit lower triangular) by forward substitution on its rows, then
      // U = T diag(beta) V and W = T diag(beta) (K . exp(G)) as GEMMs.
      float* T = this->tc_;
      for (Index r = 0; r < n; ++r) {
        float* row = T + r * cp;
        std::fill(row, row + cp, 0.f);
        row[r] = 1.f;
        for (Index j = 0; j < r; ++j)
          Base::axpy(row, T + j * cp, simd::round_up(j + 1), -A[r * cp + j]);
      }
      keep(keep_.T, number, T, n, cp);
      float* U = this->tmp_;
      gemm::gemm(n, ldv, n, {T, cp, 1}, v, ldv, U, ldv, false);
      float* Wt = this->qs_;  // free once P is formed
      gemm::gemm(n, ldk, n, {T, cp, 1}, W, ldk, Wt, ldk, false);
      keep(keep_.W, number, Wt, n, ldk);
      float* WS = this->oc_;  // V' = U - W S, into v (read no more); oc_ is free until O
      gemm::gemm(n, ldv, Dk, {Wt, ldk, 1}, S, ld, WS, ldv, false);
      for (Index i = 0; i < n * ldv; ++i) v[i] = U[i] - WS[i];
      keep(keep_.Vp, number, v, n, ldv);
    }
    // O = (Q . exp(G)) S + P V'. Q's rows scaled in place (read no more).
    float* Ob = this->oc_;
    scale_rows(q, n, er_);
    gemm::gemm(n, ldv, Dk, {q, ldk, 1}, S, ld, Ob, ldv, false);
    gemm::gemm(n, ldv, n, {P, cp, 1}, v, ldv, Ob, ldv, true);
    // S = Diag(exp(G_last)) S + (K . exp(G_last - G))^T V'.
    for (Index c = 0; c < Dk; ++c) {
      const float a = at(er_, n - 1, c);
      if (a != 1.f) Base::scale_row(S + c * ld, ldv, a);
    }
    scale_rows(k, n, el_);
    gemm::gemm(Dk, ldv, n, {k, 1, ldk}, v, ldv, S, ld, true);
  }

  // The kept state before chunk c: S's Dk rows of Dv (ld apart), zero-padded to ldv.
  void keep_state(const float* S, Index ld, Index c) const {
    float* to = keep_.state(c);
    if (ld == keep_.ldv) {  // whole padded rows (own_state_'s, or the caller's, Dv = ldv)
      simd::stream_copy(S, keep_.key_dim * ld, to);
      return;
    }
    for (Index r = 0; r < keep_.key_dim; ++r)
      std::fill(std::copy_n(S + r * ld, this->s_.value_dim, to + r * keep_.ldv),
                to + (r + 1) * keep_.ldv, 0.f);
  }
  // Chunk c's n rows of ld floats of a kept product (`to`: its row 0; null: not kept).
  void keep(float* to, Index c, const float* x, Index n, Index ld) const {
    if (to != nullptr) simd::stream_copy(x, n * ld, to + c * this->c_ * ld);
  }

  // x[r, c] *= f[r, c] (per channel) or f[r] (scalar gates), n rows of ldk.
  void scale_rows(float* x, Index n, const std::vector<float>& f) const {
    if (per_channel())
      for (Index i = 0; i < n * this->ldk_; ++i) x[i] *= f[std::size_t(i)];
    else
      for (Index r = 0; r < n; ++r)
        Base::scale_row(x + r * this->ldk_, this->ldk_, f[std::size_t(r)]);
  }

  // dst = x . f per row and channel (fr_ or fj_), n rows of ldk.
  float* scaled(const float* x, const std::vector<float>& f, float* dst, Index n) const {
    for (Index i = 0; i < n * this->ldk_; ++i) dst[i] = x[i] * f[std::size_t(i)];
    return dst;
  }

  // Rows of X [n, cp]: scalar gates multiply (r, j) by exp(G_r - G_j); entries above the
  // diagonal (and on it unless `diagonal`) and the padding become 0.
  void mask(float* X, Index n, bool diagonal) const {
    const Index cp = this->cp_;
    for (Index r = 0; r < n; ++r) {
      float* row = X + r * cp;
      const Index last = diagonal ? r + 1 : r;
      if (!per_channel() && this->spec_.gate != GateShape::None)
        for (Index j = 0; j < last; ++j) row[j] *= gamma_[std::size_t(r * cp + j)];
      std::fill(row + last, row + cp, 0.f);
    }
  }

  GatedSaved* saved_;
  SavedHead keep_;                                // the item's part of saved_ (or none)
  std::vector<float> er_, el_, gamma_, fr_, fj_;  // the chunk's decay factors (factors())
  std::vector<double> cum_;
  std::vector<float> factors_;  // the step's a k, a q and a per key channel
};

}  // namespace attnkit::detail
