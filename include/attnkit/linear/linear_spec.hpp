// LinearSpec: what one linear_attention() call computes, apart from the sizes. With
// S_i = gamma S_{i-1} + phi(k_i) v_i^T and z_i = gamma z_{i-1} + phi(k_i) (key i included,
// S_{-1}, z_{-1} = the state passed in):
//   causal:     o_i = phi(s q_i)^T S_i / (phi(s q_i)^T z_i + eps)
//   non-causal: o_i = phi(s q_i)^T S_last / (phi(s q_i)^T z_last + eps): every query reads
//               the state after the call's last key (an encoder; Lq may differ from Lk)
// where s is Options::scale (default 1 here, not 1/sqrt(d): feature maps have no softmax
// temperature; Taylor2 approximates exp(s q.k)). Without normalization o_i is the numerator.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/linear/feature_map.hpp"

namespace attnkit {

/// How the kernel walks the sequence: both give the same result (within f32 rounding).
enum class LinearForm {
  Chunked,   // prefill: the quadratic term inside chunks of `chunk` rows, the state across
             // chunks; tile GEMMs throughout
  Recurrent  // decode: one rank-1 update of the state and one read per token
};

template <class Map = EluPlusOne>
struct LinearSpec {
  static constexpr Index kMaxChunk = 4096;  // bounds the [chunk, chunk] scratch

  Map map{};
  bool causal = true;
  std::vector<float> decay;  // [q_heads] gamma per head in [0, 1]; empty: no decay (1)
  bool normalize = Map::kNormalizes;
  float eps = 1e-6f;  // added to every denominator (>= 0): keeps Relu's empty rows finite
  LinearForm form = LinearForm::Chunked;
  // Rows per chunk of the chunked form, 1 to kMaxChunk. 32: the causal square inside a
  // chunk costs 2 C (F + Dv) per token and the state 4 F Dv, so a smaller C saves FLOPs
  // until the GEMMs get too thin (EluPlusOne, L = 4096, H = 2, one thread, AVX-512:
  // d = 64 3.4 ms at C = 32, 3.3 at 16, 4.3 at 64; d = 128 14.0 ms at 32, 16.6 at 64).
  Index chunk = 32;

  // Setters return a modified copy, as Options' do.
  LinearSpec with_causal(bool on) const { return set(&LinearSpec::causal, on); }
  LinearSpec with_decay(std::vector<float> gammas) const {
    return set(&LinearSpec::decay, std::move(gammas));
  }
  LinearSpec with_normalize(bool on, float epsilon = 1e-6f) const {
    return set(&LinearSpec::normalize, on).set(&LinearSpec::eps, epsilon);
  }
  LinearSpec with_form(LinearForm f) const { return set(&LinearSpec::form, f); }
  LinearSpec with_chunk(Index rows) const { return set(&LinearSpec::chunk, rows); }

  /// gamma of query head h (1 without decay).
  float gamma(Index h) const { return decay.empty() ? 1.f : decay[static_cast<std::size_t>(h)]; }

  /// This spec's identity: the feature map's tag and every field (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<LinearSpec>()
        .add(detail::policy_tag(map))
        .add(causal)
        .add(decay)
        .add(normalize)
        .add(eps)
        .add(form)
        .add(chunk)
        .value();
  }

 private:
  template <class Member, class Value>
  LinearSpec set(Member LinearSpec::*member, Value&& value) const {
    LinearSpec s = *this;
    s.*member = std::forward<Value>(value);
    return s;
  }
};

/// LinearSpec<Map>{map}: deduces the map type, `linear_spec(Taylor2{}).with_decay(...)`.
template <class Map = EluPlusOne>
LinearSpec<Map> linear_spec(Map map = {}) {
  LinearSpec<Map> s;
  s.map = map;
  return s;
}

}  // namespace attnkit
