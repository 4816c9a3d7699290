// sharded_decode(): decode against a KV cache split across the ranks of an MPI communicator,
// each rank holding a run of consecutive key positions (rank 0 the first run, then rank 1's,
// and so on: a context too long for one machine's memory). One step is the local attention()
// of the (replicated) query rows against this rank's keys at their true positions, then one
// all-gather of the ranks' (output, row statistic) pairs, merged on every rank in rank order:
// every rank gets the whole result, bitwise the same on every rank and from run to run.
//
// The same specs as ring_attention() (dist/ring_attention.hpp): every mask, Dot or Softcap,
// NoPosition (turn the queries with apply_position() and append rotated keys, as a KvCache
// does), every normalizer that merges in one round. Validation is collective.
#pragma once

#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/distributed/agreement.hpp"
#include "attnkit/distributed/collective.hpp"
#include "attnkit/distributed/ring_steps.hpp"  // part_normalizer, the spec limits
#include "attnkit/kernel/attention.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/spec.hpp"

namespace attnkit::dist {

struct ShardedDecodeOptions {
  Index kv_len = -1;      // keys of the whole cache, over all ranks (required)
  Index key_offset = -1;  // position of this rank's first key (required)
  // Per rank: scale, threads, q_offset (the position of query row 0; default kv_len - q_len)
  // and the row statistic [B, Hq, Lq] of the merged result (lse).
  Options attention{};

  ShardedDecodeOptions with_kv_len(Index n) const {
    return detail::with_field(*this, &ShardedDecodeOptions::kv_len, n);
  }
  ShardedDecodeOptions with_key_offset(Index at) const {
    return detail::with_field(*this, &ShardedDecodeOptions::key_offset, at);
  }
  ShardedDecodeOptions with_attention(const Options& a) const {
    return detail::with_field(*this, &ShardedDecodeOptions::attention, a);
  }
};

/// o [B, Hq, Lq, Dv] on every rank = attention of q [B, Hq, Lq, D] (the same on every rank)
/// over the keys and values of every rank's part (here k [B, Hkv, n, D], v [B, Hkv, n, Dv]
/// at positions key_offset .. key_offset + n - 1). Collective over comm. Throws Error on
/// every rank, before any result is exchanged, when any rank's input is bad, the parts do not
/// tile [0, kv_len) in rank order, or the ranks disagree on anything a rank's part depends on
/// (dist/agreement.hpp: the query rows, head dims, storage types, the spec's policies, scale,
/// products, kv_len, the query offset).
template <class Spec, class Q, class K, class V, class O>
void sharded_decode(MPI_Comm comm, const Spec& spec, const View<Q>& q, const View<K>& k,
                    const View<V>& v, const View<O>& o, const ShardedDecodeOptions& options) {
  using Mask = typename Spec::Mask;
  using Normalizer = typename Spec::Normalizer;
  attnkit::check_index_free_spec<Spec>();  // each part runs on the rank's keys as gathered rows
  static_assert(attnkit::detail::passes<Normalizer>() == 1,
                "sharded_decode(): this normalizer needs two rounds (LSSAR), not supported yet");
  static_assert(!std::is_const_v<O>, "sharded_decode(): the output view must be writable");

  using attnkit::detail::cat;
  using attnkit::detail::require;
  const int ranks = size_of(comm);
  const Index len = options.kv_len, first = options.key_offset;
  // dist/agreement.hpp's order. 1: the fields every rank shares (from the raw arguments; the
  // query offset from agreed ones), before any check that could throw on one rank alone.
  const Index q_offset = options.attention.q_offset.value_or(
      len >= 0 && q.seq >= 0 ? len - q.seq : 0);  // no overflow; bad values fail in step 2
  std::vector<Agreed> fields;
  agree_on_view(fields, "q", q, true);
  agree_on_view(fields, "k", k);
  agree_on_view(fields, "v", v);
  agree_on_view(fields, "o", o, true);
  agree_on_spec(fields, spec);
  agree_on_options(fields, "options.attention", options.attention);
  fields.push_back({"options.kv_len", len});
  fields.push_back({"the query offset", q_offset});
  require_same_on_all_ranks(comm, "sharded_decode()", fields);
  // 2: each rank's own checks, together.
  Problem p;
  validate_together(comm, [&] {
    require(len >= 0, "sharded_decode(): options.kv_len", ">= 0", len);
    require(first >= 0, "sharded_decode(): options.key_offset", ">= 0", first);
    p = make_problem(q, k, v, o, options.attention.with_q_offset(0));
    const Index piece = p.batch * p.q_heads * p.q_len * (p.value_dim + 1);
    require(piece <= INT_MAX, "sharded_decode(): q.batch * q.heads * q.seq * (v.dim + 1)",
            "<= INT_MAX (one rank's result is one MPI message)", piece);
    require(first <= len - p.kv_len, "sharded_decode(): key_offset + k.seq",
            cat("<= kv_len = ", len), first + p.kv_len);
    Problem whole = p;
    whole.kv_len = len;
    whole.q_offset = q_offset;
    validate_policies(spec, whole, options.attention.with_q_offset(q_offset));
  });
  // 3: the parts tile [0, kv_len) in rank order, checked on every rank from the same gather
  // against the agreed kv_len.
  std::vector<long long> runs(2 * static_cast<std::size_t>(ranks));
  const long long mine[2] = {first, p.kv_len};
  check_mpi(MPI_Allgather(mine, 2, MPI_LONG_LONG, runs.data(), 2, MPI_LONG_LONG, comm),
            "MPI_Allgather");
  long long next = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::size_t at = 2 * static_cast<std::size_t>(r);
    require(runs[at] == next, cat("sharded_decode(): rank ", r, "'s key_offset"),
            cat(next, " (the parts tile [0, kv_len) in rank order)"), runs[at]);
    next += runs[at + 1];
  }
  require(next == len, "sharded_decode(): the ranks' keys in all", cat("kv_len = ", len), next);

  // This rank's part: the queries at their positions, the keys at theirs.
  std::vector<Index> q_pos(static_cast<std::size_t>(p.q_len)),
      k_pos(static_cast<std::size_t>(p.kv_len));
  for (Index i = 0; i < p.q_len; ++i) q_pos[static_cast<std::size_t>(i)] = q_offset + i;
  for (Index j = 0; j < p.kv_len; ++j) k_pos[static_cast<std::size_t>(j)] = first + j;
  const auto normalizer =
      ring::part_normalizer(spec.normalizer, spec.mask, q_pos, p.batch, p.q_heads, len);
  constexpr bool kStat = attnkit::detail::row_stat_kind<Normalizer>() != RowStat::None;
  const Index rows = p.batch * p.q_heads * p.q_len;
  const auto part_spec = AttentionSpec<typename Spec::Score, Remapped<Mask>,
                                       std::decay_t<decltype(normalizer)>, NoPosition>{
      spec.score, remap(spec.mask, q_pos.data(), k_pos.data(), p.kv_len), normalizer, NoPosition{}};
  // One buffer per rank: the output rows, then the row statistic (gathered together).
  const Index piece = rows * p.value_dim + (kStat ? rows : 0);
  std::vector<float> local(static_cast<std::size_t>(piece));
  Options step = options.attention.with_q_offset(0);
  step.lse = kStat ? Span<float>(local.data() + rows * p.value_dim, rows) : Span<float>();
  attention(part_spec, q, k, v, bhsd(local.data(), p.batch, p.q_heads, p.q_len, p.value_dim), step);
  std::vector<float> all(static_cast<std::size_t>(piece * ranks));
  check_mpi(MPI_Allgather(local.data(), static_cast<int>(piece), MPI_FLOAT, all.data(),
                          static_cast<int>(piece), MPI_FLOAT, comm),
            "MPI_Allgather");
  std::vector<View<const float>> parts;
  std::vector<const float*> stats;
  for (int r = 0; r < ranks; ++r) {
    const float* at = all.data() + Index{r} * piece;
    parts.push_back(bhsd(at, p.batch, p.q_heads, p.q_len, p.value_dim));
    if (kStat) stats.push_back(at + rows * p.value_dim);
  }
  merge(spec.normalizer, parts, stats, o, options.attention.lse);
}

}  // namespace attnkit::dist
