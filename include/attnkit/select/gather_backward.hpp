// The backward side of gathering (select/gather.hpp), shared by the drivers' backward passes
// (moba_backward.hpp, all_or_here_backward.hpp, stripes_backward.hpp,
// superlinear_backward.hpp). A driver's forward is a set of gathered parts combined into one
// result per query row; its backward is the sum over the parts of attention_backward() on
// each part, with the part's own mask and the FINAL o and row statistic gathered for the
// part's rows. For softmax, the weights a part recomputes from the final LSE,
// exp(s - LSE_final), are exactly its share of the merged weights, and D_i = dO_i . O_i is the
// same in every part; a driver whose parts never share a query row (All-or-Here, stripes)
// gives each row its own statistic, so any normalizer works there. Each part's gradients
// (f32) are added into f32 sums of the whole dq, dk, dv (GradSum) in the driver's fixed part
// order, then stored in the gradient views' types: bitwise identical for any thread count,
// since attention_backward() is.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/options.hpp"
#include "attnkit/param_grads.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/select/gather.hpp"

namespace attnkit::select {

/// The f32 sum of one gradient [B, H, L, dim] (row-major), to which parts add rows.
class GradSum {
 public:
  GradSum(Index batch, Index heads, Index seq, Index dim)
      : data_(static_cast<std::size_t>(batch * heads * seq * dim), 0.f),
        batch_(batch),
        heads_(heads),
        seq_(seq),
        dim_(dim) {}

  /// The whole sum as a [B, H, L, dim] view (a part over every row writes here directly).
  View<float> view() { return bhsd(data_.data(), batch_, heads_, seq_, dim_); }

  /// Rows rows[r] (rows null: first + r) of head h in batch b += row r of part [1, 1, n, dim].
  void add(const View<float>& part, Index b, Index h, const Index* rows, Index first = 0) {
    for (Index r = 0; r < part.seq; ++r) {
      const float* in = part.row(0, 0, r);
      float* out = row(b, h, rows != nullptr ? rows[r] : first + r);
      for (Index c = 0; c < dim_; ++c) out[c] += in[c];
    }
  }

  /// The sums, in G's storage, into out (shaped [B, H, L, dim]).
  template <class G>
  void store(const View<G>& out) const {
    for (Index b = 0; b < batch_; ++b)
      for (Index h = 0; h < heads_; ++h)
        for (Index s = 0; s < seq_; ++s) {
          const float* in = data_.data() + ((b * heads_ + h) * seq_ + s) * dim_;
          G* dst = out.row(b, h, s);
          for (Index c = 0; c < dim_; ++c) dst[c] = static_cast<G>(in[c]);
        }
  }

 private:
  float* row(Index b, Index h, Index s) {
    return data_.data() + ((b * heads_ + h) * seq_ + s) * dim_;
  }

  std::vector<float> data_;
  Index batch_, heads_, seq_, dim_;
};

/// The f32 gradients of one gathered part: dq [1, 1, n, D], dk [1, 1, m, D], dv [1, 1, m, Dv],
/// and its one-head normalizer parameter gradient.
struct PartGrads {
  std::vector<float> dq_rows, dk_rows, dv_rows;
  float param = 0.f;
  View<float> dq, dk, dv;
};

/// attention_backward(spec) on one gathered part (q: its n query rows, k / v: its m keys, o
/// and d_o: the final output and its gradient on the same rows, call.lse: the final row
/// statistic of those rows) into `out`; with_param: also the part's parameter gradient.
template <class Spec, class Q, class K, class V, class O, class GO>
void part_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                   const View<O>& o, const View<GO>& d_o, const Options& call, bool with_param,
                   PartGrads& out) {
  const auto size = [](Index rows, Index dim) { return static_cast<std::size_t>(rows * dim); };
  out.dq_rows.resize(size(q.seq, q.dim));
  out.dk_rows.resize(size(k.seq, k.dim));
  out.dv_rows.resize(size(v.seq, v.dim));
  out.dq = bhsd(out.dq_rows.data(), 1, 1, q.seq, q.dim);
  out.dk = bhsd(out.dk_rows.data(), 1, 1, k.seq, k.dim);
  out.dv = bhsd(out.dv_rows.data(), 1, 1, v.seq, v.dim);
  out.param = 0.f;
  attention_backward(spec, q, k, v, o, d_o, out.dq, out.dk, out.dv, call,
                     with_param ? ParamGrads{}.with_normalizer(&out.param, 1) : ParamGrads{});
}

/// The call's gradients as the parts add into them: dq, dk, dv in f32 (GradSum) and the
/// per-head parameter gradient in double, then stored in the gradient views' storage.
struct CallSums {
  GradSum q, k, v;
  std::vector<double> heads;  // [Hq]

  explicit CallSums(const Problem& p)
      : q(p.batch, p.q_heads, p.q_len, p.head_dim),
        k(p.batch, p.kv_heads, p.kv_len, p.head_dim),
        v(p.batch, p.kv_heads, p.kv_len, p.value_dim),
        heads(static_cast<std::size_t>(p.q_heads), 0.0) {}

  /// One part of query head h (KV head hk) in batch b: its dq row r to q_rows[r] (null:
  /// q_first + r), its dk / dv row r to k_rows[r] (null: k_first + r).
  void add(const PartGrads& part, Index b, Index h, Index hk, const Index* q_rows, Index q_first,
           const Index* k_rows, Index k_first) {
    q.add(part.dq, b, h, q_rows, q_first);
    k.add(part.dk, b, hk, k_rows, k_first);
    v.add(part.dv, b, hk, k_rows, k_first);
    heads[static_cast<std::size_t>(h)] += double(part.param);
  }

  /// The sums into dq, dk, dv and (when not null) the parameter gradient [Hq].
  template <class GQ, class GK, class GV>
  void store(const View<GQ>& dq, const View<GK>& dk, const View<GV>& dv, Span<float> param) const {
    q.store(dq);
    k.store(dk);
    v.store(dv);
    if (param.empty()) return;
    for (std::size_t h = 0; h < heads.size(); ++h) param.data()[h] = static_cast<float>(heads[h]);
  }
};

/// Row statistics rows[r] of head h in batch b (stat: [B, Hq, Lq]; null: none) into out.
inline Span<float> gather_stats(Span<float> stat, const Problem& p, Index b, Index h,
                                const std::vector<Index>& rows, std::vector<float>& out) {
  if (stat.empty()) return {};
  out.resize(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r)
    out[r] = stat.data()[(b * p.q_heads + h) * p.q_len + rows[r]];
  return out;
}

}  // namespace attnkit::select
