// dist::linear_attention(): causal linear attention over a sequence split across the ranks
// of an MPI communicator in consecutive runs (Layout::Contiguous: rank r holds the r-th run).
// The recurrent state (linear/linear_state.hpp) is handed from rank to rank: rank r waits
// for the state after rank r - 1's last key, runs linear_attention() on its rows from it and
// passes the state after its own last key on. The ranks run in turn, so this spreads the
// sequence's memory, not its time. With runs a multiple of the spec's chunk the chunks are
// the single process's and the result is bitwise the single process's. Validation is
// collective.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <vector>

#include "attnkit/distributed/agreement.hpp"
#include "attnkit/distributed/collective.hpp"
#include "attnkit/distributed/layout.hpp"
#include "attnkit/linear/linear_attention.hpp"

namespace attnkit::dist {

/// o [B, Hq, n, Dv] = causal linear attention of this rank's rows q [B, Hq, n, D] over the
/// keys of every rank up to its own (k [B, Hkv, n, D], v [B, Hkv, n, Dv] here), the ranks
/// holding consecutive runs of a sequence of `len` positions in rank order (n =
/// shard_length(Layout::Contiguous, len, rank, ranks)). `state`: on rank 0, the state before
/// the first key (a prefill's, or zero); on every rank afterwards, the state after its own
/// last key (on the last rank: after the whole sequence). Collective over comm; throws Error
/// on every rank, before any state moves, when any rank's input is bad or the ranks disagree
/// on sizes, storage types, the options or any field of the spec (dist/agreement.hpp).
template <class Map, class Q, class K, class V, class O>
void linear_attention(MPI_Comm comm, const LinearSpec<Map>& spec, const View<Q>& q,
                      const View<K>& k, const View<V>& v, const View<O>& o, LinearState& state,
                      Index len, const Options& options = {}) {
  using attnkit::detail::TagHash;
  const int rank = rank_of(comm), ranks = size_of(comm);
  // dist/agreement.hpp's order. 1: the fields every rank shares, the spec field by field
  // (then whole, by its tag, for any field not named here), before any check that could
  // throw on one rank alone.
  std::vector<Agreed> fields;
  agree_on_qkvo(fields, q, k, v, o);
  agree_on_options(fields, "options", options);
  fields.push_back({"len", len});
  fields.push_back({"state.features", state.features()});
  fields.push_back({"the state's size (floats)", static_cast<long long>(state.floats().size())});
  fields.push_back(
      identity_field("spec.map (the feature map)", attnkit::detail::policy_tag(spec.map)));
  fields.push_back({"spec.causal", spec.causal});
  fields.push_back(identity_field("spec.decay", TagHash{}.add(spec.decay).value()));
  fields.push_back({"spec.normalize", spec.normalize});
  fields.push_back(identity_field("spec.eps", TagHash{}.add(spec.eps).value()));
  fields.push_back({"spec.form", static_cast<long long>(spec.form)});
  fields.push_back({"spec.chunk", spec.chunk});
  fields.push_back(identity_field("the linear spec", spec.tag()));
  require_same_on_all_ranks(comm, "dist::linear_attention()", fields);
  // 2: each rank's own checks, together.
  Problem p;
  validate_together(comm, [&] {
    attnkit::detail::require(spec.causal, "dist::linear_attention(): spec.causal",
                             "true (the state flows from rank to rank in sequence order)", "false");
    const Index n = shard_length(Layout::Contiguous, len, rank, ranks);
    p = make_problem(q, k, v, o, options);
    attnkit::detail::validate_linear(spec, p, options, &state);
    attnkit::detail::require(state.floats().size() <= std::size_t{INT_MAX},
                             "dist::linear_attention(): the state's size",
                             "<= INT_MAX floats (one MPI message)", state.floats().size());
    attnkit::detail::require(
        p.q_len == n, "dist::linear_attention(): q.seq",
        attnkit::detail::cat("this rank's run of ", n, " positions (Contiguous, L = ", len, ")"),
        p.q_len);
  });

  // The state travels whole, in its own layout: one buffer, from head (0, 0) on.
  const auto state_floats = [&state] { return state.head(0, 0); };
  const int count = static_cast<int>(state.floats().size());
  if (rank > 0)
    check_mpi(MPI_Recv(state_floats(), count, MPI_FLOAT, rank - 1, 0, comm, MPI_STATUS_IGNORE),
              "MPI_Recv");
  attnkit::linear_attention(spec, q, k, v, o, state, options);
  if (rank + 1 < ranks)
    check_mpi(MPI_Send(state_floats(), count, MPI_FLOAT, rank + 1, 0, comm), "MPI_Send");
}

}  // namespace attnkit::dist
