// gated_attention() against reference::gated_attention() (the per-token recurrence in f64):
// both updates (additive, delta) and the four gate shapes, chunked (chunk sizes 16, 64 and
// 100 over a length none divides) and recurrent, q/k l2-normalized or not, GQA-style heads
// (Hv = 2 Hk), the three layouts, f32 and bf16 storage, a random initial state, 1 or 2
// threads; the final state; prefill then decode steps against one long call; gates as
// negative as -20 per token; L 4096 at unit scale; bitwise equal results for any thread
// count; every bad input refused with an Error before anything is written.
// The engine under test: gated/gated_heads.hpp (GatedHeads, chunked and recurrent).
#include <Eigen/Core>
#include <attnkit/gated/gated_attention.hpp>
#include <attnkit/gated/reference.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/backward_check.hpp"
#include "support/error_checks.hpp"
#include "support/gated_cases.hpp"

namespace ak = attnkit;
using ak::GatedSpec;
using ak::GatedUpdate;
using ak::GateShape;
using ak::Index;
using ak::LinearForm;
using ak::test::copy_values;
using ak::test::GatedInputs;
using ak::test::GatedShape;
using ak::test::kGatedFamily;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

// Outputs and states against the f64 recurrence, relative to max |reference|: the chunked
// form adds the same terms in other orders, through a triangular solve (f32).
constexpr double kGatedF32 = 2e-5;
// bf16 inputs are exact in f32; the output is rounded to bf16 once.
constexpr double kGatedBf16 = ak::test::tol::kBf16;

struct Result {
  double out = 0, state = 0;
};

// The kernel and the reference on the same inputs: relative errors of o and the final state.
template <class T>
Result run_against_reference(const GatedSpec& spec, const GatedShape& s, std::uint32_t seed = 3,
                             float g_low = -0.5f) {
  GatedInputs<T> in(spec, s, seed, g_low);
  Tensor<T> o(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
  Tensor<double> want(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
  Tensor<double> state_want(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
  copy_values(in.state, state_want);
  const auto options = ak::Options{}.with_threads(s.threads);
  ak::reference::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec),
                                 want.view, &state_want.view, options);
  ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec), o.view,
                      in.state.view, options);
  return {ak::test::relative_error(o.view, want.view),
          ak::test::relative_error(in.state.view, state_want.view)};
}

}  // namespace

TEST_CASE(
    "gated_attention: every update and gate, chunked and recurrent, against the f64 "
    "recurrence",
    "[gated]") {
  const GatedSpec base = GENERATE(from_range(std::begin(kGatedFamily), std::end(kGatedFamily)));
  const bool l2 = GENERATE(true, false);
  const auto [form, chunk] = GENERATE(table<LinearForm, Index>({{LinearForm::Recurrent, 1},
                                                                {LinearForm::Chunked, 16},
                                                                {LinearForm::Chunked, 64},
                                                                {LinearForm::Chunked, 100}}));
  const GatedSpec spec = base.with_l2_normalize(l2).with_form(form).with_chunk(chunk);
  INFO("update " << int(spec.update) << " gate " << int(spec.gate) << " l2 " << l2 << " form "
                 << int(form) << " chunk " << chunk);
  const Result r = run_against_reference<float>(spec, GatedShape{});
  CHECK(r.out <= kGatedF32);
  CHECK(r.state <= kGatedF32);
}

TEST_CASE("gated_attention: layouts, bf16 storage, one thread", "[gated]") {
  const GatedSpec spec = GENERATE(GatedSpec::gated_delta_net(), GatedSpec::gla());
  GatedShape s;
  s.layout = GENERATE(Layout::Bhsd, Layout::Bshd, Layout::Padded);
  s.threads = GENERATE(1, 2);
  INFO("layout " << ak::test::name(s.layout) << " threads " << s.threads);
  const Result f32 = run_against_reference<float>(spec, s);
  CHECK(f32.out <= kGatedF32);
  CHECK(f32.state <= kGatedF32);
  const Result bf16 = run_against_reference<Eigen::bfloat16>(spec, s);
  CHECK(bf16.out <= kGatedBf16);
  CHECK(bf16.state <= kGatedF32);  // the state stays f32
}

TEST_CASE("gated_attention: gates as negative as -20 a token stay finite and exact", "[gated]") {
  // Cumulative log gates reach -20 x chunk inside a chunk: the scalar form takes differences
  // of double sums, the per-channel form halves a chunk until its factors stay in exp(+-80).
  const GatedSpec spec = GENERATE(GatedSpec::gated_delta_net(), GatedSpec::kimi_delta(),
                                  GatedSpec::mamba2(), GatedSpec::gla());
  const float g_low = GENERATE(-20.f, -3.f);
  INFO("gate " << int(spec.gate) << " update " << int(spec.update) << " g in [" << g_low << ", 0]");
  const Result r = run_against_reference<float>(spec, GatedShape{}, 7, g_low);
  CHECK(r.out <= kGatedF32);
  CHECK(r.state <= kGatedF32);
}

TEST_CASE("gated_attention: L 4096 at unit scale, chunked and recurrent within 1e-5", "[gated]") {
  GatedShape s;
  s.batch = 1;
  s.k_heads = 1;
  s.v_heads = 2;
  s.len = 4096;
  s.key_dim = s.value_dim = 64;
  const GatedSpec spec = GENERATE(GatedSpec::gated_delta_net(), GatedSpec::kimi_delta());
  const LinearForm form = GENERATE(LinearForm::Chunked, LinearForm::Recurrent);
  INFO("gate " << int(spec.gate) << " form " << int(form));
  const Result r = run_against_reference<float>(spec.with_form(form), s, 5, -0.05f);
  CHECK(r.out <= 1e-5);  // the target for L 4K
  CHECK(r.state <= 1e-5);
}

TEST_CASE("gated_attention: a prefill and decode steps from its state equal one long call",
          "[gated]") {
  const GatedSpec spec = GENERATE(GatedSpec::gated_delta_net(), GatedSpec::gla());
  GatedShape s;
  const Index prefill = 100;
  GatedInputs<float> in(spec, s);
  Tensor<float> whole(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
  Tensor<float> state_whole(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
  copy_values(in.state, state_whole);
  ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec), whole.view,
                      state_whole.view);
  // The same tokens: rows [0, prefill) chunked, then one call per token, recurrent.
  const auto rows = [](auto view, Index begin, Index n) {
    view.data = view.row(0, 0, begin);
    view.seq = n;
    return view;
  };
  Tensor<float> parts(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
  const auto call = [&](const GatedSpec& sp, Index begin, Index n) {
    ak::GateInputs g = in.gates(sp);
    if (g.g.data != nullptr) g.g = rows(g.g, begin, n);
    if (g.beta.data != nullptr) g.beta = rows(g.beta, begin, n);
    ak::gated_attention(sp, rows(in.q.cview(), begin, n), rows(in.k.cview(), begin, n),
                        rows(in.v.cview(), begin, n), g, rows(parts.view, begin, n), in.state.view);
  };
  call(spec, 0, prefill);
  for (Index t = prefill; t < s.len; ++t) call(spec.with_form(LinearForm::Recurrent), t, 1);
  CHECK(ak::test::relative_error(parts.view, whole.view) <= kGatedF32);
  CHECK(ak::test::relative_error(in.state.view, state_whole.view) <= kGatedF32);
}

TEST_CASE("gated_attention: the thread count changes no bit", "[gated]") {
  const GatedSpec spec = GENERATE(GatedSpec::gated_delta_net(), GatedSpec::kimi_delta());
  GatedShape s;
  GatedInputs<float> in(spec, s);
  std::vector<std::vector<float>> outs;
  for (const int threads : {1, 2, 3}) {
    Tensor<float> o(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
    Tensor<float> state(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
    copy_values(in.state, state);
    ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec), o.view,
                        state.view, ak::Options{}.with_threads(threads));
    outs.push_back(o.values());
    outs.back().insert(outs.back().end(), state.memory.begin(), state.memory.end());
  }
  CHECK(outs[0] == outs[1]);
  CHECK(outs[0] == outs[2]);
}

TEST_CASE("gated_attention: a call of no tokens writes nothing and keeps the state", "[gated]") {
  const GatedSpec spec = GatedSpec::gated_delta_net();
  GatedShape s;
  s.len = 0;
  GatedInputs<float> in(spec, s);
  Tensor<float> o(s.layout, s.batch, s.v_heads, 0, s.value_dim);
  const std::vector<float> before = in.state.memory;
  ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec), o.view,
                      in.state.view);
  CHECK(in.state.memory == before);
}

TEST_CASE("gated_attention: bad inputs throw Error before anything is written", "[gated]") {
  using ak::test::check_refused;
  const GatedSpec spec = GatedSpec::gated_delta_net();
  GatedShape s;
  s.layout = Layout::Bhsd;
  GatedInputs<float> in(spec, s);
  Tensor<float> o(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
  o.fill(42.f);
  in.state.fill(42.f);
  const auto refused = [&](const GatedSpec& sp, ak::GateInputs g,
                           std::initializer_list<const char*> parts,
                           const ak::Options& options = {}) {
    check_refused(
        [&] {
          ak::gated_attention(sp, in.q.cview(), in.k.cview(), in.v.cview(), g, o.view,
                              in.state.view, options);
        },
        parts, {&o.memory, &in.state.memory});
  };
  const ak::GateInputs good = in.gates(spec);
  const auto poke = [&](Tensor<float>& t, float x, auto&& call) {
    const float old = t.memory[5];
    t.memory[5] = x;
    call();
    t.memory[5] = old;
  };
  poke(in.g, 0.5f, [&] { refused(spec, good, {"g", "<= 0", "> 0"}); });
  poke(in.g, std::numeric_limits<float>::quiet_NaN(), [&] { refused(spec, good, {"g", "NaN"}); });
  poke(in.beta, 1.5f, [&] { refused(spec, good, {"beta", "[0, 1]"}); });
  poke(in.beta, -0.1f, [&] { refused(spec, good, {"beta", "[0, 1]"}); });
  poke(in.beta, std::numeric_limits<float>::quiet_NaN(), [&] {
    refused(spec, good, {"beta", "NaN"});
  });
  refused(spec, {good.g, {}}, {"beta", "a view", "empty"});
  refused(spec, {{}, good.beta}, {"g", "a view", "empty"});
  refused(GatedSpec::mamba2(), good, {"beta", "empty", "additive"});
  refused(GatedSpec{}.with_gate(GateShape::None), good, {"g", "empty", "None or PerHead"});
  refused(spec.with_gate(GateShape::PerChannel), good, {"g.dim", "32", "1"});
  refused(GatedSpec{}.with_head_gates({-1.f}), {{}, good.beta}, {"head_gates", "4", "1"});
  refused(GatedSpec{}.with_head_gates({-1.f, 0.f, 0.2f, 0.f}), {{}, good.beta},
          {"head_gates", "<= 0", "0.2"});
  refused(spec.with_chunk(0), good, {"chunk", "1 to 256", "0"});
  std::vector<float> lse(8);
  refused(spec, good, {"lse", "nullptr"}, ak::Options{}.with_lse(lse));
  refused(spec, good, {"q_offset", "unset"}, ak::Options{}.with_q_offset(3));

  // Shapes: the state's, the heads', the output's; memory shared with the output.
  Tensor<float> small_state(Layout::Bhsd, s.batch, s.v_heads, s.key_dim - 1, s.value_dim);
  check_refused(
      [&] {
        ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), good, o.view,
                            small_state.view);
      },
      {"state.seq", "32", "31"}, {&o.memory});
  Tensor<float> v3(s.layout, s.batch, 3, s.len, s.value_dim);
  check_refused(
      [&] {
        ak::gated_attention(spec, in.q.cview(), in.k.cview(), v3.cview(), good, o.view,
                            in.state.view);
      },
      {"v.heads", "a multiple of q.heads", "3"}, {&o.memory, &in.state.memory});
  const auto state_in_out = ak::bhsd(o.memory.data(), s.batch, s.v_heads, s.key_dim, s.value_dim);
  check_refused(
      [&] {
        ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), good, o.view,
                            state_in_out);
      },
      {"o", "state", "overlapping"}, {&o.memory});
}
