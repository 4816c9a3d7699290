// Rounding f32 values to bfloat16, kept in f32: the operands of Products::Bf16's products
// (options.hpp). Round to nearest, ties to even, as Eigen::bfloat16's conversion and the
// AVX512-BF16 conversion instructions do; infinities stay, a NaN stays a (quiet) NaN, a
// finite value past bf16's largest (3.3895e38) becomes an infinity. The relative error of
// a rounded normal value is at most u = 2^-8 (bf16 keeps 8 significand bits, the leading
// one included: a tie such as 1 + 2^-8 moves by 2^-8 of itself). Values below bf16's
// smallest normal (2^-126) keep an absolute error of up to 2^-134, and the vdpbf16ps kernel
// flushes subnormal operands and products to 0: docs/mechanisms.md's bound adds an absolute term.
#pragma once

#include <cstdint>
#include <cstring>

#include "attnkit/core/index.hpp"

namespace attnkit::detail {

/// The relative rounding error bound of round_to_bf16() on normal values.
inline constexpr double kBf16Unit = 1.0 / 256;

/// x rounded to the nearest bfloat16 (ties to even), as an f32.
inline float round_to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  // A NaN keeps its sign and becomes quiet; otherwise add half an ulp of bf16 (minus one
  // when the kept part is even: ties go to even) and cut the low 16 bits. The carry rounds
  // the largest finite values up to infinity.
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const std::uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  const std::uint32_t out = nan ? ((bits & 0xFFFF0000u) | 0x00400000u) : rounded;
  float y;
  std::memcpy(&y, &out, sizeof y);
  return y;
}

/// x[0, n) rounded to bfloat16 in place (a loop the compiler vectorizes).
inline void round_to_bf16(float* x, Index n) {
  for (Index i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

/// Rows [0, rows) of x (ld apart), columns [0, cols), rounded to bfloat16 in place.
inline void round_rows_to_bf16(float* x, Index rows, Index cols, Index ld) {
  for (Index r = 0; r < rows; ++r) round_to_bf16(x + r * ld, cols);
}

}  // namespace attnkit::detail
