// Dense attention: attnkit::attention() against two baselines measured in the same run —
// an unfused Eigen implementation (GEMM, softmax, GEMM over a materialized [L, L] matrix)
// and a GEMM roofline (the same two Eigen GEMMs without the softmax). Counters: GFLOP/s
// (4 * B * H * Lq * Lk * d useful FLOPs, halved for causal), bytes/s of Q, K, V, O, and
// others% (CPU that other processes took during the run: this machine is shared). After
// the usual table, a summary prints the ratios per shape; then the bf16-products table
// (bench_dense_products.hpp).
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_dense_products.hpp"
#include "bench_support.hpp"

namespace {

constexpr Index kBatch = 1, kHeads = 8;

struct Shape {
  Index dim, len;
  bool causal;
  int threads;

  std::string name(const char* impl) const {
    return std::string(impl) + "/d:" + std::to_string(dim) + "/L:" + std::to_string(len) +
           "/causal:" + std::to_string(causal) + "/threads:" + std::to_string(threads);
  }
  double flops() const {
    const double dense = 4.0 * kBatch * kHeads * double(len) * double(len) * double(dim);
    return causal ? dense / 2 : dense;
  }
  double bytes() const { return 4.0 * sizeof(float) * kBatch * kHeads * len * dim; }
};

// Q, K, V, O in BHSD layout (or BSHD, the layout of a model's projections: rows of one head
// kHeads * d floats apart), filled once per shape.
struct Buffers : attnkit_bench::QkvoBuffers {
  explicit Buffers(const Shape& s, bool bshd = false)
      : QkvoBuffers(static_cast<std::size_t>(kBatch * kHeads * s.len * s.dim)), bshd_(bshd) {}
  ak::View<float> view(std::vector<float>& t, const Shape& s) {
    return bshd_ ? ak::bshd(t.data(), kBatch, s.len, kHeads, s.dim)
                 : ak::bhsd(t.data(), kBatch, kHeads, s.len, s.dim);
  }

 private:
  bool bshd_;
};

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

// CPU time that other processes, and the hypervisor (steal), took while a benchmark ran, in
// percent of one core: all busy time in /proc/stat minus this process's own CPU time. On a
// shared 2-core VM it tells a real result from noise: a 2-thread run needs both cores.
class OthersProbe {
 public:
  OthersProbe() : busy0_(system_busy()), own0_(own_cpu()), wall0_(Clock::now()) {}

  /// Percent of one core; -1 where /proc/stat is not available.
  double percent() const {
    const double busy = system_busy(), wall = seconds(Clock::now() - wall0_);
    if (busy < 0 || busy0_ < 0 || wall <= 0) return -1;
    return std::max(0.0, 100 * ((busy - busy0_) - (own_cpu() - own0_)) / wall);
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::duration t) { return std::chrono::duration<double>(t).count(); }

  // Seconds all CPUs spent on anything but idle and I/O wait since boot.
  static double system_busy() {
    std::FILE* f = std::fopen("/proc/stat", "r");
    if (f == nullptr) return -1;
    unsigned long long user, nice, system, idle, iowait, irq, softirq, steal;
    const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice,
                              &system, &idle, &iowait, &irq, &softirq, &steal);
    std::fclose(f);
    if (n != 8) return -1;
    return double(user + nice + system + irq + softirq + steal) / double(sysconf(_SC_CLK_TCK));
  }
  static double own_cpu() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }

  double busy0_, own0_;
  Clock::time_point wall0_;
};

void set_others(benchmark::State& state, const OthersProbe& probe) {
  const double percent = probe.percent();
  if (percent >= 0) state.counters["others%"] = std::round(percent);
}

// Rates, computed by the library from the run's wall-clock time. The console reporter below
// prints them without the library's "/s" suffix: the column names carry the unit.
void set_counters(benchmark::State& state, const Shape& s, const OthersProbe& probe) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(s.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] =
      benchmark::Counter(s.bytes(), benchmark::Counter::kIsIterationInvariantRate);
  set_others(state, probe);
}

// attnkit with the given score policy (Dot, or Softcap to price a score mod), on BHSD or
// BSHD buffers.
template <class Score>
void BM_Attention_Attnkit(benchmark::State& state, Shape s, Score score, bool bshd) {
  Buffers buf(s, bshd);
  const auto q = buf.view(buf.q, s), k = buf.view(buf.k, s), v = buf.view(buf.v, s),
             o = buf.view(buf.o, s);
  const auto options = ak::Options{}.with_threads(s.threads);
  const OthersProbe probe;
  for (auto _ : state) {
    if (s.causal)
      ak::attention(ak::make_spec(score, ak::Causal{}), q, k, v, o, options);
    else
      ak::attention(ak::make_spec(score), q, k, v, o, options);
    benchmark::DoNotOptimize(buf.o.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s, probe);
}

// attnkit with bf16 products (Products::Bf16) on one kernel of the mode, same inputs.
void BM_Attention_Bf16(benchmark::State& state, Shape s, ak::gemm::Bf16Kernel kernel) {
  Buffers buf(s);
  const auto q = buf.view(buf.q, s), k = buf.view(buf.k, s), v = buf.view(buf.v, s),
             o = buf.view(buf.o, s);
  const auto options = ak::Options{}.with_threads(s.threads).with_products(ak::Products::Bf16);
  ak::gemm::bf16_kernel() = kernel;
  const OthersProbe probe;
  for (auto _ : state) {
    if (s.causal)
      ak::attention(ak::make_spec(ak::Causal{}), q, k, v, o, options);
    else
      ak::attention(ak::make_spec(ak::Full{}), q, k, v, o, options);
    benchmark::DoNotOptimize(buf.o.data());
    benchmark::ClobberMemory();
  }
  ak::gemm::bf16_kernel() = ak::gemm::Bf16Kernel::Auto;
  set_counters(state, s, probe);
}

// Runs body(Q, K, V, O, S) for every head: Eigen maps [L, d] of that head's buffers and a
// [L, L] score matrix of the running thread, allocated outside the timed loop. Heads are
// spread over s.threads threads, as attnkit spreads its work; Eigen itself stays serial.
template <class Body>
void per_head(const Shape& s, Buffers& buf, std::vector<RowMatrix>& scores, Body body) {
  const Index per_head_size = s.len * s.dim;
#ifdef _OPENMP
#pragma omp parallel for num_threads(s.threads) schedule(static)
#endif
  for (Index h = 0; h < kBatch * kHeads; ++h) {
#ifdef _OPENMP
    RowMatrix& S = scores[static_cast<std::size_t>(omp_get_thread_num())];
#else
    RowMatrix& S = scores[0];
#endif
    const Index at = h * per_head_size;
    body(ConstMap(buf.q.data() + at, s.len, s.dim), ConstMap(buf.k.data() + at, s.len, s.dim),
         ConstMap(buf.v.data() + at, s.len, s.dim), Map(buf.o.data() + at, s.len, s.dim), S);
  }
}

// Times `body` as a baseline: per-thread score matrices, heads in parallel.
template <class Body>
void run_baseline(benchmark::State& state, const Shape& s, Body body) {
  Eigen::setNbThreads(1);
  Buffers buf(s);
  std::vector<RowMatrix> scores(static_cast<std::size_t>(s.threads), RowMatrix(s.len, s.len));
  const OthersProbe probe;
  for (auto _ : state) {
    per_head(s, buf, scores, body);
    benchmark::DoNotOptimize(buf.o.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s, probe);
}

// The textbook implementation: S = scale Q K^T (masked), P = softmax(S), O = P V.
void BM_Attention_Unfused(benchmark::State& state, Shape s) {
  const float scale = 1.f / std::sqrt(float(s.dim));
  run_baseline(state, s, [&](ConstMap Q, ConstMap K, ConstMap V, Map O, RowMatrix& S) {
    S.noalias() = (Q * K.transpose()) * scale;
    if (s.causal)
      S.triangularView<Eigen::StrictlyUpper>().setConstant(-std::numeric_limits<float>::infinity());
    S = (S.colwise() - S.rowwise().maxCoeff()).array().exp().matrix();
    const Eigen::VectorXf inv_sum = S.rowwise().sum().cwiseInverse();
    O.noalias() = inv_sum.asDiagonal() * (S * V);
  });
}

// The two GEMMs of attention alone (S = Q K^T, O = S V): what Eigen's GEMM reaches on
// these shapes. Always dense; causal attention is compared against it at half the FLOPs.
void BM_Gemm_Roofline(benchmark::State& state, Shape s) {
  run_baseline(state, s, [](ConstMap Q, ConstMap K, ConstMap V, Map O, RowMatrix& S) {
    S.noalias() = Q * K.transpose();
    O.noalias() = S * V;
  });
}

// The in-cache peak of attnkit's own tile GEMM on the kernel's two tile products
// (attnkit_bench::tile_gemm_peak: the best round, an upper bound, where the Eigen "roofline"
// on [L, L] matrices is not one; a mean once read 2.6x low).
void BM_Gemm_TilePeak(benchmark::State& state, Index d, int threads) {
  const OthersProbe probe;
  state.counters["GFLOP/s"] = attnkit_bench::tile_gemm_peak(state, d, threads);
  set_others(state, probe);
  state.SetLabel("best of " + std::to_string(state.iterations()) + " rounds");
}

std::string peak_name(Index dim, int threads) {
  return "tile_peak/d:" + std::to_string(dim) + "/threads:" + std::to_string(threads);
}

// The console table, minus two distractions, then the ratios per shape.
class SummaryReporter : public attnkit_bench::PlainConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    PlainConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const auto others = run.counters.find("others%");
      const Result result{run.counters.at("GFLOP/s").value,
                          others == run.counters.end() ? -1.0 : others->second.value};
      Result& kept = results_[run.run_name.function_name];
      if (result.gflops > kept.gflops) kept = result;  // the best repetition
    }
  }

  /// attnkit on BSHD buffers against BHSD, same shape and run: 1.0x means the layout is free.
  void print_layouts(const std::vector<Shape>& shapes) const {
    std::printf("\nBSHD (H %td: a head's rows H d floats apart) against BHSD, GFLOP/s:\n", kHeads);
    for (const Shape& s : shapes) {
      const Result a = get(s.name("attnkit")), b = get(s.name("attnkit_bshd"));
      if (a.gflops > 0 && b.gflops > 0)
        std::printf("  d %td L %td causal %d threads %d: bshd %.1f bhsd %.1f (%s)\n", s.dim, s.len,
                    int(s.causal), s.threads, b.gflops, a.gflops, ratio(b, a).c_str());
    }
  }

  /// The best GFLOP/s of a row (0 when it did not run).
  double gflops(const std::string& name) const { return get(name).gflops; }

  void print_summary(const std::vector<Shape>& shapes) const {
    std::fputs(
        "\nSummary (GFLOP/s, the best repetition; causal counts half the FLOPs; roofline ="
        " dense Eigen GEMMs;\n peak = attnkit's tile GEMM in cache, best round; softcap ="
        " attnkit with Softcap{30}; softcap/ = its speed\n relative to attnkit; others% = the"
        " most CPU other processes took during one of the row's runs,\n in % of one core:"
        " from about 10 on, the row's ratios measure the machine, not the code)\n",
        stdout);
    std::printf("%5s %6s %6s %7s | %8s %8s %8s %8s %8s | %7s %9s %8s %6s %8s | %7s\n", "d", "L",
                "causal", "threads", "attnkit", "softcap", "unfused", "roofline", "peak", "/peak",
                "/roofline", "/unfused", "2T/1T", "softcap/", "others%");
    for (const Shape& s : shapes) {
      const Result a = get(s.name("attnkit")), u = get(s.name("unfused"));
      const Result c = get(s.name("attnkit_softcap"));
      const Result r = get(Shape{s.dim, s.len, false, s.threads}.name("roofline"));
      const Result one = get(Shape{s.dim, s.len, s.causal, 1}.name("attnkit"));
      const Result peak = get(peak_name(s.dim, s.threads));
      if (a.gflops <= 0) continue;  // filtered out
      const double others = std::max(
          {a.others, c.others, u.others, r.others, peak.others, s.threads > 1 ? one.others : -1.0});
      std::printf("%5td %6td %6d %7d | %8.1f %8.1f %8.1f %8.1f %8.1f | %7s %9s %8s %6s %8s | %7s\n",
                  s.dim, s.len, int(s.causal), s.threads, a.gflops, c.gflops, u.gflops, r.gflops,
                  peak.gflops, ratio(a, peak).c_str(), ratio(a, r).c_str(), ratio(a, u).c_str(),
                  s.threads > 1 ? ratio(a, one).c_str() : "", ratio(c, a).c_str(),
                  others < 0 ? "-" : std::to_string(int(others)).c_str());
    }
  }

 private:
  struct Result {
    double gflops = 0, others = -1;  // others: -1 where unknown
  };
  Result get(const std::string& name) const {
    const auto it = results_.find(name);
    return it == results_.end() ? Result{} : it->second;
  }
  static std::string ratio(const Result& a, const Result& b) {
    if (a.gflops <= 0 || b.gflops <= 0) return "-";
    char text[32];
    std::snprintf(text, sizeof text, "%.2fx", a.gflops / b.gflops);
    return text;
  }
  std::map<std::string, Result> results_;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (const Index dim : {64, 128})
    for (const Index len : {1024, 2048, 4096})
      for (const bool causal : {false, true})
        for (const int threads : {1, 2}) shapes.push_back({dim, len, causal, threads});

  // Wall-clock time: the work runs on OpenMP threads, not the benchmark's own thread.
  const auto add = [](const std::string& name, auto fn, const auto&... args) {
    benchmark::RegisterBenchmark(name.c_str(), fn, args...)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (const Index dim : {64, 128})
    for (const int threads : {1, 2}) add(peak_name(dim, threads), BM_Gemm_TilePeak, dim, threads);
  for (const Shape& s : shapes) {
    add(s.name("attnkit"), BM_Attention_Attnkit<ak::Dot>, s, ak::Dot{}, false);
    add(s.name("attnkit_softcap"), BM_Attention_Attnkit<ak::Softcap>, s, ak::Softcap{30.f}, false);
    if (s.len == 4096 && s.causal)
      add(s.name("attnkit_bshd"), BM_Attention_Attnkit<ak::Dot>, s, ak::Dot{}, true);
    add(s.name("unfused"), BM_Attention_Unfused, s);
    if (!s.causal) add(s.name("roofline"), BM_Gemm_Roofline, s);
  }
  const std::vector<Shape> product_shapes = bench_products::shapes<Shape>();
  add("fma_peak/threads:1", bench_products::BM_InstructionPeak, true);
  if (ak::gemm::kHasBf16Dot) add("dot_peak/threads:1", bench_products::BM_InstructionPeak, false);
  for (const Shape& s : product_shapes) {
    if (std::find_if(shapes.begin(), shapes.end(),
                     [&](const Shape& t) { return t.name("") == s.name(""); }) == shapes.end())
      add(s.name("attnkit"), BM_Attention_Attnkit<ak::Dot>, s, ak::Dot{}, false);
    for (const auto kernel : bench_products::kernels())
      add(s.name(bench_products::variant(kernel)), BM_Attention_Bf16, s, kernel);
  }

  attnkit_bench::report_context("dense", kBatch * kHeads, 0);
  attnkit_bench::report_baseline("attnkit", "unfused");
  attnkit_bench::report_baseline("attnkit_softcap", "attnkit");
  attnkit_bench::report_baseline("attnkit_bshd", "attnkit");
  attnkit_bench::report_baseline("bf16_fma", "attnkit");
  attnkit_bench::report_baseline("bf16_dot", "attnkit");
  // 0.3 s per benchmark unless the command line says otherwise.
  if (!attnkit_bench::initialize(argc, argv, {"--benchmark_min_time=0.3"})) return 1;
  std::printf("attnkit bench_dense: B=%td H=%td, SIMD %s (%d lanes), OpenMP %s\n", kBatch, kHeads,
              ak::simd::kArchName, ak::simd::kWidth,
#ifdef _OPENMP
              "on"
#else
              "off"
#endif
  );
  std::fflush(stdout);  // before the library's context, which goes to stderr
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary(shapes);
  reporter.print_layouts(shapes);
  bench_products::print_summary<Shape>(
      product_shapes, [&reporter](const std::string& name) { return reporter.gflops(name); });
  benchmark::Shutdown();
  return 0;
}
