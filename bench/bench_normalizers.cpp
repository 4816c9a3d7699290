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
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kDim = 128, kLen = 4096, kHeads = 4;

double flops(bool causal) {
  const double full = 4.0 * double(kHeads) * double(kLen) * double(kLen) * double(kDim);
  return causal ? full / 2 : full;
}

// Times attention with `spec` under `key` ("<normalizer>/<mask>/threads:<n>"), with the CPU
// clock: the summary's cpu column tells a real result from a machine other processes took.
template <class Spec>
void bench_normalizer(benchmark::State& state, const std::string& key, const Spec& spec,
                      bool causal, int threads) {
  attnkit_bench::BshdBuffers& buf = attnkit_bench::shared_buffers(kLen, kHeads, kDim);
  const auto options = ak::Options{}.with_threads(threads);
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWallAndCpu, [&] {
    ak::attention(spec, buf.in(buf.q), buf.in(buf.k), buf.in(buf.v), buf.out(), options);
  });
  state.counters["GFLOP/s"] = attnkit_bench::per_second(flops(causal) / 1e9);
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
      attnkit_bench::register_timed(key, run);
    }
}

void print_summary() {
  const attnkit_bench::TargetRow rows[] = {
      {"softmax", "baseline", 0},         {"sigmoid", "<= 1.00", 1.0},
      {"softmax_sinks", "<= 1.02", 1.02}, {"relu_power2", "- (none)", 0},
      {"lssa", "<= 1.15", 1.15},          {"lssar", "<= 2.20", 2.2}};
  attnkit_bench::print_target_heading(
      "Normalizers vs softmax", kDim, kLen, kHeads, "",
      "GFLOP/s = 4 H L^2 d / time (halved\nfor causal); / softmax = time / softmax time, same "
      "mask and threads; target from issue 7",
      "| normalizer | mask | threads | ms | GFLOP/s | / softmax | target | met | cpu |");
  for (const attnkit_bench::TargetRow& row : rows)
    for (const char* mask : {"full", "causal"})
      for (const int threads : {1, 2}) {
        const std::string t = std::to_string(threads);
        attnkit_bench::print_target_row(row, std::string(row.name) + " | " + mask + " | " + t,
                                        "softmax", std::string("/") + mask + "/threads:" + t,
                                        threads, flops(mask[0] == 'c'));
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
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.2", "--benchmark_repetitions=3"}, print_summary);
}
