// simd::Mask: per-lane booleans of a simd::Vec, the comparisons that make them (ranges, NaN,
// equality, order), their combinations and the selects that use them (a lane's -inf to 0,
// 1 / a with 0 kept at 0).
#pragma once

#include <cmath>

#include "attnkit/simd/vec.hpp"

namespace attnkit::simd {

#ifdef ATTNKIT_NO_SIMD

inline Vec zero_if_neg_inf(Vec a) { return a.x == -HUGE_VALF ? 0.f : a.x; }
using Mask = bool;
inline Mask in_range(Vec x, Vec lo, Vec hi) { return lo.x <= x.x && x.x < hi.x; }
inline Mask either(Mask a, Mask b) { return a || b; }
inline Mask is_nan(Vec a) { return std::isnan(a.x); }
inline Vec inverse_or_zero(Vec a) { return a.x == 0.f ? 0.f : 1.f / a.x; }
inline Vec select(Mask m, Vec a, Vec b) { return m ? a : b; }
inline Mask equal(Vec a, Vec b) { return a.x == b.x; }
inline Mask greater(Vec a, Vec b) { return a.x > b.x; }
inline Mask both(Mask a, Mask b) { return a && b; }
inline bool any(Mask m) { return m; }

#elif defined(ATTNKIT_SIMD_NEON)

// AArch64: the same operations in one or two intrinsics each (xsimd 8's NEON comparisons and
// selects cost seconds of compile time per translation unit; see simd/vec.hpp).
using Mask = Vec::batch_bool_type;
inline Vec zero_if_neg_inf(Vec a) {
  return Vec(vbslq_f32(vceqq_f32(a, vdupq_n_f32(-HUGE_VALF)), vdupq_n_f32(0.f), a));
}
inline Mask in_range(Vec x, Vec lo, Vec hi) {
  return Mask(vandq_u32(vcleq_f32(lo, x), vcltq_f32(x, hi)));
}
inline Mask either(Mask a, Mask b) { return Mask(vorrq_u32(a, b)); }
inline Mask is_nan(Vec a) { return Mask(vmvnq_u32(vceqq_f32(a, a))); }
inline Vec inverse_or_zero(Vec a) {
  const float32x4_t zero = vdupq_n_f32(0.f);
  return Vec(vbslq_f32(vceqq_f32(a, zero), zero, vdivq_f32(vdupq_n_f32(1.f), a)));
}
inline Vec select(Mask m, Vec a, Vec b) { return Vec(vbslq_f32(m, a, b)); }
inline Mask equal(Vec a, Vec b) { return Mask(vceqq_f32(a, b)); }
inline Mask greater(Vec a, Vec b) { return Mask(vcgtq_f32(a, b)); }
inline Mask both(Mask a, Mask b) { return Mask(vandq_u32(a, b)); }
inline bool any(Mask m) { return vmaxvq_u32(m) != 0; }

#else

/// a, with lanes equal to -inf replaced by 0.
inline Vec zero_if_neg_inf(Vec a) { return xsimd::select(a == Vec(-HUGE_VALF), Vec(0.f), a); }

/// Per-lane booleans of a Vec.
using Mask = Vec::batch_bool_type;
/// lo <= x < hi, lane by lane.
inline Mask in_range(Vec x, Vec lo, Vec hi) { return (lo <= x) & (x < hi); }
inline Mask either(Mask a, Mask b) { return a | b; }
/// NaN lanes. Not `a != a`: xsimd 8.1 compares != with an ordered predicate on AVX and
/// AVX-512, false for NaN.
inline Mask is_nan(Vec a) { return !(a == a); }
/// 1 / a, and 0 where a is 0 (an l1 or softmax row that saw nothing finalizes to 0, never
/// NaN; a NaN row sum stays NaN).
inline Vec inverse_or_zero(Vec a) { return xsimd::select(a == Vec(0.f), Vec(0.f), Vec(1.f) / a); }
/// a where m is set, else b.
inline Vec select(Mask m, Vec a, Vec b) { return xsimd::select(m, a, b); }
/// Lane-wise a == b and a > b (false where either is NaN).
inline Mask equal(Vec a, Vec b) { return a == b; }
inline Mask greater(Vec a, Vec b) { return a > b; }
inline Mask both(Mask a, Mask b) { return a & b; }
/// True when some lane is set.
inline bool any(Mask m) { return xsimd::any(m); }

#endif

}  // namespace attnkit::simd
