// Positional encodings against no position on the same inputs, in the same run: ALiBi so
// far (a bias slope_h |i - j| added to each logit tile in apply_tile: one add, abs and fma
// per logit), causal, 1 and 2 threads. The question a user asks: what does the encoding
// cost on top of the attention it rides on? The GEMMs and the softmax are the same, so the
// difference is the encoding's own work. A new encoding is one add("name", spec) line in
// main() and one Row in kRows. The summary reports ms, GFLOP/s (2 H L^2 d, causal) and
// time / "none" time next to the targets. Times are the best of the repetitions (the
// machines are shared).
#include <benchmark/benchmark.h>

#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>

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

// The best iteration of one benchmark ("<encoding>/causal/threads:<n>"): its wall time and
// the share of the threads' wall time this process got on a CPU (process CPU time / (wall x
// threads)); well under 100% means other processes took the cores during it.
struct Best {
  double seconds = 1e300, busy = 0;
};
std::map<std::string, Best>& best_seconds() {
  static std::map<std::string, Best> r;
  return r;
}

constexpr double kCausalFlops = 2.0 * double(kHeads) * double(kLen) * double(kLen) * double(kDim);

template <class Spec>
void bench_position(benchmark::State& state, const std::string& key, const Spec& spec,
                    int threads) {
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
      benchmark::Counter(kCausalFlops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Registers `name` (an encoding, given as its whole causal spec) under both thread counts.
template <class Spec>
void add(const std::string& name, const Spec& spec) {
  for (const int threads : {1, 2}) {
    const std::string key = name + "/causal/threads:" + std::to_string(threads);
    auto run = [=](benchmark::State& s) { bench_position(s, key, spec, threads); };
    benchmark::RegisterBenchmark(key.c_str(), run)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

struct Row {
  const char* name;
  const char* target;  // the target for time / "none" time, or "baseline"
  double limit;        // the same as a number; 0: none
};

// One row per encoding, in print order; a row without a benchmark is skipped.
constexpr Row kRows[] = {{"none", "baseline", 0}, {"alibi", "<= 1.05", 1.05}};

void print_summary() {
  std::printf(
      "\n### Positional encodings vs none: ISA %s, d=%ld, L=%ld, H=%ld, B=1, f32, BSHD, causal\n\n"
      "ms = best iteration over the repetitions (default 3); GFLOP/s = 2 H L^2 d / time; / none ="
      "\ntime / time without position, same threads; cpu = process CPU time / (wall x threads)"
      "\nof that iteration: well under 100%% means other processes took the cores.\n\n",
      ak::simd::kArchName, long(kDim), long(kLen), long(kHeads));
  std::printf("| encoding | threads | ms | GFLOP/s | / none | target | met | cpu |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : kRows)
    for (const int threads : {1, 2}) {
      const std::string suffix = "/causal/threads:" + std::to_string(threads);
      const auto it = best_seconds().find(row.name + suffix);
      if (it == best_seconds().end()) continue;
      const double seconds = it->second.seconds;
      const auto base = best_seconds().find("none" + suffix);
      char ratio[32] = "-", met[8] = "-";
      if (base != best_seconds().end()) {
        const double r = seconds / base->second.seconds;
        std::snprintf(ratio, sizeof ratio, "%.3f", r);
        if (row.limit > 0) std::snprintf(met, sizeof met, "%s", r <= row.limit ? "yes" : "no");
      }
      std::printf("| %s | %d | %.1f | %.1f | %s | %s | %s | %.0f%% |\n", row.name, threads,
                  seconds * 1e3, kCausalFlops / seconds / 1e9, ratio, row.target, met,
                  100 * it->second.busy);
    }
}

}  // namespace

int main(int argc, char** argv) {
  add("none", ak::make_spec(ak::Causal{}));
  add("alibi", ak::make_spec(ak::Causal{}, ak::Alibi::standard(kHeads)));
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
