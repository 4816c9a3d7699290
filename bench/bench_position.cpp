// Positional encodings against no position on the same inputs, in the same run, causal, 1
// and 2 threads: ALiBi (a bias slope_h |i - j| added to each logit tile in apply_tile: one
// add, abs and fma per logit), RoPE fused (queries turned as their tile is packed, keys once
// per call into an f32 copy) and standalone (apply_position on copies of q and k, then plain
// attention), FoPE the same two ways (drawn coefficients, sigma 0.3, N_train = L / 2), TAPA
// (two half-width products and one cos per logit). The question a user asks: what
// does the encoding cost on top of the attention it rides on? The GEMMs and the softmax are the
// same, so the difference is the encoding's own work. A new encoding is one add("name", spec) line
// in main() and one Row in kRows. The summary reports ms, GFLOP/s (2 H L^2 d, causal) and time /
// "none" time next to the targets. Times are the best of the repetitions (the machines are shared).
#include <benchmark/benchmark.h>

#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
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

// Times call(options), which writes the output buffer.
template <class Call>
void bench_position(benchmark::State& state, const std::string& key, int threads, Call call) {
  attnkit_bench::BshdBuffers& buf = buffers();
  const auto options = ak::Options{}.with_threads(threads);
  Best& best = best_seconds()[key];
  for (auto _ : state) {
    const std::clock_t cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    call(options);
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

// Registers `name` under both thread counts; make_call(threads) gives the timed callable.
template <class MakeCall>
void add_call(const std::string& name, MakeCall make_call) {
  if (name != "none") attnkit_bench::report_baseline(name, "none");
  for (const int threads : {1, 2}) {
    const std::string key = name + "/causal/threads:" + std::to_string(threads);
    auto run = [=](benchmark::State& s) { bench_position(s, key, threads, make_call()); };
    benchmark::RegisterBenchmark(key.c_str(), run)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

// An encoding fused into attention(), given as its whole causal spec.
template <class Spec>
void add(const std::string& name, const Spec& spec) {
  add_call(name, [spec] {
    return [spec](const ak::Options& options) {
      attnkit_bench::BshdBuffers& buf = buffers();
      ak::attention(spec, buf.in(buf.q), buf.in(buf.k), buf.in(buf.v), buf.out(), options);
    };
  });
}

// The same encoding applied standalone -- q and k copied, turned in place by
// apply_position(), then plain causal attention: what a caller without fusion would do.
template <class Position>
void add_standalone(const std::string& name, const Position& position) {
  add_call(name, [position] {
    return [position](const ak::Options& options) {
      attnkit_bench::BshdBuffers& buf = buffers();
      static std::vector<float> q, k;
      q = buf.q;
      k = buf.k;
      const auto view = [&](std::vector<float>& t) {
        return ak::bshd(t.data(), 1, buf.len, buf.heads, buf.dim);
      };
      ak::apply_position(position, view(q), ak::Role::Query);
      ak::apply_position(position, view(k), ak::Role::Key);
      ak::attention(ak::make_spec(ak::Causal{}), ak::View<const float>(view(q)),
                    ak::View<const float>(view(k)), buf.in(buf.v), buf.out(), options);
    };
  });
}

struct Row {
  const char* name;
  const char* target;  // the target for time / "none" time, or "baseline"
  double limit;        // the same as a number; 0: none
};

// One row per encoding, in print order; a row without a benchmark is skipped.
constexpr Row kRows[] = {{"none", "baseline", 0},   {"alibi", "<= 1.05", 1.05},
                         {"rope", "<= 1.08", 1.08}, {"rope_standalone", "- (rope < it)", 0},
                         {"fope", "<= 1.08", 1.08}, {"fope_standalone", "- (fope < it)", 0},
                         {"tapa", "<= 1.30", 1.30}};

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
  attnkit_bench::report_context("positions", kHeads, kLen);
  add("none", ak::make_spec(ak::Causal{}));
  add("alibi", ak::make_spec(ak::Causal{}, ak::Alibi::standard(kHeads)));
  const ak::Rope rope(ak::RopeTable(kDim, 10000.0, kLen));
  add("rope", ak::make_spec(ak::Causal{}, rope));
  add_standalone("rope_standalone", rope);
  const ak::Fope fope = ak::Fope::drawn(
      ak::FopeConfig{kDim, kLen, kLen / 2, 10000.0, kHeads, kHeads, ak::FopePadding::Identity});
  add("fope", ak::make_spec(ak::Causal{}, fope));
  add_standalone("fope_standalone", fope);
  add("tapa", ak::make_spec(ak::Causal{}, ak::Tapa{}));
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
