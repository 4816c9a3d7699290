// reference::attention on cases small enough to work out by hand: the expected numbers
// below come from the formulas in the comments, not from any attnkit code. Inputs are
// doubles so that the hand values are exact up to f64 rounding. Also NoPosition
// (position/no_position.hpp), the default Position, which leaves Q and K as given.
#include <attnkit/core/error.hpp>
#include <attnkit/core/tensor.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/options.hpp>
#include <attnkit/position/no_position.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/matchers.hpp"

namespace ak = attnkit;
using ak::Index;

namespace {

constexpr double kHand = 1e-12;      // f64 reference vs a value worked out by hand
constexpr double kLseStored = 1e-6;  // the LSE output is float: half an ulp below 16
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

const auto kFull = ak::make_spec();
const auto kCausal = ak::make_spec(ak::Causal{});

// Dense [B, H, S, D] doubles with the given contents (row-major), and a view of them.
struct Dense {
  std::vector<double> data;
  ak::View<double> view;
  Dense(Index B, Index H, Index S, Index D, std::vector<double> values = {})
      : data(values.empty() ? std::vector<double>(static_cast<std::size_t>(B * H * S * D), 0.0)
                            : std::move(values)),
        view(ak::bhsd(data.data(), B, H, S, D)) {
    REQUIRE(static_cast<Index>(data.size()) == B * H * S * D);
  }
  ak::View<const double> cview() const { return view; }
  double at(Index b, Index h, Index s, Index d) const { return view.row(b, h, s)[d]; }
};

}  // namespace

TEST_CASE("reference::attention: one query, two keys, weights are softmax by hand", "[reference]") {
  // D = 1, scale 1: logits q.k = {0, ln 3}, weights {1/4, 3/4}; values {4, 8} -> 1 + 6 = 7.
  // LSE = ln(e^0 + e^ln3) = ln 4.
  const Dense q(1, 1, 1, 1, {1.0}), k(1, 1, 2, 1, {0.0, std::log(3.0)}), v(1, 1, 2, 1, {4.0, 8.0});
  Dense o(1, 1, 1, 1);
  float lse = 0.f;
  ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_scale(1.f).with_lse(&lse, 1));
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(7.0, kHand));
  CHECK_THAT(lse, WithinAbs(std::log(4.0), kLseStored));
}

TEST_CASE("reference::attention: the default scale is 1/sqrt(D)", "[reference]") {
  // D = 4, q = (1, 1, 1, 1), k1 = (ln3 / 2) * (1, 1, 1, 1): q.k1 = 2 ln 3, times 1/sqrt(4)
  // gives ln 3 again, so the output is 7 as above.
  const double h = std::log(3.0) / 2;
  const Dense q(1, 1, 1, 4, {1, 1, 1, 1}), k(1, 1, 2, 4, {0, 0, 0, 0, h, h, h, h}),
      v(1, 1, 2, 1, {4.0, 8.0});
  Dense o(1, 1, 1, 1);
  ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), o.view);
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(7.0, kHand));
}

TEST_CASE("reference::attention: one-hot values read back the weights", "[reference]") {
  // Logits {0, ln 2, ln 5}: weights {1/8, 2/8, 5/8}. V = identity [3, 3], so the output
  // row is the weight vector itself.
  const Dense q(1, 1, 1, 1, {1.0}), k(1, 1, 3, 1, {0.0, std::log(2.0), std::log(5.0)}),
      v(1, 1, 3, 3, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  Dense o(1, 1, 1, 3);
  ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_scale(1.f));
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(1.0 / 8, kHand));
  CHECK_THAT(o.at(0, 0, 0, 1), WithinAbs(2.0 / 8, kHand));
  CHECK_THAT(o.at(0, 0, 0, 2), WithinAbs(5.0 / 8, kHand));
}

TEST_CASE("reference::attention: a dominant logit selects its key's value", "[reference]") {
  // Causal, Lq = Lk = 3, logits q.k_j = 50 j: row i sees keys 0..i and key i outweighs the
  // others by e^50 (> 1e21), so with one-hot values row i reads e_i.
  const Dense q(1, 1, 3, 1, {1, 1, 1}), k(1, 1, 3, 1, {0, 50, 100}),
      v(1, 1, 3, 3, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  Dense o(1, 1, 3, 3);
  ak::reference::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_scale(1.f));
  for (Index i = 0; i < 3; ++i)
    for (Index c = 0; c < 3; ++c) {
      INFO("row " << i << " column " << c);
      CHECK_THAT(o.at(0, 0, i, c), WithinAbs(i == c ? 1.0 : 0.0, kHand));
    }
}

TEST_CASE("reference::attention: causal is bottom-right aligned when Lq < Lk",
          "[reference][causal]") {
  // Lq = 2, Lk = 4, all logits 0 (q = 0), values v_j = j. Default q_offset = Lk - Lq = 2:
  // row 0 sits at position 2 and averages keys 0..2 -> 1, LSE ln 3; row 1 at position 3
  // averages keys 0..3 -> 1.5, LSE ln 4. With q_offset 0 (top-left): row 0 sees key 0 only
  // -> 0, LSE 0; row 1 sees keys 0, 1 -> 0.5, LSE ln 2.
  const Dense q(1, 1, 2, 1), k(1, 1, 4, 1, {1, 2, 3, 4}), v(1, 1, 4, 1, {0, 1, 2, 3});
  Dense o(1, 1, 2, 1);
  float lse[2];
  ak::reference::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_lse(lse));
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(1.0, kHand));
  CHECK_THAT(o.at(0, 0, 1, 0), WithinAbs(1.5, kHand));
  CHECK_THAT(lse[0], WithinAbs(std::log(3.0), kLseStored));
  CHECK_THAT(lse[1], WithinAbs(std::log(4.0), kLseStored));

  ak::reference::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_q_offset(0).with_lse(lse));
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(0.0, kHand));
  CHECK_THAT(o.at(0, 0, 1, 0), WithinAbs(0.5, kHand));
  CHECK_THAT(lse[0], WithinAbs(0.0, kLseStored));
  CHECK_THAT(lse[1], WithinAbs(std::log(2.0), kLseStored));
}

TEST_CASE("reference::attention: a row with no visible key gives 0 and LSE -inf",
          "[reference][edge]") {
  // Causal with q_offset = -1: row 0 sits at position -1, before every key; row 1 at 0
  // sees key 0 only, so it reads v_0 = (3, -2) and its LSE is its one logit, 2 * 0.5 = 1.
  const Dense q(1, 1, 2, 1, {2, 2}), k(1, 1, 2, 1, {0.5, 0.5}), v(1, 1, 2, 2, {3, -2, 7, 7});
  Dense o(1, 1, 2, 2, {9, 9, 9, 9});
  float lse[2] = {1.f, 1.f};
  ak::reference::attention(kCausal, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_scale(1.f).with_q_offset(-1).with_lse(lse));
  CHECK(o.at(0, 0, 0, 0) == 0.0);  // exact: an empty row is 0, not NaN
  CHECK(o.at(0, 0, 0, 1) == 0.0);
  CHECK(lse[0] == kNegInf);  // exact
  CHECK_THAT(o.at(0, 0, 1, 0), WithinAbs(3.0, kHand));
  CHECK_THAT(o.at(0, 0, 1, 1), WithinAbs(-2.0, kHand));
  CHECK_THAT(lse[1], WithinAbs(1.0, kLseStored));
}

TEST_CASE("reference::attention: no keys at all gives 0 and LSE -inf", "[reference][edge]") {
  const Dense q(1, 2, 3, 4, std::vector<double>(24, 1.0)), k(1, 2, 0, 4), v(1, 2, 0, 2);
  Dense o(1, 2, 3, 2, std::vector<double>(12, 9.0));
  std::vector<float> lse(6, 1.f);
  ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_lse(lse));
  for (const double x : o.data) CHECK(x == 0.0);  // exact
  for (const float x : lse) CHECK(x == kNegInf);  // exact
}

TEST_CASE("reference::attention: softcap bends the logits before the softmax",
          "[reference][softcap]") {
  // Softcap{1}: logits {0, 100} become {0, tanh(100)} = {0, 1} (to f64 precision), so the
  // weights are {1, e} / (1 + e); values {0, 1} -> e / (1 + e), LSE = ln(1 + e).
  const Dense q(1, 1, 1, 1, {1.0}), k(1, 1, 2, 1, {0.0, 100.0}), v(1, 1, 2, 1, {0.0, 1.0});
  Dense o(1, 1, 1, 1);
  float lse = 0.f;
  const double e = std::exp(1.0);
  ak::reference::attention(ak::make_spec(ak::Softcap{1.f}), q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_scale(1.f).with_lse(&lse, 1));
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(e / (1 + e), kHand));
  CHECK_THAT(lse, WithinAbs(std::log(1 + e), kLseStored));
}

TEST_CASE("reference::attention: GQA query heads read their group's KV head", "[reference][gqa]") {
  // Hq = 4, Hkv = 2, BSHD layout: KV head 0 holds values 1, KV head 1 values 2, so query
  // heads 0, 1 must output 1 and heads 2, 3 output 2, whatever the weights.
  const Index B = 1, Hq = 4, Hkv = 2, Lq = 2, Lk = 3, D = 2;
  std::vector<double> qm(B * Lq * Hq * D), km(B * Lk * Hkv * D), vm(B * Lk * Hkv * D),
      om(B * Lq * Hq * D, -1.0);
  for (std::size_t i = 0; i < qm.size(); ++i) qm[i] = 0.1 * double(i % 7);
  for (std::size_t i = 0; i < km.size(); ++i) km[i] = 0.2 * double(i % 5);
  const auto v = ak::bshd(vm.data(), B, Lk, Hkv, D);
  for (Index j = 0; j < Lk; ++j)
    for (Index h = 0; h < Hkv; ++h)
      for (Index c = 0; c < D; ++c) v.row(0, h, j)[c] = double(h + 1);
  const auto o = ak::bshd(om.data(), B, Lq, Hq, D);
  ak::reference::attention(kFull, ak::bshd(qm.data(), B, Lq, Hq, D),
                           ak::bshd(km.data(), B, Lk, Hkv, D), v, o);
  for (Index h = 0; h < Hq; ++h)
    for (Index r = 0; r < Lq; ++r)
      for (Index c = 0; c < D; ++c) {
        INFO("head " << h << " row " << r);
        CHECK_THAT(o.row(0, h, r)[c], WithinAbs(h < 2 ? 1.0 : 2.0, kHand));
      }
}

TEST_CASE("reference::attention: the LSE output is laid out [batch, q_heads, q_len]",
          "[reference][lse]") {
  // Every logit of query (b, h, r) is c = 10 b + 3 h + r (q = c, k = 1, scale 1) over two
  // keys, so its LSE is c + ln 2: the value tells where it was written.
  const Index B = 2, H = 2, L = 3;
  Dense q(B, H, L, 1), o(B, H, L, 1);
  const Dense k(B, 1, 2, 1, {1, 1, 1, 1}), v(B, 1, 2, 1);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index r = 0; r < L; ++r) q.view.row(b, h, r)[0] = double(10 * b + 3 * h + r);
  std::vector<float> lse(B * H * L);
  ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), o.view,
                           ak::Options{}.with_scale(1.f).with_lse(lse));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index r = 0; r < L; ++r) {
        INFO("b " << b << " h " << h << " r " << r);
        CHECK_THAT(lse[static_cast<std::size_t>((b * H + h) * L + r)],
                   WithinAbs(double(10 * b + 3 * h + r) + std::log(2.0), kLseStored));
      }
}

TEST_CASE("reference::attention: float storage in and out", "[reference]") {
  // The same hand case as the first, with f32 views: ln 3 rounds to f32, so the output
  // is 7 to f32 precision.
  const float q[1] = {1.f}, k[2] = {0.f, std::log(3.f)}, v[2] = {4.f, 8.f};
  float o[1] = {0.f};
  ak::reference::attention(kFull, ak::bhsd(q, 1, 1, 1, 1), ak::bhsd(k, 1, 1, 2, 1),
                           ak::bhsd(v, 1, 1, 2, 1), ak::bhsd(o, 1, 1, 1, 1),
                           ak::Options{}.with_scale(1.f));
  CHECK_THAT(o[0], WithinAbs(7.0, 1e-5));
}

TEST_CASE("reference::attention: validates like attention() and writes nothing on error",
          "[reference][errors]") {
  const Dense q(1, 1, 2, 4), k(1, 1, 3, 2), v(1, 1, 3, 4);
  Dense o(1, 1, 2, 4, std::vector<double>(8, 9.0));
  CHECK_THROWS_MATCHES(
      ak::reference::attention(kFull, q.cview(), k.cview(), v.cview(), o.view), ak::Error,
      Catch::Matchers::MessageMatches(Catch::Matchers::ContainsSubstring("k.dim: expected 4")));
  for (const double x : o.data) CHECK(x == 9.0);  // exact: untouched
}

TEST_CASE("NoPosition: is the default Position and declares the Position slot",
          "[reference][position]") {
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec())::Position, ak::NoPosition>);
  STATIC_REQUIRE(std::is_same_v<decltype(ak::make_spec(ak::Causal{}))::Position, ak::NoPosition>);
  STATIC_REQUIRE(std::is_same_v<ak::NoPosition::slot, ak::PositionSlot>);
  STATIC_REQUIRE(std::is_empty_v<ak::NoPosition>);
}

TEST_CASE("reference::attention: logits beyond f32's range are infinite, as in the kernel",
          "[reference][nonfinite]") {
  // The kernel forms q . k in f32, so a product beyond FLT_MAX is +-inf there; the reference
  // takes it so too. One key, logit -4e40 (-inf): the query saw a key it cannot weigh, NaN
  // with LSE -inf (not a zero row, "no key"). A second key at logit 0 takes all the weight.
  // Logit +4e40 (+inf): NaN, LSE NaN, as for any +inf logit.
  const Dense q(1, 1, 1, 2, {2e20, 2e20}), far(1, 1, 1, 2, {-1e20, -1e20}),
      near(1, 1, 2, 2, {-1e20, -1e20, 0.0, 0.0}), up(1, 1, 1, 2, {1e20, 1e20}),
      v1(1, 1, 1, 2, {4.0, 8.0}), v2(1, 1, 2, 2, {4.0, 8.0, 1.0, 2.0});
  Dense o(1, 1, 1, 2);
  float lse = 0.f;
  const auto options = ak::Options{}.with_scale(1.f).with_lse(&lse, 1);
  ak::reference::attention(kFull, q.cview(), far.cview(), v1.cview(), o.view, options);
  CHECK(std::isnan(o.at(0, 0, 0, 0)));
  CHECK(std::isnan(o.at(0, 0, 0, 1)));
  CHECK(lse == kNegInf);
  ak::reference::attention(kFull, q.cview(), near.cview(), v2.cview(), o.view, options);
  CHECK_THAT(o.at(0, 0, 0, 0), WithinAbs(1.0, kHand));
  CHECK_THAT(o.at(0, 0, 0, 1), WithinAbs(2.0, kHand));
  CHECK_THAT(double(lse), WithinAbs(0.0, kLseStored));
  ak::reference::attention(kFull, q.cview(), up.cview(), v1.cview(), o.view, options);
  CHECK(std::isnan(o.at(0, 0, 0, 0)));
  CHECK(std::isnan(lse));
  // A query that sees no key is still the zero row with LSE -inf.
  ak::reference::attention(kCausal, q.cview(), far.cview(), v1.cview(), o.view,
                           options.with_q_offset(-1));
  CHECK(o.at(0, 0, 0, 0) == 0.0);
  CHECK(lse == kNegInf);
}
