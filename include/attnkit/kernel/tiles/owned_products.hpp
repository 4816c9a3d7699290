// OwnedProducts: the products of a backward tile (kernel/backward/backward_tiles.hpp) for a
// Position that owns them (Tapa: the logit joins an amplitude product q_A . k_A and a phase product
// q_P . k_P over two parts of the head dims). Forward: the two half-width products, the
// amplitude product kept, combine(). Backward: the Position's combine_backward() splits dS
// into the gradients of the two products; each part's dK and dQ come from the rows with the
// other part's columns zeroed, so every product keeps the full, vector-padded width (the
// column split need not fall on a SIMD vector).
#pragma once

#include <algorithm>

#include "attnkit/core/tensor.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

class OwnedProducts {
 public:
  static constexpr Index kBq = TileConfig::kBlockQ, kBk = TileConfig::kBlockK;

  /// Floats of scratch for head dimension d, padded to d_pad.
  static Index floats(Index d_pad) { return 3 * kBk * kBq + (kBq + kBk) + 2 * (kBq + kBk) * d_pad; }

  OwnedProducts() = default;
  /// `scratch`: floats(d_pad) floats, 64-byte aligned.
  OwnedProducts(float* scratch, Index d_pad) : d_pad_(d_pad) {
    amp_ = scratch;
    s2_ = amp_ + kBk * kBq;
    ds2_ = s2_ + kBk * kBq;
    work_ = ds2_ + kBk * kBq;
    q_amp_ = work_ + (kBq + kBk);
    q_phase_ = q_amp_ + kBq * d_pad;
    k_amp_ = q_phase_ + kBq * d_pad;
    k_phase_ = k_amp_ + kBk * d_pad;
  }

  /// The query rows qrow[nq, d_pad] split into their two parts (the other part's columns 0).
  void split_queries(const float* qrow, Index nq, Index a) {
    split(qrow, d_pad_, nq, a, q_amp_, q_phase_);
  }

  /// s[nk, kBq] = the logits of key rows `keys` against qt[d, kBq] (lanes of them).
  template <class Position>
  void logits(const Position& position, const F32Rows& keys, const float* qt, Index nk, Index lanes,
              Index i0, Index k0, Index d, float* s) {
    const Index a = position.amplitude_dims(d);
    gemm::gemm(nk, lanes, a, {keys.data, keys.ld, 1}, qt, kBq, s, kBq, false);
    if (a < d)
      gemm::gemm(nk, lanes, d - a, {keys.data + a, keys.ld, 1}, qt + a * kBq, kBq, s2_, kBq, false);
    std::copy(s, s + nk * kBq, amp_);
    position.combine(s, s2_, nk, lanes, kBq, i0, k0, d, work_);
  }

  /// ds[nk, kBq] (the logits' gradient) -> the amplitude products', ds2() <- the phase
  /// products'; then dk_acc[nk, d_pad] += both parts' dS^T Q.
  template <class Position>
  void backward(const Position& position, float* ds, Index nk, Index nq, Index lanes, Index i0,
                Index k0, Index d, float* dk_acc) {
    position.combine_backward(amp_, s2_, ds, ds2_, nk, lanes, kBq, i0, k0, d, work_);
    gemm::gemm(nk, d_pad_, nq, {ds, kBq, 1}, q_amp_, d_pad_, dk_acc, d_pad_, true);
    gemm::gemm(nk, d_pad_, nq, {ds2_, kBq, 1}, q_phase_, d_pad_, dk_acc, d_pad_, true);
  }

  /// The key rows split as the queries are: f32 rows [nk, d_pad] of each part.
  F32Rows keys_amp(const F32Rows& keys, Index nk, Index a) {
    split(keys.data, keys.ld, nk, a, k_amp_, k_phase_);
    return {k_amp_, d_pad_};
  }
  F32Rows keys_phase() const { return {k_phase_, d_pad_}; }
  float* ds2() const { return ds2_; }

 private:
  void split(const float* rows, Index ld, Index n, Index a, float* amp, float* phase) const {
    for (Index r = 0; r < n; ++r) {
      const float* x = rows + r * ld;
      float* xa = amp + r * d_pad_;
      float* xp = phase + r * d_pad_;
      for (Index c = 0; c < d_pad_; ++c) {
        const bool first = c < a;
        xa[c] = first ? x[c] : 0.f;
        xp[c] = first ? 0.f : x[c];
      }
    }
  }

  Index d_pad_ = 0;
  float* amp_ = nullptr;      // [kBk, kBq]     the amplitude products, kept for the backward
  float* s2_ = nullptr;       // [kBk, kBq]     the phase products
  float* ds2_ = nullptr;      // [kBk, kBq]     their gradient
  float* work_ = nullptr;     // [kBq + kBk]    the Position's per-tile table
  float* q_amp_ = nullptr;    // [kBq, d_pad]   query rows, amplitude part (phase columns 0)
  float* q_phase_ = nullptr;  // [kBq, d_pad]   query rows, phase part
  float* k_amp_ = nullptr;    // [kBk, d_pad]   key rows, amplitude part
  float* k_phase_ = nullptr;  // [kBk, d_pad]   key rows, phase part
};

}  // namespace attnkit::detail
