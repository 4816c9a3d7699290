// The console output every attnkit benchmark shares: Google Benchmark's table in plain text,
// without two distractions. Debian's "Library was built as DEBUG" warning is replaced by a
// note on what it means, and rate counters print without the "/s" the library appends (the
// column names carry the unit: GFLOP/s, bytes/s). JSON output is unchanged.
#pragma once

#include <benchmark/benchmark.h>

#include <sstream>
#include <string>
#include <vector>

namespace attnkit_bench {

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
