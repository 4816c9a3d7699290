// Tapa (position/tapa.hpp): attention() against reference::attention() over (alpha, theta)
// pairs, odd head dims, Full / Causal / windowed masks, Softmax / Sigmoid / ReluPower, Softcap,
// decode-like q_offset, GQA, 1 and 2 threads, f32 / bf16 / f16 storage; then properties
// (theta = 1 is plain attention, the logit depends on |i - j| only), combine() on hand-made
// tiles against the formula, and the errors. Built for the native ISA and x86-64-v2
// (ATTNKIT_PATH_TESTS).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/relu_power.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

using ak::Tapa;

namespace {

constexpr double kF32Eps = std::numeric_limits<float>::epsilon();
// An f32 TAPA logit is amp * cos(turn), turn = 2 pi |i - j|^alpha q_P . k_P / sqrt(d - a).
// The kernel's turn carries a relative error of a few ulp of its largest partial term, the
// cosine's argument magnitude arg = 2 pi |i - j|^alpha sum_c |q_c k_c| / sqrt(d - a) (the
// phase dot's rounding, the f32 frequency table, the product, the cosine's range reduction),
// and the logit that error times |amp|. So the logit may be off by kTurnUlps ulp of
// max |amp| * arg over the visible pairs: ~1e-5 for N(0, 1) inputs at d = 64 and distances
// of a few hundred (arg ~ 50, |amp| ~ 4), which tol::kF32 alone cannot absorb.
constexpr double kTurnUlps = 8.0;
// Two f32 orderings of one computation (the scale applied to the query before the product,
// or to the product after it): a few ulp of each logit.
constexpr double kReorderedF32 = 1e-5;

// max over the pairs the mask keeps of |amp_ij| * arg_ij (the comment on kTurnUlps), in double
// from the stored (rounded) inputs.
template <class Spec, class T>
double amplitude_times_argument(const Spec& spec, const Case& c, const Tensor<T>& q,
                                const Tensor<T>& k) {
  const Tapa& tapa = spec.position;
  const Index d = c.dim, a = tapa.amplitude_dims(d), phase = d - a;
  const Index group = c.q_heads / c.kv_heads;
  double worst = 0.0;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r)
        for (Index j = 0; j < c.kv_len; ++j) {
          const Index i = r + c.offset();
          if (!spec.mask.keep(b, h, i, j)) continue;
          const T* x = q.view.row(b, h, r);
          const T* y = k.view.row(b, h / group, j);
          double amp = 0.0, sum = 0.0;
          for (Index e = 0; e < a; ++e) amp += double(x[e]) * double(y[e]);
          for (Index e = a; e < d; ++e) sum += std::abs(double(x[e]) * double(y[e]));
          const double arg = phase == 0
                                 ? 0.0
                                 : Tapa::kTwoPi * std::pow(double(std::abs(i - j)), tapa.alpha) *
                                       sum / std::sqrt(double(phase));
          worst = std::max(worst, std::abs(amp) / std::sqrt(double(a)) * (1.0 + arg));
        }
  return worst;
}

// attention() against reference::attention() on one Case, in storage T (the reference reads
// the same rounded values), with the named tolerances of support/reference_check.hpp widened
// by a logit error e: softmax and ReLU^a outputs are convex combinations of V, so e moves them
// by at most ~2e max |v|; a Sigmoid output's rounding grows with sum_j w_ij |v_j| (the
// reference on |V|), and so does the effect of e (sigmoid' <= sigmoid). Allowed:
// (tol::kF32 + 8 e) per unit of magnitude; LSE: tol::kLseF32 + e; ReLU^a row sums:
// tol::kRowSumRel plus 2 e (Lk + |sum|); e = kTurnUlps ulp of amplitude_times_argument().
template <class T = float, class Spec>
void check(const std::string& what, const Spec& spec, const Case& c, std::uint32_t seed = 11) {
  const ak::test::Inputs<T> in(c, seed);
  ak::test::Tolerance t;
  t.logit = kTurnUlps * kF32Eps * amplitude_times_argument(spec, c, in.q, in.k);
  INFO(what << ", " << ak::test::describe(c) << ", " << ak::test::storage_name<T>()
            << ", logit error allowed " << t.logit);
  ak::test::check_attention_on(spec, c, in, t);
}

// The (alpha, theta) pairs of the grid: the defaults, a narrow amplitude part, and a wider
// part with a steeper distance power (theta = 1, no phase part, has its own test below).
template <class Visit>
void for_each_tapa(Visit&& visit) {
  visit("Tapa{} (0.1, 0.5)", Tapa{});
  visit("Tapa{0.1, 0.25}", Tapa{0.1f, 0.25f});
  visit("Tapa{0.3, 0.7}", Tapa{0.3f, 0.7f});
}

// Every Tapa under Full and Causal softmax; the default Tapa also under the other masks,
// normalizers and score mods (the parameters change the position math, which those two
// cover; the policies around it do not depend on them).
template <class T = float>
void check_grid(const Case& c) {
  bool first = true;
  for_each_tapa([&](const char* name, const Tapa& tapa) {
    const std::string s(name);
    check<T>(s + ", Full, Softmax", ak::make_spec(tapa), c);
    check<T>(s + ", Causal, Softmax", ak::make_spec(tapa, Causal{}), c);
    if (!first) return;
    first = false;
    check<T>(s + ", Causal & SlidingWindow{24, 0}, Softmax",
             ak::make_spec(tapa, Causal{} & SlidingWindow{24, 0}), c);
    check<T>(s + ", Causal, Sigmoid{}", ak::make_spec(tapa, Causal{}, ak::Sigmoid{}), c);
    check<T>(s + ", Causal, ReluPower{2, 0.3}",
             ak::make_spec(tapa, Causal{}, ak::ReluPower{2.f, 0.3f}), c);
    check<T>(s + ", Full, ReluPower{1, 0}", ak::make_spec(tapa, ak::ReluPower{1.f, 0.f}), c);
    check<T>(s + ", Causal, Softcap{5}", ak::make_spec(tapa, Causal{}, ak::Softcap{5.f}), c);
    check<T>(s + ", Full, Softcap{20}, Sigmoid{}",
             ak::make_spec(tapa, ak::Softcap{20.f}, ak::Sigmoid{}), c);
  });
}

}  // namespace

TEST_CASE("Tapa: attention matches the reference on ragged square shapes", "[position][tapa]") {
  // three query tiles, the last one ragged; 1 and 2 threads alternate over the head dims
  // (bitwise thread stability is test_attention_paths')
  for (const Index d : {33, 64, 80}) {
    Case c = Case{}
                 .lengths(150, 150)
                 .dims(d)
                 .laid_out(d == 33 ? Layout::Padded : Layout::Bshd)
                 .on_threads(d == 64 ? 1 : 2);
    check_grid(c);
  }
}

TEST_CASE("Tapa: attention matches the reference with two key tiles and GQA", "[position][tapa]") {
  // two key tiles, queries at 230..299
  // round(theta d) is not theta d: 0.5 * 33 = 16.5 rounds to 17
  Case c = Case{}.lengths(70, 300).heads(4, 2).dims(33, 20);
  check_grid(c);
}

TEST_CASE("Tapa: attention matches the reference for decode-like calls with q_offset",
          "[position][tapa]") {
  for (const Index lq : {1, 2, 3}) {
    Case c = Case{}.lengths(lq, 300).heads(4, 1).dims(33).on_threads(1);
    check_grid(c);    // bottom-right: the queries at 297..299 (for Lq = 3)
    c.q_offset = 40;  // queries in the middle: Full rows see keys on both sides
    c.threads = 2;
    check_grid(c);
  }
}

TEST_CASE("Tapa: attention matches the reference with bf16 and f16 storage", "[position][tapa]") {
  Case c = Case{}.lengths(67, 290).heads(2, 1).dims(33);  // two key tiles, GQA
  check_grid<Eigen::bfloat16>(c);
  check_grid<Eigen::half>(c);
  c.dim = 64;
  c.q_len = 1;
  check_grid<Eigen::bfloat16>(c);
  check_grid<Eigen::half>(c);
}

TEST_CASE("Tapa: theta = 1 (all amplitude) is plain attention with the default scale",
          "[position][tapa]") {
  for (const Index d : {33, 64}) {
    Case c = Case{}.lengths(90, 300).heads(4, 2).dims(d);
    INFO(ak::test::describe(c));
    const auto tapa = ak::test::run_kernel(ak::make_spec(Tapa{0.1f, 1.f}, Causal{}), c);
    const auto plain = ak::test::run_kernel(ak::make_spec(Causal{}), c);
    double worst = 0.0;
    for (std::size_t x = 0; x < tapa.out.size(); ++x)
      worst = std::max(worst, double(std::abs(tapa.out[x] - plain.out[x])));
    CHECK(worst <= kReorderedF32);
    CHECK(ak::test::max_lse_diff(tapa.lse, plain.lse) <= kReorderedF32);
    // theta < 1 is not plain attention: the comparison can fail.
    const auto half = ak::test::run_kernel(ak::make_spec(Tapa{0.1f, 0.5f}, Causal{}), c);
    CHECK(ak::test::max_lse_diff(half.lse, plain.lse) > 0.1);
  }
}

TEST_CASE("Tapa: the logit is a function of |i - j| for fixed q and k vectors",
          "[position][tapa]") {
  // Every query row is the same vector q and every key row the same vector k, V = identity
  // (Dv = Lk), Full mask, Softmax: row i of the output is the weights p_ij, and
  // s_ij = log p_ij + LSE_i. Queries sit on both sides of the keys, across two key tiles.
  const Index kLen = 300, kDim = 33;
  const Tapa tapa{0.3f, 0.5f};
  std::vector<float> qv(kDim), kv(kDim);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& x : qv) x = normal(rng);
  for (float& x : kv) x = normal(rng);
  std::vector<double> qd(qv.begin(), qv.end()), kd(kv.begin(), kv.end());

  for (const Index offset : {Index{0}, Index{150}, Index{1000}}) {
    const Index lq = 80;
    INFO("q_offset " << offset);
    std::vector<float> q(lq * kDim), k(kLen * kDim), v(kLen * kLen, 0.f), o(lq * kLen), lse(lq);
    for (Index r = 0; r < lq; ++r) std::copy(qv.begin(), qv.end(), q.begin() + r * kDim);
    for (Index j = 0; j < kLen; ++j) std::copy(kv.begin(), kv.end(), k.begin() + j * kDim);
    for (Index j = 0; j < kLen; ++j) v[std::size_t(j * kLen + j)] = 1.f;
    ak::attention(ak::make_spec(tapa), ak::bhsd(std::as_const(q).data(), 1, 1, lq, kDim),
                  ak::bhsd(std::as_const(k).data(), 1, 1, kLen, kDim),
                  ak::bhsd(std::as_const(v).data(), 1, 1, kLen, kLen),
                  ak::bhsd(o.data(), 1, 1, lq, kLen),
                  ak::Options{}.with_q_offset(offset).with_lse(lse));

    // logit_by_distance[t]: the first logit seen at distance t; every other one must match.
    std::vector<double> logit_by_distance(std::size_t(offset + lq + kLen), HUGE_VAL);
    double worst = 0.0, worst_formula = 0.0, spread_lo = HUGE_VAL, spread_hi = -HUGE_VAL;
    const double allowed = 1e-4;  // log of an f32 weight of ~1e-3 (a few ulp) + kTurnUlps
    for (Index r = 0; r < lq; ++r)
      for (Index j = 0; j < kLen; ++j) {
        const Index i = r + offset, t = std::abs(i - j);
        const double s = std::log(double(o[std::size_t(r * kLen + j)])) + double(lse[r]);
        double& first = logit_by_distance[std::size_t(t)];
        if (first == HUGE_VAL) first = s;
        worst = std::max(worst, std::abs(s - first));
        worst_formula = std::max(
            worst_formula, std::abs(s - tapa.reference_logit(qd.data(), kd.data(), kDim, i, j)));
        spread_lo = std::min(spread_lo, s);
        spread_hi = std::max(spread_hi, s);
      }
    CHECK(worst <= allowed);
    CHECK(worst_formula <= allowed);
    CHECK(spread_hi - spread_lo > 0.1);  // the logits do change with the distance
  }
}

TEST_CASE("Tapa: combine() joins a hand-made tile as the formula says, at every tile edge",
          "[position][tapa]") {
  // keys x lanes logits with row stride ld; padding lanes [lanes, ld) hold a sentinel that
  // must survive. The amplitude products s and phase products s2 are small integers over 8.
  const Index keys = 5, lanes = 2 * ak::simd::kWidth, ld = lanes + 3, dim = 33;
  struct Where {
    Index q_begin, k_begin;
    const char* what;
  };
  const Where places[] = {
      {0, 0, "same start"},
      {0, 3, "q_begin < k_begin, keys after some queries"},
      {2, 2 + lanes + 4, "k_begin > q_begin + lanes: every key after every query"},
      {100, 7, "every key far before every query"},
      {10, 12, "the diagonal crosses the tile"},
      {1000000, 999990, "large positions"},
  };
  for (const Tapa tapa : {Tapa{}, Tapa{0.1f, 0.25f}, Tapa{0.7f, 0.5f}, Tapa{0.1f, 1.f}})
    for (const Where& at : places) {
      INFO(at.what << ", alpha " << tapa.alpha << ", theta " << tapa.theta);
      std::vector<float> s(std::size_t(keys * ld)), s2(s.size()), work(std::size_t(lanes + keys));
      for (Index jj = 0; jj < keys; ++jj)
        for (Index r = 0; r < ld; ++r) {
          const auto x = std::size_t(jj * ld + r);
          s[x] = r < lanes ? float((3 * jj + 5 * r) % 17 - 8) / 8.f : 42.f;
          s2[x] = r < lanes ? float((7 * jj + 2 * r) % 13 - 6) / 8.f : 42.f;
        }
      const std::vector<float> s_in = s;
      tapa.combine(s.data(), s2.data(), keys, lanes, ld, at.q_begin, at.k_begin, dim, work.data());

      const Index a = tapa.amplitude_dims(dim), phase = dim - a;
      double worst = 0.0;
      bool padding_intact = true;
      for (Index jj = 0; jj < keys; ++jj)
        for (Index r = 0; r < ld; ++r) {
          const auto x = std::size_t(jj * ld + r);
          if (r >= lanes) {
            padding_intact = padding_intact && s[x] == 42.f;
            continue;
          }
          const double distance = double(std::abs((at.q_begin + r) - (at.k_begin + jj)));
          const double turn = phase == 0 ? 0.0
                                         : Tapa::kTwoPi * std::pow(distance, double(tapa.alpha)) *
                                               double(s2[x]) / std::sqrt(double(phase));
          const double want = double(s_in[x]) / std::sqrt(double(a)) * std::cos(turn);
          // The f32 turn is off by a few ulp of its size: kTurnUlps of it, and of the result.
          const double allowed = kTurnUlps * kF32Eps * (std::abs(turn) + 1.0);
          worst = std::max(worst, std::abs(double(s[x]) - want) / allowed);
        }
      CHECK(worst <= 1.0);
      CHECK(padding_intact);
    }
}

TEST_CASE("Tapa: alpha and theta out of range throw Error naming them", "[position][tapa]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const float alpha : {0.f, -0.1f, nan, inf}) {
    INFO("alpha " << alpha);
    ak::test::check_error([&] { (void)Tapa{alpha}; }, {"Tapa.alpha"});
  }
  for (const float theta : {0.f, -0.5f, 1.5f, 1.0001f, nan}) {
    INFO("theta " << theta);
    ak::test::check_error([&] { (void)Tapa{0.1f, theta}; }, {"Tapa.theta"});
  }
  CHECK_NOTHROW(Tapa{2.f, 1.f});
  CHECK_NOTHROW(Tapa{0.1f, 1e-3f});
}

TEST_CASE("Tapa: Options::scale is refused, naming it, and nothing is written",
          "[position][tapa]") {
  const Case c = Case{}.lengths(5, 9).heads(2, 1).dims(16).laid_out(Layout::Bhsd);
  const ak::test::Inputs<float> in(c, 1);
  Tensor<float> o(Layout::Bhsd, 1, 2, 5, 16);
  o.fill(42.f);
  std::vector<float> lse(10, 42.f);
  const auto spec = ak::make_spec(Tapa{}, Causal{});
  const ak::Options options = ak::Options{}.with_scale(0.25f).with_lse(lse);
  ak::test::check_refused(
      [&] { ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, options); },
      {"Options.scale"}, {&o.memory, &lse});
  Tensor<double> expected(Layout::Bhsd, 1, 2, 5, 16);
  ak::test::check_error(
      [&] {
        ak::reference::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), expected.view,
                                 options);
      },
      {"Options.scale"});
  // Without the scale the same call runs.
  CHECK_NOTHROW(ak::attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view,
                              ak::Options{}.with_lse(lse)));
}
