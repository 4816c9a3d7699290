// RowAt: where a query or key row sits, handed to a Position policy that transforms rows
// (Rope, Fope). The faces such a policy has:
//   void apply(float* x, Index dim, const RowAt& at) const            -- the kernel's form
//   void reference_apply(double* x, Index dim, const RowAt& at) const -- the reference's
//   validate(q_len, kv_len, q_offset, batch, q_heads)                 -- positions in range
//   validate_role(Role, batch, len, offset, heads)  (optional)        -- the same, one role
//   validate_head_dim(Index head_dim)  (optional)                     -- d fits the table
//   validate_kv_heads(Index kv_heads)  (optional)                     -- K's head count
// The kernel applies it once per query row when the query tile is packed, and once per key
// row per call (into an f32 copy of K that every query tile then reads in place).
// A Position may instead own the logit product (TAPA: two half-width products and a term in
// the distance), with the faces
//   Index amplitude_dims(Index head_dim) const    -- the product splits the head dims there
//   void combine(float* s, const float* s2, Index keys, Index lanes, Index ld,
//                Index q_begin, Index k_begin, Index head_dim, float* work) const
//     -- s = logits of dims [0, a), s2 of dims [a, d), transposed tiles like every score
//        tile (s[key * ld + lane]); `work` holds lanes + keys floats
//   double reference_logit(const double* q, const double* k, Index head_dim, Index i,
//                          Index j) const
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/core/tensor.hpp"

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

template <class P, class = void>
struct has_validate_role : std::false_type {};
template <class P>
struct has_validate_role<P, std::void_t<decltype(std::declval<const P&>().validate_role(
                                Role::Query, Index{}, Index{}, Index{}, Index{}))>>
    : std::true_type {};

template <class P, class = void>
struct has_validate_kv_heads : std::false_type {};
template <class P>
struct has_validate_kv_heads<
    P, std::void_t<decltype(std::declval<const P&>().validate_kv_heads(Index{}))>>
    : std::true_type {};

/// Lets a Position policy with per-KV-head data (Fope) check the call's KV head count.
template <class P>
void validate_kv_heads_of(const P& policy, Index kv_heads) {
  if constexpr (has_validate_kv_heads<P>::value) policy.validate_kv_heads(kv_heads);
}

/// Whether a Position policy transforms q and k rows (RoPE, FoPE).
template <class P>
constexpr bool transforms_rows() {
  return has_row_transform<P>::value;
}

template <class P, class = void>
struct has_product : std::false_type {};
template <class P>
struct has_product<P, std::void_t<decltype(std::declval<const P&>().combine(
                          std::declval<float*>(), std::declval<const float*>(), Index{}, Index{},
                          Index{}, Index{}, Index{}, Index{}, std::declval<float*>()))>>
    : std::true_type {};

/// Whether a Position policy forms the logits itself (TAPA).
template <class P>
constexpr bool owns_product() {
  return has_product<P>::value;
}

template <class P, class = void>
struct has_apply_transpose : std::false_type {};
template <class P>
struct has_apply_transpose<P,
                           std::void_t<decltype(std::declval<const P&>().apply_transpose(
                                           std::declval<float*>(), Index{}, RowAt{})),
                                       decltype(std::declval<const P&>().reference_apply_transpose(
                                           std::declval<double*>(), Index{}, RowAt{}))>>
    : std::true_type {};

template <class P, class = void>
struct has_product_backward : std::false_type {};
template <class P>
struct has_product_backward<
    P,
    std::void_t<decltype(std::declval<const P&>().combine_backward(
                    std::declval<const float*>(), std::declval<const float*>(),
                    std::declval<float*>(), std::declval<float*>(), Index{}, Index{}, Index{},
                    Index{}, Index{}, Index{}, std::declval<float*>())),
                decltype(std::declval<const P&>().reference_logit_grad(
                    std::declval<const double*>(), std::declval<const double*>(), Index{}, Index{},
                    Index{}, double{}, std::declval<double*>(), std::declval<double*>()))>>
    : std::true_type {};

template <class P, class = void>
struct has_position_param_grad : std::false_type {};
template <class P>
struct has_position_param_grad<
    P, std::void_t<decltype(std::declval<const P&>().param_count()),
                   decltype(std::declval<const P&>().accumulate_param_grad(
                       std::declval<const float*>(), std::declval<const float*>(), RowAt{},
                       std::declval<double*>()))>> : std::true_type {};

/// The Position's trained parameters (0 for a Position without any).
template <class P>
Index position_param_count(const P& position) {
  if constexpr (has_position_param_grad<P>::value)
    return position.param_count();
  else
    return 0;
}

}  // namespace detail
}  // namespace attnkit
