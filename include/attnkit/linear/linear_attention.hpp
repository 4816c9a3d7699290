// linear_attention(): O(L) attention through a feature map and a carried state (see
// linear_spec.hpp for the math). Checks every input once, then runs (batch, query head)
// items over OpenMP threads, each with its own LinearHeads engine (linear_heads.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "attnkit/core/error.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/linear/feature_map.hpp"
#include "attnkit/linear/linear_heads.hpp"
#include "attnkit/linear/linear_spec.hpp"
#include "attnkit/linear/linear_state.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {
namespace detail {

// The bytes of a state (empty for none), for the aliasing checks.
inline ByteSpan state_span(const LinearState* s) {
  if (s == nullptr) return {};
  const auto begin = reinterpret_cast<std::uintptr_t>(s->floats().data());
  return {begin, begin + s->floats().size() * sizeof(float)};
}

// The checks linear_attention() adds to make_problem()'s; the state's when one is given.
template <class Map>
void validate_linear(const LinearSpec<Map>& spec, const Problem& p, const Options& options,
                     const LinearState* state) {
  require(options.lse.empty(), "lse", "nullptr (linear attention has no row statistic)",
          "a buffer");
  require(!options.q_offset, "Options.q_offset",
          "unset (queries and keys of a linear_attention() call are the same positions)",
          options.q_offset.value_or(0));
  if (spec.causal) require_dim(p.kv_len, p.q_len, "k.seq", "q.seq: causal linear attention");
  require(spec.decay.empty() || Index(spec.decay.size()) == p.q_heads, "decay",
          detail::cat("empty or one gamma per query head (", p.q_heads, ")"), spec.decay.size());
  for (const float g : spec.decay) require(g >= 0.f && g <= 1.f, "decay", "gammas in [0, 1]", g);
  require(std::isfinite(spec.eps) && spec.eps >= 0.f, "eps", "finite and >= 0", spec.eps);
  require(spec.chunk >= 1 && spec.chunk <= LinearSpec<Map>::kMaxChunk, "chunk",
          detail::cat("1 to ", LinearSpec<Map>::kMaxChunk), spec.chunk);
  if (state == nullptr) return;
  require_dim(state->batch(), p.batch, "state.batch", "q.batch");
  require_dim(state->heads(), p.q_heads, "state.heads", "q.heads");
  require_dim(state->features(), feature_count(spec.map, p.head_dim), "state.features",
              "the feature map's count for q.dim");
  require_dim(state->value_dim(), p.value_dim, "state.value_dim", "v.dim");
}

}  // namespace detail

/// The state linear_attention(spec, q, k, v, o, state) expects: zero, for q's batch and
/// heads, the feature map's feature count for q.dim, and v.dim.
template <class Map, class Q, class V>
LinearState make_linear_state(const LinearSpec<Map>& spec, const View<Q>& q, const View<V>& v) {
  return LinearState(q.batch, q.heads, detail::feature_count(spec.map, q.dim), v.dim);
}

/// o[B, Hq, Lq, Dv] = linear attention of q[B, Hq, Lq, D] over k[B, Hkv, Lk, D],
/// v[B, Hkv, Lk, Dv] (GQA: Hq a multiple of Hkv; causal: Lq == Lk), starting from `state`
/// and leaving in it the state after the last key. Options: scale (default 1, applied to q
/// before the feature map) and threads; q_offset and lse are refused. Throws Error before
/// writing anything (output or state) on bad input.
template <class Map, class Q, class K, class V, class O>
void linear_attention(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                      const View<V>& v, const View<O>& o, LinearState& state,
                      const Options& options = {}) {
  static_assert(!std::is_const_v<O>, "linear_attention(): the output view must be writable");
  static_assert(detail::is_storage<Q>() && detail::is_storage<K>() && detail::is_storage<V>() &&
                    detail::is_storage<O>(),
                "linear_attention(): storage must be float, Eigen::bfloat16 or Eigen::half");
  const Problem p = make_problem(q, k, v, o, options);
  detail::validate_linear(spec, p, options, &state);
  // The state is read and written: no view may share its memory (an output inside it would
  // overwrite the state other heads still read; an input would be read after it changed).
  const detail::ByteSpan state_bytes = detail::state_span(&state);
  detail::require_disjoint(detail::byte_span(o), "o", state_bytes, "state");
  detail::require_disjoint(detail::byte_span(q), "q", state_bytes, "state");
  detail::require_disjoint(detail::byte_span(k), "k", state_bytes, "state");
  detail::require_disjoint(detail::byte_span(v), "v", state_bytes, "state");
  const float scale = options.scale.value_or(1.f);

  using Heads = detail::LinearHeads<Map, Q, K, V, O>;
  const Index items = p.batch * p.q_heads;
  if (items == 0) return;
  // No key in the call and none in the history (a zero state): every row sees nothing and
  // gets 0, as attention()'s empty rows do -- not phi(q) . 0, which is NaN for a NaN query.
  const std::vector<float>& held = state.floats();
  if (p.kv_len == 0 && std::all_of(held.begin(), held.end(), [](float x) { return x == 0.f; })) {
    for (Index b = 0; b < p.batch; ++b)
      for (Index h = 0; h < p.q_heads; ++h)
        for (Index i = 0; i < p.q_len; ++i)
          std::fill(o.row(b, h, i), o.row(b, h, i) + p.value_dim, O(0.f));
    return;
  }
  const int threads = detail::threads_for(p.threads, items);
  // Scratch for every thread is allocated here, so std::bad_alloc reaches the caller.
  detail::Workers<Heads> heads(threads, spec, p, scale, q, k, v, o, state);
  const auto run_item = [&](Heads& mine, Index item) {
    mine.run(item / p.q_heads, item % p.q_heads);
  };
  detail::for_each_item(heads, items, run_item);
}

/// linear_attention() from the empty history, the final state dropped.
template <class Map, class Q, class K, class V, class O>
void linear_attention(const LinearSpec<Map>& spec, const View<Q>& q, const View<K>& k,
                      const View<V>& v, const View<O>& o, const Options& options = {}) {
  LinearState state = make_linear_state(spec, q, v);
  linear_attention(spec, q, k, v, o, state, options);
}

}  // namespace attnkit
