// fuzz_linear: the fuzz target's runs of linear_attention() and linear_attention_backward()
// against reference::linear_attention() and reference::linear_attention_backward();
// fuzz_entries.cpp decodes the inputs, fuzz_grads.cpp fits them to these entries
// (shape_grads_case()). Properties: as fuzz_grads.cpp states them; a NaN query makes its row
// NaN, as in the reference (forward, EluPlusOne and Taylor2).
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz/fuzz_grads.hpp"

namespace attnkit_fuzz {
namespace {

const float kGammas[] = {1.f, 0.9f, 0.5f, 0.99f, 0.f, 0.75f};
const Index kLinearChunks[] = {1, 2, 3, 5, 8, 16, 32, 64};

// ---------------------------------------------------------------------------------------
// Linear attention. e[4]: the map (bits 0-1: EluPlusOne, Relu, Taylor2), non-causal (bit 2),
// unnormalized (bit 3), recurrent (bit 4), decay (bit 5); e[5]: the chunk.

template <class Map>
ak::LinearSpec<Map> linear_spec_of(const Case& c) {
  ak::LinearSpec<Map> spec = ak::linear_spec(Map{});
  spec = spec.with_causal((c.e[4] & 4) == 0)
             .with_form((c.e[4] & 16) != 0 ? ak::LinearForm::Recurrent : ak::LinearForm::Chunked)
             .with_chunk(kLinearChunks[c.e[5] % std::size(kLinearChunks)]);
  if ((c.e[4] & 8) != 0) spec = spec.with_normalize(false);
  if ((c.e[4] & 32) != 0) {
    std::vector<float> gammas;
    for (Index h = 0; h < c.Hq; ++h) gammas.push_back(kGammas[(c.e[6] + h) % std::size(kGammas)]);
    spec = spec.with_decay(gammas);
  }
  return spec;
}

template <class Map>
void linear_one(const Case& c) {
  const ak::LinearSpec<Map> spec = linear_spec_of<Map>(c);
  Qkv<> in(c);
  Buf<float>&q = in.q, &k = in.k, &v = in.v;
  Buf<float> o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  place_special(c, q, true);  // a NaN query: its row NaN, as the reference's
  for (auto* b : {&q, &k, &v, &o}) b->snapshot();
  ak::LinearState state = ak::make_linear_state(spec, q.view(), v.view());
  const std::vector<float> state_before = state.floats();
  ak::View<float> out = o.view();
  if (c.defect == Defect::LinearAlias) out.data = state.head(0, 0);  // o inside the state
  const auto fast = [&](Buf<float>* dst, int threads) {
    ak::LinearState st = ak::make_linear_state(spec, q.view(), v.view());
    ak::linear_attention(spec, q.view(), k.view(), v.view(), dst->view(), st,
                         call_options(c).with_threads(threads));
  };
  const bool ok = returns([&] {
    ak::linear_attention(spec, q.view(), k.view(), v.view(), out, state, call_options(c));
  });
  for (auto* b : {&q, &k, &v})
    if (!b->unchanged()) violated(c, "linear_attention changed an input");
  if (c.defect != Defect::None) {
    if (ok) violated(c, "linear_attention accepted an invalid call");
    if (!o.unchanged() || state.floats() != state_before)
      violated(c, "a rejected linear_attention wrote its output or state");
    return;
  }
  Buf<double> ref(c.B, c.Hq, c.Lq, c.Dv), mass(c.B, c.Hq, c.Lq, c.Dv);
  const bool ref_ok = returns([&] {
    ak::reference::linear_attention(spec, q.view(), k.view(), v.view(), ref.view(), options_of(c));
  });
  if (ok != ref_ok) violated(c, verdicts_differ("linear_attention", ok, ref_ok));
  if (!ok) {
    if (!o.unchanged()) violated(c, "a rejected linear_attention wrote its output");
    return;
  }
  Buf<float> again(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  fast(&again, c.threads == 1 ? 2 : 1);
  if (std::memcmp(again.data.data(), o.data.data(), o.data.size() * sizeof(float)) != 0)
    violated(c, "linear_attention's output depends on the thread count");
  // Normalized: a weighted mean of the values (the features are positive); unnormalized: a
  // weighted sum, whose weights the reference sums over values of 1 (`mass`).
  const double vmax = std::max(v.max_abs(), 1e-30);
  double tol = vmax * 1e-3;
  if (!spec.normalize) {
    Buf<float> ones = ones_like(v);
    ak::reference::linear_attention(spec, q.view(), k.view(), ones.view(), mass.view(),
                                    options_of(c));
    tol *= std::max(finite_max(mass), 1.0);
  }
  check_tensor(c, "linear_attention", o, ref, tol, true);
}

template <class Map>
void linear_backward_one(const Case& c) {
  const ak::LinearSpec<Map> spec = linear_spec_of<Map>(c);
  Qkv<> in(c);
  Buf<float>&q = in.q, &k = in.k, &v = in.v;
  Buf<float> d_o(c.B, c.Hq, c.Lq, c.Dv, c.bshd[3]);
  d_o.fill(1.f, seed_of(c, 3));
  Buf<float> dq(c.B, c.Hq, c.Lq, c.D), dk(c.B, c.Hkv, c.Lk, c.D), dv(c.B, c.Hkv, c.Lk, c.Dv);
  for (auto* b : {&q, &k, &v, &d_o, &dq, &dk, &dv}) b->snapshot();
  const auto fast = [&](Buf<float>& gq, Buf<float>& gk, Buf<float>& gv, int threads) {
    ak::linear_attention_backward(spec, q.view(), k.view(), v.view(), d_o.view(), gq.view(),
                                  gk.view(), gv.view(), call_options(c).with_threads(threads));
  };
  const bool ok = returns([&] { fast(dq, dk, dv, c.threads); });
  for (auto* b : {&q, &k, &v, &d_o})
    if (!b->unchanged()) violated(c, "linear_attention_backward changed an input");
  if (c.defect != Defect::None && ok)
    violated(c, "linear_attention_backward accepted an invalid call");
  Buf<double> rq(c.B, c.Hq, c.Lq, c.D), rk(c.B, c.Hkv, c.Lk, c.D), rv(c.B, c.Hkv, c.Lk, c.Dv);
  const bool ref_ok = c.defect != Defect::None || returns([&] {
                        ak::reference::linear_attention_backward(
                            spec, q.view(), k.view(), v.view(), d_o.view(), rq.view(), rk.view(),
                            rv.view(), nullptr, nullptr, nullptr, options_of(c));
                      });
  if (c.defect == Defect::None && ok != ref_ok)
    violated(c, verdicts_differ("linear_attention_backward", ok, ref_ok));
  if (!ok) {
    if (!dq.unchanged() || !dk.unchanged() || !dv.unchanged())
      violated(c, "a rejected linear_attention_backward wrote a gradient");
    return;
  }
  Buf<float> gq(c.B, c.Hq, c.Lq, c.D), gk(c.B, c.Hkv, c.Lk, c.D), gv(c.B, c.Hkv, c.Lk, c.Dv);
  fast(gq, gk, gv, c.threads == 1 ? 2 : 1);
  if (!same_bits(gq, dq) || !same_bits(gk, dk) || !same_bits(gv, dv))
    violated(c, "linear_attention_backward's gradients depend on the thread count");
  // Loose, relative to the largest gradient of each tensor and of all three (a tensor whose
  // terms cancel keeps the rounding of the others' scale).
  const double all = std::max({finite_max(rq), finite_max(rk), finite_max(rv), 1e-30});
  for (auto [name, fast_g, ref_g] :
       {std::tuple{"dq", &dq, &rq}, std::tuple{"dk", &dk, &rk}, std::tuple{"dv", &dv, &rv}})
    check_tensor(c, std::string("linear_attention_backward ") + name, *fast_g, *ref_g,
                 2e-3 * finite_max(*ref_g) + 2e-4 * all, false);
}

}  // namespace

void run_linear(const Case& c) {
  switch (c.e[4] & 3) {
    case 1:
      return linear_one<ak::Relu>(c);
    case 2:
      return linear_one<ak::Taylor2>(c);
    default:
      return linear_one<ak::EluPlusOne>(c);
  }
}

void run_linear_backward(const Case& c) {
  if ((c.e[4] & 3) == 2) return linear_backward_one<ak::Taylor2>(c);
  linear_backward_one<ak::EluPlusOne>(c);
}

}  // namespace attnkit_fuzz
