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
#include <cstdio>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kDim = 128, kLen = 4096, kHeads = 4;

constexpr double kCausalFlops = 2.0 * double(kHeads) * double(kLen) * double(kLen) * double(kDim);

// Times call(buf, options), which writes the output buffer of `buf`, under `key`
// ("<encoding>/causal/threads:<n>"), with the CPU clock: the summary's cpu column tells a real
// result from a machine other processes took.
template <class Call>
void bench_position(benchmark::State& state, const std::string& key, int threads, Call call) {
  attnkit_bench::BshdBuffers& buf = attnkit_bench::shared_buffers(kLen, kHeads, kDim);
  const auto options = ak::Options{}.with_threads(threads);
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWallAndCpu,
                           [&] { call(buf, options); });
  state.counters["GFLOP/s"] = attnkit_bench::per_second(kCausalFlops / 1e9);
}

// Registers `name` under both thread counts; make_call(threads) gives the timed callable.
template <class MakeCall>
void add_call(const std::string& name, MakeCall make_call) {
  if (name != "none") attnkit_bench::report_baseline(name, "none");
  for (const int threads : {1, 2}) {
    const std::string key = name + "/causal/threads:" + std::to_string(threads);
    auto run = [=](benchmark::State& s) { bench_position(s, key, threads, make_call()); };
    attnkit_bench::register_timed(key, run);
  }
}

// An encoding fused into attention(), given as its whole causal spec.
template <class Spec>
void add(const std::string& name, const Spec& spec) {
  add_call(name, [spec] {
    return [spec](attnkit_bench::BshdBuffers& buf, const ak::Options& options) {
      ak::attention(spec, buf.in(buf.q), buf.in(buf.k), buf.in(buf.v), buf.out(), options);
    };
  });
}

// The same encoding applied standalone -- q and k copied, turned in place by
// apply_position(), then plain causal attention: what a caller without fusion would do.
template <class Position>
void add_standalone(const std::string& name, const Position& position) {
  add_call(name, [position] {
    return [position](attnkit_bench::BshdBuffers& buf, const ak::Options& options) {
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

// One row per encoding, in print order; a row without a benchmark is skipped.
constexpr attnkit_bench::TargetRow kRows[] = {
    {"none", "baseline", 0},   {"alibi", "<= 1.05", 1.05},
    {"rope", "<= 1.08", 1.08}, {"rope_standalone", "- (rope < it)", 0},
    {"fope", "<= 1.08", 1.08}, {"fope_standalone", "- (fope < it)", 0},
    {"tapa", "<= 1.30", 1.30}};

void print_summary() {
  attnkit_bench::print_target_heading(
      "Positional encodings vs none", kDim, kLen, kHeads, ", causal",
      "GFLOP/s = 2 H L^2 d / time; / none =\ntime / time without position, same threads",
      "| encoding | threads | ms | GFLOP/s | / none | target | met | cpu |");
  for (const attnkit_bench::TargetRow& row : kRows)
    for (const int threads : {1, 2}) {
      const std::string t = std::to_string(threads);
      attnkit_bench::print_target_row(row, std::string(row.name) + " | " + t, "none",
                                      "/causal/threads:" + t, threads, kCausalFlops);
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
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.2", "--benchmark_repetitions=3"}, print_summary);
}
