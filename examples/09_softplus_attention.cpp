// What this shows: why LSSA exists (Gao & Spratling 2025), and what its re-weighting adds.
// A fixed query pattern -- each query has 8 "relevant" keys, the query plus noise of the
// same size, among random keys -- is read at contexts of 1K to 16K keys. Softmax disperses
// as the context grows: the relevant keys keep their logits while ever more random keys
// share the mass, so the row's entropy climbs faster than log L. LSSA,
// w_ij = softplus(log(d) log(N) cos(q_i, k_j)) normalized in l1, scales its logits with
// log N, but an l1 norm undoes any scale of the positive logits (softplus(c x) ~ c x for
// large c): the scale only silences the keys with a negative cosine. Its row is then close
// to uniform over half the keys, and its entropy is ~log(L / 2) at every L. LSSAR sharpens
// those weights with ReLU(N a - 1)^p (p = 15), keeping only the keys weighed well above
// uniform: its entropy stays flat and its mass stays on the relevant keys.
//
// The weights of a row are not one output of attention(), so we compute them here from the
// formulas, print their entropy, and check them against the library: attention() with
// values [1, j / L, relevant-to-query-0, ...] must give the sums of the same weights.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/normalizer/softplus_l1.hpp>
#include <attnkit/normalizer/softplus_l1_reweighted.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kQueries = 4, kDim = 64, kRelevant = 8, kMaxLen = 16384, kValues = 2 + kQueries;

// Key t of query i's relevant keys sits among the first 1024, so every context holds them.
Index relevant_key(Index i, Index t) { return 31 * (i * kRelevant + t) + 5; }

double dot(const float* a, const float* b) {
  double sum = 0;
  for (Index c = 0; c < kDim; ++c) sum += double(a[c]) * b[c];
  return sum;
}

// The attention weights a[n] of query q over the first n keys, in double, from the formulas.
enum class Rule { Softmax, Lssa, Lssar };
std::vector<double> weights(Rule rule, const float* q, const std::vector<float>& k, Index n) {
  std::vector<double> a(static_cast<std::size_t>(n));  // [n]
  for (Index j = 0; j < n; ++j) {
    const float* key = &k[std::size_t(j * kDim)];
    if (rule == Rule::Softmax) {
      a[std::size_t(j)] = dot(q, key) / std::sqrt(double(kDim));
    } else {
      const double x = std::log(double(kDim)) * std::log(double(n)) * dot(q, key) /
                       std::sqrt(dot(q, q) * dot(key, key));
      a[std::size_t(j)] = std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x)));  // softplus
    }
  }
  if (rule == Rule::Softmax) {
    const double top = *std::max_element(a.begin(), a.end());
    for (double& x : a) x = std::exp(x - top);
  }
  double sum = 0;
  for (double x : a) sum += x;
  for (double& x : a) x /= sum;
  if (rule != Rule::Lssar) return a;
  // r = ReLU(N a - 1)^15 in the log domain, as the library does it (r^15 reaches 1e63 at
  // N = 16K, past f32): 15 log r, then a softmax over it.
  std::vector<double> log_r(a.size());
  double top = -INFINITY;
  for (std::size_t j = 0; j < a.size(); ++j) {
    const double r = double(n) * a[j] - 1.0;
    log_r[j] = r > 0 ? 15.0 * std::log(r) : -INFINITY;
    top = std::max(top, log_r[j]);
  }
  if (top == -INFINITY) return a;  // every key at or below uniform: LSSA's weights
  sum = 0;
  for (double& x : log_r) sum += (x = std::exp(x - top));
  for (double& x : log_r) x /= sum;
  return log_r;
}

double entropy(const std::vector<double>& a) {
  double h = 0;
  for (double x : a)
    if (x > 0) h -= x * std::log(x);
  return h;
}

}  // namespace

int main() {
  // Queries and random keys N(0, 1), so softmax logits q.k / sqrt(d) are about N(0, 1); a
  // relevant key is its query plus N(0, 1) noise: softmax logit ~8, cosine ~0.7.
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> q(kQueries * kDim), k(kMaxLen * kDim), v(kMaxLen * kValues),
      o(kQueries * kValues);
  for (auto* buffer : {&q, &k})
    for (float& x : *buffer) x = normal(rng);
  for (Index i = 0; i < kQueries; ++i)
    for (Index t = 0; t < kRelevant; ++t)
      for (Index c = 0; c < kDim; ++c)
        k[std::size_t(relevant_key(i, t) * kDim + c)] = q[std::size_t(i * kDim + c)] + normal(rng);

  const auto Q = ak::bshd(q.data(), 1, kQueries, 1, kDim);
  const auto O = ak::bshd(o.data(), 1, kQueries, 1, kValues);
  // BSHD: the first n keys of the buffer are a view of n keys.
  const auto K = [&](Index n) { return ak::bshd(k.data(), 1, n, 1, kDim); };
  const auto V = [&](Index n) { return ak::bshd(v.data(), 1, n, 1, kValues); };

  const Rule rules[3] = {Rule::Softmax, Rule::Lssa, Rule::Lssar};
  const auto run = [&](Rule rule, Index n) {
    if (rule == Rule::Softmax) ak::attention(ak::make_spec(ak::Softmax{}), Q, K(n), V(n), O);
    if (rule == Rule::Lssa) ak::attention(ak::make_spec(ak::Lssa{}), Q, K(n), V(n), O);
    if (rule == Rule::Lssar) ak::attention(ak::make_spec(ak::Lssar{}), Q, K(n), V(n), O);
  };

  std::printf("mean over %ld queries, d = %ld, %ld relevant keys each; entropy in nats\n",
              long(kQueries), long(kDim), long(kRelevant));
  std::printf("%6s %6s | %8s %8s %8s | %s\n", "L", "log L", "softmax", "LSSA", "LSSAR",
              "mass on the relevant keys: softmax LSSA LSSAR");
  double worst = 0, first[3] = {}, last[3] = {};
  for (Index n = 1024; n <= kMaxLen; n *= 2) {
    // Values [1, j / n, relevant to query 0, ..., relevant to query 3].
    std::fill(v.begin(), v.end(), 0.f);
    for (Index j = 0; j < n; ++j) {
      v[std::size_t(j * kValues)] = 1.f;
      v[std::size_t(j * kValues + 1)] = float(j) / float(n);
    }
    for (Index i = 0; i < kQueries; ++i)
      for (Index t = 0; t < kRelevant; ++t)
        v[std::size_t(relevant_key(i, t) * kValues + 2 + i)] = 1.f;

    double h[3] = {}, mass[3] = {};
    for (int r = 0; r < 3; ++r) {
      run(rules[r], n);
      for (Index i = 0; i < kQueries; ++i) {
        const std::vector<double> a = weights(rules[r], &q[std::size_t(i * kDim)], k, n);
        h[r] += entropy(a) / kQueries;
        mass[r] += O.row(0, 0, i)[2 + i] / kQueries;  // the library's output
        for (Index c = 0; c < kValues; ++c) {
          double want = 0;
          for (Index j = 0; j < n; ++j) want += a[std::size_t(j)] * v[std::size_t(j * kValues + c)];
          worst = std::max(worst, std::abs(O.row(0, 0, i)[c] - want));
        }
      }
      if (n == 1024) first[r] = h[r];
      last[r] = h[r];
    }
    std::printf("%6ld %6.2f | %8.2f %8.2f %8.2f | %7.3f %6.3f %6.3f\n", long(n),
                std::log(double(n)), h[0], h[1], h[2], mass[0], mass[1], mass[2]);
  }

  const double tolerance = 1e-4;
  std::printf("entropy growth 1K -> 16K: softmax %+.2f, LSSA %+.2f, LSSAR %+.2f (log 16 = %.2f)\n",
              last[0] - first[0], last[1] - first[1], last[2] - first[2], std::log(16.0));
  std::printf("max |attention() - weights . v| = %.2g (tolerance %.0e)\n", worst, tolerance);
  // The trend, robust over seeds: softmax grows by ~3 nats (2.8 to 4.6), LSSAR by < 0.05.
  const bool trend = last[0] - first[0] > 1.0 && std::abs(last[2] - first[2]) < 0.25;
  const bool pass = trend && worst <= tolerance;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
