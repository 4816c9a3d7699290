// anchor_stripes(), stripe_attention() and stripe_recall() against slow, obvious versions
// (support/select_oracles.hpp): a double-loop selector, the f64 reference under a test-side
// mask built from the regions' definition, and a dense softmax recall.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/select_oracles.hpp"
#include "support/test_names.hpp"

namespace {

struct Shape {
  Index batch, q_heads, kv_heads, q_len, kv_len, dim;
};

using ak::test::dot_f64;
using ak::test::small_stripe_params;
using ak::test::stripe_mask;
using TestStripeMask = decltype(stripe_mask(nullptr));

struct Inputs {
  Tensor<float> q, k, v;
  Inputs(const Shape& s, Layout layout, unsigned seed)
      : q(layout, s.batch, s.q_heads, s.q_len, s.dim),
        k(layout, s.batch, s.kv_heads, s.kv_len, s.dim),
        v(layout, s.batch, s.kv_heads, s.kv_len, s.dim) {
    q.randomize(seed);
    k.randomize(seed + 1);
    v.randomize(seed + 2);
  }
};

}  // namespace

TEST_CASE("anchor_stripes: keeps the columns a slow, obvious selector keeps", "[select][stripes]") {
  const Shape shape =
      GENERATE(Shape{2, 4, 2, 37, 37, 32}, Shape{1, 2, 1, 20, 45, 32}, Shape{1, 2, 2, 1, 30, 16},
               Shape{1, 2, 1, 45, 30, 16}, Shape{1, 1, 1, 64, 64, 80});
  const Index local = GENERATE(0, 5);
  const int threads = GENERATE(1, 2);
  Inputs in(shape, Layout::Padded, 11);
  const ak::StripeParams params = small_stripe_params(local);
  const auto options = ak::Options{}.with_threads(threads);
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), params, options);
  const float scale = 1.f / std::sqrt(float(shape.dim));
  const ak::test::SlowStripes slow =
      ak::test::slow_stripes(in.q.view, in.k.view, params, scale, shape.kv_len - shape.q_len);
  REQUIRE(sel.offsets.size() == slow.kept.size() + 1);
  Index kept = 0, middle = 0, near_ties = 0;
  for (std::size_t it = 0; it < slow.kept.size(); ++it) {
    const std::vector<Index> got(sel.columns.begin() + sel.offsets[it],
                                 sel.columns.begin() + sel.offsets[it + 1]);
    middle += Index(slow.margin[it].size());
    kept += Index(got.size());
    if (got == slow.kept[it]) continue;
    // Only a column within f32 rounding of the threshold may be decided differently.
    const Index first = sel.middle(Index(it) % sel.big_blocks()).begin;
    for (std::size_t m = 0; m < slow.margin[it].size(); ++m) {
      const bool in_got = std::count(got.begin(), got.end(), first + Index(m)) > 0;
      if (in_got != (slow.margin[it][m] >= 0)) {
        CHECK(std::abs(slow.margin[it][m]) < 1e-4);
        ++near_ties;
      }
    }
  }
  CHECK(near_ties <= 1);
  UNSCOPED_INFO("kept " << kept << " of " << middle << " middle columns");
  if (middle > 50) {  // the grid must exercise the choice, not keep all or nothing
    CHECK(kept > middle / 10);
    CHECK(kept < middle * 9 / 10);
  }
}

TEST_CASE("anchor_stripes: an explicit q_offset moves the regions", "[select][stripes]") {
  Inputs in(Shape{1, 2, 1, 24, 40, 32}, Layout::Bhsd, 5);
  const ak::StripeParams params = small_stripe_params(0);
  const auto options = ak::Options{}.with_q_offset(9);
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), params, options);
  const ak::test::SlowStripes slow =
      ak::test::slow_stripes(in.q.view, in.k.view, params, 1.f / std::sqrt(32.f), 9);
  CHECK(sel.q_offset == 9);
  CHECK(sel.middle(2).end == 9 + 16);
  for (std::size_t it = 0; it < slow.kept.size(); ++it)
    CHECK(std::vector<Index>(sel.columns.begin() + sel.offsets[it],
                             sel.columns.begin() + sel.offsets[it + 1]) == slow.kept[it]);
}

TEST_CASE("stripe_attention: equals the reference under the selection's mask",
          "[select][stripes]") {
  const Shape shape =
      GENERATE(Shape{2, 4, 2, 37, 37, 32}, Shape{1, 2, 1, 20, 45, 64}, Shape{1, 2, 2, 1, 30, 16},
               Shape{1, 2, 1, 45, 30, 16}, Shape{1, 1, 1, 70, 70, 128});
  const Index local = GENERATE(0, 5);
  const int threads = GENERATE(1, 2);
  const Layout layout = GENERATE(Layout::Bhsd, Layout::Padded);
  Inputs in(shape, layout, 21);
  const ak::StripeParams params = small_stripe_params(local);
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), params);
  Tensor<float> o(layout, shape.batch, shape.q_heads, shape.q_len, shape.dim);
  std::vector<double> expected(std::size_t(shape.batch * shape.q_heads * shape.q_len * shape.dim));
  const auto want = ak::bhsd(expected.data(), shape.batch, shape.q_heads, shape.q_len, shape.dim);
  std::vector<float> lse(std::size_t(shape.batch * shape.q_heads * shape.q_len)),
      lse_want(lse.size());
  const auto options = ak::Options{}.with_threads(threads);
  ak::stripe_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, sel,
                       options.with_lse(lse));
  const auto masked = ak::AttentionSpec<ak::Dot, TestStripeMask>{{}, stripe_mask(&sel), {}, {}};
  ak::reference::attention(masked, in.q.cview(), in.k.cview(), in.v.cview(), want,
                           options.with_lse(lse_want));
  CHECK(ak::test::max_abs_diff(o.cview(), ak::View<const double>(want)) < ak::test::tol::kF32);
  CHECK(ak::test::max_lse_diff(lse, lse_want) < ak::test::tol::kLseF32);
}

TEST_CASE("stripe_attention: a selection keeping every column equals dense causal",
          "[select][stripes]") {
  const Shape shape = GENERATE(Shape{1, 4, 2, 53, 53, 32}, Shape{2, 2, 1, 19, 40, 64});
  const int threads = GENERATE(1, 2);
  Inputs in(shape, Layout::Bshd, 31);
  ak::StripeParams params = small_stripe_params(0);
  params.theta = std::numeric_limits<float>::infinity();
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), params);
  CHECK(sel.kept_fraction() == 1.0);
  Tensor<float> o(Layout::Bhsd, shape.batch, shape.q_heads, shape.q_len, shape.dim),
      dense(Layout::Bhsd, shape.batch, shape.q_heads, shape.q_len, shape.dim);
  const auto options = ak::Options{}.with_threads(threads);
  ak::stripe_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, sel,
                       options);
  ak::attention(ak::make_spec(ak::Causal{}), in.q.cview(), in.k.cview(), in.v.cview(), dense.view,
                options);
  CHECK(ak::test::max_abs_diff(o.cview(), dense.cview()) < ak::test::tol::kF32);
  const ak::StripeRecall recall = ak::stripe_recall(in.q.cview(), in.k.cview(), sel, options);
  CHECK_THAT(recall.mean, Catch::Matchers::WithinAbs(1.0, 1e-12));
  CHECK_THAT(recall.min, Catch::Matchers::WithinAbs(1.0, 1e-12));
}

TEST_CASE("stripe_recall: the softmax mass on the selected columns, per row", "[select][stripes]") {
  const Shape shape{1, 4, 2, 37, 50, 32};
  Inputs in(shape, Layout::Bhsd, 41);
  const ak::StripeSelection sel =
      ak::anchor_stripes(in.q.cview(), in.k.cview(), small_stripe_params(0));
  const int threads = GENERATE(1, 2);
  const ak::StripeRecall recall =
      ak::stripe_recall(in.q.cview(), in.k.cview(), sel, ak::Options{}.with_threads(threads));
  const TestStripeMask mask = stripe_mask(&sel);
  const Index offset = shape.kv_len - shape.q_len;
  double total = 0;
  for (Index h = 0; h < shape.q_heads; ++h)
    for (Index r = 0; r < shape.q_len; ++r) {
      const Index i = r + offset;
      double all = 0, held = 0;
      for (Index j = 0; j <= i; ++j) {
        const double w = std::exp(dot_f64(in.q.view.row(0, h, r), in.k.view.row(0, h / 2, j), 32) /
                                  std::sqrt(32.0));
        all += w;
        held += mask.keep(0, h, i, j) ? w : 0.0;
      }
      CHECK_THAT(recall.per_row[std::size_t(h * shape.q_len + r)],
                 Catch::Matchers::WithinAbs(held / all, 1e-6));  // the scale is an f32
      total += held / all;
    }
  CHECK_THAT(recall.mean,
             Catch::Matchers::WithinAbs(total / double(shape.q_heads * shape.q_len), 1e-6));
  CHECK(recall.min < 1.0);  // this selection drops some columns
}

TEST_CASE("stripe_attention: bad input throws before writing", "[select][stripes]") {
  const Shape shape{1, 2, 1, 30, 30, 16};
  Inputs in(shape, Layout::Bhsd, 51);
  const ak::StripeSelection sel =
      ak::anchor_stripes(in.q.cview(), in.k.cview(), small_stripe_params(0));
  REQUIRE(!sel.columns.empty());
  Tensor<float> o(Layout::Bhsd, 1, 2, 30, 16);
  std::fill(o.memory.begin(), o.memory.end(), 7.f);
  const auto run = [&](const ak::StripeSelection& s, const ak::Options& options = {}) {
    ak::stripe_attention(ak::make_spec(), in.q.cview(), in.k.cview(), in.v.cview(), o.view, s,
                         options);
  };
  ak::StripeSelection unsorted = sel;
  std::swap(unsorted.columns.front(), unsorted.columns.back());
  unsorted.columns.front() = unsorted.columns.back() + 100;  // out of its middle region too
  ak::StripeSelection short_offsets = sel;
  short_offsets.offsets.pop_back();
  ak::StripeSelection other_len = sel;
  other_len.q_len = 29;
  CHECK_THROWS_AS(run(unsorted), ak::Error);
  CHECK_THROWS_AS(run(short_offsets), ak::Error);
  CHECK_THROWS_AS(run(other_len), ak::Error);
  CHECK_THROWS_AS(run(sel, ak::Options{}.with_q_offset(3)), ak::Error);
  CHECK_THROWS_AS(run(sel, ak::Options{}.with_threads(-1)), ak::Error);
  ak::StripeParams bad = small_stripe_params(0);
  bad.block = 0;
  CHECK_THROWS_AS(ak::anchor_stripes(in.q.cview(), in.k.cview(), bad), ak::Error);
  bad = small_stripe_params(0);
  bad.theta = std::nanf("");
  CHECK_THROWS_AS(ak::anchor_stripes(in.q.cview(), in.k.cview(), bad), ak::Error);
  CHECK(std::all_of(o.memory.begin(), o.memory.end(), [](float x) { return x == 7.f; }));
}
