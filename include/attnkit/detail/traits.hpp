// Detection of the hooks any policy may have, whatever its slot: validate() and
// validate_head_dim() check a policy's own data against the call. The hooks of one slot are
// in that slot's faces header (score/faces.hpp, mask/faces.hpp, normalizer/faces.hpp,
// position/faces.hpp). The kernels ask these traits with `if constexpr`, so a policy only
// writes the hooks it needs.
#pragma once

#include <type_traits>

#include "attnkit/core/tensor.hpp"

namespace attnkit::detail {

// Any policy: validate(q_len, kv_len, q_offset, batch, q_heads) throws Error when the
// policy's own data does not fit the call (a BlockMask built for other sizes).
template <class P, class = void>
struct has_validate : std::false_type {};
template <class P>
struct has_validate<P, std::void_t<decltype(std::declval<const P&>().validate(
                           Index{}, Index{}, Index{}, Index{}, Index{}))>> : std::true_type {};

template <class P, class = void>
struct has_validate_head_dim : std::false_type {};
template <class P>
struct has_validate_head_dim<
    P, std::void_t<decltype(std::declval<const P&>().validate_head_dim(Index{}))>>
    : std::true_type {};

/// Calls p.validate_head_dim(head_dim) when the policy has that face.
template <class P>
void validate_head_dim_of(const P& p, Index head_dim) {
  if constexpr (has_validate_head_dim<P>::value) p.validate_head_dim(head_dim);
}

}  // namespace attnkit::detail
