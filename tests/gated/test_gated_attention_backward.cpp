// gated_attention_backward() and its f64 reference: the reference's dq, dk, dv, dg, dbeta and
// starting-state gradient against central finite differences of reference::gated_attention()
// (a loss reading o and the final state), for both updates, the four gate shapes and q/k
// normalized or not; the kernel against the reference over GQA-style heads, chunk sizes and
// storage; the thread count changes no bit; bad arguments are refused before anything is
// written.
#include <Eigen/Core>
#include <attnkit/gated/gated_attention.hpp>
#include <attnkit/gated/gated_backward.hpp>
#include <attnkit/gated/gated_saved.hpp>
#include <attnkit/gated/reference.hpp>
#include <attnkit/gated/reference_backward.hpp>
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
using ak::GateShape;
using ak::Index;
using ak::test::GatedInputs;
using ak::test::GatedShape;
using ak::test::kGatedFamily;
using ak::test::Layout;
using ak::test::Tensor;

namespace {

// The reference against central differences in double (h = 1e-6 on q, k, v and the state:
// truncation and rounding near 1e-9) and on the f32 gates with h = 2^-10 on values that are
// multiples of 2^-12 (every perturbed gate exact in f32; truncation near h^2 = 1e-6).
constexpr double kFdF64 = 1e-6;
constexpr double kFdGates = 2e-5;
// The f32 kernel against the f64 reference: sums over up to L tokens of f32 products.
constexpr double kGradF32 = 5e-5;

// Small inputs for the finite differences: B 1, Hk 1, Hv 2, L 6, Dk 4, Dv 3.
struct Small {
  static constexpr Index B = 1, Hk = 1, Hv = 2, L = 6, Dk = 4, Dv = 3;
  Tensor<double> q{Layout::Bhsd, B, Hk, L, Dk}, k{Layout::Bhsd, B, Hk, L, Dk},
      v{Layout::Bhsd, B, Hv, L, Dv}, state{Layout::Bhsd, B, Hv, Dk, Dv},
      w_out{Layout::Bhsd, B, Hv, L, Dv}, w_state{Layout::Bhsd, B, Hv, Dk, Dv};
  Tensor<float> g, beta{Layout::Bhsd, B, Hv, L, 1};
  explicit Small(const GatedSpec& spec)
      : g(Layout::Bhsd, B, Hv, L, spec.gate == GateShape::PerChannel ? Dk : 1) {
    q.randomize(1);
    k.randomize(2, spec.l2_normalize ? 1.f : 0.5f);
    v.randomize(3);
    state.randomize(4, 0.5f);
    w_out.randomize(5);
    w_state.randomize(6);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> steps(41, 2048);  // g in [-0.5, -0.01], 2^-12 steps
    g.for_each([&](float& x) { x = -float(steps(rng)) / 4096.f; });
    std::uniform_int_distribution<int> b_steps(410, 3686);  // beta in [0.1, 0.9]
    beta.for_each([&](float& x) { x = float(b_steps(rng)) / 4096.f; });
  }
  ak::GateInputs gates(const GatedSpec& spec) const {
    ak::GateInputs in;
    if (spec.reads_gates()) in.g = g.cview();
    if (spec.delta()) in.beta = beta.cview();
    return in;
  }
  // sum(o . w_out) + sum(S_final . w_state).
  double loss(const GatedSpec& spec) {
    Tensor<double> o(Layout::Bhsd, B, Hv, L, Dv), s(Layout::Bhsd, B, Hv, Dk, Dv);
    s.memory = state.memory;
    ak::reference::gated_attention(spec, q.cview(), k.cview(), v.cview(), gates(spec), o.view,
                                   &s.view);
    double sum = 0;
    for (std::size_t i = 0; i < o.memory.size(); ++i) sum += o.memory[i] * w_out.memory[i];
    for (std::size_t i = 0; i < s.memory.size(); ++i) sum += s.memory[i] * w_state.memory[i];
    return sum;
  }
};

// Worst |analytic - central difference| over max(1, max |difference|) for every element of
// `x`, perturbed by h.
template <class T>
double fd_error(Small& in, const GatedSpec& spec, std::vector<T>& x,
                const std::vector<double>& grad, double h) {
  double worst = 0, scale = 1;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const T keep = x[i];
    x[i] = T(double(keep) + h);
    const double up = in.loss(spec);
    x[i] = T(double(keep) - h);
    const double down = in.loss(spec);
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    scale = std::max(scale, std::abs(fd));
    worst = std::max(worst, std::abs(fd - grad[i]));
  }
  return worst / scale;
}

}  // namespace

TEST_CASE("reference::gated_attention_backward against finite differences", "[gated][backward]") {
  const GatedSpec base = GENERATE(from_range(std::begin(kGatedFamily), std::end(kGatedFamily)));
  const bool l2 = GENERATE(true, false);
  GatedSpec spec = base.with_l2_normalize(l2);
  if (spec.gate == GateShape::PerHead) spec = spec.with_head_gates({-0.2f, -0.05f});  // Hv 2
  INFO("update " << int(spec.update) << " gate " << int(spec.gate) << " l2 " << l2);
  Small in(spec);
  using S = Small;
  Tensor<double> dq(Layout::Bhsd, S::B, S::Hk, S::L, S::Dk),
      dk(Layout::Bhsd, S::B, S::Hk, S::L, S::Dk), dv(Layout::Bhsd, S::B, S::Hv, S::L, S::Dv),
      ds(Layout::Bhsd, S::B, S::Hv, S::Dk, S::Dv),
      dg(Layout::Bhsd, S::B, S::Hv, S::L, in.g.view.dim), db(Layout::Bhsd, S::B, S::Hv, S::L, 1);
  ak::reference::GatedGradsF64 grads;
  if (spec.reads_gates()) grads.dg = dg.view;
  if (spec.delta()) grads.dbeta = db.view;
  grads.d_state_in = ds.view;
  const ak::View<const double> state = in.state.cview(), w_state = in.w_state.cview();
  ak::reference::gated_attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(),
                                          in.gates(spec), in.w_out.cview(), dq.view, dk.view,
                                          dv.view, grads, &state, &w_state);
  CHECK(fd_error(in, spec, in.q.memory, dq.memory, 1e-6) <= kFdF64);
  CHECK(fd_error(in, spec, in.k.memory, dk.memory, 1e-6) <= kFdF64);
  CHECK(fd_error(in, spec, in.v.memory, dv.memory, 1e-6) <= kFdF64);
  CHECK(fd_error(in, spec, in.state.memory, ds.memory, 1e-6) <= kFdF64);
  if (spec.reads_gates()) CHECK(fd_error(in, spec, in.g.memory, dg.memory, 1.0 / 1024) <= kFdGates);
  if (spec.delta()) CHECK(fd_error(in, spec, in.beta.memory, db.memory, 1.0 / 1024) <= kFdGates);
}

namespace {

// The f32 kernel's gradients and the f64 reference's on the same inputs (q, k, v in storage
// T), with a starting state and a state gradient; returns the worst relative error of each.
struct GradErrors {
  double dq = 0, dk = 0, dv = 0, dg = 0, dbeta = 0, d_state = 0;
};
template <class T>
GradErrors kernel_against_reference(const GatedSpec& spec, const GatedShape& s, int threads,
                                    std::vector<float>* bits = nullptr, bool saved = false) {
  const Layout lay = s.layout;
  GatedInputs<T> in(spec, s, 11, -0.3f);
  const Index g_dim = in.g.view.dim;
  Tensor<T> d_o(lay, s.batch, s.v_heads, s.len, s.value_dim);
  Tensor<float> d_state(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
  d_o.randomize(14);
  d_state.randomize(16, 0.5f);
  const auto& q = in.q;
  const auto& k = in.k;
  const auto& v = in.v;
  const auto& state = in.state;
  const ak::GateInputs gates = in.gates(spec);

  Tensor<float> dq(lay, s.batch, s.k_heads, s.len, s.key_dim),
      dk(lay, s.batch, s.k_heads, s.len, s.key_dim),
      dv(lay, s.batch, s.v_heads, s.len, s.value_dim), dg(lay, s.batch, s.v_heads, s.len, g_dim),
      db(lay, s.batch, s.v_heads, s.len, 1),
      ds(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
  ak::GateGrads grads;
  if (spec.reads_gates()) grads.dg = dg.view;
  if (spec.delta()) grads.dbeta = db.view;
  grads.d_state_in = ds.view;
  const auto options = ak::Options{}.with_threads(threads);
  if (saved) {  // the forward keeps its chunks (from a copy of the state: it leaves the last)
    ak::GatedSaved kept;
    Tensor<float> o(lay, s.batch, s.v_heads, s.len, s.value_dim),
        state_io(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
    state_io.memory = state.memory;
    ak::gated_attention(spec, q.cview(), k.cview(), v.cview(), gates, o.view, state_io.view, kept,
                        options);
    ak::gated_attention_backward(kept, spec, q.cview(), k.cview(), v.cview(), gates, d_o.cview(),
                                 dq.view, dk.view, dv.view, grads, d_state.cview(), options);
  } else {
    ak::gated_attention_backward(spec, q.cview(), k.cview(), v.cview(), gates, d_o.cview(), dq.view,
                                 dk.view, dv.view, grads, state.cview(), d_state.cview(), options);
  }
  if (bits != nullptr)
    for (const auto* t : {&dq, &dk, &dv, &dg, &db, &ds})
      bits->insert(bits->end(), t->memory.begin(), t->memory.end());

  Tensor<double> rq(lay, s.batch, s.k_heads, s.len, s.key_dim),
      rk(lay, s.batch, s.k_heads, s.len, s.key_dim),
      rv(lay, s.batch, s.v_heads, s.len, s.value_dim), rg(lay, s.batch, s.v_heads, s.len, g_dim),
      rb(lay, s.batch, s.v_heads, s.len, 1),
      rs(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim),
      state64(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim),
      d_state64(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
  for (std::size_t i = 0; i < state.memory.size(); ++i) {
    state64.memory[i] = state.memory[i];
    d_state64.memory[i] = d_state.memory[i];
  }
  ak::reference::GatedGradsF64 ref_grads;
  if (spec.reads_gates()) ref_grads.dg = rg.view;
  if (spec.delta()) ref_grads.dbeta = rb.view;
  ref_grads.d_state_in = rs.view;
  const ak::View<const double> st = state64.cview(), dst = d_state64.cview();
  ak::reference::gated_attention_backward(spec, q.cview(), k.cview(), v.cview(), gates, d_o.cview(),
                                          rq.view, rk.view, rv.view, ref_grads, &st, &dst);
  using ak::test::relative_error;
  GradErrors e{relative_error(dq.view, rq.view),
               relative_error(dk.view, rk.view),
               relative_error(dv.view, rv.view),
               0,
               0,
               relative_error(ds.view, rs.view)};
  if (spec.reads_gates()) e.dg = relative_error(dg.view, rg.view);
  if (spec.delta()) e.dbeta = relative_error(db.view, rb.view);
  return e;
}

}  // namespace

TEST_CASE("gated_attention_backward against the f64 reference", "[gated][backward]") {
  const GatedSpec base = GENERATE(from_range(std::begin(kGatedFamily), std::end(kGatedFamily)));
  const bool l2 = GENERATE(true, false);
  const Index chunk = GENERATE(16, 64);
  const bool saved = GENERATE(false, true);  // the backward's own pass, or the forward's
  const GatedSpec spec = base.with_l2_normalize(l2).with_chunk(chunk);
  INFO("update " << int(spec.update) << " gate " << int(spec.gate) << " l2 " << l2 << " chunk "
                 << chunk << " saved " << saved);
  const GradErrors e = kernel_against_reference<float>(spec, GatedShape{}, 2, nullptr, saved);
  CHECK(e.dq <= kGradF32);
  CHECK(e.dk <= kGradF32);
  CHECK(e.dv <= kGradF32);
  CHECK(e.dg <= kGradF32);
  CHECK(e.dbeta <= kGradF32);
  CHECK(e.d_state <= kGradF32);
}

TEST_CASE("gated_attention_backward: bf16 inputs, and the thread count changes no bit",
          "[gated][backward]") {
  const GatedSpec spec = GENERATE(GatedSpec::gated_delta_net(), GatedSpec::kimi_delta());
  const GradErrors e = kernel_against_reference<Eigen::bfloat16>(spec, GatedShape{}, 2);
  CHECK(e.dq <= kGradF32);  // bf16 inputs are exact in f32; the gradients stay f32
  CHECK(e.dk <= kGradF32);
  CHECK(e.dv <= kGradF32);
  std::vector<float> one, two, three;
  kernel_against_reference<float>(spec, GatedShape{}, 1, &one);
  kernel_against_reference<float>(spec, GatedShape{}, 2, &two);
  kernel_against_reference<float>(spec, GatedShape{}, 3, &three);
  CHECK(one == two);
  CHECK(one == three);
  std::vector<float> kept_one, kept_two;  // from the forward's saved chunks
  kernel_against_reference<float>(spec, GatedShape{}, 1, &kept_one, true);
  kernel_against_reference<float>(spec, GatedShape{}, 2, &kept_two, true);
  CHECK(kept_one == kept_two);
}

TEST_CASE("gated_attention_backward: a call of no tokens passes the state's gradient through",
          "[gated][backward]") {
  for (const GatedSpec& spec : kGatedFamily)
    for (const bool saved : {false, true}) {
      INFO("update " << int(spec.update) << " gate " << int(spec.gate) << " saved " << saved);
      GatedShape s;
      s.len = 0;
      GatedInputs<float> in(spec, s);
      Tensor<float> o(s.layout, s.batch, s.v_heads, 0, s.value_dim),
          d_o(s.layout, s.batch, s.v_heads, 0, s.value_dim),
          dq(s.layout, s.batch, s.k_heads, 0, s.key_dim),
          dk(s.layout, s.batch, s.k_heads, 0, s.key_dim),
          dv(s.layout, s.batch, s.v_heads, 0, s.value_dim),
          d_state(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim),
          ds(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim);
      d_state.randomize(16, 0.5f);
      ds.fill(42.f);
      ak::GateGrads grads;
      grads.d_state_in = ds.view;
      const ak::GateInputs gates = in.gates(spec);
      if (saved) {
        ak::GatedSaved kept;
        ak::gated_attention(spec, in.q.cview(), in.k.cview(), in.v.cview(), gates, o.view,
                            in.state.view, kept);
        ak::gated_attention_backward(kept, spec, in.q.cview(), in.k.cview(), in.v.cview(), gates,
                                     d_o.cview(), dq.view, dk.view, dv.view, grads,
                                     d_state.cview());
      } else {
        ak::gated_attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), gates,
                                     d_o.cview(), dq.view, dk.view, dv.view, grads,
                                     in.state.cview(), d_state.cview());
      }
      CHECK(ds.memory == d_state.memory);
    }
}

TEST_CASE("gated_attention_backward: bad arguments throw Error before anything is written",
          "[gated][backward]") {
  using ak::test::check_refused;
  const GatedSpec spec = GatedSpec::gated_delta_net();
  const Index B = 1, Hk = 1, Hv = 2, L = 5, D = 8;
  const Layout lay = Layout::Bhsd;
  Tensor<float> q(lay, B, Hk, L, D), k(lay, B, Hk, L, D), v(lay, B, Hv, L, D),
      d_o(lay, B, Hv, L, D), g(lay, B, Hv, L, 1), beta(lay, B, Hv, L, 1), dq(lay, B, Hk, L, D),
      dk(lay, B, Hk, L, D), dv(lay, B, Hv, L, D), dg(lay, B, Hv, L, 1), state(lay, B, Hv, D, D);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  d_o.randomize(4);
  g.fill(-0.1f);
  beta.fill(0.5f);
  for (auto* t : {&dq, &dk, &dv, &dg}) t->fill(42.f);
  const ak::GateInputs gates{g.cview(), beta.cview()};
  const std::initializer_list<const std::vector<float>*> outs = {&dq.memory, &dk.memory, &dv.memory,
                                                                 &dg.memory};
  const auto call = [&](const ak::View<float>& dq_view, const ak::GateGrads& grads,
                        const ak::View<const float>& state_in = {}) {
    ak::gated_attention_backward(spec, q.cview(), k.cview(), v.cview(), gates, d_o.cview(), dq_view,
                                 dk.view, dv.view, grads, state_in);
  };
  Tensor<float> dq_small(lay, B, Hk, L - 1, D);
  check_refused([&] { call(dq_small.view, {}); }, {"dq.seq", "5", "4"}, outs);
  Tensor<float> db_wide(lay, B, Hv, L, 2);
  check_refused(
      [&] {
        call(dq.view, {{}, db_wide.view, {}});
      },
      {"grads.dbeta.dim", "1", "2"}, outs);
  check_refused(
      [&] {
        call(dq.view, {dg.view, dg.view, {}});
      },
      {"grads.dg", "grads.dbeta", "overlapping"}, outs);
  check_refused([&] { call(ak::View<float>(ak::bhsd(d_o.memory.data(), B, Hk, L, D)), {}); },
                {"dq", "d_o", "overlapping"}, outs);
  check_refused(
      [&] {
        ak::gated_attention_backward(GatedSpec{}.with_gate(GateShape::None), q.cview(), k.cview(),
                                     v.cview(), ak::GateInputs{{}, beta.cview()}, d_o.cview(),
                                     dq.view, dk.view, dv.view, ak::GateGrads{dg.view, {}, {}});
      },
      {"grads.dg", "empty"}, outs);
  // With a GatedSaved: it must be kept, and by a call of the same shape, spec and scale.
  const auto call_saved = [&](const ak::GatedSaved& saved, const GatedSpec& with,
                              const ak::Options& options = {}) {
    ak::gated_attention_backward(saved, with, q.cview(), k.cview(), v.cview(), gates, d_o.cview(),
                                 dq.view, dk.view, dv.view, {}, {}, options);
  };
  check_refused([&] { call_saved(ak::GatedSaved{}, spec); }, {"saved", "empty"}, outs);
  ak::GatedSaved shorter;
  {
    Tensor<float> o(lay, B, Hv, L - 1, D);
    const auto rows = [&](const Tensor<float>& t) {
      return ak::View<const float>(ak::bhsd(t.memory.data(), B, t.view.heads, L - 1, t.view.dim));
    };
    ak::gated_attention(spec, rows(q), rows(k), rows(v), ak::GateInputs{rows(g), rows(beta)},
                        o.view, ak::View<float>{}, shorter);
  }
  check_refused([&] { call_saved(shorter, spec); }, {"q.seq", "4", "5"}, outs);
  ak::GatedSaved kept;
  {
    Tensor<float> o(lay, B, Hv, L, D);
    ak::gated_attention(spec, q.cview(), k.cview(), v.cview(), gates, o.view, ak::View<float>{},
                        kept);
  }
  check_refused([&] { call_saved(kept, spec.with_chunk(2)); }, {"spec", "chunk"}, outs);
  check_refused([&] { call_saved(kept, spec, ak::Options{}.with_scale(0.5f)); },
                {"options.scale", "0.5"}, outs);
  state.fill(std::numeric_limits<float>::quiet_NaN());
  check_refused([&] { call(dq.view, {}, state.cview()); }, {"state_in", "finite"}, outs);
}
