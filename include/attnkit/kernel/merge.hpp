// merge(): partial results of one attention call, each computed over a disjoint range of
// the keys, combined into the result over all of them -- the primitive of split-KV decode
// and of ring (distributed) attention. Each normalizer's row statistic says how:
//   Softmax  (LSE):  lse = log sum_k exp(lse_k) (+ the head's sink, counted once here),
//                    o = sum_k o_k exp(lse_k - lse);
//   Sum      (l1):   l = sum_k l_k, o = sum_k o_k l_k / l (0 where l = 0);
//   None  (sigmoid): o = sum_k o_k (compute the parts with the whole call's bias: the
//                    default -log Lk of a part would use the part's key count).
// One round suffices for these; LSSAR's re-weighting (a second pass that needs the global
// row sum first) does not merge in one round: see kernel/merge_reweighted.hpp. Parts are summed in
// the order given, so the result does not depend on how the parts were computed (threads, tiles).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/span.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/normalizer/faces.hpp"

namespace attnkit {

namespace detail {

// The sink logit of head h, or -inf.
template <class N>
float sink_of(const N& n, Index h) {
  if constexpr (has_sinks<N>::value)
    return n.sinks.empty() ? -std::numeric_limits<float>::infinity()
                           : n.sinks[static_cast<std::size_t>(h)];
  else
    return -std::numeric_limits<float>::infinity();
}

template <class T>
bool row_has_nan(const T* row, Index n) {
  for (Index c = 0; c < n; ++c)
    if (std::isnan(double(row[c]))) return true;
  return false;
}

}  // namespace detail

/// out[B, H, Lq, Dv] = the merge of parts[k][B, H, Lq, Dv] with their row statistics
/// stats[k][B * H * Lq] (as attention() wrote them through Options::lse; ignored for a
/// normalizer without one). out_stat, when given, receives the merged statistic
/// [B * H * Lq] (its size is checked). With
/// Softmax::with_sinks, compute the parts with plain Softmax: the sink is added here, once.
/// Throws Error before writing anything when shapes, statistics or buffers disagree.
template <class Normalizer, class P, class O>
void merge(const Normalizer& normalizer, const std::vector<View<P>>& parts,
           const std::vector<const float*>& stats, const View<O>& out, Span<float> out_stat = {}) {
  static_assert(!std::is_const_v<O>, "merge(): the output view must be writable");
  static_assert(detail::passes<Normalizer>() == 1,
                "merge(): this normalizer makes more than one pass over the keys (LSSAR needs "
                "each row's whole sum before its weights), so its parts cannot merge in one "
                "round: use its two-round form (SoftplusL1Reweighted::second_round, "
                "merge_reweighted in kernel/merge_reweighted.hpp)");
  constexpr RowStat kStat = detail::row_stat_kind<Normalizer>();
  using detail::require;
  detail::check_view(out, "out");
  detail::check_rows_distinct(out, "out");
  require(!parts.empty(), "parts.size()", ">= 1", parts.size());
  require(kStat == RowStat::None || stats.size() == parts.size(), "stats.size()",
          detail::cat("parts.size() = ", parts.size()), stats.size());
  require(kStat != RowStat::None || out_stat.empty(), "out_stat",
          "nullptr (this normalizer has no row statistic)", "a buffer");
  detail::require_span_size(out_stat, out.batch * out.heads * out.seq, "out_stat.size()",
                            "out.batch * out.heads * out.seq");
  const detail::ByteSpan out_span = detail::byte_span(out);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const auto name = detail::cat("parts[", k, "]");
    const View<P>& part = parts[k];
    detail::check_view(part, name);
    require(part.batch == out.batch && part.heads == out.heads && part.seq == out.seq &&
                part.dim == out.dim,
            name, "the shape of out", "another shape");
    require(kStat == RowStat::None || stats[k] != nullptr || out.batch * out.heads * out.seq == 0,
            detail::cat("stats[", k, "]"), "non-null", "nullptr");
    detail::require_disjoint(out_span, "out", detail::byte_span(part), name);
  }
  if constexpr (detail::has_sinks<Normalizer>::value)
    require(normalizer.sinks.empty() || static_cast<Index>(normalizer.sinks.size()) == out.heads,
            "Softmax.sinks.size()", detail::cat("heads = ", out.heads), normalizer.sinks.size());

  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> weight(parts.size());  // per part, for one row
  std::vector<double> acc(static_cast<std::size_t>(out.dim));
  for (Index b = 0; b < out.batch; ++b)
    for (Index h = 0; h < out.heads; ++h)
      for (Index r = 0; r < out.seq; ++r) {
        const Index row = (b * out.heads + h) * out.seq + r;
        double total = 0;  // the merged statistic
        if constexpr (kStat == RowStat::LogSumExp) {
          const double sink = double(detail::sink_of(normalizer, h));
          double m = sink;
          for (const float* s : stats)
            m = std::isnan(s[row]) ? double(s[row]) : std::max(m, double(s[row]));
          double sum = m == kNegInf || std::isnan(m) ? 0.0 : std::exp(sink - m);
          for (std::size_t k = 0; k < parts.size(); ++k)
            sum += (weight[k] = m == kNegInf ? 0.0 : std::exp(double(stats[k][row]) - m));
          // Every part -inf: a NaN row among them saw keys whose f32 logits were all -inf
          // (attention() gives it LSE -inf), so the merged row is NaN, not "no key".
          for (std::size_t k = 0; m == kNegInf && k < parts.size(); ++k)
            if (detail::row_has_nan(parts[k].row(b, h, r), out.dim)) weight[k] = std::nan("");
          total = m == kNegInf ? kNegInf : m + std::log(sum);
          for (double& w : weight) w = sum > 0 ? w / sum : w;  // NaN stays NaN
        } else if constexpr (kStat == RowStat::Sum) {
          for (std::size_t k = 0; k < parts.size(); ++k)
            total += (weight[k] = double(stats[k][row]));
          for (double& w : weight) w = total == 0 ? 0.0 : w / total;
        } else {
          for (double& w : weight) w = 1.0;
        }
        O* dst = out.row(b, h, r);
        if (!out_stat.empty()) out_stat.data()[row] = static_cast<float>(total);
        if (parts.size() == 1 && weight[0] == 1.0) {  // one part, whole: the sum below, copied
          const P* in = parts[0].row(b, h, r);
          if constexpr (std::is_same_v<std::remove_const_t<P>, O>)
            std::copy(in, in + out.dim, dst);
          else
            for (Index c = 0; c < out.dim; ++c) dst[c] = static_cast<O>(double(in[c]));
          continue;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::size_t k = 0; k < parts.size(); ++k) {
          if (weight[k] == 0.0) continue;  // an empty part: its (zero) output adds nothing
          const P* in = parts[k].row(b, h, r);
          for (Index c = 0; c < out.dim; ++c)
            acc[static_cast<std::size_t>(c)] += weight[k] * double(in[c]);
        }
        for (Index c = 0; c < out.dim; ++c)
          dst[c] = static_cast<O>(acc[static_cast<std::size_t>(c)]);
      }
}

}  // namespace attnkit
