// IEEE half (binary16) bit patterns to and from f32, one value at a time, bit-exact and
// without Eigen or intrinsics: the scales of the quantized blocks (storage/blocks.hpp) are
// stored as halves. The decode engine's per-block conversion uses simd::half_to_float()
// (simd/convert.hpp: F16C's instruction where the ISA has it, else this).
// float_to_half_bits() rounds to nearest, ties to even, as the F16C instruction and Eigen::half
// do (tests/quant compares both over every half and a sweep of floats).
#pragma once

#include <cstdint>
#include <cstring>

namespace attnkit::detail {

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

/// The f32 value of a half's bits (exact: every half is a float; a signaling NaN comes back
/// quiet).
inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F)  // inf; NaN quieted, as the conversion instructions (F16C, NEON) do
    return bits_to_float(sign | 0x7F800000u | (mantissa != 0 ? 0x00400000u : 0u) |
                         (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/// The half nearest to f (ties to even): inf past 65504 (from 65520 on), NaN stays NaN.
inline std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x = float_to_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);   // NaN
  if (x >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // to inf
  if (x < 0x38800000u) {  // below 2^-14: a subnormal half (units of 2^-24) or zero
    // |f| * 2^24 < 2^10 is exact; the integer conversion of m + 2^23 rounds it to nearest even.
    const float m = bits_to_float(x) * 16777216.f + 8388608.f;
    return static_cast<std::uint16_t>(sign | (float_to_bits(m) - 0x4B000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round off 13 mantissa bits; a carry out of the
  // mantissa steps the exponent, as it should.
  std::uint32_t h = (x >> 13) - (112u << 10);
  const std::uint32_t rest = x & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

}  // namespace attnkit::detail
