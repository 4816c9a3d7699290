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
// bias, SoftplusL1 with each row's key count over the whole sequence, ReluPower). LSSAR's
// two rounds are not supported yet. Validation is collective: bad input on any rank makes
// every rank throw the same Error before anything is sent.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attnkit/detail/storage_rows.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/dist/collective.hpp"
#include "attnkit/dist/layout.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/sigmoid.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/normalizer/softplus_l1.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/spec.hpp"

namespace attnkit::dist {

/// Where one rank's time in a ring_attention() call went (seconds, MPI_Wtime): the steps'
/// attention, the waits for shards still in flight when a step's attention ended (the
/// communication the computation did not hide), and the final merge.
struct RingTimes {
  double attention = 0, waiting = 0, merge = 0;
};

struct RingOptions {
  Layout layout = Layout::Zigzag;
  Index seq_len = -1;  // L, the whole sequence's length (required)
  // Per rank: scale, threads, and the local rows' row statistic [B, Hq, shard] (lse). The
  // query offset is set by the layout (leave it unset).
  Options attention{};
  RingTimes* times = nullptr;  // when not null: this rank's times, added to it

  RingOptions with_layout(Layout l) const {
    RingOptions o = *this;
    o.layout = l;
    return o;
  }
  RingOptions with_seq_len(Index len) const {
    RingOptions o = *this;
    o.seq_len = len;
    return o;
  }
  RingOptions with_attention(const Options& a) const {
    RingOptions o = *this;
    o.attention = a;
    return o;
  }
  RingOptions with_times(RingTimes* t) const {
    RingOptions o = *this;
    o.times = t;
    return o;
  }
};

namespace ring {

// The normalizer each step runs with: a softmax sink is added once, by the merge; a sigmoid
// with the default bias gets the whole sequence's -log L; SoftplusL1 gets each local row's
// key count over the whole sequence (a shard's own counts would differ). Others as given.
template <class Mask>
Softmax part_normalizer(const Softmax&, const Mask&, const std::vector<Index>&, Index, Index,
                        Index) {
  return Softmax{};
}
template <class Mask>
Sigmoid part_normalizer(const Sigmoid& s, const Mask&, const std::vector<Index>&, Index, Index,
                        Index len) {
  if (!s.head_bias.empty() || s.bias) return s;
  return Sigmoid{len > 0 ? -std::log(static_cast<float>(len)) : 0.f};
}
template <class Mask>
SoftplusL1 part_normalizer(const SoftplusL1& s, const Mask& mask, const std::vector<Index>& q_pos,
                           Index batch, Index q_heads, Index len) {
  if (!s.key_counts.empty()) return s;  // given for the local rows
  const Index n = static_cast<Index>(q_pos.size());
  return SoftplusL1::with_key_counts(
      visible_key_counts(remap(mask, q_pos.data(), nullptr, 0), batch, q_heads, n, len, 0));
}
template <class N, class Mask>
const N& part_normalizer(const N& n, const Mask&, const std::vector<Index>&, Index, Index, Index) {
  return n;
}

// Rows of storage T of one shard, [B, H, n, D] dense (bhsd), as they travel.
template <class T>
struct Rows {
  std::vector<T> data;
  Index batch = 0, heads = 0, seq = 0, dim = 0;
  View<const T> view() const { return bhsd(data.data(), batch, heads, seq, dim); }
  static Rows sized(Index b, Index h, Index s, Index d) {
    const auto n = static_cast<std::size_t>(b * h * s * attnkit::detail::row_elements<T>(d));
    return Rows{std::vector<T>(n), b, h, s, d};
  }
  std::size_t bytes() const { return data.size() * sizeof(T); }
};

// The shard's rows of x in the ring's storage T: copied, or -- with a Position that turns
// rows -- converted to f32 and turned at their global positions.
template <class T, class Position, class X>
Rows<T> local_rows(const View<X>& x, const Position& position, const std::vector<Index>& pos,
                   Index len, Role role) {
  Rows<T> r = Rows<T>::sized(x.batch, x.heads, x.seq, x.dim);
  const Index e = attnkit::detail::row_elements<T>(x.dim);
  for (Index b = 0; b < x.batch; ++b)
    for (Index h = 0; h < x.heads; ++h)
      for (Index s = 0; s < x.seq; ++s) {
        T* dst = r.data.data() + ((b * x.heads + h) * x.seq + s) * e;
        if constexpr (attnkit::detail::transforms_rows<Position>()) {
          attnkit::detail::row_to_f32(x.row(b, h, s), x.dim, dst);
          const Index at = pos[static_cast<std::size_t>(s)];
          position.apply(dst, x.dim, RowAt{b, h, at, len, at, role});
        } else {
          std::copy(x.row(b, h, s), x.row(b, h, s) + e, dst);
        }
      }
  return r;
}

// Posts the non-blocking send or receive of `bytes` at p in pieces that fit an int count.
inline void post(bool send, void* p, std::size_t bytes, int peer, int tag, MPI_Comm comm,
                 std::vector<MPI_Request>& requests) {
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  auto* at = static_cast<unsigned char*>(p);
  for (std::size_t done = 0; done < bytes || (done == 0 && bytes == 0); done += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, bytes - done));
    MPI_Request request;
    check_mpi(send ? MPI_Isend(at + done, count, MPI_BYTE, peer, tag, comm, &request)
                   : MPI_Irecv(at + done, count, MPI_BYTE, peer, tag, comm, &request),
              send ? "MPI_Isend" : "MPI_Irecv");
    requests.push_back(request);
    if (bytes == 0) break;
  }
}

}  // namespace ring

/// o (this rank's output rows, [B, Hq, n, Dv]) = attention of this rank's query rows q
/// [B, Hq, n, D] over the keys and values of every rank's shard (k [B, Hkv, n, D], v
/// [B, Hkv, n, Dv] here), n = shard_length(options.layout, options.seq_len, rank, ranks).
/// Collective over comm. Throws Error on every rank, before any send, when any rank's input
/// is bad or the ranks disagree on sizes, layout, storage or scale.
template <class Spec, class Q, class K, class V, class O>
void ring_attention(MPI_Comm comm, const Spec& spec, const View<Q>& q, const View<K>& k,
                    const View<V>& v, const View<O>& o, const RingOptions& options) {
  using Score = typename Spec::Score;
  using Mask = typename Spec::Mask;
  using Normalizer = typename Spec::Normalizer;
  using Position = typename Spec::Position;
  static_assert(std::is_same_v<Score, Dot> || std::is_same_v<Score, Softcap>,
                "ring_attention(): the score mod must not read positions (Dot or Softcap): "
                "each step runs on the visiting shard's gathered keys");
  static_assert(
      std::is_same_v<Position, NoPosition> || attnkit::detail::transforms_rows<Position>(),
      "ring_attention(): the Position must turn rows (Rope, Fope) or be NoPosition");
  static_assert(attnkit::detail::passes<Normalizer>() == 1,
                "ring_attention(): this normalizer needs two rounds (LSSAR), not supported yet");
  static_assert(!std::is_const_v<O>, "ring_attention(): the output view must be writable");
  constexpr bool kTurns = attnkit::detail::transforms_rows<Position>();
  using KT = std::conditional_t<kTurns, float, std::remove_const_t<K>>;
  using VT = std::remove_const_t<V>;
  using QT = std::conditional_t<kTurns, float, std::remove_const_t<Q>>;

  const int rank = rank_of(comm), ranks = size_of(comm);
  const Index len = options.seq_len;
  Problem p;
  validate_together(comm, [&] {
    attnkit::detail::require(len >= 0, "ring_attention(): options.seq_len", ">= 0", len);
    attnkit::detail::require(!options.attention.q_offset, "ring_attention(): Options.q_offset",
                             "unset (the layout places the rows)", "a value");
    const Index n = shard_length(options.layout, len, rank, ranks);
    p = make_problem(q, k, v, o, options.attention.with_q_offset(0));
    attnkit::detail::require(p.q_len == n && p.kv_len == n, "ring_attention(): q.seq and k.seq",
                             attnkit::detail::cat("this rank's shard length ", n, " (",
                                                  layout_name(options.layout), ", L = ", len, ")"),
                             attnkit::detail::cat(p.q_len, " and ", p.kv_len));
    Problem whole = p;
    whole.q_len = whole.kv_len = len;
    validate_policies(spec, whole, options.attention.with_q_offset(0));
  });
  std::int32_t scale_bits = 0;
  std::memcpy(&scale_bits, &p.scale, sizeof p.scale);
  require_same_on_all_ranks(comm, "ring_attention()",
                            {{"q.batch", p.batch},
                             {"q.heads", p.q_heads},
                             {"k.heads", p.kv_heads},
                             {"q.dim", p.head_dim},
                             {"v.dim", p.value_dim},
                             {"options.seq_len", len},
                             {"options.layout", static_cast<long long>(options.layout)},
                             {"sizeof(K)", static_cast<long long>(sizeof(KT))},
                             {"sizeof(V)", static_cast<long long>(sizeof(VT))},
                             {"the scale (its bits)", scale_bits}});

  // This rank's rows, then the ring: at step s the shard of rank (rank - s) mod P is in hand.
  std::vector<std::vector<Index>> positions(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    positions[static_cast<std::size_t>(r)] = shard_positions(options.layout, len, r, ranks);
  const std::vector<Index>& q_pos = positions[static_cast<std::size_t>(rank)];
  const ring::Rows<QT> qs = ring::local_rows<QT>(q, spec.position, q_pos, len, Role::Query);
  ring::Rows<KT> k_cur = ring::local_rows<KT>(k, spec.position, q_pos, len, Role::Key), k_next;
  ring::Rows<VT> v_cur = ring::local_rows<VT>(v, NoPosition{}, q_pos, len, Role::Key), v_next;
  const auto normalizer =
      ring::part_normalizer(spec.normalizer, spec.mask, q_pos, p.batch, p.q_heads, len);
  constexpr bool kStat = attnkit::detail::row_stat_kind<Normalizer>() != RowStat::None;
  const Index rows = p.batch * p.q_heads * p.q_len;
  std::vector<float> part_out(static_cast<std::size_t>(ranks * rows * p.value_dim));
  std::vector<float> part_stat(kStat ? static_cast<std::size_t>(ranks * rows) : 0);

  // A step's options: the caller's scale and threads, its part's row statistic.
  const auto step_options = [&](std::size_t part) {
    Options step = options.attention.with_q_offset(0);
    step.lse = kStat ? part_stat.data() + part * static_cast<std::size_t>(rows) : nullptr;
    return step;
  };
  const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
  for (int step = 0; step < ranks; ++step) {
    const int from = (rank - step + ranks) % ranks;
    std::vector<MPI_Request> requests;
    if (step + 1 < ranks) {  // the next shard arrives while this one is computed on
      const int incoming = (from + ranks - 1) % ranks;
      const Index m = static_cast<Index>(positions[static_cast<std::size_t>(incoming)].size());
      k_next = ring::Rows<KT>::sized(k_cur.batch, k_cur.heads, m, k_cur.dim);
      v_next = ring::Rows<VT>::sized(v_cur.batch, v_cur.heads, m, v_cur.dim);
      ring::post(false, k_next.data.data(), k_next.bytes(), prev, 0, comm, requests);
      ring::post(false, v_next.data.data(), v_next.bytes(), prev, 1, comm, requests);
      ring::post(true, k_cur.data.data(), k_cur.bytes(), next, 0, comm, requests);
      ring::post(true, v_cur.data.data(), v_cur.bytes(), next, 1, comm, requests);
    }
    const std::vector<Index>& k_pos = positions[static_cast<std::size_t>(from)];
    const auto part_spec =
        AttentionSpec<Score, Remapped<Mask>, std::decay_t<decltype(normalizer)>, NoPosition>{
            spec.score, remap(spec.mask, q_pos.data(), k_pos.data(), k_cur.seq), normalizer,
            NoPosition{}};
    float* out = part_out.data() + Index{from} * rows * p.value_dim;
    const double started = MPI_Wtime();
    attention(part_spec, qs.view(), k_cur.view(), v_cur.view(),
              bhsd(out, p.batch, p.q_heads, p.q_len, p.value_dim),
              step_options(static_cast<std::size_t>(from)));
    const double computed = MPI_Wtime();
    if (!requests.empty())
      check_mpi(
          MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall");
    if (options.times != nullptr) {
      options.times->attention += computed - started;
      options.times->waiting += MPI_Wtime() - computed;
    }
    if (step + 1 < ranks) {
      std::swap(k_cur, k_next);
      std::swap(v_cur, v_next);
    }
  }

  std::vector<View<const float>> parts;
  std::vector<const float*> stats;
  for (Index r = 0; r < ranks; ++r) {
    parts.push_back(bhsd(static_cast<const float*>(part_out.data()) + r * rows * p.value_dim,
                         p.batch, p.q_heads, p.q_len, p.value_dim));
    if (kStat) stats.push_back(part_stat.data() + r * rows);
  }
  const double merging = MPI_Wtime();
  merge(spec.normalizer, parts, stats, o, options.attention.lse);
  if (options.times != nullptr) options.times->merge += MPI_Wtime() - merging;
}

}  // namespace attnkit::dist
