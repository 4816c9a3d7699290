// attention_backward(): the gradients of attention() -- dQ, dK, dV and the normalizer's
// per-head parameter -- for every spec whose policies have backward faces
// (detail/backward_traits.hpp). FlashAttention-2's scheme on the forward's tiles
// (kernel/backward_tiles.hpp): each logit tile is recomputed from Q, K and the forward's row
// statistic, so no [Lq, Lk] buffer exists. Work is split by KV head (batch, hk): one thread
// owns every gradient of an item, so results are bitwise identical for any thread count.
#pragma once

#include <type_traits>
#include <vector>

#include "attnkit/detail/backward_checks.hpp"
#include "attnkit/detail/pack.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/row_norms.hpp"
#include "attnkit/kernel/backward_tiles.hpp"
#include "attnkit/options.hpp"
#include "attnkit/param_grads.hpp"
#include "attnkit/position/apply.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {
namespace detail {

// delta[row] = D_i = dO_i . O_i (f32 rows, summed in double), for every row of the call.
template <class O, class GO>
std::vector<float> row_deltas(const Problem& p, const View<O>& o, const View<GO>& d_o) {
  std::vector<float> delta(static_cast<std::size_t>(p.batch * p.q_heads * p.q_len));
  parallel_for(thread_count(p.threads), p.batch * p.q_heads, 1, [&](Index bh) {
    const Index b = bh / p.q_heads, h = bh % p.q_heads;
    for (Index r = 0; r < p.q_len; ++r) {
      const O* x = o.row(b, h, r);
      const GO* g = d_o.row(b, h, r);
      double sum = 0.0;
      for (Index c = 0; c < p.value_dim; ++c) sum += double(float(x[c])) * double(float(g[c]));
      delta[static_cast<std::size_t>(bh * p.q_len + r)] = static_cast<float>(sum);
    }
  });
  return delta;
}

template <class Spec, class Q, class K, class V, class GO, class GQ, class GK, class GV, class KR>
void run_backward(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                  const View<V>& v, const View<GO>& d_o, const View<GQ>& dq, const View<GK>& dk,
                  const View<GV>& dv, const View<KR>& k_raw, const float* stat, const float* delta,
                  const ParamGrads& grads) {
  using Tiles = BackwardTiles<Spec, Q, K, V, GO, GQ, GK, GV, KR>;
  const Index items = p.batch * p.kv_heads;
  const int threads = threads_for(p.threads, items);
  std::vector<float> key_scale;
  if constexpr (cosine_logits<typename Spec::Normalizer>()) key_scale = inverse_row_norms(k);
  // [B, Hq] per-head parameter gradients of each batch, summed over batches in order below;
  // [items, count] the Position's parameter gradients of each item, summed in item order.
  std::vector<double> head_grads(static_cast<std::size_t>(p.batch * p.q_heads), 0.0);
  const Index count = grads.position.empty() ? 0 : position_param_count(spec.position);
  std::vector<double> position_grads(static_cast<std::size_t>(items * count), 0.0);
  // per thread, allocated here (std::bad_alloc reaches the caller)
  Workers<Tiles> tiles(threads, spec, p, q, k, v, d_o, dq, dk, dv, k_raw, stat, delta,
                       key_scale.data());
  for_each_item(tiles, items, [&](Tiles& worker, Index item) {
    const Index b = item / p.kv_heads;
    worker.run(b, item % p.kv_heads, head_grads.data() + b * p.q_heads,
               count > 0 ? position_grads.data() + item * count : nullptr);
  });
  if (!grads.normalizer.empty())
    for (Index h = 0; h < p.q_heads; ++h) {
      double sum = 0.0;
      for (Index b = 0; b < p.batch; ++b)
        sum += head_grads[static_cast<std::size_t>(b * p.q_heads + h)];
      grads.normalizer.data()[h] = static_cast<float>(sum);
    }
  for (Index c = 0; c < count; ++c) {
    double sum = 0.0;
    for (Index item = 0; item < items; ++item)
      sum += position_grads[static_cast<std::size_t>(item * count + c)];
    grads.position.data()[c] = static_cast<float>(sum);
  }
}

}  // namespace detail

/// Writes dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D] and dv [B, Hkv, Lk, Dv], the gradients of a
/// loss L through o = attention(spec, q, k, v, o, options) given d_o = dL/do, and, when
/// grads.normalizer is set, dL/d(the normalizer's per-head parameter) [Hq] (Softmax's sinks,
/// Sigmoid's or ReluPower's bias), and when grads.position is set, dL/d(the Position's trained
/// parameters) (Fope's coefficients). `o` and options.lse are the forward call's output and row
/// statistic (required when the normalizer has one: Options::with_lse on both calls); the
/// scale, q_offset and threads options must be the forward's. GQA: dk and dv sum over the
/// query heads of each group. Masked pairs get exactly zero gradient: whatever masked keys
/// and values hold never reaches a gradient. Gradients are accumulated in f32 and stored in
/// their views' storage (float, bfloat16, half); they must not share memory with any input
/// or with each other. Throws Error before writing anything on bad input; bitwise identical
/// for any thread count. A Position that turns rows (Rope) turns the keys once per call.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                        const View<O>& o, const View<GO>& d_o, const View<GQ>& dq,
                        const View<GK>& dk, const View<GV>& dv, const Options& options = {},
                        const ParamGrads& grads = {}) {
  using Position = typename Spec::Position;
  static_assert(!std::is_const_v<GQ> && !std::is_const_v<GK> && !std::is_const_v<GV>,
                "attention_backward(): the gradient views must be writable");
  static_assert(detail::is_storage<Q>() && detail::is_storage<K>() && detail::is_storage<V>() &&
                    detail::is_storage<O>() && detail::is_storage<GO>() &&
                    detail::is_storage<GQ>() && detail::is_storage<GK>() &&
                    detail::is_storage<GV>(),
                "attention_backward(): storage must be float, Eigen::bfloat16 or Eigen::half");
  static_assert(detail::check_backward_spec<Spec>());  // each face says what is missing
  const Problem p =
      detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, grads);
  const std::vector<float> delta = detail::row_deltas(p, o, d_o);
  // Strided f32 inputs are read from contiguous copies (detail::tile_rows, pack.hpp).
  std::vector<float> q_copy, v_copy, d_o_copy;
  const View<Q> queries = detail::tile_rows(q, p, false, q_copy);
  const View<V> values = detail::tile_rows(v, p, false, v_copy);
  const View<GO> d_out = detail::tile_rows(d_o, p, false, d_o_copy);
  const auto run = [&](const auto& keys) {
    detail::run_backward(spec, p, queries, keys, values, d_out, dq, dk, dv, k, options.lse.data(),
                         delta.data(), grads);
  };
  if constexpr (detail::transforms_rows<Position>()) {
    const std::vector<float> keys =
        detail::transformed_keys(spec.position, k, detail::thread_count(p.threads));
    run(bhsd(keys.data(), p.batch, p.kv_heads, p.kv_len, p.head_dim));
  } else {
    std::vector<float> k_copy;
    run(detail::tile_rows(k, p, false, k_copy));
  }
}

}  // namespace attnkit
