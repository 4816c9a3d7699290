// Problem: the sizes and scalars of one attention call, deduced from the views and the
// Options, and checked once by validate(). Kernels trust a validated Problem.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/options.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/score/faces.hpp"

namespace attnkit {

struct Problem {
  Index batch = 0, q_heads = 0, kv_heads = 0;
  Index q_len = 0, kv_len = 0;
  Index head_dim = 0, value_dim = 0;
  float scale = 0.f;   // logit = scale * q . k
  Index q_offset = 0;  // absolute position of query row i is i + q_offset (keys: j)
  int threads = 0;
  Products products = Products::Exact;  // Bf16: tiles may round; Int8: decode's Q.K

  /// Query head h reads KV head kv_head(h) (GQA/MQA).
  Index kv_head(Index h) const { return h / (q_heads / kv_heads); }

  /// Throws Error naming the first invalid field.
  void validate() const {
    using detail::require;
    require(batch >= 0, "batch", ">= 0", batch);
    require(q_len >= 0, "q_len", ">= 0", q_len);
    require(kv_len >= 0, "kv_len", ">= 0", kv_len);
    require(head_dim >= 1 && head_dim <= kMaxDim, "head_dim", "1 to 2^20", head_dim);
    require(value_dim >= 1 && value_dim <= kMaxDim, "value_dim", "1 to 2^20", value_dim);
    require(kv_heads >= 1, "kv_heads", ">= 1", kv_heads);
    require(q_heads >= 1 && q_heads % kv_heads == 0, "q_heads",
            detail::cat("a positive multiple of kv_heads (", kv_heads, ")"), q_heads);
    require(std::isfinite(scale) && scale != 0.f, "scale", "finite and non-zero", scale);
    require(threads >= 0 && threads <= kMaxThreads, "threads",
            detail::cat("0 (all) to ", kMaxThreads), threads);
    require(products == Products::Exact || products == Products::Bf16 || products == Products::Int8,
            "products", "Products::Exact, Bf16 or Int8", static_cast<int>(products));
    // Positions i + q_offset and the ranges built from them must not overflow Index.
    require(q_offset >= -kMaxOffset && q_offset <= kMaxOffset, "q_offset", "within +-2^62",
            q_offset);
  }

  static constexpr Index kMaxOffset = Index{1} << 62;
  // Far above any model's head size; it bounds the per-thread scratch (tiles of
  // kBlockK x head_dim floats) so that its size never overflows.
  static constexpr Index kMaxDim = Index{1} << 20;
  // More threads than any machine runs attention on; beyond a few thousand OpenMP runtimes
  // crash (libgomp) or take minutes to start them (libomp).
  static constexpr int kMaxThreads = Options::kMaxThreads;
};

namespace detail {

inline constexpr Index kMaxLseRows = Index{1} << 60;  // LSE bytes fit in Index

/// The logit scale of a call: Options.scale when set, else 1 / sqrt(head_dim) (0 for an
/// empty head dim, which Problem::validate() refuses).
inline float scale_for(const Options& options, Index head_dim) {
  if (options.scale) return *options.scale;
  return head_dim > 0 ? 1.f / std::sqrt(static_cast<float>(head_dim)) : 0.f;
}

template <class What, class Source>
void require_dim(Index actual, Index expected, const What& what, const Source& source) {
  require(actual == expected, what, cat(expected, " (", source, ")"), actual);
}

// Outputs never share memory with the inputs (a tile's output would overwrite keys and
// values other tiles still read) nor with each other. In-place output over q is refused
// too: it would hold only while every kernel reads a query row before writing it.
template <class Q, class K, class V, class O>
void check_outputs_disjoint(const View<Q>& q, const View<K>& k, const View<V>& v, const View<O>& o,
                            Span<float> lse) {
  const ByteSpan out = byte_span(o);
  const ByteSpan in[3] = {byte_span(q), byte_span(k), byte_span(v)};
  const char* in_names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) require_disjoint(out, "o", in[i], in_names[i]);
  if (lse.empty()) return;
  Index rows = 0;
  require(checked_product({q.batch, q.heads, q.seq}, &rows) && rows <= kMaxLseRows, "lse",
          "a buffer of batch * q_heads * q_len floats that fits in memory", "an overflow");
  require_span_size(lse, rows, "Options.lse.size()",
                    "q.batch * q.heads * q.seq: one statistic per query row");
  const auto begin = reinterpret_cast<std::uintptr_t>(lse.data());
  const ByteSpan stats{begin, begin + static_cast<std::uintptr_t>(rows) * sizeof(float)};
  require_disjoint(stats, "lse", out, "o");
  for (int i = 0; i < 3; ++i) require_disjoint(stats, "lse", in[i], in_names[i]);
}

}  // namespace detail

namespace detail {

/// k and v against q: batch, head dim, and v against k: heads and length.
template <class Q, class K, class V>
void require_qkv_dims(const View<Q>& q, const View<K>& k, const View<V>& v) {
  require_dim(k.batch, q.batch, "k.batch", "q.batch");
  require_dim(v.batch, q.batch, "v.batch", "q.batch");
  require_dim(k.dim, q.dim, "k.dim", "q.dim");
  require_dim(v.heads, k.heads, "v.heads", "k.heads");
  require_dim(v.seq, k.seq, "v.seq", "k.seq");
}

/// An output-shaped view (o, or d_o for a backward) against q and v: [B, Hq, Lq, Dv].
template <class O, class Q, class V>
void require_out_dims(const View<O>& o, const View<Q>& q, const View<V>& v, const char* name) {
  require_dim(o.batch, q.batch, cat(name, ".batch"), "q.batch");
  require_dim(o.heads, q.heads, cat(name, ".heads"), "q.heads");
  require_dim(o.seq, q.seq, cat(name, ".seq"), "q.seq");
  require_dim(o.dim, v.dim, cat(name, ".dim"), "v.dim");
}

/// The Problem of views whose shapes were checked, with the given scalars, validated.
template <class Q, class K, class V>
Problem problem_of(const View<Q>& q, const View<K>& k, const View<V>& v, float scale,
                   Index q_offset, int threads, Products products = Products::Exact) {
  Problem p;
  p.batch = q.batch;
  p.q_heads = q.heads;
  p.kv_heads = k.heads;
  p.q_len = q.seq;
  p.kv_len = k.seq;
  p.head_dim = q.dim;
  p.value_dim = v.dim;
  p.scale = scale;
  p.q_offset = q_offset;
  p.threads = threads;
  p.products = products;
  p.validate();
  return p;
}

}  // namespace detail

/// Deduces and validates the Problem of attention(q [B,Hq,Lq,D], k [B,Hkv,Lk,D],
/// v [B,Hkv,Lk,Dv], o [B,Hq,Lq,Dv]). Throws Error on any disagreement.
template <class Q, class K, class V, class O>
Problem make_problem(const View<Q>& q, const View<K>& k, const View<V>& v, const View<O>& o,
                     const Options& options = {}) {
  detail::check_view(q, "q");
  detail::check_view(k, "k");
  detail::check_view(v, "v");
  detail::check_view(o, "o");
  detail::check_rows_distinct(o, "o");
  detail::check_outputs_disjoint(q, k, v, o, options.lse);
  detail::require_qkv_dims(q, k, v);
  detail::require_out_dims(o, q, v, "o");
  return detail::problem_of(q, k, v, detail::scale_for(options, q.dim),
                            options.q_offset ? *options.q_offset : k.seq - q.seq, options.threads,
                            options.products);
}

/// The checks of the paths whose parts see part-local or gathered indices (pages, the
/// gathered drivers, sharded decode): no Position (turn q and the keys before, keep the keys
/// rotated) and a Score that does not read positions (score/faces.hpp, reads_positions()).
template <class Spec>
constexpr void check_index_free_spec() {
  static_assert(std::is_same_v<typename Spec::Position, NoPosition>,
                "this path's parts see page-local or gathered indices: Position NoPosition only "
                "(turn q and k with apply_position() before; keep the keys rotated)");
  static_assert(!detail::reads_positions<typename Spec::Score>(),
                "this path's parts see page-local or gathered indices: a position-free Score "
                "only (Dot, Softcap; a Score of yours that says kReadsPositions = false), not "
                "a Score that reads positions (Alibi)");
}

/// Lets each policy of `spec` that carries data of its own (a BlockMask built for other
/// sizes) check it against the call: validate(q_len, kv_len, q_offset, batch, q_heads), and
/// the Position K's head count (validate_kv_heads). A row-statistics buffer is refused for
/// a normalizer that has none.
template <class Spec>
void validate_policies(const Spec& spec, const Problem& p, const Options& options) {
  using Normalizer = typename Spec::Normalizer;
  if constexpr (detail::row_stat_kind<Normalizer>() == RowStat::None)
    detail::require(options.lse.empty(), "lse", "nullptr (this normalizer has no row statistic)",
                    "a buffer");
  if constexpr (detail::owns_product<typename Spec::Position>())
    detail::require(!options.scale, "Options.scale",
                    "unset (this Position forms the logits with its own scale)",
                    options.scale.value_or(0.f));
  if constexpr (detail::cosine_logits<Normalizer>())
    detail::require(!options.scale, "Options.scale",
                    "unset (this normalizer's logits are cosines, with its own scale)",
                    options.scale.value_or(0.f));
  const auto check = [&p](const auto& policy) {
    if constexpr (detail::has_validate<std::decay_t<decltype(policy)>>::value)
      policy.validate(p.q_len, p.kv_len, p.q_offset, p.batch, p.q_heads);
    detail::validate_head_dim_of(policy, p.head_dim);
  };
  check(spec.score);
  check(spec.mask);
  check(spec.normalizer);
  check(spec.position);
  detail::validate_kv_heads_of(spec.position, p.kv_heads);
}

}  // namespace attnkit
