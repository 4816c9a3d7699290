// decode(): attention for a few query rows (Lq <= kMaxDecodeQueries, e.g. one new token per
// sequence) against a long KV, split-KV (kernel/split_kv.hpp): key chunks of kDecodeChunk are
// shared by the threads, the query heads of a KV group read each chunk once, and the chunks
// merge in a fixed order, so the result is bitwise identical for any thread count. Softmax
// with no score mod or Softcap and up to kDecodeRowsMaxQueries rows runs the row engine
// (kernel/decode/decode_rows.hpp: keys in the SIMD lanes, the rows of a KV group sharing each K/V
// load); the rest runs query tiles. attention() routes such shapes here by itself (the row
// engine's always, others when Lk >= 2 kDecodeChunk); call decode() to ask for it explicitly. Every
// mask, score mod, position policy and one-pass normalizer works; a multi-pass normalizer (LSSAR)
// fails at compile time.
#pragma once

#include <string>
#include <type_traits>

#include "attnkit/kernel/attention.hpp"
#include "attnkit/kernel/split_kv.hpp"

namespace attnkit {

/// The same contract as attention(), for q_len <= kMaxDecodeQueries (Error otherwise).
template <class Spec, class Q, class K, class V, class O>
void decode(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
            const View<O>& o, const Options& options = {}) {
  static_assert(detail::passes<typename Spec::Normalizer>() == 1,
                "decode(): this normalizer makes more than one pass over the keys (LSSAR): its "
                "chunks cannot be merged in one round; use attention()");
  static_assert(detail::check_entry_types<Spec, Q, K, V, O>());  // attention()'s checks
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  detail::require(p.q_len <= kMaxDecodeQueries, "decode(): q_len",
                  detail::cat("<= ", kMaxDecodeQueries, " (use attention())"), p.q_len);
  detail::run_with_keys(spec, p, q, k, v, o, options, true);
}

}  // namespace attnkit
