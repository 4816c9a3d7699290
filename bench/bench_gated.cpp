// Gated attention (gated/): the chunked form of Gated DeltaNet (delta rule, one gate per token,
// q/k l2-normalized, chunk 64) and of KDA (one gate per key channel) against the tiled causal
// softmax attention and the older linear attention (EluPlusOne, chunk 32) on the same inputs
// in the same run: H = 16, d = Dk = Dv = 128, B = 1, L from 1K to 8K, 2 threads; then the
// recurrent step (decode, L = 1) against a streaming read of the state's bytes, 1 thread.
// The summary reports per L the times, the chunked form's GFLOP/s against the tile-GEMM peak
// measured here (gemm::gemm 128^3 in cache, per thread; target >= 50%), the length from which
// it beats softmax (target: from about 2K), and the decode step's state GB/s against the
// stream (target >= 0.8). FLOPs of the chunked form per head and chunk of n rows (Dk = Dv = d):
// 8 n^2 d (Q K^T, K K^T, the triangular solve for U and W, P V') + 6 n d^2 (W S, Q S, K^T V').
#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kHeads = 16, kDim = 128, kChunk = 64, kMinLen = 1024, kMaxLen = 8192;
constexpr Index kPeakSize = 128;
constexpr int kThreads = 2;

attnkit_bench::BshdBuffers& buffers() {
  return attnkit_bench::shared_buffers(kMaxLen, kHeads, kDim);
}

// The gates of every shape: g in [-0.1, 0] per token and per channel, beta 0.5.
struct Gates {
  std::vector<float> token, channel, beta;
  Gates()
      : token(std::size_t(kMaxLen * kHeads), -0.05f),
        channel(std::size_t(kMaxLen * kHeads * kDim)),
        beta(std::size_t(kMaxLen * kHeads), 0.5f) {
    for (std::size_t i = 0; i < channel.size(); ++i) channel[i] = -0.1f * float(i % 7) / 7.f;
  }
};
const Gates& gates() {
  static const Gates g;
  return g;
}

template <class Body>
void timed(benchmark::State& state, const std::string& key, double flops, Body body) {
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWallAndCpu, body);
  state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
}

double gated_flops(Index len) {
  const double per_chunk = 8.0 * kChunk * kChunk * kDim + 6.0 * kChunk * kDim * kDim;
  return double(kHeads) * per_chunk * double(len) / double(kChunk);
}
double linear_flops(Index len) {  // bench_linear.cpp's count, chunk 32
  return double(kHeads) * (4.0 * 32 * kDim * kDim + 4.0 * 32 * 32 * kDim) * double(len) / 32.0;
}
double softmax_flops(Index len) { return 2.0 * kHeads * double(len) * double(len) * kDim; }

std::string key(const char* kind, Index len) {
  return std::string(kind) + "/d:" + std::to_string(kDim) + "/L:" + std::to_string(len) +
         "/threads:" + std::to_string(kThreads);
}

ak::GateInputs gate_views(const ak::GatedSpec& spec, Index len) {
  ak::GateInputs in;
  const Gates& g = gates();
  if (spec.gate == ak::GateShape::PerToken) in.g = ak::bshd(g.token.data(), 1, len, kHeads, 1);
  if (spec.gate == ak::GateShape::PerChannel)
    in.g = ak::bshd(g.channel.data(), 1, len, kHeads, kDim);
  if (spec.delta()) in.beta = ak::bshd(g.beta.data(), 1, len, kHeads, 1);
  return in;
}

template <class Call>
void add_timed(const std::string& name, Index len, double flops, Call call) {
  attnkit_bench::register_timed(name, [=](benchmark::State& s) {
    auto& b = buffers();
    const auto q = ak::bshd((const float*)b.q.data(), 1, len, kHeads, kDim);
    const auto k = ak::bshd((const float*)b.k.data(), 1, len, kHeads, kDim);
    const auto v = ak::bshd((const float*)b.v.data(), 1, len, kHeads, kDim);
    const auto o = ak::bshd(b.o.data(), 1, len, kHeads, kDim);
    timed(s, name, flops, [&] { call(q, k, v, o); });
  });
}

void add_length(Index len) {
  const auto options = ak::Options{}.with_threads(kThreads);
  for (const auto& [name, spec] : {std::pair{"gated_delta", ak::GatedSpec::gated_delta_net()},
                                   std::pair{"kda", ak::GatedSpec::kimi_delta()}})
    add_timed(key(name, len), len, gated_flops(len),
              [=, spec = spec](const auto& q, const auto& k, const auto& v, const auto& o) {
                ak::gated_attention(spec, q, k, v, gate_views(spec, len), o, options);
              });
  add_timed(key("linear", len), len, linear_flops(len),
            [=](const auto& q, const auto& k, const auto& v, const auto& o) {
              ak::linear_attention(ak::linear_spec(ak::EluPlusOne{}), q, k, v, o, options);
            });
  add_timed(key("softmax", len), len, softmax_flops(len),
            [=](const auto& q, const auto& k, const auto& v, const auto& o) {
              ak::attention(ak::make_spec(ak::Causal{}), q, k, v, o, options);
            });
}

// Forward and backward of Gated DeltaNet at one length: the forward (chunked) then
// gated_attention_backward() (dq, dk, dv, dg, dbeta), against the forward alone; the
// backward either runs the forward's chunks again ("fwd_bwd") or reads what the forward kept
// in a GatedSaved ("fwd_bwd_saved", the training path).
constexpr Index kBackwardLen = 2048;
const char* const kFwdBwd = "gated_delta_fwd_bwd/d:128/L:2048/threads:2";
const char* const kFwdBwdSaved = "gated_delta_fwd_bwd_saved/d:128/L:2048/threads:2";
void add_backward(const char* name, bool saved) {
  const auto spec = ak::GatedSpec::gated_delta_net();
  add_timed(name, kBackwardLen, 0,
            [spec, saved](const auto& q, const auto& k, const auto& v, const auto& o) {
              static std::vector<float> grads(std::size_t(4 * kMaxLen * kHeads * kDim));
              static std::vector<float> gate_grads(std::size_t(2 * kMaxLen * kHeads));
              static ak::GatedSaved kept;  // reused: its memory stays between calls
              const auto options = ak::Options{}.with_threads(kThreads);
              const ak::GateInputs g = gate_views(spec, kBackwardLen);
              const auto view = [&](std::size_t slot) {
                return ak::bshd(grads.data() + slot * kMaxLen * kHeads * kDim, 1, kBackwardLen,
                                kHeads, kDim);
              };
              const ak::GateGrads gg{
                  ak::bshd(gate_grads.data(), 1, kBackwardLen, kHeads, 1),
                  ak::bshd(gate_grads.data() + kMaxLen * kHeads, 1, kBackwardLen, kHeads, 1),
                  {}};
              const ak::View<const float> d_o(view(0));
              if (saved) {
                ak::gated_attention(spec, q, k, v, g, o, ak::View<float>{}, kept, options);
                ak::gated_attention_backward(kept, spec, q, k, v, g, d_o, view(1), view(2), view(3),
                                             gg, {}, options);
              } else {
                ak::gated_attention(spec, q, k, v, g, o, options);
                ak::gated_attention_backward(spec, q, k, v, g, d_o, view(1), view(2), view(3), gg,
                                             {}, {}, options);
              }
            });
}

void BM_TilePeak(benchmark::State& state) { attnkit_bench::square_tile_peak(state, kPeakSize); }

// Decode: one token through the recurrent form, state [1, 16, 128, 128] f32 (1 MiB), against a
// sum over the same bytes (the state's streaming read), one thread.
std::vector<float>& decode_state() {
  static std::vector<float> s(std::size_t(kHeads * kDim * kDim), 0.01f);
  return s;
}
const double kStateBytes = double(kHeads * kDim * kDim) * sizeof(float);

void BM_DecodeStep(benchmark::State& state) {
  auto& b = buffers();
  const auto spec = ak::GatedSpec::gated_delta_net().with_form(ak::LinearForm::Recurrent);
  const auto q = ak::bshd((const float*)b.q.data(), 1, 1, kHeads, kDim);
  const auto st = ak::bhsd(decode_state().data(), 1, kHeads, kDim, kDim);
  const auto o = ak::bshd(b.o.data(), 1, 1, kHeads, kDim);
  timed(state, "decode", 0, [&] {
    ak::gated_attention(spec, q, q, q, gate_views(spec, 1), o, st, ak::Options{}.with_threads(1));
  });
  state.counters["state GB/s"] = attnkit_bench::per_second(kStateBytes / 1e9);
}

void BM_StateStream(benchmark::State& state) {
  const std::vector<float>& s = decode_state();
  timed(state, "stream", 0, [&] {
    ak::simd::Vec acc(0.f);
    for (std::size_t i = 0; i < s.size(); i += ak::simd::kWidth) acc += ak::simd::load(&s[i]);
    benchmark::DoNotOptimize(acc);
  });
  state.counters["state GB/s"] = attnkit_bench::per_second(kStateBytes / 1e9);
}

void print_summary() {
  const auto* p = attnkit_bench::find_best("tile_peak");
  const double peak = p == nullptr ? 0 : 2.0 * kPeakSize * kPeakSize * kPeakSize / p->seconds / 1e9;
  std::printf(
      "\n### Gated attention (chunked, C = %ld) vs causal softmax and linear attention: ISA %s, "
      "H=%ld, d=%ld, B=1, f32, %d threads\n\ntile-GEMM peak (gemm::gemm %ld^3 in cache, one "
      "thread): %.1f GFLOP/s. %%peak = GFLOP/s / (threads x peak) (target >= 50%%); "
      "softmax/gated > 1: gated is faster (target: from L ~ 2K).\n\n",
      long(kChunk), ak::simd::kArchName, long(kHeads), long(kDim), kThreads, long(kPeakSize), peak);
  attnkit_bench::print_table_head(
      "| L | Gated DeltaNet ms | GFLOP/s | %peak | KDA ms | linear ms | softmax ms | "
      "softmax/gated |");
  for (Index len = kMinLen; len <= kMaxLen; len *= 2) {
    const auto* g = attnkit_bench::find_best(key("gated_delta", len));
    const auto* kda = attnkit_bench::find_best(key("kda", len));
    const auto* lin = attnkit_bench::find_best(key("linear", len));
    const auto* soft = attnkit_bench::find_best(key("softmax", len));
    if (g == nullptr || kda == nullptr || lin == nullptr || soft == nullptr) continue;
    const double gflops = gated_flops(len) / g->seconds / 1e9;
    std::printf("| %ld | %.2f | %.1f | %.0f%% | %.2f | %.2f | %.2f | %.2f |\n", long(len),
                g->seconds * 1e3, gflops, 100 * gflops / (kThreads * peak), kda->seconds * 1e3,
                lin->seconds * 1e3, soft->seconds * 1e3, soft->seconds / g->seconds);
  }
  const auto* f = attnkit_bench::find_best(key("gated_delta", kBackwardLen));
  const auto* fb = attnkit_bench::find_best(kFwdBwd);
  const auto* fs = attnkit_bench::find_best(kFwdBwdSaved);
  if (fb != nullptr && fs != nullptr && f != nullptr)
    std::printf(
        "\nforward + backward (L %ld), against the forward alone (%.1f ms; target <= 3.5x): "
        "with the forward's GatedSaved %.1f ms, %.2fx; the backward running the forward again "
        "%.1f ms, %.2fx\n",
        long(kBackwardLen), f->seconds * 1e3, fs->seconds * 1e3, fs->seconds / f->seconds,
        fb->seconds * 1e3, fb->seconds / f->seconds);
  const auto* d = attnkit_bench::find_best("decode");
  const auto* s = attnkit_bench::find_best("stream");
  if (d != nullptr && s != nullptr)
    std::printf(
        "\ndecode step (recurrent, H=%ld, Dk=Dv=%ld, 1 thread): %.1f us, state %.1f GB/s; "
        "streaming read of the state's %.0f KiB: %.1f GB/s; ratio %.2f (target >= 0.8)\n",
        long(kHeads), long(kDim), d->seconds * 1e6, kStateBytes / d->seconds / 1e9,
        kStateBytes / 1024, kStateBytes / s->seconds / 1e9, s->seconds / d->seconds);
}

}  // namespace

int main(int argc, char** argv) {
  attnkit_bench::report_context("gated", kHeads, 0);
  attnkit_bench::report_baseline("gated_delta", "softmax");
  attnkit_bench::report_baseline("kda", "softmax");
  benchmark::RegisterBenchmark("tile_peak", BM_TilePeak)->UseRealTime();
  for (Index len = kMinLen; len <= kMaxLen; len *= 2) add_length(len);
  add_backward(kFwdBwd, false);
  add_backward(kFwdBwdSaved, true);
  attnkit_bench::register_timed("gated_delta_decode/d:128/threads:1", BM_DecodeStep);
  attnkit_bench::register_timed("state_stream/d:128/threads:1", BM_StateStream);
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.05", "--benchmark_repetitions=2"}, print_summary);
}
