// The keys a kernel reads (kernel/tiles/kernel_keys.hpp, detail::with_kernel_keys) and the row
// norms cosine logits use (kernel/tiles/row_norms.hpp):
//  - no Position: split-KV and short calls read k in place; a call of kContiguousCopyQueries
//    queries or more reads strided f32 K (BSHD with several heads) from a contiguous copy of
//    the same values;
//  - a row-turning Position (Rope): every key row arrives turned at its position, as
//    apply_position() turns it;
//  - inverse_norm() is 1 / |x| in f64 terms, 0 for a zero row; inverse_row_norms() indexes
//    [(b * heads + h) * seq + s].
#include <attnkit/kernel/tiles/kernel_keys.hpp>
#include <attnkit/kernel/tiles/row_norms.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/position/apply.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <vector>

#include "support/reference_check.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

ak::Problem problem_for(Index q_len, Index kv_len, Index kv_heads, Index dim) {
  ak::Problem p;
  p.batch = 1;
  p.q_heads = kv_heads;
  p.kv_heads = kv_heads;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.head_dim = p.value_dim = dim;
  p.scale = 1.f;
  p.threads = 1;
  return p;
}

// The largest |keys[b, h, s, c] - expected row (b, h, s)[c]| over every element.
template <class T>
double max_diff(const ak::View<T>& keys, const Tensor<float>& expected) {
  double worst = 0.0;
  for (Index h = 0; h < keys.heads; ++h)
    for (Index s = 0; s < keys.seq; ++s)
      for (Index c = 0; c < keys.dim; ++c)
        worst = std::max(
            worst, std::fabs(double(keys.row(0, h, s)[c]) - double(expected.view.row(0, h, s)[c])));
  return worst;
}

}  // namespace

TEST_CASE("kernel keys: in place, or a contiguous copy of strided f32 keys for long calls",
          "[kernel_keys]") {
  Tensor<float> k(Layout::Bshd, 1, 4, 50, 32);  // rows H D apart: strided
  k.randomize(3);
  const auto spec = ak::make_spec(ak::Causal{});
  const ak::View<const float> kv = k.cview();
  for (const bool split : {false, true})
    for (const Index q_len : {Index{8}, ak::detail::kContiguousCopyQueries}) {
      INFO("split " << split << ", Lq " << q_len);
      bool ran = false;
      ak::detail::with_kernel_keys(spec, problem_for(q_len, 50, 4, 32), kv, split,
                                   [&](const auto& keys) {
                                     ran = true;
                                     const bool copied = !split && q_len >= 256;
                                     CHECK((keys.data == kv.data) == !copied);
                                     CHECK(keys.seq_stride == (copied ? 32 : kv.seq_stride));
                                     CHECK(max_diff(keys, k) == 0.0);  // the same values
                                   });
      CHECK(ran);
    }
}

TEST_CASE("kernel keys: a row-turning Position hands every key row turned at its position",
          "[kernel_keys][rope]") {
  Tensor<float> k(Layout::Bhsd, 1, 2, 40, 32), turned(Layout::Bhsd, 1, 2, 40, 32);
  k.randomize(5);
  turned.randomize(5);
  const ak::Rope rope{ak::RopeTable(32, 10000.0, 64)};
  ak::apply_position(rope, turned.view, ak::Role::Key);
  const auto spec = ak::make_spec(ak::Causal{}, rope);
  bool ran = false;
  ak::detail::with_kernel_keys(spec, problem_for(4, 40, 2, 32), k.cview(), true,
                               [&](const auto& keys) {
                                 ran = true;
                                 CHECK(max_diff(keys, turned) <= ak::test::tol::kF32);
                                 CHECK(max_diff(keys, k) > 1e-3);  // they were turned
                               });
  CHECK(ran);
}

TEST_CASE("row norms: 1 / |x| in f64 terms, 0 for a zero row, indexed by (b, h, s)",
          "[kernel_keys][row_norms]") {
  Tensor<float> x(Layout::Bshd, 2, 3, 5, 24);
  x.randomize(9);
  std::fill(x.view.row(1, 2, 4), x.view.row(1, 2, 4) + 24, 0.f);
  const std::vector<float> norms = ak::detail::inverse_row_norms(x.cview());
  REQUIRE(norms.size() == 2 * 3 * 5);
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 3; ++h)
      for (Index s = 0; s < 5; ++s) {
        double sum = 0.0;
        for (Index c = 0; c < 24; ++c)
          sum += double(x.view.row(b, h, s)[c]) * x.view.row(b, h, s)[c];
        const double want = sum == 0.0 ? 0.0 : 1.0 / std::sqrt(sum);
        const float got = norms[std::size_t((b * 3 + h) * 5 + s)];
        INFO("row (" << b << ", " << h << ", " << s << ")");
        CHECK(std::fabs(double(got) - want) <= 1e-7 * want);
      }
  CHECK(norms[std::size_t((1 * 3 + 2) * 5 + 4)] == 0.f);
}
