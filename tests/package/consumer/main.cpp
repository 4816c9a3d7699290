// The consumer of tests/package: what a user writes after find_package(attnkit) or
// add_subdirectory(attnkit). It is built with a strict warning set and -Werror, so it
// instantiates widely to make warnings inside attnkit's templates fire: f32, bf16 and f16
// storage, f32 and f16 output, Full/Causal x Dot/Softcap, GQA, Dv != D and an LSE output,
// each through the fast kernel and the reference (four storage mixes: each a kernel
// instantiation, compiled twice by the package tests). Exits non-zero when they disagree.
#include <Eigen/Core>  // Eigen::bfloat16, Eigen::half
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;

namespace {

// Sizes: ragged lengths (no multiple of any tile), Lq != Lk, GQA (2 query heads per KV
// head) and Dv != D with Dv not a whole number of SIMD vectors.
constexpr ak::Index kB = 2, kLq = 37, kLk = 45, kHq = 4, kHkv = 2, kD = 32, kDv = 20;

std::size_t size_of(ak::Index seq, ak::Index heads, ak::Index dim) {
  return static_cast<std::size_t>(kB * seq * heads * dim);
}

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<T> values(n);
  for (T& x : values) x = T(uniform(rng));
  return values;
}

// Runs `spec` with Q and K of storage In, V of storage V, output of type Out, through the
// kernel and the reference; true when outputs and LSE agree within `tolerance`.
template <class In, class Val, class Out, class Spec>
bool agrees(const char* name, const Spec& spec, double tolerance) {
  std::mt19937 rng(20240601);
  auto q = random_values<In>(size_of(kLq, kHq, kD), rng);
  auto k = random_values<In>(size_of(kLk, kHkv, kD), rng);
  auto v = random_values<Val>(size_of(kLk, kHkv, kDv), rng);
  std::vector<Out> o(size_of(kLq, kHq, kDv));
  std::vector<double> o_ref(o.size());
  std::vector<float> lse(static_cast<std::size_t>(kB * kHq * kLq));
  std::vector<float> lse_ref(lse.size());

  // Views over [B, L, H, D] buffers; the const ones are what a model passes for inputs.
  const auto qv = ak::bshd(static_cast<const In*>(q.data()), kB, kLq, kHq, kD);
  const auto kv = ak::bshd(static_cast<const In*>(k.data()), kB, kLk, kHkv, kD);
  const auto vv = ak::bshd(static_cast<const Val*>(v.data()), kB, kLk, kHkv, kDv);
  ak::attention(spec, qv, kv, vv, ak::bshd(o.data(), kB, kLq, kHq, kDv),
                ak::Options{}.with_lse(lse).with_threads(2));
  ak::reference::attention(spec, qv, kv, vv, ak::bshd(o_ref.data(), kB, kLq, kHq, kDv),
                           ak::Options{}.with_lse(lse_ref));

  double max_err = 0.0;
  bool finite = true;
  for (std::size_t i = 0; i < o.size(); ++i) {
    const double err = std::abs(static_cast<double>(o[i]) - o_ref[i]);
    finite = finite && std::isfinite(err);
    max_err = std::max(max_err, err);
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double err = std::abs(static_cast<double>(lse[i]) - static_cast<double>(lse_ref[i]));
    finite = finite && std::isfinite(err);
    max_err = std::max(max_err, err);
  }
  const bool ok = finite && max_err <= tolerance;
  std::printf("%-36s max abs error %.3g (tolerance %.1g)%s\n", name, max_err, tolerance,
              ok ? "" : (finite ? "  FAILED" : "  FAILED (not finite)"));
  return ok;
}

}  // namespace

int main() {
  using bf16 = Eigen::bfloat16;
  using f16 = Eigen::half;
  constexpr double kF32 = 2e-5;  // f32 output vs the f64 reference
  constexpr double kF16 = 2e-3;  // output rounded to f16 (11-bit mantissa)

  const auto full = ak::make_spec();
  const auto causal = ak::make_spec(ak::Causal{});
  const auto capped = ak::make_spec(ak::Softcap{1.f});  // a low cap, so that it bends logits
  const auto causal_capped = ak::make_spec(ak::Softcap{1.f}, ak::Causal{});

  bool ok = true;
  ok = agrees<float, float, float>("f32, Full, Dot", full, kF32) && ok;
  ok = agrees<float, bf16, float>("f32 / bf16 V, Causal, Softcap", causal_capped, kF32) && ok;
  ok = agrees<bf16, bf16, f16>("bf16 -> f16, Causal, Dot", causal, kF16) && ok;
  ok = agrees<f16, float, f16>("f16 / f32 V -> f16, Full, Softcap", capped, kF16) && ok;
  if (!ok) {
    std::printf("consumer FAILED\n");
    return 1;
  }
  std::printf("consumer OK: attnkit %d.%d.%d\n", ATTNKIT_VERSION_MAJOR, ATTNKIT_VERSION_MINOR,
              ATTNKIT_VERSION_PATCH);
  return 0;
}
