// linear_attention_backward(): the gradients of linear_attention() -- dq, dk, dv and the
// gradient of the initial state -- in the chunk structure of the forward, with the state
// recurrence run in reverse for the gradients (linear_backward_heads.hpp has the math).
// Checks every input once, then runs (batch, KV head) items over OpenMP threads, each
// with its own LinearBackwardHeads engine.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attnkit/core/error.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_attention.hpp"
#include "attnkit/linear/linear_backward_heads.hpp"
#include "attnkit/linear/linear_spec.hpp"
#include "attnkit/linear/linear_state.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {
namespace detail {

/// The Problem of a backward call from its views and options, as linear_attention()
/// checks them (d_o standing for o), then dq, dk, dv shaped as q, k, v, with distinct rows,
/// disjoint from every input view and from each other.
template <class Map, class Q, class K, class V, class GO, class GQ, class GK, class GV>
Problem make_linear_backward_problem(const LinearSpec<Map>& spec, const View<Q>& q,
                                     const View<K>& k, const View<V>& v, const View<GO>& d_o,
                                     const View<GQ>& dq, const View<GK>& dk, const View<GV>& dv,
                                     const Options& options) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  check_view(d_o, "d_o");
  require_qkv_dims(q, k, v);
  require_out_dims(d_o, q, v, "d_o");
  check_gradients(q, k, v, dq, dk, dv, {{byte_span(d_o), "d_o"}});
  const Problem p = problem_of(q, k, v, options.scale.value_or(1.f), options.q_offset.value_or(0),
                               options.threads, options.products);
  validate_linear(spec, p, options, nullptr);
  return p;
}

/// A state argument of the backward: sized as linear_attention() sizes its state.
template <class Map>
void check_linear_state(const LinearSpec<Map>& spec, const Problem& p, const LinearState& s,
                        const char* name) {
  require_dim(s.batch(), p.batch, cat(name, ".batch"), "q.batch");
  require_dim(s.heads(), p.q_heads, cat(name, ".heads"), "q.heads");
  require_dim(s.features(), feature_count(spec.map, p.head_dim), cat(name, ".features"),
              "the feature map's count for q.dim");
  require_dim(s.value_dim(), p.value_dim, cat(name, ".value_dim"), "v.dim");
}

}  // namespace detail

/// Writes dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D] and dv [B, Hkv, Lk, Dv], the gradients of
/// a loss L through linear_attention(spec, q, k, v, o, state, options) given d_o = dL/do,
/// and, when `d_state_in` is set, dL/d(the state the forward started from) (its S and z
/// parts, in a LinearState's layout). `state_in` is the state the forward call STARTED
/// from: linear_attention() overwrites its state, so keep a copy before the call (nullptr:
/// the empty history). `d_state_out` is dL/d(the state the forward LEFT), when the loss
/// reads it (a later chunk of the sequence: pass that chunk's d_state_in here; nullptr:
/// zero). Every state is sized as make_linear_state() sizes it. The forward's output is
/// not needed: the backward rebuilds what it needs in f32 from q, k, v and state_in. The
/// spec and the scale and threads options must be the forward's; spec.form is free (both
/// forms have these gradients; the chunks are spec.chunk rows). GQA: dk and dv sum over the
/// query heads of each group. Gradients are accumulated in f32 and stored in their views'
/// storage (float, bfloat16, half); they must not share memory with any input or with each
/// other, nor d_state_in with state_in or d_state_out. Throws Error before writing anything
/// on bad input. Work is split by (batch, KV head): one thread computes every gradient of
/// an item (dq of the group's query heads, dk, dv, d_state_in of those heads), in a fixed
/// order, so results are bitwise identical for any thread count.
template <class Map, class Q, class K, class V, class GO, class GQ, class GK, class GV>
void linear_attention_backward(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                               const View<V>& v, const View<GO>& d_o, const View<GQ>& dq,
                               const View<GK>& dk, const View<GV>& dv, const LinearState* state_in,
                               const LinearState* d_state_out, LinearState* d_state_in,
                               const Options& options = {}) {
  static_assert(!std::is_const_v<GQ> && !std::is_const_v<GK> && !std::is_const_v<GV>,
                "linear_attention_backward(): the gradient views must be writable");
  static_assert(detail::is_storage<Q>() && detail::is_storage<K>() && detail::is_storage<V>() &&
                    detail::is_storage<GO>() && detail::is_storage<GQ>() &&
                    detail::is_storage<GK>() && detail::is_storage<GV>(),
                "linear_attention_backward(): storage must be float, Eigen::bfloat16 or "
                "Eigen::half");
  static_assert(detail::has_feature_backward<Map>(),
                "linear_attention_backward(): the feature map has no backward face: an "
                "elementwise map needs `double derivative(double x) const` (f'(x)); a map with "
                "features(dim) needs `template <class T> void backward_row(const T* x, const T* "
                "d_phi, Index dim, T* dx) const` (dx = J_phi(x)^T d_phi)");
  const Problem p = detail::make_linear_backward_problem(spec, q, k, v, d_o, dq, dk, dv, options);
  if (state_in != nullptr) detail::check_linear_state(spec, p, *state_in, "state_in");
  if (d_state_out != nullptr) detail::check_linear_state(spec, p, *d_state_out, "d_state_out");
  if (d_state_in != nullptr) {
    detail::check_linear_state(spec, p, *d_state_in, "d_state_in");
    const detail::ByteSpan mine = detail::state_span(d_state_in);
    detail::require_disjoint(mine, "d_state_in", detail::state_span(state_in), "state_in");
    detail::require_disjoint(mine, "d_state_in", detail::state_span(d_state_out), "d_state_out");
  }
  {  // views into a state's memory (LinearState::head() hands out pointers)
    const detail::ByteSpan views[7] = {
        detail::byte_span(q),  detail::byte_span(k),  detail::byte_span(v), detail::byte_span(d_o),
        detail::byte_span(dq), detail::byte_span(dk), detail::byte_span(dv)};
    const char* names[7] = {"q", "k", "v", "d_o", "dq", "dk", "dv"};
    const LinearState* states[3] = {state_in, d_state_out, d_state_in};
    const char* state_names[3] = {"state_in", "d_state_out", "d_state_in"};
    for (int s = 0; s < 3; ++s)
      for (int i = (s == 2 ? 0 : 4); i < 7; ++i)
        detail::require_disjoint(views[i], names[i], detail::state_span(states[s]), state_names[s]);
  }
  const float scale = options.scale.value_or(1.f);

  using Heads = detail::LinearBackwardHeads<Map, Q, K, V, GO, GQ, GK, GV>;
  const Index items = p.batch * p.kv_heads;
  if (items == 0) return;
  const int threads = detail::threads_for(p.threads, items);
  const detail::LinearBackwardStates states{state_in, d_state_out, d_state_in};
  // per thread, allocated here (std::bad_alloc reaches the caller)
  detail::Workers<Heads> heads(threads, spec, p, scale, q, k, v, d_o, dq, dk, dv, states);
  detail::for_each_item(heads, items, [&](Heads& mine, Index item) {
    mine.run(item / p.kv_heads, item % p.kv_heads);
  });
}

/// linear_attention_backward() of a call from the empty history whose final state the loss
/// does not read: dq, dk, dv only.
template <class Map, class Q, class K, class V, class GO, class GQ, class GK, class GV>
void linear_attention_backward(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                               const View<V>& v, const View<GO>& d_o, const View<GQ>& dq,
                               const View<GK>& dk, const View<GV>& dv,
                               const Options& options = {}) {
  linear_attention_backward(spec, q, k, v, d_o, dq, dk, dv, nullptr, nullptr, nullptr, options);
}

}  // namespace attnkit
