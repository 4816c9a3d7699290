// What this shows: serving a RoPE model through a KvCache. The prompt's keys and values go
// into the cache at once (prefill), keys rotated at their positions as they enter; then
// tokens come one at a time: each new key is rotated at position length() and appended, the
// new query is rotated at the same position with apply_position(), and decode() (one query
// row against the whole cache, split-KV) gives the token's output. Keys are rotated once,
// when they enter, so the spec of every call has no Position: putting Rope there as well
// would turn the cached keys a second time. (The other correct way: store plain keys and
// fuse Rope into attention(), which then turns every cached key on every call.)
//
// Each step is checked against a full recompute: attention() with Rope fused over the
// whole sequence so far, whose last row must match the decoded token. Last, the same sequence
// in a q8_0 cache (quantized K/V, read in place), checked against the reference and the f32
// cache, and read with int8 products.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kHeads = 8, kKvHeads = 2, kDim = 64;  // GQA: 4 query heads per KV head
const Index kPrompt = 200, kNewTokens = 40, kTotal = kPrompt + kNewTokens;

// Rows [begin, begin + n) of a BSHD view: the tokens of a span of the sequence.
template <class T>
ak::View<T> tokens(const ak::View<T>& x, Index begin, Index n) {
  ak::View<T> part = x;
  part.data = x.row(0, 0, begin);
  part.seq = n;
  return part;
}

// Largest |a - b| over two views of the same shape.
double max_diff(ak::View<const float> a, ak::View<const float> b) {
  double worst = 0;
  for (Index h = 0; h < a.heads; ++h)
    for (Index s = 0; s < a.seq; ++s)
      for (Index c = 0; c < a.dim; ++c)
        worst = std::max(worst, double(std::abs(a.row(0, h, s)[c] - b.row(0, h, s)[c])));
  return worst;
}

}  // namespace

int main() {
  // The projections a model would compute per token, drawn up front: [1, L, H, D] (BSHD).
  std::mt19937 rng(14);
  std::normal_distribution<float> normal;
  std::vector<float> q(kTotal * kHeads * kDim), k(kTotal * kKvHeads * kDim), v(k.size());
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);
  const auto Q = ak::bshd(q.data(), 1, kTotal, kHeads, kDim);
  const auto K = ak::bshd(k.data(), 1, kTotal, kKvHeads, kDim);
  const auto V = ak::bshd(v.data(), 1, kTotal, kKvHeads, kDim);

  const ak::Rope rope{ak::RopeTable(kDim, 10000.0, kTotal)};
  const auto served = ak::make_spec(ak::Causal{});           // keys arrive rotated
  const auto recompute = ak::make_spec(ak::Causal{}, rope);  // turns q and k itself

  ak::KvCache<float> cache(1, kKvHeads, kTotal, kDim);
  std::vector<float> q_turned(kPrompt * kHeads * kDim), out(q_turned.size()),
      full(kTotal * kHeads * kDim);
  const double tolerance = 2e-5;  // two f32 computations of the same rows; outputs ~ 1
  double worst = 0;

  // Prefill: the prompt's keys rotated at 0..kPrompt-1 into the cache, its queries rotated
  // at the same positions, causal attention over the cache.
  cache.append(tokens(K, 0, kPrompt), tokens(V, 0, kPrompt), rope);
  std::copy_n(q.begin(), q_turned.size(), q_turned.begin());
  const auto q_prompt = ak::bshd(q_turned.data(), 1, kPrompt, kHeads, kDim);
  const auto o_prompt = ak::bshd(out.data(), 1, kPrompt, kHeads, kDim);
  ak::apply_position(rope, q_prompt, ak::Role::Query, 0);
  ak::attention(served, ak::View<const float>(q_prompt), cache.keys(), cache.values(), o_prompt);
  const auto o_full = ak::bshd(full.data(), 1, kPrompt, kHeads, kDim);
  ak::attention(recompute, tokens(Q, 0, kPrompt), tokens(K, 0, kPrompt), tokens(V, 0, kPrompt),
                o_full);
  worst = max_diff(o_prompt, o_full);
  std::printf("prefill: %ld tokens, max |cache - recompute| = %.2g\n", long(kPrompt), worst);

  // Decode: one token at a time. Its key turns at position t as it is appended; its query
  // turns at t too (offset = length - 1 once the token is in the cache).
  for (Index t = kPrompt; t < kTotal; ++t) {
    cache.append(tokens(K, t, 1), tokens(V, t, 1), rope);
    std::vector<float> q_token(Q.row(0, 0, t), Q.row(0, 0, t) + kHeads * kDim), o_token(q_token);
    const auto q1 = ak::bshd(q_token.data(), 1, 1, kHeads, kDim);
    const auto o1 = ak::bshd(o_token.data(), 1, 1, kHeads, kDim);
    ak::apply_position(rope, q1, ak::Role::Query, cache.length() - 1);
    ak::decode(served, ak::View<const float>(q1), cache.keys(), cache.values(), o1);

    const auto o_all = ak::bshd(full.data(), 1, t + 1, kHeads, kDim);
    ak::attention(recompute, tokens(Q, 0, t + 1), tokens(K, 0, t + 1), tokens(V, 0, t + 1), o_all);
    const double diff = max_diff(o1, tokens(o_all, t, 1));
    worst = std::max(worst, diff);
    if (t % 10 == 0 || t == kTotal - 1)
      std::printf("token %3ld: cache length %3ld, max |decode - recompute| = %.2g\n", long(t),
                  long(cache.length()), diff);
  }

  // The same sequence in a q8_0 cache (llama.cpp's block format: 32 int8 values and one f16
  // scale per block, 8.5 bits a value, about half the bytes of bf16): append() rotates each key
  // and quantizes it as it enters, decode() reads the blocks in place. The last token against
  // it: within f32 rounding of the reference on the stored (dequantized) values, and within
  // q8_0's rounding of the f32 cache (each value moves by at most half a step of its block,
  // max|x| / 254).
  ak::KvCache<ak::BlockQ8_0> q8_cache(1, kKvHeads, kTotal, kDim);
  q8_cache.append(K, V, rope);
  std::vector<float> q_last(Q.row(0, 0, kTotal - 1), Q.row(0, 0, kTotal - 1) + kHeads * kDim);
  std::vector<float> o_q8(q_last.size()), o_f32(q_last.size());
  std::vector<double> o_ref(q_last.size());
  const auto q_view = ak::bshd(q_last.data(), 1, 1, kHeads, kDim);
  ak::apply_position(rope, q_view, ak::Role::Query, kTotal - 1);
  const auto q_in = ak::View<const float>(q_view);
  ak::decode(served, q_in, q8_cache.keys(), q8_cache.values(),
             ak::bshd(o_q8.data(), 1, 1, kHeads, kDim));
  ak::decode(served, q_in, cache.keys(), cache.values(),
             ak::bshd(o_f32.data(), 1, 1, kHeads, kDim));
  ak::reference::attention(served, q_in, q8_cache.keys(), q8_cache.values(),
                           ak::bshd(o_ref.data(), 1, 1, kHeads, kDim));
  double q8_vs_ref = 0, q8_vs_f32 = 0;
  for (std::size_t i = 0; i < o_q8.size(); ++i) {
    q8_vs_ref = std::max(q8_vs_ref, std::abs(double(o_q8[i]) - o_ref[i]));
    q8_vs_f32 = std::max(q8_vs_f32, double(std::abs(o_q8[i] - o_f32[i])));
  }
  const double q8_tolerance = 1e-2;  // q8_0's rounding, for inputs and outputs of order 1
  std::printf(
      "q8_0 cache: %ld bytes against %ld for f32; last token: max |q8_0 - reference of "
      "the stored values| = %.2g, max |q8_0 - f32 cache| = %.2g (tolerance %.0e)\n",
      long(2 * kTotal * kKvHeads * kDim / 32 * Index(sizeof(ak::BlockQ8_0))),
      long(2 * kTotal * kKvHeads * kDim * Index(sizeof(float))), q8_vs_ref, q8_vs_f32,
      q8_tolerance);
  worst = std::max(worst, q8_vs_ref);

  // Products::Int8: the query quantized to int8 per block too, Q.K as integer dot products on
  // the cached blocks (ggml's convention); the softmax and P.V stay f32. Each logit moves by at
  // most max|q_b| / 254 * sum|k_b| per block: well inside q8_0's own tolerance here.
  std::vector<float> o_int8(q_last.size());
  ak::decode(served, q_in, q8_cache.keys(), q8_cache.values(),
             ak::bshd(o_int8.data(), 1, 1, kHeads, kDim),
             ak::Options{}.with_products(ak::Products::Int8));
  double int8_vs_q8 = 0;
  for (std::size_t i = 0; i < o_q8.size(); ++i)
    int8_vs_q8 = std::max(int8_vs_q8, double(std::abs(o_int8[i] - o_q8[i])));
  std::printf("q8_0 cache, int8 products: max |int8 - exact products| = %.2g (tolerance %.0e)\n",
              int8_vs_q8, q8_tolerance);

  // The cache is full now: one more token is an Error, and nothing is written.
  bool refused = false;
  try {
    cache.append(tokens(K, 0, 1), tokens(V, 0, 1), rope);
  } catch (const ak::Error& e) {
    refused = cache.length() == kTotal;
    std::printf("append beyond capacity: %s\n", e.what());
  }

  std::printf("worst difference %.2g (tolerance %.0e)\n", worst, tolerance);
  const bool pass =
      worst <= tolerance && q8_vs_f32 <= q8_tolerance && int8_vs_q8 <= q8_tolerance && refused;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
