// anchor_stripes(), stripe_attention() and stripe_recall() against slow, obvious versions
// written here: a double-loop selector, the f64 reference under a test-side mask built from
// the regions' definition, and a dense softmax recall.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/keep_if.hpp"
#include "support/test_names.hpp"

namespace {

struct Shape {
  Index batch, q_heads, kv_heads, q_len, kv_len, dim;
};

// The small parameters the grid runs with: big blocks of 8 queries, so ragged sizes cut
// several of them, and a theta that keeps part of the middle on N(0, 1) data.
ak::StripeParams small_params(Index local) {
  ak::StripeParams params;
  params.block = 4;
  params.step = 2;
  params.theta = 1.f;
  params.init = 3;
  params.local = local;
  return params;
}

double dot(const float* a, const float* b, Index d) {
  double s = 0;
  for (Index c = 0; c < d; ++c) s += double(a[c]) * double(b[c]);
  return s;
}

// Positions: big block g covers rows [g B, (g + 1) B); the local region starts `local`
// keys before its first query; the middle lies between init and local.
struct Regions {
  Index init_end, local_begin;
};
Regions regions_of(const ak::StripeParams& params, Index offset, Index kv_len, Index g) {
  const Index init_end = std::min(params.init, kv_len);
  const Index local =
      std::clamp<Index>(offset + g * params.block * params.step - params.local, 0, kv_len);
  return {init_end, std::max(local, init_end)};
}

// The obvious selector: per (b, h, g) the kept middle columns, and the margin
// (best pooled score + theta - pooled anchor) of every middle column, to excuse near ties.
struct SlowSelection {
  std::vector<std::vector<Index>> kept;     // [b, h, g] -> columns
  std::vector<std::vector<double>> margin;  // [b, h, g] -> per middle column
};

SlowSelection slow_select(const ak::View<float>& q, const ak::View<float>& k,
                          const ak::StripeParams& params, float scale, Index offset) {
  const Index big = params.block * params.step, groups = (q.seq + big - 1) / big;
  SlowSelection out;
  for (Index b = 0; b < q.batch; ++b)
    for (Index h = 0; h < q.heads; ++h)
      for (Index g = 0; g < groups; ++g) {
        const Index hk = h / (q.heads / k.heads);
        const Regions reg = regions_of(params, offset, k.seq, g);
        std::vector<Index> kept;
        std::vector<double> margins;
        const Index r0 = g * big, r1 = std::min(q.seq, r0 + big);
        std::vector<double> q_bar, a_bar;  // per pooled group
        for (Index p0 = r0; p0 < r1; p0 += params.block) {
          const Index p1 = std::min(r1, p0 + params.block);
          std::vector<double> mean(std::size_t(q.dim), 0.0);
          double anchor_sum = 0;
          for (Index r = p0; r < p1; ++r) {
            const Index i = r + offset;
            double anchor = -std::numeric_limits<double>::infinity();
            for (Index j = 0; j < k.seq; ++j)
              if (j <= i && (j < reg.init_end || j >= reg.local_begin))
                anchor = std::max(anchor, scale * dot(q.row(b, h, r), k.row(b, hk, j), q.dim));
            anchor_sum += anchor;
            for (Index c = 0; c < q.dim; ++c) mean[std::size_t(c)] += q.row(b, h, r)[c];
          }
          for (double& x : mean) x /= double(p1 - p0);
          q_bar.insert(q_bar.end(), mean.begin(), mean.end());
          a_bar.push_back(anchor_sum / double(p1 - p0));
        }
        for (Index j = reg.init_end; j < reg.local_begin; ++j) {
          double best = -std::numeric_limits<double>::infinity();
          for (std::size_t p = 0; p < a_bar.size(); ++p) {
            double s = 0;
            for (Index c = 0; c < q.dim; ++c)
              s += q_bar[p * std::size_t(q.dim) + std::size_t(c)] * double(k.row(b, hk, j)[c]);
            best = std::max(best, scale * s + params.theta - a_bar[p]);
          }
          margins.push_back(best);
          if (best >= 0) kept.push_back(j);
        }
        out.kept.push_back(kept);
        out.margin.push_back(margins);
      }
  return out;
}

// keep(b, h, i, j) = j <= i && (j in init or j in local(i) or j kept by i's big block).
auto stripe_mask(const ak::StripeSelection* sel) {
  return ak::test::keep_if([sel](Index b, Index h, Index i, Index j) {
    if (j > i) return false;
    const Index g = (i - sel->q_offset) / (sel->params.block * sel->params.step);
    const Regions reg = regions_of(sel->params, sel->q_offset, sel->kv_len, g);
    if (j < reg.init_end || j >= reg.local_begin) return true;
    return std::find(sel->kept_begin(b, h, g), sel->kept_end(b, h, g), j) != sel->kept_end(b, h, g);
  });
}
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
  const ak::StripeParams params = small_params(local);
  const auto options = ak::Options{}.with_threads(threads);
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), params, options);
  const float scale = 1.f / std::sqrt(float(shape.dim));
  const SlowSelection slow =
      slow_select(in.q.view, in.k.view, params, scale, shape.kv_len - shape.q_len);
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
  const ak::StripeParams params = small_params(0);
  const auto options = ak::Options{}.with_q_offset(9);
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), params, options);
  const SlowSelection slow = slow_select(in.q.view, in.k.view, params, 1.f / std::sqrt(32.f), 9);
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
  const ak::StripeParams params = small_params(local);
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
  ak::StripeParams params = small_params(0);
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
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), small_params(0));
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
        const double w =
            std::exp(dot(in.q.view.row(0, h, r), in.k.view.row(0, h / 2, j), 32) / std::sqrt(32.0));
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
  const ak::StripeSelection sel = ak::anchor_stripes(in.q.cview(), in.k.cview(), small_params(0));
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
  ak::StripeParams bad = small_params(0);
  bad.block = 0;
  CHECK_THROWS_AS(ak::anchor_stripes(in.q.cview(), in.k.cview(), bad), ak::Error);
  bad = small_params(0);
  bad.theta = std::nanf("");
  CHECK_THROWS_AS(ak::anchor_stripes(in.q.cview(), in.k.cview(), bad), ak::Error);
  CHECK(std::all_of(o.memory.begin(), o.memory.end(), [](float x) { return x == 7.f; }));
}
