// attention_backward(): the gradients of attention() -- dQ, dK, dV and the normalizer's
// per-head parameter -- for every spec whose policies have backward faces
// (kernel/backward/backward_traits.hpp). FlashAttention-2's scheme on the forward's tiles
// (kernel/backward/backward_tiles.hpp): each logit tile is recomputed from Q, K and the forward's
// row statistic, so no [Lq, Lk] buffer exists. Work is split by KV head (batch, hk) -- and, when
// those are few (backward_parts()), each by ranges of query tiles whose partial dK / dV are
// summed in a fixed order: the split follows the shape, not the thread count, so results are
// bitwise identical for any thread count.
#pragma once

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "attnkit/detail/aligned.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/kernel/backward/backward_tiles.hpp"
#include "attnkit/kernel/tiles/kernel_keys.hpp"
#include "attnkit/kernel/tiles/pack.hpp"
#include "attnkit/kernel/tiles/row_norms.hpp"
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

// How many parts the query tiles of each (batch, KV head) item are cut into. One item per
// thread leaves cores idle when B * Hkv is small (an MQA model: Hkv 1), so below
// kBackwardSplitBelow items each item's query tiles are cut into parts -- about
// kBackwardWork units of work in all, at most one a query tile, their partial dK / dV within
// kBackwardPartFloats -- each part's dK / dV summed in part order afterwards. The count comes
// from the shape alone, never from the thread count: the gradients stay bitwise identical for
// any thread count. (Not for 4 items and more: the parts' dK / dV cost a pass over memory
// each, 37% of a 4-head L 1024 backward on one thread, measured on the Xeon.)
inline constexpr Index kBackwardSplitBelow = 4;
inline constexpr Index kBackwardWork = 8;
inline constexpr Index kBackwardPartFloats = Index{1} << 26;  // 256 MiB of partial dK / dV
inline Index backward_parts(const Problem& p, Index d_pad, Index dv_pad) {
  const Index items = p.batch * p.kv_heads,
              tiles = (p.q_len + TileConfig::kBlockQ - 1) / TileConfig::kBlockQ;
  if (items >= kBackwardSplitBelow || tiles <= 1 || items == 0) return 1;
  const Index parts = std::min((kBackwardWork + items - 1) / items, tiles);
  const Index per_part = items * p.kv_len * (d_pad + dv_pad);  // floats of one part per item
  return per_part == 0 ? parts
                       : std::max<Index>(1, std::min(parts, kBackwardPartFloats / per_part));
}

// run_backward() with each item cut into `parts` (backward_parts() > 1): the parts' query
// tiles, then each item's keys from its parts. head_grads [items * parts, group] and
// position_grads [items * parts + items, count] get one slot per unit of work.
template <class Tiles>
void run_backward_parts(Workers<Tiles>& tiles, const Problem& p, Index parts, Index d_pad,
                        Index dv_pad, std::vector<double>& head_grads,
                        std::vector<double>& position_grads, Index count) {
  const Index items = p.batch * p.kv_heads, work = items * parts;
  const Index group = p.q_heads / p.kv_heads,
              q_tiles = (p.q_len + TileConfig::kBlockQ - 1) / TileConfig::kBlockQ;
  const Index nk = p.kv_len * d_pad, nv = p.kv_len * dv_pad;
  // Uninitialized (run_part() zeroes the rows it reaches) and on huge pages from 2 MiB on
  // (AlignedAllocator: fewer page faults on these fresh buffers); std::bad_alloc reaches the
  // caller.
  AlignedAllocator<float> alloc;
  const auto floats = static_cast<std::size_t>(work * (nk + nv));
  const auto release = [&alloc, floats](float* at) { alloc.deallocate(at, floats); };
  const std::unique_ptr<float, decltype(release)> parts_kv(alloc.allocate(floats), release);
  float* const part_k = parts_kv.get();
  float* const part_v = part_k + work * nk;
  std::vector<Index> written(static_cast<std::size_t>(work));
  head_grads.assign(static_cast<std::size_t>(work * group), 0.0);
  position_grads.assign(static_cast<std::size_t>((work + items) * count), 0.0);
  const auto position_slot = [&](Index slot) {
    return count > 0 ? position_grads.data() + slot * count : nullptr;
  };
  // The last parts first: under a causal mask they hold the most work (balance).
  for_each_item(tiles, work, [&](Tiles& worker, Index n) {
    const Index i = work - 1 - n, item = i / parts, s = i % parts;
    written[static_cast<std::size_t>(i)] = worker.run_part(
        item / p.kv_heads, item % p.kv_heads, s * q_tiles / parts, (s + 1) * q_tiles / parts,
        head_grads.data() + i * group, position_slot(i), part_k + i * nk, part_v + i * nv);
  });
  for_each_item(tiles, items, [&](Tiles& worker, Index item) {
    worker.finish_keys(item / p.kv_heads, item % p.kv_heads, part_k + item * parts * nk,
                       part_v + item * parts * nv, parts, written.data() + item * parts,
                       position_slot(work + item));
  });
}

template <class Spec, class Q, class K, class V, class GO, class GQ, class GK, class GV, class KR>
void run_backward(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                  const View<V>& v, const View<GO>& d_o, const View<GQ>& dq, const View<GK>& dk,
                  const View<GV>& dv, const View<KR>& k_raw, const float* stat, const float* delta,
                  const ParamGrads& grads) {
  using Tiles = BackwardTiles<Spec, Q, K, V, GO, GQ, GK, GV, KR>;
  const Index items = p.batch * p.kv_heads, group = p.q_heads / p.kv_heads;
  const Index d_pad = simd::round_up(p.head_dim), dv_pad = simd::round_up(p.value_dim);
  const Index parts = backward_parts(p, d_pad, dv_pad);
  const int threads = threads_for(p.threads, items * parts);
  std::vector<float> key_scale;
  if constexpr (cosine_logits<typename Spec::Normalizer>()) key_scale = inverse_row_norms(k);
  // Per unit of work (an item, or a part of one): the normalizer's per-head parameter
  // gradients [group] and the Position's [count], each summed in a fixed order below.
  std::vector<double> head_grads(static_cast<std::size_t>(p.batch * p.q_heads), 0.0);
  const Index count = grads.position.empty() ? 0 : position_param_count(spec.position);
  std::vector<double> position_grads(static_cast<std::size_t>(items * count), 0.0);
  // per thread, allocated here (std::bad_alloc reaches the caller)
  Workers<Tiles> tiles(threads, spec, p, q, k, v, d_o, dq, dk, dv, k_raw, stat, delta,
                       key_scale.data());
  if (parts > 1) {
    run_backward_parts(tiles, p, parts, d_pad, dv_pad, head_grads, position_grads, count);
  } else {  // one slot an item: head_grads [items, group], position_grads [items, count]
    for_each_item(tiles, items, [&](Tiles& worker, Index item) {
      worker.run(item / p.kv_heads, item % p.kv_heads, head_grads.data() + item * group,
                 count > 0 ? position_grads.data() + item * count : nullptr);
    });
  }
  // Head h's gradient: over the batches, and over its item's parts, in that fixed order.
  if (!grads.normalizer.empty())
    for (Index h = 0; h < p.q_heads; ++h) {
      double sum = 0.0;
      for (Index b = 0; b < p.batch; ++b)
        for (Index s = 0; s < parts; ++s)
          sum += head_grads[static_cast<std::size_t>(
              ((b * p.kv_heads + h / group) * parts + s) * group + h % group)];
      grads.normalizer.data()[h] = static_cast<float>(sum);
    }
  const Index slots = count > 0 ? static_cast<Index>(position_grads.size()) / count : 0;
  for (Index c = 0; c < count; ++c) {
    double sum = 0.0;
    for (Index slot = 0; slot < slots; ++slot)
      sum += position_grads[static_cast<std::size_t>(slot * count + c)];
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
  detail::with_kernel_keys(spec, p, k, false, run);
}

}  // namespace attnkit
