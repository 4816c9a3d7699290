// Ring attention (attnkit/distributed/ring_attention.hpp) under mpirun: strong scaling from one
// rank to the ranks of the run (the bench workflow: 2, one thread each), causal self-attention, H =
// Hkv = kHeads, d = 128, L = 2K, 16K and 32K. Rows:
//   single/L:<n>           attention() over the whole sequence on rank 0 alone, 1 thread:
//                          the in-run baseline (the other ranks wait);
//   ring_contiguous/L:<n>  ring_attention(), contiguous shards;
//   ring_zigzag/L:<n>      ring_attention(), zigzag shards (causal load balance);
//   ring_transfers/L:<n>   the ring's K/V transfers alone, no attention: the communication.
// A row's time is its slowest rank's. The ring rows also record the ranks' attention times
// and waits (RingTimes). The summary table sets them side by side: the speedup over one rank,
// the imbalance between the ranks, and what the transfers alone cost. Every rank runs every
// benchmark for the same fixed number of iterations (in lockstep); rank 0 alone reports.
#include <mpi.h>

#include <attnkit/attnkit.hpp>  // first: see simd.hpp on GCC 12 and <immintrin.h>
#include <attnkit/distributed/ring_attention.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace dist = attnkit::dist;

namespace {

constexpr Index kHeads = 1, kDim = 128;
constexpr int kIterations = 2;

int my_rank() { return dist::rank_of(MPI_COMM_WORLD); }
int ranks() { return dist::size_of(MPI_COMM_WORLD); }

double causal_flops(Index len) { return 4.0 * kHeads * kDim * double(len) * double(len + 1) / 2; }

double slowest(double mine) {
  double worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

double fastest(double mine) {
  double best = 0;
  MPI_Allreduce(&mine, &best, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  return best;
}

// Each row's best iteration (the slowest rank's time) and, for the ring rows, the ranks'
// fastest and slowest attention time and the longest wait in it.
struct Row {
  double seconds = 1e300, attention_min = 0, attention_max = 0, waiting = 0;
};
std::map<std::string, Row>& rows() {
  static std::map<std::string, Row> all;
  return all;
}

std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  for (float& v : x) {  // the same values on every rank
    seed = seed * 1664525u + 1013904223u;
    v = float(int(seed >> 9) - (1 << 22)) * (1.f / float(1 << 22));
  }
  return x;
}

// The whole sequence [1, H, L, D], and this rank's shards of it in `layout`.
struct Sequence {
  Index len;
  std::vector<float> q, k, v;
  explicit Sequence(Index l)
      : len(l),
        q(values(std::size_t(kHeads * l * kDim), 1)),
        k(values(std::size_t(kHeads * l * kDim), 2)),
        v(values(std::size_t(kHeads * l * kDim), 3)) {}
  ak::View<const float> whole(const std::vector<float>& x) const {
    return ak::bhsd(x.data(), 1, kHeads, len, kDim);
  }
};

Sequence& sequence(Index len) {
  static std::map<Index, Sequence> all;
  return all.try_emplace(len, len).first->second;
}

struct Shards {
  Index n;
  std::vector<float> q, k, v, o;
  Shards(const Sequence& s, dist::Layout layout)
      : n(dist::shard_length(layout, s.len, my_rank(), ranks())),
        q(std::size_t(kHeads * n * kDim)),
        k(q.size()),
        v(q.size()),
        o(q.size()) {
    dist::shard_rows(s.whole(s.q), layout, my_rank(), ranks(), view(q));
    dist::shard_rows(s.whole(s.k), layout, my_rank(), ranks(), view(k));
    dist::shard_rows(s.whole(s.v), layout, my_rank(), ranks(), view(v));
  }
  ak::View<float> view(std::vector<float>& x) { return ak::bhsd(x.data(), 1, kHeads, n, kDim); }
  ak::View<const float> cview(const std::vector<float>& x) const {
    return ak::bhsd(x.data(), 1, kHeads, n, kDim);
  }
};

// Registers `name`: kIterations in lockstep on every rank, each timed from a barrier to this
// rank's end of work(times), the iteration's time the slowest rank's.
template <class Work>
void add(const std::string& name, Index len, Work work) {
  benchmark::RegisterBenchmark(
      name.c_str(),
      [=](benchmark::State& state) {
        Row& best = rows()[name];
        for (auto _ : state) {
          dist::RingTimes times;
          MPI_Barrier(MPI_COMM_WORLD);
          const double start = MPI_Wtime();
          work(times);
          const double seconds = slowest(MPI_Wtime() - start);
          const double low = fastest(times.attention), high = slowest(times.attention);
          const double waiting = slowest(times.waiting);
          state.SetIterationTime(seconds);
          if (seconds < best.seconds) best = Row{seconds, low, high, waiting};
        }
        state.counters["GFLOP/s"] = attnkit_bench::per_second(causal_flops(len) / 1e9);
      })
      ->Iterations(kIterations)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

void add_length(Index len) {
  const std::string at = "/L:" + std::to_string(len);
  add("single" + at, len, [len](dist::RingTimes&) {
    if (my_rank() != 0) return;
    Sequence& s = sequence(len);
    static std::vector<float> o;
    o.resize(s.q.size());
    ak::attention(ak::make_spec(ak::Causal{}), s.whole(s.q), s.whole(s.k), s.whole(s.v),
                  ak::bhsd(o.data(), 1, kHeads, len, kDim), ak::Options{}.with_threads(1));
  });
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag}) {
    const std::string name =
        std::string(layout == dist::Layout::Zigzag ? "ring_zigzag" : "ring_contiguous") + at;
    add(name, len, [len, layout](dist::RingTimes& times) {
      static std::map<std::pair<Index, int>, Shards> all;
      Shards& sh = all.try_emplace({len, int(layout)}, sequence(len), layout).first->second;
      dist::ring_attention(MPI_COMM_WORLD, ak::make_spec(ak::Causal{}), sh.cview(sh.q),
                           sh.cview(sh.k), sh.cview(sh.v), sh.view(sh.o),
                           dist::RingOptions{}
                               .with_layout(layout)
                               .with_seq_len(len)
                               .with_attention(ak::Options{}.with_threads(1))
                               .with_times(&times));
    });
  }
  add("ring_transfers" + at, len, [len](dist::RingTimes&) {  // the zigzag ring's bytes
    const int p = ranks(), me = my_rank();
    static std::map<Index, std::vector<float>> buffers;
    std::vector<float>& buf = buffers[len];
    const Index most = dist::shard_length(dist::Layout::Zigzag, len, 0, p);
    buf.resize(std::size_t(4 * kHeads * most * kDim));  // K and V, current and next
    for (int step = 0; step + 1 < p; ++step) {
      const int from = (me - step + p) % p, incoming = (from + p - 1) % p;
      const int sent =
          int(2 * kHeads * kDim * dist::shard_length(dist::Layout::Zigzag, len, from, p));
      const int got =
          int(2 * kHeads * kDim * dist::shard_length(dist::Layout::Zigzag, len, incoming, p));
      MPI_Request requests[2];
      MPI_Irecv(buf.data() + buf.size() / 2, got, MPI_FLOAT, (me + p - 1) % p, 0, MPI_COMM_WORLD,
                &requests[0]);
      MPI_Isend(buf.data(), sent, MPI_FLOAT, (me + 1) % p, 0, MPI_COMM_WORLD, &requests[1]);
      MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
    }
  });
}

void print_summary() {
  std::printf(
      "\n### Ring attention: %d ranks x 1 thread against attention() on one rank x 1 thread, "
      "causal, H=%ld, d=%ld, ISA %s\n\nms = the slowest rank's; attention = the fastest and "
      "the slowest rank's attention time; waits = the longest time a rank waited for a shard "
      "after its step's attention (the neighbour's step still running, or the transfer); "
      "transfers = the same ring's K/V transfers alone, and their share of the ring's time "
      "(what they would cost if nothing hid them).\n\n",
      ranks(), long(kHeads), long(kDim), ak::simd::kArchName);
  attnkit_bench::print_table_head(
      "| L | layout | ms | 1 rank ms | speedup | attention ms | waits ms | transfers ms | "
      "transfers / ms |");
  for (const Index len : {Index{2048}, Index{16384}, Index{32768}})
    for (const char* layout : {"contiguous", "zigzag"}) {
      const std::string at = "/L:" + std::to_string(len);
      const auto found = [](const std::string& key) -> const Row* {
        const auto it = rows().find(key);
        return it == rows().end() ? nullptr : &it->second;
      };
      const Row* ring = found(std::string("ring_") + layout + at);
      const Row* one = found("single" + at);
      const Row* moved = found("ring_transfers" + at);
      if (ring == nullptr || one == nullptr || moved == nullptr) continue;
      std::printf("| %ld | %s | %.1f | %.1f | %.2f | %.1f-%.1f | %.2f | %.2f | %.4f |\n", long(len),
                  layout, ring->seconds * 1e3, one->seconds * 1e3, one->seconds / ring->seconds,
                  ring->attention_min * 1e3, ring->attention_max * 1e3, ring->waiting * 1e3,
                  moved->seconds * 1e3, moved->seconds / ring->seconds);
    }
}

// Reports nothing: the ranks but 0 run the benchmarks without output.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  for (const Index len : {Index{2048}, Index{16384}, Index{32768}}) add_length(len);
  attnkit_bench::report_context("ring", kHeads, 0);
  attnkit_bench::report_baseline("ring_contiguous", "single");
  attnkit_bench::report_baseline("ring_zigzag", "single");
  attnkit_bench::report_baseline("ring_transfers", "single");
  int code = 0;
  if (my_rank() == 0) {
    code = attnkit_bench::run_benchmarks(argc, argv, {}, print_summary);
  } else {  // the same benchmarks, in the same order; no report, no JSON file
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i)
      if (std::string(argv[i]).rfind("--benchmark_out", 0) != 0) args.push_back(argv[i]);
    int count = static_cast<int>(args.size());
    benchmark::Initialize(&count, args.data());
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return code;
}
