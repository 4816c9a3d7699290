// LinearHeads: one thread's engine of linear_attention(), run head by head on validated
// inputs. The chunked form (prefill) splits the sequence into chunks of C rows; per chunk
//   O  = diag(gamma^(r+1)) phi(Q) S                 what the state before the chunk gives
//   O += (phi(Q) phi(K)^T . D) V                    D[r, j] = gamma^(r-j) for j <= r, else 0
//   S  = gamma^n S + phi(K)^T diag(gamma^(n-1-j)) V
// all three through the tile GEMM, and the same three with z in place of S and 1 in place
// of V for the denominators: dot products and row sums beside the GEMMs. (z as a column of
// ones appended to V costs a whole SIMD vector per row: 80 columns instead of 64 at d = 64
// on AVX-512. Apart, EluPlusOne, L = 1024, H = 2, one thread: d = 64 0.78 -> 0.74 ms,
// d = 128 2.25 -> 2.15 ms.)
// The recurrent form (decode) does per token S = gamma S + phi(k) v^T (a rank-1 update),
// z = gamma z + phi(k) and o = phi(q)^T S / (phi(q)^T z + eps).
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/scratch.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_spec.hpp"
#include "attnkit/linear/linear_state.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

template <class Map, class Q, class K, class V, class O>
class LinearHeads {
 public:
  LinearHeads(const LinearSpec<Map>& spec, const Problem& p, float scale, const View<Q>& q,
              const View<K>& k, const View<V>& v, const View<O>& o, LinearState& state)
      : spec_(spec),
        p_(p),
        scale_(scale),
        q_(q),
        k_(k),
        v_(v),
        o_(o),
        state_(state),
        f_(state.features()),
        ld_(state.ld()),
        c_(spec.form == LinearForm::Chunked ? spec.chunk : 1),
        cp_(simd::round_up(c_)),
        scratch_(Scratch::size_for(p.head_dim, f_, c_ * f_, f_ * cp_, c_ * ld_, c_ * cp_, c_ * ld_,
                                   c_, c_ + 1, cp_)) {
    raw_ = scratch_.carve(p.head_dim);   // [D]     one input row in f32
    krow_ = scratch_.carve(f_);          // [F]     phi(k) of one key
    qf_ = scratch_.carve(c_ * f_);       // [C, F]  phi(s Q) of the chunk
    kft_ = scratch_.carve(f_ * cp_);     // [F, Cp] phi(K)^T of the chunk, columns >= n are 0
    va_ = scratch_.carve(c_ * ld_);      // [C, ld] V of the chunk, columns >= Dv are 0
    scores_ = scratch_.carve(c_ * cp_);  // [C, Cp] phi(Q) phi(K)^T, then decayed and masked
    out_ = scratch_.carve(c_ * ld_);     // [C, ld] numerators
    den_ = scratch_.carve(c_);           // [C]     denominators (before eps)
    powers_ = scratch_.carve(c_ + 1);    // [C + 1] gamma^0 .. gamma^C
    weights_ = scratch_.carve(cp_);      // [Cp]    gamma^(n-1-j) of key j, 0 past the chunk
  }

  /// Runs query head h of batch b: reads and updates its state, writes its output rows.
  void run(Index b, Index h) {
    const float gamma = spec_.gamma(h);
    decays_ = gamma != 1.f;
    for (Index i = 0; i <= c_; ++i) powers_[i] = float(std::pow(double(gamma), double(i)));
    float* s = state_.head(b, h);  // [F, ld]
    z_ = state_.z_row(b, h);       // [F]
    const Index kvh = p_.kv_head(h);
    if (spec_.form == LinearForm::Recurrent)
      recurrent(b, h, kvh, s, gamma);
    else
      chunked(b, h, kvh, s);
  }

 private:
  void chunked(Index b, Index h, Index kvh, float* s) {
    if (spec_.causal) {
      for (Index t0 = 0; t0 < p_.q_len; t0 += c_) {
        const Index n = std::min(c_, p_.q_len - t0);
        query_features(b, h, t0, n);
        key_features(b, kvh, t0, n);
        values(b, kvh, t0, n);
        read_state(s, n, decays_);
        intra_chunk(n);
        write_rows(b, h, t0, n);
        advance_state(s, n);
      }
      return;
    }
    for (Index t0 = 0; t0 < p_.kv_len; t0 += c_) {  // the whole history first
      const Index n = std::min(c_, p_.kv_len - t0);
      key_features(b, kvh, t0, n);
      values(b, kvh, t0, n);
      advance_state(s, n);
    }
    for (Index t0 = 0; t0 < p_.q_len; t0 += c_) {  // then every query reads the last state
      const Index n = std::min(c_, p_.q_len - t0);
      query_features(b, h, t0, n);
      read_state(s, n, false);
      write_rows(b, h, t0, n);
    }
  }

  void recurrent(Index b, Index h, Index kvh, float* s, float gamma) {
    const auto step = [&](Index t) {
      key_row(b, kvh, t);
      values(b, kvh, t, 1);
    };
    if (spec_.causal) {
      for (Index t = 0; t < p_.q_len; ++t) {
        step(t);
        query_features(b, h, t, 1);
        update_and_read(s, gamma);
        write_rows(b, h, t, 1);
      }
      return;
    }
    for (Index t = 0; t < p_.kv_len; ++t) {
      step(t);
      update_and_read(s, gamma, false);
    }
    for (Index t = 0; t < p_.q_len; ++t) {
      query_features(b, h, t, 1);
      read_state(s, 1, false);
      write_rows(b, h, t, 1);
    }
  }

  // qf_[n, F] = phi(scale * q rows t0 ..).
  void query_features(Index b, Index h, Index t0, Index n) {
    for (Index r = 0; r < n; ++r)
      feature_row(spec_.map, input_row(q_, b, h, t0 + r, scale_), p_.head_dim, qf_ + r * f_);
  }

  // krow_[F] = phi(k row t).
  void key_row(Index b, Index kvh, Index t) {
    feature_row(spec_.map, input_row(k_, b, kvh, t, 1.f), p_.head_dim, krow_);
  }

  // Row t of x as f32 times `factor`: f32 rows with factor 1 are read in place (no copy:
  // the copy was 8% of the time at d = 128), others converted into raw_[D].
  template <class T>
  const float* input_row(const View<T>& x, Index b, Index h, Index t, float factor) {
    if constexpr (is_f32<T>())
      if (factor == 1.f) return x.row(b, h, t);
    pack_rows(x, b, h, t, 1, raw_, p_.head_dim);
    if (factor != 1.f)
      for (Index c = 0; c < p_.head_dim; ++c) raw_[c] *= factor;
    return raw_;
  }

  // kft_[F, Cp] = phi(K rows t0 ..)^T, columns n .. Cp zero (they meet masked scores only).
  void key_features(Index b, Index kvh, Index t0, Index n) {
    for (Index j = 0; j < n; ++j) {
      key_row(b, kvh, t0 + j);
      for (Index f = 0; f < f_; ++f) kft_[f * cp_ + j] = krow_[f];
    }
    if (n < cp_)
      for (Index f = 0; f < f_; ++f) std::fill(kft_ + f * cp_ + n, kft_ + (f + 1) * cp_, 0.f);
  }

  // va_[n, ld] = V rows t0 .., zero-padded.
  void values(Index b, Index kvh, Index t0, Index n) { pack_rows(v_, b, kvh, t0, n, va_, ld_); }

  // out_[n, ld] = phi(Q) S and den_[n] = phi(Q) z, row r decayed by gamma^(r+1) when
  // `decay` (causal chunks).
  void read_state(const float* s, Index n, bool decay) {
    gemm::gemm(n, ld_, f_, {qf_, f_, 1}, s, ld_, out_, ld_, false);
    for (Index r = 0; r < n; ++r) den_[r] = simd::dot(qf_ + r * f_, z_, f_);
    if (decay)
      for (Index r = 0; r < n; ++r) {
        scale_row(out_ + r * ld_, ld_, powers_[r + 1]);
        den_[r] *= powers_[r + 1];
      }
  }

  // out_ += (phi(Q) phi(K)^T . D) V and den_ += its row sums, D the causal decay mask.
  void intra_chunk(Index n) {
    const Index np = simd::round_up(n);
    gemm::gemm(n, np, f_, {qf_, f_, 1}, kft_, cp_, scores_, cp_, false);
    for (Index r = 0; r < n; ++r) den_[r] += decay_mask_row(scores_ + r * cp_, r, n);
    gemm::gemm(n, ld_, n, {scores_, cp_, 1}, va_, ld_, out_, ld_, true);
  }

  // Query row r of a chunk sees keys j <= r with weight gamma^(r - j); returns the row sum.
  float decay_mask_row(float* row, Index r, Index n) const {
    float sum = 0;
    if (decays_)
      for (Index j = 0; j <= r; ++j) row[j] *= powers_[r - j];
    for (Index j = 0; j <= r; ++j) sum += row[j];
    std::fill(row + r + 1, row + n, 0.f);
    return sum;
  }

  // S = gamma^n S + phi(K)^T diag(gamma^(n-1-j)) V and z = gamma^n z + phi(K)^T
  // gamma^(n-1-j). Scales va_ in place (read last).
  void advance_state(float* s, Index n) {
    for (Index j = 0; j < cp_; ++j) weights_[j] = j < n ? powers_[n - 1 - j] : 0.f;
    for (Index f = 0; f < f_; ++f)
      z_[f] = z_[f] * powers_[n] + simd::dot(kft_ + f * cp_, weights_, cp_);
    if (decays_) {
      scale_row(s, f_ * ld_, powers_[n]);
      for (Index j = 0; j < n; ++j) scale_row(va_ + j * ld_, ld_, powers_[n - 1 - j]);
    }
    gemm::gemm(f_, ld_, n, {kft_, cp_, 1}, va_, ld_, s, ld_, true);
  }

  // The recurrent step S[f, :] = gamma S[f, :] + phi(k)[f] v, z[f] = gamma z[f] + phi(k)[f]
  // and, when `read`, the read out_[ld] = phi(q)^T S, den_[0] = phi(q)^T z of the new state
  // in the same pass: a decode step is bound by the state's memory traffic (H = 8, d = 128,
  // one thread: 23.2 us against 25.5 in two passes).
  void update_and_read(float* s, float gamma, bool read = true) {
    const simd::Vec g(gamma);
    if (read) std::fill(out_, out_ + ld_, 0.f);
    float den = 0;
    for (Index f = 0; f < f_; ++f) {
      z_[f] = gamma * z_[f] + krow_[f];
      if (read) den += qf_[f] * z_[f];
      float* row = s + f * ld_;
      const simd::Vec kf(krow_[f]), qf(read ? qf_[f] : 0.f);
      for (Index c = 0; c < ld_; c += simd::kWidth) {
        const simd::Vec updated = simd::fma(kf, simd::load(va_ + c), simd::load(row + c) * g);
        simd::store(row + c, updated);
        if (read) simd::store(out_ + c, simd::fma(qf, updated, simd::load(out_ + c)));
      }
    }
    den_[0] = den;
  }

  // o rows t0 .. = numerators / (denominator + eps), or the numerators.
  void write_rows(Index b, Index h, Index t0, Index n) {
    using Out = typename View<O>::value_type;
    for (Index r = 0; r < n; ++r) {
      const float* acc = out_ + r * ld_;
      const float factor = spec_.normalize ? 1.f / (den_[r] + spec_.eps) : 1.f;
      Out* dst = o_.row(b, h, t0 + r);
      for (Index c = 0; c < p_.value_dim; ++c) dst[c] = static_cast<Out>(acc[c] * factor);
    }
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
  View<O> o_;
  LinearState& state_;
  Index f_, ld_, c_, cp_;  // features, state row stride, chunk rows, chunk rows padded
  bool decays_ = false;    // this head's gamma != 1
  Scratch scratch_;
  float* z_ = nullptr;  // [F] the current head's z, in the state
  float *raw_, *krow_, *qf_, *kft_, *va_, *scores_, *out_, *den_, *powers_, *weights_;
};

}  // namespace attnkit::detail
