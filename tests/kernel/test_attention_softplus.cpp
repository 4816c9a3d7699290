// attention() with SoftplusL1 (LSSA) and SoftplusL1Reweighted (LSSAR), by property and
// against weights computed here from scratch in double: rows sum to 1; with V = identity the
// output row is the weight vector, so LSSA's weights follow softplus(log d log(i + 1) cos)
// under Causal and LSSAR's ReLU(N a - 1)^p re-weighting sharpens them (lower entropy); rows
// with uniform LSSA weights (a zero query) or one key fall back to the LSSA output with
// statistic -inf; given key counts equal the mask's; the errors (Options::scale, key counts,
// row sums, power) throw before anything is written; zero and NaN rows; 1 vs 2 threads; f16
// storage. Built natively.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/power_of_two.hpp>
#include <attnkit/mask/sinks.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/mask/visible_keys.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/reference/attention.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::test::kNegInf;

namespace {

// LSSAR's LSE is log sum_j r_ij^p, up to p log Lk (~75 at p = 15, Lk = 150): f32 rounds it
// to eps |lse|, on top of the LSE tolerance.
constexpr double kLssarLseAbs = tol::kLseF32 + 75 * std::numeric_limits<float>::epsilon();

// One batch of `heads` query heads in Bhsd.
Case bhsd_case(Index heads, Index kv_heads, Index q_len, Index kv_len, Index d, Index dv) {
  return Case{}.lengths(q_len, kv_len).heads(heads, kv_heads).dims(d, dv).laid_out(Layout::Bhsd);
}

// Random q, k, v of one shape (Bhsd), f32, and that shape.
struct Inputs : ak::test::Inputs<float> {
  Case shape;
  Inputs(Index heads, Index kv_heads, Index q_len, Index kv_len, Index d, Index dv,
         std::uint32_t seed)
      : ak::test::Inputs<float>(bhsd_case(heads, kv_heads, q_len, kv_len, d, dv), seed),
        shape(bhsd_case(heads, kv_heads, q_len, kv_len, d, dv)) {}
};

// attention()'s output [Hq, Lq, Dv] (row-major) and row statistic.
struct Result {
  std::vector<float> out, stat;
  Index dv = 0;
  const float* row(Index r) const { return out.data() + r * dv; }
};

template <class Spec>
Result run(const Spec& spec, const Inputs& in, ak::Options options) {
  const ak::View<const float> q = in.q.cview(), v = in.v.cview();
  Tensor<float> o(Layout::Bhsd, 1, q.heads, q.seq, v.dim);
  Result r;
  r.dv = v.dim;
  r.stat.assign(static_cast<std::size_t>(q.heads * q.seq), 42.f);
  ak::attention(spec, q, in.k.cview(), v, o.view, options.with_lse(r.stat));
  r.out = std::move(o.memory);
  return r;
}

// cos(q_i, k_j) in double from the stored f32 values, 0 for a zero row.
double cosine(const float* a, const float* b, Index d) {
  double ab = 0, aa = 0, bb = 0;
  for (Index x = 0; x < d; ++x) {
    ab += double(a[x]) * double(b[x]);
    aa += double(a[x]) * double(a[x]);
    bb += double(b[x]) * double(b[x]);
  }
  return aa == 0 || bb == 0 ? 0.0 : ab / std::sqrt(aa * bb);
}

double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

// The LSSA weights of query row r of head h over keys 0 .. n-1 (n = N_i), from the paper's
// formula: softplus(log d log N cos) / sum, with log N = 0 at N = 1 (uniform weights).
std::vector<double> lssa_weights(const Inputs& in, Index h, Index kv_h, Index r, Index n) {
  const Index d = in.q.view.dim;
  const double c = std::log(double(d)) * std::log(double(n));
  std::vector<double> w(static_cast<std::size_t>(n));
  double sum = 0;
  for (Index j = 0; j < n; ++j)
    sum += (w[static_cast<std::size_t>(j)] =
                softplus(c * cosine(in.q.view.row(0, h, r), in.k.view.row(0, kv_h, j), d)));
  for (double& x : w) x /= sum;
  return w;
}

// LSSAR from LSSA weights a over N keys: ReLU(N a - 1)^p / sum; a when every r is 0.
std::vector<double> lssar_weights(const std::vector<double>& a, double power) {
  const double n = double(a.size());
  std::vector<double> r(a.size());
  double sum = 0;
  for (std::size_t j = 0; j < a.size(); ++j)
    sum += (r[j] = std::pow(std::max(n * a[j] - 1.0, 0.0), power));
  if (sum == 0) return a;
  for (double& x : r) x /= sum;
  return r;
}

double entropy(const float* w, Index n) {
  double e = 0;
  for (Index j = 0; j < n; ++j)
    if (w[j] > 0.f) e -= double(w[j]) * std::log(double(w[j]));
  return e;
}

bool all_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

}  // namespace

TEST_CASE("softplus: LSSA and LSSAR rows sum to 1 with V = ones; rows without keys give 0",
          "[attention][softplus]") {
  const Index q_len = 45, kv_len = 70, q_offset = -6;  // under Causal rows 0..5 see no key
  Inputs in(4, 2, q_len, kv_len, 32, 16, 3);
  in.v.for_each([](float& x) { x = 1.f; });
  const auto options = ak::Options{}.with_q_offset(q_offset);
  const auto check_sums = [&](const char* what, const auto& spec, bool lse) {
    INFO(what);
    const Result r = run(spec, in, options);
    for (Index row = 0; row < 4 * q_len; ++row) {
      const bool sees = row % q_len + q_offset >= 0;
      const float stat = r.stat[static_cast<std::size_t>(row)];
      INFO("row " << row << ", statistic " << stat);
      if (!sees) {
        CHECK(stat == (lse ? kNegInf : 0.f));  // exact
        CHECK(std::all_of(r.row(row), r.row(row) + r.dv, [](float x) { return x == 0.f; }));
        continue;
      }
      if (!lse) CHECK(stat > 0.f);
      for (Index x = 0; x < r.dv; ++x) CHECK(std::abs(r.row(row)[x] - 1.f) <= tol::kF32);
    }
  };
  check_sums("SoftplusL1", ak::make_spec(Causal{}, ak::SoftplusL1{}), false);
  check_sums("SoftplusL1Reweighted{15}", ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), true);
  check_sums("SoftplusL1Reweighted{3}, window",
             ak::make_spec(Causal{} & SlidingWindow{20, 0}, ak::SoftplusL1Reweighted{3.f}), true);
}

namespace {

// Inputs with V = identity (V[j] = e_j, Lk = Dv): the output row is the weight vector.
constexpr Index kWq = 64, kWk = 64, kWd = 32;
// V[j] = e_j on `in` (Lk = Dv = kWk).
void set_identity_v(Inputs& in) {
  in.v.for_each([](float& x) { x = 0.f; });
  for (Index j = 0; j < kWk; ++j) in.v.view.row(0, 0, j)[j] = 1.f;
}

}  // namespace

TEST_CASE("softplus: LSSA weights are softplus(log d log(i + 1) cos) normalized under Causal",
          "[attention][softplus][weights]") {
  Inputs in(2, 1, kWq, kWk, kWd, kWk, 21);
  set_identity_v(in);
  const Result r = run(ak::make_spec(Causal{}, ak::SoftplusL1{}), in, ak::Options{});
  // The same call with N_i = Lk for every row (a wrong count): its weights differ, so the
  // comparison below does see N_i.
  const Result wrong =
      run(ak::make_spec(Causal{},
                        ak::SoftplusL1::with_key_counts(std::vector<float>(2 * kWq, float(kWk)))),
          in, ak::Options{});
  double worst = 0, worst_wrong = 0;
  for (Index h = 0; h < 2; ++h)
    for (Index i = 0; i < kWq; ++i) {
      const Index n = i + 1;  // Causal, q_offset 0
      const std::vector<double> a = lssa_weights(in, h, 0, i, n);
      const Index row = h * kWq + i;
      for (Index j = 0; j < kWk; ++j) {
        const double want = j < n ? a[static_cast<std::size_t>(j)] : 0.0;
        worst = std::max(worst, std::abs(double(r.row(row)[j]) - want));
        worst_wrong = std::max(worst_wrong, std::abs(double(wrong.row(row)[j]) - want));
      }
    }
  CHECK(worst <= tol::kF32);
  CHECK(worst_wrong > 100 * tol::kF32);
}

TEST_CASE("softplus: LSSAR weights are ReLU(N a - 1)^p normalized, sharper than LSSA",
          "[attention][softplus][weights]") {
  Inputs in(2, 1, kWq, kWk, kWd, kWk, 33);
  set_identity_v(in);
  const Result lssa = run(ak::make_spec(Causal{}, ak::SoftplusL1{}), in, ak::Options{});
  for (const float p : {3.f, 15.f}) {
    INFO("power " << p);
    const Result lssar =
        run(ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{p}), in, ak::Options{});
    double worst = 0;
    Index sharper = 0, compared = 0;
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < kWq; ++i) {
        const Index n = i + 1, row = h * kWq + i;
        const std::vector<double> a = lssar_weights(lssa_weights(in, h, 0, i, n), p);
        for (Index j = 0; j < kWk; ++j)
          worst = std::max(worst, std::abs(double(lssar.row(row)[j]) -
                                           (j < n ? a[static_cast<std::size_t>(j)] : 0.0)));
        if (n <= 4) continue;
        ++compared;
        sharper += entropy(lssar.row(row), n) < entropy(lssa.row(row), n) ? 1 : 0;
      }
    CHECK(worst <= tol::kF32);
    CHECK(compared > 100);
    CHECK(sharper == compared);
  }
}

TEST_CASE("softplus: uniform LSSA weights (zero query) and one-key rows fall back to LSSA",
          "[attention][softplus][fallback]") {
  const Index len = 70, d = 32, dv = 8;
  Inputs in(2, 1, len, len, d, dv, 41);
  const std::vector<Index> zero_rows{0, 1, 2, 5, 17, 40, 63, 64, 69};  // N_i = row + 1
  for (const Index r : zero_rows)
    for (Index h = 0; h < 2; ++h)
      std::fill(in.q.view.row(0, h, r), in.q.view.row(0, h, r) + d, 0.f);
  const Result lssa = run(ak::make_spec(Causal{}, ak::SoftplusL1{}), in, ak::Options{});
  const Result lssar = run(ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), in, ak::Options{});
  for (Index h = 0; h < 2; ++h)
    for (const Index r : zero_rows) {
      const Index row = h * len + r;
      INFO("head " << h << ", row " << r << " (" << r + 1 << " keys), LSSAR statistic "
                   << lssar.stat[static_cast<std::size_t>(row)]);
      if (r == 0) CHECK(lssar.stat[static_cast<std::size_t>(row)] == kNegInf);  // one key
      for (Index x = 0; x < dv; ++x) {
        double mean = 0;  // the mean of the visible values, computed here
        for (Index j = 0; j <= r; ++j) mean += double(in.v.view.row(0, 0, j)[x]);
        mean /= double(r + 1);
        CHECK(std::abs(double(lssa.row(row)[x]) - mean) <= tol::kF32);
        CHECK(std::abs(double(lssar.row(row)[x]) - mean) <= tol::kF32);
      }
    }

  // Every row sees exactly one key (its own): both give that key's value, LSSAR falls back.
  const Inputs fresh(2, 1, len, len, d, dv, 43);
  const ak::SlidingWindow diagonal{0, 0};
  const Result one = run(ak::make_spec(diagonal, ak::SoftplusL1Reweighted{}), fresh, ak::Options{});
  const Result one_lssa = run(ak::make_spec(diagonal, ak::SoftplusL1{}), fresh, ak::Options{});
  double worst = 0;
  bool stats_fall_back = true;
  for (Index h = 0; h < 2; ++h)
    for (Index r = 0; r < len; ++r) {
      const Index row = h * len + r;
      stats_fall_back = stats_fall_back && one.stat[static_cast<std::size_t>(row)] == kNegInf;
      for (Index x = 0; x < dv; ++x) {
        const double want = fresh.v.view.row(0, 0, r)[x];
        worst = std::max({worst, std::abs(double(one.row(row)[x]) - want),
                          std::abs(double(one_lssa.row(row)[x]) - want)});
      }
    }
  CHECK(stats_fall_back);
  CHECK(worst <= tol::kF32);
}

// A zero query has uniform LSSA weights, a_ij = 1 / N_i, and falls back with statistic -inf.
// N_i a_ij - 1 of such a row is rounding noise around 0 (positive for many N_i), so both the
// kernel and the reference find uniform rows exactly (all visible w equal) instead.
TEST_CASE("softplus: LSSAR zero query rows report statistic -inf (kernel and reference)",
          "[attention][softplus][fallback]") {
  const Index len = 300, d = 32;
  Inputs in(1, 1, len, len, d, 4, 45);
  in.q.for_each([](float& x) { x = 0.f; });  // every row: uniform weights over N_i = r + 1
  const auto spec = ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{});
  const Result got = run(spec, in, ak::Options{});
  Tensor<double> want(Layout::Bhsd, 1, 1, len, 4);
  std::vector<float> stat(static_cast<std::size_t>(len));
  ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), want.view,
                           ak::Options{}.with_lse(stat));
  Index kernel_finite = 0, reference_finite = 0;
  for (std::size_t r = 0; r < stat.size(); ++r) {
    kernel_finite += got.stat[r] == kNegInf ? 0 : 1;
    reference_finite += stat[r] == kNegInf ? 0 : 1;
  }
  CHECK(kernel_finite == 0);
  CHECK(reference_finite == 0);
}

TEST_CASE("softplus: key counts from visible_key_counts() give the default result",
          "[attention][softplus]") {
  const Index heads = 4, q_len = 90, kv_len = 300, q_offset = 180;
  const Inputs in(heads, 2, q_len, kv_len, 32, 16, 51);
  const auto options = ak::Options{}.with_q_offset(q_offset);
  const auto check_mask = [&](const char* what, const auto& mask) {
    INFO(what);
    const std::vector<float> counts =
        ak::visible_key_counts(mask, 1, heads, q_len, kv_len, q_offset);
    const Result a = run(ak::make_spec(mask, ak::SoftplusL1{}), in, options);
    const Result b = run(ak::make_spec(mask, ak::SoftplusL1::with_key_counts(counts)), in, options);
    CHECK(all_equal(a.out, b.out));  // the same counts: the same arithmetic
    CHECK(all_equal(a.stat, b.stat));
    const Result c = run(ak::make_spec(mask, ak::SoftplusL1Reweighted{}), in, options);
    const Result d =
        run(ak::make_spec(mask,
                          ak::SoftplusL1Reweighted{15.f, ak::SoftplusL1::with_key_counts(counts)}),
            in, options);
    CHECK(all_equal(c.out, d.out));
    CHECK(all_equal(c.stat, d.stat));
  };
  check_mask("Causal", Causal{});
  check_mask("Causal & (Sinks{4} | SlidingWindow{30, 0})",
             Causal{} & (ak::Sinks{4} | SlidingWindow{30, 0}));
  check_mask("PowerOfTwo{2, 8}", ak::PowerOfTwo{2, 8});
}

TEST_CASE("softplus: bad arguments throw attnkit::Error naming the field and write nothing",
          "[attention][softplus][errors]") {
  const Inputs in(2, 1, 20, 30, 16, 8, 61);
  Tensor<float> o(Layout::Bhsd, 1, 2, 20, 8);
  o.fill(42.f);
  std::vector<float> stat(40, 7.f);
  const auto expect_error = [&](const auto& spec, const ak::Options& options, const char* field) {
    INFO(field);
    ak::test::check_error(
        [&] { ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options); },
        {field});
    ak::test::check_error(
        [&] {
          ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options);
        },
        {field});
  };
  const auto scaled = ak::Options{}.with_scale(0.5f).with_lse(stat);
  expect_error(ak::make_spec(ak::SoftplusL1{}), scaled, "Options.scale");
  expect_error(ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), scaled, "Options.scale");
  expect_error(
      ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}.second_round(std::vector<float>(40, 1.f))),
      scaled, "Options.scale");
  const auto plain = ak::Options{}.with_lse(stat);
  for (const std::size_t n : {std::size_t{39}, std::size_t{41}, std::size_t{20}}) {
    INFO(n << " key counts for 40 rows");
    const std::vector<float> counts(n, 5.f);
    expect_error(ak::make_spec(ak::SoftplusL1::with_key_counts(counts)), plain,
                 "SoftplusL1.key_counts.size()");
    expect_error(
        ak::make_spec(ak::SoftplusL1Reweighted{3.f, ak::SoftplusL1::with_key_counts(counts)}),
        plain, "SoftplusL1.key_counts.size()");
    expect_error(ak::make_spec(ak::SoftplusL1Reweighted{}.second_round(counts)), plain,
                 "SecondRound.row_sums.size()");
  }
  expect_error(ak::make_spec(ak::SoftplusL1Reweighted{}.second_round({})), plain,
               "SecondRound.row_sums.size()");
  CHECK(o.holds(42.f));
  CHECK(ak::test::all_equal_to(stat, 7.f));

  for (const float p : {0.f, -1.f, ak::test::kNaN, ak::test::kInf}) {
    INFO("power " << p);
    ak::test::check_error([&] { (void)ak::SoftplusL1Reweighted{p}; },
                          {"SoftplusL1Reweighted.power"});
  }
  CHECK_NOTHROW(ak::SoftplusL1Reweighted{0.5f});
}

namespace {

// Kernel vs reference on `in` with q_offset, with the named tolerances of
// support/reference_check.hpp: output within tol::kF32; statistics within tol::kRowSumRel
// (row sum) or tol::kLseF32 + eps |lse| (LSE); equal infinities agree.
template <class Spec>
void check_against_reference(const Spec& spec, const Inputs& in, Index q_offset) {
  Case c = in.shape;
  c.q_offset = q_offset;
  ak::test::check_attention_on(spec, c, in);
}

}  // namespace

TEST_CASE("softplus: zero key rows have cosine 0 and give finite results",
          "[attention][softplus][nonfinite]") {
  Inputs in(2, 1, 40, 90, 32, 16, 71);
  for (const Index j : {0, 3, 50, 89})
    std::fill(in.k.view.row(0, 0, j), in.k.view.row(0, 0, j) + 32, 0.f);
  const auto options = ak::Options{}.with_q_offset(20);
  const auto finite = [&](const auto& spec) {
    const Result r = run(spec, in, options);
    return std::all_of(r.out.begin(), r.out.end(), [](float x) { return std::isfinite(x); });
  };
  {
    INFO("SoftplusL1");
    CHECK(finite(ak::make_spec(Causal{}, ak::SoftplusL1{})));
    check_against_reference(ak::make_spec(Causal{}, ak::SoftplusL1{}), in, 20);
  }
  {
    INFO("SoftplusL1Reweighted");
    CHECK(finite(ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{})));
    check_against_reference(ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), in, 20);
  }
}

TEST_CASE("softplus: NaN in one query row gives NaN in that row only",
          "[attention][softplus][nonfinite]") {
  const Inputs clean_in(2, 1, 40, 90, 32, 16, 81);
  Inputs in(2, 1, 40, 90, 32, 16, 81);
  const Index h = 1, r = 13, poisoned = h * 40 + r;
  in.q.view.row(0, h, r)[5] = ak::test::kNaN;
  const auto check_one = [&](const char* what, const auto& spec) {
    INFO(what);
    const Result clean = run(spec, clean_in, ak::Options{});
    const Result got = run(spec, in, ak::Options{});
    for (Index row = 0; row < 80; ++row) {
      INFO("row " << row);
      const auto at = static_cast<std::size_t>(row);
      if (row == poisoned) {
        CHECK(std::all_of(got.row(row), got.row(row) + got.dv,
                          [](float x) { return std::isnan(x); }));
        CHECK(std::isnan(got.stat[at]));
        continue;
      }
      CHECK(std::equal(got.row(row), got.row(row) + got.dv, clean.row(row)));  // bit for bit
      CHECK(got.stat[at] == clean.stat[at]);
    }
  };
  check_one("SoftplusL1", ak::make_spec(Causal{}, ak::SoftplusL1{}));
  check_one("SoftplusL1Reweighted", ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}));
}

TEST_CASE("softplus: 1 and 2 threads give identical results", "[attention][softplus][threads]") {
  // Several query tiles, rows without keys (q_offset < 0) and fallback rows (zero queries).
  Inputs in(3, 3, 150, 260, 32, 16, 91);
  for (const Index r : {10, 100, 149})
    std::fill(in.q.view.row(0, 2, r), in.q.view.row(0, 2, r) + 32, 0.f);
  const auto check_threads = [&](const char* what, const auto& spec) {
    INFO(what);
    const Result one = run(spec, in, ak::Options{}.with_q_offset(-3).with_threads(1));
    const Result two = run(spec, in, ak::Options{}.with_q_offset(-3).with_threads(2));
    CHECK(all_equal(one.out, two.out));
    CHECK(all_equal(one.stat, two.stat));
  };
  check_threads("SoftplusL1", ak::make_spec(Causal{}, ak::SoftplusL1{}));
  check_threads("SoftplusL1Reweighted", ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}));
  check_threads("SoftplusL1Reweighted{3}, window",
                ak::make_spec(Causal{} & SlidingWindow{40, 0}, ak::SoftplusL1Reweighted{3.f}));
}

TEST_CASE("softplus: f16 storage matches the reference on the same rounded inputs",
          "[attention][softplus][f16]") {
  // The reference reads the same rounded values: the f32 tolerance holds for the output, the
  // LSSA row sums are relative (tol::kRowSumRel), the LSSAR statistic within kLssarLseAbs.
  Case c = Case{}.lengths(70, 150).heads(4, 2).dims(32);
  ak::test::check_attention<Eigen::half>("SoftplusL1", ak::make_spec(Causal{}, ak::SoftplusL1{}), c,
                                         7);
  ak::test::Tolerance lssar;
  lssar.lse = kLssarLseAbs;
  lssar.lse_rel = 0.0;
  ak::test::check_attention<Eigen::half>(
      "SoftplusL1Reweighted", ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}), c, 7, lssar);
}
