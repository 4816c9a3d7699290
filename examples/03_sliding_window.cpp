// What this shows: local attention and StreamingLLM's attention sinks, built by combining
// masks. `Causal & SlidingWindow{w, 0}` lets query i see keys i - w .. i; StreamingLLM adds
// the first 4 keys ("sinks") that every query keeps: `Causal & (Sinks{4} | SlidingWindow)`.
// The kernel walks only the key ranges a mask leaves (two short ranges for sinks + window,
// not their hull), so the time follows the kept pairs; we count them and time both against
// dense causal attention, then check each against the double-precision reference.
//
// Convention: SlidingWindow{left, right} counts keys before and after the query, so a KV
// cache holding W recent tokens (the current one included), as in StreamingLLM's recent
// window, is SlidingWindow{W - 1, 0}.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

// Pairs (i, j) the mask keeps for queries 0 .. len-1 over keys 0 .. len-1, from runs():
// the exact visible key intervals of each query.
template <class Mask>
double kept_pairs(const Mask& mask, Index len) {
  double kept = 0;
  for (Index i = 0; i < len; ++i)
    for (const ak::Range& r : mask.runs(0, 0, i))
      kept += double(std::max<Index>(0, std::min(r.end, len) - std::max<Index>(r.begin, 0)));
  return kept;
}

template <class Spec>
double seconds_of(const Spec& spec, ak::View<const float> q, ak::View<const float> k,
                  ak::View<const float> v, ak::View<float> o) {
  const auto start = std::chrono::steady_clock::now();
  ak::attention(spec, q, k, v, o);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Largest |fast - reference| for one spec.
template <class Spec>
double error_of(const Spec& spec, ak::View<const float> q, ak::View<const float> k,
                ak::View<const float> v, ak::View<float> o, std::vector<double>& expected) {
  const auto reference_out = ak::bshd(expected.data(), 1, o.seq, o.heads, o.dim);
  ak::attention(spec, q, k, v, o);
  ak::reference::attention(spec, q, k, v, reference_out);
  double worst = 0;
  for (Index h = 0; h < o.heads; ++h)
    for (Index s = 0; s < o.seq; ++s)
      for (Index c = 0; c < o.dim; ++c)
        worst = std::max(worst, std::abs(o.row(0, h, s)[c] - reference_out.row(0, h, s)[c]));
  return worst;
}

}  // namespace

int main() {
  const Index len = 2048, heads = 2, dim = 64, window = 256, sinks = 4;
  std::vector<float> q(len * heads * dim), k(q.size()), v(q.size()), o(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);
  const auto Q = ak::bshd(q.data(), 1, len, heads, dim), K = ak::bshd(k.data(), 1, len, heads, dim),
             V = ak::bshd(v.data(), 1, len, heads, dim);
  const auto O = ak::bshd(o.data(), 1, len, heads, dim);

  // Three variants: dense causal, local attention, and StreamingLLM (sinks + window).
  const auto causal = ak::Causal{};
  const auto local_mask = ak::Causal{} & ak::SlidingWindow{window - 1, 0};
  const auto streaming_mask = ak::Causal{} & (ak::Sinks{sinks} | ak::SlidingWindow{window - 1, 0});

  const double dense_pairs = kept_pairs(causal, len);
  const double local_pairs = kept_pairs(local_mask, len);
  const double streaming_pairs = kept_pairs(streaming_mask, len);
  std::printf("kept pairs: causal %.0f, window %.0f (%.1f%%), sinks + window %.0f (%.1f%%)\n",
              dense_pairs, local_pairs, 100 * local_pairs / dense_pairs, streaming_pairs,
              100 * streaming_pairs / dense_pairs);

  // Best of a few runs each: the time follows the kept pairs, not the sequence length.
  double t_dense = 1e9, t_local = 1e9, t_streaming = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    t_dense = std::min(t_dense, seconds_of(ak::make_spec(causal), Q, K, V, O));
    t_local = std::min(t_local, seconds_of(ak::make_spec(local_mask), Q, K, V, O));
    t_streaming = std::min(t_streaming, seconds_of(ak::make_spec(streaming_mask), Q, K, V, O));
  }
  std::printf("time: causal %.2f ms, window %.2f ms (%.0f%% skipped), sinks + window %.2f ms\n",
              1e3 * t_dense, 1e3 * t_local, 100 * (1 - t_local / t_dense), 1e3 * t_streaming);

  // Both sparse variants agree with the reference, which applies keep() to every pair.
  std::vector<double> expected(o.size());
  const double err_local = error_of(ak::make_spec(local_mask), Q, K, V, O, expected);
  const double err_streaming = error_of(ak::make_spec(streaming_mask), Q, K, V, O, expected);
  const double tolerance = 2e-5;  // f32 kernel vs f64 reference, values of order 1
  std::printf("max |o - reference|: window %.3g, sinks + window %.3g (tolerance %.0e)\n", err_local,
              err_streaming, tolerance);
  const bool pass = err_local <= tolerance && err_streaming <= tolerance;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
