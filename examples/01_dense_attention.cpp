// What this shows: dense (and causal) softmax attention with attnkit, from raw buffers
// to a checked result.
//
//   1. describe caller-owned buffers with views (no copies),
//   2. compose a variant from policies with make_spec,
//   3. call attnkit::attention, optionally asking for the row log-sum-exp,
//   4. check the result against the double-precision reference,
//   5. run it again with bf16 products (Options::with_products), and print PASS.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;

int main() {
  // Shapes of a small grouped-query attention layer: 8 query heads share 2 KV heads.
  const ak::Index batch = 2, q_heads = 8, kv_heads = 2;
  const ak::Index q_len = 100, kv_len = 300;  // e.g. 100 new tokens after 200 cached ones
  const ak::Index dim = 64;

  // Model code usually stores activations as [batch, seq, heads, dim] ("BSHD").
  std::vector<float> q(batch * q_len * q_heads * dim);
  std::vector<float> k(batch * kv_len * kv_heads * dim);
  std::vector<float> v(batch * kv_len * kv_heads * dim);
  std::vector<float> o(batch * q_len * q_heads * dim);

  std::mt19937 rng(2024);
  std::normal_distribution<float> normal;
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);

  // 1. Views say how to read the buffers: sizes and strides, nothing is copied.
  //    bshd(ptr, B, S, H, D) for [batch, seq, heads, dim]; bhsd(...) for the other layout.
  const auto Q = ak::bshd(q.data(), batch, q_len, q_heads, dim);
  const auto K = ak::bshd(k.data(), batch, kv_len, kv_heads, dim);
  const auto V = ak::bshd(v.data(), batch, kv_len, kv_heads, dim);
  const auto O = ak::bshd(o.data(), batch, q_len, q_heads, dim);

  // 2. A variant is a handful of policies, in any order. Missing slots take defaults:
  //    Dot score, Full mask, Softmax normalizer, no positional encoding.
  //    Causal masks are bottom-right aligned: with 100 queries after 300 keys, query row
  //    r sits at absolute position r + 200 and sees keys 0 .. r + 200.
  const auto spec = ak::make_spec(ak::Causal{});

  // 3. One call. Options carry the per-call knobs: scale (default 1/sqrt(dim)), the
  //    query offset, threads, and optional statistics such as the log-sum-exp per row,
  //    laid out [batch, q_heads, q_len].
  std::vector<float> lse(batch * q_heads * q_len);
  ak::attention(spec, Q, K, V, O, ak::Options{}.with_lse(lse));

  // 4. The reference computes the same spec the obvious way, in double precision.
  std::vector<double> expected(o.size());
  const auto E = ak::bshd(expected.data(), batch, q_len, q_heads, dim);
  std::vector<float> expected_lse(lse.size());
  ak::reference::attention(spec, Q, K, V, E, ak::Options{}.with_lse(expected_lse));

  double worst = 0.0, worst_lse = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) worst = std::max(worst, std::abs(o[i] - expected[i]));
  for (std::size_t i = 0; i < lse.size(); ++i)
    worst_lse = std::max(worst_lse, double(std::abs(lse[i] - expected_lse[i])));

  // 5. bf16 products, per call: the kernel may round Q, K, V and the softmax weights to bf16
  //    and accumulate in f32, as GPU kernels do. Only where a kernel makes that faster
  //    (vdpbf16ps on AMD CPUs: gemm::bf16_products_here()); elsewhere the products stay exact.
  std::vector<float> o_bf16(o.size());
  const auto O16 = ak::bshd(o_bf16.data(), batch, q_len, q_heads, dim);
  ak::attention(spec, Q, K, V, O16, ak::Options{}.with_products(ak::Products::Bf16));
  double worst_bf16 = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i)
    worst_bf16 = std::max(worst_bf16, std::abs(o_bf16[i] - expected[i]));
  // Each rounding is within 2^-9 relative: on N(0, 1) inputs like these the outputs move by
  // 2e-3 to 3e-3 (the tests check the bound the rounding implies).
  const double bf16_tolerance = 1e-2;
  std::printf("bf16 products %s here: max |o - reference| = %.3g (tolerance %.0e)\n",
              ak::gemm::bf16_products_here() ? "run" : "are not faster, exact products ran",
              worst_bf16, bf16_tolerance);

  // Bad input is rejected before anything is written, with a message naming the argument.
  bool rejected = false;
  try {
    const auto K_wrong_dim = ak::bshd(k.data(), batch, kv_len, kv_heads * 2, dim / 2);
    ak::attention(spec, Q, K_wrong_dim, V, O);
  } catch (const ak::Error& e) {
    std::printf("rejected as expected: %s\n", e.what());
    rejected = true;
  }

  const double tolerance = 2e-5;  // f32 accumulation against the f64 reference
  std::printf("max |o - reference| = %.3g, max |lse - reference| = %.3g (tolerance %.0e)\n", worst,
              worst_lse, tolerance);
  const bool pass =
      worst <= tolerance && worst_lse <= tolerance && worst_bf16 <= bf16_tolerance && rejected;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
