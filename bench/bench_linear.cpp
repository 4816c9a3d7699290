// Linear attention (EluPlusOne, causal, chunked form, C = 32, the default) against the tiled
// softmax attention (causal) on the same inputs in the same run: d = 64 and 128, H = 2, L from 1K
// to 64K for linear, softmax up to 16K (it is O(L^2): 64K would take minutes). The summary reports
// per shape the time, time(L) / time(L/2) (target <= 2.2 for L >= 8K: O(L)), the chunked form's
// GFLOP/s against the tile-GEMM peak measured here (gemm::gemm on a square 128 problem in cache,
// per thread; target >= 40%), and the length where linear overtakes softmax. FLOPs of the chunked
// form, per head and chunk of n rows: 2 n F Dv (read the state) + 2 n^2 (F + Dv) (the causal square
// inside the chunk, computed whole) + 2 n F Dv (update the state); F = d for EluPlusOne. Softmax: 2
// L^2 d (4 L^2 d halved by causality).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "bench_support.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ak = attnkit;
using ak::Index;

namespace {

// From 256 (below the 1K) so that the crossover is bracketed.
constexpr Index kHeads = 2, kChunk = 32, kMinLen = 256, kMaxLen = 65536, kMaxSoftmaxLen = 16384;
constexpr Index kPeakSize = 128;

// Q, K, V, O of [1, kMaxLen, kHeads, d]; a call on L tokens views the first L (BSHD).
attnkit_bench::BshdBuffers& buffers(Index dim) {
  static std::map<Index, attnkit_bench::BshdBuffers> all;
  auto it = all.find(dim);
  if (it == all.end()) it = all.try_emplace(dim, kMaxLen, kHeads, dim).first;
  return it->second;
}

// The best iteration of one benchmark: wall time and process CPU time. This machine is
// shared: a long run loses the CPU to other processes, so the summary also reports each
// figure per CPU second (cpu = CPU time / (wall x threads); 100% on a quiet machine).
struct Best {
  double wall = 1e300, cpu = 0;
  double share(int threads) const { return cpu / (wall * threads); }
};
std::map<std::string, Best>& best_seconds() {
  static std::map<std::string, Best> r;
  return r;
}

// Times `body` per iteration, keeps the best under `key`, reports GFLOP/s of `flops`.
template <class Body>
void timed(benchmark::State& state, const std::string& key, double flops, Body body) {
  Best& best = best_seconds()[key];
  for (auto _ : state) {
    const std::clock_t cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    body();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    if (wall < best.wall) best = Best{wall, cpu};
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

double linear_flops(Index len, Index dim) {
  const double per_chunk = 4.0 * kChunk * dim * dim + 2.0 * kChunk * kChunk * (2.0 * dim);
  return double(kHeads) * per_chunk * double(len) / double(kChunk);
}
double softmax_flops(Index len, Index dim) {
  return 2.0 * double(kHeads) * double(len) * double(len) * double(dim);
}

std::string key(const char* kind, Index dim, Index len, int threads) {
  return std::string(kind) + "/d:" + std::to_string(dim) + "/L:" + std::to_string(len) +
         "/threads:" + std::to_string(threads);
}

void add_pair(Index dim, Index len, int threads) {
  const std::string lin = key("linear", dim, len, threads);
  benchmark::RegisterBenchmark(
      lin.c_str(),
      [=](benchmark::State& s) {
        auto& b = buffers(dim);
        const auto spec = ak::linear_spec(ak::EluPlusOne{});
        static_assert(kChunk == 32, "kChunk: the default chunk, for the FLOP count");
        const auto q = ak::bshd(b.q.data(), 1, len, kHeads, dim);
        const auto k = ak::bshd(b.k.data(), 1, len, kHeads, dim);
        const auto v = ak::bshd(b.v.data(), 1, len, kHeads, dim);
        const auto o = ak::bshd(b.o.data(), 1, len, kHeads, dim);
        timed(s, lin, linear_flops(len, dim),
              [&] { ak::linear_attention(spec, q, k, v, o, ak::Options{}.with_threads(threads)); });
      })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  if (len > kMaxSoftmaxLen) return;
  const std::string soft = key("softmax", dim, len, threads);
  benchmark::RegisterBenchmark(soft.c_str(),
                               [=](benchmark::State& s) {
                                 auto& b = buffers(dim);
                                 const auto q = ak::bshd(b.q.data(), 1, len, kHeads, dim);
                                 const auto k = ak::bshd(b.k.data(), 1, len, kHeads, dim);
                                 const auto v = ak::bshd(b.v.data(), 1, len, kHeads, dim);
                                 const auto o = ak::bshd(b.o.data(), 1, len, kHeads, dim);
                                 timed(s, soft, softmax_flops(len, dim), [&] {
                                   ak::attention(ak::make_spec(ak::Causal{}), q, k, v, o,
                                                 ak::Options{}.with_threads(threads));
                                 });
                               })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// The tile GEMM in cache on one square problem, one thread: C[n, n] = A[n, n] B[n, n].
void BM_Gemm_TilePeak(benchmark::State& state) {
  const std::size_t n = kPeakSize;
  std::vector<float> a(n * n, 0.5f), b = a, c = a;
  timed(state, "tile_peak", 2.0 * double(n * n * n), [&] {
    ak::gemm::gemm(kPeakSize, kPeakSize, kPeakSize, {a.data(), kPeakSize, 1}, b.data(), kPeakSize,
                   c.data(), kPeakSize, false);
  });
}

// One table row per (d, L): linear, its scaling and peak share, softmax and the ratio.
// "per CPU s" figures divide by the CPU share: what the kernel does while it runs.
void print_rows(Index dim, int threads, double peak) {
  Index crossover = 0;
  for (Index len = kMinLen; len <= kMaxLen; len *= 2) {
    const auto lin = best_seconds().find(key("linear", dim, len, threads));
    if (lin == best_seconds().end()) continue;
    const Best& l = lin->second;
    const auto half = best_seconds().find(key("linear", dim, len / 2, threads));
    const auto soft = best_seconds().find(key("softmax", dim, len, threads));
    char x2[32] = "-", soft_ms[16] = "-", ratio[16] = "-";
    if (half != best_seconds().end())
      std::snprintf(x2, sizeof x2, "%.2f / %.2f", l.wall / half->second.wall,
                    l.cpu / half->second.cpu);
    if (soft != best_seconds().end()) {
      std::snprintf(soft_ms, sizeof soft_ms, "%.1f", soft->second.wall * 1e3);
      std::snprintf(ratio, sizeof ratio, "%.2f", soft->second.wall / l.wall);
      if (crossover == 0 && soft->second.wall > l.wall) crossover = len;
    }
    const double gflops = linear_flops(len, dim) / l.wall / 1e9;
    std::printf("| %ld | %d | %ld | %.2f | %.0f%% | %s | %.1f | %.0f%% / %.0f%% | %s | %s |\n",
                long(dim), threads, long(len), l.wall * 1e3, 100 * l.share(threads), x2, gflops,
                100 * gflops / (threads * peak), 100 * gflops / (threads * peak * l.share(threads)),
                soft_ms, ratio);
  }
  if (crossover > 0)
    std::printf(
        "| %ld | %d | crossover: linear faster from L = %ld (first measured length) |"
        "|||||||\n",
        long(dim), threads, long(crossover));
}

void print_summary() {
  const auto p = best_seconds().find("tile_peak");
  const double peak = p == best_seconds().end()
                          ? 0
                          : 2.0 * kPeakSize * kPeakSize * kPeakSize / p->second.wall / 1e9;
  std::printf(
      "\n### Linear attention (EluPlusOne, causal, chunked C = %ld) vs softmax (causal): ISA "
      "%s, H=%ld, B=1, f32, BSHD\n\ntile-GEMM peak (gemm::gemm %ld^3 in cache, one thread): "
      "%.1f GFLOP/s (cpu %.0f%%). ms = best iteration; cpu = CPU time / (wall x threads) of "
      "it; x2 = time(L) / time(L/2), wall / CPU time (target <= 2.2 for L >= 8K); %%peak = "
      "linear GFLOP/s / (threads x peak), wall / per CPU second (target >= 40%%); "
      "softmax/linear > 1: linear is faster.\n\n",
      long(kChunk), ak::simd::kArchName, long(kHeads), long(kPeakSize), peak,
      p == best_seconds().end() ? 0.0 : 100 * p->second.share(1));
  std::printf(
      "| d | threads | L | linear ms | cpu | x2 | GFLOP/s | %%peak | softmax ms | "
      "softmax/linear |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Index dim : {64, 128})
    for (const int threads : {1, 2}) print_rows(dim, threads, peak);
}

}  // namespace

int main(int argc, char** argv) {
  attnkit_bench::report_context("linear", kHeads, 0);
  attnkit_bench::report_baseline("linear", "softmax");
  benchmark::RegisterBenchmark("tile_peak", BM_Gemm_TilePeak)->UseRealTime();
  for (const Index dim : {64, 128})
    for (Index len = kMinLen; len <= kMaxLen; len *= 2)
      for (const int threads : {1, 2}) add_pair(dim, len, threads);
  // 2 repetitions of at least 0.05 s each unless the command line says otherwise: the long
  // softmax shapes run once per repetition, which keeps the default run near a minute.
  if (!attnkit_bench::initialize(argc, argv,
                                 {"--benchmark_min_time=0.05", "--benchmark_repetitions=2"}))
    return 1;
  attnkit_bench::PlainConsoleReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary();
  return 0;
}
