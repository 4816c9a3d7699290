// LinearBackwardRows: the chunk rows linear_attention_backward()'s engine reads, in f32 and
// in the layouts its tile GEMMs take (features padded to SIMD vectors, K and V also
// transposed), with the per-head decay powers; the base of LinearBackwardHeads, which owns
// the rest of the same Scratch.
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/scratch.hpp"
#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_spec.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

template <class Map, class Q, class K, class V, class GO>
class LinearBackwardRows {
 protected:
  // `extra` floats of the scratch follow this class's buffers, for the derived class.
  LinearBackwardRows(const LinearSpec<Map>& spec, const Problem& p, float scale, const View<Q>& q,
                     const View<K>& k, const View<V>& v, const View<GO>& d_o, Index extra)
      : spec_(spec),
        p_(p),
        scale_(scale),
        q_(q),
        k_(k),
        v_(v),
        d_o_(d_o),
        d_(p.head_dim),
        dvd_(p.value_dim),
        f_(feature_count(spec.map, p.head_dim)),
        fp_(simd::round_up(f_)),
        ld_(simd::round_up(p.value_dim)),
        c_(spec.chunk),
        cp_(simd::round_up(c_)),
        scratch_(Scratch::size_for(c_ * d_, c_ * d_, c_ * fp_, c_ * fp_, f_ * cp_, c_ * ld_,
                                   dvd_ * cp_, c_ * ld_, p.q_len, c_ + 1, extra)) {
    qa_ = scratch_.carve(c_ * d_);     // [C, D]   s q rows (f32)
    ka_ = scratch_.carve(c_ * d_);     // [C, D]   k rows
    qf_ = scratch_.carve(c_ * fp_);    // [C, Fp]  phi(s Q), padding 0
    kf_ = scratch_.carve(c_ * fp_);    // [C, Fp]  phi(K), padding 0
    kft_ = scratch_.carve(f_ * cp_);   // [F, Cp]  phi(K)^T, columns >= n 0
    va_ = scratch_.carve(c_ * ld_);    // [C, ld]  V rows
    vt_ = scratch_.carve(dvd_ * cp_);  // [Dv, Cp] V^T, columns >= n 0
    g_ = scratch_.carve(c_ * ld_);     // [C, ld]  G = d_o / den
    den_ = scratch_.carve(p.q_len);    // [Lq]     denominators (with eps; 1 unnormalized)
    powers_ = scratch_.carve(c_ + 1);  // [C + 1]  gamma^0 .. gamma^C
  }

  // powers_ for query head h; returns its gamma.
  float set_gamma(Index h) {
    const float gamma = spec_.gamma(h);
    decays_ = gamma != 1.f;
    for (Index i = 0; i <= c_; ++i) powers_[i] = float(std::pow(double(gamma), double(i)));
    return gamma;
  }

  // qa_ = s q rows, qf_ = phi(qa_).
  void load_queries(Index b, Index h, Index t0, Index n) {
    pack_rows(q_, b, h, t0, n, qa_, d_);
    for (Index r = 0; r < n; ++r) {
      float* x = qa_ + r * d_;
      for (Index c = 0; c < d_; ++c) x[c] *= scale_;
      feature_row(spec_.map, static_cast<const float*>(x), d_, qf_ + r * fp_);
      std::fill(qf_ + r * fp_ + f_, qf_ + (r + 1) * fp_, 0.f);
    }
  }

  // ka_ = k rows, kf_ = phi(ka_), kft_ = kf_^T.
  void load_keys(Index b, Index kvh, Index t0, Index n) {
    pack_rows(k_, b, kvh, t0, n, ka_, d_);
    for (Index j = 0; j < n; ++j) {
      float* row = kf_ + j * fp_;
      feature_row(spec_.map, static_cast<const float*>(ka_ + j * d_), d_, row);
      std::fill(row + f_, row + fp_, 0.f);
      for (Index f = 0; f < f_; ++f) kft_[f * cp_ + j] = row[f];
    }
    for (Index f = 0; f < f_; ++f) std::fill(kft_ + f * cp_ + n, kft_ + (f + 1) * cp_, 0.f);
  }

  // va_ = V rows, vt_ = V^T.
  void load_values(Index b, Index kvh, Index t0, Index n) {
    pack_rows(v_, b, kvh, t0, n, va_, ld_);
    for (Index c = 0; c < dvd_; ++c) {
      for (Index j = 0; j < n; ++j) vt_[c * cp_ + j] = va_[j * ld_ + c];
      std::fill(vt_ + c * cp_ + n, vt_ + (c + 1) * cp_, 0.f);
    }
  }

  // g_ = d_o rows / den.
  void load_grads(Index b, Index h, Index t0, Index n) {
    pack_rows(d_o_, b, h, t0, n, g_, ld_);
    if (spec_.normalize)
      for (Index r = 0; r < n; ++r) scale_row(g_ + r * ld_, ld_, 1.f / den_[t0 + r]);
  }

  // Row r of a chunk matrix: (x + add) gamma^(r - j) for j <= r, 0 after (up to np).
  void mask_row(float* row, Index r, Index np, float add) const {
    for (Index j = 0; j <= r; ++j) row[j] = (row[j] + add) * powers_[r - j];
    std::fill(row + r + 1, row + np, 0.f);
  }

  template <class T>
  static void store(T* dst, const float* src, Index n, float factor) {
    for (Index c = 0; c < n; ++c) dst[c] = static_cast<T>(src[c] * factor);
  }

  static void scale_row(float* x, Index n, float factor) {  // n a whole number of vectors
    const simd::Vec f(factor);
    for (Index c = 0; c < n; c += simd::kWidth) simd::store(x + c, simd::load(x + c) * f);
  }

  const LinearSpec<Map>& spec_;
  const Problem& p_;
  float scale_;
  View<Q> q_;
  View<K> k_;
  View<V> v_;
  View<GO> d_o_;
  Index d_, dvd_, f_, fp_, ld_, c_, cp_;  // dims, features (padded), state stride, chunk
  bool decays_ = false;                   // this head's gamma != 1
  Scratch scratch_;
  float *qa_, *ka_, *qf_, *kf_, *kft_, *va_, *vt_, *g_, *den_, *powers_;
};

}  // namespace attnkit::detail
