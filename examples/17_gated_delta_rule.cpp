// What this shows: a Gated DeltaNet layer (Qwen3-Next, Qwen3.5) through gated_attention().
//
// The state S [Dk, Dv] of a head is an associative memory: reading it with a key returns the
// value stored under that key (o = S^T q). Additive linear attention writes S += k v^T: a key
// written twice returns the SUM of its two values, and old writes are never taken back. The
// delta rule first reads what S already holds under k and writes only the correction:
//   S = S' + beta k (v - S'^T k)^T,   S' = exp(g) S   (g <= 0: a per-token forgetting gate)
// With beta = 1 and a unit key, the new value replaces the old one. Part 1 shows that recall;
// part 2 runs a layer the way a model does: a prompt in the chunked form (prefill), then token
// by token in the recurrent form from the state the prefill handed over (decode), every step
// checked against reference::gated_attention(), the plain recurrence in double.
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

// Part 1: two writes under key 0 (values 1 then 2 in column 0), one read with key 0.
float recall(const ak::GatedSpec& spec) {
  const Index D = 4;
  //                     write k0 -> v=1    write k0 -> v=2    read with k0
  std::vector<float> q = {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
  std::vector<float> k = {1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};  // the read writes nothing: k = 0
  std::vector<float> v = {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  std::vector<float> beta = {1, 1, 1}, o(12);
  ak::GateInputs gates;
  if (spec.delta()) gates.beta = ak::bshd(beta.data(), 1, 3, 1, 1);
  const auto view = [&](std::vector<float>& x) {
    return ak::bshd((const float*)x.data(), 1, 3, 1, D);
  };
  ak::gated_attention(spec, view(q), view(k), view(v), gates, ak::bshd(o.data(), 1, 3, 1, D),
                      ak::Options{}.with_scale(1.f));
  return o[8];  // the read's value in column 0
}

}  // namespace

int main() {
  const auto additive =
      ak::GatedSpec{}.with_update(ak::GatedUpdate::Additive).with_gate(ak::GateShape::None);
  const auto delta = ak::GatedSpec{}.with_gate(ak::GateShape::None);
  const float sum = recall(additive), replaced = recall(delta);
  std::printf("recall of a key written twice (values 1, then 2): additive %.3g, delta rule %.3g\n",
              sum, replaced);
  bool ok = std::abs(sum - 3.f) < 1e-6f && std::abs(replaced - 2.f) < 1e-6f;

  // Part 2: a layer of Qwen3-Next's shape, scaled down: 2 key heads shared by 4 value heads,
  // Dk = Dv = 64, a prompt of 300 tokens, then 20 decode steps. q and k are l2-normalized
  // in the kernel; g and beta come from the model's own projections (here: drawn).
  const Index B = 1, Hk = 2, Hv = 4, D = 64, prompt = 300, steps = 20, L = prompt + steps;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> q(B * L * Hk * D), k(q.size()), v(B * L * Hv * D), g(B * L * Hv),
      beta(g.size()), out(v.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  for (float& e : g) e = -0.2f * unit(rng);  // log decays: exp(g) in [0.82, 1]
  for (float& e : beta) e = unit(rng);

  // Views of the tokens [begin, begin + n) of each BSHD buffer.
  const auto rows = [](auto* data, Index begin, Index n, Index heads, Index dim) {
    return ak::bshd(data + begin * heads * dim, B, n, heads, dim);
  };
  const auto spec = ak::GatedSpec::gated_delta_net();  // chunked by default
  std::vector<float> state(B * Hv * D * D, 0.f);       // [B, Hv, Dk, Dv], zero before the prompt
  const auto state_view = ak::bhsd(state.data(), B, Hv, D, D);
  const auto call = [&](const ak::GatedSpec& s, Index begin, Index n) {
    const ak::GateInputs gates{rows((const float*)g.data(), begin, n, Hv, 1),
                               rows((const float*)beta.data(), begin, n, Hv, 1)};
    ak::gated_attention(s, rows((const float*)q.data(), begin, n, Hk, D),
                        rows((const float*)k.data(), begin, n, Hk, D),
                        rows((const float*)v.data(), begin, n, Hv, D), gates,
                        rows(out.data(), begin, n, Hv, D), state_view);
  };
  call(spec, 0, prompt);              // prefill: chunked, leaves the state after the prompt
  for (Index t = prompt; t < L; ++t)  // decode: one token at a time from the handed-over state
    call(spec.with_form(ak::LinearForm::Recurrent), t, 1);

  // The reference: the whole sequence in one plain recurrence (double).
  std::vector<double> want(v.size());
  const ak::GateInputs all{rows((const float*)g.data(), 0, L, Hv, 1),
                           rows((const float*)beta.data(), 0, L, Hv, 1)};
  ak::reference::gated_attention(
      spec, rows((const float*)q.data(), 0, L, Hk, D), rows((const float*)k.data(), 0, L, Hk, D),
      rows((const float*)v.data(), 0, L, Hv, D), all, rows(want.data(), 0, L, Hv, D));
  double prefill_err = 0, decode_err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i]));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(out[i] - want[i]) / scale;
    (i < std::size_t(prompt * Hv * D) ? prefill_err : decode_err) =
        std::max(i < std::size_t(prompt * Hv * D) ? prefill_err : decode_err, e);
  }
  const double tolerance = 2e-5;  // f32 against f64, relative to max |reference|
  std::printf(
      "prefill (%ld tokens, chunked): max error %.2g; decode (%ld steps, recurrent, from "
      "the prefill's state): max error %.2g (tolerance %.0e, relative)\n",
      long(prompt), prefill_err, long(steps), decode_err, tolerance);
  ok = ok && prefill_err <= tolerance && decode_err <= tolerance;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
