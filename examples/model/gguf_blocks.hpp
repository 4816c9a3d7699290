// ggml's tensor types that the two checkpoints use, dequantized to f32 as ggml does
// (ggml-quants.c, dequantize_row_*): F32, F16, Q8_0, Q4_1, Q5_0 (blocks of 32 values) and
// the k-quants Q4_K and Q6_K (super-blocks of 256). Weights are dequantized once, at load;
// the runner then multiplies in f32 (Eigen).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace model {

enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_1 = 3,
  Q5_0 = 6,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
};

inline float f16(const unsigned char* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
}

/// Values per block and bytes per block of a type.
inline void block_shape(GgmlType type, std::int64_t& values, std::int64_t& bytes) {
  switch (type) {
    case GgmlType::F32:
      values = 1, bytes = 4;
      return;
    case GgmlType::F16:
      values = 1, bytes = 2;
      return;
    case GgmlType::Q4_1:
      values = 32, bytes = 20;
      return;  // f16 d, f16 m, 16 bytes of nibbles
    case GgmlType::Q5_0:
      values = 32, bytes = 22;
      return;  // f16 d, 4 bytes of 5th bits, 16
    case GgmlType::Q8_0:
      values = 32, bytes = 34;
      return;  // f16 d, 32 int8
    case GgmlType::Q4_K:
      values = 256, bytes = 144;
      return;  // d, dmin, 12 scale bytes, 128
    case GgmlType::Q6_K:
      values = 256, bytes = 210;
      return;  // 128 low, 64 high, 16 scales, d
  }
  throw std::runtime_error("gguf: tensor type " + std::to_string(unsigned(type)) +
                           " is not read by this runner");
}

inline std::size_t row_bytes(GgmlType type, std::int64_t count) {
  std::int64_t values = 0, bytes = 0;
  block_shape(type, values, bytes);
  if (count % values != 0) throw std::runtime_error("gguf: a tensor is not whole blocks");
  return static_cast<std::size_t>(count / values * bytes);
}

// Q4_K packs eight 6-bit scales and eight 6-bit mins in 12 bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const unsigned char* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

inline void dequantize_block(GgmlType type, const unsigned char* b, float* y) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(y, b, 4);
      return;
    case GgmlType::F16:
      *y = f16(b);
      return;
    case GgmlType::Q8_0: {
      const float d = f16(b);
      for (int j = 0; j < 32; ++j) y[j] = float(static_cast<std::int8_t>(b[2 + j])) * d;
      return;
    }
    case GgmlType::Q4_1: {
      const float d = f16(b), m = f16(b + 2);
      for (int j = 0; j < 16; ++j) {
        y[j] = float(b[4 + j] & 0xF) * d + m;
        y[j + 16] = float(b[4 + j] >> 4) * d + m;
      }
      return;
    }
    case GgmlType::Q5_0: {
      const float d = f16(b);
      std::uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      for (int j = 0; j < 16; ++j) {
        const int high0 = int((qh >> j) << 4) & 0x10, high1 = int(qh >> (j + 12)) & 0x10;
        y[j] = float(((b[6 + j] & 0xF) | high0) - 16) * d;
        y[j + 16] = float(((b[6 + j] >> 4) | high1) - 16) * d;
      }
      return;
    }
    case GgmlType::Q4_K: {
      const float d = f16(b), dmin = f16(b + 2);
      const unsigned char* scales = b + 4;
      const unsigned char* q = b + 16;
      for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        int sc = 0, m = 0;
        scale_min_k4(is, scales, sc, m);
        const float d1 = d * float(sc), m1 = dmin * float(m);
        scale_min_k4(is + 1, scales, sc, m);
        const float d2 = d * float(sc), m2 = dmin * float(m);
        for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
      }
      return;
    }
    case GgmlType::Q6_K: {
      const unsigned char* ql = b;
      const unsigned char* qh = b + 128;
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
      const float d = f16(b + 208);
      for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = d * float(sc[is]) * float(q1);
          y[l + 32] = d * float(sc[is + 2]) * float(q2);
          y[l + 64] = d * float(sc[is + 4]) * float(q3);
          y[l + 96] = d * float(sc[is + 6]) * float(q4);
        }
      }
      return;
    }
  }
}

/// count values of a tensor of `type` at `in`, dequantized into out.
inline void dequantize(GgmlType type, const unsigned char* in, std::int64_t count, float* out) {
  std::int64_t values = 0, bytes = 0;
  block_shape(type, values, bytes);
  for (std::int64_t i = 0; i < count / values; ++i)
    dequantize_block(type, in + i * bytes, out + i * values);
}

}  // namespace model
