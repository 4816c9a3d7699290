// simd::Vec: the float vector of kWidth lanes the kernels compute with, and its arithmetic
// (load/store, fma, max/min, abs, horizontal sums, dot). simd/ is the only layer that names
// xsimd (8.1+, which has hadd() but no reduce_add(): hence the shims) or intrinsics;
// ATTNKIT_NO_SIMD selects a scalar Vec (one lane) with the same interface, so every kernel
// has a portable path that tests compare against the vector one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

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
// AArch64: xsimd's batch is a NEON register; the few forms xsimd lacks (simd/convert.hpp)
// use the intrinsics under ATTNKIT_SIMD_NEON.
#if defined(__aarch64__)
#include <arm_neon.h>
#define ATTNKIT_SIMD_NEON 1
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
inline float reduce_add(Vec a) { return a.x; }
inline float reduce_max(Vec a) { return a.x; }
inline Vec transpose_add(const Vec* rows) { return rows[0]; }
inline Vec abs(Vec a) { return std::fabs(a.x); }

#else

using Vec = xsimd::batch<float>;
inline constexpr int kWidth = static_cast<int>(Vec::size);
// AVX-512 and AArch64's NEON have 32 vector registers, SSE and AVX2 have 16: this sizes
// the GEMM register block (on NEON 4-lane registers: 6 rows x 4 vectors of accumulators,
// 24 of the 32, as on AVX-512).
#if defined(__aarch64__)
inline constexpr int kRegisters = 32;
#else
inline constexpr int kRegisters = kWidth >= 16 ? 32 : 16;
#endif
inline constexpr const char* kArchName = Vec::arch_type::name();

#if defined(ATTNKIT_SIMD_NEON)
// AArch64: one intrinsic each. xsimd 8's NEON kernels reach every operation through a table
// over all ten element types, whose instantiation costs each translation unit seconds of
// compile time (simd/neon_math.hpp has the measurements); the arithmetic operators, used
// everywhere, stay xsimd's.
inline Vec load(const float* p) { return Vec(vld1q_f32(p)); }
inline void store(float* p, Vec v) { vst1q_f32(p, v); }
inline Vec fma(Vec a, Vec b, Vec c) { return Vec(vfmaq_f32(c, a, b)); }
inline Vec max(Vec a, Vec b) { return Vec(vmaxq_f32(a, b)); }
inline Vec min(Vec a, Vec b) { return Vec(vminq_f32(a, b)); }
inline Vec abs(Vec a) { return Vec(vabsq_f32(a)); }
inline float reduce_add(Vec a) { return vaddvq_f32(a); }
/// Lane t of the result is the sum of the lanes of rows[t] (t < 4): three pairwise adds.
inline Vec transpose_add(const Vec* rows) {
  return Vec(vpaddq_f32(vpaddq_f32(rows[0], rows[1]), vpaddq_f32(rows[2], rows[3])));
}
#else
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
inline Vec abs(Vec a) { return xsimd::abs(a); }

inline float reduce_add(Vec a) {
#if XSIMD_VERSION_MAJOR >= 10
  return xsimd::reduce_add(a);
#else
  return xsimd::hadd(a);
#endif
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
#endif  // ATTNKIT_SIMD_NEON

inline float reduce_max(Vec a) {
  // Called once per row and tile, so a store and a short loop are cheap enough and work
  // on every xsimd version.
  alignas(64) float lanes[kWidth];
  a.store_aligned(lanes);
  return *std::max_element(lanes, lanes + kWidth);
}

#endif

/// v, held in a register: keeps the compiler from folding the load behind v into each
/// instruction that uses it (GCC does, for a vector that feeds several FMAs; every fold is a
/// load of its own, and Zen 4 issues one 512-bit load per cycle). An empty asm statement
/// that claims to change v; no instruction is emitted.
inline Vec in_register(Vec v) {
#if !defined(ATTNKIT_NO_SIMD) && (defined(__GNUC__) || defined(__clang__)) && \
    (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__))
  auto raw = static_cast<typename Vec::register_type>(v);
#if defined(__aarch64__)
  asm("" : "+w"(raw));  // "w": an FP/SIMD register (x86's "v": an SSE/AVX one)
#else
  asm("" : "+v"(raw));
#endif
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
