// ring_attention(): self-attention over a sequence sharded across the ranks of an MPI
// communicator (context parallelism). Each rank holds the rows of Q, K and V at its shard's
// positions (dist/layout.hpp: Contiguous or Zigzag) and gets the output rows at the same
// positions. The K/V shards travel around the ring -- rank r sends to r + 1 and receives
// from r - 1, non-blocking, while it computes on the shard in hand -- so after P steps every
// rank has met every shard. Each step is one attention() call of the local queries against
// the visiting keys at their true (global) positions (a Remapped mask); the P partial results
// merge() in the order of the shards' ranks, so the output is bitwise the same from run to
// run for a given rank count, and for any thread count.
//
// Works with every mask; Dot or Softcap logits (a score mod that reads positions would see
// gathered indices); NoPosition or a Position that turns rows (Rope, Fope: the local rows
// are turned once at their global positions, in f32, and travel turned); every normalizer
// that merges in one round (Softmax with sinks, Sigmoid with the whole sequence's default
// bias, SoftplusL1 with each row's key count over the whole sequence, ReluPower), and LSSAR
// (SoftplusL1Reweighted) in its two-round form: a first trip around the ring for the LSSA
// row sums, a second for the reweighted parts (kernel/merge_reweighted.hpp). Validation is
// collective: bad input on any rank, or ranks that disagree, make every rank throw the same
// Error before anything is sent. The ring itself is dist/ring_steps.hpp.
#pragma once

#include <mpi.h>

#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/distributed/agreement.hpp"
#include "attnkit/distributed/collective.hpp"
#include "attnkit/distributed/layout.hpp"
#include "attnkit/distributed/ring_steps.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/kernel/merge_reweighted.hpp"
#include "attnkit/normalizer/softplus_l1_reweighted.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/spec.hpp"

namespace attnkit::dist {

/// o (this rank's output rows, [B, Hq, n, Dv]) = attention of this rank's query rows q
/// [B, Hq, n, D] over the keys and values of every rank's shard (k [B, Hkv, n, D], v
/// [B, Hkv, n, Dv] here), n = shard_length(options.layout, options.seq_len, rank, ranks).
/// A rank whose shard is empty (L < 2P under Zigzag, L < P under Contiguous) has no rows to
/// write and returns normally after the ring. Collective over comm. Throws Error on every
/// rank, before any send, when any rank's input is bad or the ranks disagree on anything a
/// rank's call depends on (dist/agreement.hpp: sizes, storage types, the spec's policies,
/// scale, products, length, layout).
template <class Spec, class Q, class K, class V, class O>
void ring_attention(MPI_Comm comm, const Spec& spec, const View<Q>& q, const View<K>& k,
                    const View<V>& v, const View<O>& o, const RingOptions& options) {
  using Score = typename Spec::Score;
  using Normalizer = typename Spec::Normalizer;
  using Position = typename Spec::Position;
  static_assert(!attnkit::detail::reads_positions<Score>(),
                "ring_attention(): the score mod must not read positions (Dot, Softcap; a "
                "Score of yours: kReadsPositions = false): each step runs on the visiting "
                "shard's gathered keys");
  static_assert(
      std::is_same_v<Position, NoPosition> || attnkit::detail::transforms_rows<Position>(),
      "ring_attention(): the Position must turn rows (Rope, Fope) or be NoPosition");
  constexpr bool kTwoRounds = attnkit::detail::has_second_round<Normalizer>::value;
  static_assert(attnkit::detail::passes<Normalizer>() == 1 || kTwoRounds,
                "ring_attention(): this normalizer makes more than one pass and has no "
                "two-round form");
  static_assert(!std::is_const_v<O>, "ring_attention(): the output view must be writable");
  constexpr bool kTurns = attnkit::detail::transforms_rows<Position>();
  using KT = std::conditional_t<kTurns, float, std::remove_const_t<K>>;
  using VT = std::remove_const_t<V>;
  using QT = std::conditional_t<kTurns, float, std::remove_const_t<Q>>;

  const int rank = rank_of(comm), ranks = size_of(comm);
  const Index len = options.seq_len;
  std::vector<Agreed> fields;
  agree_on_qkvo(fields, q, k, v, o);
  const Problem p = ring::validate(comm, "ring_attention()", spec, options, std::move(fields), [&] {
    return make_problem(q, k, v, o, options.attention.with_q_offset(0));
  });
  // This rank's rows, then the ring: at step s the shard of rank (rank - s) mod P is in hand.
  const std::vector<std::vector<Index>> positions = ring::all_positions(options.layout, len, ranks);
  const std::vector<Index>& q_pos = positions[static_cast<std::size_t>(rank)];
  const ring::Rows<QT> qs = ring::local_rows<QT>(q, spec.position, q_pos, len, Role::Query);
  const ring::Rows<KT> k_local = ring::local_rows<KT>(k, spec.position, q_pos, len, Role::Key);
  const ring::Rows<VT> v_local = ring::local_rows<VT>(v, NoPosition{}, q_pos, len, Role::Key);
  std::vector<float> part_out, part_stat;
  std::vector<View<const float>> parts;
  std::vector<const float*> stats;
  if constexpr (kTwoRounds) {
    // Round one: LSSA with the whole sequence's key counts, its parts' row sums merged
    // (and its output: the rows that fall back take it). Round two: the reweighted parts.
    const SoftplusL1 lssa =
        ring::part_normalizer(spec.normalizer.lssa, spec.mask, q_pos, p.batch, p.q_heads, len);
    ring::pass(comm, spec.score, spec.mask, lssa, qs, k_local, v_local, positions, p, options,
               part_out, part_stat);
    ring::part_views<SoftplusL1>(part_out, part_stat, ranks, p, parts, stats);
    std::vector<float> fallback(
        static_cast<std::size_t>(p.batch * p.q_heads * p.q_len * p.value_dim));
    std::vector<float> sums(static_cast<std::size_t>(p.batch * p.q_heads * p.q_len));
    const auto lssa_out = bhsd(fallback.data(), p.batch, p.q_heads, p.q_len, p.value_dim);
    merge(lssa, parts, stats, lssa_out, sums);
    SoftplusL1Reweighted whole = spec.normalizer;
    whole.lssa = lssa;
    const SoftplusL1Reweighted::SecondRound second = whole.second_round(std::move(sums));
    ring::pass(comm, spec.score, spec.mask, second, qs, k_local, v_local, positions, p, options,
               part_out, part_stat);
    parts.clear();
    stats.clear();
    ring::part_views<SoftplusL1Reweighted::SecondRound>(part_out, part_stat, ranks, p, parts,
                                                        stats);
    const double merging = MPI_Wtime();
    merge_reweighted(second, parts, stats, View<const float>(lssa_out), o, options.attention.lse);
    if (options.times != nullptr) options.times->merge += MPI_Wtime() - merging;
  } else {
    const auto normalizer =
        ring::part_normalizer(spec.normalizer, spec.mask, q_pos, p.batch, p.q_heads, len);
    ring::pass(comm, spec.score, spec.mask, normalizer, qs, k_local, v_local, positions, p, options,
               part_out, part_stat);
    ring::part_views<Normalizer>(part_out, part_stat, ranks, p, parts, stats);
    const double merging = MPI_Wtime();
    merge(spec.normalizer, parts, stats, o, options.attention.lse);
    if (options.times != nullptr) options.times->merge += MPI_Wtime() - merging;
  }
}

}  // namespace attnkit::dist
