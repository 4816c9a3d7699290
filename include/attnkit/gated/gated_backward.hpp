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
#include "attnkit/gated/gated_backward_chunks.hpp"
#include "attnkit/gated/gated_backward_columns.hpp"
#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_rows.hpp"
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
                const View<const float>& d_state_out)
      : Base(spec.with_form(LinearForm::Recurrent), s, scale, q, k, v, gates, dv, nullptr),
        chunk_(spec.chunk),
        ldvb_((s.value_dim + ColumnBackward::kBlock - 1) / ColumnBackward::kBlock *
              ColumnBackward::kBlock),
        d_o_(d_o),
        dq_(dq),
        dk_(dk),
        grads_(grads),
        in_(state_in),
        d_out_(d_state_out) {
    const Index L = s.len, ldk = this->ldk_, ldv = ldvb_;
    dqk_.resize(std::size_t(2 * L * s.key_dim));
    // The head's rows, loaded once: normalized q and k, v and d_o [L, ld], the decays
    // [L, Dk] and beta [L]; the row sums the column blocks add to: dq and dk of the
    // normalized rows, dg [L, Dk], dbeta, d . do [L].
    qn_.resize(std::size_t(L * ldk));
    kn_.resize(std::size_t(L * ldk));
    vn_.resize(std::size_t(L * ldv));
    don_.resize(std::size_t(L * ldv));
    if (spec.gate == GateShape::PerChannel) decay_.resize(std::size_t(L * s.key_dim));
    betas_.resize(std::size_t(L));
    dqn_.resize(std::size_t(L * s.key_dim));
    dkn_.resize(std::size_t(L * s.key_dim));
    dgn_.resize(std::size_t(L * s.key_dim));
    dbn_.resize(std::size_t(L));
    ddo_.resize(std::size_t(L));
  }

  void run(Index b, Index kh) {
    const GatedShape& s = this->s_;
    std::fill(dqk_.begin(), dqk_.end(), 0.f);
    const Index group = s.v_heads / s.k_heads;
    for (Index h = kh * group; h < (kh + 1) * group; ++h) head(b, kh, h);
    const auto raw_grad = [&](const auto& x, Index t, const float* dy, float factor, float* out) {
      pack_rows(x, b, kh, t, 1, this->qc_, this->ldk_);  // the raw row
      row_backward(this->qc_, dy, factor, out);
    };
    for (Index t = 0; t < s.len; ++t) {
      std::fill(dq_.row(b, kh, t), dq_.row(b, kh, t) + s.key_dim, 0.f);
      std::fill(dk_.row(b, kh, t), dk_.row(b, kh, t) + s.key_dim, 0.f);
      raw_grad(this->q_, t, dqk_.data() + t * s.key_dim, this->scale_, dq_.row(b, kh, t));
      raw_grad(this->k_, t, dqk_.data() + (s.len + t) * s.key_dim, 1.f, dk_.row(b, kh, t));
    }
  }

 private:
  // The gradients of value head h: dv, dg, dbeta, d_state_in, and dq, dk of the normalized
  // rows summed into dqk_.
  void head(Index b, Index kh, Index h) {
    const GatedShape& s = this->s_;
    const Index L = s.len, Dk = s.key_dim, ldk = this->ldk_, ldv = ldvb_;
    for (Index t = 0; t < L; ++t) {
      this->load_rows(b, kh, h, t, 1);
      std::copy_n(this->qc_, ldk, qn_.data() + t * ldk);
      std::copy_n(this->kc_, ldk, kn_.data() + t * ldk);
      std::fill(std::copy_n(this->vc_, this->ldv_, vn_.data() + t * ldv),
                vn_.data() + (t + 1) * ldv, 0.f);
      pack_rows(d_o_, b, h, t, 1, don_.data() + t * ldv, ldv);
      if (this->spec_.gate == GateShape::PerChannel)  // ColumnBackward's decays (only its)
        for (Index c = 0; c < Dk; ++c)
          decay_[std::size_t(t * Dk + c)] = std::exp(this->gate_[std::size_t(c)]);
      betas_[std::size_t(t)] = this->beta_[0];
    }
    for (auto* x : {&dqn_, &dkn_, &dgn_, &dbn_, &ddo_}) std::fill(x->begin(), x->end(), 0.f);
    engines(b, h);
    for (Index t = 0; t < L; ++t) {
      float* sum_q = dqk_.data() + t * Dk;
      float* sum_k = dqk_.data() + (L + t) * Dk;
      const float* k = kn_.data() + t * ldk;
      for (Index c = 0; c < Dk; ++c) {
        sum_q[c] += dqn_[std::size_t(t * Dk + c)] + k[c] * ddo_[std::size_t(t)];
        sum_k[c] += dkn_[std::size_t(t * Dk + c)];
      }
      if (this->spec_.delta() && grads_.dbeta.data != nullptr)
        grads_.dbeta.row(b, h, t)[0] = dbn_[std::size_t(t)];
      if (grads_.dg.data != nullptr) {
        float* dg = grads_.dg.row(b, h, t);
        if (this->spec_.gate == GateShape::PerChannel)
          std::copy_n(dgn_.data() + t * Dk, Dk, dg);
        else if (this->spec_.gate == GateShape::PerToken)
          dg[0] = dgn_[std::size_t(t * Dk)];  // by_chunks() leaves a token's dg in column 0
      }
    }
  }

  // The head's engine: scalar gates the chunked form's backward (ChunkBackward), per-channel
  // gates the recurrence by blocks of columns (ColumnBackward); dv and the starting state's
  // gradient go through row buffers of ldvb_ floats.
  void engines(Index b, Index h) {
    const GatedShape& s = this->s_;
    const Index L = s.len, Dk = s.key_dim, ldv = ldvb_, area = Dk * ldv;
    log_gate_.resize(std::size_t(L));
    dg_token_.assign(std::size_t(L), 0.f);
    dv_rows_.assign(std::size_t(L * ldv), 0.f);
    for (Index t = 0; t < L; ++t) log_gate_[std::size_t(t)] = this->log_gate(b, h, t, 0);
    S0_.assign(std::size_t(area), 0.f);
    dS0_.assign(std::size_t(area), 0.f);
    for (Index c = 0; c < Dk; ++c) {
      if (in_.data != nullptr) std::copy_n(in_.row(b, h, c), s.value_dim, S0_.data() + c * ldv);
      if (d_out_.data != nullptr)
        std::copy_n(d_out_.row(b, h, c), s.value_dim, dS0_.data() + c * ldv);
    }
    const bool delta = this->spec_.delta();
    const HeadRows rows{L,
                        Dk,
                        s.value_dim,
                        this->ldk_,
                        ldv,
                        chunk_,
                        delta,
                        qn_.data(),
                        kn_.data(),
                        vn_.data(),
                        don_.data(),
                        log_gate_.data(),
                        betas_.data(),
                        dqn_.data(),
                        dkn_.data(),
                        dv_rows_.data(),
                        dg_token_.data(),
                        delta ? dbn_.data() : nullptr};
    if (this->spec_.gate == GateShape::PerChannel) {
      columns_.run(rows, decay_.data(), dgn_.data(), ddo_.data(), S0_.data(), dS0_.data());
    } else {
      chunks_.run(rows, S0_.data(), dS0_.data());
      for (Index t = 0; t < L; ++t) dgn_[std::size_t(t * Dk)] = dg_token_[std::size_t(t)];
    }
    for (Index t = 0; t < L; ++t)
      std::copy_n(dv_rows_.data() + t * ldv, s.value_dim, this->o_.row(b, h, t));
    if (grads_.d_state_in.data != nullptr)
      for (Index c = 0; c < Dk; ++c)
        std::copy_n(dS0_.data() + c * ldv, s.value_dim, grads_.d_state_in.row(b, h, c));
  }

  // out += dx of y = factor x r (l2) or factor x, x the raw row (reference_backward.hpp).
  void row_backward(const float* x, const float* dy, float factor, float* out) const {
    const Index Dk = this->s_.key_dim;
    if (!this->spec_.l2_normalize) {
      for (Index c = 0; c < Dk; ++c) out[c] += factor * dy[c];
      return;
    }
    const float r = float(1.0 / std::sqrt(double(simd::dot(x, x, Dk)) + 1e-6));
    const float dot = r * simd::dot(x, dy, Dk);  // y0 . dy, y0 = x r
    for (Index c = 0; c < Dk; ++c) out[c] += factor * r * (dy[c] - x[c] * r * dot);
  }

  Index chunk_, ldvb_;  // ldvb_: the rows of vn_ and don_, whole blocks of columns
  View<G> d_o_;
  View<float> dq_, dk_;
  GateGrads grads_;
  View<const float> in_, d_out_;
  std::vector<float> dqk_;
  std::vector<float> qn_, kn_, vn_, don_, decay_, betas_;  // the head's rows (head())
  std::vector<float> dqn_, dkn_, dgn_, dbn_, ddo_;         // its row sums over blocks
  ChunkBackward chunks_;                                   // scalar gates
  ColumnBackward columns_;                                 // per-channel gates
  std::vector<float> log_gate_, dg_token_, dv_rows_, S0_, dS0_;
};

}  // namespace detail

/// The gradients of gated_attention(spec, q, k, v, gates, o, state_in) for a loss whose
/// gradient with respect to o is d_o (and, if given, with respect to the state the call left,
/// d_state_out): dq, dk [B, Hk, L, Dk] (summed over the value heads that read each key head),
/// dv [B, Hv, L, Dv], all f32, and the GateGrads wanted. state_in: the state the forward
/// started from (empty: zero). Bitwise the same for any thread count.
template <class Q, class K, class V, class G>
void gated_attention_backward(const GatedSpec& spec, const View<Q>& q, const View<K>& k,
                              const View<V>& v, const GateInputs& gates, const View<G>& d_o,
                              const View<float>& dq, const View<float>& dk, const View<float>& dv,
                              const GateGrads& grads = {}, const View<const float>& state_in = {},
                              const View<const float>& d_state_out = {},
                              const Options& options = {}) {
  const detail::GatedShape s = detail::check_gated(spec, q, k, v, gates, dv, nullptr, options);
  detail::check_gated_grads(spec, s, q, k, v, d_o, dq, dk, dv, grads, state_in, d_state_out);
  const float scale = options.scale.value_or(1.f / std::sqrt(float(s.key_dim)));
  using Engine = detail::GatedBackward<Q, K, V, G>;
  const Index items = s.batch * s.k_heads;
  if (items == 0) return;
  const int threads = detail::threads_for(options.threads, items);
  detail::Workers<Engine> workers(threads, spec, s, scale, q, k, v, gates, d_o, dq, dk, dv, grads,
                                  state_in, d_state_out);
  detail::for_each_item(workers, items, [&](Engine& mine, Index item) {
    mine.run(item / s.k_heads, item % s.k_heads);
  });
}

}  // namespace attnkit
