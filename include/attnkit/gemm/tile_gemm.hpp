// Tile products of the attention kernels: C[m, n] (+)= A[m, k] * B[k, n] in f32. B and C
// are row-major with n a whole number of SIMD vectors (callers pad); A has any row and
// column stride, so K rows straight from a view, or a transposed weight tile, serve as A
// without a copy. A's or B's rows may also lie anywhere (RowsA, RowsB: a table of row
// pointers), so rows chosen at run time (a top-k selection's keys) serve in place, never
// gathered. A register-blocked micro-kernel (BLIS style): an MR x NR-vector block of C lives
// in registers while one row of B and MR broadcasts of A feed it per step of k.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::gemm {

using simd::kWidth;
using simd::Vec;

// Register block: MR * NR accumulators + NR loads + 1 broadcast must fit the register file.
// 32 registers (AVX-512): 6 x 4 = 24 accumulators; 16 registers: 6 x 2 = 12.
inline constexpr int kMR = 6;
inline constexpr int kNR = simd::kRegisters >= 32 ? 4 : 2;
// RowsA's steps of depth a pointer bump (micro_kernel).
inline constexpr int kRowsUnroll = 8;
// Depth of one pass over B: a kKc x (kNR * kWidth) panel of B stays in L1 across row blocks.
inline constexpr Index kKc = 128;

/// A operand: element (i, p) at data[i * row_stride + p * col_stride].
struct StridedA {
  const float* data;
  Index row_stride, col_stride;
  const float* at(Index i, Index p) const { return data + i * row_stride + p * col_stride; }
  StridedA from(Index i, Index p) const { return {at(i, p), row_stride, col_stride}; }
};

/// A operand whose rows lie anywhere: element (i, p) at rows[i][col + p].
struct RowsA {
  const float* const* rows;
  Index col = 0;
  const float* at(Index i, Index p) const { return rows[i] + col + p; }
  RowsA from(Index i, Index p) const { return {rows + i, col + p}; }
};

/// B operand, row-major: row p at data + p * ld.
struct StridedB {
  const float* data;
  Index ld;
  const float* row(Index p) const { return data + p * ld; }
  StridedB from(Index p, Index j) const { return {row(p) + j, ld}; }
};

/// B operand whose rows lie anywhere: row p at rows[p] + col (each at least the product's
/// n columns long from col).
struct RowsB {
  const float* const* rows;
  Index col = 0;
  const float* row(Index p) const { return rows[p] + col; }
  RowsB from(Index p, Index j) const { return {rows + p, col + j}; }
};

namespace detail {

// The micro-kernel's steps over A rows of unit column stride, each row's pointer stepped
// kRowsUnroll values at a time, so its broadcasts take a constant displacement, not an
// index register (an indexed memory operand costs the FMA an extra micro-op on Intel cores).
template <int MR, int NR, class B>
inline void unit_row_steps(Index k, const float* (&ar)[std::size_t{MR}], B b,
                           Vec (&acc)[std::size_t{MR}][std::size_t{NR}]) {
  Index p = 0;
  constexpr int U = kRowsUnroll;
  for (; p + U <= k; p += U) {
    for (int u = 0; u < U; ++u) {
      Vec brow[std::size_t{NR}];
      for (int r = 0; r < NR; ++r) brow[r] = simd::load(b.row(p + u) + r * kWidth);
      for (int i = 0; i < MR; ++i) {
        const Vec ai(ar[i][u]);
        for (int r = 0; r < NR; ++r) acc[i][r] = simd::fma(ai, brow[r], acc[i][r]);
      }
    }
    for (int i = 0; i < MR; ++i) ar[i] += U;
  }
  for (; p < k; ++p) {
    Vec brow[std::size_t{NR}];
    for (int r = 0; r < NR; ++r) brow[r] = simd::load(b.row(p) + r * kWidth);
    for (int i = 0; i < MR; ++i) {
      const Vec ai(*ar[i]++);
      for (int r = 0; r < NR; ++r) acc[i][r] = simd::fma(ai, brow[r], acc[i][r]);
    }
  }
}

}  // namespace detail

/// C[MR, NR*kWidth] (+)= A[MR, k] * B[k, NR*kWidth]; ldc in elements.
template <int MR, int NR, class A, class B>
inline void micro_kernel(Index k, A a, B b, float* c, Index ldc, bool accumulate) {
  Vec acc[std::size_t{MR}][std::size_t{NR}];  // array bounds are unsigned (-Wsign-conversion)
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r)
      acc[i][r] = accumulate ? simd::load(c + i * ldc + r * kWidth) : Vec(0.f);

  // Rows anywhere, and row-major A under one vector of columns (the FMAs then take A's
  // broadcasts as memory operands), step by pointer (detail::unit_row_steps). On an Intel Xeon,
  // alternated in one process: the DSA engines 8-9% faster (16 heads over one KV head of 128,
  // top k 1024; 16 values a step gained nothing), short query blocks 13% (16 queries over
  // 8192 keys, docs/ledger.md), the rest even. The loads and FMAs are the same; only the
  // address arithmetic differs, so no CPU without the extra micro-op should lose.
  constexpr bool kRows = std::is_same_v<A, RowsA>;
  bool unit = kRows;
  if constexpr (!kRows) unit = NR == 1 && a.col_stride == 1;
  if (unit) {
    const float* ar[std::size_t{MR}];
    for (int i = 0; i < MR; ++i) ar[i] = a.at(i, 0);
    detail::unit_row_steps<MR, NR>(k, ar, b, acc);
  } else {
    for (Index p = 0; p < k; ++p) {
      Vec brow[std::size_t{NR}];
      for (int r = 0; r < NR; ++r) brow[r] = simd::load(b.row(p) + r * kWidth);
      for (int i = 0; i < MR; ++i) {
        const Vec ai(*a.at(i, p));
        for (int r = 0; r < NR; ++r) acc[i][r] = simd::fma(ai, brow[r], acc[i][r]);
      }
    }
  }

  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) simd::store(c + i * ldc + r * kWidth, acc[i][r]);
}

namespace detail {

// Runs the micro-kernel over rows [0, m) in blocks of kMR, the last one or two with fewer rows.
// The remainder is a switch over instantiations: a compile-time recursion measured 2-3%
// slower in the kernel (d=128, L=4096, H=8, one thread).
template <int NR, class A, class B>
inline void row_blocks(Index m, Index k, A a, B b, float* c, Index ldc, bool accumulate) {
  Index i = 0;
  const auto rows_from = [&](Index i0) { return a.from(i0, 0); };
  if constexpr (NR == 1) {
    // One vector of columns (a 16-query tile's logits, AVX-512): 6 accumulators leave the
    // FMAs waiting on their own latency; 8 rows keep both pipes busy (12 would spill the
    // rows' addresses: 16 general registers).
    for (; i + 8 <= m; i += 8) micro_kernel<8, 1>(k, rows_from(i), b, c + i * ldc, ldc, accumulate);
  }
  // A short last block (1 to 4 rows: 2 to 8 accumulators with AVX2's two vectors) leaves the
  // FMA pipes waiting on their own latency: it and the last whole block run as two blocks of
  // near-equal rows instead (16 rows as 6 + 5 + 5, not 6 + 6 + 4: a window-64 call 6% and
  // dense causal 4% faster on Zen 2). Each element of C is the same chain of FMAs whatever
  // the blocking, so the bits do not change.
  Index whole = (m - i) / kMR;
  const Index rest = (m - i) % kMR;
  if (whole > 0 && rest > 0 && rest < kMR - 1) --whole;
  for (; whole > 0; --whole, i += kMR)
    micro_kernel<kMR, NR>(k, rows_from(i), b, c + i * ldc, ldc, accumulate);
  const auto at = [&](auto rows) {
    micro_kernel<decltype(rows)::value, NR>(k, rows_from(i), b, c + i * ldc, ldc, accumulate);
  };
  static_assert(kMR <= 6, "row_blocks: extend the remainder switch for a larger kMR");
  const auto block = [&](Index rows) {  // rows < kMR
    switch (rows) {
      case 1:
        at(std::integral_constant<int, 1>{});
        break;
      case 2:
        at(std::integral_constant<int, 2>{});
        break;
      case 3:
        at(std::integral_constant<int, 3>{});
        break;
      case 4:
        at(std::integral_constant<int, 4>{});
        break;
      case 5:
        at(std::integral_constant<int, 5>{});
        break;
      default:
        break;
    }
    i += rows;
  };
  if (m - i > kMR) block((m - i + 1) / 2);
  block(m - i);
}

}  // namespace detail

/// C[m, n] = A[m, k] * B[k, n] (or += when `accumulate`): A a StridedA or RowsA, B a
/// StridedB or RowsB, C row-major with n % kWidth == 0 and ldc >= n. No allocation, no
/// threading.
template <class A, class B>
inline void gemm(Index m, Index n, Index k, A a, B b, float* c, Index ldc, bool accumulate) {
  assert(n % kWidth == 0);
  if (k == 0) {  // an empty product: C = 0, or unchanged when accumulating
    if (!accumulate)
      for (Index i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.f);
    return;
  }
  constexpr Index kNc = kNR * kWidth;
  for (Index p = 0; p < k; p += kKc) {
    const Index kc = std::min(kKc, k - p);
    const bool acc = accumulate || p > 0;
    Index j = 0;
    const A ap = a.from(0, p);
    for (; j + kNc <= n; j += kNc)
      detail::row_blocks<kNR>(m, kc, ap, b.from(p, j), c + j, ldc, acc);
    switch ((n - j) / kWidth) {  // the last few vectors of columns, in one block
      case 3:
        if constexpr (kNR > 3) detail::row_blocks<3>(m, kc, ap, b.from(p, j), c + j, ldc, acc);
        break;
      case 2:
        if constexpr (kNR > 2) detail::row_blocks<2>(m, kc, ap, b.from(p, j), c + j, ldc, acc);
        break;
      case 1:
        detail::row_blocks<1>(m, kc, ap, b.from(p, j), c + j, ldc, acc);
        break;
      default:
        break;
    }
  }
}

/// gemm() of a row-major B [k, n] with row stride ldb.
inline void gemm(Index m, Index n, Index k, StridedA a, const float* b, Index ldb, float* c,
                 Index ldc, bool accumulate) {
  gemm(m, n, k, a, StridedB{b, ldb}, c, ldc, accumulate);
}

/// Which entries of a square A [m, k = m] a product reads: all, or its lower (j <= i) or
/// upper (j >= i) triangle, the rest being zero.
enum class Triangle { Full, Lower, Upper };

/// gemm() of a triangular A (the other side zero): each band of kMR rows skips the depth
/// where all its rows of A are zero (about half the work at m = k = 64); the zeros inside a
/// band's diagonal block are read. The same bits as gemm() of the whole A.
inline void gemm(Index m, Index n, Index k, StridedA a, const float* b, Index ldb, float* c,
                 Index ldc, bool accumulate, Triangle t) {
  if (t == Triangle::Full) return gemm(m, n, k, a, b, ldb, c, ldc, accumulate);
  for (Index i0 = 0; i0 < m; i0 += kMR) {
    const Index rows = std::min(Index{kMR}, m - i0);
    const Index p0 = t == Triangle::Lower ? 0 : std::min(i0, k);
    const Index p1 = t == Triangle::Lower ? std::min(k, i0 + rows) : k;
    gemm(rows, n, p1 - p0, {a.at(i0, p0), a.row_stride, a.col_stride}, b + p0 * ldb, ldb,
         c + i0 * ldc, ldc, accumulate);
  }
}

}  // namespace attnkit::gemm
