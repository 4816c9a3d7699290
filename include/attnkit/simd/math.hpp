// Elementwise functions of a simd::Vec: exp2, log2, tanh, cos, softplus; each says what it
// returns at the edges (exp2's 0 and inf, log2's -inf), which the normalizers rely on.
#pragma once

#include <cmath>
#include <cstddef>

#include "attnkit/simd/neon_math.hpp"
#include "attnkit/simd/vec.hpp"

namespace attnkit::simd {

#ifdef ATTNKIT_NO_SIMD

// The SIMD path's contract: 0 at or below -127 (no subnormal results, so 1 / a row sum of
// such weights stays finite), inf from 127 on.
inline Vec exp2(Vec a) { return a.x <= -127.f ? 0.f : a.x >= 127.f ? HUGE_VALF : std::exp2(a.x); }
inline Vec log2(Vec a) { return std::log2(a.x); }
inline Vec tanh(Vec a) { return std::tanh(a.x); }
inline Vec cos(Vec a) { return std::cos(a.x); }

#elif defined(ATTNKIT_SIMD_NEON)

// AArch64: the intrinsic forms (simd/neon_math.hpp), same edges as below.
inline Vec exp2(Vec a) { return neon::exp2(a); }
inline Vec log2(Vec a) { return neon::log2(a); }
inline Vec tanh(Vec a) { return neon::tanh(a); }
inline Vec cos(Vec a) { return neon::cos(a); }

#else

/// 2^a for a < 127 (xsimd returns inf from 127 on, and 0 at or below -127).
inline Vec exp2(Vec a) { return xsimd::exp2(a); }
/// log2(a); -inf at 0.
inline Vec log2(Vec a) {
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__) && defined(__AVX512BW__)
  // GCC without optimization defines the AVX-512BW blend intrinsics as macros whose casts
  // refuse the xsimd::batch<int> that xsimd's log2 hands them (xsimd 8.1): a Debug build
  // on an AVX-512 machine would not compile. There it goes lane by lane.
  alignas(64) float lanes[kWidth];
  a.store_aligned(lanes);
  for (float& x : lanes) x = std::log2(x);
  return Vec::load_aligned(lanes);
#else
  return xsimd::log2(a);
#endif
}
inline Vec tanh(Vec a) { return xsimd::tanh(a); }
inline Vec cos(Vec a) { return xsimd::cos(a); }

#endif

/// log(1 + e^x) for every x: max(x, 0) + u q(u) with u = e^-|x| in [0, 1] and q(u) =
/// log1p(u) / u as a degree-8 polynomial (a Chebyshev fit on [0, 1], relative error 3.3e-8
/// before f32 rounding). Relative accuracy holds down to tiny u, so a very negative x gives
/// e^x, not 0: the error is a few ulp plus what exp2 inherits from rounding |x| log2 e
/// (about |x| / 2 ulp: 3.7e-6 at x = -80). No log and no division: 2x cheaper than
/// log2-based forms. -inf gives 0, +inf gives +inf, NaN stays NaN.
inline Vec softplus(Vec x) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kQ[] = {0.005126102140966913f, -0.0290740646774942f,  0.07751608674036942f,
                          -0.13602247622479405f, 0.19076880735747795f,  -0.24835398988515545f,
                          0.3331812170753319f,   -0.49999444976340096f, 0.9999999659255097f};
  const Vec u = exp2(abs(x) * Vec(-kLog2e));
  Vec q(kQ[0]);
  for (std::size_t i = 1; i < sizeof kQ / sizeof kQ[0]; ++i) q = fma(q, u, Vec(kQ[i]));
  return fma(u, q, max(x, Vec(0.f)));
}

}  // namespace attnkit::simd
