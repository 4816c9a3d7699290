// Superlinear span attention: superlinear_spans() against a slow, obvious selector (every
// anchor scored in double, an explicit sort); superlinear_attention() against the f64
// reference under a test-side mask built from each row's own spans and window (both in
// support/select_oracles.hpp); anchors at every offset (p = 1) with top-k covering them, or one
// span wider than the sequence, equal dense causal; 1 and 2 threads give the same bits; bad
// arguments throw before anything is written. Ragged L, Lq != Lk with q_offset, GQA, d in
// {32, 64, 80, 128}, bf16.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/select/superlinear.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "support/matchers.hpp"
#include "support/select_oracles.hpp"
#include "support/test_names.hpp"

namespace {

struct SpanCase {
  Index hq, hkv, lq, lk, d, topk, span, window;
  std::optional<Index> q_offset;  // default: Lk - Lq
  double p = 0.5;
};

std::vector<SpanCase> cases() {
  return {
      {2, 2, 100, 100, 32, 3, 8, 4, std::nullopt},            // ragged L, overlapping spans
      {4, 2, 37, 150, 64, 2, 5, 0, std::nullopt},             // GQA, odd span, no window
      {3, 1, 50, 120, 32, 4, 6, 8, Index{10}},                // MQA, an explicit offset
      {2, 2, 40, 64, 32, 3, 4, 2, Index{-5}},                 // rows before every key
      {2, 1, 1, 77, 80, 3, 8, 4, std::nullopt},               // Lq = 1
      {2, 2, 90, 60, 32, 2, 8, 4, std::nullopt},              // Lq > Lk: leading rows see nothing
      {2, 2, 130, 130, 128, 3, 7, 5, std::nullopt, 1.0 / 3},  // d = 128, cubic offsets
  };
}

struct Inputs {
  Tensor<float> q, k, v, r;
  Inputs(const SpanCase& c, Layout layout, std::uint32_t seed)
      : q(layout, 1, c.hq, c.lq, c.d),
        k(layout, 1, c.hkv, c.lk, c.d),
        v(layout, 1, c.hkv, c.lk, c.d),
        r(layout, 1, c.hq, c.lq, c.d) {
    q.randomize(seed);
    k.randomize(seed + 1);
    v.randomize(seed + 2);
    r.randomize(seed + 3);
  }
};

ak::Options options_for(const SpanCase& c) {
  return c.q_offset ? ak::Options{}.with_q_offset(*c.q_offset) : ak::Options{};
}
ak::SuperlinearParams params_for(const SpanCase& c) { return {c.p, c.topk, c.span, c.window}; }

}  // namespace

TEST_CASE("superlinear_spans: each row's anchors are those of the obvious selector",
          "[select][superlinear]") {
  const auto c = GENERATE(Catch::Generators::from_range(cases()));
  const Inputs in(c, Layout::Padded, 11);
  const auto sel = ak::superlinear_spans(in.r.cview(), in.k.cview(), params_for(c), options_for(c));
  const Index offset = c.q_offset.value_or(c.lk - c.lq);
  Index partial_rows = 0;  // rows that kept only some of their anchors
  for (Index h = 0; h < c.hq; ++h)
    for (Index i = 0; i < c.lq; ++i) {
      const Index* a = sel.chosen(0, h, i);
      const std::vector<Index> got(a, a + sel.count(0, h, i));
      const auto want =
          ak::test::slow_spans(in.r.cview(), in.k.cview(), 0, h, i, c.p, c.topk, offset);
      INFO("head " << h << " row " << i);
      REQUIRE(got == want);
      partial_rows += i + offset >= (c.topk + 1) * (c.topk + 1) ? 1 : 0;
    }
  if (c.lq > 1) CHECK(partial_rows > 0);  // the grid exercises a real choice
}

TEST_CASE("superlinear_spans: a key aligned with the routing query is chosen",
          "[select][superlinear]") {
  const SpanCase c{1, 1, 64, 64, 32, 1, 4, 0, std::nullopt};
  Inputs in(c, Layout::Bhsd, 5);
  for (Index d = 0; d < c.d; ++d)
    in.k.view.row(0, 0, 63 - 25)[d] = 4.f * in.r.view.row(0, 0, 63)[d];
  const auto sel = ak::superlinear_spans(in.r.cview(), in.k.cview(), params_for(c));
  REQUIRE(sel.count(0, 0, 63) == 1);
  CHECK(sel.chosen(0, 0, 63)[0] == 63 - 25);  // m = 5
}

TEST_CASE("superlinear_attention: equals the reference under each row's own spans",
          "[select][superlinear]") {
  const auto c = GENERATE(Catch::Generators::from_range(cases()));
  const auto layout = GENERATE(Layout::Bhsd, Layout::Padded);
  const Inputs in(c, layout, 21);
  const auto options = options_for(c);
  const auto sel = ak::superlinear_spans(in.r.cview(), in.k.cview(), params_for(c), options);
  Tensor<float> o(layout, 1, c.hq, c.lq, c.d);
  std::vector<float> lse(static_cast<std::size_t>(c.hq * c.lq));
  ak::superlinear_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, sel,
                            options.with_lse(lse));
  ak::test::check_driver_output(ak::make_spec(ak::test::span_mask(&sel)), in.q.cview(),
                                in.k.cview(), in.v.cview(), o.cview(), lse, options, tol::kF32);
}

TEST_CASE("superlinear_attention: bf16 storage and a soft-capped score match the reference",
          "[select][superlinear]") {
  const SpanCase c{4, 2, 70, 70, 64, 3, 6, 4, std::nullopt};
  Tensor<Eigen::bfloat16> q(Layout::Bshd, 1, c.hq, c.lq, c.d), k(Layout::Bshd, 1, c.hkv, c.lk, c.d),
      v(Layout::Bshd, 1, c.hkv, c.lk, c.d), o(Layout::Bshd, 1, c.hq, c.lq, c.d),
      r(Layout::Bshd, 1, c.hq, c.lq, c.d);
  q.randomize(3, 2.f), k.randomize(4, 2.f), v.randomize(5), r.randomize(6);
  const auto sel = ak::superlinear_spans(r.cview(), k.cview(), params_for(c));
  ak::superlinear_attention(ak::make_spec(ak::Softcap{5.f}), q.cview(), k.cview(), v.cview(),
                            o.view, sel);
  ak::test::check_driver_output(ak::make_spec(ak::Softcap{5.f}, ak::test::span_mask(&sel)),
                                q.cview(), k.cview(), v.cview(), o.cview(), {}, {}, tol::kBf16);
}

TEST_CASE("superlinear_attention: spans that cover every past key are dense causal",
          "[select][superlinear]") {
  const auto c = GENERATE(Catch::Generators::from_range(cases()));
  const bool every_offset = GENERATE(true, false);
  const Inputs in(c, Layout::Bhsd, 31);
  // p = 1: an anchor at every past key, top-k keeps all; or one span wider than the keys.
  const ak::SuperlinearParams params =
      every_offset ? ak::SuperlinearParams{1.0, c.lk + c.lq, 1, 1}
                   : ak::SuperlinearParams{0.5, 1, 2 * (c.lk + c.lq) + 2, 1};
  const auto options = options_for(c);
  const auto sel = ak::superlinear_spans(in.r.cview(), in.k.cview(), params, options);
  Tensor<float> o(Layout::Bhsd, 1, c.hq, c.lq, c.d), dense(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  std::vector<float> lse(static_cast<std::size_t>(c.hq * c.lq)), lse_dense(lse.size());
  ak::superlinear_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, sel,
                            options.with_lse(lse));
  ak::attention(ak::make_spec(ak::Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), dense.view,
                options.with_lse(lse_dense));
  CHECK_THAT(ak::test::max_abs_diff(o.cview(), dense.cview()), WithinAbs(0.0, tol::kF32));
  CHECK_THAT(ak::test::max_lse_diff(lse, lse_dense), WithinAbs(0.0, tol::kLseF32));
}

TEST_CASE("superlinear_attention: 1 and 2 threads give the same bits", "[select][superlinear]") {
  const SpanCase c{4, 2, 300, 300, 64, 4, 16, 16, std::nullopt};
  const Inputs in(c, Layout::Bhsd, 41);
  const auto params = params_for(c);
  const auto sel_one =
      ak::superlinear_spans(in.r.cview(), in.k.cview(), params, ak::Options{}.with_threads(1));
  const auto sel =
      ak::superlinear_spans(in.r.cview(), in.k.cview(), params, ak::Options{}.with_threads(2));
  CHECK(sel_one.anchors == sel.anchors);
  CHECK(sel_one.counts == sel.counts);
  Tensor<float> one(Layout::Bhsd, 1, c.hq, c.lq, c.d), two(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  std::vector<float> lse_one(static_cast<std::size_t>(c.hq * c.lq)), lse_two(lse_one.size());
  ak::superlinear_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), one.view,
                            sel, ak::Options{}.with_threads(1).with_lse(lse_one));
  ak::superlinear_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), two.view,
                            sel, ak::Options{}.with_threads(2).with_lse(lse_two));
  const auto bytes = [](const std::vector<float>& x) { return x.size() * sizeof(float); };
  CHECK(std::memcmp(one.memory.data(), two.memory.data(), bytes(one.memory)) == 0);
  CHECK(std::memcmp(lse_one.data(), lse_two.data(), bytes(lse_one)) == 0);
}

TEST_CASE("superlinear_attention: bad arguments throw before anything is written",
          "[select][superlinear]") {
  const SpanCase c{2, 1, 40, 40, 32, 3, 4, 2, std::nullopt};
  const Inputs in(c, Layout::Bhsd, 51);
  const auto sel = ak::superlinear_spans(in.r.cview(), in.k.cview(), params_for(c));
  Tensor<float> o(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  std::vector<float> lse(static_cast<std::size_t>(c.hq * c.lq), 7.f);
  for (float& x : o.memory) x = 7.f;
  const auto run = [&](const ak::SpanSelection& s, const ak::Options& opt,
                       ak::Softmax normalizer = {}) {
    ak::superlinear_attention(ak::make_spec(normalizer), in.q.cview(), in.k.cview(), in.v.cview(),
                              o.view, s, opt.with_lse(lse));
  };
  const auto spans = [&](ak::SuperlinearParams p) {
    return ak::superlinear_spans(in.r.cview(), in.k.cview(), p);
  };
  CHECK_THROWS_AS(spans({0.0, 3, 4, 2}), ak::Error);   // p = 0
  CHECK_THROWS_AS(spans({1.5, 3, 4, 2}), ak::Error);   // p > 1
  CHECK_THROWS_AS(spans({0.5, 0, 4, 2}), ak::Error);   // top-k 0
  CHECK_THROWS_AS(spans({0.5, 3, 0, 2}), ak::Error);   // span 0
  CHECK_THROWS_AS(spans({0.5, 3, 4, -1}), ak::Error);  // negative window
  CHECK_THROWS_AS(ak::superlinear_spans(in.r.cview(), in.k.cview(), params_for(c),
                                        ak::Options{}.with_threads(-1)),
                  ak::Error);
  CHECK_THROWS_AS(run(sel, ak::Options{}.with_q_offset(3)), ak::Error);  // another offset
  CHECK_THROWS_AS(run(sel, {}, ak::Softmax::with_sinks({0.f, 0.f})), ak::Error);
  auto other_heads = sel;
  other_heads.heads = 1;
  CHECK_THROWS_AS(run(other_heads, {}), ak::Error);
  auto future = sel;  // row 20 claims key 25, after its position
  future.anchors[static_cast<std::size_t>(20 * c.topk + future.counts[20] - 1)] = 25;
  CHECK_THROWS_AS(run(future, {}), ak::Error);
  auto unsorted = sel;  // row 30's anchors out of order
  std::swap(unsorted.anchors[30 * 3], unsorted.anchors[30 * 3 + 1]);
  CHECK_THROWS_AS(run(unsorted, {}), ak::Error);
  for (const float x : o.memory) REQUIRE_THAT(x, WithinAbs(7.0, 0.0));
  for (const float x : lse) REQUIRE_THAT(x, WithinAbs(7.0, 0.0));
  run(sel, {});  // and the good call does write
  CHECK_THAT(double(o.view.row(0, 0, 0)[0]), !WithinAbs(7.0, 0.0));
}

TEST_CASE("superlinear_attention: a selection whose topk overflows its sizes throws",
          "[select][superlinear][errors]") {
  // 1 * 2 * 40 * 2^60 = 5 * 2^64 wraps to 0, the size of an empty anchors vector; every row
  // sits before every key, so no row's anchors are checked. Without checked arithmetic this
  // selection passed the check (undefined behaviour) and the call failed later, or worse.
  const SpanCase c{2, 1, 40, 40, 32, 3, 4, 2, Index{-100}};
  const Inputs in(c, Layout::Bhsd, 55);
  auto sel = ak::superlinear_spans(in.r.cview(), in.k.cview(), params_for(c),
                                   ak::Options{}.with_q_offset(-100));
  sel.topk = Index{1} << 60;
  sel.anchors.clear();
  Tensor<float> o(Layout::Bhsd, 1, c.hq, c.lq, c.d);
  CHECK_THROWS_AS(
      ak::superlinear_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                                sel, ak::Options{}.with_q_offset(-100)),
      ak::Error);
}

TEST_CASE("superlinear_spans: a topk whose selection sizes overflow Index throws",
          "[select][superlinear][errors]") {
  const SpanCase c{2, 1, 40, 40, 32, 3, 4, 2, std::nullopt};
  const Inputs in(c, Layout::Bhsd, 56);
  ak::SuperlinearParams params = params_for(c);
  params.topk = Index{1} << 60;
  CHECK_THROWS_AS(ak::superlinear_spans(in.r.cview(), in.k.cview(), params), ak::Error);
}
