// Split-KV for SoftplusL1 (LSSA) and the two-round form of SoftplusL1Reweighted (LSSAR):
// keys cut at random points into 2, 3 or 7 parts. LSSA parts run with the whole call's key
// counts and merge() by their row sums gives the whole call. LSSAR: round one is that LSSA
// merge (row sums W_i and the LSSA output); round two runs second_round(W) on every part and
// merge_reweighted() gives the whole LSSAR call, LSE included, with the fallback rows (a zero
// query, one visible key) taking the LSSA output. merge_reweighted's own errors throw before
// anything is written.
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/merge.hpp>
#include <attnkit/kernel/merge_reweighted.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/mask/visible_keys.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "support/matchers.hpp"
#include "support/test_names.hpp"

using ak::test::kNegInf;

namespace {

constexpr Index kB = 1, kH = 2, kLq = 70, kLk = 300, kD = 32, kDv = 16;

// Cut points 0 = c_0 < c_1 < ... < c_parts = kLk, drawn at random.
std::vector<Index> cuts(int parts, std::uint32_t seed) {
  return ak::test::random_cuts(kLk, parts, seed);
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i])));
    worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d);
  }
  return worst;
}

// Query rows of head 1 set to zero in the inputs.
constexpr Index kZeroRows[] = {7, 30, 69};

std::vector<float> without_zero_rows(std::vector<float> lse) {
  for (const Index r : kZeroRows) lse[static_cast<std::size_t>(kLq + r)] = 0.f;
  return lse;
}

// The inputs, with some query rows zero (uniform LSSA weights: LSSAR falls back).
struct Inputs {
  Tensor<float> q{Layout::Bshd, kB, kH, kLq, kD}, k{Layout::Bshd, kB, kH, kLk, kD},
      v{Layout::Bshd, kB, kH, kLk, kDv};
  Inputs() {
    q.randomize(1);
    k.randomize(2);
    v.randomize(3);
    for (const Index r : kZeroRows) std::fill(q.view.row(0, 1, r), q.view.row(0, 1, r) + kD, 0.f);
  }
};

// Runs `normalizer` under `mask` on each key slice [c_p, c_p+1) (positions shifted so that
// query i still sees key j' + c_p where it saw j before); keeps the outputs and statistics.
struct Parts {
  std::deque<Tensor<float>> outs;  // Tensor is not movable: its view points into it
  std::vector<std::vector<float>> stats;
  std::vector<ak::View<const float>> views;
  std::vector<const float*> stat_ptrs;
};

template <class Mask, class N>
void run_parts(const Mask& mask, const N& normalizer, const Inputs& in, const std::vector<Index>& c,
               Index q_offset, Parts& parts) {
  const auto rows = static_cast<std::size_t>(kB * kH * kLq);
  const int n = static_cast<int>(c.size()) - 1;
  parts.stats.assign(static_cast<std::size_t>(n), std::vector<float>(rows, 42.f));
  for (int p = 0; p < n; ++p) {
    auto ks = in.k.cview(), vs = in.v.cview();
    ks.data = in.k.view.row(0, 0, c[p]);
    vs.data = in.v.view.row(0, 0, c[p]);
    ks.seq = vs.seq = c[p + 1] - c[p];
    parts.outs.emplace_back(Layout::Bhsd, kB, kH, kLq, kDv);
    std::vector<float>& s = parts.stats[static_cast<std::size_t>(p)];
    ak::attention(ak::make_spec(mask, normalizer), in.q.cview(), ks, vs, parts.outs.back().view,
                  ak::Options{}.with_q_offset(q_offset - c[p]).with_threads(2).with_lse(s));
    parts.views.push_back(parts.outs.back().cview());
    parts.stat_ptrs.push_back(s.data());
  }
}

template <class Mask>
void check_split(const Mask& mask, int n, Index q_offset) {
  INFO(n << " parts, q_offset " << q_offset);
  const Inputs in;
  const auto rows = static_cast<std::size_t>(kB * kH * kLq);
  const auto whole = ak::Options{}.with_q_offset(q_offset).with_threads(2);
  const std::vector<float> counts = ak::visible_key_counts(mask, kB, kH, kLq, kLk, q_offset);
  const std::vector<Index> c = cuts(n, 40u + static_cast<std::uint32_t>(n));

  // LSSA: the whole call, and round one (parts with the whole call's counts, merged).
  Tensor<float> lssa(Layout::Bhsd, kB, kH, kLq, kDv), lssa_merged(Layout::Bhsd, kB, kH, kLq, kDv);
  std::vector<float> sums(rows), sums_merged(rows);
  ak::attention(ak::make_spec(mask, ak::SoftplusL1{}), in.q.cview(), in.k.cview(), in.v.cview(),
                lssa.view, whole.with_lse(sums));
  Parts one;
  run_parts(mask, ak::SoftplusL1::with_key_counts(counts), in, c, q_offset, one);
  ak::merge(ak::SoftplusL1{}, one.views, one.stat_ptrs, lssa_merged.view, sums_merged);
  CHECK(ak::test::max_abs_diff(lssa_merged.view, lssa.view) <= 4 * tol::kF32);
  CHECK(max_rel_diff(sums_merged, sums) <= 4 * tol::kRowSumRel);

  // LSSAR: the whole call, and round two merged with the round-one LSSA output.
  Tensor<float> lssar(Layout::Bhsd, kB, kH, kLq, kDv), lssar_merged(Layout::Bhsd, kB, kH, kLq, kDv);
  std::vector<float> lse(rows), lse_merged(rows, 42.f);
  ak::attention(ak::make_spec(mask, ak::SoftplusL1Reweighted{}), in.q.cview(), in.k.cview(),
                in.v.cview(), lssar.view, whole.with_lse(lse));
  const auto second =
      ak::SoftplusL1Reweighted{15.f, ak::SoftplusL1::with_key_counts(counts)}.second_round(
          sums_merged);
  Parts two;
  run_parts(mask, second, in, c, q_offset, two);
  ak::merge_reweighted(second, two.views, two.stat_ptrs, lssa_merged.cview(), lssar_merged.view,
                       lse_merged);
  CHECK(ak::test::max_abs_diff(lssar_merged.view, lssar.view) <= 4 * tol::kF32);
  // LSE up to p log Lk (~85): f32 rounds it to eps |lse|. The zero query rows are left out
  // (their statistic is the known bug below).
  CHECK(ak::test::max_lse_diff(without_zero_rows(lse_merged), without_zero_rows(lse)) <=
        4 * tol::kLseF32 + 90 * std::numeric_limits<float>::epsilon());
  if (q_offset == -5)  // row 5 sees one key (of both heads): falls back, LSE -inf
    for (const std::size_t at : {std::size_t{5}, std::size_t{kLq + 5}}) {
      CHECK(lse[at] == kNegInf);
      CHECK(lse_merged[at] == kNegInf);
    }
  // The zero query rows of head 1 fall back in the whole call (LSE -inf). Their merged LSE
  // may be finite: a part cannot see that the whole row is uniform (documented in
  // softplus_l1_reweighted.hpp); their output, checked above, is the same.
  for (const Index r : kZeroRows) {
    INFO("zero query row " << r);
    CHECK(lse[static_cast<std::size_t>(kLq + r)] == kNegInf);
  }
}

}  // namespace

TEST_CASE(
    "merge: LSSA parts with the whole call's key counts merge by row sums; LSSAR in two "
    "rounds",
    "[merge][softplus]") {
  const int parts = GENERATE(2, 3, 7);
  check_split(ak::Causal{}, parts, kLk - kLq);
  check_split(ak::Causal{}, parts, -5);  // rows 0..4 see nothing, row 5 one key
  check_split(ak::Causal{} & ak::SlidingWindow{100, 0}, parts, kLk - kLq);
}

TEST_CASE("merge: parts with their own key counts do not give the whole LSSA call",
          "[merge][softplus]") {
  // The reason for with_key_counts: a part's own N_i (the default) changes the weights.
  const Inputs in;
  const auto rows = static_cast<std::size_t>(kB * kH * kLq);
  const Index q_offset = kLk - kLq;
  Tensor<float> whole(Layout::Bhsd, kB, kH, kLq, kDv), merged(Layout::Bhsd, kB, kH, kLq, kDv);
  std::vector<float> sums(rows);
  ak::attention(ak::make_spec(ak::Causal{}, ak::SoftplusL1{}), in.q.cview(), in.k.cview(),
                in.v.cview(), whole.view, ak::Options{}.with_q_offset(q_offset));
  Parts parts;
  run_parts(ak::Causal{}, ak::SoftplusL1{}, in, cuts(3, 43), q_offset, parts);
  ak::merge(ak::SoftplusL1{}, parts.views, parts.stat_ptrs, merged.view, sums);
  CHECK(ak::test::max_abs_diff(merged.view, whole.view) > 100 * tol::kF32);
}

TEST_CASE("merge_reweighted: bad arguments throw attnkit::Error and write nothing",
          "[merge][softplus][errors]") {
  Tensor<float> a(Layout::Bhsd, 1, 2, 3, 4), lssa(Layout::Bhsd, 1, 2, 3, 4),
      wrong(Layout::Bhsd, 1, 2, 3, 5), out(Layout::Bhsd, 1, 2, 3, 4);
  out.for_each([](float& x) { x = 42.f; });
  std::vector<float> s(6, 0.f), stat_out(6, 7.f);
  const auto second = ak::SoftplusL1Reweighted{}.second_round(std::vector<float>(6, 1.f));
  using Views = std::vector<ak::View<const float>>;
  CHECK_THROWS_MATCHES(
      ak::merge_reweighted(second, Views{a.cview()}, {s.data()}, wrong.cview(), out.view, stat_out),
      ak::Error, MessageMatches(ContainsSubstring("lssa: expected the shape of out")));
  CHECK_THROWS_MATCHES(
      ak::merge_reweighted(second, Views{a.cview()}, {s.data()}, out.cview(), out.view, stat_out),
      ak::Error, MessageMatches(ContainsSubstring("lssa")));
  CHECK_THROWS_MATCHES(ak::merge_reweighted(second, Views{a.cview(), wrong.cview()},
                                            {s.data(), s.data()}, lssa.cview(), out.view, stat_out),
                       ak::Error,
                       MessageMatches(ContainsSubstring("parts[1]: expected the shape")));
  CHECK_THROWS_MATCHES(
      ak::merge_reweighted(second, Views{a.cview()}, {}, lssa.cview(), out.view, stat_out),
      ak::Error, MessageMatches(ContainsSubstring("stats.size()")));
  CHECK_THROWS_MATCHES(ak::merge_reweighted(second, Views{}, {}, lssa.cview(), out.view), ak::Error,
                       MessageMatches(ContainsSubstring("parts.size(): expected >= 1")));
  bool untouched = true;
  out.for_each([&](float& x) { untouched = untouched && x == 42.f; });
  CHECK(untouched);
  CHECK(std::all_of(stat_out.begin(), stat_out.end(), [](float x) { return x == 7.f; }));
}

TEST_CASE("merge_reweighted: rows with LSE -inf in every part take the LSSA output",
          "[merge][softplus]") {
  // Row 0: both parts -inf (falls back); row 1: one part finite (its output, weight 1);
  // row 2: NaN stays NaN.
  Tensor<float> a(Layout::Bhsd, 1, 1, 3, 4), b(Layout::Bhsd, 1, 1, 3, 4),
      lssa(Layout::Bhsd, 1, 1, 3, 4), out(Layout::Bhsd, 1, 1, 3, 4);
  a.randomize(1);
  b.randomize(2);
  lssa.randomize(3);
  std::vector<float> la{kNegInf, kNegInf, std::numeric_limits<float>::quiet_NaN()},
      lb{kNegInf, 0.5f, 0.f}, merged(3);
  const auto second = ak::SoftplusL1Reweighted{}.second_round(std::vector<float>(3, 1.f));
  ak::merge_reweighted(second, std::vector<ak::View<const float>>{a.cview(), b.cview()},
                       {la.data(), lb.data()}, lssa.cview(), out.view, merged);
  CHECK(merged[0] == kNegInf);
  CHECK(merged[1] == 0.5f);
  CHECK(std::isnan(merged[2]));
  for (Index c = 0; c < 4; ++c) {
    CHECK(out.view.row(0, 0, 0)[c] == lssa.view.row(0, 0, 0)[c]);
    CHECK(std::abs(out.view.row(0, 0, 1)[c] - b.view.row(0, 0, 1)[c]) <= tol::kF32);
    CHECK(std::isnan(out.view.row(0, 0, 2)[c]));
  }
}
