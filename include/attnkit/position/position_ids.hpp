// PositionIds: where the rows of a table-driven row transform (Rope, Fope) sit, shared by both:
// absolute by default (query row r at r + q_offset, key j at j), or explicit ids per batch
// (packed or padded sequences): with_positions(q_ids [B * Lq], k_ids [B * Lk]). A table holds
// positions [0, max_len); a negative position t turns by the angle of -t backwards: the same
// cosines and negated sines (cos(-x) = cos x, sin(-x) = -sin x; table_row()), so positions
// in (-max_len, max_len) are served -- a varlen sequence with more queries than keys puts its
// first queries before key 0.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/position/faces.hpp"

namespace attnkit {

/// The row of a position's table entry: |t|, and the sign the sines take (-1 for t < 0).
struct TableRow {
  Index at;
  float sign;
};
inline TableRow table_row(Index t) { return t < 0 ? TableRow{-t, -1.f} : TableRow{t, 1.f}; }

/// The position ids of a Policy (CRTP: with_positions() returns the Policy).
template <class Policy>
struct PositionIds {
  std::vector<Index> q_positions, k_positions;  // [B * Lq], [B * Lk]; empty: absolute

  /// The same policy at explicit positions: q_ids[b * Lq + r], k_ids[b * Lk + j].
  Policy with_positions(std::vector<Index> q_ids, std::vector<Index> k_ids) const {
    Policy p = static_cast<const Policy&>(*this);
    p.q_positions = std::move(q_ids);
    p.k_positions = std::move(k_ids);
    return p;
  }

  /// The position of a row: its id, or its absolute position.
  Index position_of(const RowAt& at) const {
    const std::vector<Index>& ids = at.role == Role::Query ? q_positions : k_positions;
    return ids.empty() ? at.position : ids[static_cast<std::size_t>(at.batch * at.len + at.row)];
  }

  /// Throws Error (naming `policy`, "Rope" or "Fope") unless the role's ids cover `batch`
  /// rows of `len` each, or, without ids, unless every position offset .. offset + len - 1
  /// lies in (-max_len, max_len).
  void check_positions(const char* policy, Role role, Index batch, Index len, Index offset,
                       Index max_len) const {
    using detail::cat;
    using detail::require;
    const bool query = role == Role::Query;
    const std::vector<Index>& ids = query ? q_positions : k_positions;
    const char* ids_name = query ? ".q_positions" : ".k_positions";
    const auto range = cat("in (-max_len, max_len), max_len = ", max_len);
    if (!ids.empty()) {
      const Index rows = batch * len;  // the view's rows: within Index
      require(static_cast<Index>(ids.size()) == rows, cat(policy, ids_name, ".size()"),
              cat("batch * length = ", rows), ids.size());
      for (const Index id : ids)
        require(id > -max_len && id < max_len, cat(policy, ids_name, "[...]"), range, id);
      return;
    }
    if (len == 0) return;
    const char* who = query ? "query" : "key";
    require(offset > -max_len,
            cat(policy, ": the first ", who, " position (", query ? "q_offset" : "offset", ")"),
            range, offset);
    Index last = 0;
    require(detail::checked_add(offset, len - 1, &last) && last < max_len,
            cat(policy, ": the last ", who, " position"), range, last);
  }
};

}  // namespace attnkit
