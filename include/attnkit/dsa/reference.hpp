// The f64 references of DeepSeek Sparse Attention: the indexer's scores as a whole [Lq, Lk]
// matrix in double, their exact top k by a full sort (the order of dsa/topk_select.hpp: higher
// score, then lower key), and topk_attention() as reference::attention() under a mask that
// keeps each query's selected keys (and its backward under that mask). Slow and obvious,
// for tests and for debugging.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "attnkit/dsa/indexer_checks.hpp"
#include "attnkit/dsa/topk_checks.hpp"
#include "attnkit/reference/attention.hpp"
#include "attnkit/reference/attention_backward.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::reference {

/// I(t, s) = sum_j w(t, j) ReLU(q_I(t, j) . k_I(s)) in double, as [B, Lq, Lk] row-major;
/// -inf where query t does not see key s (causal: s > t + q_offset).
template <class QI, class KI>
std::vector<double> indexer_scores(const IndexerSpec& spec, const View<QI>& q,
                                   const View<const float>& w, const View<KI>& k,
                                   const View<std::int32_t>& selected,
                                   const Options& options = {}) {
  const attnkit::detail::IndexerShape s =
      attnkit::detail::check_indexer(spec, q, w, k, selected, options);
  std::vector<double> out(std::size_t(s.batch * s.q_len * s.k_len));
  std::vector<float> qr(std::size_t(s.dim)), kr(std::size_t(s.dim));
  for (Index b = 0; b < s.batch; ++b)
    for (Index t = 0; t < s.q_len; ++t)
      for (Index x = 0; x < s.k_len; ++x) {
        double& I = out[std::size_t((b * s.q_len + t) * s.k_len + x)];
        if (s.causal && x > t + s.offset) {
          I = -std::numeric_limits<double>::infinity();
          continue;
        }
        attnkit::detail::row_to_f32(k.row(b, 0, x), s.dim, kr.data());
        I = 0;
        for (Index j = 0; j < s.heads; ++j) {
          attnkit::detail::row_to_f32(q.row(b, j, t), s.dim, qr.data());
          double dot = 0;
          for (Index c = 0; c < s.dim; ++c)
            dot += double(qr[std::size_t(c)]) * double(kr[std::size_t(c)]);
          I += double(w.row(b, j, t)[0]) * std::max(dot, 0.0);
        }
      }
  return out;
}

/// indexer_topk() in double: the spec.topk keys of the highest f64 score (ties: the lower
/// key) among those each query sees, in increasing key order, -1 past them.
template <class QI, class KI>
void indexer_topk(const IndexerSpec& spec, const View<QI>& q, const View<const float>& w,
                  const View<KI>& k, const View<std::int32_t>& selected,
                  const Options& options = {}) {
  const std::vector<double> I = indexer_scores(spec, q, w, k, selected, options);
  const Index B = q.batch, Lq = q.seq, Lk = k.seq, offset = options.q_offset.value_or(Lk - Lq);
  std::vector<Index> order(static_cast<std::size_t>(Lk));
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < Lq; ++t) {
      const double* row = I.data() + (b * Lq + t) * Lk;
      const Index seen = spec.causal ? std::clamp<Index>(t + offset + 1, 0, Lk) : Lk;
      std::iota(order.begin(), order.end(), Index{0});
      std::sort(order.begin(), order.begin() + seen, [&](Index x, Index y) {
        return row[x] > row[y] || (row[x] == row[y] && x < y);  // NOLINT exact ties
      });
      const Index kept = std::min(seen, spec.topk);
      std::sort(order.begin(), order.begin() + kept);
      std::int32_t* out = selected.row(b, 0, t);
      for (Index i = 0; i < spec.topk; ++i)
        out[i] = i < kept ? std::int32_t(order[std::size_t(i)]) : -1;
    }
}

namespace detail {

/// The mask of a selection: query at absolute position i keeps the keys its row names.
struct SelectedKeys {
  using slot = MaskSlot;
  const std::vector<char>* kept;  // [B, Lq, Lk]
  Index q_len, k_len, offset;
  bool keep(Index b, Index /*h*/, Index i, Index j) const {
    return (*kept)[std::size_t((b * q_len + (i - offset)) * k_len + j)] != 0;
  }
  TileKind classify(Index, Index, Range, Range) const { return TileKind::Partial; }
};

}  // namespace detail

/// topk_attention() in double (o may be a View<double>): reference::attention() of the spec's
/// Score and Normalizer under the mask of keys.indices (checked as topk_attention() checks).
namespace detail {

// [B, Lq, Lk]: 1 where query t selected key s.
inline std::vector<char> selected_pairs(const TopkKeys& keys, const Problem& p) {
  std::vector<char> kept(std::size_t(p.batch * p.q_len * p.kv_len), 0);
  for (Index b = 0; b < p.batch; ++b)
    for (Index t = 0; t < p.q_len; ++t)
      for (Index i = 0; i < keys.indices.dim; ++i) {
        const std::int32_t x = keys.indices.row(b, 0, t)[i];
        if (x >= 0) kept[std::size_t((b * p.q_len + t) * p.kv_len + x)] = 1;
      }
  return kept;
}

template <class Spec>
auto masked_spec(const Spec& spec, const std::vector<char>& kept, const Problem& p) {
  return AttentionSpec<typename Spec::Score, SelectedKeys, typename Spec::Normalizer, NoPosition>{
      spec.score, SelectedKeys{&kept, p.q_len, p.kv_len, p.q_offset}, spec.normalizer, {}};
}

}  // namespace detail

template <class Spec, class Q, class K, class V, class O>
void topk_attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                    const View<O>& o, const TopkKeys& keys, const Options& options = {}) {
  const Problem p = make_problem(q, k, v, o, options);
  attnkit::detail::check_topk_keys(keys, p, o);
  const std::vector<char> kept = detail::selected_pairs(keys, p);
  reference::attention(detail::masked_spec(spec, kept, p), q, k, v, o, options);
}

/// topk_attention_backward() in double: reference::attention_backward() under the mask of
/// keys.indices (dq, dk, dv may be View<double>).
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void topk_attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                             const View<O>& o, const View<GO>& d_o, const View<GQ>& dq,
                             const View<GK>& dk, const View<GV>& dv, const TopkKeys& keys,
                             const Options& options = {}) {
  const Problem p = make_problem(q, k, v, o, options);
  attnkit::detail::check_topk_keys(keys, p, o);
  const std::vector<char> kept = detail::selected_pairs(keys, p);
  reference::attention_backward(detail::masked_spec(spec, kept, p), q, k, v, o, d_o, dq, dk, dv,
                                options);
}

}  // namespace attnkit::reference
