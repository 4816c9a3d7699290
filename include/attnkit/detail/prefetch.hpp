// Software prefetch of rows into the cache, for reads the hardware prefetchers do not
// foresee: split-KV decode's K and V rows a few blocks ahead (kernel/decode_rows.hpp), and the
// gathered columns' K and V rows, a few scattered rows per query (PowerOfTwo's i - 2^k), asked
// for a few queries ahead (kernel/tile_columns.hpp).
#pragma once

#include "attnkit/detail/aligned.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

/// Every cache line of n rows of `bytes` bytes, ld elements apart, asked for to be read.
template <class T>
void prefetch_rows(const T* rows, Index ld, Index n, Index bytes) {
  for (Index j = 0; j < n; ++j) {
    const char* row = reinterpret_cast<const char*>(rows + j * ld);
    for (Index at = 0; at < bytes; at += static_cast<Index>(kCacheLine))
      __builtin_prefetch(row + at);
  }
}

}  // namespace attnkit::detail
