// What this shows: MoBA (Lu et al. 2025, Moonshot), attention routed to key blocks. Keys are
// cut into blocks of B positions; each query scores every past block by q . mean(K_block)
// and attends, causally, to its own block plus the best k - 1 of them -- the choice is per
// query token and per head, so neighbouring queries read different keys.
// route_topk_blocks() makes the routes, moba_attention() runs them: the own blocks in one
// call, then per key block the queries that chose it, gathered, merged by their LSE.
//
// We print the blocks a few queries chose, plant a "needle" (a few keys aligned with one
// query, in an old block) and check that the router finds it, and compare the output with
// the f64 reference under a dense causal mask restricted to each query's chosen blocks.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

namespace {

const Index kLen = 2048, kHeads = 2, kDim = 64, kBlock = 128, kTopK = 3;

// keep(i, j): j <= i and key j's block is among the blocks query i chose -- the definition
// of MoBA, one query at a time (the reference calls it for every pair).
struct ChosenBlocks {
  using slot = ak::MaskSlot;
  const ak::BlockRoutes* routes;
  bool keep(Index b, Index h, Index i, Index j) const {
    const auto list = routes->chosen(b, h, i - routes->q_offset);
    return j <= i && std::find(list.begin(), list.end(), j / routes->block) != list.end();
  }
};

void print_choice(const ak::BlockRoutes& routes, Index head, Index row) {
  std::printf("  head %ld, query %4ld (own block %2ld):", long(head), long(row),
              long(routes.own_block(row)));
  for (const Index c : routes.chosen(0, head, row)) std::printf(" %2ld", long(c));
  std::printf("\n");
}

}  // namespace

int main() {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal;
  std::vector<float> q(kLen * kHeads * kDim), k(q.size()), v(q.size()), o(q.size());
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);
  const auto Q = ak::bhsd(q.data(), 1, kHeads, kLen, kDim);
  const auto K = ak::bhsd(k.data(), 1, kHeads, kLen, kDim);
  const auto V = ak::bhsd(v.data(), 1, kHeads, kLen, kDim);
  const auto O = ak::bhsd(o.data(), 1, kHeads, kLen, kDim);

  // The needle: 4 keys of block 2 (positions 300..303) along query 2000 of head 0. They lift
  // that block's mean toward the query (score ~ 4 * 3 / 128 |q|^2 ~ 6 against ~N(0, 0.7)).
  const Index needle_query = 2000, needle_block = 300 / kBlock;
  for (Index j = 300; j < 304; ++j)
    for (Index c = 0; c < kDim; ++c) K.row(0, 0, j)[c] = 3.f * Q.row(0, 0, needle_query)[c];

  const ak::BlockRoutes routes = ak::route_topk_blocks(Q, K, kBlock, kTopK);
  std::printf("MoBA: L = %ld, B = %ld, top-k = %ld (own block included), %ld blocks\n", long(kLen),
              long(kBlock), long(kTopK), long(routes.num_blocks()));
  std::printf("blocks chosen:\n");
  for (const Index row : {Index{100}, Index{700}, Index{701}, Index{1500}, Index{needle_query}})
    for (Index h = 0; h < kHeads; ++h) print_choice(routes, h, row);

  const auto needle = routes.chosen(0, 0, needle_query);
  const bool found = std::find(needle.begin(), needle.end(), needle_block) != needle.end();
  std::printf("needle in block %ld: %s by query %ld\n", long(needle_block),
              found ? "chosen" : "MISSED", long(needle_query));

  // The fraction of causal (query, key) pairs MoBA computes.
  double kept = 0;
  for (Index h = 0; h < kHeads; ++h)
    for (Index i = 0; i < kLen; ++i)
      for (const Index c : routes.chosen(0, h, i))
        kept += double(std::min(kBlock, i + 1 - c * kBlock));
  std::printf("pairs computed: %.1f%% of dense causal\n",
              100.0 * kept / (double(kHeads) * kLen * (kLen + 1) / 2));

  ak::moba_attention(ak::make_spec(), Q, K, V, O, routes, kBlock);
  std::vector<double> expected(q.size());
  const auto reference_out = ak::bhsd(expected.data(), 1, kHeads, kLen, kDim);
  ak::reference::attention(ak::make_spec(ChosenBlocks{&routes}), Q, K, V, reference_out);
  double worst = 0;
  for (std::size_t x = 0; x < o.size(); ++x)
    worst = std::max(worst, std::abs(double(o[x]) - expected[x]));

  // The needle query's softmax mass sits on the needle, so MoBA matches dense causal there.
  std::vector<float> dense(q.size());
  ak::attention(ak::make_spec(ak::Causal{}), Q, K, V,
                ak::bhsd(dense.data(), 1, kHeads, kLen, kDim));
  double needle_gap = 0;
  for (Index c = 0; c < kDim; ++c)
    needle_gap =
        std::max(needle_gap, double(std::abs(O.row(0, 0, needle_query)[c] -
                                             dense[std::size_t(needle_query * kDim + c)])));
  const double tolerance = 2e-5;  // f32 kernel vs f64 reference, outputs of order 1
  std::printf("max |o - reference on the chosen blocks| = %.2g (tolerance %.0e)\n", worst,
              tolerance);
  std::printf("needle query: max |o_moba - o_dense_causal| = %.2g\n", needle_gap);

  const bool pass = found && worst <= tolerance && needle_gap <= 1e-3;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
