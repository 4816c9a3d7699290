// Standalone use of a row-transforming Position policy (Rope, Fope): rotate a view in place,
// the way a model applies RoPE before writing keys to its cache; and the f32 copy of K the
// kernel reads when the policy is fused into attention(). Both go through the policy's
// apply(), so fused and standalone-then-attention compute the same rows.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/storage/f32_rows.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit {

/// Transforms every row of x in place: row s of head h in batch b sits at position
/// s + offset (queries: offset = q_offset; keys: 0), or at the policy's position ids. `role`
/// says which ids and heads apply (queries: query heads; keys: KV heads). Rows are converted
/// to f32, transformed and stored back in x's type. Throws Error (before writing) when the
/// policy refuses the shape, as attention() would.
template <class Policy, class T>
void apply_position(const Policy& policy, const View<T>& x, Role role, Index offset = 0) {
  static_assert(!std::is_const_v<T>, "apply_position(): the view must be writable");
  static_assert(detail::transforms_rows<Policy>(), "apply_position(): the policy has no apply()");
  static_assert(!detail::is_block_quantized<T>(),
                "apply_position(): quantized rows would be rounded twice; turn the f32 rows "
                "before they are quantized (KvCache::append(k, v, rope) does)");
  detail::check_view(x, "x");
  detail::check_rows_distinct(x, "x");
  if constexpr (detail::has_validate_role<Policy>::value) {
    policy.validate_role(role, x.batch, x.seq, offset, x.heads);
  } else if constexpr (detail::has_validate<Policy>::value) {
    detail::require(role == Role::Query || offset == 0, "apply_position(): offset",
                    "0 for keys (this policy checks key positions from 0 only)", offset);
    if (role == Role::Query)
      policy.validate(x.seq, 0, offset, x.batch, x.heads);
    else
      policy.validate(0, x.seq, 0, x.batch, x.heads);
  }
  detail::validate_head_dim_of(policy, x.dim);
  std::vector<float> row(static_cast<std::size_t>(x.dim));
  for (Index b = 0; b < x.batch; ++b)
    for (Index h = 0; h < x.heads; ++h)
      for (Index s = 0; s < x.seq; ++s) {
        T* src = x.row(b, h, s);
        for (Index c = 0; c < x.dim; ++c)
          row[static_cast<std::size_t>(c)] = static_cast<float>(src[c]);
        policy.apply(row.data(), x.dim, RowAt{b, h, s, x.seq, s + offset, role});
        for (Index c = 0; c < x.dim; ++c) src[c] = static_cast<T>(row[static_cast<std::size_t>(c)]);
      }
}

namespace detail {

/// The keys of a call transformed once, in f32, BHSD-contiguous [B, Hkv, Lk, D]: what the
/// kernel reads in place instead of k. Rows are shared out over `threads`, 64 at a time (a
/// row is a short transform).
template <class Policy, class T>
std::vector<float> transformed_keys(const Policy& policy, const View<T>& k, int threads) {
  return contiguous_rows(k, threads, [&](float* row, Index b, Index h, Index s) {
    policy.apply(row, k.dim, RowAt{b, h, s, k.seq, s, Role::Key});
  });
}

}  // namespace detail
}  // namespace attnkit
