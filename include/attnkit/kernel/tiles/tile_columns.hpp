// The gathered columns of a query tile (kernel/tiles/attention_tiles.hpp), for masks with the
// gathered-columns face (mask/key_columns.hpp). Each query's isolated keys are not in any key
// tile: they form one more tile of logits s[t, lanes], which the normalizer absorbs like any
// key tile, in one of two forms:
// - row by row (columns of their own: PowerOfTwo's i - 2^k differ from query to query): row t
//   holds, in lane r, query r's t-th column; a dot product of query r with each of its
//   columns' key rows, then their weighted value rows added to r's accumulator. Only the
//   columns' K and V rows are read, each for the one query that has it.
// - as a key tile (columns the tile's queries share: landmarks, a BlockMask of narrow key
//   blocks): row t is the t-th distinct column of the tile, -inf in the lanes of queries
//   without it; its K and V rows are gathered into a dense tile once and the products run as
//   the tile GEMMs, so each row read serves every query of the tile.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/prefetch.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/tiles/tile_plan.hpp"
#include "attnkit/kernel/tiles/value_guard.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/bf16_round.hpp"
#include "attnkit/storage/f32_rows.hpp"

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
  /// returns the rows of the column tile: the most columns any of them has, or the number of
  /// distinct columns when they are shared (then shared() is true).
  Index gather(const Mask& mask, Index b, Index h, Index i0, Index nq, Index lo, Index hi) {
    Index most = 0, total = 0;
    for (Index r = 0; r < nq; ++r) {
      const std::size_t x = static_cast<std::size_t>(r);
      new (&cols_[x]) Columns(mask.columns(b, h, i0 + r));  // built in place: no copy
      const Index* all = cols_[x].keys;
      const Index* first = std::lower_bound(all, all + cols_[x].count, lo);
      const Index* last = std::lower_bound(first, all + cols_[x].count, hi);
      first_[x] = first - all;
      count_[x] = last - first;
      most = std::max(most, count_[x]);
      total += count_[x];
    }
    shared_ = nq >= 8 && most > 0 && unite(nq, total);
    return shared_ ? Index(union_.size()) : most;
  }

  /// The form gather() chose for the current tile.
  bool shared() const { return shared_; }

  /// Shared columns: s[(t - t0) * ld + r] = the logit of query r (column r of qt [d, ldq], as
  /// the key tiles read it) and distinct column t, for t in [t0, t0 + nt); -inf where query r
  /// lacks that column and on the padding lanes. The columns' key rows are gathered into a
  /// dense tile first (widened to f32, rounded with `bf16`). Then inv_norms and the score
  /// mod as logits() applies them.
  template <class K, class Score>
  void shared_logits(const View<K>& k, bool bf16, Index b, Index hk, Index t0, Index nt, Index nq,
                     Index lanes, const float* qt, Index ldq, Index d, float* s, Index ld,
                     const Score& score, const float* inv_norms, Index h, Index i0) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    (void)score, (void)h, (void)i0;  // without a score mod
    const Index* keys = union_.data() + t0;
    float* rows = pack(k, bf16, b, hk, keys, nt, d, d, kpack_);
    gemm::gemm(nt, lanes, d, {rows, d, 1}, qt, ldq, s, ld, false);
    for (Index r = 0; r < lanes; ++r) {
      const Index* own = r < nq ? key_list(r) : nullptr;
      const Index* own_end = r < nq ? own + count_[static_cast<std::size_t>(r)] : nullptr;
      if (r < nq) own = std::lower_bound(own, own_end, keys[0]);
      for (Index t = 0; t < nt; ++t) {
        float& x = s[t * ld + r];
        if (own == own_end || *own != keys[t]) {
          x = kNegInf;
          continue;
        }
        ++own;
        if (inv_norms != nullptr) x *= inv_norms[keys[t]];
        if constexpr (has_modify<Score>::value)
          x = static_cast<float>(score.modify(double(x), b, h, i0 + r, keys[t]));
      }
    }
  }

  /// Shared columns: acc[r] (rows dv_pad apart) += the weights s[(t - t0) * ld + r] times the
  /// value rows of distinct columns [t0, t0 + nt), gathered into a dense tile, as one tile
  /// GEMM. A value row that is not finite is added only to the queries that have its column
  /// (0 * inf is NaN) and left out of the product.
  template <class V>
  void shared_values(const View<V>& v, bool bf16, Index b, Index hk, Index t0, Index nt, Index nq,
                     const float* s, Index ld, float* acc_rows, Index dv, Index dv_pad) {
    const Index* keys = union_.data() + t0;
    float* rows = pack(v, bf16, b, hk, keys, nt, dv, dv_pad, vpack_);
    for (Index t = 0; t < nt; ++t) {
      float* value = rows + t * dv_pad;
      if (rows_finite(F32Rows{value, dv_pad}, 0, 1, dv_pad)) continue;
      for (Index r = 0; r < nq; ++r) {
        const Index* own = key_list(r);
        if (!std::binary_search(own, own + count_[static_cast<std::size_t>(r)], keys[t])) continue;
        for (Index c = 0; c < dv; ++c) acc_rows[r * dv_pad + c] += s[t * ld + r] * value[c];
      }
      std::fill(value, value + dv_pad, 0.f);
    }
    gemm::gemm(nq, dv_pad, nt, {s, 1, ld}, rows, dv_pad, acc_rows, dv_pad, true);
  }

  /// s[(t - t0) * ld + r] = logit of query r (row r of qr [nq, d]) and its t-th column, for t
  /// in [t0, t0 + nt); -inf past its columns and on the padding lanes up to `lanes`. Keys
  /// that are not read in place are widened into `rows` [kW, d] (and rounded to bf16 with
  /// `bf16`, as the tiles' operands are). kW dot products end in one transposing add. Then
  /// each logit is divided by its key's norm (inv_norms [Lk], cosine logits, else null) and
  /// given the score mod's element rule for query head h and its position i0 + r.
  /// In the shared form (shared()) the logits come from shared_logits() over qt [d, ldq].
  template <class K, class Score>
  void logits(const View<K>& k, bool in_place, bool bf16, Index b, Index hk, Index t0, Index nt,
              Index nq, Index lanes, const float* qr, const float* qt, Index ldq, Index d,
              float* rows, float* s, Index ld, const Score& score, const float* inv_norms, Index h,
              Index i0) {
    if (shared_)
      return shared_logits(k, bf16, b, hk, t0, nt, nq, lanes, qt, ldq, d, s, ld, score, inv_norms,
                           h, i0);
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    (void)score, (void)h, (void)i0;  // without a score mod
    for (Index t = 0; t < nt; ++t) std::fill(s + t * ld, s + t * ld + lanes, kNegInf);
    const Index whole = d / kW * kW;
    for (Index r = 0; r < nq; ++r) {
      if (r + kAhead < nq) prefetch_columns(k, b, hk, r + kAhead, t0, nt);
      const float* q = qr + r * d;
      const Index* keys = key_list(r);
      const Index end = std::min(count_[static_cast<std::size_t>(r)], t0 + nt);
      for (Index t1 = t0; t1 < end; t1 += kW) {
        const Index n = std::min(kW, end - t1);
        const float* key[kW];
        for (Index u = 0; u < n; ++u) {
          key[u] = in_place ? as_f32(k.row(b, hk, keys[t1 + u])) : rows + u * d;
          if (!in_place) pack_rows(k, b, hk, keys[t1 + u], 1, rows + u * d, d);
          if (!in_place && bf16 && !is_bf16<K>()) round_rows_to_bf16(rows + u * d, 1, d, d);
        }
        simd::Vec acc[kW];
        dot_columns(q, key, n, whole, acc);
        alignas(64) float sums[kW];
        simd::store(sums, simd::transpose_add(acc));
        for (Index u = 0; u < n; ++u) {
          for (Index c = whole; c < d; ++c) sums[u] += key[u][c] * q[c];
          float x = sums[u];
          if (inv_norms != nullptr) x *= inv_norms[keys[t1 + u]];
          if constexpr (has_modify<Score>::value)
            x = static_cast<float>(score.modify(double(x), b, h, i0 + r, keys[t1 + u]));
          s[(t1 + u - t0) * ld + r] = x;
        }
      }
    }
  }

  /// acc[r] (rows dv_pad apart) += the weights s[(t - t0) * ld + r] times the value rows of
  /// query r's columns t in [t0, t0 + nt), with r's accumulator held in registers across
  /// them. Values that are not f32 are widened into `rows` [kW, dv_pad] (rounded with
  /// `bf16`); a column's value row is read only by its own queries.
  /// In the shared form, shared_values() instead.
  template <class V>
  void weighted_sum(const View<V>& v, bool bf16, Index b, Index hk, Index t0, Index nt, Index nq,
                    const float* s, Index ld, float* rows, float* acc_rows, Index dv,
                    Index dv_pad) {
    if (shared_) return shared_values(v, bf16, b, hk, t0, nt, nq, s, ld, acc_rows, dv, dv_pad);
    const bool in_place = is_f32<V>() && !bf16;
    const Index whole = (in_place ? dv : dv_pad) / kW * kW;
    for (Index r = 0; r < nq; ++r) {
      if (r + kAhead < nq) prefetch_columns(v, b, hk, r + kAhead, t0, nt);
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
  // Queries ahead whose column rows the row-by-row products ask the cache for: each query's
  // rows are scattered (PowerOfTwo's i - 2^k), so no hardware prefetcher finds them.
  static constexpr Index kAhead = 4;

  template <class T>
  void prefetch_columns(const View<T>& x, Index b, Index hk, Index r, Index t0, Index nt) const {
    const Index* keys = key_list(r);
    const Index end = std::min(count_[static_cast<std::size_t>(r)], t0 + nt);
    const Index bytes = row_elements<std::remove_const_t<T>>(x.dim) * Index{sizeof(T)};
    for (Index t = t0; t < end; ++t) prefetch_rows(x.row(b, hk, keys[t]), 0, 1, bytes);
  }

  // union_ = the distinct columns of queries [0, nq), ascending, when the queries share them
  // (shares_columns(), with `total` columns counted query by query); false, union_ left
  // partial, as soon as they cannot.
  bool unite(Index nq, Index total) {
    union_.assign(key_list(0), key_list(0) + count_[0]);
    for (Index r = 1; r < nq; ++r) {
      const Index* own = key_list(r);
      merged_.clear();
      std::set_union(union_.begin(), union_.end(), own, own + count_[static_cast<std::size_t>(r)],
                     std::back_inserter(merged_));
      union_.swap(merged_);
      if (!shares_columns(Index(union_.size()), total, nq)) return false;
    }
    return true;
  }

  // The f32 rows [n, ld] of keys[0, n) of view x (head hk of batch b), in `buffer`, padded
  // with zeros from `dim` and rounded to bf16 with `bf16` (as the tiles' operands are).
  template <class T>
  static float* pack(const View<T>& x, bool bf16, Index b, Index hk, const Index* keys, Index n,
                     Index dim, Index ld, std::vector<float>& buffer) {
    if (buffer.size() < static_cast<std::size_t>(n * ld))
      buffer.resize(static_cast<std::size_t>(n * ld));
    float* rows = buffer.data();
    for (Index t = 0; t < n; ++t) pack_rows(x, b, hk, keys[t], 1, rows + t * ld, ld);
    if (bf16 && !is_bf16<T>()) round_rows_to_bf16(rows, n, dim, ld);
    return rows;
  }

  // acc[u] = the lanes of q . key[u] over [0, whole) (whole a multiple of kW), for u < n
  // (n <= kW), and 0 for u >= n: each chunk of q is loaded once for all n keys, one chain a
  // key (n chains hide the FMA latency). n is rounded up to a power of two, the extra keys
  // reading key[0] again (from L1), so a few block sizes serve every n.
  static void dot_columns(const float* q, const float** key, Index n, Index whole, simd::Vec* acc) {
    for (Index u = n; u < kW; ++u) key[u] = key[0];
    if (n <= 2)
      dot_block<at_most_width(2)>(q, key, whole, acc);
    else if (n <= 4)
      dot_block<at_most_width(4)>(q, key, whole, acc);
    else if (n <= 8)
      dot_block<at_most_width(8)>(q, key, whole, acc);
    else
      dot_block<int{kW}>(q, key, whole, acc);
    for (Index u = n; u < kW; ++u) acc[u] = simd::Vec(0.f);
  }

  static constexpr int at_most_width(int n) { return kW < n ? int{kW} : n; }

  template <int N>
  static void dot_block(const float* q, const float* const* key, Index whole, simd::Vec* acc) {
    simd::Vec a[std::size_t{N}];  // array bounds are unsigned (-Wsign-conversion)
    for (int u = 0; u < N; ++u) a[u] = simd::Vec(0.f);
    for (Index c = 0; c < whole; c += kW) {
      const simd::Vec qc = simd::in_register(simd::load(q + c));
      for (int u = 0; u < N; ++u) a[u] = simd::fma(simd::load(key[u] + c), qc, a[u]);
    }
    for (int u = 0; u < N; ++u) acc[u] = a[u];
  }

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

  std::vector<Columns> cols_;          // [rows of a query tile] each query's columns
  std::vector<Index> first_, count_;   // the ones in the keys asked: [first, first + count)
  bool shared_ = false;                // the tile's columns form key tiles
  std::vector<Index> union_, merged_;  // its distinct columns (and the merge's scratch)
  std::vector<float> kpack_, vpack_;   // their K and V rows, gathered
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
