// Policies written the way a user writes them, in this file only, on every path attnkit has.
// Each path asks a policy its cross-cutting questions through the policy's own faces
// (normalizer/faces.hpp: part(), for_head(), merges_by_lse(); score/faces.hpp:
// reads_positions()), so a policy with none of those faces takes the defaults and must
// work -- or be refused with a message naming what is missing -- with no edit elsewhere:
// - Tempered: softmax(s / t), a user normalizer with a LogSumExp statistic and a backward;
// - Halve: 0.5 s, a user Score that says it does not read positions (kReadsPositions);
// - Slope: s - 0.05 (i - j), a user Score that reads positions and does not say so.
// attention(), decode() (split-KV and the row engine), attention_paged() and
// attention_backward() are checked against the f64 reference. The gathered drivers (moba,
// all_or_here) are checked by a property: Tempered{2} with Halve is Softmax with a scale a
// quarter of the default one. The refusals (attention_paged() and the gathered drivers
// with Slope) are compile-fail tests: tests/compile_fail/paged_user_score.cpp and
// stripes_alibi.cpp.
#include <attnkit/cache/attention_paged.hpp>
#include <attnkit/cache/paged_kv.hpp>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/kernel/decode.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/select/all_or_here.hpp>
#include <attnkit/select/moba.hpp>
#include <attnkit/spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <vector>

#include "support/backward_check.hpp"
#include "support/reference_check.hpp"

namespace ak = attnkit;
namespace simd = attnkit::simd;
using ak::Index;
using ak::test::Case;
using ak::test::Inputs;

namespace {

// softmax(s / t): a user normalizer built on Softmax's own faces.
struct Tempered {
  using slot = ak::NormalizerSlot;
  float t = 2.f;

  void divide(float* s, Index keys, Index ld) const {
    const simd::Vec inv(1.f / t);
    for (Index j = 0; j < keys; ++j) simd::store(s + j * ld, simd::load(s + j * ld) * inv);
  }

  using State = ak::Softmax::State;
  State begin() const { return State{}; }
  simd::Vec absorb(State& st, float* s, Index keys, Index ld) const {
    divide(s, keys, ld);
    return ak::Softmax{}.absorb(st, s, keys, ld);
  }
  simd::Vec finalize(const State& st) const { return ak::Softmax{}.finalize(st); }
  simd::Vec lse(const State& st) const { return ak::Softmax{}.lse(st); }
  double reference_row(double* s, Index n) const {
    for (Index j = 0; j < n; ++j) s[j] /= double(t);
    return ak::Softmax{}.reference_row(s, n);
  }

  using BackwardState = ak::Softmax::BackwardState;
  BackwardState begin_backward(const ak::RowContext& ctx, simd::Vec stat, simd::Vec delta) const {
    return ak::Softmax{}.begin_backward(ctx, stat, delta);
  }
  simd::Vec backward(const BackwardState& st, float* s, float* ds, Index keys, Index ld) const {
    divide(s, keys, ld);
    ak::Softmax{}.backward(st, s, ds, keys, ld);
    divide(ds, keys, ld);  // d(s / t) / ds = 1 / t
    return simd::Vec(0.f);
  }
  double reference_backward(const double* s, const double* p, double* dp, Index n, double stat,
                            const ak::RowContext& ctx) const {
    ak::Softmax{}.reference_backward(s, p, dp, n, stat, ctx);
    for (Index j = 0; j < n; ++j) dp[j] /= double(t);
    return 0.0;
  }
};

// 0.5 s: position-free, and it says so.
struct Halve {
  using slot = ak::ScoreSlot;
  static constexpr bool kReadsPositions = false;
  double modify(double s, Index, Index, Index, Index) const { return 0.5 * s; }
  void apply_tile(float* s, Index keys, Index lanes, Index ld, const ak::ScoreTile&) const {
    for (Index j = 0; j < keys; ++j)
      for (Index c = 0; c < lanes; ++c) s[j * ld + c] *= 0.5f;
  }
  double derivative(double, Index, Index, Index, Index) const { return 0.5; }
  void derivative_tile(const float*, float* g, Index keys, Index lanes, Index ld,
                       const ak::ScoreTile&) const {
    for (Index j = 0; j < keys; ++j)
      for (Index c = 0; c < lanes; ++c) g[j * ld + c] = 0.5f;
  }
};

// s - 0.05 (i - j): reads positions and does not say so.
struct Slope {
  using slot = ak::ScoreSlot;
  static constexpr bool kUnitDerivative = true;
  double modify(double s, Index, Index, Index i, Index j) const { return s - 0.05 * double(i - j); }
  void apply_tile(float* s, Index keys, Index lanes, Index ld, const ak::ScoreTile& at) const {
    for (Index j = 0; j < keys; ++j)
      for (Index c = 0; c < lanes; ++c)
        s[j * ld + c] -= 0.05f * static_cast<float>((at.q_begin + c) - (at.k_begin + j));
  }
};

static_assert(!ak::detail::reads_positions<Halve>() && ak::detail::reads_positions<Slope>() &&
              ak::detail::merges_by_lse<Tempered>() && !ak::detail::has_part<Tempered>::value);

template <class Spec>
void check_decode(const std::string& what, const Spec& spec, const Case& c) {
  INFO(what << ", " << ak::test::describe(c));
  const Inputs<float> in(c, 5);
  ak::test::check_agreement(ak::test::agreement(spec, c, in, [&](auto o, const auto& options) {
    ak::decode(spec, in.q.cview(), in.k.cview(), in.v.cview(), o, options);
  }));
}

// attention_paged() over one sequence appended in pieces of 37 rows to pages of 64.
template <class Spec>
void check_paged(const std::string& what, const Spec& spec, const Case& c) {
  INFO(what << ", " << ak::test::describe(c));
  const Inputs<float> in(c, 9);
  ak::PagedKv<float> pool(16, c.kv_heads, 64, c.dim);
  const Index seq = pool.add_sequence();
  for (Index from = 0; from < c.kv_len; from += 37) {
    const Index n = std::min<Index>(37, c.kv_len - from);
    ak::View<const float> k = in.k.cview(), v = in.v.cview();
    k.data = k.row(0, 0, from);
    v.data = v.row(0, 0, from);
    k.seq = v.seq = n;
    pool.append(seq, k, v);
  }
  ak::test::check_agreement(ak::test::agreement(spec, c, in, [&](auto o, const auto& options) {
    ak::attention_paged(spec, in.q.cview(), pool, o, options);
  }));
}

}  // namespace

TEST_CASE("user policies: attention() and decode() against the reference", "[user_policies]") {
  const Case prefill = Case{}.lengths(90, 200).heads(4, 2).dims(32);
  ak::test::check_attention("Tempered, Halve", ak::make_spec(Tempered{}, Halve{}), prefill);
  ak::test::check_attention("Tempered, Slope, Causal",
                            ak::make_spec(Tempered{3.f}, Slope{}, ak::Causal{}), prefill);
  for (Index q_len : {1, 3}) {
    const Case c = Case{}.lengths(q_len, 1100).heads(4, 1).dims(64);
    check_decode("split-KV: Tempered, Halve", ak::make_spec(Tempered{}, Halve{}), c);
    check_decode("split-KV: Softmax, Slope (the tile engine)", ak::make_spec(Slope{}), c);
    check_decode("the row engine: Softmax, Halve", ak::make_spec(Halve{}), c);
  }
}

TEST_CASE("user policies: attention_paged() against the reference", "[user_policies]") {
  for (Index q_len : {1, 40}) {
    const Case c = Case{}.lengths(q_len, 300).heads(2, 1).dims(32).laid_out(ak::test::Layout::Bhsd);
    check_paged("Tempered, Halve", ak::make_spec(Tempered{}, Halve{}), c);
    check_paged("Tempered, Halve, Causal", ak::make_spec(Tempered{}, Halve{}, ak::Causal{}), c);
  }
}

TEST_CASE("user policies: attention_backward() against the reference", "[user_policies]") {
  const Case c = Case{}.lengths(70, 150).heads(4, 2).dims(32);
  ak::test::check_backward("Tempered, Halve, Causal",
                           ak::make_spec(Tempered{}, Halve{}, ak::Causal{}), c);
  ak::test::check_backward("Tempered, Slope", ak::make_spec(Tempered{3.f}, Slope{}), c);
}

TEST_CASE("user policies: the gathered drivers take them through their faces", "[user_policies]") {
  // Tempered{2} after Halve: softmax(s / 4), which is Softmax with a quarter of the scale.
  const Case c = Case{}.lengths(256, 256).heads(2, 1).dims(32).laid_out(ak::test::Layout::Bhsd);
  const Inputs<float> in(c, 13);
  const float quarter = 0.25f / std::sqrt(float(c.dim));
  const auto user = ak::make_spec(Tempered{}, Halve{});
  const auto plain = ak::make_spec();
  const auto close = [&](const ak::test::Tensor<float>& a, const ak::test::Tensor<float>& b) {
    double err = 0;
    for (Index h = 0; h < c.q_heads; ++h)
      for (Index r = 0; r < c.q_len; ++r)
        for (Index x = 0; x < c.dim; ++x)
          err = std::max(err, double(std::abs(a.view.row(0, h, r)[x] - b.view.row(0, h, r)[x])));
    CHECK(err <= ak::test::tol::kF32);
  };
  ak::test::Tensor<float> got(ak::test::Layout::Bhsd, 1, c.q_heads, c.q_len, c.dim),
      want(ak::test::Layout::Bhsd, 1, c.q_heads, c.q_len, c.dim);
  SECTION("moba_attention") {
    const ak::BlockRoutes routes = ak::route_topk_blocks(in.q.cview(), in.k.cview(), 64, 2);
    ak::moba_attention(user, in.q.cview(), in.k.cview(), in.v.cview(), got.view, routes, 64);
    ak::moba_attention(plain, in.q.cview(), in.k.cview(), in.v.cview(), want.view, routes, 64,
                       ak::Options{}.with_scale(quarter));
    close(got, want);
  }
  SECTION("all_or_here") {
    std::vector<unsigned char> full(static_cast<std::size_t>(c.q_len * c.q_heads));
    for (std::size_t x = 0; x < full.size(); ++x) full[x] = x % 3 == 0;  // a third full
    const ak::AhaRoutes routes(1, c.q_len, c.q_heads, full);
    ak::all_or_here(user, in.q.cview(), in.k.cview(), in.v.cview(), got.view, routes, 32);
    ak::all_or_here(plain, in.q.cview(), in.k.cview(), in.v.cview(), want.view, routes, 32,
                    ak::Options{}.with_scale(quarter));
    close(got, want);
  }
}
