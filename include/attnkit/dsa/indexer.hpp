// indexer_topk(): DeepSeek Sparse Attention's lightning indexer and its top-k selection
// (DeepSeek-V3.2, GLM-5; transformers' deepseek_v32): for query t and every key s it sees,
//   I(t, s) = sum_j w(t, j) ReLU(q_I(t, j) . k_I(s))
// over the indexer heads j (w: the caller's weights, any scale folded in), and keeps the k
// keys of the highest I (on equal scores the lower key) in increasing key order, -1 past the
// keys a query sees. The [Lq, Lk] score matrix is never stored whole: per block of up to 16
// queries, tiles of keys go through the tile GEMM ([queries x heads, keys], against k_I
// transposed once per call) and the heads' weighted ReLU sum into the block's rows of scores,
// from which select_topk() (dsa/topk_select.hpp, a radix select) keeps each query's k. Work
// items are (batch, block of queries); a decode call (fewer blocks than threads) cuts the
// keys into parts. The selection is exact, the same for any thread count. Products::Int8
// scores int8 rows instead (dsa/indexer_int8.hpp), every key packed once a call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/dsa/indexer_checks.hpp"
#include "attnkit/dsa/indexer_int8.hpp"
#include "attnkit/dsa/topk_select.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/options.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/simd/transpose.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {

namespace detail {

/// One worker of indexer_topk(): a block of queries at a time.
template <class QI, class KI>
class IndexerBlocks {
 public:
  static constexpr Index kKeys = 256;  // keys per tile (columns of the GEMM)

  IndexerBlocks(const IndexerShape& s, const View<QI>& q, const View<const float>& w,
                const std::vector<float>& kt, const Int8Keys& k8,
                const View<std::int32_t>& selected, bool own_rows)
      : s_(s),
        q_(q),
        w_(w),
        kt_(kt),
        k8_(k8),
        selected_(selected),
        a_(std::size_t(s.block * s.heads * s.ldd)),
        scores_(std::size_t(simd::round_up(s.block * s.heads) * kKeys)),
        weights_(std::size_t(s.block * s.heads)),
        rows_(own_rows ? std::size_t(s.block * s.k_len_pad) : 0) {}

  /// With keys as rows (no kt: decode): set k, whose rows each tile packs.
  void keys_as_rows(const View<KI>& k) {
    k_ = k;
    const Index nh = simd::round_up(s_.block * s_.heads);
    qt_.assign(std::size_t(s_.ldd * nh), 0.f);
    tile_.resize(std::size_t(kKeys * s_.ldd));
    c_.resize(std::size_t(kKeys * nh));
  }

  /// The scores of the queries of `block` (batch b) for the keys of part `part` of `parts`
  /// (whole tiles) into rows (row r: query r of the block, key s at s; null: the worker's
  /// own), and with one part the selection.
  void run(Index b, Index block, Index part, Index parts, float* rows) {
    const IndexerShape& s = s_;
    const Index H = s.heads, t0 = block * s.block, n = std::min(s.block, s.q_len - t0);
    if (rows == nullptr) rows = rows_.data();
    for (Index r = 0; r < n; ++r)
      for (Index j = 0; j < H; ++j) {
        pack_rows(q_, b, j, t0 + r, 1, a_.data() + (r * H + j) * s.ldd, s.ldd);
        weights_[std::size_t(r * H + j)] = w_.row(b, j, t0 + r)[0];
      }
    const Index end = seen(t0 + n - 1);  // the keys the block's last query sees
    const Index per = (end / parts + kKeys - 1) / kKeys * kKeys;  // keys a part, whole tiles
    const Index lo = std::min(end, part * per);
    const Index hi = part + 1 == parts ? end : std::min(end, lo + per);
    const float* kt = kt_.empty() ? nullptr : kt_.data() + b * s.ldkt * s.ldd;  // [Di, ldkt]
    const Index nh = simd::round_up(n * H);
    if (!qt_.empty())  // keys as rows: qt_ [ldd, nh] = the queries' heads transposed
      for (Index i = 0; i < n * H; ++i)
        for (Index c = 0; c < s.ldd; ++c)
          qt_[std::size_t(c * nh + i)] = a_[std::size_t(i * s.ldd + c)];
    const bool int8 = !k8_.packed.empty();
    if (int8) q8_.set(a_.data(), n * H, s.ldd, s.dim, k8_.d4);
    for (Index s0 = lo; s0 < hi; s0 += kKeys) {
      const Index cols = std::min(kKeys, hi - s0), padded = simd::round_up(cols);
      if (int8) {  // Products::Int8 (dsa/indexer_int8.hpp): whole groups of 16 keys
        int8_scores(q8_, n * H, k8_, b, s0 / kInt8Group, (cols + kInt8Group - 1) / kInt8Group,
                    scores_.data(), kKeys);
      } else if (qt_.empty()) {
        gemm::gemm(n * H, padded, s.dim, {a_.data(), s.ldd, 1}, kt + s0, s.ldkt, scores_.data(),
                   kKeys, false);
      } else {  // C [keys, heads] = K_tile Q^T, then transposed to scores_ [heads, keys]: the
                // same products in the same order, so the same bits
        for (Index r = 0; r < padded; ++r) {
          float* row = tile_.data() + r * s.ldd;
          if (r < cols)
            pack_rows(k_, b, 0, s0 + r, 1, row, s.ldd);
          else
            std::fill(row, row + s.ldd, 0.f);
        }
        gemm::gemm(padded, nh, s.dim, {tile_.data(), s.ldd, 1}, qt_.data(), nh, c_.data(), nh,
                   false);
        for (Index r = 0; r < padded; r += simd::kWidth)
          for (Index i = 0; i < nh; i += simd::kWidth)
            simd::transpose_block(c_.data() + r * nh + i, nh, scores_.data() + i * kKeys + r,
                                  kKeys);
      }
      for (Index r = 0; r < n; ++r)
        if (seen(t0 + r) > s0) head_sum(r, padded, rows + r * s.k_len_pad + s0);
    }
    if (parts == 1) select(b, t0, n, rows);
  }

  /// The selection of the n queries from t0 (batch b) from their rows of scores.
  void select(Index b, Index t0, Index n, const float* rows) {
    for (Index r = 0; r < n; ++r)
      select_topk(rows + r * s_.k_len_pad, seen(t0 + r), s_.topk, selected_.row(b, 0, t0 + r),
                  bits_, candidates_);
  }

 private:
  // The keys query t sees: [0, seen).
  Index seen(Index t) const {
    return s_.causal ? std::clamp<Index>(t + s_.offset + 1, 0, s_.k_len) : s_.k_len;
  }

  // out[0, cols) = sum_j w_j ReLU(scores row (r, j)), the heads in order.
  void head_sum(Index r, Index cols, float* out) {
    using simd::Vec;
    const Index H = s_.heads;
    const Vec zero(0.f);
    for (Index c = 0; c < cols; c += simd::kWidth) {
      Vec acc(0.f);
      for (Index j = 0; j < H; ++j) {
        const Vec x = simd::load(scores_.data() + (r * H + j) * kKeys + c);
        acc = simd::fma(simd::max(x, zero), Vec(weights_[std::size_t(r * H + j)]), acc);
      }
      simd::store(out + c, acc);
    }
  }

  IndexerShape s_;
  View<QI> q_;
  View<const float> w_;
  const std::vector<float>& kt_;
  const Int8Keys& k8_;  // Products::Int8: k_I packed (else empty)
  Int8Queries q8_;
  View<std::int32_t> selected_;
  View<KI> k_;  // keys as rows (decode)
  std::vector<float> a_, scores_, weights_, rows_, qt_, tile_, c_;
  std::vector<std::uint32_t> bits_;
  std::vector<Index> candidates_;
};

// kt[b] = k_I of batch b transposed, [Di, ldkt] (zero past k_len), tiles of keys in
// parallel.
template <class KI>
std::vector<float> transposed_keys(const IndexerShape& s, const View<KI>& k, int threads) {
  std::vector<float> kt(std::size_t(s.batch * s.ldkt * s.ldd), 0.f);
  const Index W = simd::kWidth, tiles = s.k_len_pad / W;
  parallel_for(threads, s.batch * tiles, 16, [&](Index item) {
    const Index b = item / tiles, s0 = item % tiles * W;
    std::vector<float> rows(std::size_t(W * s.ldd));
    float* tile = rows.data();
    for (Index r = 0; r < W; ++r) {
      float* row = tile + r * s.ldd;
      if (s0 + r < s.k_len)
        pack_rows(k, b, 0, s0 + r, 1, row, s.ldd);
      else
        std::fill(row, row + s.ldd, 0.f);
    }
    float* dst = kt.data() + b * s.ldkt * s.ldd;
    for (Index c = 0; c < s.ldd; c += W)
      simd::transpose_block(tile + c, s.ldd, dst + c * s.ldkt + s0, s.ldkt);
  });
  return kt;
}

}  // namespace detail

/// Whether indexer_topk() takes int8 products when asked (Products::Int8) in this build: with
/// AVX-512 VNNI; elsewhere the request runs f32 products.
inline constexpr bool kIndexerInt8 = detail::kInt8Indexer;

/// The indexer's selection: for each query of q_I [B, Hi, Lq, Di] (Hi indexer heads) with
/// weights w [B, Hi, Lq, 1] (f32), the spec.topk keys of k_I [B, 1, Lk, Di] with the highest
/// sum_j w(t, j) ReLU(q_I(t, j) . k_I(s)), written as increasing key indices into selected
/// [B, 1, Lq, topk] (int32; -1 past the keys a query sees). Causal: query t sees keys
/// s <= t + options.q_offset (default Lk - Lq). q_I and k_I in f32, bf16 or f16; f32
/// products, or with options.products = Products::Int8 (calls of 64 queries or more, builds
/// with AVX-512 VNNI) int8 rows with a scale each and exact integer sums
/// (dsa/indexer_int8.hpp: the selection of the quantized inputs; Bf16 runs f32). Throws Error
/// before writing anything on bad input (shapes, topk < 1, values that are not finite, a selection
/// sharing memory with an input).
template <class QI, class KI>
void indexer_topk(const IndexerSpec& spec, const View<QI>& q, const View<const float>& w,
                  const View<KI>& k, const View<std::int32_t>& selected,
                  const Options& options = {}) {
  const detail::IndexerShape s = detail::check_indexer(spec, q, w, k, selected, options);
  if (s.batch * s.q_len == 0) return;
  const int threads = detail::thread_count(options.threads);
  const Index blocks = (s.q_len + s.block - 1) / s.block, rows = s.batch * blocks;
  // Fewer query blocks than threads (decode): each tile packs its keys as GEMM rows, rather
  // than the call transposing every key for blocks that would read each once. Int8 products
  // (calls of 64 queries or more) quantize and pack every key once a call, whatever the
  // thread count (a thread-count choice of path must not change the scores).
  const bool int8 = detail::kInt8Indexer && options.products == Products::Int8 &&
                    s.batch * s.q_len >= detail::kInt8MinQueries;
  const bool decode = rows < threads && !int8;
  const std::vector<float> kt =
      decode || int8 ? std::vector<float>{} : detail::transposed_keys(s, k, threads);
  const detail::Int8Keys k8 = int8 ? detail::pack_int8_keys(s, k, threads) : detail::Int8Keys{};
  // Fewer blocks than threads (decode): each block's keys in parts into shared rows of
  // scores, selected after.
  using Engine = detail::IndexerBlocks<QI, KI>;
  const Index parts =
      rows >= threads ? 1 : std::clamp<Index>(threads / rows, 1, s.k_len / (4 * Engine::kKeys) + 1);
  std::vector<float> shared(std::size_t(parts > 1 ? rows * s.block * s.k_len_pad : 0));
  detail::Workers<Engine> workers(detail::threads_for(options.threads, rows * parts), s, q, w, kt,
                                  k8, selected, parts == 1);
  if (decode)
    for (std::size_t i = 0; i < workers.size(); ++i) workers[i].keys_as_rows(k);
  // The last blocks see the most keys: hand them out first.
  detail::for_each_item(workers, rows * parts, [&](Engine& mine, Index item) {
    const Index i = rows * parts - 1 - item, row = i / parts;
    mine.run(row % s.batch, row / s.batch, i % parts, parts,
             parts > 1 ? shared.data() + row * s.block * s.k_len_pad : nullptr);
  });
  if (parts == 1) return;
  detail::for_each_item(workers, rows, [&](Engine& mine, Index row) {
    const Index t0 = row / s.batch * s.block;
    mine.select(row % s.batch, t0, std::min(s.block, s.q_len - t0),
                shared.data() + row * s.block * s.k_len_pad);
  });
}

}  // namespace attnkit
