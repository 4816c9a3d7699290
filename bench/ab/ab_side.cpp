// One side of the alternating comparison (scripts/ab_compare.sh): compiled twice, once
// against each tree's headers, with -Dattnkit=attnkit_<side> -DAB_SIDE=ab_<side>, so both
// builds of every inline function live in one process. Each side owns its buffers, filled
// from the same seed (both sides read the same values), and times one call of a row.
#include <Eigen/Core>
#include <attnkit/attnkit.hpp>
// Older trees lack some entry points: their rows are skipped (the _supports() answer).
#if __has_include(<attnkit/kernel/attention_backward.hpp>)
#define AB_HAS_BACKWARD 1
#else
#define AB_HAS_BACKWARD 0
#endif
#if __has_include(<attnkit/gemm/tile_gemm_bf16.hpp>)
#define AB_HAS_BF16 1
#else
#define AB_HAS_BF16 0
#endif
#if __has_include(<attnkit/storage/quantize.hpp>)
#include <attnkit/storage/quantize.hpp>
#define AB_HAS_Q8 1
#elif __has_include(<attnkit/quant/quantize.hpp>)  // trees before storage/
#include <attnkit/quant/quantize.hpp>
#define AB_HAS_Q8 1
#else
#define AB_HAS_Q8 0
#endif
#if __has_include( \
    <attnkit/kernel/decode/decode_int8.hpp>) || __has_include(<attnkit/kernel/decode_int8.hpp>)
#define AB_HAS_INT8 1
#else
#define AB_HAS_INT8 0
#endif
#if __has_include(<attnkit/dsa/topk_backward.hpp>)
#include <attnkit/dsa/topk_attention.hpp>
#include <attnkit/dsa/topk_backward.hpp>
#define AB_HAS_DSA 1
#else
#define AB_HAS_DSA 0
#endif
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "ab_rows.hpp"

namespace {

namespace ak = attnkit;
using ak::Index;

// Values in [-1, 1) from a 64-bit LCG: the same on both sides.
void fill(float* x, std::size_t n, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x[i] = float(double(s >> 40) / double(1ULL << 23) - 1.0);
  }
}

struct Buffers {
  const ab::Row* row = nullptr;
  std::vector<float> q, o, d_o, dq, dk, dv, lse, kf, vf;
  std::vector<std::int32_t> selected;  // Sparse rows: [q_len, topk], each row ascending
  std::vector<Eigen::bfloat16> kb, vb;
  std::vector<Eigen::half> kh, vh;
#if AB_HAS_Q8
  std::vector<ak::BlockQ8_0> kq, vq;
  std::vector<ak::BlockQ4_0> k4, v4;
#endif
};
std::unique_ptr<Buffers> buffers;

template <class T>
std::vector<T> converted(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = T(x[i]);
  return out;
}

#if AB_HAS_Q8
template <class Block>
std::vector<Block> quantized(const std::vector<float>& x, Index dim) {
  std::vector<Block> out(x.size() / 32);
  for (std::size_t r = 0; r < x.size() / std::size_t(dim); ++r)
    ak::quantize_row(x.data() + r * std::size_t(dim), dim, out.data() + r * std::size_t(dim / 32));
  return out;
}
#endif

template <class Mask, class K>
void run(const ab::Row& r, const Mask& mask, const K* k, const K* v, Buffers& b) {
  const auto q = ak::bhsd(static_cast<const float*>(b.q.data()), 1, r.heads, r.q_len, r.dim);
  const auto kv = ak::bhsd(k, 1, r.kv_heads, r.kv_len, r.dim);
  const auto vv = ak::bhsd(v, 1, r.kv_heads, r.kv_len, r.dim);
  const auto o = ak::bhsd(b.o.data(), 1, r.heads, r.q_len, r.dim);
  const auto spec = ak::make_spec(mask);
  ak::Options options = ak::Options{}.with_threads(r.threads);
#if __has_include(<attnkit/core/span.hpp>) || __has_include(<attnkit/span.hpp>)
  options = options.with_lse(b.lse);
#else
  options = options.with_lse(b.lse.data());
#endif
#if AB_HAS_BF16
  if (r.products == ab::Products::Bf16) options = options.with_products(ak::Products::Bf16);
#endif
#if AB_HAS_INT8 && !defined(AB_EXACT_PRODUCTS)  // a side forced exact: --a-cxxflags
  if (r.products == ab::Products::Int8) options = options.with_products(ak::Products::Int8);
#endif
  if (r.kind != ab::Kind::Backward) return ak::attention(spec, q, kv, vv, o, options);
#if AB_HAS_BACKWARD
  if constexpr (std::is_same_v<K, float>)
    ak::attention_backward(
        spec, q, kv, vv,
        ak::bhsd(static_cast<const float*>(b.o.data()), 1, r.heads, r.q_len, r.dim),
        ak::bhsd(static_cast<const float*>(b.d_o.data()), 1, r.heads, r.q_len, r.dim),
        ak::bhsd(b.dq.data(), 1, r.heads, r.q_len, r.dim),
        ak::bhsd(b.dk.data(), 1, r.kv_heads, r.kv_len, r.dim),
        ak::bhsd(b.dv.data(), 1, r.kv_heads, r.kv_len, r.dim), options);
#endif
}

template <class Mask>
void run_storage(const ab::Row& r, const Mask& mask, Buffers& b) {
  switch (r.kv) {
    case ab::Storage::F32:
      return run(r, mask, b.kf.data(), b.vf.data(), b);
    case ab::Storage::Bf16:
      return run(r, mask, b.kb.data(), b.vb.data(), b);
    case ab::Storage::F16:
      return run(r, mask, b.kh.data(), b.vh.data(), b);
#if AB_HAS_Q8
    case ab::Storage::Q8_0:
      return run(r, mask, b.kq.data(), b.vq.data(), b);
    case ab::Storage::Q4_0:
      return run(r, mask, b.k4.data(), b.v4.data(), b);
#else
    case ab::Storage::Q8_0:
    case ab::Storage::Q4_0:
      return;
#endif
  }
}

#if AB_HAS_DSA
void run_sparse(const ab::Row& r, Buffers& b) {
  const auto q = ak::bhsd(static_cast<const float*>(b.q.data()), 1, r.heads, r.q_len, r.dim);
  const auto k = ak::bhsd(static_cast<const float*>(b.kf.data()), 1, r.kv_heads, r.kv_len, r.dim);
  const auto v = ak::bhsd(static_cast<const float*>(b.vf.data()), 1, r.kv_heads, r.kv_len, r.dim);
  const ak::TopkKeys keys{
      ak::bhsd(static_cast<const std::int32_t*>(b.selected.data()), 1, 1, r.q_len, r.topk)};
  const auto options = ak::Options{}.with_threads(r.threads).with_lse(b.lse);
  if (r.kind == ab::Kind::Sparse)
    return ak::topk_attention(ak::make_spec(), q, k, v,
                              ak::bhsd(b.o.data(), 1, r.heads, r.q_len, r.dim), keys, options);
  ak::topk_attention_backward(
      ak::make_spec(), q, k, v,
      ak::bhsd(static_cast<const float*>(b.o.data()), 1, r.heads, r.q_len, r.dim),
      ak::bhsd(static_cast<const float*>(b.d_o.data()), 1, r.heads, r.q_len, r.dim),
      ak::bhsd(b.dq.data(), 1, r.heads, r.q_len, r.dim),
      ak::bhsd(b.dk.data(), 1, r.kv_heads, r.kv_len, r.dim),
      ak::bhsd(b.dv.data(), 1, r.kv_heads, r.kv_len, r.dim), keys, options);
}

// Each query's topk keys among those it sees (causal, the last q_len of kv_len), ascending.
std::vector<std::int32_t> selection(const ab::Row& r) {
  std::vector<std::int32_t> out(std::size_t(r.q_len * r.topk)), pool;
  std::uint64_t s = 7;
  for (long t = 0; t < r.q_len; ++t) {
    pool.resize(std::size_t(r.kv_len - r.q_len + t + 1));
    for (std::size_t j = 0; j < pool.size(); ++j) pool[j] = std::int32_t(j);
    for (long i = 0; i < r.topk; ++i) {  // a partial Fisher-Yates draw
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      const std::size_t pick =
          std::size_t(i) + std::size_t((s >> 33) % (pool.size() - std::size_t(i)));
      std::swap(pool[std::size_t(i)], pool[pick]);
    }
    std::sort(pool.begin(), pool.begin() + r.topk);
    std::copy_n(pool.begin(), r.topk, out.begin() + t * r.topk);
  }
  return out;
}
#endif

void call(Buffers& b) {
  const ab::Row& r = *b.row;
#if AB_HAS_DSA
  if (r.kind == ab::Kind::Sparse || r.kind == ab::Kind::SparseBackward) return run_sparse(r, b);
#endif
  switch (r.mask) {
    case ab::MaskKind::Full:
      return run_storage(r, ak::Full{}, b);
    case ab::MaskKind::Causal:
      return run_storage(r, ak::Causal{}, b);
    case ab::MaskKind::Window:
      return run_storage(r, ak::Causal{} & ak::SlidingWindow{255, 0}, b);
  }
}

}  // namespace

void AB_CAT(AB_SIDE, _setup)(int index) {
#ifdef AB_DECODE_PREFETCH  // a side's forced decode prefetch (Off, Ahead): --a-cxxflags
  ak::decode_prefetch() = ak::DecodePrefetch::AB_DECODE_PREFETCH;
#endif
  buffers = std::make_unique<Buffers>();
  Buffers& b = *buffers;
  const ab::Row& r = ab::kRows[index];
  b.row = &r;
  const auto n = [](long a, long c, long d) {
    return std::size_t(a) * std::size_t(c) * std::size_t(d);
  };
  b.q.resize(n(r.heads, r.q_len, r.dim));
  fill(b.q.data(), b.q.size(), 1);
  b.o.assign(b.q.size(), 0.f);
  b.lse.assign(std::size_t(r.heads * r.q_len), 0.f);
  std::vector<float> k(n(r.kv_heads, r.kv_len, r.dim)), v(k.size());
  fill(k.data(), k.size(), 2);
  fill(v.data(), v.size(), 3);
  switch (r.kv) {
    case ab::Storage::F32:
      b.kf = std::move(k), b.vf = std::move(v);
      break;
    case ab::Storage::Bf16:
      b.kb = converted<Eigen::bfloat16>(k), b.vb = converted<Eigen::bfloat16>(v);
      break;
    case ab::Storage::F16:
      b.kh = converted<Eigen::half>(k), b.vh = converted<Eigen::half>(v);
      break;
    case ab::Storage::Q8_0:
#if AB_HAS_Q8
      b.kq = quantized<ak::BlockQ8_0>(k, r.dim), b.vq = quantized<ak::BlockQ8_0>(v, r.dim);
#endif
      break;
    case ab::Storage::Q4_0:
#if AB_HAS_Q8
      b.k4 = quantized<ak::BlockQ4_0>(k, r.dim), b.v4 = quantized<ak::BlockQ4_0>(v, r.dim);
#endif
      break;
  }
#if AB_HAS_DSA
  if (r.kind == ab::Kind::Sparse || r.kind == ab::Kind::SparseBackward) b.selected = selection(r);
#endif
  if (r.kind == ab::Kind::Backward || r.kind == ab::Kind::SparseBackward) {
    b.d_o.resize(b.q.size());
    fill(b.d_o.data(), b.d_o.size(), 4);
    b.dq.assign(b.q.size(), 0.f);
    b.dk.assign(n(r.kv_heads, r.kv_len, r.dim), 0.f);
    b.dv.assign(b.dk.size(), 0.f);
    ab::Row forward = r;  // o and the statistic the backward reads
    forward.kind = r.kind == ab::Kind::Backward ? ab::Kind::Prefill : ab::Kind::Sparse;
    b.row = &forward;
    call(b);
    b.row = &r;
  }
}

double AB_CAT(AB_SIDE, _call)(int) {
  const auto start = std::chrono::steady_clock::now();
  call(*buffers);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void AB_CAT(AB_SIDE, _teardown)() { buffers.reset(); }

bool AB_CAT(AB_SIDE, _supports)(int index) {
  const ab::Row& r = ab::kRows[index];
  const bool quantized = r.kv == ab::Storage::Q8_0 || r.kv == ab::Storage::Q4_0;
  return (AB_HAS_Q8 || !quantized) && (AB_HAS_BF16 || r.products != ab::Products::Bf16) &&
         (AB_HAS_INT8 || r.products != ab::Products::Int8) &&
         (AB_HAS_BACKWARD || r.kind != ab::Kind::Backward) &&
         (AB_HAS_DSA || (r.kind != ab::Kind::Sparse && r.kind != ab::Kind::SparseBackward));
}
