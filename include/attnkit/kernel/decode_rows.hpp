// DecodeRows: the split-KV engine for softmax rows (kernel/split_kv.hpp runs it when the spec
// allows, see decode_rows_fit(), for up to kDecodeRowsMaxQueries query rows per head; paged
// decode runs it over pages, cache/paged_decode.hpp). One item is one KV group over one key
// chunk: all the rows of the group -- its query heads times Lq -- read each block of
// kDecodeBlock keys while it is in L1, and each row keeps its logits with the keys in the
// SIMD lanes: a block of kWidth dot products ends in one transposing horizontal add, the
// softmax takes one exp per kWidth keys, and the weighted sum of value rows runs in
// registers. Two rows that see a whole block share each K/V load (AVX-512: 32 registers
// hold both rows' queries and accumulators); bf16/f16 K/V are widened in registers as they
// are loaded. The tile engine (AttentionTiles) puts queries in the lanes instead, which
// leaves all but one lane idle when a head decodes one token.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/detail/pack.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/position/row_at.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/score_tile.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

/// Keys a DecodeRows block holds (K and V of one block stay in L1 across the group's rows).
inline constexpr Index kDecodeBlock = 16;

/// Query rows per head up to which split-KV runs the row engine rather than query tiles:
/// each row costs the engine the same, while a tile's products fill more SIMD lanes as rows
/// grow. Measured (Lk 4096, H 32, d 128, 1 thread, AVX-512): the engine is 1.2 to 10x faster
/// at Lq 1 to 4, even at Lq 8, and 1.2 to 1.5x slower at Lq 16.
inline constexpr Index kDecodeRowsMaxQueries = 4;

/// True when DecodeRows can run the spec: softmax rows (sinks are added by the merge), a
/// logit mod that does not depend on positions or heads (none, Softcap), and no Position or
/// one that turns rows (the key rows then arrive turned). Others take AttentionTiles.
template <class Spec>
constexpr bool decode_rows_fit() {
  using Score = typename Spec::Score;
  using Position = typename Spec::Position;
  return std::is_same_v<typename Spec::Normalizer, Softmax> &&
         (std::is_same_v<Score, Dot> || std::is_same_v<Score, Softcap>)&&(
             std::is_same_v<Position, NoPosition> || transforms_rows<Position>());
}

/// kWidth f32 values from storage T at p, widened in registers (no store on the way).
template <class T>
simd::Vec widened(const T* p) {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return simd::in_register(simd::load(p));  // one load, shared by the rows that use it
  } else if constexpr (std::is_same_v<U, Eigen::bfloat16>) {
    return simd::load_bf16(reinterpret_cast<const std::uint16_t*>(p));
  } else if constexpr (simd::kWidensF16) {
    return simd::load_f16(reinterpret_cast<const std::uint16_t*>(p));
  } else {
    alignas(64) float out[simd::kWidth];
    for (int i = 0; i < simd::kWidth; ++i) out[i] = static_cast<float>(p[i]);
    return simd::load(out);
  }
}

template <class Spec, class Q, class K, class V>
class DecodeRows {
 public:
  static constexpr Index kW = simd::kWidth;
  static constexpr Index kBlock = kDecodeBlock;
  static constexpr Index kSlab = 8;  // value vectors accumulated in registers at a time
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  /// p: the call's sizes (batch, heads, q_len, dims, scale); key positions and the query
  /// offset come with each run. `groups`: the KV groups whose rows it can hold at once (the
  /// pieces below may then alternate between groups).
  DecodeRows(const Spec& spec, const Problem& p, const View<Q>& q, Index groups = 1)
      : spec_(spec),
        p_(p),
        q_(q),
        rows_(p.q_heads / p.kv_heads * p.q_len),
        dv_pad_(simd::round_up(p.value_dim)),
        q_vectors_(queries_in_registers(p.head_dim)),
        groups_(groups),
        scratch_(Scratch::size_for(groups * rows_ * p.head_dim, groups * rows_ * dv_pad_,
                                   groups * rows_, groups * rows_ * kW, rows_ * kSPad)),
        qr_all_(scratch_.carve(groups * rows_ * p.head_dim)),
        acc_all_(scratch_.carve(groups * rows_ * dv_pad_)),
        m_all_(scratch_.carve(groups * rows_)),
        l_all_(scratch_.carve(groups * rows_ * kW)) {
    blk_.kinds.resize(static_cast<std::size_t>(rows_));
    blk_.visible.resize(static_cast<std::size_t>(rows_ * kBlock));
    blk_.logits = scratch_.carve(rows_ * kSPad);
    seen_all_.resize(static_cast<std::size_t>(groups * rows_));
  }

  /// The rows of KV group g in batch b -- query heads g * G .. (g + 1) * G - 1, each with its
  /// Lq queries, in that order, at positions p.q_offset + i -- over keys [keys) of k and v:
  /// out[r * Dv + c] is row r's partial output and stat[r] its log-sum-exp (-inf for a row
  /// that saw no key, and for one whose visible logits were all -inf: its output is NaN).
  void run(Index b, Index g, const View<K>& k, const View<V>& v, Range keys, float* out,
           float* stat) {
    begin(b, g, p_.q_offset);
    add_keys(b, g, k.row(b, g, keys.begin), k.seq_stride, v.row(b, g, keys.begin), v.seq_stride,
             keys.begin, keys.end - keys.begin);
    finish(g, out, stat);
  }

  /// The same in pieces, for keys that are not one view (paged KV): begin() with the rows'
  /// query offset, add_keys() for each run of n keys at positions pos0 .. pos0 + n - 1 whose
  /// rows are keys[j * kld] and values[j * vld] (runs in position order), then finish(). With
  /// `groups` > 1 the groups' pieces may interleave; the query offset is shared.
  void begin(Index b, Index g, Index q_offset) {
    select(g);
    q_offset_ = q_offset;
    const Index d = p_.head_dim, whole = d / kW * kW;
    const simd::Vec scale(p_.scale);
    for (Index r = 0; r < rows_; ++r) {
      const Index h = head(g, r), i = r % p_.q_len;
      const Q* src = q_.row(b, h, i);
      float* row = qr_ + r * d;
      for (Index c = 0; c < whole; c += kW) simd::store(row + c, widened(src + c));
      for (Index c = whole; c < d; ++c) row[c] = static_cast<float>(src[c]);
      if constexpr (transforms_rows<typename Spec::Position>())
        spec_.position.apply(row, d, RowAt{b, h, i, p_.q_len, i + q_offset, Role::Query});
      for (Index c = 0; c < whole; c += kW) simd::store(row + c, simd::load(row + c) * scale);
      for (Index c = whole; c < d; ++c) row[c] *= p_.scale;
      if (kPairsK && q_vectors_ > 0) split_row(row, d);  // as logits_in_registers() reads K
    }
    std::fill(acc_, acc_ + rows_ * dv_pad_, 0.f);
    std::fill(m_, m_ + rows_, kNegInf);
    std::fill(l_, l_ + rows_ * kW, 0.f);
    std::fill(seen_, seen_ + rows_, char{0});
  }

  void add_keys(Index b, Index g, const K* keys, Index kld, const V* values, Index vld, Index pos0,
                Index n) {
    select(g);
    // Block by block: logits, online softmax, values. (A software pipeline that formed block
    // n's logits before weighing block n - 1's values, to read K and V together, was slower
    // once K/V sat on huge pages: f32 decode, Lk 32K, H 32, 1 thread, AVX-512: MHA 45 -> 41
    // ms, GQA (Hkv 8) 16 -> 15 ms without it; 2 threads unchanged or slightly faster.)
    Block& blk = blk_;
    for (Index j0 = 0; j0 < n; j0 += kBlock) {
      const Index nk = std::min(kBlock, n - j0), k0 = pos0 + j0, lanes = simd::round_up(nk);
      for (Index r = 0; r < rows_; ++r) {
        const Index i = query_position(r);
        blk.kinds[static_cast<std::size_t>(r)] =
            tile_kind_of(spec_.mask, b, head(g, r), Range{i, i + 1}, Range{k0, k0 + nk});
      }
      for (Index j = 0; j < nk; ++j) blk.values[j] = values + (j0 + j) * vld;
      const K* block_keys = keys + j0 * kld;
      for (Index r = 0; r < rows_; ++r) {
        const TileKind kind = blk.kind(r);
        if (kind == TileKind::Empty) continue;
        // Two rows that see the whole block share each K load (AVX-512 has the registers for
        // both rows' queries).
        if (kPair && q_vectors_ > 0 && kind == TileKind::Full && r + 1 < rows_ &&
            blk.kind(r + 1) == TileKind::Full) {
          logit_rows<2>(b, g, r, block_keys, kld, k0, nk, blk);
          ++r;
        } else {
          logit_rows<1>(b, g, r, block_keys, kld, k0, nk, blk);
        }
      }
      for (Index r = 0; r < rows_; ++r)
        if (blk.kind(r) != TileKind::Empty) absorb(r, blk.logits + r * kSPad, lanes);
      weigh_block(blk, nk);
    }
  }

  /// The rows' partial outputs acc / l (0 for a row that saw no key, NaN for one that saw
  /// keys whose logits were all -inf: f32 products that overflowed) and log-sum-exps.
  void finish(Index g, float* out, float* stat) {
    select(g);
    for (Index r = 0; r < rows_; ++r) {
      const float l = simd::reduce_add(simd::load(l_ + r * kW));
      const float f = l != 0.f ? 1.f / l : seen_[r] ? std::numeric_limits<float>::quiet_NaN() : 0.f;
      const float* acc = acc_ + r * dv_pad_;
      float* o = out + r * p_.value_dim;
      Index c = 0;
      if constexpr (kPairsV)  // whole pairs in load_bf16_pair()'s order, as slab() wrote them
        for (; c + 2 * kW <= p_.value_dim; c += 2 * kW) simd::join_pairs(acc + c, f, o + c);
      for (; c < p_.value_dim; ++c) o[c] = acc[c] * f;
      stat[r] = l == 0.f ? kNegInf : m_[r] + std::log(l);
    }
  }

 private:
  static constexpr bool kPair = simd::kRegisters >= 32;
  // bf16 K / V rows are widened two vectors at a time (simd::load_bf16_pair(): a shift and
  // an AND, where one vector at a time takes a lane-crossing widen and a shift), in its
  // order: the queries kept in registers are stored in that order (split_row()), and so are
  // the value accumulators' whole pairs of vectors (finish() puts them back in place). A dot
  // product or an elementwise sum does not care about the order of its elements.
  static constexpr bool kPairsK = std::is_same_v<std::remove_const_t<K>, Eigen::bfloat16>;
  static constexpr bool kPairsV = std::is_same_v<std::remove_const_t<V>, Eigen::bfloat16>;

  // The whole pairs of vectors of row[0, n) from memory order to load_bf16_pair()'s.
  static void split_row(float* row, Index n) {
    float pair[2 * kW];
    for (Index c = 0; c + 2 * kW <= n; c += 2 * kW) {
      simd::split_pairs(row + c, pair);
      std::copy(pair, pair + 2 * kW, row + c);
    }
  }

  // The state the next steps work on: group g's slice (the only one when groups_ = 1).
  void select(Index g) {
    const Index at = groups_ == 1 ? 0 : g;
    qr_ = qr_all_ + at * rows_ * p_.head_dim;
    acc_ = acc_all_ + at * rows_ * dv_pad_;
    m_ = m_all_ + at * rows_;
    l_ = l_all_ + at * rows_ * kW;
    seen_ = seen_all_.data() + at * rows_;
  }

  // Vectors of one query row when it is 2, 4 or 8 whole vectors (kept in registers), else 0.
  static Index queries_in_registers(Index d) {
    const Index n = d % kW == 0 ? d / kW : 0;
    return n == 2 || n == 4 || n == 8 ? n : 0;
  }
  static constexpr Index kSPad = simd::round_up(kBlock);  // one row's logits in s_

  Index head(Index g, Index r) const { return g * (p_.q_heads / p_.kv_heads) + r / p_.q_len; }
  Index query_position(Index r) const { return r % p_.q_len + q_offset_; }

  // One block's state between its logits and its values: the rows' kinds and logits (then
  // weights), a Partial row's keep bits, the value rows.
  struct Block {
    std::vector<TileKind> kinds;  // [rows]
    float* logits = nullptr;      // [rows, kSPad] logits, then weights, keys in the lanes
    std::vector<bool> visible;    // [rows, kBlock] keep bits of Partial rows
    const V* values[kBlock] = {};
    TileKind kind(Index r) const { return kinds[static_cast<std::size_t>(r)]; }
  };

  // Logits of rows r0 .. r0 + R - 1 over the block's nk keys (R = 2: both see all of them),
  // then the score mod, the mask (-inf) and -inf padding to whole vectors.
  template <int R>
  void logit_rows(Index b, Index g, Index r0, const K* keys, Index kld, Index k0, Index nk,
                  Block& blk) {
    const Index lanes = simd::round_up(nk);
    logits<R>(keys, kld, nk, r0, blk.logits + r0 * kSPad);
    for (Index x = 0; x < R; ++x) {
      const Index r = r0 + x, h = head(g, r), i = query_position(r);
      float* s = blk.logits + r * kSPad;
      if constexpr (std::is_same_v<typename Spec::Score, Softcap>)  // elementwise: keys in lanes
        spec_.score.apply_tile(s, 1, lanes, lanes, ScoreTile{b, h, i, k0});
      seen_[r] = seen_[r] || blk.kind(r) == TileKind::Full;
      if (blk.kind(r) == TileKind::Partial)  // R = 1: the row's keep bits, for weigh_block()
        for (Index j = 0; j < nk; ++j) {
          const bool keep = spec_.mask.keep(b, h, i, k0 + j);
          blk.visible[static_cast<std::size_t>(r * kBlock + j)] = keep;
          seen_[r] = seen_[r] || keep;
          if (!keep) s[j] = kNegInf;
        }
      std::fill(s + nk, s + lanes, kNegInf);
    }
  }

  // acc += the block's weights times its nk value rows, for every row that sees some key;
  // two rows that see the whole block share each V load.
  void weigh_block(const Block& blk, Index nk) {
    for (Index r = 0; r < rows_; ++r) {
      const TileKind kind = blk.kind(r);
      if (kind == TileKind::Empty) continue;
      const float* weights[2] = {blk.logits + r * kSPad,
                                 blk.logits + std::min(r + 1, rows_ - 1) * kSPad};
      if (kind == TileKind::Full) {
        if (kPair && r + 1 < rows_ && blk.kind(r + 1) == TileKind::Full) {
          weighted_values<2>(nk, weights, blk.values, acc_ + r * dv_pad_);
          ++r;
        } else {
          weighted_values<1>(nk, weights, blk.values, acc_ + r * dv_pad_);
        }
        continue;
      }
      // A masked key is left out of the values' sum: it cannot bring a non-finite value row
      // (garbage past a cache's length, a poisoned future key) into a row that does not see
      // it (0 * inf is NaN). A visible key stays in even when its weight is 0 (a -inf logit,
      // an underflow), as on Full blocks.
      Index n = 0;
      for (Index j = 0; j < nk; ++j) {
        if (!blk.visible[static_cast<std::size_t>(r * kBlock + j)]) continue;
        w_[n] = weights[0][j];
        vrow_[n++] = blk.values[j];
      }
      weights[0] = w_;
      weighted_values<1>(n, weights, vrow_, acc_ + r * dv_pad_);
    }
  }

  // Online softmax of row r over the logits s[0, lanes) (masked = -inf), as Softmax::absorb:
  // subtract the max first, exp2 with log2(e) folded in. The logits become weights; a +inf or
  // NaN logit gives NaN weights and the row stays NaN; a row with nothing visible yet keeps
  // m = -inf and gets weights exp2(-inf) = 0.
  void absorb(Index r, float* s, Index lanes) {
    simd::Vec top(kNegInf);
    for (Index j = 0; j < lanes; j += kW) top = simd::max(top, simd::load(s + j));
    float m_new = m_[r];  // the horizontal max only when some logit passes the running max
    if (simd::any(simd::greater(top, simd::Vec(m_new))))
      m_new = std::max(m_new, simd::reduce_max(top));
    const simd::Vec log2e(Softmax::kLog2e), m_v(m_new == kNegInf ? 0.f : m_new);
    simd::Vec sum(0.f);
    for (Index j = 0; j < lanes; j += kW) {
      const simd::Vec w = simd::exp2((simd::load(s + j) - m_v) * log2e);
      simd::store(s + j, w);
      sum = sum + w;
    }
    float* l = l_ + r * kW;  // the row sum, lane by lane: one horizontal add, at the end
    if (m_new != m_[r]) {
      const float alpha = std::exp2((m_[r] - m_new) * Softmax::kLog2e);  // exp2(-inf) = 0
      simd::store(l, simd::load(l) * simd::Vec(alpha));
      scale_row(acc_ + r * dv_pad_, alpha);
      m_[r] = m_new;
    }
    simd::store(l, simd::load(l) + sum);
  }

  // out rows 0 .. R - 1 (kSPad apart) = the nk key rows at `keys` (K's storage, widened in
  // registers) . the queries of rows r0 .. r0 + R - 1. With whole vectors of 2, 4 or 8 the queries
  // stay in registers (q_vectors_); otherwise one row at a time, queries loaded.
  template <int R>
  void logits(const K* keys, Index ld, Index nk, Index r0, float* out) {
    switch (q_vectors_) {
      case 8:
        return logits_in_registers<R, 8>(keys, ld, nk, r0, out);
      case 4:
        return logits_in_registers<R, 4>(keys, ld, nk, r0, out);
      case 2:
        return logits_in_registers<R, 2>(keys, ld, nk, r0, out);
      default:
        break;
    }
    if constexpr (R == 1) logits_any(keys, ld, nk, qr_ + r0 * p_.head_dim, out);
  }

  template <int R, int NQ>
  void logits_in_registers(const K* keys, Index ld, Index nk, Index r0, float* out) {
    simd::Vec qv[std::size_t{R}][std::size_t{NQ}];  // array bounds are unsigned
    for (int x = 0; x < R; ++x)
      for (int c = 0; c < NQ; ++c) qv[x][c] = simd::load(qr_ + (r0 + x) * p_.head_dim + c * kW);
    Index j = 0;
    for (; j + kW <= nk; j += kW) {  // kW keys at a time, one transposing add per row
      simd::Vec part[std::size_t{R}]
                    [std::size_t{kW}];  // per key: its products, summed over the lanes after
      const K* key = keys + j * ld;
      for (Index t = 0; t < kW; ++t, key += ld) {  // the rows stream in memory order
        simd::Vec a[std::size_t{R}];
        key_dot<R, NQ>(key, qv, a);
        for (int x = 0; x < R; ++x) part[x][t] = a[x];
      }
      for (int x = 0; x < R; ++x) simd::store(out + x * kSPad + j, simd::transpose_add(part[x]));
    }
    for (; j < nk; ++j) {
      simd::Vec a[std::size_t{R}];
      key_dot<R, NQ>(keys + j * ld, qv, a);
      for (int x = 0; x < R; ++x) out[x * kSPad + j] = simd::reduce_add(a[x]);
    }
  }

  // a[x] = the lane-wise products of one key row with row x's NQ query vectors, summed over
  // the vectors (the caller sums the lanes).
  template <int R, int NQ>
  static void key_dot(const K* key, const simd::Vec (*qv)[std::size_t{NQ}], simd::Vec* a) {
    for (int x = 0; x < R; ++x) a[x] = simd::Vec(0.f);
    if constexpr (kPairsK) {  // NQ is even; the queries are in load_bf16_pair()'s order
      for (int c = 0; c < NQ; c += 2) {
        simd::Vec k0, k1;
        simd::load_bf16_pair(reinterpret_cast<const std::uint16_t*>(key + c * kW), k0, k1);
        for (int x = 0; x < R; ++x) a[x] = simd::fma(k0, qv[x][c], a[x]);
        for (int x = 0; x < R; ++x) a[x] = simd::fma(k1, qv[x][c + 1], a[x]);
      }
    } else {
      for (int c = 0; c < NQ; ++c) {
        const simd::Vec kc = widened(key + c * kW);
        for (int x = 0; x < R; ++x) a[x] = simd::fma(kc, qv[x][c], a[x]);
      }
    }
  }

  // out[0, nk) for one row, any head dim: queries loaded, a scalar tail past whole vectors.
  void logits_any(const K* keys, Index ld, Index nk, const float* q, float* out) {
    const Index d = p_.head_dim, whole = d / kW * kW;
    Index j = 0;
    for (; j + kW <= nk; j += kW) {
      simd::Vec part[kW];
      const K* key = keys + j * ld;
      for (Index t = 0; t < kW; ++t, key += ld) {
        simd::Vec a0(0.f), a1(0.f);  // two chains hide the FMA latency
        Index c = 0;
        for (; c + 2 * kW <= whole; c += 2 * kW) {
          a0 = simd::fma(widened(key + c), simd::load(q + c), a0);
          a1 = simd::fma(widened(key + c + kW), simd::load(q + c + kW), a1);
        }
        if (c < whole) a0 = simd::fma(widened(key + c), simd::load(q + c), a0);
        part[t] = a0 + a1;
      }
      simd::store(out + j, simd::transpose_add(part));
    }
    for (; j < nk; ++j) {
      const K* key = keys + j * ld;
      simd::Vec a0(0.f);
      for (Index c = 0; c < whole; c += kW) a0 = simd::fma(widened(key + c), simd::load(q + c), a0);
      out[j] = simd::reduce_add(a0);
    }
    if (whole < d)
      for (j = 0; j < nk; ++j)
        for (Index c = whole; c < d; ++c) out[j] += static_cast<float>(keys[j * ld + c]) * q[c];
  }

  // Rows r0 .. r0 + R - 1 (accumulators at acc, dv_pad_ apart) += sum over j < n of
  // w[x][j] * rows[j], in register slabs of up to kSlab vectors per row.
  template <int R>
  void weighted_values(Index n, const float* const* w, const V* const* rows, float* acc) {
    const Index dv = p_.value_dim, whole = dv / kW * kW;
    for (Index c0 = 0; c0 < whole; c0 += kSlab * kW) {
      switch (std::min<Index>(kSlab, (whole - c0) / kW)) {
        case 8:
          slab<R, 8>(n, w, rows, acc, c0);
          break;
        case 7:
          slab<R, 7>(n, w, rows, acc, c0);
          break;
        case 6:
          slab<R, 6>(n, w, rows, acc, c0);
          break;
        case 5:
          slab<R, 5>(n, w, rows, acc, c0);
          break;
        case 4:
          slab<R, 4>(n, w, rows, acc, c0);
          break;
        case 3:
          slab<R, 3>(n, w, rows, acc, c0);
          break;
        case 2:
          slab<R, 2>(n, w, rows, acc, c0);
          break;
        default:
          slab<R, 1>(n, w, rows, acc, c0);
          break;
      }
    }
    for (Index x = 0; x < R; ++x)
      for (Index j = 0; j < n; ++j)
        for (Index c = whole; c < dv; ++c)
          acc[x * dv_pad_ + c] += w[x][j] * static_cast<float>(rows[j][c]);
  }

  template <int R, int N>
  void slab(Index n, const float* const* w, const V* const* rows, float* acc, Index c0) {
    simd::Vec a[std::size_t{R}][std::size_t{N}];
    for (int x = 0; x < R; ++x)
      for (int t = 0; t < N; ++t) a[x][t] = simd::load(acc + x * dv_pad_ + c0 + t * kW);
    for (Index j = 0; j < n; ++j) {
      simd::Vec wj[std::size_t{R}];
      for (int x = 0; x < R; ++x) wj[x] = simd::Vec(w[x][j]);
      const V* value = rows[j] + c0;
      int t = 0;
      if constexpr (kPairsV)  // c0 is a multiple of 2 kW: whole pairs in split order
        for (; t + 1 < N; t += 2) {
          simd::Vec v0, v1;
          simd::load_bf16_pair(reinterpret_cast<const std::uint16_t*>(value + t * kW), v0, v1);
          for (int x = 0; x < R; ++x) a[x][t] = simd::fma(wj[x], v0, a[x][t]);
          for (int x = 0; x < R; ++x) a[x][t + 1] = simd::fma(wj[x], v1, a[x][t + 1]);
        }
      for (; t < N; ++t) {
        const simd::Vec vt = widened(value + t * kW);
        for (int x = 0; x < R; ++x) a[x][t] = simd::fma(wj[x], vt, a[x][t]);
      }
    }
    for (int x = 0; x < R; ++x)
      for (int t = 0; t < N; ++t) simd::store(acc + x * dv_pad_ + c0 + t * kW, a[x][t]);
  }

  void scale_row(float* acc, float alpha) {
    const simd::Vec f(alpha);
    for (Index c = 0; c < dv_pad_; c += kW) simd::store(acc + c, simd::load(acc + c) * f);
  }

  const Spec& spec_;
  const Problem& p_;
  View<Q> q_;
  Index q_offset_ = 0;  // position of query row 0 in the current run
  Index rows_;          // rows of one KV group: (q_heads / kv_heads) * q_len
  Index dv_pad_;        // value_dim rounded up to whole vectors
  Index q_vectors_;     // vectors of a query row kept in registers (2, 4 or 8), else 0
  Index groups_;        // KV groups held at once
  // Scratch of one thread, carved once, per group held:
  Scratch scratch_;
  float* qr_all_;   // [groups, rows, D]        the queries, turned and scaled
  float* acc_all_;  // [groups, rows, dv_pad]   output accumulators
  float* m_all_;    // [groups, rows]           running max logit
  float* l_all_;    // [groups, rows, kWidth]   running sum of exp(s - m), per lane
  // The slices of the selected group:
  float* qr_ = nullptr;
  float* acc_ = nullptr;
  float* m_ = nullptr;
  float* l_ = nullptr;
  Block blk_;              // the block in hand (its logits in the scratch)
  float w_[kBlock];        // a Partial row's visible weights
  const V* vrow_[kBlock];  // and their value rows

  std::vector<char> seen_all_;  // [groups, rows] whether the row saw a visible key
  char* seen_ = nullptr;        // the selected group's
};

}  // namespace attnkit::detail
