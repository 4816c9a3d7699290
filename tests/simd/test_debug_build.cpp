// The library in a Debug build: this file is compiled without optimization (-O0, see
// tests/CMakeLists.txt) for the native ISA. GCC then defines some AVX-512 intrinsics as
// macros that xsimd 8.1 cannot call (simd::log2 works around it): the whole library must
// still compile, and the SIMD log2 must still agree with std::log2. libstdc++'s assertions
// are on (as distributions' default flags build, -D_GLIBCXX_ASSERTIONS): a disengaged
// std::optional read, an index past a std::vector aborts.
#ifndef _GLIBCXX_ASSERTIONS
#define _GLIBCXX_ASSERTIONS 1
#endif
#include <attnkit/attnkit.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace simd = attnkit::simd;

TEST_CASE("debug build: the library compiles at -O0 and simd::log2 matches std::log2",
          "[simd][debug]") {
  // Within 4 ulp of the f64 log2 of the same f32 (xsimd's polynomial, or std::log2 lane by
  // lane); exact at 0 (-inf), +inf, 1 (0) and for NaN.
  constexpr double kUlps = 4 * std::numeric_limits<float>::epsilon();
  std::vector<float> xs = {0.f, 1.f,    2.f,   0.5f,
                           3.f, 1e-30f, 1e30f, std::numeric_limits<float>::infinity()};
  for (int i = 1; i < 200; ++i) xs.push_back(float(i) * 0.37f);
  for (std::size_t i = 0; i < xs.size(); i += simd::kWidth) {
    alignas(64) float in[simd::kWidth], out[simd::kWidth];
    for (std::size_t l = 0; l < simd::kWidth; ++l) in[l] = xs[std::min(i + l, xs.size() - 1)];
    simd::store(out, simd::log2(simd::load(in)));
    for (std::size_t l = 0; l < simd::kWidth; ++l) {
      const double want = std::log2(double(in[l]));
      INFO("x = " << in[l]);
      if (std::isinf(want) || want == 0)
        CHECK(double(out[l]) == want);
      else
        CHECK(std::fabs(double(out[l]) - want) <= kUlps * std::fabs(want));
    }
  }
  alignas(64) float nan_in[simd::kWidth], nan_out[simd::kWidth];
  for (float& x : nan_in) x = std::numeric_limits<float>::quiet_NaN();
  simd::store(nan_out, simd::log2(simd::load(nan_in)));
  CHECK(std::isnan(nan_out[0]));
}

TEST_CASE("debug build: indexer_topk's checks read no unset option", "[dsa][debug]") {
  // q_I [1, 2, 3, 4], weights [1, 2, 3, 1], k_I [1, 1, 5, 4]: the top 2 keys of each query.
  std::vector<float> q(24, 1.f), w(6, 1.f), k(20);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = float(i % 7);
  std::vector<std::int32_t> selected(6, -7);
  attnkit::indexer_topk(attnkit::IndexerSpec{2, true},
                        attnkit::View<const float>(attnkit::bhsd(q.data(), 1, 2, 3, 4)),
                        attnkit::View<const float>(attnkit::bhsd(w.data(), 1, 2, 3, 1)),
                        attnkit::View<const float>(attnkit::bhsd(k.data(), 1, 1, 5, 4)),
                        attnkit::bhsd(selected.data(), 1, 1, 3, 2));
  // Query t sees keys 0 .. t + 2; key s scores twice its row's sum: 12, 30, 20, 24, 28.
  CHECK(selected == std::vector<std::int32_t>{1, 2, 1, 3, 1, 4});
}
