// The backward passes of the gathered drivers (moba_attention_backward, all_or_here_backward,
// stripe_attention_backward, superlinear_attention_backward) against
// reference::attention_backward() (f64) on the equivalent full spec: the same Score and
// Normalizer under a test-side element mask written from the routes / selection, the forward
// tests' own (support/select_oracles.hpp). The driver's own forward saves o and the row
// statistic; every gradient is compared relative to its largest element (tol::kGradF32),
// per-head parameter gradients likewise. Ragged lengths, Lq != Lk with offsets (rows that see no
// key), GQA / MQA, padded layouts, Dv != D; 1 and 2 threads give the same bits; a bad input per
// driver throws before any gradient is written.
// The shared part of the drivers' backward (select/gather_backward.hpp: part_backward,
// CallSums) is what every case here runs.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/normalizer/sigmoid.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <attnkit/reference/attention_backward.hpp>
#include <attnkit/score/softcap.hpp>
#include <attnkit/select/all_or_here_backward.hpp>
#include <attnkit/select/moba_backward.hpp>
#include <attnkit/select/stripes_backward.hpp>
#include <attnkit/select/superlinear_backward.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/select_oracles.hpp"
#include "support/test_names.hpp"

using ak::test::Grads;
using ak::test::relative_error;

namespace {

// q, k, v, dO of a case, and o with its row statistic as the driver's forward wrote them.
template <class T = float>
struct Io {
  Tensor<T> q, k, v, d_o;
  Tensor<float> o;
  std::vector<float> stat;
  explicit Io(const Case& c, std::uint32_t seed)
      : q(c.layout, c.batch, c.q_heads, c.q_len, c.dim),
        k(c.layout, c.batch, c.kv_heads, c.kv_len, c.dim),
        v(c.layout, c.batch, c.kv_heads, c.kv_len, c.dv()),
        d_o(c.layout, c.batch, c.q_heads, c.q_len, c.dv()),
        o(c.layout, c.batch, c.q_heads, c.q_len, c.dv()),
        stat(static_cast<std::size_t>(c.rows()), 0.f) {
    q.randomize(seed, c.stddev);
    k.randomize(seed + 1, c.stddev);
    v.randomize(seed + 2);
    d_o.randomize(seed + 3);
  }
  // The case's options, with the statistic's buffer when the normalizer has one.
  template <class Spec = decltype(ak::make_spec())>
  ak::Options options(const Case& c) {
    if constexpr (ak::detail::row_stat_kind<typename Spec::Normalizer>() == ak::RowStat::None)
      return c.options();
    else
      return c.options().with_lse(stat);
  }
};

// The per-head parameter gradient, relative to its largest element.
double param_error(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, worst = 0.0;
  for (std::size_t h = 0; h < got.size(); ++h) {
    scale = std::max(scale, std::abs(want[h]));
    worst = std::max(worst, std::abs(double(got[h]) - want[h]));
  }
  return worst / scale;
}

// forward(o view, options) writes o and the statistic; backward(io, grads, options, param)
// the driver's gradients; the reference runs on ref_spec (the element mask) with the same o.
template <class G = float, class T, class RefSpec, class Forward, class Backward>
void check_driver(const std::string& name, const Case& c, Io<T>& io, const RefSpec& ref_spec,
                  Forward&& forward, Backward&& backward, bool with_param = false) {
  INFO(name << ", " << ak::test::describe(c) << ", inputs " << ak::test::storage_name<T>()
            << ", gradients " << ak::test::storage_name<G>());
  const ak::Options options = io.template options<RefSpec>(c);
  forward(io.o.view, options);
  Grads<G> got(c, c.layout);
  backward(got, options, with_param ? ak::Span<float>(got.param) : nullptr);
  Grads<double> want(c, Layout::Bhsd);
  std::vector<double> want_param(static_cast<std::size_t>(c.q_heads), 0.0);
  std::vector<float> want_param_f(want_param.size(), 0.f);
  ak::reference::attention_backward(
      ref_spec, io.q.cview(), io.k.cview(), io.v.cview(), io.o.cview(), io.d_o.cview(),
      want.dq.view, want.dk.view, want.dv.view, options,
      with_param ? ak::ParamGrads{}.with_normalizer(want_param_f) : ak::ParamGrads{});
  const double allowed = ak::test::grad_tolerance<G>();
  CHECK(relative_error(got.dq.view, want.dq.view) <= allowed);
  CHECK(relative_error(got.dk.view, want.dk.view) <= allowed);
  CHECK(relative_error(got.dv.view, want.dv.view) <= allowed);
  if (with_param) {
    std::copy(want_param_f.begin(), want_param_f.end(), want_param.begin());
    CHECK(param_error(got.param, want_param) <= tol::kGradF32);
  }
}

// Two runs of backward (1 and 2 threads) give the same bits.
template <class Backward>
void check_threads(const Case& c, Backward&& backward) {
  Grads<float> one(c, Layout::Bhsd), two(c, Layout::Bhsd);
  backward(one, 1);
  backward(two, 2);
  const auto same = [](const Tensor<float>& a, const Tensor<float>& b) {
    return std::memcmp(a.memory.data(), b.memory.data(), a.memory.size() * sizeof(float)) == 0;
  };
  CHECK(same(one.dq, two.dq));
  CHECK(same(one.dk, two.dk));
  CHECK(same(one.dv, two.dv));
}

// Every gradient element set to 7 / still 7 (nothing was written).
void fill_sevens(Grads<float>& g) {
  for (Tensor<float>* t : {&g.dq, &g.dk, &g.dv}) std::fill(t->memory.begin(), t->memory.end(), 7.f);
}
bool all_sevens(const Grads<float>& g) {
  for (const Tensor<float>* t : {&g.dq, &g.dk, &g.dv})
    if (std::any_of(t->memory.begin(), t->memory.end(), [](float x) { return x != 7.f; }))
      return false;
  return true;
}

// ---- MoBA ----

struct MobaCase {
  Case c;
  Index block, topk;
};

template <class T = float, class G = float, class Score>
void check_moba(const MobaCase& m, const Score& score, std::uint32_t seed) {
  const Case& c = m.c;
  Io<T> io(c, seed);
  const auto routes =
      ak::route_topk_blocks(io.q.cview(), io.k.cview(), m.block, m.topk, c.q_offset);
  const auto spec = ak::make_spec(score);
  check_driver<G>(
      "moba block " + std::to_string(m.block) + " topk " + std::to_string(m.topk), c, io,
      ak::make_spec(score, ak::test::moba_mask(&routes)),
      [&](const ak::View<float>& o, const ak::Options& opt) {
        ak::moba_attention(spec, io.q.cview(), io.k.cview(), io.v.cview(), o, routes, m.block, opt);
      },
      [&](Grads<G>& g, const ak::Options& opt, ak::Span<float>) {
        ak::moba_attention_backward(spec, io.q.cview(), io.k.cview(), io.v.cview(), io.o.cview(),
                                    io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view, routes,
                                    m.block, opt);
      });
}

// ---- All-or-Here ----

template <class T = float, class G = float, class Score, class N>
void check_aha(const std::string& name, const Case& c, const Score& score, const N& n,
               double p_full, Index window, std::uint32_t seed) {
  Io<T> io(c, seed);
  const auto routes = ak::test::random_routes(c, p_full, seed);
  const auto spec = ak::make_spec(score, n);
  check_driver<G>(
      "all_or_here " + name + " full " + std::to_string(p_full) + " window " +
          std::to_string(window),
      c, io, ak::make_spec(score, n, ak::test::AhaMask{&routes, window, c.offset()}),
      [&](const ak::View<float>& o, const ak::Options& opt) {
        ak::all_or_here(spec, io.q.cview(), io.k.cview(), io.v.cview(), o, routes, window, opt);
      },
      [&](Grads<G>& g, const ak::Options& opt, ak::Span<float> param) {
        ak::all_or_here_backward(spec, io.q.cview(), io.k.cview(), io.v.cview(), io.o.cview(),
                                 io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view, routes, window,
                                 opt, ak::ParamGrads{}.with_normalizer(param));
      },
      ak::test::trains_param<decltype(spec)>());
}

// ---- Stripes ----

template <class Score, class N>
void check_stripes(const std::string& name, const Case& c, const Score& score, const N& n,
                   Index local, std::uint32_t seed) {
  Io<> io(c, seed);
  const auto sel = ak::anchor_stripes(io.q.cview(), io.k.cview(),
                                      ak::test::small_stripe_params(local), c.options());
  const auto spec = ak::make_spec(score, n);
  INFO("kept fraction " << sel.kept_fraction());
  check_driver(
      "stripes " + name + " local " + std::to_string(local), c, io,
      ak::make_spec(score, n, ak::test::stripe_mask(&sel)),
      [&](const ak::View<float>& o, const ak::Options& opt) {
        ak::stripe_attention(spec, io.q.cview(), io.k.cview(), io.v.cview(), o, sel, opt);
      },
      [&](Grads<float>& g, const ak::Options& opt, ak::Span<float> param) {
        ak::stripe_attention_backward(spec, io.q.cview(), io.k.cview(), io.v.cview(), io.o.cview(),
                                      io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view, sel, opt,
                                      ak::ParamGrads{}.with_normalizer(param));
      },
      ak::test::trains_param<decltype(spec)>());
}

// ---- Superlinear ----

template <class Score>
void check_superlinear(const Case& c, const Score& score, const ak::SuperlinearParams& params,
                       std::uint32_t seed) {
  Io<> io(c, seed);
  Tensor<float> routing(c.layout, c.batch, c.q_heads, c.q_len, c.dim);
  routing.randomize(seed + 7);
  const auto sel = ak::superlinear_spans(routing.cview(), io.k.cview(), params, c.options());
  const auto spec = ak::make_spec(score);
  check_driver(
      "superlinear topk " + std::to_string(params.topk) + " span " + std::to_string(params.span), c,
      io, ak::make_spec(score, ak::test::span_mask(&sel)),
      [&](const ak::View<float>& o, const ak::Options& opt) {
        ak::superlinear_attention(spec, io.q.cview(), io.k.cview(), io.v.cview(), o, sel, opt);
      },
      [&](Grads<float>& g, const ak::Options& opt, ak::Span<float>) {
        ak::superlinear_attention_backward(spec, io.q.cview(), io.k.cview(), io.v.cview(),
                                           io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view,
                                           g.dv.view, sel, opt);
      });
}

}  // namespace

TEST_CASE("moba_attention_backward: matches the reference under each row's chosen blocks",
          "[select][moba][backward]") {
  const MobaCase cases[] = {
      {Case{}.lengths(100, 100).heads(2, 2).dims(32), 16, 3},  // L not a multiple of the block
      {Case{}.lengths(37, 150).heads(4, 2).dims(64, 40).laid_out(Layout::Padded), 32, 2},  // GQA
      {Case{}.lengths(50, 120).heads(3, 1).dims(32).at_offset(10).batches(2), 12, 4},      // MQA
      {Case{}.lengths(40, 64).heads(2, 2).dims(32).at_offset(-5), 8, 3},  // rows see nothing
      {Case{}.lengths(90, 60).heads(2, 1).dims(32), 16, 2},               // Lq > Lk
      {Case{}.lengths(200, 200).heads(2, 1).dims(32), 16, 20},            // topk > blocks
  };
  std::uint32_t seed = 100;
  for (const MobaCase& m : cases) check_moba(m, ak::Dot{}, seed += 10);
  check_moba(cases[0], ak::Softcap{5.f}, 7);
}

TEST_CASE("moba / all_or_here backward: bf16 inputs, bf16 and f32 gradients",
          "[select][backward][bf16]") {
  using Bf16 = Eigen::bfloat16;
  const MobaCase m{Case{}.lengths(70, 70).heads(4, 2).dims(64), 16, 3};
  check_moba<Bf16, float>(m, ak::Dot{}, 61);
  check_moba<Bf16, Bf16>(m, ak::Softcap{5.f}, 62);
  check_moba<float, Eigen::half>(m, ak::Dot{}, 63);
  check_aha<Bf16, float>("Softmax", m.c, ak::Dot{}, ak::Softmax{}, 0.4, 12, 64);
  check_aha<Bf16, Bf16>("SoftplusL1", m.c, ak::Dot{}, ak::SoftplusL1{}, 0.4, 12, 65);
}

TEST_CASE("all_or_here_backward: matches the reference routing mask, every normalizer",
          "[select][aha][backward]") {
  const Case cases[] = {
      Case{}.lengths(130, 130).heads(2, 2).dims(32),
      Case{}.lengths(150, 150).heads(4, 2).dims(64, 40).batches(2).laid_out(Layout::Padded),
      Case{}.lengths(60, 100).heads(3, 1).dims(32).at_offset(-5),  // rows before every key
      Case{}.lengths(1, 77).heads(2, 1).dims(32),
  };
  std::uint32_t seed = 200;
  for (const Case& c : cases)
    for (const double p_full : {0.0, 0.3, 0.8}) {
      seed += 10;
      check_aha("Softmax", c, ak::Dot{}, ak::Softmax{}, p_full, 16, seed);
      check_aha("Softmax::with_sinks", c, ak::Dot{},
                ak::Softmax::with_sinks(ak::test::head_sinks(c.q_heads)), p_full, 16, seed);
      check_aha("Sigmoid::per_head", c, ak::Dot{},
                ak::Sigmoid::per_head(ak::test::head_biases(c.q_heads)), p_full, 16, seed);
      check_aha("SoftplusL1", c, ak::Dot{}, ak::SoftplusL1{}, p_full, 16, seed);
      check_aha("SoftplusL1Reweighted", c, ak::Dot{}, ak::SoftplusL1Reweighted{}, p_full, 16, seed);
      check_aha("Softcap{5}, Softmax", c, ak::Softcap{5.f}, ak::Softmax{}, p_full, 3, seed);
    }
}

TEST_CASE("stripe_attention_backward: matches the reference under the selection's mask",
          "[select][stripes][backward]") {
  const Case cases[] = {
      Case{}.lengths(37, 37).heads(2, 2).dims(32),
      Case{}.lengths(61, 61).heads(4, 2).dims(32, 24).batches(2).laid_out(Layout::Padded),
      Case{}.lengths(29, 70).heads(3, 1).dims(32),  // bottom-right queries, MQA
  };
  std::uint32_t seed = 300;
  for (const Case& c : cases)
    for (const Index local : {0, 5}) {
      seed += 10;
      check_stripes("Softmax", c, ak::Dot{}, ak::Softmax{}, local, seed);
      check_stripes("Softmax::with_sinks", c, ak::Dot{},
                    ak::Softmax::with_sinks(ak::test::head_sinks(c.q_heads)), local, seed);
      check_stripes("Sigmoid::per_head", c, ak::Dot{},
                    ak::Sigmoid::per_head(ak::test::head_biases(c.q_heads)), local, seed);
      check_stripes("SoftplusL1Reweighted{3}", c, ak::Dot{}, ak::SoftplusL1Reweighted{3.f}, local,
                    seed);
      check_stripes("Softcap{5}, Softmax", c, ak::Softcap{5.f}, ak::Softmax{}, local, seed);
    }
}

TEST_CASE("superlinear_attention_backward: matches the reference under each row's spans",
          "[select][superlinear][backward]") {
  std::uint32_t seed = 400;
  check_superlinear(Case{}.lengths(100, 100).heads(2, 2).dims(32), ak::Dot{}, {0.5, 3, 8, 4},
                    seed += 10);
  check_superlinear(Case{}.lengths(37, 150).heads(4, 2).dims(64, 40).laid_out(Layout::Padded),
                    ak::Dot{}, {0.5, 2, 5, 0}, seed += 10);
  check_superlinear(Case{}.lengths(40, 64).heads(2, 2).dims(32).at_offset(-5), ak::Dot{},
                    {0.5, 3, 4, 2}, seed += 10);
  check_superlinear(Case{}.lengths(90, 60).heads(2, 1).dims(32).batches(2), ak::Softcap{5.f},
                    {0.5, 2, 8, 4}, seed += 10);
}

TEST_CASE("select backward: 1 and 2 threads give the same bits", "[select][backward]") {
  const Case c = Case{}.lengths(300, 300).heads(4, 2).dims(64);
  Io<> io(c, 500);
  const ak::Options base = io.options(c);
  {
    const Index block = 32;
    const auto routes = ak::route_topk_blocks(io.q.cview(), io.k.cview(), block, 3);
    ak::moba_attention(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(), io.o.view, routes,
                       block, base);
    check_threads(c, [&](Grads<float>& g, int threads) {
      ak::moba_attention_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                                  io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view,
                                  routes, block, base.with_threads(threads));
    });
  }
  {
    const auto routes = ak::test::random_routes(c, 0.3, 501);
    ak::all_or_here(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(), io.o.view, routes,
                    24, base);
    check_threads(c, [&](Grads<float>& g, int threads) {
      ak::all_or_here_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                               io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view,
                               routes, 24, base.with_threads(threads));
    });
  }
  {
    ak::StripeParams params = ak::test::small_stripe_params(8);
    params.block = 16;
    const auto sel = ak::anchor_stripes(io.q.cview(), io.k.cview(), params, base);
    ak::stripe_attention(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(), io.o.view, sel,
                         base);
    check_threads(c, [&](Grads<float>& g, int threads) {
      ak::stripe_attention_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                                    io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view,
                                    sel, base.with_threads(threads));
    });
  }
  {
    const auto sel = ak::superlinear_spans(io.d_o.cview(), io.k.cview(), {0.5, 4, 16, 8}, base);
    ak::superlinear_attention(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(), io.o.view,
                              sel, base);
    check_threads(c, [&](Grads<float>& g, int threads) {
      ak::superlinear_attention_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                                         io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view,
                                         g.dv.view, sel, base.with_threads(threads));
    });
  }
}

TEST_CASE("select backward: bad inputs throw before any gradient is written",
          "[select][backward][errors]") {
  const Case c = Case{}.lengths(40, 40).heads(2, 1).dims(32);
  Io<> io(c, 600);
  const ak::Options with_lse = io.options(c);
  Grads<float> g(c, Layout::Bhsd);
  fill_sevens(g);
  Tensor<float> short_dq(Layout::Bhsd, 1, 2, 39, 32);
  // MoBA: routes made for another block; and no LSE.
  const auto routes = ak::route_topk_blocks(io.q.cview(), io.k.cview(), 8, 3);
  const auto moba = [&](Index block, const ak::Options& opt) {
    ak::moba_attention_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                                io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view, g.dv.view,
                                routes, block, opt);
  };
  CHECK_THROWS_AS(moba(16, with_lse), ak::Error);
  CHECK_THROWS_AS(moba(8, c.options()), ak::Error);
  // All-or-Here: routes of another shape; a window of 0; dq of another shape.
  const auto aha_routes = ak::test::random_routes(c, 0.5, 601);
  const auto other = ak::test::random_routes(Case{}.lengths(39, 40).heads(2, 1), 0.5, 602);
  const auto aha = [&](const ak::AhaRoutes& r, Index window, const ak::View<float>& dq) {
    ak::all_or_here_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                             io.o.cview(), io.d_o.cview(), dq, g.dk.view, g.dv.view, r, window,
                             with_lse);
  };
  CHECK_THROWS_AS(aha(other, 8, g.dq.view), ak::Error);
  CHECK_THROWS_AS(aha(aha_routes, 0, g.dq.view), ak::Error);
  CHECK_THROWS_AS(aha(aha_routes, 8, short_dq.view), ak::Error);
  // Stripes: a selection made for another offset; dk aliasing k.
  const auto sel = ak::anchor_stripes(io.q.cview(), io.k.cview(), ak::test::small_stripe_params(0));
  const auto shifted = ak::anchor_stripes(
      io.q.cview(), io.k.cview(), ak::test::small_stripe_params(0), ak::Options{}.with_q_offset(3));
  const auto stripes = [&](const ak::StripeSelection& s, const ak::View<float>& dk) {
    ak::stripe_attention_backward(ak::make_spec(), io.q.cview(), io.k.cview(), io.v.cview(),
                                  io.o.cview(), io.d_o.cview(), g.dq.view, dk, g.dv.view, s,
                                  with_lse);
  };
  CHECK_THROWS_AS(stripes(shifted, g.dk.view), ak::Error);
  CHECK_THROWS_AS(stripes(sel, io.k.view), ak::Error);
  // Superlinear: a selection with a future anchor; sinks.
  auto spans = ak::superlinear_spans(io.d_o.cview(), io.k.cview(), {0.5, 3, 4, 2});
  const auto superlinear = [&](const ak::SpanSelection& s, const ak::Softmax& n) {
    ak::superlinear_attention_backward(ak::make_spec(n), io.q.cview(), io.k.cview(), io.v.cview(),
                                       io.o.cview(), io.d_o.cview(), g.dq.view, g.dk.view,
                                       g.dv.view, s, with_lse);
  };
  CHECK_THROWS_AS(superlinear(spans, ak::Softmax::with_sinks({0.f, 0.f})), ak::Error);
  auto future = spans;
  future.counts[5] = 1;
  future.anchors[static_cast<std::size_t>(5 * future.topk)] = 39;  // row 5 sees keys <= 5
  CHECK_THROWS_AS(superlinear(future, ak::Softmax{}), ak::Error);
  CHECK(all_sevens(g));
  // And the good calls do write.
  moba(8, with_lse);
  CHECK_FALSE(all_sevens(g));
}
