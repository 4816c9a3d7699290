// DeepSeek Sparse Attention (dsa/): the lightning indexer with its top-k selection, the
// sparse attention over the selected keys and its backward, against dense causal attention
// on the same inputs in the same run.
// Prefill (2 threads), top k = min(L / 4, 2048) (DeepSeek's 2048 from L 8K), an indexer of
// 16 heads of 128: "mqa16", 16 query heads
// sharing one KV head of d 128, L 4096 (8K, 16K and 32K with ATTNKIT_BENCH_LONG=1), with the
// backward; "mla64", DeepSeek's MQA form of MLA (64 heads over one latent of 576, values its
// first 512), L 2048. The
// indexer's GFLOP/s against the tile-GEMM peak measured here (target >= 50% of threads x
// peak); the sparse attention against dense causal: "of ideal" = the speedup over dense as a
// share of the ideal one, causal pairs / selected pairs (the k / L counts the dense
// side's pairs as L^2; the report prints both); the backward likewise.
// Decode (2 threads): one query against Lk 32K and 128K keys, DeepSeek's absorbed MLA shape
// (128 heads over one latent of 576, values its first 512, f32), an indexer of 64 heads of
// 128, k 2048, against dense decode of the same latent (target: >= 5x faster at 128K).
// The indexer again with int8 products (Products::Int8) against f32: time and the share of
// the f32 selection it keeps.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
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

// A prefill shape: H query heads over one KV head of D (values Dv), as MQA (separate K and V)
// or as MLA's latent (V = the first Dv values of K's rows).
struct Shape {
  const char* name;
  Index len, heads, dim, value_dim;
  bool latent;
};
constexpr Shape kMqa{"mqa16", 4096, kHeads, kDim, kDim, false};
constexpr Shape kMla{"mla64", 2048, 64, kLatent, kValueDim, true};

// One prefill shape's inputs and the indexer's selection (made once, outside the timings).
struct Prefill {
  Shape s;
  Index topk;
  std::vector<float> q, k, v, o, d_o, dq, dk, dv, lse, qi, w, ki;
  std::vector<std::int32_t> sel, sel8;  // the indexer's selection: exact, int8 products
  explicit Prefill(const Shape& shape)
      : s(shape),
        topk(std::min<Index>(shape.len / 4, 2048)),
        q(normal(std::size_t(s.len * s.heads * s.dim), 1)),
        k(normal(std::size_t(s.len * s.dim), 2)),
        v(normal(std::size_t(s.len * s.value_dim), 3)),
        o(std::size_t(s.len * s.heads * s.value_dim)),
        d_o(normal(std::size_t(s.len * s.heads * s.value_dim), 4)),
        dq(q.size()),
        dk(k.size()),
        dv(v.size()),
        lse(std::size_t(s.len * s.heads)),
        qi(normal(std::size_t(s.len * kIndexHeads * kIndexDim), 5)),
        w(normal(std::size_t(s.len * kIndexHeads), 6)),
        ki(normal(std::size_t(s.len * kIndexDim), 7)),
        sel(std::size_t(s.len * topk)),
        sel8(sel.size()) {
    indexer();
  }
  ak::View<const float> cq() const { return ak::bshd(q.data(), 1, s.len, s.heads, s.dim); }
  ak::View<const float> ck() const { return ak::bshd(k.data(), 1, s.len, 1, s.dim); }
  ak::View<const float> cv() const {
    if (!s.latent) return ak::bshd(v.data(), 1, s.len, 1, s.value_dim);
    ak::View<const float> x = ck();
    x.dim = s.value_dim;  // the latent's first values of each row
    return x;
  }
  ak::View<float> out() { return ak::bshd(o.data(), 1, s.len, s.heads, s.value_dim); }
  ak::View<const float> cout() const { return ak::bshd(o.data(), 1, s.len, s.heads, s.value_dim); }
  ak::TopkKeys keys() const { return {ak::bshd(sel.data(), 1, s.len, 1, topk)}; }
  void indexer(ak::Products how = ak::Products::Exact) {
    std::vector<std::int32_t>& out = how == ak::Products::Int8 ? sel8 : sel;
    ak::indexer_topk(ak::IndexerSpec{topk, true},
                     ak::View<const float>(ak::bshd(qi.data(), 1, s.len, kIndexHeads, kIndexDim)),
                     ak::View<const float>(ak::bshd(w.data(), 1, s.len, kIndexHeads, 1)),
                     ak::View<const float>(ak::bshd(ki.data(), 1, s.len, 1, kIndexDim)),
                     ak::bshd(out.data(), 1, s.len, 1, topk),
                     ak::Options{}.with_threads(kThreads).with_products(how));
  }
  // The share of the exact selection's keys the int8 one keeps (both rows ascending).
  double int8_recall() const {
    double kept = 0, all = 0;
    for (Index t = 0; t < s.len; ++t) {
      const auto a = sel.begin() + t * topk, b = sel8.begin() + t * topk;
      const auto a_end = std::find(a, a + topk, -1), b_end = std::find(b, b + topk, -1);
      std::vector<std::int32_t> both;
      std::set_intersection(a, a_end, b, b_end, std::back_inserter(both));
      kept += double(both.size());
      all += double(a_end - a);
    }
    return all > 0 ? kept / all : 1.0;
  }
  double selected_pairs() const {
    return double(std::count_if(sel.begin(), sel.end(), [](std::int32_t x) { return x >= 0; }));
  }
};

Prefill& prefill(const Shape& shape) {
  static std::vector<std::unique_ptr<Prefill>> made;
  for (auto& p : made)
    if (p->s.len == shape.len && p->s.heads == shape.heads && p->s.dim == shape.dim) return *p;
  made.push_back(std::make_unique<Prefill>(shape));
  return *made.back();
}

double causal_pairs(Index L) { return double(L) * double(L + 1) / 2; }
double indexer_flops(Index L) { return 2.0 * kIndexHeads * kIndexDim * causal_pairs(L); }
double attention_flops(const Shape& s, double pairs) {
  return 2.0 * double(s.heads) * double(s.dim + s.value_dim) * pairs;
}

std::string key(const char* kind, const Shape& s) {
  return std::string(kind) + "/" + s.name + "/L:" + std::to_string(s.len) +
         "/threads:" + std::to_string(kThreads);
}

template <class Body>
void add(const std::string& name, double flops, Body body) {
  attnkit_bench::register_timed(name, [=](benchmark::State& st) {
    attnkit_bench::time_best(st, name, attnkit_bench::Clocks::kWallAndCpu, body);
    st.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
  });
}

void add_prefill(const Shape& sh, bool backward) {
  const auto options = ak::Options{}.with_threads(kThreads);
  add(key("indexer", sh), indexer_flops(sh.len), [=] { prefill(sh).indexer(); });
  add(key("indexer_int8", sh), indexer_flops(sh.len),
      [=] { prefill(sh).indexer(ak::Products::Int8); });
  const double selected =
      double(sh.len) * double(std::min<Index>(sh.len / 4, 2048));  // the summary counts
  add(key("dsa", sh), attention_flops(sh, selected), [=] {
    Prefill& p = prefill(sh);
    ak::topk_attention(ak::make_spec(), p.cq(), p.ck(), p.cv(), p.out(), p.keys(),
                       options.with_lse(p.lse.data(), Index(p.lse.size())));
  });
  add(key("dense", sh), attention_flops(sh, causal_pairs(sh.len)), [=] {
    Prefill& p = prefill(sh);
    ak::attention(ak::make_spec(ak::Causal{}), p.cq(), p.ck(), p.cv(), p.out(), options);
  });
  if (!backward) return;
  const auto grads = [](Prefill& p) {
    return std::tuple{
        ak::View<const float>(ak::bshd(p.d_o.data(), 1, p.s.len, p.s.heads, p.s.value_dim)),
        ak::bshd(p.dq.data(), 1, p.s.len, p.s.heads, p.s.dim),
        ak::bshd(p.dk.data(), 1, p.s.len, 1, p.s.dim),
        ak::bshd(p.dv.data(), 1, p.s.len, 1, p.s.value_dim)};
  };
  add(key("dsa_backward", sh), 2.5 * attention_flops(sh, selected), [=] {
    Prefill& p = prefill(sh);
    const auto lse = options.with_lse(p.lse.data(), Index(p.lse.size()));
    const auto [d_o, dq, dk, dv] = grads(p);
    ak::topk_attention(ak::make_spec(), p.cq(), p.ck(), p.cv(), p.out(), p.keys(), lse);
    ak::topk_attention_backward(ak::make_spec(), p.cq(), p.ck(), p.cv(), p.cout(), d_o, dq, dk, dv,
                                p.keys(), lse);
  });
  add(key("dense_backward", sh), 2.5 * attention_flops(sh, causal_pairs(sh.len)), [=] {
    Prefill& p = prefill(sh);
    const auto causal = ak::make_spec(ak::Causal{});
    const auto lse = options.with_lse(p.lse.data(), Index(p.lse.size()));
    const auto [d_o, dq, dk, dv] = grads(p);
    ak::attention(causal, p.cq(), p.ck(), p.cv(), p.out(), lse);
    ak::attention_backward(causal, p.cq(), p.ck(), p.cv(), p.cout(), d_o, dq, dk, dv, lse);
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

void print_summary(const std::vector<Shape>& shapes, const std::vector<Index>& decodes) {
  const auto* pk = attnkit_bench::find_best("tile_peak");
  const double peak =
      pk == nullptr ? 0 : 2.0 * kPeakSize * kPeakSize * kPeakSize / pk->seconds / 1e9;
  std::printf(
      "\n### DeepSeek Sparse Attention: ISA %s, H query heads over one KV head (mqa16: d %ld; "
      "mla64: MLA's latent), indexer %ld heads of %ld, top k = min(L/4, 2048), %d "
      "threads\n\ntile-GEMM peak "
      "(one thread): %.1f GFLOP/s. "
      "indexer %%peak = GFLOP/s / (threads x peak) (target >= 50%%); of ideal = (dense / dsa) / "
      "(causal pairs / selected pairs) (target >= 0.8); the issue's ideal k / L is also shown.\n\n",
      ak::simd::kArchName, long(kDim), long(kIndexHeads), long(kIndexDim), kThreads, peak);
  attnkit_bench::print_table_head(
      "| shape | L | indexer ms | indexer GFLOP/s | %peak | dsa ms | dense ms | dense/dsa | "
      "of ideal | of k/L ideal | dsa bwd ms | dense bwd ms | bwd of ideal |");
  for (const Shape& sh : shapes) {
    const auto* ix = attnkit_bench::find_best(key("indexer", sh));
    const auto* ds = attnkit_bench::find_best(key("dsa", sh));
    const auto* de = attnkit_bench::find_best(key("dense", sh));
    if (ix == nullptr || ds == nullptr || de == nullptr) continue;
    const double gf = indexer_flops(sh.len) / ix->seconds / 1e9;
    const double live = prefill(sh).selected_pairs() / causal_pairs(sh.len);
    const double speedup = de->seconds / ds->seconds;
    const auto* db = attnkit_bench::find_best(key("dsa_backward", sh));
    const auto* nb = attnkit_bench::find_best(key("dense_backward", sh));
    char bwd[96] = "| - | - | - |";
    if (db != nullptr && nb != nullptr)
      std::snprintf(bwd, sizeof bwd, "| %.1f | %.1f | %.2f |", db->seconds * 1e3, nb->seconds * 1e3,
                    nb->seconds / db->seconds * live);
    std::printf(
        "| %s (H %ld, D %ld/%ld) | %ld | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.2f | %.2f | %.2f "
        "%s\n",
        sh.name, long(sh.heads), long(sh.dim), long(sh.value_dim), long(sh.len), ix->seconds * 1e3,
        gf, 100 * gf / (kThreads * peak), ds->seconds * 1e3, de->seconds * 1e3, speedup,
        speedup * live, speedup * double(prefill(sh).topk) / double(sh.len), bwd);
  }
  std::printf(
      "\nThe indexer with int8 products (Products::Int8: rows quantized with a scale each, exact "
      "integer sums%s), against f32 products; recall = the share of the f32 selection's keys "
      "the int8 one keeps:\n\n",
#ifdef ATTNKIT_INDEXER_VNNI
      ", AVX-512 VNNI"
#else
      ", a portable integer loop (no AVX-512 VNNI in this build)"
#endif
  );
  attnkit_bench::print_table_head("| shape | L | f32 ms | int8 ms | f32 / int8 | recall |");
  for (const Shape& sh : shapes) {
    const auto* ix = attnkit_bench::find_best(key("indexer", sh));
    const auto* i8 = attnkit_bench::find_best(key("indexer_int8", sh));
    if (ix == nullptr || i8 == nullptr) continue;
    std::printf("| %s | %ld | %.1f | %.1f | %.2f | %.4f |\n", sh.name, long(sh.len),
                ix->seconds * 1e3, i8->seconds * 1e3, ix->seconds / i8->seconds,
                prefill(sh).int8_recall());
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
  attnkit_bench::report_baseline("indexer_int8", "indexer");
  benchmark::RegisterBenchmark("tile_peak", BM_TilePeak)->UseRealTime();
  std::vector<Shape> shapes = {kMqa, kMla};
  std::vector<Index> decodes = {32768, 131072};
  if (std::getenv("ATTNKIT_BENCH_LONG") != nullptr)
    for (const Index L : {8192, 16384, 32768})
      shapes.push_back({"mqa16", L, kHeads, kDim, kDim, false});
  for (const Shape& sh : shapes) add_prefill(sh, sh.len == 4096 && !sh.latent);
  for (const Index Lk : decodes) add_decode(Lk);
  return attnkit_bench::run_benchmarks(argc, argv,
                                       {"--benchmark_min_time=0.05", "--benchmark_repetitions=3"},
                                       [&] { print_summary(shapes, decodes); });
}
