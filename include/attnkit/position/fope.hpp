// Fope: Fourier position embedding (Hua et al. 2024; docs/mechanisms.md "FoPE") as a Position
// policy. RoPE's frequencies omega_m = base^(-2m/d) over the d/2 NeoX pairs (m, m + d/2);
// those below 2 pi / train_len are clipped to zero frequency. Pair p of head h at position t
// is turned by cos'/sin' = Fourier series over the kept frequencies f:
//   cos'[h,t,p] = sum_f C[h,f,p] cos(omega_f t),  sin'[h,t,p] = sum_f S[h,f,p] sin(omega_f t),
//   x[p]' = x[p] cos' - x[p + d/2] sin',  x[p + d/2]' = x[p + d/2] cos' + x[p] sin'.
// Clipped pairs (p >= F, the F kept frequencies come first) get a padding instead:
//   FopePadding::Identity (default, the paper): cos' = 1, sin' = 0, the pair passes through;
//   FopePadding::ReferenceCode (the authors' code): cos' = sin' = 1.
// Coefficients are per KV head; query head h uses those of its KV head h / (q_heads/kv_heads).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/detail/checked.hpp"
#include "attnkit/error.hpp"
#include "attnkit/position/position_ids.hpp"
#include "attnkit/position/row_at.hpp"
#include "attnkit/slots.hpp"
#include "attnkit/tensor.hpp"

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

/// FoPE as a Position policy. Conventions, and where they differ from the authors' code:
///  - GQA: coefficients are per KV head (FopeConfig.kv_heads sets); query head h uses set
///    h / (q_heads / kv_heads), so q_i . k_j of a group sees one embedding. The calls must
///    have q_heads = FopeConfig.q_heads query heads and kv_heads KV heads.
///  - Clipped pairs: FopePadding::Identity (default, the paper: a zero frequency leaves the
///    pair unturned) or FopePadding::ReferenceCode (the code pads cos' and sin' with 1:
///    x[p]' = x[p] - x[p + d/2], x[p + d/2]' = x[p + d/2] + x[p]).
///  - Fourier outputs: every kept pair gets its series over all F kept frequencies, on an
///    identity base C = S = I [F, d/2]; the code keeps only min(F, d/4) output pairs on a
///    "step eye" base and pads the rest.
///  - drawn(): C, S = I + N(0, sigma^2) per entry, the paper's sigma (0.3 at 60M). The code
///    draws xavier-normal with gain sigma, an effective spread sigma sqrt(2 / (fan_in +
///    fan_out)); to match it pass that value as sigma. Trained coefficients
///    (with_coefficients) make this moot.
///  - Positions: absolute (query row r at r + q_offset, key j at j) or ids per batch, in
///    (-max_len, max_len), as Rope (position/position_ids.hpp): cos' is even in t, sin' odd.
/// The table is shared, so copying a Fope (or a spec) copies no table.
struct Fope : PositionIds<Fope> {
  using slot = PositionSlot;

  std::shared_ptr<const FopeTable> table;

  explicit Fope(std::shared_ptr<const FopeTable> t) : table(std::move(t)) {
    detail::require(table != nullptr, "Fope.table", "a table", "nullptr");
  }

  /// C, S = identity + N(0, sigma^2) per entry, as the paper initializes them. Throws Error
  /// when sigma is negative or not finite, or on a bad config.
  static Fope drawn(const FopeConfig& c, double sigma = 0.3, std::uint64_t seed = 0) {
    detail::require(std::isfinite(sigma) && sigma >= 0.0, "Fope: sigma", "finite and >= 0", sigma);
    FopeTable::check(c);
    const Index pairs = c.head_dim / 2;
    const Index kept = FopeTable::kept_frequencies(c.head_dim, c.base, c.train_len);
    const auto n = static_cast<std::size_t>(c.kv_heads * kept * pairs);
    std::vector<double> cos_coef(n), sin_coef(n);
    std::mt19937_64 rng(seed);  // its output sequence is fixed by the standard
    for (auto* coef : {&cos_coef, &sin_coef})
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t f = (i / std::size_t(pairs)) % std::size_t(kept),
                          p = i % std::size_t(pairs);
        (*coef)[i] = (f == p ? 1.0 : 0.0) + sigma * standard_normal(rng);
      }
    return Fope(std::make_shared<const FopeTable>(c, std::move(cos_coef), std::move(sin_coef)));
  }

  /// User-given (trained) coefficients C, S [kv_heads, F, d/2], F = kept_frequencies(...).
  static Fope with_coefficients(const FopeConfig& c, std::vector<double> cos_coef,
                                std::vector<double> sin_coef) {
    return Fope(std::make_shared<const FopeTable>(c, std::move(cos_coef), std::move(sin_coef)));
  }

  /// The coefficient set of a row: its KV head.
  Index coefficient_head(const RowAt& at) const {
    const FopeConfig& c = table->config();
    return at.role == Role::Query ? at.head / (c.q_heads / c.kv_heads) : at.head;
  }

  /// Turns x[0, d) in place with the table's cos' / sin' of the row's head and position (a
  /// negative one: the table's row of -t, sin' negated). validate() and validate_kv_heads()
  /// keep the head within the coefficient sets.
  void apply(float* x, Index /*dim*/, const RowAt& at) const {
    const Index h = coefficient_head(at);
    const TableRow t = table_row(position_of(at));
    turn(x, table->pairs(), table->cos_at(h, t.at), table->sin_at(h, t.at), t.sign);
  }

  /// The same in double: the series recomputed from C, S and omega, without the table.
  void reference_apply(double* x, Index /*dim*/, const RowAt& at) const {
    const Index h = coefficient_head(at), pairs = table->pairs();
    std::vector<double> basis(2 * std::size_t(table->kept())), row(2 * std::size_t(pairs));
    table->fill_basis(double(position_of(at)), basis.data());
    table->series(h, basis.data(), row.data());
    turn(x, pairs, row.data(), row.data() + pairs, 1.0);
  }

  /// Throws Error when a position falls outside the table, ids do not cover the call, or the
  /// call's query heads are not config.q_heads. A KvCache appending keys passes its KV head
  /// count with q_len = 0: kv_heads is accepted then. (K's head count comes to
  /// validate_kv_heads().)
  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index q_heads) const {
    const FopeConfig& c = table->config();
    detail::require(q_heads == c.q_heads || (q_len == 0 && q_heads == c.kv_heads),
                    "Fope: the call's query heads",
                    detail::cat("FopeConfig.q_heads = ", c.q_heads, " (or kv_heads = ", c.kv_heads,
                                " for keys alone)"),
                    q_heads);
    check_positions("Fope", Role::Query, batch, q_len, q_offset, c.max_len);
    check_positions("Fope", Role::Key, batch, kv_len, 0, c.max_len);
  }

  /// Throws Error unless K has config.kv_heads heads: one coefficient set per KV head (fewer
  /// would turn a group's queries and keys with different sets, more would read past them).
  void validate_kv_heads(Index kv_heads) const {
    detail::require(kv_heads == table->config().kv_heads, "Fope: the call's KV heads",
                    detail::cat("FopeConfig.kv_heads = ", table->config().kv_heads), kv_heads);
  }

  /// The checks of validate() for the rows of one role alone (apply_position): `heads` query
  /// or KV heads, `len` rows per batch at positions offset .. offset + len - 1 or at the ids.
  void validate_role(Role role, Index batch, Index len, Index offset, Index heads) const {
    const FopeConfig& c = table->config();
    const bool query = role == Role::Query;
    detail::require(heads == (query ? c.q_heads : c.kv_heads),
                    query ? "Fope: the call's query heads" : "Fope: the keys' heads",
                    detail::cat(query ? "FopeConfig.q_heads = " : "FopeConfig.kv_heads = ",
                                query ? c.q_heads : c.kv_heads),
                    heads);
    check_positions("Fope", role, batch, len, offset, c.max_len);
  }

  /// Throws Error unless the head is the table's d.
  void validate_head_dim(Index head_dim) const {
    detail::require(head_dim == table->config().head_dim, "Fope: head_dim",
                    detail::cat("FopeConfig.head_dim = ", table->config().head_dim), head_dim);
  }

 private:
  // x[m] = x_m c - x_{m+P} s, x[m+P] = x_{m+P} c + x_m s for the NeoX pairs (m, m + P), with
  // s = sign * sin_p[m] (-1 for a negative position read from the table's row of -t).
  template <class T, class C>
  static void turn(T* x, Index pairs, const C* cos_p, const C* sin_p, T sign) {
    for (Index m = 0; m < pairs; ++m) {
      const T c = static_cast<T>(cos_p[m]), s = sign * static_cast<T>(sin_p[m]);
      const T xa = x[m], xb = x[m + pairs];
      x[m] = xa * c - xb * s;
      x[m + pairs] = xb * c + xa * s;
    }
  }

  // Box-Muller on two uniforms in (0, 1] from the top 53 bits: portable, unlike
  // std::normal_distribution, whose algorithm each standard library chooses.
  static double standard_normal(std::mt19937_64& rng) {
    const double u1 = double((rng() >> 11) + 1) * 0x1p-53, u2 = double(rng() >> 11) * 0x1p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace attnkit
