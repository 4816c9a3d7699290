// gated_attention_backward(): dq, dk, dv, dg, dbeta and the gradient of the starting state
// of one gated_attention() call (reference_backward.hpp has the formulas). The work items
// are (batch, key head): one worker owns the rows of a key head and runs the value heads that
// read it one after the other, summing their dq and dk in a fixed order, so the result does
// not change with the thread count. Per value head, after a forward pass that keeps the state
// at every chunk boundary:
// - scalar gates (None, PerHead, PerToken): the chunked form's backward, chunk by chunk from
//   the last, on the tile GEMMs (gated_backward_chunks.hpp);
// - per-channel gates: the recurrence token by token, one block of the state's columns at a
//   time (columns(): every column of the recurrence and of its gradient is independent but
//   for the row sums), each chunk's states rebuilt from its boundary.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/gated/gated_backward_chunks.hpp"
#include "attnkit/gated/gated_backward_columns.hpp"
#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_rows.hpp"
#include "attnkit/gated/gated_saved.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/options.hpp"

namespace attnkit {

/// Where gated_attention_backward() writes the gradients of the gates (f32, shaped as gates.g
/// and gates.beta) and of the starting state ([B, Hv, Dk, Dv]); an empty view: not wanted.
/// PerHead gates are the spec's constants and get none.
struct GateGrads {
  View<float> dg, dbeta, d_state_in;
};

namespace detail {

template <class Q, class K, class V, class G>
class GatedBackward : public GatedRows<Q, K, V, float> {
  using Base = GatedRows<Q, K, V, float>;

 public:
  GatedBackward(const GatedSpec& spec, const GatedShape& s, float scale, const View<Q>& q,
                const View<K>& k, const View<V>& v, const GateInputs& gates, const View<G>& d_o,
                const View<float>& dq, const View<float>& dk, const View<float>& dv,
                const GateGrads& grads, const View<const float>& state_in,
                const View<const float>& d_state_out, const GatedSaved* saved)
      : Base(spec.with_form(LinearForm::Recurrent), s, scale, q, k, v, gates, dv, nullptr),
        chunk_(std::min(spec.chunk, std::max<Index>(s.len, 1))),  // the forward's chunks
        ldvb_((s.value_dim + ColumnBackward::kBlock - 1) / ColumnBackward::kBlock *
              ColumnBackward::kBlock),
        per_channel_(spec.gate == GateShape::PerChannel),
        d_o_(d_o),
        dq_(dq),
        dk_(dk),
        grads_(grads),
        in_(state_in),
        d_out_(d_state_out),
        saved_(saved),
        rows_(Scratch::size_for(s.len * this->ldk_, s.len * this->ldk_, s.len * ldvb_,
                                s.len * ldvb_, s.len * ldvb_, 2 * s.len * s.key_dim,
                                per_channel_ ? s.len * s.key_dim : 0,
                                per_channel_ ? s.len * s.key_dim : 0, s.len, s.len, s.len, s.len,
                                s.len, s.len, s.len, s.key_dim * ldvb_, s.key_dim * ldvb_)) {
    // The key head's rows, loaded once: normalized q and k [L, ldk] and their 1 / |x|; per
    // value head v, d_o and dv [L, ldv], beta, the log gates [L] and (per channel) the decays
    // [L, Dk]; the sums over the value heads of dq and dk of the normalized rows [L, Dk];
    // what the engines write per row: dg ([L, Dk] per channel, else [L]), dbeta, d . do [L].
    const Index L = s.len, Dk = s.key_dim, ldk = this->ldk_, ldv = ldvb_;
    qn_ = rows_.carve(L * ldk);
    kn_ = rows_.carve(L * ldk);
    vn_ = rows_.carve(L * ldv);
    don_ = rows_.carve(L * ldv);
    dv_rows_ = rows_.carve(L * ldv);
    dqk_ = rows_.carve(2 * L * Dk);
    decay_ = rows_.carve(per_channel_ ? L * Dk : 0);
    dgn_ = rows_.carve(per_channel_ ? L * Dk : 0);
    rq_ = rows_.carve(L);
    rk_ = rows_.carve(L);
    betas_ = rows_.carve(L);
    log_gate_ = rows_.carve(L);
    dg_token_ = rows_.carve(L);
    dbn_ = rows_.carve(L);
    ddo_ = rows_.carve(L);
    S0_ = rows_.carve(Dk * ldv);
    dS0_ = rows_.carve(Dk * ldv);
  }

  void run(Index b, Index kh) {
    const GatedShape& s = this->s_;
    const Index L = s.len, Dk = s.key_dim, ldk = this->ldk_;
    pack_rows(this->q_, b, kh, 0, L, qn_, ldk);
    pack_rows(this->k_, b, kh, 0, L, kn_, ldk);
    for (Index t = 0; t < L; ++t) {
      rq_[t] = normalize(qn_ + t * ldk, this->scale_);
      rk_[t] = normalize(kn_ + t * ldk, 1.f);
    }
    std::fill(dqk_, dqk_ + 2 * L * Dk, 0.f);
    const Index group = s.v_heads / s.k_heads;
    for (Index h = kh * group; h < (kh + 1) * group; ++h) head(b, h);
    for (Index t = 0; t < L; ++t) {
      row_backward(qn_ + t * ldk, rq_[t], dqk_ + t * Dk, this->scale_, dq_.row(b, kh, t));
      row_backward(kn_ + t * ldk, rk_[t], dqk_ + (L + t) * Dk, 1.f, dk_.row(b, kh, t));
    }
  }

 private:
  // The gradients of value head h: dv, dg, dbeta, d_state_in, and dq, dk of the normalized
  // rows summed into dqk_.
  void head(Index b, Index h) {
    const GatedShape& s = this->s_;
    const Index L = s.len, Dk = s.key_dim, ldv = ldvb_;
    pack_rows(this->v_, b, h, 0, L, vn_, ldv);
    pack_rows(d_o_, b, h, 0, L, don_, ldv);
    for (Index t = 0; t < L; ++t) {
      betas_[t] = this->spec_.delta() ? this->gates_.beta.row(b, h, t)[0] : 1.f;
      log_gate_[t] = this->log_gate(b, h, t, 0);
      if (per_channel_)  // ColumnBackward's decays (only its)
        for (Index c = 0; c < Dk; ++c) decay_[t * Dk + c] = std::exp(this->log_gate(b, h, t, c));
    }
    if (per_channel_) {  // ColumnBackward adds its blocks' parts to these
      std::fill(dgn_, dgn_ + L * Dk, 0.f);
      std::fill(dbn_, dbn_ + L, 0.f);
      std::fill(ddo_, ddo_ + L, 0.f);
      std::fill(dv_rows_, dv_rows_ + L * ldv, 0.f);
    }
    engines(b, h);
    for (Index t = 0; t < L; ++t) {
      if (per_channel_) {  // dq of the normalized row also takes k (d . do)
        const float* k = kn_ + t * this->ldk_;
        float* sum_q = dqk_ + t * Dk;
        for (Index c = 0; c < Dk; ++c) sum_q[c] += k[c] * ddo_[t];
      }
      std::copy_n(dv_rows_ + t * ldv, s.value_dim, this->o_.row(b, h, t));
      if (this->spec_.delta() && grads_.dbeta.data != nullptr)
        grads_.dbeta.row(b, h, t)[0] = dbn_[t];
      if (grads_.dg.data != nullptr) {
        float* dg = grads_.dg.row(b, h, t);
        if (per_channel_)
          std::copy_n(dgn_ + t * Dk, Dk, dg);
        else if (this->spec_.gate == GateShape::PerToken)
          dg[0] = dg_token_[t];
      }
    }
  }

  // The head's engine: scalar gates the chunked form's backward (ChunkBackward), from the
  // forward's saved chunks when there are; per-channel gates the recurrence by blocks of
  // columns (ColumnBackward). dv and the starting state's gradient go through row buffers of
  // ldvb_ floats; dq and dk are added to dqk_ directly.
  void engines(Index b, Index h) {
    const GatedShape& s = this->s_;
    const Index L = s.len, Dk = s.key_dim, ldv = ldvb_, area = Dk * ldv;
    std::fill(S0_, S0_ + area, 0.f);
    std::fill(dS0_, dS0_ + area, 0.f);
    const SavedHead saved = saved_ != nullptr ? SavedAccess::head(*saved_, b, h) : SavedHead{};
    for (Index c = 0; c < Dk; ++c) {
      if (saved.states != nullptr)
        std::copy_n(saved.states + c * saved.ldv, s.value_dim, S0_ + c * ldv);
      else if (in_.data != nullptr)
        std::copy_n(in_.row(b, h, c), s.value_dim, S0_ + c * ldv);
      if (d_out_.data != nullptr) std::copy_n(d_out_.row(b, h, c), s.value_dim, dS0_ + c * ldv);
    }
    const bool delta = this->spec_.delta();
    const HeadRows rows{L,      Dk,   s.value_dim,   this->ldk_, ldv,       chunk_,
                        delta,  qn_,  kn_,           vn_,        don_,      log_gate_,
                        betas_, dqk_, dqk_ + L * Dk, dv_rows_,   dg_token_, delta ? dbn_ : nullptr};
    if (per_channel_)
      columns_.run(rows, decay_, dgn_, ddo_, S0_, dS0_);
    else if (saved.P != nullptr)
      chunks_.run(rows, saved, dS0_);
    else
      chunks_.run(rows, S0_, dS0_);
    if (grads_.d_state_in.data != nullptr)
      for (Index c = 0; c < Dk; ++c)
        std::copy_n(dS0_ + c * ldv, s.value_dim, grads_.d_state_in.row(b, h, c));
  }

  // x (Dk values, zero-padded to ldk) l2-normalized when the spec asks, times factor; returns
  // 1 / |x| (1 without l2), for row_backward().
  float normalize(float* x, float factor) const {
    if (!this->spec_.l2_normalize) {
      if (factor != 1.f) Base::scale_row(x, this->ldk_, factor);
      return 1.f;
    }
    const double r = 1.0 / std::sqrt(double(simd::dot(x, x, this->ldk_)) + 1e-6);
    Base::scale_row(x, this->ldk_, float(double(factor) * r));
    return float(r);
  }

  // out = dx of y = factor x r (l2) or factor x (reference_backward.hpp), from y (the loaded
  // row), r = 1 / |x| and dy.
  void row_backward(const float* y, float r, const float* dy, float factor, float* out) const {
    const Index Dk = this->s_.key_dim;
    if (!this->spec_.l2_normalize) {
      for (Index c = 0; c < Dk; ++c) out[c] = factor * dy[c];
      return;
    }
    const float inv = 1.f / factor;                // y0 = y / factor = x r
    const float dot = inv * simd::dot(y, dy, Dk);  // y0 . dy
    for (Index c = 0; c < Dk; ++c) out[c] = factor * r * (dy[c] - y[c] * inv * dot);
  }

  Index chunk_, ldvb_;  // ldvb_: the rows of vn_, don_ and dv_rows_, whole blocks of columns
  bool per_channel_;
  View<G> d_o_;
  View<float> dq_, dk_;
  GateGrads grads_;
  View<const float> in_, d_out_;
  const GatedSaved* saved_;  // the forward's kept chunks, or null
  Scratch rows_;             // the buffers below
  float *qn_, *kn_, *vn_, *don_, *dv_rows_, *dqk_, *decay_, *dgn_;
  float *rq_, *rk_, *betas_, *log_gate_, *dg_token_, *dbn_, *ddo_, *S0_, *dS0_;
  ChunkBackward chunks_;    // scalar gates
  ColumnBackward columns_;  // per-channel gates
};

}  // namespace detail

namespace detail {

template <class Q, class K, class V, class G>
void run_gated_backward(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                        const GateInputs& gates, const View<G>& d_o, const View<float>& dq,
                        const View<float>& dk, const View<float>& dv, const GateGrads& grads,
                        const View<const float>& state_in, const View<const float>& d_state_out,
                        const Options& options, const GatedSaved* saved) {
  const GatedShape s = check_gated(spec, q, k, v, gates, dv, nullptr, options);
  check_gated_grads(spec, s, q, k, v, d_o, dq, dk, dv, grads, state_in, d_state_out);
  const float scale = options.scale.value_or(1.f / std::sqrt(float(s.key_dim)));
  if (saved != nullptr) SavedAccess::check(*saved, spec, s, scale);
  using Engine = GatedBackward<Q, K, V, G>;
  const Index items = s.batch * s.k_heads;
  if (items == 0) return;
  const int threads = threads_for(options.threads, items);
  Workers<Engine> workers(threads, spec, s, scale, q, k, v, gates, d_o, dq, dk, dv, grads, state_in,
                          d_state_out, saved);
  for_each_item(workers, items,
                [&](Engine& mine, Index item) { mine.run(item / s.k_heads, item % s.k_heads); });
}

}  // namespace detail

/// The gradients of gated_attention(spec, q, k, v, gates, o, state_in) for a loss whose
/// gradient with respect to o is d_o (and, if given, with respect to the state the call left,
/// d_state_out): dq, dk [B, Hk, L, Dk] (summed over the value heads that read each key head),
/// dv [B, Hv, L, Dv], all f32, and the GateGrads wanted. state_in: the state the forward
/// started from (empty: zero). Runs the forward's chunks again first; the overload with a
/// GatedSaved does not. Bitwise the same for any thread count.
template <class Q, class K, class V, class G>
void gated_attention_backward(const GatedSpec& spec, const View<Q>& q, const View<K>& k,
                              const View<V>& v, const GateInputs& gates, const View<G>& d_o,
                              const View<float>& dq, const View<float>& dk, const View<float>& dv,
                              const GateGrads& grads = {}, const View<const float>& state_in = {},
                              const View<const float>& d_state_out = {},
                              const Options& options = {}) {
  detail::run_gated_backward(spec, q, k, v, gates, d_o, dq, dk, dv, grads, state_in, d_state_out,
                             options, nullptr);
}

/// gated_attention_backward() of the gated_attention(..., saved) call that kept `saved`
/// (which holds its starting state): the same inputs, spec and scale, else an Error.
template <class Q, class K, class V, class G>
void gated_attention_backward(const GatedSaved& saved, const GatedSpec& spec, const View<Q>& q,
                              const View<K>& k, const View<V>& v, const GateInputs& gates,
                              const View<G>& d_o, const View<float>& dq, const View<float>& dk,
                              const View<float>& dv, const GateGrads& grads = {},
                              const View<const float>& d_state_out = {},
                              const Options& options = {}) {
  detail::run_gated_backward(spec, q, k, v, gates, d_o, dq, dk, dv, grads, {}, d_state_out, options,
                             &saved);
}

}  // namespace attnkit
