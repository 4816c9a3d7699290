// Fope, Fourier position embedding: with sigma = 0 and nothing clipped it is RoPE (NeoX);
// apply() and reference_apply() follow the series written out here from C, S and omega;
// clipped pairs get the chosen padding; fused equals apply_position() then attention();
// attention() agrees with the f64 reference over masks, normalizers, GQA, offsets and bf16;
// drawn coefficients are seeded; bad inputs throw Error before anything is written.
// The tables (FopeConfig, FopeTable) live in position/fope_table.hpp.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/core/error.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/full.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/position/apply.hpp>
#include <attnkit/position/fope.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "support/error_checks.hpp"
#include "support/matchers.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::test::check_error;
using ak::test::random_values;

namespace {

// One f32 row turned by a table entry formed in double and rounded once: a few ulps of
// |x| * (|cos'| + |sin'|), which stays below ~10 for the coefficients drawn here.
constexpr double kRowF32 = 2e-5;
// Two rows turned in double along two paths (series vs the same series): rounding only.
constexpr double kRowF64 = 1e-12;

// cos'/sin' of pair p for KV head h at position t, written out from the definition.
struct Series {
  double cos_p, sin_p;
};
Series series_of(const ak::FopeConfig& c, const std::vector<double>& C,
                 const std::vector<double>& S, Index h, double t, Index p) {
  const Index pairs = c.head_dim / 2;
  Index kept = 0;
  std::vector<double> omega;
  for (Index m = 0; m < pairs; ++m) {
    const double w = std::pow(c.base, -2.0 * double(m) / double(c.head_dim));
    if (c.train_len > 0 && w < 2.0 * M_PI / double(c.train_len)) continue;
    omega.push_back(w);
    ++kept;
  }
  if (p >= kept) return {1.0, c.padding == ak::FopePadding::ReferenceCode ? 1.0 : 0.0};
  Series s{0.0, 0.0};
  for (Index f = 0; f < kept; ++f) {
    const auto at = static_cast<std::size_t>((h * kept + f) * pairs + p);
    s.cos_p += C[at] * std::cos(omega[std::size_t(f)] * t);
    s.sin_p += S[at] * std::sin(omega[std::size_t(f)] * t);
  }
  return s;
}

// The row x turned at (h, t) by the series above, in double.
std::vector<double> turned(const ak::FopeConfig& c, const std::vector<double>& C,
                           const std::vector<double>& S, Index h, double t,
                           const std::vector<double>& x) {
  const Index pairs = c.head_dim / 2;
  std::vector<double> y = x;
  for (Index p = 0; p < pairs; ++p) {
    const Series s = series_of(c, C, S, h, t, p);
    const double a = x[std::size_t(p)], b = x[std::size_t(p + pairs)];
    y[std::size_t(p)] = a * s.cos_p - b * s.sin_p;
    y[std::size_t(p + pairs)] = b * s.cos_p + a * s.sin_p;
  }
  return y;
}

// d = 16, base 10^4, N_train = 100: omega = 1, 0.316, 0.1 are kept; 0.0316 ... < 2 pi / 100.
ak::FopeConfig clipped_config(ak::FopePadding padding) {
  ak::FopeConfig c{16, 64, 100};
  c.kv_heads = 2;
  c.q_heads = 4;
  c.padding = padding;
  return c;
}

}  // namespace

TEST_CASE("Fope: with sigma = 0 and nothing clipped, attention equals Rope's", "[position][fope]") {
  const Index dim = GENERATE(32, 64, 128);
  // 2 pi / N_train below the lowest frequency base^(-(d-2)/d) >= 1e-4: nothing is clipped.
  ak::FopeConfig c{dim, 160, 1000000};
  c.kv_heads = 2;
  const ak::Fope fope = ak::Fope::drawn(c, 0.0);
  REQUIRE(fope.table->kept() == dim / 2);
  const ak::Rope rope(ak::RopeTable(dim, 10000.0, 160));
  ak::test::Case k;
  k.q_heads = 2;
  k.kv_heads = 2;
  k.q_len = 37;
  k.kv_len = 150;
  k.dim = dim;
  k.stddev = 2.f;  // logits of order several: the turn matters for the weights
  const auto a = ak::test::run_kernel(ak::make_spec(ak::Causal{}, fope), k);
  const auto b = ak::test::run_kernel(ak::make_spec(ak::Causal{}, rope), k);
  const auto none = ak::test::run_kernel(ak::make_spec(ak::Causal{}), k);
  double diff = 0, moved = 0;
  for (std::size_t i = 0; i < a.out.size(); ++i) {
    diff = std::max(diff, double(std::abs(a.out[i] - b.out[i])));
    moved = std::max(moved, double(std::abs(a.out[i] - none.out[i])));
  }
  CHECK(diff <= 1e-6);
  CHECK(moved > 0.1);  // and the position actually changed the result
}

TEST_CASE("Fope: apply and reference_apply follow the series from the given coefficients",
          "[position][fope]") {
  const auto padding = GENERATE(ak::FopePadding::Identity, ak::FopePadding::ReferenceCode);
  const ak::FopeConfig c = clipped_config(padding);
  const Index kept = ak::FopeTable::kept_frequencies(c.head_dim, c.base, c.train_len);
  REQUIRE(kept == 3);
  const auto n = static_cast<std::size_t>(c.kv_heads * kept * c.head_dim / 2);
  const std::vector<double> C = random_values<double>(n, 1, 0.7),
                            S = random_values<double>(n, 2, 0.7);
  const ak::Fope fope = ak::Fope::with_coefficients(c, C, S);
  CHECK(fope.table->cos_coef() == C);  // used as given, not renormalized
  CHECK(fope.table->sin_coef() == S);
  const std::vector<double> x = random_values<double>(16, 3, 1.0);
  for (const ak::Role role : {ak::Role::Query, ak::Role::Key})
    for (Index head = 0; head < (role == ak::Role::Query ? 4 : 2); ++head)
      for (const Index t : {0, 1, 17, 63}) {
        const Index h = role == ak::Role::Query ? head / 2 : head;  // GQA: its KV head
        const std::vector<double> want = turned(c, C, S, h, double(t), x);
        std::vector<float> xf(x.begin(), x.end());
        std::vector<double> xd = x;
        const ak::RowAt at{0, head, t, 64, t, role};
        fope.apply(xf.data(), 16, at);
        fope.reference_apply(xd.data(), 16, at);
        for (std::size_t i = 0; i < 16; ++i) {
          INFO("role " << int(role) << " head " << head << " t " << t << " dim " << i);
          CHECK_THAT(xf[i], WithinAbs(want[i], kRowF32));
          CHECK_THAT(xd[i], WithinAbs(want[i], kRowF64));
        }
      }
}

TEST_CASE("Fope: clipped pairs pass through or take cos = sin = 1", "[position][fope]") {
  const auto padding = GENERATE(ak::FopePadding::Identity, ak::FopePadding::ReferenceCode);
  const ak::Fope fope = ak::Fope::drawn(clipped_config(padding), 0.3, 5);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  // Negative positions too: the padding is a constant, not odd in t (a kept pair's sin' is).
  for (const Index t : {0, 5, 40, -5, -40}) {
    std::vector<float> y = x, back = x;
    fope.apply(y.data(), 16, ak::RowAt{0, 1, t, 64, t, ak::Role::Key});
    fope.apply_transpose(back.data(), 16, ak::RowAt{0, 1, t, 64, t, ak::Role::Key});
    for (Index p = 3; p < 8; ++p) {  // the clipped pairs (p, p + 8)
      const float a = x[std::size_t(p)], b = x[std::size_t(p + 8)];
      INFO("t " << t << " pair " << p);
      if (padding == ak::FopePadding::Identity) {
        CHECK(y[std::size_t(p)] == a);  // exact: cos' = 1, sin' = 0
        CHECK(y[std::size_t(p + 8)] == b);
      } else {
        CHECK(y[std::size_t(p)] == a - b);  // exact in f32 for these small integers
        CHECK(y[std::size_t(p + 8)] == b + a);
        CHECK(back[std::size_t(p)] == a + b);  // the transpose: sin' = 1 negated
        CHECK(back[std::size_t(p + 8)] == b - a);
      }
    }
    if (t != 0) CHECK(y[0] != x[0]);  // a kept pair turns
  }
}

TEST_CASE("Fope: drawn coefficients are seeded and spread by sigma", "[position][fope]") {
  ak::FopeConfig c{128, 8, 0};
  c.kv_heads = 4;
  const ak::Fope a = ak::Fope::drawn(c, 0.3, 42), b = ak::Fope::drawn(c, 0.3, 42);
  const ak::Fope other = ak::Fope::drawn(c, 0.3, 43), zero = ak::Fope::drawn(c, 0.0, 42);
  CHECK(a.table->cos_coef() == b.table->cos_coef());
  CHECK(a.table->sin_coef() == b.table->sin_coef());
  CHECK(a.table->cos_coef() != other.table->cos_coef());
  CHECK(a.table->cos_coef() != a.table->sin_coef());  // separate for cos and sin
  const std::vector<double>& C = a.table->cos_coef();
  double sum = 0, sq = 0;
  for (std::size_t i = 0; i < C.size(); ++i) {
    const std::size_t f = (i / 64) % 64, p = i % 64;
    const double eye = f == p ? 1.0 : 0.0;
    CHECK(zero.table->cos_coef()[i] == eye);
    sum += C[i] - eye;
    sq += (C[i] - eye) * (C[i] - eye);
  }
  const double n = double(C.size()), mean = sum / n;  // 16384 draws
  CHECK_THAT(mean, WithinAbs(0.0, 0.01));
  CHECK_THAT(std::sqrt(sq / n - mean * mean), WithinAbs(0.3, 0.01));
}

TEST_CASE("Fope: fused in attention equals apply_position then attention", "[position][fope]") {
  using T = Tensor<float>;
  ak::FopeConfig c{64, 128, 200};  // pairs with omega < 2 pi / 200 are clipped
  c.kv_heads = 2;
  c.q_heads = 4;
  const ak::Fope fope = ak::Fope::drawn(c, 0.3, 9);
  REQUIRE(fope.table->kept() < 32);
  const Index q_len = 19, kv_len = 90, offset = 60;
  T q(Layout::Padded, 2, 4, q_len, 64), k(Layout::Bshd, 2, 2, kv_len, 64);
  T v(Layout::Bhsd, 2, 2, kv_len, 64), fused(Layout::Bhsd, 2, 4, q_len, 64);
  T plain(Layout::Bhsd, 2, 4, q_len, 64);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  const auto options = ak::Options{}.with_threads(2).with_q_offset(offset);
  ak::attention(ak::make_spec(ak::Causal{}, fope), q.cview(), k.cview(), v.cview(), fused.view,
                options);
  ak::apply_position(fope, q.view, ak::Role::Query, offset);
  ak::apply_position(fope, k.view, ak::Role::Key);
  ak::attention(ak::make_spec(ak::Causal{}), q.cview(), k.cview(), v.cview(), plain.view, options);
  CHECK(ak::test::max_abs_diff(fused.view, plain.view) <= 1e-6);
}

TEST_CASE("Fope: attention agrees with the f64 reference", "[position][fope]") {
  ak::FopeConfig cfg{0, 300, 256};
  cfg.kv_heads = 2;
  cfg.q_heads = 4;
  cfg.head_dim = GENERATE(32, 64, 80, 128);
  const ak::Fope fope = ak::Fope::drawn(cfg, 0.3, 11);
  ak::test::Case c;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.dim = cfg.head_dim;
  c.q_len = GENERATE(1, 33, 70);
  c.kv_len = 129;
  c.layout = GENERATE(Layout::Bshd, Layout::Padded);
  INFO("d " << c.dim << " Lq " << c.q_len << " layout " << ak::test::name(c.layout));
  SECTION("causal softmax, bottom-right") {
    ak::test::check_outcome(ak::test::run_case(ak::make_spec(ak::Causal{}, fope), c));
  }
  SECTION("full sigmoid with a q_offset") {
    c.q_offset = 200;  // queries at 200 .. 269, keys at 0 .. 128
    // An unnormalized sum: tol::kF32 per unit of its magnitude sum_j w_ij |v_j|.
    ak::test::check_attention("Full, Sigmoid{}", ak::make_spec(ak::Full{}, ak::Sigmoid{}, fope), c,
                              7);
  }
  SECTION("causal softmax, bf16 storage") {
    const auto r = ak::test::run_case<Eigen::bfloat16>(ak::make_spec(ak::Causal{}, fope), c);
    CHECK(r.out_err <= tol::kBf16);
  }
}

TEST_CASE("Fope: position ids give the same result as the absolute positions they name",
          "[position][fope]") {
  const ak::Fope fope = ak::Fope::drawn({32, 64, 40}, 0.3, 3);
  ak::test::Case c;
  c.q_heads = c.kv_heads = 1;
  c.batch = 2;
  c.dim = 32;
  c.q_len = 9;
  c.kv_len = 30;
  std::vector<Index> q_ids, k_ids;
  for (Index b = 0; b < 2; ++b) {
    for (Index r = 0; r < 9; ++r) q_ids.push_back(r + 21);
    for (Index j = 0; j < 30; ++j) k_ids.push_back(j);
  }
  const auto a = ak::test::run_kernel(ak::make_spec(ak::Causal{}, fope), c);
  const auto b =
      ak::test::run_kernel(ak::make_spec(ak::Causal{}, fope.with_positions(q_ids, k_ids)), c);
  CHECK(a.out == b.out);  // the same table entries, the same arithmetic
  k_ids[3] += 1;
  const auto moved =
      ak::test::run_kernel(ak::make_spec(ak::Causal{}, fope.with_positions(q_ids, k_ids)), c);
  CHECK(moved.out != a.out);
}

TEST_CASE("Fope: bad inputs throw Error before anything is written", "[position][fope]") {
  const ak::FopeConfig c{32, 64, 0};
  const auto n = static_cast<std::size_t>(16 * 16);
  check_error([&] { ak::Fope::drawn(c, -0.1); }, {"sigma"});
  check_error([&] { ak::Fope::drawn(c, std::nan("")); }, {"sigma"});
  check_error(
      [&] { ak::Fope::with_coefficients(c, std::vector<double>(n - 1), std::vector<double>(n)); },
      {"C.size()"});
  check_error(
      [&] { ak::Fope::with_coefficients(c, std::vector<double>(n), std::vector<double>(n + 16)); },
      {"S.size()"});
  std::vector<double> bad(n);
  bad[7] = std::nan("");
  CHECK_THROWS_AS(ak::Fope::with_coefficients(c, std::vector<double>(n), bad), ak::Error);
  CHECK_THROWS_AS(ak::Fope::drawn({31, 64, 0}), ak::Error);
  CHECK_THROWS_AS(ak::Fope::drawn({32, 0, 0}), ak::Error);
  ak::FopeConfig gqa = c;
  gqa.kv_heads = 2;
  gqa.q_heads = 3;
  check_error([&] { ak::Fope::drawn(gqa); }, {"q_heads"});

  const ak::Fope fope = ak::Fope::drawn(c, 0.3, 1);
  using T = Tensor<float>;
  T q(Layout::Bhsd, 1, 1, 8, 32), k(Layout::Bhsd, 1, 1, 16, 32), v(Layout::Bhsd, 1, 1, 16, 32);
  T o(Layout::Bhsd, 1, 1, 8, 32), q64(Layout::Bhsd, 1, 1, 8, 64), k64(Layout::Bhsd, 1, 1, 16, 64);
  T q2(Layout::Bhsd, 1, 2, 8, 32), o2(Layout::Bhsd, 1, 2, 8, 32);
  for (T* t : {&q, &k, &v, &q64, &k64, &q2}) t->randomize(4);
  for (T* t : {&o, &o2}) std::fill(t->memory.begin(), t->memory.end(), 7.f);
  const auto spec = ak::make_spec(ak::Causal{}, fope);
  check_error([&] { ak::attention(spec, q64.cview(), k64.cview(), v.cview(), o.view); },
              {"head_dim"});
  check_error(
      [&] {
        ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view,
                      ak::Options{}.with_q_offset(60));
      },
      {"last query position"});
  check_error([&] { ak::attention(spec, q2.cview(), k.cview(), v.cview(), o2.view); },
              {"query heads"});
  CHECK_THROWS_AS(ak::attention(ak::make_spec(fope.with_positions({1, 2}, {})), q.cview(),
                                k.cview(), v.cview(), o.view),
                  ak::Error);
  for (const T* t : {&o, &o2}) CHECK(ak::test::all_equal_to(t->memory, 7.f));
  const std::vector<float> before = q64.memory;
  CHECK_THROWS_AS(ak::apply_position(fope, q64.view, ak::Role::Query), ak::Error);
  CHECK(q64.memory == before);
}

TEST_CASE("Fope: K with other KV heads than the coefficient sets throws before writing",
          "[position][fope][errors]") {
  // Two coefficient sets for 4 query heads. K with 1 KV head would turn query heads 2, 3 (set
  // 1) against keys turned with set 0; K with 4 would read sets that do not exist.
  using T = ak::test::Tensor<float>;
  using ak::test::Layout;
  ak::FopeConfig c{32, 64, 0};
  c.kv_heads = 2;
  c.q_heads = 4;
  const auto spec = ak::make_spec(ak::Causal{}, ak::Fope::drawn(c, 0.3, 5));
  T q(Layout::Bhsd, 1, 4, 8, 32), o(Layout::Bhsd, 1, 4, 8, 32);
  q.randomize(1);
  for (const Index kv_heads : {Index{1}, Index{4}}) {
    INFO("K with " << kv_heads << " heads");
    T k(Layout::Bhsd, 1, kv_heads, 16, 32), v(Layout::Bhsd, 1, kv_heads, 16, 32);
    k.randomize(2);
    v.randomize(3);
    std::fill(o.memory.begin(), o.memory.end(), 7.f);
    CHECK_THROWS_MATCHES(ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view), ak::Error,
                         MessageMatches(ContainsSubstring("Fope: the call's KV heads") &&
                                        ContainsSubstring("FopeConfig.kv_heads = 2")));
    CHECK_THROWS_AS(ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), o.view),
                    ak::Error);
    CHECK(std::all_of(o.memory.begin(), o.memory.end(), [](float x) { return x == 7.f; }));
  }
  T k(Layout::Bhsd, 1, 2, 16, 32), v(Layout::Bhsd, 1, 2, 16, 32);
  k.randomize(2);
  v.randomize(3);
  CHECK_NOTHROW(ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view));
}

TEST_CASE("Fope: negative query positions (more queries than keys) match the f64 reference",
          "[position][fope][reference]") {
  // The kernel reads the table's row of -t with sin' negated; the reference sums the series
  // at t itself.
  ak::FopeConfig cfg{64, 128, 100};
  cfg.kv_heads = 2;
  cfg.q_heads = 4;
  // ReferenceCode pads the clipped pairs with sin' = 1 at every position (it was -1 at
  // negative ones on the fast path, where the reference kept +1).
  cfg.padding = GENERATE(ak::FopePadding::Identity, ak::FopePadding::ReferenceCode);
  INFO((cfg.padding == ak::FopePadding::Identity ? "Identity" : "ReferenceCode") << " padding");
  const ak::Fope fope = ak::Fope::drawn(cfg, 0.3, 12);
  REQUIRE(fope.table->kept() < fope.table->pairs());  // some pairs are clipped
  ak::test::Case c;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.dim = 64;
  c.q_len = 90;  // bottom-right: queries at -50 .. 39
  c.kv_len = 40;
  const auto r = ak::test::run_case(ak::make_spec(ak::Full{}, fope), c);
  CHECK(r.out_err <= tol::kF32);
  CHECK(r.lse_err <= tol::kLseF32);
}
