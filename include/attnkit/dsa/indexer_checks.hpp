// The checks of indexer_topk() and its reference, before anything is written: the shapes of
// q_I [B, Hi, Lq, Di], the weights [B, Hi, Lq, 1], k_I [B, 1, Lk, Di] and the selection
// [B, 1, Lq, topk]; topk >= 1; finite inputs (a NaN would make the order of the scores
// undefined); no scale option (fold it into the weights); the selection sharing no memory
// with an input.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {

/// What the indexer keeps: the topk keys of each query, among those it sees (causal: keys
/// s <= t + q_offset; else all).
struct IndexerSpec {
  Index topk = 2048;
  bool causal = true;
};

namespace detail {

/// The sizes of one indexer_topk() call, and its blocking.
struct IndexerShape {
  Index batch = 0, heads = 0, q_len = 0, k_len = 0, dim = 0, topk = 0, offset = 0;
  bool causal = true;
  Index ldd = 0, k_len_pad = 0, block = 1;  // Di and Lk padded to vectors; queries a block
  Index ldkt = 0;  // the rows of k_I transposed: k_len_pad and a cache line (no power-of-two
                   // stride: a GEMM panel's rows would share the L1's sets)
};

// Every value of x's rows (in f32) is finite: x * 0 is NaN exactly for inf and NaN, tested a
// vector at a time (f32 rows read in place, others widened a row at a time).
template <class T>
bool all_finite(const View<T>& x) {
  const Index ld = simd::round_up(x.dim);
  std::vector<float> row(std::size_t(ld), 0.f);
  const simd::Vec zero(0.f);
  for (Index b = 0; b < x.batch; ++b)
    for (Index h = 0; h < x.heads; ++h)
      for (Index t = 0; t < x.seq; ++t) {
        const float* r = row.data();
        Index whole = 0;  // leading floats tested in place
        if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
          r = x.row(b, h, t);
          whole = x.dim / simd::kWidth * simd::kWidth;
          for (Index c = 0; c < whole; c += simd::kWidth)
            if (simd::any(simd::is_nan(simd::load(r + c) * zero))) return false;
          for (Index c = whole; c < x.dim; ++c)
            if (!std::isfinite(r[c])) return false;
          continue;
        }
        pack_rows(x, b, h, t, 1, row.data(), ld);
        for (Index c = 0; c < ld; c += simd::kWidth)
          if (simd::any(simd::is_nan(simd::load(r + c) * zero))) return false;
      }
  return true;
}

template <class QI, class KI>
IndexerShape check_indexer(const IndexerSpec& spec, const View<QI>& q, const View<const float>& w,
                           const View<KI>& k, const View<std::int32_t>& selected,
                           const Options& options) {
  check_view(q, "q_index");
  check_view(w, "weights");
  check_view(k, "k_index");
  check_view(selected, "selected");
  require(spec.topk >= 1, "spec.topk", ">= 1", spec.topk);
  require(!options.scale.has_value(), "options.scale", "unset (fold a scale into the weights)",
          options.scale.value_or(0.f));
  IndexerShape s;
  s.batch = q.batch;
  s.heads = q.heads;
  s.q_len = q.seq;
  s.k_len = k.seq;
  s.dim = q.dim;
  s.topk = spec.topk;
  s.causal = spec.causal;
  s.offset = options.q_offset.value_or(k.seq - q.seq);
  require_dim(w.batch, s.batch, "weights.batch", "q_index.batch");
  require_dim(w.heads, s.heads, "weights.heads", "q_index.heads");
  require_dim(w.seq, s.q_len, "weights.seq", "q_index.seq");
  require_dim(w.dim, 1, "weights.dim", "1");
  require_dim(k.batch, s.batch, "k_index.batch", "q_index.batch");
  require_dim(k.heads, 1, "k_index.heads", "1 (one key shared by the indexer heads)");
  require_dim(k.dim, s.dim, "k_index.dim", "q_index.dim");
  require_dim(selected.batch, s.batch, "selected.batch", "q_index.batch");
  require_dim(selected.heads, 1, "selected.heads", "1 (one selection shared by the heads)");
  require_dim(selected.seq, s.q_len, "selected.seq", "q_index.seq");
  require_dim(selected.dim, spec.topk, "selected.dim", "spec.topk");
  require(s.k_len <= INT32_MAX, "k_index.seq", "<= 2^31 - 1 (int32 key indices)", s.k_len);
  require(all_finite(q), "q_index", "finite values", "NaN or inf");
  require(all_finite(w), "weights", "finite values", "NaN or inf");
  require(all_finite(k), "k_index", "finite values", "NaN or inf");
  const ByteSpan out = byte_span(selected);
  require_disjoint(out, "selected", byte_span(q), "q_index");
  require_disjoint(out, "selected", byte_span(w), "weights");
  require_disjoint(out, "selected", byte_span(k), "k_index");
  s.ldd = simd::round_up(s.dim);
  s.k_len_pad = simd::round_up(std::max<Index>(s.k_len, 1));
  s.ldkt = s.k_len_pad + 16;
  s.block = std::clamp<Index>(384 / std::max<Index>(s.heads, 1), 1, 16);  // ~384 GEMM rows
  return s;
}

}  // namespace detail
}  // namespace attnkit
