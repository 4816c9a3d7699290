// ring_attention_backward(): the gradients of ring_attention() (dist/ring_attention.hpp)
// with the sequence sharded across the ranks as in the forward. The K/V shards travel the
// ring again, each with the gradient accumulators of its keys (dK, dV): at step s rank r holds
// the shard of rank (r - s) mod P, runs attention_backward() of its own query rows against
// those keys -- with the forward's merged output and row statistic, so that every step's
// weights are the whole sequence's -- adds its contribution to the shard's dK, dV and to its
// own dQ, and passes shard and accumulators on. After P steps each shard's accumulators
// return to their owner. Every sum runs in a fixed order (dQ over the steps, a shard's dK /
// dV over the ranks in ring order), so the gradients are bitwise the same from run to run,
// for a given rank count and any thread count. The K/V of the next step arrive during a
// step's computation; the accumulators move after it (they are complete only then).
//
// The specs of ring_attention() but LSSAR, without trained parameters' gradients (a
// normalizer's sinks or bias, FoPE's coefficients: not yet). With a Position that turns rows
// (Rope), the local rows are turned once at their global positions, the steps run on them,
// and dQ, dK are turned back by the rotation's transpose at the end. Validation is
// collective.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/traits.hpp"
#include "attnkit/distributed/agreement.hpp"
#include "attnkit/distributed/collective.hpp"
#include "attnkit/distributed/layout.hpp"
#include "attnkit/distributed/ring_steps.hpp"
#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/kernel/backward/backward_traits.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/spec.hpp"

namespace attnkit::dist {

namespace ring {

// acc[i] += x[i].
inline void add_to(std::vector<float>& acc, const std::vector<float>& x) {
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
}

// Rows [B, H, n, D] of f32 (dense) into a view of the caller's storage.
template <class G>
void store_rows(const std::vector<float>& rows, const View<G>& out) {
  for (Index b = 0; b < out.batch; ++b)
    for (Index h = 0; h < out.heads; ++h)
      for (Index s = 0; s < out.seq; ++s) {
        const float* src = rows.data() + ((b * out.heads + h) * out.seq + s) * out.dim;
        G* dst = out.row(b, h, s);
        for (Index c = 0; c < out.dim; ++c) dst[c] = static_cast<G>(src[c]);
      }
}

}  // namespace ring

/// dq [B, Hq, n, D], dk [B, Hkv, n, D], dv [B, Hkv, n, Dv] of this rank's shard: the
/// gradients of a loss through o = ring_attention(comm, spec, q, k, v, o, options), given
/// d_o = dL/do (this rank's rows). `o` and options.attention.lse are the forward call's
/// output and row statistic (required when the normalizer has one); the layout, length,
/// scale and threads must be the forward's. Collective over comm; throws Error on every
/// rank before anything is sent when any rank's input is bad or the ranks disagree.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void ring_attention_backward(MPI_Comm comm, const Spec& spec, const View<Q>& q, const View<K>& k,
                             const View<V>& v, const View<O>& o, const View<GO>& d_o,
                             const View<GQ>& dq, const View<GK>& dk, const View<GV>& dv,
                             const RingOptions& options) {
  using Score = typename Spec::Score;
  using Mask = typename Spec::Mask;
  using Normalizer = typename Spec::Normalizer;
  static_assert(!attnkit::detail::reads_positions<Score>(),
                "ring_attention_backward(): the score mod must not read positions (Dot, "
                "Softcap; a Score of yours: kReadsPositions = false)");
  using Position = typename Spec::Position;
  constexpr bool kTurns = attnkit::detail::transforms_rows<Position>();
  static_assert(std::is_same_v<Position, NoPosition> ||
                    (kTurns && attnkit::detail::has_apply_transpose<Position>::value),
                "ring_attention_backward(): the Position must be NoPosition or turn rows with "
                "an apply_transpose() (Rope)");
  static_assert(attnkit::detail::passes<Normalizer>() == 1,
                "ring_attention_backward(): this normalizer needs two rounds (LSSAR)");
  static_assert(!std::is_const_v<GQ> && !std::is_const_v<GK> && !std::is_const_v<GV>,
                "ring_attention_backward(): the gradient views must be writable");
  using KT = std::conditional_t<kTurns, float, std::remove_const_t<K>>;
  using VT = std::remove_const_t<V>;
  using QT = std::conditional_t<kTurns, float, std::remove_const_t<Q>>;
  constexpr bool kStat = attnkit::detail::row_stat_kind<Normalizer>() != RowStat::None;

  const int rank = rank_of(comm), ranks = size_of(comm);
  const Index len = options.seq_len;
  std::vector<Agreed> fields;
  agree_on_qkvo(fields, q, k, v, o);
  agree_on_view(fields, "d_o", d_o);
  agree_on_view(fields, "dq", dq);
  agree_on_view(fields, "dk", dk);
  agree_on_view(fields, "dv", dv);
  const char* what = "ring_attention_backward()";
  const Problem p = ring::validate(comm, what, spec, options, std::move(fields), [&] {
    // A rank without rows reads no statistic (the forward wrote none).
    const Index rows = q.batch * q.heads * q.seq;
    attnkit::detail::require(!kStat || rows == 0 || !options.attention.lse.empty(),
                             "ring_attention_backward(): Options.lse",
                             "the forward's row statistic (this normalizer has one)", "none");
    // The local shapes as attention_backward() checks them (the keys: this rank's shard).
    return attnkit::detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv,
                                                  options.attention.with_q_offset(0), ParamGrads{});
  });
  const std::vector<std::vector<Index>> positions = ring::all_positions(options.layout, len, ranks);
  const std::vector<Index>& q_pos = positions[static_cast<std::size_t>(rank)];
  const auto normalizer =
      ring::part_normalizer(spec.normalizer, spec.mask, q_pos, p.batch, p.q_heads, len);
  const Index n = p.q_len, hkv = p.kv_heads, d = p.head_dim, e = p.value_dim;
  const auto sized = [](Index count) {
    return std::vector<float>(static_cast<std::size_t>(count));
  };

  // The shard in hand, its accumulators, and the next shard's.
  const ring::Rows<QT> qs = ring::local_rows<QT>(q, spec.position, q_pos, len, Role::Query);
  ring::Rows<KT> k_cur = ring::local_rows<KT>(k, spec.position, q_pos, len, Role::Key), k_next;
  ring::Rows<VT> v_cur = ring::local_rows<VT>(v, NoPosition{}, q_pos, len, Role::Key), v_next;
  std::vector<float> dk_cur = sized(p.batch * hkv * n * d), dv_cur = sized(p.batch * hkv * n * e);
  std::vector<float> dq_sum = sized(p.batch * p.q_heads * n * d), dq_part = dq_sum;
  std::vector<float> dk_part, dv_part, dk_in, dv_in;
  Options step = options.attention.with_q_offset(0);

  const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
  for (int s = 0; s < ranks; ++s) {
    const int from = (rank - s + ranks) % ranks;
    const Index m = k_cur.seq;  // the visiting shard's rows
    std::vector<MPI_Request> requests;
    if (s + 1 < ranks) {  // the next shard's K/V arrive during this step
      const int incoming = (from + ranks - 1) % ranks;
      const Index mi = static_cast<Index>(positions[static_cast<std::size_t>(incoming)].size());
      k_next = ring::Rows<KT>::sized(p.batch, hkv, mi, d);
      v_next = ring::Rows<VT>::sized(p.batch, hkv, mi, e);
      ring::post(false, k_next.data.data(), k_next.bytes(), prev, 0, comm, requests);
      ring::post(false, v_next.data.data(), v_next.bytes(), prev, 1, comm, requests);
      ring::post(true, k_cur.data.data(), k_cur.bytes(), next, 0, comm, requests);
      ring::post(true, v_cur.data.data(), v_cur.bytes(), next, 1, comm, requests);
    }
    const std::vector<Index>& k_pos = positions[static_cast<std::size_t>(from)];
    const auto part_spec =
        AttentionSpec<Score, Remapped<Mask>, std::decay_t<decltype(normalizer)>, NoPosition>{
            spec.score, remap(spec.mask, q_pos.data(), k_pos.data(), m), normalizer, NoPosition{}};
    dk_part = sized(p.batch * hkv * m * d);
    dv_part = sized(p.batch * hkv * m * e);
    const double started = MPI_Wtime();
    attention_backward(part_spec, qs.view(), k_cur.view(), v_cur.view(), o, d_o,
                       bhsd(dq_part.data(), p.batch, p.q_heads, n, d),
                       bhsd(dk_part.data(), p.batch, hkv, m, d),
                       bhsd(dv_part.data(), p.batch, hkv, m, e), step);
    ring::add_to(dq_sum, dq_part);
    ring::add_to(dk_cur, dk_part);
    ring::add_to(dv_cur, dv_part);
    const double computed = MPI_Wtime();
    if (!requests.empty())
      check_mpi(
          MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall");
    // The accumulators follow their shard: to the next rank, or (after the last step) home.
    const int incoming = (from + ranks - 1) % ranks;
    const Index mi = s + 1 < ranks
                         ? static_cast<Index>(positions[static_cast<std::size_t>(incoming)].size())
                         : n;
    dk_in = sized(p.batch * hkv * mi * d);
    dv_in = sized(p.batch * hkv * mi * e);
    if (ranks > 1) {
      std::vector<MPI_Request> moved;
      ring::post(false, dk_in.data(), dk_in.size() * sizeof(float), prev, 2, comm, moved);
      ring::post(false, dv_in.data(), dv_in.size() * sizeof(float), prev, 3, comm, moved);
      ring::post(true, dk_cur.data(), dk_cur.size() * sizeof(float), next, 2, comm, moved);
      ring::post(true, dv_cur.data(), dv_cur.size() * sizeof(float), next, 3, comm, moved);
      check_mpi(MPI_Waitall(static_cast<int>(moved.size()), moved.data(), MPI_STATUSES_IGNORE),
                "MPI_Waitall");
    } else {
      dk_in = dk_cur;
      dv_in = dv_cur;
    }
    if (options.times != nullptr) {
      options.times->attention += computed - started;
      options.times->waiting += MPI_Wtime() - computed;
    }
    std::swap(dk_cur, dk_in);
    std::swap(dv_cur, dv_in);
    if (s + 1 < ranks) {
      std::swap(k_cur, k_next);
      std::swap(v_cur, v_next);
    }
  }
  // After P steps the accumulators in hand are this rank's own shard's. Turned rows: the
  // gradients of the raw rows are the turned rows' gradients turned back (the transpose).
  if constexpr (kTurns) {
    const auto turn_back = [&](std::vector<float>& rows, Index heads, Role role) {
      for (Index b = 0; b < p.batch; ++b)
        for (Index h = 0; h < heads; ++h)
          for (Index i = 0; i < n; ++i) {
            const Index at = q_pos[static_cast<std::size_t>(i)];
            spec.position.apply_transpose(rows.data() + ((b * heads + h) * n + i) * d, d,
                                          RowAt{b, h, at, len, at, role});
          }
    };
    turn_back(dq_sum, p.q_heads, Role::Query);
    turn_back(dk_cur, hkv, Role::Key);
  }
  ring::store_rows(dq_sum, dq);
  ring::store_rows(dk_cur, dk);
  ring::store_rows(dv_cur, dv);
}

}  // namespace attnkit::dist
