// gemm::gemm, the register-blocked tile product, against a naive f64 triple loop: every
// row remainder of kMR, column counts around the kNR-vector block (with a one-vector
// tail), depths across the kKc panel, overwrite and accumulate, row-major and transposed A.
// Padding of A holds NaN, so a read outside [m, k] poisons the result. Rows read through
// row tables (RowsA, RowsB) give the strided product's bits.
#include <algorithm>
#include <attnkit/gemm/tile_gemm.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace ak = attnkit;
namespace gemm = attnkit::gemm;
using ak::Index;

namespace {

// A dot product of k terms in f32 rounds at most k + 1 times (+1 when accumulating into C),
// whatever the order: |error| <= (k + 2) u sum |terms| with u the f32 unit roundoff. A
// wrong index costs O(1), far above this bound.
constexpr double kUnitRoundoff = std::numeric_limits<float>::epsilon() / 2;
double gemm_tolerance(Index k, double magnitude) {
  return double(k + 2) * kUnitRoundoff * magnitude;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 1234.5f;  // C padding that gemm must not write

std::vector<float> uniform(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Column counts: whole vectors below, at and above one kNR-vector block, with tails of one
// and of kNR - 1 vectors.
std::vector<Index> column_counts() {
  constexpr Index w = gemm::kWidth, block = gemm::kNR * gemm::kWidth;
  std::vector<Index> ns{w, 2 * w, block, block + w, 2 * block + w, 2 * block + (gemm::kNR - 1) * w};
  std::sort(ns.begin(), ns.end());
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  return ns;
}

struct Operands {
  Index m, n, k;
  bool transposed;        // A stored [k, lda] (column i of it is row i of A)
  Index lda, ldb, ldc;    // padded leading dimensions
  std::vector<float> a;   // [m, lda] or [k, lda], padding NaN
  std::vector<float> b;   // [k, ldb], padding NaN
  std::vector<float> c0;  // [m, ldc] initial C, padding kSentinel

  Operands(Index m_, Index n_, Index k_, bool transposed_, std::mt19937& rng)
      : m(m_),
        n(n_),
        k(k_),
        transposed(transposed_),
        lda(transposed_ ? m_ + 2 : k_ + 3),
        ldb(n_ + gemm::kWidth + 1),
        ldc(n_ + 3) {
    const Index a_rows = transposed ? k : m, a_cols = transposed ? m : k;
    a.assign(static_cast<std::size_t>(std::max<Index>(a_rows * lda, 1)), kNaN);
    const auto a_vals = uniform(static_cast<std::size_t>(a_rows * a_cols), rng);
    for (Index r = 0; r < a_rows; ++r)
      std::copy_n(a_vals.begin() + r * a_cols, a_cols, a.begin() + r * lda);
    b.assign(static_cast<std::size_t>(std::max<Index>(k * ldb, 1)), kNaN);
    const auto b_vals = uniform(static_cast<std::size_t>(k * n), rng);
    for (Index p = 0; p < k; ++p) std::copy_n(b_vals.begin() + p * n, n, b.begin() + p * ldb);
    c0.assign(static_cast<std::size_t>(m * ldc), kSentinel);
    const auto c_vals = uniform(static_cast<std::size_t>(m * n), rng);
    for (Index i = 0; i < m; ++i) std::copy_n(c_vals.begin() + i * n, n, c0.begin() + i * ldc);
  }

  gemm::StridedA a_operand() const {
    return transposed ? gemm::StridedA{a.data(), 1, lda} : gemm::StridedA{a.data(), lda, 1};
  }
  float a_at(Index i, Index p) const {
    return a[static_cast<std::size_t>(transposed ? p * lda + i : i * lda + p)];
  }
  float b_at(Index p, Index j) const { return b[static_cast<std::size_t>(p * ldb + j)]; }
  float c0_at(Index i, Index j) const { return c0[static_cast<std::size_t>(i * ldc + j)]; }
};

// Runs gemm and compares every element with the f64 triple loop; checks C's padding.
void check_gemm(const Operands& x, bool accumulate) {
  std::vector<float> c = x.c0;
  gemm::gemm(x.m, x.n, x.k, x.a_operand(), x.b.data(), x.ldb, c.data(), x.ldc, accumulate);
  int bad = 0;
  for (Index i = 0; i < x.m; ++i) {
    for (Index j = 0; j < x.n; ++j) {
      double expected = accumulate ? double(x.c0_at(i, j)) : 0.0;
      double magnitude = std::abs(expected);
      for (Index p = 0; p < x.k; ++p) {
        const double term = double(x.a_at(i, p)) * double(x.b_at(p, j));
        expected += term;
        magnitude += std::abs(term);
      }
      const double got = c[static_cast<std::size_t>(i * x.ldc + j)];
      if (std::abs(got - expected) <= gemm_tolerance(x.k, magnitude)) continue;  // NaN fails
      if (++bad > 3) continue;  // a few elements say enough
      INFO("C(" << i << ", " << j << ") = " << got << ", expected " << expected << ", tolerance "
                << gemm_tolerance(x.k, magnitude));
      CHECK(std::abs(got - expected) <= gemm_tolerance(x.k, magnitude));
    }
    // Exact: columns [n, ldc) are padding and must keep their bits.
    for (Index j = x.n; j < x.ldc; ++j)
      CHECK(c[static_cast<std::size_t>(i * x.ldc + j)] == kSentinel);
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("gemm: matches the f64 triple loop for every row, column and depth remainder",
          "[gemm][grid]") {
  const Index m = GENERATE(range<Index>(1, 14));  // 1..13: every remainder of kMR = 6, twice
  std::mt19937 rng(static_cast<std::uint32_t>(100 + m));
  for (const Index n : column_counts())
    for (const Index k : {0, 1, 5, 128, 129, 300})  // around kKc = 128, and past two panels
      for (const bool transposed : {false, true})
        for (const bool accumulate : {false, true}) {
          INFO("m=" << m << " n=" << n << " k=" << k << (transposed ? " A^T" : " A")
                    << (accumulate ? " C +=" : " C =") << " on " << ak::simd::kArchName);
          check_gemm(Operands(m, n, k, transposed, rng), accumulate);
        }
}

TEST_CASE("gemm: k = 0 zeroes C, or leaves it unchanged when accumulating", "[gemm][edge]") {
  std::mt19937 rng(3);
  const Operands x(7, 3 * gemm::kWidth, 0, false, rng);
  std::vector<float> c = x.c0;
  gemm::gemm(x.m, x.n, 0, x.a_operand(), x.b.data(), x.ldb, c.data(), x.ldc, true);
  CHECK(std::memcmp(c.data(), x.c0.data(), c.size() * sizeof(float)) == 0);
  gemm::gemm(x.m, x.n, 0, x.a_operand(), x.b.data(), x.ldb, c.data(), x.ldc, false);
  for (Index i = 0; i < x.m; ++i)
    for (Index j = 0; j < x.ldc; ++j)  // exact: an empty sum is 0; padding keeps its bits
      CHECK(c[static_cast<std::size_t>(i * x.ldc + j)] == (j < x.n ? 0.f : kSentinel));
}

TEST_CASE("gemm: m = 0 writes nothing", "[gemm][edge]") {
  float a = kNaN, b[gemm::kWidth] = {}, c = kSentinel;
  gemm::gemm(0, gemm::kWidth, 1, gemm::StridedA{&a, 1, 1}, b, gemm::kWidth, &c, gemm::kWidth,
             false);
  CHECK(c == kSentinel);  // exact: untouched
}

TEST_CASE("gemm: StridedA addresses element (i, p) at i * row_stride + p * col_stride", "[gemm]") {
  const float data[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const gemm::StridedA rows{data, 4, 1}, cols{data, 1, 3};
  CHECK(rows.at(2, 1) == data + 9);
  CHECK(cols.at(2, 1) == data + 5);
  CHECK(gemm::StridedA{data + 1, 4, 1}.at(1, 2) == data + 7);
}

TEST_CASE("gemm: a triangular A skips the zeros past its bands, with the bits of the whole product",
          "[gemm]") {
  // A [m, m] with the triangle's other side zero; the triangular product reads it only in
  // the diagonal blocks of its bands of kMR rows, so past them it holds NaN there (a read
  // poisons C) and zero inside them.
  for (const Index m : {1, 5, 6, 7, 13, 64})
    for (const auto t : {gemm::Triangle::Lower, gemm::Triangle::Upper})
      for (const bool accumulate : {false, true}) {
        INFO("m=" << m << (t == gemm::Triangle::Lower ? " lower" : " upper")
                  << (accumulate ? " C +=" : " C ="));
        std::mt19937 rng(static_cast<std::uint32_t>(m));
        const Index n = 2 * gemm::kWidth;
        std::vector<float> zeros = uniform(std::size_t(m * m), rng), nans = zeros;
        for (Index i = 0; i < m; ++i)
          for (Index p = 0; p < m; ++p)
            if (t == gemm::Triangle::Lower ? p > i : p < i) {
              const Index band = i / gemm::kMR * gemm::kMR;  // the row's band starts here
              const bool read = t == gemm::Triangle::Lower ? p < band + gemm::kMR : p >= band;
              zeros[std::size_t(i * m + p)] = 0.f;
              nans[std::size_t(i * m + p)] = read ? 0.f : kNaN;
            }
        const std::vector<float> b = uniform(std::size_t(m * n), rng),
                                 c0 = uniform(std::size_t(m * n), rng);
        std::vector<float> whole = c0, part = c0;
        gemm::gemm(m, n, m, {zeros.data(), m, 1}, b.data(), n, whole.data(), n, accumulate);
        gemm::gemm(m, n, m, {nans.data(), m, 1}, b.data(), n, part.data(), n, accumulate, t);
        CHECK(std::memcmp(whole.data(), part.data(), whole.size() * sizeof(float)) == 0);
      }
}

TEST_CASE("gemm: rows anywhere (RowsA, RowsB) give the bits of the same rows strided", "[gemm]") {
  // A's and B's rows copied to scattered places (reversed, with NaN between them: a read
  // past a row's end poisons C), then read through row tables.
  for (const Index m : {1, 7, 13})
    for (const Index n : column_counts())
      for (const Index k : {1, 5, 129}) {
        INFO("m=" << m << " n=" << n << " k=" << k);
        std::mt19937 rng(static_cast<std::uint32_t>(m * 1000 + n * 10 + k));
        const Operands x(m, n, k, false, rng);
        const auto scatter = [](const std::vector<float>& src, Index rows, Index ld, Index len,
                                std::vector<float>& dst, std::vector<const float*>& table) {
          const Index gap = len + 5;
          dst.assign(std::size_t(rows * gap + 1), kNaN);
          table.resize(std::size_t(rows));
          for (Index r = 0; r < rows; ++r) {
            float* row = dst.data() + (rows - 1 - r) * gap;
            std::copy_n(src.begin() + r * ld, len, row);
            table[std::size_t(r)] = row;
          }
        };
        std::vector<float> a_rows, b_rows;
        std::vector<const float*> a_table, b_table;
        scatter(x.a, m, x.lda, k, a_rows, a_table);
        scatter(x.b, k, x.ldb, n, b_rows, b_table);
        for (const bool accumulate : {false, true}) {
          std::vector<float> strided = x.c0, rows_a = x.c0, rows_b = x.c0;
          gemm::gemm(m, n, k, x.a_operand(), x.b.data(), x.ldb, strided.data(), x.ldc, accumulate);
          gemm::gemm(m, n, k, gemm::RowsA{a_table.data()}, gemm::StridedB{x.b.data(), x.ldb},
                     rows_a.data(), x.ldc, accumulate);
          gemm::gemm(m, n, k, x.a_operand(), gemm::RowsB{b_table.data()}, rows_b.data(), x.ldc,
                     accumulate);
          CHECK(std::memcmp(strided.data(), rows_a.data(), strided.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(strided.data(), rows_b.data(), strided.size() * sizeof(float)) == 0);
        }
      }
}
