// FopeTable: the frequencies, Fourier coefficients and cos'/sin' tables of a FoPE (Hua et al.
// 2024; docs/mechanisms.md "FoPE"), shared by the Fope policy (position/fope.hpp). RoPE's
// frequencies omega_m = base^(-2m/d) over the d/2 NeoX pairs (m, m + d/2); those below
// 2 pi / train_len are clipped to zero frequency. Pair p of KV head h at position t:
//   cos'[h,t,p] = sum_f C[h,f,p] cos(omega_f t),  sin'[h,t,p] = sum_f S[h,f,p] sin(omega_f t);
// clipped pairs (p >= F, the F kept frequencies come first) get the padding instead.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"

namespace attnkit {

enum class FopePadding { Identity, ReferenceCode };

/// The shape of a FoPE: sizes, frequencies and heads. train_len = 0 clips nothing.
struct FopeConfig {
  Index head_dim = 0;     // d: every dimension is embedded (no partial rotary)
  Index max_len = 0;      // positions the table covers: [0, max_len)
  Index train_len = 0;    // N_train: omega < 2 pi / N_train is clipped
  double base = 10000.0;  // RoPE's base
  Index kv_heads = 1;     // coefficient sets, one per KV head
  Index q_heads = 0;      // query heads of the calls (GQA); 0: kv_heads
  FopePadding padding = FopePadding::Identity;
};

/// The frequencies, the coefficients C, S [kv_heads, F, d/2] (double) and cos'/sin' at every
/// (KV head, position) [kv_heads, max_len, d/2] (f32, formed in double and rounded once).
class FopeTable {
 public:
  /// Throws Error on a bad config or coefficients not of size kv_heads * F * d/2 or not finite.
  FopeTable(FopeConfig c, std::vector<double> cos_coef, std::vector<double> sin_coef)
      : c_(c), cos_coef_(std::move(cos_coef)), sin_coef_(std::move(sin_coef)) {
    using detail::require;
    check(c_);
    if (c_.q_heads == 0) c_.q_heads = c_.kv_heads;
    omega_ = frequencies(c_.head_dim, c_.base, c_.train_len);
    kept_ = kept_frequencies(c_.head_dim, c_.base, c_.train_len);
    const Index pairs = c_.head_dim / 2, coefs = c_.kv_heads * kept_ * pairs;
    for (const auto* coef : {&cos_coef_, &sin_coef_}) {
      const char* name = coef == &cos_coef_ ? "Fope: C.size()" : "Fope: S.size()";
      require(static_cast<Index>(coef->size()) == coefs, name,
              detail::cat("kv_heads * F * d/2 = ", coefs, " (F = ", kept_, " kept frequencies)"),
              coef->size());
      for (const double x : *coef) require(std::isfinite(x), "Fope: a coefficient", "finite", x);
    }
    Index cells = 0;
    require(detail::checked_product({c_.kv_heads, c_.max_len, pairs}, &cells) &&
                cells <= (Index{1} << 32),
            "Fope: kv_heads * max_len * d/2", "<= 2^32 table entries", "more");
    cos_.resize(static_cast<std::size_t>(cells));
    sin_.resize(static_cast<std::size_t>(cells));
    std::vector<double> basis(2 * static_cast<std::size_t>(kept_)), row(2 * std::size_t(pairs));
    for (Index t = 0; t < c_.max_len; ++t) {
      fill_basis(double(t), basis.data());
      for (Index h = 0; h < c_.kv_heads; ++h) {
        series(h, basis.data(), row.data());
        float* cs = cos_.data() + (h * c_.max_len + t) * pairs;
        float* sn = sin_.data() + (h * c_.max_len + t) * pairs;
        for (Index p = 0; p < pairs; ++p) {
          cs[p] = float(row[std::size_t(p)]);
          sn[p] = float(row[std::size_t(pairs + p)]);
        }
      }
    }
  }

  /// omega_m = base^(-2m/d) for m < d/2; 0 where omega_m < 2 pi / train_len (clipped).
  static std::vector<double> frequencies(Index head_dim, double base, Index train_len) {
    const double floor = train_len > 0 ? 6.283185307179586 / double(train_len) : 0.0;
    std::vector<double> f(static_cast<std::size_t>(head_dim / 2));
    for (std::size_t m = 0; m < f.size(); ++m) {
      const double w = 1.0 / std::pow(base, 2.0 * double(m) / double(head_dim));
      f[m] = w < floor ? 0.0 : w;
    }
    return f;
  }
  /// F: how many frequencies are kept (they are the first F pairs: omega falls with m).
  static Index kept_frequencies(Index head_dim, double base, Index train_len) {
    Index n = 0;
    for (const double w : frequencies(head_dim, base, train_len)) n += w > 0.0;
    return n;
  }

  /// Throws Error unless d is even, base > 1, max_len >= 1, train_len >= 0, kv_heads >= 1
  /// and q_heads (0: kv_heads) is a multiple of kv_heads.
  static void check(const FopeConfig& c) {
    using detail::require;
    require(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= (Index{1} << 20),
            "FopeConfig.head_dim", "even, in [2, 2^20]", c.head_dim);
    require(std::isfinite(c.base) && c.base > 1.0, "FopeConfig.base", "finite and > 1", c.base);
    require(c.max_len >= 1 && c.max_len <= (Index{1} << 40), "FopeConfig.max_len", "in [1, 2^40]",
            c.max_len);
    require(c.train_len >= 0, "FopeConfig.train_len", ">= 0 (0: clip nothing)", c.train_len);
    require(c.kv_heads >= 1 && c.kv_heads <= (Index{1} << 20), "FopeConfig.kv_heads",
            "in [1, 2^20]", c.kv_heads);
    const Index q_heads = c.q_heads == 0 ? c.kv_heads : c.q_heads;
    require(q_heads >= 1 && q_heads % c.kv_heads == 0, "FopeConfig.q_heads",
            detail::cat("0 or a positive multiple of kv_heads = ", c.kv_heads), c.q_heads);
    Index coefs = 0;
    require(detail::checked_product({c.kv_heads, c.head_dim / 2, c.head_dim / 2}, &coefs) &&
                coefs <= (Index{1} << 32),
            "FopeConfig: kv_heads * (d/2)^2", "<= 2^32 coefficients", "more");
  }

  const FopeConfig& config() const { return c_; }
  Index pairs() const { return c_.head_dim / 2; }
  Index kept() const { return kept_; }
  const std::vector<double>& omega() const { return omega_; }
  /// C, S [kv_heads, F, d/2].
  const std::vector<double>& cos_coef() const { return cos_coef_; }
  const std::vector<double>& sin_coef() const { return sin_coef_; }
  /// cos' / sin' of KV head h at position t: d/2 floats each.
  const float* cos_at(Index h, Index t) const {
    return cos_.data() + (h * c_.max_len + t) * pairs();
  }
  const float* sin_at(Index h, Index t) const {
    return sin_.data() + (h * c_.max_len + t) * pairs();
  }

  /// basis[2F] = cos(omega_f t) for f < F, then sin(omega_f t).
  void fill_basis(double t, double* basis) const {
    for (Index f = 0; f < kept_; ++f) {
      basis[f] = std::cos(t * omega_[std::size_t(f)]);
      basis[kept_ + f] = std::sin(t * omega_[std::size_t(f)]);
    }
  }
  /// row[d] = cos'[h, t, :] then sin'[h, t, :] from basis (fill_basis at t), in double.
  void series(Index h, const double* basis, double* row) const {
    const Index pairs = this->pairs();
    const double pad_sin = c_.padding == FopePadding::ReferenceCode ? 1.0 : 0.0;
    for (Index p = 0; p < pairs; ++p) {
      row[p] = p < kept_ ? 0.0 : 1.0;
      row[pairs + p] = p < kept_ ? 0.0 : pad_sin;
    }
    for (Index f = 0; f < kept_; ++f) {
      const double* cf = cos_coef_.data() + (h * kept_ + f) * pairs;
      const double* sf = sin_coef_.data() + (h * kept_ + f) * pairs;
      for (Index p = 0; p < kept_; ++p) {  // columns p >= F (clipped pairs) are not read
        row[p] += cf[p] * basis[f];
        row[pairs + p] += sf[p] * basis[kept_ + f];
      }
    }
  }

 private:
  FopeConfig c_;
  std::vector<double> cos_coef_, sin_coef_;  // [kv_heads, F, d/2]
  std::vector<double> omega_;                // [d/2], 0 where clipped
  Index kept_ = 0;                           // F
  std::vector<float> cos_, sin_;             // [kv_heads, max_len, d/2]
};

}  // namespace attnkit
