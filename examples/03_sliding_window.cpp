// What this shows: local attention and StreamingLLM's attention sinks, built by combining
// masks. `Causal & SlidingWindow{w, 0}` lets query i see keys i - w .. i; StreamingLLM adds
// the first 4 keys ("sinks") that every query keeps: `Causal & (Sinks{4} | SlidingWindow)`.
// The kernel walks only the key ranges a mask leaves (two short ranges for sinks + window,
// not their hull), so the time follows the kept pairs; we count them and time both against
// dense causal attention, then check each against the double-precision reference.
//
// Convention: SlidingWindow{left, right} counts keys before and after the query, so a KV
// cache holding W recent tokens (the current one included), as in StreamingLLM's recent
// window, is SlidingWindow{W - 1, 0}.
//
// Then scattered keys: PowerOfTwo (PowerAttention: keys at distances 2^k) and a mask of our
// own that keeps a window plus "landmark" keys at every 64th position. Such a mask tells the
// kernel which of its keys come in ranges (range_part(), itself a mask) and which are
// isolated columns of each query (columns()); the kernel tiles the ranges and gathers each
// query's columns row by row, so the work follows the kept pairs, not the bands that hold
// them. Both are timed and checked against the reference too.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

// Pairs (i, j) the mask keeps for queries 0 .. len-1 over keys 0 .. len-1: each query's
// visible keys, counted from the mask's runs() (exact key intervals) or its columns.
template <class Mask>
double kept_pairs(const Mask& mask, Index len) {
  double kept = 0;
  for (Index i = 0; i < len; ++i) kept += double(ak::visible_key_count(mask, 0, 0, i, len));
  return kept;
}

// Our own mask: query i sees its last `window` keys and the landmarks before them (every
// `every`-th key). keep() alone would be correct; the two faces below make it fast.
struct Landmarks {
  using slot = ak::MaskSlot;
  static constexpr int kMost = 64;  // landmarks a query can have: len / every
  Index window = 64, every = 64;

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return 0 <= j && j <= i && (i - j < window || j % every == 0);
  }
  // The keys that come in ranges, as a mask with every face of its own.
  auto range_part() const { return ak::Causal{} & ak::SlidingWindow{window - 1, 0}; }
  // The others, ascending, none in the range part.
  ak::KeyColumns<kMost> columns(Index /*b*/, Index /*h*/, Index i) const {
    ak::KeyColumns<kMost> c;
    for (Index j = 0; j <= i - window && c.count < kMost; j += every) c.add(j);
    return c;
  }
};

template <class Spec>
double seconds_of(const Spec& spec, ak::View<const float> q, ak::View<const float> k,
                  ak::View<const float> v, ak::View<float> o) {
  const auto start = std::chrono::steady_clock::now();
  ak::attention(spec, q, k, v, o);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Largest |fast - reference| for one spec, over the last `rows` queries (those that see the
// most keys; the reference's cost grows with the pairs it visits).
template <class Spec>
double error_of(const Spec& spec, ak::View<const float> q, ak::View<const float> k,
                ak::View<const float> v, ak::View<float> o, std::vector<double>& expected,
                Index rows = 256) {
  const Index first = q.seq - rows;
  const ak::View<const float> q_last = ak::bshd(q.row(0, 0, first), 1, rows, q.heads, q.dim);
  const ak::View<float> o_last = ak::bshd(o.row(0, 0, first), 1, rows, o.heads, o.dim);
  const auto reference_out = ak::bshd(expected.data(), 1, rows, o.heads, o.dim);
  const auto options = ak::Options{}.with_q_offset(first);
  ak::attention(spec, q_last, k, v, o_last, options);
  ak::reference::attention(spec, q_last, k, v, reference_out, options);
  double worst = 0;
  for (Index h = 0; h < o.heads; ++h)
    for (Index s = 0; s < rows; ++s)
      for (Index c = 0; c < o.dim; ++c)
        worst = std::max(worst, std::abs(o_last.row(0, h, s)[c] - reference_out.row(0, h, s)[c]));
  return worst;
}

}  // namespace

int main() {
  const Index len = 2048, heads = 2, dim = 64, window = 256, sinks = 4;
  std::vector<float> q(len * heads * dim), k(q.size()), v(q.size()), o(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);
  const auto Q = ak::bshd(q.data(), 1, len, heads, dim), K = ak::bshd(k.data(), 1, len, heads, dim),
             V = ak::bshd(v.data(), 1, len, heads, dim);
  const auto O = ak::bshd(o.data(), 1, len, heads, dim);

  // Three variants: dense causal, local attention, and StreamingLLM (sinks + window).
  const auto causal = ak::Causal{};
  const auto local_mask = ak::Causal{} & ak::SlidingWindow{window - 1, 0};
  const auto streaming_mask = ak::Causal{} & (ak::Sinks{sinks} | ak::SlidingWindow{window - 1, 0});
  const auto power_mask = ak::PowerOfTwo{sinks, 64};
  const auto landmarks = Landmarks{};

  const double dense_pairs = kept_pairs(causal, len);
  const double local_pairs = kept_pairs(local_mask, len);
  const double streaming_pairs = kept_pairs(streaming_mask, len);
  const double power_pairs = kept_pairs(power_mask, len);
  const double landmark_pairs = kept_pairs(landmarks, len);
  std::printf("kept pairs: causal %.0f, window %.0f (%.1f%%), sinks + window %.0f (%.1f%%)\n",
              dense_pairs, local_pairs, 100 * local_pairs / dense_pairs, streaming_pairs,
              100 * streaming_pairs / dense_pairs);
  std::printf("            PowerOfTwo %.0f (%.1f%%), landmarks %.0f (%.1f%%)\n", power_pairs,
              100 * power_pairs / dense_pairs, landmark_pairs, 100 * landmark_pairs / dense_pairs);

  // Best of a few runs each: the time follows the kept pairs, not the sequence length.
  double t_dense = 1e9, t_local = 1e9, t_streaming = 1e9, t_power = 1e9, t_landmarks = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    t_dense = std::min(t_dense, seconds_of(ak::make_spec(causal), Q, K, V, O));
    t_local = std::min(t_local, seconds_of(ak::make_spec(local_mask), Q, K, V, O));
    t_streaming = std::min(t_streaming, seconds_of(ak::make_spec(streaming_mask), Q, K, V, O));
    t_power = std::min(t_power, seconds_of(ak::make_spec(power_mask), Q, K, V, O));
    t_landmarks = std::min(t_landmarks, seconds_of(ak::make_spec(landmarks), Q, K, V, O));
  }
  std::printf("time: causal %.2f ms, window %.2f ms (%.0f%% skipped), sinks + window %.2f ms\n",
              1e3 * t_dense, 1e3 * t_local, 100 * (1 - t_local / t_dense), 1e3 * t_streaming);
  std::printf("      PowerOfTwo %.2f ms, landmarks %.2f ms\n", 1e3 * t_power, 1e3 * t_landmarks);

  // Every sparse variant agrees with the reference, which applies keep() to every pair: on
  // the last 256 queries, at their positions.
  std::vector<double> expected(o.size());
  const double err_local = error_of(ak::make_spec(local_mask), Q, K, V, O, expected);
  const double err_streaming = error_of(ak::make_spec(streaming_mask), Q, K, V, O, expected);
  const double err_power = error_of(ak::make_spec(power_mask), Q, K, V, O, expected);
  const double err_landmarks = error_of(ak::make_spec(landmarks), Q, K, V, O, expected);
  const double tolerance = 2e-5;  // f32 kernel vs f64 reference, values of order 1
  std::printf(
      "max |o - reference|: window %.3g, sinks + window %.3g, PowerOfTwo %.3g, "
      "landmarks %.3g (tolerance %.0e)\n",
      err_local, err_streaming, err_power, err_landmarks, tolerance);
  const bool pass = std::max({err_local, err_streaming, err_power, err_landmarks}) <= tolerance;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
