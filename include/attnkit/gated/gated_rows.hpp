// The per-head buffers of gated attention and what fills them: one worker's scratch, the
// rows of q, k, v (f32, l2-normalized and scaled as the spec says), the cumulative log gates
// of a chunk in double, and the state's rows (the caller's memory in place when its rows
// are whole SIMD vectors, else a padded copy).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/scratch.hpp"
#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::detail {

template <class Q, class K, class V, class O>
class GatedRows {
 public:
  GatedRows(const GatedSpec& spec, const GatedShape& s, float scale, const View<Q>& q,
            const View<K>& k, const View<V>& v, const GateInputs& gates, const View<O>& o,
            const View<float>* state)
      : spec_(spec),
        s_(s),
        scale_(scale),
        q_(q),
        k_(k),
        v_(v),
        gates_(gates),
        o_(o),
        state_(state),
        c_(spec.form == LinearForm::Recurrent ? 1
                                              : std::min(spec.chunk, std::max<Index>(s.len, 1))),
        cp_(simd::round_up(c_)),
        ldk_(simd::round_up(s.key_dim)),
        ldv_(simd::round_up(s.value_dim)),
        scratch_(scratch_floats()),
        qc_(scratch_.carve(c_ * ldk_)),
        kc_(scratch_.carve(c_ * ldk_)),
        vc_(scratch_.carve(c_ * ldv_)),
        wc_(scratch_.carve(c_ * ldk_)),
        qs_(scratch_.carve(c_ * ldk_)),
        kj_(scratch_.carve(cp_ * ldk_)),
        kt_(scratch_.carve(s.key_dim * cp_)),
        pc_(scratch_.carve(c_ * cp_)),
        ac_(scratch_.carve(c_ * cp_)),
        tc_(scratch_.carve(c_ * cp_)),
        oc_(scratch_.carve(c_ * ldv_)),
        tmp_(scratch_.carve(c_ * ldv_)),
        own_state_(scratch_.carve(s.key_dim * ldv_)),
        gate_(static_cast<std::size_t>(c_ * (spec.gate == GateShape::PerChannel ? s.key_dim : 1))),
        beta_(static_cast<std::size_t>(c_)) {}

 protected:
  Index scratch_floats() const {
    const auto line = [](Index n) { return (n + 15) / 16 * 16; };
    return 4 * line(c_ * ldk_) + line(cp_ * ldk_) + line(s_.key_dim * cp_) + 3 * line(c_ * cp_) +
           3 * line(c_ * ldv_) + line(s_.key_dim * ldv_) + line(c_ * ldv_);
  }

  // The state of head (b, h) as rows of ld floats: the caller's own memory when its rows are
  // whole vectors (read and written in place), else own_state_ (loaded, written back by
  // store_state()); zero without a state.
  float* load_state(Index b, Index h, Index& ld) {
    if (state_ != nullptr && s_.value_dim == ldv_ && can_use_in_place()) {
      ld = state_->seq_stride;
      return state_->row(b, h, 0);
    }
    ld = ldv_;
    for (Index c = 0; c < s_.key_dim; ++c) {
      float* row = own_state_ + c * ldv_;
      std::fill(row, row + ldv_, 0.f);
      if (state_ != nullptr) std::copy_n(state_->row(b, h, c), s_.value_dim, row);
    }
    return own_state_;
  }
  void store_state(Index b, Index h, const float* S) const {
    if (state_ == nullptr || S != own_state_) return;
    for (Index c = 0; c < s_.key_dim; ++c)
      std::copy_n(S + c * ldv_, s_.value_dim, state_->row(b, h, c));
  }
  bool can_use_in_place() const { return state_->seq_stride >= ldv_; }

  // Rows t0 .. t0 + n of q and k (key head kh) into qc_, kc_ [n, ldk] (normalized, q scaled),
  // v (value head h) into vc_ [n, ldv], zero-padded; beta_ and the gates of the rows.
  void load_rows(Index b, Index kh, Index h, Index t0, Index n) {
    pack_rows(q_, b, kh, t0, n, qc_, ldk_);
    pack_rows(k_, b, kh, t0, n, kc_, ldk_);
    pack_rows(v_, b, h, t0, n, vc_, ldv_);
    for (Index r = 0; r < n; ++r) {
      normalize(qc_ + r * ldk_, scale_);
      normalize(kc_ + r * ldk_, 1.f);
      beta_[std::size_t(r)] = spec_.delta() ? gates_.beta.row(b, h, t0 + r)[0] : 1.f;
    }
    const Index width = spec_.gate == GateShape::PerChannel ? s_.key_dim : 1;
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < width; ++c)
        gate_[std::size_t(r * width + c)] = log_gate(b, h, t0 + r, c);
  }

  float log_gate(Index b, Index h, Index t, Index c) const {
    switch (spec_.gate) {
      case GateShape::None:
        return 0.f;
      case GateShape::PerHead:
        return spec_.head_gates[std::size_t(h)];
      case GateShape::PerToken:
        return gates_.g.row(b, h, t)[0];
      case GateShape::PerChannel:
        return gates_.g.row(b, h, t)[c];
    }
    return 0.f;
  }

  // x[Dk] l2-normalized (x / sqrt(sum x^2 + 1e-6)) when the spec asks, times `factor`.
  void normalize(float* x, float factor) const {
    float f = factor;
    if (spec_.l2_normalize)  // x is zero-padded to ldk: a SIMD dot (f32 sums of squares)
      f = float(double(factor) / std::sqrt(double(simd::dot(x, x, ldk_)) + 1e-6));
    if (f != 1.f) scale_row(x, ldk_, f);
  }

  // Output rows t0 .. t0 + n of head (b, h) from oc_ [n, ldv].
  void write_rows(Index b, Index h, Index t0, Index n) const {
    for (Index r = 0; r < n; ++r) row_from_f32(oc_ + r * ldv_, s_.value_dim, o_.row(b, h, t0 + r));
  }

  static void scale_row(float* x, Index n, float factor) {  // n a whole number of vectors
    const simd::Vec f(factor);
    for (Index c = 0; c < n; c += simd::kWidth) simd::store(x + c, simd::load(x + c) * f);
  }
  // y[0, n) += a * x[0, n), n a whole number of vectors.
  static void axpy(float* y, const float* x, Index n, float a) {
    const simd::Vec f(a);
    for (Index c = 0; c < n; c += simd::kWidth)
      simd::store(y + c, simd::fma(simd::load(x + c), f, simd::load(y + c)));
  }

  GatedSpec spec_;  // a copy: the backward runs its own (recurrent) variant
  GatedShape s_;
  float scale_;
  View<Q> q_;
  View<K> k_;
  View<V> v_;
  GateInputs gates_;
  View<O> o_;
  const View<float>* state_;
  Index c_, cp_, ldk_, ldv_;
  Scratch scratch_;
  float *qc_, *kc_, *vc_, *wc_, *qs_, *kj_, *kt_, *pc_, *ac_, *tc_, *oc_, *tmp_, *own_state_;
  std::vector<float> gate_, beta_;  // the rows' log gates ([n] or [n, Dk]) and betas
};

}  // namespace attnkit::detail
