// topk_attention_backward(): dq, dk, dv against reference::topk_attention_backward() (the f64
// backward under the selection's mask) for GQA and MQA, random selections with gaps and empty
// rows, keys no query selected (zero gradient); with every key selected, against the dense
// causal attention_backward(); the same bits for any thread count; bad arguments refused.
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/dsa/reference.hpp>
#include <attnkit/dsa/topk_attention.hpp>
#include <attnkit/dsa/topk_backward.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/backward_check.hpp"
#include "support/dsa_cases.hpp"
#include "support/error_checks.hpp"

namespace ak = attnkit;
using ak::Index;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

constexpr double kGradF32 = 5e-5;  // f32 gradients against f64, sums of a few hundred terms

struct Case {
  Index B, Hq, Hkv, Lq, Lk, D, Dv, topk;
  bool all;  // every key each query sees
};

// The shared selections (support/dsa_cases.hpp), keys past 3 Lk / 4 never selected (their
// gradient is zero).
std::vector<std::int32_t> selection(const Case& c, std::uint32_t seed) {
  return ak::test::topk_selection({c.B, c.Hq, c.Hkv, c.Lq, c.Lk, c.D, c.Dv, c.topk}, c.all, seed,
                                  3 * c.Lk / 4);
}

struct Grads {
  double dq = 0, dk = 0, dv = 0;
  std::vector<float> bits;
};

Grads run(const Case& c, int threads, bool dense_baseline = false) {
  const auto sel = selection(c, 3);
  Tensor<float> q(Layout::Bshd, c.B, c.Hq, c.Lq, c.D), k(Layout::Bhsd, c.B, c.Hkv, c.Lk, c.D),
      v(Layout::Bshd, c.B, c.Hkv, c.Lk, c.Dv), o(Layout::Bshd, c.B, c.Hq, c.Lq, c.Dv),
      d_o(Layout::Bshd, c.B, c.Hq, c.Lq, c.Dv), dq(Layout::Bshd, c.B, c.Hq, c.Lq, c.D),
      dk(Layout::Bhsd, c.B, c.Hkv, c.Lk, c.D), dv(Layout::Bshd, c.B, c.Hkv, c.Lk, c.Dv);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  d_o.randomize(4);
  std::vector<float> lse(std::size_t(c.B * c.Hq * c.Lq));
  const auto options = ak::Options{}.with_threads(threads).with_lse(lse.data(), Index(lse.size()));
  const ak::TopkKeys keys{ak::bhsd(sel.data(), c.B, 1, c.Lq, c.topk)};
  const auto spec = ak::make_spec();
  ak::topk_attention(spec, q.cview(), k.cview(), v.cview(), o.view, keys, options);
  ak::topk_attention_backward(spec, q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                              dq.view, dk.view, dv.view, keys, options);
  Grads g;
  for (const auto* t : {&dq, &dk, &dv})
    g.bits.insert(g.bits.end(), t->memory.begin(), t->memory.end());
  Tensor<double> rq(Layout::Bshd, c.B, c.Hq, c.Lq, c.D), rk(Layout::Bhsd, c.B, c.Hkv, c.Lk, c.D),
      rv(Layout::Bshd, c.B, c.Hkv, c.Lk, c.Dv);
  if (dense_baseline) {  // the dense causal backward, f32
    Tensor<float> o2(Layout::Bshd, c.B, c.Hq, c.Lq, c.Dv), fq(Layout::Bshd, c.B, c.Hq, c.Lq, c.D),
        fk(Layout::Bhsd, c.B, c.Hkv, c.Lk, c.D), fv(Layout::Bshd, c.B, c.Hkv, c.Lk, c.Dv);
    std::vector<float> lse2(lse.size());
    const auto o2opt = ak::Options{}.with_lse(lse2.data(), Index(lse2.size()));
    const auto causal = ak::make_spec(ak::Causal{});
    ak::attention(causal, q.cview(), k.cview(), v.cview(), o2.view, o2opt);
    ak::attention_backward(causal, q.cview(), k.cview(), v.cview(), o2.cview(), d_o.cview(),
                           fq.view, fk.view, fv.view, o2opt);
    g.dq = ak::test::relative_error(dq.view, fq.view);
    g.dk = ak::test::relative_error(dk.view, fk.view);
    g.dv = ak::test::relative_error(dv.view, fv.view);
    return g;
  }
  ak::reference::topk_attention_backward(spec, q.cview(), k.cview(), v.cview(), o.cview(),
                                         d_o.cview(), rq.view, rk.view, rv.view, keys, options);
  g.dq = ak::test::relative_error(dq.view, rq.view);
  g.dk = ak::test::relative_error(dk.view, rk.view);
  g.dv = ak::test::relative_error(dv.view, rv.view);
  return g;
}

}  // namespace

TEST_CASE("topk_attention_backward against the f64 reference", "[dsa][backward]") {
  const Case cases[] = {
      {2, 8, 2, 40, 60, 32, 24, 24, false},    // GQA
      {1, 16, 1, 30, 700, 32, 32, 64, false},  // MQA, keys in two ranges
      {1, 4, 4, 20, 20, 16, 16, 40, false},    // MHA, topk above every query's keys
      {1, 4, 2, 30, 50, 20, 48, 16, false},    // K rows widened for dQ (20 not whole vectors)
  };
  for (const Case& c : cases) {
    INFO("Hq " << c.Hq << " Hkv " << c.Hkv << " Lk " << c.Lk);
    const Grads g = run(c, 2);
    CHECK(g.dq <= kGradF32);
    CHECK(g.dk <= kGradF32);
    CHECK(g.dv <= kGradF32);
  }
}

TEST_CASE("topk_attention_backward: every key selected is the dense causal backward",
          "[dsa][backward]") {
  const Grads g = run({1, 8, 2, 50, 50, 32, 32, 50, true}, 2, true);
  CHECK(g.dq <= kGradF32);
  CHECK(g.dk <= kGradF32);
  CHECK(g.dv <= kGradF32);
}

TEST_CASE("topk_attention_backward: the thread count changes no bit", "[dsa][backward]") {
  const Case c{1, 8, 2, 40, 700, 32, 24, 32, false};
  const Grads one = run(c, 1), two = run(c, 2), three = run(c, 3);
  CHECK(one.bits == two.bits);
  CHECK(one.bits == three.bits);
}

TEST_CASE("topk_attention_backward: bad arguments throw Error before anything is written",
          "[dsa][backward]") {
  using ak::test::check_refused;
  const Index L = 6, D = 8, K = 3;
  Tensor<float> q(Layout::Bhsd, 1, 2, L, D), k(Layout::Bhsd, 1, 1, L, D),
      v(Layout::Bhsd, 1, 1, L, D), o(Layout::Bhsd, 1, 2, L, D), d_o(Layout::Bhsd, 1, 2, L, D),
      dq(Layout::Bhsd, 1, 2, L, D), dk(Layout::Bhsd, 1, 1, L, D), dv(Layout::Bhsd, 1, 1, L, D);
  for (auto* t : {&dq, &dk, &dv}) t->fill(42.f);
  std::vector<std::int32_t> sel(static_cast<std::size_t>(L * K), 0);
  std::vector<float> lse(static_cast<std::size_t>(2 * L));
  const ak::TopkKeys keys{ak::bhsd(sel.data(), 1, 1, L, K)};
  const auto call = [&](const ak::Options& options) {
    ak::topk_attention_backward(ak::make_spec(), q.cview(), k.cview(), v.cview(), o.cview(),
                                d_o.cview(), dq.view, dk.view, dv.view, keys, options);
  };
  const std::initializer_list<const std::vector<float>*> outs = {&dq.memory, &dk.memory,
                                                                 &dv.memory};
  check_refused([&] { call({}); }, {"lse"}, outs);
  sel[1] = 0;  // key 0 twice in row 0
  check_refused([&] { call(ak::Options{}.with_lse(lse.data(), 2 * L)); },
                {"keys.indices[0, 0, 0, 1]", "0 twice"}, outs);
}
