// Validation that every rank of a communicator passes or fails together, before any rank
// sends: a distributed call that lets one rank throw while the others wait in a receive
// hangs. validate_together() runs each rank's own checks and, when any rank's failed, makes
// every rank throw the same Error (the lowest failing rank's message, naming that rank);
// require_same_on_all_ranks() checks that the ranks agree on the call's fields (sizes, and
// identities: storage types, policies, by their tags) and names the first field they do not
// agree on, on every rank. dist/agreement.hpp lists the fields of a call.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"

namespace attnkit::dist {

/// An MPI call's return code as an Error (MPI's default handler aborts first; this serves a
/// communicator whose handler returns).
inline void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("attnkit: ") + call +
              ": MPI error: " + std::string(text, static_cast<std::size_t>(length)));
}

/// This process's rank in comm, and comm's size.
inline int rank_of(MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}

inline int size_of(MPI_Comm comm) {
  int size = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

/// Runs check() -- this rank's validation, which throws Error on bad input -- on every rank
/// of comm, then throws on every rank when it threw on any: Error("attnkit: rank R of P:
/// <R's message>") for the lowest such rank R. Collective: every rank must call it.
template <class Check>
void validate_together(MPI_Comm comm, Check&& check) {
  std::string message;
  try {
    std::forward<Check>(check)();
  } catch (const Error& e) {
    message = e.what();
    if (message.empty()) message = "attnkit: validation failed";
  }
  const int rank = rank_of(comm), size = size_of(comm);
  int mine = message.empty() ? size : rank, lowest = size;
  check_mpi(MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (lowest == size) return;
  int length = rank == lowest ? static_cast<int>(message.size()) : 0;
  check_mpi(MPI_Bcast(&length, 1, MPI_INT, lowest, comm), "MPI_Bcast");
  message.resize(static_cast<std::size_t>(length));
  check_mpi(MPI_Bcast(message.data(), length, MPI_CHAR, lowest, comm), "MPI_Bcast");
  const std::string prefix = "attnkit: ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  throw Error(prefix + "rank " + std::to_string(lowest) + " of " + std::to_string(size) + ": " +
              message);
}

/// A value every rank of a call must give alike, and its name in the Error. An identity (a
/// tag: detail/policy_tag.hpp) has no order: its Error does not print the values.
struct Agreed {
  std::string name;
  long long value;
  bool identity = false;
};

/// Throws Error on every rank when the ranks' values of some field differ, naming the first
/// such field, `what` (the call) and, for a number, the smallest and largest value.
/// Collective; every rank must give the same number of fields.
inline void require_same_on_all_ranks(MPI_Comm comm, const char* what,
                                      const std::vector<Agreed>& fields) {
  const int n = static_cast<int>(fields.size());
  std::vector<long long> mine(fields.size()), lo(fields.size()), hi(fields.size());
  for (std::size_t i = 0; i < fields.size(); ++i) mine[i] = fields[i].value;
  check_mpi(MPI_Allreduce(mine.data(), lo.data(), n, MPI_LONG_LONG, MPI_MIN, comm),
            "MPI_Allreduce");
  check_mpi(MPI_Allreduce(mine.data(), hi.data(), n, MPI_LONG_LONG, MPI_MAX, comm),
            "MPI_Allreduce");
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].identity)
      attnkit::detail::require(lo[i] == hi[i], attnkit::detail::cat(what, ": ", fields[i].name),
                               "the same on every rank", "different ones across ranks");
    else
      attnkit::detail::require(
          lo[i] == hi[i], attnkit::detail::cat(what, ": ", fields[i].name),
          "the same value on every rank",
          attnkit::detail::cat("values from ", lo[i], " to ", hi[i], " across ranks"));
  }
}

}  // namespace attnkit::dist
