// The gated family's parts, each on its own: the spec (gated/gated_spec.hpp: the named models'
// settings, setters that copy, identities), the checks (gated/gated_checks.hpp: the shape they
// return and Qwen3-Next's key head of a value head), the row loading (gated/gated_rows.hpp:
// q and k l2-normalized and scaled, gates and beta per row), and the two backward engines
// against each other (gated/gated_backward_chunks.hpp on GEMMs, from its own pass over the
// chunks, gated/gated_chunk_pass.hpp, gated/gated_backward_columns.hpp
// by blocks of state columns): on a per-token gate, given to the second as the same decay in
// every key channel, they must give the same gradients within f32 rounding.
#include <attnkit/gated/gated_backward_chunks.hpp>
#include <attnkit/gated/gated_backward_columns.hpp>
#include <attnkit/gated/gated_checks.hpp>
#include <attnkit/gated/gated_chunk_pass.hpp>
#include <attnkit/gated/gated_rows.hpp>
#include <attnkit/gated/gated_spec.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "support/attnkit_test.hpp"
#include "support/gated_cases.hpp"

namespace ak = attnkit;
using ak::GatedSpec;
using ak::GatedUpdate;
using ak::GateShape;
using ak::Index;
using ak::LinearForm;
using ak::test::GatedInputs;
using ak::test::GatedShape;
using ak::test::Tensor;

TEST_CASE("GatedSpec: the named models' settings, setters that copy, identities",
          "[gated][parts]") {
  const GatedSpec gdn = GatedSpec::gated_delta_net(), kda = GatedSpec::kimi_delta();
  CHECK((gdn.update == GatedUpdate::Delta && gdn.gate == GateShape::PerToken && gdn.l2_normalize));
  CHECK(
      (kda.update == GatedUpdate::Delta && kda.gate == GateShape::PerChannel && kda.l2_normalize));
  const GatedSpec ssd = GatedSpec::mamba2(), gla = GatedSpec::gla();
  CHECK((ssd.update == GatedUpdate::Additive && ssd.gate == GateShape::PerToken));
  CHECK((gla.update == GatedUpdate::Additive && gla.gate == GateShape::PerChannel));
  CHECK((gdn.delta() && !ssd.delta() && gdn.reads_gates() && gla.reads_gates()));
  const GatedSpec fixed = gdn.with_head_gates({-0.5f, 0.f});
  CHECK((fixed.gate == GateShape::PerHead && !fixed.reads_gates() && gdn.head_gates.empty()));
  CHECK(gdn.with_chunk(32).chunk == 32);
  CHECK(gdn.chunk == 64);  // the setter changed a copy
  CHECK(gdn.with_form(LinearForm::Recurrent).form == LinearForm::Recurrent);
  CHECK(gdn.tag() == GatedSpec::gated_delta_net().tag());
  CHECK(gdn.tag() != kda.tag());
  CHECK(gdn.tag() != gdn.with_chunk(32).tag());
  CHECK(fixed.tag() != gdn.with_head_gates({-0.5f, -0.1f}).tag());
}

TEST_CASE("check_gated: the call's shape, and the key head of each value head", "[gated][parts]") {
  GatedShape s;
  s.k_heads = 2;
  s.v_heads = 6;
  const GatedSpec spec = GatedSpec::gated_delta_net();
  const GatedInputs<float> in(spec, s);
  Tensor<float> o(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
  const ak::detail::GatedShape shape = ak::detail::check_gated(
      spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec), o.view, nullptr, {});
  CHECK((shape.batch == s.batch && shape.k_heads == 2 && shape.v_heads == 6));
  CHECK((shape.len == s.len && shape.key_dim == s.key_dim && shape.value_dim == s.value_dim));
  // Value heads 0-2 read key head 0, 3-5 key head 1 (transformers' repeat_interleave).
  for (Index h = 0; h < 6; ++h) CHECK(shape.k_head(h) == h / 3);
}

namespace {

// GatedRows' loading, opened for the test.
struct RowsProbe : ak::detail::GatedRows<const float, const float, const float, float> {
  using GatedRows::beta_;
  using GatedRows::gate_;
  using GatedRows::GatedRows;
  using GatedRows::kc_;
  using GatedRows::ldk_;
  using GatedRows::load_rows;
  using GatedRows::qc_;
};

}  // namespace

TEST_CASE("GatedRows: q and k rows normalized and scaled, the rows' gates and betas",
          "[gated][parts]") {
  GatedShape s;
  const float scale = 0.25f;
  for (const GatedSpec& spec : {GatedSpec::kimi_delta(), GatedSpec::mamba2()}) {
    const GatedInputs<float> in(spec, s);
    Tensor<float> o(s.layout, s.batch, s.v_heads, s.len, s.value_dim);
    const ak::detail::GatedShape shape = ak::detail::check_gated(
        spec, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec), o.view, nullptr, {});
    RowsProbe rows(spec, shape, scale, in.q.cview(), in.k.cview(), in.v.cview(), in.gates(spec),
                   o.view, nullptr);
    const Index b = 1, kh = 1, h = 3, t0 = 5, n = 4;
    rows.load_rows(b, kh, h, t0, n);
    for (Index r = 0; r < n; ++r) {
      const float* q = in.q.view.row(b, kh, t0 + r);
      double sum = 0;
      for (Index c = 0; c < s.key_dim; ++c) sum += double(q[c]) * double(q[c]);
      const double f = spec.l2_normalize ? scale / std::sqrt(sum + 1e-6) : scale;
      for (Index c = 0; c < s.key_dim; ++c)
        CHECK(std::abs(rows.qc_[r * rows.ldk_ + c] - f * double(q[c])) <=
              1e-6 * std::abs(f * q[c]) + 1e-7);
      for (Index c = s.key_dim; c < rows.ldk_; ++c) CHECK(rows.qc_[r * rows.ldk_ + c] == 0.f);
      const Index width = spec.gate == GateShape::PerChannel ? s.key_dim : 1;
      for (Index c = 0; c < width; ++c)
        CHECK(rows.gate_[std::size_t(r * width + c)] == in.g.view.row(b, h, t0 + r)[c]);
      CHECK(rows.beta_[std::size_t(r)] ==
            (spec.delta() ? in.beta.view.row(b, h, t0 + r)[0] : 1.f));  // additive: 1
    }
  }
}

TEST_CASE("ChunkBackward and ColumnBackward agree on a per-token gate", "[gated][parts]") {
  // One head's rows as GatedBackward loads them: q, k [L, ldk] (unit-norm keys), v, d_o
  // [L, ldv] (ldv a whole number of ColumnBackward blocks), log gates, betas.
  const Index L = 150, Dk = 32, Dv = 24, W = ak::simd::kWidth;
  const Index ldk = (Dk + W - 1) / W * W;
  const Index ldv = (Dv + ak::detail::ColumnBackward::kBlock - 1) /
                    ak::detail::ColumnBackward::kBlock * ak::detail::ColumnBackward::kBlock;
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> q(std::size_t(L * ldk), 0.f), k(q.size(), 0.f), v(std::size_t(L * ldv), 0.f),
      d_o(v.size(), 0.f), gate(static_cast<std::size_t>(L)), beta(gate.size()),
      decay(static_cast<std::size_t>(L * Dk));
  for (Index t = 0; t < L; ++t) {
    double norm = 0;
    for (Index c = 0; c < Dk; ++c) {
      q[std::size_t(t * ldk + c)] = 0.2f * normal(rng);
      norm += double(k[std::size_t(t * ldk + c)] = normal(rng)) * k[std::size_t(t * ldk + c)];
    }
    for (Index c = 0; c < Dk; ++c) k[std::size_t(t * ldk + c)] /= float(std::sqrt(norm));
    for (Index c = 0; c < Dv; ++c) {
      v[std::size_t(t * ldv + c)] = normal(rng);
      d_o[std::size_t(t * ldv + c)] = normal(rng);
    }
    gate[std::size_t(t)] = -0.3f * unit(rng);
    beta[std::size_t(t)] = unit(rng);
    for (Index c = 0; c < Dk; ++c) decay[std::size_t(t * Dk + c)] = std::exp(gate[std::size_t(t)]);
  }
  std::vector<float> S0(std::size_t(Dk * ldv), 0.f), d_out(S0.size(), 0.f);
  for (Index c = 0; c < Dk; ++c)
    for (Index e = 0; e < Dv; ++e) {
      S0[std::size_t(c * ldv + e)] = 0.5f * normal(rng);
      d_out[std::size_t(c * ldv + e)] = 0.5f * normal(rng);
    }
  struct Grads {
    std::vector<float> dq, dk, dv, dg, dbeta, ddo, dS;
  };
  const auto grads = [&](bool chunks) {
    Grads g{std::vector<float>(std::size_t(L * Dk), 0.f),
            std::vector<float>(std::size_t(L * Dk), 0.f),
            std::vector<float>(v.size(), 0.f),
            std::vector<float>(std::size_t(L * Dk), 0.f),
            std::vector<float>(std::size_t(L), 0.f),
            std::vector<float>(std::size_t(L), 0.f),
            d_out};
    std::vector<float> dg_token(std::size_t(L), 0.f), start = S0;
    const ak::detail::HeadRows rows{L,
                                    Dk,
                                    Dv,
                                    ldk,
                                    ldv,
                                    64,
                                    true,
                                    q.data(),
                                    k.data(),
                                    v.data(),
                                    d_o.data(),
                                    gate.data(),
                                    beta.data(),
                                    g.dq.data(),
                                    g.dk.data(),
                                    g.dv.data(),
                                    dg_token.data(),
                                    g.dbeta.data()};
    if (chunks) {
      ak::detail::ChunkBackward().run(rows, start.data(), g.dS.data());
      for (Index t = 0; t < L; ++t) g.dg[std::size_t(t * Dk)] = dg_token[std::size_t(t)];
    } else {
      ak::detail::ColumnBackward().run(rows, decay.data(), g.dg.data(), g.ddo.data(), S0.data(),
                                       g.dS.data());
      for (Index t = 0; t < L; ++t) {  // the per-channel dg summed to the token's; dq's k part
        float sum = 0;
        for (Index c = 0; c < Dk; ++c) {
          sum += g.dg[std::size_t(t * Dk + c)];
          g.dq[std::size_t(t * Dk + c)] += k[std::size_t(t * ldk + c)] * g.ddo[std::size_t(t)];
        }
        std::fill(g.dg.begin() + t * Dk, g.dg.begin() + (t + 1) * Dk, 0.f);
        g.dg[std::size_t(t * Dk)] = sum;
      }
    }
    return g;
  };
  const Grads a = grads(true), b = grads(false);
  const auto relative = [](const std::vector<float>& x, const std::vector<float>& y) {
    double worst = 0, scale = 1e-30;
    for (std::size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, std::abs(double(x[i]) - double(y[i])));
      scale = std::max(scale, std::abs(double(y[i])));
    }
    return worst / scale;
  };
  const double tolerance = 5e-5;  // two f32 evaluations of the same sums in other orders
  CHECK(relative(a.dq, b.dq) <= tolerance);
  CHECK(relative(a.dk, b.dk) <= tolerance);
  CHECK(relative(a.dv, b.dv) <= tolerance);
  CHECK(relative(a.dg, b.dg) <= tolerance);
  CHECK(relative(a.dbeta, b.dbeta) <= tolerance);
  CHECK(relative(a.dS, b.dS) <= tolerance);
}
