// README's "Prefill, decode and a KV cache" block, run: tests/readme/CMakeLists.txt cuts the
// ```cpp block into its three paragraphs, each included here as printed -- the #include
// lines, the setup (rope, spec, cache) and the lines of one step. The step runs once for a
// prompt, then once per new token; every output row must match a full recompute (the f64
// reference with Rope fused, over the whole sequence at once), and decode() must give what
// attention() gave for each decode step. A wrong query offset, or Rope in the spec as well,
// is off by far more than the bf16 tolerance.
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "readme_kv_includes.inc"
#include "support/attnkit_test.hpp"

namespace ak = attnkit;
using ak::Index;

namespace {

// Rows [start, start + n) of the BSHD view x, copied into a BSHD buffer [B, n, H, D].
std::vector<float> tokens(const ak::View<float>& x, Index start, Index n) {
  std::vector<float> out(static_cast<std::size_t>(x.batch * n * x.heads * x.dim));
  for (Index b = 0; b < x.batch; ++b)
    for (Index s = 0; s < n; ++s)
      for (Index h = 0; h < x.heads; ++h)
        std::copy_n(x.row(b, h, start + s), x.dim,
                    out.data() + ((b * n + s) * x.heads + h) * x.dim);
  return out;
}

}  // namespace

int main() {
  // GQA, a batch of two, a prompt that is not a multiple of any tile, then six tokens.
  const Index B = 2, Hq = 8, Hkv = 2, D = 64, prompt = 100, max_len = prompt + 6;
  std::vector<float> q_all(static_cast<std::size_t>(B * max_len * Hq * D)),
      k_all(static_cast<std::size_t>(B * max_len * Hkv * D)), v_all(k_all.size());
  float t = 0;  // deterministic projections in [-1, 1]
  for (auto* buf : {&q_all, &k_all, &v_all})
    for (float& x : *buf) x = std::sin(t += 0.37f);
  const auto Q = ak::bshd(q_all.data(), B, max_len, Hq, D);
  const auto K = ak::bshd(k_all.data(), B, max_len, Hkv, D);
  const auto V = ak::bshd(v_all.data(), B, max_len, Hkv, D);
  std::vector<float> got(q_all.size());  // the cached outputs, [B, max_len, Hq, D]
  const auto got_view = ak::bshd(got.data(), B, max_len, Hq, D);

#include "readme_kv_setup.inc"

  double decode_diff = 0;  // |decode() - attention()| over the decode steps
  for (Index start = 0, n = prompt; start < max_len; start += n, n = 1) {
    std::vector<float> q_buf = tokens(Q, start, n), k_buf = tokens(K, start, n),
                       v_buf = tokens(V, start, n), o_buf(q_buf.size()), o2_buf(q_buf.size());
    const auto q = ak::bshd(q_buf.data(), B, n, Hq, D);
    const auto k = ak::bshd(k_buf.data(), B, n, Hkv, D);
    const auto v = ak::bshd(v_buf.data(), B, n, Hkv, D);
    const auto o = ak::bshd(o_buf.data(), B, n, Hq, D);
#include "readme_kv_step.inc"
    if (n == 1) {
      ak::decode(spec, q, cache.keys(), cache.values(), ak::bshd(o2_buf.data(), B, n, Hq, D));
      for (std::size_t i = 0; i < o_buf.size(); ++i)
        decode_diff = std::max(decode_diff, static_cast<double>(std::abs(o_buf[i] - o2_buf[i])));
    }
    for (Index b = 0; b < B; ++b)
      for (Index s = 0; s < n; ++s)
        for (Index h = 0; h < Hq; ++h)
          std::copy_n(o.row(b, h, s), D, got_view.row(b, h, start + s));
  }

  std::vector<double> want(got.size());
  ak::reference::attention(ak::make_spec(ak::Causal{}, rope), Q, K, V,
                           ak::bshd(want.data(), B, max_len, Hq, D));
  double worst = 0;
  bool ok = cache.length() == max_len && decode_diff <= ak::test::tol::kF32;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, diff);
    ok = ok && diff <= ak::test::tol::kBf16;  // K and V are stored as bf16
  }
  std::printf(
      "cache length %ld; max |cached - recompute| = %.3g; max |decode - attention| = %.3g\n",
      static_cast<long>(cache.length()), worst, decode_diff);
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
