// DecodeRows: the split-KV engine for softmax rows (kernel/split_kv.hpp runs it when the spec
// allows, see kernel/decode/decode_rows_fit.hpp, for up to kDecodeRowsMaxQueries rows per head;
// paged decode runs it over pages, cache/paged_decode.hpp). One item is one KV group over one key
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
#include <optional>
#include <type_traits>
#include <vector>

#include "attnkit/detail/prefetch.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/kernel/decode/decode_int8.hpp"
#include "attnkit/kernel/decode/decode_row_math.hpp"
#include "attnkit/kernel/decode/decode_rows_fit.hpp"
#include "attnkit/kernel/tiles/query_row.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

template <class Spec, class Q, class K, class V>
class DecodeRows {
 public:
  using Math = DecodeRowMath<K, V>;
  static constexpr Index kW = simd::kWidth;
  static constexpr Index kBlock = kDecodeBlock;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  /// p: the call's sizes (batch, heads, q_len, dims, scale); key positions and the query
  /// offset come with each run. `groups`: the KV groups whose rows it can hold at once (the
  /// pieces below may then alternate between groups).
  DecodeRows(const Spec& spec, const Problem& p, const View<Q>& q, Index groups = 1)
      : spec_(spec),
        p_(p),
        q_(q),
        rows_(p.q_heads / p.kv_heads * p.q_len),
        math_(p.head_dim, p.value_dim),
        dv_pad_(math_.dv_pad),
        groups_(groups),
        int8_(int8_logits_for<K>(p)),
        q8_floats_(int8_ ? int8_->query_bytes() / Index{sizeof(float)} : 0),
        scratch_(Scratch::size_for(groups * rows_ * p.head_dim, groups * rows_ * dv_pad_,
                                   groups * rows_, groups * rows_ * kW, rows_ * kSPad,
                                   groups * rows_ * q8_floats_)),
        qr_all_(scratch_.carve(groups * rows_ * p.head_dim)),
        acc_all_(scratch_.carve(groups * rows_ * dv_pad_)),
        m_all_(scratch_.carve(groups * rows_)),
        l_all_(scratch_.carve(groups * rows_ * kW)),
        q8_all_(scratch_.carve(groups * rows_ * q8_floats_)) {
    blk_.kinds.resize(static_cast<std::size_t>(rows_));
    blk_.visible.resize(static_cast<std::size_t>(rows_ * kBlock));
    blk_.logits = scratch_.carve(rows_ * kSPad);
    seen_all_.resize(static_cast<std::size_t>(groups * rows_));
    prefetch_keys_ = decode_prefetch_keys(p.q_heads / std::max<Index>(p.kv_heads, 1),
                                          row_elements<K>(p.head_dim) * Index{sizeof(K)},
                                          std::is_same_v<std::remove_const_t<K>, float>);
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
    for (Index r = 0; r < rows_; ++r) {
      const Index h = head(g, r), i = r % p_.q_len;
      float* row = qr_ + r * p_.head_dim;
      query_row(spec_, p_, q_.row(b, h, i), RowAt{b, h, i, p_.q_len, i + q_offset, Role::Query},
                row);
      math_.prepare_query(row);  // in the order logits() reads K
      if (int8_) int8_->quantize(row, query_ints(r));
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
    const Index k_bytes = row_elements<K>(p_.head_dim) * Index{sizeof(K)};
    const Index v_bytes = row_elements<V>(p_.value_dim) * Index{sizeof(V)};
    for (Index j0 = 0; j0 < n; j0 += kBlock) {
      const Index nk = std::min(kBlock, n - j0), k0 = pos0 + j0, lanes = simd::round_up(nk);
      // The rows prefetch_keys_ on (2 blocks), asked for one by one as the first rows that
      // see this block read its K and V rows (none for a run's last blocks).
      RowsAhead ahead;
      if (prefetch_keys_ > 0 && j0 + kBlock + prefetch_keys_ <= n)
        ahead = {prefetch_keys_ * kld * Index{sizeof(K)}, k_bytes,
                 prefetch_keys_ * vld * Index{sizeof(V)}, v_bytes};
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
        // Rows that see the whole block share each K load: four (a GQA group's heads; their
        // queries then live in L1, not all in registers) or two (AVX-512 and NEON have the
        // registers for both rows' queries). Queries too wide for the registers (head dims
        // 256 and 512 on AVX-512) are loaded from L1 by every row, but the key vector is
        // still loaded and widened once: MQA at d 512, one row at a time, re-read each
        // block's K rows eight times.
        const Index shared = kPair || int8_ ? full_rows(blk, r) : 1;
        if (shared >= 4) {
          logit_rows<4>(b, g, r, block_keys, kld, k0, nk, blk, ahead);
          r += 3;
        } else if (shared >= 2) {
          logit_rows<2>(b, g, r, block_keys, kld, k0, nk, blk, ahead);
          ++r;
        } else {
          logit_rows<1>(b, g, r, block_keys, kld, k0, nk, blk, ahead);
        }
        ahead.k_offset = 0;  // asked for once
      }
      for (Index r = 0; r < rows_; ++r)
        if (blk.kind(r) != TileKind::Empty)
          math_.absorb(blk.logits + r * kSPad, lanes, m_[r], l_ + r * kW, acc_ + r * dv_pad_);
      weigh_block(blk, nk, ahead);
    }
  }

  /// Asks the memory system for n key and value rows (laid out as add_keys() takes them)
  /// that a later add_keys() will read: keys that are not one view (paged KV) prefetch their
  /// next pages with it, as add_keys() does within a run.
  void prefetch(const K* keys, Index kld, const V* values, Index vld, Index n) const {
    prefetch_rows(keys, kld, n, row_elements<K>(p_.head_dim) * Index{sizeof(K)});
    prefetch_rows(values, vld, n, row_elements<V>(p_.value_dim) * Index{sizeof(V)});
  }

  /// Keys add_keys() prefetches ahead of the block it computes, where it prefetches
  /// (decode_prefetch_keys(), detail/prefetch.hpp: chosen per CPU).
  static constexpr Index kPrefetchKeys = kDecodePrefetchAhead;
  static_assert(kPrefetchKeys % kDecodeBlock == 0, "whole blocks ahead");

  /// The rows' partial outputs acc / l (0 for a row that saw no key, NaN for one that saw
  /// keys whose logits were all -inf: f32 products that overflowed) and log-sum-exps.
  void finish(Index g, float* out, float* stat) {
    select(g);
    for (Index r = 0; r < rows_; ++r) {
      float* o = out + r * p_.value_dim;
      math_.finish_row(acc_ + r * dv_pad_, m_[r], l_ + r * kW, o, stat + r);
      if (seen_[r] && stat[r] == kNegInf)  // l = 0 though it saw keys: their logits were -inf
        std::fill(o, o + p_.value_dim, std::numeric_limits<float>::quiet_NaN());
    }
  }

 private:
  static constexpr bool kPair = simd::kRegisters >= 32;
  // Software prefetch of the K and V rows kPrefetchKeys ahead, on the CPUs where it pays
  // (detail/prefetch.hpp: on the Intel Xeon the hardware's stream prefetchers alone left decode
  // waiting on memory between blocks; on AMD Zen 4 the same prefetch made decode 1.6-1.9x
  // slower). Read once per engine: 0 (none) or kPrefetchKeys.
  Index prefetch_keys_ = 0;  // set in the constructor, once the Problem is bound

  // The state the next steps work on: group g's slice (the only one when groups_ = 1).
  void select(Index g) {
    const Index at = groups_ == 1 ? 0 : g;
    qr_ = qr_all_ + at * rows_ * p_.head_dim;
    acc_ = acc_all_ + at * rows_ * dv_pad_;
    m_ = m_all_ + at * rows_;
    l_ = l_all_ + at * rows_ * kW;
    q8_ = q8_all_ + at * rows_ * q8_floats_;
    seen_ = seen_all_.data() + at * rows_;
  }

  // Row r's int8 query (Products::Int8 over quantized K: kernel/decode/decode_int8.hpp).
  std::byte* query_ints(Index r) const {
    return reinterpret_cast<std::byte*>(q8_ + r * q8_floats_);
  }

  static constexpr Index kSPad = kDecodeLogitsPad;  // one row's logits in the block

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
                  Block& blk, const RowsAhead& ahead) {
    const Index lanes = simd::round_up(nk);
    float* out = blk.logits + r0 * kSPad;
    if (int8_logits_apply<K>() && int8_)
      int8_->template logits<R>(query_ints(r0), keys, kld, nk, out, kSPad, ahead);
    else
      math_.template logits<R>(qr_ + r0 * p_.head_dim, keys, kld, nk, out, ahead);
    for (Index x = 0; x < R; ++x) {
      const Index r = r0 + x, h = head(g, r), i = query_position(r);
      float* s = blk.logits + r * kSPad;
      if constexpr (has_apply_tile<typename Spec::Score>::value)  // position-free: keys in lanes
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

  // How many rows from r on (up to 4) see the whole block.
  Index full_rows(const Block& blk, Index r) const {
    Index n = 0;
    while (n < 4 && r + n < rows_ && blk.kind(r + n) == TileKind::Full) ++n;
    return n;
  }

  // acc += the block's weights times its nk value rows, for every row that sees some key;
  // four or two rows that see the whole block share each V load. The first rows ask for the
  // value rows `ahead`.
  void weigh_block(const Block& blk, Index nk, RowsAhead ahead) {
    for (Index r = 0; r < rows_; ++r) {
      const TileKind kind = blk.kind(r);
      if (kind == TileKind::Empty) continue;
      const float* weights[4];
      for (Index x = 0; x < 4; ++x) weights[x] = blk.logits + std::min(r + x, rows_ - 1) * kSPad;
      if (kind == TileKind::Full) {
        const Index shared = kPair ? full_rows(blk, r) : 1;
        if (shared >= 4) {
          math_.template weighted_values<4>(nk, weights, blk.values, acc_ + r * dv_pad_, ahead);
          r += 3;
        } else if (shared >= 2) {
          math_.template weighted_values<2>(nk, weights, blk.values, acc_ + r * dv_pad_, ahead);
          ++r;
        } else {
          math_.template weighted_values<1>(nk, weights, blk.values, acc_ + r * dv_pad_, ahead);
        }
        ahead.v_offset = 0;  // asked for once
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
      math_.template weighted_values<1>(n, weights, vrow_, acc_ + r * dv_pad_, ahead);
      ahead.v_offset = 0;
    }
  }

  const Spec& spec_;
  const Problem& p_;
  View<Q> q_;
  Index q_offset_ = 0;                 // position of query row 0 in the current run
  Index rows_;                         // rows of one KV group: (q_heads / kv_heads) * q_len
  Math math_;                          // the block math (head and value dims, queries in registers)
  Index dv_pad_;                       // value_dim rounded up to whole vectors
  Index groups_;                       // KV groups held at once
  std::optional<Int8Logits<K>> int8_;  // Products::Int8 over q8_0 / q4_0 K (else empty)
  Index q8_floats_;                    // one int8 query row's bytes, in floats (0 without int8_)
  // Scratch of one thread, carved once, per group held:
  Scratch scratch_;
  float* qr_all_;   // [groups, rows, D]        the queries, turned and scaled
  float* acc_all_;  // [groups, rows, dv_pad]   output accumulators
  float* m_all_;    // [groups, rows]           running max logit
  float* l_all_;    // [groups, rows, kWidth]   running sum of exp(s - m), per lane
  float* q8_all_;   // [groups, rows, q8_floats] the int8 queries (Products::Int8)
  // The slices of the selected group:
  float* qr_ = nullptr;
  float* acc_ = nullptr;
  float* m_ = nullptr;
  float* l_ = nullptr;
  float* q8_ = nullptr;
  Block blk_;              // the block in hand (its logits in the scratch)
  float w_[kBlock];        // a Partial row's visible weights
  const V* vrow_[kBlock];  // and their value rows

  std::vector<char> seen_all_;  // [groups, rows] whether the row saw a visible key
  char* seen_ = nullptr;        // the selected group's
};

}  // namespace attnkit::detail
