// Rope: rotary position embedding as a Position policy (docs/mechanisms.md "RoPE"). Pair m of the
// first rotary_dim dimensions of q (at position i) and k (at position j) turns by i theta_m
// and j theta_m, so q_i . k_j depends on i - j only. Pairings:
//   NeoX (Hugging Face "rotate_half", Llama, GPT-NeoX): pair m is (m, m + rotary_dim / 2);
//   GptJ (the original paper, GPT-J, interleaved): pair m is (2m, 2m + 1).
// They are the same rotation up to a permutation of the dimensions. Dimensions past
// rotary_dim pass through (partial rotary). Proportional RoPE (RopeScaling::proportional,
// Gemma 4's global layers) spans the head, rotary_dim == head_dim: its pairs past
// turned_pairs() have frequency 0 and are skipped (a turn by 0 leaves them as they are), so
// NeoX turns (m, m + head_dim / 2) for m < turned_pairs() only. Positions
// (position/position_ids.hpp): absolute by default (a query row r sits at r + q_offset, key j
// at j), or explicit ids per batch (with_positions); every position must be in (-max_len,
// max_len), a negative one turning backwards. The table is shared, so copying a Rope (or a
// spec) copies no table.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/position_ids.hpp"
#include "attnkit/position/rope_table.hpp"

namespace attnkit {

enum class RopePairing { NeoX, GptJ };

struct Rope : PositionIds<Rope> {
  using slot = PositionSlot;

  std::shared_ptr<const RopeTable> table;
  RopePairing pairing = RopePairing::NeoX;

  explicit Rope(RopeTable t, RopePairing p = RopePairing::NeoX)
      : table(std::make_shared<const RopeTable>(std::move(t))), pairing(p) {}
  Rope(std::shared_ptr<const RopeTable> t, RopePairing p) : table(std::move(t)), pairing(p) {
    detail::require(table != nullptr, "Rope.table", "a table", "nullptr");
  }

  /// This policy's identity: its table's rotation (sizes, frequencies, attention factor),
  /// the pairing and the position ids (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    detail::TagHash h = detail::TagHash::of<Rope>();
    if (table != nullptr)
      h.add(table->rotary_dim())
          .add(table->max_len())
          .add(table->inv_freq())
          .add(table->attention_factor());
    return h.add(pairing).add(q_positions).add(k_positions).value();
  }

  /// Rotates x[0, rotary_dim) in place with the table's cos / sin at the row's position (a
  /// negative one: the table's row of -t, sines negated).
  void apply(float* x, Index /*dim*/, const RowAt& at) const {
    const TableRow t = table_row(position_of(at));
    const float* c = table->cos_at(t.at);
    const float* s = table->sin_at(t.at);
    rotate(
        x, [&](Index m) { return c[m]; }, [&](Index m) { return t.sign * s[m]; });
  }

  /// The same in double, with the angle position * inv_freq formed in double.
  void reference_apply(double* x, Index /*dim*/, const RowAt& at) const {
    const double t = double(position_of(at)), f = table->attention_factor();
    const std::vector<double>& inv_freq = table->inv_freq();
    rotate(
        x, [&](Index m) { return f * std::cos(t * inv_freq[static_cast<std::size_t>(m)]); },
        [&](Index m) { return f * std::sin(t * inv_freq[static_cast<std::size_t>(m)]); });
  }

  /// The transposed rotation (attention_backward(): gradients of turned rows turn back):
  /// the same pairs turned by the opposite angle.
  void apply_transpose(float* x, Index /*dim*/, const RowAt& at) const {
    const TableRow t = table_row(position_of(at));
    const float* c = table->cos_at(t.at);
    const float* s = table->sin_at(t.at);
    rotate(
        x, [&](Index m) { return c[m]; }, [&](Index m) { return -t.sign * s[m]; });
  }

  /// The same in double.
  void reference_apply_transpose(double* x, Index /*dim*/, const RowAt& at) const {
    const double t = double(position_of(at)), f = table->attention_factor();
    const std::vector<double>& inv_freq = table->inv_freq();
    rotate(
        x, [&](Index m) { return f * std::cos(t * inv_freq[static_cast<std::size_t>(m)]); },
        [&](Index m) { return -f * std::sin(t * inv_freq[static_cast<std::size_t>(m)]); });
  }

  /// Throws Error when a position falls outside the table or ids do not cover the call.
  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index /*q_heads*/) const {
    validate_role(Role::Query, batch, q_len, q_offset, 0);
    validate_role(Role::Key, batch, kv_len, 0, 0);
  }

  /// The same for the rows of one role alone (apply_position): `len` rows per batch at
  /// positions offset .. offset + len - 1, or at the role's ids.
  void validate_role(Role role, Index batch, Index len, Index offset, Index /*heads*/) const {
    check_positions("Rope", role, batch, len, offset, table->max_len());
  }

  /// Throws Error when the rotated dimensions do not fit the head (proportional RoPE: do not
  /// span it).
  void validate_head_dim(Index head_dim) const {
    if (table->scaling().kind == RopeScaling::Kind::Proportional)
      detail::require(
          table->rotary_dim() == head_dim, "RopeTable.rotary_dim",
          detail::cat("== head_dim = ", head_dim, " (proportional RoPE spans the head)"),
          table->rotary_dim());
    detail::require(table->rotary_dim() <= head_dim, "RopeTable.rotary_dim",
                    detail::cat("<= head_dim = ", head_dim), table->rotary_dim());
  }

 private:
  // x[a] = x_a c - x_b s, x[b] = x_b c + x_a s for every turned pair (a, b) of the pairing.
  template <class T, class Cos, class Sin>
  void rotate(T* x, Cos cos_of, Sin sin_of) const {
    const Index pairs = table->pairs(), turned = table->turned_pairs();
    for (Index m = 0; m < turned; ++m) {
      const Index a = pairing == RopePairing::NeoX ? m : 2 * m;
      const Index b = pairing == RopePairing::NeoX ? m + pairs : 2 * m + 1;
      const T c = static_cast<T>(cos_of(m)), s = static_cast<T>(sin_of(m));
      const T xa = x[a], xb = x[b];
      x[a] = xa * c - xb * s;
      x[b] = xb * c + xa * s;
    }
  }
};

}  // namespace attnkit
