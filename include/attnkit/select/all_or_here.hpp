// All-or-Here attention (AHA; docs/mechanisms.md "All-or-Here"): per (batch, token,
// head) a route chooses full causal attention or a sliding window of the last `window` keys
// (default 256, the query's own key included), in one call. A route is given as a boolean
// or as gate logits g with a threshold (full where sigmoid(g) > 0.5 by default: the seed's
// hard routing at inference). Each query pays only for what it chose: per (batch, head) the
// queries of each route are gathered (select/gather.hpp) and the tiled kernel runs each group
// against that head's keys under a Remapped causal or windowed mask, then the rows are put
// back. Any normalizer and a position-free Score (Dot, Softcap: checked at compile time) work; row
// statistics are written per query as usual.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/mask/sliding_window.hpp"
#include "attnkit/options.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// One route per (batch, token, head): true = full attention, false = the window.
struct AhaRoutes {
  Index batch = 0, len = 0, heads = 0;
  std::vector<unsigned char> full;  // [batch, len, heads]

  AhaRoutes() = default;
  /// Throws Error unless the sizes are >= 0, their product fits in Index and routes holds it.
  AhaRoutes(Index b, Index l, Index h, std::vector<unsigned char> routes)
      : batch(b), len(l), heads(h), full(std::move(routes)) {
    Index n = 0;
    detail::require(b >= 0 && l >= 0 && h >= 0 && detail::checked_product({b, l, h}, &n),
                    "AhaRoutes [batch, len, heads]", "sizes >= 0 whose product fits in Index",
                    detail::cat("[", b, ", ", l, ", ", h, "]"));
    detail::require(Index(full.size()) == n, "AhaRoutes.full.size()",
                    detail::cat("batch * len * heads = ", n), full.size());
  }

  /// Routes from gate logits g [batch, len, heads]: full where sigmoid(g) > threshold.
  static AhaRoutes from_gates(const std::vector<float>& gates, Index b, Index l, Index h,
                              float threshold = 0.5f) {
    detail::require(threshold > 0.f && threshold < 1.f, "AhaRoutes threshold", "in (0, 1)",
                    threshold);
    std::vector<unsigned char> routes(gates.size());
    const float logit = std::log(threshold / (1.f - threshold));  // sigmoid(g) > t <=> g > this
    std::transform(gates.begin(), gates.end(), routes.begin(),
                   [&](float g) { return static_cast<unsigned char>(g > logit); });
    return AhaRoutes(b, l, h, std::move(routes));
  }

  bool is_full(Index b, Index t, Index h) const {
    return full[static_cast<std::size_t>((b * len + t) * heads + h)] != 0;
  }

  /// The fraction of (batch, token, head) routed to full attention.
  double full_fraction() const {
    if (full.empty()) return 0.0;
    return double(full.size() - std::size_t(std::count(full.begin(), full.end(), 0))) /
           double(full.size());
  }
};

namespace select {

/// The call's own checks: routes shaped [batch, Lq, q_heads] and window >= 1.
inline void check_aha_call(const Problem& p, const AhaRoutes& routes, Index window) {
  detail::require(routes.batch == p.batch && routes.len == p.q_len && routes.heads == p.q_heads,
                  "AhaRoutes shape", "[batch, Lq, q_heads] of the call", "another shape");
  detail::require(window >= 1, "window", ">= 1", window);
}

/// The parts of an All-or-Here call, in the order its forward and backward both take them:
/// per (batch, head), the rows routed to full attention, then those routed to the window.
/// visit(b, h, rows, part) gets the part's query rows and its spec: the Score and the head's
/// normalizer with a causal (or causal-windowed) mask Remapped to the rows' true positions.
template <class Spec, class Visit>
void for_each_aha_part(const Spec& spec, const Problem& p, const AhaRoutes& routes, Index window,
                       Visit&& visit) {
  const auto spec_with = [&](const auto& mask, Index h) {
    return AttentionSpec<typename Spec::Score, std::decay_t<decltype(mask)>,
                         typename Spec::Normalizer, NoPosition>{
        spec.score, mask, for_head(spec.normalizer, h), {}};
  };
  std::vector<Index> rows, positions;
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h)
      for (const bool full : {true, false}) {
        rows.clear();
        positions.clear();
        for (Index r = 0; r < p.q_len; ++r)
          if (routes.is_full(b, r, h) == full) {
            rows.push_back(r);
            positions.push_back(r + p.q_offset);
          }
        if (rows.empty()) continue;
        if (full)
          visit(b, h, rows, spec_with(remap(Causal{}, positions.data(), nullptr, 0), h));
        else
          visit(
              b, h, rows,
              spec_with(
                  remap(Causal{} & SlidingWindow{window - 1, 0}, positions.data(), nullptr, 0), h));
      }
}

}  // namespace select

/// o = All-or-Here attention of q over k, v: query row r of head h in batch b attends
/// causally to every key when routes.is_full(b, r, h), else to the last `window` keys. The
/// spec gives the Score and Normalizer (its Mask must be Full, its Position NoPosition);
/// options as for attention() (q_offset places the queries; default bottom-right).
template <class Spec, class Q, class K, class V, class O>
void all_or_here(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                 const View<O>& o, const AhaRoutes& routes, Index window = 256,
                 const Options& options = {}) {
  select::check_gathered_spec<Spec>();
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  select::check_aha_call(p, routes, window);
  select::GatheredRows<Q> gathered;
  std::vector<float> out, stat;
  select::for_each_aha_part(
      spec, p, routes, window,
      [&](Index b, Index h, const std::vector<Index>& rows, const auto& part) {
        const Index hk = p.kv_head(h);
        select::gather_rows(q, b, h, rows, gathered);
        const auto n = static_cast<Index>(rows.size());
        out.assign(static_cast<std::size_t>(n * p.value_dim), 0.f);
        stat.assign(static_cast<std::size_t>(n), 0.f);
        const View<float> o_rows = bhsd(out.data(), 1, 1, n, p.value_dim);
        Options call = options.with_q_offset(0);
        call.lse = options.lse.empty() ? Span<float>() : Span<float>(stat);
        attention(part, gathered.view(), select::head_view(k, b, hk), select::head_view(v, b, hk),
                  o_rows, call);
        select::scatter_rows(View<const float>(o_rows), rows, o, b, h);
        if (!options.lse.empty())
          for (std::size_t r = 0; r < rows.size(); ++r)
            options.lse.data()[(b * p.q_heads + h) * p.q_len + rows[r]] = stat[r];
      });
}

}  // namespace attnkit
