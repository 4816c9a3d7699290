// ScoreTile: the kernel tells a Score policy's apply_tile() where its tile sits. A
// position-dependent mod (an ALiBi-like linear bias written here, not a library policy)
// must then give the same result as its element rule in the reference.
#include <attnkit/kernel/attention.hpp>
#include <attnkit/mask/causal.hpp>
#include <attnkit/reference/attention.hpp>
#include <attnkit/score/faces.hpp>
#include <catch2/catch_test_macros.hpp>

#include "support/attnkit_test.hpp"
#include "support/test_names.hpp"

namespace {

// s -> s - slope_h * (i - j): a different bias per head, query and key.
struct LinearBias {
  using slot = ak::ScoreSlot;

  double slope(Index h) const { return 0.05 * double(h + 1); }

  double modify(double s, Index /*b*/, Index h, Index i, Index j) const {
    return s - slope(h) * double(i - j);
  }

  // s[key r, lane c] holds the logit of query q_begin + c and key k_begin + r.
  void apply_tile(float* s, Index keys, Index lanes, Index ld, const ak::ScoreTile& at) const {
    for (Index r = 0; r < keys; ++r)
      for (Index c = 0; c < lanes; ++c)
        s[r * ld + c] =
            float(modify(s[r * ld + c], at.batch, at.head, at.q_begin + c, at.k_begin + r));
  }
};

}  // namespace

TEST_CASE("ScoreTile: a position-dependent score mod sees the right (b, h, i, j)",
          "[score_tile][attention]") {
  // Several query and key tiles, GQA, an offset, and a batch of 2: every field matters.
  const Index B = 2, Hq = 4, Hkv = 2, Lq = 130, Lk = 600, D = 32;
  Tensor<float> q(Layout::Bshd, B, Hq, Lq, D), k(Layout::Bshd, B, Hkv, Lk, D),
      v(Layout::Bshd, B, Hkv, Lk, D), o(Layout::Bshd, B, Hq, Lq, D);
  Tensor<double> expected(Layout::Bhsd, B, Hq, Lq, D);
  q.randomize(1);
  k.randomize(2);
  v.randomize(3);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    if (causal) {
      const auto spec = ak::make_spec(LinearBias{}, ak::Causal{});
      ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view);
      ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), expected.view);
    } else {
      const auto spec = ak::make_spec(LinearBias{});
      ak::attention(spec, q.cview(), k.cview(), v.cview(), o.view);
      ak::reference::attention(spec, q.cview(), k.cview(), v.cview(), expected.view);
    }
    CHECK(ak::test::max_abs_diff(o.view, expected.view) <= ak::test::tol::kF32);
  }
}
