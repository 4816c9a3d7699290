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

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/bf16_dot.hpp"
#include "attnkit/simd/vec.hpp"
#include "attnkit/storage/bf16_round.hpp"

namespace attnkit::gemm {

/// True when this build has the bf16 pair products (AVX512-BF16: simd/bf16_dot.hpp).
inline constexpr bool kHasBf16Dot = simd::kHasBf16Dot;

/// How the tile kernel serves Products::Bf16: Auto picks per CPU (bf16_products_here()); the
/// others force a kernel (tests, benchmarks): vdpbf16ps where the build has it, or f32 FMAs
/// on the operands rounded to bf16 (the portable form, on every ISA).
enum class Bf16Kernel { Auto, PairProducts, RoundedF32 };

/// The process-wide choice (default Auto).
inline std::atomic<Bf16Kernel>& bf16_kernel() {
  static std::atomic<Bf16Kernel> kernel{Bf16Kernel::Auto};
  return kernel;
}

/// Auto's choice: vdpbf16ps on AMD CPUs, whose Zen 4 and Zen 5 cores run it at twice the f32
/// FMA's multiply-adds per cycle (AMD's and uops.info's tables; not measured on this
/// project's machines yet). Elsewhere nothing makes bf16 products faster than exact ones --
/// a Xeon of the Sapphire Rapids class measured 0.5 vdpbf16ps a cycle against 2 FMAs (84
/// against 166-175 GFLOP/s, bench_dense's products table), and the rounded-f32 form pays for
/// its rounding -- so Auto leaves the products exact there (the mode is a permission).
inline bool bf16_dot_by_default() {
#ifdef ATTNKIT_BF16_DOT
  return __builtin_cpu_is("amd") != 0;
#else
  return false;
#endif
}

/// Whether Products::Bf16 rounds the operands here (else the products stay exact).
inline bool bf16_products_here() {
  switch (bf16_kernel().load(std::memory_order_relaxed)) {
    case Bf16Kernel::PairProducts:
      return kHasBf16Dot;
    case Bf16Kernel::RoundedF32:
      return true;
    case Bf16Kernel::Auto:
      break;
  }
  return bf16_dot_by_default();
}

/// Whether they are multiplied with vdpbf16ps (else with f32 FMAs).
inline bool pair_products_chosen() {
  return bf16_products_here() && kHasBf16Dot &&
         bf16_kernel().load(std::memory_order_relaxed) != Bf16Kernel::RoundedF32;
}

/// Columns of one vector of pairs: B and C have n a multiple of this.
inline constexpr Index kBf16Lanes = 16;

/// The bits of x rounded to bf16 (storage/bf16_round.hpp: the high half of the rounded f32).
inline std::uint16_t bf16_bits(float x) {
  const float rounded = attnkit::detail::round_to_bf16(x);
  std::uint32_t bits;
  std::memcpy(&bits, &rounded, sizeof bits);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// dst[i * ld + p] = src[i * src_row + p * src_col] rounded to bf16, for i < m, p < k, and 0
/// at p = k when k is odd (the pair's other half).
inline void pack_bf16_rows(const float* src, Index src_row, Index src_col, Index m, Index k,
                           std::uint16_t* dst, Index ld) {
  for (Index i = 0; i < m; ++i) {
    for (Index p = 0; p < k; ++p) dst[i * ld + p] = bf16_bits(src[i * src_row + p * src_col]);
    if (k % 2 == 1) dst[i * ld + k] = 0;
  }
}

/// dst[(p / 2) * ld + j] = the pair (src row p, src row p + 1) at column j, rounded to bf16,
/// for p < k (rows ld_src apart), j < n; a missing last row of an odd k is 0.
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
  simd::Vec acc[std::size_t{MR}][std::size_t{NR}];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r)
      acc[i][r] = accumulate ? simd::load(c + i * ldc + r * 16) : simd::Vec(0.f);
  for (Index p = 0; p < kp; ++p) {
    simd::Bf16Pairs bv[std::size_t{NR}];
    for (int r = 0; r < NR; ++r) bv[r] = simd::load_pairs(b + p * ldb + r * 16);
    for (int i = 0; i < MR; ++i) {
      const simd::Bf16Pairs ai = simd::broadcast_pair(a + i * lda + 2 * p);
      for (int r = 0; r < NR; ++r) acc[i][r] = simd::dot_pairs(acc[i][r], ai, bv[r]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) simd::store(c + i * ldc + r * 16, acc[i][r]);
}

// The micro-kernel over rows [0, m) in blocks of 6, the last few rows one at a time (four
// instantiations in all: each costs every translation unit that runs attention() its
// compile time, and the remainder rows are a few of a tile's 64 or 256).
template <int NR>
inline void rows_bf16(Index m, Index kp, const std::uint16_t* a, Index lda, const std::uint32_t* b,
                      Index ldb, float* c, Index ldc, bool accumulate) {
  Index i = 0;
  for (; i + 6 <= m; i += 6)
    micro_kernel_bf16<6, NR>(kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
  for (; i < m; ++i)
    micro_kernel_bf16<1, NR>(kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
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
