// The backward of one value head with per-channel gates: the recurrence token by token, one
// block of the state's columns at a time. Every column e of the recurrence and of its
// gradient reads only column e of S and dS (u_e, d_e, dd_e, du_e); only the row sums (dq,
// dk, dg) gather over columns, and they add up over blocks. So the head runs one block of
// columns at a time: forward, keeping the block's state at every chunk boundary, then the
// chunks backward, each rebuilding its states from its boundary, with the states (Dk x kBlock
// floats each) in L1 and L2 instead of whole [Dk, Dv] states streamed per token
// (reference_backward.hpp has the per-token formulas).
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/gated/gated_backward_chunks.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

class ColumnBackward {
 public:
  static constexpr Index kBlock = 2 * simd::kWidth;

  /// The head of `h` (h.ldv a whole number of blocks, h.dbeta null for an additive update):
  /// decay [L, Dk] = exp(g); dg [L, Dk] and ddo [L] (d . do, whose k part the caller adds
  /// to dq) are added to; S0 [Dk, ldv] the starting state; dS [Dk, ldv] the gradient of the
  /// final state (in) and of the starting one (out).
  void run(const HeadRows& h, const float* decay, float* dg, float* ddo, const float* S0,
           float* dS) {
    h_ = h;
    decay_ = decay;
    dg_ = dg;
    ddo_ = ddo;
    S0_ = S0;
    dS_out_ = dS;
    const Index area = h.key_dim * kBlock;
    bounds_.resize(std::size_t((h.len / h.chunk + 2) * area));
    states_.resize(std::size_t(h.chunk * area));
    dS_.resize(std::size_t(area));
    for (Index e0 = 0; e0 < h.ldv; e0 += kBlock) columns(e0);
  }

 private:
  // Columns [e0, e0 + kBlock) of head (b, h): forward with the state at every chunk boundary,
  // then the chunks backward, each rebuilding its states from its boundary.
  void columns(Index e0) {
    const Index L = h_.len, Dk = h_.key_dim, area = Dk * kBlock;
    const Index width = std::min(kBlock, h_.value_dim - e0);  // real columns of the block
    float* S = bounds_.data();
    std::fill(S, S + area, 0.f);
    for (Index c = 0; c < Dk; ++c) std::copy_n(S0_ + c * h_.ldv + e0, width, S + c * kBlock);
    for (Index t = 0; t < L; ++t) {  // slot c + 1 runs through chunk c from slot c
      float* next = bounds_.data() + (t / h_.chunk + 1) * area;
      if (t % h_.chunk == 0) std::copy_n(next - area, area, next);
      forward_token(next, next, t, e0);
    }
    float* dS = dS_.data();
    std::fill(dS, dS + area, 0.f);
    for (Index c = 0; c < Dk; ++c) std::copy_n(dS_out_ + c * h_.ldv + e0, width, dS + c * kBlock);
    for (Index c0 = (L - 1) / h_.chunk * h_.chunk; c0 >= 0 && L > 0; c0 -= h_.chunk) {
      const Index n = std::min(h_.chunk, L - c0);
      std::copy_n(bounds_.data() + (c0 / h_.chunk) * area, area, states_.data());
      for (Index j = 0; j + 1 < n; ++j)
        forward_token(states_.data() + j * area, states_.data() + (j + 1) * area, c0 + j, e0);
      for (Index j = n - 1; j >= 0; --j)
        backward_token(c0 + j, e0, width, states_.data() + j * area);
    }
    for (Index c = 0; c < Dk; ++c) std::copy_n(dS + c * kBlock, width, dS_out_ + c * h_.ldv + e0);
  }

  // dst = src' + k d^T on the block's columns for token t (Dk rows of kBlock; dst may be src).
  void forward_token(const float* src, float* dst, Index t, Index e0) {
    using simd::Vec;
    constexpr int NV = int(kBlock / simd::kWidth);
    const Index Dk = h_.key_dim, W = simd::kWidth;
    const float* k = h_.k + t * h_.ldk;
    const float* a = decay_ + t * Dk;
    Vec u[std::size_t{NV}], d[std::size_t{NV}];  // array bounds are unsigned
    for (int i = 0; i < NV; ++i) u[i] = Vec(0.f);
    if (h_.delta)
      for (Index c = 0; c < Dk; ++c)
        for (int i = 0; i < NV; ++i)
          u[i] = simd::fma(simd::load(src + c * kBlock + i * W), Vec(a[c] * k[c]), u[i]);
    const Vec beta(h_.beta[t]);
    for (int i = 0; i < NV; ++i) {
      const Vec v = simd::load(h_.v + t * h_.ldv + e0 + i * W);
      d[i] = h_.delta ? beta * (v - u[i]) : v;
    }
    for (Index c = 0; c < Dk; ++c)
      for (int i = 0; i < NV; ++i)
        simd::store(dst + c * kBlock + i * W,
                    simd::fma(d[i], Vec(k[c]), simd::load(src + c * kBlock + i * W) * Vec(a[c])));
  }

  // Row sums of a pass, kWidth rows at a time: part(c) is row c's vector of partial sums;
  // out[c] += scale[c] * (the sum of its lanes), the lanes of kWidth rows summed by one
  // transpose_add (a horizontal sum per row cost more than the pass's FMAs).
  template <class Part>
  static void row_sums(Index rows, const float* scale, float* out, Part part) {
    using simd::Vec;
    const Index W = simd::kWidth;
    Vec parts[std::size_t{simd::kWidth}];
    Index c = 0;
    for (; c + W <= rows; c += W) {
      for (Index r = 0; r < W; ++r) parts[r] = part(c + r);
      const Vec sums = simd::transpose_add(parts);
      const Vec f = scale != nullptr ? simd::load(scale + c) : Vec(1.f);
      simd::store(out + c, simd::fma(sums, f, simd::load(out + c)));
    }
    for (; c < rows; ++c) out[c] += (scale != nullptr ? scale[c] : 1.f) * simd::reduce_add(part(c));
  }

  // Token t on the block's columns, `before` the state before it (reference_backward.hpp).
  void backward_token(Index t, Index e0, Index width, const float* before) {
    using simd::Vec;
    constexpr int NV = int(kBlock / simd::kWidth);
    const Index Dk = h_.key_dim, W = simd::kWidth, ldk = h_.ldk, ldv = h_.ldv;
    const float* q = h_.q + t * ldk;
    const float* k = h_.k + t * ldk;
    const float* a = decay_ + t * Dk;
    const float* vrow = h_.v + t * ldv + e0;
    const float* dorow = h_.d_o + t * ldv + e0;
    const bool delta = h_.delta;
    const Vec beta(h_.beta[t]);
    Vec u[std::size_t{NV}], d[std::size_t{NV}], dd[std::size_t{NV}], du[std::size_t{NV}],
        dov[std::size_t{NV}];
    for (int i = 0; i < NV; ++i) {
      u[i] = dd[i] = Vec(0.f);
      dov[i] = simd::load(dorow + i * W);
    }
    // Pass 1: u = S'^T k; dq += S' do (its k (d . do) part is added once per token, later).
    row_sums(Dk, a, h_.dq + t * Dk, [&](Index c) {
      Vec part(0.f);
      for (int i = 0; i < NV; ++i) {
        const Vec x = simd::load(before + c * kBlock + i * W);
        if (delta) u[i] = simd::fma(x, Vec(a[c] * k[c]), u[i]);
        part = simd::fma(x, dov[i], part);
      }
      return part;
    });
    Vec d_do(0.f), db(0.f);
    for (int i = 0; i < NV; ++i) {
      d[i] = beta * (simd::load(vrow + i * W) - u[i]);  // u = 0: Additive (beta 1)
      d_do = simd::fma(d[i], dov[i], d_do);
    }
    ddo_[t] += simd::reduce_add(d_do);
    // Pass 2: dS += q do^T; dk = dS d; dd = dS^T k.
    float* dS = dS_.data();
    row_sums(Dk, nullptr, h_.dk + t * Dk, [&](Index c) {
      Vec part(0.f);
      for (int i = 0; i < NV; ++i) {
        float* x = dS + c * kBlock + i * W;
        const Vec g = simd::fma(Vec(q[c]), dov[i], simd::load(x));
        simd::store(x, g);
        part = simd::fma(g, d[i], part);
        dd[i] = simd::fma(g, Vec(k[c]), dd[i]);
      }
      return part;
    });
    alignas(64) float dv_block[kBlock];
    for (int i = 0; i < NV; ++i) {
      simd::store(dv_block + i * W, beta * dd[i]);
      du[i] = delta ? Vec(0.f) - beta * dd[i] : Vec(0.f);
      db = simd::fma(dd[i], simd::load(vrow + i * W) - u[i], db);
    }
    std::copy_n(dv_block, width, h_.dv + t * h_.ldv + e0);
    if (delta) h_.dbeta[t] += simd::reduce_add(db);
    // Pass 3: dS' = dS + k du^T; dk += S' du; dg += dS' . S'; dS = Diag(a) dS'.
    Vec sp_du[std::size_t{simd::kWidth}];  // row c's S' du partials, summed after the dg pass
    float* dk_row = h_.dk + t * Dk;
    row_sums(Dk, a, dg_ + t * Dk, [&](Index c) {
      Vec part_k(0.f), part_g(0.f);
      for (int i = 0; i < NV; ++i) {
        float* x = dS + c * kBlock + i * W;
        const Vec sp = simd::load(before + c * kBlock + i * W);
        const Vec g = delta ? simd::fma(Vec(k[c]), du[i], simd::load(x)) : simd::load(x);
        if (delta) part_k = simd::fma(sp, du[i], part_k);
        part_g = simd::fma(g, sp, part_g);
        simd::store(x, g * Vec(a[c]));
      }
      sp_du[c % W] = part_k;
      if (c % W == W - 1 || c == Dk - 1) {  // the dk sums of this group of rows
        const Index first = c - c % W;
        for (Index r = first; r <= c; ++r) dk_row[r] += a[r] * simd::reduce_add(sp_du[r % W]);
      }
      return part_g;
    });
  }

  HeadRows h_{};
  const float *decay_ = nullptr, *S0_ = nullptr;
  float *dg_ = nullptr, *ddo_ = nullptr, *dS_out_ = nullptr;
  std::vector<float> bounds_, states_, dS_;
};

}  // namespace attnkit::detail
