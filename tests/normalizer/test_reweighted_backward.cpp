// reference_reweighted_grads() (normalizer/reweighted_backward.hpp): LSSAR's sharpening taken
// back, dP -> dS, against central finite differences of its forward written out here:
//   w_j = softplus(c s_j), a_j = w_j / sum w, u_j = N a_j - 1,
//   a'_j = exp(x_j - LSE(x)) with x_j = p ln u_j (u_j > 0; a key with u_j <= 0 gets 0),
// for the loss sum_j dP_j a'_j: its gradient with respect to s_j is what the rule writes.
// (The kernel's ReweightedGrad runs the same chain per SIMD lane; attention_backward's tests
// check it against this rule.)
#include <attnkit/normalizer/reweighted_backward.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

// a'(s) of one row: the reweighted weights, 0 for keys with u <= 0.
std::vector<double> reweighted(const std::vector<double>& s, double c, double keys, float power) {
  const std::size_t n = s.size();
  std::vector<double> w(n), x(n);
  double total = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const double z = c * s[j];
    total += (w[j] = std::max(z, 0.0) + std::log1p(std::exp(-std::fabs(z))));
  }
  double top = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < n; ++j) {
    const double u = keys * w[j] / total - 1.0;
    x[j] = u > 0 ? double(power) * std::log(u) : -std::numeric_limits<double>::infinity();
    top = std::max(top, x[j]);
  }
  double sum = 0;
  for (std::size_t j = 0; j < n; ++j) sum += std::exp(x[j] - top);
  for (std::size_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - top) / sum;
  return x;
}

}  // namespace

TEST_CASE("reference_reweighted_grads: the gradient of sum dP a' against finite differences",
          "[normalizer][lssar][backward]") {
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  for (const float power : {1.f, 3.f, 15.f}) {
    const Index n = 12;
    const double c = 4.0, keys = double(n);
    std::vector<double> s(static_cast<std::size_t>(n)), dp(s.size());
    for (double& x : s) x = 0.5 * normal(rng);  // cosines
    for (double& x : dp) x = normal(rng);
    const std::vector<double> p = reweighted(s, c, keys, power);
    std::vector<double> ds = dp;
    ak::detail::reference_reweighted_grads(s.data(), p.data(), ds.data(), n, c, keys, power);
    const auto loss = [&](const std::vector<double>& at) {
      const std::vector<double> a = reweighted(at, c, keys, power);
      double sum = 0;
      for (std::size_t j = 0; j < a.size(); ++j) sum += dp[j] * a[j];
      return sum;
    };
    double worst = 0, scale = 1e-12;
    const double h = 1e-6;
    for (std::size_t j = 0; j < s.size(); ++j) {
      std::vector<double> up = s, down = s;
      up[j] += h;
      down[j] -= h;
      const double fd = (loss(up) - loss(down)) / (2 * h);
      worst = std::max(worst, std::abs(fd - ds[j]));
      scale = std::max(scale, std::abs(fd));
    }
    INFO("power " << power);
    CHECK(worst / scale <= 1e-6);  // central differences in double: truncation near h^2
  }
}
