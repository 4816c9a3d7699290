// Software prefetch of rows into the cache, for reads the hardware prefetchers do not
// foresee: split-KV decode's K and V rows a few blocks ahead (kernel/decode/decode_rows.hpp,
// cache/paged_decode.hpp), and the gathered columns' K and V rows, a few scattered rows per
// query (PowerOfTwo's i - 2^k), asked for a few queries ahead (kernel/tiles/tile_columns.hpp).
//
// Decode's prefetch is chosen per CPU at run time, not fixed at build time: it helps one
// microarchitecture and hurts another. Measured on decode, Lk 32K, H 32, d 128, one thread,
// in one process alternating the two choices call by call (docs/ledger.md has the rows):
//  - Intel Xeon (Sapphire Rapids class, AVX-512): 3 blocks (48 keys) ahead was a gain, GQA
//    (Hkv 8) f32 30-35 -> 24-29 ms, bf16 18-23 -> 16 ms, q8_0 17.5-18.7 -> 14 ms, MHA even;
//  - AMD Zen 4: the same prefetch made decode 1.6-1.9x slower (f16 MHA 20.0 -> 37.9 ms, bf16
//    19.5 -> 36.9, f16 GQA 10.4 -> 18.0; 1.3-1.7x on two threads): Zen's hardware prefetchers
//    already stream the rows, and the extra requests compete with them.
//  - on the same Xeon, f32 MHA d 128 (512-byte K rows, one query row per K row: the stream
//    alone, at 0.97-1.0 of the in-run streaming read without the prefetch) lost 6-14% with it
//    in five of six runs, while f16 / bf16 / q8_0 MHA (rows of 256 bytes and less) gained 2-7%
//    and f16 GQA 32/8 6-18% (docs/ledger.md).
// The rows are asked for one at a time, each as the row kDecodePrefetchAhead keys before it is
// computed
// (RowsAhead below): asked for as one burst at each block's start, the same prefetch filled the
// core's fill buffers and stalled it there (alternated on the Xeon, burst -> spread: q8_0 MHA
// 31.6 -> 25.6 ms, with Products::Int8 31.5 -> 24.1, q8_0 GQA 11.9 -> 10.2, q4_0 MHA 24.3 ->
// 21.3, bf16 MHA 46.0 -> 43.8; f16 and f32 within noise).
// So Auto prefetches on Intel CPUs, except for MHA over f32 K rows wider than 256 bytes;
// elsewhere (AMD, Arm, unknown) decode runs without, as before the prefetch (8640f62).
// decode_prefetch() forces a choice (benchmarks, the alternating comparison, tests).
#pragma once

#include <atomic>

#include "attnkit/core/index.hpp"
#include "attnkit/detail/aligned.hpp"

namespace attnkit {

/// Decode's software prefetch of K/V rows: Auto (per CPU, see detail/prefetch.hpp), or forced.
enum class DecodePrefetch { Auto, Off, Ahead };

/// The process-wide choice (default Auto).
inline std::atomic<DecodePrefetch>& decode_prefetch() {
  static std::atomic<DecodePrefetch> choice{DecodePrefetch::Auto};
  return choice;
}

namespace detail {

/// Keys decode asks for ahead of the block it computes, when it prefetches.
/// (Spread over the rows, 32 keys ahead ran 0.88-1.00x the time of 48 and 16 0.94-0.97x on
/// the Xeon, decode f16 / bf16 / q8_0 MHA and f16 GQA, docs/ledger.md; 96 1.00-1.09x.)
inline constexpr Index kDecodePrefetchAhead = 32;

/// Auto's choice (the measurements above): on Intel CPUs, unless each K row serves one query
/// row (`group` query heads per KV head, 1: MHA), is wider than 256 bytes and is f32 (a pure
/// stream, whose hardware prefetch the requests only disturb). Rows that are widened or
/// dequantized on the way gain at any width: MHA at d 512, Lk 16K, on the Xeon, alternated
/// in one process: bf16 24.0 -> 20.5 ms, q8_0 17.8 -> 12.4 (f32 35.4 -> 38.4: left off).
inline bool decode_prefetch_for(bool intel, Index group, Index key_row_bytes,
                                bool f32_keys = true) {
  return intel && (group > 1 || key_row_bytes <= 256 || !f32_keys);
}

/// Whether this CPU is an Intel one (x86 with GCC / Clang's cpu builtins; false elsewhere).
inline bool cpu_is_intel() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_is("intel") != 0;
#else
  return false;
#endif
}

/// Keys decode prefetches ahead here and now, for K rows of key_row_bytes (f32 or not) that
/// serve `group` query heads each: kDecodePrefetchAhead or 0.
inline Index decode_prefetch_keys(Index group, Index key_row_bytes, bool f32_keys = true) {
  switch (decode_prefetch().load(std::memory_order_relaxed)) {
    case DecodePrefetch::Off:
      return 0;
    case DecodePrefetch::Ahead:
      return kDecodePrefetchAhead;
    case DecodePrefetch::Auto:
      break;
  }
  static const bool intel = cpu_is_intel();
  return decode_prefetch_for(intel, group, key_row_bytes, f32_keys) ? kDecodePrefetchAhead : 0;
}

/// Every cache line of the `bytes` bytes at p asked for to be read (a hint: never faults).
inline void prefetch_span(const void* p, Index bytes) {
  const char* at = static_cast<const char*>(p);
  for (Index off = 0; off < bytes; off += static_cast<Index>(kCacheLine))
    __builtin_prefetch(at + off);
}

/// Where decode's row loops ask for rows ahead: a key or value row `k_offset` / `v_offset`
/// bytes past the one in hand, `k_bytes` / `v_bytes` long (offsets 0: none). One row asked for
/// with each row computed keeps the requests in step with the work: the same rows asked for as
/// one burst at a block's start (48 rows of K and V at once) filled the core's fill buffers
/// and stalled it there (q8_0 MHA decode on the Xeon: 33-37 -> 23-28 ms spread out).
struct RowsAhead {
  Index k_offset = 0, k_bytes = 0, v_offset = 0, v_bytes = 0;
  /// Asks for the key row k_offset bytes past `key` (nothing when k_offset is 0).
  void ask_key(const void* key) const {
    if (k_offset != 0) prefetch_span(static_cast<const char*>(key) + k_offset, k_bytes);
  }
  /// Asks for the value row v_offset bytes past `value` (nothing when v_offset is 0).
  void ask_value(const void* value) const {
    if (v_offset != 0) prefetch_span(static_cast<const char*>(value) + v_offset, v_bytes);
  }
};

/// Every cache line of n rows of `bytes` bytes, ld elements apart, asked for to be read.
template <class T>
void prefetch_rows(const T* rows, Index ld, Index n, Index bytes) {
  for (Index j = 0; j < n; ++j) prefetch_span(rows + j * ld, bytes);
}

}  // namespace detail
}  // namespace attnkit
