// What this shows: attention over a sequence split across MPI ranks (context parallelism),
// with attnkit's optional distributed component (attnkit::mpi, include/attnkit/distributed/).
//
//   mpirun -np 2 ./example_16_ring_attention     (any number of ranks)
//
// Every rank holds the rows of Q, K and V at its shard's positions. The zigzag layout cuts
// the sequence into 2P chunks and gives rank r chunks r and 2P - 1 - r, so that under a
// causal mask every rank has the same work. ring_attention() passes the K/V shards around
// the ring (each rank sends to the next while it computes on the shard in hand) and merges
// the partial results; the output rows come back at the rank's own positions. RoPE sees the
// true, global positions. The example gathers every rank's rows and checks them against
// attention() over the whole sequence in one process.
//
// Then one decode step against a KV cache split across the ranks (rank r holds the r-th run
// of positions): sharded_decode() gives every rank the whole result.
#include <mpi.h>

#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <attnkit/distributed/ring_attention.hpp>
#include <attnkit/distributed/sharded_decode.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace ak = attnkit;
namespace dist = attnkit::dist;
using ak::Index;

namespace {

const Index kLen = 1024, kHeads = 8, kKvHeads = 2, kDim = 64;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);  // the same values on every rank
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rank = dist::rank_of(MPI_COMM_WORLD), ranks = dist::size_of(MPI_COMM_WORLD);
  const auto spec = ak::make_spec(ak::Causal{}, ak::Rope(ak::RopeTable(kDim, 10000, kLen)));

  // The whole sequence, [B, H, L, D]: every rank draws the same values, keeps its rows.
  const auto q_all = random_values(std::size_t(kHeads * kLen * kDim), 1);
  const auto k_all = random_values(std::size_t(kKvHeads * kLen * kDim), 2);
  const auto v_all = random_values(std::size_t(kKvHeads * kLen * kDim), 3);
  const auto whole = [](const std::vector<float>& x, Index heads) {
    return ak::bhsd(x.data(), 1, heads, kLen, kDim);
  };

  // This rank's shard: the rows at its positions (zigzag).
  const dist::Layout layout = dist::Layout::Zigzag;
  const Index n = dist::shard_length(layout, kLen, rank, ranks);
  std::vector<float> q(std::size_t(kHeads * n * kDim)), k(std::size_t(kKvHeads * n * kDim)),
      v(k.size()), o(q.size());
  const auto shard = [n](std::vector<float>& x, Index heads) {
    return ak::bhsd(x.data(), 1, heads, n, kDim);
  };
  dist::shard_rows(whole(q_all, kHeads), layout, rank, ranks, shard(q, kHeads));
  dist::shard_rows(whole(k_all, kKvHeads), layout, rank, ranks, shard(k, kKvHeads));
  dist::shard_rows(whole(v_all, kKvHeads), layout, rank, ranks, shard(v, kKvHeads));

  dist::ring_attention(MPI_COMM_WORLD, spec, ak::View<const float>(shard(q, kHeads)),
                       ak::View<const float>(shard(k, kKvHeads)),
                       ak::View<const float>(shard(v, kKvHeads)), shard(o, kHeads),
                       dist::RingOptions{}.with_layout(layout).with_seq_len(kLen));

  // Every rank's rows put back in place (a sum of disjoint rows), against one process.
  std::vector<float> o_all(q_all.size(), 0.f), gathered(q_all.size());
  dist::unshard_rows(ak::View<const float>(shard(o, kHeads)), layout, rank, ranks,
                     ak::bhsd(o_all.data(), 1, kHeads, kLen, kDim));
  MPI_Allreduce(o_all.data(), gathered.data(), int(o_all.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  std::vector<float> expected(q_all.size());
  ak::attention(spec, whole(q_all, kHeads), whole(k_all, kKvHeads), whole(v_all, kKvHeads),
                ak::bhsd(expected.data(), 1, kHeads, kLen, kDim));
  const double ring_error = max_diff(gathered, expected);

  // Decode: the cache's keys split in consecutive runs, rank r the r-th. RoPE is applied
  // once: keys rotated as they were cached, the new query rotated at its position.
  const Index pos = kLen - 1;
  const ak::Range part = dist::shard_ranges(dist::Layout::Contiguous, kLen, rank, ranks).front();
  std::vector<float> k_rot = k_all, q_new(std::size_t(kHeads * kDim)), out(q_new.size());
  const ak::Rope rope(ak::RopeTable(kDim, 10000, kLen));
  ak::apply_position(rope, ak::bhsd(k_rot.data(), 1, kKvHeads, kLen, kDim), ak::Role::Key);
  for (Index h = 0; h < kHeads; ++h)  // the last query of the sequence, alone
    std::copy_n(q_all.begin() + (h * kLen + pos) * kDim, kDim, q_new.begin() + h * kDim);
  ak::apply_position(rope, ak::bhsd(q_new.data(), 1, kHeads, 1, kDim), ak::Role::Query, pos);
  const auto rows_of = [&](const std::vector<float>& x) {
    return ak::strided(x.data() + part.begin * kDim, {1, kKvHeads, part.end - part.begin, kDim},
                       {kKvHeads * kLen * kDim, kLen * kDim, kDim});
  };
  dist::sharded_decode(MPI_COMM_WORLD, ak::make_spec(ak::Causal{}),
                       ak::bhsd(static_cast<const float*>(q_new.data()), 1, kHeads, 1, kDim),
                       rows_of(k_rot), rows_of(v_all), ak::bhsd(out.data(), 1, kHeads, 1, kDim),
                       dist::ShardedDecodeOptions{}.with_kv_len(kLen).with_key_offset(part.begin));
  double decode_error = 0;  // against the last row of the whole sequence's attention
  for (Index h = 0; h < kHeads; ++h)
    for (Index c = 0; c < kDim; ++c)
      decode_error =
          std::max(decode_error, std::abs(double(out[std::size_t(h * kDim + c)]) -
                                          expected[std::size_t((h * kLen + pos) * kDim + c)]));

  const bool ok = ring_error < 1e-4 && decode_error < 1e-4;
  if (rank == 0)
    std::printf(
        "%d ranks, zigzag shards of %ld to %ld rows: ring attention max |error| %.2e, "
        "sharded decode %.2e: %s\n",
        ranks, long(dist::shard_length(layout, kLen, ranks - 1, ranks)),
        long(dist::shard_length(layout, kLen, 0, ranks)), ring_error, decode_error,
        ok ? "PASS" : "FAIL");
  MPI_Finalize();
  return ok ? 0 : 1;
}
