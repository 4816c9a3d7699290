// attention() with the normalizers beyond plain softmax (Sigmoid, ReluPower, Softmax with
// sinks) against reference::attention(), under Full, Causal and windowed masks with and
// without Softcap, over ragged sizes, Lq != Lk with q_offset (rows that see nothing
// included), GQA, d 32 and 128, f32 and bf16 storage and 1 or 2 threads, row statistics
// included; then properties: l1 rows sum to 1, a sink scales a row's weights by one factor,
// empty rows give 0, the errors. Built three times: native ISA, x86-64-v2, scalar.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "support/attention_runner.hpp"

namespace ak = attnkit;
using ak::Causal;
using ak::Index;
using ak::SlidingWindow;
using ak::test::Case;
using ak::test::Layout;
using ak::test::Tensor;
namespace tol = ak::test::tol;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Row sums of ReluPower are sums of up to Lk positive f32 weights: relative tolerance.
constexpr double kRowSumRel = 1e-5;

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "B" << c.batch << " Hq" << c.q_heads << " Hkv" << c.kv_heads << " Lq" << c.q_len << " Lk"
    << c.kv_len << " d" << c.dim << " " << ak::test::name(c.layout) << " threads " << c.threads
    << " q_offset " << (c.q_offset ? std::to_string(*c.q_offset) : "default");
  return s.str();
}

template <class N>
constexpr bool is_sigmoid() {
  return std::is_same_v<N, ak::Sigmoid>;
}

// The inputs of one Case in storage T, V also as |V| (for the magnitude of sigmoid rows).
template <class T>
struct Inputs {
  Tensor<T> q, k, v, v_abs;
  Inputs(const Case& c, std::uint32_t seed)
      : q(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        v_abs(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()) {
    q.randomize(seed, c.stddev);
    k.randomize(seed + 1, c.stddev);
    v.randomize(seed + 2);
    v_abs.randomize(seed + 2);
    v_abs.for_each([](T& x) { x = T(std::abs(float(x))); });
  }
};

// Whether query row r (absolute position r + q_offset) of head h sees any key.
template <class Mask>
bool sees_a_key(const Mask& mask, const Case& c, Index b, Index h, Index r) {
  const Index offset = c.q_offset ? *c.q_offset : c.kv_len - c.q_len;
  for (Index j = 0; j < c.kv_len; ++j)
    if (mask.keep(b, h, r + offset, j)) return true;
  return false;
}

// The row statistic a row that sees no key must report.
template <class N>
float empty_row_stat(const N& n, Index h) {
  if constexpr (ak::detail::row_stat_kind<N>() == ak::RowStat::Sum) {
    return 0.f;
  } else if constexpr (is_sigmoid<N>()) {
    return std::numeric_limits<float>::quiet_NaN();  // no statistic: never compared
  } else if constexpr (std::is_same_v<N, ak::Softmax>) {
    return n.sinks.empty() ? kNegInf : n.sinks[static_cast<std::size_t>(h)];
  } else {
    return kNegInf;
  }
}

// attention() against reference::attention() on one Case. Outputs of normalized rules
// (softmax, ReLU^a) are convex combinations of V: absolute tol::kF32. A Sigmoid output is
// an unnormalized sum of up to Lk terms sigmoid(s + b) v_j: f32 rounding grows with
// sum_j w_ij |v_j| (the reference on |V|), not with the result, which can cancel to near 0;
// its tolerance is tol::kF32 times that magnitude (at least 1).
template <class T = float, class Spec>
void check(const std::string& what, const Spec& spec, const Case& c, std::uint32_t seed = 11) {
  using N = typename Spec::Normalizer;
  constexpr bool kHasStat = ak::detail::row_stat_kind<N>() != ak::RowStat::None;
  INFO(what << ", " << describe(c) << (std::is_same_v<T, float> ? ", f32" : ", bf16"));
  const Inputs<T> in(c, seed);
  const Index dv = c.dv();
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, dv);
  Tensor<double> expected(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  Tensor<double> magnitude(Layout::Bhsd, c.batch, c.q_heads, c.q_len, dv);
  const auto rows = static_cast<std::size_t>(c.rows());
  std::vector<float> stat(rows, 42.f), stat_expected(rows, 42.f);
  ak::Options options = c.options(), ref_options = c.options();
  if constexpr (kHasStat) {
    options = options.with_lse(stat.data());
    ref_options = ref_options.with_lse(stat_expected.data());
  }
  ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), expected.view,
                           ref_options);
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v_abs.cview(), magnitude.view,
                           c.options());

  double worst = 0.0, worst_stat = 0.0;  // error / allowed error
  Index empty = 0;
  bool empty_exact = true;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r) {
        const float* got = o.view.row(b, h, r);
        for (Index x = 0; x < dv; ++x) {
          const double allowed =
              tol::kF32 * (is_sigmoid<N>() ? std::max(1.0, magnitude.view.row(b, h, r)[x]) : 1.0);
          const double d = std::abs(double(got[x]) - expected.view.row(b, h, r)[x]);
          worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d / allowed);
        }
        const auto at = static_cast<std::size_t>((b * c.q_heads + h) * c.q_len + r);
        if constexpr (kHasStat) {
          const double e = stat_expected[at], g = stat[at];
          double d = e == g ? 0.0 : std::abs(g - e);
          if constexpr (ak::detail::row_stat_kind<N>() == ak::RowStat::Sum)
            d /= kRowSumRel * std::max(1.0, std::abs(e));
          else
            d /= tol::kLseF32 + std::numeric_limits<float>::epsilon() * std::abs(e);
          worst_stat = std::isnan(d) ? HUGE_VAL : std::max(worst_stat, d);
        }
        if (sees_a_key(spec.mask, c, b, h, r)) continue;
        ++empty;
        empty_exact = empty_exact && std::all_of(got, got + dv, [](float x) { return x == 0.f; });
        if constexpr (kHasStat)
          empty_exact = empty_exact && stat[at] == empty_row_stat(spec.normalizer, h) &&
                        stat_expected[at] == stat[at];
      }
  INFO("rows that see no key: " << empty);
  CHECK(worst <= 1.0);
  CHECK(worst_stat <= 1.0);
  CHECK(empty_exact);
}

// The normalizers of the grid, each with its name; per-head parameters sized for `heads`.
template <class Visit>
void for_each_normalizer(Index heads, Visit&& visit) {
  std::vector<float> biases, sinks;
  for (Index h = 0; h < heads; ++h) {
    biases.push_back(-1.f - 0.75f * float(h));
    sinks.push_back(float(h % 3) - 1.f);  // -1, 0 (off by one), 1
  }
  visit("Sigmoid{} (-log Lk)", ak::Sigmoid{});
  visit("Sigmoid{-log 2048}", ak::Sigmoid{-std::log(2048.f)});
  visit("Sigmoid::per_head", ak::Sigmoid::per_head(biases));
  visit("ReluPower{1, 0}", ak::ReluPower{1.f, 0.f});
  visit("ReluPower{2, 0.3}", ak::ReluPower{2.f, 0.3f});
  visit("ReluPower{1.5, 0.3}", ak::ReluPower{1.5f, 0.3f});
  visit("ReluPower{1.5, 0}", ak::ReluPower{1.5f, 0.f});
  visit("Softmax::with_sinks", ak::Softmax::with_sinks(sinks));
  visit("SoftplusL1 (LSSA)", ak::SoftplusL1{});
  visit("SoftplusL1Reweighted{15} (LSSAR)", ak::SoftplusL1Reweighted{});
  visit("SoftplusL1Reweighted{3}", ak::SoftplusL1Reweighted{3.f});
}

template <class T = float>
void check_grid(const Case& c) {
  for_each_normalizer(c.q_heads, [&](const char* name, const auto& n) {
    const std::string s(name);
    check<T>(s + ", Full", ak::make_spec(n), c);
    check<T>(s + ", Causal", ak::make_spec(Causal{}, n), c);
    check<T>(s + ", Causal & SlidingWindow{24, 0}",
             ak::make_spec(Causal{} & SlidingWindow{24, 0}, n), c);
    check<T>(s + ", Causal, Softcap{5}", ak::make_spec(Causal{}, ak::Softcap{5.f}, n), c);
    check<T>(s + ", Full, Softcap{20}", ak::make_spec(ak::Softcap{20.f}, n), c);
  });
}

}  // namespace

TEST_CASE("normalizers: attention matches the reference on ragged square shapes",
          "[attention][normalizers]") {
  Case c;
  c.q_len = c.kv_len = 77;
  c.dim = 32;
  c.layout = Layout::Bhsd;
  check_grid(c);
  c.q_len = c.kv_len = 1;  // one query, one key
  c.threads = 1;
  check_grid(c);
}

TEST_CASE("normalizers: attention matches the reference with Lq != Lk, q_offset and GQA",
          "[attention][normalizers][gqa]") {
  Case c;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.dim = 32;
  c.q_len = 37;
  c.kv_len = 133;  // bottom-right: the queries sit at the end
  c.threads = 1;
  check_grid(c);
  c.q_heads = 3;
  c.kv_heads = 1;
  c.q_len = 50;
  c.kv_len = 30;
  c.q_offset = -9;  // under Causal, rows 0..8 see no key
  c.threads = 2;
  check_grid(c);
}

TEST_CASE("normalizers: attention matches the reference at d 128", "[attention][normalizers]") {
  Case c;
  c.dim = 128;
  c.q_len = 33;
  c.kv_len = 70;
  c.q_offset = 5;
  check_grid(c);
}

TEST_CASE("normalizers: attention matches the reference with bf16 storage",
          "[attention][normalizers][bf16]") {
  // Inputs are rounded to bf16 before both read them: the f32 tolerance holds.
  Case c;
  c.q_len = c.kv_len = 65;
  c.dim = 32;
  c.q_heads = 4;
  c.kv_heads = 2;
  check_grid<Eigen::bfloat16>(c);
}

namespace {

// attention() on the Inputs of `c` (V replaced by ones when asked), output [B, Hq, Lq, Dv]
// in Bhsd and the row statistic when the normalizer has one.
template <class Spec>
ak::test::KernelResult run_on(const Spec& spec, const Case& c, bool v_ones = false,
                              std::uint32_t seed = 11) {
  Inputs<float> in(c, seed);
  if (v_ones) in.v.for_each([](float& x) { x = 1.f; });
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  ak::test::KernelResult r;
  ak::Options options = c.options();
  if constexpr (ak::detail::row_stat_kind<typename Spec::Normalizer>() != ak::RowStat::None) {
    r.lse.assign(static_cast<std::size_t>(c.rows()), 42.f);
    options = options.with_lse(r.lse.data());
  }
  ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
  r.out = std::move(o.memory);
  return r;
}

Case property_case() {
  Case c;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.q_len = 45;
  c.kv_len = 70;
  c.q_offset = -6;  // under Causal, rows 0..5 see no key
  c.dim = 32;
  return c;
}

}  // namespace

TEST_CASE("normalizers: ReluPower and Softmax rows sum to 1 with V = ones",
          "[attention][normalizers][properties]") {
  const Case c = property_case();
  const auto dv = static_cast<std::size_t>(c.dv());
  const auto check_sums = [&](const std::string& what, const auto& spec, auto positive) {
    INFO(what);
    const ak::test::KernelResult r = run_on(spec, c, true);
    Index full = 0;
    for (std::size_t row = 0; row < r.lse.size(); ++row) {
      INFO("row " << row << ", statistic " << r.lse[row]);
      const bool sees = positive(r.lse[row]);
      full += sees ? 1 : 0;
      for (std::size_t x = 0; x < dv; ++x) {
        const float got = r.out[row * dv + x];
        if (sees)
          CHECK(std::abs(got - 1.f) <= tol::kF32);
        else
          CHECK(got == 0.f);  // exact
      }
    }
    CHECK(full > 0);
    CHECK(full < c.rows());  // some rows see nothing: both branches ran
  };
  const auto has_weight = [](float sum) { return sum > 0.f; };
  const auto has_key = [](float lse) { return lse != kNegInf; };
  check_sums("ReluPower{1, 0.3}", ak::make_spec(Causal{}, ak::ReluPower{1.f, 0.3f}), has_weight);
  check_sums("ReluPower{2, 0}", ak::make_spec(Causal{}, ak::ReluPower{2.f, 0.f}), has_weight);
  check_sums("Softmax", ak::make_spec(Causal{}), has_key);
}

TEST_CASE("normalizers: a sink scales every weight of a row by exp(lse - lse_sink)",
          "[attention][normalizers][properties][sinks]") {
  const Case c = property_case();
  const auto dv = static_cast<std::size_t>(c.dv());
  const std::vector<float> sinks{-1.f, 0.f, 1.5f, 4.f};
  const auto plain = run_on(ak::make_spec(Causal{} & SlidingWindow{30, 0}), c);
  const auto sunk =
      run_on(ak::make_spec(Causal{} & SlidingWindow{30, 0}, ak::Softmax::with_sinks(sinks)), c);
  for (std::size_t row = 0; row < plain.lse.size(); ++row) {
    const float sink = sinks[row / static_cast<std::size_t>(c.q_len)];
    INFO("row " << row << ", lse " << plain.lse[row] << ", with sink " << sunk.lse[row]);
    if (plain.lse[row] == kNegInf) {  // sees nothing: 0 and LSE = sink
      CHECK(sunk.lse[row] == sink);
      for (std::size_t x = 0; x < dv; ++x) CHECK(sunk.out[row * dv + x] == 0.f);
      continue;
    }
    // log(exp(lse) + exp(sink)), computed here.
    const double m = std::max<double>(plain.lse[row], sink);
    const double lse_sink = m + std::log(std::exp(plain.lse[row] - m) + std::exp(sink - m));
    CHECK(std::abs(sunk.lse[row] - lse_sink) <= 2 * tol::kLseF32);
    const double factor = std::exp(double(plain.lse[row]) - double(sunk.lse[row]));
    for (std::size_t x = 0; x < dv; ++x)
      CHECK(std::abs(sunk.out[row * dv + x] - plain.out[row * dv + x] * factor) <= tol::kF32);
  }
}

TEST_CASE("normalizers: Sigmoid with a bias of -1e30 gives exactly 0",
          "[attention][normalizers][properties][sigmoid]") {
  Case c = property_case();
  c.q_offset.reset();
  for (const auto& r : {run_on(ak::make_spec(ak::Sigmoid{-1e30f}), c),
                        run_on(ak::make_spec(Causal{}, ak::Sigmoid{-1e30f}), c)})
    CHECK(std::all_of(r.out.begin(), r.out.end(), [](float x) { return x == 0.f; }));
}

TEST_CASE("normalizers: Sigmoid{} uses -log(Lk) of the call", "[attention][normalizers][sigmoid]") {
  Case c = property_case();
  for (const Index lk : {Index{45}, Index{70}, Index{300}}) {
    c.kv_len = lk;
    INFO("Lk " << lk);
    const auto by_default = run_on(ak::make_spec(Causal{}, ak::Sigmoid{}), c);
    const auto fixed =
        run_on(ak::make_spec(Causal{}, ak::Sigmoid{-std::log(static_cast<float>(lk))}), c);
    CHECK(by_default.out == fixed.out);  // the same bias: the same f32 computation
  }
}

TEST_CASE("normalizers: rows that see no key give 0, never NaN, with every normalizer",
          "[attention][normalizers][masked]") {
  Case c = property_case();
  c.q_offset = -c.q_len;  // under Causal, row 0..Lq-1 at positions -Lq..-1: nothing visible
  for_each_normalizer(c.q_heads, [&](const char* name, const auto& n) {
    INFO(name);
    const auto r = run_on(ak::make_spec(Causal{}, n), c);
    CHECK(std::all_of(r.out.begin(), r.out.end(), [](float x) { return x == 0.f; }));
    for (std::size_t row = 0; row < r.lse.size(); ++row)
      CHECK(r.lse[row] == empty_row_stat(n, static_cast<Index>(row) / c.q_len));
  });
}

TEST_CASE("normalizers: an lse buffer with Sigmoid throws and writes nothing",
          "[attention][normalizers][errors]") {
  using Catch::Matchers::ContainsSubstring;
  using Catch::Matchers::MessageMatches;
  const Case c = property_case();
  const Inputs<float> in(c, 3);
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  o.for_each([](float& x) { x = 42.f; });
  std::vector<float> lse(static_cast<std::size_t>(c.rows()), 7.f);
  const auto call = [&](auto&& f) {
    CHECK_THROWS_MATCHES(
        f(), ak::Error,
        MessageMatches(ContainsSubstring("lse") && ContainsSubstring("no row statistic")));
  };
  call([&] {
    ak::attention(ak::make_spec(ak::Sigmoid{}), in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                  ak::Options{}.with_lse(lse.data()));
  });
  call([&] {
    ak::reference::attention(ak::make_spec(ak::Sigmoid{}), in.q.cview(), in.k.cview(), in.v.cview(),
                             o.view, ak::Options{}.with_lse(lse.data()));
  });
  CHECK(std::all_of(lse.begin(), lse.end(), [](float x) { return x == 7.f; }));
  bool intact = true;
  o.for_each([&](float& x) { intact = intact && x == 42.f; });
  CHECK(intact);
}

TEST_CASE("normalizers: per-head vectors of the wrong size throw, naming the field",
          "[attention][normalizers][errors]") {
  using Catch::Matchers::ContainsSubstring;
  using Catch::Matchers::MessageMatches;
  const Case c = property_case();  // 4 query heads
  const Inputs<float> in(c, 3);
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  o.for_each([](float& x) { x = 42.f; });
  const auto expect_error = [&](const auto& spec, const char* field) {
    INFO(field);
    CHECK_THROWS_MATCHES(
        ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view), ak::Error,
        MessageMatches(ContainsSubstring(field) && ContainsSubstring("q_heads = 4")));
    CHECK_THROWS_MATCHES(
        ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view), ak::Error,
        MessageMatches(ContainsSubstring(field)));
  };
  expect_error(ak::make_spec(ak::Softmax::with_sinks({0.f, 0.f})), "Softmax.sinks.size()");
  expect_error(ak::make_spec(Causal{}, ak::Softmax::with_sinks({0.f, 0.f, 0.f, 0.f, 0.f})),
               "Softmax.sinks.size()");
  expect_error(ak::make_spec(ak::Sigmoid::per_head({0.f})), "Sigmoid.head_bias.size()");
  expect_error(ak::make_spec(Causal{}, ak::Sigmoid::per_head(std::vector<float>(8, 0.f))),
               "Sigmoid.head_bias.size()");
  bool intact = true;
  o.for_each([&](float& x) { intact = intact && x == 42.f; });
  CHECK(intact);
}

TEST_CASE("normalizers: NaN in one query row gives NaN in that row only",
          "[attention][normalizers][nonfinite]") {
  // ReluPower included: its NaN check once used `a != a`, false for NaN in xsimd 8.1's
  // AVX and AVX-512 compares, and the row came out 0 like an empty one.
  const Case c = property_case();
  const auto dv = static_cast<std::size_t>(c.dv());
  const Index h = 1, r = 20;  // sees keys under Causal (position 14)
  const auto poisoned_row = static_cast<std::size_t>(h * c.q_len + r);
  const auto check_one = [&](const char* what, const auto& spec) {
    INFO(what);
    const auto clean = run_on(spec, c);
    Inputs<float> in(c, 11);
    in.q.view.row(0, h, r)[3] = std::numeric_limits<float>::quiet_NaN();
    Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
    std::vector<float> lse(clean.lse.size(), 42.f);
    ak::Options options = c.options();
    if (!lse.empty()) options = options.with_lse(lse.data());
    ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
    for (std::size_t row = 0; row < static_cast<std::size_t>(c.rows()); ++row) {
      INFO("row " << row);
      for (std::size_t x = 0; x < dv; ++x) {
        const float got = o.memory[row * dv + x];
        if (row == poisoned_row)
          CHECK(std::isnan(got));
        else
          CHECK(got == clean.out[row * dv + x]);  // bit for bit: lanes are independent
      }
      if (!lse.empty())
        CHECK((row == poisoned_row ? std::isnan(lse[row]) : lse[row] == clean.lse[row]));
    }
  };
  check_one("Sigmoid{}", ak::make_spec(Causal{}, ak::Sigmoid{}));
  check_one("Softmax", ak::make_spec(Causal{}));
  check_one("Softmax::with_sinks",
            ak::make_spec(Causal{}, ak::Softmax::with_sinks({1.f, 2.f, 0.f, -1.f})));
  check_one("ReluPower{1.5, 0}", ak::make_spec(Causal{}, ak::ReluPower{1.5f, 0.f}));
}
