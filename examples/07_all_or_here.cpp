// What this shows: All-or-Here attention (AHA). A per-(token, head) gate g = w_h . x_t
// decides, with the hard threshold sigmoid(g) > 0.5 used at inference, whether a query
// pays for full causal attention or only for a sliding window of its last `window` keys
// (256 by default, its own key included). all_or_here() takes the routes and runs both
// kinds in one call; each query costs only what it chose.
//
// We turn gate logits into routes (AhaRoutes::from_gates), print the fraction routed to
// full attention and the (query, key) pairs visited vs dense causal attention, time both at
// L = 8192, and check the result against the f64 reference with the routing written out as
// an element mask at a small size.
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/select/all_or_here.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kHeads = 2, kDim = 64, kWindow = 256;

// Gate logits g[t, h] = w_h . x_t / sqrt(d) - 1: a learned gate stands in for random
// weights here; the offset makes most tokens stay "here", as trained AHA gates do.
std::vector<float> gate_logits(Index len, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<std::size_t>(len * kDim)), w(kHeads * kDim);
  for (float& e : x) e = normal(rng);
  for (float& e : w) e = normal(rng);
  std::vector<float> g(static_cast<std::size_t>(len * kHeads));
  for (Index t = 0; t < len; ++t)
    for (Index h = 0; h < kHeads; ++h) {
      float dot = 0;
      for (Index c = 0; c < kDim; ++c) dot += w[h * kDim + c] * x[t * kDim + c];
      g[static_cast<std::size_t>(t * kHeads + h)] = dot / std::sqrt(float(kDim)) - 1.f;
    }
  return g;
}

// The routing as an element mask, for the reference: causal, and within the window unless
// the query's route is full.
struct RoutingMask {
  using slot = ak::MaskSlot;
  const ak::AhaRoutes* routes;
  Index window;
  bool keep(Index b, Index h, Index i, Index j) const {
    return j <= i && (routes->is_full(b, i, h) || i - j < window);
  }
};

std::vector<float> random_vector(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& e : v) e = normal(rng);
  return v;
}

template <class F>
double seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const auto spec = ak::make_spec(ak::Softmax{});

  // 1. Routes, their fraction and the work they save at L = 8192.
  const Index len = 8192;
  const ak::AhaRoutes routes = ak::AhaRoutes::from_gates(gate_logits(len, rng), 1, len, kHeads);
  double visited = 0, dense = 0;  // (query, key) pairs
  for (Index t = 0; t < len; ++t)
    for (Index h = 0; h < kHeads; ++h) {
      dense += double(t + 1);
      visited += routes.is_full(0, t, h) ? double(t + 1) : double(std::min(t + 1, kWindow));
    }
  std::printf("L = %ld, %ld heads, window %ld\n", long(len), long(kHeads), long(kWindow));
  std::printf("routed to full attention: %.1f%% of (token, head)\n", 100 * routes.full_fraction());
  std::printf("pairs visited: %.3g vs %.3g dense causal (%.1f%% of the work)\n", visited, dense,
              100 * visited / dense);

  // 2. Timing: one AHA call vs one dense causal call on the same inputs.
  const auto n = static_cast<std::size_t>(len * kHeads * kDim);
  const auto q = random_vector(n, rng), k = random_vector(n, rng), v = random_vector(n, rng);
  std::vector<float> o(n);
  const auto Q = ak::bshd(q.data(), 1, len, kHeads, kDim),
             K = ak::bshd(k.data(), 1, len, kHeads, kDim),
             V = ak::bshd(v.data(), 1, len, kHeads, kDim);
  const auto O = ak::bshd(o.data(), 1, len, kHeads, kDim);
  ak::all_or_here(spec, Q, K, V, O, routes, kWindow);  // warm-up
  const double t_aha = seconds([&] { ak::all_or_here(spec, Q, K, V, O, routes, kWindow); });
  const double t_dense = seconds([&] { ak::attention(ak::make_spec(ak::Causal{}), Q, K, V, O); });
  std::printf("time: all_or_here %.1f ms, dense causal %.1f ms (%.2fx)\n", 1e3 * t_aha,
              1e3 * t_dense, t_dense / t_aha);

  // 3. Check at a small size: a window of 32 over 300 tokens, so both routes matter.
  const Index small = 300, small_window = 32;
  const ak::AhaRoutes small_routes =
      ak::AhaRoutes::from_gates(gate_logits(small, rng), 1, small, kHeads);
  const auto m = static_cast<std::size_t>(small * kHeads * kDim);
  const auto sq = random_vector(m, rng), sk = random_vector(m, rng), sv = random_vector(m, rng);
  std::vector<float> so(m);
  std::vector<double> expected(m);
  const auto view = [&](const std::vector<float>& x) {
    return ak::bshd(x.data(), 1, small, kHeads, kDim);
  };
  ak::all_or_here(spec, view(sq), view(sk), view(sv), ak::bshd(so.data(), 1, small, kHeads, kDim),
                  small_routes, small_window);
  ak::reference::attention(ak::make_spec(RoutingMask{&small_routes, small_window}), view(sq),
                           view(sk), view(sv), ak::bshd(expected.data(), 1, small, kHeads, kDim));
  double worst = 0;
  for (std::size_t i = 0; i < m; ++i) worst = std::max(worst, std::abs(so[i] - expected[i]));
  const double tolerance = 2e-5;  // f32 kernel vs f64 reference, softmax rows
  std::printf("max |o - reference| at L = %ld, window %ld: %.2g (tolerance %.0e)\n", long(small),
              long(small_window), worst, tolerance);

  const bool pass = worst <= tolerance && routes.full_fraction() > 0 && visited < dense;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
