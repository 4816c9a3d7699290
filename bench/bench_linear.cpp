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
#include <cstdio>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

// From 256 (below the 1K) so that the crossover is bracketed.
constexpr Index kHeads = 2, kChunk = 32, kMinLen = 256, kMaxLen = 65536, kMaxSoftmaxLen = 16384;
constexpr Index kPeakSize = 128;

// Q, K, V, O of [1, kMaxLen, kHeads, d]; a call on L tokens views the first L (BSHD).
attnkit_bench::BshdBuffers& buffers(Index dim) {
  return attnkit_bench::shared_buffers(kMaxLen, kHeads, dim);
}

// Times `body` per iteration with the CPU clock, keeps the best under `key`, reports GFLOP/s
// of `flops`. This machine is shared: a long run loses the CPU to other processes, so the
// summary also reports each figure per CPU second (cpu = CPU time / (wall x threads); 100% on
// a quiet machine).
template <class Body>
void timed(benchmark::State& state, const std::string& key, double flops, Body body) {
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWallAndCpu, body);
  state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
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

// Registers `name`: call(q, k, v, o) on the first `len` tokens of buffers(dim), timed().
template <class Call>
void add_timed(const std::string& name, Index dim, Index len, double flops, Call call) {
  attnkit_bench::register_timed(name, [=](benchmark::State& s) {
    auto& b = buffers(dim);
    const auto q = ak::bshd(b.q.data(), 1, len, kHeads, dim);
    const auto k = ak::bshd(b.k.data(), 1, len, kHeads, dim);
    const auto v = ak::bshd(b.v.data(), 1, len, kHeads, dim);
    const auto o = ak::bshd(b.o.data(), 1, len, kHeads, dim);
    timed(s, name, flops, [&] { call(q, k, v, o); });
  });
}

void add_pair(Index dim, Index len, int threads) {
  static_assert(kChunk == 32, "kChunk: the default chunk, for the FLOP count");
  add_timed(key("linear", dim, len, threads), dim, len, linear_flops(len, dim),
            [threads, spec = ak::linear_spec(ak::EluPlusOne{})](const auto& q, const auto& k,
                                                                const auto& v, const auto& o) {
              ak::linear_attention(spec, q, k, v, o, ak::Options{}.with_threads(threads));
            });
  if (len > kMaxSoftmaxLen) return;
  add_timed(key("softmax", dim, len, threads), dim, len, softmax_flops(len, dim),
            [threads](const auto& q, const auto& k, const auto& v, const auto& o) {
              ak::attention(ak::make_spec(ak::Causal{}), q, k, v, o,
                            ak::Options{}.with_threads(threads));
            });
}

// The tile GEMM in cache on one square problem, one thread: C[n, n] = A[n, n] B[n, n].
void BM_Gemm_TilePeak(benchmark::State& state) {
  attnkit_bench::square_tile_peak(state, kPeakSize);
}

// One table row per (d, L): linear, its scaling and peak share, softmax and the ratio.
// "per CPU s" figures divide by the CPU share: what the kernel does while it runs.
void print_rows(Index dim, int threads, double peak) {
  Index crossover = 0;
  for (Index len = kMinLen; len <= kMaxLen; len *= 2) {
    const attnkit_bench::Best* lin = attnkit_bench::find_best(key("linear", dim, len, threads));
    if (lin == nullptr) continue;
    const attnkit_bench::Best& l = *lin;
    const attnkit_bench::Best* half =
        attnkit_bench::find_best(key("linear", dim, len / 2, threads));
    const attnkit_bench::Best* soft = attnkit_bench::find_best(key("softmax", dim, len, threads));
    char x2[32] = "-", soft_ms[16] = "-", ratio[16] = "-";
    if (half != nullptr)
      std::snprintf(x2, sizeof x2, "%.2f / %.2f", l.seconds / half->seconds, l.cpu / half->cpu);
    if (soft != nullptr) {
      std::snprintf(soft_ms, sizeof soft_ms, "%.1f", soft->seconds * 1e3);
      std::snprintf(ratio, sizeof ratio, "%.2f", soft->seconds / l.seconds);
      if (crossover == 0 && soft->seconds > l.seconds) crossover = len;
    }
    const double gflops = linear_flops(len, dim) / l.seconds / 1e9;
    std::printf("| %ld | %d | %ld | %.2f | %.0f%% | %s | %.1f | %.0f%% / %.0f%% | %s | %s |\n",
                long(dim), threads, long(len), l.seconds * 1e3, 100 * l.busy(threads), x2, gflops,
                100 * gflops / (threads * peak), 100 * gflops / (threads * peak * l.busy(threads)),
                soft_ms, ratio);
  }
  if (crossover > 0)
    std::printf(
        "| %ld | %d | crossover: linear faster from L = %ld (first measured length) |"
        "|||||||\n",
        long(dim), threads, long(crossover));
}

void print_summary() {
  const attnkit_bench::Best* p = attnkit_bench::find_best("tile_peak");
  const double peak = p == nullptr ? 0 : 2.0 * kPeakSize * kPeakSize * kPeakSize / p->seconds / 1e9;
  std::printf(
      "\n### Linear attention (EluPlusOne, causal, chunked C = %ld) vs softmax (causal): ISA "
      "%s, H=%ld, B=1, f32, BSHD\n\ntile-GEMM peak (gemm::gemm %ld^3 in cache, one thread): "
      "%.1f GFLOP/s (cpu %.0f%%). ms = best iteration; cpu = CPU time / (wall x threads) of "
      "it; x2 = time(L) / time(L/2), wall / CPU time (target <= 2.2 for L >= 8K); %%peak = "
      "linear GFLOP/s / (threads x peak), wall / per CPU second (target >= 40%%); "
      "softmax/linear > 1: linear is faster.\n\n",
      long(kChunk), ak::simd::kArchName, long(kHeads), long(kPeakSize), peak,
      p == nullptr ? 0.0 : 100 * p->busy(1));
  attnkit_bench::print_table_head(
      "| d | threads | L | linear ms | cpu | x2 | GFLOP/s | %peak | softmax ms | softmax/linear |");
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
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.05", "--benchmark_repetitions=2"}, print_summary);
}
