// The sparsity drivers stated by brute force, for their forward and backward tests alike: the
// obvious selectors (loops, double dot products, an explicit sort: MoBA's blocks, the
// superlinear anchors, the stripes' kept columns) and each selection as an element mask
// (keep_if) for the f64 reference, written from the selection's definition, not from the
// driver's faces; and a driver's output against that reference (check_driver_output).
#pragma once

#include <algorithm>
#include <attnkit/core/tensor.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/select/all_or_here.hpp>
#include <attnkit/select/moba.hpp>
#include <attnkit/select/stripes.hpp>
#include <attnkit/select/superlinear_spans.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/case.hpp"
#include "support/keep_if.hpp"

namespace attnkit::test {

/// CHECKs a driver's output o [B, Hq, Lq, Dv] (in storage O) against reference::attention(ref) (the
/// spec under the selection's element mask) on the same q, k, v and options: within out_tol, and
/// its LSE within tol::kLseF32 where `lse` holds one (else empty).
template <class RefSpec, class T, class O>
void check_driver_output(const RefSpec& ref, const View<const T>& q, const View<const T>& k,
                         const View<const T>& v, const View<const O>& o,
                         const std::vector<float>& lse, const Options& options, double out_tol) {
  Tensor<double> expected(Layout::Bhsd, o.batch, o.heads, o.seq, o.dim);
  std::vector<float> lse_ref(lse.size());
  reference::attention(ref, q, k, v, expected.view,
                       lse.empty() ? options : options.with_lse(lse_ref));
  CHECK(max_abs_diff(o, expected.cview()) <= out_tol);
  CHECK(max_lse_diff(lse, lse_ref) <= tol::kLseF32);
}

// ---- MoBA ----

/// The obvious MoBA selector for query row i of (b, h) at position i + offset: every past
/// block's mean key and its score in double, sorted (ties to the earlier block); the top-k - 1
/// ascending, then the own block.
inline std::vector<Index> slow_route(const View<const float>& q, const View<const float>& k,
                                     Index b, Index h, Index i, Index block, Index topk,
                                     Index offset) {
  const Index pos = i + offset;
  if (pos < 0) return {};
  const Index own = pos / block, n_blocks = (k.seq + block - 1) / block;
  const Index hk = h / (q.heads / k.heads);
  std::vector<std::pair<double, Index>> scored;  // (score, block)
  for (Index c = 0; c < std::min(own, n_blocks); ++c) {
    double score = 0;
    for (Index d = 0; d < q.dim; ++d) {
      double mean = 0;
      Index n = 0;
      for (Index j = c * block; j < std::min((c + 1) * block, k.seq); ++j, ++n)
        mean += double(k.row(b, hk, j)[d]);
      score += double(q.row(b, h, i)[d]) * (mean / double(n));
    }
    scored.emplace_back(score, c);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  });
  std::vector<Index> chosen;
  for (std::size_t t = 0; t < scored.size() && Index(t) + 1 < topk; ++t)
    chosen.push_back(scored[t].second);
  std::sort(chosen.begin(), chosen.end());
  chosen.push_back(own);
  return chosen;
}

/// keep(i, j) = j <= i and block(j) among row i's chosen blocks.
inline auto moba_mask(const BlockRoutes* routes) {
  return keep_if([routes](Index b, Index h, Index i, Index j) {
    if (j > i) return false;
    const auto list = routes->chosen(b, h, i - routes->q_offset);
    return std::find(list.begin(), list.end(), j / routes->block) != list.end();
  });
}

// ---- Superlinear spans ----

/// The obvious superlinear selector for row i of (b, h): every anchor pos - floor(m^(1/p)) in
/// [0, Lk), scored r_i . k_a in double, the top-k (ties to the nearer anchor) ascending.
inline std::vector<Index> slow_spans(const View<const float>& r, const View<const float>& k,
                                     Index b, Index h, Index i, double p, Index topk,
                                     Index offset) {
  const Index pos = i + offset, hk = h / (r.heads / k.heads);
  std::vector<std::pair<double, Index>> scored;  // (score, anchor)
  for (Index m = 1;; ++m) {
    const auto back = static_cast<Index>(std::floor(std::pow(double(m), 1.0 / p) + 1e-9));
    if (back > pos) break;
    const Index a = pos - back;
    if (a >= k.seq) continue;
    double score = 0;
    for (Index d = 0; d < r.dim; ++d) score += double(r.row(b, h, i)[d]) * k.row(b, hk, a)[d];
    scored.emplace_back(score, a);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) {
    return x.first > y.first || (x.first == y.first && x.second > y.second);  // nearer first
  });
  std::vector<Index> chosen;
  for (std::size_t t = 0; t < scored.size() && Index(t) < topk; ++t)
    chosen.push_back(scored[t].second);
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

/// keep(i, j) = j <= i, and j in a span [a - w/2, a - w/2 + w) of row i or in its window.
inline auto span_mask(const SpanSelection* sel) {
  return keep_if([sel](Index b, Index h, Index i, Index j) {
    if (j > i) return false;
    if (j > i - sel->window) return true;
    const Index row = i - sel->q_offset;
    const Index* a = sel->chosen(b, h, row);
    for (Index t = 0; t < sel->count(b, h, row); ++t)
      if (j >= a[t] - sel->span / 2 && j < a[t] - sel->span / 2 + sel->span) return true;
    return false;
  });
}

// ---- Anchor stripes ----

/// The small parameters the stripe tests run with: big blocks of 8 queries, so ragged sizes
/// cut several of them, and a theta that keeps part of the middle on N(0, 1) data.
inline StripeParams small_stripe_params(Index local) {
  StripeParams params;
  params.block = 4;
  params.step = 2;
  params.theta = 1.f;
  params.init = 3;
  params.local = local;
  return params;
}

/// Big block g covers rows [g B, (g + 1) B); its init region is [0, init_end), its local
/// region starts `local` keys before its first query; the middle lies between the two.
struct StripeRegions {
  Index init_end, local_begin;
};
inline StripeRegions stripe_regions(const StripeParams& params, Index offset, Index kv_len,
                                    Index g) {
  const Index init_end = std::min(params.init, kv_len);
  const Index local =
      std::clamp<Index>(offset + g * params.block * params.step - params.local, 0, kv_len);
  return {init_end, std::max(local, init_end)};
}

inline double dot_f64(const float* a, const float* b, Index d) {
  double s = 0;
  for (Index c = 0; c < d; ++c) s += double(a[c]) * double(b[c]);
  return s;
}

/// The obvious stripe selector: per (b, h, g) the kept middle columns, and the margin
/// (best pooled score + theta - pooled anchor) of every middle column, to excuse near ties.
struct SlowStripes {
  std::vector<std::vector<Index>> kept;     // [b, h, g] -> columns
  std::vector<std::vector<double>> margin;  // [b, h, g] -> per middle column
};

inline SlowStripes slow_stripes(const View<float>& q, const View<float>& k,
                                const StripeParams& params, float scale, Index offset) {
  const Index big = params.block * params.step, groups = (q.seq + big - 1) / big;
  SlowStripes out;
  for (Index b = 0; b < q.batch; ++b)
    for (Index h = 0; h < q.heads; ++h)
      for (Index g = 0; g < groups; ++g) {
        const Index hk = h / (q.heads / k.heads);
        const StripeRegions reg = stripe_regions(params, offset, k.seq, g);
        std::vector<Index> kept;
        std::vector<double> margins;
        const Index r0 = g * big, r1 = std::min(q.seq, r0 + big);
        std::vector<double> q_bar, a_bar;  // per pooled group
        for (Index p0 = r0; p0 < r1; p0 += params.block) {
          const Index p1 = std::min(r1, p0 + params.block);
          std::vector<double> mean(std::size_t(q.dim), 0.0);
          double anchor_sum = 0;
          for (Index r = p0; r < p1; ++r) {
            const Index i = r + offset;
            double anchor = -std::numeric_limits<double>::infinity();
            for (Index j = 0; j < k.seq; ++j)
              if (j <= i && (j < reg.init_end || j >= reg.local_begin))
                anchor = std::max(anchor, scale * dot_f64(q.row(b, h, r), k.row(b, hk, j), q.dim));
            anchor_sum += anchor;
            for (Index c = 0; c < q.dim; ++c) mean[std::size_t(c)] += q.row(b, h, r)[c];
          }
          for (double& x : mean) x /= double(p1 - p0);
          q_bar.insert(q_bar.end(), mean.begin(), mean.end());
          a_bar.push_back(anchor_sum / double(p1 - p0));
        }
        for (Index j = reg.init_end; j < reg.local_begin; ++j) {
          double best = -std::numeric_limits<double>::infinity();
          for (std::size_t p = 0; p < a_bar.size(); ++p) {
            double s = 0;
            for (Index c = 0; c < q.dim; ++c)
              s += q_bar[p * std::size_t(q.dim) + std::size_t(c)] * double(k.row(b, hk, j)[c]);
            best = std::max(best, scale * s + params.theta - a_bar[p]);
          }
          margins.push_back(best);
          if (best >= 0) kept.push_back(j);
        }
        out.kept.push_back(kept);
        out.margin.push_back(margins);
      }
  return out;
}

/// keep(b, h, i, j) = j <= i && (j in init, j in the local region of i's big block, or j kept
/// by that big block).
inline auto stripe_mask(const StripeSelection* sel) {
  return keep_if([sel](Index b, Index h, Index i, Index j) {
    if (j > i) return false;
    const Index g = (i - sel->q_offset) / (sel->params.block * sel->params.step);
    const StripeRegions reg = stripe_regions(sel->params, sel->q_offset, sel->kv_len, g);
    if (j < reg.init_end || j >= reg.local_begin) return true;
    return std::find(sel->kept_begin(b, h, g), sel->kept_end(b, h, g), j) != sel->kept_end(b, h, g);
  });
}

// ---- All-or-Here ----

/// The routing as an element mask (absolute positions; row = i - q_offset): j <= i and the
/// route full or j within the window.
struct AhaMask {
  using slot = MaskSlot;
  const AhaRoutes* routes = nullptr;
  Index window = 256, q_offset = 0;
  bool keep(Index b, Index h, Index i, Index j) const {
    return j <= i && (routes->is_full(b, i - q_offset, h) || i - j < window);
  }
};

/// Boolean routes of case c, each full with probability p_full (mt19937(seed)).
inline AhaRoutes random_routes(const Case& c, double p_full, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution full(p_full);
  std::vector<unsigned char> r(static_cast<std::size_t>(c.rows()));
  for (auto& x : r) x = full(rng) ? 1 : 0;
  return AhaRoutes(c.batch, c.q_len, c.q_heads, std::move(r));
}

}  // namespace attnkit::test
