// exp2, log2, tanh and cos of a NEON simd::Vec in AArch64 intrinsics: simd/math.hpp's forms
// on Arm. xsimd 8's NEON kernels dispatch every operation through a table over all ten
// element types, so its polynomial functions (built from dozens of such operations on float
// and int batches) cost a translation unit 3-7 s of template instantiation each, and the
// umbrella header 14 s of GCC's time, against 3 s on x86-64. These are the same Cephes
// polynomials xsimd evaluates (within the same few ulp, tested against std:: in test_simd
// and test_simd_ops), written as a handful of intrinsics each.
#pragma once

#if defined(__aarch64__) && !defined(ATTNKIT_NO_SIMD)

#include <arm_neon.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "attnkit/simd/vec.hpp"

namespace attnkit::simd::neon {

/// c[0] x^(n-1) + ... + c[n-1], by Horner's rule with fused multiply-adds.
template <std::size_t N>
inline float32x4_t horner(float32x4_t x, const float (&c)[N]) {
  float32x4_t p = vdupq_n_f32(c[0]);
  for (std::size_t i = 1; i < N; ++i) p = vfmaq_f32(vdupq_n_f32(c[i]), p, x);
  return p;
}

/// 2^a = 2^k 2^f with k = round(a) and f in [-1/2, 1/2]: 2^f = 1 + f P(f) (Cephes exp2f,
/// relative error 1.7e-7), 2^k built in the exponent field. 0 at or below -127 (a k of -127
/// would make a subnormal), inf from 127 on, NaN stays NaN (the compares are false).
inline Vec exp2(Vec a) {
  constexpr float kP[] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                          5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f};
  const float32x4_t x = a;
  const float32x4_t k = vrndnq_f32(x);
  const float32x4_t f = vsubq_f32(x, k);
  const float32x4_t y = vfmaq_f32(vdupq_n_f32(1.f), f, horner(f, kP));
  const int32x4_t biased = vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127));
  const float32x4_t r = vmulq_f32(y, vreinterpretq_f32_s32(vshlq_n_s32(biased, 23)));
  const float32x4_t low = vbslq_f32(vcleq_f32(x, vdupq_n_f32(-127.f)), vdupq_n_f32(0.f), r);
  return Vec(vbslq_f32(vcgeq_f32(x, vdupq_n_f32(127.f)), vdupq_n_f32(HUGE_VALF), low));
}

/// log2(a) = e + log(m) log2(e) with a = m 2^e, m in [sqrt(1/2), sqrt(2)) and log(1 + t)
/// = t - t^2/2 + t^3 P(t) (Cephes logf); subnormals are scaled by 2^23 first. -inf at 0,
/// NaN below 0 and for NaN, inf at inf.
inline Vec log2(Vec a) {
  constexpr float kP[] = {7.0376836292e-2f,  -1.1514610310e-1f, 1.1676998740e-1f,
                          -1.2420140846e-1f, 1.4249322787e-1f,  -1.6668057665e-1f,
                          2.0000714765e-1f,  -2.4999993993e-1f, 3.3333331174e-1f};
  constexpr float kMinNormal = 1.17549435e-38f, kTwo23 = 8388608.f;
  const float32x4_t x0 = a;
  const uint32x4_t tiny = vcltq_f32(x0, vdupq_n_f32(kMinNormal));
  const float32x4_t x = vbslq_f32(tiny, vmulq_f32(x0, vdupq_n_f32(kTwo23)), x0);
  const uint32x4_t bits = vreinterpretq_u32_f32(x);
  float32x4_t e =
      vcvtq_f32_s32(vsubq_s32(vreinterpretq_s32_u32(vshrq_n_u32(bits, 23)), vdupq_n_s32(127)));
  e = vbslq_f32(tiny, vsubq_f32(e, vdupq_n_f32(23.f)), e);
  float32x4_t m = vreinterpretq_f32_u32(
      vorrq_u32(vandq_u32(bits, vdupq_n_u32(0x007FFFFFu)), vdupq_n_u32(0x3F800000u)));
  const uint32x4_t high = vcgtq_f32(m, vdupq_n_f32(1.41421356f));
  m = vbslq_f32(high, vmulq_f32(m, vdupq_n_f32(0.5f)), m);
  e = vbslq_f32(high, vaddq_f32(e, vdupq_n_f32(1.f)), e);
  const float32x4_t t = vsubq_f32(m, vdupq_n_f32(1.f));  // exact: m in [1/2, 2]
  const float32x4_t t2 = vmulq_f32(t, t);
  const float32x4_t tail =
      vfmaq_f32(vmulq_f32(vdupq_n_f32(-0.5f), t2), vmulq_f32(t, t2), horner(t, kP));
  float32x4_t r = vfmaq_f32(e, vaddq_f32(t, tail), vdupq_n_f32(1.4426950408889634f));
  r = vbslq_f32(vceqq_f32(x0, vdupq_n_f32(HUGE_VALF)), x0, r);
  r = vbslq_f32(vceqq_f32(x0, vdupq_n_f32(0.f)), vdupq_n_f32(-HUGE_VALF), r);
  const uint32x4_t not_nonneg = vmvnq_u32(vcgeq_f32(x0, vdupq_n_f32(0.f)));  // < 0 or NaN
  return Vec(vbslq_f32(not_nonneg, vdupq_n_f32(std::numeric_limits<float>::quiet_NaN()), r));
}

/// tanh(a): a + a^3 P(a^2) for |a| < 0.625 (Cephes tanhf), else sign(a) (1 - 2 / (e^2|a| +
/// 1)), which saturates to +-1 (e^2|a| overflows to inf) and keeps NaN.
inline Vec tanh(Vec a) {
  constexpr float kP[] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f,
                          1.33314422036e-1f, -3.33332819422e-1f};
  const float32x4_t x = a;
  const float32x4_t ax = vabsq_f32(x);
  const float32x4_t s = vmulq_f32(x, x);
  const float32x4_t small = vfmaq_f32(x, vmulq_f32(s, x), horner(s, kP));
  const float32x4_t e = exp2(Vec(vmulq_f32(ax, vdupq_n_f32(2.8853900817779268f))));  // 2 log2 e
  const float32x4_t one = vdupq_n_f32(1.f);
  const float32x4_t big_abs = vsubq_f32(one, vdivq_f32(vdupq_n_f32(2.f), vaddq_f32(e, one)));
  const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
  const float32x4_t big = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(big_abs), sign));
  return Vec(vbslq_f32(vcltq_f32(ax, vdupq_n_f32(0.625f)), small, big));
}

/// cos(a): a = q pi/2 + r with q = round(2a / pi) and |r| <= pi/4 (a three-part pi/2, each
/// product exact for |q| < 2^15), then +-cos r or +-sin r by the quadrant q mod 4 (Cephes
/// sinf/cosf polynomials). Absolute error a few ulp for |a| up to about 1e4.
inline Vec cos(Vec a) {
  constexpr float kSin[] = {-1.9515295891e-4f, 8.3321608736e-3f, -1.6666654611e-1f};
  constexpr float kCos[] = {2.443315711809948e-5f, -1.388731625493765e-3f, 4.166664568298827e-2f};
  const float32x4_t x = a;
  const float32x4_t q = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(0.63661977236758134f)));
  float32x4_t r = vfmsq_f32(x, q, vdupq_n_f32(1.5703125f));
  r = vfmsq_f32(r, q, vdupq_n_f32(4.837512969970703125e-4f));
  r = vfmsq_f32(r, q, vdupq_n_f32(7.54978995489188216e-8f));
  const float32x4_t r2 = vmulq_f32(r, r);
  const float32x4_t sin_r = vfmaq_f32(r, vmulq_f32(r2, r), horner(r2, kSin));
  const float32x4_t cos_r = vfmaq_f32(vfmsq_f32(vdupq_n_f32(1.f), vdupq_n_f32(0.5f), r2),
                                      vmulq_f32(r2, r2), horner(r2, kCos));
  const int32x4_t qi = vcvtq_s32_f32(q);
  const uint32x4_t odd = vtstq_s32(qi, vdupq_n_s32(1));  // quadrants 1, 3: +-sin r
  const float32x4_t v = vbslq_f32(odd, sin_r, cos_r);
  // Negative in quadrants 1 and 2 (mod 4): bit 1 of q + 1, moved to the sign bit.
  const uint32x4_t flip = vshlq_n_u32(
      vandq_u32(vreinterpretq_u32_s32(vaddq_s32(qi, vdupq_n_s32(1))), vdupq_n_u32(2u)), 30);
  return Vec(vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(v), flip)));
}

}  // namespace attnkit::simd::neon

#endif
