// The SIMD layer: the only header that names xsimd. It exposes one float vector type
// `simd::Vec` of kWidth lanes and the few operations the kernels need. Defining
// ATTNKIT_NO_SIMD selects a scalar Vec (one lane) with the same interface, so every kernel
// has a portable path that tests compare against the vector one.
// Version shims: xsimd 8.1 (Debian 12) has hadd() but no reduce_add()/reduce_max().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifndef ATTNKIT_NO_SIMD
// GCC 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsic headers when
// they are inlined (the _mm512_undefined_* pass-through operands, GCC PR 105593, fixed in
// 13). Silencing it while those headers are parsed keeps -Werror usable, as long as
// nothing included <immintrin.h> (Eigen does) before attnkit: include attnkit first.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <xsimd/xsimd.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace attnkit::simd {

#ifdef ATTNKIT_NO_SIMD

/// Scalar stand-in for a SIMD register: one lane, same operations.
struct Vec {
  float x;
  Vec() = default;
  Vec(float v) : x(v) {}  // NOLINT(google-explicit-constructor): mirrors xsimd broadcast
  friend Vec operator+(Vec a, Vec b) { return a.x + b.x; }
  friend Vec operator-(Vec a, Vec b) { return a.x - b.x; }
  friend Vec operator*(Vec a, Vec b) { return a.x * b.x; }
  friend Vec operator/(Vec a, Vec b) { return a.x / b.x; }
};
inline constexpr int kWidth = 1;
inline constexpr int kRegisters = 16;  // what the compiler has for the scalar path
inline constexpr const char* kArchName = "scalar";

inline Vec load(const float* p) { return *p; }
inline void store(float* p, Vec v) { *p = v.x; }
inline Vec fma(Vec a, Vec b, Vec c) { return std::fma(a.x, b.x, c.x); }
inline Vec max(Vec a, Vec b) { return std::max(a.x, b.x); }
inline Vec min(Vec a, Vec b) { return std::min(a.x, b.x); }
// The SIMD path's contract: 0 at or below -127 (no subnormal results, so 1 / a row sum of
// such weights stays finite), inf from 127 on.
inline Vec exp2(Vec a) { return a.x <= -127.f ? 0.f : a.x >= 127.f ? HUGE_VALF : std::exp2(a.x); }
inline Vec log2(Vec a) { return std::log2(a.x); }
inline Vec tanh(Vec a) { return std::tanh(a.x); }
inline Vec cos(Vec a) { return std::cos(a.x); }
inline float reduce_add(Vec a) { return a.x; }
inline float reduce_max(Vec a) { return a.x; }
inline Vec transpose_add(const Vec* rows) { return rows[0]; }
inline Vec zero_if_neg_inf(Vec a) { return a.x == -HUGE_VALF ? 0.f : a.x; }
using Mask = bool;
inline Mask in_range(Vec x, Vec lo, Vec hi) { return lo.x <= x.x && x.x < hi.x; }
inline Mask either(Mask a, Mask b) { return a || b; }
inline Mask is_nan(Vec a) { return std::isnan(a.x); }
inline Vec inverse_or_zero(Vec a) { return a.x == 0.f ? 0.f : 1.f / a.x; }
inline Vec select(Mask m, Vec a, Vec b) { return m ? a : b; }
inline Vec abs(Vec a) { return std::fabs(a.x); }
inline Mask equal(Vec a, Vec b) { return a.x == b.x; }
inline Mask greater(Vec a, Vec b) { return a.x > b.x; }
inline Mask both(Mask a, Mask b) { return a && b; }
inline bool any(Mask m) { return m; }

#else

using Vec = xsimd::batch<float>;
inline constexpr int kWidth = static_cast<int>(Vec::size);
// AVX-512 has 32 vector registers, SSE and AVX2 have 16: this sizes the GEMM register block.
inline constexpr int kRegisters = kWidth >= 16 ? 32 : 16;
inline constexpr const char* kArchName = Vec::arch_type::name();

inline Vec load(const float* p) { return xsimd::load_unaligned(p); }
inline void store(float* p, Vec v) { v.store_unaligned(p); }
/// a * b + c, rounded once where the ISA has an FMA instruction (SSE4 has none: twice).
inline Vec fma(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  // xsimd 8.1 has no AVX-512 fma kernel: its generic a * b + c is fused only when the
  // compiler contracts it (GCC at -O1+, not Clang 14). Call the instruction directly.
  if constexpr (kWidth == 16) return Vec(_mm512_fmadd_ps(a, b, c));
#endif
  return xsimd::fma(a, b, c);
}
inline Vec max(Vec a, Vec b) { return xsimd::max(a, b); }
inline Vec min(Vec a, Vec b) { return xsimd::min(a, b); }
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
inline Vec abs(Vec a) { return xsimd::abs(a); }
/// Lane-wise a == b and a > b (false where either is NaN).
inline Mask equal(Vec a, Vec b) { return a == b; }
inline Mask greater(Vec a, Vec b) { return a > b; }
inline Mask both(Mask a, Mask b) { return a & b; }
/// True when some lane is set.
inline bool any(Mask m) { return xsimd::any(m); }

inline float reduce_add(Vec a) {
#if XSIMD_VERSION_MAJOR >= 10
  return xsimd::reduce_add(a);
#else
  return xsimd::hadd(a);
#endif
}

inline float reduce_max(Vec a) {
  // Called once per row and tile, so a store and a short loop are cheap enough and work
  // on every xsimd version.
  alignas(64) float lanes[kWidth];
  a.store_aligned(lanes);
  return *std::max_element(lanes, lanes + kWidth);
}

/// Lane t of the result is the sum of the lanes of rows[t] (t < kWidth): kWidth horizontal
/// sums in about 2 kWidth shuffles and adds, instead of a reduction each. xsimd's haddp()
/// serves 4 and 8 lanes; its AVX-512 form in xsimd 8.1 returns the sums out of order, so
/// 16 lanes have their own: four halving steps, each adding two shuffles of a pair of
/// vectors (zero-masked forms: see the GCC 12 note above).
inline Vec transpose_add(const Vec* rows) {
#if defined(__AVX512F__)
  if constexpr (kWidth == 16) {
    constexpr __mmask16 kAll = 0xFFFF;
    const auto half = [](__m512 a, __m512 b, auto lo, auto hi) {
      return _mm512_maskz_add_ps(kAll, lo(a, b), hi(a, b));
    };
    const auto quarters_lo = [](__m512 a, __m512 b) {
      return _mm512_maskz_shuffle_f32x4(kAll, a, b, 0x44);
    };
    const auto quarters_hi = [](__m512 a, __m512 b) {
      return _mm512_maskz_shuffle_f32x4(kAll, a, b, 0xEE);
    };
    const auto quarters_even = [](__m512 a, __m512 b) {
      return _mm512_maskz_shuffle_f32x4(kAll, a, b, 0x88);
    };
    const auto quarters_odd = [](__m512 a, __m512 b) {
      return _mm512_maskz_shuffle_f32x4(kAll, a, b, 0xDD);
    };
    const auto lanes_even = [](__m512 a, __m512 b) {
      return _mm512_maskz_shuffle_ps(kAll, a, b, 0x88);
    };
    const auto lanes_odd = [](__m512 a, __m512 b) {
      return _mm512_maskz_shuffle_ps(kAll, a, b, 0xDD);
    };
    // The steps leave row P[t] in lane t for P = {0, 2, 1, 3, 8, 10, 9, 11, 4, ...}; P is its
    // own inverse, so feeding row P[t] as input t puts every sum in its own lane.
    constexpr int kP[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    __m512 c[8], f[4], p[2];
    for (int i = 0; i < 8; ++i) c[i] = half(rows[kP[i]], rows[kP[i + 8]], quarters_lo, quarters_hi);
    for (int i = 0; i < 4; ++i) f[i] = half(c[i], c[i + 4], quarters_even, quarters_odd);
    for (int i = 0; i < 2; ++i) p[i] = half(f[i], f[i + 2], lanes_even, lanes_odd);
    return Vec(half(p[0], p[1], lanes_even, lanes_odd));
  }
#endif
  return xsimd::haddp(rows);
}

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
#endif
  for (; i < n; ++i) {
    const std::uint32_t bits = std::uint32_t{src[i]} << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

/// dst[0, n) = the f32 values of n IEEE half bit patterns, with the F16C / AVX-512
/// conversion instructions where the ISA has them; false when it has none (the caller
/// converts one at a time).
inline bool widen_f16(const std::uint16_t* src, float* dst, std::ptrdiff_t n) {
#if !defined(ATTNKIT_NO_SIMD) && defined(__F16C__)
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
#else
  alignas(64) float out[kWidth];
  widen_bf16(src, out, kWidth);
  return load(out);
#endif
}

/// True when load_bf16_pair() splits even and odd elements (AVX-512, AVX2); elsewhere it
/// returns the two vectors in memory order.
#if !defined(ATTNKIT_NO_SIMD) && (defined(__AVX512F__) || defined(__AVX2__))
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
#else
  store(dst, even);  // memory order (kSplitsBf16Pairs is false)
  store(dst + kWidth, odd);
#endif
}

/// True when load_f16() converts in registers (F16C, or AVX-512's conversions).
#if !defined(ATTNKIT_NO_SIMD) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__)))
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
#else
  (void)src;
  return Vec(0.f);  // not reached: kWidensF16 is false here
#endif
}

/// v, held in a register: keeps the compiler from folding the load behind v into each
/// instruction that uses it (GCC does, for a vector that feeds several FMAs; every fold is a
/// load of its own, and Zen 4 issues one 512-bit load per cycle). An empty asm statement
/// that claims to change v; no instruction is emitted.
inline Vec in_register(Vec v) {
#if !defined(ATTNKIT_NO_SIMD) && (defined(__GNUC__) || defined(__clang__))
  auto raw = static_cast<typename Vec::register_type>(v);
  asm("" : "+v"(raw));
  return Vec(raw);
#else
  return v;
#endif
}

/// a . b over n floats (any n): four accumulators hide the FMA latency (d = 128 is 8
/// vectors on AVX-512, two per accumulator), a scalar tail for n not a multiple of the width.
inline float dot(const float* a, const float* b, std::ptrdiff_t n) {
  constexpr std::ptrdiff_t w = kWidth;
  Vec acc0(0.f), acc1(0.f), acc2(0.f), acc3(0.f);
  std::ptrdiff_t c = 0;
  for (; c + 4 * w <= n; c += 4 * w) {
    acc0 = fma(load(a + c), load(b + c), acc0);
    acc1 = fma(load(a + c + w), load(b + c + w), acc1);
    acc2 = fma(load(a + c + 2 * w), load(b + c + 2 * w), acc2);
    acc3 = fma(load(a + c + 3 * w), load(b + c + 3 * w), acc3);
  }
  for (; c + w <= n; c += w) acc0 = fma(load(a + c), load(b + c), acc0);
  float sum = reduce_add((acc0 + acc1) + (acc2 + acc3));
  for (; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

/// Rounds n up to a whole number of vectors.
constexpr std::ptrdiff_t round_up(std::ptrdiff_t n) { return (n + kWidth - 1) / kWidth * kWidth; }

}  // namespace attnkit::simd
