// The keys a kernel reads: k as it is, or a contiguous f32 copy of it where the tiles gain
// from one (detail::tile_rows, kernel/tiles/pack.hpp), or -- with a Position that turns rows (Rope,
// Fope) -- every key row turned once per call into an f32 copy [B, Hkv, Lk, D]. One step for
// attention() (kernel/attention.hpp) and attention_backward() (kernel/attention_backward.hpp).
#pragma once

#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/kernel/tiles/pack.hpp"
#include "attnkit/position/apply.hpp"
#include "attnkit/problem.hpp"

namespace attnkit::detail {

/// run(keys): keys the view the kernel reads for k (above); `split`: the call runs split-KV
/// (which reads k in place).
template <class Spec, class K, class Run>
void with_kernel_keys(const Spec& spec, const Problem& p, const View<K>& k, bool split, Run&& run) {
  if constexpr (transforms_rows<typename Spec::Position>()) {
    const std::vector<float> keys = transformed_keys(spec.position, k, thread_count(p.threads));
    run(bhsd(keys.data(), p.batch, p.kv_heads, p.kv_len, p.head_dim));
  } else {
    std::vector<float> k_copy;
    run(tile_rows(k, p, split, k_copy));
  }
}

}  // namespace attnkit::detail
