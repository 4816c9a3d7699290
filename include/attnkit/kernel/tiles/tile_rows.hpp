// The normalizer side of one query tile of the tile engine (kernel/tiles/attention_tiles.hpp): one
// normalizer State per kWidth queries (a SIMD lane per query), begun with each block's
// context, fed tile after tile of logits s[keys, lanes] (rows ld apart), and finished into
// per-row output factors and row statistics.
#pragma once

#include <cstddef>
#include <limits>
#include <vector>

#include "attnkit/kernel/tiles/tile_output.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

template <class Normalizer>
class TileRows {
 public:
  using State = typename Normalizer::State;
  static constexpr Index kW = simd::kWidth;

  explicit TileRows(Index max_rows) : states_(static_cast<std::size_t>(max_rows / kW)) {}

  /// The states of rows [q0, q0 + nq) of head h in batch b (positions from i0): the flat
  /// index of their row statistic and, if the normalizer asks (kCountsKeys), their key
  /// counts under `mask`, written to counts [nq].
  template <class Mask>
  void begin(const Normalizer& n, const Mask& mask, const Problem& p, Index b, Index h, Index q0,
             Index nq, Index i0, float* counts) {
    if constexpr (counts_keys<Normalizer>())
      for (Index r = 0; r < nq; ++r)
        counts[r] = static_cast<float>(visible_key_count(mask, b, h, i0 + r, p.kv_len));
    const Index row0 = (b * p.q_heads + h) * p.q_len + q0;
    for (Index c = 0; c < nq; c += kW)
      at(c) = begin_state(n, RowContext{b, h, p.kv_len, p.head_dim, row0 + c, nq - c,
                                        counts_keys<Normalizer>() ? counts + c : nullptr});
  }

  /// A statistics-only pass over one tile (passes before the last), and that pass's end.
  void observe(const Normalizer& n, float* s, Index nk, Index lanes, Index ld) {
    for (Index c = 0; c < lanes; c += kW) n.observe(at(c), s + c, nk, ld);
  }
  void end_pass(const Normalizer& n, Index lanes) {
    for (Index c = 0; c < lanes; c += kW) n.end_pass(at(c));
  }

  /// After the last pass: whether some row asks for it again (every state is asked).
  bool another(const Normalizer& n, Index lanes) {
    bool again = false;
    for (Index c = 0; c < lanes; c += kW) again = another_pass(n, at(c)) || again;
    return again;
  }

  /// Logits -> weights in s, lane block by lane block; rescales the accumulator rows acc
  /// [nq, dv_pad] unless the normalizer keeps no running maximum (sigmoid, ReLU^a: kRescales
  /// = false). factor [lanes] is scratch. With `keys` (one range per lane block, from the
  /// masking), a block's logits outside its range are -inf: their weights are 0 for every
  /// normalizer, so they are stored as 0 and only the range is absorbed, to the same bits.
  void absorb(const Normalizer& n, float* s, Index nk, Index nq, Index lanes, Index ld,
              float* factor, float* acc, Index dv_pad, const Range* keys = nullptr) {
    for (Index c = 0; c < lanes; c += kW) {
      const Range r = keys != nullptr ? keys[c / kW] : Range{0, nk};
      const simd::Vec zero(0.f);
      for (Index j = 0; j < r.begin; ++j) simd::store(s + j * ld + c, zero);
      for (Index j = r.end; j < nk; ++j) simd::store(s + j * ld + c, zero);
      simd::store(factor + c, n.absorb(at(c), s + r.begin * ld + c, r.end - r.begin, ld));
    }
    if constexpr (!rescales<Normalizer>()) return;
    for (Index r = 0; r < nq; ++r) {
      if (factor[r] == 1.f) continue;  // the row's maximum did not move: x * 1 is x
      const simd::Vec f(factor[r]);
      float* row = acc + r * dv_pad;
      for (Index c = 0; c < dv_pad; c += kW) simd::store(row + c, simd::load(row + c) * f);
    }
  }

  /// factor [lanes] = each row's finalize factor. A row with an LSE whose factor is 0 ("saw no
  /// key") but which the mask lets see keys in `keys` had all their logits at -inf: products
  /// that overflow f32 (q = 1e20, k = -1e20). f32 cannot weigh them: its output becomes NaN,
  /// its LSE stays -inf (a merge weighs it 0 beside a part with a finite LSE, as f64 would).
  /// Only such rows ask the mask again: nothing per key.
  template <class Mask>
  void finalize(const Normalizer& n, const Mask& mask, const Problem& p, Index b, Index h, Index q0,
                Index nq, Index lanes, Range keys, float* factor) {
    finalize_factors(n, states_.data(), lanes, factor);
    if constexpr (row_stat_kind<Normalizer>() == RowStat::LogSumExp)
      for (Index r = 0; r < nq; ++r)
        if (factor[r] == 0.f &&
            visible_key_count(mask, b, h, q0 + r + p.q_offset, p.kv_len, keys) > 0)
          factor[r] = std::numeric_limits<float>::quiet_NaN();
  }

  /// The rows' statistics (LSE or row sum) into stat [nq].
  void store(const Normalizer& n, float* stat, Index nq, Index lanes) const {
    store_row_stats(n, states_.data(), stat, nq, lanes);
  }

 private:
  State& at(Index lane) { return states_[static_cast<std::size_t>(lane / kW)]; }

  std::vector<State> states_;  // [max_rows / kWidth] one lane per query
};

}  // namespace attnkit::detail
