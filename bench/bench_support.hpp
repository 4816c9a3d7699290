// What every attnkit benchmark shares: default flags that the command line can override, and
// the console output -- Google Benchmark's table in plain text, without two distractions. Debian's
// "Library was built as DEBUG" warning is replaced by a note on what it means, and rate counters
// print without the "/s" the library appends (the column names carry the unit: GFLOP/s, bytes/s).
// JSON output is unchanged; report_context() and report_baseline() add to it what
// scripts/bench_report.py needs (family, shape, ISA, each variant's in-run baseline). Benches
// whose summary tables read each benchmark's best iteration time it with time_best(), which
// keeps it in best_times(), and end main() with run_benchmarks().
#pragma once

#include <benchmark/benchmark.h>

#include <attnkit/core/tensor.hpp>
#include <attnkit/gemm/tile_gemm.hpp>
#include <attnkit/kernel/tiles/tile_config.hpp>
#include <attnkit/simd/simd.hpp>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

// The short names every bench uses.
namespace ak = attnkit;
using ak::Index;

namespace attnkit_bench {

/// Q, K and V of `elements` floats each, drawn once from N(0, 1) with a fixed seed, and an
/// output O of the same size: the inputs every benchmark times its variants on.
struct QkvoBuffers {
  std::vector<float> q, k, v, o;
  explicit QkvoBuffers(std::size_t elements) : q(elements), k(elements), v(elements), o(elements) {
    std::mt19937 rng(42);
    std::normal_distribution<float> dist;
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = dist(rng);
  }
};

/// QkvoBuffers of one [1, len, heads, dim] shape in BSHD layout, with its views.
struct BshdBuffers : QkvoBuffers {
  attnkit::Index len, heads, dim;
  BshdBuffers(attnkit::Index seq, attnkit::Index h, attnkit::Index d)
      : QkvoBuffers(static_cast<std::size_t>(seq * h * d)), len(seq), heads(h), dim(d) {}
  attnkit::View<const float> in(const std::vector<float>& t) const {
    return attnkit::bshd(t.data(), 1, len, heads, dim);
  }
  attnkit::View<float> out() { return attnkit::bshd(o.data(), 1, len, heads, dim); }
};

/// The BshdBuffers of one [1, len, heads, dim] shape, filled on first use and kept for the
/// whole run: every benchmark of that shape times its variant on the same inputs.
inline BshdBuffers& shared_buffers(attnkit::Index len, attnkit::Index heads, attnkit::Index dim) {
  static std::map<std::tuple<attnkit::Index, attnkit::Index, attnkit::Index>, BshdBuffers> all;
  return all.try_emplace({len, heads, dim}, len, heads, dim).first->second;
}

/// The best iteration of one benchmark: its wall time and, where the bench reads the CPU
/// clock (Clocks::kWallAndCpu), the process CPU time of that same iteration (else 0).
struct Best {
  double seconds = 1e300, cpu = 0;

  /// The share of the threads' wall time this process got on a CPU, cpu / (wall x threads):
  /// well under 1 means other processes took the cores during that iteration.
  double busy(int threads) const { return cpu / (seconds * threads); }
};

/// Each benchmark's best iteration over all its repetitions, by the key its time_best() names
/// (the benchmark's name, as a rule): what the summary tables read after the run.
inline std::map<std::string, Best>& best_times() {
  static std::map<std::string, Best> all;
  return all;
}

/// The best iteration kept under `key`; nullptr where that benchmark did not run (filtered out).
inline const Best* find_best(const std::string& key) {
  const auto it = best_times().find(key);
  return it == best_times().end() ? nullptr : &it->second;
}

/// The in-cache peak of attnkit's own tile GEMM on the attention kernel's two tile products,
/// S^T[Bk, Bq] = K[Bk, d] Q^T[d, Bq] and O[Bq, d] += P[Bq, Bk] V[Bk, d], repeated on the same
/// buffers by each of `threads` threads: the FLOP rate attention could reach if the softmax,
/// masking and memory traffic were free. An upper bound, so it returns the GFLOP/s of the
/// best round (each iteration of `state` is one timed round on all threads), not the mean:
/// one round slowed by another process must not lower the bound.
inline double tile_gemm_peak(benchmark::State& state, attnkit::Index d, int threads) {
  using attnkit::Index;
  constexpr Index bq = attnkit::TileConfig::kBlockQ, bk = attnkit::TileConfig::kBlockK;
  constexpr Index kReps = 64;
  struct Tiles {  // one thread's operands, allocated outside the timed rounds
    std::vector<float> k, qt, st, v, o;
  };
  const auto n = [](Index x) { return static_cast<std::size_t>(x); };
  const Tiles init{std::vector<float>(n(bk * d), 0.5f), std::vector<float>(n(d * bq), 0.25f),
                   std::vector<float>(n(bk * bq)), std::vector<float>(n(bk * d), 0.5f),
                   std::vector<float>(n(bq * d), 0.f)};
  std::vector<Tiles> tiles(n(threads), init);
  using Clock = std::chrono::steady_clock;
  auto best = Clock::duration::max();
  for (auto _ : state) {
    const auto start = Clock::now();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
      Tiles& t = tiles[n(omp_get_thread_num())];
#else
      Tiles& t = tiles[0];
#endif
      for (Index rep = 0; rep < kReps; ++rep) {
        attnkit::gemm::gemm(bk, bq, d, {t.k.data(), d, 1}, t.qt.data(), bq, t.st.data(), bq, false);
        attnkit::gemm::gemm(bq, d, bk, {t.st.data(), 1, bq}, t.v.data(), d, t.o.data(), d, true);
      }
      benchmark::DoNotOptimize(t.o.data());
    }
    best = std::min(best, Clock::now() - start);
  }
  const double flops_per_round = 4.0 * bq * bk * double(d) * kReps * threads;
  return flops_per_round / std::chrono::duration<double>(best).count() / 1e9;
}

/// The clocks time_best() reads around each call: the wall clock, and for kWallAndCpu the
/// process CPU clock too (two more system calls per iteration, outside the wall-time window).
enum class Clocks { kWall, kWallAndCpu };

/// Runs call() once per iteration of `state` and keeps its best iteration under `key` in
/// best_times(): the wall clock brackets call() alone, the CPU clock (if read) brackets that.
/// The best, not the mean, because this machine is shared: a slowed iteration is noise.
template <class Call>
void time_best(benchmark::State& state, const std::string& key, Clocks clocks, Call&& call) {
  const bool read_cpu = clocks == Clocks::kWallAndCpu;
  Best& best = best_times()[key];
  for (auto _ : state) {
    const std::clock_t cpu_start = read_cpu ? std::clock() : 0;
    const auto start = std::chrono::steady_clock::now();
    call();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = read_cpu ? double(std::clock() - cpu_start) / CLOCKS_PER_SEC : 0;
    if (wall < best.seconds) best = Best{wall, cpu};
    benchmark::ClobberMemory();  // what call() wrote counts as used
  }
}

/// The tile GEMM in cache on one square problem, one thread: C[n, n] = A[n, n] B[n, n], its
/// best iteration kept under "tile_peak" (GFLOP/s counter). The baseline of the chunked linear
/// forms (bench_linear, bench_gated): their GEMMs are of this kind, smaller.
inline void square_tile_peak(benchmark::State& state, attnkit::Index n) {
  const auto size = static_cast<std::size_t>(n * n);
  std::vector<float> a(size, 0.5f), b = a, c = a;
  time_best(state, "tile_peak", Clocks::kWallAndCpu, [&] {
    attnkit::gemm::gemm(n, n, n, {a.data(), n, 1}, b.data(), n, c.data(), n, false);
  });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

/// A row of a summary table that sets a variant against its baseline: the variant's name and
/// the target for time / baseline time, as printed ("<= 1.05", "baseline", "- (none)") and as
/// a number (0: none).
struct TargetRow {
  const char* name;
  const char* target;
  double limit;
};

/// The "/ <baseline>" and "met" cells of a row that took `seconds`: seconds / base->seconds
/// ("%.3f") and whether that is at most `limit` (yes / no; "-" where limit is 0); both "-"
/// where the baseline did not run.
struct TimeRatio {
  std::string ratio = "-", met = "-";
};
inline TimeRatio time_ratio(double seconds, const Best* base, double limit) {
  TimeRatio cells;
  if (base == nullptr) return cells;
  const double r = seconds / base->seconds;
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", r);
  cells.ratio = text;
  if (limit > 0) cells.met = r <= limit ? "yes" : "no";
  return cells;
}

/// Prints a TargetRow's line of a summary table for the benchmark row.name + suffix against
/// baseline + suffix, run on `threads` at `flops` per iteration: "| <cells> | ms | GFLOP/s |
/// / <baseline> | target | met | cpu |". Nothing where the benchmark did not run.
inline void print_target_row(const TargetRow& row, const std::string& cells,
                             const std::string& baseline, const std::string& suffix, int threads,
                             double flops) {
  const Best* best = find_best(row.name + suffix);
  if (best == nullptr) return;
  const TimeRatio to_base = time_ratio(best->seconds, find_best(baseline + suffix), row.limit);
  std::printf("| %s | %.1f | %.1f | %s | %s | %s | %.0f%% |\n", cells.c_str(), best->seconds * 1e3,
              flops / best->seconds / 1e9, to_base.ratio.c_str(), row.target, to_base.met.c_str(),
              100 * best->busy(threads));
}

/// Prints the header row of a Markdown summary table, `columns` ("| ms | GB/s |"), and the
/// rule under it, one "---" per column.
inline void print_table_head(const std::string& columns) {
  std::string rule = "|";
  for (std::size_t bar = columns.find('|', 1); bar != std::string::npos;
       bar = columns.find('|', bar + 1))
    rule += "---|";
  std::printf("%s\n%s\n", columns.c_str(), rule.c_str());
}

/// Prints the heading of a summary table that sets variants against a baseline: "### <what>:"
/// with the ISA and the shape (H heads of L tokens, head dim d, B 1, f32, BSHD, then
/// `shape_note`), what the GFLOP/s and ratio columns mean (`columns_note`) with the notes on
/// ms and cpu every such table shares, and the column heads.
inline void print_target_heading(const char* what, Index dim, Index len, Index heads,
                                 const char* shape_note, const char* columns_note,
                                 const std::string& columns) {
  std::printf(
      "\n### %s: ISA %s, d=%ld, L=%ld, H=%ld, B=1, f32, BSHD%s\n\n"
      "ms = best iteration over the repetitions (default 3); %s;\ncpu = process CPU time / "
      "(wall x threads) of that iteration: well under 100%% means other\nprocesses took the "
      "cores, and the row measures the machine.\n\n",
      what, ak::simd::kArchName, long(dim), long(len), long(heads), shape_note, columns_note);
  print_table_head(columns);
}

/// A counter of `amount` per iteration (GFLOP, GB) that the library turns into a rate per
/// second of the run; the console prints it without "/s" (PlainConsoleReporter).
inline benchmark::Counter per_second(double amount) {
  return benchmark::Counter(amount, benchmark::Counter::kIsIterationInvariantRate);
}

/// Registers `run` (a callable on benchmark::State&) as `name`, timed in wall-clock
/// milliseconds: the work runs on OpenMP threads, not on the benchmark's own thread. With
/// `min_seconds`, each repetition runs at least that long (else --benchmark_min_time).
template <class Run>
void register_timed(const std::string& name, Run run, double min_seconds = 0) {
  benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(name.c_str(), std::move(run));
  b->Unit(benchmark::kMillisecond)->UseRealTime();
  if (min_seconds > 0) b->MinTime(min_seconds);
}

/// benchmark::Initialize with `defaults` placed before the user's flags (a later flag wins),
/// so a default such as --benchmark_min_time stays out of every benchmark's name and the
/// command line can still change it. False when an argument is not recognized.
inline bool initialize(int argc, char** argv, std::initializer_list<const char*> defaults) {
  static std::vector<std::string> storage;  // argv must outlive the library's use of it
  storage.assign(defaults.begin(), defaults.end());
  std::vector<char*> args{argv[0]};
  for (std::string& flag : storage) args.push_back(flag.data());
  args.insert(args.end(), argv + 1, argv + argc);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  return !benchmark::ReportUnrecognizedArguments(count, args.data());
}

/// Tells the report (scripts/bench_report.py) which family this bench's rows belong to
/// ("dense", "masks", ...), its head count (time per head lets benches of different H share
/// a plot) and its sequence length where the names do not carry "L:<n>" (0: they do), plus
/// the ISA and CPU model for plot titles. Goes to the JSON context; call before running.
inline void report_context(const std::string& family, attnkit::Index heads, attnkit::Index len) {
  benchmark::AddCustomContext("attnkit_family", family);
  benchmark::AddCustomContext("attnkit_heads", std::to_string(heads));
  if (len > 0) benchmark::AddCustomContext("attnkit_len", std::to_string(len));
  benchmark::AddCustomContext("attnkit_isa", attnkit::simd::kArchName);
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      benchmark::AddCustomContext("attnkit_cpu", line.substr(line.find(':') + 2));
      break;
    }
}

/// Names the in-run baseline of `variant` (the first '/'-part of a benchmark name) for the
/// report: a row "<variant>/<rest>" is compared with "<baseline>/<rest>" of the same file.
inline void report_baseline(const std::string& variant, const std::string& baseline) {
  benchmark::AddCustomContext("attnkit_baseline:" + variant, baseline);
}

class PlainConsoleReporter : public benchmark::ConsoleReporter {
 public:
  PlainConsoleReporter() : ConsoleReporter(OO_Tabular) {}  // plain text: readable in CTest logs

  // The library's context, with Debian's "Library was built as DEBUG" warning explained.
  // It concerns libbenchmark itself: Debian compiles the package -O2 but without NDEBUG,
  // so its assertions stay on. The timed loops are inlined here, built -O3.
  bool ReportContext(const Context& context) override {
    std::ostream& err = GetErrorStream();
    std::ostringstream text;
    SetErrorStream(&text);
    const bool ok = ConsoleReporter::ReportContext(context);
    SetErrorStream(&err);
    std::istringstream lines(text.str());
    for (std::string line; std::getline(lines, line);) {
      if (line.find("Library was built as DEBUG") != std::string::npos)
        line =
            "(libbenchmark is the distribution's build without NDEBUG; its 'built as DEBUG'"
            " warning is about the library's own assertions, not the timed code, built -O3)";
      err << line << '\n';
    }
    return ok;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> shown = runs;
    for (Run& run : shown)
      for (auto& counter : run.counters)  // rates are final; without this the console adds "/s"
        counter.second.flags = benchmark::Counter::kDefaults;
    ConsoleReporter::ReportRuns(shown);
  }
};

/// The end of a bench's main(): initialize() with `defaults`, the benchmarks the command line
/// selects through PlainConsoleReporter, then print_summary() (the bench's tables, read from
/// best_times()). Returns main()'s exit code: 1 where an argument is not recognized.
template <class Summary>
int run_benchmarks(int argc, char** argv, std::initializer_list<const char*> defaults,
                   Summary print_summary) {
  if (!initialize(argc, argv, defaults)) return 1;
  PlainConsoleReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary();
  return 0;
}

}  // namespace attnkit_bench
