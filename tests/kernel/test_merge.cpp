// merge(): partial results over disjoint key ranges combine into the whole result, for every
// normalizer with a one-round statistic (LSE, row sum, none), with sinks added once, under
// Full and Causal masks, for 2, 3 and 7 parts cut at random points (some parts empty for
// some rows); NaN stays NaN; bad arguments throw before anything is written.
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/merge.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <deque>
#include <random>
#include <type_traits>
#include <vector>

#include "support/matchers.hpp"
#include "support/test_names.hpp"

namespace {

constexpr Index kB = 1, kH = 2, kLq = 70, kLk = 300, kD = 32;

// Cut points 0 = c_0 < c_1 < ... < c_parts = kLk, drawn at random.
std::vector<Index> cuts(int parts, std::uint32_t seed) {
  return ak::test::random_cuts(kLk, parts, seed);
}

// Whole call vs the merge of the calls on each key slice. `partial` is the normalizer the
// parts run with (plain Softmax where the whole uses sinks), `whole` the one merge applies.
template <class Mask, class Whole, class Partial>
void check_merge(const Mask& mask, const Whole& whole, const Partial& partial, int parts,
                 bool stat) {
  Tensor<float> q(Layout::Bshd, kB, kH, kLq, kD), k(Layout::Bshd, kB, kH, kLk, kD),
      v(Layout::Bshd, kB, kH, kLk, kD), expected(Layout::Bhsd, kB, kH, kLq, kD),
      merged(Layout::Bhsd, kB, kH, kLq, kD);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  const auto rows = static_cast<std::size_t>(kB * kH * kLq);
  std::vector<float> lse(rows), lse_merged(rows);
  const Index q_offset = kLk - kLq;
  const auto base = ak::Options{}.with_q_offset(q_offset).with_threads(2);
  ak::attention(ak::make_spec(mask, whole), q.cview(), k.cview(), v.cview(), expected.view,
                stat ? base.with_lse(lse) : base);

  const std::vector<Index> c = cuts(parts, 40u + static_cast<std::uint32_t>(parts));
  std::deque<Tensor<float>> outs;  // Tensor is not movable: its view points into it
  std::vector<std::vector<float>> stats(static_cast<std::size_t>(parts), std::vector<float>(rows));
  std::vector<ak::View<const float>> views;
  std::vector<const float*> stat_ptrs;
  for (int p = 0; p < parts; ++p) {
    auto ks = k.cview(), vs = v.cview();  // keys [c_p, c_p+1), renumbered from 0
    ks.data = k.view.row(0, 0, c[p]);
    vs.data = v.view.row(0, 0, c[p]);
    ks.seq = vs.seq = c[p + 1] - c[p];
    outs.emplace_back(Layout::Bhsd, kB, kH, kLq, kD);
    // Positions shift with the slice: query i sees key j = j' + c_p where it saw j before.
    const auto options = base.with_q_offset(q_offset - c[p]);
    std::vector<float>& s = stats[static_cast<std::size_t>(p)];
    ak::attention(ak::make_spec(mask, partial), q.cview(), ks, vs, outs.back().view,
                  stat ? options.with_lse(s) : options);
    views.push_back(outs.back().cview());
    stat_ptrs.push_back(s.data());
  }
  ak::merge(whole, views, stat_ptrs, merged.view, stat ? ak::Span<float>(lse_merged) : nullptr);
  INFO(parts << " parts");
  CHECK(ak::test::max_abs_diff(merged.view, expected.view) <= 4 * tol::kF32);
  if (!stat) return;
  if constexpr (std::is_same_v<Whole, ak::ReluPower>) {  // a row sum: relative to the sum
    for (std::size_t r = 0; r < rows; ++r) {
      INFO("row " << r << ": merged " << lse_merged[r] << ", whole " << lse[r]);
      CHECK(std::abs(lse_merged[r] - lse[r]) <= 4 * tol::kRowSumRel * std::abs(lse[r]));
    }
  } else {  // an LSE, in nats: absolute
    CHECK(ak::test::max_lse_diff(lse_merged, lse) <= 4 * tol::kLseF32);
  }
}

}  // namespace

TEST_CASE("merge: parts over disjoint key ranges give the whole softmax result",
          "[merge][softmax]") {
  const int parts = GENERATE(2, 3, 7);
  check_merge(ak::Full{}, ak::Softmax{}, ak::Softmax{}, parts, true);
  check_merge(ak::Causal{}, ak::Softmax{}, ak::Softmax{}, parts, true);  // some parts empty
}

TEST_CASE("merge: softmax sinks are added once, by the merge", "[merge][softmax]") {
  const int parts = GENERATE(2, 7);
  check_merge(ak::Causal{}, ak::Softmax::with_sinks({0.5f, -1.f}), ak::Softmax{}, parts, true);
}

TEST_CASE("merge: ReLU^alpha parts merge by their row sums", "[merge][relu_power]") {
  const int parts = GENERATE(2, 3, 7);
  check_merge(ak::Causal{}, ak::ReluPower{2.f, 0.f}, ak::ReluPower{2.f, 0.f}, parts, true);
}

TEST_CASE("merge: sigmoid parts add up (with the whole call's bias)", "[merge][sigmoid]") {
  const int parts = GENERATE(2, 3, 7);
  const ak::Sigmoid sigmoid{-std::log(float(kLk))};
  check_merge(ak::Full{}, sigmoid, sigmoid, parts, false);
}

TEST_CASE("merge: a NaN statistic makes that row NaN only", "[merge][nonfinite]") {
  Tensor<float> a(Layout::Bhsd, 1, 1, 3, 4), b(Layout::Bhsd, 1, 1, 3, 4),
      out(Layout::Bhsd, 1, 1, 3, 4);
  a.randomize(1);
  b.randomize(2);
  std::vector<float> la{0.f, NAN, -INFINITY}, lb{1.f, 0.f, -INFINITY}, merged(3);
  ak::merge(ak::Softmax{}, std::vector<ak::View<const float>>{a.cview(), b.cview()},
            {la.data(), lb.data()}, out.view, merged);
  CHECK(std::isfinite(merged[0]));
  CHECK(std::isnan(merged[1]));
  CHECK(merged[2] == -INFINITY);  // no key in any part: 0 and -inf
  for (Index c = 0; c < 4; ++c) {
    CHECK(std::isfinite(out.view.row(0, 0, 0)[c]));
    CHECK(std::isnan(out.view.row(0, 0, 1)[c]));
    CHECK(out.view.row(0, 0, 2)[c] == 0.f);
  }
}

TEST_CASE("merge: bad arguments throw attnkit::Error and write nothing", "[merge][errors]") {
  Tensor<float> a(Layout::Bhsd, 1, 2, 3, 4), wrong(Layout::Bhsd, 1, 2, 4, 4),
      out(Layout::Bhsd, 1, 2, 3, 4);
  out.for_each([](float& x) { x = 42.f; });
  std::vector<float> s(6, 0.f), stat_out(6, 7.f);
  using Parts = std::vector<ak::View<const float>>;
  CHECK_THROWS_MATCHES(ak::merge(ak::Softmax{}, Parts{}, {}, out.view), ak::Error,
                       MessageMatches(ContainsSubstring("parts.size(): expected >= 1")));
  CHECK_THROWS_MATCHES(
      ak::merge(ak::Softmax{}, Parts{a.cview()}, {}, out.view), ak::Error,
      MessageMatches(ContainsSubstring("stats.size(): expected parts.size() = 1")));
  CHECK_THROWS_MATCHES(
      ak::merge(ak::Softmax{}, Parts{a.cview(), wrong.cview()}, {s.data(), s.data()}, out.view),
      ak::Error, MessageMatches(ContainsSubstring("parts[1]: expected the shape")));
  CHECK_THROWS_MATCHES(ak::merge(ak::Softmax{}, Parts{a.cview()}, {nullptr}, out.view), ak::Error,
                       MessageMatches(ContainsSubstring("stats[0]: expected non-null")));
  CHECK_THROWS_MATCHES(ak::merge(ak::Sigmoid{-1.f}, Parts{a.cview()}, {}, out.view, stat_out),
                       ak::Error, MessageMatches(ContainsSubstring("out_stat: expected nullptr")));
  CHECK_THROWS_MATCHES(  // the merged statistic carries its size: one float short
      ak::merge(ak::Softmax{}, Parts{a.cview()}, {s.data()}, out.view,
                ak::Span<float>(stat_out.data(), 5)),
      ak::Error, MessageMatches(ContainsSubstring("out_stat.size(): expected 6")));
  CHECK_THROWS_MATCHES(
      ak::merge(ak::Softmax{}, Parts{out.cview()}, {s.data()}, out.view), ak::Error,
      MessageMatches(ContainsSubstring("out: expected memory disjoint from parts[0]")));
  CHECK_THROWS_MATCHES(
      ak::merge(ak::Softmax::with_sinks({1.f}), Parts{a.cview()}, {s.data()}, out.view), ak::Error,
      MessageMatches(ContainsSubstring("Softmax.sinks.size(): expected heads = 2")));
  bool untouched = true;
  out.for_each([&](float& x) { untouched = untouched && x == 42.f; });
  CHECK(untouched);
  CHECK(std::all_of(stat_out.begin(), stat_out.end(), [](float x) { return x == 7.f; }));
}
