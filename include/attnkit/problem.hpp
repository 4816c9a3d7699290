// Problem: the sizes and scalars of one attention call, deduced from the views and the
// Options, and checked once by validate(). Kernels trust a validated Problem.
#pragma once

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "attnkit/error.hpp"
#include "attnkit/options.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit {

struct Problem {
  Index batch = 0, q_heads = 0, kv_heads = 0;
  Index q_len = 0, kv_len = 0;
  Index head_dim = 0, value_dim = 0;
  float scale = 0.f;   // logit = scale * q . k
  Index q_offset = 0;  // absolute position of query row i is i + q_offset (keys: j)
  int threads = 0;

  /// Query head h reads KV head kv_head(h) (GQA/MQA).
  Index kv_head(Index h) const { return h / (q_heads / kv_heads); }

  /// Throws Error naming the first invalid field.
  void validate() const {
    using detail::require;
    require(batch >= 0, "batch", ">= 0", batch);
    require(q_len >= 0, "q_len", ">= 0", q_len);
    require(kv_len >= 0, "kv_len", ">= 0", kv_len);
    require(head_dim >= 1, "head_dim", ">= 1", head_dim);
    require(value_dim >= 1, "value_dim", ">= 1", value_dim);
    require(kv_heads >= 1, "kv_heads", ">= 1", kv_heads);
    require(q_heads >= 1 && q_heads % kv_heads == 0, "q_heads",
            "a positive multiple of kv_heads (" + std::to_string(kv_heads) + ")", q_heads);
    require(std::isfinite(scale) && scale != 0.f, "scale", "finite and non-zero", scale);
    require(threads >= 0, "threads", ">= 0", threads);
    // Positions i + q_offset and the ranges built from them must not overflow Index.
    require(q_offset >= -kMaxOffset && q_offset <= kMaxOffset, "q_offset", "within +-2^62",
            q_offset);
  }

  static constexpr Index kMaxOffset = Index{1} << 62;
};

namespace detail {

template <class T>
void check_view(const View<T>& v, const std::string& name) {
  require(v.batch >= 0, name + ".batch", ">= 0", v.batch);
  require(v.heads >= 0, name + ".heads", ">= 0", v.heads);
  require(v.seq >= 0, name + ".seq", ">= 0", v.seq);
  require(v.dim >= 0, name + ".dim", ">= 0", v.dim);
  require(v.batch_stride >= 0, name + ".batch_stride", ">= 0", v.batch_stride);
  require(v.head_stride >= 0, name + ".head_stride", ">= 0", v.head_stride);
  require(v.seq_stride >= 0, name + ".seq_stride", ">= 0", v.seq_stride);
  const bool empty = v.batch == 0 || v.heads == 0 || v.seq == 0 || v.dim == 0;
  require(empty || v.data != nullptr, name + ".data", "non-null", "nullptr");
}

// The rows of an output view must be distinct memory: threads write them concurrently.
// Sufficient check: sorted by stride, each dimension of extent > 1 steps past the whole
// block spanned by the smaller ones (every dense or padded layout passes).
template <class T>
void check_rows_distinct(const View<T>& v, const std::string& name) {
  if (v.batch == 0 || v.heads == 0 || v.seq == 0) return;  // no rows, nothing to overlap
  struct Dim {
    Index stride, extent;
    const char* label;
  };
  Dim dims[3] = {{v.seq_stride, v.seq, ".seq_stride"},
                 {v.head_stride, v.heads, ".head_stride"},
                 {v.batch_stride, v.batch, ".batch_stride"}};
  std::sort(std::begin(dims), std::end(dims),
            [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  Index span = v.dim;  // elements covered by one row, then by each block of rows
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    require(d.stride >= span, name + d.label,
            ">= " + std::to_string(span) + " (rows must not overlap)", d.stride);
    span = d.stride * d.extent;
  }
}

inline void require_dim(Index actual, Index expected, const std::string& what,
                        const std::string& source) {
  require(actual == expected, what, std::to_string(expected) + " (" + source + ")", actual);
}

}  // namespace detail

/// Deduces and validates the Problem of attention(q [B,Hq,Lq,D], k [B,Hkv,Lk,D],
/// v [B,Hkv,Lk,Dv], o [B,Hq,Lq,Dv]). Throws Error on any disagreement.
template <class Q, class K, class V, class O>
Problem make_problem(const View<Q>& q, const View<K>& k, const View<V>& v, const View<O>& o,
                     const Options& options = {}) {
  using detail::require_dim;
  detail::check_view(q, "q");
  detail::check_view(k, "k");
  detail::check_view(v, "v");
  detail::check_view(o, "o");
  detail::check_rows_distinct(o, "o");
  require_dim(k.batch, q.batch, "k.batch", "q.batch");
  require_dim(v.batch, q.batch, "v.batch", "q.batch");
  require_dim(o.batch, q.batch, "o.batch", "q.batch");
  require_dim(k.dim, q.dim, "k.dim", "q.dim");
  require_dim(v.heads, k.heads, "v.heads", "k.heads");
  require_dim(v.seq, k.seq, "v.seq", "k.seq");
  require_dim(o.heads, q.heads, "o.heads", "q.heads");
  require_dim(o.seq, q.seq, "o.seq", "q.seq");
  require_dim(o.dim, v.dim, "o.dim", "v.dim");

  Problem p;
  p.batch = q.batch;
  p.q_heads = q.heads;
  p.kv_heads = k.heads;
  p.q_len = q.seq;
  p.kv_len = k.seq;
  p.head_dim = q.dim;
  p.value_dim = v.dim;
  p.scale = options.scale ? *options.scale
                          : (q.dim > 0 ? 1.f / std::sqrt(static_cast<float>(q.dim)) : 0.f);
  p.q_offset = options.q_offset ? *options.q_offset : p.kv_len - p.q_len;
  p.threads = options.threads;
  p.validate();
  return p;
}

}  // namespace attnkit
