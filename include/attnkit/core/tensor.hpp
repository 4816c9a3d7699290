// View<T>: a non-owning 4-D strided view [batch, heads, seq, dim] over caller memory.
// Strides are in elements (for quantized blocks, storage/blocks.hpp: in blocks, with dim still
// counting values); the last dimension is contiguous. bhsd() and bshd() build the
// two common layouts; any other layout is described by strides, never by a copy.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/index.hpp"

namespace attnkit {

template <class T>
struct View {
  using value_type = std::remove_const_t<T>;

  T* data = nullptr;
  Index batch = 0, heads = 0, seq = 0, dim = 0;
  Index batch_stride = 0, head_stride = 0, seq_stride = 0;  // in elements

  /// Pointer to the contiguous row [dim] at (b, h, s).
  T* row(Index b, Index h, Index s) const {
    return data + b * batch_stride + h * head_stride + s * seq_stride;
  }

  /// A const view of the same memory.
  operator View<const value_type>() const {  // NOLINT(google-explicit-constructor)
    return {data, batch, heads, seq, dim, batch_stride, head_stride, seq_stride};
  }
};

/// General strided view: sizes {B, H, S, D}, strides {batch, head, seq} in elements.
template <class T>
View<T> strided(T* data, std::array<Index, 4> sizes, std::array<Index, 3> strides) {
  return {data, sizes[0], sizes[1], sizes[2], sizes[3], strides[0], strides[1], strides[2]};
}

namespace detail {

// Values one storage element holds: a block format says so itself with a static member
// kBlockValues (storage/blocks.hpp); every other element holds 1.
template <class T, class = void>
struct ElementValues : std::integral_constant<std::ptrdiff_t, 1> {};
template <class T>
struct ElementValues<T, std::void_t<decltype(T::kBlockValues)>>
    : std::integral_constant<std::ptrdiff_t, T::kBlockValues> {};

/// Values one storage element holds: a block's count, 1 otherwise.
template <class T>
constexpr std::ptrdiff_t values_per_element() {
  return ElementValues<std::remove_const_t<T>>::value;
}

/// True for the block types (const or not).
template <class T>
constexpr bool is_block_quantized() {
  return values_per_element<T>() > 1;
}

/// Storage elements of a row of `dim` values (dim a multiple of a block's count for blocks).
template <class T>
constexpr std::ptrdiff_t row_elements(std::ptrdiff_t dim) {
  return dim / values_per_element<T>();
}

// The stride of a dense layout: the product of the inner sizes. A product that overflows
// Index would wrap to a wrong (even zero) stride, so it is an Error instead.
inline Index dense_stride(const char* factory, const char* product,
                          std::initializer_list<Index> inner) {
  Index stride = 0;
  if (!checked_product(inner, &stride))
    fail(std::string(factory) + ": " + product, "a product that fits in Index (int64)",
         "an overflow");
  return stride;
}

// Storage elements of one row of D values: D, or D / 32 blocks for quantized storage (an
// Error unless D is a multiple of 32).
template <class T>
Index row_extent(const char* factory, Index D) {
  if constexpr (is_block_quantized<T>())
    require(D % values_per_element<T>() == 0, std::string(factory) + ": D",
            cat("a multiple of ", values_per_element<T>(), " (quantized blocks)"), D);
  return row_elements<T>(D);
}

}  // namespace detail

namespace detail {

// Dense memory [B, H, S, D] with the heads outside the sequence (bhsd) or inside it (bshd).
// Throws Error, naming `factory`, when a stride overflows Index.
template <class T>
View<T> dense(const char* factory, T* data, Index B, Index H, Index S, Index D, bool bhsd) {
  const Index E = row_extent<T>(factory, D);
  if (bhsd)
    return strided(
        data, {B, H, S, D},
        {dense_stride(factory, "H*S*D", {H, S, E}), dense_stride(factory, "S*D", {S, E}), E});
  return strided(
      data, {B, H, S, D},
      {dense_stride(factory, "S*H*D", {S, H, E}), E, dense_stride(factory, "H*D", {H, E})});
}

}  // namespace detail

/// Dense [batch, heads, seq, dim] memory. Throws Error when a stride overflows Index.
template <class T>
View<T> bhsd(T* data, Index B, Index H, Index S, Index D) {
  return detail::dense("bhsd", data, B, H, S, D, true);
}

/// Dense [batch, seq, heads, dim] memory (the layout of most model code). Throws Error when
/// a stride overflows Index.
template <class T>
View<T> bshd(T* data, Index B, Index S, Index H, Index D) {
  return detail::dense("bshd", data, B, H, S, D, false);
}

}  // namespace attnkit
