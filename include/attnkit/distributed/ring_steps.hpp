// The ring of dist::ring_attention() and its backward: the options, the rows a rank holds
// and sends (Rows, local_rows), the non-blocking transfers (post), the normalizer each step
// runs with (part_normalizer), and pass(): one trip of the K/V shards around the ring, each
// step an attention() of the local queries against the visiting shard's keys at their true
// positions, while the next shard arrives.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/distributed/agreement.hpp"
#include "attnkit/distributed/collective.hpp"
#include "attnkit/distributed/layout.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/sigmoid.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/normalizer/softplus_l1.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/spec.hpp"
#include "attnkit/storage/storage_rows.hpp"

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
    return detail::with_field(*this, &RingOptions::layout, l);
  }
  RingOptions with_seq_len(Index len) const {
    return detail::with_field(*this, &RingOptions::seq_len, len);
  }
  RingOptions with_attention(const Options& a) const {
    return detail::with_field(*this, &RingOptions::attention, a);
  }
  RingOptions with_times(RingTimes* t) const {
    return detail::with_field(*this, &RingOptions::times, t);
  }
};

namespace ring {

// What each step knows of the whole sequence (length len), for the normalizer it runs with
// (KeyPart): it runs as a call of its own, over the local rows, each row's visible keys
// counted over the whole sequence.
template <class Mask>
KeyPart key_part(const Mask& mask, const std::vector<Index>& q_pos, Index batch, Index q_heads,
                 Index len) {
  return KeyPart::own(len, 0, -1, [&mask, &q_pos, batch, q_heads, len] {
    const Index n = static_cast<Index>(q_pos.size());
    return visible_key_counts(remap(mask, q_pos.data(), nullptr, 0), batch, q_heads, n, len, 0);
  });
}

/// The normalizer each step runs with: the spec's normalizer's part() face (KeyPart).
template <class N, class Mask>
decltype(auto) part_normalizer(const N& n, const Mask& mask, const std::vector<Index>& q_pos,
                               Index batch, Index q_heads, Index len) {
  return attnkit::detail::part_normalizer(n, key_part(mask, q_pos, batch, q_heads, len));
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

/// The global positions of every rank's shard, by rank.
inline std::vector<std::vector<Index>> all_positions(Layout layout, Index len, int ranks) {
  std::vector<std::vector<Index>> positions(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    positions[static_cast<std::size_t>(r)] = shard_positions(layout, len, r, ranks);
  return positions;
}

/// The checks of a ring call (`what`: its name), collective, in the order of
/// dist/agreement.hpp: first the ranks' agreement on `fields` (the views' shared sizes and
/// storage, from the caller), the spec's policies, the options, the length and the layout;
/// then, together, this rank's own checks: the layout and length, `local_problem()` (its
/// shapes, as the local call checks them, and the call's own checks), shards of this rank's
/// length, the spec's policies against the whole sequence. Returns this rank's Problem;
/// throws the same Error on every rank.
template <class Spec, class LocalProblem>
Problem validate(MPI_Comm comm, const char* what, const Spec& spec, const RingOptions& options,
                 std::vector<Agreed> fields, LocalProblem&& local_problem) {
  using attnkit::detail::cat;
  using attnkit::detail::require;
  const int rank = rank_of(comm), ranks = size_of(comm);
  const Index len = options.seq_len;
  agree_on_spec(fields, spec);
  agree_on_options(fields, "options.attention", options.attention);
  fields.push_back({"options.seq_len", len});
  fields.push_back({"options.layout", static_cast<long long>(options.layout)});
  require_same_on_all_ranks(comm, what, fields);
  Problem p;
  validate_together(comm, [&] {
    check_layout(options.layout, cat(what, ": options.layout"));
    require(len >= 0, cat(what, ": options.seq_len"), ">= 0", len);
    require(!options.attention.q_offset, cat(what, ": Options.q_offset"),
            "unset (the layout places the rows)", "a value");
    const Index n = shard_length(options.layout, len, rank, ranks);
    p = local_problem();
    require(
        p.q_len == n && p.kv_len == n, cat(what, ": q.seq and k.seq"),
        cat("this rank's shard length ", n, " (", layout_name(options.layout), ", L = ", len, ")"),
        cat(p.q_len, " and ", p.kv_len));
    Problem whole = p;
    whole.q_len = whole.kv_len = len;
    validate_policies(spec, whole, options.attention.with_q_offset(0));
  });
  return p;
}

/// One trip of the K/V shards around the ring: part_out [P, B, Hq, n, Dv] and part_stat
/// [P, B * Hq * n] (empty for a normalizer without statistic) get this rank's queries qs
/// against the keys of rank r at part r. At step s the shard of rank (rank - s) mod P is in
/// hand; the next one arrives (non-blocking) while it is computed on.
template <class Score, class Mask, class N, class QT, class KT, class VT>
void pass(MPI_Comm comm, const Score& score, const Mask& mask, const N& normalizer,
          const Rows<QT>& qs, const Rows<KT>& k_local, const Rows<VT>& v_local,
          const std::vector<std::vector<Index>>& positions, const Problem& p,
          const RingOptions& options, std::vector<float>& part_out, std::vector<float>& part_stat) {
  const int rank = rank_of(comm), ranks = size_of(comm);
  const Index rows = p.batch * p.q_heads * p.q_len;
  const std::vector<Index>& q_pos = positions[static_cast<std::size_t>(rank)];
  part_out.assign(static_cast<std::size_t>(ranks * rows * p.value_dim), 0.f);
  part_stat.assign(static_cast<std::size_t>(
                       attnkit::detail::row_stat_kind<N>() != RowStat::None ? ranks * rows : 0),
                   0.f);
  Rows<KT> k_cur = k_local, k_next;
  Rows<VT> v_cur = v_local, v_next;
  const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
  for (int step = 0; step < ranks; ++step) {
    const int from = (rank - step + ranks) % ranks;
    std::vector<MPI_Request> requests;
    if (step + 1 < ranks) {  // the next shard arrives while this one is computed on
      const int incoming = (from + ranks - 1) % ranks;
      const Index m = static_cast<Index>(positions[static_cast<std::size_t>(incoming)].size());
      k_next = Rows<KT>::sized(k_cur.batch, k_cur.heads, m, k_cur.dim);
      v_next = Rows<VT>::sized(v_cur.batch, v_cur.heads, m, v_cur.dim);
      post(false, k_next.data.data(), k_next.bytes(), prev, 0, comm, requests);
      post(false, v_next.data.data(), v_next.bytes(), prev, 1, comm, requests);
      post(true, k_cur.data.data(), k_cur.bytes(), next, 0, comm, requests);
      post(true, v_cur.data.data(), v_cur.bytes(), next, 1, comm, requests);
    }
    const std::vector<Index>& k_pos = positions[static_cast<std::size_t>(from)];
    const auto part_spec = AttentionSpec<Score, Remapped<Mask>, N, NoPosition>{
        score, remap(mask, q_pos.data(), k_pos.data(), k_cur.seq), normalizer, NoPosition{}};
    Options step_options = options.attention.with_q_offset(0);
    step_options.lse = part_stat.empty() ? Span<float>()
                                         : Span<float>(part_stat.data() + Index{from} * rows, rows);
    const double started = MPI_Wtime();
    attention(part_spec, qs.view(), k_cur.view(), v_cur.view(),
              bhsd(part_out.data() + Index{from} * rows * p.value_dim, p.batch, p.q_heads, p.q_len,
                   p.value_dim),
              step_options);
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
}

/// The P parts of pass() with normalizer N as merge() takes them (a statistic per part when N
/// has one, even for a rank without rows: merge() reads none then).
template <class N>
void part_views(const std::vector<float>& part_out, const std::vector<float>& part_stat, int ranks,
                const Problem& p, std::vector<View<const float>>& parts,
                std::vector<const float*>& stats) {
  const Index rows = p.batch * p.q_heads * p.q_len;
  for (Index r = 0; r < ranks; ++r) {
    parts.push_back(
        bhsd(part_out.data() + r * rows * p.value_dim, p.batch, p.q_heads, p.q_len, p.value_dim));
    if (attnkit::detail::row_stat_kind<N>() != RowStat::None)
      stats.push_back(part_stat.data() + r * rows);
  }
}

}  // namespace ring

}  // namespace attnkit::dist
