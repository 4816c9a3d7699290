// What every attnkit benchmark shares: default flags that the command line can override, and
// the console output -- Google Benchmark's table in plain text, without two distractions. Debian's
// "Library was built as DEBUG" warning is replaced by a note on what it means, and rate counters
// print without the "/s" the library appends (the column names carry the unit: GFLOP/s, bytes/s).
// JSON output is unchanged; report_context() and report_baseline() add to it what
// scripts/bench_report.py needs (family, shape, ISA, each variant's in-run baseline).
#pragma once

#include <benchmark/benchmark.h>

#include <attnkit/simd/simd.hpp>
#include <attnkit/tensor.hpp>
#include <cstddef>
#include <fstream>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace attnkit_bench
