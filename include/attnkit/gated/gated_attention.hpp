// gated_attention(): the gated delta rule and gated decay family (gated_spec.hpp for the
// math), chunked or recurrent. Checks every input once (gated_checks.hpp), then runs the
// (batch, value head) items over OpenMP threads, each with its own GatedHeads engine; every
// item writes only its own rows and state, so the thread count changes no bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/gated/gated_checks.hpp"
#include "attnkit/gated/gated_heads.hpp"
#include "attnkit/gated/gated_saved.hpp"
#include "attnkit/gated/gated_spec.hpp"
#include "attnkit/options.hpp"

namespace attnkit {

namespace detail {

template <class Q, class K, class V, class O>
void run_gated(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
               const GateInputs& gates, const View<O>& o, const View<float>& state,
               const Options& options, GatedSaved* saved) {
  static_assert(!std::is_const_v<O>, "gated_attention(): the output view must be writable");
  static_assert(is_storage<Q>() && is_storage<K>() && is_storage<V>() && is_storage<O>() &&
                    !is_block_quantized<Q>() && !is_block_quantized<K>() &&
                    !is_block_quantized<V>() && !is_block_quantized<O>(),
                "gated_attention(): storage must be float, Eigen::bfloat16 or Eigen::half");
  const View<float>* held = state.data != nullptr ? &state : nullptr;
  const GatedShape s = check_gated(spec, q, k, v, gates, o, held, options);
  const float scale = options.scale.value_or(1.f / std::sqrt(float(s.key_dim)));
  // Kept chunks are the chunked form's, whatever the spec's form.
  const bool chunked = saved != nullptr && spec.gate != GateShape::PerChannel;
  const GatedSpec run = chunked ? spec.with_form(LinearForm::Chunked) : spec;
  if (saved != nullptr)
    SavedAccess::reset(*saved, spec, s, std::min(spec.chunk, std::max<Index>(s.len, 1)), scale);
  using Heads = GatedHeads<Q, K, V, O>;
  const Index items = s.batch * s.v_heads;
  if (items == 0) return;
  const int threads = threads_for(options.threads, items);
  // Scratch for every thread is allocated here, so std::bad_alloc reaches the caller.
  Workers<Heads> heads(threads, run, s, scale, q, k, v, gates, o, held, saved);
  for_each_item(heads, items,
                [&](Heads& mine, Index item) { mine.run(item / s.v_heads, item % s.v_heads); });
}

}  // namespace detail

/// o[B, Hv, L, Dv] = gated attention of q, k [B, Hk, L, Dk] and v [B, Hv, L, Dv] (Hv a
/// multiple of Hk) with the gates of `gates`, starting from `state` ([B, Hv, Dk, Dv], f32,
/// any strides) and leaving in it the state after the last token, so a prefill followed by
/// decode steps equals one long call. Storage: f32, bf16 or f16 for q, k, v, o; f32 gates and
/// state; f32 compute. Options: scale (default 1/sqrt(Dk)) and threads. Throws Error before
/// writing anything (output or state) on bad input.
template <class Q, class K, class V, class O>
void gated_attention(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                     const GateInputs& gates, const View<O>& o, const View<float>& state,
                     const Options& options = {}) {
  detail::run_gated(spec, q, k, v, gates, o, state, options, nullptr);
}

/// gated_attention() for training: also keeps in `saved` what gated_attention_backward(saved,
/// ...) reads instead of running the forward again (gated_saved.hpp: the chunks' starting
/// states and products, about 2.8 KB a token and value head at Dk = Dv = 128; per-channel
/// gates keep the starting state only). With scalar gates the chunked form runs, whatever
/// spec.form says.
template <class Q, class K, class V, class O>
void gated_attention(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                     const GateInputs& gates, const View<O>& o, const View<float>& state,
                     GatedSaved& saved, const Options& options = {}) {
  detail::run_gated(spec, q, k, v, gates, o, state, options, &saved);
}

/// gated_attention() from a zero state, the final state dropped.
template <class Q, class K, class V, class O>
void gated_attention(const GatedSpec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                     const GateInputs& gates, const View<O>& o, const Options& options = {}) {
  gated_attention(spec, q, k, v, gates, o, View<float>{}, options);
}

}  // namespace attnkit
