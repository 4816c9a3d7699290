// What this shows: rotary position embedding (RoPE, Su et al. 2021). Pair m of the head
// dimensions of a query at position i turns by the angle i theta_m, a key at j by j theta_m,
// theta_m = base^(-2m / d); a dot product of two turned vectors then sees only the angle
// (i - j) theta_m: q_i . k_j depends on the distance i - j, not on where the pair sits. We
// print q_i . k_(i - delta) for one fixed q and k at several absolute positions i.
//
// Models trained on L positions stretch the frequencies to run longer: Linear divides every
// theta_m by s; NTK raises the base; YaRN keeps the fast pairs, divides the slow ones by s
// and ramps in between (and scales the logits); Llama-3 does the same by wavelength. We
// print the wavelength 2 pi / theta_m of a few pairs for a 4K-trained model run 8x longer.
//
// Finally Rope goes into the spec like any policy: attention() turns q and k as it packs
// them, which must equal apply_position() on q and k followed by plain attention().
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kDim = 64;

std::vector<float> random_vector(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

// x turned to position `at` (one row; queries and keys turn alike), dotted in double.
double turned_dot(const ak::Rope& rope, std::vector<float> q, Index i, std::vector<float> k,
                  Index j) {
  ak::apply_position(rope, ak::bhsd(q.data(), 1, 1, 1, kDim), ak::Role::Query, i);
  ak::apply_position(rope, ak::bhsd(k.data(), 1, 1, 1, kDim), ak::Role::Key, j);
  double s = 0;
  for (Index c = 0; c < kDim; ++c) s += double(q[std::size_t(c)]) * k[std::size_t(c)];
  return s;
}

}  // namespace

int main() {
  std::mt19937 rng(10);
  const ak::Rope rope(ak::RopeTable(kDim, 10000, 8192));  // NeoX pairing (Llama, HF)

  // 1. The relative-position property.
  const std::vector<float> q = random_vector(rng, kDim), k = random_vector(rng, kDim);
  const Index deltas[] = {0, 1, 16, 256}, starts[] = {256, 1000, 5000, 8191};
  std::printf("q_i . k_(i - delta) for one q and one k, head_dim %ld\n", long(kDim));
  std::printf("%6s %10s %10s %10s %10s\n", "delta", "i=256", "i=1000", "i=5000", "i=8191");
  double spread = 0;  // the largest change of a row across absolute positions
  std::vector<double> firsts;
  for (const Index delta : deltas) {
    std::printf("%6ld", long(delta));
    const double first = turned_dot(rope, q, starts[0], k, starts[0] - delta);
    firsts.push_back(first);
    for (const Index i : starts) {
      const double s = turned_dot(rope, q, i, k, i - delta);
      spread = std::max(spread, std::abs(s - first));
      std::printf(" %10.5f", s);
    }
    std::printf("\n");
  }
  // Two f32 roundings per element of 64-dim N(0, 1) rows: ~1e-5; 1e-4 leaves room.
  const double tolerance = 1e-4;
  std::printf("largest change along a row: %.2g (tolerance %.0e)\n\n", spread, tolerance);
  const bool turned = std::abs(firsts[0] - firsts[2]) > 100 * tolerance;  // distance matters

  // 2. What each scaling does to the frequencies: a 4K-trained model (base 10^4, head_dim
  // 128) extended 8x, to 32K.
  using S = ak::RopeScaling;
  const S scalings[] = {S{}, S::linear(8), S::ntk(8), S::yarn(8, 4096), S::llama3(8, 4096)};
  std::vector<ak::RopeTable> tables;
  for (const S& s : scalings) tables.emplace_back(128, 10000, 1, s);
  std::printf("wavelength 2 pi / theta_m (positions per turn), trained on 4096, s = 8\n");
  std::printf("%4s %11s %11s %11s %11s %11s\n", "m", "default", "linear", "NTK", "YaRN", "Llama-3");
  for (const Index m : {0, 8, 16, 24, 32, 40, 48, 56, 63}) {
    std::printf("%4ld", long(m));
    for (const ak::RopeTable& t : tables)
      std::printf(" %11.1f", 2 * 3.14159265358979 / t.inv_freq()[std::size_t(m)]);
    std::printf("\n");
  }
  std::printf("YaRN scales cos and sin by %.4f (logits by its square)\n\n",
              tables[3].attention_factor());

  // 3. Fused equals standalone: GQA (4 query heads over 2 KV heads), causal, YaRN.
  const Index L = 300, Hq = 4, Hkv = 2;
  const ak::Rope yarn(ak::RopeTable(kDim, 10000, 8192, S::yarn(8, 1024)));
  std::vector<float> qs = random_vector(rng, L * Hq * kDim),
                     ks = random_vector(rng, L * Hkv * kDim),
                     vs = random_vector(rng, L * Hkv * kDim), fused(qs.size()), plain(qs.size());
  const auto Q = ak::bshd(qs.data(), 1, L, Hq, kDim), K = ak::bshd(ks.data(), 1, L, Hkv, kDim);
  const auto V = ak::bshd(vs.data(), 1, L, Hkv, kDim);
  ak::attention(ak::make_spec(ak::Causal{}, yarn), Q, K, V, ak::bshd(fused.data(), 1, L, Hq, kDim));
  ak::apply_position(yarn, Q, ak::Role::Query);  // in place, as a model does before caching
  ak::apply_position(yarn, K, ak::Role::Key);
  ak::attention(ak::make_spec(ak::Causal{}), Q, K, V, ak::bshd(plain.data(), 1, L, Hq, kDim));
  double fused_err = 0;
  for (std::size_t x = 0; x < fused.size(); ++x)
    fused_err = std::max(fused_err, double(std::abs(fused[x] - plain[x])));
  const double f32_tolerance = 2e-5;
  std::printf("max |fused - apply_position then attention|: %.2g (tolerance %.0e)\n", fused_err,
              f32_tolerance);

  const bool pass = turned && spread <= tolerance && fused_err <= f32_tolerance;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
