// The block math of the softmax row engine (kernel/decode/decode_rows.hpp): one block's logits with
// the keys in the SIMD lanes, the online softmax over them, the weighted sum of its value
// rows and the rows' final scaling. None of it depends on the spec (mask, score mod and
// position stay in DecodeRows), only on the storage of K and V: DecodeRowMath<K, V> is
// compiled once per storage pair, however many specs a program decodes with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/prefetch.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace Eigen {  // the storage types, declared: a program that stores them includes Eigen
struct bfloat16;
struct half;
}  // namespace Eigen

namespace attnkit::detail {

/// Keys a DecodeRows block holds (K and V of one block stay in L1 across the group's rows).
inline constexpr Index kDecodeBlock = 16;
/// One row's logits of a block, padded to whole vectors.
inline constexpr Index kDecodeLogitsPad = simd::round_up(kDecodeBlock);

/// The row engine's arithmetic for K rows of storage K and V rows of storage V, for rows of
/// head dim d and value dim dv (accumulators dv_pad apart). Query rows are f32, turned and
/// scaled; with bf16 K they are stored in load_bf16_pair()'s order (split_row()).
template <class K, class V>
struct DecodeRowMath {
  static constexpr Index kW = simd::kWidth;
  static constexpr Index kSPad = kDecodeLogitsPad;
  static constexpr Index kSlab = 8;  // value vectors accumulated in registers at a time
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // bf16 K / V rows are widened two vectors at a time (simd::load_bf16_pair(): a shift and
  // an AND, where one vector at a time takes a lane-crossing widen and a shift), in its
  // order: the queries kept in registers are stored in that order (split_row()), and so are
  // the value accumulators' whole pairs of vectors (finish_row() puts them back in place). A
  // dot product or an elementwise sum does not care about the order of its elements.
  static constexpr bool kPairsK = std::is_same_v<std::remove_const_t<K>, Eigen::bfloat16>;
  static constexpr bool kPairsV = std::is_same_v<std::remove_const_t<V>, Eigen::bfloat16>;
  // Quantized K / V rows (storage/blocks.hpp): kPer vectors a block (kW divides 32). One row
  // scales each block's products once (K: the block's partial dot product; V: the weight);
  // rows that share a load dequantize it (one multiply a vector, shared: cheaper than a
  // scaled partial sum or weight for each row, and the f16 scale converted once).
  static constexpr bool kBlocksK = is_block_quantized<K>(), kBlocksV = is_block_quantized<V>();
  static constexpr int kPer = int(kQuantBlock >= kW ? kQuantBlock / kW : 1);

  Index d, dv, dv_pad, q_vectors;

  DecodeRowMath(Index head_dim, Index value_dim)
      : d(head_dim),
        dv(value_dim),
        dv_pad(simd::round_up(value_dim)),
        q_vectors(queries_in_registers(head_dim)) {}

  // Vectors of one query row when it is 2, 4 or 8 whole vectors (kept in registers), else 0.
  static Index queries_in_registers(Index head_dim) {
    const Index n = head_dim % kW == 0 ? head_dim / kW : 0;
    return n == 2 || n == 4 || n == 8 ? n : 0;
  }

  /// A scaled query row as logits() reads it: in load_bf16_pair()'s order for bf16 K.
  void prepare_query(float* row) const {
    if (!kPairsK || q_vectors == 0) return;
    float pair[2 * kW];
    for (Index c = 0; c + 2 * kW <= d; c += 2 * kW) {
      simd::split_pairs(row + c, pair);
      std::copy(pair, pair + 2 * kW, row + c);
    }
  }

  /// out rows 0 .. R - 1 (kSPad apart) = the nk key rows at `keys` (widened in registers) .
  /// the R query rows at q (d apart). With whole vectors of 2, 4 or 8 the queries stay in
  /// registers (q_vectors); otherwise they are loaded from L1 (any head dim: 256 and 512 on
  /// AVX-512), each key vector widened once for the R rows. Each key row read asks for the
  /// one `ahead` on (RowsAhead, detail/prefetch.hpp).
  template <int R>
  void logits(const float* q, const K* keys, Index ld, Index nk, float* out,
              const RowsAhead& ahead) const {
    switch (q_vectors) {
      case 8:
        return logits_in_registers<R, 8>(q, keys, ld, nk, out, ahead);
      case 4:
        return logits_in_registers<R, 4>(q, keys, ld, nk, out, ahead);
      case 2:
        return logits_in_registers<R, 2>(q, keys, ld, nk, out, ahead);
      default:
        break;
    }
    logits_any<R>(q, keys, ld, nk, out, ahead);
  }

  /// Online softmax of one row over the logits s[0, lanes) (masked = -inf), as
  /// Softmax::absorb: subtract the max first, exp2 with log2(e) folded in. The logits become
  /// weights; m is the row's running max, l its running sum lane by lane (one horizontal add,
  /// at the end), acc its accumulators, rescaled when the max moves. A +inf or NaN logit
  /// gives NaN weights and the row stays NaN; a row with nothing visible yet keeps m = -inf
  /// and gets weights exp2(-inf) = 0.
  void absorb(float* s, Index lanes, float& m, float* l, float* acc) const {
    simd::Vec top(kNegInf);
    for (Index j = 0; j < lanes; j += kW) top = simd::max(top, simd::load(s + j));
    float m_new = m;  // the horizontal max only when some logit passes the running max
    if (simd::any(simd::greater(top, simd::Vec(m_new))))
      m_new = std::max(m_new, simd::reduce_max(top));
    const simd::Vec log2e(Softmax::kLog2e), m_v(m_new == kNegInf ? 0.f : m_new);
    simd::Vec sum(0.f);
    for (Index j = 0; j < lanes; j += kW) {
      const simd::Vec w = simd::exp2((simd::load(s + j) - m_v) * log2e);
      simd::store(s + j, w);
      sum = sum + w;
    }
    if (m_new != m) {
      const float alpha = std::exp2((m - m_new) * Softmax::kLog2e);  // exp2(-inf) = 0
      simd::store(l, simd::load(l) * simd::Vec(alpha));
      const simd::Vec f(alpha);
      for (Index c = 0; c < dv_pad; c += kW) simd::store(acc + c, simd::load(acc + c) * f);
      m = m_new;
    }
    simd::store(l, simd::load(l) + sum);
  }

  /// Rows 0 .. R - 1 (accumulators at acc, dv_pad apart) += sum over j < n of w[x][j] *
  /// rows[j], in register slabs of up to slab_width<R>() vectors per row; the first slab asks
  /// for each value row's successor `ahead` on.
  template <int R>
  void weighted_values(Index n, const float* const* w, const V* const* rows, float* acc,
                       const RowsAhead& ahead) const {
    constexpr int kWide = slab_width<R>();
    const Index whole = dv / kW * kW;
    for (Index c0 = 0; c0 < whole; c0 += kWide * kW)
      slab_of<R, kWide>(std::min<Index>(kWide, (whole - c0) / kW), n, w, rows, acc, c0,
                        c0 == 0 ? ahead : RowsAhead{});
    for (Index x = 0; x < R; ++x)
      for (Index j = 0; j < n; ++j)
        for (Index c = whole; c < dv; ++c) acc[x * dv_pad + c] += w[x][j] * value_at(rows[j], c);
  }

  /// One row's partial output o[0, dv) = acc / l (0 for a row that saw no key) and its
  /// log-sum-exp m + log l (-inf for a row that saw no key).
  void finish_row(const float* acc, float m, const float* l_lanes, float* o, float* stat) const {
    const float l = simd::reduce_add(simd::load(l_lanes)), f = l == 0.f ? 0.f : 1.f / l;
    Index c = 0;
    if constexpr (kPairsV)  // whole pairs in load_bf16_pair()'s order, as slab() wrote them
      for (; c + 2 * kW <= dv; c += 2 * kW) simd::join_pairs(acc + c, f, o + c);
    for (; c < dv; ++c) o[c] = acc[c] * f;
    *stat = l == 0.f ? kNegInf : m + std::log(l);
  }

 private:
  template <int R, int NQ>
  void logits_in_registers(const float* q, const K* keys, Index ld, Index nk, float* out,
                           const RowsAhead& ahead) const {
    simd::Vec qv[std::size_t{R}][std::size_t{NQ}];  // array bounds are unsigned
    for (int x = 0; x < R; ++x)
      for (int c = 0; c < NQ; ++c) qv[x][c] = simd::load(q + x * d + c * kW);
    Index j = 0;
    for (; j + kW <= nk; j += kW) {  // kW keys at a time, one transposing add per row
      simd::Vec part[std::size_t{R}]
                    [std::size_t{kW}];  // per key: its products, summed over the lanes after
      const K* key = keys + j * ld;
      for (Index t = 0; t < kW; ++t, key += ld) {  // the rows stream in memory order
        ahead.ask_key(key);
        simd::Vec a[std::size_t{R}];
        key_dot<R, NQ>(key, qv, a);
        for (int x = 0; x < R; ++x) part[x][t] = a[x];
      }
      for (int x = 0; x < R; ++x) simd::store(out + x * kSPad + j, simd::transpose_add(part[x]));
    }
    for (; j < nk; ++j) {
      ahead.ask_key(keys + j * ld);
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
    } else if constexpr (kBlocksK && R == 1 &&
                         NQ % kPer == 0) {  // a block's products, then its scale
      for (int c0 = 0; c0 < NQ; c0 += kPer) {
        const auto& blk = key[c0 / kPer];
        simd::Vec part[std::size_t{R}];
        for (int x = 0; x < R; ++x) part[x] = simd::Vec(0.f);
        for (int c = 0; c < kPer; ++c) {
          const simd::Vec kc = block_ints(blk, c * kW);
          for (int x = 0; x < R; ++x) part[x] = simd::fma(kc, qv[x][c0 + c], part[x]);
        }
        const simd::Vec scale(block_scale(blk));
        for (int x = 0; x < R; ++x) a[x] = simd::fma(part[x], scale, a[x]);
      }
    } else {
      for (int c = 0; c < NQ; ++c) {
        const simd::Vec kc = widened_at(key, c * kW);
        for (int x = 0; x < R; ++x) a[x] = simd::fma(kc, qv[x][c], a[x]);
      }
    }
  }

  // out rows 0 .. R - 1 (kSPad apart) for R rows, any head dim: queries loaded, a scalar tail
  // past whole vectors. Each key vector is loaded (and widened) once for the R rows; a row's
  // sum is formed in the same order whatever R, so its logits have the same bits.
  template <int R>
  void logits_any(const float* q, const K* keys, Index ld, Index nk, float* out,
                  const RowsAhead& ahead) const {
    const Index whole = d / kW * kW;
    Index j = 0;
    for (; j + kW <= nk; j += kW) {
      simd::Vec part[std::size_t{R}][std::size_t{kW}];
      const K* key = keys + j * ld;
      for (Index t = 0; t < kW; ++t, key += ld) {
        ahead.ask_key(key);
        simd::Vec a0[std::size_t{R}], a1[std::size_t{R}];  // two chains hide the FMA latency
        for (int x = 0; x < R; ++x) a0[x] = a1[x] = simd::Vec(0.f);
        Index c = 0;
        for (; c + 2 * kW <= whole; c += 2 * kW) {
          const simd::Vec k0 = widened_at(key, c), k1 = widened_at(key, c + kW);
          for (int x = 0; x < R; ++x) {
            a0[x] = simd::fma(k0, simd::load(q + x * d + c), a0[x]);
            a1[x] = simd::fma(k1, simd::load(q + x * d + c + kW), a1[x]);
          }
        }
        if (c < whole) {
          const simd::Vec k0 = widened_at(key, c);
          for (int x = 0; x < R; ++x) a0[x] = simd::fma(k0, simd::load(q + x * d + c), a0[x]);
        }
        for (int x = 0; x < R; ++x) part[x][t] = a0[x] + a1[x];
      }
      for (int x = 0; x < R; ++x) simd::store(out + x * kSPad + j, simd::transpose_add(part[x]));
    }
    for (; j < nk; ++j) {
      const K* key = keys + j * ld;
      simd::Vec a0[std::size_t{R}];
      for (int x = 0; x < R; ++x) a0[x] = simd::Vec(0.f);
      for (Index c = 0; c < whole; c += kW) {
        const simd::Vec k0 = widened_at(key, c);
        for (int x = 0; x < R; ++x) a0[x] = simd::fma(k0, simd::load(q + x * d + c), a0[x]);
      }
      for (int x = 0; x < R; ++x) out[x * kSPad + j] = simd::reduce_add(a0[x]);
    }
    if (whole < d)
      for (int x = 0; x < R; ++x)
        for (j = 0; j < nk; ++j)
          for (Index c = whole; c < d; ++c)
            out[x * kSPad + j] += value_at(keys + j * ld, c) * q[x * d + c];
  }

  // Vectors per row a slab keeps in registers: 8 for one or two rows, 4 for four (16
  // accumulators, the weights and the value vector: 21 of 32 registers).
  template <int R>
  static constexpr int slab_width() {
    return R >= 4 ? 4 : int(kSlab);
  }

  // slab<R, count>() for a count <= N known only at run time.
  template <int R, int N>
  void slab_of(Index count, Index n, const float* const* w, const V* const* rows, float* acc,
               Index c0, const RowsAhead& ahead) const {
    if constexpr (N > 1)
      if (count < N) return slab_of<R, N - 1>(count, n, w, rows, acc, c0, ahead);
    slab<R, N>(n, w, rows, acc, c0, ahead);
  }

  template <int R, int N>
  void slab(Index n, const float* const* w, const V* const* rows, float* acc, Index c0,
            const RowsAhead& ahead) const {
    simd::Vec a[std::size_t{R}][std::size_t{N}];
    for (int x = 0; x < R; ++x)
      for (int t = 0; t < N; ++t) a[x][t] = simd::load(acc + x * dv_pad + c0 + t * kW);
    for (Index j = 0; j < n; ++j) {
      ahead.ask_value(rows[j]);
      simd::Vec wj[std::size_t{R}];
      for (int x = 0; x < R; ++x) wj[x] = simd::Vec(w[x][j]);
      int t = 0;
      if constexpr (kBlocksV && R == 1 && kSlab * kW % kQuantBlock == 0) {  // c0 starts a block
        // The weight takes the block's scale (one product a block, not one a vector).
        for (; t < N; t += kPer) {
          const auto& blk = rows[j][(c0 + t * kW) / kQuantBlock];
          const simd::Vec scale(block_scale(blk));
          simd::Vec ws[std::size_t{R}];
          for (int x = 0; x < R; ++x) ws[x] = wj[x] * scale;
          for (int u = 0; u < kPer && t + u < N; ++u) {
            const simd::Vec vt = block_ints(blk, u * kW);
            for (int x = 0; x < R; ++x) a[x][t + u] = simd::fma(ws[x], vt, a[x][t + u]);
          }
        }
      }
      if constexpr (kPairsV)  // c0 is a multiple of 2 kW: whole pairs in split order
        for (; t + 1 < N; t += 2) {
          simd::Vec v0, v1;
          simd::load_bf16_pair(reinterpret_cast<const std::uint16_t*>(rows[j] + c0 + t * kW), v0,
                               v1);
          for (int x = 0; x < R; ++x) a[x][t] = simd::fma(wj[x], v0, a[x][t]);
          for (int x = 0; x < R; ++x) a[x][t + 1] = simd::fma(wj[x], v1, a[x][t + 1]);
        }
      for (; t < N; ++t) {
        const simd::Vec vt = widened_at(rows[j], c0 + t * kW);
        for (int x = 0; x < R; ++x) a[x][t] = simd::fma(wj[x], vt, a[x][t]);
      }
    }
    for (int x = 0; x < R; ++x)
      for (int t = 0; t < N; ++t) simd::store(acc + x * dv_pad + c0 + t * kW, a[x][t]);
  }
};

}  // namespace attnkit::detail
