// The lightning indexer's products in int8 (indexer_topk() with Products::Int8): each q_I row
// (query, indexer head) and each k_I row quantized to int8 with one scale a row, q8_0's rule
// with the scale in f32 (a = max|x| / 127, q = round(x / a), halves away from 0, in
// [-127, 127]; a row whose max|x| is below 127 * 2^-126 is 0), their dot products summed
// exactly in int32, then scaled in f32: score = (a_q a_k) * float(sum). The integer sums are
// exact, so the scores, and the selection, are the same bits on every CPU that runs them:
//  - AVX-512 VNNI: vpdpbusd multiplies 64 unsigned by 64 signed bytes into 16 int32 lanes;
//    the query's bytes become unsigned (q + 128) and each key's 128 * sum(k) is taken off.
//    A register block of 6 query rows x 4 groups of 16 keys, the keys packed once a call as
//    [group][Di / 4][16 keys][4 bytes];
//  - elsewhere the request runs f32 products (an integer loop over the same bytes, kept for
//    the tests, would be slower than the f32 tile GEMM).
// DeepSeek-V3.2 runs its indexer in FP8 with block scales; int8 with a scale a row is its
// integer counterpart on CPUs with VNNI (twice the f32 tile GEMM's rate on the Xeon in cache).
// Every key is quantized and packed once a call, so only calls of kInt8MinQueries queries or
// more (prefill) take the int8 products.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/dsa/indexer_checks.hpp"
#include "attnkit/storage/f32_rows.hpp"

#if !defined(ATTNKIT_NO_SIMD) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ATTNKIT_INDEXER_VNNI 1
#endif

namespace attnkit::detail {

inline constexpr Index kInt8Group = 16;  // keys a packed group: one vector of 16 int32 sums

/// Calls of fewer queries (B x Lq) run the f32 products: quantizing and packing every key
/// costs more than their products save (1 query of 16 heads over 32K keys: 4.7x slower in
/// int8 on the Xeon). A rule of the shape, so the scores never depend on the thread count.
inline constexpr Index kInt8MinQueries = 64;

/// x[0, n) as int8 into q[0, np) (zero past n); returns the scale a (0 for a row of zeros).
/// Rounding half away from 0 without a library call or a branch, so the loops vectorize:
/// |y| + 2^23 - 2^23 rounds |y| (<= 127) to the nearest integer, ties to even, exactly; a tie
/// it rounded down (t - |y| = -0.5) goes up.
inline float quantize_i8(const float* x, Index n, Index np, std::int8_t* q) {
  float top = 0.f;
  for (Index c = 0; c < n; ++c) top = std::max(top, std::abs(x[c]));
  const float a = top / 127.f;
  const bool zero = !(a >= std::numeric_limits<float>::min());
  const float inv = zero ? 0.f : 1.f / a, big = 8388608.f;
  for (Index c = 0; c < n; ++c) {
    const float y = x[c] * inv, m = std::abs(y);
    float t = (m + big) - big;
    t += t - m == -0.5f ? 1.f : 0.f;
    q[c] = static_cast<std::int8_t>(y < 0.f ? -t : t);
  }
  std::fill(q + n, q + np, std::int8_t{0});
  return zero ? 0.f : a;
}

/// k_I of every batch quantized and packed: batch b's group g (keys 16 g ..) at
/// packed[((b * groups + g) * d4 + p) * 64 + 4 * key + i] (depth 4 p + i), zero past k_len
/// and Di; scale and bias (128 * the key's sum of int8 values) per key.
struct Int8Keys {
  Index d4 = 0, groups = 0;
  std::vector<std::int8_t> packed;
  std::vector<float> scale;
  std::vector<std::int32_t> bias;
};

template <class KI>
Int8Keys pack_int8_keys(const IndexerShape& s, const View<KI>& k, int threads) {
  Int8Keys out;
  out.d4 = (s.dim + 3) / 4;
  out.groups = (s.k_len + kInt8Group - 1) / kInt8Group;
  const Index keys = out.groups * kInt8Group, bytes = out.d4 * 4 * kInt8Group;
  out.packed.assign(std::size_t(s.batch * out.groups * bytes), 0);
  out.scale.assign(std::size_t(s.batch * keys), 0.f);
  out.bias.assign(std::size_t(s.batch * keys), 0);
  parallel_for(threads, s.batch * out.groups, 4, [&](Index item) {
    const Index b = item / out.groups, g = item % out.groups;
    std::vector<float> row(std::size_t(s.ldd));
    std::vector<std::int8_t> q(std::size_t(out.d4 * 4));
    std::int8_t* group = out.packed.data() + (b * out.groups + g) * bytes;
    for (Index r = 0; r < kInt8Group && g * kInt8Group + r < s.k_len; ++r) {
      const Index key = g * kInt8Group + r;
      pack_rows(k, b, 0, key, 1, row.data(), s.ldd);
      out.scale[std::size_t(b * keys + key)] = quantize_i8(row.data(), s.dim, out.d4 * 4, q.data());
      std::int32_t sum = 0;
      for (Index p = 0; p < out.d4; ++p)
        for (Index i = 0; i < 4; ++i) {
          group[(p * kInt8Group + r) * 4 + i] = q[std::size_t(4 * p + i)];
          sum += q[std::size_t(4 * p + i)];
        }
      out.bias[std::size_t(b * keys + key)] = 128 * sum;
    }
  });
  return out;
}

/// A block's query rows quantized: row i's 4 d4 bytes (q + 128, unsigned) at bytes[i * 4 d4],
/// its scale at scale[i].
struct Int8Queries {
  std::vector<std::uint8_t> bytes;
  std::vector<float> scale;
  std::vector<std::int8_t> q;
  /// Rows [0, n) of a (ld floats apart, dim values each).
  void set(const float* a, Index n, Index ld, Index dim, Index d4) {
    bytes.resize(std::size_t(n * 4 * d4));
    scale.resize(std::size_t(n));
    q.resize(std::size_t(4 * d4));
    for (Index i = 0; i < n; ++i) {
      scale[std::size_t(i)] = quantize_i8(a + i * ld, dim, 4 * d4, q.data());
      for (Index c = 0; c < 4 * d4; ++c)
        bytes[std::size_t(i * 4 * d4 + c)] = static_cast<std::uint8_t>(q[std::size_t(c)] + 128);
    }
  }
};

#ifdef ATTNKIT_INDEXER_VNNI
// out rows [0, MR) x groups [0, NR) of keys from group g0 (batch b): the scores.
template <int MR, int NR>
inline void int8_block(const Int8Queries& q, Index i0, const Int8Keys& k, Index b, Index g0,
                       float* out, Index ldo) {
  const Index d4 = k.d4, keys = k.groups * kInt8Group;
  __m512i acc[std::size_t{MR}][std::size_t{NR}];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_si512();
  const std::int8_t* panel = k.packed.data() + (b * k.groups + g0) * d4 * 64;
  const std::uint8_t* rows = q.bytes.data() + i0 * 4 * d4;
  for (Index p = 0; p < d4; ++p) {
    __m512i kv[std::size_t{NR}];
    for (int r = 0; r < NR; ++r) kv[r] = _mm512_loadu_si512(panel + (r * d4 + p) * 64);
    for (int i = 0; i < MR; ++i) {
      std::int32_t word;
      std::memcpy(&word, rows + i * 4 * d4 + 4 * p, 4);
      const __m512i qv = _mm512_set1_epi32(word);
      for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], qv, kv[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const Index key = (g0 + r) * kInt8Group;
    const __m512i bias = _mm512_loadu_si512(k.bias.data() + b * keys + key);
    const __m512 ks = _mm512_loadu_ps(k.scale.data() + b * keys + key);
    for (int i = 0; i < MR; ++i) {
      // (maskz: GCC 12 warns on the unmasked form's undefined source)
      const __m512 sum = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_sub_epi32(acc[i][r], bias));
      const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(q.scale[std::size_t(i0 + i)]), ks);
      _mm512_storeu_ps(out + i * ldo + r * kInt8Group, _mm512_mul_ps(scale, sum));
    }
  }
}

template <int NR>
inline void int8_rows(const Int8Queries& q, Index m, const Int8Keys& k, Index b, Index g0,
                      float* out, Index ldo) {
  Index i = 0;
  for (; i + 6 <= m; i += 6) int8_block<6, NR>(q, i, k, b, g0, out + i * ldo, ldo);
  switch (m - i) {
    case 5:
      return int8_block<5, NR>(q, i, k, b, g0, out + i * ldo, ldo);
    case 4:
      return int8_block<4, NR>(q, i, k, b, g0, out + i * ldo, ldo);
    case 3:
      return int8_block<3, NR>(q, i, k, b, g0, out + i * ldo, ldo);
    case 2:
      return int8_block<2, NR>(q, i, k, b, g0, out + i * ldo, ldo);
    case 1:
      return int8_block<1, NR>(q, i, k, b, g0, out + i * ldo, ldo);
    default:
      return;
  }
}
#endif

/// int8_scores() as an integer loop: the same sums and the same bits (tests compare the two).
inline void int8_scores_portable(const Int8Queries& q, Index m, const Int8Keys& k, Index b,
                                 Index g0, Index groups, float* out, Index ldo) {
  const Index d4 = k.d4, keys = k.groups * kInt8Group;
  for (Index i = 0; i < m; ++i)
    for (Index c = 0; c < groups * kInt8Group; ++c) {
      const Index key = g0 * kInt8Group + c, g = key / kInt8Group, r = key % kInt8Group;
      const std::int8_t* kb = k.packed.data() + (b * k.groups + g) * d4 * 64 + r * 4;
      const std::uint8_t* qb = q.bytes.data() + i * 4 * d4;
      std::int32_t sum = 0;
      for (Index p = 0; p < d4; ++p)
        for (Index j = 0; j < 4; ++j) sum += (qb[4 * p + j] - 128) * kb[p * 64 + j];
      const float scale = q.scale[std::size_t(i)] * k.scale[std::size_t(b * keys + key)];
      out[i * ldo + c] = scale * static_cast<float>(sum);
    }
}

/// Whether indexer_topk() takes the int8 products (Products::Int8) in this build: with AVX-512
/// VNNI. Elsewhere the integer loop would be slower than the f32 tile GEMM, and the request
/// (a permission, as Products is) runs f32.
#ifdef ATTNKIT_INDEXER_VNNI
inline constexpr bool kInt8Indexer = true;
#else
inline constexpr bool kInt8Indexer = false;
#endif

/// out [m, 16 groups) (row stride ldo) = the scores of query rows [0, m) against the keys of
/// `groups` groups from g0 (batch b).
inline void int8_scores(const Int8Queries& q, Index m, const Int8Keys& k, Index b, Index g0,
                        Index groups, float* out, Index ldo) {
#ifdef ATTNKIT_INDEXER_VNNI
  Index g = 0;
  for (; g + 4 <= groups; g += 4) int8_rows<4>(q, m, k, b, g0 + g, out + g * kInt8Group, ldo);
  for (; g < groups; ++g) int8_rows<1>(q, m, k, b, g0 + g, out + g * kInt8Group, ldo);
#else
  int8_scores_portable(q, m, k, b, g0, groups, out, ldo);
#endif
}

}  // namespace attnkit::detail
