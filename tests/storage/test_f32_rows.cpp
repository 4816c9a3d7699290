// storage/f32_rows.hpp: rows of any storage as f32 for the kernels. pack_rows() widens and
// zero-pads to the stride asked; f32_rows() serves f32 rows in place (the view's own memory
// and stride) or packs them; contiguous_rows() gathers a view BHSD-contiguous and hands each
// row to a callback, the same for any thread count; is_f32() / is_bf16() name the storage.
#include <Eigen/Core>
#include <attnkit/storage/f32_rows.hpp>
#include <catch2/catch_test_macros.hpp>
#include <vector>

#include "support/attnkit_test.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

TEST_CASE("f32_rows: widened, zero-padded, in place when asked", "[storage][f32_rows]") {
  STATIC_CHECK(ak::detail::is_f32<const float>());
  STATIC_CHECK_FALSE(ak::detail::is_f32<Eigen::bfloat16>());
  STATIC_CHECK(ak::detail::is_bf16<const Eigen::bfloat16>());
  STATIC_CHECK_FALSE(ak::detail::is_bf16<Eigen::half>());
  const Index B = 2, H = 3, S = 5, D = 7, ld = 16;
  Tensor<Eigen::bfloat16> x(Layout::Padded, B, H, S, D);
  x.randomize(3);
  Tensor<float> f(Layout::Padded, B, H, S, D);
  f.randomize(4);
  std::vector<float> out(std::size_t(3 * ld), -1.f);
  ak::detail::pack_rows(x.cview(), 1, 2, 1, 3, out.data(), ld);
  for (Index r = 0; r < 3; ++r) {
    for (Index c = 0; c < D; ++c)
      CHECK(out[std::size_t(r * ld + c)] == float(x.view.row(1, 2, 1 + r)[c]));  // bf16 is exact
    for (Index c = D; c < ld; ++c) CHECK(out[std::size_t(r * ld + c)] == 0.f);
  }
  // In place: f32 rows come back as the view's own memory and stride.
  const ak::detail::F32Rows own = ak::detail::f32_rows(f.cview(), true, 1, 0, 2, 2, out.data(), ld);
  CHECK(own.data == f.view.row(1, 0, 2));
  CHECK(own.ld == f.view.seq_stride);
  // Not in place: packed into the scratch with its stride.
  const ak::detail::F32Rows packed =
      ak::detail::f32_rows(f.cview(), false, 1, 0, 2, 2, out.data(), ld);
  CHECK(packed.data == out.data());
  CHECK(packed.ld == ld);
  for (Index r = 0; r < 2; ++r)
    for (Index c = 0; c < D; ++c) CHECK(out[std::size_t(r * ld + c)] == f.view.row(1, 0, 2 + r)[c]);
  // Gathered BHSD-contiguous, each row turned by the callback (here: +1 in column 0), the
  // same for 1 and 2 threads.
  for (const int threads : {1, 2}) {
    const std::vector<float> all = ak::detail::contiguous_rows(
        x.cview(), threads, [](float* row, Index, Index, Index) { row[0] += 1.f; });
    REQUIRE(all.size() == std::size_t(B * H * S * D));
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index s = 0; s < S; ++s)
          for (Index c = 0; c < D; ++c)
            CHECK(all[std::size_t(((b * H + h) * S + s) * D + c)] ==
                  float(x.view.row(b, h, s)[c]) + (c == 0 ? 1.f : 0.f));
  }
}
