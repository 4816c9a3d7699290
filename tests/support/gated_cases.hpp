// What the gated attention tests share (tests/gated): the shape of a call, its inputs (q, k,
// v in storage T, the log gates in [g_low, 0], beta in [0, 1], a starting state), and the
// family of specs every test runs: the four named models' specs, no gate, fixed per-head gates.
#pragma once

#include <attnkit/gated/gated_spec.hpp>
#include <cmath>
#include <cstdint>
#include <random>

#include "support/attnkit_test.hpp"

namespace attnkit::test {

struct GatedShape {
  Index batch = 2, k_heads = 2, v_heads = 4, len = 150, key_dim = 32, value_dim = 24;
  Layout layout = Layout::Bshd;
  int threads = 2;
};

// The inputs of one call: q, k, v in storage T, the gates in f32, a state [B, Hv, Dk, Dv].
template <class T>
struct GatedInputs {
  Tensor<T> q, k, v;
  Tensor<float> g, beta, state;
  GatedInputs(const GatedSpec& spec, const GatedShape& s, std::uint32_t seed = 3,
              float g_low = -0.5f)
      : q(s.layout, s.batch, s.k_heads, s.len, s.key_dim),
        k(s.layout, s.batch, s.k_heads, s.len, s.key_dim),
        v(s.layout, s.batch, s.v_heads, s.len, s.value_dim),
        g(s.layout, s.batch, s.v_heads, s.len, spec.gate == GateShape::PerChannel ? s.key_dim : 1),
        beta(s.layout, s.batch, s.v_heads, s.len, 1),
        state(Layout::Bhsd, s.batch, s.v_heads, s.key_dim, s.value_dim) {
    // Without l2 normalization the keys' scale must keep the delta rule stable
    // (beta |k|^2 < 2): entries of 1/sqrt(Dk) give |k| near 1.
    const float key_scale = spec.l2_normalize ? 1.f : 1.f / std::sqrt(float(s.key_dim));
    q.randomize(seed, 1.f);
    k.randomize(seed + 1, key_scale);
    v.randomize(seed + 2);
    state.randomize(seed + 3, 0.5f);
    std::mt19937 rng(seed + 4);
    std::uniform_real_distribution<float> unit(0.f, 1.f);
    g.for_each([&](float& x) { x = g_low * unit(rng); });
    beta.for_each([&](float& x) { x = unit(rng); });
  }
  GateInputs gates(const GatedSpec& spec) const {
    GateInputs in;
    if (spec.reads_gates()) in.g = g.cview();
    if (spec.delta()) in.beta = beta.cview();
    return in;
  }
};

// dst = src, element for element (f32 to f64 for the reference's states).
template <class A, class B>
void copy_values(const Tensor<A>& src, Tensor<B>& dst) {
  const auto& v = src.view;
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index r = 0; r < v.seq; ++r)
        for (Index c = 0; c < v.dim; ++c) dst.view.row(b, h, r)[c] = B(v.row(b, h, r)[c]);
}

// The specs every gated test runs (PerHead's gates: one per value head of GatedShape{}).
inline const GatedSpec kGatedFamily[] = {GatedSpec::gated_delta_net(),
                                         GatedSpec::kimi_delta(),
                                         GatedSpec::mamba2(),
                                         GatedSpec::gla(),
                                         GatedSpec{}.with_gate(GateShape::None),
                                         GatedSpec{}.with_head_gates({-0.1f, 0.f, -1.f, -0.01f})};

}  // namespace attnkit::test
