// ReluPower{alpha, bias}, the l1 normalizer: absorb() turns each logit into
// ReLU(s - b)^alpha in place and adds it to the row sum, over any number of key tiles and
// with nothing to rescale; finalize() is 1 / sum, or 0 for a row whose weights are all 0;
// the row sum is the row statistic. Blocks are [keys, ld] with one query per lane.
#include <attnkit/core/error.hpp>
#include <attnkit/normalizer/faces.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/simd/simd.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/lane_blocks.hpp"
#include "support/matchers.hpp"

namespace simd = attnkit::simd;

namespace {

using namespace attnkit::test::lanes;  // W, kLd, make_rows, make_block, at, lanes_of

// x^alpha as 2^(alpha log2 x) in f32: the SIMD log2 and exp2 each lose a few ulps, and
// alpha scales the log's error; 1e-5 relative covers alpha up to 3 with room.
constexpr double kPowRel = 1e-5;

struct Absorbed {
  Rows weights;                        // [W][keys] as absorb() left them (unnormalized)
  std::vector<float> row_sum, factor;  // [W] row_sum(), finalize()
  bool factors_one = true;             // every absorb() returned 1
  bool padding_intact = true;          // absorb() never wrote past the lanes
};

// The kernel's loop for one State over key tiles of the given sizes.
Absorbed run(const ak::ReluPower& relu, const Rows& rows, const std::vector<Index>& tiles) {
  ak::ReluPower::State st = ak::detail::begin_state(relu, ak::RowContext{0, 0, 9});
  Absorbed out;
  out.weights.assign(W, std::vector<float>(rows[0].size()));
  Index k0 = 0;
  for (const Index nk : tiles) {
    std::vector<float> block(static_cast<std::size_t>(nk * kLd), kNaN);  // [nk, kLd]
    for (Index j = 0; j < nk; ++j)
      for (int q = 0; q < W; ++q)
        block[static_cast<std::size_t>(j * kLd + q)] = rows[q][static_cast<std::size_t>(k0 + j)];
    for (const float f : lanes_of(relu.absorb(st, block.data(), nk, kLd)))
      out.factors_one = out.factors_one && f == 1.f;
    for (Index j = 0; j < nk; ++j) {
      for (int q = 0; q < W; ++q)
        out.weights[q][static_cast<std::size_t>(k0 + j)] =
            block[static_cast<std::size_t>(j * kLd + q)];
      for (Index c = W; c < kLd; ++c)
        out.padding_intact =
            out.padding_intact && std::isnan(block[static_cast<std::size_t>(j * kLd + c)]);
    }
    k0 += nk;
  }
  REQUIRE(k0 == static_cast<Index>(rows[0].size()));
  out.row_sum = lanes_of(relu.row_sum(st));
  out.factor = lanes_of(relu.finalize(st));
  return out;
}

// ReLU(s - b)^alpha in double, written here independently of the library.
double relu_pow(double s, double alpha, double b) {
  return s - b > 0.0 ? std::pow(s - b, alpha) : 0.0;
}

void check_against_formula(const ak::ReluPower& relu, const Rows& rows, const Absorbed& got) {
  CHECK(got.factors_one);
  CHECK(got.padding_intact);
  for (int q = 0; q < W; ++q) {
    double sum = 0.0;
    for (std::size_t j = 0; j < rows[q].size(); ++j) {
      const double w = relu_pow(rows[q][j], relu.alpha, relu.bias);
      sum += w;
      INFO("lane " << q << ", key " << j << ", logit " << rows[q][j]);
      if (w == 0.0)
        CHECK(got.weights[q][j] == 0.f);  // exact: at or below the bias, or masked
      else
        CHECK_THAT(got.weights[q][j], WithinRel(w, kPowRel));
    }
    INFO("lane " << q);
    CHECK_THAT(got.row_sum[q], WithinRel(sum, kPowRel));
    if (sum == 0.0)
      CHECK(got.factor[q] == 0.f);
    else
      CHECK_THAT(got.factor[q], WithinRel(1.0 / sum, kPowRel));
    // The reference rule agrees with the formula: normalized weights, the sum returned.
    std::vector<double> ref(rows[q].begin(), rows[q].end());
    CHECK_THAT(relu.reference_row(ref.data(), static_cast<Index>(ref.size())),
               WithinRel(sum, 1e-12));
    for (std::size_t j = 0; j < ref.size(); ++j)
      CHECK_THAT(
          ref[j],
          WithinAbs(sum == 0.0 ? 0.0 : relu_pow(rows[q][j], relu.alpha, relu.bias) / sum, 1e-12));
  }
}

}  // namespace

TEST_CASE("ReluPower: traits say no rescale and the row sum as statistic", "[relu_power][traits]") {
  STATIC_REQUIRE_FALSE(ak::detail::rescales<ak::ReluPower>());
  STATIC_REQUIRE(ak::detail::row_stat_kind<ak::ReluPower>() == ak::RowStat::Sum);
  STATIC_REQUIRE_FALSE(ak::detail::has_context_begin<ak::ReluPower>::value);
  STATIC_REQUIRE_FALSE(ak::detail::has_context_reference<ak::ReluPower>::value);
}

TEST_CASE("ReluPower: absorb over several tiles gives ReLU(s - b)^alpha and their sum",
          "[relu_power][absorb]") {
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.f, 2.f);
  const Rows rows = make_rows(41, [&](int q, Index j) {
    return (j + q) % 5 == 2 ? kNegInf : dist(rng);  // every 5th pair masked, shifted per lane
  });
  for (const float alpha : {1.f, 2.f, 1.5f, 0.5f, 3.f})
    for (const float bias : {0.f, 0.3f, -1.f}) {
      INFO("alpha " << alpha << ", bias " << bias);
      const ak::ReluPower relu{alpha, bias};
      check_against_formula(relu, rows, run(relu, rows, {41}));
      check_against_formula(relu, rows, run(relu, rows, {7, 1, 16, 17}));
    }
}

TEST_CASE("ReluPower: a row whose logits are all masked or at most b gives 0, never NaN",
          "[relu_power][masked]") {
  // Lane q: masked lanes (even), lanes whose logits are all <= b (odd); b itself weighs 0.
  const ak::ReluPower relu{2.f, 0.5f};
  const Rows rows =
      make_rows(12, [](int q, Index j) { return q % 2 == 0 ? kNegInf : 0.5f - 0.25f * float(j); });
  const Absorbed got = run(relu, rows, {5, 7});
  check_against_formula(relu, rows, got);
  for (int q = 0; q < W; ++q) {
    CHECK(got.row_sum[q] == 0.f);  // exact
    CHECK(got.factor[q] == 0.f);   // exact: 0, not 1 / 0
  }
  // A State that absorbed nothing (e.g. kv_len = 0) finalizes the same way.
  const ak::ReluPower::State empty = relu.begin();
  for (const float f : lanes_of(relu.finalize(empty))) CHECK(f == 0.f);
  for (const float l : lanes_of(relu.row_sum(empty))) CHECK(l == 0.f);
}

TEST_CASE("ReluPower: reference_row turns a NaN logit into NaN weights and sum",
          "[relu_power][nan]") {
  const ak::ReluPower relu{1.5f, 0.f};
  std::vector<double> ref{1.0, std::nan(""), 2.0};
  CHECK(std::isnan(relu.reference_row(ref.data(), 3)));
  for (const double w : ref) CHECK(std::isnan(w));
}

TEST_CASE("ReluPower: reference_row on a hand-checked row", "[relu_power][reference]") {
  // alpha 2, bias 0.5: logits {1.5, 0.5, -inf, 2.5, -4} -> {1, 0, 0, 4, 0}, sum 5.
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> row{1.5, 0.5, neg_inf, 2.5, -4.0};
  CHECK_THAT(ak::ReluPower(2.f, 0.5f).reference_row(row.data(), 5), WithinAbs(5.0, 1e-15));
  CHECK_THAT(row[0], WithinAbs(0.2, 1e-15));
  CHECK(row[1] == 0.0);  // exact: s == b
  CHECK(row[2] == 0.0);  // exact: masked
  CHECK_THAT(row[3], WithinAbs(0.8, 1e-15));
  CHECK(row[4] == 0.0);
  double untouched = 5.0;
  CHECK(ak::ReluPower(1.f, 0.f).reference_row(&untouched, 0) == 0.0);  // no key: sum 0
  CHECK(untouched == 5.0);
}

TEST_CASE("ReluPower: the constructor refuses alpha <= 0 or not finite, and a non-finite bias",
          "[relu_power][errors]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float alpha : {0.f, -0.f, -1.f, inf, -inf, kNaN}) {
    INFO("alpha " << alpha);
    CHECK_THROWS_MATCHES(ak::ReluPower(alpha, 0.f), ak::Error,
                         MessageMatches(ContainsSubstring("ReluPower.alpha") &&
                                        ContainsSubstring("finite and > 0")));
  }
  for (const float bias : {inf, -inf, kNaN}) {
    INFO("bias " << bias);
    CHECK_THROWS_MATCHES(ak::ReluPower(1.f, bias), ak::Error,
                         MessageMatches(ContainsSubstring("ReluPower.bias")));
  }
  CHECK_NOTHROW(ak::ReluPower(std::numeric_limits<float>::denorm_min(), -1e30f));
  const ak::ReluPower ok{2.f, 0.3f};
  CHECK(ok.alpha == 2.f);
  CHECK(ok.bias == 0.3f);
}
