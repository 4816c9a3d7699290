// Software prefetch of a view's rows into the cache, for reads the hardware prefetchers
// cannot foresee: the gathered columns' key and value rows (kernel/tile_columns.hpp), a few
// scattered rows per query (PowerOfTwo's i - 2^k), each asked for a few queries ahead.
#pragma once

#include <type_traits>

#include "attnkit/detail/aligned.hpp"
#include "attnkit/quant/blocks.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

/// Asks for rows [row0, row0 + rows) of (b, h) in x, for reading or (write) for writing.
template <class T>
void prefetch_rows(const View<T>& x, Index b, Index h, Index row0, Index rows, bool write) {
#if defined(__GNUC__) || defined(__clang__)
  using Element = std::remove_const_t<T>;
  const Index bytes = row_elements<Element>(x.dim) * static_cast<Index>(sizeof(Element));
  for (Index r = 0; r < rows; ++r) {
    const char* row = reinterpret_cast<const char*>(x.row(b, h, row0 + r));
    for (Index at = 0; at < bytes; at += static_cast<Index>(kCacheLine)) {
      if (write)
        __builtin_prefetch(row + at, 1, 3);
      else
        __builtin_prefetch(row + at, 0, 3);
    }
  }
#else
  (void)x, (void)b, (void)h, (void)row0, (void)rows, (void)write;
#endif
}

}  // namespace attnkit::detail
