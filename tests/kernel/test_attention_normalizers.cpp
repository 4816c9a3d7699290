// attention() with every normalizer of the catalogue and its parameter corners
// (support/catalogue.hpp: Softmax plain and with sinks, Sigmoid, ReluPower, LSSA, LSSAR)
// against reference::attention(), under Full, Causal and windowed masks with and without
// Softcap, over ragged sizes, Lq != Lk with q_offset (rows that see nothing
// included), GQA, d 32 and 128, f32 and bf16 storage and 1 or 2 threads, row statistics
// included; then properties: l1 rows sum to 1, a sink scales a row's weights by one factor,
// empty rows give 0, the errors. Built natively (the flavours run test_attention_paths.cpp).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catalogue.hpp"
#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::test::check_attention;
using ak::test::Inputs;
using ak::test::under;

namespace {

// Every normalizer and its parameter corners under Full, Causal and a causal window, and
// with Softcap.
template <class T = float>
void check_grid(const Case& c) {
  ak::test::for_each_spec(
      c.q_heads, ak::test::Breadth::Variants,
      [&](const std::string& name, const auto& spec) { check_attention<T>(name, spec, c); },
      under("Full"), under("Causal", Causal{}),
      under("Causal & SlidingWindow{24, 0}", Causal{} & ak::SlidingWindow{24, 0}),
      under("Causal, Softcap{5}", Causal{}, ak::Softcap{5.f}),
      under("Full, Softcap{20}", ak::Softcap{20.f}));
}

}  // namespace

TEST_CASE("normalizers: attention matches the reference on ragged shapes, q_offset and GQA",
          "[attention][normalizers][gqa]") {
  ak::test::for_each_ragged_case([](const Case& c) { check_grid(c); });
}

TEST_CASE("normalizers: attention matches the reference at d 128", "[attention][normalizers]") {
  Case c = Case{}.lengths(33, 70).dims(128).at_offset(5);
  check_grid(c);
}

TEST_CASE("normalizers: attention matches the reference with bf16 storage",
          "[attention][normalizers][bf16]") {
  // Inputs are rounded to bf16 before both read them: the f32 tolerance holds.
  Case c = Case{}.lengths(65, 65).heads(4, 2).dims(32);
  check_grid<Eigen::bfloat16>(c);
}

namespace {

// attention() on the Inputs of `c` (V replaced by ones when asked), output [B, Hq, Lq, Dv]
// in Bhsd and the row statistic when the normalizer has one.
template <class Spec>
ak::test::KernelResult run_on(const Spec& spec, const Case& c, bool v_ones = false,
                              std::uint32_t seed = 11) {
  Inputs<float> in(c, seed);
  if (v_ones) in.v.fill(1.f);
  return ak::test::run_into<Spec>(c, [&](const ak::View<float>& o, const ak::Options& options) {
    ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
  });
}

Case property_case() {
  // under Causal, rows 0..5 see no key
  Case c = Case{}.lengths(45, 70).heads(4, 2).dims(32).at_offset(-6);
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
  const auto has_key = [](float lse) { return lse != ak::test::kNegInf; };
  check_sums("ReluPower{1, 0.3}", ak::make_spec(Causal{}, ak::ReluPower{1.f, 0.3f}), has_weight);
  check_sums("ReluPower{2, 0}", ak::make_spec(Causal{}, ak::ReluPower{2.f, 0.f}), has_weight);
  check_sums("Softmax", ak::make_spec(Causal{}), has_key);
}

TEST_CASE("normalizers: a sink scales every weight of a row by exp(lse - lse_sink)",
          "[attention][normalizers][properties][sinks]") {
  const Case c = property_case();
  const auto dv = static_cast<std::size_t>(c.dv());
  const std::vector<float> sinks{-1.f, 0.f, 1.5f, 4.f};
  const auto plain = run_on(ak::make_spec(Causal{} & ak::SlidingWindow{30, 0}), c);
  const auto sunk =
      run_on(ak::make_spec(Causal{} & ak::SlidingWindow{30, 0}, ak::Softmax::with_sinks(sinks)), c);
  for (std::size_t row = 0; row < plain.lse.size(); ++row) {
    const float sink = sinks[row / static_cast<std::size_t>(c.q_len)];
    INFO("row " << row << ", lse " << plain.lse[row] << ", with sink " << sunk.lse[row]);
    if (plain.lse[row] == ak::test::kNegInf) {  // sees nothing: 0 and LSE = sink
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
  ak::test::for_each_normalizer(
      c.q_heads,
      [&](const std::string& name, const auto& n) {
        INFO(name);
        const auto r = run_on(ak::make_spec(Causal{}, n), c);
        CHECK(std::all_of(r.out.begin(), r.out.end(), [](float x) { return x == 0.f; }));
        for (std::size_t row = 0; row < r.lse.size(); ++row)
          CHECK(r.lse[row] == ak::test::empty_row_stat(n, static_cast<Index>(row) / c.q_len));
      },
      ak::test::Breadth::Variants);
}

TEST_CASE("normalizers: an lse buffer with Sigmoid throws and writes nothing",
          "[attention][normalizers][errors]") {
  const Case c = property_case();
  const Inputs<float> in(c, 3);
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  o.fill(42.f);
  std::vector<float> lse(static_cast<std::size_t>(c.rows()), 7.f);
  ak::test::check_error(
      [&] {
        ak::attention(ak::make_spec(ak::Sigmoid{}), in.q.cview(), in.k.cview(), in.v.cview(),
                      o.view, ak::Options{}.with_lse(lse));
      },
      {"lse", "no row statistic"});
  ak::test::check_refused(
      [&] {
        ak::reference::attention(ak::make_spec(ak::Sigmoid{}), in.q.cview(), in.k.cview(),
                                 in.v.cview(), o.view, ak::Options{}.with_lse(lse));
      },
      {"lse", "no row statistic"}, {&lse}, 7.f);
  CHECK(o.holds(42.f));
}

TEST_CASE("normalizers: per-head vectors of the wrong size throw, naming the field",
          "[attention][normalizers][errors]") {
  const Case c = property_case();  // 4 query heads
  const Inputs<float> in(c, 3);
  Tensor<float> o(Layout::Bhsd, c.batch, c.q_heads, c.q_len, c.dv());
  o.fill(42.f);
  const auto expect_error = [&](const auto& spec, const char* field) {
    INFO(field);
    ak::test::check_error(
        [&] { ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view); },
        {field, "q_heads = 4"});
    ak::test::check_error(
        [&] { ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view); },
        {field});
  };
  expect_error(ak::make_spec(ak::Softmax::with_sinks({0.f, 0.f})), "Softmax.sinks.size()");
  expect_error(ak::make_spec(Causal{}, ak::Softmax::with_sinks({0.f, 0.f, 0.f, 0.f, 0.f})),
               "Softmax.sinks.size()");
  expect_error(ak::make_spec(ak::Sigmoid::per_head({0.f})), "Sigmoid.head_bias.size()");
  expect_error(ak::make_spec(Causal{}, ak::Sigmoid::per_head(std::vector<float>(8, 0.f))),
               "Sigmoid.head_bias.size()");
  CHECK(o.holds(42.f));
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
    in.q.view.row(0, h, r)[3] = ak::test::kNaN;
    const auto poisoned = ak::test::run_into<std::decay_t<decltype(spec)>>(
        c, [&](const ak::View<float>& o, const ak::Options& options) {
          ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
        });
    const std::vector<float>& lse = poisoned.lse;
    for (std::size_t row = 0; row < static_cast<std::size_t>(c.rows()); ++row) {
      INFO("row " << row);
      for (std::size_t x = 0; x < dv; ++x) {
        const float got = poisoned.out[row * dv + x];
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
