// attention_varlen(): attention over packed sequences of different lengths, in
// FlashAttention's varlen convention. Tokens of all sequences are packed along seq of views
// with batch = 1 (q [1, Hq, total_q, D], BSHD-like memory [total_q, Hq, D]); cu_seqlens_q =
// {0, n_1, n_1 + n_2, ...} (num_seqs + 1 entries) delimits the sequences, cu_seqlens_k the
// same for k and v. Sequence s is one attention() call on sub-views (no copy): its queries see
// only its keys, and masks and positions see per-sequence indices.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"

namespace attnkit {
namespace detail {

// Rows [begin, begin + n) of a batch-1 view along seq; an empty view keeps the base pointer,
// so no pointer is formed past the end of the caller's memory.
template <class T>
View<T> seq_rows(const View<T>& x, Index begin, Index n) {
  View<T> part = x;
  part.data = n > 0 ? x.row(0, 0, begin) : x.data;
  part.seq = n;
  return part;
}

inline void check_cu_seqlens(const std::vector<Index>& cu, const char* name, Index total) {
  require(!cu.empty(), cat(name, ".size()"), ">= 1 (num_seqs + 1)", cu.size());
  require(cu.front() == 0, cat(name, "[0]"), 0, cu.front());
  for (std::size_t s = 1; s < cu.size(); ++s)
    require(cu[s] >= cu[s - 1], cat(name, "[", s, "]"), cat("non-decreasing: >= ", cu[s - 1]),
            cu[s]);
  require(cu.back() == total, cat(name, ".back()"), cat("the packed length ", total), cu.back());
}

}  // namespace detail

/// o [1, Hq, total_q, Dv] = per-sequence attention of q [1, Hq, total_q, D] over
/// k [1, Hkv, total_k, D], v [1, Hkv, total_k, Dv]: queries [cu_q[s], cu_q[s+1]) attend to
/// keys [cu_k[s], cu_k[s+1]) only, at per-sequence positions (query row r of sequence s sits
/// at r + q_offset_s, q_offset_s = len_k - len_q by default (bottom-right); Options.q_offset,
/// if set, applies to every sequence). options.lse, if set, receives [1, Hq, total_q] at the
/// packed query indices. Every check (sizes, cu_seqlens, each sequence's policies) runs
/// before anything is written. Sequences run one after another, each call on
/// options.threads threads, so many short sequences use the threads poorly.
template <class Spec, class Q, class K, class V, class O>
void attention_varlen(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                      const View<O>& o, const std::vector<Index>& cu_seqlens_q,
                      const std::vector<Index>& cu_seqlens_k, const Options& options = {}) {
  using detail::require;
  const Problem whole = make_problem(q, k, v, o, options.with_q_offset(0));
  require(whole.batch == 1, "q.batch", "1 (varlen packs the sequences along seq)", whole.batch);
  detail::check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", whole.q_len);
  detail::check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", whole.kv_len);
  require(cu_seqlens_k.size() == cu_seqlens_q.size(), "cu_seqlens_k.size()",
          detail::cat("cu_seqlens_q.size() = ", cu_seqlens_q.size()), cu_seqlens_k.size());

  const std::size_t seqs = cu_seqlens_q.size() - 1;
  Options part = options;  // per sequence: its own LSE rows, gathered into scratch
  Index longest_q = 0;
  for (std::size_t s = 0; s < seqs; ++s) {
    const Index q0 = cu_seqlens_q[s], nq = cu_seqlens_q[s + 1] - q0;
    const Index k0 = cu_seqlens_k[s], nk = cu_seqlens_k[s + 1] - k0;
    longest_q = std::max(longest_q, nq);
    // The sequence's statistic rows, checked here as the call below will see them.
    part.lse =
        options.lse.empty() ? Span<float>() : Span<float>(options.lse.data(), whole.q_heads * nq);
    const Problem p = make_problem(detail::seq_rows(q, q0, nq), detail::seq_rows(k, k0, nk),
                                   detail::seq_rows(v, k0, nk), detail::seq_rows(o, q0, nq), part);
    validate_policies(spec, p, part);
  }

  std::vector<float> lse_part;  // [Hq, longest_q]: one sequence's LSE, then scattered
  if (!options.lse.empty()) lse_part.resize(static_cast<std::size_t>(whole.q_heads * longest_q));
  for (std::size_t s = 0; s < seqs; ++s) {
    const Index q0 = cu_seqlens_q[s], nq = cu_seqlens_q[s + 1] - q0;
    const Index k0 = cu_seqlens_k[s], nk = cu_seqlens_k[s + 1] - k0;
    if (nq == 0) continue;
    if (!options.lse.empty()) part.lse = Span<float>(lse_part.data(), whole.q_heads * nq);
    attention(spec, detail::seq_rows(q, q0, nq), detail::seq_rows(k, k0, nk),
              detail::seq_rows(v, k0, nk), detail::seq_rows(o, q0, nq), part);
    if (options.lse.empty()) continue;
    for (Index h = 0; h < whole.q_heads; ++h)
      std::copy_n(lse_part.data() + h * nq, nq, options.lse.data() + h * whole.q_len + q0);
  }
}

}  // namespace attnkit
