// bench_dense's bf16-products rows: attention() with Options::with_products(Products::Bf16) on
// the same f32 inputs as the exact "attnkit" rows, on each kernel the mode has in this build
// -- "bf16_fma" (f32 FMAs on the operands rounded to bf16) and, with AVX512-BF16, "bf16_dot"
// (vdpbf16ps) -- and the two instructions' peak rates measured in the same run (f32 FMAs
// and vdpbf16ps on 24 independent accumulators in registers), which bound what the second can
// gain over the first on this CPU. Templates over bench_dense.cpp's Shape.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/gemm/tile_gemm_bf16.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace bench_products {

using attnkit::gemm::Bf16Kernel;

/// The row name of a kernel of the mode.
inline const char* variant(Bf16Kernel k) {
  return k == Bf16Kernel::PairProducts ? "bf16_dot" : "bf16_fma";
}

/// The kernels the mode has in this build.
inline std::vector<Bf16Kernel> kernels() {
  if (attnkit::gemm::kHasBf16Dot) return {Bf16Kernel::RoundedF32, Bf16Kernel::PairProducts};
  return {Bf16Kernel::RoundedF32};
}

/// Multiply-add instructions a second on one core: f32 FMAs (kFma) or vdpbf16ps, on 24
/// independent accumulators in registers (throughput, not latency); 0 for vdpbf16ps where
/// the build has none.
template <bool kFma>
double instructions_per_second() {
  namespace simd = attnkit::simd;
  constexpr int kAcc = 24;
  constexpr long kSteps = 4000000;
  simd::Vec acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = simd::Vec(float(i) * 1e-3f);
  const auto start = std::chrono::steady_clock::now();
  if constexpr (kFma) {
    const simd::Vec x(0.999f), y(1e-6f);
    for (long s = 0; s < kSteps; ++s) {
#pragma GCC unroll 24  // whole: the accumulators stay in registers (no loop interchange)
      for (int i = 0; i < kAcc; ++i) acc[i] = simd::in_register(simd::fma(acc[i], x, y));
    }
  } else {
#ifdef ATTNKIT_BF16_DOT
    const std::uint16_t ones[2] = {0x3F80, 0x3F80};  // bf16 1.0, twice
    const simd::Bf16Pairs a = simd::broadcast_pair(ones);
    for (long s = 0; s < kSteps; ++s) {
#pragma GCC unroll 24
      for (int i = 0; i < kAcc; ++i) acc[i] = simd::in_register(simd::dot_pairs(acc[i], a, a));
    }
#else
    return 0.0;
#endif
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float lanes[simd::kWidth];
  for (int i = 0; i < kAcc; ++i) {  // the results stay live
    simd::store(lanes, acc[i]);
    benchmark::DoNotOptimize(lanes[0]);
  }
  return double(kAcc) * double(kSteps) / seconds;
}

/// Multiply-adds of one instruction: an FMA's lanes, or vdpbf16ps's 16 pairs.
inline double multiply_adds(bool fma) { return fma ? attnkit::simd::kWidth : 32; }

/// "dot_peak/threads:1" and "fma_peak/threads:1": the instructions' multiply-add rates in
/// GFLOP/s (2 FLOPs a multiply-add), the best of the rounds.
inline void BM_InstructionPeak(benchmark::State& state, bool fma) {
  double best = 0.0;
  for (auto _ : state)
    best = std::max(best, fma ? instructions_per_second<true>() : instructions_per_second<false>());
  state.counters["GFLOP/s"] = best * multiply_adds(fma) * 2 / 1e9;
}

/// Prints the products table from the best GFLOP/s of each row (get(name), 0 when absent).
template <class Shape>
void print_summary(const std::vector<Shape>& shapes,
                   const std::function<double(const std::string&)>& get) {
  const double fma = get("fma_peak/threads:1"), dot = get("dot_peak/threads:1");
  std::printf(
      "\nbf16 products (Products::Bf16) against exact f32 products, same f32 inputs (GFLOP/s,\n"
      " the best repetition): bf16_fma = f32 FMAs on operands rounded to bf16, bf16_dot =\n"
      " vdpbf16ps; Auto runs %s here. Instruction peaks on one core: vfmadd231ps %.0f GFLOP/s,\n"
      " vdpbf16ps %.0f GFLOP/s (%.2fx): the most bf16_dot can gain over exact products here.\n",
      attnkit::gemm::pair_products_chosen() ? "bf16_dot" : "exact products", fma, dot,
      fma > 0 ? dot / fma : 0.0);
  std::printf("%5s %6s %6s %7s | %8s %8s %8s | %8s %8s\n", "d", "L", "causal", "threads", "exact",
              "bf16_fma", "/exact", "bf16_dot", "/exact");
  for (const Shape& s : shapes) {
    const double exact = get(s.name("attnkit")), f = get(s.name("bf16_fma")),
                 d = get(s.name("bf16_dot"));
    if (exact <= 0 || f <= 0) continue;
    std::printf("%5td %6td %6d %7d | %8.1f %8.1f %7.2fx | %8.1f %7.2fx\n", s.dim, s.len,
                int(s.causal), s.threads, exact, f, f / exact, d, d > 0 ? d / exact : 0.0);
  }
}

/// The shapes of the products rows: d 64 / 128, L 1024 / 4096 causal, 4096 full, 1 and 2
/// threads; ATTNKIT_BENCH_LONG=1 adds L 16384 causal.
template <class Shape>
std::vector<Shape> shapes() {
  std::vector<Shape> all;
  const char* long_run = std::getenv("ATTNKIT_BENCH_LONG");
  const bool long_too = long_run != nullptr && std::string(long_run) == "1";
  for (const attnkit::Index dim : {64, 128})
    for (const int threads : {1, 2}) {
      for (const attnkit::Index len : {1024, 4096}) all.push_back({dim, len, true, threads});
      all.push_back({dim, 4096, false, threads});
      if (long_too) all.push_back({dim, 16384, true, threads});
    }
  return all;
}

}  // namespace bench_products
