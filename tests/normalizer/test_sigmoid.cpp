// Sigmoid, the unnormalized normalizer: absorb() turns each logit into sigmoid(s + b) in
// place, lane by lane, with nothing to rescale and nothing to divide by; the bias is the
// call's -log(kv_len) by default, a fixed value, or one per query head; there is no row
// statistic. Blocks are [keys, ld] with one query per lane, as the kernel hands them over.
#include <attnkit/core/error.hpp>
#include <attnkit/normalizer/faces.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
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
using ak::RowContext;

namespace {

using namespace attnkit::test::lanes;  // W, kLd, make_rows, make_block, at, lanes_of

// sigmoid in f32 via exp2 and one division: a few ulps of a weight in (0, 1).
constexpr double kWeightTol = 1e-6;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// absorb() of `block` with the rows of ctx; checks every lane against sigmoid(s + b) in
// double, the padding untouched and the returned factor 1.
void check_absorb(const ak::Sigmoid& sig, const RowContext& ctx, double b, Index keys,
                  std::vector<float> block) {
  const std::vector<float> logits = block;
  ak::Sigmoid::State st = sig.begin(ctx);
  for (const float f : lanes_of(sig.absorb(st, block.data(), keys, kLd))) CHECK(f == 1.f);
  for (Index j = 0; j < keys; ++j) {
    for (int q = 0; q < W; ++q) {
      INFO("key " << j << ", lane " << q << ", logit " << at(logits, j, q) << ", bias " << b);
      CHECK_THAT(at(block, j, q), WithinAbs(sigmoid(double(at(logits, j, q)) + b), kWeightTol));
    }
    for (Index c = W; c < kLd; ++c) CHECK(std::isnan(at(block, j, static_cast<int>(c))));
  }
  for (const float f : lanes_of(sig.finalize(st))) CHECK(f == 1.f);  // no normalization
}

}  // namespace

TEST_CASE("Sigmoid: traits say no rescale and no row statistic", "[sigmoid][traits]") {
  STATIC_REQUIRE_FALSE(ak::detail::rescales<ak::Sigmoid>());
  STATIC_REQUIRE(ak::detail::row_stat_kind<ak::Sigmoid>() == ak::RowStat::None);
  STATIC_REQUIRE(ak::detail::has_context_begin<ak::Sigmoid>::value);
  STATIC_REQUIRE(ak::detail::has_context_reference<ak::Sigmoid>::value);
  // The other normalizers, for contrast: Softmax keeps the defaults.
  STATIC_REQUIRE(ak::detail::rescales<ak::Softmax>());
  STATIC_REQUIRE(ak::detail::row_stat_kind<ak::Softmax>() == ak::RowStat::LogSumExp);
  STATIC_REQUIRE_FALSE(ak::detail::rescales<ak::ReluPower>());
  STATIC_REQUIRE(ak::detail::row_stat_kind<ak::ReluPower>() == ak::RowStat::Sum);
}

TEST_CASE("Sigmoid: absorb gives sigmoid(s + b) for each logit, factor 1", "[sigmoid][absorb]") {
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.f, 4.f);
  const auto block = make_block(29, [&](int, Index) { return dist(rng); });
  check_absorb(ak::Sigmoid{0.f}, {}, 0.0, 29, block);
  check_absorb(ak::Sigmoid{-2.5f}, {}, -2.5, 29, block);
  check_absorb(ak::Sigmoid{3.f}, {}, 3.0, 29, block);
}

TEST_CASE("Sigmoid: saturating logits give weights 0 and 1, never NaN", "[sigmoid][range]") {
  // s + b beyond +-100: 2^(-(s + b) log2 e) overflows to inf or underflows to 0.
  const auto block = make_block(
      6, [](int q, Index j) { return (j % 2 == 0 ? -1.f : 1.f) * (100.f + 1e3f * float(j + q)); });
  ak::Sigmoid::State st = ak::Sigmoid{0.f}.begin(RowContext{});
  auto w = block;
  ak::Sigmoid{0.f}.absorb(st, w.data(), 6, kLd);
  for (Index j = 0; j < 6; ++j)
    for (int q = 0; q < W; ++q) CHECK_THAT(at(w, j, q), WithinAbs(j % 2 == 0 ? 0.0 : 1.0, 1e-30));
}

TEST_CASE("Sigmoid: a masked -inf logit weighs exactly 0, a NaN logit gives NaN",
          "[sigmoid][masked][nan]") {
  // Lane q: key 0 masked, key 1 NaN in odd lanes, key 2 a plain logit.
  auto block = make_block(3, [](int q, Index j) {
    return j == 0 ? kNegInf : j == 1 ? (q % 2 == 1 ? kNaN : 0.5f) : -1.f;
  });
  const ak::Sigmoid sig{-1.f};
  ak::Sigmoid::State st = sig.begin(RowContext{});
  sig.absorb(st, block.data(), 3, kLd);
  for (int q = 0; q < W; ++q) {
    INFO("lane " << q);
    CHECK(at(block, 0, q) == 0.f);  // exact
    if (q % 2 == 1)
      CHECK(std::isnan(at(block, 1, q)));
    else
      CHECK_THAT(at(block, 1, q), WithinAbs(sigmoid(-0.5), kWeightTol));
    CHECK_THAT(at(block, 2, q), WithinAbs(sigmoid(-2.0), kWeightTol));  // neighbours unharmed
  }
}

TEST_CASE("Sigmoid: the default bias is -log(kv_len) of the call, from the RowContext",
          "[sigmoid][bias]") {
  const ak::Sigmoid sig;
  for (const Index n : {Index{1}, Index{7}, Index{128}, Index{2048}, Index{100000}}) {
    INFO("kv_len " << n);
    const RowContext ctx{0, 1, n};
    CHECK_THAT(sig.bias_for(ctx), WithinRel(-std::log(double(n)), 1e-6));
    // A logit of 0 weighs sigmoid(-log n) = 1 / (1 + n).
    const auto block = make_block(2, [](int, Index j) { return j == 0 ? 0.f : 1.25f; });
    check_absorb(sig, ctx, -std::log(double(n)), 2, block);
    std::vector<double> row{0.0};
    sig.reference_row(row.data(), 1, ctx);
    CHECK_THAT(row[0], WithinRel(1.0 / (1.0 + double(n)), 1e-6));
  }
  // No key at all: the bias is 0 (log 0 is never taken); nothing is absorbed anyway.
  CHECK(sig.bias_for(RowContext{0, 0, 0}) == 0.f);
}

TEST_CASE("Sigmoid: a fixed bias ignores kv_len; a per-head bias overrides both",
          "[sigmoid][bias]") {
  const ak::Sigmoid fixed{-std::log(2048.f)};
  CHECK(fixed.bias_for(RowContext{0, 0, 5}) == -std::log(2048.f));
  CHECK(fixed.bias_for(RowContext{3, 2, 99}) == -std::log(2048.f));

  ak::Sigmoid heads = ak::Sigmoid::per_head({0.5f, -1.f, -3.f});
  heads.bias = 10.f;  // a fixed bias set as well loses to the per-head one
  const auto block =
      make_block(5, [](int q, Index j) { return 0.3f * float(j) - 0.2f * float(q); });
  for (Index h = 0; h < 3; ++h) {
    INFO("head " << h);
    const RowContext ctx{1, h, 40};
    CHECK(heads.bias_for(ctx) == heads.head_bias[static_cast<std::size_t>(h)]);
    check_absorb(heads, ctx, heads.head_bias[static_cast<std::size_t>(h)], 5, block);
  }
}

TEST_CASE("Sigmoid: reference_row gives sigmoid(s + b) in double and no statistic",
          "[sigmoid][reference]") {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> row{0.0, 2.0, neg_inf, -3.0, std::nan("")};
  const ak::Sigmoid sig = ak::Sigmoid::per_head({0.f, 1.f});
  CHECK(std::isnan(sig.reference_row(row.data(), 5, RowContext{0, 1, 5})));  // no statistic
  CHECK_THAT(row[0], WithinAbs(sigmoid(1.0), 1e-15));
  CHECK_THAT(row[1], WithinAbs(sigmoid(3.0), 1e-15));
  CHECK(row[2] == 0.0);  // exact: masked
  CHECK_THAT(row[3], WithinAbs(sigmoid(-2.0), 1e-15));
  CHECK(std::isnan(row[4]));
}

TEST_CASE("Sigmoid: validate refuses a per-head bias that does not cover the heads",
          "[sigmoid][errors]") {
  const ak::Sigmoid heads = ak::Sigmoid::per_head({0.f, 1.f, 2.f});
  CHECK_NOTHROW(heads.validate(4, 4, 0, 1, 3));
  ak::test::check_error([&] { heads.validate(4, 4, 0, 1, 4); },
                        {"Sigmoid.head_bias.size()", "q_heads = 4", "got 3"});
  CHECK_THROWS_AS(heads.validate(4, 4, 0, 1, 2), ak::Error);  // too many is wrong too
  CHECK_NOTHROW(ak::Sigmoid{}.validate(4, 4, 0, 1, 16));      // no per-head bias: any heads
  CHECK_NOTHROW(ak::Sigmoid{-1.f}.validate(4, 4, 0, 1, 16));
}

TEST_CASE("Sigmoid: a bias that is NaN or infinite throws naming the bias", "[sigmoid][errors]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {kNaN, inf, -inf}) {
    INFO("bias " << bad);
    CHECK_THROWS_MATCHES(
        ak::Sigmoid{bad}, ak::Error,
        MessageMatches(ContainsSubstring("Sigmoid.bias") && ContainsSubstring("finite")));
    CHECK_THROWS_MATCHES(ak::Sigmoid::per_head({0.f, bad}), ak::Error,
                         MessageMatches(ContainsSubstring("Sigmoid.head_bias[1]")));
    ak::Sigmoid set_later;  // the members are public: validate() checks them too
    set_later.bias = bad;
    CHECK_THROWS_MATCHES(set_later.validate(4, 4, 0, 1, 2), ak::Error,
                         MessageMatches(ContainsSubstring("Sigmoid.bias")));
  }
  CHECK_NOTHROW(ak::Sigmoid{-1e30f});
  CHECK_NOTHROW(ak::Sigmoid::per_head({0.f, -3.f}).validate(4, 4, 0, 1, 2));
}
