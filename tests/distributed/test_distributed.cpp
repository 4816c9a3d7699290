// The distributed component (attnkit/distributed/), run by CTest under mpirun with 2 and 3 ranks
// (tests/dist/CMakeLists.txt). Every rank runs every case on its own part of inputs all ranks
// draw alike. ring_attention() (dist/ring_attention.hpp, its ring in dist/ring_steps.hpp): the
// ranks' output rows and row statistics, gathered, against the f64 reference of the whole
// sequence (reference_check.hpp's agreement) for masks, normalizers (LSSAR in two rounds), a
// Position, GQA, both layouts and lengths that do not divide into the ranks; bitwise the same from
// run to run and for 1 or 2 threads. ring_attention_backward() (dist/ring_backward.hpp): the
// gathered gradients against the f64 reference backward of the whole sequence (Rope too), bitwise
// the same from run to run. dist::linear_attention() (dist/linear_attention.hpp): bitwise the
// single process's outputs and final state when the runs are whole chunks, close otherwise.
// sharded_decode() (dist/sharded_decode.hpp): each rank's merged result against the
// reference, the same bits on every rank. Bad input on one rank is the same Error on every
// rank, not a hang; so are ranks that disagree on a field the call depends on (a policy by
// its tag, a storage type, a size, kv_len, the layout, the linear spec), each such case under
// a 60 s watchdog (a hang fails fast). A rank with an empty shard returns normally. Also the
// layout helpers (dist/layout.hpp) and the collective checks (dist/collective.hpp).
// Comparisons use CHECK, never REQUIRE: a rank that left a case early would leave the others
// waiting.
#include <mpi.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>  // first: see simd.hpp on GCC 12 and <immintrin.h>
// clang-format off: Eigen's types after attnkit.hpp (above)
#include <Eigen/Core>
// clang-format on
#include <attnkit/distributed/linear_attention.hpp>
#include <attnkit/distributed/ring_attention.hpp>
#include <attnkit/distributed/ring_backward.hpp>
#include <attnkit/distributed/sharded_decode.hpp>
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catalogue.hpp"
#include "support/error_checks.hpp"
#include "support/reference_check.hpp"
#include "support/test_names.hpp"

namespace dist = attnkit::dist;

namespace {

int my_rank() { return dist::rank_of(MPI_COMM_WORLD); }
int ranks() { return dist::size_of(MPI_COMM_WORLD); }

// x = the element-wise sum of every rank's x (each rank fills only its own rows, zeros
// elsewhere: the gather of disjoint rows).
void sum_over_ranks(std::vector<float>& x) {
  std::vector<float> total(x.size());
  MPI_Allreduce(x.data(), total.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  x = total;
}

// The call of agreement(): this rank's shard of `in` through ring_attention(), every rank's
// rows of o and of the row statistic gathered. Returns this rank's own output bytes (for the
// repeatability checks) through `mine` when given.
template <class Spec, class Inputs>
auto ring_on(const Spec& spec, const Case& c, const Inputs& in, dist::Layout layout,
             std::vector<float>* mine = nullptr) {
  return [&spec, &c, &in, layout, mine](const ak::View<float>& o, const ak::Options& options) {
    const int rank = my_rank(), p = ranks();
    const Index n = dist::shard_length(layout, c.q_len, rank, p), dv = c.dv();
    std::vector<float> q(static_cast<std::size_t>(c.batch * c.q_heads * n * c.dim));
    std::vector<float> k(static_cast<std::size_t>(c.batch * c.kv_heads * n * c.dim));
    std::vector<float> v(static_cast<std::size_t>(c.batch * c.kv_heads * n * dv));
    std::vector<float> out(static_cast<std::size_t>(c.batch * c.q_heads * n * dv));
    std::vector<float> lse(static_cast<std::size_t>(c.batch * c.q_heads * n));
    const auto shard = [&](auto& data, Index heads, Index dim) {
      return ak::bhsd(data.data(), c.batch, heads, n, dim);
    };
    dist::shard_rows(in.q.cview(), layout, rank, p, shard(q, c.q_heads, c.dim));
    dist::shard_rows(in.k.cview(), layout, rank, p, shard(k, c.kv_heads, c.dim));
    dist::shard_rows(in.v.cview(), layout, rank, p, shard(v, c.kv_heads, dv));
    ak::Options local = ak::Options{}.with_threads(options.threads);
    local.scale = options.scale;
    if (!options.lse.empty()) local.lse = lse;
    const auto cshard = [&](const std::vector<float>& data, Index heads, Index dim) {
      return ak::bhsd(data.data(), c.batch, heads, n, dim);
    };
    dist::ring_attention(
        MPI_COMM_WORLD, spec, cshard(q, c.q_heads, c.dim), cshard(k, c.kv_heads, c.dim),
        cshard(v, c.kv_heads, dv), shard(out, c.q_heads, dv),
        dist::RingOptions{}.with_layout(layout).with_seq_len(c.q_len).with_attention(local));
    if (mine != nullptr) *mine = out;
    std::vector<float> all_out(static_cast<std::size_t>(c.rows() * dv), 0.f);
    std::vector<float> all_lse(static_cast<std::size_t>(c.rows()), 0.f);
    dist::unshard_rows(cshard(out, c.q_heads, dv), layout, rank, p,
                       ak::bhsd(all_out.data(), c.batch, c.q_heads, c.q_len, dv));
    dist::unshard_rows(ak::bhsd(static_cast<const float*>(lse.data()), c.batch, c.q_heads, n, 1),
                       layout, rank, p, ak::bhsd(all_lse.data(), c.batch, c.q_heads, c.q_len, 1));
    sum_over_ranks(all_out);
    sum_over_ranks(all_lse);
    for (Index b = 0; b < c.batch; ++b)
      for (Index h = 0; h < c.q_heads; ++h)
        for (Index r = 0; r < c.q_len; ++r)
          std::memcpy(o.row(b, h, r), all_out.data() + ((b * c.q_heads + h) * c.q_len + r) * dv,
                      static_cast<std::size_t>(dv) * sizeof(float));
    if (!options.lse.empty()) std::copy(all_lse.begin(), all_lse.end(), options.lse.data());
  };
}

// The specs of the agreement cases (4 query heads): every mask kind with Softmax (dense,
// causal, sinks and a window with Softcap, a power-of-two pattern), every one-round normalizer
// of the catalogue under Causal, and Rope (where the call takes a Position). Each spec is a
// kernel instantiation: the lists stay short.
template <bool kWithRope = true, class Visit>
void for_each_spec(Visit&& visit) {
  visit("Softmax, Full", ak::make_spec(ak::Softmax{}));
  visit("Softmax, Causal & (Sinks{3} | SlidingWindow{9, 0}), Softcap{8}",
        ak::make_spec(Causal{} & (Sinks{3} | SlidingWindow{9, 0}), ak::Softcap{8.f}));
  visit("Softmax, PowerOfTwo{2, 4}", ak::make_spec(ak::PowerOfTwo{2, 4}));
  ak::test::for_each_spec<ak::test::OnePass>(4, ak::test::Breadth::Kinds, visit,
                                             ak::test::under("Causal", Causal{}));
  if constexpr (kWithRope)
    visit("Softmax, Causal, Rope",
          ak::make_spec(Causal{}, ak::Rope(ak::RopeTable(32, 10000, 256))));
}

// A disagreement that hangs must fail the suite quickly, not at CTest's timeout: while a
// Watchdog lives, a call that has not returned within 60 s ends this process (and mpirun the
// others) with a message naming it.
class Watchdog {
 public:
  explicit Watchdog(std::string what) : what_(std::move(what)), rank_(my_rank()) {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!done_cv_.wait_for(lock, std::chrono::seconds(60), [this] { return done_; })) {
        std::fprintf(stderr, "test_distributed: rank %d: %s did not return within 60 s (a hang)\n",
                     rank_, what_.c_str());
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~Watchdog() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::string what_;
  int rank_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// Runs `call` (a collective call whose arguments differ by rank) under a Watchdog and CHECKs
// that it throws an attnkit::Error on every rank, the same message on every rank, naming
// `field` (e.g. "ring_attention(): the spec's normalizer"; a rank's own check adds "rank R of
// P: " before it).
void check_same_error(const std::string& name, const std::function<void()>& call,
                      const std::string& field) {
  std::string message = "no Error";
  {
    const Watchdog watchdog(name);
    try {
      call();
    } catch (const ak::Error& e) {
      message = e.what();
    }
  }
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string first(static_cast<std::size_t>(length), ' ');
  if (my_rank() == 0) first = message;
  MPI_Bcast(first.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  INFO(name << ", rank " << my_rank() << " of " << ranks() << ": " << message);
  CHECK(message.find("attnkit: ") == 0);
  CHECK(message.find(field) != std::string::npos);
  CHECK(message == first);
}

// ring_attention() of a small case -- one batch, 2 heads, D 16, L = len -- with this rank's
// spec, K storage KT and layout (rows sized by `sized`, a valid layout): the calls of the
// disagreement and empty-shard cases. Returns this rank's output rows and row statistic.
template <class KT = float, class Spec>
std::vector<float> small_ring(const Spec& spec, Index len = 12,
                              dist::Layout layout = dist::Layout::Zigzag,
                              dist::Layout sized = dist::Layout::Zigzag) {
  const Index n = dist::shard_length(sized, len, my_rank(), ranks()), d = 16;
  const auto rows = [&](Index count) { return static_cast<std::size_t>(2 * count * d); };
  const auto q = ak::test::random_values<float>(rows(n), 7u + static_cast<unsigned>(my_rank()));
  const std::vector<KT> k(rows(n), KT(0.5f));
  std::vector<float> out(rows(n) + static_cast<std::size_t>(2 * n), -1.f);
  const auto view = [&](const auto* data) { return ak::bhsd(data, 1, 2, n, d); };
  dist::ring_attention(MPI_COMM_WORLD, spec, view(q.data()), view(k.data()), view(q.data()),
                       ak::bhsd(out.data(), 1, 2, n, d),
                       dist::RingOptions{}.with_layout(layout).with_seq_len(len).with_attention(
                           ak::Options{}.with_lse(out.data() + rows(n), 2 * n)));
  return out;
}

// run(on_first) on rank 0 and run(elsewhere) on the others: check_same_error.
template <class Run, class First, class Elsewhere>
void check_rank0_differs(const std::string& name, Run run, const First& on_first,
                         const Elsewhere& elsewhere, const std::string& field) {
  check_same_error(
      name,
      [&] {
        if (my_rank() == 0)
          run(on_first);
        else
          run(elsewhere);
      },
      field);
}

}  // namespace

TEST_CASE("shard layouts: every position on one rank, zigzag balances causal pairs",
          "[dist][layout]") {
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag})
    for (int p = 1; p <= 5; ++p)
      for (const Index len : {Index{0}, Index{1}, Index{7}, Index{60}, Index{101}}) {
        INFO(dist::layout_name(layout) << ", " << p << " ranks, L " << len);
        std::vector<int> owner(static_cast<std::size_t>(len), -1);
        bool once = true, ascending = true;
        for (int r = 0; r < p; ++r) {
          const std::vector<Index> at = dist::shard_positions(layout, len, r, p);
          CHECK(static_cast<Index>(at.size()) == dist::shard_length(layout, len, r, p));
          for (std::size_t s = 0; s < at.size(); ++s) {
            once = once && owner[static_cast<std::size_t>(at[s])] == -1;
            owner[static_cast<std::size_t>(at[s])] = r;
            ascending = ascending && (s == 0 || at[s - 1] < at[s]);
          }
        }
        CHECK(once);
        CHECK(ascending);
        CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      }
  // L a multiple of 2P: every rank of the zigzag layout has the same causal pairs (i + 1 keys
  // for query i); the contiguous layout's last rank has the most.
  for (int p = 2; p <= 4; ++p) {
    std::vector<Index> zigzag, contiguous;
    for (int r = 0; r < p; ++r) {
      Index z = 0, c = 0;
      for (Index i : dist::shard_positions(dist::Layout::Zigzag, 24 * p, r, p)) z += i + 1;
      for (Index i : dist::shard_positions(dist::Layout::Contiguous, 24 * p, r, p)) c += i + 1;
      zigzag.push_back(z);
      contiguous.push_back(c);
    }
    CHECK(std::adjacent_find(zigzag.begin(), zigzag.end(), std::not_equal_to<>()) == zigzag.end());
    CHECK(contiguous.back() > contiguous.front());
  }
  ak::test::check_error([] { dist::shard_ranges(dist::Layout::Zigzag, 10, 3, 3); },
                        {"shard_ranges(): rank", "in [0, 3)", "got 3"});
  ak::test::check_error([] { dist::shard_ranges(dist::Layout::Zigzag, 10, 0, 0); },
                        {"shard_ranges(): ranks", ">= 1", "got 0"});
  ak::test::check_error([] { dist::shard_ranges(dist::Layout::Contiguous, -1, 0, 1); },
                        {"shard_ranges(): len", ">= 0", "got -1"});
  // V2: a value that is no enumerator is refused, not sharded as Zigzag.
  ak::test::check_error(
      [] { dist::shard_ranges(static_cast<dist::Layout>(5), 10, 0, 2); },
      {"shard_ranges(): layout", "Layout::Contiguous or Layout::Zigzag", "got Layout(5)"});
  CHECK(std::string(dist::layout_name(static_cast<dist::Layout>(5))) == "not a Layout");
  // A shard of the wrong shape is refused before anything is copied.
  std::vector<float> full(2 * 10 * 4, 1.f), part(2 * 4 * 4, 0.f);
  ak::test::check_refused(
      [&] {
        dist::shard_rows(ak::bhsd(static_cast<const float*>(full.data()), 1, 2, 10, 4),
                         dist::Layout::Zigzag, 0, 2, ak::bhsd(part.data(), 1, 2, 4, 4));
      },
      {"shard_rows(): shard", "[1, 2, 5, 4]", "[1, 2, 4, 4]"}, {&part}, 0.f);
  // shard_rows then unshard_rows of every rank gives the sequence back.
  std::vector<float> back(full.size(), 0.f);
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  for (int r = 0; r < 3; ++r) {
    const Index n = dist::shard_length(dist::Layout::Zigzag, 10, r, 3);
    std::vector<float> shard(static_cast<std::size_t>(2 * n * 4));
    dist::shard_rows(ak::bhsd(static_cast<const float*>(full.data()), 1, 2, 10, 4),
                     dist::Layout::Zigzag, r, 3, ak::bhsd(shard.data(), 1, 2, n, 4));
    dist::unshard_rows(ak::bhsd(static_cast<const float*>(shard.data()), 1, 2, n, 4),
                       dist::Layout::Zigzag, r, 3, ak::bhsd(back.data(), 1, 2, 10, 4));
  }
  CHECK(back == full);
}

TEST_CASE("policy tags: equal policies agree, a parameter or a type that differs does not",
          "[dist][agreement]") {
  using ak::detail::policy_tag, ak::detail::type_tag;
  const auto differ = [](const auto& a, const auto& b) { return policy_tag(a) != policy_tag(b); };
  const auto same = [](const auto& a) {
    const auto copy = a;
    return policy_tag(a) == policy_tag(copy);
  };
  CHECK(same(ak::Causal{} & ak::SlidingWindow{4, 0}));
  CHECK(differ(ak::SlidingWindow{4, 0}, ak::SlidingWindow{5, 0}));
  CHECK(differ(ak::Causal{} & ak::SlidingWindow{4, 0}, ak::Causal{} & ak::SlidingWindow{4, 1}));
  CHECK(differ(ak::Causal{} & ak::Sinks{2}, ak::Causal{} | ak::Sinks{2}));
  CHECK(differ(ak::Causal{}, ak::Full{}));
  CHECK(differ(ak::Chunked{4}, ak::Chunked{8}));
  CHECK(differ(ak::PowerOfTwo{2, 4}, ak::PowerOfTwo{2, 8}));
  CHECK(differ(ak::Softcap{8.f}, ak::Softcap{9.f}));
  CHECK(differ(ak::Softmax{}, ak::Softmax::with_sinks({0.f})));
  CHECK(differ(ak::Softmax::with_sinks({0.f}), ak::Softmax::with_sinks({1.f})));
  CHECK(differ(ak::Sigmoid{}, ak::Sigmoid{-1.f}));
  CHECK(differ(ak::ReluPower{1.5f, 0.3f}, ak::ReluPower{2.f, 0.3f}));
  CHECK(differ(ak::SoftplusL1Reweighted{15.f}, ak::SoftplusL1Reweighted{3.f}));
  CHECK(differ(ak::Softmax{}, ak::SoftplusL1Reweighted{}));
  // SoftplusL1's key counts are given for a rank's own rows: not part of its identity.
  CHECK(policy_tag(ak::SoftplusL1{}) == policy_tag(ak::SoftplusL1::with_key_counts({3.f})));
  CHECK(same(ak::Rope(ak::RopeTable(16, 10000, 64))));
  CHECK(differ(ak::Rope(ak::RopeTable(16, 10000, 64)), ak::Rope(ak::RopeTable(16, 500000, 64))));
  ak::FopeConfig fope;
  fope.head_dim = 8;
  fope.max_len = 16;
  CHECK(differ(ak::Fope::drawn(fope, 0.3, 1), ak::Fope::drawn(fope, 0.3, 2)));
  ak::BlockMaskLayout layout;
  layout.q_len = layout.kv_len = 4;
  layout.block_q = layout.block_k = 2;
  const ak::BlockMask<> diagonal(layout, ak::BlockList{{0, 1, 2}, {0, 1}},
                                 ak::BlockList{{0, 0, 0}, {}});
  const ak::BlockMask<> first_column(layout, ak::BlockList{{0, 1, 2}, {0, 0}},
                                     ak::BlockList{{0, 0, 0}, {}});
  CHECK(same(diagonal));
  CHECK(differ(diagonal, first_column));
  const auto linear = ak::linear_spec(ak::EluPlusOne{});
  CHECK(same(linear));
  CHECK(differ(linear, linear.with_decay({0.9f})));
  CHECK(differ(linear, linear.with_normalize(true, 1e-5f)));
  CHECK(differ(linear, ak::linear_spec(ak::Relu{})));
  CHECK(type_tag<Eigen::bfloat16>() != type_tag<Eigen::half>());
  CHECK(type_tag<const float>() == type_tag<float>());
  CHECK(type_tag<ak::BlockQ8_0>() != type_tag<ak::BlockQ4_0>());
}

TEST_CASE("ring_attention equals attention over the whole sequence (f64 reference)",
          "[dist][ring]") {
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag})
    for (const Index len : {Index{37}, Index{64}}) {
      const Case c = Case{}.lengths(len, len).heads(4, 2).dims(32, 16).batches(2).at_offset(0);
      const ak::test::Inputs<float> in(c, 5);
      const auto check = [&](const std::string& name, const auto& spec,
                             const ak::test::Tolerance& t = {}) {
        INFO(name << ", " << dist::layout_name(layout) << ", " << ranks() << " ranks, "
                  << ak::test::describe(c));
        ak::test::check_agreement(
            ak::test::agreement(spec, c, in, ring_on(spec, c, in, layout), t));
      };
      for_each_spec([&](const std::string& name, const auto& spec) { check(name, spec); });
      // LSSAR through its two rounds (two trips around the ring), with the two-round form's
      // tolerance of the split-KV test (test_merge_softplus.cpp): each round's rounding.
      ak::test::Tolerance two_rounds;
      two_rounds.out = 4 * tol::kF32;
      two_rounds.lse = 4 * tol::kLseF32;
      check("SoftplusL1Reweighted (LSSAR), Causal",
            ak::make_spec(ak::Causal{}, ak::SoftplusL1Reweighted{}), two_rounds);
    }
}

TEST_CASE("ring_attention is bitwise the same from run to run and for 1 or 2 threads",
          "[dist][ring]") {
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag}) {
    const ak::test::Inputs<float> in(Case{}.lengths(50, 50).heads(4, 4).dims(64).at_offset(0), 8);
    const auto spec = ak::make_spec(ak::Causal{});
    std::vector<std::vector<float>> runs;
    for (const int threads : {2, 2, 1}) {
      const Case c = Case{}.lengths(50, 50).heads(4, 4).dims(64).at_offset(0).on_threads(threads);
      std::vector<float> mine;
      ak::test::check_agreement(
          ak::test::agreement(spec, c, in, ring_on(spec, c, in, layout, &mine)));
      runs.push_back(mine);
    }
    INFO(dist::layout_name(layout));
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);
  }
}

TEST_CASE("ring_attention: bad input on one rank is the same Error on every rank",
          "[dist][ring][errors]") {
  const int rank = my_rank(), p = ranks();
  const Index len = 30, n = dist::shard_length(dist::Layout::Zigzag, len, rank, p);
  std::vector<float> q(static_cast<std::size_t>(4 * (n + 1) * 32), 0.5f), o(q.size());
  const auto view = [&](std::vector<float>& x, Index heads, Index seq) {
    return ak::bhsd(x.data(), 1, heads, seq, 32);
  };
  const auto spec = ak::make_spec(ak::Causal{});
  const auto options = dist::RingOptions{}.with_seq_len(len);
  const auto message_of = [](auto&& call) {
    try {
      call();
    } catch (const ak::Error& e) {
      return std::string(e.what());
    }
    return std::string("no Error");
  };
  // The last rank's key shard is one row too long: every rank names it.
  const Index k_rows = rank == p - 1 ? n + 1 : n;
  const std::string wrong_length = message_of([&] {
    dist::ring_attention(MPI_COMM_WORLD, spec, view(q, 2, n), view(q, 2, k_rows),
                         view(q, 2, k_rows), view(o, 2, n), options);
  });
  INFO(wrong_length);
  CHECK(wrong_length.find("attnkit: rank " + std::to_string(p - 1) + " of " + std::to_string(p) +
                          ": ring_attention(): q.seq and k.seq") == 0);
  CHECK(wrong_length.find("shard length " + std::to_string(dist::shard_length(dist::Layout::Zigzag,
                                                                              len, p - 1, p))) !=
        std::string::npos);
  // Each rank's call is sound alone, but rank 0 has 4 query heads and the others 2.
  const Index heads = rank == 0 ? 4 : 2;
  const std::string disagree = message_of([&] {
    dist::ring_attention(MPI_COMM_WORLD, spec, view(q, heads, n), view(q, 2, n), view(q, 2, n),
                         view(o, heads, n), options);
  });
  INFO(disagree);
  if (p > 1)
    CHECK(disagree ==
          "attnkit: ring_attention(): q.heads: expected the same value on every rank, got values "
          "from 2 to 4 across ranks");
  else
    CHECK(disagree == "no Error");
}

TEST_CASE(
    "ring_attention: ranks that disagree on the spec, the storage or the layout are one "
    "Error on every rank, before the ring",
    "[dist][ring][errors][agreement]") {
  const bool first = my_rank() == 0;
  using ak::Full;
  // H2: LSSAR goes round the ring twice, Softmax once (rank 0 waited in its second round).
  const auto ring = [](const auto& spec) { small_ring(spec); };
  check_rank0_differs("Softmax on rank 0, SoftplusL1Reweighted elsewhere", ring,
                      ak::make_spec(Causal{}), ak::make_spec(Causal{}, ak::SoftplusL1Reweighted{}),
                      "ring_attention(): the spec's normalizer");
  check_same_error(
      "Softmax sinks that differ",
      [&] {
        small_ring(ak::make_spec(Causal{}, ak::Softmax::with_sinks({first ? 0.f : 1.f, 0.f})));
      },
      "ring_attention(): the spec's normalizer");
  check_rank0_differs("Causal on rank 0, Full elsewhere", ring, ak::make_spec(Causal{}),
                      ak::make_spec(Full{}), "ring_attention(): the spec's mask");
  check_same_error(
      "SlidingWindow sizes that differ",
      [&] {
        small_ring(ak::make_spec(Causal{} & SlidingWindow{first ? 4 : 5, 0}));
      },
      "ring_attention(): the spec's mask");
  check_same_error(
      "Softcap caps that differ",
      [&] { small_ring(ak::make_spec(Causal{}, ak::Softcap{first ? 8.f : 9.f})); },
      "ring_attention(): the spec's score");
  // W5: both 2 bytes; the other rank's bytes were read as its own type.
  check_same_error(
      "K in bf16 on rank 0, f16 elsewhere",
      [&] {
        if (first)
          small_ring<Eigen::bfloat16>(ak::make_spec(Causal{}));
        else
          small_ring<Eigen::half>(ak::make_spec(Causal{}));
      },
      "ring_attention(): the storage of k");
  // V2: an invalid layout was named "Contiguous" and sharded as Zigzag.
  check_same_error(
      "Layout 5 on every rank",
      [&] { small_ring(ak::make_spec(Causal{}), 12, static_cast<dist::Layout>(5)); },
      "ring_attention(): options.layout");
  check_same_error(
      "Layout 5 on rank 0, Zigzag elsewhere",
      [&] {
        small_ring(ak::make_spec(Causal{}), 12,
                   first ? static_cast<dist::Layout>(5) : dist::Layout::Zigzag);
      },
      "ring_attention(): options.layout");
}

namespace {

// The call of agreement() for sharded_decode(): rank r holds the keys of the r-th contiguous
// run of the cache; every rank's o is the whole result. Its bytes go to `mine` when given.
template <class Spec, class Inputs>
auto sharded_on(const Spec& spec, const Case& c, const Inputs& in,
                std::vector<float>* mine = nullptr) {
  return [&spec, &c, &in, mine](const ak::View<float>& o, const ak::Options& options) {
    const ak::Range part =
        dist::shard_ranges(dist::Layout::Contiguous, c.kv_len, my_rank(), ranks()).front();
    const auto rows_of = [&](const auto& view) {
      return ak::strided(view.row(0, 0, part.begin),
                         {view.batch, view.heads, part.end - part.begin, view.dim},
                         {view.batch_stride, view.head_stride, view.seq_stride});
    };
    dist::sharded_decode(MPI_COMM_WORLD, spec, in.q.cview(), rows_of(in.k.cview()),
                         rows_of(in.v.cview()), o,
                         dist::ShardedDecodeOptions{}
                             .with_kv_len(c.kv_len)
                             .with_key_offset(part.begin)
                             .with_attention(options));
    if (mine != nullptr) {
      mine->clear();
      for (Index b = 0; b < c.batch; ++b)
        for (Index h = 0; h < c.q_heads; ++h)
          for (Index r = 0; r < c.q_len; ++r)
            mine->insert(mine->end(), o.row(b, h, r), o.row(b, h, r) + c.dv());
    }
  };
}

}  // namespace

TEST_CASE("sharded_decode equals decode over the whole cache (f64 reference), on every rank",
          "[dist][sharded_decode]") {
  for (const Index q_len : {Index{1}, Index{3}}) {
    const Case c = Case{}.lengths(q_len, 77).heads(4, 2).dims(32, 16).batches(2);
    const ak::test::Inputs<float> in(c, 21);
    for_each_spec<false>([&](const std::string& name, const auto& spec) {
      INFO(name << ", " << ranks() << " ranks, " << ak::test::describe(c));
      std::vector<float> mine;
      ak::test::check_agreement(ak::test::agreement(spec, c, in, sharded_on(spec, c, in, &mine)));
      std::vector<float> first = mine;  // rank 0's bits, on every rank
      MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      CHECK(std::memcmp(first.data(), mine.data(), mine.size() * sizeof(float)) == 0);
    });
  }
}

TEST_CASE("sharded_decode: parts that do not tile the cache are the same Error on every rank",
          "[dist][sharded_decode][errors]") {
  const int rank = my_rank(), p = ranks();
  std::vector<float> q(4 * 32, 0.5f), kv(2 * 10 * 32, 0.25f), o(4 * 32);
  const auto spec = ak::make_spec(ak::Causal{});
  const auto call = [&](Index offset, Index kv_len) {
    try {
      dist::sharded_decode(
          MPI_COMM_WORLD, spec, ak::bhsd(static_cast<const float*>(q.data()), 1, 4, 1, 32),
          ak::bhsd(static_cast<const float*>(kv.data()), 1, 2, 10, 32),
          ak::bhsd(static_cast<const float*>(kv.data()), 1, 2, 10, 32),
          ak::bhsd(o.data(), 1, 4, 1, 32),
          dist::ShardedDecodeOptions{}.with_kv_len(kv_len).with_key_offset(offset));
    } catch (const ak::Error& e) {
      return std::string(e.what());
    }
    return std::string("no Error");
  };
  // Ten keys a rank: rank r at 10 r, but the last rank one position late.
  const std::string gap = call(10 * rank + (rank == p - 1 ? 1 : 0), 10 * p + 1);
  INFO(gap);
  if (p > 1)
    CHECK(gap == "attnkit: sharded_decode(): rank " + std::to_string(p - 1) +
                     "'s key_offset: expected " + std::to_string(10 * (p - 1)) +
                     " (the parts tile [0, kv_len) in rank order), got " +
                     std::to_string(10 * (p - 1) + 1));
  const std::string short_cache = call(10 * rank, 10 * p + 5);
  INFO(short_cache);
  CHECK(short_cache == "attnkit: sharded_decode(): the ranks' keys in all: expected kv_len = " +
                           std::to_string(10 * p + 5) + ", got " + std::to_string(10 * p));
  // Rank 0's keys past kv_len: its own check, the same Error on every rank.
  const std::string past_end = call(rank == 0 ? 10 * p : 10 * rank, 10 * p);
  INFO(past_end);
  CHECK(past_end == "attnkit: rank 0 of " + std::to_string(p) +
                        ": sharded_decode(): key_offset + k.seq: expected <= kv_len = " +
                        std::to_string(10 * p) + ", got " + std::to_string(10 * p + 10));
}

TEST_CASE(
    "sharded_decode: ranks that disagree on kv_len, the head dim or the spec are one Error "
    "on every rank",
    "[dist][sharded_decode][errors][agreement]") {
  const bool first = my_rank() == 0;
  // One query row, 50 keys a rank at 50 r; this rank's kv_len, head dim (of q and k; v's is
  // 16) and spec.
  const auto call = [&](Index kv_len, Index dim, const auto& spec) {
    std::vector<float> q(static_cast<std::size_t>(4 * dim), 0.5f), o(4 * 16);
    std::vector<float> kv(static_cast<std::size_t>(2 * 50 * dim), 0.25f);
    const auto keys = ak::bhsd(static_cast<const float*>(kv.data()), 1, 2, 50, dim);
    const auto values = ak::bhsd(static_cast<const float*>(kv.data()), 1, 2, 50, 16);
    dist::sharded_decode(MPI_COMM_WORLD, spec,
                         ak::bhsd(static_cast<const float*>(q.data()), 1, 4, 1, dim), keys, values,
                         ak::bhsd(o.data(), 1, 4, 1, 16),
                         dist::ShardedDecodeOptions{}
                             .with_kv_len(kv_len)
                             .with_key_offset(50 * my_rank())
                             .with_attention(ak::Options{}.with_scale(0.125f)));
  };
  const Index whole = 50 * ranks();
  const auto causal = ak::make_spec(ak::Causal{});
  // H1: the tiling check ran against each rank's own kv_len; rank 1 threw alone.
  check_same_error(
      "kv_len 50 P on rank 0, one more elsewhere",
      [&] { call(first ? whole : whole + 1, 32, causal); }, "sharded_decode(): options.kv_len");
  // W6: the parts of unrelated problems were merged.
  check_same_error(
      "head dim 32 on rank 0, 64 elsewhere", [&] { call(whole, first ? 32 : 64, causal); },
      "sharded_decode(): q.dim");
  const auto decode = [&](const auto& spec) { call(whole, 32, spec); };
  check_rank0_differs("Softmax on rank 0, Sigmoid elsewhere", decode, causal,
                      ak::make_spec(Causal{}, ak::Sigmoid{}),
                      "sharded_decode(): the spec's normalizer");
  check_rank0_differs("Causal on rank 0, a sliding window elsewhere", decode, causal,
                      ak::make_spec(Causal{} & SlidingWindow{64, 0}),
                      "sharded_decode(): the spec's mask");
}

namespace {

// Rows of a whole-sequence view (seq = L) in this rank's shard, as a dense f32 copy.
template <class T>
std::vector<float> shard_of(const ak::View<T>& full, dist::Layout layout, Index n) {
  std::vector<float> out(static_cast<std::size_t>(full.batch * full.heads * n * full.dim));
  dist::shard_rows(full, layout, my_rank(), ranks(),
                   ak::bhsd(out.data(), full.batch, full.heads, n, full.dim));
  return out;
}

// A shard's rows [B, H, n, D] put back in a whole-sequence f32 buffer on every rank (zero
// elsewhere, then summed over the ranks: the gather of disjoint rows).
std::vector<float> gathered(const std::vector<float>& shard, dist::Layout layout, Index batch,
                            Index heads, Index len, Index dim) {
  const Index n = static_cast<Index>(shard.size()) / (batch * heads * dim);
  std::vector<float> whole(static_cast<std::size_t>(batch * heads * len * dim), 0.f);
  dist::unshard_rows(ak::bhsd(shard.data(), batch, heads, n, dim), layout, my_rank(), ranks(),
                     ak::bhsd(whole.data(), batch, heads, len, dim));
  sum_over_ranks(whole);
  return whole;
}

// ring_attention_backward() on this rank's shard of a whole-sequence case (O and its row
// statistic from the f64 reference forward), its gradients gathered, against the reference
// backward; returns this rank's own dq, dk, dv bytes for the repeatability check.
template <class Spec>
std::vector<float> check_ring_backward(const std::string& name, const Spec& spec, const Case& c,
                                       dist::Layout layout) {
  INFO(name << ", " << dist::layout_name(layout) << ", " << ranks() << " ranks, "
            << ak::test::describe(c));
  ak::test::BackwardCase<float> in(spec, c, 31);
  const Index len = c.q_len, dv = c.dv();
  const Index n = dist::shard_length(layout, len, my_rank(), ranks());
  const auto q = shard_of(in.q.cview(), layout, n), k = shard_of(in.k.cview(), layout, n);
  const auto v = shard_of(in.v.cview(), layout, n), o = shard_of(in.o.cview(), layout, n);
  const auto d_o = shard_of(in.d_o.cview(), layout, n);
  auto stat = shard_of(
      ak::bhsd(static_cast<const float*>(in.stat.data()), c.batch, c.q_heads, len, 1), layout, n);
  std::vector<float> dq(q.size()), dk(k.size()), dvv(v.size());
  const auto rows = [&](const std::vector<float>& x, Index heads, Index dim) {
    return ak::bhsd(x.data(), c.batch, heads, n, dim);
  };
  const auto out = [&](std::vector<float>& x, Index heads, Index dim) {
    return ak::bhsd(x.data(), c.batch, heads, n, dim);
  };
  ak::Options options = ak::Options{}.with_threads(c.threads);
  if (ak::detail::row_stat_kind<typename Spec::Normalizer>() != ak::RowStat::None)
    options = options.with_lse(stat);
  dist::ring_attention_backward(
      MPI_COMM_WORLD, spec, rows(q, c.q_heads, c.dim), rows(k, c.kv_heads, c.dim),
      rows(v, c.kv_heads, dv), rows(o, c.q_heads, dv), rows(d_o, c.q_heads, dv),
      out(dq, c.q_heads, c.dim), out(dk, c.kv_heads, c.dim), out(dvv, c.kv_heads, dv),
      dist::RingOptions{}.with_layout(layout).with_seq_len(len).with_attention(options));
  ak::test::Grads<double> want(c, ak::test::Layout::Bhsd);
  ak::reference::attention_backward(spec, in.q.cview(), in.k.cview(), in.v.cview(), in.o.cview(),
                                    in.d_o.cview(), want.dq.view, want.dk.view, want.dv.view,
                                    in.options_for(spec));
  const auto whole = [&](const std::vector<float>& shard, Index heads, Index dim,
                         std::vector<float>& keep) {
    keep = gathered(shard, layout, c.batch, heads, len, dim);
    return ak::bhsd(static_cast<const float*>(keep.data()), c.batch, heads, len, dim);
  };
  std::vector<float> a, b, e;
  CHECK(ak::test::relative_error(whole(dq, c.q_heads, c.dim, a), want.dq.view) <=
        ak::test::tol::kGradF32);
  CHECK(ak::test::relative_error(whole(dk, c.kv_heads, c.dim, b), want.dk.view) <=
        ak::test::tol::kGradF32);
  CHECK(ak::test::relative_error(whole(dvv, c.kv_heads, dv, e), want.dv.view) <=
        ak::test::tol::kGradF32);
  dq.insert(dq.end(), dk.begin(), dk.end());
  dq.insert(dq.end(), dvv.begin(), dvv.end());
  return dq;
}

}  // namespace

TEST_CASE("ring_attention_backward equals the f64 reference backward of the whole sequence",
          "[dist][ring][backward]") {
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag}) {
    const Case c = Case{}.lengths(45, 45).heads(4, 2).dims(32, 16).batches(2).at_offset(0);
    for_each_spec([&](const std::string& name, const auto& spec) {
      check_ring_backward(name, spec, c, layout);
    });
    // The same bits from run to run, and on 1 or 2 threads.
    const auto spec = ak::make_spec(ak::Causal{});
    const auto first = check_ring_backward("Causal, run 1", spec, c, layout);
    CHECK(first == check_ring_backward("Causal, run 2", spec, c, layout));
    CHECK(first == check_ring_backward("Causal, 1 thread", spec, Case(c).on_threads(1), layout));
  }
}

TEST_CASE(
    "ring_attention: a rank whose shard is empty returns normally, the others' rows as "
    "over the whole sequence",
    "[dist][ring][empty]") {
  // E1: L < 2P under Zigzag (L < P under Contiguous) leaves ranks without rows.
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag})
    for (const Index len : {Index{1}, Index{2}, Index{3}}) {
      const Case c = Case{}.lengths(len, len).heads(2, 2).dims(16).at_offset(0);
      const ak::test::Inputs<float> in(c, 3);
      INFO(dist::layout_name(layout) << ", L " << len << ", " << ranks() << " ranks");
      {
        const Watchdog watchdog("ring_attention, an empty shard");
        const auto spec = ak::make_spec(ak::Causal{});
        ak::test::check_agreement(ak::test::agreement(spec, c, in, ring_on(spec, c, in, layout)));
        ak::test::Tolerance two_rounds;
        two_rounds.out = 4 * tol::kF32;
        two_rounds.lse = 4 * tol::kLseF32;
        const auto lssar = ak::make_spec(ak::Causal{}, ak::SoftplusL1Reweighted{});
        ak::test::check_agreement(
            ak::test::agreement(lssar, c, in, ring_on(lssar, c, in, layout), two_rounds));
      }
      {
        // Sigmoid: at L = 1 softmax's gradients of q and k are exactly 0 (one weight, always
        // 1), which a relative error cannot compare; a sigmoid weight moves with the logit.
        const Watchdog watchdog("ring_attention_backward, an empty shard");
        check_ring_backward("Sigmoid, Causal", ak::make_spec(ak::Causal{}, ak::Sigmoid{}), c,
                            layout);
        if (len > 1) check_ring_backward("Softmax, Causal", ak::make_spec(ak::Causal{}), c, layout);
      }
    }
  // L = 0: no rank has rows; every rank returns.
  for (const dist::Layout layout : {dist::Layout::Contiguous, dist::Layout::Zigzag}) {
    const Watchdog watchdog("ring_attention, L = 0");
    bool returned = false;
    try {
      small_ring(ak::make_spec(ak::Causal{}), 0, layout, layout);
      small_ring(ak::make_spec(ak::Causal{}, ak::SoftplusL1Reweighted{}), 0, layout, layout);
      returned = true;
    } catch (const ak::Error& e) {
      FAIL_CHECK(e.what());
    }
    CHECK(returned);
  }
}

TEST_CASE("dist::linear_attention: the state handed from rank to rank is the single process's",
          "[dist][linear]") {
  const int rank = my_rank(), p = ranks();
  for (const Index len : {Index{96}, Index{100}}) {  // 96: whole 16-row chunks on 1, 2, 3 ranks
    const Index n = dist::shard_length(dist::Layout::Contiguous, len, rank, p);
    const Index first = dist::shard_ranges(dist::Layout::Contiguous, len, rank, p).front().begin;
    const auto spec =
        ak::linear_spec(ak::EluPlusOne{}).with_chunk(16).with_decay({0.9f, 1.f, 0.99f, 0.8f});
    const auto q = ak::test::random_values<float>(std::size_t(4 * len * 32), 41);
    const auto k = ak::test::random_values<float>(std::size_t(2 * len * 32), 42);
    const auto v = ak::test::random_values<float>(std::size_t(2 * len * 16), 43);
    const auto whole = [&](const std::vector<float>& x, Index heads, Index dim) {
      return ak::bhsd(x.data(), 1, heads, len, dim);
    };
    std::vector<float> want(std::size_t(4 * len * 16));
    ak::LinearState want_state = ak::make_linear_state(spec, whole(q, 4, 32), whole(v, 2, 16));
    ak::linear_attention(spec, whole(q, 4, 32), whole(k, 2, 32), whole(v, 2, 16),
                         ak::bhsd(want.data(), 1, 4, len, 16), want_state);
    // This rank's run: rows [first, first + n) of every head, in place (strided views).
    const auto run = [&](const std::vector<float>& x, Index heads, Index dim) {
      return ak::strided(x.data() + first * dim, {1, heads, n, dim},
                         {heads * len * dim, len * dim, dim});
    };
    std::vector<float> got(want.size(), 0.f);
    ak::LinearState state = ak::make_linear_state(spec, whole(q, 4, 32), whole(v, 2, 16));
    dist::linear_attention(
        MPI_COMM_WORLD, spec, run(q, 4, 32), run(k, 2, 32), run(v, 2, 16),
        ak::strided(got.data() + first * 16, {1, 4, n, 16}, {4 * len * 16, len * 16, 16}), state,
        len);
    sum_over_ranks(got);  // every rank's rows, the others zero
    INFO(len << " positions, " << p << " ranks");
    if (len == 96) {
      CHECK(got == want);
      if (rank == p - 1) CHECK(state.floats() == want_state.floats());
    } else {
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
      CHECK(worst <= 1e-5);
    }
  }
  // A non-causal spec is refused on every rank.
  std::vector<float> x(4 * 32, 0.5f), y(4 * 32);
  ak::LinearState state(1, 4, 32, 32);
  const auto spec = ak::linear_spec(ak::Identity{}).with_causal(false);
  std::string message = "no Error";
  try {
    dist::linear_attention(MPI_COMM_WORLD, spec,
                           ak::bhsd(static_cast<const float*>(x.data()), 1, 4, 1, 32),
                           ak::bhsd(static_cast<const float*>(x.data()), 1, 4, 1, 32),
                           ak::bhsd(static_cast<const float*>(x.data()), 1, 4, 1, 32),
                           ak::bhsd(y.data(), 1, 4, 1, 32), state, p);
  } catch (const ak::Error& e) {
    message = e.what();
  }
  CHECK(message == "attnkit: rank 0 of " + std::to_string(p) +
                       ": dist::linear_attention(): spec.causal: expected true (the state flows "
                       "from rank to rank in sequence order), got false");
}

TEST_CASE("dist::linear_attention: ranks that disagree on the spec are one Error on every rank",
          "[dist][linear][errors][agreement]") {
  const bool first = my_rank() == 0;
  const Index len = 4 * ranks();
  const auto call = [&](const auto& spec) {
    std::vector<float> x(static_cast<std::size_t>(2 * 4 * 16), 0.5f), y(x.size());
    const auto rows = ak::bhsd(static_cast<const float*>(x.data()), 1, 2, 4, 16);
    ak::LinearState state = ak::make_linear_state(spec, rows, rows);
    dist::linear_attention(MPI_COMM_WORLD, spec, rows, rows, rows, ak::bhsd(y.data(), 1, 2, 4, 16),
                           state, len);
  };
  const auto spec = ak::linear_spec(ak::EluPlusOne{}).with_chunk(4);
  check_same_error(
      "decay that differs",
      [&] {
        call(spec.with_decay({first ? 0.9f : 0.8f, 1.f}));
      },
      "dist::linear_attention(): spec.decay");
  check_same_error(
      "eps that differs", [&] { call(spec.with_normalize(true, first ? 1e-6f : 1e-5f)); },
      "dist::linear_attention(): spec.eps");
  check_same_error(
      "EluPlusOne on rank 0, Relu elsewhere",
      [&] {
        if (first)
          call(spec);
        else
          call(ak::linear_spec(ak::Relu{}).with_chunk(4));
      },
      "dist::linear_attention(): spec.map (the feature map)");
}

// Catch2's session between MPI_Init and MPI_Finalize; the exit code is the worst rank's.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int failed = Catch::Session().run(argc, argv);
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
