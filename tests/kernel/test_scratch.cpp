// The kernel's per-thread working memory and the copies into it: detail::Scratch
// (detail/scratch.hpp) carves 64-byte aligned, disjoint buffers sized by size_for();
// TileConfig (kernel/tiles/tile_config.hpp) keeps the query tile a whole number of vectors;
// detail::pack_q_transposed / pack_rows (kernel/tiles/pack.hpp) transpose, scale, zero-pad and
// convert bf16 storage to f32.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/core/tensor.hpp>
#include <attnkit/detail/scratch.hpp>
#include <attnkit/kernel/tiles/pack.hpp>
#include <attnkit/kernel/tiles/tile_config.hpp>
#include <attnkit/simd/simd.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::detail::Scratch;

namespace {

constexpr float kSentinel = -777.f;  // memory that packing must not touch

bool aligned64(const float* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

}  // namespace

TEST_CASE("Scratch: a size that cannot fit in memory throws std::bad_alloc, never wraps",
          "[scratch][errors]") {
  const Index huge = std::numeric_limits<Index>::max() / 4;
  CHECK_THROWS_AS(Scratch::size_for(huge), std::bad_alloc);  // as bytes it overflows
  CHECK_THROWS_AS(Scratch::size_for(huge / 4, huge / 4, huge / 4), std::bad_alloc);
  CHECK_THROWS_AS(Scratch::size_for(std::numeric_limits<Index>::max()), std::bad_array_new_length);
  CHECK(Scratch::size_for(Index{1} << 40) == Index{1} << 40);  // large is fine
}

TEST_CASE("Scratch: size_for rounds every buffer up to whole 64-byte lines", "[scratch]") {
  // 16 floats per line.
  CHECK(Scratch::size_for() == 0);
  CHECK(Scratch::size_for(Index{0}) == 0);
  CHECK(Scratch::size_for(Index{1}) == 16);
  CHECK(Scratch::size_for(Index{16}) == 16);
  CHECK(Scratch::size_for(Index{17}) == 32);
  CHECK(Scratch::size_for(Index{1}, Index{1}) == 32);
  CHECK(Scratch::size_for(Index{64 * 80}, Index{0}, Index{5}, Index{256 * 64}) ==
        64 * 80 + 16 + 256 * 64);
}

TEST_CASE("Scratch: carve hands out 64-byte aligned, disjoint buffers within its size",
          "[scratch]") {
  const std::vector<Index> sizes{1, 16, 17, 100, 3, 64 * 80, 5};
  Scratch scratch(
      Scratch::size_for(sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5], sizes[6]));
  const Index capacity =
      Scratch::size_for(sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5], sizes[6]);
  std::vector<float*> buffers;
  for (const Index n : sizes) buffers.push_back(scratch.carve(n));

  const float* base = buffers.front();
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    INFO("buffer " << i << " of " << sizes[i] << " floats");
    CHECK(aligned64(buffers[i]));
    CHECK(buffers[i] >= base);
    CHECK(buffers[i] + sizes[i] <= base + capacity);
    if (i > 0) CHECK(buffers[i] >= buffers[i - 1] + sizes[i - 1]);  // after the previous one
  }
  // Fill each buffer with its own number, then read all back: no two overlap.
  for (std::size_t i = 0; i < buffers.size(); ++i)
    std::fill(buffers[i], buffers[i] + sizes[i], float(i));
  for (std::size_t i = 0; i < buffers.size(); ++i)
    for (Index e = 0; e < sizes[i]; ++e) CHECK(buffers[i][e] == float(i));  // exact: stored ints
}

TEST_CASE("Scratch: an empty scratch still hands out an aligned zero-size buffer", "[scratch]") {
  Scratch empty(Scratch::size_for(Index{0}));  // e.g. K used in place: its buffer is 0 floats
  CHECK(aligned64(empty.carve(0)));
}

TEST_CASE("TileConfig: the query tile is a whole number of SIMD vectors", "[scratch][tiles]") {
  STATIC_REQUIRE(ak::TileConfig::kBlockQ % ak::simd::kWidth == 0);
  STATIC_REQUIRE(ak::TileConfig::kBlockQ > 0);
  STATIC_REQUIRE(ak::TileConfig::kBlockK > 0);
}

TEST_CASE("pack_q_transposed: transposes, scales and zero-pads the query lanes", "[pack]") {
  // q [1, 2, 5, 3] BHSD holding 100 h + 10 s + c; pack rows 1..3 of head 1.
  const Index S = 5, D = 3, row0 = 1, rows = 3, padded = 6, ld = 8;
  std::vector<float> qm(2 * S * D);
  const auto q = ak::bhsd(qm.data(), 1, 2, S, D);
  for (Index h = 0; h < 2; ++h)
    for (Index s = 0; s < S; ++s)
      for (Index c = 0; c < D; ++c) q.row(0, h, s)[c] = float(100 * h + 10 * s + c);
  std::vector<float> qt(D * ld, kSentinel);  // [D, ld]
  ak::detail::pack_q_transposed(ak::View<const float>(q), 0, 1, row0, rows, padded, 0.5f, qt.data(),
                                ld);
  // Exact below: integers times a power of two.
  for (Index c = 0; c < D; ++c)
    for (Index r = 0; r < ld; ++r) {
      INFO("dim " << c << " lane " << r);
      const float got = qt[static_cast<std::size_t>(c * ld + r)];
      if (r < rows)
        CHECK(got == 0.5f * float(100 + 10 * (row0 + r) + c));
      else if (r < padded)
        CHECK(got == 0.f);  // padded lanes: finite, unused logits
      else
        CHECK(got == kSentinel);  // beyond `padded`: untouched
    }
}

TEST_CASE("pack_rows: copies rows to a padded stride and zero-fills the tail", "[pack]") {
  // src [1, 2, 4, 3] BSHD; rows 1..2 of head 1 into dst [2, ld = 5].
  const Index S = 4, H = 2, D = 3, ld = 5;
  std::vector<float> m(S * H * D);
  const auto src = ak::bshd(m.data(), 1, S, H, D);
  for (Index h = 0; h < H; ++h)
    for (Index s = 0; s < S; ++s)
      for (Index c = 0; c < D; ++c) src.row(0, h, s)[c] = float(100 * h + 10 * s + c);
  std::vector<float> dst(2 * ld + 1, kSentinel);
  ak::detail::pack_rows(src, 0, 1, 1, 2, dst.data(), ld);
  for (Index r = 0; r < 2; ++r)
    for (Index c = 0; c < ld; ++c) {
      INFO("row " << r << " column " << c);
      const float got = dst[static_cast<std::size_t>(r * ld + c)];
      CHECK(got == (c < D ? float(100 + 10 * (1 + r) + c) : 0.f));  // exact copies, zero pad
    }
  CHECK(dst.back() == kSentinel);  // nothing past rows * ld
}

TEST_CASE("pack: bf16 storage converts to f32 exactly", "[pack][bf16]") {
  // Every bf16 value is exactly a float, so packing must reproduce float(x) bit for bit:
  // 1/3 and 0.1 are rounded when *stored* as bf16 (8-bit mantissa), never when packed.
  using bf16 = Eigen::bfloat16;
  const float inputs[4] = {1.5f, -2.25f, 1.f / 3.f, 0.1f};
  std::vector<bf16> m;
  for (const float x : inputs) m.push_back(bf16(x));
  const auto v = ak::bhsd(m.data(), 1, 1, 2, 2);  // two rows of two

  std::vector<float> rows(2 * 4, kSentinel);  // [2, ld = 4]
  ak::detail::pack_rows(v, 0, 0, 0, 2, rows.data(), 4);
  std::vector<float> qt(2 * 4, kSentinel);  // [D = 2, ld = 4], scale 2, padded to 4
  ak::detail::pack_q_transposed(v, 0, 0, 0, 2, 4, 2.f, qt.data(), 4);

  for (Index r = 0; r < 2; ++r)
    for (Index c = 0; c < 2; ++c) {
      const float stored = static_cast<float>(m[static_cast<std::size_t>(r * 2 + c)]);
      INFO("row " << r << " column " << c << ": " << inputs[r * 2 + c] << " stored as " << stored);
      CHECK(rows[static_cast<std::size_t>(r * 4 + c)] == stored);      // exact conversion
      CHECK(qt[static_cast<std::size_t>(c * 4 + r)] == 2.f * stored);  // times a power of 2
      // bf16 keeps 8 significant bits: the stored value is within 2^-8 of the input.
      CHECK_THAT(stored, WithinRel(inputs[r * 2 + c], 1.f / 256));
    }
  CHECK(rows[2] == 0.f);  // pad columns [2, 4) of row 0
  CHECK(rows[3] == 0.f);
  CHECK(qt[2] == 0.f);  // pad lanes [2, 4) of dim 0
  CHECK(qt[3] == 0.f);
  // 1.5 and -2.25 fit in bf16 and survive unchanged.
  CHECK(rows[0] == 1.5f);
  CHECK(rows[1] == -2.25f);
}

TEST_CASE("pack: is_f32 and as_f32 tell which storage feeds the GEMMs in place", "[pack]") {
  STATIC_REQUIRE(ak::detail::is_f32<float>());
  STATIC_REQUIRE(ak::detail::is_f32<const float>());
  STATIC_REQUIRE_FALSE(ak::detail::is_f32<Eigen::bfloat16>());
  STATIC_REQUIRE_FALSE(ak::detail::is_f32<Eigen::half>());
  STATIC_REQUIRE_FALSE(ak::detail::is_f32<double>());
  const float f = 1.f;
  const Eigen::bfloat16 b(1.f);
  CHECK(ak::detail::as_f32(&f) == &f);
  CHECK(ak::detail::as_f32(&b) == nullptr);
}
