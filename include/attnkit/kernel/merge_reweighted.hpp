// merge_reweighted(): the second round of LSSAR's two-round split-KV form
// (normalizer/softplus_l1_reweighted.hpp). Round one: every part runs SoftplusL1 with the
// whole call's key counts and merge() adds their row sums (and gives the LSSA output).
// Round two: every part runs SoftplusL1Reweighted::second_round(row sums); this merges them
// by their LSE like softmax parts, and rows where no part had a positive r (LSE -inf in every
// part) take the round-one LSSA output: the fallback of the one-call form.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/normalizer/softplus_l1_reweighted.hpp"

namespace attnkit {

/// out = the LSSAR result of the whole call from round two's parts and statistics, with
/// round one's merged LSSA output `lssa` for the rows that fall back. out_stat, when given,
/// receives log sum_j r_ij (-inf where the row fell back). Throws Error before writing.
template <class P, class F, class O>
void merge_reweighted(const SoftplusL1Reweighted::SecondRound& normalizer,
                      const std::vector<View<P>>& parts, const std::vector<const float*>& stats,
                      const View<F>& lssa, const View<O>& out, Span<float> out_stat = {}) {
  detail::check_view(lssa, "lssa");
  detail::require(lssa.batch == out.batch && lssa.heads == out.heads && lssa.seq == out.seq &&
                      lssa.dim == out.dim,
                  "lssa", "the shape of out", "another shape");
  detail::require_disjoint(detail::byte_span(out), "out", detail::byte_span(lssa), "lssa");
  std::vector<float> stat(static_cast<std::size_t>(out.batch * out.heads * out.seq));
  detail::require_span_size(out_stat, out.batch * out.heads * out.seq, "out_stat.size()",
                            "out.batch * out.heads * out.seq");
  merge(normalizer, parts, stats, out, stat);  // checks the rest, then writes
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (Index b = 0; b < out.batch; ++b)
    for (Index h = 0; h < out.heads; ++h)
      for (Index r = 0; r < out.seq; ++r) {
        const Index row = (b * out.heads + h) * out.seq + r;
        if (stat[static_cast<std::size_t>(row)] == kNegInf)
          for (Index c = 0; c < out.dim; ++c)
            out.row(b, h, r)[c] = static_cast<O>(lssa.row(b, h, r)[c]);
        if (!out_stat.empty()) out_stat.data()[row] = stat[static_cast<std::size_t>(row)];
      }
}

}  // namespace attnkit
