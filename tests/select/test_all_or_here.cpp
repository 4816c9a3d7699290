// all_or_here() (select/all_or_here.hpp) against reference::attention() under a test-side
// mask that spells the routing out pair by pair: keep(b, h, i, j) = j <= i && (route full ||
// i - j < window). Random routes (booleans, gate logits with default and custom thresholds),
// Softmax (output + LSE), Sigmoid, SoftplusL1, Softcap, ragged L, Lq != Lk with q_offset (rows
// that see nothing included), GQA, BSHD / BHSD, 1 and 2 threads (bitwise equal), f32 and
// bf16; properties (all full = Causal, all here = a window, full_fraction) and errors. Then
// Remapped<Mask> (mask/remap.hpp): every face against brute force over the true positions.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/block_mask.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/mask/combine.hpp>
#include <attnkit/mask/remap.hpp>
#include <attnkit/mask/sliding_window.hpp>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/select/all_or_here.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/reference_check.hpp"
#include "support/select_oracles.hpp"
#include "support/test_names.hpp"

using ak::AhaRoutes;
using ak::Range;
using ak::TileKind;
using ak::test::AhaMask;
using ak::test::random_routes;

namespace {

// Every route full, or every route here.
AhaRoutes uniform_routes(const Case& c, bool full) {
  return AhaRoutes(c.batch, c.q_len, c.q_heads,
                   std::vector<unsigned char>(static_cast<std::size_t>(c.rows()), full ? 1 : 0));
}

// Gate logits N(0, 4): sigmoid(g) spreads over (0, 1) around every threshold tested.
std::vector<float> random_gates(Index n, std::uint32_t seed) {
  return ak::test::random_values(static_cast<std::size_t>(n), seed, 2.0);
}

// all_or_here()'s output [B, Hq, Lq, Dv] (Bhsd) and row statistic on the inputs of c.
template <class T = float, class Spec>
ak::test::KernelResult run_aha(const Spec& spec, const Case& c, const AhaRoutes& routes,
                               Index window, std::uint32_t seed = 11) {
  const ak::test::Inputs<T> in(c, seed);
  return ak::test::run_into<Spec>(c, [&](const ak::View<float>& o, const ak::Options& options) {
    ak::all_or_here(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, routes, window, options);
  });
}

// all_or_here(spec) against reference::attention(spec + AhaMask), with the named tolerances of
// support/reference_check.hpp (Softmax / SoftplusL1 rows convex combinations of V, Sigmoid
// rows per unit of magnitude), the LSE within tol::kLseF32 + 1e-5 |lse|.
template <class T = float, class Score, class N>
void check(const std::string& what, const Score& score, const N& n, const Case& c,
           const AhaRoutes& routes, Index window, std::uint32_t seed = 11) {
  INFO(what << ", " << ak::test::describe(c) << " window " << window << " full "
            << routes.full_fraction() << ", " << ak::test::storage_name<T>());
  const AhaMask mask{&routes, window, c.offset()};
  const auto spec = ak::make_spec(score, n);
  const ak::test::Inputs<T> in(c, seed);
  ak::test::Tolerance t;
  t.lse_rel = 1e-5;
  ak::test::check_agreement(ak::test::agreement(
      ak::make_spec(score, n, mask), c, in,
      [&](const ak::View<float>& o, const ak::Options& options) {
        ak::all_or_here(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, routes, window, options);
      },
      t));
}

// One Case over the grid of normalizers and scores, with routes of several densities.
template <class T = float>
void check_grid(const Case& c, Index window, std::uint32_t seed) {
  for (const double p_full : {0.0, 0.3, 0.8}) {
    const AhaRoutes routes =
        random_routes(c, p_full, seed + static_cast<std::uint32_t>(10 * p_full));
    check<T>("Softmax", ak::Dot{}, ak::Softmax{}, c, routes, window);
    check<T>("Sigmoid{}", ak::Dot{}, ak::Sigmoid{}, c, routes, window);
    check<T>("SoftplusL1", ak::Dot{}, ak::SoftplusL1{}, c, routes, window);
    check<T>("Softcap{5}, Softmax", ak::Softcap{5.f}, ak::Softmax{}, c, routes, window);
  }
}

}  // namespace

TEST_CASE("all_or_here: matches the reference routing mask on ragged square shapes",
          "[select][aha]") {
  for (const Index len : {1, 37, 130, 200})
    for (const Layout layout : {Layout::Bshd, Layout::Bhsd}) {
      Case c = Case{}.lengths(len, len).dims(32).laid_out(layout).on_threads(1);
      check_grid(c, 16, static_cast<std::uint32_t>(len));
    }
}

TEST_CASE("all_or_here: matches the reference with GQA, two batches, d 64, two threads",
          "[select][aha]") {
  Case c = Case{}.lengths(150, 150).heads(4, 2).dims(64, 40).batches(2);
  check_grid(c, 33, 3);
  c.threads = 1;
  check_grid(c, 1, 4);  // a window of one: the query's own key only
}

TEST_CASE("all_or_here: matches the reference with Lq != Lk and q_offset, rows seeing nothing",
          "[select][aha]") {
  Case c = Case{}.lengths(40, 170).heads(3, 1).dims(32);
  check_grid(c, 24, 5);  // bottom-right: queries at 130 .. 169
  c.q_offset = 70;
  check_grid(c, 24, 6);
  c.q_offset = -5;  // the first five rows sit before key 0
  check_grid(c, 24, 7);
  c.q_len = 90;
  c.kv_len = 30;
  c.q_offset = -20;  // Lq > Lk
  check_grid(c, 8, 8);
}

TEST_CASE("all_or_here: matches the reference with bf16 storage", "[select][aha][bf16]") {
  Case c = Case{}.lengths(97, 97).heads(4, 2).dims(32).on_threads(1);
  check_grid<Eigen::bfloat16>(c, 20, 9);
}

TEST_CASE("all_or_here: routes from gate logits, default and custom thresholds", "[select][aha]") {
  Case c = Case{}.lengths(120, 120).dims(32);
  const auto gates = random_gates(c.batch * c.q_len * c.q_heads, 21);
  for (const float threshold : {0.5f, 0.2f, 0.9f}) {
    INFO("threshold " << threshold);
    const AhaRoutes routes =
        threshold == 0.5f ? AhaRoutes::from_gates(gates, c.batch, c.q_len, c.q_heads)
                          : AhaRoutes::from_gates(gates, c.batch, c.q_len, c.q_heads, threshold);
    Index full = 0, mismatches = 0;
    for (Index b = 0; b < c.batch; ++b)
      for (Index t = 0; t < c.q_len; ++t)
        for (Index h = 0; h < c.q_heads; ++h) {
          const double g = gates[static_cast<std::size_t>((b * c.q_len + t) * c.q_heads + h)];
          const double sigmoid = 1.0 / (1.0 + std::exp(-g));
          if (std::abs(sigmoid - threshold) < 1e-6) continue;  // too close to call in f32
          const bool want = sigmoid > threshold;
          full += want ? 1 : 0;
          mismatches += want != routes.is_full(b, t, h) ? 1 : 0;
        }
    CHECK(mismatches == 0);
    CHECK(full > 0);
    CHECK(full < c.batch * c.q_len * c.q_heads);
    check("gates, Softmax", ak::Dot{}, ak::Softmax{}, c, routes, 16);
  }
}

TEST_CASE("all_or_here: one and two threads give bitwise equal results", "[select][aha]") {
  Case c = Case{}.lengths(300, 300).heads(4, 2).dims(64);
  const AhaRoutes routes = random_routes(c, 0.4, 31);
  const auto spec = ak::make_spec(ak::Softmax{});
  c.threads = 1;
  const auto one = run_aha(spec, c, routes, 50);
  c.threads = 2;
  const auto two = run_aha(spec, c, routes, 50);
  REQUIRE(one.out.size() == two.out.size());
  CHECK(std::memcmp(one.out.data(), two.out.data(), one.out.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * sizeof(float)) == 0);
}

TEST_CASE("all_or_here: every route full equals causal attention", "[select][aha]") {
  const Case c = Case{}.lengths(100, 180).heads(2, 1).dims(32);
  const AhaRoutes routes = uniform_routes(c, true);
  CHECK(routes.full_fraction() == 1.0);
  const auto aha = run_aha(ak::make_spec(ak::Softmax{}), c, routes, 7);
  const auto dense = ak::test::run_kernel(ak::make_spec(Causal{}), c, 11);
  CHECK(ak::test::max_lse_diff(aha.out, dense.out) <= tol::kF32);
  CHECK(ak::test::max_lse_diff(aha.lse, dense.lse) <= tol::kLseF32);
}

TEST_CASE("all_or_here: every route here equals a causal sliding window", "[select][aha]") {
  const Case c = Case{}.lengths(200, 200).heads(2, 1).dims(32);
  const AhaRoutes routes = uniform_routes(c, false);
  CHECK(routes.full_fraction() == 0.0);
  for (const Index window : {1, 5, 64, 256}) {
    INFO("window " << window);
    const auto aha = run_aha(ak::make_spec(ak::Softmax{}), c, routes, window);
    const auto dense =
        ak::test::run_kernel(ak::make_spec(Causal{} & SlidingWindow{window - 1, 0}), c, 11);
    CHECK(ak::test::max_lse_diff(aha.out, dense.out) <= tol::kF32);
    CHECK(ak::test::max_lse_diff(aha.lse, dense.lse) <= tol::kLseF32);
  }
}

TEST_CASE("AhaRoutes: full_fraction counts the routes to full attention", "[select][aha]") {
  CHECK(AhaRoutes().full_fraction() == 0.0);
  const AhaRoutes r(1, 4, 2, {1, 0, 0, 0, 1, 1, 0, 1});
  CHECK(std::abs(r.full_fraction() - 0.5) < 1e-12);
  CHECK(r.is_full(0, 0, 0));
  CHECK_FALSE(r.is_full(0, 0, 1));
  CHECK(r.is_full(0, 3, 1));
  Case c = Case{}.batches(2);
  c.q_len = 77;
  c.q_heads = 3;
  const AhaRoutes random = random_routes(c, 0.25, 41);
  Index full = 0;
  for (Index b = 0; b < c.batch; ++b)
    for (Index t = 0; t < c.q_len; ++t)
      for (Index h = 0; h < c.q_heads; ++h) full += random.is_full(b, t, h) ? 1 : 0;
  CHECK(std::abs(random.full_fraction() - double(full) / double(c.rows())) < 1e-12);
}

// full_fraction() counts every nonzero route, as is_full() does: {2, 0, 255, 0} is half full.
TEST_CASE("AhaRoutes: full_fraction agrees with is_full for any nonzero route", "[select][aha]") {
  const AhaRoutes r(1, 2, 2, {2, 0, 255, 0});
  CHECK(r.is_full(0, 0, 0));
  CHECK(r.is_full(0, 1, 0));
  CHECK(std::abs(r.full_fraction() - 0.5) < 1e-12);
}

// Each gathered call is one head ([1, 1, n, d] views): per-head normalizer parameters must
// follow the query head it stands for (select::for_head), or the inner call would refuse them.
TEST_CASE("all_or_here: per-head normalizer parameters follow the query head", "[select][aha]") {
  Case c = Case{}.lengths(64, 64).dims(32);
  c.q_heads = 2;
  const AhaRoutes routes = random_routes(c, 0.5, 51);
  check("Sigmoid::per_head", ak::Dot{}, ak::Sigmoid::per_head({-1.f, -2.f}), c, routes, 8);
  check("Softmax::with_sinks", ak::Dot{}, ak::Softmax::with_sinks({0.f, 1.f}), c, routes, 8);
}

TEST_CASE("all_or_here: refuses bad routes, window and threshold before writing",
          "[select][aha][errors]") {
  Case c = Case{}.lengths(20, 20).dims(32).batches(2);
  c.q_heads = 2;
  const ak::test::Inputs<float> in(c, 3);
  Tensor<float> o(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  o.fill(42.f);
  const auto untouched = [&] { return o.holds(42.f); };
  const auto spec = ak::make_spec(ak::Softmax{});
  const auto call = [&](const AhaRoutes& routes, Index window) {
    ak::all_or_here(spec, in.q.cview(), in.k.cview(), in.v.cview(), o.view, routes, window);
  };
  const auto routes_of = [](Index b, Index l, Index h) {
    return AhaRoutes(b, l, h, std::vector<unsigned char>(static_cast<std::size_t>(b * l * h), 1));
  };
  CHECK_THROWS_AS(call(routes_of(1, 20, 2), 8), ak::Error);  // batch
  CHECK_THROWS_AS(call(routes_of(2, 19, 2), 8), ak::Error);  // length
  CHECK_THROWS_AS(call(routes_of(2, 20, 1), 8), ak::Error);  // heads
  CHECK_THROWS_AS(call(AhaRoutes(), 8), ak::Error);
  CHECK_THROWS_AS(call(routes_of(2, 20, 2), 0), ak::Error);
  CHECK_THROWS_AS(call(routes_of(2, 20, 2), -3), ak::Error);
  CHECK(untouched());
  CHECK_NOTHROW(call(routes_of(2, 20, 2), 1));  // the checks above can pass
  CHECK_FALSE(untouched());

  CHECK_THROWS_AS(AhaRoutes(1, 2, 2, {1, 0, 1}), ak::Error);  // size != b * l * h
  const std::vector<float> gates(8, 0.f);
  for (const float t : {0.f, 1.f, -0.5f, 1.5f, ak::test::kNaN}) {
    INFO("threshold " << t);
    CHECK_THROWS_AS(AhaRoutes::from_gates(gates, 1, 4, 2, t), ak::Error);
  }
  CHECK_THROWS_AS(AhaRoutes::from_gates(gates, 1, 3, 2), ak::Error);
  CHECK_NOTHROW(AhaRoutes::from_gates(gates, 1, 4, 2, 0.01f));
}

// ---- Remapped<Mask> ----------------------------------------------------------------------

namespace {

// A sorted random subset of [begin, end) holding about `keep` of its positions (at least 1).
std::vector<Index> random_positions(Index begin, Index end, double keep, std::mt19937& rng) {
  std::bernoulli_distribution take(keep);
  std::vector<Index> out;
  for (Index p = begin; p < end; ++p)
    if (take(rng)) out.push_back(p);
  if (out.empty()) out.push_back(begin);
  return out;
}

// Every face of remap(inner, qp, kp) against inner.keep at the true positions.
template <class Inner>
void check_remapped(const std::string& what, const Inner& inner, const std::vector<Index>& qp,
                    const std::vector<Index>& kp, std::mt19937& rng, Index b = 0, Index h = 0) {
  INFO(what << ", " << qp.size() << " queries, " << kp.size() << " keys, inner (b, h) = (" << b
            << ", " << h << ")");
  const auto nq = static_cast<Index>(qp.size()), nk = static_cast<Index>(kp.size());
  const auto m = ak::remap(inner, qp.data(), kp.data(), nk, b, h);
  // The call is (0, 0): the remapped mask asks the inner one at (b, h).
  const auto truth = [&](Index r, Index j) {
    return inner.keep(b, h, qp[static_cast<std::size_t>(r)], kp[static_cast<std::size_t>(j)]);
  };

  Index keep_wrong = 0;
  for (Index r = 0; r < nq; ++r)
    for (Index j = 0; j < nk; ++j) keep_wrong += m.keep(0, 0, r, j) != truth(r, j) ? 1 : 0;
  CHECK(keep_wrong == 0);

  // classify: sound on random tiles of gathered rows and keys.
  std::uniform_int_distribution<Index> qd(0, nq - 1), kd(0, nk - 1);
  Index unsound = 0, full = 0, empty = 0;
  for (int t = 0; t < 400; ++t) {
    Index q0 = qd(rng), q1 = qd(rng), k0 = kd(rng), k1 = kd(rng);
    if (q0 > q1) std::swap(q0, q1);
    if (k0 > k1) std::swap(k0, k1);
    const Range q{q0, q1 + 1}, kv{k0, k1 + 1};
    Index kept = 0;
    for (Index r = q.begin; r < q.end; ++r)
      for (Index j = kv.begin; j < kv.end; ++j) kept += truth(r, j) ? 1 : 0;
    const TileKind kind = ak::detail::tile_kind_of(m, 0, 0, q, kv);
    full += kind == TileKind::Full;
    empty += kind == TileKind::Empty;
    if (kind == TileKind::Full && kept != (q.end - q.begin) * (kv.end - kv.begin)) ++unsound;
    if (kind == TileKind::Empty && kept != 0) ++unsound;
  }
  CHECK(unsound == 0);
  INFO("Full tiles " << full << ", Empty tiles " << empty);
  CHECK(ak::detail::tile_kind_of(m, 0, 0, Range{0, 0}, Range{0, nk}) == TileKind::Empty);

  // key_ranges / for_each_key_range (through the key schedule): every kept key is covered.
  for (int t = 0; t < 100; ++t) {
    Index q0 = qd(rng), q1 = qd(rng);
    if (q0 > q1) std::swap(q0, q1);
    const Range q{q0, q1 + 1};
    std::vector<char> covered(static_cast<std::size_t>(nk), 0);
    Index last_end = -1;
    bool ordered = true;
    ak::detail::for_each_key_tile(m, 0, 0, q, nk, 16, [&](Range kv, TileKind) {
      ordered = ordered && kv.begin >= last_end;
      last_end = kv.end;
      for (Index j = kv.begin; j < kv.end; ++j) covered[static_cast<std::size_t>(j)] = 1;
    });
    Index missed = 0;
    for (Index r = q.begin; r < q.end; ++r)
      for (Index j = 0; j < nk; ++j)
        missed += truth(r, j) && !covered[static_cast<std::size_t>(j)] ? 1 : 0;
    INFO("query rows [" << q.begin << ", " << q.end << ")");
    CHECK(missed == 0);
    CHECK(ordered);
  }
  if constexpr (ak::detail::has_key_ranges<decltype(m), Range>::value) {
    Index missed = 0;
    for (Index r = 0; r < nq; ++r)
      for (Index j = 0; j < nk; ++j) {
        if (!truth(r, j)) continue;
        bool in = false;
        for (const Range& x : m.key_ranges(0, 0, Range{r, r + 1}))
          in = in || (x.begin <= j && j < x.end);
        missed += in ? 0 : 1;
      }
    CHECK(missed == 0);
  }

  // runs: exactly the gathered keys each query keeps.
  if constexpr (ak::detail::has_runs<decltype(m)>::value) {
    Index wrong = 0;
    for (Index r = 0; r < nq; ++r) {
      std::vector<char> in(static_cast<std::size_t>(nk), 0);
      for (const Range& x : m.runs(0, 0, r))
        for (Index j = std::max<Index>(x.begin, 0); j < std::min(x.end, nk); ++j)
          in[static_cast<std::size_t>(j)] = 1;
      for (Index j = 0; j < nk; ++j) wrong += (in[static_cast<std::size_t>(j)] != 0) != truth(r, j);
    }
    CHECK(wrong == 0);
  }
}

}  // namespace

TEST_CASE("Remapped: identity positions leave the mask unchanged", "[select][aha][remap]") {
  const auto m = ak::remap(Causal{} & SlidingWindow{3, 0}, nullptr, nullptr, 0);
  Index wrong = 0;
  for (Index i = -2; i < 20; ++i)
    for (Index j = 0; j < 20; ++j) wrong += m.keep(0, 0, i, j) != (j <= i && i - j <= 3);
  CHECK(wrong == 0);
  CHECK(m.classify(0, 0, Range{10, 12}, Range{8, 10}) == TileKind::Full);
  CHECK(m.classify(0, 0, Range{10, 12}, Range{0, 4}) == TileKind::Empty);
}

TEST_CASE("Remapped<Causal>: faces agree with the true positions", "[select][aha][remap]") {
  std::mt19937 rng(61);
  for (const double density : {0.1, 0.5, 0.95}) {
    const auto qp = random_positions(0, 300, density, rng);
    const auto kp = random_positions(0, 300, density, rng);
    check_remapped("Causal, gathered queries and keys", Causal{}, qp, kp, rng);
    std::vector<Index> all_keys(300);
    for (Index j = 0; j < 300; ++j) all_keys[static_cast<std::size_t>(j)] = j;
    check_remapped("Causal, gathered queries only", Causal{}, qp, all_keys, rng);
    check_remapped("Causal, queries at 200 .. 500", Causal{},
                   random_positions(200, 500, density, rng), kp, rng);
  }
}

TEST_CASE("Remapped<Causal & SlidingWindow>: faces agree with the true positions",
          "[select][aha][remap]") {
  std::mt19937 rng(62);
  for (const Index left : {0, 7, 40})
    for (const double density : {0.15, 0.6}) {
      const auto qp = random_positions(-10, 260, density, rng);
      const auto kp = random_positions(0, 260, density, rng);
      check_remapped("Causal & SlidingWindow{" + std::to_string(left) + ", 0}",
                     Causal{} & SlidingWindow{left, 0}, qp, kp, rng);
    }
}

TEST_CASE("Remapped<BlockMask>: faces agree with the true positions", "[select][aha][remap]") {
  std::mt19937 rng(63);
  ak::BlockMaskLayout layout;
  layout.batch = 2;
  layout.heads = 3;
  layout.q_len = 200;
  layout.kv_len = 230;
  layout.block_q = 16;
  layout.block_k = 32;
  layout.q_offset = 30;
  // A per-head pattern so that (batch, head) matter: document-like causal windows.
  struct Rule {
    bool keep(Index b, Index h, Index i, Index j) const {
      return j <= i && i - j < 20 + 30 * h + 7 * b;
    }
  };
  const auto block = ak::make_block_mask(Rule{}, layout);
  for (const double density : {0.2, 0.7}) {
    const auto qp = random_positions(30, 230, density, rng);
    const auto kp = random_positions(0, 230, density, rng);
    check_remapped("BlockMask, (b, h) = (0, 0)", block, qp, kp, rng, 0, 0);
    check_remapped("BlockMask, (b, h) = (1, 2)", block, qp, kp, rng, 1, 2);
  }
}

TEST_CASE("Remapped: a gathered attention call equals the reference at true positions",
          "[select][aha][remap]") {
  // Queries and keys gathered by hand; the kernel under Remapped must match the reference
  // run on the same gathered rows with the mask spelled at true positions.
  std::mt19937 rng(64);
  const auto qp = random_positions(0, 180, 0.4, rng);
  const auto kp = random_positions(0, 180, 0.6, rng);
  const auto nq = static_cast<Index>(qp.size()), nk = static_cast<Index>(kp.size());
  const Index d = 32;
  Tensor<float> q(Layout::Bhsd, 1, 1, nq, d), k(Layout::Bhsd, 1, 1, nk, d),
      v(Layout::Bhsd, 1, 1, nk, d), o(Layout::Bhsd, 1, 1, nq, d);
  Tensor<double> expected(Layout::Bhsd, 1, 1, nq, d);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  struct AtTrue {
    using slot = ak::MaskSlot;
    const std::vector<Index>*qp, *kp;
    bool keep(Index, Index, Index i, Index j) const {
      const Index a = (*qp)[static_cast<std::size_t>(i)], b = (*kp)[static_cast<std::size_t>(j)];
      return b <= a && a - b <= 25;
    }
  };
  const auto inner = Causal{} & SlidingWindow{25, 0};
  std::vector<float> lse(static_cast<std::size_t>(nq)), lse_expected(lse.size());
  const auto options = ak::Options{}.with_q_offset(0).with_threads(2);
  ak::attention(ak::make_spec(ak::remap(inner, qp.data(), kp.data(), nk)), q.cview(), k.cview(),
                v.cview(), o.view, options.with_lse(lse));
  ak::reference::attention(ak::make_spec(AtTrue{&qp, &kp}), q.cview(), k.cview(), v.cview(),
                           expected.view, options.with_lse(lse_expected));
  CHECK(ak::test::max_abs_diff(o.view, expected.view) <= tol::kF32);
  CHECK(ak::test::max_lse_diff(lse, lse_expected) <= tol::kLseF32);
}

TEST_CASE("AhaRoutes: sizes whose product overflows Index throw instead of wrapping",
          "[select][aha][errors]") {
  // 2^32 * 2^32 * 1 wraps to 0, the size of an empty route vector: without checked arithmetic
  // the routes were accepted (and the product is undefined behaviour).
  const Index big = Index{1} << 32;
  CHECK_THROWS_AS(AhaRoutes(big, big, 1, {}), ak::Error);
  CHECK_THROWS_AS(AhaRoutes(1, big, big, {}), ak::Error);
  CHECK_THROWS_AS(AhaRoutes::from_gates({}, big, big, 1), ak::Error);
  CHECK_NOTHROW(AhaRoutes(big, 0, big, {}));  // a zero size: the product is 0, no overflow
}
