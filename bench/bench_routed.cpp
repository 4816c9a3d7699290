// Data-dependent sparsity against dense causal attention on the same inputs, in the same
// run: All-or-Here (AHA) with ~10% of (token, head) routed to full attention at L = 16384
// (the rest: a 256-key window), f32, d = 128, 2 threads (1 thread too for the
// ratio). The question a user asks: how much faster than dense causal is the routed variant
// at the sparsity it runs at? The summary reports ms, the ratio dense / variant (a speedup),
// the live fraction (the (query, key) pairs computed / causal pairs) and the target.
// Selection (routing) time is timed apart and shown in its own row.
#include <benchmark/benchmark.h>

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

constexpr Index kDim = 128, kHeads = 2, kAhaLen = 16384, kWindow = 256;

attnkit_bench::BshdBuffers& buffers(Index len) {
  static std::map<Index, attnkit_bench::BshdBuffers> all;
  return all.try_emplace(len, len, kHeads, kDim).first->second;
}

struct Best {
  double seconds = 1e300, busy = 0;
};
std::map<std::string, Best>& best_seconds() {
  static std::map<std::string, Best> r;
  return r;
}
std::map<std::string, double>& live_fraction() {
  static std::map<std::string, double> r;
  return r;
}

double causal_pairs(Index len) { return double(len) * double(len + 1) / 2.0; }

// Times call() (which writes the output buffer) under `key`.
template <class Call>
void bench_call(benchmark::State& state, const std::string& key, int threads, Index len,
                Call call) {
  Best& best = best_seconds()[key];
  for (auto _ : state) {
    const std::clock_t cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    call();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    if (s < best.seconds) best = Best{s, cpu / (s * threads)};
    benchmark::DoNotOptimize(buffers(len).o.data());
    benchmark::ClobberMemory();
  }
}

template <class MakeCall>
void add(const std::string& name, Index len, const std::vector<int>& thread_counts,
         MakeCall make_call) {
  for (const int threads : thread_counts) {
    const std::string key = name + "/threads:" + std::to_string(threads);
    auto run = [=](benchmark::State& s) { bench_call(s, key, threads, len, make_call(threads)); };
    benchmark::RegisterBenchmark(key.c_str(), run)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

void add_dense(Index len) {
  add("dense_causal/L:" + std::to_string(len), len, {1, 2}, [len](int threads) {
    return [len, threads] {
      attnkit_bench::BshdBuffers& buf = buffers(len);
      ak::attention(ak::make_spec(ak::Causal{}), buf.in(buf.q), buf.in(buf.k), buf.in(buf.v),
                    buf.out(), ak::Options{}.with_threads(threads));
    };
  });
}

// AHA: gates drawn so that ~10% of (token, head) exceed 0 (sigmoid > 0.5).
const ak::AhaRoutes& aha_routes() {
  static const ak::AhaRoutes routes = [] {
    std::mt19937 rng(7);
    std::normal_distribution<float> n;
    std::vector<float> gates(static_cast<std::size_t>(kAhaLen * kHeads));
    for (float& g : gates) g = n(rng) - 1.2816f;  // P(N(0,1) > 1.2816) = 10%
    return ak::AhaRoutes::from_gates(gates, 1, kAhaLen, kHeads);
  }();
  return routes;
}

void add_aha() {
  const ak::AhaRoutes& routes = aha_routes();
  double pairs = 0;
  for (Index h = 0; h < kHeads; ++h)
    for (Index t = 0; t < kAhaLen; ++t)
      pairs += routes.is_full(0, t, h) ? double(t + 1) : double(std::min<Index>(t + 1, kWindow));
  const std::string name = "aha/L:" + std::to_string(kAhaLen);
  live_fraction()[name] = pairs / (kHeads * causal_pairs(kAhaLen));
  add(name, kAhaLen, {1, 2}, [](int threads) {
    return [threads] {
      attnkit_bench::BshdBuffers& buf = buffers(kAhaLen);
      ak::all_or_here(ak::make_spec(ak::Softmax{}), buf.in(buf.q), buf.in(buf.k), buf.in(buf.v),
                      buf.out(), aha_routes(), kWindow, ak::Options{}.with_threads(threads));
    };
  });
  // Routing from gate logits (the selection step of AHA), apart.
  add("aha_routing/L:" + std::to_string(kAhaLen), kAhaLen, {1}, [](int) {
    return [] {
      static std::vector<float> gates(static_cast<std::size_t>(kAhaLen * kHeads), -1.f);
      benchmark::DoNotOptimize(ak::AhaRoutes::from_gates(gates, 1, kAhaLen, kHeads));
    };
  });
}

struct Row {
  const char* name;    // benchmark name without "/threads:n"
  const char* dense;   // its dense causal baseline
  const char* target;  // the speedup target, or "-"
  double limit;        // the same as a number; 0: none
};

constexpr Row kRows[] = {
    {"aha/L:16384", "dense_causal/L:16384", ">= 3x (10% full)", 3.0},
    {"aha_routing/L:16384", "dense_causal/L:16384", "- (selection)", 0},
};

void print_summary() {
  std::printf(
      "\n### Routed and data-dependent sparsity vs dense causal: ISA %s, d=%ld, H=%ld, B=1, "
      "f32, BSHD\n\n"
      "ms = best iteration over the repetitions; speedup = dense causal time / variant time, "
      "same L and threads;\nlive = (query, key) pairs computed / causal pairs; cpu = process "
      "CPU time / (wall x threads):\nwell under 100%% means other processes took the cores.\n\n",
      ak::simd::kArchName, long(kDim), long(kHeads));
  std::printf("| variant | threads | ms | live | speedup | target | met | cpu |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : kRows)
    for (const int threads : {1, 2}) {
      const std::string suffix = "/threads:" + std::to_string(threads);
      const auto it = best_seconds().find(row.name + suffix);
      if (it == best_seconds().end()) continue;
      const auto base = best_seconds().find(row.dense + suffix);
      char speedup[32] = "-", met[8] = "-", live[16] = "-";
      if (base != best_seconds().end() && row.limit > 0) {  // selection rows: time only
        const double r = base->second.seconds / it->second.seconds;
        std::snprintf(speedup, sizeof speedup, "%.2fx", r);
        if (row.limit > 0) std::snprintf(met, sizeof met, "%s", r >= row.limit ? "yes" : "no");
      }
      const auto lf = live_fraction().find(row.name);
      if (lf != live_fraction().end()) std::snprintf(live, sizeof live, "%.3f", lf->second);
      std::printf("| %s | %d | %.1f | %s | %s | %s | %s | %.0f%% |\n", row.name, threads,
                  it->second.seconds * 1e3, live, speedup, row.target, met, 100 * it->second.busy);
    }
  for (const char* dense : {"dense_causal/L:16384"})
    for (const int threads : {1, 2}) {
      const auto it =
          best_seconds().find(std::string(dense) + "/threads:" + std::to_string(threads));
      if (it != best_seconds().end())
        std::printf("| %s | %d | %.1f | 1.000 | baseline | - | - | %.0f%% |\n", dense, threads,
                    it->second.seconds * 1e3, 100 * it->second.busy);
    }
}

}  // namespace

int main(int argc, char** argv) {
  add_dense(kAhaLen);
  add_aha();
  // 2 repetitions of one iteration each unless the command line says otherwise: the dense
  // baselines at long L take seconds.
  if (!attnkit_bench::initialize(argc, argv,
                                 {"--benchmark_min_time=0.01", "--benchmark_repetitions=2"}))
    return 1;
  attnkit_bench::PlainConsoleReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary();
  return 0;
}
