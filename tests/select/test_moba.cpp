// MoBA: route_topk_blocks() against a slow, obvious selector (loops, double dot products, an
// explicit sort); moba_attention() against the f64 reference under a mask built from the
// routes (both in support/select_oracles.hpp), per query row (so a kernel that used the union of a
// tile's choices would fail); top-k >= the block count equals dense causal; 1 and 2 threads give
// the same bits; bad arguments throw before anything is written. Ragged L, Lq != Lk with q_offset,
// GQA.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/select/moba.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "support/matchers.hpp"
#include "support/select_oracles.hpp"
#include "support/test_names.hpp"

namespace {

struct MobaCase {
  Index hq, hkv, lq, lk, d, block, topk;
  std::optional<Index> q_offset;  // default: Lk - Lq
};

// The cases of the grid: ragged lengths, Lq != Lk, explicit and negative offsets, GQA.
std::vector<MobaCase> cases() {
  return {
      {2, 2, 100, 100, 32, 16, 3, std::nullopt},  // L not a multiple of the block
      {4, 2, 37, 150, 64, 32, 2, std::nullopt},   // GQA, decode-like bottom-right queries
      {3, 1, 50, 120, 32, 12, 4, Index{10}},      // MQA, an explicit offset
      {2, 2, 40, 64, 32, 8, 3, Index{-5}},        // rows before every key see nothing
      {2, 1, 1, 77, 80, 16, 3, std::nullopt},     // Lq = 1
      {2, 2, 90, 60, 32, 16, 2, std::nullopt},    // Lq > Lk: leading rows see nothing
  };
}

struct Inputs {
  Tensor<float> q, k, v;
  Inputs(const MobaCase& c, Layout layout, std::uint32_t seed)
      : q(layout, 1, c.hq, c.lq, c.d),
        k(layout, 1, c.hkv, c.lk, c.d),
        v(layout, 1, c.hkv, c.lk, c.d) {
    q.randomize(seed);
    k.randomize(seed + 1);
    v.randomize(seed + 2);
  }
};

ak::Options options_for(const MobaCase& c) {
  return c.q_offset ? ak::Options{}.with_q_offset(*c.q_offset) : ak::Options{};
}

}  // namespace

TEST_CASE("route_topk_blocks: each row's blocks are those of the obvious selector",
          "[select][moba]") {
  const auto c = GENERATE(Catch::Generators::from_range(cases()));
  const Inputs in(c, Layout::Padded, 11);
  const auto routes =
      ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk, c.q_offset);
  const Index offset = c.q_offset.value_or(c.lk - c.lq);
  Index partial_rows = 0;  // rows that chose only some of their past blocks
  for (Index h = 0; h < c.hq; ++h)
    for (Index i = 0; i < c.lq; ++i) {
      const auto list = routes.chosen(0, h, i);
      const std::vector<Index> got(list.begin(), list.end());
      const auto want =
          ak::test::slow_route(in.q.cview(), in.k.cview(), 0, h, i, c.block, c.topk, offset);
      INFO("head " << h << " row " << i);
      REQUIRE(got == want);
      partial_rows += (i + offset) / c.block >= c.topk ? 1 : 0;
    }
  if (c.lq > 1) CHECK(partial_rows > 0);  // the grid exercises a real choice
}

TEST_CASE("route_topk_blocks: a strongly aligned old block is chosen", "[select][moba]") {
  const MobaCase c{1, 1, 64, 64, 32, 8, 2, std::nullopt};
  Inputs in(c, Layout::Bhsd, 5);
  for (Index j = 8; j < 16; ++j)  // block 1: every key along q_63
    for (Index d = 0; d < c.d; ++d) in.k.view.row(0, 0, j)[d] = 4.f * in.q.view.row(0, 0, 63)[d];
  const auto routes = ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk);
  const auto list = routes.chosen(0, 0, 63);
  REQUIRE(list.size() == 2);
  CHECK(list[0] == 1);
  CHECK(list[1] == 7);
}

TEST_CASE("moba_attention: equals the reference under each row's own chosen blocks",
          "[select][moba]") {
  const auto c = GENERATE(Catch::Generators::from_range(cases()));
  const auto layout = GENERATE(Layout::Bhsd, Layout::Padded);
  const Inputs in(c, layout, 21);
  const auto routes =
      ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk, c.q_offset);
  Tensor<float> o(layout, 1, c.hq, c.lq, c.d);
  std::vector<float> lse(static_cast<std::size_t>(c.hq * c.lq));
  const auto options = options_for(c);
  ak::moba_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, routes,
                     c.block, options.with_lse(lse));
  ak::test::check_driver_output(ak::make_spec(ak::test::moba_mask(&routes)), in.q.cview(),
                                in.k.cview(), in.v.cview(), o.cview(), lse, options, tol::kF32);
}

TEST_CASE("moba_attention: bf16 storage and a soft-capped score match the reference",
          "[select][moba]") {
  const MobaCase c{4, 2, 70, 70, 64, 16, 3, std::nullopt};
  Tensor<Eigen::bfloat16> q(Layout::Bshd, 1, c.hq, c.lq, c.d), k(Layout::Bshd, 1, c.hkv, c.lk, c.d),
      v(Layout::Bshd, 1, c.hkv, c.lk, c.d), o(Layout::Bshd, 1, c.hq, c.lq, c.d);
  q.randomize(3, 2.f);
  k.randomize(4, 2.f);
  v.randomize(5);
  const auto routes = ak::route_topk_blocks(q.cview(), k.cview(), c.block, c.topk);
  ak::moba_attention(ak::make_spec(ak::Softcap{5.f}), q.cview(), k.cview(), v.cview(), o.view,
                     routes, c.block);
  ak::test::check_driver_output(ak::make_spec(ak::Softcap{5.f}, ak::test::moba_mask(&routes)),
                                q.cview(), k.cview(), v.cview(), o.cview(), {}, {}, tol::kBf16);
}

TEST_CASE("moba_attention: top-k at least the block count is dense causal", "[select][moba]") {
  const auto c = GENERATE(Catch::Generators::from_range(cases()));
  const Inputs in(c, Layout::Bhsd, 31);
  const Index all = (c.lk + c.block - 1) / c.block + 1;
  const auto routes = ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, all, c.q_offset);
  Tensor<float> o(Layout::Bhsd, 1, c.hq, c.lq, c.d), dense(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  std::vector<float> lse(static_cast<std::size_t>(c.hq * c.lq)), lse_dense(lse.size());
  const auto options = options_for(c);
  ak::moba_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, routes,
                     c.block, options.with_lse(lse));
  ak::attention(ak::make_spec(ak::Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), dense.view,
                options.with_lse(lse_dense));
  CHECK_THAT(ak::test::max_abs_diff(o.cview(), dense.cview()), WithinAbs(0.0, tol::kF32));
  CHECK_THAT(ak::test::max_lse_diff(lse, lse_dense), WithinAbs(0.0, tol::kLseF32));
}

TEST_CASE("moba_attention: 1 and 2 threads give the same bits", "[select][moba]") {
  const MobaCase c{4, 2, 300, 300, 64, 32, 3, std::nullopt};
  const Inputs in(c, Layout::Bhsd, 41);
  const auto routes = ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk);
  Tensor<float> one(Layout::Bhsd, 1, c.hq, c.lq, c.d), two(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  std::vector<float> lse_one(static_cast<std::size_t>(c.hq * c.lq)), lse_two(lse_one.size());
  ak::moba_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), one.view, routes,
                     c.block, ak::Options{}.with_threads(1).with_lse(lse_one));
  ak::moba_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), two.view, routes,
                     c.block, ak::Options{}.with_threads(2).with_lse(lse_two));
  const auto bytes = [](const std::vector<float>& x) { return x.size() * sizeof(float); };
  CHECK(std::memcmp(one.memory.data(), two.memory.data(), bytes(one.memory)) == 0);
  CHECK(std::memcmp(lse_one.data(), lse_two.data(), bytes(lse_one)) == 0);
}

TEST_CASE("moba_attention: bad arguments throw before anything is written", "[select][moba]") {
  const MobaCase c{2, 1, 40, 40, 32, 8, 3, std::nullopt};
  const Inputs in(c, Layout::Bhsd, 51);
  const auto routes = ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk);
  Tensor<float> o(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  std::vector<float> lse(static_cast<std::size_t>(c.hq * c.lq), 7.f);
  for (float& x : o.memory) x = 7.f;
  const auto run = [&](const ak::BlockRoutes& r, Index block, const ak::Options& opt,
                       ak::Softmax normalizer = {}) {
    ak::moba_attention(ak::make_spec(normalizer), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                       r, block, opt.with_lse(lse));
  };
  CHECK_THROWS_AS(ak::route_topk_blocks(in.q.cview(), in.k.cview(), 0, 3), ak::Error);
  CHECK_THROWS_AS(ak::route_topk_blocks(in.q.cview(), in.k.cview(), 8, 0), ak::Error);
  CHECK_THROWS_AS(run(routes, 16, {}), ak::Error);                             // another block
  CHECK_THROWS_AS(run(routes, 0, {}), ak::Error);                              // block 0
  CHECK_THROWS_AS(run(routes, 8, ak::Options{}.with_q_offset(3)), ak::Error);  // another offset
  CHECK_THROWS_AS(run(routes, 8, {}, ak::Softmax::with_sinks({0.f, 0.f})), ak::Error);
  auto other_heads = ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk);
  other_heads.heads = 1;
  CHECK_THROWS_AS(run(other_heads, 8, {}), ak::Error);
  auto future = routes;  // row 20 (own block 2) claims future block 4
  future.blocks[static_cast<std::size_t>(20 * c.topk)] = 4;
  CHECK_THROWS_AS(run(future, 8, {}), ak::Error);
  for (const float x : o.memory) REQUIRE_THAT(x, WithinAbs(7.0, 0.0));
  for (const float x : lse) REQUIRE_THAT(x, WithinAbs(7.0, 0.0));
  run(routes, 8, {});  // and the good call does write
  CHECK_THAT(double(o.view.row(0, 0, 0)[0]), !WithinAbs(7.0, 0.0));
}

TEST_CASE("moba_attention: routes whose topk overflows the route sizes throw",
          "[select][moba][errors]") {
  // 1 * 2 * 40 * 2^60 = 5 * 2^64 wraps to 0, the size of an empty blocks vector; every row sits
  // before every key, so no row's list is checked. Without checked arithmetic these routes
  // passed the check (undefined behaviour) and the call failed later, or worse.
  const MobaCase c{2, 1, 40, 40, 32, 8, 3, Index{-100}};
  const Inputs in(c, Layout::Bhsd, 53);
  auto routes = ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, c.topk, c.q_offset);
  routes.topk = Index{1} << 60;
  routes.blocks.clear();
  Tensor<float> o(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  CHECK_THROWS_AS(ak::moba_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(),
                                     o.view, routes, c.block, ak::Options{}.with_q_offset(-100)),
                  ak::Error);
}

TEST_CASE("route_topk_blocks: a topk whose route sizes overflow Index throws",
          "[select][moba][errors]") {
  const MobaCase c{2, 1, 40, 40, 32, 8, 3, std::nullopt};
  const Inputs in(c, Layout::Bhsd, 54);
  CHECK_THROWS_AS(ak::route_topk_blocks(in.q.cview(), in.k.cview(), c.block, Index{1} << 60),
                  ak::Error);
}
