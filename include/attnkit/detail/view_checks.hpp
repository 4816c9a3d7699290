// Checks on caller-supplied views, run once by make_problem() before anything is read or
// written: sizes and strides are sane, element offsets fit in Index, output rows are
// distinct, and outputs do not share memory with inputs or with each other.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/span.hpp"
#include "attnkit/core/tensor.hpp"

namespace attnkit::detail {

/// The bytes [begin, end) a view or buffer may touch; empty when begin == end.
struct ByteSpan {
  std::uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
};

template <class T>
bool is_empty(const View<T>& v) {
  return v.batch == 0 || v.heads == 0 || v.seq == 0 || v.dim == 0;
}

/// Elements (blocks for quantized storage) from v.data to one past the last element of the last
/// row, or -1 when that number (or its size in bytes) overflows Index. 0 for an empty view.
template <class T>
Index element_extent(const View<T>& v) {
  if (is_empty(v)) return 0;
  Index total = row_elements<T>(v.dim), term = 0;
  const Index extents[3] = {v.batch, v.heads, v.seq};
  const Index strides[3] = {v.batch_stride, v.head_stride, v.seq_stride};
  for (int d = 0; d < 3; ++d)
    if (!checked_mul(extents[d] - 1, strides[d], &term) || !checked_add(total, term, &total))
      return -1;
  Index bytes = 0;
  return checked_mul(total, Index{sizeof(T)}, &bytes) ? total : -1;
}

template <class T, class Name>
void check_view(const View<T>& v, const Name& name) {
  require(v.batch >= 0, cat(name, ".batch"), ">= 0", v.batch);
  require(v.heads >= 0, cat(name, ".heads"), ">= 0", v.heads);
  require(v.seq >= 0, cat(name, ".seq"), ">= 0", v.seq);
  require(v.dim >= 0, cat(name, ".dim"), ">= 0", v.dim);
  if constexpr (is_block_quantized<T>())
    require(v.dim % values_per_element<T>() == 0, cat(name, ".dim"),
            cat("a multiple of ", values_per_element<T>(), " (quantized blocks)"), v.dim);
  require(v.batch_stride >= 0, cat(name, ".batch_stride"), ">= 0", v.batch_stride);
  require(v.head_stride >= 0, cat(name, ".head_stride"), ">= 0", v.head_stride);
  require(v.seq_stride >= 0, cat(name, ".seq_stride"), ">= 0", v.seq_stride);
  require(is_empty(v) || v.data != nullptr, cat(name, ".data"), "non-null", "nullptr");
  require(element_extent(v) >= 0, name,
          "sizes and strides whose element offsets fit in Index (int64)", "an overflow");
}

/// The bytes a (checked) view spans, padding included.
template <class T>
ByteSpan byte_span(const View<T>& v) {
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data);
  return {begin, begin + static_cast<std::uintptr_t>(element_extent(v)) * sizeof(T)};
}

/// Throws Error naming both arguments when the address ranges the two spans cover overlap.
/// Conservative: an output interleaved with an input (one fused buffer holding q, k, v and
/// o slots per token) is refused even where no element is shared.
template <class AName, class BName>
void require_disjoint(const ByteSpan& a, const AName& a_name, const ByteSpan& b,
                      const BName& b_name) {
  const bool overlap = !a.empty() && !b.empty() && a.begin < b.end && b.begin < a.end;
  if (overlap)
    fail(a_name, cat("memory disjoint from ", b_name),
         cat("address ranges overlapping by ", std::min(a.end, b.end) - std::max(a.begin, b.begin),
             " bytes"));
}

// The rows of an output view must be distinct memory: threads write them concurrently.
// Sufficient check: sorted by stride, each dimension of extent > 1 steps past the whole
// block spanned by the smaller ones (every dense or padded layout passes).
/// A flat output buffer beside the views (a row statistic, a parameter gradient): empty, or
/// exactly `count` floats, what the call writes (`source` says why; the message names `name`).
inline void require_span_size(Span<float> s, Index count, const char* name, const char* source) {
  if (!s.empty()) require(s.size() == count, name, cat(count, " (", source, ")"), s.size());
}

template <class T, class Name>
void check_rows_distinct(const View<T>& v, const Name& name) {
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
  Index span = row_elements<T>(v.dim);  // elements covered by one row, then by each block of rows
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    require(d.stride >= span, cat(name, d.label), cat(">= ", span, " (rows must not overlap)"),
            d.stride);
    if (!checked_mul(d.stride, d.extent, &span)) return;  // nothing larger can follow
  }
}

}  // namespace attnkit::detail
