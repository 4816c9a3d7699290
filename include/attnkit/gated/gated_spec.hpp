// GatedSpec: the gated linear recurrences of 2025-26 models, one family (docs/mechanisms.md
// "Gated delta rule and gated decay"). Per value head, with state S [Dk, Dv] (f32):
//   decay:   S' = Diag(a_t) S_{t-1},  a_t = exp(g_t): 1 (None), exp(g_h) per head (PerHead),
//            one exp(g_t) per token (PerToken), one per token and key channel (PerChannel)
//   update:  Additive  S_t = S' + k_t v_t^T                       (Mamba-2 SSD, GLA)
//            Delta     S_t = S' + beta_t k_t (v_t - S'^T k_t)^T  (Gated DeltaNet, KDA)
//   read:    o_t = S_t^T (s q_t)
// with q_t, k_t optionally l2-normalized in the kernel (x / sqrt(sum x^2 + 1e-6), as
// transformers' l2norm) and s = Options::scale (default 1/sqrt(Dk)). Gates arrive in log space
// (g <= 0, the caller's -exp(A_log) softplus(...)), beta already through its sigmoid: the short
// convolution and the gate projections stay in the model's code.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/linear/linear_spec.hpp"

namespace attnkit {

/// How the state takes a token: added (k v^T) or corrected by its own prediction (delta).
enum class GatedUpdate { Additive, Delta };

/// The shape of the decay's log gate g.
enum class GateShape {
  None,       // no decay (a = 1)
  PerHead,    // GatedSpec::head_gates, one log decay per value head, fixed
  PerToken,   // g [B, Hv, L, 1]: one per token and head (Gated DeltaNet, Mamba-2)
  PerChannel  // g [B, Hv, L, Dk]: one per token, head and key channel (KDA, GLA)
};

struct GatedSpec {
  static constexpr Index kMaxChunk = 256;  // bounds the [chunk, chunk] scratch

  GatedUpdate update = GatedUpdate::Delta;
  GateShape gate = GateShape::PerToken;
  std::vector<float> head_gates;  // PerHead: log decay g_h <= 0 per value head
  bool l2_normalize = false;      // q and k rows l2-normalized in the kernel
  LinearForm form = LinearForm::Chunked;
  // Rows per chunk of the chunked form (1 to kMaxChunk). A chunk's pairwise decays are formed
  // from a reference point inside it; a chunk whose per-channel gates span more than exp(80)
  // on either side of it is halved until they do not (exact in any case: the state carries
  // across chunks of any size).
  Index chunk = 64;

  /// Gated DeltaNet (Qwen3-Next, Qwen3.5): delta rule, one gate per token, q and k
  /// l2-normalized in the kernel.
  static GatedSpec gated_delta_net() { return GatedSpec{}.with_l2_normalize(true); }
  /// Kimi Delta Attention: the same with one gate per key channel.
  static GatedSpec kimi_delta() { return gated_delta_net().with_gate(GateShape::PerChannel); }
  /// Mamba-2's SSD (h_t = exp(g_t) h_{t-1} + k_t v_t^T, y = h^T q; B as k, C as q, x as v):
  /// additive, one gate per token. Its y has no 1/sqrt(d) scale: pass Options::scale 1.
  static GatedSpec mamba2() {
    return GatedSpec{}.with_update(GatedUpdate::Additive).with_gate(GateShape::PerToken);
  }
  /// Gated linear attention (GLA): additive, one gate per key channel.
  static GatedSpec gla() {
    return GatedSpec{}.with_update(GatedUpdate::Additive).with_gate(GateShape::PerChannel);
  }

  // Setters return a modified copy, as Options' do.
  GatedSpec with_update(GatedUpdate u) const { return set(&GatedSpec::update, u); }
  GatedSpec with_gate(GateShape g) const { return set(&GatedSpec::gate, g); }
  GatedSpec with_head_gates(std::vector<float> g) const {
    return set(&GatedSpec::gate, GateShape::PerHead).set(&GatedSpec::head_gates, std::move(g));
  }
  GatedSpec with_l2_normalize(bool on) const { return set(&GatedSpec::l2_normalize, on); }
  GatedSpec with_form(LinearForm f) const { return set(&GatedSpec::form, f); }
  GatedSpec with_chunk(Index rows) const { return set(&GatedSpec::chunk, rows); }

  bool delta() const { return update == GatedUpdate::Delta; }
  /// Whether the call reads a g tensor, and its last dimension (Dk for PerChannel).
  bool reads_gates() const { return gate == GateShape::PerToken || gate == GateShape::PerChannel; }

  /// This spec's identity (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<GatedSpec>()
        .add(update)
        .add(gate)
        .add(head_gates)
        .add(l2_normalize)
        .add(form)
        .add(chunk)
        .value();
  }

 private:
  template <class Member, class Value>
  GatedSpec set(Member GatedSpec::*member, Value&& value) const {
    GatedSpec s = *this;
    s.*member = std::forward<Value>(value);
    return s;
  }
};

/// The per-token inputs besides q, k, v, computed by the model: g (log decay, <= 0) as
/// [B, Hv, L, 1] (PerToken) or [B, Hv, L, Dk] (PerChannel), beta (write strength in [0, 1])
/// as [B, Hv, L, 1] (Delta). Views of f32, any strides (transformers' [B, L, H] is
/// bshd(ptr, B, L, H, 1)). Leave a view empty (data null) where the spec reads none.
struct GateInputs {
  View<const float> g;
  View<const float> beta;
};

}  // namespace attnkit
