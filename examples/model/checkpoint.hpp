// A decoder checkpoint from a GGUF file: its hyperparameters, the conventions of its
// architecture that the file does not spell out, and its weights dequantized to f32.
//
// Two architectures, as llama.cpp reads them (src/llama-model.cpp):
// - "llama" (SmolLM2): RMSNorm before attention and MLP, SiLU-gated MLP, one RoPE base.
//   llama.cpp's converter permutes the rows of Q and K of each head so that RoPE turns
//   adjacent pairs (x0, x1), (x2, x3), ... (GPT-J's pairing, ggml's "normal" rope); Hugging
//   Face's modeling code turns (x_m, x_{m + d/2}) on unpermuted rows (NeoX). Q.K is the same
//   either way: we keep the file's rows and tell Rope the pairing (RopePairing::GptJ).
// - "gemma3" (Gemma 3): embeddings scaled by sqrt(d_model); RMSNorm with weight 1 + w (the
//   file stores 1 + w already); a norm after attention and after the MLP too; QK-norm (an
//   RMSNorm over each head's q and k before RoPE); GELU (tanh) MLP; sliding-window layers
//   (window 512: key j visible from query i when i - 511 <= j <= i) with RoPE base 10000 and
//   every sixth layer global with the file's base (10^6); NeoX pairing; query scale
//   1/sqrt(head_dim) (query_pre_attn_scalar = head_dim but for the 27B model). The local
//   base and the 5:1 pattern are not in the file: llama.cpp and transformers hard-code them.
#pragma once

#include <Eigen/Core>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf.hpp"

namespace model {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;

struct Config {
  bool gemma = false;  // else llama
  attnkit::Index layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, d_ff = 0;
  attnkit::Index vocab = 0, window = 0;  // window: 0 = every layer global
  double eps = 1e-5, rope_base = 10000, local_rope_base = 10000;
  float scale = 0;        // the logits' scale, 1/sqrt(head_dim) for both models
  float embed_scale = 1;  // gemma: sqrt(d_model)
  attnkit::RopePairing pairing = attnkit::RopePairing::NeoX;
  int bos = -1;

  /// Gemma 3's 5:1 pattern: layers 5, 11, 17, ... are global, the others slide.
  bool is_local(attnkit::Index layer) const { return window > 0 && (layer + 1) % 6 != 0; }
};

inline Config read_config(const GgufFile& f) {
  const std::string arch = f.text("general.architecture");
  if (arch != "llama" && arch != "gemma3")
    throw std::runtime_error("runner: architecture " + arch + " (reads llama and gemma3)");
  const std::string a = arch + ".";
  if (f.has(a + "rope.scaling.type"))
    throw std::runtime_error("runner: RoPE scaling is not read by this runner");
  Config c;
  c.gemma = arch == "gemma3";
  c.layers = f.integer(a + "block_count");
  c.d_model = f.integer(a + "embedding_length");
  c.heads = f.integer(a + "attention.head_count");
  c.kv_heads = f.integer(a + "attention.head_count_kv");
  c.head_dim = f.has(a + "attention.key_length") ? f.integer(a + "attention.key_length")
                                                 : c.d_model / c.heads;
  c.d_ff = f.integer(a + "feed_forward_length");
  c.vocab = static_cast<attnkit::Index>(f.strings("tokenizer.ggml.tokens").size());
  c.eps = f.number(a + "attention.layer_norm_rms_epsilon");
  c.rope_base = f.number(a + "rope.freq_base");
  c.scale = 1.0f / std::sqrt(float(c.head_dim));
  if (f.has("tokenizer.ggml.bos_token_id")) c.bos = int(f.integer("tokenizer.ggml.bos_token_id"));
  if (c.gemma) {
    c.window = f.integer(a + "attention.sliding_window");
    c.local_rope_base = 10000;
    c.embed_scale = std::sqrt(float(c.d_model));
  } else {
    c.pairing = attnkit::RopePairing::GptJ;  // the file's Q/K rows are permuted (above)
  }
  return c;
}

struct Layer {
  Matrix wq, wk, wv, wo, gate, up, down;  // [out, in], as stored
  Vector attn_norm, ffn_norm;             // before attention, before the MLP
  Vector post_attn_norm, post_ffn_norm;   // gemma: after attention, after the MLP
  Vector q_norm, k_norm;                  // gemma: over each head's dim
};

struct Weights {
  Matrix embed;  // [vocab, d_model]; tied: also the output projection
  Vector out_norm;
  std::vector<Layer> layers;
};

inline Matrix load_matrix(const GgufFile& f, const std::string& name, attnkit::Index rows,
                          attnkit::Index cols) {
  const TensorInfo& t = f.tensor(name);
  if (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows)
    throw std::runtime_error("runner: " + name + " is not [" + std::to_string(rows) + ", " +
                             std::to_string(cols) + "]");
  const std::vector<float> values = f.load(name);
  return Eigen::Map<const Matrix>(values.data(), rows, cols);
}

inline Vector load_vector(const GgufFile& f, const std::string& name, attnkit::Index n) {
  const std::vector<float> values = f.load(name);
  if (attnkit::Index(values.size()) != n)
    throw std::runtime_error("runner: " + name + " has the wrong length");
  return Eigen::Map<const Vector>(values.data(), n);
}

inline Weights load_weights(const GgufFile& f, const Config& c) {
  Weights w;
  w.embed = load_matrix(f, "token_embd.weight", c.vocab, c.d_model);
  if (f.has_tensor("output.weight"))
    throw std::runtime_error("runner: an untied output projection is not read by this runner");
  w.out_norm = load_vector(f, "output_norm.weight", c.d_model);
  const attnkit::Index q_width = c.heads * c.head_dim, kv_width = c.kv_heads * c.head_dim;
  for (attnkit::Index i = 0; i < c.layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    Layer l;
    l.wq = load_matrix(f, p + "attn_q.weight", q_width, c.d_model);
    l.wk = load_matrix(f, p + "attn_k.weight", kv_width, c.d_model);
    l.wv = load_matrix(f, p + "attn_v.weight", kv_width, c.d_model);
    l.wo = load_matrix(f, p + "attn_output.weight", c.d_model, q_width);
    l.gate = load_matrix(f, p + "ffn_gate.weight", c.d_ff, c.d_model);
    l.up = load_matrix(f, p + "ffn_up.weight", c.d_ff, c.d_model);
    l.down = load_matrix(f, p + "ffn_down.weight", c.d_model, c.d_ff);
    l.attn_norm = load_vector(f, p + "attn_norm.weight", c.d_model);
    l.ffn_norm = load_vector(f, p + "ffn_norm.weight", c.d_model);
    if (c.gemma) {
      l.post_attn_norm = load_vector(f, p + "post_attention_norm.weight", c.d_model);
      l.post_ffn_norm = load_vector(f, p + "post_ffw_norm.weight", c.d_model);
      l.q_norm = load_vector(f, p + "attn_q_norm.weight", c.head_dim);
      l.k_norm = load_vector(f, p + "attn_k_norm.weight", c.head_dim);
    }
    w.layers.push_back(std::move(l));
  }
  return w;
}

}  // namespace model
