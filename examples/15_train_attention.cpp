// What this shows: a tiny attention model trained from scratch in plain C++, every gradient
// by hand -- attnkit's attention_backward() (linear_attention_backward()) for the attention,
// a few Eigen products for the rest -- on a task that needs attention: associative recall.
// A sequence holds P = 16 (key, value) pairs, one position each (input: key embedding +
// value embedding; distinct keys of 32, values of 16), then a query key (key embedding + a
// "no value" embedding); the answer is the value paired with the query. Values are drawn
// afresh per sequence, so the last position alone -- a model without attention, however
// deep -- cannot beat chance (1/16): the answer is only at an earlier position, and attention
// is the only path from there (the control run shows it: each position attends to itself).
//   x = E_key[key] + E_val[value]  [L, dm] -> q, k, v = x Wq, x Wk, x Wv  [L, D]
//   -> o = attention(q, k, v), causal, one head  [L, D] -> logits = o[L-1] Wo  [V]
//   -> softmax cross-entropy on the last position; Adam, written out.
// Variants: Softmax, Sigmoid, SoftplusL1 (LSSA), linear attention (elu + 1). Each run checks
// its first step's gradient against central differences of the whole model's loss, prints its
// loss curve and checks loss and accuracy on held-out sequences (fixed seeds: deterministic).
// Linear attention keeps one [D, D] state for all 16 pairs and recalls less: looser bounds.
//
// attnkit before Eigen, or GCC 12 warns inside its own AVX-512 headers (simd/vec.hpp).
// clang-format off
#include <attnkit/attnkit.hpp>
#include <Eigen/Core>
// clang-format on
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
using ak::Index;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using View = ak::View<float>;

namespace {

constexpr int kKeys = 32, kValues = 16, kPairs = 16, kLen = kPairs + 1;  // L = 17 positions
constexpr int kModel = 32, kHead = 16;                                   // dm, D (= Dv)
constexpr int kBatch = 64, kSteps = 600, kPrintEvery = 50;

// [K, dm], [V + 1, dm] (row V: "no value"), [dm, D] x3, [D, V]. Gradients and Adam's
// moments are Params too.
enum { kEKey, kEVal, kWq, kWk, kWv, kWo, kMats };
using Params = std::array<Mat, kMats>;
const char* const kNames[kMats] = {"E_key", "E_val", "Wq", "Wk", "Wv", "Wo"};

Params zeros_like(Params p) {
  for (Mat& m : p) m.setZero();
  return p;
}

Params init_params(std::mt19937& rng) {  // uniform in +-1/sqrt(fan_in), from mt19937's raw draws
  const auto draw = [&](int rows, int cols, int fan_in) {
    Mat m(rows, cols);
    for (float& x : m.reshaped())
      x = (2.f * float(rng()) / 4294967296.f - 1.f) / std::sqrt(float(fan_in));
    return m;
  };
  return {draw(kKeys, kModel, 1),      draw(kValues + 1, kModel, 1), draw(kModel, kHead, kModel),
          draw(kModel, kHead, kModel), draw(kModel, kHead, kModel),  draw(kHead, kValues, kHead)};
}

struct Batch {
  std::vector<int> key, value, target;  // [n, L] token ids (value kValues at the query), [n]
};

Batch make_batch(std::mt19937& rng, int n) {
  Batch b{std::vector<int>(n * kLen), std::vector<int>(n * kLen), std::vector<int>(n)};
  for (int s = 0; s < n; ++s) {
    int* key = &b.key[s * kLen];
    int* value = &b.value[s * kLen];
    int keys[kKeys];  // P distinct keys: the front of a partial shuffle
    for (int i = 0; i < kKeys; ++i) keys[i] = i;
    for (int i = 0; i < kPairs; ++i) {
      std::swap(keys[i], keys[i + int(rng() % (kKeys - i))]);
      key[i] = keys[i];
      value[i] = int(rng() % kValues);
    }
    const int asked = int(rng() % kPairs);
    key[kPairs] = keys[asked];
    value[kPairs] = kValues;
    b.target[s] = value[asked];
  }
  return b;
}

View view(Mat& m) {  // [n L, cols] rows as [n, L, 1 head, cols]
  return ak::bshd(m.data(), m.rows() / kLen, kLen, 1, m.cols());
}

// A dense variant; the forward keeps the row statistic the backward needs.
template <class Spec>
struct Dense {
  Spec spec;
  bool has_stat;            // Softmax: the LSE, SoftplusL1: the row sum; Sigmoid has none
  std::vector<float> stat;  // [n, 1, L]
  Dense(Spec s, bool with_stat) : spec(s), has_stat(with_stat) {}
  ak::Options options(Index n) {
    const auto serial = ak::Options{}.with_threads(1);  // scale: the normalizer's default
    if (!has_stat) return serial;
    stat.resize(std::size_t(n * kLen));
    return serial.with_lse(stat);
  }
  void forward(View q, View k, View v, View o) {
    ak::attention(spec, q, k, v, o, options(q.batch));
  }
  void backward(View q, View k, View v, View o, View d_o, View dq, View dk, View dv) {
    ak::attention_backward(spec, q, k, v, o, d_o, dq, dk, dv, options(q.batch));
  }
};

struct Linear {  // causal, normalized, phi = elu + 1, scale 1
  ak::LinearSpec<ak::EluPlusOne> spec = ak::linear_spec(ak::EluPlusOne{});
  ak::Options options = ak::Options{}.with_threads(1);
  void forward(View q, View k, View v, View o) { ak::linear_attention(spec, q, k, v, o, options); }
  void backward(View q, View k, View v, View, View d_o, View dq, View dk, View dv) {
    ak::linear_attention_backward(spec, q, k, v, d_o, dq, dk, dv, options);
  }
};

struct Acts {
  Mat x, q, k, v, o, logits;  // [n L, dm], [n L, D] x4, [n, V]
};

// The batch's mean cross-entropy (and how many answers are right); keeps the activations.
template <class Attn>
double forward(const Params& p, Attn& attn, const Batch& b, Acts& a, int* correct = nullptr) {
  const int n = int(b.target.size());
  a.x.resize(n * kLen, kModel);
  for (int r = 0; r < n * kLen; ++r) a.x.row(r) = p[kEKey].row(b.key[r]) + p[kEVal].row(b.value[r]);
  a.q = a.x * p[kWq];
  a.k = a.x * p[kWk];
  a.v = a.x * p[kWv];
  a.o.resize(n * kLen, kHead);
  attn.forward(view(a.q), view(a.k), view(a.v), view(a.o));
  a.logits.resize(n, kValues);
  double loss = 0;
  for (int s = 0; s < n; ++s) {
    a.logits.row(s) = a.o.row(s * kLen + kPairs) * p[kWo];
    Index best;
    const double top = a.logits.row(s).maxCoeff(&best);
    const double sum = (a.logits.row(s).cast<double>().array() - top).exp().sum();
    loss += top + std::log(sum) - double(a.logits(s, b.target[s]));
    if (correct) *correct += best == b.target[s];
  }
  return loss / n;
}

// d(loss)/d(every parameter), from forward()'s activations.
template <class Attn>
Params backward(const Params& p, Attn& attn, const Batch& b, Acts& a) {
  const int n = int(b.target.size());
  Params g = zeros_like(p);
  Mat d_logits = a.logits, o_last(n, kHead);  // [n, V]: (softmax - one hot) / n; [n, D]
  for (int s = 0; s < n; ++s) {
    auto row = d_logits.row(s).array();
    row = (row - row.maxCoeff()).exp();
    row /= row.sum() * float(n);
    d_logits(s, b.target[s]) -= 1.f / float(n);
    o_last.row(s) = a.o.row(s * kLen + kPairs);
  }
  g[kWo] = o_last.transpose() * d_logits;
  const Mat d_last = d_logits * p[kWo].transpose();  // [n, D]
  Mat d_o = Mat::Zero(n * kLen, kHead);              // [n L, D]: only the last positions
  for (int s = 0; s < n; ++s) d_o.row(s * kLen + kPairs) = d_last.row(s);
  Mat dq(n * kLen, kHead), dk(n * kLen, kHead), dv(n * kLen, kHead);  // [n L, D]
  attn.backward(view(a.q), view(a.k), view(a.v), view(a.o), view(d_o), view(dq), view(dk),
                view(dv));
  g[kWq] = a.x.transpose() * dq;
  g[kWk] = a.x.transpose() * dk;
  g[kWv] = a.x.transpose() * dv;
  const Mat dx = dq * p[kWq].transpose() + dk * p[kWk].transpose() + dv * p[kWv].transpose();
  for (int r = 0; r < n * kLen; ++r) {
    g[kEKey].row(b.key[r]) += dx.row(r);
    g[kEVal].row(b.value[r]) += dx.row(r);
  }
  return g;
}

// The gradient g against central differences d of the whole model's loss, at 4 random
// entries of each matrix: the worst |d - g| / max(|d| + |g|, 1e-4).
template <class Attn>
double gradient_check(Params p, Attn& attn, const Batch& b, const Params& g) {
  std::mt19937 rng(5);
  Acts a;
  double worst = 0;
  std::printf("  gradient check, worst relative error:");
  for (int m = 0; m < kMats; ++m) {
    double worst_here = 0;
    for (int trial = 0; trial < 4; ++trial) {
      const Index i = Index(rng() % unsigned(p[m].size()));
      const float saved = p[m].data()[i], h = 1e-2f;
      p[m].data()[i] = saved + h;
      const double up = forward(p, attn, b, a);
      p[m].data()[i] = saved - h;
      const double down = forward(p, attn, b, a);
      p[m].data()[i] = saved;
      const double d = (up - down) / (2 * double(h)), exact = g[m].data()[i];
      worst_here =
          std::max(worst_here, std::abs(d - exact) / std::max(std::abs(d) + std::abs(exact), 1e-4));
    }
    std::printf(" %s %.0e", kNames[m], worst_here);
    worst = std::max(worst, worst_here);
  }
  std::printf("\n");
  return worst;
}

void adam_step(Params& p, const Params& g, Params& m, Params& v, int t, float lr) {
  const float b1 = 0.9f, b2 = 0.999f;
  const float c1 = 1.f - std::pow(b1, float(t)), c2 = 1.f - std::pow(b2, float(t));
  for (int i = 0; i < kMats; ++i) {
    m[i] = b1 * m[i] + (1.f - b1) * g[i];
    v[i] = b2 * v[i] + (1.f - b2) * g[i].cwiseProduct(g[i]);
    p[i].array() -= lr * (m[i].array() / c1) / ((v[i].array() / c2).sqrt() + 1e-8f);
  }
}

struct Range {
  double lo, hi;
  bool has(double x) const { return lo <= x && x <= hi; }
};

// Trains one variant from the same seed; true when every check holds.
template <class Attn>
bool train(const char* name, Attn attn, Range loss_range, Range accuracy_range) {
  std::printf("\n%s\n", name);
  std::mt19937 rng(2024);
  Params p = init_params(rng), m = zeros_like(p), v = zeros_like(p);
  Acts a;
  double running = 0, grad_error = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const Batch b = make_batch(rng, kBatch);
    running += forward(p, attn, b, a);
    const Params g = backward(p, attn, b, a);
    if (step == 1) grad_error = gradient_check(p, attn, b, g);
    adam_step(p, g, m, v, step, 1e-2f);
    if (step % kPrintEvery == 0) {
      std::printf("  step %4d  loss %.3f\n", step, running / kPrintEvery);
      running = 0;
    }
  }
  std::mt19937 test_rng(99);  // held-out sequences, the same for every variant
  int correct = 0;
  const double loss = forward(p, attn, make_batch(test_rng, 1000), a, &correct);
  const double accuracy = correct / 1000.0;
  const bool ok = grad_error < 1e-2 && loss_range.has(loss) && accuracy_range.has(accuracy);
  std::printf("  test loss %.3g in [%g, %g], accuracy %.3f in [%g, %g]: %s\n", loss, loss_range.lo,
              loss_range.hi, accuracy, accuracy_range.lo, accuracy_range.hi, ok ? "ok" : "FAIL");
  return ok;
}

}  // namespace

int main() {
  Eigen::setNbThreads(1);
  using ak::Causal, ak::make_spec;
  // Bounds: what the runs reach, with margin for other seeds too (seeds 1 to 6 at worst:
  // softmax loss 0.006, accuracy 0.997; linear 0.61, 0.71). Chance: ln 16 = 2.77 and 1/16.
  bool pass = train("softmax", Dense(make_spec(Causal{}), true), {0, 0.05}, {0.98, 1});
  pass &= train("sigmoid", Dense(make_spec(Causal{}, ak::Sigmoid{}), false), {0, 0.05}, {0.98, 1});
  pass &= train("softplus_l1 (LSSA)", Dense(make_spec(Causal{}, ak::SoftplusL1{}), true), {0, 0.05},
                {0.98, 1});
  pass &= train("linear (elu + 1)", Linear{}, {0, 0.8}, {0.6, 1});
  // The control, no attention: each position sees only itself (o = v).
  pass &= train("self only (no attention)",
                Dense(make_spec(Causal{} & ak::SlidingWindow{0, 0}), true), {2.6, 1e9}, {0, 0.12});
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
