// Normalizers against softmax on the same inputs, in the same run: Sigmoid (default bias
// -log Lk), ReluPower{2, 0}, Softmax::with_sinks (one sink logit 0 per head), SoftplusL1
// (LSSA) and SoftplusL1Reweighted (LSSAR, p = 15, two passes over the keys), each beside
// plain Softmax, full and causal, 1 and 2 threads. The question a user asks: what does
// swapping the normalizer cost? The GEMMs are the same, so any difference is the
// per-logit work of absorb() (sigmoid: one exp2 and one division; ReluPower: log2 and
// exp2; softmax: a max pass, one exp2, and the accumulator rescale; LSSA: a softplus, i.e.
// exp2, log2 and a division; LSSAR: a second scores GEMM and softplus pass, then log2 and
// the softmax work on p log r). The summary reports
// ms, GFLOP/s (4 H L^2 d, halved for causal) and time / softmax time next to the targets
// of issue 7. Times are the best of the repetitions (the machines are shared).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ak = attnkit;
using ak::Index;

namespace {

constexpr Index kDim = 128, kLen = 4096, kHeads = 4;

// Q, K, V, O of the one shape, filled once.
attnkit_bench::BshdBuffers& buffers() {
  static attnkit_bench::BshdBuffers b(kLen, kHeads, kDim);
  return b;
}

// The best iteration of one benchmark ("<normalizer>/<mask>/threads:<n>"): its wall time
// and the share of the threads' wall time this process got on a CPU (process CPU time /
// (wall x threads)); well under 100% means other processes took the cores during it.
struct Best {
  double seconds = 1e300, busy = 0;
};
std::map<std::string, Best>& best_seconds() {
  static std::map<std::string, Best> r;
  return r;
}

double flops(bool causal) {
  const double full = 4.0 * double(kHeads) * double(kLen) * double(kLen) * double(kDim);
  return causal ? full / 2 : full;
}

template <class Spec>
void bench_normalizer(benchmark::State& state, const std::string& key, const Spec& spec,
                      bool causal, int threads) {
  attnkit_bench::BshdBuffers& buf = buffers();
  const auto options = ak::Options{}.with_threads(threads);
  Best& best = best_seconds()[key];
  for (auto _ : state) {
    const std::clock_t cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    ak::attention(spec, buf.in(buf.q), buf.in(buf.k), buf.in(buf.v), buf.out(), options);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    if (s < best.seconds) best = Best{s, cpu / (s * threads)};
    benchmark::DoNotOptimize(buf.o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops(causal) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Registers `name` (a normalizer) under both masks and both thread counts.
template <class Normalizer>
void add(const std::string& name, const Normalizer& normalizer) {
  if (name != "softmax") attnkit_bench::report_baseline(name, "softmax");
  for (const bool causal : {false, true})
    for (const int threads : {1, 2}) {
      const std::string key =
          name + (causal ? "/causal" : "/full") + "/threads:" + std::to_string(threads);
      auto run = [=](benchmark::State& s) {
        if (causal)
          bench_normalizer(s, key, ak::make_spec(ak::Causal{}, normalizer), causal, threads);
        else
          bench_normalizer(s, key, ak::make_spec(normalizer), causal, threads);
      };
      benchmark::RegisterBenchmark(key.c_str(), run)->Unit(benchmark::kMillisecond)->UseRealTime();
    }
}

struct Row {
  const char* name;
  const char* target;  // the target for time / softmax time, or "-"
  double limit;        // the same as a number; 0: none
};

void print_summary() {
  const Row rows[] = {{"softmax", "baseline", 0},         {"sigmoid", "<= 1.00", 1.0},
                      {"softmax_sinks", "<= 1.02", 1.02}, {"relu_power2", "- (none)", 0},
                      {"lssa", "<= 1.15", 1.15},          {"lssar", "<= 2.20", 2.2}};
  std::printf(
      "\n### Normalizers vs softmax: ISA %s, d=%ld, L=%ld, H=%ld, B=1, f32, BSHD\n\n"
      "ms = best iteration over the repetitions (default 3); GFLOP/s = 4 H L^2 d / time "
      "(halved\nfor causal); / softmax = time / softmax time, same mask and threads; target "
      "from issue 7;\ncpu = process CPU time / (wall x threads) of that iteration: well under "
      "100%% means other\nprocesses took the cores, and the row measures the machine.\n\n",
      ak::simd::kArchName, long(kDim), long(kLen), long(kHeads));
  std::printf("| normalizer | mask | threads | ms | GFLOP/s | / softmax | target | met | cpu |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : rows)
    for (const char* mask : {"full", "causal"})
      for (const int threads : {1, 2}) {
        const std::string suffix = std::string("/") + mask + "/threads:" + std::to_string(threads);
        const auto it = best_seconds().find(row.name + suffix);
        if (it == best_seconds().end()) continue;
        const double seconds = it->second.seconds;
        const auto base = best_seconds().find("softmax" + suffix);
        char ratio[32] = "-", met[8] = "-";
        if (base != best_seconds().end()) {
          const double r = seconds / base->second.seconds;
          std::snprintf(ratio, sizeof ratio, "%.3f", r);
          if (row.limit > 0) std::snprintf(met, sizeof met, "%s", r <= row.limit ? "yes" : "no");
        }
        std::printf("| %s | %s | %d | %.1f | %.1f | %s | %s | %s | %.0f%% |\n", row.name, mask,
                    threads, seconds * 1e3, flops(mask[0] == 'c') / seconds / 1e9, ratio,
                    row.target, met, 100 * it->second.busy);
      }
}

}  // namespace

int main(int argc, char** argv) {
  attnkit_bench::report_context("normalizers", kHeads, kLen);
  add("softmax", ak::Softmax{});
  add("sigmoid", ak::Sigmoid{});
  add("softmax_sinks", ak::Softmax::with_sinks(std::vector<float>(kHeads, 0.f)));
  add("relu_power2", ak::ReluPower{2.f, 0.f});
  add("lssa", ak::SoftplusL1{});
  add("lssar", ak::SoftplusL1Reweighted{});
  // 3 repetitions of at least 0.2 s each unless the command line says otherwise.
  if (!attnkit_bench::initialize(argc, argv,
                                 {"--benchmark_min_time=0.2", "--benchmark_repetitions=3"}))
    return 1;
  attnkit_bench::PlainConsoleReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary();
  return 0;
}
