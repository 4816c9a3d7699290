// Sparse masks against dense attention on the same inputs, in the same run: sliding window,
// StreamingLLM sinks + window, chunked, PowerOfTwo, a strided mask (a window and every
// 128th key before it, the way a user writes a mask with gathered columns), landmarks (a
// window and every 128th key: columns the queries share), 256 keys picked per query block
// (BlockColumns) and a BlockMask with 10% live blocks, each beside dense causal (and dense
// full, the BlockMask's baseline).
// PowerOfTwo's own window (64 keys, contiguous) runs alone beside it: PowerOfTwo keeps those
// pairs and more, so the window's time bounds PowerOfTwo's from below. A plain loop reading
// its columns' K and V rows (no products) says how much of the rest is reading those rows.
// PowerOfTwo and the strided mask run twice: as the kernel plans them (gathered columns,
// kernel/tiles/tile_plan.hpp) and with their whole mask tiled ("/whole"), the path without the
// face. The question a user asks: does the time follow the work the mask leaves? So the summary
// reports, per variant, the live fraction (kept pairs / causal pairs), the effective GFLOP/s
// over the kept pairs (4 d per kept pair), and time / (baseline time x live fraction of the
// baseline's pairs): 1.0 means the sparse call is exactly as efficient per kept pair as the
// dense one; "of ideal" is its inverse, the speedup over the baseline as a share of 1 / live.
// Times are the best of the repetitions (the machines are shared). ATTNKIT_BENCH_LONG=1 adds
// PowerOfTwo, its window, its columns' read and dense causal at L 65536.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/kernel/tiles/tile_plan.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

constexpr Index kDim = 128, kLen = 16384, kLongLen = 65536, kHeads = 1;
using Plan = ak::detail::PlanChoice;

// Sparse Transformer's strided pattern, written as a user writes a mask with gathered
// columns: query i sees its last `local` keys, and every `stride`-th key before them.
struct Strided {
  using slot = ak::MaskSlot;
  static constexpr int kColumns = 512;  // up to L 65536 with stride 128
  Index local = 128, stride = 128;

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return j <= i && (i - j < local || (i - j) % stride == 0);
  }
  ak::KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, ak::Range q) const {
    return ak::key_range(0, q.end);
  }
  auto range_part() const { return ak::Causal{} & ak::SlidingWindow{local - 1, 0}; }
  ak::KeyColumns<kColumns> columns(Index /*b*/, Index /*h*/, Index i) const {
    ak::KeyColumns<kColumns> c;  // j = i mod stride, ..., up to the key before the window
    if (i < local) return c;
    for (Index j = i % stride; j <= i - local && c.count < kColumns; j += stride) c.add(j);
    return c;
  }
};

// Landmarks: query i sees its last `local` keys and every `every`-th key before them. The
// queries of a tile share those columns: the kernel gathers them into key tiles.
struct Landmarks {
  using slot = ak::MaskSlot;
  static constexpr int kColumns = 512;  // up to L 65536 with every 128
  Index local = 128, every = 128;
  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return 0 <= j && j <= i && (i - j < local || j % every == 0);
  }
  ak::KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, ak::Range q) const {
    return ak::key_range(0, q.end);
  }
  auto range_part() const { return ak::Causal{} & ak::SlidingWindow{local - 1, 0}; }
  ak::KeyColumns<kColumns> columns(Index /*b*/, Index /*h*/, Index i) const {
    ak::KeyColumns<kColumns> c;
    for (Index j = 0; j <= i - local && c.count < kColumns; j += every) c.add(j);
    return c;
  }
};
// Keys picked per query block of 16, as a router's top-k gives them: `picks` random keys
// before the block (single-key full blocks) and the block's own keys, causal (partial), in a
// BlockMask of 16 x 1 blocks seen through BlockColumns.
ak::BlockColumns<512, ak::Causal> picked_keys(Index picks) {
  ak::BlockMaskLayout layout;
  layout.q_len = layout.kv_len = kLen;
  layout.block_q = 16;
  layout.block_k = 1;
  std::mt19937 rng(11);
  ak::BlockList full{{0}, {}}, partial{{0}, {}};
  std::vector<Index> before;
  for (Index qb = 0; qb < layout.q_blocks(); ++qb) {
    const Index i0 = qb * layout.block_q;
    before.resize(static_cast<std::size_t>(i0));
    std::iota(before.begin(), before.end(), Index{0});
    const Index n = std::min(picks, i0);
    for (Index t = 0; t < n; ++t)  // a partial Fisher-Yates shuffle: n distinct keys
      std::swap(before[std::size_t(t)],
                before[std::size_t(t + Index(rng() % std::uint32_t(i0 - t)))]);
    std::sort(before.begin(), before.begin() + n);
    full.blocks.insert(full.blocks.end(), before.begin(), before.begin() + n);
    full.offsets.push_back(static_cast<Index>(full.blocks.size()));
    for (Index j = i0; j < i0 + layout.block_q; ++j) partial.blocks.push_back(j);
    partial.offsets.push_back(static_cast<Index>(partial.blocks.size()));
  }
  return ak::block_columns<512>(
      ak::BlockMask<ak::Causal>(layout, std::move(partial), std::move(full), ak::Causal{}));
}
// A random BlockMask with `live` of its 128 x 128 blocks listed full, the same number in
// every query block, shared across heads.
ak::BlockMask<> random_block_mask(double live) {
  ak::BlockMaskLayout layout;
  layout.q_len = layout.kv_len = kLen;
  const Index per_row = std::max<Index>(1, Index(live * double(layout.kv_blocks()) + 0.5));
  std::mt19937 rng(7);
  std::vector<Index> all(static_cast<std::size_t>(layout.kv_blocks()));
  std::iota(all.begin(), all.end(), Index{0});
  ak::BlockList full{{0}, {}}, partial{std::vector<Index>(layout.rows() + 1, 0), {}};
  for (Index r = 0; r < layout.rows(); ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<Index> row(all.begin(), all.begin() + per_row);
    std::sort(row.begin(), row.end());
    full.blocks.insert(full.blocks.end(), row.begin(), row.end());
    full.offsets.push_back(static_cast<Index>(full.blocks.size()));
  }
  return ak::BlockMask<>(layout, std::move(partial), std::move(full));
}

// Pairs (i, j) of the len x len problem the mask keeps, counted exactly once per variant,
// outside the timed loop: from runs() or columns() where the mask has them, else keep().
template <class Mask>
double kept_pairs(const Mask& mask, Index len) {
  double kept = 0;
  for (Index i = 0; i < len; ++i) {
    if constexpr (ak::detail::has_runs<Mask>::value || ak::detail::has_columns<Mask>::value) {
      kept += double(ak::visible_key_count(mask, 0, 0, i, len));
    } else {
      for (Index j = 0; j < len; ++j) kept += mask.keep(0, 0, i, j) ? 1 : 0;
    }
  }
  return kept;
}

// A BlockMask without an element rule keeps whole blocks: count them.
double kept_pairs(const ak::BlockMask<>& mask, Index /*len*/) {
  const ak::BlockMaskLayout& l = mask.layout();
  double kept = 0;
  for (const ak::BlockList* list : {&mask.full_blocks(), &mask.partial_blocks()})
    for (Index r = 0; r < l.rows(); ++r)
      for (Index t = list->offsets[std::size_t(r)]; t < list->offsets[std::size_t(r + 1)]; ++t) {
        const Index qb = r % l.q_blocks(), kb = list->blocks[std::size_t(t)];
        const Index rows = std::min(l.block_q, l.q_len - qb * l.block_q);
        kept += double(rows) * double(std::min(l.block_k, l.kv_len - kb * l.block_k));
      }
  return kept;
}

struct Variant {
  std::string name, baseline;  // baseline: the dense variant it is compared with
  double kept = 0;             // pairs kept
  Index len = kLen;
};

std::map<std::string, Variant>& variants() {
  static std::map<std::string, Variant> v;
  return v;
}

// The variant of a benchmark key ("<variant>/threads:<n>").
const Variant& variant_of(const std::string& key) {
  return variants()[key.substr(0, key.rfind("/threads:"))];
}

// Times attention with `mask` under `key`, wall clock only, with `plan` for a mask with
// gathered columns.
template <class Mask>
void bench_mask(benchmark::State& state, const std::string& key, Mask mask, int threads,
                Plan plan) {
  const Variant& variant = variant_of(key);
  attnkit_bench::BshdBuffers& buf = attnkit_bench::shared_buffers(variant.len, kHeads, kDim);
  const auto spec = ak::make_spec(mask);
  const auto options = ak::Options{}.with_threads(threads);
  ak::detail::plan_choice() = plan;
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWall, [&] {
    ak::attention(spec, buf.in(buf.q), buf.in(buf.k), buf.in(buf.v), buf.out(), options);
  });
  ak::detail::plan_choice() = Plan::Auto;
  const double len = double(variant.len), flops = 4.0 * kHeads * kDim * variant.kept;
  state.counters["live"] = variant.kept / (len * (len + 1) / 2);  // for the report
  state.counters["GFLOP/s"] = attnkit_bench::per_second(flops / 1e9);
}

// What PowerOfTwo's columns cost to read: the K and V rows of every query's columns (its 2^k
// keys and sinks), in the kernel's order (its query tiles in the order attention() takes
// them, the queries of a tile in order, each one's columns ascending), summed into its output
// row by a plain loop, on the same inputs, threads and schedule as attention(), with none of
// the products. Set beside PowerOfTwo's time over its window's, it says how much of the
// columns' time is the reading of their rows (at L 65536 they come from memory). bytes/s
// over the rows read.
void bench_columns_read(benchmark::State& state, const std::string& key, Index len, int threads) {
  attnkit_bench::BshdBuffers& buf = attnkit_bench::shared_buffers(len, kHeads, kDim);
  const ak::PowerOfTwo mask{4, 64};
  constexpr Index kRows = ak::TileConfig::kBlockQ;
  const Index tiles = (len + kRows - 1) / kRows;
  ak::Problem p{};
  p.q_len = p.kv_len = len;
  const bool from_last = ak::detail::work_grows(mask, p, kRows);  // as run_tiles() orders them
  double rows = 0;
  for (Index i = 0; i < len; ++i) rows += double(mask.columns(0, 0, i).count);
  attnkit_bench::time_best(state, key, attnkit_bench::Clocks::kWall, [&] {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (Index t = 0; t < tiles; ++t) {
      const Index i0 = (from_last ? tiles - 1 - t : t) * kRows;
      for (Index i = i0; i < std::min(len, i0 + kRows); ++i) {
        float* out = buf.o.data() + i * kDim;
        std::fill(out, out + kDim, 0.f);
        for (const Index j : mask.columns(0, 0, i)) {
          const float* k = buf.k.data() + j * kDim;
          const float* v = buf.v.data() + j * kDim;
          for (Index c = 0; c < kDim; ++c) out[c] += k[c] + v[c];
        }
      }
    }
  });
  state.counters["bytes/s"] = attnkit_bench::per_second(rows * 2 * kDim * sizeof(float));
}

template <class Mask>
void add(const std::string& name, const std::string& baseline, Mask mask, Index len = kLen,
         Plan plan = Plan::Auto) {
  variants()[name] = Variant{name, baseline, kept_pairs(mask, len), len};
  if (!baseline.empty()) attnkit_bench::report_baseline(name, baseline);
  // A dense baseline at L 16384 takes 0.6 to 2.6 s a call, one call a repetition by default:
  // the best of 3 would set every ratio against it. At least 1.5 s a repetition gives it 2 to 3
  // calls each where it is quick enough (at L 65536 a call is 10 to 20 s: the default).
  const double min_seconds = baseline.empty() && len == kLen ? 1.5 : 0;
  for (const int threads : {1, 2}) {
    const std::string key = name + "/threads:" + std::to_string(threads);
    attnkit_bench::register_timed(
        key, [=](benchmark::State& s) { bench_mask(s, key, mask, threads, plan); }, min_seconds);
  }
}

// The columns' read (bench_columns_read) as a row of its own, outside the summary table.
void add_columns_read(const std::string& name, Index len) {
  for (const int threads : {1, 2}) {
    const std::string key = name + "/threads:" + std::to_string(threads);
    attnkit_bench::register_timed(
        key, [=](benchmark::State& s) { bench_columns_read(s, key, len, threads); });
  }
}

void print_summary() {
  std::printf(
      "\nSummary: d=%ld, L=%ld (@64K: 65536), H=%ld, f32, BSHD, ISA %s; best of the repetitions.\n"
      "live = kept pairs / causal pairs; GFLOP/s over kept pairs (4 d each);\n"
      "ratio = time / (baseline time x kept pairs / baseline pairs): 1.0 = as efficient per\n"
      "kept pair as the dense baseline; of ideal = 1 / ratio (targets: window <= 1.25,\n"
      "BlockMask 10%% <= 1.3; sinks+window / window <= 1.1; PowerOfTwo of ideal >= 0.6 at\n"
      "L 16K, >= 0.7 at 64K)\n\n",
      long(kDim), long(kLen), long(kHeads), ak::simd::kArchName);
  attnkit_bench::print_table_head(
      "| variant | threads | live | ms | GFLOP/s | baseline | ratio | of ideal |");
  for (const auto& [name, variant] : variants())
    for (const int threads : {1, 2}) {
      const std::string t = "/threads:" + std::to_string(threads);
      const attnkit_bench::Best* best = attnkit_bench::find_best(name + t);
      if (best == nullptr) continue;
      const double seconds = best->seconds;
      std::string ratio = "", of_ideal = "";
      if (!variant.baseline.empty()) {
        const attnkit_bench::Best* base = attnkit_bench::find_best(variant.baseline + t);
        if (base != nullptr) {
          const double work = variant.kept / variants()[variant.baseline].kept;
          const double r = seconds / (base->seconds * work);
          char text[32];
          std::snprintf(text, sizeof text, "%.2f", r);
          ratio = text;
          std::snprintf(text, sizeof text, "%.2f", 1.0 / r);
          of_ideal = text;
        }
      }
      const double len = double(variant.len);
      std::printf("| %s | %d | %.4f | %.1f | %.1f | %s | %s | %s |\n", name.c_str(), threads,
                  variant.kept / (len * (len + 1) / 2), seconds * 1e3,
                  4.0 * kHeads * kDim * variant.kept / seconds / 1e9,
                  variant.baseline.empty() ? "-" : variant.baseline.c_str(), ratio.c_str(),
                  of_ideal.c_str());
    }
  for (const int threads : {1, 2}) {
    const std::string t = "/threads:" + std::to_string(threads);
    const attnkit_bench::Best* sinks = attnkit_bench::find_best("causal&(sinks4|window512)" + t);
    const attnkit_bench::Best* window = attnkit_bench::find_best("causal&window512" + t);
    if (sinks != nullptr && window != nullptr)
      std::printf("sinks+window / window, %d thread(s): %.2f\n", threads,
                  sinks->seconds / window->seconds);
    // PowerOfTwo's of ideal, were its columns free: its pairs' ideal time (the dense time x
    // its live fraction) over the time of its window alone (a lower bound on its time); and
    // what its columns add to the window, against what reading their rows alone takes.
    for (const std::string at : {"", "@64K"}) {
      const attnkit_bench::Best* dense = attnkit_bench::find_best("dense_causal" + at + t);
      const attnkit_bench::Best* band = attnkit_bench::find_best("causal&window64" + at + t);
      const attnkit_bench::Best* all = attnkit_bench::find_best("power_of_two(4,64)" + at + t);
      const attnkit_bench::Best* read =
          attnkit_bench::find_best("power_of_two(4,64) columns read" + at + t);
      if (dense == nullptr || band == nullptr) continue;
      const double ideal = dense->seconds * variants()["power_of_two(4,64)" + at].kept /
                           variants()["dense_causal" + at].kept;
      std::printf("power_of_two(4,64)%s of ideal at most %.2f, %d thread(s): its window alone",
                  at.c_str(), ideal / band->seconds, threads);
      if (all != nullptr && read != nullptr)
        std::printf("; its columns add %.1f ms to it, reading their rows alone takes %.1f ms",
                    (all->seconds - band->seconds) * 1e3, read->seconds * 1e3);
      std::printf("\n");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  attnkit_bench::report_context("masks", kHeads, kLen);
  add("dense_causal", "", ak::Causal{});
  add("dense_full", "", ak::Full{});
  add("causal&window512", "dense_causal", ak::Causal{} & ak::SlidingWindow{512, 0});
  add("causal&(sinks4|window512)", "dense_causal",
      ak::Causal{} & (ak::Sinks{4} | ak::SlidingWindow{512, 0}));
  add("causal&chunk2048", "dense_causal", ak::Causal{} & ak::Chunked{2048});
  // PowerOfTwo{4, 64}'s window alone: 64 of its ~76 keys per query, in one contiguous band.
  // A lower bound on PowerOfTwo's time, measured in the same run.
  add("causal&window64", "dense_causal", ak::Causal{} & ak::SlidingWindow{63, 0});
  add("power_of_two(4,64)", "dense_causal", ak::PowerOfTwo{4, 64});
  add("power_of_two(4,64)/whole", "dense_causal", ak::PowerOfTwo{4, 64}, kLen, Plan::Whole);
  add_columns_read("power_of_two(4,64) columns read", kLen);
  add("strided(128,128)", "dense_causal", Strided{});
  add("strided(128,128)/whole", "dense_causal", Strided{}, kLen, Plan::Whole);
  add("landmarks(128,128)", "dense_causal", Landmarks{});
  add("picked_keys(256)", "dense_causal", picked_keys(256));
  const char* long_run = std::getenv("ATTNKIT_BENCH_LONG");
  if (long_run != nullptr && long_run[0] == '1') {
    add("dense_causal@64K", "", ak::Causal{}, kLongLen);
    add("power_of_two(4,64)@64K", "dense_causal@64K", ak::PowerOfTwo{4, 64}, kLongLen);
    add("causal&window64@64K", "dense_causal@64K", ak::Causal{} & ak::SlidingWindow{63, 0},
        kLongLen);
    add_columns_read("power_of_two(4,64) columns read@64K", kLongLen);
  }
  add("block_mask_10%", "dense_full", random_block_mask(0.1));
  // 3 repetitions of at least 0.3 s each unless the command line says otherwise.
  return attnkit_bench::run_benchmarks(
      argc, argv, {"--benchmark_min_time=0.3", "--benchmark_repetitions=3"}, print_summary);
}
