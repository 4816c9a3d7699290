// Decode: one new query per head (Lq = 1, H = 32 query heads, d = 128) against a long KV
// (Lk = 4096 and 32768) with Hkv = 32 (MHA) and 8 (GQA), K/V stored in f32, bf16, f16 and the
// GGUF blocks q8_0 and q4_0, 1 and 2 threads. Decode is a stream over K and V: the measure is GB/s
// of K+V read, against a streaming-read baseline over the same bytes measured in the same run (a
// SIMD sum over the buffers, the same threads). Targets (issue 22): >= 85% of that baseline for
// every storage type but q4_0 (75%); with GQA the time follows Hkv = 8's bytes (each KV group read
// once). Two more tables: decode over a PagedKv of 16-key pages (bf16) against decode() on the same
// K/V stored contiguously, and prefill (causal, Lq = Lk = 1024, H = 32) with bf16/f16 K/V against
// f32 K/V (target: <= 1.05x the f32 time; q8_0 <= 1.25x), and q8_0 / q4_0 decode against bf16
// decode (target: q8_0 <= 0.6x the bf16 time at Lk 32K).
#include <benchmark/benchmark.h>

#include <attnkit/attnkit.hpp>  // first: see simd.hpp on GCC 12 and <immintrin.h>
#include <attnkit/cache/paged_kv.hpp>
#include <attnkit/detail/aligned.hpp>  // the K/V buffers
// clang-format off
#include <Eigen/Core>
// clang-format on
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_kv.hpp"
#include "bench_support.hpp"

namespace {

using attnkit_bench::stream_bytes;

constexpr Index kHeads = 32, kDim = 128;

// K and V of one (Lk, Hkv) in storage T, filled with a cheap deterministic pattern; 64-byte
// aligned, as the storage of KvCache and PagedKv.
template <class T>
struct KvBuffers : attnkit_bench::KvRows<T> {
  KvBuffers(Index l, Index h) : attnkit_bench::KvRows<T>(l, h, kDim) {}
};

template <class T>
KvBuffers<T>& kv(Index len, Index kv_heads) {
  static std::map<std::pair<Index, Index>, KvBuffers<T>> all;
  return all.try_emplace({len, kv_heads}, len, kv_heads).first->second;
}

std::vector<float>& queries() {
  static std::vector<float> q = [] {
    std::vector<float> x(static_cast<std::size_t>(kHeads * kDim));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
    return x;
  }();
  return q;
}

// K and V of buf, each byte once.
template <class T>
float stream(const KvBuffers<T>& buf, int threads) {
  return stream_bytes({buf.k.data(), buf.v.data()}, buf.k.size() * sizeof(T), threads);
}

// The overlap of memory and arithmetic that decode's ratios rest on: the streaming read of the
// f32 Lk 32K Hkv 8 K/V with kOverlapFmas independent FMAs per 64-byte line between the loads
// (about the arithmetic quantized decode spends per line of K/V), against the read alone and the
// same FMAs alone over an L1-resident slice (the read with FMAs prefetches 8 KB ahead, as decode
// asks for its rows ahead). A CPU that overlaps the two takes max(read, arithmetic), one that
// does not their sum; in between, decode's ratio to the stream is bounded by how much of the
// kernel's arithmetic the CPU hides under the read.
constexpr int kOverlapFmas = 16;
constexpr Index kOverlapLen = 32768, kOverlapKvHeads = 8;

template <bool kFromMemory>
float stream_with_fmas(const float* x, Index n, int threads) {
  constexpr Index kLine = 64 / sizeof(float), kResident = 4096;  // 16 KB: stays in L1
  constexpr Index kAhead = 2048;                                 // 8 KB ahead
  float total = 0.f;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
#endif
  for (Index block = 0; block < n; block += 4096) {
    ak::simd::Vec acc(0.f), w[8];
    const ak::simd::Vec a(1.0001f), b(1e-7f);
    for (int t = 0; t < 8; ++t) w[t] = ak::simd::Vec(float(t));
    const Index end = std::min(n, block + 4096);
    for (Index i = block; i + kLine <= end; i += kLine) {
      if (kFromMemory) __builtin_prefetch(x + i + kAhead);  // as decode asks for its rows ahead
      for (Index c = 0; c < kLine; c += ak::simd::kWidth)
        acc = acc + ak::simd::load(x + (kFromMemory ? i : i % kResident) + c);
      for (int f = 0; f < kOverlapFmas; f += 8)
        for (int t = 0; t < 8; ++t) w[t] = ak::simd::fma(w[t], a, b);
    }
    for (int t = 0; t < 8; ++t) acc = acc + w[t];
    total += ak::simd::reduce_add(acc);
  }
  (void)threads;
  return total;
}

void add_overlap() {
  for (const int threads : {1, 2}) {
    const std::string rest = "/threads:" + std::to_string(threads);
    const auto n = [] {
      return static_cast<Index>(kv<float>(kOverlapLen, kOverlapKvHeads).k.size());
    };
    attnkit_bench::register_timed("overlap_read" + rest, [=](benchmark::State& state) {
      KvBuffers<float>& buf = kv<float>(kOverlapLen, kOverlapKvHeads);
      attnkit_bench::time_best(state, "overlap_read" + rest, attnkit_bench::Clocks::kWall, [&] {
        benchmark::DoNotOptimize(
            stream_bytes({buf.k.data(), buf.v.data()}, buf.k.size() * 4, threads));
      });
      state.counters["GB/s"] = attnkit_bench::per_second(buf.bytes() / 1e9);
    });
    attnkit_bench::register_timed("overlap_fmas" + rest, [=](benchmark::State& state) {
      KvBuffers<float>& buf = kv<float>(kOverlapLen, kOverlapKvHeads);
      attnkit_bench::time_best(state, "overlap_fmas" + rest, attnkit_bench::Clocks::kWall, [&] {
        benchmark::DoNotOptimize(stream_with_fmas<false>(buf.k.data(), 2 * n(), threads));
      });
      const double lines = 2.0 * double(n()) * sizeof(float) / 64.0;  // FMAs of kWidth lanes
      state.counters["GFLOP/s"] =
          attnkit_bench::per_second(lines * kOverlapFmas * ak::simd::kWidth * 2.0 / 1e9);
    });
    attnkit_bench::register_timed("overlap_both" + rest, [=](benchmark::State& state) {
      KvBuffers<float>& buf = kv<float>(kOverlapLen, kOverlapKvHeads);
      attnkit_bench::time_best(state, "overlap_both" + rest, attnkit_bench::Clocks::kWall, [&] {
        benchmark::DoNotOptimize(stream_with_fmas<true>(buf.k.data(), n(), threads) +
                                 stream_with_fmas<true>(buf.v.data(), n(), threads));
      });
      state.counters["GB/s"] = attnkit_bench::per_second(buf.bytes() / 1e9);
    });
  }
}

// "<storage>/Lk:<len>/Hkv:<kv_heads>/threads:<n>": the shape part of the decode, stream and
// paged benchmarks' names, which the summary tables look up.
std::string shape_name(const char* storage, Index len, Index kv_heads, int threads) {
  return std::string(storage) + "/Lk:" + std::to_string(len) + "/Hkv:" + std::to_string(kv_heads) +
         "/threads:" + std::to_string(threads);
}

template <class T>
void add(const char* storage, Index len, Index kv_heads) {
  for (const int threads : {1, 2}) {
    const std::string shape = shape_name(storage, len, kv_heads, threads);
    attnkit_bench::register_timed("decode/" + shape, [=](benchmark::State& state) {
      KvBuffers<T>& buf = kv<T>(len, kv_heads);
      std::vector<float> out(static_cast<std::size_t>(kHeads * kDim));
      const auto q = ak::bhsd(static_cast<const float*>(queries().data()), 1, kHeads, 1, kDim);
      const auto o = ak::bhsd(out.data(), 1, kHeads, 1, kDim);
      attnkit_bench::time_best(state, "decode/" + shape, attnkit_bench::Clocks::kWall, [&] {
        ak::decode(ak::make_spec(ak::Causal{}), q, buf.view(buf.k), buf.view(buf.v), o,
                   ak::Options{}.with_threads(threads));
        benchmark::DoNotOptimize(out.data());
      });
      state.counters["GB/s"] = attnkit_bench::per_second(buf.bytes() / 1e9);
    });
    attnkit_bench::register_timed("stream/" + shape, [=](benchmark::State& state) {
      KvBuffers<T>& buf = kv<T>(len, kv_heads);
      attnkit_bench::time_best(state, "stream/" + shape, attnkit_bench::Clocks::kWall,
                               [&] { benchmark::DoNotOptimize(stream(buf, threads)); });
      state.counters["GB/s"] = attnkit_bench::per_second(buf.bytes() / 1e9);
    });
  }
}

// decode() with Products::Int8 (int8 queries, integer K.Q products) over quantized K/V: the
// same K/V buffers as decode/ (Lk 32768), against exact products and the stream.
template <class T>
void add_int8(const char* storage) {
  for (const Index kv_heads : {Index{32}, Index{8}})
    for (const int threads : {1, 2}) {
      const std::string shape = shape_name(storage, 32768, kv_heads, threads);
      attnkit_bench::register_timed("decode_int8/" + shape, [=](benchmark::State& state) {
        KvBuffers<T>& buf = kv<T>(32768, kv_heads);
        std::vector<float> out(static_cast<std::size_t>(kHeads * kDim));
        const auto q = ak::bhsd(static_cast<const float*>(queries().data()), 1, kHeads, 1, kDim);
        const auto o = ak::bhsd(out.data(), 1, kHeads, 1, kDim);
        attnkit_bench::time_best(state, "decode_int8/" + shape, attnkit_bench::Clocks::kWall, [&] {
          ak::decode(ak::make_spec(ak::Causal{}), q, buf.view(buf.k), buf.view(buf.v), o,
                     ak::Options{}.with_threads(threads).with_products(ak::Products::Int8));
          benchmark::DoNotOptimize(out.data());
        });
        state.counters["GB/s"] = attnkit_bench::per_second(buf.bytes() / 1e9);
      });
    }
}

constexpr Index kPageSize = 16, kPrefillLen = 1024;

// The K/V of kv<T>(len, kv_heads) appended to a PagedKv of kPageSize-position pages.
template <class T>
const ak::PagedKv<T>& paged(Index len, Index kv_heads) {
  static std::map<std::pair<Index, Index>, ak::PagedKv<T>> all;
  const auto found = all.find({len, kv_heads});
  if (found != all.end()) return found->second;
  KvBuffers<T>& buf = kv<T>(len, kv_heads);
  ak::PagedKv<T>& pool =
      all.try_emplace({len, kv_heads}, len / kPageSize + 1, kv_heads, kPageSize, kDim)
          .first->second;
  pool.add_sequence();
  pool.append(0, buf.view(buf.k), buf.view(buf.v));
  return pool;
}

template <class T>
void add_paged(const char* storage, Index len, Index kv_heads) {
  for (const int threads : {1, 2}) {
    const std::string shape = shape_name(storage, len, kv_heads, threads);
    attnkit_bench::register_timed("paged/" + shape, [=](benchmark::State& state) {
      const ak::PagedKv<T>& pool = paged<T>(len, kv_heads);
      std::vector<float> out(static_cast<std::size_t>(kHeads * kDim));
      const auto q = ak::bhsd(static_cast<const float*>(queries().data()), 1, kHeads, 1, kDim);
      attnkit_bench::time_best(state, "paged/" + shape, attnkit_bench::Clocks::kWall, [&] {
        ak::attention_paged(ak::make_spec(ak::Causal{}), q, pool,
                            ak::bhsd(out.data(), 1, kHeads, 1, kDim),
                            ak::Options{}.with_threads(threads));
        benchmark::DoNotOptimize(out.data());
      });
      state.counters["GB/s"] = attnkit_bench::per_second(kv<T>(len, kv_heads).bytes() / 1e9);
    });
  }
}

// Prefill: causal attention, Lq = Lk = kPrefillLen, H = kHeads, f32 queries and output, K/V
// in T. The rows "prefill_<T>/..." compare with "prefill_f32/..." in the report.
template <class T>
void add_prefill(const char* storage) {
  for (const int threads : {1, 2}) {
    const std::string name = std::string("prefill_") + storage +
                             "/Lk:" + std::to_string(kPrefillLen) +
                             "/threads:" + std::to_string(threads);
    attnkit_bench::register_timed(name, [=](benchmark::State& state) {
      static attnkit_bench::QkvoBuffers f32(static_cast<std::size_t>(kPrefillLen * kHeads * kDim));
      static ak::detail::AlignedVector<T> k, v;
      if (k.empty()) {
        KvBuffers<T>::store(std::vector<float>(f32.k.begin(), f32.k.end()), k);
        KvBuffers<T>::store(std::vector<float>(f32.v.begin(), f32.v.end()), v);
      }
      const auto view = [](auto* data) { return ak::bshd(data, 1, kPrefillLen, kHeads, kDim); };
      attnkit_bench::time_best(state, name, attnkit_bench::Clocks::kWall, [&] {
        ak::attention(ak::make_spec(ak::Causal{}), view(static_cast<const float*>(f32.q.data())),
                      view(static_cast<const T*>(k.data())), view(static_cast<const T*>(v.data())),
                      view(f32.o.data()), ak::Options{}.with_threads(threads));
      });
      const double flops = 2.0 * kHeads * double(kPrefillLen) * double(kPrefillLen) * kDim;
      state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
    });
  }
}

// Short query blocks (speculative verification, chunked prefill): Lq = 2..16 queries per head
// at the end of Lk = kShortLen keys, causal, GQA (Hkv 8), through attention() (which routes
// them itself). GFLOP/s against the lower of two bounds of the same run: the long-prefill
// rate (prefill_long_f32, L = kLongLen, same threads) and the streaming read of the K/V bytes
// times the shape's FLOPs per byte (target of issue 22: >= 0.85 of that bound).
constexpr Index kShortLen = 8192, kShortKvHeads = 8;
constexpr Index kLongLen = 4096, kLongHeads = 8;

double long_prefill_flops() {
  return 2.0 * kLongHeads * double(kLongLen) * double(kLongLen) * kDim;
}

double short_flops(Index lq) { return 4.0 * kHeads * double(lq) * double(kShortLen) * kDim; }

// The long-prefill rate the short blocks are held to: causal f32, L = kLongLen, kLongHeads heads
// (the rate does not depend on the head count), d = kDim.
void add_long_prefill() {
  for (const int threads : {1, 2}) {
    const std::string name = "prefill_long_f32/threads:" + std::to_string(threads);
    attnkit_bench::register_timed(name, [=](benchmark::State& state) {
      static attnkit_bench::QkvoBuffers f32(static_cast<std::size_t>(kLongLen * kLongHeads * kDim));
      const auto view = [](auto* data) { return ak::bshd(data, 1, kLongLen, kLongHeads, kDim); };
      attnkit_bench::time_best(state, name, attnkit_bench::Clocks::kWall, [&] {
        ak::attention(ak::make_spec(ak::Causal{}), view(static_cast<const float*>(f32.q.data())),
                      view(static_cast<const float*>(f32.k.data())),
                      view(static_cast<const float*>(f32.v.data())), view(f32.o.data()),
                      ak::Options{}.with_threads(threads));
      });
      state.counters["GFLOP/s"] = attnkit_bench::per_second(long_prefill_flops() / 1e9);
    });
  }
}

template <class T>
void add_short(const char* storage) {
  for (const Index lq : {Index{2}, Index{4}, Index{8}, Index{16}})
    for (const int threads : {1, 2}) {
      const std::string name = std::string("short/") + storage + "/Lq:" + std::to_string(lq) +
                               "/threads:" + std::to_string(threads);
      attnkit_bench::register_timed(name, [=](benchmark::State& state) {
        KvBuffers<T>& buf = kv<T>(kShortLen, kShortKvHeads);
        static const std::vector<float> q = [] {
          std::vector<float> x(static_cast<std::size_t>(kHeads * 16 * kDim));
          for (std::size_t i = 0; i < x.size(); ++i)
            x[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
          return x;
        }();
        std::vector<float> out(static_cast<std::size_t>(kHeads * lq * kDim));
        attnkit_bench::time_best(state, name, attnkit_bench::Clocks::kWall, [&] {
          ak::attention(ak::make_spec(ak::Causal{}), ak::bshd(q.data(), 1, lq, kHeads, kDim),
                        buf.view(buf.k), buf.view(buf.v), ak::bshd(out.data(), 1, lq, kHeads, kDim),
                        ak::Options{}.with_threads(threads));
          benchmark::DoNotOptimize(out.data());
        });
        state.counters["GFLOP/s"] = attnkit_bench::per_second(short_flops(lq) / 1e9);
      });
    }
  for (const int threads : {1, 2})  // the stream over the same K/V
    attnkit_bench::register_timed(
        "stream/" + shape_name(storage, kShortLen, kShortKvHeads, threads),
        [=](benchmark::State& state) {
          KvBuffers<T>& buf = kv<T>(kShortLen, kShortKvHeads);
          attnkit_bench::time_best(
              state, "stream/" + shape_name(storage, kShortLen, kShortKvHeads, threads),
              attnkit_bench::Clocks::kWall,
              [&] { benchmark::DoNotOptimize(stream(buf, threads)); });
          state.counters["GB/s"] = attnkit_bench::per_second(buf.bytes() / 1e9);
        });
}

// MLA decode (DeepSeek's absorbed form): one latent row of kLatent values per position, K the
// whole row, V its first kMlaValues columns (a view of the same rows: the latent is read once),
// kMlaHeads query heads on the one KV head, Lq = 1, Lk = kMlaLen. Measured in GFLOP/s against
// the in-run tile-GEMM peak (16 heads on each latent row make it compute-bound) and in GB/s
// of latent against a streaming read of it.
// The tile-GEMM peak (GFLOP/s) by thread count, measured in this run.
std::map<int, double>& mla_peaks() {
  static std::map<int, double> peaks;
  return peaks;
}

constexpr Index kLatent = 576, kMlaValues = 512, kMlaHeads = 16, kMlaLen = 32768;

template <class T>
const ak::detail::AlignedVector<T>& latent() {
  static const ak::detail::AlignedVector<T> rows = [] {
    std::vector<float> values(static_cast<std::size_t>(kMlaLen * kLatent));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
    ak::detail::AlignedVector<T> out;
    KvBuffers<T>::store(values, out);
    return out;
  }();
  return rows;
}

template <class T>
void add_mla(const char* storage) {
  for (const int threads : {1, 2}) {
    const std::string shape = std::string(storage) + "/Lk:" + std::to_string(kMlaLen) +
                              "/threads:" + std::to_string(threads);
    attnkit_bench::register_timed("mla/" + shape, [=](benchmark::State& state) {
      const ak::detail::AlignedVector<T>& rows = latent<T>();
      const auto k = ak::bhsd(rows.data(), 1, 1, kMlaLen, kLatent);
      const auto v = ak::strided(rows.data(), {1, 1, kMlaLen, kMlaValues},
                                 {k.batch_stride, k.head_stride, k.seq_stride});
      static const std::vector<float> q = [] {
        std::vector<float> x(static_cast<std::size_t>(kMlaHeads * kLatent));
        for (std::size_t i = 0; i < x.size(); ++i)
          x[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
        return x;
      }();
      std::vector<float> out(static_cast<std::size_t>(kMlaHeads * kMlaValues));
      attnkit_bench::time_best(state, "mla/" + shape, attnkit_bench::Clocks::kWall, [&] {
        ak::decode(ak::make_spec(ak::Causal{}), ak::bhsd(q.data(), 1, kMlaHeads, 1, kLatent), k, v,
                   ak::bhsd(out.data(), 1, kMlaHeads, 1, kMlaValues),
                   ak::Options{}.with_threads(threads));
        benchmark::DoNotOptimize(out.data());
      });
      const double flops = 2.0 * kMlaHeads * double(kMlaLen) * (kLatent + kMlaValues);
      state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
      state.counters["GB/s"] = attnkit_bench::per_second(double(rows.size() * sizeof(T)) / 1e9);
    });
    attnkit_bench::register_timed("mla_stream/" + shape, [=](benchmark::State& state) {
      const ak::detail::AlignedVector<T>& rows = latent<T>();
      attnkit_bench::time_best(state, "mla_stream/" + shape, attnkit_bench::Clocks::kWall, [&] {
        benchmark::DoNotOptimize(stream_bytes({rows.data()}, rows.size() * sizeof(T), threads));
      });
      state.counters["GB/s"] = attnkit_bench::per_second(double(rows.size() * sizeof(T)) / 1e9);
    });
  }
  if (std::string(storage) != "bf16") return;
  for (const int threads : {1, 2})  // the compute baseline, once
    attnkit_bench::register_timed(
        "mla_peak/threads:" + std::to_string(threads), [=](benchmark::State& state) {
          state.counters["GFLOP/s"] = mla_peaks()[threads] =
              std::max(mla_peaks()[threads], attnkit_bench::tile_gemm_peak(state, 128, threads));
        });
}

// Bytes of K + V per value in each storage type of the tables.
double bytes_per_value(const std::string& storage) {
  if (storage == "f32") return 4.0;
  if (storage == "q8_0") return double(sizeof(ak::BlockQ8_0)) / 32.0;
  if (storage == "q4_0") return double(sizeof(ak::BlockQ4_0)) / 32.0;
  return 2.0;  // bf16, f16
}

double bytes_of(const std::string& storage, Index len, Index kv_heads) {
  return 2.0 * double(len * kv_heads * kDim) * bytes_per_value(storage);
}

void print_summary() {
  std::printf(
      "\n### Decode vs a streaming read of the same K/V bytes: ISA %s, Lq=1, H=%ld, d=%ld, B=1, "
      "causal\n\n"
      "GB/s = K+V bytes / best time; / stream = decode GB/s / streaming-read GB/s over the same "
      "bytes,\nsame threads (target of issue 22: >= 0.85, q4_0 >= 0.75); ms for Hkv = 8 against "
      "Hkv = 32 shows the GQA group read once.\n\n",
      ak::simd::kArchName, long(kHeads), long(kDim));
  attnkit_bench::print_table_head(
      "| K/V | Lk | Hkv | threads | ms | GB/s | stream GB/s | / stream | met |");
  for (const char* storage : {"f32", "bf16", "f16", "q8_0", "q4_0"})
    for (const Index len : {Index{4096}, Index{32768}})
      for (const Index hkv : {Index{32}, Index{8}})
        for (const int threads : {1, 2}) {
          const std::string shape = shape_name(storage, len, hkv, threads);
          const attnkit_bench::Best* d = attnkit_bench::find_best("decode/" + shape);
          const attnkit_bench::Best* s = attnkit_bench::find_best("stream/" + shape);
          if (d == nullptr || s == nullptr) continue;
          const double bytes = bytes_of(storage, len, hkv);
          const double ratio = s->seconds / d->seconds;
          std::printf("| %s | %ld | %ld | %d | %.2f | %.1f | %.1f | %.2f | %s |\n", storage,
                      long(len), long(hkv), threads, d->seconds * 1e3, bytes / d->seconds / 1e9,
                      bytes / s->seconds / 1e9, ratio,
                      ratio >= (std::string(storage) == "q4_0" ? 0.75 : 0.85) ? "yes" : "no");
        }

  std::printf(
      "\n### Overlap of memory and arithmetic: the read of %.0f MB (f32 K/V, Lk=%ld, Hkv=%ld) with "
      "%d independent FMAs per 64-byte line\n\nread = the read alone; FMAs = the same FMAs alone "
      "(L1-resident data); both = the two together. both / (read + FMAs) = 1: the CPU does "
      "not overlap them; both / max = 1: it overlaps them fully. Decode time ~ both for the "
      "kernel's own arithmetic per byte.\n\n",
      bytes_of("f32", kOverlapLen, kOverlapKvHeads) / 1e6, long(kOverlapLen), long(kOverlapKvHeads),
      kOverlapFmas);
  attnkit_bench::print_table_head(
      "| threads | read ms | FMAs ms | both ms | both / (read + FMAs) | both / max |");
  for (const int threads : {1, 2}) {
    const std::string rest = "/threads:" + std::to_string(threads);
    const attnkit_bench::Best* r = attnkit_bench::find_best("overlap_read" + rest);
    const attnkit_bench::Best* f = attnkit_bench::find_best("overlap_fmas" + rest);
    const attnkit_bench::Best* b = attnkit_bench::find_best("overlap_both" + rest);
    if (r == nullptr || f == nullptr || b == nullptr) continue;
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", threads, r->seconds * 1e3,
                f->seconds * 1e3, b->seconds * 1e3, b->seconds / (r->seconds + f->seconds),
                b->seconds / std::max(r->seconds, f->seconds));
  }

  std::printf(
      "\n### Quantized K/V decode against bf16 decode: Lk=32768, Lq=1, H=%ld, d=%ld (target: q8_0 "
      "<= 0.60x the bf16 time)\n\n",
      long(kHeads), long(kDim));
  attnkit_bench::print_table_head("| K/V | Hkv | threads | ms | bf16 ms | / bf16 time |");
  for (const char* storage : {"q8_0", "q4_0"})
    for (const Index hkv : {Index{32}, Index{8}})
      for (const int threads : {1, 2}) {
        const attnkit_bench::Best* d =
            attnkit_bench::find_best("decode/" + shape_name(storage, 32768, hkv, threads));
        const attnkit_bench::Best* b =
            attnkit_bench::find_best("decode/" + shape_name("bf16", 32768, hkv, threads));
        if (d == nullptr || b == nullptr) continue;
        std::printf("| %s | %ld | %d | %.2f | %.2f | %.2f |\n", storage, long(hkv), threads,
                    d->seconds * 1e3, b->seconds * 1e3, d->seconds / b->seconds);
      }

  std::printf(
      "\n### Products::Int8 (queries quantized to int8 per block, integer K.Q products) against "
      "exact products: Lk=32768, Lq=1, H=%ld, d=%ld\n\n",
      long(kHeads), long(kDim));
  attnkit_bench::print_table_head(
      "| K/V | Hkv | threads | int8 ms | exact ms | / exact time | / stream | / bf16 time |");
  for (const char* storage : {"q8_0", "q4_0"})
    for (const Index hkv : {Index{32}, Index{8}})
      for (const int threads : {1, 2}) {
        const std::string shape = shape_name(storage, 32768, hkv, threads);
        const attnkit_bench::Best* i = attnkit_bench::find_best("decode_int8/" + shape);
        const attnkit_bench::Best* d = attnkit_bench::find_best("decode/" + shape);
        const attnkit_bench::Best* s = attnkit_bench::find_best("stream/" + shape);
        const attnkit_bench::Best* b =
            attnkit_bench::find_best("decode/" + shape_name("bf16", 32768, hkv, threads));
        if (i == nullptr || d == nullptr || s == nullptr || b == nullptr) continue;
        std::printf("| %s | %ld | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", storage, long(hkv),
                    threads, i->seconds * 1e3, d->seconds * 1e3, i->seconds / d->seconds,
                    s->seconds / i->seconds, i->seconds / b->seconds);
      }

  std::printf(
      "\n### MLA decode (shared latent: K = %ld columns, V = its first %ld, one KV head, %ld "
      "query heads), Lk=%ld, Lq=1\n\n/ tile peak = GFLOP/s against the in-run tile-GEMM peak (d "
      "128, same threads, mla_peak); / stream = latent GB/s against a streaming read of it.\n\n",
      long(kLatent), long(kMlaValues), long(kMlaHeads), long(kMlaLen));
  attnkit_bench::print_table_head(
      "| latent | threads | ms | GFLOP/s | / tile peak | GB/s | / stream |");
  for (const char* storage : {"bf16", "q8_0"})
    for (const int threads : {1, 2}) {
      const std::string shape = std::string(storage) + "/Lk:" + std::to_string(kMlaLen) +
                                "/threads:" + std::to_string(threads);
      const attnkit_bench::Best* m = attnkit_bench::find_best("mla/" + shape);
      const attnkit_bench::Best* st = attnkit_bench::find_best("mla_stream/" + shape);
      if (m == nullptr || st == nullptr) continue;
      const double flops = 2.0 * kMlaHeads * double(kMlaLen) * (kLatent + kMlaValues);
      const double bytes =
          double(kMlaLen * kLatent) * (std::string(storage) == "bf16" ? 2.0 : 34.0 / 32.0);
      const double peak = mla_peaks()[threads];
      std::printf("| %s | %d | %.2f | %.1f | %.2f | %.1f | %.2f |\n", storage, threads,
                  m->seconds * 1e3, flops / m->seconds / 1e9,
                  peak > 0 ? flops / m->seconds / 1e9 / peak : 0.0, bytes / m->seconds / 1e9,
                  st->seconds / m->seconds);
    }

  std::printf(
      "\n### Short query blocks: Lq queries per head at the end of Lk=%ld keys, causal, H=%ld, "
      "Hkv=%ld, d=%ld, through attention()\n\nbound = min(long-prefill GFLOP/s (causal f32, "
      "L=%ld, same threads), stream GB/s x FLOPs per K/V byte); target >= 0.85 of it.\n\n",
      long(kShortLen), long(kHeads), long(kShortKvHeads), long(kDim), long(kLongLen));
  attnkit_bench::print_table_head(
      "| K/V | Lq | threads | ms | GFLOP/s | prefill GFLOP/s | stream bound | / bound |");
  for (const char* storage : {"f32", "bf16", "q8_0"})
    for (const Index lq : {Index{2}, Index{4}, Index{8}, Index{16}})
      for (const int threads : {1, 2}) {
        const attnkit_bench::Best* t =
            attnkit_bench::find_best(std::string("short/") + storage + "/Lq:" + std::to_string(lq) +
                                     "/threads:" + std::to_string(threads));
        const attnkit_bench::Best* st = attnkit_bench::find_best(
            "stream/" + shape_name(storage, kShortLen, kShortKvHeads, threads));
        const attnkit_bench::Best* pf =
            attnkit_bench::find_best("prefill_long_f32/threads:" + std::to_string(threads));
        if (t == nullptr || st == nullptr || pf == nullptr) continue;
        const double prefill = long_prefill_flops() / pf->seconds / 1e9;
        const double streamed = short_flops(lq) / st->seconds / 1e9;  // FLOPs at stream speed
        const double got = short_flops(lq) / t->seconds / 1e9, bound = std::min(prefill, streamed);
        std::printf("| %s | %ld | %d | %.3f | %.1f | %.1f | %.1f | %.2f |\n", storage, long(lq),
                    threads, t->seconds * 1e3, got, prefill, streamed, got / bound);
      }

  std::printf(
      "\n### Decode over paged KV (%ld-position pages, read in place) vs decode() on contiguous "
      "K/V: bf16, Lq=1, H=%ld, d=%ld\n\n",
      long(kPageSize), long(kHeads), long(kDim));
  attnkit_bench::print_table_head(
      "| Lk | Hkv | threads | paged ms | contiguous ms | paged / contiguous |");
  for (const Index hkv : {Index{32}, Index{8}})
    for (const int threads : {1, 2}) {
      const std::string shape = shape_name("bf16", 32768, hkv, threads);
      const attnkit_bench::Best* pg = attnkit_bench::find_best("paged/" + shape);
      const attnkit_bench::Best* d = attnkit_bench::find_best("decode/" + shape);
      if (pg == nullptr || d == nullptr) continue;
      std::printf("| 32768 | %ld | %d | %.2f | %.2f | %.2f |\n", long(hkv), threads,
                  pg->seconds * 1e3, d->seconds * 1e3, pg->seconds / d->seconds);
    }

  std::printf(
      "\n### Prefill with bf16/f16/q8_0 K/V vs f32 K/V: causal, Lq=Lk=%ld, H=%ld, d=%ld, f32 "
      "queries and output (targets: 16-bit <= 1.05x, q8_0 <= 1.25x the f32 time)\n\n",
      long(kPrefillLen), long(kHeads), long(kDim));
  attnkit_bench::print_table_head("| K/V | threads | ms | / f32 time | met |");
  for (const char* storage : {"f32", "bf16", "f16", "q8_0"})
    for (const int threads : {1, 2}) {
      const std::string rest =
          "/Lk:" + std::to_string(kPrefillLen) + "/threads:" + std::to_string(threads);
      const attnkit_bench::Best* t =
          attnkit_bench::find_best(std::string("prefill_") + storage + rest);
      const attnkit_bench::Best* f = attnkit_bench::find_best("prefill_f32" + rest);
      if (t == nullptr || f == nullptr) continue;
      const double ratio = t->seconds / f->seconds;
      const double target = std::string(storage) == "q8_0" ? 1.25 : 1.05;
      std::printf("| %s | %d | %.2f | %.3f | %s |\n", storage, threads, t->seconds * 1e3, ratio,
                  ratio <= target ? "yes" : "no");
    }
}

}  // namespace

int main(int argc, char** argv) {
  for (const Index len : {Index{4096}, Index{32768}})
    for (const Index hkv : {Index{32}, Index{8}}) {
      add<float>("f32", len, hkv);
      add<Eigen::bfloat16>("bf16", len, hkv);
      add<Eigen::half>("f16", len, hkv);
      add<ak::BlockQ8_0>("q8_0", len, hkv);
      add<ak::BlockQ4_0>("q4_0", len, hkv);
    }
  add_int8<ak::BlockQ8_0>("q8_0");
  add_int8<ak::BlockQ4_0>("q4_0");
  for (const Index hkv : {Index{32}, Index{8}}) add_paged<Eigen::bfloat16>("bf16", 32768, hkv);
  add_prefill<float>("f32");
  add_prefill<Eigen::bfloat16>("bf16");
  add_prefill<Eigen::half>("f16");
  add_prefill<ak::BlockQ8_0>("q8_0");
  add_long_prefill();
  add_short<float>("f32");
  add_short<Eigen::bfloat16>("bf16");
  add_short<ak::BlockQ8_0>("q8_0");
  add_mla<Eigen::bfloat16>("bf16");
  add_mla<ak::BlockQ8_0>("q8_0");
  add_overlap();
  attnkit_bench::report_context("decode", kHeads, 0);
  attnkit_bench::report_baseline("decode", "stream");
  attnkit_bench::report_baseline("paged", "decode");
  attnkit_bench::report_baseline("decode_int8", "decode");
  attnkit_bench::report_baseline("prefill_bf16", "prefill_f32");
  attnkit_bench::report_baseline("prefill_f16", "prefill_f32");
  attnkit_bench::report_baseline("prefill_q8_0", "prefill_f32");
  attnkit_bench::report_baseline("mla", "mla_stream");
  attnkit_bench::report_baseline("short", "prefill_long_f32");
  attnkit_bench::report_baseline("overlap_both", "overlap_read");
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.1", "--benchmark_repetitions=1"}, print_summary);
}
