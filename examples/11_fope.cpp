// What this shows: FoPE (Fourier position embedding, Hua et al. 2024) next to RoPE. RoPE turns
// pair m of q and k by omega_m t; a pair whose wavelength 2 pi / omega_m exceeds the training
// length never completes a turn in training, so at longer contexts it reaches angles the model
// never saw. FoPE clips those frequencies to zero (the pair passes through: it carries no
// position, and its q.k term is the same at every distance), and turns each kept pair by a
// Fourier series over all kept frequencies, cos' = sum_f C_f cos(omega_f t) (sin' alike), with
// C, S = identity + N(0, sigma^2): the spectrum of every dimension is spread over the others.
//
// We print each pair's frequency and whether it is clipped, then q'.k' as a function of the
// distance i - j for RoPE, FoPE with clipping only (sigma = 0) and FoPE (sigma = 0.3), over
// many absolute positions i: RoPE and clipping-only stay functions of i - j alone (zero
// spread); the Fourier coefficients make q'.k' depend on i and j (the spread), which is what
// the paper trades for robustness. Then check the fused kernel against the f64 reference.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kDim = 64, kMaxLen = 4096, kTrainLen = 512;

// q'.k' for q at position i and k at position j, both turned by `position` (one head).
template <class Position>
double turned_dot(const Position& position, std::vector<float> q, std::vector<float> k, Index i,
                  Index j) {
  position.apply(q.data(), kDim, ak::RowAt{0, 0, 0, 1, i, ak::Role::Query});
  position.apply(k.data(), kDim, ak::RowAt{0, 0, 0, 1, j, ak::Role::Key});
  double dot = 0;
  for (Index c = 0; c < kDim; ++c) dot += double(q[std::size_t(c)]) * k[std::size_t(c)];
  return dot;
}

// Over query positions i = d, d + 97, ... < kMaxLen: the mean and the spread (max - min) of
// q'.k' at distance d.
template <class Position>
void dot_at_distance(const Position& position, const std::vector<float>& q,
                     const std::vector<float>& k, Index d, double* mean, double* spread) {
  double lo = HUGE_VAL, hi = -HUGE_VAL, sum = 0;
  int n = 0;
  for (Index i = d; i < kMaxLen; i += 97, ++n) {
    const double s = turned_dot(position, q, k, i, i - d);
    lo = std::min(lo, s), hi = std::max(hi, s), sum += s;
  }
  *mean = sum / n;
  *spread = hi - lo;
}

}  // namespace

int main() {
  ak::FopeConfig config{kDim, kMaxLen, kTrainLen};  // base 10^4, one head
  const ak::Rope rope(ak::RopeTable(kDim, config.base, kMaxLen));
  const ak::Fope clip_only = ak::Fope::drawn(config, 0.0);
  const ak::Fope fope = ak::Fope::drawn(config, 0.3, 2024);

  const std::vector<double>& omega = clip_only.table->omega();
  const double floor = 2 * M_PI / double(kTrainLen);
  std::printf("d = %ld, base 1e4, N_train = %ld: floor frequency 2 pi / N_train = %.4f\n",
              long(kDim), long(kTrainLen), floor);
  std::printf("%5s %12s %12s  %s\n", "pair", "omega", "wavelength", "FoPE");
  for (Index m = 0; m < kDim / 2; m += 3) {
    const double w = std::pow(config.base, -2.0 * double(m) / double(kDim));
    std::printf("%5ld %12.5f %12.1f  %s\n", long(m), w, 2 * M_PI / w,
                omega[std::size_t(m)] > 0 ? "kept" : "clipped: passes through");
  }
  const Index kept = fope.table->kept();
  std::printf("kept %ld of %ld pairs\n\n", long(kept), long(kDim / 2));

  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> q(kDim), k(kDim);
  for (float& x : q) x = normal(rng);
  for (std::size_t c = 0; c < k.size(); ++c) k[c] = q[c] + 0.5f * normal(rng);  // correlated

  std::printf("q'.k' over absolute positions at each distance: mean (spread)\n");
  std::printf("%9s %20s %20s %20s\n", "distance", "RoPE", "FoPE sigma=0", "FoPE sigma=0.3");
  double worst_rope = 0, worst_clip = 0, least_fope = HUGE_VAL;
  for (const Index d : {0, 16, 128, 512, 2048, 3000}) {
    double m[3], s[3];
    dot_at_distance(rope, q, k, d, &m[0], &s[0]);
    dot_at_distance(clip_only, q, k, d, &m[1], &s[1]);
    dot_at_distance(fope, q, k, d, &m[2], &s[2]);
    std::printf("%9ld %11.2f (%6.3f) %11.2f (%6.3f) %11.2f (%6.3f)\n", long(d), m[0], s[0], m[1],
                s[1], m[2], s[2]);
    worst_rope = std::max(worst_rope, s[0]);
    worst_clip = std::max(worst_clip, s[1]);
    least_fope = std::min(least_fope, s[2]);
  }
  // The clipped pairs carry no position: FoPE leaves them as they are at every position, so
  // their share of q.k is the same at every distance.
  std::vector<float> turned = q;
  fope.apply(turned.data(), kDim, ak::RowAt{0, 0, 0, 1, 3000, ak::Role::Query});
  bool clipped_unchanged = true;
  double clipped_share = 0;
  for (Index p = kept; p < kDim / 2; ++p)
    for (const Index c : {p, p + kDim / 2}) {
      clipped_unchanged = clipped_unchanged && turned[std::size_t(c)] == q[std::size_t(c)];
      clipped_share += double(q[std::size_t(c)]) * k[std::size_t(c)];
    }
  std::printf("clipped pairs unchanged at position 3000: %s; their share of q.k: %.2f\n\n",
              clipped_unchanged ? "yes" : "no", clipped_share);

  // The fused kernel against the f64 reference: 2 heads, causal, positions 0 .. 1023.
  const Index heads = 2, len = 1024;
  config.kv_heads = heads;
  const auto spec = ak::make_spec(ak::Causal{}, ak::Fope::drawn(config, 0.3, 7));
  std::vector<float> qs(len * heads * kDim), ks(qs.size()), vs(qs.size()), os(qs.size());
  std::vector<double> want(qs.size());
  for (auto* buffer : {&qs, &ks, &vs})
    for (float& x : *buffer) x = normal(rng);
  const auto view = [&](std::vector<float>& b) { return ak::bshd(b.data(), 1, len, heads, kDim); };
  ak::attention(spec, view(qs), view(ks), view(vs), view(os));
  ak::reference::attention(spec, view(qs), view(ks), view(vs),
                           ak::bshd(want.data(), 1, len, heads, kDim));
  double err = 0;
  for (std::size_t i = 0; i < os.size(); ++i) err = std::max(err, std::abs(os[i] - want[i]));
  std::printf("attention() vs the f64 reference: max |o - ref| = %.2g (tolerance 2e-5)\n", err);

  // RoPE and clipping alone depend on i - j only (f32 rounding: < 1e-3 of |q||k| ~ 64); the
  // Fourier coefficients do not (a spread of order |q||k| at every distance).
  const bool pass = kept > 0 && kept < kDim / 2 && worst_rope < 1e-3 * kDim &&
                    worst_clip < 1e-3 * kDim && least_fope > 1 && err <= 2e-5 && clipped_unchanged;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
