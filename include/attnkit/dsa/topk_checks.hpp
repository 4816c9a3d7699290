// TopkKeys, the per-query key sets of topk_attention(), and their checks before anything is
// written: the shape [B, 1, Lq, topk] (topk >= 1), every entry -1 (none) or a key in
// [0, Lk), under causal no key after the query (s <= t + q_offset), no key twice in a row,
// and the indices sharing no memory with the output.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/problem.hpp"

namespace attnkit {

/// For each query position, the keys it attends (int32 [B, 1, Lq, topk], -1: none), shared by
/// all its heads; indexer_topk() writes them. causal: a key after the query is an error.
struct TopkKeys {
  View<const std::int32_t> indices;
  bool causal = true;
};

namespace detail {

template <class O>
void check_topk_keys(const TopkKeys& keys, const Problem& p, const View<O>& o) {
  const View<const std::int32_t>& x = keys.indices;
  check_view(x, "keys.indices");
  require_dim(x.batch, p.batch, "keys.indices.batch", "q.batch");
  require_dim(x.heads, 1, "keys.indices.heads", "1 (one key set shared by the heads)");
  require_dim(x.seq, p.q_len, "keys.indices.seq", "q.seq");
  require(x.dim >= 1, "keys.indices.dim (topk)", ">= 1", x.dim);
  require_disjoint(byte_span(o), "o", byte_span(x), "keys.indices");
  std::vector<unsigned char> seen(std::size_t(p.kv_len), 0);
  for (Index b = 0; b < p.batch; ++b)
    for (Index t = 0; t < p.q_len; ++t) {
      const std::int32_t* row = x.row(b, 0, t);
      const Index last = keys.causal ? std::min(p.kv_len - 1, t + p.q_offset) : p.kv_len - 1;
      for (Index i = 0; i < x.dim; ++i) {
        const Index s = row[i];
        if (s == -1) continue;
        if (s < 0 || s > last || seen[std::size_t(s)] != 0) {
          for (Index j = 0; j < i; ++j)
            if (row[j] >= 0) seen[std::size_t(row[j])] = 0;
          const auto where = cat("keys.indices[", b, ", 0, ", t, ", ", i, "]");
          require(s >= 0 && s < p.kv_len, where, cat("-1 or a key in [0, ", p.kv_len, ")"), s);
          require(s <= last, where, cat("<= ", t + p.q_offset, " (causal: no later key)"), s);
          require(false, where, "a key not already in the row", cat(s, " twice"));
        }
        seen[std::size_t(s)] = 1;
      }
      for (Index i = 0; i < x.dim; ++i)
        if (row[i] >= 0) seen[std::size_t(row[i])] = 0;
    }
}

}  // namespace detail
}  // namespace attnkit
