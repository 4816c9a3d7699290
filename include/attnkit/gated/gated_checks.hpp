// The checks of gated_attention() and its reference, before anything is written: the shapes
// of q, k [B, Hk, L, Dk], v and o [B, Hv, L, Dv] (Hv a multiple of Hk: value head h reads
// key head h / (Hv / Hk), Qwen3-Next's layout), of g, beta and the state [B, Hv, Dk, Dv];
// the values of g (finite, <= 0) and beta (in [0, 1]); no output
// sharing memory with an input; the options gated attention takes (scale, threads).
#pragma once

#include <cmath>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"

namespace attnkit::detail {

/// The sizes of one gated_attention() call.
struct GatedShape {
  Index batch = 0, k_heads = 0, v_heads = 0, len = 0, key_dim = 0, value_dim = 0;
  Index k_head(Index vh) const { return vh / (v_heads / k_heads); }
};

// Every value of a [B, H, L, D] view of f32 satisfies ok(x).
template <class Ok>
bool all_values(const View<const float>& x, Ok ok) {
  for (Index b = 0; b < x.batch; ++b)
    for (Index h = 0; h < x.heads; ++h)
      for (Index s = 0; s < x.seq; ++s)
        for (Index c = 0; c < x.dim; ++c)
          if (!ok(x.row(b, h, s)[c])) return false;
  return true;
}

// An f32 view of exactly [B, H, L, D], checked; or refused when the spec reads none.
inline void check_gate_view(const View<const float>& x, bool read, const GatedShape& s, Index dim,
                            const char* name, const char* when) {
  if (!read) {
    require(x.data == nullptr, name, cat("empty (", when, ")"), "a view");
    return;
  }
  check_view(x, name);
  require(x.data != nullptr || s.batch * s.v_heads * s.len == 0, name, "a view", "empty");
  if (x.data == nullptr) return;  // a call of no tokens reads none
  require_dim(x.batch, s.batch, cat(name, ".batch"), "q.batch");
  require_dim(x.heads, s.v_heads, cat(name, ".heads"), "v.heads");
  require_dim(x.seq, s.len, cat(name, ".seq"), "q.seq");
  require_dim(x.dim, dim, cat(name, ".dim"), dim == 1 ? "1" : "q.dim");
}

template <class Q, class K, class V, class O>
GatedShape check_gated(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                       const GateInputs& gates, const View<O>& o, const View<float>* state,
                       const Options& options) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  check_view(o, "o");
  GatedShape s{q.batch, q.heads, v.heads, q.seq, q.dim, v.dim};
  require_dim(k.batch, q.batch, "k.batch", "q.batch");
  require_dim(k.heads, q.heads, "k.heads", "q.heads");
  require_dim(k.seq, q.seq, "k.seq", "q.seq");
  require_dim(k.dim, q.dim, "k.dim", "q.dim");
  require_dim(v.batch, q.batch, "v.batch", "q.batch");
  require_dim(v.seq, q.seq, "v.seq", "q.seq");
  require(q.heads > 0 && v.heads % q.heads == 0, "v.heads",
          cat("a multiple of q.heads (", q.heads, ")"), v.heads);
  require_dim(o.batch, q.batch, "o.batch", "q.batch");
  require_dim(o.heads, v.heads, "o.heads", "v.heads");
  require_dim(o.seq, q.seq, "o.seq", "q.seq");
  require_dim(o.dim, v.dim, "o.dim", "v.dim");
  require(q.dim > 0 && v.dim > 0, "q.dim and v.dim", "> 0", q.dim > 0 ? v.dim : q.dim);

  check_gate_view(gates.g, spec.reads_gates(), s,
                  spec.gate == GateShape::PerChannel ? s.key_dim : 1, "g",
                  "the spec's gate is None or PerHead");
  check_gate_view(gates.beta, spec.delta(), s, 1, "beta", "an additive update has no beta");
  if (spec.reads_gates())
    require(all_values(gates.g, [](float x) { return std::isfinite(x) && x <= 0.f; }), "g",
            "finite log decays <= 0", "a value > 0, NaN or inf");
  if (spec.delta())
    require(all_values(gates.beta, [](float x) { return x >= 0.f && x <= 1.f; }), "beta",
            "values in [0, 1]", "a value outside [0, 1] or NaN");
  if (spec.gate == GateShape::PerHead) {
    require(Index(spec.head_gates.size()) == s.v_heads, "head_gates",
            cat("one log decay per value head (", s.v_heads, ")"), spec.head_gates.size());
    for (const float g : spec.head_gates)
      require(std::isfinite(g) && g <= 0.f, "head_gates", "finite log decays <= 0", g);
  } else {
    require(spec.head_gates.empty(), "head_gates", "empty (the gate is not PerHead)",
            spec.head_gates.size());
  }
  require(spec.chunk >= 1 && spec.chunk <= GatedSpec::kMaxChunk, "chunk",
          cat("1 to ", GatedSpec::kMaxChunk), spec.chunk);
  require(options.lse.empty(), "lse", "nullptr (gated attention has no row statistic)", "a buffer");
  require(!options.q_offset, "Options.q_offset", "unset (positions are the state's business)",
          options.q_offset.value_or(0));
  require(!options.scale || std::isfinite(*options.scale), "Options.scale", "finite",
          options.scale.value_or(0.f));

  const ByteSpan out = byte_span(o);
  require_disjoint(out, "o", byte_span(q), "q");
  require_disjoint(out, "o", byte_span(k), "k");
  require_disjoint(out, "o", byte_span(v), "v");
  if (gates.g.data != nullptr) require_disjoint(out, "o", byte_span(gates.g), "g");
  if (gates.beta.data != nullptr) require_disjoint(out, "o", byte_span(gates.beta), "beta");
  check_rows_distinct(o, "o");
  if (state == nullptr) return s;
  const View<float>& st = *state;
  check_view(st, "state");
  require_dim(st.batch, s.batch, "state.batch", "q.batch");
  require_dim(st.heads, s.v_heads, "state.heads", "v.heads");
  require_dim(st.seq, s.key_dim, "state.seq (rows: key channels)", "q.dim");
  require_dim(st.dim, s.value_dim, "state.dim", "v.dim");
  check_rows_distinct(st, "state");
  // The state's values are not read here: a pass over them costs as much as a decode step
  // (the state is the kernel's own output; a NaN in it makes that head's outputs NaN).
  const ByteSpan held = byte_span(st);
  require_disjoint(out, "o", held, "state");
  require_disjoint(byte_span(q), "q", held, "state");
  require_disjoint(byte_span(k), "k", held, "state");
  require_disjoint(byte_span(v), "v", held, "state");
  if (gates.g.data != nullptr) require_disjoint(byte_span(gates.g), "g", held, "state");
  if (gates.beta.data != nullptr) require_disjoint(byte_span(gates.beta), "beta", held, "state");
  return s;
}

// An f32 view of exactly [B, H, S, D] (or empty when `optional`), checked and finite when read.
template <class T>
void check_shape(const View<T>& x, bool optional, Index B, Index H, Index S, Index D,
                 const char* name) {
  if (optional && x.data == nullptr) return;
  check_view(x, name);
  require(x.data != nullptr || B * H * S == 0, name, "a view", "empty");
  require_dim(x.batch, B, cat(name, ".batch"), "q.batch");
  require_dim(x.heads, H, cat(name, ".heads"), "its heads");
  require_dim(x.seq, S, cat(name, ".seq"), "its rows");
  require_dim(x.dim, D, cat(name, ".dim"), "its width");
}

/// The checks gated_attention_backward() adds to check_gated() (run with dv as the output):
/// the shapes of d_o, dq, dk, the gate and state gradients and the states; no gradient sharing
/// memory with an input or another gradient.
template <class Q, class K, class V, class G, class GateGradsT>
void check_gated_grads(const GatedSpec& spec, const GatedShape& s, const View<Q>& q,
                       const View<K>& k, const View<V>& v, const View<G>& d_o,
                       const View<float>& dq, const View<float>& dk, const View<float>& dv,
                       const GateGradsT& grads, const View<const float>& state_in,
                       const View<const float>& d_state_out) {
  check_shape(d_o, false, s.batch, s.v_heads, s.len, s.value_dim, "d_o");
  check_shape(dq, false, s.batch, s.k_heads, s.len, s.key_dim, "dq");
  check_shape(dk, false, s.batch, s.k_heads, s.len, s.key_dim, "dk");
  const Index g_dim = spec.gate == GateShape::PerChannel ? s.key_dim : 1;
  require(grads.dg.data == nullptr || spec.reads_gates(), "grads.dg",
          "empty (the spec's gate is None or PerHead)", "a view");
  require(grads.dbeta.data == nullptr || spec.delta(), "grads.dbeta",
          "empty (an additive update has no beta)", "a view");
  check_shape(grads.dg, true, s.batch, s.v_heads, s.len, g_dim, "grads.dg");
  check_shape(grads.dbeta, true, s.batch, s.v_heads, s.len, 1, "grads.dbeta");
  check_shape(grads.d_state_in, true, s.batch, s.v_heads, s.key_dim, s.value_dim,
              "grads.d_state_in");
  check_shape(state_in, true, s.batch, s.v_heads, s.key_dim, s.value_dim, "state_in");
  check_shape(d_state_out, true, s.batch, s.v_heads, s.key_dim, s.value_dim, "d_state_out");
  if (state_in.data != nullptr)
    require(all_values(state_in, [](float x) { return std::isfinite(x); }), "state_in",
            "finite values", "NaN or inf");
  const ByteSpan outs[] = {byte_span(dq),          byte_span(dk),
                           byte_span(dv),          byte_span(grads.dg),
                           byte_span(grads.dbeta), byte_span(grads.d_state_in)};
  const char* names[] = {"dq", "dk", "dv", "grads.dg", "grads.dbeta", "grads.d_state_in"};
  const ByteSpan ins[] = {byte_span(q),   byte_span(k),        byte_span(v),
                          byte_span(d_o), byte_span(state_in), byte_span(d_state_out)};
  const char* in_names[] = {"q", "k", "v", "d_o", "state_in", "d_state_out"};
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) require_disjoint(outs[i], names[i], ins[j], in_names[j]);
    for (int j = i + 1; j < 6; ++j) require_disjoint(outs[i], names[i], outs[j], names[j]);
  }
}

}  // namespace attnkit::detail
