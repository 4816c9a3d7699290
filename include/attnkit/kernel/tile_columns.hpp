// The gathered columns of a query tile (kernel/attention_tiles.hpp), for masks with the
// gathered-columns face (mask/key_columns.hpp). Each query's isolated keys are not in any key
// tile: they form one more tile of logits s[t, lanes] whose row t holds, in lane r, query r's
// t-th column -- so the normalizer absorbs it like any key tile -- and its products run row by
// row: a dot product of query r with the key row of each of its columns, then the weighted
// value rows added to r's accumulator. Only the columns' K and V rows are read.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "attnkit/detail/bf16_round.hpp"
#include "attnkit/detail/pack.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

template <class Mask>
class TileColumns {
 public:
  using Columns = decltype(std::declval<const Mask&>().columns(Index{}, Index{}, Index{}));
  static constexpr Index kW = simd::kWidth;

  explicit TileColumns(Index max_rows)
      : cols_(static_cast<std::size_t>(max_rows)),
        first_(static_cast<std::size_t>(max_rows)),
        count_(static_cast<std::size_t>(max_rows)) {}

  /// The columns of queries i0 .. i0 + nq - 1 (head h of batch b) that lie in [lo, hi);
  /// returns the most that any of them has: the rows of the column tile.
  Index gather(const Mask& mask, Index b, Index h, Index i0, Index nq, Index lo, Index hi) {
    Index most = 0;
    for (Index r = 0; r < nq; ++r) {
      const std::size_t x = static_cast<std::size_t>(r);
      new (&cols_[x]) Columns(mask.columns(b, h, i0 + r));  // built in place: no copy
      const Index* all = cols_[x].keys;
      const Index* first = std::lower_bound(all, all + cols_[x].count, lo);
      const Index* last = std::lower_bound(first, all + cols_[x].count, hi);
      first_[x] = first - all;
      count_[x] = last - first;
      most = std::max(most, count_[x]);
    }
    return most;
  }

  /// s[(t - t0) * ld + r] = logit of query r (row r of qr [nq, d]) and its t-th column, for t
  /// in [t0, t0 + nt); -inf past its columns and on the padding lanes up to `lanes`. Keys
  /// that are not read in place are widened into `rows` [kW, d] (and rounded to bf16 with
  /// `bf16`, as the tiles' operands are). kW dot products end in one transposing add. Then
  /// each logit is divided by its key's norm (inv_norms [Lk], cosine logits, else null) and
  /// given the score mod's element rule for query head h and its position i0 + r.
  template <class K, class Score>
  void logits(const View<K>& k, bool in_place, bool bf16, Index b, Index hk, Index t0, Index nt,
              Index nq, Index lanes, const float* qr, Index d, float* rows, float* s, Index ld,
              const Score& score, const float* inv_norms, Index h, Index i0) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    (void)score, (void)h, (void)i0;  // without a score mod
    for (Index t = 0; t < nt; ++t) std::fill(s + t * ld, s + t * ld + lanes, kNegInf);
    const Index whole = d / kW * kW;
    for (Index r = 0; r < nq; ++r) {
      const float* q = qr + r * d;
      const Index* keys = key_list(r);
      const Index end = std::min(count_[static_cast<std::size_t>(r)], t0 + nt);
      for (Index t1 = t0; t1 < end; t1 += kW) {
        const Index n = std::min(kW, end - t1);
        const float* key[kW];
        simd::Vec acc[kW];
        for (Index u = 0; u < kW; ++u) acc[u] = simd::Vec(0.f);
        for (Index u = 0; u < n; ++u) {
          key[u] = in_place ? as_f32(k.row(b, hk, keys[t1 + u])) : rows + u * d;
          if (!in_place) pack_rows(k, b, hk, keys[t1 + u], 1, rows + u * d, d);
          if (!in_place && bf16 && !is_bf16<K>()) round_rows_to_bf16(rows + u * d, 1, d, d);
          simd::Vec a0(0.f), a1(0.f);  // two chains, in registers
          Index c = 0;
          for (; c + 2 * kW <= whole; c += 2 * kW) {
            a0 = simd::fma(simd::load(key[u] + c), simd::load(q + c), a0);
            a1 = simd::fma(simd::load(key[u] + c + kW), simd::load(q + c + kW), a1);
          }
          if (c < whole) a0 = simd::fma(simd::load(key[u] + c), simd::load(q + c), a0);
          acc[u] = a0 + a1;
        }
        alignas(64) float sums[kW];
        simd::store(sums, simd::transpose_add(acc));
        for (Index u = 0; u < n; ++u) {
          for (Index c = whole; c < d; ++c) sums[u] += key[u][c] * q[c];
          float x = sums[u];
          if (inv_norms != nullptr) x *= inv_norms[keys[t1 + u]];
          if constexpr (has_modify<Score>::value)
            x = static_cast<float>(score.modify(x, b, h, i0 + r, keys[t1 + u]));
          s[(t1 + u - t0) * ld + r] = x;
        }
      }
    }
  }

  /// acc[r] (rows dv_pad apart) += the weights s[(t - t0) * ld + r] times the value rows of
  /// query r's columns t in [t0, t0 + nt), with r's accumulator held in registers across
  /// them. Values that are not f32 are widened into `rows` [kW, dv_pad] (rounded with
  /// `bf16`); a column's value row is read only by its own queries.
  template <class V>
  void weighted_sum(const View<V>& v, bool bf16, Index b, Index hk, Index t0, Index nt, Index nq,
                    const float* s, Index ld, float* rows, float* acc_rows, Index dv,
                    Index dv_pad) const {
    const bool in_place = is_f32<V>() && !bf16;
    const Index whole = (in_place ? dv : dv_pad) / kW * kW;
    for (Index r = 0; r < nq; ++r) {
      const Index* keys = key_list(r);
      const Index end = std::min(count_[static_cast<std::size_t>(r)], t0 + nt);
      float* acc = acc_rows + r * dv_pad;
      for (Index t1 = t0; t1 < end; t1 += kW) {
        const Index n = std::min(kW, end - t1);
        const float* value[kW];
        float w[kW];
        for (Index u = 0; u < n; ++u) {
          value[u] = in_place ? as_f32(v.row(b, hk, keys[t1 + u])) : rows + u * dv_pad;
          if (!in_place) pack_rows(v, b, hk, keys[t1 + u], 1, rows + u * dv_pad, dv_pad);
          if (!in_place && bf16 && !is_bf16<V>())
            round_rows_to_bf16(rows + u * dv_pad, 1, dv, dv_pad);
          w[u] = s[(t1 + u - t0) * ld + r];
        }
        Index c = 0;
        for (; c + kBlock * kW <= whole; c += kBlock * kW)
          add_block<kBlock>(acc + c, value, w, n, c);
        for (; c < whole; c += kW) add_block<1>(acc + c, value, w, n, c);
        for (; c < dv; ++c)
          for (Index u = 0; u < n; ++u) acc[c] += w[u] * value[u][c];
      }
    }
  }

 private:
  static constexpr int kBlock = 8;  // accumulator vectors held in registers at once

  // acc[0, N kW) += sum over u < n of w[u] * value[u][c + ...].
  template <int N>
  static void add_block(float* acc, const float* const* value, const float* w, Index n, Index c) {
    simd::Vec a[std::size_t{N}];  // array bounds are unsigned (-Wsign-conversion)
    for (int x = 0; x < N; ++x) a[x] = simd::load(acc + x * kW);
    for (Index u = 0; u < n; ++u) {
      const simd::Vec wv(w[u]);
      for (int x = 0; x < N; ++x) a[x] = simd::fma(wv, simd::load(value[u] + c + x * kW), a[x]);
    }
    for (int x = 0; x < N; ++x) simd::store(acc + x * kW, a[x]);
  }

  const Index* key_list(Index r) const {
    const std::size_t x = static_cast<std::size_t>(r);
    return cols_[x].keys + first_[x];
  }

  std::vector<Columns> cols_;         // [rows of a query tile] each query's columns
  std::vector<Index> first_, count_;  // the ones in the keys asked: [first, first + count)
};

// What the tile engine keeps of a mask with gathered columns: its range part, built once per
// thread, and the columns of the current query tile (nothing for other masks).
template <class Mask, bool kOn = has_columns<Mask>::value>
struct MaskParts {
  explicit MaskParts(const Mask&) {}
};
template <class Mask>
struct MaskParts<Mask, true> {
  explicit MaskParts(const Mask& mask, Index max_rows = 64)
      : range(mask.range_part()), columns(max_rows) {}
  decltype(std::declval<const Mask&>().range_part()) range;
  TileColumns<Mask> columns;
};

}  // namespace attnkit::detail
