// What this shows: how a TAPA logit (Wang et al. 2025; `Tapa{alpha, theta}`) depends on the
// distance between a query and a key, next to RoPE's. TAPA splits each head vector into an
// amplitude part (its first a = round(theta d) dims) and a phase part, and
//   logit(t) = (q_A . k_A / sqrt(a)) * cos(2 pi t^alpha q_P . k_P / sqrt(d - a)),  t = |i - j|:
// for a fixed pair of vectors the logit is one cosine whose phase grows like t^alpha
// (alpha = 0.1: it turns about as fast from t = 1 to 2 as from 1000 to 2000), under an
// envelope that never changes. RoPE's logit for the same pair is a sum of d / 2 terms each
// turning at its own frequency, so it wanders with t without a simple shape. TAPA's decay
// is in the mean: over random phase parts (q_P . k_P / sqrt(d - a) ~ N(0, 1)) the cosine
// averages to exp(-(2 pi t^alpha)^2 / 2), already ~3e-9 at t = 1.
//
// We read the library's logits without any [Lq, Lk] matrix: one query at position t
// (Options::q_offset = t) and one key at position 0, Softmax, LSE output: the LSE of a row
// with a single key is that key's logit. We print them next to the formulas computed here and
// check that they agree.
#include <algorithm>
#include <attnkit/kernel/attention.hpp>
#include <attnkit/normalizer/softmax.hpp>
#include <attnkit/position/rope.hpp>
#include <attnkit/position/rope_table.hpp>
#include <attnkit/position/tapa.hpp>
#include <attnkit/spec.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kDim = 64, kMaxDistance = 8192;
const double kTwoPi = 6.283185307179586;

// The logit of one query at position t against one key at position 0, from the LSE.
template <class Spec>
float library_logit(const Spec& spec, const std::vector<float>& q, const std::vector<float>& k,
                    Index t) {
  const float one = 1.f;
  float out = 0.f, lse = 0.f;
  ak::attention(spec, ak::bhsd(q.data(), 1, 1, 1, kDim), ak::bhsd(k.data(), 1, 1, 1, kDim),
                ak::bhsd(&one, 1, 1, 1, 1), ak::bhsd(&out, 1, 1, 1, 1),
                ak::Options{}.with_q_offset(t).with_lse(&lse, 1));
  return lse;
}

// The RoPE logit (NeoX pairing, base 10000) in double: q turned by t theta_m, k by 0.
double rope_formula(const std::vector<float>& q, const std::vector<float>& k, Index t) {
  const Index half = kDim / 2;
  double dot = 0.0;
  for (Index m = 0; m < half; ++m) {
    const double angle = double(t) / std::pow(10000.0, 2.0 * double(m) / double(kDim));
    const double a = q[size_t(m)], b = q[size_t(m + half)];
    dot += (a * std::cos(angle) - b * std::sin(angle)) * k[size_t(m)] +
           (b * std::cos(angle) + a * std::sin(angle)) * k[size_t(m + half)];
  }
  return dot / std::sqrt(double(kDim));
}

}  // namespace

int main() {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  std::vector<float> q(kDim), k(kDim);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);

  const ak::Tapa tapa;  // alpha = 0.1, theta = 0.5
  const Index a = tapa.amplitude_dims(kDim), phase = kDim - a;
  double amplitude = 0.0, phase_dot = 0.0, phase_abs = 0.0, rope_abs = 0.0;
  for (Index c = 0; c < kDim; ++c) {
    const double term = double(q[size_t(c)]) * k[size_t(c)];
    (c < a ? amplitude : phase_dot) += term;
    if (c >= a) phase_abs += std::abs(term);
    rope_abs += std::abs(term);
  }
  amplitude /= std::sqrt(double(a));
  const auto tapa_formula = [&](Index t) {
    return amplitude * std::cos(kTwoPi * std::pow(double(t), double(tapa.alpha)) * phase_dot /
                                std::sqrt(double(phase)));
  };
  const auto tapa_spec = ak::make_spec(tapa, ak::Softmax{});
  const auto rope_spec =
      ak::make_spec(ak::Rope(ak::RopeTable(kDim, 10000.0, kMaxDistance + 1)), ak::Softmax{});

  std::printf("one fixed q, k (d = %ld); TAPA alpha = %.1f, theta = %.1f: envelope %.3f\n",
              long(kDim), double(tapa.alpha), double(tapa.theta), amplitude);
  std::printf("%6s %8s %12s %12s %12s %12s\n", "t", "t^alpha", "TAPA", "formula", "RoPE",
              "formula");
  // Allowed error: f32 rounding of the cosine's argument, whose size is bounded by
  // 2 pi t^alpha sum_c |q_c k_c| / sqrt(d - a) (the phase dot's largest partial sum), times
  // the envelope, 8 ulp of it; RoPE: 8 ulp of sum_c |q_c k_c| / sqrt(d) (the f32 table).
  const double eps = std::numeric_limits<float>::epsilon();
  double worst = 0.0;  // error / allowed
  bool oscillates = false, bounded = true;
  for (Index t = 0; t <= kMaxDistance; t = t == 0 ? 1 : 2 * t) {
    const double t_alpha = std::pow(double(t), double(tapa.alpha));
    const float tapa_logit = library_logit(tapa_spec, q, k, t);
    const float rope_logit = library_logit(rope_spec, q, k, t);
    const double tapa_want = tapa_formula(t), rope_want = rope_formula(q, k, t);
    std::printf("%6ld %8.3f %12.5f %12.5f %12.5f %12.5f\n", long(t), t_alpha, tapa_logit, tapa_want,
                rope_logit, rope_want);
    const double argument = kTwoPi * t_alpha * phase_abs / std::sqrt(double(phase));
    const double tapa_allowed = 1e-6 + 8 * eps * std::abs(amplitude) * (1.0 + argument);
    const double rope_allowed = 1e-6 + 8 * eps * rope_abs / std::sqrt(double(kDim));
    worst = std::max({worst, std::abs(tapa_logit - tapa_want) / tapa_allowed,
                      std::abs(rope_logit - rope_want) / rope_allowed});
    oscillates = oscillates || tapa_want * tapa_formula(0) < 0;  // the cosine changed sign
    bounded = bounded && std::abs(tapa_logit) <= std::abs(amplitude) * (1 + 1e-5);
  }
  std::printf(
      "largest error / allowed: %.3f; TAPA changes sign: %s; stays under its "
      "envelope: %s\n",
      worst, oscillates ? "yes" : "no", bounded ? "yes" : "no");

  const bool pass = worst <= 1.0 && oscillates && bounded;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
