// attention_backward()'s parts on their own: the normalizers' backward faces as detected
// (normalizer/backward_faces.hpp), the spec check every backward entry runs
// (kernel/backward/backward_traits.hpp), the gradient views' checks
// (kernel/backward/backward_checks.hpp) and the store stage that takes dQ rows back through the
// scale and the Position's turn (kernel/backward/backward_store.hpp).
#include <attnkit/kernel/backward/backward_checks.hpp>
#include <attnkit/kernel/backward/backward_store.hpp>
#include <attnkit/kernel/backward/backward_traits.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/normalizer/backward_faces.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/error_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

TEST_CASE("backward faces: detected per normalizer, LSSAR's three passes", "[backward][parts]") {
  using namespace ak::detail;
  STATIC_CHECK(has_normalizer_backward<ak::Softmax>::value);
  STATIC_CHECK(has_normalizer_backward<ak::Sigmoid>::value);
  STATIC_CHECK(backward_passes<ak::Softmax>() == 1);
  STATIC_CHECK_FALSE(has_backward_observe<ak::Softmax>::value);
  STATIC_CHECK(backward_passes<ak::SoftplusL1Reweighted>() == 3);  // W, E, then dS
  STATIC_CHECK(has_backward_observe<ak::SoftplusL1Reweighted>::value);
  STATIC_CHECK(has_trained_param<ak::ReluPower>::value);  // its bias
  // Every built-in spec has its backward faces (a missing one is a static_assert naming it).
  STATIC_CHECK(check_backward_spec<decltype(ak::make_spec(ak::Causal{}))>());
  STATIC_CHECK(
      check_backward_spec<decltype(ak::make_spec(ak::Causal{}, ak::SoftplusL1Reweighted{}))>());
}

TEST_CASE("check_gradients: shapes as the inputs', no memory shared, before any write",
          "[backward][parts]") {
  const Index B = 1, H = 2, L = 6, D = 8;
  Tensor<float> q(Layout::Bhsd, B, H, L, D), k(Layout::Bhsd, B, H, L, D),
      v(Layout::Bhsd, B, H, L, D), dq(Layout::Bhsd, B, H, L, D), dk(Layout::Bhsd, B, H, L, D),
      dv(Layout::Bhsd, B, H, L, D), short_dq(Layout::Bhsd, B, H, L - 1, D);
  ak::detail::check_gradients(q.cview(), k.cview(), v.cview(), dq.view, dk.view, dv.view, {});
  ak::test::check_error(
      [&] {
        ak::detail::check_gradients(q.cview(), k.cview(), v.cview(), short_dq.view, dk.view,
                                    dv.view, {});
      },
      {"dq.seq", "6", "q.seq", "5"});
  ak::test::check_error(
      [&] {
        ak::detail::check_gradients(q.cview(), k.cview(), v.cview(), dq.view, dq.view, dv.view, {});
      },
      {"dq", "dk", "overlapping"});
  ak::test::check_error(
      [&] {
        ak::detail::check_gradients(q.cview(), k.cview(), v.cview(), ak::View<float>(q.view),
                                    dk.view, dv.view, {});
      },
      {"dq", "q", "overlapping"});
}

TEST_CASE("store_query_grads: dQ rows times the scale, turned back by RoPE's transpose",
          "[backward][parts]") {
  const Index B = 1, H = 2, L = 5, D = 8, pad = 16;
  Tensor<float> q(Layout::Bhsd, B, H, L, D), o(Layout::Bhsd, B, H, L, D),
      dq(Layout::Bhsd, B, H, L, D);
  q.randomize(7);
  const ak::Rope rope{ak::RopeTable(D, 10000.0, 64)};
  const auto plain = ak::make_spec(ak::Causal{});
  const auto turned = ak::make_spec(ak::Causal{}, rope);
  const ak::Problem p = ak::make_problem(q.cview(), q.cview(), q.cview(), o.view, ak::Options{});
  std::vector<float> tile(std::size_t(L * pad)), kept;
  for (std::size_t i = 0; i < tile.size(); ++i) tile[i] = std::sin(0.3f * float(i));
  kept = tile;
  // No Position: dq = scale * tile.
  ak::detail::store_query_grads(plain, p, q.cview(), dq.view, 0, 1, 0, L, tile.data(), pad, nullptr,
                                nullptr, nullptr);
  for (Index r = 0; r < L; ++r)
    for (Index c = 0; c < D; ++c)
      CHECK(std::abs(dq.view.row(0, 1, r)[c] - p.scale * kept[std::size_t(r * pad + c)]) <= 1e-6f);
  // RoPE: dq = R^T (scale * tile); turning it forward again gives scale * tile back.
  tile = kept;
  ak::detail::store_query_grads(turned, p, q.cview(), dq.view, 0, 1, 0, L, tile.data(), pad,
                                nullptr, nullptr, nullptr);
  for (Index r = 0; r < L; ++r) {
    std::vector<float> row(dq.view.row(0, 1, r), dq.view.row(0, 1, r) + D);
    rope.apply(row.data(), D, ak::RowAt{0, 1, r, L, r, ak::Role::Query});
    for (Index c = 0; c < D; ++c)
      CHECK(std::abs(row[std::size_t(c)] - p.scale * kept[std::size_t(r * pad + c)]) <= 1e-5f);
  }
}
