// attention(): the tiled ("flash") kernel for every AttentionSpec, and its dispatch. The
// work is split into items (batch, head, query tile), shared by OpenMP threads, each with its
// own AttentionTiles (kernel/tiles/attention_tiles.hpp): no [Lq, Lk] buffer ever exists.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/split_kv.hpp"
#include "attnkit/kernel/tiles/attention_tiles.hpp"
#include "attnkit/kernel/tiles/kernel_keys.hpp"
#include "attnkit/kernel/tiles/pack.hpp"
#include "attnkit/kernel/tiles/tile_plan.hpp"
#include "attnkit/options.hpp"
#include "attnkit/position/apply.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

namespace detail {

// Whether the last query tile of `rows` queries sees more than 5/4 of the keys the middle one
// sees (batch 0, head 0): the query tiles' work grows along the sequence, as under Causal.
template <class Mask>
bool work_grows(const Mask& mask, const Problem& p, Index rows) {
  const auto keys_of = [&](Index q0) {
    const Range q{q0 + p.q_offset, std::min(q0 + rows, p.q_len) + p.q_offset};
    Index keys = 0;
    for_each_key_tile(mask, 0, 0, q, p.kv_len, TileConfig::kBlockK,
                      [&](Range kv, TileKind) { keys += kv.end - kv.begin; });
    return keys;
  };
  const Index q_tiles = (p.q_len + rows - 1) / rows;
  if (q_tiles == 0) return false;
  const Index last = keys_of((q_tiles - 1) * rows), middle = keys_of(q_tiles / 2 * rows);
  return last - middle > middle / 4;
}

// The tiled kernel on validated inputs: items (batch, head, query tile) over the threads.
template <class Spec, class Q, class K, class V, class O>
void run_tiles(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
               const View<V>& v, const View<O>& o, float* lse) {
  using Tiles = AttentionTiles<Spec, Q, K, V, O>;
  // A mask with gathered columns: gathered or not, 64 or 16 queries a tile (tile_plan.hpp).
  TilePlan plan;
  if constexpr (Tiles::kColumns) plan = plan_tiles(spec.mask, p);
  const Index rows = plan.rows;
  const Index q_tiles = (p.q_len + rows - 1) / rows;
  const Index heads = p.batch * p.q_heads;
  const Index items = q_tiles * heads;
  const int threads = threads_for(p.threads, items);

  // Items go head by head, so consecutive query tiles reuse the same K and V from cache
  // (+20% at H=8, L=4096 on one thread against a query-tile-major order). Within a head the
  // last query tile runs first where the tiles' work grows along the queries (causal: the
  // last is the longest, and the lightest tiles come last, which balances the dynamic
  // schedule). Where it does not (a sliding window), the first runs first: each tile's new K
  // and V rows then lie past those the tile before read, where the hardware prefetchers
  // look (on Zen 3 at L 16384, one thread: a causal window of 64 keys about 2% faster, of
  // 512 unchanged; within 1% on two threads, whose consecutive tiles go to different cores).
  const bool from_last = work_grows(spec.mask, p, rows);
  const auto run_item = [&](Tiles& tiles, Index item) {
    const Index qt = from_last ? q_tiles - 1 - item % q_tiles : item % q_tiles;
    const Index bh = item / q_tiles;
    const Index q0 = qt * rows;
    tiles.run(bh / p.q_heads, bh % p.q_heads, q0, std::min(rows, p.q_len - q0));
  };

  if (items == 0) return;
  // Every thread's scratch is allocated here, on the calling thread, so that a failed
  // allocation throws to the caller instead of calling std::terminate inside the parallel
  // region. Each thread still first-touches (and so places) its own pages.
  // Cosine logits (SoftplusL1): the key norms, once per call.
  std::vector<float> key_scale;
  if constexpr (cosine_logits<typename Spec::Normalizer>()) key_scale = inverse_row_norms(k);
  // bf16 products on vdpbf16ps: K and V packed once for every query tile (pair_kv.hpp).
  PairKv pair_kv;
  if (!owns_product<typename Spec::Position>() && TilePairProducts::wanted(rounds_operands(p)))
    pair_kv = pack_pair_kv(k, v, simd::round_up(p.value_dim), threads);
  Workers<Tiles> tiles(threads, spec, p, q, k, v, o, lse, key_scale.data(), &pair_kv, plan.gather);

  for_each_item(tiles, items, run_item);
}

// Runs the kernel -- split-KV or tiled -- on k, or on k turned once by a row-transforming
// Position (Rope, Fope): each key row turned into an f32 copy [B, Hkv, Lk, D] the tiles read.
template <class Spec, class Q, class K, class V, class O>
void run_with_keys(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                   const View<V>& v, const View<O>& o, const Options& options, bool split) {
  std::vector<float> v_copy;
  const View<V> values = tile_rows(v, p, split, v_copy);
  const auto run = [&](const auto& keys) {
    if constexpr (passes<typename Spec::Normalizer>() == 1) {
      if (split) return run_split_kv(spec, p, q, keys, values, o, options.lse.data());
    }
    run_tiles(spec, p, q, keys, values, o, options.lse.data());
  };
  if constexpr (transforms_rows<typename Spec::Position>())
    if (p.batch * p.q_heads * p.q_len == 0) return;  // no key turned for nothing
  with_kernel_keys(spec, p, k, split, run);
}

}  // namespace detail

/// o[B, Hq, Lq, Dv] = attention of q[B, Hq, Lq, D] over k[B, Hkv, Lk, D], v[B, Hkv, Lk, Dv]
/// under `spec`. Sizes come from the views; options carry scale, q_offset, threads and
/// the optional LSE output [B, Hq, Lq]. Throws Error before writing anything on bad input.
/// `o` and the LSE buffer must not share memory with q, k, v or each other (checked).
/// Policy hooks run inside the parallel region and must not throw. Scratch is allocated
/// before any thread starts: when it cannot be, std::bad_alloc reaches the caller.
/// A Position that transforms rows (Rope, Fope) turns each query row as its tile is packed
/// and every key row once per call, into an f32 copy of K [B, Hkv, Lk, D] that the tiles read.
/// f32 K or V whose rows are not back to back (BSHD with several heads) are read from such a
/// contiguous copy too, from kContiguousCopyQueries queries on (faster tiles).
/// Up to kMaxDecodeQueries query rows run split-KV, as decode() does: up to
/// kDecodeRowsMaxQueries rows with a softmax spec the decode row engine takes
/// (decode_rows_fit(): faster than the tiles at every key count), else (one-pass
/// normalizers) against at least 2 kDecodeChunk keys.
namespace detail {

/// The checks attention() and decode() make of their types, each saying what is missing: one
/// list for both entry points (their copies had drifted: decode() lacked the normalizer's and
/// the TAPA-with-cosine-logits checks).
template <class Spec, class Q, class K, class V, class O>
constexpr bool check_entry_types() {
  using Position = typename Spec::Position;
  static_assert(!std::is_const_v<O>, "attention() / decode(): the output view must be writable");
  static_assert(std::is_same_v<Position, NoPosition> || transforms_rows<Position>() ||
                    owns_product<Position>(),
                "attention() / decode(): a Position policy needs apply(float* row, Index dim, "
                "RowAt) (a q/k row transform such as Rope) or combine() (it owns the product, "
                "as Tapa)");
  static_assert(!(owns_product<Position>() && cosine_logits<typename Spec::Normalizer>()),
                "attention() / decode(): this Position forms the logits itself (TAPA), and "
                "this normalizer needs cosine logits (SoftplusL1): they cannot be combined");
  static_assert(is_storage<Q>() && is_storage<O>(),
                "attention() / decode(): q and o storage must be float, Eigen::bfloat16 or "
                "Eigen::half");
  static_assert(is_kv_storage<K>() && is_kv_storage<V>(),
                "attention() / decode(): k and v storage must be float, Eigen::bfloat16, "
                "Eigen::half, BlockQ8_0 or BlockQ4_0");
  static_assert(check_normalizer<typename Spec::Normalizer>());  // each says why
  return true;
}

}  // namespace detail

template <class Spec, class Q, class K, class V, class O>
void attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
               const View<O>& o, const Options& options = {}) {
  static_assert(detail::check_entry_types<Spec, Q, K, V, O>());
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  // Few queries against many keys (decode): split-KV over key chunks (split_kv.hpp).
  const bool split =
      detail::passes<typename Spec::Normalizer>() == 1 && p.q_len <= kMaxDecodeQueries &&
      ((detail::decode_rows_fit<Spec>() && p.q_len <= detail::kDecodeRowsMaxQueries) ||
       p.kv_len >= 2 * kDecodeChunk);
  detail::run_with_keys(spec, p, q, k, v, o, options, split);
}

}  // namespace attnkit
