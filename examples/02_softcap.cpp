// What this shows: logit soft-capping (Gemma 2, Grok), a Score policy that bends every
// logit s into cap * tanh(s / cap) before the mask and the softmax. It keeps logits, and
// so the softmax, bounded when activations grow large; we make that visible through the
// rows' log-sum-exp, with and without the cap.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;

int main() {
  const ak::Index heads = 4, len = 128, dim = 64;
  std::vector<float> q(heads * len * dim), k(q.size()), v(q.size()), o(q.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 4.f);  // large activations: logits up to ~100
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);

  // [heads, seq, dim] per batch: the BHSD layout.
  const auto Q = ak::bhsd(q.data(), 1, heads, len, dim);
  const auto K = ak::bhsd(k.data(), 1, heads, len, dim);
  const auto V = ak::bhsd(v.data(), 1, heads, len, dim);
  const auto O = ak::bhsd(o.data(), 1, heads, len, dim);

  // Softcap sits in the Score slot; Causal in the Mask slot. The order does not matter.
  const float cap = 30.f;  // Gemma 2 uses 50 for attention logits, Grok-1 uses 30
  const auto capped = ak::make_spec(ak::Softcap{cap}, ak::Causal{});
  const auto plain = ak::make_spec(ak::Causal{});

  // The LSE of a row is bounded by its largest logit plus log(number of keys).
  std::vector<float> lse_capped(heads * len), lse_plain(heads * len);
  ak::attention(plain, Q, K, V, O, ak::Options{}.with_lse(lse_plain));
  ak::attention(capped, Q, K, V, O, ak::Options{}.with_lse(lse_capped));

  // With the cap, every logit lies in (-cap, cap), so LSE <= cap + log(number of keys).
  float worst_lse = -INFINITY;
  for (float x : lse_capped) worst_lse = std::max(worst_lse, x);
  float plain_lse = -INFINITY;
  for (float x : lse_plain) plain_lse = std::max(plain_lse, x);
  std::printf("largest row LSE: %.1f without cap, %.1f with cap %.0f (bound %.1f)\n", plain_lse,
              worst_lse, cap, cap + std::log(float(len)));

  // The fast path agrees with the double-precision reference for the capped variant.
  std::vector<double> expected(o.size());
  ak::reference::attention(capped, Q, K, V, ak::bhsd(expected.data(), 1, heads, len, dim));
  double worst = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) worst = std::max(worst, std::abs(o[i] - expected[i]));

  const double tolerance = 2e-5 * 4;  // f32 vs f64, values of scale 4
  std::printf("max |o - reference| = %.3g (tolerance %.1e)\n", worst, tolerance);
  const bool pass = worst <= tolerance && worst_lse < cap + std::log(float(len));
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
