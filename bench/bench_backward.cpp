// The backward pass beside the forward, in the same run: attnkit::attention_backward() against
// attnkit::attention() on the same inputs (full, causal, a causal window of 256, sigmoid, RoPE and
// LSSAR), against an unfused backward (materialized P and dP, Eigen GEMMs: what a user writes
// without a fused kernel) and against the in-cache peak of attnkit's tile GEMM. GFLOP/s count the
// useful FLOPs: 4 H L^2 d for the forward (halved for causal, the window's live pairs for the
// window), 2.5 times that for the backward (five tile products where the forward has two; LSSAR's
// passes multiply more, eight tile products against the forward's three, but the useful FLOPs
// counted are the same). The summary reports bwd / fwd time and the backward's share of the tile
// peak, next to the targets of the backward issue (causal f32, d 128, L 4096: bwd <= 3.0x fwd and
// >= 45% of the peak), and the window's speedup over causal in both directions (a sparse mask
// should keep its live-fraction speedup in backward). ATTNKIT_BENCH_LONG=1 adds L 8192.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kHeads = 4, kWindow = 256;

struct Shape {
  Index dim, len;
  int threads;
  std::string suffix() const {
    return "/d:" + std::to_string(dim) + "/L:" + std::to_string(len) +
           "/threads:" + std::to_string(threads);
  }
};

// Useful forward FLOPs of `variant` on shape s (the window: its live pairs).
double forward_flops(const std::string& variant, const Shape& s) {
  const double full = 4.0 * double(kHeads) * double(s.len) * double(s.len) * double(s.dim);
  if (variant == "full") return full;
  if (variant == "window") {
    const double n = double(s.len), w = double(kWindow);
    const double pairs = n <= w ? n * (n + 1) / 2 : w * (w + 1) / 2 + (n - w) * w;
    return full * pairs / (n * n);
  }
  return full / 2;  // causal, sigmoid, rope, lssar: causal
}

// One shape's buffers, BSHD: Q, K, V, dO drawn once, O and the statistic from one forward call
// per variant, the gradients.
struct Buffers {
  attnkit_bench::BshdBuffers& in;
  std::vector<float> d_o, dq, dk, dv, lse;
  explicit Buffers(const Shape& s)
      : in(attnkit_bench::shared_buffers(s.len, kHeads, s.dim)),
        d_o(in.q.size()),
        dq(in.q.size()),
        dk(in.q.size()),
        dv(in.q.size()),
        lse(static_cast<std::size_t>(kHeads * s.len)) {
    d_o = in.v;  // any fixed values
    std::reverse(d_o.begin(), d_o.end());
  }
  ak::View<float> at(std::vector<float>& t) {
    return ak::bshd(t.data(), 1, in.len, kHeads, in.dim);
  }
};

template <class Spec>
ak::Options options_for(const Spec&, Buffers& buf, int threads) {
  const ak::Options o = ak::Options{}.with_threads(threads);
  if constexpr (ak::detail::row_stat_kind<typename Spec::Normalizer>() == ak::RowStat::None)
    return o;
  else
    return o.with_lse(buf.lse);
}

// fwd_<variant> and bwd_<variant> of `spec` on shape s.
template <class Spec>
void add_pair(const std::string& variant, const Spec& spec, const Shape& s) {
  const std::string fwd = "fwd_" + variant + s.suffix(), bwd = "bwd_" + variant + s.suffix();
  const double flops = forward_flops(variant, s);
  attnkit_bench::register_timed(fwd, [=](benchmark::State& state) {
    Buffers buf(s);
    const ak::Options options = options_for(spec, buf, s.threads);
    attnkit_bench::time_best(state, fwd, attnkit_bench::Clocks::kWallAndCpu, [&] {
      ak::attention(spec, buf.in.in(buf.in.q), buf.in.in(buf.in.k), buf.in.in(buf.in.v),
                    buf.in.out(), options);
    });
    state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
  });
  attnkit_bench::register_timed(bwd, [=](benchmark::State& state) {
    Buffers buf(s);
    const ak::Options options = options_for(spec, buf, s.threads);
    ak::attention(spec, buf.in.in(buf.in.q), buf.in.in(buf.in.k), buf.in.in(buf.in.v), buf.in.out(),
                  options);  // O and its statistic, as training saves them
    attnkit_bench::time_best(state, bwd, attnkit_bench::Clocks::kWallAndCpu, [&] {
      ak::attention_backward(spec, buf.in.in(buf.in.q), buf.in.in(buf.in.k), buf.in.in(buf.in.v),
                             buf.in.in(buf.in.o), buf.at(buf.d_o), buf.at(buf.dq), buf.at(buf.dk),
                             buf.at(buf.dv), options);
    });
    state.counters["GFLOP/s"] = attnkit_bench::per_second(2.5 * flops / 1e9);
  });
}

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strided = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
using StridedOut = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;

// The unfused causal softmax backward, head by head over the threads (Eigen itself serial):
// P = exp(scale Q K^T - lse) (masked), dV = P^T dO, dP = dO V^T, dS = P o (dP - D),
// dQ = scale dS K, dK = scale dS^T Q, with [L, L] matrices P and dP per thread.
void add_unfused(const Shape& s) {
  const std::string name = "unfused_causal" + s.suffix();
  const double flops = 2.5 * forward_flops("causal", s);
  attnkit_bench::register_timed(name, [=](benchmark::State& state) {
    Eigen::setNbThreads(1);
    Buffers buf(s);
    const auto spec = ak::make_spec(ak::Causal{});
    ak::attention(spec, buf.in.in(buf.in.q), buf.in.in(buf.in.k), buf.in.in(buf.in.v), buf.in.out(),
                  ak::Options{}.with_lse(buf.lse));
    std::vector<RowMatrix> p(static_cast<std::size_t>(s.threads), RowMatrix(s.len, s.len));
    std::vector<RowMatrix> dp = p;
    const float scale = 1.f / std::sqrt(float(s.dim));
    const Index ld = kHeads * s.dim, L = s.len, d = s.dim;
    attnkit_bench::time_best(state, name, attnkit_bench::Clocks::kWallAndCpu, [&] {
#ifdef _OPENMP
#pragma omp parallel for num_threads(s.threads) schedule(static)
#endif
      for (Index h = 0; h < kHeads; ++h) {
#ifdef _OPENMP
        const auto t = static_cast<std::size_t>(omp_get_thread_num());
#else
        const std::size_t t = 0;
#endif
        const auto in = [&](std::vector<float>& x) {
          return Strided(x.data() + h * d, L, d, Eigen::OuterStride<>(ld));
        };
        const auto out = [&](std::vector<float>& x) {
          return StridedOut(x.data() + h * d, L, d, Eigen::OuterStride<>(ld));
        };
        RowMatrix& P = p[t];
        RowMatrix& dP = dp[t];
        P.noalias() = in(buf.in.q) * in(buf.in.k).transpose() * scale;
        for (Index i = 0; i < L; ++i) {
          const float m = buf.lse[static_cast<std::size_t>(h * L + i)];
          for (Index j = 0; j < L; ++j) P(i, j) = j <= i ? std::exp(P(i, j) - m) : 0.f;
        }
        out(buf.dv).noalias() = P.transpose() * in(buf.d_o);
        dP.noalias() = in(buf.d_o) * in(buf.in.v).transpose();
        const Eigen::VectorXf delta = in(buf.d_o).cwiseProduct(in(buf.in.o)).rowwise().sum();
        dP = P.cwiseProduct(dP.colwise() - delta);
        out(buf.dq).noalias() = dP * in(buf.in.k) * scale;
        out(buf.dk).noalias() = dP.transpose() * in(buf.in.q) * scale;
      }
    });
    state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
  });
}

std::vector<Shape> shapes() {
  std::vector<Index> lens{1024, 2048, 4096};
  const char* long_run = std::getenv("ATTNKIT_BENCH_LONG");
  if (long_run != nullptr && std::string(long_run) == "1") lens.push_back(8192);
  std::vector<Shape> all;
  for (const Index d : {64, 128})
    for (const Index len : lens)
      for (const int threads : {1, 2}) all.push_back({d, len, threads});
  return all;
}

// The tile GEMM peak of each (d, threads), in GFLOP/s, as measured in this run.
std::map<std::string, double>& peaks() {
  static std::map<std::string, double> all;
  return all;
}
std::string peak_key(Index d, int threads) {
  return "tile_peak/d:" + std::to_string(d) + "/threads:" + std::to_string(threads);
}
double peak_gflops(const Shape& s) {
  const auto it = peaks().find(peak_key(s.dim, s.threads));
  return it == peaks().end() ? 0 : it->second;
}

void print_summary() {
  std::printf(
      "\n### Backward vs forward: ISA %s, H=%ld, B=1, f32, BSHD\n\n"
      "ms = best iteration; bwd GFLOP/s counts 2.5x the forward's useful FLOPs; / peak = that "
      "over the\nin-cache tile GEMM peak of the same run (target >= 0.45 for causal d 128 L "
      "4096); bwd / fwd = time\nratio (target <= 3.0 there); unfused / bwd = the unfused "
      "backward's time over attnkit's;\ncpu = process CPU / (wall x threads) of the backward's "
      "best iteration (well under 100%% = a busy machine).\n\n",
      ak::simd::kArchName, long(kHeads));
  attnkit_bench::print_table_head(
      "| variant | d | L | threads | fwd ms | bwd ms | bwd / fwd | bwd GFLOP/s | / peak | "
      "unfused / bwd | met | cpu |");
  for (const Shape& s : shapes())
    for (const char* variant : {"full", "causal", "window", "sigmoid", "rope", "lssar"}) {
      const std::string v(variant);
      const attnkit_bench::Best* f = attnkit_bench::find_best("fwd_" + v + s.suffix());
      const attnkit_bench::Best* b = attnkit_bench::find_best("bwd_" + v + s.suffix());
      if (f == nullptr || b == nullptr) continue;
      const double peak = peak_gflops(s);
      const double bwd_gflops = 2.5 * forward_flops(v, s) / b->seconds / 1e9;
      const double share = peak > 0 ? bwd_gflops / peak : 0;
      const attnkit_bench::Best* u = attnkit_bench::find_best("unfused_causal" + s.suffix());
      const bool target = v == "causal" && s.dim == 128 && s.len == 4096;
      char unfused[32] = "-";
      if (v == "causal" && u != nullptr)
        std::snprintf(unfused, sizeof unfused, "%.2f", u->seconds / b->seconds);
      std::printf("| %s | %ld | %ld | %d | %.1f | %.1f | %.2f | %.1f | %s | %s | %s | %.0f%% |\n",
                  variant, long(s.dim), long(s.len), s.threads, f->seconds * 1e3, b->seconds * 1e3,
                  b->seconds / f->seconds, bwd_gflops,
                  share > 0 ? std::to_string(share).substr(0, 4).c_str() : "-", unfused,
                  target ? (b->seconds / f->seconds <= 3.0 && share >= 0.45 ? "yes" : "no") : "-",
                  100 * b->busy(s.threads));
    }
  std::printf(
      "\nThe window (causal & SlidingWindow{%ld, 0}) against causal: its live fraction and"
      " its speedup\nin each direction (time causal / time window; ideal = 1 / live).\n\n",
      long(kWindow));
  attnkit_bench::print_table_head("| d | L | threads | live | fwd speedup | bwd speedup |");
  for (const Shape& s : shapes()) {
    const attnkit_bench::Best* fc = attnkit_bench::find_best("fwd_causal" + s.suffix());
    const attnkit_bench::Best* fw = attnkit_bench::find_best("fwd_window" + s.suffix());
    const attnkit_bench::Best* bc = attnkit_bench::find_best("bwd_causal" + s.suffix());
    const attnkit_bench::Best* bw = attnkit_bench::find_best("bwd_window" + s.suffix());
    if (!fc || !fw || !bc || !bw) continue;
    std::printf("| %ld | %ld | %d | %.3f | %.2f | %.2f |\n", long(s.dim), long(s.len), s.threads,
                forward_flops("window", s) / forward_flops("causal", s), fc->seconds / fw->seconds,
                bc->seconds / bw->seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  attnkit_bench::report_context("backward", kHeads, 0);
  for (const char* v : {"full", "causal", "window", "sigmoid", "rope", "lssar"})
    attnkit_bench::report_baseline(std::string("bwd_") + v, std::string("fwd_") + v);
  attnkit_bench::report_baseline("unfused_causal", "bwd_causal");
  for (const Index d : {64, 128})
    for (const int threads : {1, 2}) {
      const std::string key = peak_key(d, threads);
      attnkit_bench::register_timed(key, [=](benchmark::State& state) {
        const double gflops = attnkit_bench::tile_gemm_peak(state, d, threads);
        state.counters["GFLOP/s"] = gflops;
        peaks()[key] = std::max(peaks()[key], gflops);
      });
    }
  for (const Shape& s : shapes()) {
    add_pair("full", ak::make_spec(ak::Full{}), s);
    add_pair("causal", ak::make_spec(ak::Causal{}), s);
    if (s.dim == 128 && s.len == 4096) {  // the other variants at the target's shape
      add_pair("window", ak::make_spec(ak::Causal{} & ak::SlidingWindow{kWindow, 0}), s);
      add_pair("sigmoid", ak::make_spec(ak::Causal{}, ak::Sigmoid{}), s);
      add_pair("rope", ak::make_spec(ak::Causal{}, ak::Rope(ak::RopeTable(s.dim, 10000, s.len))),
               s);
      add_pair("lssar", ak::make_spec(ak::Causal{}, ak::SoftplusL1Reweighted{}), s);
    }
    if (s.len <= 4096) add_unfused(s);
  }
  // 2 repetitions of at least 0.1 s each unless the command line says otherwise.
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.1", "--benchmark_repetitions=2"}, print_summary);
}
