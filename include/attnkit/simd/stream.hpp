// stream_copy(): a copy whose stores bypass the caches (non-temporal) where the ISA has them
// and the destination is 64-byte aligned, for data written once and read back much later (a
// GatedSaved's chunks, tens of MB): ordinary stores would read every line first (for
// ownership) and evict the working set. stream_fence() orders them before a later read by
// another thread. Elsewhere (scalar, Arm, unaligned) a plain copy.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnkit/core/index.hpp"

#if !defined(ATTNKIT_NO_SIMD) && (defined(__AVX512F__) || defined(__AVX__))
#include <immintrin.h>
#define ATTNKIT_STREAM_STORES 1
#endif

namespace attnkit::simd {

/// dst[0, n) = src[0, n) (non-temporal stores when available and dst is 64-byte aligned).
inline void stream_copy(const float* src, Index n, float* dst) {
#ifdef ATTNKIT_STREAM_STORES
  if ((reinterpret_cast<std::uintptr_t>(dst) & 63u) == 0) {
    Index i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#else
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#endif
    std::copy(src + i, src + n, dst + i);
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

/// Orders the stream_copy() stores before what follows.
inline void stream_fence() {
#ifdef ATTNKIT_STREAM_STORES
  _mm_sfence();
#endif
}

}  // namespace attnkit::simd
