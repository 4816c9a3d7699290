// Internals of select/stripes.hpp: the checked problem of a selector call, one item of the
// anchor selection (anchors, pooling, the theta test) and one row of the recall.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {

namespace detail {

using StripeProblem = Problem;  // value_dim = head_dim: there are no values

/// The Problem of q [B, Hq, Lq, D] and k [B, Hkv, Lk, D] with the selection's parameters.
template <class Q, class K, class Params>
Problem stripe_problem(const View<Q>& q, const View<K>& k, const Params& params,
                       const Options& options) {
  check_view(q, "q");
  check_view(k, "k");
  require(k.batch == q.batch, "k.batch", q.batch, k.batch);
  require(k.dim == q.dim, "k.dim", q.dim, k.dim);
  require(params.block >= 1, "StripeParams.block", ">= 1", params.block);
  require(params.step >= 1 && params.step <= (Index{1} << 30) / params.block, "StripeParams.step",
          ">= 1 with block * step <= 2^30", params.step);
  require(params.init >= 0, "StripeParams.init", ">= 0", params.init);
  require(params.local >= 0, "StripeParams.local", ">= 0", params.local);
  require(!std::isnan(params.theta), "StripeParams.theta", "not NaN", params.theta);
  // The keys stand in for the values: the scores have none (value_dim = head dim).
  return problem_of(q, k, k, scale_for(options, q.dim),
                    options.q_offset ? *options.q_offset : k.seq - q.seq, options.threads);
}

// Rows [begin, end) of head (b, h) of x as contiguous f32 [end - begin, dim]: f32 rows of
// the caller are read in place, other storage is converted into `buffer`.
template <class T>
const float* f32_rows(const View<T>& x, Index b, Index h, Index begin, Index end,
                      std::vector<float>& buffer, Index* stride) {
  if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
    *stride = x.seq_stride;
    return x.row(b, h, begin);
  } else {
    buffer.resize(std::size_t((end - begin) * x.dim));
    pack_rows(x, b, h, begin, end - begin, buffer.data(), x.dim);
    *stride = x.dim;
    return buffer.data();
  }
}

/// The kept middle columns of one (b, h, big block): anchors over init [0, init_end) and the
/// local keys [mid.end, i] of each query, then group means of q and of the anchors, then
/// the theta test per middle column. `out` receives the columns, ascending.
template <class Q, class K, class Params>
void select_stripes(const View<Q>& q, const View<K>& k, const Problem& p, const Params& params,
                    Index b, Index h, Range rows, Range mid, std::vector<Index>& out) {
  out.clear();
  if (mid.end <= mid.begin) return;  // nothing to choose (every query then has i >= 0)
  const Index d = p.head_dim, n = rows.end - rows.begin;
  const Index last_key = std::min(p.kv_len, rows.end + p.q_offset);  // keys < this
  std::vector<float> q_buffer, k_buffer;
  Index q_stride = 0, k_stride = 0;
  const float* qs = f32_rows(q, b, h, rows.begin, rows.end, q_buffer, &q_stride);    // [n, d]
  const float* ks = f32_rows(k, b, p.kv_head(h), 0, last_key, k_buffer, &k_stride);  // [.., d]
  const auto key = [&](Index j) { return ks + j * k_stride; };

  const Index groups = (n + params.block - 1) / params.block;
  std::vector<float> q_bar(std::size_t(groups * d), 0.f);  // [groups, d]
  std::vector<float> a_bar(std::size_t(groups), 0.f);      // [groups]
  for (Index r = 0; r < n; ++r) {
    const Index i = rows.begin + r + p.q_offset, see = std::min(i + 1, p.kv_len);
    const float* qi = qs + r * q_stride;
    float anchor = -std::numeric_limits<float>::infinity();
    for (Index j = 0; j < std::min(mid.begin, see); ++j)
      anchor = std::max(anchor, p.scale * simd::dot(qi, key(j), d));
    for (Index j = mid.end; j < see; ++j)
      anchor = std::max(anchor, p.scale * simd::dot(qi, key(j), d));
    const Index g = r / params.block;
    a_bar[std::size_t(g)] += anchor;
    for (Index c = 0; c < d; ++c) q_bar[std::size_t(g * d + c)] += qi[c];
  }
  for (Index g = 0; g < groups; ++g) {
    const float inv = 1.f / float(std::min(params.block, n - g * params.block));
    a_bar[std::size_t(g)] *= inv;
    for (Index c = 0; c < d; ++c) q_bar[std::size_t(g * d + c)] *= p.scale * inv;
  }
  // q_bar already carries the scale; keep j when q_bar . k_j >= a_bar - theta for any group.
  for (Index j = mid.begin; j < mid.end; ++j)
    for (Index g = 0; g < groups; ++g)
      if (simd::dot(q_bar.data() + g * d, key(j), d) + params.theta >= a_bar[std::size_t(g)]) {
        out.push_back(j);
        break;
      }
}

/// The softmax mass (over keys j <= i, scale q . k in double) on the keys `kept(j)` says.
template <class Q, class K, class Kept>
double recall_of_row(const Q* qi, const View<K>& k, const Problem& p, Index b, Kept kept, Index h,
                     Index i) {
  const Index see = std::min(i + 1, p.kv_len);
  if (see <= 0) return 1.0;
  std::vector<double> s(static_cast<std::size_t>(see));  // [see] logits
  double top = -std::numeric_limits<double>::infinity();
  for (Index j = 0; j < see; ++j) {
    const auto* kj = k.row(b, p.kv_head(h), j);
    double acc = 0;
    for (Index c = 0; c < p.head_dim; ++c) acc += double(qi[c]) * double(kj[c]);
    s[std::size_t(j)] = double(p.scale) * acc;
    top = std::max(top, s[std::size_t(j)]);
  }
  double all = 0, held = 0;
  for (Index j = 0; j < see; ++j) {
    const double w = std::exp(s[std::size_t(j)] - top);
    all += w;
    if (kept(j)) held += w;
  }
  return held / all;
}

}  // namespace detail
}  // namespace attnkit
