// transpose_block(): a kWidth x kWidth block of floats transposed. AVX-512 moves its 16 x 16
// block through registers (three rounds of interleaves, 64 shuffles for 256 values, instead
// of 256 scalar moves), AVX2 its 8 x 8 (24 shuffles for 64 values); other ISAs copy element
// by element.
#pragma once

#include <cstddef>

#include "attnkit/simd/vec.hpp"

namespace attnkit::simd {

/// dst[c * ldd + r] = src[r * lds + c] for r, c < kWidth.
inline void transpose_block(const float* src, std::ptrdiff_t lds, float* dst, std::ptrdiff_t ldd) {
#if defined(__AVX512F__) && !defined(ATTNKIT_NO_SIMD)
  if constexpr (kWidth == 16) {
    // Zero-masked forms throughout: GCC 12 warns on the others' undefined passthrough.
    constexpr __mmask16 kAll = 0xFFFF;
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    // In each 128-bit lane k: t[2i] = rows 2i, 2i+1 at columns 4k, 4k+1, interleaved;
    // t[2i+1] the same at 4k+2, 4k+3.
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_maskz_unpacklo_ps(kAll, r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[2 * i], r[2 * i + 1]);
    }
    // r[4i + m], lane k: column 4k + m of rows 4i .. 4i + 3.
    const auto lo = [](__m512 a, __m512 b) {
      constexpr __mmask8 kAllPd = 0xFF;
      return _mm512_castpd_ps(
          _mm512_maskz_unpacklo_pd(kAllPd, _mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    const auto hi = [](__m512 a, __m512 b) {
      constexpr __mmask8 kAllPd = 0xFF;
      return _mm512_castpd_ps(
          _mm512_maskz_unpackhi_pd(kAllPd, _mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    for (int i = 0; i < 4; ++i) {
      r[4 * i] = lo(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
    }
    // Column 4k + m: lane k of r[m], r[4 + m], r[8 + m], r[12 + m].
    for (int m = 0; m < 4; ++m) {
      const __m512 ab_lo = _mm512_maskz_shuffle_f32x4(kAll, r[m], r[4 + m], 0x44);
      const __m512 ab_hi = _mm512_maskz_shuffle_f32x4(kAll, r[m], r[4 + m], 0xEE);
      const __m512 cd_lo = _mm512_maskz_shuffle_f32x4(kAll, r[8 + m], r[12 + m], 0x44);
      const __m512 cd_hi = _mm512_maskz_shuffle_f32x4(kAll, r[8 + m], r[12 + m], 0xEE);
      _mm512_storeu_ps(dst + m * ldd, _mm512_maskz_shuffle_f32x4(kAll, ab_lo, cd_lo, 0x88));
      _mm512_storeu_ps(dst + (4 + m) * ldd, _mm512_maskz_shuffle_f32x4(kAll, ab_lo, cd_lo, 0xDD));
      _mm512_storeu_ps(dst + (8 + m) * ldd, _mm512_maskz_shuffle_f32x4(kAll, ab_hi, cd_hi, 0x88));
      _mm512_storeu_ps(dst + (12 + m) * ldd, _mm512_maskz_shuffle_f32x4(kAll, ab_hi, cd_hi, 0xDD));
    }
    return;
  }
#endif
#if defined(__AVX2__) && !defined(ATTNKIT_NO_SIMD)
  if constexpr (kWidth == 8) {
    // The same three rounds on 8 x 8: pairs of rows interleaved, then pairs of pairs, then
    // the 128-bit halves: out[c] holds column c in its low half for c < 4, high half after.
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // r[4i + m]: column m of rows 4i .. 4i + 3 (low half), column m + 4 (high half).
    for (int i = 0; i < 2; ++i) {
      r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int m = 0; m < 4; ++m) {
      _mm256_storeu_ps(dst + m * ldd, _mm256_permute2f128_ps(r[m], r[4 + m], 0x20));
      _mm256_storeu_ps(dst + (4 + m) * ldd, _mm256_permute2f128_ps(r[m], r[4 + m], 0x31));
    }
    return;
  }
#endif
  for (int c = 0; c < kWidth; ++c)
    for (int r = 0; r < kWidth; ++r) dst[c * ldd + r] = src[r * lds + c];
}

}  // namespace attnkit::simd
