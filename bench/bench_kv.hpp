// KvRows: the K and V of a decode benchmark, [1, Hkv, Lk, D] each in storage T (quantized
// blocks too), 64-byte aligned as the storage of KvCache and PagedKv, filled with a cheap
// deterministic pattern; stream_bytes(): the streaming read of the same bytes, decode's
// baseline (bench_decode, bench_head_dim).
#pragma once

#include <algorithm>
#include <attnkit/attnkit.hpp>  // first: see simd.hpp on GCC 12 and <immintrin.h>
#include <attnkit/detail/aligned.hpp>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace attnkit_bench {

template <class T>
struct KvRows {
  attnkit::detail::AlignedVector<T> k, v;
  attnkit::Index len, kv_heads, dim;
  KvRows(attnkit::Index l, attnkit::Index h, attnkit::Index d) : len(l), kv_heads(h), dim(d) {
    const auto n = static_cast<std::size_t>(l * h * d);
    std::vector<float> kf(n), vf(n);
    std::uint32_t x = 12345;
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      kf[i] = float(int(x >> 9) - (1 << 22)) * (1.f / float(1 << 22));
      vf[i] = float(int(x >> 12) - (1 << 19)) * (1.f / float(1 << 19));
    }
    store(kf, k);
    store(vf, v);
  }
  // The values in T (quantized blocks: 32 values each).
  static void store(const std::vector<float>& values, attnkit::detail::AlignedVector<T>& out) {
    const auto n = static_cast<attnkit::Index>(values.size());
    out.resize(static_cast<std::size_t>(attnkit::detail::row_elements<T>(n)));
    if constexpr (attnkit::detail::is_block_quantized<T>())
      attnkit::quantize_row(values.data(), n, out.data());
    else
      for (std::size_t i = 0; i < values.size(); ++i) out[i] = T(values[i]);
  }
  attnkit::View<const T> view(const attnkit::detail::AlignedVector<T>& t) const {
    return attnkit::bhsd(t.data(), 1, kv_heads, len, dim);
  }
  std::size_t bytes_each() const { return k.size() * sizeof(T); }
  double bytes() const { return 2.0 * double(bytes_each()); }
};

/// Reads every byte of the `arrays` (each `bytes` long) once, summed with SIMD over `threads`:
/// the streaming baseline.
inline float stream_bytes(std::initializer_list<const void*> arrays, std::size_t bytes,
                          int threads) {
  using attnkit::Index;
  const auto n = static_cast<Index>(bytes / sizeof(float));
  float total = 0.f;
  for (const void* array : arrays) {
    const auto* x = static_cast<const float*>(array);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
#endif
    for (Index block = 0; block < n; block += 4096) {
      attnkit::simd::Vec acc(0.f);
      const Index end = std::min(n, block + 4096);
      for (Index i = block; i + attnkit::simd::kWidth <= end; i += attnkit::simd::kWidth)
        acc = acc + attnkit::simd::load(x + i);
      total += attnkit::simd::reduce_add(acc);
    }
  }
  (void)threads;
  return total;
}

}  // namespace attnkit_bench
