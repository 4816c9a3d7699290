// Softmax, the online normalizer: absorb() over several key tiles, with the caller's
// accumulator rescaled by the returned alpha as the kernel does, ends in the same weights
// as the one-pass reference_row(); fully masked blocks and rows give 0 and LSE -inf, never
// NaN; lse() is the natural-log log-sum-exp. Blocks are [keys, ld] with one query per lane.
#include <algorithm>
#include <attnkit/core/error.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/simd/simd.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/error_checks.hpp"
#include "support/lane_blocks.hpp"
#include "support/matchers.hpp"

namespace simd = attnkit::simd;

namespace {

using namespace attnkit::test::lanes;  // W, kLd, make_rows, make_block, at, lanes_of

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
// On top of tol::kLseF32: the LSE is returned as a float, one ulp of its own magnitude.
constexpr double kLseRel = std::numeric_limits<float>::epsilon();

struct Online {
  Rows weights;               // [W][keys] accumulator * finalize factor
  std::vector<float> factor;  // [W] finalize()
  std::vector<float> lse;     // [W] lse()
  bool rescaled = false;      // some alpha < 1 was applied to a non-zero accumulator
  bool padding_intact = true;
};

// The kernel's loop for one State, with V = identity so the output row of query q is its
// weight vector: per tile, acc = acc * alpha + P.
Online run_online(const Rows& rows, const std::vector<Index>& tiles) {
  const ak::Softmax softmax;
  const auto keys = static_cast<Index>(rows[0].size());
  Rows acc(W, std::vector<float>(rows[0].size(), 0.f));  // [W][keys]
  ak::Softmax::State st = softmax.begin();
  Online out;
  Index k0 = 0;
  for (const Index nk : tiles) {
    std::vector<float> block(static_cast<std::size_t>(nk * kLd),
                             std::numeric_limits<float>::quiet_NaN());  // [nk, kLd]
    for (Index j = 0; j < nk; ++j)
      for (int q = 0; q < W; ++q)
        block[static_cast<std::size_t>(j * kLd + q)] = rows[q][static_cast<std::size_t>(k0 + j)];
    const std::vector<float> alpha = lanes_of(softmax.absorb(st, block.data(), nk, kLd));
    for (int q = 0; q < W; ++q) {
      for (float& a : acc[q]) {
        out.rescaled = out.rescaled || (a != 0.f && alpha[q] < 1.f);
        a *= alpha[q];
      }
      for (Index j = 0; j < nk; ++j)
        acc[q][static_cast<std::size_t>(k0 + j)] += block[static_cast<std::size_t>(j * kLd + q)];
    }
    for (Index j = 0; j < nk; ++j)
      for (Index c = W; c < kLd; ++c)
        out.padding_intact =
            out.padding_intact && std::isnan(block[static_cast<std::size_t>(j * kLd + c)]);
    k0 += nk;
  }
  REQUIRE(k0 == keys);
  out.factor = lanes_of(softmax.finalize(st));
  out.lse = lanes_of(softmax.lse(st));
  out.weights = acc;
  for (int q = 0; q < W; ++q)
    for (float& a : out.weights[q]) a *= out.factor[q];
  return out;
}

// The one-pass reference of one query: weights in place, returns the LSE.
double reference(const std::vector<float>& logits, std::vector<double>& weights) {
  weights.assign(logits.begin(), logits.end());
  return ak::Softmax{}.reference_row(weights.data(), static_cast<Index>(weights.size()));
}

// log(sum_j exp(s_j)) in double, computed here independently of the library.
double log_sum_exp(const std::vector<float>& logits) {
  double m = kNegInfD;
  for (const float s : logits) m = std::max(m, double(s));
  if (m == kNegInfD) return kNegInfD;
  double l = 0.0;
  for (const float s : logits) l += std::exp(double(s) - m);
  return m + std::log(l);
}

// Online weights and LSE against the reference for every lane; reports the worst weight
// and the worst LSE, one assertion each.
void check_against_reference(const Rows& rows, const Online& online) {
  CHECK(online.padding_intact);
  double worst = -1.0, worst_expected = 0.0, worst_lse = -1.0, worst_lse_expected = 0.0;
  int wq = 0, lq = 0;
  std::size_t wj = 0;
  for (int q = 0; q < W; ++q) {
    std::vector<double> expected;
    const double lse = reference(rows[q], expected);
    for (std::size_t j = 0; j < expected.size(); ++j) {
      double d = std::abs(online.weights[q][j] - expected[j]);
      if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
      if (d > worst) {
        worst = d;
        worst_expected = expected[j];
        wq = q;
        wj = j;
      }
    }
    // Equal infinities (an empty row's -inf) agree; NaN never does.
    double d = lse == online.lse[q] ? 0.0 : std::abs(online.lse[q] - lse);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    // An f32 LSE of magnitude |lse| is itself only good to about an ulp of it.
    if (std::isfinite(lse)) d = std::max(0.0, d - kLseRel * std::abs(lse));
    if (d > worst_lse) {
      worst_lse = d;
      worst_lse_expected = lse;
      lq = q;
    }
  }
  if (worst >= 0.0) {
    INFO("worst weight: query lane " << wq << ", key " << wj);
    CHECK_THAT(online.weights[wq][wj], WithinAbs(worst_expected, tol::kF32));
  }
  INFO("worst LSE: query lane " << lq << ", " << online.lse[lq] << " vs " << worst_lse_expected
                                << " (beyond kLseRel: " << worst_lse << ")");
  CHECK(worst_lse <= tol::kLseF32);
}

}  // namespace

TEST_CASE("Softmax: absorbing tiles online gives the one-pass weights after finalize",
          "[softmax][online]") {
  // Later tiles hold larger logits, so the running max grows and alpha < 1 rescales the
  // accumulator; every 7th pair (shifted per lane) is masked.
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.f, 3.f);
  const Rows rows = make_rows(37, [&](int q, Index j) {
    return (j + q) % 7 == 3 ? kNegInf : dist(rng) + 0.25f * float(j);
  });
  for (const auto& tiles : {std::vector<Index>{5, 1, 13, 18}, std::vector<Index>{37},
                            std::vector<Index>{1, 1, 1, 34}}) {
    INFO("tiles of " << tiles.size());
    const Online online = run_online(rows, tiles);
    if (tiles.size() > 1) CHECK(online.rescaled);  // the case under test really happened
    check_against_reference(rows, online);
  }
}

TEST_CASE("Softmax: lse equals log-sum-exp computed in double", "[softmax][lse]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 4.f);
  const Rows rows = make_rows(50, [&](int, Index) { return dist(rng); });
  const Online online = run_online(rows, {20, 30});
  for (int q = 0; q < W; ++q) {
    INFO("query lane " << q);
    CHECK_THAT(online.lse[q], WithinAbs(log_sum_exp(rows[q]), tol::kLseF32));
    std::vector<double> weights;
    CHECK_THAT(reference(rows[q], weights), WithinAbs(log_sum_exp(rows[q]), 1e-12));
  }
}

TEST_CASE("Softmax: an all -inf block gives weight 0, factor 0 and LSE -inf, no NaN",
          "[softmax][masked]") {
  const ak::Softmax softmax;
  ak::Softmax::State st = softmax.begin();
  for (int tile = 0; tile < 2; ++tile) {  // twice: -inf stays -inf, never NaN
    std::vector<float> block(static_cast<std::size_t>(4 * kLd), kNegInf);  // [4, kLd]
    const std::vector<float> alpha = lanes_of(softmax.absorb(st, block.data(), 4, kLd));
    for (int q = 0; q < W; ++q) {
      INFO("tile " << tile << " lane " << q);
      CHECK_FALSE(std::isnan(alpha[q]));
      for (Index j = 0; j < 4; ++j)
        CHECK(block[static_cast<std::size_t>(j * kLd + q)] == 0.f);  // exact: weight 0
    }
  }
  for (const float f : lanes_of(softmax.finalize(st))) CHECK(f == 0.f);  // exact
  for (const float l : lanes_of(softmax.lse(st))) CHECK(l == kNegInf);   // exact
}

TEST_CASE("Softmax: fully masked lanes next to visible lanes stay independent",
          "[softmax][masked]") {
  // Even lanes see nothing, odd lanes see random logits (with one lane, lane 0 is masked).
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.f, 2.f);
  const Rows rows = make_rows(30, [&](int q, Index) { return q % 2 == 0 ? kNegInf : dist(rng); });
  const Online online = run_online(rows, {10, 20});
  check_against_reference(rows, online);
  for (int q = 0; q < W; q += 2) {
    CHECK(online.factor[q] == 0.f);  // exact: an empty row finalizes to 0
    for (const float w : online.weights[q]) CHECK(w == 0.f);
  }
}

TEST_CASE("Softmax: a masked tile before or after the visible keys changes nothing",
          "[softmax][masked]") {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.f, 2.f);
  SECTION("masked first: the -inf running max meets the first visible tile") {
    const Rows rows = make_rows(24, [&](int, Index j) { return j < 8 ? kNegInf : dist(rng); });
    check_against_reference(rows, run_online(rows, {8, 16}));
  }
  SECTION("masked last: alpha must stay 1 and the sum unchanged") {
    const Rows rows = make_rows(24, [&](int, Index j) { return j >= 16 ? kNegInf : dist(rng); });
    check_against_reference(rows, run_online(rows, {16, 8}));
  }
}

TEST_CASE("Softmax: a State that absorbed nothing finalizes to 0 with LSE -inf",
          "[softmax][masked]") {
  const ak::Softmax softmax;
  const ak::Softmax::State st = softmax.begin();                         // e.g. kv_len = 0
  for (const float f : lanes_of(softmax.finalize(st))) CHECK(f == 0.f);  // exact
  for (const float l : lanes_of(softmax.lse(st))) CHECK(l == kNegInf);   // exact
}

TEST_CASE("Softmax: reference_row of an empty or all-masked row is 0 with LSE -inf",
          "[softmax][reference]") {
  const ak::Softmax softmax;
  double untouched = 5.0;
  CHECK(softmax.reference_row(&untouched, 0) == kNegInfD);  // exact
  CHECK(untouched == 5.0);                                  // n = 0 writes nothing
  std::vector<double> row(6, kNegInfD);
  CHECK(softmax.reference_row(row.data(), 6) == kNegInfD);
  for (const double w : row) CHECK(w == 0.0);  // exact: not NaN, not -inf
}

TEST_CASE("Softmax: reference_row on a hand-checked row", "[softmax][reference]") {
  // Logits {0, ln 3, -inf, ln 4}: weights {1/8, 3/8, 0, 4/8}, LSE = ln 8.
  std::vector<double> row{0.0, std::log(3.0), kNegInfD, std::log(4.0)};
  const double lse = ak::Softmax{}.reference_row(row.data(), 4);
  CHECK_THAT(row[0], WithinAbs(1.0 / 8, 1e-15));
  CHECK_THAT(row[1], WithinAbs(3.0 / 8, 1e-15));
  CHECK(row[2] == 0.0);  // exact: masked
  CHECK_THAT(row[3], WithinAbs(4.0 / 8, 1e-15));
  CHECK_THAT(lse, WithinAbs(std::log(8.0), 1e-15));
}

TEST_CASE("Softmax: weights do not depend on a large common shift of the logits",
          "[softmax][range]") {
  // Logits near +-80 would overflow or underflow a naive exp(s) in f32; the running max
  // keeps every exponent <= 0. Values are multiples of 1/8, exact in f32 at this size.
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> eighths(-40, 40);
  for (const float shift : {-80.f, 0.f, 80.f}) {
    INFO("shift " << shift);
    const Rows rows = make_rows(40, [&](int, Index) { return shift + float(eighths(rng)) / 8.f; });
    check_against_reference(rows, run_online(rows, {15, 25}));
  }
}

TEST_CASE("Softmax: large near-equal logits give the same weights across tiles as in one",
          "[softmax][range]") {
  // Logits base + {0, 0.5} are exact in f32 up to 2^14 (ulp <= 2^-10), so the weights are
  // {1, e^0.5} / (1 + e^0.5) whatever base is, and an f32 softmax can get them to a few
  // ulps. Absorbing the two keys as two tiles makes the running max grow between tiles;
  // the rescale factor alpha must then cancel the rounding of m * log2e that the first
  // tile's weights carry, or the error grows with |base|.
  for (const float base : {0.f, 100.f, 1000.f, 3000.f, 10000.f, 12345.f, 16000.f}) {
    INFO("logits {" << base << ", " << base + 0.5f << "}");
    const Rows rows = make_rows(2, [&](int, Index j) { return base + 0.5f * float(j); });
    check_against_reference(rows, run_online(rows, {2}));     // one tile
    check_against_reference(rows, run_online(rows, {1, 1}));  // two tiles, max grows
  }
}

// Sinks (gpt-oss): one logit per query head that adds exp(sink - m) to the denominator and
// nothing to the output.

TEST_CASE("Softmax: begin(RowContext) holds the head's sink: m = sink, l = 1", "[softmax][sinks]") {
  const ak::Softmax sinks = ak::Softmax::with_sinks({0.5f, -2.f, 0.f});
  for (Index h = 0; h < 3; ++h) {
    INFO("head " << h);
    const ak::Softmax::State st = sinks.begin(ak::RowContext{1, h, 17});
    for (const float m : lanes_of(st.m)) CHECK(m == sinks.sinks[static_cast<std::size_t>(h)]);
    for (const float l : lanes_of(st.l)) CHECK(l == 1.f);
    // Nothing absorbed (the row sees no key): factor 1 on a zero accumulator, LSE = sink.
    for (const float f : lanes_of(sinks.finalize(st))) CHECK(f == 1.f);
    for (const float l : lanes_of(sinks.lse(st)))
      CHECK(l == sinks.sinks[static_cast<std::size_t>(h)]);
  }
  // Without sinks, begin(RowContext) is begin(): m = -inf, l = 0.
  const ak::Softmax::State plain = ak::Softmax{}.begin(ak::RowContext{0, 2, 5});
  for (const float m : lanes_of(plain.m)) CHECK(m == kNegInf);
  for (const float l : lanes_of(plain.l)) CHECK(l == 0.f);
}

TEST_CASE("Softmax: absorbing tiles after a sink matches reference_row with the sink",
          "[softmax][sinks]") {
  // Sinks below, among and above the logits: the running max starts at the sink and grows
  // past it (alpha < 1) or never does (the sink dominates the denominator).
  std::mt19937 rng(23);
  std::normal_distribution<float> dist(0.f, 2.f);
  const Rows rows = make_rows(
      33, [&](int q, Index j) { return (j + q) % 6 == 1 ? kNegInf : dist(rng) + 0.1f * float(j); });
  const ak::Softmax softmax = ak::Softmax::with_sinks({-5.f, 1.f, 12.f});
  for (Index h = 0; h < 3; ++h) {
    const ak::RowContext ctx{0, h, 33};
    ak::Softmax::State st = softmax.begin(ctx);
    Rows acc(W, std::vector<float>(33, 0.f));  // [W][keys], V = identity
    Index k0 = 0;
    for (const Index nk : {Index{9}, Index{1}, Index{23}}) {
      std::vector<float> block(static_cast<std::size_t>(nk * kLd), 0.f);  // [nk, kLd]
      for (Index j = 0; j < nk; ++j)
        for (int q = 0; q < W; ++q)
          block[static_cast<std::size_t>(j * kLd + q)] = rows[q][static_cast<std::size_t>(k0 + j)];
      const std::vector<float> alpha = lanes_of(softmax.absorb(st, block.data(), nk, kLd));
      for (int q = 0; q < W; ++q) {
        for (float& a : acc[q]) a *= alpha[q];
        for (Index j = 0; j < nk; ++j)
          acc[q][static_cast<std::size_t>(k0 + j)] += block[static_cast<std::size_t>(j * kLd + q)];
      }
      k0 += nk;
    }
    const std::vector<float> factor = lanes_of(softmax.finalize(st));
    const std::vector<float> lse = lanes_of(softmax.lse(st));
    for (int q = 0; q < W; ++q) {
      INFO("head " << h << ", lane " << q);
      std::vector<double> expected(rows[q].begin(), rows[q].end());
      const double ref_lse = softmax.reference_row(expected.data(), 33, ctx);
      // Independently: log(exp(sink) + sum_j exp(s_j)).
      std::vector<float> with_sink = rows[q];
      with_sink.push_back(softmax.sinks[static_cast<std::size_t>(h)]);
      CHECK_THAT(ref_lse, WithinAbs(log_sum_exp(with_sink), 1e-12));
      CHECK_THAT(lse[q], WithinAbs(ref_lse, tol::kLseF32 + kLseRel * std::abs(ref_lse)));
      double sum = 0.0;
      for (std::size_t j = 0; j < expected.size(); ++j) {
        sum += expected[j];
        CHECK_THAT(acc[q][j] * factor[q], WithinAbs(expected[j], tol::kF32));
      }
      // The weights sum to 1 minus the sink's share.
      const double sink_share =
          std::exp(double(softmax.sinks[static_cast<std::size_t>(h)]) - ref_lse);
      CHECK_THAT(sum, WithinAbs(1.0 - sink_share, 1e-12));
    }
  }
}

TEST_CASE("Softmax: reference_row with a sink on a hand-checked row",
          "[softmax][sinks][reference]") {
  // Logits {0, ln 3, -inf, ln 4} and sink ln 2: denominator 1 + 3 + 4 + 2 = 10, weights
  // {1/10, 3/10, 0, 4/10}, LSE = ln 10.
  const ak::Softmax softmax = ak::Softmax::with_sinks({0.f, float(std::log(2.0))});
  const ak::RowContext head1{0, 1, 4};
  std::vector<double> row{0.0, std::log(3.0), kNegInfD, std::log(4.0)};
  const double lse = softmax.reference_row(row.data(), 4, head1);
  CHECK_THAT(row[0], WithinAbs(0.1, 1e-7));
  CHECK_THAT(row[1], WithinAbs(0.3, 1e-7));
  CHECK(row[2] == 0.0);  // exact: masked
  CHECK_THAT(row[3], WithinAbs(0.4, 1e-7));
  CHECK_THAT(lse, WithinAbs(std::log(10.0), 1e-7));  // the sink is a float: ln 2 to 1e-8
  // Sink 0 ("softmax off by one"), head 0: denominator 1 + 1 + 3 + 4 = 9.
  std::vector<double> off{0.0, std::log(3.0), kNegInfD, std::log(4.0)};
  CHECK_THAT(softmax.reference_row(off.data(), 4, ak::RowContext{0, 0, 4}),
             WithinAbs(std::log(9.0), 1e-15));
  CHECK_THAT(off[3], WithinAbs(4.0 / 9, 1e-15));
  // The two-argument form is plain softmax, sinks or not.
  std::vector<double> plain{0.0, std::log(3.0), kNegInfD, std::log(4.0)};
  CHECK_THAT(softmax.reference_row(plain.data(), 4), WithinAbs(std::log(8.0), 1e-15));
}

TEST_CASE("Softmax: with a sink, an empty or all-masked row gives 0 and LSE = sink",
          "[softmax][sinks][masked]") {
  const ak::Softmax softmax = ak::Softmax::with_sinks({-3.5f});
  const ak::RowContext ctx{0, 0, 6};
  std::vector<double> row(6, kNegInfD);
  CHECK(softmax.reference_row(row.data(), 6, ctx) == -3.5);  // exact
  for (const double w : row) CHECK(w == 0.0);                // exact: not NaN
  double untouched = 5.0;
  CHECK(softmax.reference_row(&untouched, 0, ctx) == -3.5);
  CHECK(untouched == 5.0);
  // The online form: an all -inf block keeps m = sink, l = 1.
  ak::Softmax::State st = softmax.begin(ctx);
  std::vector<float> block(static_cast<std::size_t>(3 * kLd), kNegInf);  // [3, kLd]
  for (const float a : lanes_of(softmax.absorb(st, block.data(), 3, kLd))) CHECK(a == 1.f);
  for (Index j = 0; j < 3; ++j)
    for (int q = 0; q < W; ++q) CHECK(block[static_cast<std::size_t>(j * kLd + q)] == 0.f);
  for (const float l : lanes_of(softmax.lse(st))) CHECK(l == -3.5f);
  // A NaN logit still poisons the row, sink or not.
  std::vector<double> poisoned{0.0, std::nan(""), 1.0};
  CHECK(std::isnan(softmax.reference_row(poisoned.data(), 3, ctx)));
  for (const double w : poisoned) CHECK(std::isnan(w));
}

TEST_CASE("Softmax: validate refuses sinks that do not cover the query heads",
          "[softmax][sinks][errors]") {
  const ak::Softmax sinks = ak::Softmax::with_sinks({0.f, 1.f, 2.f});
  CHECK_NOTHROW(sinks.validate(8, 8, 0, 2, 3));
  ak::test::check_error([&] { sinks.validate(8, 8, 0, 2, 4); },
                        {"Softmax.sinks.size()", "q_heads = 4", "got 3"});
  CHECK_THROWS_AS(sinks.validate(8, 8, 0, 2, 1), ak::Error);
  CHECK_NOTHROW(ak::Softmax{}.validate(8, 8, 0, 2, 64));  // no sinks: any head count
}
