// Tile products on bfloat16 pairs for Products::Bf16 (options.hpp): C[m, n] (+)= A[m, k] *
// B[k, n] with AVX512-BF16's vdpbf16ps, which multiplies 16 pairs of bf16 values and adds
// both products to 16 f32 lanes. A is bf16 rows (element p of row i at a[i * lda + p], k
// padded to even with a zero); B is packed in pairs of rows, b[(p / 2) * ldb + j] holding
// B[p][j] (low half) and B[p + 1][j] (high half), so a broadcast pair of A meets 16 columns'
// pairs. A register block of 6 rows x 4 vectors of C, as in tile_gemm.hpp. The operands are
// the bf16 values the portable form (f32 FMAs on rounded operands) multiplies too; the two
// differ only in the order of the f32 additions (vdpbf16ps adds a pair's products to the
// lane in one step) and in subnormal products, which the instruction flushes to zero.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "attnkit/tensor.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && !defined(ATTNKIT_NO_SIMD)
#include <immintrin.h>
#define ATTNKIT_BF16_DOT 1
#endif

namespace attnkit::gemm {

/// True when this build has the bf16 pair products (AVX512-BF16).
#ifdef ATTNKIT_BF16_DOT
inline constexpr bool kHasBf16Dot = true;
#else
inline constexpr bool kHasBf16Dot = false;
#endif

/// Which kernel Products::Bf16's tile products run on where the build has the pair products:
/// Auto picks per CPU (pair_products_chosen()); the others force one (tests, benchmarks).
enum class Bf16Kernel { Auto, PairProducts, RoundedF32 };

/// The process-wide choice (default Auto).
inline std::atomic<Bf16Kernel>& bf16_kernel() {
  static std::atomic<Bf16Kernel> kernel{Bf16Kernel::Auto};
  return kernel;
}

/// Whether Products::Bf16 multiplies with vdpbf16ps here. Auto: on AMD CPUs, whose Zen 4 and
/// Zen 5 cores run it at twice the f32 FMA's multiply-adds per cycle (AMD's and uops.info's
/// tables; not measured on this project's machines yet); not on Intel ones, where a Xeon of
/// the Sapphire Rapids class measured 0.5 vdpbf16ps a cycle against 2 FMAs (84 against 170
/// GFLOP/s, bench_dense's products table), so f32 FMAs on the rounded operands are faster.
inline bool pair_products_chosen() {
  if (!kHasBf16Dot) return false;
  switch (bf16_kernel().load(std::memory_order_relaxed)) {
    case Bf16Kernel::PairProducts:
      return true;
    case Bf16Kernel::RoundedF32:
      return false;
    case Bf16Kernel::Auto:
      break;
  }
#ifdef ATTNKIT_BF16_DOT
  return __builtin_cpu_is("amd") != 0;
#else
  return false;
#endif
}

/// Columns of one vector of pairs: B and C have n a multiple of this.
inline constexpr Index kBf16Lanes = 16;

/// The bf16 bits of an f32 that holds a bf16 value (its high half).
inline std::uint16_t bf16_bits(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// dst[i * ld + p] = the bf16 bits of src[i * src_row + p * src_col] for i < m, p < k (values
/// that are bf16 already), and 0 at p = k when k is odd (the pair's other half).
inline void pack_bf16_rows(const float* src, Index src_row, Index src_col, Index m, Index k,
                           std::uint16_t* dst, Index ld) {
  for (Index i = 0; i < m; ++i) {
    for (Index p = 0; p < k; ++p) dst[i * ld + p] = bf16_bits(src[i * src_row + p * src_col]);
    if (k % 2 == 1) dst[i * ld + k] = 0;
  }
}

/// dst[(p / 2) * ld + j] = the pair (src row p, src row p + 1) at column j for p < k (rows ld_src
/// apart, values that are bf16 already), j < n; a missing last row of an odd k is 0.
inline void pack_bf16_pairs(const float* src, Index ld_src, Index k, Index n, std::uint32_t* dst,
                            Index ld) {
  for (Index p = 0; p < k; p += 2) {
    const float* lo = src + p * ld_src;
    const float* hi = p + 1 < k ? lo + ld_src : nullptr;
    std::uint32_t* out = dst + (p / 2) * ld;
    for (Index j = 0; j < n; ++j)
      out[j] = std::uint32_t{bf16_bits(lo[j])} |
               (hi != nullptr ? std::uint32_t{bf16_bits(hi[j])} << 16 : 0u);
  }
}

#ifdef ATTNKIT_BF16_DOT
namespace detail {

// C[MR, NR * 16] (+)= A[MR, 2 kp] * B (kp pairs of rows).
template <int MR, int NR>
inline void micro_kernel_bf16(Index kp, const std::uint16_t* a, Index lda, const std::uint32_t* b,
                              Index ldb, float* c, Index ldc, bool accumulate) {
  __m512 acc[std::size_t{MR}][std::size_t{NR}];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r)
      acc[i][r] = accumulate ? _mm512_loadu_ps(c + i * ldc + r * 16) : _mm512_setzero_ps();
  // The bf16 vector type has no load or cast intrinsics in GCC 12: memcpy (one vmovdqu16, one
  // vpbroadcastd) stands in for a C-style cast.
  for (Index p = 0; p < kp; ++p) {
    __m512bh bv[std::size_t{NR}];
    for (int r = 0; r < NR; ++r) std::memcpy(&bv[r], b + p * ldb + r * 16, sizeof bv[r]);
    for (int i = 0; i < MR; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, a + i * lda + 2 * p, sizeof pair);
      const __m512i pairs = _mm512_set1_epi32(pair);
      __m512bh ai;
      std::memcpy(&ai, &pairs, sizeof ai);
      for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], ai, bv[r]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) _mm512_storeu_ps(c + i * ldc + r * 16, acc[i][r]);
}

// The micro-kernel over rows [0, m) in blocks of 6, the last block with fewer.
template <int NR>
inline void rows_bf16(Index m, Index kp, const std::uint16_t* a, Index lda, const std::uint32_t* b,
                      Index ldb, float* c, Index ldc, bool accumulate) {
  Index i = 0;
  for (; i + 6 <= m; i += 6)
    micro_kernel_bf16<6, NR>(kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
  const auto rest = [&](auto rows) {
    micro_kernel_bf16<decltype(rows)::value, NR>(kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc,
                                                 accumulate);
  };
  switch (m - i) {
    case 1:
      return rest(std::integral_constant<int, 1>{});
    case 2:
      return rest(std::integral_constant<int, 2>{});
    case 3:
      return rest(std::integral_constant<int, 3>{});
    case 4:
      return rest(std::integral_constant<int, 4>{});
    case 5:
      return rest(std::integral_constant<int, 5>{});
    default:
      return;
  }
}

}  // namespace detail

/// C[m, n] = A[m, k] * B[k, n] (or += when `accumulate`) on bf16 pairs: a as packed by
/// pack_bf16_rows (lda >= k rounded up to even), b by pack_bf16_pairs (ldb >= n), n a
/// multiple of kBf16Lanes. No allocation, no threading.
inline void gemm_bf16(Index m, Index n, Index k, const std::uint16_t* a, Index lda,
                      const std::uint32_t* b, Index ldb, float* c, Index ldc, bool accumulate) {
  const Index kp = (k + 1) / 2;
  Index j = 0;
  for (; j + 4 * kBf16Lanes <= n; j += 4 * kBf16Lanes)
    detail::rows_bf16<4>(m, kp, a, lda, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; j += kBf16Lanes)
    detail::rows_bf16<1>(m, kp, a, lda, b + j, ldb, c + j, ldc, accumulate);
}
#endif

}  // namespace attnkit::gemm
