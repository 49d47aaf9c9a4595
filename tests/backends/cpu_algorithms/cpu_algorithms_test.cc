// The CPU algorithms (backends/cpu_algorithms) on an in-process transport:
// one thread per rank, messages through queues. Every collective at world
// sizes 1-4, on both sides of the exchange/ring cut, with uneven counts;
// results checked against values computed here, and reductions checked to
// give every rank the same bits. The fake transport also checks that both
// ends of every message agree on where it lands, which Gloo relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives.h"
#include "fake_transport.h"
#include "plan.h"
#include "vector_collectives.h"

namespace comms::cpu_algorithms {
namespace {

using namespace std::chrono_literals;

using testing_support::FakeTransport;
using testing_support::Network;

// Collectives as a backend's plan runs them: each op with the algorithm
// algorithm_for gives it on this transport, and on a one-rank comm the
// plan's copy (run_on_one_rank) instead.
class Planned {
 public:
  Planned(Collectives& c, bool in_place) : c_(c), in_place_(in_place) {}
  void all_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
    if (!one_rank(in, out, count * es)) c_.all_reduce(algo(OpType::kAllReduce, count * es), in, out, count, es, fn);
  }
  void reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn, int root) {
    if (!one_rank(in, out, count * es)) c_.reduce(algo(OpType::kReduce, count * es), in, out, count, es, fn, root);
  }
  void all_gather(const void* in, void* out, size_t bytes) {
    if (!one_rank(in, out, bytes)) c_.all_gather(algo(OpType::kAllGather, bytes), in, out, bytes);
  }
  void reduce_scatter(const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
    if (!one_rank(in, out, count * es)) {
      c_.reduce_scatter(algo(OpType::kReduceScatter, count * es), in, out, count, es, fn);
    }
  }
  void all_to_all(const void* in, void* out, size_t bytes) {
    if (!one_rank(in, out, bytes)) c_.all_to_all(in, out, bytes);
  }
  void gather(const void* in, void* out, size_t bytes, int root) {
    if (!one_rank(in, out, bytes)) c_.gather(in, out, bytes, root);
  }
  void scatter(const void* in, void* out, size_t bytes, int root) {
    if (!one_rank(in, out, bytes)) c_.scatter(in, out, bytes, root);
  }
  void broadcast(const void* in, void* out, size_t bytes, int root) {
    if (!one_rank(in, out, bytes)) c_.broadcast(algo(OpType::kBroadcast, bytes), in, out, bytes, root);
  }
  void barrier() {
    if (c_.size() > 1) c_.barrier();
  }

 private:
  using OpType = plugin::OpType;
  Algorithm algo(OpType type, size_t bytes) const { return algorithm_for(type, bytes, c_.size(), in_place_); }
  bool one_rank(const void* in, void* out, size_t bytes) const {
    if (c_.size() > 1) return false;
    if (in != out) std::memmove(out, in, bytes);
    return true;
  }
  Collectives& c_;
  bool in_place_;
};

// Runs body(rank, collectives) on one thread per rank; then no message is left.
void run_ranks(int size, const std::function<void(int, Planned&)>& body, std::chrono::milliseconds timeout = 10s,
               bool drained = true, bool in_place = false, std::vector<bool> direct = {}, int* direct_copies = nullptr) {
  Network net(size);
  net.direct = std::move(direct);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport t(net, r, in_place);
      Collectives c(t, timeout);
      Planned planned(c, in_place);
      body(r, planned);
    });
  }
  for (auto& t : threads) t.join();
  if (direct_copies) *direct_copies = net.direct_copies;
  if (!drained) return;
  for (const auto& [key, q] : net.queues) EXPECT_TRUE(q.empty()) << "a message nobody received";
}

// Rank r's element i, distinct for every (r, i) and exact in float.
int32_t value(int r, size_t i) { return static_cast<int32_t>((i * 7 + static_cast<size_t>(r) * 13) % 1000) - 300; }

// A rank's body: an int32 broadcast of value(root, i) from `root`, each
// element checked.
std::function<void(int, Planned&)> broadcast_checked(size_t count, int root) {
  return [count, root](int r, Planned& c) {
    std::vector<int32_t> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
    c.broadcast(in.data(), out.data(), count * 4, root);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], value(root, i)) << "rank " << r << " at " << i;
  };
}

// A rank's body: an int32 sum of value(r, i) over `n` ranks, in place or
// not, each element checked.
std::function<void(int, Planned&)> all_reduce_checked(int n, size_t count, bool in_place) {
  return [n, count, in_place](int r, Planned& c) {
    std::vector<int32_t> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
    int32_t* dst = in_place ? in.data() : out.data();
    c.all_reduce(in.data(), dst, count, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum));
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i);
      ASSERT_EQ(dst[i], want) << "rank " << r << " element " << i;
    }
  };
}

// Counts per rank either side of the exchange's 64 KiB and uneven against
// the ring's segments and 128 KiB pieces.
std::vector<size_t> counts_for(int size) {
  const size_t exchange_max = kExchangeMaxBytes / sizeof(int32_t) / static_cast<size_t>(size);
  return {1, 3, exchange_max, exchange_max + 1, 70001};
}

constexpr int kSizes[] = {1, 2, 3, 4};

TEST(CpuAlgorithms, AllReduceSumsEveryRanksInputOnBothSidesOfTheExchangeLimit) {
  for (int n : kSizes) {
    for (size_t count : counts_for(n)) {
      SCOPED_TRACE(testing::Message() << "size " << n << " count " << count);
      run_ranks(n, [&](int r, Planned& c) {
        std::vector<int32_t> in(count), out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
        c.all_reduce(in.data(), out.data(), count, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum));
        for (size_t i = 0; i < count; ++i) {
          int32_t want = 0;
          for (int q = 0; q < n; ++q) want += value(q, i);
          ASSERT_EQ(out[i], want) << "rank " << r << " element " << i;
        }
      });
    }
  }
}

TEST(CpuAlgorithms, AllReduceInPlaceWithMaxAndMinGivesTheExtremes) {
  for (int n : kSizes) {
    for (ReduceKind kind : {ReduceKind::kMax, ReduceKind::kMin}) {
      for (size_t count : counts_for(n)) {
        run_ranks(n, [&](int r, Planned& c) {
          std::vector<int64_t> data(count);
          for (size_t i = 0; i < count; ++i) data[i] = value(r, i);
          c.all_reduce(data.data(), data.data(), count, 8, reduce_fn(DataType::kInt64, kind));
          for (size_t i = 0; i < count; ++i) {
            int64_t want = value(0, i);
            for (int q = 1; q < n; ++q) want = kind == ReduceKind::kMax ? std::max<int64_t>(want, value(q, i))
                                                                       : std::min<int64_t>(want, value(q, i));
            ASSERT_EQ(data[i], want) << "size " << n << " rank " << r << " element " << i;
          }
        });
      }
    }
  }
}

// Floats whose sum depends on the order: every rank must still get the same
// bits (a rank that added its own block first would differ).
TEST(CpuAlgorithms, FloatReductionsGiveEveryRankTheSameBits) {
  for (int n : kSizes) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16, DataType::kFloat64}) {
      const size_t es = element_size(dtype);
      for (size_t count : {size_t{5}, kExchangeMaxBytes / es / static_cast<size_t>(n) + 3, size_t{100003}}) {
        std::vector<std::vector<unsigned char>> results(static_cast<size_t>(n));
        run_ranks(n, [&](int r, Planned& c) {
          std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1);
          std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
          std::vector<unsigned char> in(count * es), out(count * es);
          for (size_t i = 0; i < count; ++i) {
            const float f = dist(rng) * (i % 3 == 0 ? 1e-4f : 1.0f);
            const double d = f;
            if (dtype == DataType::kFloat32) std::memcpy(&in[i * es], &f, 4);
            else if (dtype == DataType::kFloat64) std::memcpy(&in[i * es], &d, 8);
            else {  // 16 bits: random mantissa, positive, exponent kept finite
              in[i * es] = static_cast<unsigned char>(rng());
              in[i * es + 1] = static_cast<unsigned char>(rng() % 0x70);
            }
          }
          c.all_reduce(in.data(), out.data(), count, es, reduce_fn(dtype, ReduceKind::kSum));
          results[static_cast<size_t>(r)] = out;
        });
        for (int r = 1; r < n; ++r) {
          ASSERT_EQ(results[static_cast<size_t>(r)], results[0])
              << "rank " << r << " differs from rank 0: size " << n << " dtype " << int(dtype) << " count " << count;
        }
      }
    }
  }
}

TEST(CpuAlgorithms, ReduceLeavesTheSumAtEveryRootAndTouchesNoOtherOutput) {
  for (int n : kSizes) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : counts_for(n)) {
        run_ranks(n, [&](int r, Planned& c) {
          std::vector<int32_t> in(count), out(count, -7);
          for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
          c.reduce(in.data(), out.data(), count, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum), root);
          for (size_t i = 0; i < count; ++i) {
            int32_t want = 0;
            for (int q = 0; q < n; ++q) want += value(q, i);
            ASSERT_EQ(out[i], r == root ? want : -7) << "size " << n << " root " << root << " rank " << r;
          }
        });
      }
    }
  }
}

TEST(CpuAlgorithms, AllGatherPutsEveryRanksBlockInRankOrder) {
  for (int n : kSizes) {
    for (size_t count : counts_for(n)) {
      run_ranks(n, [&](int r, Planned& c) {
        std::vector<int32_t> in(count), out(count * static_cast<size_t>(n), -1);
        for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
        c.all_gather(in.data(), out.data(), count * 4);
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[static_cast<size_t>(q) * count + i], value(q, i)) << "size " << n << " rank " << r;
          }
        }
      });
    }
  }
}

TEST(CpuAlgorithms, ReduceScatterGivesEachRankTheSumOfItsBlock) {
  for (int n : kSizes) {
    for (size_t count : counts_for(n)) {
      run_ranks(n, [&](int r, Planned& c) {
        const size_t total = count * static_cast<size_t>(n);
        std::vector<int32_t> in(total), out(count, -1);
        for (size_t i = 0; i < total; ++i) in[i] = value(r, i);
        c.reduce_scatter(in.data(), out.data(), count, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum));
        for (size_t i = 0; i < count; ++i) {
          int32_t want = 0;
          for (int q = 0; q < n; ++q) want += value(q, static_cast<size_t>(r) * count + i);
          ASSERT_EQ(out[i], want) << "size " << n << " rank " << r << " element " << i;
        }
      });
    }
  }
}

// all_to_all, gather and scatter run only where the exchange fits.
TEST(CpuAlgorithms, AllToAllGatherAndScatterMoveEveryBlockToItsRank) {
  for (int n : kSizes) {
    const size_t count = kExchangeMaxBytes / 4 / static_cast<size_t>(n) - 1;  // uneven, largest that fits
    for (int root = 0; root < n; ++root) {
      run_ranks(n, [&](int r, Planned& c) {
        const size_t total = count * static_cast<size_t>(n);
        std::vector<int32_t> in(total), out(total, -1);
        for (size_t i = 0; i < total; ++i) in[i] = value(r, i);
        c.all_to_all(in.data(), out.data(), count * 4);
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[static_cast<size_t>(q) * count + i], value(q, static_cast<size_t>(r) * count + i));
          }
        }
        std::vector<int32_t> gathered(total, -1);
        c.gather(in.data(), gathered.data(), count * 4, root);
        if (r == root) {
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(gathered[static_cast<size_t>(q) * count + i], value(q, i));
          }
        }
        std::vector<int32_t> mine(count, -1);
        c.scatter(in.data(), mine.data(), count * 4, root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(mine[i], value(root, static_cast<size_t>(r) * count + i));
      });
    }
  }
}

TEST(CpuAlgorithms, BroadcastAndBarrierReachEveryRank) {
  for (int n : kSizes) {
    for (int root = 0; root < n; ++root) {
      run_ranks(n, [&](int r, Planned& c) {
        const size_t count = kSyncPathMaxBytes / 4 - 5;
        std::vector<int32_t> data(count, -1);
        if (r == root) {
          for (size_t i = 0; i < count; ++i) data[i] = value(root, i);
        }
        c.barrier();
        c.broadcast(data.data(), data.data(), count * 4, root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i)) << "size " << n << " rank " << r;
        c.barrier();
      });
    }
  }
}

// The in-place plans (algorithms.h): broadcast in pieces up to
// kBroadcastPiecedMaxBytes and above it as one message (no direct copies
// here), from every root; the
// ring in 64 KiB and (above 1 MiB) 32 KiB pieces, in and out of place.
TEST(CpuAlgorithms, InPlacePlansBroadcastAndReduceAtEverySwitchPoint) {
  const size_t bcast_counts[] = {3, (3 * kBroadcastPieceBytes + 5) / 4, kBroadcastPiecedMaxBytes / 4 + 3};
  for (int n : {2, 3}) {
    for (size_t count : bcast_counts) {
      for (int root = 0; root < n; ++root) {
        SCOPED_TRACE(testing::Message() << "broadcast size " << n << " count " << count << " root " << root);
        run_ranks(
            n,
            broadcast_checked(count, root),
            10s, true, true);
      }
    }
  }
  EXPECT_EQ(algorithm_for(plugin::OpType::kBroadcast, kBroadcastDirectMinBytes - 1, 2, true), Algorithm::kBroadcast);
  EXPECT_EQ(algorithm_for(plugin::OpType::kBroadcast, 64u << 20, 2, true), Algorithm::kDirectCopies);
  EXPECT_EQ(ring_piece_bytes(1 << 20, true), 64u * 1024);
  EXPECT_EQ(ring_piece_bytes((1 << 20) + 4, true), 32u * 1024);
  EXPECT_EQ(ring_piece_bytes(1 << 20, false), kRingPieceBytes);
  for (int n : {2, 3, 4}) {
    for (size_t count : {size_t{70001}, size_t{(1 << 20) / 4 + 7}}) {
      for (bool same : {false, true}) {
        SCOPED_TRACE(testing::Message() << "all_reduce size " << n << " count " << count << " in-place " << same);
        run_ranks(
            n,
            all_reduce_checked(n, count, same),
            10s, true, true);
      }
    }
  }
}

// From kBroadcastDirectMinBytes the root writes its share into each
// receiver and the receiver reads the rest; a rank that cannot copy directly
// gets pieces (above kBroadcastPiecedMaxBytes one message) from the root
// instead, the others still copy.
TEST(CpuAlgorithms, LargeBroadcastCopiesDirectlyWhereBothEndsCanAndSendsElsewhere) {
  for (size_t count : {kBroadcastDirectMinBytes / 4 + 3, kBroadcastPiecedMaxBytes / 4 + 4099})
  for (int n : {2, 3, 4}) {
    for (int refusing : {-1, 1}) {
      for (int root = 0; root < n; ++root) {
        SCOPED_TRACE(testing::Message() << "size " << n << " count " << count << " root " << root << " refusing "
                                        << refusing);
        std::vector<bool> direct(static_cast<size_t>(n), true);
        if (refusing >= 0) direct[static_cast<size_t>(refusing)] = false;
        int copies = 0;
        run_ranks(
            n,
            broadcast_checked(count, root),
            10s, true, true, direct, &copies);
        const int pairs = refusing < 0 ? n - 1 : refusing == root ? 0 : n - 2;
        EXPECT_EQ(copies, 2 * pairs) << "a write and a read per receiver that copies directly";
      }
    }
  }
  EXPECT_EQ(broadcast_direct_share(8u << 20, 2), 4u << 20);
  EXPECT_EQ(broadcast_direct_share((8u << 20) + 5, 3) % 4096, 0u);
}

// An op whose size takes direct copies, at 2-4 ranks, in and out of place:
// once with every rank copying directly (the copies counted must be
// want_copies(n)), once with rank refusing(n) unable to (then no rank may
// copy: every rank takes the fallback). body(n, in_place) checks values.
void expect_direct_only_when_every_rank_can(const std::function<std::function<void(int, Planned&)>(int, bool)>& body,
                                            const std::function<int(int)>& refusing_rank,
                                            const std::function<int(int)>& want_copies) {
  for (int n : {2, 3, 4}) {
    for (int refusing : {-1, refusing_rank(n)}) {
      for (bool same : {false, true}) {
        SCOPED_TRACE(testing::Message() << "size " << n << " refusing " << refusing << " in-place " << same);
        std::vector<bool> direct(static_cast<size_t>(n), true);
        if (refusing >= 0) direct[static_cast<size_t>(refusing)] = false;
        int copies = 0;
        run_ranks(n, body(n, same), 10s, true, true, direct, &copies);
        if (refusing >= 0) EXPECT_EQ(copies, 0) << "the fallback, on every rank";
        else EXPECT_EQ(copies, want_copies(n));
      }
    }
  }
}

// From kAllReduceDirectMinSegmentBytes per segment each rank reduces its
// segment out of the peers' inputs and writes it into their outputs: a read
// and a write per peer and chunk.
TEST(CpuAlgorithms, LargeAllReduceCopiesDirectlyOnlyWhenEveryRankCan) {
  const size_t count = 4 * kAllReduceDirectMinSegmentBytes + 70001;
  expect_direct_only_when_every_rank_can(
      [count](int n, bool same) { return all_reduce_checked(n, count, same); }, [](int n) { return n - 1; },
      [count](int n) {
        const size_t segment = count * 4 / static_cast<size_t>(n);
        const int chunks = static_cast<int>((segment + kAllReduceDirectChunkBytes - 1) / kAllReduceDirectChunkBytes);
        return n * (n - 1) * 2 * chunks;
      });
}

// From kAllGatherDirectMinBytes each rank reads every peer's block out of
// the peer's input (in place, the input is the rank's own block of its
// output): one read per peer.
TEST(CpuAlgorithms, LargeAllGatherCopiesDirectlyOnlyWhenEveryRankCan) {
  for (size_t count : {kAllGatherDirectMinBytes / 4 + 3, kExchangeMaxBytes / 4 + 1031}) {  // per rank, int32
    expect_direct_only_when_every_rank_can(
        [count](int n, bool same) {
          return [n, count, same](int r, Planned& c) {
            std::vector<int32_t> in(count), out(count * static_cast<size_t>(n), -1);
            int32_t* mine = out.data() + static_cast<size_t>(r) * count;
            for (size_t i = 0; i < count; ++i) (same ? mine : in.data())[i] = value(r, i);
            c.all_gather(same ? mine : in.data(), out.data(), count * 4);
            for (int q = 0; q < n; ++q) {
              for (size_t i = 0; i < count; ++i) {
                ASSERT_EQ(out[static_cast<size_t>(q) * count + i], value(q, i)) << "rank " << r << " block " << q;
              }
            }
          };
        },
        [](int) { return 0; }, [](int n) { return n * (n - 1); });
  }
}

// Beyond the exchange, from kAllReduceDirectMinSegmentBytes per block, each
// rank reduces its own block out of the peers' inputs (in place: its output
// is its own input block): one read per peer and chunk.
TEST(CpuAlgorithms, LargeReduceScatterCopiesDirectlyOnlyWhenEveryRankCan) {
  const size_t count = kAllReduceDirectChunkBytes / 4 + 4099;  // per block, int32: two chunks
  expect_direct_only_when_every_rank_can(
      [count](int n, bool same) {
        return [n, count, same](int r, Planned& c) {
          std::vector<int32_t> in(count * static_cast<size_t>(n)), out(count, -1);
          for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
          int32_t* dst = same ? in.data() + static_cast<size_t>(r) * count : out.data();
          c.reduce_scatter(in.data(), dst, count, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum));
          for (size_t i = 0; i < count; ++i) {
            int32_t want = 0;
            for (int q = 0; q < n; ++q) want += value(q, static_cast<size_t>(r) * count + i);
            ASSERT_EQ(dst[i], want) << "rank " << r << " element " << i;
          }
        };
      },
      [](int) { return 1; }, [](int n) { return n * (n - 1) * 2; });
}

TEST(CpuAlgorithms, AWaitForAPeerThatNeverSendsEndsAtTheDeadlineNamingThePeer) {
  run_ranks(
      2,
      [](int r, Planned& c) {
        if (r == 1) return;  // rank 1 never joins
        const auto start = Clock::now();
        std::vector<int32_t> in(4, 1), out(4);
        try {
          c.all_reduce(in.data(), out.data(), 4, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum));
          ADD_FAILURE() << "all_reduce returned without its peer";
        } catch (const TransportError& e) {
          EXPECT_EQ(e.kind(), TransportError::Kind::kTimeout);
          EXPECT_EQ(e.peer(), 1);
        }
        const auto waited = Clock::now() - start;
        EXPECT_GE(waited, 200ms);
        EXPECT_LT(waited, 5s);
      },
      200ms, /*drained=*/false);  // rank 0's message to rank 1 stays unread
}

TEST(CpuAlgorithms, AbortWakesARankWaitingOnAPeer) {
  Network net(2);
  FakeTransport t0(net, 0);
  Collectives collectives(t0, 60s);
  Planned c(collectives, false);
  std::thread aborter([&] {
    std::this_thread::sleep_for(100ms);
    FakeTransport(net, 1).abort();
  });
  const auto start = Clock::now();
  try {
    c.barrier();
    ADD_FAILURE() << "barrier returned without its peer";
  } catch (const TransportError& e) {
    EXPECT_EQ(e.kind(), TransportError::Kind::kAborted);
  }
  aborter.join();
  EXPECT_LT(Clock::now() - start, 10s);
}

// Rank 1 passes fewer elements: every rank gets CountMismatch naming the
// byte counts, no message is left unread, and the next op works.
TEST(CpuAlgorithms, RanksPassingDifferentCountsToTheExchangeAllFailWithTheCounts) {
  Network net(3);
  net.lengths_may_differ = true;
  std::vector<std::string> errors(3);
  std::vector<int32_t> after(3, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport t(net, r);
      Collectives collectives(t, 10s);
      Planned c(collectives, false);
      std::vector<int32_t> x(1024, 1);
      try {
        c.all_reduce(x.data(), x.data(), r == 1 ? 1000 : 1024, sizeof(int32_t), reduce_fn(DataType::kInt32, ReduceKind::kSum));
      } catch (const CountMismatch& e) {
        errors[r] = e.what();
      }
      std::vector<int32_t> y(8, r + 1);
      c.all_reduce(y.data(), y.data(), 8, sizeof(int32_t), reduce_fn(DataType::kInt32, ReduceKind::kSum));
      after[r] = y[7];
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[0].find("rank 0 expects 4096 bytes from each peer, rank 1 sent 4000"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 1 expects 4000 bytes from each peer, rank 0 sent 4096, rank 2 sent 4096"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[2].find("rank 2 expects 4096 bytes from each peer, rank 1 sent 4000"), std::string::npos) << errors[2];
  EXPECT_EQ(after, std::vector<int32_t>(3, 6));
  for (const auto& [key, q] : net.queues) EXPECT_TRUE(q.empty()) << "a message nobody received";
}

TEST(CpuAlgorithms, TheExchangeAndTheRingSplitWhereAlgorithmForSays) {
  using plugin::OpType;
  EXPECT_EQ(algorithm_for(OpType::kAllReduce, kExchangeMaxBytes / 2, 2), Algorithm::kExchange);
  EXPECT_EQ(algorithm_for(OpType::kAllReduce, kExchangeMaxBytes / 2 + 1, 2), Algorithm::kPipelinedRing);
  EXPECT_EQ(algorithm_for(OpType::kAllToAll, kExchangeMaxBytes / 2 + 1, 2), Algorithm::kNone);
  EXPECT_EQ(algorithm_for(OpType::kBroadcast, kSyncPathMaxBytes, 8), Algorithm::kBroadcast);
  EXPECT_EQ(algorithm_for(OpType::kBroadcast, kSyncPathMaxBytes + 1, 8), Algorithm::kNone);
  EXPECT_EQ(algorithm_for(OpType::kAllReduce, 0, 2), Algorithm::kNone);
  // Direct copies only on a transport that sends in place, from their size rule.
  EXPECT_EQ(algorithm_for(OpType::kAllReduce, 2 * kAllReduceDirectMinSegmentBytes - 1, 2, true),
            Algorithm::kPipelinedRing);
  EXPECT_EQ(algorithm_for(OpType::kAllReduce, 2 * kAllReduceDirectMinSegmentBytes, 2, true), Algorithm::kDirectCopies);
  EXPECT_EQ(algorithm_for(OpType::kAllReduce, 2 * kAllReduceDirectMinSegmentBytes, 2), Algorithm::kPipelinedRing);
  EXPECT_EQ(algorithm_for(OpType::kReduce, 64u << 20, 2, true), Algorithm::kPipelinedRing);
  EXPECT_EQ(algorithm_for(OpType::kBroadcast, kBroadcastDirectMinBytes, 2), Algorithm::kBroadcast);
  // all_gather copies directly from its size rule, on such a transport only.
  EXPECT_EQ(algorithm_for(OpType::kAllGather, kAllGatherDirectMinBytes - 1, 2, true), Algorithm::kExchange);
  EXPECT_EQ(algorithm_for(OpType::kAllGather, kAllGatherDirectMinBytes, 2, true), Algorithm::kDirectCopies);
  EXPECT_EQ(algorithm_for(OpType::kAllGather, kExchangeMaxBytes, 2, true), Algorithm::kDirectCopies);
  EXPECT_EQ(algorithm_for(OpType::kAllGather, kAllGatherDirectMinBytes, 2), Algorithm::kExchange);
  EXPECT_EQ(algorithm_for(OpType::kAllGather, kExchangeMaxBytes / 2 + 1, 2), Algorithm::kPipelinedRing);
  EXPECT_EQ(fallback_of(OpType::kAllGather, Algorithm::kDirectCopies, kAllGatherDirectMinBytes, 2), Algorithm::kExchange);
  EXPECT_EQ(fallback_of(OpType::kAllGather, Algorithm::kDirectCopies, kExchangeMaxBytes, 2), Algorithm::kPipelinedRing);
  EXPECT_EQ(fallback_of(OpType::kAllReduce, Algorithm::kDirectCopies, 64u << 20, 2), Algorithm::kPipelinedRing);
  // reduce_scatter copies directly beyond the exchange, from all_reduce's segment size per block.
  EXPECT_EQ(algorithm_for(OpType::kReduceScatter, kExchangeMaxBytes / 2, 2, true), Algorithm::kExchange);
  EXPECT_EQ(algorithm_for(OpType::kReduceScatter, kExchangeMaxBytes / 2 + 1, 2, true), Algorithm::kDirectCopies);
  EXPECT_EQ(algorithm_for(OpType::kReduceScatter, kAllReduceDirectMinSegmentBytes - 1, 4, true),
            Algorithm::kPipelinedRing);
  EXPECT_EQ(algorithm_for(OpType::kReduceScatter, kExchangeMaxBytes / 2 + 1, 2), Algorithm::kPipelinedRing);
}


// VectorCollectives (vector_collectives.h): the pairwise exchange behind the
// v-variants and the large all_to_all, gather, scatter and broadcast, with
// blocks that are empty, below and across its 128 KiB pieces.
void run_vector_ranks(int size, const std::function<void(int, VectorCollectives&)>& body) {
  Network net(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport t(net, r);
      VectorCollectives v(t);
      body(r, v);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& [key, q] : net.queues) EXPECT_TRUE(q.empty()) << "a message nobody received";
}

// Elements rank `from` sends rank `to`: 0 for some pairs, several pieces for others.
size_t pair_count(int from, int to) { return (from + to) % 3 == 0 ? 0 : size_t(1 + from * 40000 + to * 17); }

TEST(VectorCollectives, AllToAllVMovesUnevenBlocksIncludingEmptyAndMultiPieceOnes) {
  for (int n : kSizes) {
    run_vector_ranks(n, [&](int r, VectorCollectives& v) {
      std::vector<size_t> send(n), recv(n);
      for (int p = 0; p < n; ++p) send[p] = pair_count(r, p) * 4, recv[p] = pair_count(p, r) * 4;
      std::vector<int32_t> in, out;
      for (int p = 0; p < n; ++p) {
        for (size_t i = 0; i < pair_count(r, p); ++i) in.push_back(value(r * 10 + p, i));
      }
      size_t total = 0;
      for (size_t b : recv) total += b / 4;
      out.assign(total, -1);
      v.all_to_all_v(in.data(), out.data(), send, recv, Clock::now() + 10s);
      size_t k = 0;
      for (int p = 0; p < n; ++p) {
        for (size_t i = 0; i < pair_count(p, r); ++i, ++k) ASSERT_EQ(out[k], value(p * 10 + r, i)) << p << " " << i;
      }
    });
  }
}

TEST(VectorCollectives, AllGatherVAndReduceScatterVGiveEveryRankItsShare) {
  for (int n : kSizes) {
    run_vector_ranks(n, [&](int r, VectorCollectives& v) {
      std::vector<size_t> counts(n), bytes(n);
      for (int p = 0; p < n; ++p) counts[p] = pair_count(p, 1), bytes[p] = counts[p] * 4;
      size_t total = 0;
      for (size_t c : counts) total += c;
      std::vector<int32_t> mine(counts[r]), all(total, -1);
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(r, i);
      v.all_gather_v(mine.data(), all.data(), bytes, Clock::now() + 10s);
      size_t k = 0;
      for (int p = 0; p < n; ++p) {
        for (size_t i = 0; i < counts[p]; ++i, ++k) ASSERT_EQ(all[k], value(p, i));
      }
      // reduce_scatter_v of every rank's `all`-shaped input: rank p gets the
      // sum over ranks of block p.
      std::vector<int32_t> in(total), out(counts[r], -1);
      for (size_t i = 0; i < total; ++i) in[i] = value(r, i);
      v.reduce_scatter_v(in.data(), out.data(), counts, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum),
                         Clock::now() + 10s);
      size_t offset = 0;
      for (int p = 0; p < r; ++p) offset += counts[p];
      for (size_t i = 0; i < counts[r]; ++i) {
        int32_t sum = 0;
        for (int q = 0; q < n; ++q) sum += value(q, offset + i);
        ASSERT_EQ(out[i], sum) << "rank " << r << " element " << i;
      }
    });
  }
}

TEST(VectorCollectives, LargeGatherScatterAndBroadcastReachEveryRankFromEveryRoot) {
  const size_t count = 3 * VectorCollectives::kPieceBytes / 4 + 5;  // several pieces, the last partial
  for (int n : kSizes) {
    for (int root = 0; root < n; ++root) {
      run_vector_ranks(n, [&](int r, VectorCollectives& v) {
        std::vector<int32_t> in(count), gathered(r == root ? count * n : 0, -1);
        for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
        v.gather(in.data(), gathered.data(), count * 4, root, Clock::now() + 10s);
        for (size_t i = 0; r == root && i < count * n; ++i) ASSERT_EQ(gathered[i], value(int(i / count), i % count));
        std::vector<int32_t> src(r == root ? count * n : 0), part(count, -1);
        for (size_t i = 0; i < src.size(); ++i) src[i] = value(root, i);
        v.scatter(src.data(), part.data(), count * 4, root, Clock::now() + 10s);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(part[i], value(root, r * count + i));
        std::vector<int32_t> data(count, -1);
        if (r == root) data = in;
        v.broadcast(data.data(), count * 4, root, Clock::now() + 10s);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i));
      });
    }
  }
}

}  // namespace
}  // namespace comms::cpu_algorithms
