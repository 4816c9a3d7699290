// Data-dependent sparsity against dense causal attention on the same inputs, in the same
// run, f32, d = 128, 2 threads (1 thread too): All-or-Here (AHA) with ~10% of (token, head)
// routed to full attention at L = 16384 (the rest: a 256-key window); MoBA (B = 512, top-3,
// routed from the data) and AnchorAttention stripes (theta tuned to keep ~10% of the middle
// columns) at L = 32768. The question a user asks: how much faster than dense causal is the routed
// variant at the sparsity it runs at? The summary reports ms, the ratio dense / variant (a
// speedup), the live fraction (the (query, key) pairs computed / causal pairs) and the issue's
// target. Selection (routing) time is timed apart and shown in its own row.
#include <benchmark/benchmark.h>

#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kDim = 128, kHeads = 2, kAhaLen = 16384, kWindow = 256;
constexpr Index kLongLen = 32768, kMobaBlock = 512, kMobaTopk = 3;
constexpr double kStripeKeep = 0.10;  // target fraction of middle columns kept

// Q, K, V, O of one length, filled once.
attnkit_bench::BshdBuffers& buffers(Index len) {
  return attnkit_bench::shared_buffers(len, kHeads, kDim);
}

std::map<std::string, double>& live_fraction() {
  static std::map<std::string, double> r;
  return r;
}

double causal_pairs(Index len) { return double(len) * double(len + 1) / 2.0; }

// Times call() (which writes the output buffer) under `key`, with the CPU clock: the
// summary's cpu column tells a real result from a machine other processes took.
template <class Call>
void bench_call(benchmark::State& state, const std::string& key, Call call) {
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWallAndCpu, call);
  const auto live = live_fraction().find(key.substr(0, key.rfind("/threads:")));
  if (live != live_fraction().end()) state.counters["live"] = live->second;  // for the report
}

// Registers `name` under each of `thread_counts`; make_call(threads) gives the timed callable.
template <class MakeCall>
void add(const std::string& name, const std::vector<int>& thread_counts, MakeCall make_call) {
  for (const int threads : thread_counts) {
    const std::string key = name + "/threads:" + std::to_string(threads);
    auto run = [=](benchmark::State& s) { bench_call(s, key, make_call(threads)); };
    attnkit_bench::register_timed(key, run);
  }
}

// Registers a routed variant on 1 and 2 threads with its live fraction (`pairs` computed /
// causal pairs); run(buffers, options) is the timed call on the inputs of length len.
template <class Run>
void add_routed(const std::string& name, Index len, double pairs, Run run) {
  live_fraction()[name] = pairs / (kHeads * causal_pairs(len));
  add(name, {1, 2}, [len, run](int threads) {
    return [len, run, threads] { run(buffers(len), ak::Options{}.with_threads(threads)); };
  });
}

// Registers a variant's selection step apart, on one thread: select() returns what the step
// makes (routes, a selection), kept from the optimizer.
template <class Select>
void add_selection(const std::string& name, Select select) {
  add(name, {1}, [select](int) { return [select] { benchmark::DoNotOptimize(select()); }; });
}

void add_dense(Index len) {
  add("dense_causal/L:" + std::to_string(len), {1, 2}, [len](int threads) {
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
  add_routed("aha/L:" + std::to_string(kAhaLen), kAhaLen, pairs,
             [](attnkit_bench::BshdBuffers& buf, const ak::Options& options) {
               ak::all_or_here(ak::make_spec(ak::Softmax{}), buf.in(buf.q), buf.in(buf.k),
                               buf.in(buf.v), buf.out(), aha_routes(), kWindow, options);
             });
  // Routing from gate logits (the selection step of AHA), apart.
  add_selection("aha_routing/L:" + std::to_string(kAhaLen), [] {
    static std::vector<float> gates(static_cast<std::size_t>(kAhaLen * kHeads), -1.f);
    return ak::AhaRoutes::from_gates(gates, 1, kAhaLen, kHeads);
  });
}

// MoBA, B = 512, top-3 (own block included), routes from the data.
const ak::BlockRoutes& moba_routes() {
  static const ak::BlockRoutes routes = [] {
    attnkit_bench::BshdBuffers& buf = buffers(kLongLen);
    return ak::route_topk_blocks(buf.in(buf.q), buf.in(buf.k), kMobaBlock, kMobaTopk);
  }();
  return routes;
}

void add_moba() {
  const ak::BlockRoutes& routes = moba_routes();
  double pairs = 0;  // keys of the chosen blocks at or before each query
  for (Index h = 0; h < kHeads; ++h)
    for (Index i = 0; i < kLongLen; ++i)
      for (const Index blk : routes.chosen(0, h, i))
        pairs += double(std::min(i + 1, (blk + 1) * kMobaBlock) - blk * kMobaBlock);
  add_routed("moba/L:" + std::to_string(kLongLen), kLongLen, pairs,
             [](attnkit_bench::BshdBuffers& buf, const ak::Options& options) {
               ak::moba_attention(ak::make_spec(ak::Softmax{}), buf.in(buf.q), buf.in(buf.k),
                                  buf.in(buf.v), buf.out(), moba_routes(), kMobaBlock, options);
             });
  add_selection("moba_routing/L:" + std::to_string(kLongLen), [] {
    attnkit_bench::BshdBuffers& buf = buffers(kLongLen);
    return ak::route_topk_blocks(buf.in(buf.q), buf.in(buf.k), kMobaBlock, kMobaTopk);
  });
}

// Stripes with theta chosen (by bisection, on these inputs) so that ~10% of the middle
// columns are kept: random inputs have no structure for the anchors to find.
std::pair<ak::StripeParams, double>& stripe_setup() {
  static std::pair<ak::StripeParams, double> setup = [] {
    attnkit_bench::BshdBuffers& buf = buffers(kLongLen);
    const auto kept_fraction = [&](const ak::StripeSelection& sel) {
      double kept = 0, middle = 0;
      for (Index h = 0; h < kHeads; ++h)
        for (Index g = 0; g < sel.big_blocks(); ++g) {
          kept += double(sel.kept_end(0, h, g) - sel.kept_begin(0, h, g));
          middle += double(sel.middle(g).end - sel.middle(g).begin);
        }
      return middle > 0 ? kept / middle : 0.0;
    };
    ak::StripeParams params;
    float lo = -20.f, hi = 20.f;
    for (int step = 0; step < 12; ++step) {
      params.theta = 0.5f * (lo + hi);
      const double f = kept_fraction(ak::anchor_stripes(buf.in(buf.q), buf.in(buf.k), params));
      (f > kStripeKeep ? hi : lo) = params.theta;
    }
    params.theta = 0.5f * (lo + hi);
    return std::make_pair(params,
                          kept_fraction(ak::anchor_stripes(buf.in(buf.q), buf.in(buf.k), params)));
  }();
  return setup;
}

const ak::StripeSelection& stripe_selection() {
  static const ak::StripeSelection sel = [] {
    attnkit_bench::BshdBuffers& buf = buffers(kLongLen);
    return ak::anchor_stripes(buf.in(buf.q), buf.in(buf.k), stripe_setup().first);
  }();
  return sel;
}

// The pairs the stripes computed / causal pairs. Computed once, when a stripes benchmark first
// runs, not at registration: the selection's theta bisection takes seconds (most of a smoke run
// that filters the stripes out, in the test workflow's -Og build).
double stripes_live() {
  static const double live = [] {
    const ak::StripeSelection& sel = stripe_selection();
    double pairs = 0;  // init + kept middle columns + local keys at or before each query
    for (Index h = 0; h < kHeads; ++h)
      for (Index g = 0; g < sel.big_blocks(); ++g) {
        const double kept = double(sel.kept_end(0, h, g) - sel.kept_begin(0, h, g));
        for (Index i = sel.rows(g).begin; i < sel.rows(g).end; ++i)
          pairs += double(sel.init_end()) + kept + double(i + 1 - sel.middle(g).end);
      }
    return pairs / (kHeads * causal_pairs(kLongLen));
  }();
  return live;
}

bool stripes_ran() {
  for (const char* key : {"stripes/L:32768/threads:1", "stripes/L:32768/threads:2",
                          "stripes_selection/L:32768/threads:1"})
    if (attnkit_bench::find_best(key) != nullptr) return true;
  return false;
}

void add_stripes() {
  const std::string name = "stripes/L:" + std::to_string(kLongLen);
  add(name, {1, 2}, [name](int threads) {
    live_fraction()[name] = stripes_live();
    return [threads] {
      attnkit_bench::BshdBuffers& buf = buffers(kLongLen);
      ak::stripe_attention(ak::make_spec(ak::Softmax{}), buf.in(buf.q), buf.in(buf.k),
                           buf.in(buf.v), buf.out(), stripe_selection(),
                           ak::Options{}.with_threads(threads));
    };
  });
  add_selection("stripes_selection/L:" + std::to_string(kLongLen), [] {
    attnkit_bench::BshdBuffers& buf = buffers(kLongLen);
    return ak::anchor_stripes(buf.in(buf.q), buf.in(buf.k), stripe_setup().first);
  });
}

// The structured case: every query leans on one direction u, 16 planted "needle" keys lie
// along it among random keys (as examples/05_stripes_anchor.cpp). Stripes with the paper's
// defaults must find them: the recall (share of the causal softmax mass kept, in double)
// says how well. Not timed; L = 4096 keeps the dense recall computation short.
void print_needle_recall() {
  constexpr Index len = 4096;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> u(kDim), q(len * kDim), k(len * kDim);
  float norm = 0;
  for (float& x : u) {
    x = normal(rng);
    norm += x * x;
  }
  for (float& x : u) x /= std::sqrt(norm);
  for (Index i = 0; i < len; ++i)
    for (Index c = 0; c < kDim; ++c) {
      q[std::size_t(i * kDim + c)] = 16.f * u[std::size_t(c)] + normal(rng);
      k[std::size_t(i * kDim + c)] = normal(rng);
    }
  for (Index j = 0; j < len; j += len / 16)
    for (Index c = 0; c < kDim; ++c) k[std::size_t(j * kDim + c)] = 8.f * u[std::size_t(c)];
  const ak::View<const float> qv = ak::bhsd(q.data(), 1, 1, len, kDim);
  const ak::View<const float> kv = ak::bhsd(k.data(), 1, 1, len, kDim);
  const ak::StripeSelection sel = ak::anchor_stripes(qv, kv);
  const ak::StripeRecall recall = ak::stripe_recall(qv, kv, sel);
  std::printf(
      "\nneedle case (L = %ld, 16 planted keys, paper defaults): stripes keep %.2f%% of the "
      "middle columns, recall mean %.4f, min %.4f.\n",
      long(len), 100 * sel.kept_fraction(), recall.mean, recall.min);
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
    {"moba/L:32768", "dense_causal/L:32768", ">= 5x (B 512, k 3)", 5.0},
    {"moba_routing/L:32768", "dense_causal/L:32768", "- (selection)", 0},
    {"stripes/L:32768", "dense_causal/L:32768", ">= 4x (~10% columns)", 4.0},
    {"stripes_selection/L:32768", "dense_causal/L:32768", "- (selection)", 0},
};

void print_summary() {
  std::printf(
      "\n### Routed and data-dependent sparsity vs dense causal: ISA %s, d=%ld, H=%ld, B=1, "
      "f32, BSHD\n\n"
      "ms = best iteration over the repetitions; speedup = dense causal time / variant time, "
      "same L and threads;\nlive = (query, key) pairs computed / causal pairs; cpu = process "
      "CPU time / (wall x threads):\nwell under 100%% means other processes took the cores.\n\n",
      ak::simd::kArchName, long(kDim), long(kHeads));
  attnkit_bench::print_table_head(
      "| variant | threads | ms | live | speedup | target | met | cpu |");
  for (const Row& row : kRows)
    for (const int threads : {1, 2}) {
      const std::string suffix = "/threads:" + std::to_string(threads);
      const attnkit_bench::Best* best = attnkit_bench::find_best(row.name + suffix);
      if (best == nullptr) continue;
      const attnkit_bench::Best* base = attnkit_bench::find_best(row.dense + suffix);
      char speedup[32] = "-", met[8] = "-", live[16] = "-";
      if (base != nullptr && row.limit > 0) {  // selection rows: time only
        const double r = base->seconds / best->seconds;
        std::snprintf(speedup, sizeof speedup, "%.2fx", r);
        if (row.limit > 0) std::snprintf(met, sizeof met, "%s", r >= row.limit ? "yes" : "no");
      }
      const auto lf = live_fraction().find(row.name);
      if (lf != live_fraction().end()) std::snprintf(live, sizeof live, "%.3f", lf->second);
      std::printf("| %s | %d | %.1f | %s | %s | %s | %s | %.0f%% |\n", row.name, threads,
                  best->seconds * 1e3, live, speedup, row.target, met, 100 * best->busy(threads));
    }
  for (const char* dense : {"dense_causal/L:16384", "dense_causal/L:32768"})
    for (const int threads : {1, 2}) {
      const attnkit_bench::Best* best =
          attnkit_bench::find_best(std::string(dense) + "/threads:" + std::to_string(threads));
      if (best != nullptr)
        std::printf("| %s | %d | %.1f | 1.000 | baseline | - | - | %.0f%% |\n", dense, threads,
                    best->seconds * 1e3, 100 * best->busy(threads));
    }
}

}  // namespace

int main(int argc, char** argv) {
  add_dense(kAhaLen);
  add_aha();
  add_dense(kLongLen);
  add_moba();
  add_stripes();
  attnkit_bench::report_context("routed", kHeads, 0);
  const auto variant = [](const char* name) { return std::string(name, std::strcspn(name, "/")); };
  for (const Row& row : kRows)  // selection rows (no speedup target) are timed alone
    if (row.limit > 0) attnkit_bench::report_baseline(variant(row.name), variant(row.dense));
  // 2 repetitions of one iteration each unless the command line says otherwise: the dense
  // baselines at long L take seconds.
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.01", "--benchmark_repetitions=2"}, [] {
        print_summary();
        if (!stripes_ran()) return;  // the stripes' untimed extras
        print_needle_recall();
        std::printf("\nstripes: theta = %.2f keeps %.1f%% of the middle columns (random inputs).\n",
                    double(stripe_setup().first.theta), 100 * stripe_setup().second);
      });
}
