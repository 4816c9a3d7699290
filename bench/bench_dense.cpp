// Dense attention: attnkit::attention() against two baselines measured in the same run —
// an unfused Eigen implementation (GEMM, softmax, GEMM over a materialized [L, L] matrix)
// and a GEMM roofline (the same two Eigen GEMMs without the softmax). Counters: GFLOP/s
// (4 * B * H * Lq * Lk * d useful FLOPs, halved for causal) and bytes of Q, K, V, O.
// After the usual table, a summary prints the ratios per shape.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ak = attnkit;
using ak::Index;

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

// Q, K, V, O in BHSD layout, filled once per shape.
struct Buffers {
  std::vector<float> q, k, v, o;
  explicit Buffers(const Shape& s) {
    const auto n = static_cast<std::size_t>(kBatch * kHeads * s.len * s.dim);
    q.resize(n);
    k.resize(n);
    v.resize(n);
    o.resize(n);
    std::mt19937 rng(42);
    std::normal_distribution<float> dist;
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = dist(rng);
  }
  ak::View<float> view(std::vector<float>& t, const Shape& s) {
    return ak::bhsd(t.data(), kBatch, kHeads, s.len, s.dim);
  }
};

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

void set_counters(benchmark::State& state, const Shape& s) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(s.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes"] = benchmark::Counter(
      s.bytes(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
}

// attnkit with the given score policy (Dot, or Softcap to price a score mod).
template <class Score>
void BM_Attention_Attnkit(benchmark::State& state, Shape s, Score score) {
  Buffers buf(s);
  const auto q = buf.view(buf.q, s), k = buf.view(buf.k, s), v = buf.view(buf.v, s),
             o = buf.view(buf.o, s);
  const auto options = ak::Options{}.with_threads(s.threads);
  for (auto _ : state) {
    if (s.causal)
      ak::attention(ak::make_spec(score, ak::Causal{}), q, k, v, o, options);
    else
      ak::attention(ak::make_spec(score), q, k, v, o, options);
    benchmark::DoNotOptimize(buf.o.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
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
  for (auto _ : state) {
    per_head(s, buf, scores, body);
    benchmark::DoNotOptimize(buf.o.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, s);
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

// The in-cache peak of attnkit's own tile GEMM on the kernel's two tile products,
// S^T[Bk, Bq] = K[Bk, d] Q^T[d, Bq] and O[Bq, d] += P[Bq, Bk] V[Bk, d], repeated on the same
// buffers: the FLOP rate attention could reach if the softmax, masking and memory traffic
// were free. An upper bound, where the Eigen "roofline" on [L, L] matrices is not one.
void BM_Gemm_TilePeak(benchmark::State& state, Shape s) {
  constexpr Index bq = ak::TileConfig::kBlockQ, bk = ak::TileConfig::kBlockK, kReps = 64;
  const Index d = s.dim;
  const double flops_per_rep = 4.0 * bq * bk * double(d);
  for (auto _ : state) {
#ifdef _OPENMP
#pragma omp parallel num_threads(s.threads)
#endif
    {
      std::vector<float> k(bk * d, 0.5f), qt(d * bq, 0.25f), st(bk * bq), v(bk * d, 0.5f),
          o(bq * d, 0.f);
      for (Index rep = 0; rep < kReps; ++rep) {
        ak::gemm::gemm(bk, bq, d, {k.data(), d, 1}, qt.data(), bq, st.data(), bq, false);
        ak::gemm::gemm(bq, d, bk, {st.data(), 1, bq}, v.data(), d, o.data(), d, true);
      }
      benchmark::DoNotOptimize(o.data());
    }
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_rep * kReps * s.threads / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Remembers GFLOP/s per benchmark name and prints the ratios after the run.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  SummaryReporter() : ConsoleReporter(OO_Tabular) {}  // plain text: readable in CTest logs

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs)
      if (run.run_type == Run::RT_Iteration && !run.error_occurred)
        gflops_[run.run_name.function_name] = run.counters.at("GFLOP/s").value;
  }

  void print_summary(const std::vector<Shape>& shapes) const {
    std::printf(
        "\nSummary (GFLOP/s; causal counts half the FLOPs; roofline = dense Eigen GEMMs;"
        " peak = attnkit's tile GEMM in cache;\n softcap = attnkit with Softcap{30};"
        " softcap/ = its speed relative to attnkit)\n");
    std::printf("%5s %6s %6s %7s | %8s %8s %8s %8s %8s | %9s %9s %9s %9s %9s\n", "d", "L", "causal",
                "threads", "attnkit", "softcap", "unfused", "roofline", "peak", "/peak",
                "/roofline", "/unfused", "2T/1T", "softcap/");
    for (const Shape& s : shapes) {
      const double a = get(s.name("attnkit")), u = get(s.name("unfused"));
      const double c = get(s.name("attnkit_softcap"));
      const double r = get(Shape{s.dim, s.len, false, s.threads}.name("roofline"));
      const double one = get(Shape{s.dim, s.len, s.causal, 1}.name("attnkit"));
      const double peak = get(Shape{s.dim, 0, false, s.threads}.name("tile_peak"));
      if (a <= 0) continue;  // filtered out
      std::printf("%5td %6td %6d %7d | %8.1f %8.1f %8.1f %8.1f %8.1f | %9s %9s %9s %9s %9s\n",
                  s.dim, s.len, int(s.causal), s.threads, a, c, u, r, peak, ratio(a, peak).c_str(),
                  ratio(a, r).c_str(), ratio(a, u).c_str(),
                  s.threads > 1 ? ratio(a, one).c_str() : "", ratio(c, a).c_str());
    }
  }

 private:
  double get(const std::string& name) const {
    const auto it = gflops_.find(name);
    return it == gflops_.end() ? 0.0 : it->second;
  }
  static std::string ratio(double a, double b) {
    if (b <= 0) return "-";
    char text[32];
    std::snprintf(text, sizeof text, "%.2fx", a / b);
    return text;
  }
  std::map<std::string, double> gflops_;
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
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.3);
  };
  for (const Index dim : {64, 128})
    for (const int threads : {1, 2}) {
      const Shape tile{dim, 0, false, threads};
      add(tile.name("tile_peak"), BM_Gemm_TilePeak, tile);
    }
  for (const Shape& s : shapes) {
    add(s.name("attnkit"), BM_Attention_Attnkit<ak::Dot>, s, ak::Dot{});
    add(s.name("attnkit_softcap"), BM_Attention_Attnkit<ak::Softcap>, s, ak::Softcap{30.f});
    add(s.name("unfused"), BM_Attention_Unfused, s);
    if (!s.causal) add(s.name("roofline"), BM_Gemm_Roofline, s);
  }

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("attnkit bench_dense: B=%td H=%td, SIMD %s (%d lanes), OpenMP %s\n", kBatch, kHeads,
              ak::simd::kArchName, ak::simd::kWidth,
#ifdef _OPENMP
              "on"
#else
              "off"
#endif
  );
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary(shapes);
  benchmark::Shutdown();
  return 0;
}
