// kWidth int8 values, or kWidth 4-bit values (a byte's low or high nibble), widened to an f32
// Vec in registers: the quantized blocks' values (storage/blocks.hpp) as the decode engine and
// the packing read them. AVX-512, AVX2 and SSE4.1 sign- or zero-extend the bytes to 32-bit
// lanes in one instruction (vpmovsxbd / vpmovzxbd; AVX without AVX2 has no 256-bit form);
// NEON widens twice (vmovl); other paths go through memory. Never reads past the kWidth bytes at p.
#pragma once

#include <cstdint>
#include <cstring>

#include "attnkit/simd/vec.hpp"

namespace attnkit::simd {

namespace detail {
// The generic form: through memory, one lane at a time.
template <class Byte, class F>
Vec widen_bytes_generic(const Byte* p, F f) {
  alignas(64) float lanes[kWidth];
  for (int i = 0; i < kWidth; ++i) lanes[i] = static_cast<float>(f(p[i]));
  return load(lanes);
}
}  // namespace detail

/// The kWidth int8 values at p, as floats.
inline Vec load_i8(const std::int8_t* p) {
#if defined(ATTNKIT_NO_SIMD)
  return static_cast<float>(*p);
#elif defined(__AVX512F__)                      // xsimd's batch<float> is 16 lanes
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
#elif defined(__AVX2__)                         // 8 lanes
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
#elif defined(__SSE4_1__) && !defined(__AVX__)  // 4 lanes
  int word;
  std::memcpy(&word, p, sizeof word);
  return Vec(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(word))));
#elif defined(ATTNKIT_SIMD_NEON)
  std::int32_t word;
  std::memcpy(&word, p, sizeof word);
  const int16x8_t halves = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(word)));
  return Vec(vcvtq_f32_s32(vmovl_s16(vget_low_s16(halves))));
#else
  return detail::widen_bytes_generic(p, [](std::int8_t x) { return x; });
#endif
}

/// The low (high = false) or high nibbles of the kWidth bytes at p, minus 8: q4_0's values in
/// [-8, 7], as floats.
inline Vec load_u4(const std::uint8_t* p, bool high) {
  const int shift = high ? 4 : 0;
#if defined(ATTNKIT_NO_SIMD)
  return static_cast<float>(((*p >> shift) & 15) - 8);
#elif defined(__AVX512F__)
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i n =
      _mm512_and_si512(_mm512_srl_epi32(x, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(15));
  return Vec(_mm512_cvtepi32_ps(_mm512_sub_epi32(n, _mm512_set1_epi32(8))));
#elif defined(__AVX2__)
  const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i n =
      _mm256_and_si256(_mm256_srl_epi32(x, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(15));
  return Vec(_mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8))));
#elif defined(__SSE4_1__) && !defined(__AVX__)
  int word;
  std::memcpy(&word, p, sizeof word);
  const __m128i x = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(word));
  const __m128i n = _mm_and_si128(_mm_srl_epi32(x, _mm_cvtsi32_si128(shift)), _mm_set1_epi32(15));
  return Vec(_mm_cvtepi32_ps(_mm_sub_epi32(n, _mm_set1_epi32(8))));
#elif defined(ATTNKIT_SIMD_NEON)
  std::uint32_t word;
  std::memcpy(&word, p, sizeof word);
  const uint16x8_t halves = vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(word)));
  const int32x4_t x = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(halves)));
  const int32x4_t n = vandq_s32(vshlq_s32(x, vdupq_n_s32(-shift)), vdupq_n_s32(15));
  return Vec(vcvtq_f32_s32(vsubq_s32(n, vdupq_n_s32(8))));
#else
  return detail::widen_bytes_generic(p,
                                     [shift](std::uint8_t x) { return ((x >> shift) & 15) - 8; });
#endif
}

}  // namespace attnkit::simd
