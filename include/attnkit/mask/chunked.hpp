// Chunked{size}: the sequence is cut into chunks of `size` positions and query i sees the
// keys of its own chunk, floor(i / size) == floor(j / size) (floor also for negative
// positions). `Causal{} & Chunked{c}` is causal inside each chunk (Llama 4's local layers).
#pragma once

#include <cstdint>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

struct Chunked {
  using slot = MaskSlot;

  Index size = 1;

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const { return detail::TagHash::of<Chunked>().add(size).value(); }

  /// Throws Error unless 1 <= size <= 2^60 (so chunk ends never overflow).
  explicit Chunked(Index chunk_size) : size(chunk_size) {
    detail::require(chunk_size >= 1 && chunk_size <= (Index{1} << 60), "Chunked.size", "1 to 2^60",
                    chunk_size);
  }

  /// First position of the chunk holding position p.
  Index chunk_begin(Index p) const {
    const Index c = p / size;  // rounds toward zero: step down for negative p
    return (p % size != 0 && p < 0 ? c - 1 : c) * size;
  }

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return chunk_begin(i) == chunk_begin(j);
  }

  /// The keys query i sees: its chunk.
  KeyRanges<1> runs(Index /*b*/, Index /*h*/, Index i) const {
    const Index c = chunk_begin(i);
    return key_range(c, c + size);
  }

  /// Keys any query of q may see: the chunks that q's positions fall in.
  KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, Range q) const {
    return key_range(chunk_begin(q.begin), chunk_begin(q.last()) + size);
  }

  TileKind classify(Index /*b*/, Index /*h*/, Range q, Range kv) const {
    const Index first = chunk_begin(q.begin), last = chunk_begin(q.last());
    if (kv.last() < first || kv.begin >= last + size) return TileKind::Empty;
    const bool one_chunk =
        first == last && chunk_begin(kv.begin) == first && chunk_begin(kv.last()) == first;
    return one_chunk ? TileKind::Full : TileKind::Partial;
  }
};

}  // namespace attnkit
