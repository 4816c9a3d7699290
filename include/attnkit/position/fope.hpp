// Fope: Fourier position embedding (Hua et al. 2024; docs/mechanisms.md "FoPE") as a Position
// policy, on the tables of position/fope_table.hpp. Pair p of head h at position t is turned
// by the Fourier series cos'/sin' of its KV head's coefficients:
//   x[p]' = x[p] cos' - x[p + d/2] sin',  x[p + d/2]' = x[p + d/2] cos' + x[p] sin'.
// Clipped pairs (p >= F) get a padding instead:
//   FopePadding::Identity (default, the paper): cos' = 1, sin' = 0, the pair passes through;
//   FopePadding::ReferenceCode (the authors' code): cos' = sin' = 1.
// Coefficients are per KV head; query head h uses those of its KV head h / (q_heads/kv_heads).
// Backward (attention_backward()): the transposed turn, and the coefficients' gradient
// (ParamGrads::position), as the paper trains them.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/fope_table.hpp"
#include "attnkit/position/position_ids.hpp"

namespace attnkit {

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
///    (-max_len, max_len), as Rope (position/position_ids.hpp): cos' is even in t, sin' odd,
///    but a clipped pair's padding is the same constant at every position.
/// The table is shared, so copying a Fope (or a spec) copies no table.
struct Fope : PositionIds<Fope> {
  using slot = PositionSlot;

  std::shared_ptr<const FopeTable> table;

  explicit Fope(std::shared_ptr<const FopeTable> t) : table(std::move(t)) {
    detail::require(table != nullptr, "Fope.table", "a table", "nullptr");
  }

  /// This policy's identity: its table's config, frequencies and coefficients, and the
  /// position ids (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    detail::TagHash h = detail::TagHash::of<Fope>();
    if (table != nullptr) {
      const FopeConfig& c = table->config();
      h.add(c.head_dim).add(c.max_len).add(c.train_len).add(c.base).add(c.kv_heads);
      h.add(c.q_heads).add(c.padding).add(table->omega());
      h.add(table->cos_coef()).add(table->sin_coef());
    }
    return h.add(q_positions).add(k_positions).value();
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
    turn(x, table->pairs(), table->kept(), table->cos_at(h, t.at), table->sin_at(h, t.at), t.sign,
         1.f);
  }

  /// The same in double: the series recomputed from C, S and omega, without the table.
  void reference_apply(double* x, Index /*dim*/, const RowAt& at) const {
    const Index h = coefficient_head(at), pairs = table->pairs();
    std::vector<double> basis(2 * std::size_t(table->kept())), row(2 * std::size_t(pairs));
    table->fill_basis(double(position_of(at)), basis.data());
    table->series(h, basis.data(), row.data());
    turn(x, pairs, table->kept(), row.data(), row.data() + pairs, 1.0, 1.0);
  }

  /// The transposed turn (attention_backward(): the gradient of a turned row turned back).
  void apply_transpose(float* x, Index /*dim*/, const RowAt& at) const {
    const Index h = coefficient_head(at);
    const TableRow t = table_row(position_of(at));
    turn(x, table->pairs(), table->kept(), table->cos_at(h, t.at), table->sin_at(h, t.at), -t.sign,
         -1.f);
  }

  /// The same in double, from the series.
  void reference_apply_transpose(double* x, Index /*dim*/, const RowAt& at) const {
    const Index h = coefficient_head(at), pairs = table->pairs();
    std::vector<double> basis(2 * std::size_t(table->kept())), row(2 * std::size_t(pairs));
    table->fill_basis(double(position_of(at)), basis.data());
    table->series(h, basis.data(), row.data());
    turn(x, pairs, table->kept(), row.data(), row.data() + pairs, -1.0, -1.0);
  }

  /// Trained parameters: kv_heads * 2 * F * d/2 gradients (ParamGrads::position), per
  /// coefficient set h the C gradients [F, d/2] then the S gradients [F, d/2].
  Index param_count() const {
    return table->config().kv_heads * 2 * table->kept() * table->pairs();
  }

  /// One row's share of the coefficients' gradient: with x the row before turning and g the
  /// gradient of the turned row, dL/dcos'[p] = g[p] x[p] + g[p+P] x[p+P] and dL/dsin'[p] =
  /// g[p+P] x[p] - g[p] x[p+P]; then dL/dC[h,f,p] += dcos'[p] cos(omega_f t) and
  /// dL/dS[h,f,p] += dsin'[p] sin(omega_f t) for the kept pairs p < F (the padded ones have
  /// no coefficients). acc: param_count() doubles.
  template <class X, class G>
  void accumulate_param_grad(const X* x, const G* g, const RowAt& at, double* acc) const {
    const Index pairs = table->pairs(), kept = table->kept();
    const auto n = static_cast<std::size_t>(kept);
    std::vector<double> basis(2 * n), dc(n), ds(n);
    table->fill_basis(double(position_of(at)), basis.data());
    for (Index p = 0; p < kept; ++p) {
      const double xa = double(x[p]), xb = double(x[p + pairs]);
      const double ga = double(g[p]), gb = double(g[p + pairs]);
      dc[std::size_t(p)] = ga * xa + gb * xb;
      ds[std::size_t(p)] = gb * xa - ga * xb;
    }
    double* c_grad = acc + coefficient_head(at) * 2 * kept * pairs;
    double* s_grad = c_grad + kept * pairs;
    for (Index f = 0; f < kept; ++f)
      for (Index p = 0; p < kept; ++p) {
        c_grad[f * pairs + p] += dc[std::size_t(p)] * basis[std::size_t(f)];
        s_grad[f * pairs + p] += ds[std::size_t(p)] * basis[std::size_t(kept + f)];
      }
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
  // s = sign * sin_p[m] for the kept pairs m < kept (sign -1 for a negative position read
  // from the table's row of -t: their series is odd in t) and pad_sign * sin_p[m] for the
  // clipped ones, whose padding is a constant, the same at t and -t (pad_sign -1: the
  // transposed turn).
  template <class T, class C>
  static void turn(T* x, Index pairs, Index kept, const C* cos_p, const C* sin_p, T sign,
                   T pad_sign) {
    for (Index m = 0; m < pairs; ++m) {
      const T c = static_cast<T>(cos_p[m]),
              s = (m < kept ? sign : pad_sign) * static_cast<T>(sin_p[m]);
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
