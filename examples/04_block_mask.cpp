// What this shows: a BlockMask built from a rule of your own -- document packing, where
// several documents of different lengths share one sequence and a query sees only the keys
// of its own document, causally.
//
//   1. write the rule as a small mask struct: keep() decides one (query, key) pair, and the
//      optional classify() decides a whole tile at once (Empty, Full or Partial),
//   2. make_block_mask() turns it into block lists (BCSR): to_string() draws them, and
//      sparsity() says which fraction of the blocks attention() will skip,
//   3. attention() visits only the listed blocks, and asks keep() only inside partial ones,
//   4. check against the double-precision reference, both with the element rule and with
//      the BlockMask,
//   5. token-level selection: single-key blocks a router picks per query block, given the
//      gathered-columns face by block_columns<N>(), checked the same way; print PASS.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;

// 1. Documents packed back to back: document d holds positions [starts[d], starts[d + 1]).
struct DocumentCausal {
  using slot = ak::MaskSlot;  // this policy fills the Mask slot of a spec
  std::vector<Index> starts;  // [documents + 1]; starts.back() is the sequence length

  Index document(Index p) const {
    return (std::upper_bound(starts.begin(), starts.end(), p) - starts.begin()) - 1;
  }

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return j <= i && document(j) == document(i);
  }

  // Only a speed-up for make_block_mask(): it counts the pairs of every block this calls
  // Partial, so a conservative answer stays exact.
  ak::TileKind classify(Index /*b*/, Index /*h*/, ak::Range q, ak::Range kv) const {
    const Index first = document(q.begin), last = document(q.last());
    if (kv.begin > q.last() || kv.last() < starts[first]) return ak::TileKind::Empty;
    if (first == last && kv.begin >= starts[first] && kv.last() <= q.begin)
      return ak::TileKind::Full;  // every key in the queries' document, at or before each
    return ak::TileKind::Partial;
  }
};

// 5. Each block of 16 queries keeps the keys of its document that a router picked for it
//    (here a hash picks about one in ten) and its own block's keys, causally.
struct Picked {
  using slot = ak::MaskSlot;
  DocumentCausal docs;
  bool keep(Index b, Index h, Index i, Index j) const {
    return docs.keep(b, h, i, j) && (j / 16 == i / 16 || (j * 37 + (i / 16) * 11) % 10 == 0);
  }
};

int main() {
  // Five documents in one sequence of 1024 tokens; 8 query heads share 2 KV heads.
  const std::vector<Index> lengths = {300, 120, 64, 400, 140};
  DocumentCausal docs{{0}};
  for (Index n : lengths) docs.starts.push_back(docs.starts.back() + n);
  const Index len = docs.starts.back(), q_heads = 8, kv_heads = 2, dim = 64;

  std::vector<float> q(len * q_heads * dim), k(len * kv_heads * dim), v(len * kv_heads * dim);
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal;
  for (auto* buffer : {&q, &k, &v})
    for (float& x : *buffer) x = normal(rng);
  const auto Q = ak::bshd(q.data(), 1, len, q_heads, dim);
  const auto K = ak::bshd(k.data(), 1, len, kv_heads, dim);
  const auto V = ak::bshd(v.data(), 1, len, kv_heads, dim);

  // 2. Blocks of 64 queries x 64 keys: '#' full (keep() never asked), '+' partial (keep()
  //    decides each pair), '.' skipped. The documents show as triangles on the diagonal.
  //    The layout must match the call: here one batch, shared by every head, q_offset 0.
  const auto block_mask = ak::make_block_mask(docs, len, len, 64, 64);
  std::printf("%s", block_mask.to_string().c_str());
  std::printf("sparsity %.3f: %.1f%% of the 64 x 64 blocks are never visited\n",
              block_mask.sparsity(), 100.0 * block_mask.sparsity());

  // 3. The BlockMask is a mask policy like any other.
  std::vector<float> o(len * q_heads * dim), lse(q_heads * len);
  const auto O = ak::bshd(o.data(), 1, len, q_heads, dim);
  ak::attention(ak::make_spec(block_mask), Q, K, V, O, ak::Options{}.with_lse(lse));

  // 4. The reference, in double, with the element rule alone and with the BlockMask.
  std::vector<double> by_rule(o.size()), by_blocks(o.size());
  std::vector<float> lse_rule(lse.size()), lse_blocks(lse.size());
  ak::reference::attention(ak::make_spec(docs), Q, K, V,
                           ak::bshd(by_rule.data(), 1, len, q_heads, dim),
                           ak::Options{}.with_lse(lse_rule));
  ak::reference::attention(ak::make_spec(block_mask), Q, K, V,
                           ak::bshd(by_blocks.data(), 1, len, q_heads, dim),
                           ak::Options{}.with_lse(lse_blocks));

  // Largest |a - b|; a NaN anywhere makes it NaN, which fails the check below.
  const auto worst = [](const auto& a, const auto& b) {
    double w = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double d = std::abs(double(a[i]) - double(b[i]));
      w = std::isnan(d) || d > w ? d : w;
    }
    return w;
  };
  const double worst_o = worst(o, by_rule), worst_lse = worst(lse, lse_rule);
  // The BlockMask keeps exactly the pairs the rule keeps: the two references agree bit for bit.
  const bool same = worst(by_rule, by_blocks) == 0.0 && worst(lse_rule, lse_blocks) == 0.0;

  const double tolerance = 2e-5;  // f32 accumulation against the f64 reference
  std::printf("max |o - reference| = %.3g, max |lse - reference| = %.3g (tolerance %.0e)\n",
              worst_o, worst_lse, tolerance);
  std::printf("reference with the rule == reference with the BlockMask: %s\n", same ? "yes" : "no");

  // 5. Blocks of 16 queries x 1 key: scattered, so a 64-key tile over them would be masked
  //    pair by pair. block_columns<64>() makes every kept key a column (at most 64 a query
  //    block: the constructor checks); the 16 queries of a tile share theirs, so attention()
  //    gathers their K and V rows into one dense key tile.
  const Picked picked{docs};
  const auto picked_keys = ak::block_columns<64>(ak::make_block_mask(picked, len, len, 16, 1));
  ak::attention(ak::make_spec(picked_keys), Q, K, V, O);
  ak::reference::attention(ak::make_spec(picked), Q, K, V,
                           ak::bshd(by_rule.data(), 1, len, q_heads, dim));
  const double worst_picked = worst(o, by_rule);
  std::printf("picked keys (%.1f%% of the 16 x 1 blocks listed): max |o - reference| = %.3g\n",
              100.0 * (1.0 - picked_keys.blocks().sparsity()), worst_picked);

  const bool pass =
      worst_o <= tolerance && worst_lse <= tolerance && same && worst_picked <= tolerance;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
