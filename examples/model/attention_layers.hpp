// Every attention call of the decoder: what attnkit does inside a model.
//
// The model hands over, per layer, the n new tokens' projections as they come out of the
// Q/K/V matmuls: row-major [n, heads * head_dim], which is attnkit's BSHD layout for batch 1,
// so the views wrap the buffers as they are (no copy, no transpose). GQA and MQA need no
// copy either: Hq a multiple of Hkv, each KV head serves its group of query heads.
//
// Per layer and call (prefill: n = prompt length; decode: n = 1):
//   1. cache.append(k, v, rope): the new keys turned by RoPE at positions length .. length +
//      n - 1 and stored, with the values, in the cache's storage (f32, bf16 or q8_0);
//   2. apply_position(rope, q, Role::Query, length - n): the queries turned at the same
//      positions;
//   3. attention(spec, q, cache.keys(), cache.values(), o): causal, bottom-right aligned (the
//      n queries are the last n positions of the cache), the spec without a Position (the
//      cached keys are turned already). attention() itself takes split-KV decode for n <= 16.
// Gemma 3's local layers add SlidingWindow::last(window) to Causal: key j is visible from
// query i when i - window < j <= i (transformers' sliding_window_overlay), which is
// SlidingWindow{window - 1, 0}.
#pragma once

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <memory>
#include <vector>

#include "checkpoint.hpp"

namespace model {

template <class T>  // the cache's storage: float, Eigen::bfloat16 or attnkit::BlockQ8_0
class AttentionLayers {
 public:
  AttentionLayers(const Config& c, attnkit::Index capacity, int threads)
      : c_(c),
        global_rope_(attnkit::RopeTable(c.head_dim, c.rope_base, capacity), c.pairing),
        local_rope_(attnkit::RopeTable(c.head_dim, c.local_rope_base, capacity), c.pairing),
        options_(attnkit::Options{}.with_scale(c.scale).with_threads(threads)) {
    for (attnkit::Index i = 0; i < c.layers; ++i)
      caches_.emplace_back(1, c.kv_heads, capacity, c.head_dim);
  }

  attnkit::Index length() const { return caches_.front().length(); }
  double seconds() const { return seconds_; }  // inside attnkit, since construction
  /// Attention of layer `layer` for n new tokens: q [n, Hq * D] (turned in place), k and v
  /// [n, Hkv * D], o [n, Hq * D].
  void attend(attnkit::Index layer, float* q, const float* k, const float* v, float* o,
              attnkit::Index n) {
    namespace ak = attnkit;
    const auto start = std::chrono::steady_clock::now();
    ak::KvCache<T>& cache = caches_[static_cast<std::size_t>(layer)];
    const bool local = c_.is_local(layer);
    const ak::Rope& rope = local ? local_rope_ : global_rope_;
    cache.append(ak::bshd(k, 1, n, c_.kv_heads, c_.head_dim),
                 ak::bshd(v, 1, n, c_.kv_heads, c_.head_dim), rope);
    const auto q_view = ak::bshd(q, 1, n, c_.heads, c_.head_dim);
    ak::apply_position(rope, q_view, ak::Role::Query, cache.length() - n);
    const auto out = ak::bshd(o, 1, n, c_.heads, c_.head_dim);
    if (local)
      ak::attention(local_spec_, q_view, cache.keys(), cache.values(), out, options_);
    else
      ak::attention(global_spec_, q_view, cache.keys(), cache.values(), out, options_);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  Config c_;
  attnkit::Rope global_rope_, local_rope_;
  decltype(attnkit::make_spec(attnkit::Causal{})) global_spec_ =
      attnkit::make_spec(attnkit::Causal{});
  decltype(attnkit::make_spec(attnkit::Causal{} & attnkit::SlidingWindow{0, 0})) local_spec_ =
      attnkit::make_spec(attnkit::Causal{} &
                         attnkit::SlidingWindow::last(std::max<attnkit::Index>(c_.window, 1)));
  attnkit::Options options_;
  std::vector<attnkit::KvCache<T>> caches_;
  double seconds_ = 0;
};

}  // namespace model
