// The DeepSeek Sparse Attention tests' shapes and selections (tests/dsa/): a TopkShape of
// query heads over KV heads, and per query a key set as indexer_topk() would hand it to
// topk_attention(): up to topk distinct keys the query sees (causal, the default offset
// Lk - Lq), in a shuffled order with -1 gaps and every 7th row empty; with `all`, every key
// it sees in order; keys at or past `pool_end` (default: every key) never selected.
#pragma once

#include <algorithm>
#include <attnkit/core/tensor.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace attnkit::test {

struct TopkShape {
  Index B = 2, Hq = 8, Hkv = 2, Lq = 40, Lk = 60, D = 32, Dv = 24, topk = 24;
};

inline std::vector<std::int32_t> topk_selection(const TopkShape& s, bool all, std::uint32_t seed,
                                                Index pool_end = -1) {
  std::vector<std::int32_t> out(std::size_t(s.B * s.Lq * s.topk), -1);
  std::mt19937 rng(seed);
  const Index offset = s.Lk - s.Lq;
  for (Index b = 0; b < s.B; ++b)
    for (Index t = 0; t < s.Lq; ++t) {
      std::int32_t* row = out.data() + (b * s.Lq + t) * s.topk;
      const Index seen = std::min(s.Lk, t + offset + 1);
      const Index pool = pool_end < 0 || all ? seen : std::min(seen, pool_end);
      std::vector<std::int32_t> keys;
      for (Index j = 0; j < pool; ++j) keys.push_back(std::int32_t(j));
      if (all) {
        std::copy_n(keys.begin(), std::min(pool, s.topk), row);
        continue;
      }
      if (t % 7 == 3) continue;
      std::shuffle(keys.begin(), keys.end(), rng);
      for (Index i = 0; i < std::min(pool, s.topk); ++i)
        if ((i + t) % 5 != 0) row[i] = keys[std::size_t(i)];
    }
  return out;
}

}  // namespace attnkit::test
