// What this shows: stripe sparsity (AnchorAttention, 2025) finding a few "needle" keys in
// a long context. Queries are cut into big blocks of 2048 (block 128 x step 16). Each query
// always sees the initial tokens and its big block's own causal region; of the keys in
// between (the middle) only the columns chosen for the whole big block are attended: those
// where some pooled query (mean of 128) scores within theta = 12 of the pooled anchor, the
// anchor being each query's largest logit over the initial and local keys.
//
// The input: every query leans on one direction u; key 0 (a sink) and five planted needles
// lie along u, every other key is noise. We print which middle columns each big block kept,
// the recall (softmax mass of the kept columns) with and without the stripes, and check
// that every needle visible to a block was kept and that the output equals the f64
// reference under the selection's mask (on the last 1024 queries: the reference is slow).
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kLen = 4096 + 300, kDim = 64;  // three big blocks, the last one short
const Index kNeedles[] = {300, 1000, 1700, 2500, 3500};

// The selection as a Mask, for the reference: its own element rule.
struct SelectionMask {
  using slot = ak::MaskSlot;
  const ak::StripeSelection* selection;
  bool keep(Index b, Index h, Index i, Index j) const { return selection->keep(b, h, i, j); }
};

}  // namespace

int main() {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> u(kDim);
  for (float& x : u) x = normal(rng);
  float norm = 0;
  for (const float x : u) norm += x * x;
  for (float& x : u) x /= std::sqrt(norm);

  // scale = 1/8: a query (16 u + noise) gives the sink 20, a needle 16, a noise key ~N(0, 4).
  std::vector<float> q(kLen * kDim), k(kLen * kDim), v(kLen * kDim), o(kLen * kDim);
  for (Index i = 0; i < kLen; ++i)
    for (Index c = 0; c < kDim; ++c) {
      q[std::size_t(i * kDim + c)] = 16.f * u[std::size_t(c)] + normal(rng);
      k[std::size_t(i * kDim + c)] = normal(rng);
      v[std::size_t(i * kDim + c)] = normal(rng);
    }
  const auto plant = [&](Index j, float length) {
    for (Index c = 0; c < kDim; ++c) k[std::size_t(j * kDim + c)] = length * u[std::size_t(c)];
  };
  plant(0, 10.f);
  for (const Index j : kNeedles) plant(j, 8.f);

  const auto Q = ak::bhsd(q.data(), 1, 1, kLen, kDim);
  const auto K = ak::bhsd(k.data(), 1, 1, kLen, kDim);
  const auto V = ak::bhsd(v.data(), 1, 1, kLen, kDim);
  const auto O = ak::bhsd(o.data(), 1, 1, kLen, kDim);
  const ak::View<const float> q_in = Q, k_in = K, v_in = V;

  const ak::StripeSelection selection = ak::anchor_stripes(q_in, k_in);  // paper defaults
  std::printf("%s", selection.to_string(0, 0).c_str());
  std::printf("kept %.4f%% of the middle columns\n", 100.0 * selection.kept_fraction());

  bool found = true;
  for (Index g = 0; g < selection.big_blocks(); ++g) {
    const ak::Range middle = selection.middle(g);
    for (const Index j : kNeedles)
      if (j >= middle.begin && j < middle.end)
        found = found &&
                std::binary_search(selection.kept_begin(0, 0, g), selection.kept_end(0, 0, g), j);
  }

  // The recall, and what it would be with the stripes dropped (init and local only).
  ak::StripeSelection no_stripes = selection;
  no_stripes.columns.clear();
  std::fill(no_stripes.offsets.begin(), no_stripes.offsets.end(), 0);
  const ak::StripeRecall recall = ak::stripe_recall(q_in, k_in, selection);
  const ak::StripeRecall without = ak::stripe_recall(q_in, k_in, no_stripes);
  std::printf("recall: mean %.6f, min %.6f (init + local only: mean %.6f, min %.6f)\n", recall.mean,
              recall.min, without.mean, without.min);

  // The fast path against the f64 reference under the same selection, on the last 1024
  // queries (the short last big block and the end of the one before), at their positions.
  ak::stripe_attention(ak::make_spec(), q_in, k_in, v_in, O, selection);
  const Index first = kLen - 1024;
  std::vector<double> expected(std::size_t{1024} * kDim);
  const auto masked = ak::AttentionSpec<ak::Dot, SelectionMask>{{}, {&selection}, {}, {}};
  ak::reference::attention(masked, ak::bhsd(q.data() + first * kDim, 1, 1, 1024, kDim), k_in, v_in,
                           ak::bhsd(expected.data(), 1, 1, 1024, kDim),
                           ak::Options{}.with_q_offset(first));
  double worst = 0;
  for (std::size_t x = 0; x < expected.size(); ++x)
    worst = std::max(worst, std::abs(o[std::size_t(first * kDim) + x] - expected[x]));
  std::printf("needles found: %s; max |o - reference| = %.2g\n", found ? "all" : "NOT all", worst);

  const bool pass = found && worst < 5e-5 && recall.min > without.min;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
