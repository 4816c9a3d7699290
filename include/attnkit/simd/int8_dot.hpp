// Integer dot products of a block-quantized key row with a query row quantized to int8 per
// block of 32: the products of decode's Products::Int8 mode (kernel/decode/decode_row_math.hpp).
// Key rows are GGUF blocks read in place, named here by layout (simd/ sits below quant/):
//  - Q8: 34 bytes a block, a half scale dk and 32 int8 values;
//  - Q4: 18 bytes a block, dk and 16 bytes of nibbles: value j < 16 is the low nibble of byte
//    j minus 8, value j + 16 its high nibble minus 8.
// The query block follows q8_0's rule with its scale kept in f32: dq = max|x| / 127,
// q = round(x * (1 / dq)) (halves away from 0) in [-127, 127]; a block whose max|x| is below
// 127 * 2^-126 (dq not normal) is 0, and a block with a non-finite value has dq = NaN. A key
// row's product with the query is then the sum over blocks of dk * dq * (the block's integer
// sum of k q), the integer sums exact.
//
// The forms, chosen at build time:
//  - AVX-512 VNNI + VBMI (Sapphire Rapids, Zen 4, Zen 5): vpdpbusd multiplies 64 unsigned by
//    64 signed bytes and adds each four to an int32 lane. q8_0's bytes become unsigned with
//    their sign bit flipped (k + 128) and the accumulator starts at -128 * the query block's
//    sum of q; q4_0's nibbles are unsigned already (start: -8 * the sum). One vpermt2b picks
//    two q8_0 blocks' (four q4_0 blocks') values out of two loads of the row, one vpermw
//    their scales: about 10 instructions for 64 values, where widening to f32 takes 3 a 16.
//  - AVX2 (and AVX-512 without VNNI or VBMI): a block at a time on 256-bit registers:
//    vpdpbusd where AVX-VNNI or AVX512-VNNI has it, else vpmaddubsw / vpmaddwd on |k| and
//    sign(q, k) (ggml's form: with q in [-127, 127] no int16 sum saturates).
//  - NEON: sdot where the target has dotprod, else widening multiplies.
//  - elsewhere (SSE4, the scalar build): integer loops.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attnkit/simd/convert.hpp"
#include "attnkit/simd/vec.hpp"

#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && \
    defined(__AVX512BW__)
#define ATTNKIT_INT8_DOT_512 1
#endif

// int8_key_dot() runs once a key row, inside the logits' loop over keys: a call there (GCC
// 12 declines to inline it) keeps the accumulators in memory, a store-to-load chain a unit.
#if defined(__GNUC__) || defined(__clang__)
#define ATTNKIT_INT8_INLINE inline __attribute__((always_inline))
#else
#define ATTNKIT_INT8_INLINE inline
#endif

namespace attnkit::simd {

/// The layout of a quantized key row's blocks (see the top of this header).
enum class KeyBlocks { Q8, Q4 };

namespace detail {
template <KeyBlocks F>
inline constexpr std::ptrdiff_t kBlockBytes = F == KeyBlocks::Q8 ? 34 : 18;
#ifdef ATTNKIT_INT8_DOT_512
// Blocks read at a time (a unit: 68 or 72 bytes, two loads of 64) and a query unit's bytes:
// Q8 [64 int8 q][16 f32 dq][16 int32 start]; Q4 [64 q of the low nibbles][64 of the high]
// [16 dq][16 start]. A lane holds one block's dq (8 lanes a Q8 block, 4 a Q4 one).
template <KeyBlocks F>
inline constexpr int kUnitBlocks = F == KeyBlocks::Q8 ? 2 : 4;
template <KeyBlocks F>
inline constexpr std::ptrdiff_t kUnitBytes = F == KeyBlocks::Q8 ? 192 : 256;
inline constexpr bool kFlipsQ8 = true;
// pick[i]: the unit's byte holding value i (bit 6 set: from the second load, kOff bytes on);
// Q8: two blocks of 32 values, Q4: four blocks of 16 bytes.
template <KeyBlocks F>
constexpr std::array<std::uint8_t, 64> pick_table() {
  constexpr int kU = kUnitBlocks<F>, kB = int(kBlockBytes<F>), kOff = kU * kB - 64;
  std::array<std::uint8_t, 64> t{};
  for (int i = 0; i < 64; ++i) {
    const int blk = i / (64 / kU), rel = kB * blk + 2 + i % (64 / kU);
    t[std::size_t(i)] = static_cast<std::uint8_t>(blk == kU - 1 ? 64 + rel - kOff : rel);
  }
  return t;
}
// scale[w]: the word of the first load holding lane w's dk (lanes 16..31 unused).
template <KeyBlocks F>
constexpr std::array<std::uint16_t, 32> scale_table() {
  constexpr int kU = kUnitBlocks<F>, kB = int(kBlockBytes<F>);
  std::array<std::uint16_t, 32> t{};
  for (int w = 0; w < 16; ++w)
    t[std::size_t(w)] = static_cast<std::uint16_t>(w / (16 / kU) * kB / 2);
  return t;
}
#else
// One block a unit: [32 int8 q][f32 dq][int32 start], padded to 64 bytes.
template <KeyBlocks F>
inline constexpr int kUnitBlocks = 1;
template <KeyBlocks F>
inline constexpr std::ptrdiff_t kUnitBytes = 64;
#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX2__) && \
    (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
#define ATTNKIT_INT8_DOT_VNNI256 1
inline constexpr bool kFlipsQ8 = true;
#else
inline constexpr bool kFlipsQ8 = false;
#endif
#endif

// One query block quantized: q[32], dq and the sum of q.
inline void quantize_block(const float* x, std::int8_t* q, float& dq, std::int32_t& sum) {
  float amax = 0.f;
  bool finite = true;
  for (int c = 0; c < 32; ++c) {
    finite = finite && std::isfinite(x[c]);
    amax = std::fabs(x[c]) > amax ? std::fabs(x[c]) : amax;
  }
  const float d = amax / 127.f;
  const bool zero = !finite || !(d >= std::numeric_limits<float>::min());
  const float id = zero ? 0.f : 1.f / d;
  sum = 0;
  for (int c = 0; c < 32; ++c) {  // round half away from 0, as std::round (no library call)
    const float y = x[c] * id, t = std::trunc(y);
    const float r = std::fabs(y - t) >= 0.5f ? t + std::copysign(1.f, y) : t;
    q[c] = static_cast<std::int8_t>(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
    sum += q[c];
  }
  dq = !finite ? std::numeric_limits<float>::quiet_NaN() : zero ? 0.f : d;
}

// The block's value c (0 .. 31) as int8_key_dot()'s integer sums take it: q8_0's value, or
// q4_0's nibble (unsigned: the start holds the -8).
// (q8_0's bytes are read as int8: GCC 12.2 vectorizes an int8 dot product over bytes read
// as uint8 and converted into vpdpbusd with them unsigned, a wrong sum, on VNNI targets.)
template <KeyBlocks F>
int key_int(const std::uint8_t* block, int c) {
  if constexpr (F == KeyBlocks::Q8) return reinterpret_cast<const std::int8_t*>(block)[2 + c];
  return c < 16 ? block[2 + c] & 15 : block[2 + c - 16] >> 4;
}

inline std::uint16_t scale_bits(const std::uint8_t* block) {
  std::uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return h;
}
}  // namespace detail

/// Bytes of a query row of `blocks` blocks quantized for key rows of layout F (a multiple
/// of 64).
template <KeyBlocks F>
constexpr std::ptrdiff_t int8_query_bytes(std::ptrdiff_t blocks) {
  constexpr std::ptrdiff_t u = detail::kUnitBlocks<F>;
  return (blocks + u - 1) / u * detail::kUnitBytes<F>;
}

/// out = the query row x[0, 32 * blocks) quantized (the rule above), laid out for
/// int8_key_dot<F>(); out is 64-byte aligned and int8_query_bytes<F>(blocks) long.
template <KeyBlocks F>
void int8_query(const float* x, std::ptrdiff_t blocks, std::byte* out) {
  std::memset(out, 0, static_cast<std::size_t>(int8_query_bytes<F>(blocks)));
  for (std::ptrdiff_t b = 0; b < blocks; ++b) {
    std::int8_t q[32];
    float dq;
    std::int32_t sum;
    detail::quantize_block(x + 32 * b, q, dq, sum);
    const std::int32_t start = F == KeyBlocks::Q4 ? -8 * sum : detail::kFlipsQ8 ? -128 * sum : 0;
    constexpr int kU = detail::kUnitBlocks<F>;
    std::byte* unit = out + b / kU * detail::kUnitBytes<F>;
    const int s = static_cast<int>(b % kU);  // the block's place in its unit
#ifdef ATTNKIT_INT8_DOT_512
    constexpr int kLanes = 16 / kU;  // lanes of one block's dq
    float* dqs = reinterpret_cast<float*>(unit + detail::kUnitBytes<F> - 128);
    std::int32_t* starts = reinterpret_cast<std::int32_t*>(unit + detail::kUnitBytes<F> - 64);
    for (int l = 0; l < kLanes; ++l) dqs[s * kLanes + l] = dq;
    starts[s * kLanes] = start;
    if constexpr (F == KeyBlocks::Q8) {
      std::memcpy(unit + 32 * s, q, 32);
    } else {  // lane group s of each half: the block's low-nibble values, its high-nibble ones
      std::memcpy(unit + 16 * s, q, 16);
      std::memcpy(unit + 64 + 16 * s, q + 16, 16);
    }
#else
    (void)s;
    std::memcpy(unit, q, 32);
    std::memcpy(unit + 32, &dq, sizeof dq);
    std::memcpy(unit + 36, &start, sizeof start);
#endif
  }
}

/// a[r] (r < R) += lanes whose sum is the product of the key row at `key` (`blocks` blocks
/// of layout F) with query row q[r] (int8_query<F>()). Reads only the row's bytes.
template <KeyBlocks F, int R>
ATTNKIT_INT8_INLINE void int8_key_dot(const std::uint8_t* key, std::ptrdiff_t blocks,
                                      const std::byte* const* q, Vec* a) {
  constexpr std::ptrdiff_t kB = detail::kBlockBytes<F>;
#if defined(ATTNKIT_INT8_DOT_512)
  constexpr int kU = detail::kUnitBlocks<F>;
  constexpr std::ptrdiff_t kSpan = kU * kB, kOff = kSpan - 64;  // the second load's offset
  static constexpr auto pick = detail::pick_table<F>();
  static constexpr auto scale = detail::scale_table<F>();
  const __m512i pick_v = _mm512_loadu_si512(pick.data()),
                scale_v = _mm512_loadu_si512(scale.data());
  const __m512i nibble = _mm512_set1_epi8(15), flip = _mm512_set1_epi8(-128);
  for (std::ptrdiff_t b = 0, u = 0; b < blocks; b += kU, ++u) {
    const std::uint8_t* at = key + b * kB;
    __m512i lo, hi;  // the unit's bytes [0, 64) and [kOff, kOff + 64)
    if (b + kU <= blocks) {
      lo = _mm512_loadu_si512(at);
      hi = _mm512_loadu_si512(at + kOff);
    } else {  // the row's last blocks: masked loads, no byte past the row
      const auto first = [](std::ptrdiff_t n) {
        return n >= 64 ? ~__mmask64{0} : n <= 0 ? __mmask64{0} : (__mmask64{1} << n) - 1;
      };
      const std::ptrdiff_t bytes = (blocks - b) * kB;
      lo = _mm512_maskz_loadu_epi8(first(bytes), at);
      hi = _mm512_maskz_loadu_epi8(first(bytes - kOff), at + kOff);
    }
    const __m512i values = _mm512_permutex2var_epi8(lo, pick_v, hi);
    const __m512 dk =
        _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(scale_v, lo)));
    for (int r = 0; r < R; ++r) {
      const std::byte* unit = q[r] + u * detail::kUnitBytes<F>;
      const __m512 dq = _mm512_load_ps(unit + detail::kUnitBytes<F> - 128);
      __m512i sum = _mm512_load_si512(unit + detail::kUnitBytes<F> - 64);
      if constexpr (F == KeyBlocks::Q8) {
        sum = _mm512_dpbusd_epi32(sum, _mm512_xor_si512(values, flip), _mm512_load_si512(unit));
      } else {
        sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(values, nibble), _mm512_load_si512(unit));
        sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(_mm512_srli_epi16(values, 4), nibble),
                                  _mm512_load_si512(unit + 64));
      }
      a[r] = Vec(_mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dk, dq), a[r]));
    }
  }
#elif defined(__AVX2__) && !defined(ATTNKIT_NO_SIMD)
  __m256 acc[std::size_t{R}];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (std::ptrdiff_t b = 0; b < blocks; ++b) {
    const std::uint8_t* at = key + b * kB;
    const float dk = half_to_float(detail::scale_bits(at));
    __m256i k;
    if constexpr (F == KeyBlocks::Q8) {
      k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 2));
    } else {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 2));
      const __m128i m = _mm_set1_epi8(15);
      k = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
    }
    for (int r = 0; r < R; ++r) {
      const std::byte* unit = q[r] + b * 64;
      const __m256i qv = _mm256_load_si256(reinterpret_cast<const __m256i*>(unit));
      float dq;
      std::int32_t start;
      std::memcpy(&dq, unit + 32, sizeof dq);
      std::memcpy(&start, unit + 36, sizeof start);
      __m256i sum = _mm256_setr_epi32(start, 0, 0, 0, 0, 0, 0, 0);
#if defined(ATTNKIT_INT8_DOT_VNNI256)
      const __m256i ku = F == KeyBlocks::Q8 ? _mm256_xor_si256(k, _mm256_set1_epi8(-128)) : k;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
      sum = _mm256_dpbusd_epi32(sum, ku, qv);
#else
      sum = _mm256_dpbusd_avx_epi32(sum, ku, qv);
#endif
#else
      const __m256i ku = F == KeyBlocks::Q8 ? _mm256_sign_epi8(k, k) : k;
      const __m256i qs = F == KeyBlocks::Q8 ? _mm256_sign_epi8(qv, k) : qv;
      sum = _mm256_add_epi32(sum,
                             _mm256_madd_epi16(_mm256_maddubs_epi16(ku, qs), _mm256_set1_epi16(1)));
#endif
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(dk * dq), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
#if defined(__AVX512F__)  // 16 lanes: the 8 in the low half
    a[r] =
        a[r] +
        Vec(_mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(acc[r]), 0)));
#else
    a[r] = a[r] + Vec(acc[r]);
#endif
  }
#elif defined(ATTNKIT_SIMD_NEON)
  float32x4_t acc[std::size_t{R}];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.f);
  for (std::ptrdiff_t b = 0; b < blocks; ++b) {
    const std::uint8_t* at = key + b * kB;
    const float dk = half_to_float(detail::scale_bits(at));
    int8x16_t k0, k1;  // values 0..15 and 16..31
    if constexpr (F == KeyBlocks::Q8) {
      k0 = vld1q_s8(reinterpret_cast<const std::int8_t*>(at + 2));
      k1 = vld1q_s8(reinterpret_cast<const std::int8_t*>(at + 18));
    } else {
      const uint8x16_t x = vld1q_u8(at + 2);
      k0 = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(15)));
      k1 = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
    }
    for (int r = 0; r < R; ++r) {
      const std::byte* unit = q[r] + b * 64;
      const int8x16_t q0 = vld1q_s8(reinterpret_cast<const std::int8_t*>(unit));
      const int8x16_t q1 = vld1q_s8(reinterpret_cast<const std::int8_t*>(unit + 16));
      float dq;
      std::int32_t start;
      std::memcpy(&dq, unit + 32, sizeof dq);
      std::memcpy(&start, unit + 36, sizeof start);
      int32x4_t sum = vsetq_lane_s32(start, vdupq_n_s32(0), 0);
#if defined(__ARM_FEATURE_DOTPROD)
      sum = vdotq_s32(vdotq_s32(sum, k0, q0), k1, q1);
#else  // two products an int16 lane: at most 2 * 128 * 127, no overflow
      const int16x8_t p0 =
          vmlal_s8(vmull_s8(vget_low_s8(k0), vget_low_s8(q0)), vget_high_s8(k0), vget_high_s8(q0));
      const int16x8_t p1 =
          vmlal_s8(vmull_s8(vget_low_s8(k1), vget_low_s8(q1)), vget_high_s8(k1), vget_high_s8(q1));
      sum = vpadalq_s16(vpadalq_s16(sum, p0), p1);
#endif
      acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(sum), vdupq_n_f32(dk * dq));
    }
  }
  for (int r = 0; r < R; ++r) a[r] = a[r] + Vec(acc[r]);
#else
  for (int r = 0; r < R; ++r) {
    float total = 0.f;
    for (std::ptrdiff_t b = 0; b < blocks; ++b) {
      const std::uint8_t* at = key + b * kB;
      const std::byte* unit = q[r] + b * 64;
      float dq;
      std::int32_t sum;
      std::memcpy(&dq, unit + 32, sizeof dq);
      std::memcpy(&sum, unit + 36, sizeof sum);
      const auto* qs = reinterpret_cast<const std::int8_t*>(unit);
      for (int c = 0; c < 32; ++c) sum += detail::key_int<F>(at, c) * std::int32_t{qs[c]};
      total += half_to_float(detail::scale_bits(at)) * dq * static_cast<float>(sum);
    }
    alignas(64) float lanes[kWidth] = {};
    lanes[0] = total;
    a[r] = a[r] + load(lanes);
  }
#endif
}

}  // namespace attnkit::simd
