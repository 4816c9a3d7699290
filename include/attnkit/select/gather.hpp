// Gathering for data-dependent sparsity: the rows a selector chose, copied together so the
// tiled kernel runs on them as on any dense input, and the results put back. A gathered call
// sees one (batch, head) of the whole problem: head_view() is that head as a 1 x 1 view of
// the caller's memory (no copy), gather_rows() copies chosen rows of it, scatter_rows()
// writes result rows back, for_head() gives the normalizer its head's parameters. The masks of such
// calls are Remapped (mask/remap.hpp); check_gathered_spec() is what every driver asks of a spec.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/normalizer/sigmoid.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/softcap.hpp"

namespace attnkit::select {

/// The compile-time checks of the gathered drivers (all_or_here, moba_attention,
/// stripe_attention, superlinear_attention) on their spec. A gathered call sees gathered
/// indices (its row r is not query r + q_offset, its key j not key j): the driver's selection
/// is the mask, and a Position or a Score that reads positions (Alibi) would see wrong ones.
template <class Spec>
constexpr void check_gathered_spec() {
  static_assert(std::is_same_v<typename Spec::Mask, Full>,
                "gathered driver: the selection (routes, spans, stripes) is the mask; give a "
                "spec with Mask Full");
  check_index_free_spec<Spec>();
}

/// check_gathered_spec() for the drivers whose parts merge by their LSE (moba_attention,
/// superlinear_attention and their backwards): a one-pass normalizer with a LogSumExp
/// statistic (normalizer/faces.hpp, merges_by_lse()).
template <class Spec>
constexpr void check_merged_spec() {
  static_assert(detail::merges_by_lse<typename Spec::Normalizer>(),
                "gathered driver: parts merge by their LSE: a one-pass normalizer with a "
                "LogSumExp row statistic (Softmax)");
  check_gathered_spec<Spec>();
}

/// Head h of batch b of v as a [1, 1, seq, dim] view of the same memory.
template <class T>
View<T> head_view(const View<T>& v, Index b, Index h) {
  View<T> one = v;
  one.data = v.row(b, h, 0);
  one.batch = one.heads = 1;
  return one;
}

/// Rows of one head, copied contiguously in their storage type; view() is [1, 1, n, dim].
template <class T>
struct GatheredRows {
  std::vector<std::remove_const_t<T>> data;
  Index rows = 0, dim = 0;
  View<const std::remove_const_t<T>> view() const {
    View<const std::remove_const_t<T>> v;
    v.data = data.data();
    v.batch = v.heads = 1;
    v.seq = rows;
    v.dim = dim;
    v.batch_stride = v.head_stride = rows * dim;
    v.seq_stride = dim;
    return v;
  }
};

/// src rows `rows[0 .. n)` of head h in batch b, in that order.
template <class T>
void gather_rows(const View<T>& src, Index b, Index h, const std::vector<Index>& rows,
                 GatheredRows<T>& out) {
  out.rows = static_cast<Index>(rows.size());
  out.dim = src.dim;
  out.data.resize(rows.size() * static_cast<std::size_t>(src.dim));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const T* in = src.row(b, h, rows[r]);
    std::copy(in, in + src.dim, out.data.begin() + static_cast<std::ptrdiff_t>(r) * src.dim);
  }
}

/// dst rows `rows[r]` of head h in batch b = row r of src ([1, 1, n, dim]).
template <class S, class T>
void scatter_rows(const View<S>& src, const std::vector<Index>& rows, const View<T>& dst, Index b,
                  Index h) {
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const S* in = src.row(0, 0, static_cast<Index>(r));
    T* out = dst.row(b, h, rows[r]);
    for (Index c = 0; c < dst.dim; ++c) out[c] = static_cast<T>(in[c]);
  }
}

/// The normalizer of a gathered call that stands for query head h: a gathered call has one
/// head, so per-head parameters (softmax sinks, sigmoid biases) are cut down to head h's
/// (the normalizer's for_head() face, normalizer/faces.hpp; itself without one).
template <class N>
decltype(auto) for_head(const N& n, Index h) {
  return attnkit::detail::head_normalizer(n, h);
}

}  // namespace attnkit::select
