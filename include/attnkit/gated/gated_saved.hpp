// GatedSaved: what a gated_attention() call keeps for its gated_attention_backward(), so the
// backward does not run the forward a second time (as FLA keeps its chunk states h).
//
// Scalar gates (None, PerHead, PerToken), per value head and chunk c of C rows (the forward's
// chunk, gated_heads.hpp has the products):
//   the state before the chunk S_c [Dk, Dv], P = lower(Q K^T . Gamma) [C, C] and, for the
//   delta rule, KKG = strictly-lower(K K^T . Gamma), T = (I + A)^-1 [C, C], W [C, Dk] and
//   V' [C, Dv]
// that is (Dk Dv / C + C + 2 C + Dk + Dv) floats a token and value head (704 at C 64,
// Dk = Dv = 128: 2.8 KB against the 1.5 KB of its q, k, v in f32). Per-channel gates keep the
// starting state only: their backward runs the recurrence again (gated_backward_columns.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

namespace detail {

/// One value head's saved chunks: chunk c's starting state [Dk, ldv] at state(c), its rows'
/// products from row c * chunk: P, KKG, T [rows, cp], W [rows, ldk], V' [rows, ldv] (the last
/// four for the delta rule only, else null; all null but the first state without products).
struct SavedHead {
  Index chunk = 0, cp = 0, key_dim = 0, ldk = 0, ldv = 0;
  float *states = nullptr, *P = nullptr, *kkg = nullptr, *T = nullptr, *W = nullptr, *Vp = nullptr;
  float* state(Index c) const { return states + c * key_dim * ldv; }
};

/// The sizes of one head's saved chunks, and where each part starts in its floats.
struct SavedSizes {
  Index len = 0, chunk = 1, key_dim = 0, ldk = 0, ldv = 0;
  bool delta = false, products = false;

  // The chunks' starting states: one a chunk, and at least the first (a call of no tokens).
  Index chunks() const { return products ? std::max<Index>((len + chunk - 1) / chunk, 1) : 1; }
  Index cp() const { return simd::round_up(chunk); }
  Index rows() const { return products ? (len + chunk - 1) / chunk * chunk : 0; }
  Index floats() const {
    const Index per_row = cp() + (delta ? 2 * cp() + ldk + ldv : 0);
    return chunks() * key_dim * ldv + rows() * per_row;
  }
  SavedHead carve(float* base) const {
    SavedHead h{chunk, cp(), key_dim, ldk, ldv};
    h.states = base;
    if (!products) return h;
    float* at = base + chunks() * key_dim * ldv;
    const auto take = [&](Index n) { return std::exchange(at, at + rows() * n); };
    h.P = take(cp());
    if (!delta) return h;
    h.kkg = take(cp());
    h.T = take(cp());
    h.W = take(ldk);
    h.Vp = take(ldv);
    return h;
  }
};

struct SavedAccess;

}  // namespace detail

/// What gated_attention(..., saved) keeps for gated_attention_backward(saved, ...): the
/// starting state of every chunk and the chunk's products (scalar gates), or the starting state
/// (per-channel gates). Reused across calls: a call of the same shape keeps its memory.
class GatedSaved {
 public:
  bool empty() const { return data_.empty(); }
  std::size_t bytes() const { return data_.size() * sizeof(float); }

 private:
  friend struct detail::SavedAccess;
  GatedSpec spec_;
  detail::GatedShape shape_{};
  float scale_ = 0;
  detail::SavedSizes sizes_{};
  std::vector<float> data_;
};

namespace detail {

struct SavedAccess {
  // Sizes `saved` for a call (the forward's chunk c rows, l2 and scale as it runs them).
  static void reset(GatedSaved& saved, const GatedSpec& spec, const GatedShape& s, Index c,
                    float scale) {
    saved.spec_ = spec;
    saved.shape_ = s;
    saved.scale_ = scale;
    saved.sizes_ = SavedSizes{s.len,
                              c,
                              s.key_dim,
                              simd::round_up(s.key_dim),
                              simd::round_up(s.value_dim),
                              spec.delta(),
                              spec.gate != GateShape::PerChannel};
    // 15 floats more, so that the heads start 64-byte aligned (simd::stream_copy()).
    saved.data_.resize(std::size_t(s.batch * s.v_heads * saved.sizes_.floats() + 15));
  }
  static SavedHead head(const GatedSaved& saved, Index b, Index h) {
    const Index floats = saved.sizes_.floats();           // a multiple of 16: every head aligned
    auto* base = const_cast<float*>(saved.data_.data());  // the forward's item writes its own
    base += (16 - (reinterpret_cast<std::uintptr_t>(base) / sizeof(float)) % 16) % 16;
    return saved.sizes_.carve(base + (b * saved.shape_.v_heads + h) * floats);
  }
  static SavedHead head(GatedSaved& saved, Index b, Index h) {
    return head(static_cast<const GatedSaved&>(saved), b, h);
  }
  // The backward's call is the forward's: same shape, spec and scale, else an Error naming
  // what differs.
  static void check(const GatedSaved& saved, const GatedSpec& spec, const GatedShape& s,
                    float scale) {
    require(!saved.empty(), "saved", "kept by gated_attention(..., saved)", "empty");
    const GatedShape& f = saved.shape_;
    require_dim(s.batch, f.batch, "q.batch", "saved's batch");
    require_dim(s.k_heads, f.k_heads, "q.heads", "saved's key heads");
    require_dim(s.v_heads, f.v_heads, "v.heads", "saved's value heads");
    require_dim(s.len, f.len, "q.seq", "saved's length");
    require_dim(s.key_dim, f.key_dim, "q.dim", "saved's key dim");
    require_dim(s.value_dim, f.value_dim, "v.dim", "saved's value dim");
    const GatedSpec& g = saved.spec_;
    require(spec.update == g.update && spec.gate == g.gate && spec.head_gates == g.head_gates &&
                spec.l2_normalize == g.l2_normalize && spec.chunk == g.chunk,
            "spec", "the spec saved was kept with (update, gate, head gates, l2, chunk)",
            "another");
    require(scale == saved.scale_, "options.scale", saved.scale_, scale);
  }
};

}  // namespace detail
}  // namespace attnkit
