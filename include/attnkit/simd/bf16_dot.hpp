// bf16 pair products: AVX512-BF16's vdpbf16ps, which multiplies 16 pairs of bf16 values by 16
// others and adds each lane's two products to an f32 lane (32 multiply-adds an instruction,
// an f32 FMA does 16). Builds with AVX512-BF16 define ATTNKIT_BF16_DOT and have
// kHasBf16Dot; elsewhere nothing here exists but the flag. The bf16 vector type has no load
// or cast intrinsics in GCC 12: memcpy (one vmovdqu16, one vpbroadcastd) stands in for them.
#pragma once

#include <cstdint>
#include <cstring>

#include "attnkit/simd/vec.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && !defined(ATTNKIT_NO_SIMD)
#include <immintrin.h>
#define ATTNKIT_BF16_DOT 1
#endif

namespace attnkit::simd {

#ifdef ATTNKIT_BF16_DOT
inline constexpr bool kHasBf16Dot = true;

/// 16 lanes of bf16 pairs: lane l holds elements 2l (low half) and 2l + 1.
struct Bf16Pairs {
  __m512bh v;
};

/// The 16 pairs at p (p[l]: lane l's pair).
inline Bf16Pairs load_pairs(const std::uint32_t* p) {
  Bf16Pairs out;
  std::memcpy(&out.v, p, sizeof out.v);
  return out;
}

/// The pair of bf16 values at p (p[0] low, p[1] high) in every lane.
inline Bf16Pairs broadcast_pair(const std::uint16_t* p) {
  std::int32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  const __m512i all = _mm512_set1_epi32(pair);
  Bf16Pairs out;
  std::memcpy(&out.v, &all, sizeof out.v);
  return out;
}

/// acc + a.low * b.low + a.high * b.high, lane by lane (subnormal products flushed to 0).
inline Vec dot_pairs(Vec acc, Bf16Pairs a, Bf16Pairs b) {
  return Vec(_mm512_dpbf16_ps(acc, a.v, b.v));
}
#else
inline constexpr bool kHasBf16Dot = false;
#endif

}  // namespace attnkit::simd
