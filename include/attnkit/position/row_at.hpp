// RowAt: where a query or key row sits, handed to a Position policy that transforms rows
// (Rope, Fope). The faces such a policy has:
//   void apply(float* x, Index dim, const RowAt& at) const            -- the kernel's form
//   void reference_apply(double* x, Index dim, const RowAt& at) const -- the reference's
//   validate(q_len, kv_len, q_offset, batch, q_heads)                 -- positions in range
// The kernel applies it once per query row when the query tile is packed, and once per key
// row per call (into an f32 copy of K that every query tile then reads in place).
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/tensor.hpp"

namespace attnkit {

enum class Role { Query, Key };

struct RowAt {
  Index batch = 0;
  Index head = 0;      // the query head for a query, the KV head for a key
  Index row = 0;       // row in its view: query row r or key j
  Index len = 0;       // rows of its view: Lq or Lk
  Index position = 0;  // absolute position: r + q_offset for a query, j for a key
  Role role = Role::Query;
};

namespace detail {

template <class P, class = void>
struct has_row_transform : std::false_type {};
template <class P>
struct has_row_transform<P, std::void_t<decltype(std::declval<const P&>().apply(
                                std::declval<float*>(), Index{}, RowAt{}))>> : std::true_type {};

/// Whether a Position policy transforms q and k rows (RoPE, FoPE).
template <class P>
constexpr bool transforms_rows() {
  return has_row_transform<P>::value;
}

}  // namespace detail
}  // namespace attnkit
