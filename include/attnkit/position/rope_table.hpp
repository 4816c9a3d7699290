// RopeTable: the frequencies of rotary position embedding and their cos / sin at every
// position up to max_len (docs/mechanisms.md "RoPE"; formulas as in Hugging Face transformers'
// modeling_rope_utils.py). Pair m of the rotary_dim rotated dimensions turns by the angle
// position * inv_freq[m], inv_freq[m] = base^(-2m / rotary_dim), changed by the scaling
// (transformers' rope_type):
//   Linear{s}:  inv_freq / s (position interpolation);
//   Ntk{s}:     base * s^(r / (r - 2)) ("NTK-aware");
//   Yarn{s, original_max_len, beta_fast = 32, beta_slow = 1, attention_factor, truncate}: per
//               pair, a linear ramp between the interpolated (inv_freq / s) and the original
//               frequency, over the pairs that turn between beta_slow and beta_fast times in
//               the original context (its ends floor / ceil'd unless truncate is false, as in
//               gpt-oss); cos and sin are multiplied by the attention factor (default
//               0.1 ln s + 1), so logits scale by its square, as in transformers;
//   Llama3{s, original_max_len = 8192, low_freq_factor = 1, high_freq_factor = 4}: wavelengths
//               above original / low are divided by s, below original / high kept, smoothly
//               in between;
//   Proportional{partial_rotary_factor p, s = 1} (Gemma 4's global layers): rotary_dim is the
//               whole head_dim; the first k = floor(p rotary_dim / 2) pairs keep
//               base^(-2m / rotary_dim) / s, the others get 0 (they do not turn). Unlike a
//               partial rotary table of 2k dimensions, the exponent's denominator is the head
//               and NeoX pairs m with m + head_dim / 2.
// Angles are formed in double and rounded once, so cos / sin stay accurate at long positions.
// The table keeps the turned pairs only: max_len * 2 * turned_pairs() floats (32K positions at
// r = 128: 16 MiB; Gemma 4's global layers at 128K positions, 64 of 256 pairs: 64 MiB).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"

namespace attnkit {

/// How the frequencies are formed from the base and stretched for contexts beyond the training
/// length: transformers' rope_type ("default", "linear", "dynamic" at a fixed factor, "yarn",
/// "llama3", "proportional").
struct RopeScaling {
  enum class Kind { None, Linear, Ntk, Yarn, Llama3, Proportional };
  Kind kind = Kind::None;
  double factor = 1.0;                                   // s
  double original_max_len = 0.0;                         // the training context (YaRN, Llama-3)
  double beta_fast = 32.0, beta_slow = 1.0;              // YaRN
  double attention_factor = 0.0;                         // YaRN; 0: 0.1 ln s + 1
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // Llama-3
  bool truncate = true;                                  // YaRN: floor / ceil the ends of the ramp
  double partial_rotary_factor = 1.0;  // proportional: the share of the pairs that turn

  static RopeScaling linear(double s) { return {Kind::Linear, s}; }
  static RopeScaling ntk(double s) { return {Kind::Ntk, s}; }
  /// truncate = false: the ramp's ends c(beta_fast), c(beta_slow) as they are (gpt-oss).
  static RopeScaling yarn(double s, double original, double fast = 32.0, double slow = 1.0,
                          double attention = 0.0, bool truncate = true) {
    RopeScaling r{Kind::Yarn, s, original, fast, slow, attention};
    r.truncate = truncate;
    return r;
  }
  static RopeScaling llama3(double s, double original = 8192.0, double low = 1.0,
                            double high = 4.0) {
    RopeScaling r{Kind::Llama3, s, original};
    r.low_freq_factor = low;
    r.high_freq_factor = high;
    return r;
  }
  /// For a table over the whole head: RopeTable(head_dim, rope_theta, max_len,
  /// RopeScaling::proportional(partial_rotary_factor)); s is transformers' optional "factor".
  static RopeScaling proportional(double partial_rotary_factor, double s = 1.0) {
    RopeScaling r{Kind::Proportional, s};
    r.partial_rotary_factor = partial_rotary_factor;
    return r;
  }
};

class RopeTable {
 public:
  /// Throws Error unless rotary_dim is even and > 0, base > 1, max_len >= 1 and the
  /// scaling's parameters are in range.
  RopeTable(Index rotary_dim, double base, Index max_len, RopeScaling scaling = {})
      : rotary_dim_(rotary_dim), max_len_(max_len), scaling_(scaling) {
    using detail::require;
    require(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= (Index{1} << 20),
            "RopeTable.rotary_dim", "even, in [2, 2^20]", rotary_dim);
    require(std::isfinite(base) && base > 1.0, "RopeTable.base", "finite and > 1", base);
    require(max_len >= 1 && max_len <= (Index{1} << 40), "RopeTable.max_len", "in [1, 2^40]",
            max_len);
    check(rotary_dim, scaling);
    inv_freq_ = frequencies(rotary_dim, base, scaling);
    attention_factor_ = attention_factor_of(scaling);
    turned_ = turned_pairs_of(rotary_dim, scaling);
    Index cells = 0;
    require(detail::checked_product({max_len, turned_}, &cells) && cells <= (Index{1} << 32),
            "RopeTable.max_len * turned_pairs()", "<= 2^32 table entries", "more");
    cos_.resize(static_cast<std::size_t>(cells));
    sin_.resize(static_cast<std::size_t>(cells));
    for (Index t = 0; t < max_len; ++t)
      for (Index m = 0; m < turned_; ++m) {
        const double angle = double(t) * inv_freq_[static_cast<std::size_t>(m)];
        cos_[static_cast<std::size_t>(t * turned_ + m)] =
            float(attention_factor_ * std::cos(angle));
        sin_[static_cast<std::size_t>(t * turned_ + m)] =
            float(attention_factor_ * std::sin(angle));
      }
  }

  Index rotary_dim() const { return rotary_dim_; }
  Index pairs() const { return rotary_dim_ / 2; }
  /// The pairs that turn: pairs() but for proportional RoPE, whose pairs from this one on
  /// have frequency 0 and pass through.
  Index turned_pairs() const { return turned_; }
  Index max_len() const { return max_len_; }
  const RopeScaling& scaling() const { return scaling_; }
  /// inv_freq[m], m < rotary_dim / 2, in double (0 for the pairs past turned_pairs()).
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  /// The factor cos and sin carry (YaRN's attention factor; 1 otherwise).
  double attention_factor() const { return attention_factor_; }
  /// attention_factor * cos / sin of position t for each turned pair: turned_pairs() floats.
  const float* cos_at(Index t) const { return cos_.data() + t * turned_; }
  const float* sin_at(Index t) const { return sin_.data() + t * turned_; }

  /// The frequencies of `scaling`, in double (the table and the reference use these).
  static std::vector<double> frequencies(Index rotary_dim, double base, const RopeScaling& sc) {
    using Kind = RopeScaling::Kind;
    const double r = double(rotary_dim);
    const Index pairs = rotary_dim / 2;
    if (sc.kind == Kind::Ntk && rotary_dim > 2) base *= std::pow(sc.factor, r / (r - 2.0));
    std::vector<double> f(static_cast<std::size_t>(pairs));
    for (Index m = 0; m < pairs; ++m)
      f[static_cast<std::size_t>(m)] = 1.0 / std::pow(base, 2.0 * double(m) / r);
    constexpr double kTwoPi = 6.283185307179586;
    if (sc.kind == Kind::Linear) {
      for (double& x : f) x /= sc.factor;
    } else if (sc.kind == Kind::Yarn) {
      // The pair index at which a frequency turns `turns` times over the original context.
      const auto correction = [&](double turns) {
        return r * std::log(sc.original_max_len / (turns * kTwoPi)) / (2.0 * std::log(base));
      };
      double low = correction(sc.beta_fast), high = correction(sc.beta_slow);
      if (sc.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, r - 1.0);
      if (high == low) high += 0.001;  // as transformers: avoid a zero-width ramp
      for (Index m = 0; m < pairs; ++m) {
        const double ramp = std::clamp((double(m) - low) / (high - low), 0.0, 1.0);
        const double keep = 1.0 - ramp;  // weight of the original (extrapolated) frequency
        double& x = f[static_cast<std::size_t>(m)];
        x = x / sc.factor * (1.0 - keep) + x * keep;
      }
    } else if (sc.kind == Kind::Llama3) {
      const double low_wavelen = sc.original_max_len / sc.low_freq_factor;
      const double high_wavelen = sc.original_max_len / sc.high_freq_factor;
      for (double& x : f) {
        const double wavelen = kTwoPi / x;
        if (wavelen > low_wavelen) {
          x /= sc.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (sc.original_max_len / wavelen - sc.low_freq_factor) /
                                (sc.high_freq_factor - sc.low_freq_factor);
          x = (1.0 - smooth) * x / sc.factor + smooth * x;
        }
      }
    } else if (sc.kind == Kind::Proportional) {
      const auto turned = static_cast<std::size_t>(turned_pairs_of(rotary_dim, sc));
      for (std::size_t m = 0; m < f.size(); ++m) f[m] = m < turned ? f[m] / sc.factor : 0.0;
    }
    return f;
  }

  /// The pairs with a nonzero frequency: floor(partial_rotary_factor * rotary_dim / 2) for
  /// proportional RoPE (transformers' int(p * head_dim // 2)), rotary_dim / 2 otherwise.
  static Index turned_pairs_of(Index rotary_dim, const RopeScaling& sc) {
    if (sc.kind != RopeScaling::Kind::Proportional) return rotary_dim / 2;
    return static_cast<Index>(std::floor(sc.partial_rotary_factor * double(rotary_dim) / 2.0));
  }

  static double attention_factor_of(const RopeScaling& sc) {
    if (sc.kind != RopeScaling::Kind::Yarn) return 1.0;
    if (sc.attention_factor > 0.0) return sc.attention_factor;
    return sc.factor > 1.0 ? 0.1 * std::log(sc.factor) + 1.0 : 1.0;
  }

 private:
  static void check(Index rotary_dim, const RopeScaling& sc) {
    using Kind = RopeScaling::Kind;
    using detail::require;
    if (sc.kind == Kind::None) return;
    require(std::isfinite(sc.factor) && sc.factor > 0.0, "RopeScaling.factor", "finite and > 0",
            sc.factor);
    if (sc.kind == Kind::Yarn || sc.kind == Kind::Llama3)
      require(std::isfinite(sc.original_max_len) && sc.original_max_len >= 1.0,
              "RopeScaling.original_max_len", "finite and >= 1", sc.original_max_len);
    if (sc.kind == Kind::Yarn) {
      require(std::isfinite(sc.beta_fast) && std::isfinite(sc.beta_slow) && sc.beta_slow > 0.0 &&
                  sc.beta_fast > sc.beta_slow,
              "RopeScaling.beta_fast", "finite and > beta_slow > 0", sc.beta_fast);
      require(std::isfinite(sc.attention_factor) && sc.attention_factor >= 0.0,
              "RopeScaling.attention_factor", "finite and >= 0 (0: 0.1 ln s + 1)",
              sc.attention_factor);
    }
    if (sc.kind == Kind::Llama3)
      require(std::isfinite(sc.low_freq_factor) && std::isfinite(sc.high_freq_factor) &&
                  sc.low_freq_factor > 0.0 && sc.high_freq_factor > sc.low_freq_factor,
              "RopeScaling.high_freq_factor", "finite and > low_freq_factor > 0",
              sc.high_freq_factor);
    if (sc.kind == Kind::Proportional) {
      const double p = sc.partial_rotary_factor;
      require(std::isfinite(p) && p > 0.0 && p <= 1.0, "RopeScaling.partial_rotary_factor",
              "in (0, 1] (0: NoPosition)", p);
      require(turned_pairs_of(rotary_dim, sc) >= 1, "RopeScaling.partial_rotary_factor",
              detail::cat("floor(p * rotary_dim / 2) >= 1 at rotary_dim = ", rotary_dim,
                          " (else no pair would turn)"),
              p);
    }
  }

  Index rotary_dim_, max_len_, turned_ = 0;
  RopeScaling scaling_;
  std::vector<double> inv_freq_;
  double attention_factor_ = 1.0;
  std::vector<float> cos_, sin_;  // [max_len, turned_pairs()]
};

}  // namespace attnkit
