// The consumer of tests/package: what a user writes after find_package(attnkit) or
// add_subdirectory(attnkit). One small causal problem through the fast kernel and the
// reference; exits non-zero when they disagree.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;

int main() {
  const ak::Index B = 1, L = 37, H = 2, D = 32;  // L is not a multiple of any tile
  const auto n = static_cast<std::size_t>(B * L * H * D);
  std::mt19937 rng(20240601);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<float> q(n), k(n), v(n), o(n);  // [B, L, H, D] each
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = uniform(rng);
  std::vector<double> o_ref(n);  // [B, L, H, D]

  const auto spec = ak::make_spec(ak::Causal{});
  ak::attention(spec, ak::bshd(q.data(), B, L, H, D), ak::bshd(k.data(), B, L, H, D),
                ak::bshd(v.data(), B, L, H, D), ak::bshd(o.data(), B, L, H, D));
  ak::reference::attention(spec, ak::bshd(q.data(), B, L, H, D), ak::bshd(k.data(), B, L, H, D),
                           ak::bshd(v.data(), B, L, H, D), ak::bshd(o_ref.data(), B, L, H, D));

  double max_err = 0.0;
  bool finite = true;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::abs(double(o[i]) - o_ref[i]);
    finite = finite && std::isfinite(err);
    max_err = std::max(max_err, err);
  }
  const double tolerance = 1e-4;
  if (!finite || max_err > tolerance) {
    std::printf("consumer FAILED: max |attention - reference| = %g (finite: %d) > %g\n", max_err,
                int(finite), tolerance);
    return 1;
  }
  std::printf("consumer OK: attnkit %d.%d.%d, max abs error %.3g\n", ATTNKIT_VERSION_MAJOR,
              ATTNKIT_VERSION_MINOR, ATTNKIT_VERSION_PATCH, max_err);
  return 0;
}
