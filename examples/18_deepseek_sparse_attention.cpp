// What this shows: DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) through attnkit's dsa/.
//
// A small "lightning indexer" scores every earlier token for each query,
//   I(t, s) = sum_j w(t, j) ReLU(q_I(t, j) . k_I(s))      (a few cheap heads of its own)
// and each query then attends, with every head of the layer, only to its top-k tokens. In
// DeepSeek the attention runs in MLA's MQA form: all heads share one latent key/value row per
// token, so one gathered set of k rows serves every head. The attention work is then
// proportional to L x k instead of L^2 / 2; the indexer still sees every pair, but with few,
// small heads.
//
// Part 1 (prefill): indexer_topk() picks each query's keys, topk_attention() attends to them;
// both are checked against their f64 references; the indexer again with int8 products. Part 2
// (decode): each new token is appended to the caches, the indexer picks its keys among all earlier
// ones, and topk_attention() attends to them; every step is checked. Part 3 (training):
// topk_attention_backward() against the f64 backward. (The indexer itself is trained by DeepSeek
// with a loss of its own: the KL divergence of softmax(I(t, .)) over the selected keys from the
// main attention's distribution there, summed over heads; its gradient in I is softmax(I) - target,
// which the user's framework takes through q_I, w and k_I. docs/mechanisms.md says more.)
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

constexpr Index kHeads = 8, kLatent = 64, kValue = 48;  // MQA: 8 heads over one latent
constexpr Index kIndexHeads = 4, kIndexDim = 32, kTopk = 32;
constexpr Index kPrompt = 200, kSteps = 8, kMax = kPrompt + kSteps;

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& y : x) y = d(rng);
  return x;
}

// The whole sequence's inputs; a prefix of them is "the cache" at any step. Layout [L, H, D].
struct Layer {
  std::vector<float> q = normal(std::size_t(kMax * kHeads * kLatent), 1);
  std::vector<float> latent = normal(std::size_t(kMax * kLatent), 2);  // K; V = its first 48
  std::vector<float> qi = normal(std::size_t(kMax * kIndexHeads * kIndexDim), 3);
  std::vector<float> w = normal(std::size_t(kMax * kIndexHeads), 4);
  std::vector<float> ki = normal(std::size_t(kMax * kIndexDim), 5);

  // Rows [t0, t0 + n) of the queries; keys and values [0, len).
  ak::View<const float> queries(Index t0, Index n) const {
    return ak::bshd(q.data() + t0 * kHeads * kLatent, 1, n, kHeads, kLatent);
  }
  ak::View<const float> keys(Index len) const {
    return ak::bshd(latent.data(), 1, len, 1, kLatent);
  }
  ak::View<const float> values(Index len) const {
    ak::View<const float> v = keys(len);
    v.dim = kValue;  // the latent's first 48 values of each row: MLA's values
    return v;
  }
  // The indexer's selection for queries [t0, t0 + n) over keys [0, len) into sel [n, topk].
  // products: Exact (f32), or Int8 (int8 rows with a scale each, exact integer sums: the
  // indexer's cheap mode, DeepSeek's FP8 counterpart; AVX-512 VNNI builds, 64+ queries).
  void select(Index t0, Index n, Index len, std::vector<std::int32_t>& sel,
              ak::Products products = ak::Products::Exact) const {
    sel.resize(std::size_t(n * kTopk));
    const ak::Options at =
        ak::Options{}.with_q_offset(t0).with_products(products);  // query r sits at t0 + r
    ak::indexer_topk(
        ak::IndexerSpec{kTopk, true},
        ak::View<const float>(
            ak::bshd(qi.data() + t0 * kIndexHeads * kIndexDim, 1, n, kIndexHeads, kIndexDim)),
        ak::View<const float>(ak::bshd(w.data() + t0 * kIndexHeads, 1, n, kIndexHeads, 1)),
        ak::View<const float>(ak::bshd(ki.data(), 1, len, 1, kIndexDim)),
        ak::bshd(sel.data(), 1, n, 1, kTopk), at);
  }
};

double worst(const std::vector<float>& got, const std::vector<double>& want) {
  double w = 0, scale = 1e-30;
  for (std::size_t i = 0; i < got.size(); ++i) {
    w = std::max(w, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return w / scale;
}

}  // namespace

int main() {
  const Layer layer;
  const auto spec = ak::make_spec();   // softmax over q . k; the selection is the mask
  constexpr double kTolerance = 1e-5;  // f32 against f64
  bool ok = true;

  // Part 1: prefill of the prompt.
  std::vector<std::int32_t> sel;
  layer.select(0, kPrompt, kPrompt, sel);
  {
    std::vector<std::int32_t> want;
    want.resize(sel.size());
    ak::reference::indexer_topk(
        ak::IndexerSpec{kTopk, true},
        ak::View<const float>(ak::bshd(layer.qi.data(), 1, kPrompt, kIndexHeads, kIndexDim)),
        ak::View<const float>(ak::bshd(layer.w.data(), 1, kPrompt, kIndexHeads, 1)),
        ak::View<const float>(ak::bshd(layer.ki.data(), 1, kPrompt, 1, kIndexDim)),
        ak::bshd(want.data(), 1, kPrompt, 1, kTopk));
    Index same = 0;
    for (std::size_t i = 0; i < sel.size(); ++i) same += sel[i] == want[i];
    std::printf("indexer: %ld of %ld selected keys as the f64 reference picks them\n", long(same),
                long(sel.size()));
    ok = ok && double(same) >= 0.99 * double(sel.size());  // f32 scores may swap a near-tie
    // The same selection from int8 products: rounding q_I and k_I to 8 bits moves scores by
    // about 1%, so keys near the k-th swap; most of the selection stays.
    std::vector<std::int32_t> int8;
    layer.select(0, kPrompt, kPrompt, int8, ak::Products::Int8);
    Index kept = 0, all = 0;  // keys in both (each row in increasing key order, -1 last)
    for (Index t = 0; t < kPrompt; ++t) {
      const auto a = sel.begin() + t * kTopk, b = int8.begin() + t * kTopk;
      for (Index i = 0; i < kTopk && a[i] >= 0; ++i, ++all)
        kept += std::binary_search(b, std::find(b, b + kTopk, -1), a[i]);
    }
    std::printf("indexer, int8 products%s: %ld of the f32 selection's %ld keys kept\n",
                ak::kIndexerInt8 ? "" : " (no AVX-512 VNNI here: f32 ran)", long(kept), long(all));
    ok = ok && double(kept) >= 0.95 * double(all);
  }
  const ak::TopkKeys keys{ak::bshd(sel.data(), 1, kPrompt, 1, kTopk)};
  std::vector<float> o(std::size_t(kPrompt * kHeads * kValue));
  std::vector<double> want(o.size());
  ak::topk_attention(spec, layer.queries(0, kPrompt), layer.keys(kPrompt), layer.values(kPrompt),
                     ak::bshd(o.data(), 1, kPrompt, kHeads, kValue), keys);
  ak::reference::topk_attention(spec, layer.queries(0, kPrompt), layer.keys(kPrompt),
                                layer.values(kPrompt),
                                ak::bshd(want.data(), 1, kPrompt, kHeads, kValue), keys);
  const double prefill_error = worst(o, want);
  Index pairs = 0;
  for (const std::int32_t s : sel) pairs += s >= 0;
  std::printf("prefill: %ld tokens, %ld of %ld causal pairs attended; error %.1e\n", long(kPrompt),
              long(pairs), long(kPrompt * (kPrompt + 1) / 2), prefill_error);
  ok = ok && prefill_error <= kTolerance;

  // Part 2: decode, one token at a time against everything before it.
  double decode_error = 0;
  for (Index t = kPrompt; t < kMax; ++t) {
    const Index len = t + 1;  // the cache holds the new token's row too
    std::vector<std::int32_t> picked;
    layer.select(t, 1, len, picked);
    const ak::TopkKeys one{ak::bshd(picked.data(), 1, 1, 1, kTopk)};
    std::vector<float> step(std::size_t(kHeads * kValue));
    std::vector<double> ref(step.size());
    ak::topk_attention(spec, layer.queries(t, 1), layer.keys(len), layer.values(len),
                       ak::bshd(step.data(), 1, 1, kHeads, kValue), one);
    ak::reference::topk_attention(spec, layer.queries(t, 1), layer.keys(len), layer.values(len),
                                  ak::bshd(ref.data(), 1, 1, kHeads, kValue), one);
    decode_error = std::max(decode_error, worst(step, ref));
  }
  std::printf("decode: %ld steps, each over %ld of up to %ld keys; error %.1e\n", long(kSteps),
              long(kTopk), long(kMax), decode_error);
  ok = ok && decode_error <= kTolerance;

  // Part 3: the sparse attention's gradients for training.
  std::vector<float> lse(std::size_t(kHeads * kPrompt));
  const auto with_lse = ak::Options{}.with_lse(lse.data(), Index(lse.size()));
  ak::topk_attention(spec, layer.queries(0, kPrompt), layer.keys(kPrompt), layer.values(kPrompt),
                     ak::bshd(o.data(), 1, kPrompt, kHeads, kValue), keys, with_lse);
  const std::vector<float> d_o = normal(o.size(), 9);
  std::vector<float> dq(std::size_t(kPrompt * kHeads * kLatent)),
      dk(std::size_t(kPrompt * kLatent)), dv(std::size_t(kPrompt * kValue));
  std::vector<double> rq(dq.size()), rk(dk.size()), rv(dv.size());
  const auto out = ak::View<const float>(ak::bshd(o.data(), 1, kPrompt, kHeads, kValue));
  const auto grad = ak::View<const float>(ak::bshd(d_o.data(), 1, kPrompt, kHeads, kValue));
  ak::topk_attention_backward(
      spec, layer.queries(0, kPrompt), layer.keys(kPrompt), layer.values(kPrompt), out, grad,
      ak::bshd(dq.data(), 1, kPrompt, kHeads, kLatent), ak::bshd(dk.data(), 1, kPrompt, 1, kLatent),
      ak::bshd(dv.data(), 1, kPrompt, 1, kValue), keys, with_lse);
  ak::reference::topk_attention_backward(
      spec, layer.queries(0, kPrompt), layer.keys(kPrompt), layer.values(kPrompt), out, grad,
      ak::bshd(rq.data(), 1, kPrompt, kHeads, kLatent), ak::bshd(rk.data(), 1, kPrompt, 1, kLatent),
      ak::bshd(rv.data(), 1, kPrompt, 1, kValue), keys, with_lse);
  const double grad_error = std::max({worst(dq, rq), worst(dk, rk), worst(dv, rv)});
  std::printf(
      "backward: dq, dk, dv (the latent's gradient comes as dk and dv; MLA sums them "
      "into the latent); error %.1e\n",
      grad_error);
  ok = ok && grad_error <= 5e-5;

  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
