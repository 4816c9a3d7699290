// Alibi, the score mod s -> s - slope_h |i - j|: Alibi::standard() gives the authors' slopes
// (a transcription of their get_slopes, here), apply_tile() agrees with modify() on tiles at
// any position, attention() with Alibi matches reference::attention() under Full, Causal and
// windowed masks, q_offset, GQA, Softmax and Sigmoid, f32 and bf16, 1 and 2 threads; with
// q = 0 the softmax weights and LSE are the closed forms of the distance; wrong slopes throw.
// Built for the native ISA and x86-64-v2 (ATTNKIT_PATH_TESTS; the aarch64 preset too).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/core/error.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/alibi.hpp>
#include <attnkit/simd/simd.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/error_checks.hpp"
#include "support/matchers.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::Alibi;

namespace {

// get_slopes of the ALiBi repository (ofirpress/attention_with_linear_biases), line by line:
//   def get_slopes_power_of_2(n):
//       start = 2 ** (-2 ** -(math.log2(n) - 3)); ratio = start
//       return [start * ratio ** i for i in range(n)]
//   if math.log2(n).is_integer(): return get_slopes_power_of_2(n)
//   closest = 2 ** math.floor(math.log2(n))
//   return get_slopes_power_of_2(closest) + get_slopes(2 * closest)[0::2][:n - closest]
std::vector<double> slopes_power_of_2(int n) {
  const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(n)) - 3.0)));
  const double ratio = start;
  std::vector<double> r;
  for (int i = 0; i < n; ++i) r.push_back(start * std::pow(ratio, double(i)));
  return r;
}

std::vector<double> get_slopes(int n) {
  const double l = std::log2(double(n));
  if (l == std::floor(l)) return slopes_power_of_2(n);
  const int closest = 1 << int(std::floor(l));
  std::vector<double> r = slopes_power_of_2(closest);
  const std::vector<double> higher = get_slopes(2 * closest);
  for (std::size_t i = 0; i < higher.size() && int(r.size()) < n; i += 2) r.push_back(higher[i]);
  return r;
}

// attention() against reference::attention() on one Case, with the named tolerances of
// support/reference_check.hpp (as in test_attention_normalizers.cpp): softmax outputs within
// tol::kF32 and LSE within tol::kLseF32 (+ eps |lse|); a Sigmoid output is an unnormalized
// sum, within tol::kF32 times its magnitude sum_j w_ij |v_j| (the reference on |V|).
template <class T = float, class Spec>
void check(const std::string& what, const Spec& spec, const Case& c) {
  ak::test::check_attention<T>(what, spec, c, 5);
}

// Slopes of the grid for `heads` query heads: the authors', and a hand-made set with a
// steep slope (1: weights fall by e per position), a zero one (plain attention) and others.
std::vector<float> custom_slopes(Index heads) {
  const float pick[] = {1.f, 0.f, 0.3f, 0.01f, 0.7f};
  std::vector<float> s;
  for (Index h = 0; h < heads; ++h) s.push_back(pick[h % 5]);
  return s;
}

template <class T = float>
void check_grid(const Case& c) {
  for (const Alibi& alibi : {Alibi::standard(c.q_heads), Alibi(custom_slopes(c.q_heads))}) {
    const std::string name = alibi.slopes[1] == 0.f ? "Alibi(custom)" : "Alibi::standard";
    for (const bool sigmoid : {false, true}) {
      const auto run = [&](const std::string& mask, const auto& m) {
        if (sigmoid)
          check<T>(name + ", Sigmoid{}, " + mask, ak::make_spec(m, alibi, ak::Sigmoid{}), c);
        else
          check<T>(name + ", Softmax, " + mask, ak::make_spec(m, alibi), c);
      };
      run("Full", ak::Full{});
      run("Causal", Causal{});
      run("Causal & SlidingWindow{40, 0}", Causal{} & ak::SlidingWindow{40, 0});
    }
  }
}

}  // namespace

TEST_CASE("Alibi: standard slopes are the authors' get_slopes", "[alibi]") {
  for (const int heads : {1, 2, 4, 6, 8, 12, 16, 20, 32}) {
    const std::vector<double> expected = get_slopes(heads);
    const Alibi alibi = Alibi::standard(heads);
    INFO("heads " << heads);
    REQUIRE(alibi.slopes.size() == expected.size());
    for (std::size_t h = 0; h < expected.size(); ++h) {
      INFO("head " << h << ": " << alibi.slopes[h] << " vs " << expected[h]);
      // The f32 rounding of an f64 value: within one ulp.
      CHECK(std::abs(alibi.slopes[h] - expected[h]) <=
            std::numeric_limits<float>::epsilon() * expected[h]);
    }
  }
  // Two values by hand: H = 8 starts at 1/2, H = 6 takes 2^-8/4 = 2^-2 and then 2^-1.
  CHECK_THAT(Alibi::standard(8).slopes[0], WithinRel(0.5f, 1e-7f));
  CHECK_THAT(Alibi::standard(6).slopes[3], WithinRel(std::exp2(-8.f), 1e-7f));
  CHECK_THAT(Alibi::standard(6).slopes[4], WithinRel(std::exp2(-1.f), 1e-7f));
  CHECK_THAT(Alibi::standard(6).slopes[5], WithinRel(std::exp2(-3.f), 1e-7f));
}

TEST_CASE("Alibi: apply_tile equals modify at any tile position", "[alibi]") {
  const Alibi alibi({0.5f, 0.0625f, 1.f / 3.f});
  const Index keys = 9, lanes = 3 * ak::simd::kWidth, ld = lanes + 5;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-8.f, 8.f);
  // Queries before, across and after the keys, negative positions included.
  for (const Index q_begin : {Index{-20}, Index{0}, Index{5}, Index{100}})
    for (const Index h : {Index{0}, Index{1}, Index{2}}) {
      std::vector<float> s(static_cast<std::size_t>(keys * ld));
      for (float& x : s) x = dist(rng);
      const std::vector<float> before = s;
      const Index k_begin = 3;
      alibi.apply_tile(s.data(), keys, lanes, ld, ak::ScoreTile{0, h, q_begin, k_begin});
      for (Index r = 0; r < keys; ++r)
        for (Index l = 0; l < ld; ++l) {
          const auto at = static_cast<std::size_t>(r * ld + l);
          INFO("q_begin " << q_begin << " head " << h << " key " << r << " lane " << l);
          if (l >= lanes) {
            CHECK(s[at] == before[at]);  // exact: padding columns are not touched
            continue;
          }
          // By hand, not through modify(): s - slope |i - j|. One rounding in f32 with an FMA;
          // SSE4 has none, so the product rounds too: bound the error by the operands' size.
          const double i = double(q_begin + l), j = double(k_begin + r);
          const double bias = double(alibi.slopes[std::size_t(h)]) * std::abs(i - j);
          const double expected = double(before[at]) - bias;
          CHECK(std::abs(double(s[at]) - expected) <=
                double(std::numeric_limits<float>::epsilon()) * (std::abs(expected) + 0.5 * bias));
          CHECK(std::abs(alibi.modify(before[at], 0, h, q_begin + l, k_begin + r) - expected) <=
                1e-12 * std::max(1.0, std::abs(expected)));
        }
    }
}

TEST_CASE("Alibi: attention matches the reference on ragged shapes, q_offset and GQA",
          "[alibi][attention][gqa]") {
  // Under Full, the q_offset -9 case has negative query positions.
  ak::test::for_each_ragged_case([](const Case& c) { check_grid(c); });
  // queries in the middle of the keys: both signs of i - j under Full
  check_grid(Case{}.lengths(33, 70).heads(6, 3).dims(128).at_offset(5));
}

TEST_CASE("Alibi: attention matches the reference with bf16 storage", "[alibi][attention][bf16]") {
  // Inputs are rounded to bf16 before both read them: the f32 tolerance holds.
  Case c = Case{}.lengths(65, 65).heads(4, 2).dims(32);
  check_grid<Eigen::bfloat16>(c);
  c.threads = 1;
  check_grid<Eigen::bfloat16>(c);
}

TEST_CASE("Alibi: with q = 0 the softmax weights depend only on i - j",
          "[alibi][attention][properties]") {
  // All dot products 0: the logits are the bias alone. V = identity ([Lk, Lk]), so output
  // row i is the weight row w_i. Under Causal & SlidingWindow{W, 0} every row at position
  // >= W sees W + 1 keys at distances 0..W: w_ij = e^(-m (i - j)) / sum_d e^(-m d), and the
  // LSE is log sum_d e^(-m d) -- the same for every row: the authors' slope * j form would
  // shift each row's LSE by slope * i.
  constexpr Index kWindow = 24;
  // bottom-right: the first query is at position 56 >= kWindow
  Case c = Case{}.lengths(40, 96).heads(4, 2).dims(32);
  c.value_dim = c.kv_len;
  c.layout = Layout::Bhsd;
  const std::vector<double> slopes = get_slopes(int(c.q_heads));
  Tensor<float> q(c.layout, c.batch, c.q_heads, c.q_len, c.dim);  // zeros
  Tensor<float> k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  k.randomize(9);
  Tensor<float> v(c.layout, c.batch, c.kv_heads, c.kv_len, c.kv_len);
  for (Index h = 0; h < c.kv_heads; ++h)
    for (Index j = 0; j < c.kv_len; ++j) v.view.row(0, h, j)[j] = 1.f;
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, c.kv_len);
  std::vector<float> lse(static_cast<std::size_t>(c.rows()));
  for (const int threads : {1, 2}) {
    ak::attention(
        ak::make_spec(Causal{} & ak::SlidingWindow{kWindow, 0}, Alibi::standard(c.q_heads)),
        q.cview(), k.cview(), v.cview(), o.view, ak::Options{}.with_threads(threads).with_lse(lse));
    for (Index h = 0; h < c.q_heads; ++h) {
      double sum = 0.0;
      for (Index d = 0; d <= kWindow; ++d) sum += std::exp(-slopes[std::size_t(h)] * double(d));
      for (Index r = 0; r < c.q_len; ++r) {
        const Index i = r + c.kv_len - c.q_len;
        INFO("threads " << threads << " head " << h << " query " << i);
        CHECK(std::abs(lse[std::size_t(h * c.q_len + r)] - std::log(sum)) <= tol::kLseF32);
        double worst = 0.0, worst_shift = 0.0;
        for (Index j = 0; j < c.kv_len; ++j) {
          const float w = o.view.row(0, h, r)[j];
          const double expected = j <= i && i - j <= kWindow
                                      ? std::exp(-slopes[std::size_t(h)] * double(i - j)) / sum
                                      : 0.0;
          worst = std::max(worst, std::abs(w - expected));
          // The same distance one row up: the same weight, whichever row.
          if (r > 0 && j > 0)
            worst_shift =
                std::max(worst_shift, double(std::abs(w - o.view.row(0, h, r - 1)[j - 1])));
        }
        CHECK(worst <= tol::kF32);
        CHECK(worst_shift <= tol::kF32);
      }
    }
  }
}

TEST_CASE("Alibi: slopes of the wrong size or not finite throw, and nothing is written",
          "[alibi][errors]") {
  Case c = Case{}.lengths(20, 20).heads(4, 2).dims(32);
  Tensor<float> q(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  Tensor<float> k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  Tensor<float> v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  o.fill(42.f);
  std::vector<float> lse(static_cast<std::size_t>(c.rows()), 7.f);
  const auto options = ak::Options{}.with_lse(lse);
  for (const Index heads : {Index{2}, Index{8}}) {
    const auto spec = ak::make_spec(Causal{}, Alibi::standard(heads));
    INFO("slopes for " << heads << " heads, 4 query heads");
    ak::test::check_error(
        [&] { ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view, options); },
        {"Alibi.slopes.size()", "q_heads = 4"});
    ak::test::check_refused(
        [&] { ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), o.view, options); },
        {"Alibi.slopes.size()"}, {&lse}, 7.f);
  }
  CHECK(o.holds(42.f));

  ak::test::check_error([] { (void)Alibi({0.5f, ak::test::kNaN}); }, {"Alibi.slopes[1]"});
  ak::test::check_error([] { (void)Alibi({ak::test::kInf}); }, {"Alibi.slopes[0]"});
  CHECK_THROWS_AS(Alibi::standard(0), ak::Error);
}
