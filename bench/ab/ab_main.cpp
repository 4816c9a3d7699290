// The alternating comparison's driver (scripts/ab_compare.sh): side A (the base tree's
// headers) and side B (the tree at hand) run each row of ab_rows.hpp in one process, call by
// call, A first in even rounds and B first in odd ones (the second call of a pair tends to
// win by 1-2%: the order is cancelled, not assumed away). The best time of each side is kept.
// In-run baselines: the FMA peak (independent FMAs of the widest vector, one thread) and a
// streaming read of 1 GiB (one and two threads). Prints one line per row -- times, B / A,
// B's throughput and its fraction of the baseline -- and flags a row where B is more than
// 10% slower than A.
//   ab_compare [--reps N] [--rows i,j,...] [--smoke]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ab_rows.hpp"

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// GFLOP/s of one core: 12 independent chains of x = x * m + a (an FMA each: the build fuses
// them, -ffp-contract=fast), each chain its own register variable, best of 5.
double fma_peak() {
  const Vec m = Vec{} + 0.9999999f, a = Vec{} + 1e-7f;
  Vec x0 = Vec{} + 1.00f, x1 = Vec{} + 1.01f, x2 = Vec{} + 1.02f, x3 = Vec{} + 1.03f;
  Vec x4 = Vec{} + 1.04f, x5 = Vec{} + 1.05f, x6 = Vec{} + 1.06f, x7 = Vec{} + 1.07f;
  Vec x8 = Vec{} + 1.08f, x9 = Vec{} + 1.09f, x10 = Vec{} + 1.10f, x11 = Vec{} + 1.11f;
  const long iters = 20'000'000;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = std::chrono::steady_clock::now();
    for (long n = 0; n < iters; ++n) {
      x0 = x0 * m + a, x1 = x1 * m + a, x2 = x2 * m + a, x3 = x3 * m + a;
      x4 = x4 * m + a, x5 = x5 * m + a, x6 = x6 * m + a, x7 = x7 * m + a;
      x8 = x8 * m + a, x9 = x9 * m + a, x10 = x10 * m + a, x11 = x11 * m + a;
      // Every lane of every chain is live (no lane or iteration folded away); "v": any
      // vector register (zmm with AVX-512), so the chains stay in registers.
      asm volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5));
      asm volatile("" : "+v"(x6), "+v"(x7), "+v"(x8), "+v"(x9), "+v"(x10), "+v"(x11));
    }
    best = std::min(best, seconds_since(t));
  }
  const Vec sum = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;
  if (sum[0] == 42.f) std::puts("");
  return 2.0 * kLanes * 12.0 * double(iters) / best / 1e9;
}

// GB/s of a read of `bytes`, summed with vectors over `threads`, best of 5.
double stream(const std::vector<float>& buf, int threads) {
  const long n = long(buf.size());
  double best = 1e30;
  float total = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
    for (long block = 0; block < n; block += 4096) {
      Vec acc[4] = {};
      const long end = std::min(n, block + 4096);
      for (long i = block; i + 4 * kLanes <= end; i += 4 * kLanes)
        for (int u = 0; u < 4; ++u) {
          Vec v;
          std::memcpy(&v, buf.data() + i + u * kLanes, sizeof v);
          acc[u] += v;
        }
      for (int u = 0; u < 4; ++u) total += acc[u][0];
    }
    best = std::min(best, seconds_since(t));
  }
  if (total == 42.f) std::puts("");
  return double(n) * sizeof(float) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  bool smoke = false;
  std::vector<int> rows;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--smoke"))
      smoke = true;
    else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) {
      for (const char* p = argv[++i]; *p;) {
        rows.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--rows i,j,...] [--smoke]\n", argv[0]);
      return 2;
    }
  }
  for (const int r : rows)
    if (r < 0 || r >= ab::kRowCount) {
      std::fprintf(stderr, "ab_compare: row %d: expected 0 to %d\n", r, ab::kRowCount - 1);
      return 2;
    }
  if (rows.empty())
    for (int r = 0; r < ab::kRowCount; ++r) rows.push_back(r);
  if (smoke) reps = 1, rows = {1, 9};
  const double peak = fma_peak();
  std::vector<float> big(std::size_t(1) << (smoke ? 24 : 28), 1.f);  // 64 MiB / 1 GiB
  const double stream1 = stream(big, 1), stream2 = stream(big, 2);
  big = {};
  std::printf("baseline\tFMA peak (1 thread)\t%.1f GFLOP/s\n", peak);
  std::printf("baseline\tstream (1 thread)\t%.2f GB/s\n", stream1);
  std::printf("baseline\tstream (2 threads)\t%.2f GB/s\n", stream2);
  std::printf("row\tA ms\tB ms\tB/A time\tB rate\tB of baseline\tflag\n");
  int slower = 0;
  for (const int index : rows) {
    const ab::Row& r = ab::kRows[index];
    if (!ab_b_supports(index)) {
      std::printf("%s\tskipped: side B lacks what it needs\n", r.name);
      continue;
    }
    // A row side A cannot run (an older tree: a mode or storage it lacks) is timed on B alone.
    const bool with_a = ab_a_supports(index);
    if (with_a) ab_a_setup(index);
    ab_b_setup(index);
    if (with_a) ab_a_call(index);  // warm: pages touched, scratch grown
    ab_b_call(index);
    double a = 1e30, b = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      if (rep % 2 == 0) {
        if (with_a) a = std::min(a, ab_a_call(index));
        b = std::min(b, ab_b_call(index));
      } else {
        b = std::min(b, ab_b_call(index));
        if (with_a) a = std::min(a, ab_a_call(index));
      }
    }
    if (with_a) ab_a_teardown();
    ab_b_teardown();
    const bool decode = r.kind == ab::Kind::Decode;
    const double rate = ab::work_of(r) / b / 1e9;
    const double base = decode ? (r.threads > 1 ? stream2 : stream1) : peak * r.threads;
    const bool flag = with_a && b > 1.10 * a;
    slower += flag;
    char a_ms[32] = "-", ratio[32] = "-";  // "-": side A lacks the row
    if (with_a) {
      std::snprintf(a_ms, sizeof a_ms, "%.2f", a * 1e3);
      std::snprintf(ratio, sizeof ratio, "%.3f", b / a);
    }
    std::printf("%s\t%s\t%.2f\t%s\t%.1f %s\t%.2f\t%s\n", r.name, a_ms, b * 1e3, ratio, rate,
                decode ? "GB/s" : "GFLOP/s", rate / base, flag ? "B >10% SLOWER" : "");
    std::fflush(stdout);
  }
  if (slower > 0) std::printf("%d row(s) more than 10%% slower on B\n", slower);
  return 0;
}
