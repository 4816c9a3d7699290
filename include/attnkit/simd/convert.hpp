// bfloat16 and IEEE half storage widened to f32: whole arrays (widen_bf16, widen_f16), one
// vector in a register (load_bf16, load_f16), and two bf16 vectors at once in an even / odd
// split order (load_bf16_pair, with split_pairs / join_pairs to move between that order and
// memory order). Each says which ISAs convert in registers; elsewhere one element at a time.
// AArch64 (NEON, 4 lanes) has each in registers: bf16 by a widening shift (vshll), f16 by the
// base ISA's conversion (vcvt_f32_f16), pairs by vzip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnkit/core/half_bits.hpp"
#include "attnkit/simd/vec.hpp"

namespace attnkit::simd {

/// dst[0, n) = the f32 values of n bfloat16 bit patterns (the high half of an f32): a shift.
/// AVX-512 and AVX2 widen 16 or 8 at a time; elsewhere (and for the tail) one at a time.
/// The AVX-512 forms are the zero-masked ones: GCC 12 warns (-Wmaybe-uninitialized) about
/// the undefined pass-through operand of the unmasked ones once <immintrin.h> came first.
inline void widen_bf16(const std::uint16_t* src, float* dst, std::ptrdiff_t n) {
  std::ptrdiff_t i = 0;
#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
                                  0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16)));
  }
#elif !defined(ATTNKIT_NO_SIMD) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
#elif defined(ATTNKIT_SIMD_NEON)
  for (; i + 8 <= n; i += 8) {
    const uint16x8_t h = vld1q_u16(src + i);
    vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
    vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
  }
#endif
  for (; i < n; ++i) {
    const std::uint32_t bits = std::uint32_t{src[i]} << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

/// The f32 value of one IEEE half's bits (exact): F16C's vcvtph2ps where the ISA has it,
/// else detail::half_bits_to_float's bit form. A quantized block's scale, once a block.
inline float half_to_float(std::uint16_t h) {
#if !defined(ATTNKIT_NO_SIMD) && defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return attnkit::detail::half_bits_to_float(h);
#endif
}

/// dst[0, n) = the f32 values of n IEEE half bit patterns, with the F16C / AVX-512 / NEON
/// conversion instructions where the ISA has them; false when it has none (the caller
/// converts one at a time).
inline bool widen_f16(const std::uint16_t* src, float* dst, std::ptrdiff_t n) {
#if defined(ATTNKIT_SIMD_NEON)
  std::ptrdiff_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
    vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
  }
  for (; i < n; ++i)  // one lane at a time through the same conversion
    dst[i] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(src[i]))), 0);
  return true;
#elif !defined(ATTNKIT_NO_SIMD) && defined(__F16C__)
  std::ptrdiff_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i,
                     _mm512_maskz_cvtph_ps(
                         0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#endif
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (i < n) {  // the tail through a zero-padded block of 8
    alignas(16) std::uint16_t tail[8] = {};
    alignas(32) float out[8];
    std::memcpy(tail, src + i, static_cast<std::size_t>(n - i) * sizeof(std::uint16_t));
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tail))));
    std::memcpy(dst + i, out, static_cast<std::size_t>(n - i) * sizeof(float));
  }
  return true;
#else
  (void)src, (void)dst, (void)n;
  return false;
#endif
}

/// kWidth f32 values widened from the bfloat16 bits at src, in a register (no store).
inline Vec load_bf16(const std::uint16_t* src) {
#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512F__)
  return Vec(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(
      0xFFFF,
      _mm512_maskz_cvtepu16_epi32(0xFFFF,
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))),
      16)));
#elif !defined(ATTNKIT_NO_SIMD) && defined(__AVX2__)
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))), 16)));
#elif defined(ATTNKIT_SIMD_NEON)
  return Vec(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(src), 16)));
#else
  alignas(64) float out[kWidth];
  widen_bf16(src, out, kWidth);
  return load(out);
#endif
}

/// True when load_bf16_pair() splits even and odd elements (AVX-512, AVX2, NEON); elsewhere
/// it returns the two vectors in memory order.
#if !defined(ATTNKIT_NO_SIMD) && \
    (defined(__AVX512F__) || defined(__AVX2__) || defined(ATTNKIT_SIMD_NEON))
inline constexpr bool kSplitsBf16Pairs = true;
#else
inline constexpr bool kSplitsBf16Pairs = false;
#endif

/// The 2 kWidth f32 values of the bfloat16 bits at src, widened in registers with one shift
/// and one AND (no lane crossing, no load per vector): where kSplitsBf16Pairs, `even` holds
/// elements 0, 2, .., 2 kWidth - 2 and `odd` elements 1, 3, ..; elsewhere `even` holds
/// elements 0 .. kWidth - 1 and `odd` the rest. Element i of that order is element
/// pair_element(i) in memory; split_pairs() puts memory order in that order.
inline void load_bf16_pair(const std::uint16_t* src, Vec& even, Vec& odd) {
#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512F__)
  __m512i w = _mm512_loadu_si512(src);
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+v"(w));  // one load for both halves (see in_register())
#endif
  even = Vec(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16)));
  odd = Vec(_mm512_castsi512_ps(
      _mm512_maskz_and_epi32(0xFFFF, w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))));
#elif !defined(ATTNKIT_NO_SIMD) && defined(__AVX2__)
  __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+x"(w));
#endif
  even = Vec(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  odd = Vec(
      _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))));
#elif defined(ATTNKIT_SIMD_NEON)
  uint32x4_t w = vreinterpretq_u32_u16(vld1q_u16(src));
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+w"(w));
#endif
  even = Vec(vreinterpretq_f32_u32(vshlq_n_u32(w, 16)));
  odd = Vec(vreinterpretq_f32_u32(vandq_u32(w, vdupq_n_u32(0xFFFF0000u))));
#else
  even = load_bf16(src);
  odd = load_bf16(src + kWidth);
#endif
}

/// The memory index of element i of load_bf16_pair()'s order (i < 2 kWidth).
constexpr int pair_element(int i) {
  return !kSplitsBf16Pairs ? i : i < kWidth ? 2 * i : 2 * (i - kWidth) + 1;
}

/// dst[0, 2 kWidth) = src[0, 2 kWidth) in load_bf16_pair()'s order (src and dst distinct).
inline void split_pairs(const float* src, float* dst) {
  for (int i = 0; i < 2 * kWidth; ++i) dst[i] = src[pair_element(i)];
}

/// The inverse, times f: dst[pair_element(i)] = src[i] * f for i < 2 kWidth (src and dst
/// distinct): the even and odd halves interleaved.
inline void join_pairs(const float* src, float f, float* dst) {
  const Vec even = load(src) * Vec(f), odd = load(src + kWidth) * Vec(f);
#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512F__)
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  store(dst, Vec(_mm512_permutex2var_ps(even, lo, odd)));
  store(dst + kWidth, Vec(_mm512_permutex2var_ps(even, hi, odd)));
#elif !defined(ATTNKIT_NO_SIMD) && defined(__AVX2__)
  const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
  store(dst, Vec(_mm256_permute2f128_ps(lo, hi, 0x20)));
  store(dst + kWidth, Vec(_mm256_permute2f128_ps(lo, hi, 0x31)));
#elif defined(ATTNKIT_SIMD_NEON)
  store(dst, Vec(vzip1q_f32(even, odd)));
  store(dst + kWidth, Vec(vzip2q_f32(even, odd)));
#else
  store(dst, even);  // memory order (kSplitsBf16Pairs is false)
  store(dst + kWidth, odd);
#endif
}

/// True when load_f16() converts in registers (F16C, AVX-512's conversions, NEON's).
#if !defined(ATTNKIT_NO_SIMD) &&                                         \
    (defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__)) || \
     defined(ATTNKIT_SIMD_NEON))
inline constexpr bool kWidensF16 = true;
#else
inline constexpr bool kWidensF16 = false;
#endif

/// kWidth f32 values widened from the IEEE half bits at src, in a register. Only where
/// kWidensF16; callers convert one at a time elsewhere.
inline Vec load_f16(const std::uint16_t* src) {
#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512F__)
  return Vec(
      _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
#elif !defined(ATTNKIT_NO_SIMD) && defined(__AVX2__) && defined(__F16C__)
  return Vec(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
#elif defined(ATTNKIT_SIMD_NEON)
  return Vec(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src))));
#else
  (void)src;
  return Vec(0.f);  // not reached: kWidensF16 is false here
#endif
}

}  // namespace attnkit::simd
