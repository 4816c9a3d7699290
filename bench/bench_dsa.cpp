// DeepSeek Sparse Attention (dsa/): the lightning indexer with its top-k selection, the
// sparse attention over the selected keys and its backward, against dense causal attention
// on the same inputs in the same run.
// Prefill (2 threads): H 16 query heads sharing one KV head (MQA), d 128, L 4096 (8K, 16K
// and 32K with ATTNKIT_BENCH_LONG=1), top k = L / 4, an indexer of 16 heads of 128. The
// indexer's GFLOP/s against the tile-GEMM peak measured here (target >= 50% of threads x
// peak); the sparse attention against dense causal: "of ideal" = the speedup over dense as a
// share of the ideal one, causal pairs / selected pairs (the k / L counts the dense
// side's pairs as L^2; the report prints both); the backward likewise.
// Decode (2 threads): one query against Lk 32K and 128K keys, DeepSeek's absorbed MLA shape
// (128 heads over one latent of 576, values its first 512, f32), an indexer of 64 heads of
// 128, k 2048, against dense decode of the same latent (target: >= 5x faster at 128K).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kHeads = 16, kDim = 128, kIndexHeads = 16, kIndexDim = 128;
constexpr Index kPeakSize = 128;
constexpr int kThreads = 2;
constexpr Index kMlaHeads = 128, kLatent = 576, kValueDim = 512, kDecodeIndexHeads = 64,
                kDecodeTopk = 2048;

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& y : x) y = d(rng);
  return x;
}

// One prefill shape's inputs and the indexer's selection (made once, outside the timings).
struct Prefill {
  Index len, topk;
  std::vector<float> q, k, v, o, d_o, dq, dk, dv, lse, qi, w, ki;
  std::vector<std::int32_t> sel;
  explicit Prefill(Index L)
      : len(L),
        topk(L / 4),
        q(normal(std::size_t(L * kHeads * kDim), 1)),
        k(normal(std::size_t(L * kDim), 2)),
        v(normal(std::size_t(L * kDim), 3)),
        o(std::size_t(L * kHeads * kDim)),
        d_o(normal(std::size_t(L * kHeads * kDim), 4)),
        dq(o.size()),
        dk(k.size()),
        dv(v.size()),
        lse(std::size_t(L * kHeads)),
        qi(normal(std::size_t(L * kIndexHeads * kIndexDim), 5)),
        w(normal(std::size_t(L * kIndexHeads), 6)),
        ki(normal(std::size_t(L * kIndexDim), 7)),
        sel(std::size_t(L * L / 4)) {
    indexer();
  }
  ak::View<const float> cq() const { return ak::bshd(q.data(), 1, len, kHeads, kDim); }
  ak::View<const float> ck() const { return ak::bshd(k.data(), 1, len, 1, kDim); }
  ak::View<const float> cv() const { return ak::bshd(v.data(), 1, len, 1, kDim); }
  ak::TopkKeys keys() const { return {ak::bshd(sel.data(), 1, len, 1, topk)}; }
  void indexer() {
    ak::indexer_topk(ak::IndexerSpec{topk, true},
                     ak::View<const float>(ak::bshd(qi.data(), 1, len, kIndexHeads, kIndexDim)),
                     ak::View<const float>(ak::bshd(w.data(), 1, len, kIndexHeads, 1)),
                     ak::View<const float>(ak::bshd(ki.data(), 1, len, 1, kIndexDim)),
                     ak::bshd(sel.data(), 1, len, 1, topk), ak::Options{}.with_threads(kThreads));
  }
  double selected_pairs() const {
    return double(std::count_if(sel.begin(), sel.end(), [](std::int32_t x) { return x >= 0; }));
  }
};

Prefill& prefill(Index L) {
  static std::vector<std::unique_ptr<Prefill>> made;
  for (auto& p : made)
    if (p->len == L) return *p;
  made.push_back(std::make_unique<Prefill>(L));
  return *made.back();
}

double causal_pairs(Index L) { return double(L) * double(L + 1) / 2; }
double indexer_flops(Index L) { return 2.0 * kIndexHeads * kIndexDim * causal_pairs(L); }
double attention_flops(double pairs) { return 4.0 * kHeads * kDim * pairs; }

std::string key(const char* kind, Index L) {
  return std::string(kind) + "/d:" + std::to_string(kDim) + "/L:" + std::to_string(L) +
         "/threads:" + std::to_string(kThreads);
}

template <class Body>
void add(const std::string& name, double flops, Body body) {
  attnkit_bench::register_timed(name, [=](benchmark::State& s) {
    attnkit_bench::time_best(s, name, attnkit_bench::Clocks::kWallAndCpu, body);
    s.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
  });
}

void add_prefill(Index L) {
  const auto options = ak::Options{}.with_threads(kThreads);
  add(key("indexer", L), indexer_flops(L), [=] { prefill(L).indexer(); });
  const double selected = double(L) * double(L) / 4;  // estimate; the summary counts
  add(key("dsa", L), attention_flops(selected), [=] {
    Prefill& p = prefill(L);
    ak::topk_attention(ak::make_spec(), p.cq(), p.ck(), p.cv(),
                       ak::bshd(p.o.data(), 1, L, kHeads, kDim), p.keys(),
                       options.with_lse(p.lse.data(), Index(p.lse.size())));
  });
  add(key("dense", L), attention_flops(causal_pairs(L)), [=] {
    Prefill& p = prefill(L);
    ak::attention(ak::make_spec(ak::Causal{}), p.cq(), p.ck(), p.cv(),
                  ak::bshd(p.o.data(), 1, L, kHeads, kDim), options);
  });
  if (L > 4096) return;  // the backwards at the default length only
  add(key("dsa_backward", L), 2.5 * attention_flops(selected), [=] {
    Prefill& p = prefill(L);
    const auto lse = options.with_lse(p.lse.data(), Index(p.lse.size()));
    ak::topk_attention(ak::make_spec(), p.cq(), p.ck(), p.cv(),
                       ak::bshd(p.o.data(), 1, L, kHeads, kDim), p.keys(), lse);
    ak::topk_attention_backward(ak::make_spec(), p.cq(), p.ck(), p.cv(),
                                ak::View<const float>(ak::bshd(p.o.data(), 1, L, kHeads, kDim)),
                                ak::View<const float>(ak::bshd(p.d_o.data(), 1, L, kHeads, kDim)),
                                ak::bshd(p.dq.data(), 1, L, kHeads, kDim),
                                ak::bshd(p.dk.data(), 1, L, 1, kDim),
                                ak::bshd(p.dv.data(), 1, L, 1, kDim), p.keys(), lse);
  });
  add(key("dense_backward", L), 2.5 * attention_flops(causal_pairs(L)), [=] {
    Prefill& p = prefill(L);
    const auto causal = ak::make_spec(ak::Causal{});
    const auto lse = options.with_lse(p.lse.data(), Index(p.lse.size()));
    ak::attention(causal, p.cq(), p.ck(), p.cv(), ak::bshd(p.o.data(), 1, L, kHeads, kDim), lse);
    ak::attention_backward(causal, p.cq(), p.ck(), p.cv(),
                           ak::View<const float>(ak::bshd(p.o.data(), 1, L, kHeads, kDim)),
                           ak::View<const float>(ak::bshd(p.d_o.data(), 1, L, kHeads, kDim)),
                           ak::bshd(p.dq.data(), 1, L, kHeads, kDim),
                           ak::bshd(p.dk.data(), 1, L, 1, kDim),
                           ak::bshd(p.dv.data(), 1, L, 1, kDim), lse);
  });
}

// Decode: one query against Lk latent rows (MLA absorbed: K = the latent, V = its first 512).
struct Decode {
  Index len;
  std::vector<float> q, latent, o, qi, w, ki;
  std::vector<std::int32_t> sel;
  explicit Decode(Index Lk)
      : len(Lk),
        q(normal(std::size_t(kMlaHeads * kLatent), 11)),
        latent(normal(std::size_t(Lk * kLatent), 12)),
        o(std::size_t(kMlaHeads * kValueDim)),
        qi(normal(std::size_t(kDecodeIndexHeads * kIndexDim), 13)),
        w(normal(std::size_t(kDecodeIndexHeads), 14)),
        ki(normal(std::size_t(Lk * kIndexDim), 15)),
        sel(std::size_t(kDecodeTopk)) {}
  ak::View<const float> cq() const { return ak::bshd(q.data(), 1, 1, kMlaHeads, kLatent); }
  ak::View<const float> ck() const { return ak::bshd(latent.data(), 1, len, 1, kLatent); }
  ak::View<const float> cv() const {
    ak::View<const float> v = ck();
    v.dim = kValueDim;  // the latent's first 512 values of each row
    return v;
  }
  ak::View<float> out() { return ak::bshd(o.data(), 1, 1, kMlaHeads, kValueDim); }
};
Decode& decode(Index Lk) {
  static std::vector<std::unique_ptr<Decode>> made;
  for (auto& p : made)
    if (p->len == Lk) return *p;
  made.push_back(std::make_unique<Decode>(Lk));
  return *made.back();
}
std::string decode_key(const char* kind, Index Lk) {
  return std::string(kind) + "/Lk:" + std::to_string(Lk) + "/threads:" + std::to_string(kThreads);
}

void add_decode(Index Lk) {
  const auto options = ak::Options{}.with_threads(kThreads);
  const double scale = 1.0 / std::sqrt(double(kLatent));
  add(decode_key("dsa_decode", Lk), 0, [=] {
    Decode& d = decode(Lk);
    ak::indexer_topk(
        ak::IndexerSpec{kDecodeTopk, true},
        ak::View<const float>(ak::bshd(d.qi.data(), 1, 1, kDecodeIndexHeads, kIndexDim)),
        ak::View<const float>(ak::bshd(d.w.data(), 1, 1, kDecodeIndexHeads, 1)),
        ak::View<const float>(ak::bshd(d.ki.data(), 1, Lk, 1, kIndexDim)),
        ak::bshd(d.sel.data(), 1, 1, 1, kDecodeTopk), options);
    ak::topk_attention(ak::make_spec(), d.cq(), d.ck(), d.cv(), d.out(),
                       ak::TopkKeys{ak::bshd(d.sel.data(), 1, 1, 1, kDecodeTopk)},
                       options.with_scale(float(scale)));
  });
  add(decode_key("dense_decode", Lk), 0, [=] {
    Decode& d = decode(Lk);
    ak::attention(ak::make_spec(ak::Causal{}), d.cq(), d.ck(), d.cv(), d.out(),
                  options.with_scale(float(scale)));
  });
}

void BM_TilePeak(benchmark::State& state) { attnkit_bench::square_tile_peak(state, kPeakSize); }

void print_summary(const std::vector<Index>& lengths, const std::vector<Index>& decodes) {
  const auto* pk = attnkit_bench::find_best("tile_peak");
  const double peak =
      pk == nullptr ? 0 : 2.0 * kPeakSize * kPeakSize * kPeakSize / pk->seconds / 1e9;
  std::printf(
      "\n### DeepSeek Sparse Attention: ISA %s, MQA H=%ld over one KV head, d=%ld, indexer %ld "
      "heads of %ld, top k = L/4, %d threads\n\ntile-GEMM peak (one thread): %.1f GFLOP/s. "
      "indexer %%peak = GFLOP/s / (threads x peak) (target >= 50%%); of ideal = (dense / dsa) / "
      "(causal pairs / selected pairs) (target >= 0.8); the issue's ideal k / L is also shown.\n\n",
      ak::simd::kArchName, long(kHeads), long(kDim), long(kIndexHeads), long(kIndexDim), kThreads,
      peak);
  attnkit_bench::print_table_head(
      "| L | indexer ms | indexer GFLOP/s | %peak | dsa ms | dense ms | dense/dsa | of ideal | "
      "of k/L ideal | dsa bwd ms | dense bwd ms | bwd of ideal |");
  for (const Index L : lengths) {
    const auto* ix = attnkit_bench::find_best(key("indexer", L));
    const auto* ds = attnkit_bench::find_best(key("dsa", L));
    const auto* de = attnkit_bench::find_best(key("dense", L));
    if (ix == nullptr || ds == nullptr || de == nullptr) continue;
    const double gf = indexer_flops(L) / ix->seconds / 1e9;
    const double live = prefill(L).selected_pairs() / causal_pairs(L);
    const double speedup = de->seconds / ds->seconds;
    const auto* db = attnkit_bench::find_best(key("dsa_backward", L));
    const auto* nb = attnkit_bench::find_best(key("dense_backward", L));
    char bwd[96] = "| - | - | - |";
    if (db != nullptr && nb != nullptr)
      std::snprintf(bwd, sizeof bwd, "| %.1f | %.1f | %.2f |", db->seconds * 1e3, nb->seconds * 1e3,
                    nb->seconds / db->seconds * live);
    std::printf("| %ld | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.2f | %.2f | %.2f %s\n", long(L),
                ix->seconds * 1e3, gf, 100 * gf / (kThreads * peak), ds->seconds * 1e3,
                de->seconds * 1e3, speedup, speedup * live,
                speedup * double(prefill(L).topk) / double(L), bwd);
  }
  std::printf(
      "\nDecode, MLA absorbed (%ld heads, latent %ld, values %ld), indexer %ld heads of %ld, "
      "k %ld, f32, %d threads (target: dense / dsa >= 5 at 128K):\n\n",
      long(kMlaHeads), long(kLatent), long(kValueDim), long(kDecodeIndexHeads), long(kIndexDim),
      long(kDecodeTopk), kThreads);
  attnkit_bench::print_table_head("| Lk | dsa decode ms | dense decode ms | dense / dsa |");
  for (const Index Lk : decodes) {
    const auto* ds = attnkit_bench::find_best(decode_key("dsa_decode", Lk));
    const auto* de = attnkit_bench::find_best(decode_key("dense_decode", Lk));
    if (ds == nullptr || de == nullptr) continue;
    std::printf("| %ld | %.2f | %.2f | %.1f |\n", long(Lk), ds->seconds * 1e3, de->seconds * 1e3,
                de->seconds / ds->seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  attnkit_bench::report_context("dsa", kHeads, 0);
  attnkit_bench::report_baseline("dsa", "dense");
  attnkit_bench::report_baseline("dsa_backward", "dense_backward");
  attnkit_bench::report_baseline("dsa_decode", "dense_decode");
  benchmark::RegisterBenchmark("tile_peak", BM_TilePeak)->UseRealTime();
  std::vector<Index> lengths = {4096}, decodes = {32768, 131072};
  if (std::getenv("ATTNKIT_BENCH_LONG") != nullptr) lengths = {4096, 8192, 16384, 32768};
  for (const Index L : lengths) add_prefill(L);
  for (const Index Lk : decodes) add_decode(Lk);
  return attnkit_bench::run_benchmarks(argc, argv,
                                       {"--benchmark_min_time=0.05", "--benchmark_repetitions=2"},
                                       [&] { print_summary(lengths, decodes); });
}
