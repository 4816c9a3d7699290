// The decoder's forward for n new tokens: embeddings, per layer a norm, the Q/K/V
// projections, attention (attention_layers.hpp: attnkit), the output projection and the MLP,
// then the final norm and the logits (the tied embedding). Eigen does the matmuls; every
// [n, width] activation is a row-major matrix, so a token's row is contiguous.
#pragma once

#include <Eigen/Core>
#include <chrono>
#include <cmath>
#include <vector>

#include "attention_layers.hpp"
#include "checkpoint.hpp"

namespace model {

/// y = x W^T for the rows of x: W [out, in] split in `threads` bands of output features, one
/// Eigen product per band (decode's n = 1 is a matrix-vector product, which Eigen does not
/// split over threads by itself).
inline void project(const Matrix& w, const Matrix& x, Matrix& y, int threads) {
  y.resize(x.rows(), w.rows());
  const Eigen::Index bands = threads, step = (w.rows() + bands - 1) / bands;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (Eigen::Index band = 0; band < bands; ++band) {
    const Eigen::Index begin = band * step, size = std::min(step, w.rows() - begin);
    if (size > 0) y.middleCols(begin, size).noalias() = x * w.middleRows(begin, size).transpose();
  }
}

/// RMSNorm of each row of width `width` in place: x / sqrt(mean(x^2) + eps) * w.
inline void rms_norm(float* x, Eigen::Index rows, Eigen::Index width, const Vector& w, double eps) {
  for (Eigen::Index r = 0; r < rows; ++r) {
    Eigen::Map<Eigen::VectorXf> row(x + r * width, width);
    const float inv = 1.0f / std::sqrt(row.squaredNorm() / float(width) + float(eps));
    row = (row * inv).cwiseProduct(w);
  }
}

template <class T>
class Decoder {
 public:
  Decoder(const Config& c, const Weights& w, attnkit::Index capacity, int threads)
      : c_(c), w_(w), attention_(c, capacity, threads), threads_(threads) {}

  attnkit::Index length() const { return attention_.length(); }
  double attention_seconds() const { return attention_.seconds(); }

  /// Runs the n tokens at positions length() .. length() + n - 1 through every layer and
  /// leaves their final hidden states (after the last norm) in hidden(), [n, d_model].
  void forward(const std::vector<int>& tokens) {
    const Eigen::Index n = Eigen::Index(tokens.size()), d = c_.d_model;
    x_.resize(n, d);
    for (Eigen::Index t = 0; t < n; ++t)
      x_.row(t) = w_.embed.row(tokens[std::size_t(t)]) * c_.embed_scale;
    for (attnkit::Index i = 0; i < c_.layers; ++i) layer(w_.layers[std::size_t(i)], i);
    rms_norm(x_.data(), n, d, w_.out_norm, c_.eps);
  }

  const Matrix& hidden() const { return x_; }

  /// The logits of rows [begin, begin + n) of hidden(): [n, vocab].
  void logits(Eigen::Index begin, Eigen::Index n, Matrix& out) const {
    const Matrix rows = x_.middleRows(begin, n);
    project(w_.embed, rows, out, threads_);
  }

 private:
  void layer(const Layer& l, attnkit::Index index) {
    const Eigen::Index n = x_.rows(), d = c_.d_model, hd = c_.head_dim;
    h_ = x_;
    rms_norm(h_.data(), n, d, l.attn_norm, c_.eps);
    project(l.wq, h_, q_, threads_);
    project(l.wk, h_, k_, threads_);
    project(l.wv, h_, v_, threads_);
    if (c_.gemma) {  // QK-norm: each head's q and k rows normalized before RoPE
      rms_norm(q_.data(), n * c_.heads, hd, l.q_norm, c_.eps);
      rms_norm(k_.data(), n * c_.kv_heads, hd, l.k_norm, c_.eps);
    }
    o_.resize(n, c_.heads * hd);
    attention_.attend(index, q_.data(), k_.data(), v_.data(), o_.data(), n);
    project(l.wo, o_, h_, threads_);
    if (c_.gemma) rms_norm(h_.data(), n, d, l.post_attn_norm, c_.eps);
    x_ += h_;

    h_ = x_;
    rms_norm(h_.data(), n, d, l.ffn_norm, c_.eps);
    project(l.gate, h_, gate_, threads_);
    project(l.up, h_, up_, threads_);
    if (c_.gemma)  // GELU, tanh form: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
      gate_ = gate_.unaryExpr([](float g) {
        return 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
      });
    else  // SiLU: g / (1 + e^-g)
      gate_ = gate_.unaryExpr([](float g) { return g / (1.0f + std::exp(-g)); });
    gate_.array() *= up_.array();
    project(l.down, gate_, h_, threads_);
    if (c_.gemma) rms_norm(h_.data(), n, d, l.post_ffn_norm, c_.eps);
    x_ += h_;
  }

  const Config& c_;
  const Weights& w_;
  AttentionLayers<T> attention_;
  int threads_;
  Matrix x_, h_, q_, k_, v_, o_, gate_, up_;
};

}  // namespace model
