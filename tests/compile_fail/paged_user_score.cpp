// Must NOT compile: attention_paged() with a user's Score that modifies the logits and does not
// say whether it reads positions. Each page run sees page-local key indices, so a Score that
// reads (i, j) would see wrong ones; a Score without kReadsPositions is taken to read them
// (score/faces.hpp, reads_positions()). The test "paged: a user Score that may read positions
// does not compile" builds this file and passes only if the compiler says "reads positions".
// Built with ATTNKIT_COMPILE_FAIL_CONTROL, the same Score saying kReadsPositions = false must
// compile, which shows the failure comes from that check.
#include <attnkit/cache/attention_paged.hpp>
#include <attnkit/cache/paged_kv.hpp>
#include <attnkit/core/tensor.hpp>
#include <attnkit/spec.hpp>
#include <vector>

namespace ak = attnkit;

struct UserScore {
  using slot = ak::ScoreSlot;
#ifdef ATTNKIT_COMPILE_FAIL_CONTROL
  static constexpr bool kReadsPositions = false;
#endif
  double modify(double s, ak::Index, ak::Index, ak::Index, ak::Index) const { return 0.5 * s; }
  void apply_tile(float* s, ak::Index keys, ak::Index lanes, ak::Index ld,
                  const ak::ScoreTile&) const {
    for (ak::Index j = 0; j < keys; ++j)
      for (ak::Index c = 0; c < lanes; ++c) s[j * ld + c] *= 0.5f;
  }
};

int main() {
  std::vector<float> q(8), o(8);
  ak::PagedKv<float> pool(1, 1, 16, 8);
  ak::attention_paged(ak::make_spec(UserScore{}),
                      ak::View<const float>(ak::bhsd(q.data(), 1, 1, 1, 8)), pool,
                      ak::bhsd(o.data(), 1, 1, 1, 8));
  return 0;
}
