// The hierarchical all_reduce (backends/cpu_algorithms/hierarchical.h) on
// the in-process transport, one thread per rank: ranks grouped on hosts in
// several layouts (contiguous, interleaved, uneven, one rank alone), counts
// on both sides of every phase's algorithm cut, in and out of place. Sums
// are checked element by element; float sums give every rank the same bits;
// a rank that never enters makes every other rank's op time out.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "algorithms.h"
#include "fake_transport.h"
#include "hierarchical.h"

namespace comms::cpu_algorithms {
namespace {

using namespace std::chrono_literals;
using testing_support::FakeTransport;
using testing_support::Network;

// Runs body(rank, hierarchical) on one thread per rank of `hosts` (host of
// each rank); afterwards no message is left unread.
void run_hosts(const std::vector<int>& hosts, const std::function<void(int, Hierarchical&)>& body,
               bool direct = false) {
  const int n = static_cast<int>(hosts.size());
  Network net(n);
  if (direct) net.direct.assign(static_cast<size_t>(n), true);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport t(net, r, /*in_place=*/true);
      Hierarchical h(t, hosts);
      body(r, h);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& [key, q] : net.queues) EXPECT_TRUE(q.empty()) << "a message nobody received";
}

int32_t value(int r, size_t i) { return static_cast<int32_t>((i * 7 + static_cast<size_t>(r) * 13) % 1000) - 300; }

const std::vector<std::vector<int>> kLayouts = {
    {0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1, 1}, {0, 0, 1}, {5, 5, 2, 2, 2, 9},
};

// Per rank: 1 element, either side of the exchange limit at 4 ranks, and
// large enough for the ring and direct copies in every phase.
std::vector<size_t> counts() {
  return {1, 7, kExchangeMaxBytes / 4 / 4, kExchangeMaxBytes / 4 + 1, 4 * kAllReduceDirectMinSegmentBytes + 70001};
}

TEST(Hierarchical, SpansHostsOnlyWithSeveralHostsAndSomeHostWithSeveralRanks) {
  EXPECT_TRUE(spans_hosts_with_neighbours({0, 0, 1, 1}));
  EXPECT_TRUE(spans_hosts_with_neighbours({0, 0, 1}));
  EXPECT_FALSE(spans_hosts_with_neighbours({0, 0, 0}));  // one host
  EXPECT_FALSE(spans_hosts_with_neighbours({0, 1, 2}));  // one rank per host
  EXPECT_FALSE(spans_hosts_with_neighbours({0}));
}

TEST(Hierarchical, AllReduceSumsEveryRanksInputInEveryHostLayout) {
  for (const auto& hosts : kLayouts) {
    const int n = static_cast<int>(hosts.size());
    for (size_t count : counts()) {
      for (bool same : {false, true}) {
        for (bool direct : {false, true}) {
          SCOPED_TRACE(testing::Message() << "ranks " << n << " count " << count << " in-place " << same
                                          << " direct " << direct);
          run_hosts(
              hosts,
              [&](int r, Hierarchical& h) {
                std::vector<int32_t> in(count), out(count, -1);
                for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
                int32_t* dst = same ? in.data() : out.data();
                h.all_reduce(in.data(), dst, count, 4, reduce_fn(DataType::kInt32, ReduceKind::kSum), 10s);
                for (size_t i = 0; i < count; ++i) {
                  int32_t want = 0;
                  for (int q = 0; q < n; ++q) want += value(q, i);
                  ASSERT_EQ(dst[i], want) << "rank " << r << " element " << i;
                }
              },
              direct);
        }
      }
    }
  }
}

// Hosts of equal size: contiguous, interleaved (the leaders' blocks then
// come out of rank order), three hosts, hosts numbered out of order.
const std::vector<std::vector<int>> kEqualLayouts = {
    {0, 0, 1, 1}, {0, 1, 0, 1}, {0, 1, 2, 0, 1, 2}, {5, 5, 5, 2, 2, 2}, {3, 1, 1, 3},
};

TEST(Hierarchical, HostsOfEqualSize) {
  for (const auto& hosts : kEqualLayouts) EXPECT_TRUE(hosts_of_equal_size(hosts));
  EXPECT_FALSE(hosts_of_equal_size({0, 0, 1}));
  EXPECT_FALSE(hosts_of_equal_size({5, 5, 2, 2, 2, 9}));
}

// Every rank's block in rank order on every rank, in and out of place, at
// sizes on both sides of each phase's algorithm cuts.
TEST(Hierarchical, AllGatherPutsEveryRanksBlockInRankOrderInEveryEqualLayout) {
  for (const auto& hosts : kEqualLayouts) {
    const int n = static_cast<int>(hosts.size());
    for (size_t bytes : {size_t{1}, size_t{7}, kExchangeMaxBytes / 8, kAllGatherDirectMinBytes + 3, size_t{70001}}) {
      for (bool same : {false, true}) {
        for (bool direct : {false, true}) {
          SCOPED_TRACE(testing::Message() << "ranks " << n << " bytes " << bytes << " in-place " << same << " direct "
                                          << direct);
          run_hosts(
              hosts,
              [&](int r, Hierarchical& h) {
                const auto byte = [](int q, size_t i) { return static_cast<unsigned char>(q * 31 + i * 7 + 1); };
                std::vector<unsigned char> in(bytes), out(bytes * static_cast<size_t>(n), 0xEE);
                unsigned char* const mine = same ? out.data() + static_cast<size_t>(r) * bytes : in.data();
                for (size_t i = 0; i < bytes; ++i) mine[i] = byte(r, i);
                h.all_gather(mine, out.data(), bytes, 10s);
                for (int q = 0; q < n; ++q) {
                  for (size_t i = 0; i < bytes; ++i) {
                    ASSERT_EQ(out[static_cast<size_t>(q) * bytes + i], byte(q, i))
                        << "rank " << r << ": block " << q << " byte " << i;
                  }
                }
              },
              direct);
        }
      }
    }
  }
}

TEST(Hierarchical, AllGatherRefusesHostsOfUnequalSize) {
  run_hosts({0, 0, 1}, [](int, Hierarchical& h) {
    unsigned char in = 1, out[3];
    EXPECT_THROW(h.all_gather(&in, out, 1, 1s), std::logic_error);
  });
}

TEST(Hierarchical, FloatSumsGiveEveryRankTheSameBits) {
  for (const auto& hosts : kLayouts) {
    const size_t n = hosts.size();
    for (size_t count : {size_t{5}, size_t{100003}}) {
      std::vector<std::vector<float>> results(n);
      run_hosts(hosts, [&](int r, Hierarchical& h) {
        std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1);
        std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
        std::vector<float> in(count), out(count);
        for (size_t i = 0; i < count; ++i) in[i] = dist(rng) * (i % 3 == 0 ? 1e-4f : 1.0f);
        h.all_reduce(in.data(), out.data(), count, 4, reduce_fn(DataType::kFloat32, ReduceKind::kSum), 10s);
        results[static_cast<size_t>(r)] = out;
      });
      for (size_t r = 1; r < n; ++r) {
        ASSERT_EQ(std::memcmp(results[r].data(), results[0].data(), count * 4), 0)
            << "rank " << r << " differs from rank 0: ranks " << n << " count " << count;
      }
    }
  }
}

TEST(Hierarchical, ARankThatNeverEntersMakesEveryOtherRanksOpTimeOutNamingAPeer) {
  const std::vector<int> hosts = {0, 0, 1, 1};
  Network net(4);
  std::vector<std::thread> threads;
  std::vector<int> kinds(4, -1);
  const auto start = Clock::now();
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport t(net, r, true);
      Hierarchical h(t, hosts);
      if (r == 3) return;  // never enters
      std::vector<int32_t> data(16, r);
      try {
        h.all_reduce(data.data(), data.data(), data.size(), 4, reduce_fn(DataType::kInt32, ReduceKind::kSum), 300ms);
      } catch (const TransportError& e) {
        kinds[static_cast<size_t>(r)] = static_cast<int>(e.kind());
        EXPECT_GE(e.peer(), 0) << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  // One deadline for the op: its three phases share the timeout.
  EXPECT_LT(Clock::now() - start, 3s);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(kinds[static_cast<size_t>(r)], static_cast<int>(TransportError::Kind::kTimeout)) << "rank " << r;
  }
}

}  // namespace
}  // namespace comms::cpu_algorithms
