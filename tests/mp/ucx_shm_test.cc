// The UCX plugin's shared-memory collectives (backends/ucx/shm_collectives.h),
// under commsrun at 2 to 4 ranks on one host: a comm with them ("shm") and one
// without (COMMS_UCX_SHM=0, "ucx") run the same ops on the same inputs, and
// every result must match the closed-form oracle and be bit-identical across
// the two paths, at sizes on both sides of the switch. Inputs of the
// floating types are chosen so that the reduction order changes the bits.
// Faults on the shm path (a killed peer, a skipped op, abort) are in
// tests/mp/fault_test.cc (UcxFaults).
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comms/comms.h"
#include "comms/numeric.h"
#include "op_oracle.h"

namespace comms {
namespace {

// The path's limit per rank (kShmMaxBytes in backends/ucx/ucx_plan.h).
constexpr size_t kShmMaxBytes = 16 * 1024;

struct Comms {
  std::shared_ptr<Comm> shm, ucx;
  Comms() {
    shm = new_comm("cpu:ucx", Device::cpu(), "shm");
    setenv("COMMS_UCX_SHM", "0", 1);
    ucx = new_comm("cpu:ucx", Device::cpu(), "ucx");
    unsetenv("COMMS_UCX_SHM");
  }
};

Comms& comms() {
  static Comms c;
  return c;
}

// Element counts per rank around the switch, and small ones.
std::vector<size_t> counts_around_switch(DataType t, size_t per_rank_blocks) {
  const size_t es = element_size(t);
  const size_t limit = kShmMaxBytes / per_rank_blocks / es;
  return {1, 3, 1000 / es, limit - 1, limit, limit + 1};
}

// Values whose sum depends on the order it is taken in for floating types
// (mixed magnitudes); the oracle's exact values for the others.
double input(DataType t, const ReduceOp& op, int rank, size_t i) {
  if (is_floating_point(t) && op.kind == ReduceKind::kSum) {
    return ((i * 7 + static_cast<size_t>(rank) * 13) % 17) * (rank % 2 ? 1e-3 : 1.0) + 0.1 * rank;
  }
  return oracle::reduce_input(t, op.kind, rank, i);
}

std::vector<uint8_t> fill(DataType t, const ReduceOp& op, int rank, size_t count) {
  std::vector<uint8_t> b(count * element_size(t) + 1);
  for (size_t i = 0; i < count; ++i) oracle::store(b.data(), t, i, input(t, op, rank, i));
  return b;
}

BufferView view(std::vector<uint8_t>& b, DataType t, size_t count, size_t offset = 0) {
  return {b.data() + offset * element_size(t), count, t, Device::cpu()};
}

std::string what(const char* op, DataType t, const ReduceOp& r, size_t count, bool in_place) {
  return std::string(op) + " " + std::string(to_string(t)) + " " + to_string(r) + " count " + std::to_string(count) +
         (in_place ? " in place" : " out of place") + " at " + std::to_string(comms().shm->size()) + " ranks";
}

TEST(UcxShm, TheCommUsesTheSharedMemoryPathAndTheDisabledOneDoesNot) {
  EXPECT_NE(comms().shm->describe().find("\"shm_collectives\": \"on"), std::string::npos) << comms().shm->describe();
  EXPECT_NE(comms().ucx->describe().find("\"shm_collectives\": \"off (COMMS_UCX_SHM)"), std::string::npos)
      << comms().ucx->describe();
  // describe()'s path table says so too.
  EXPECT_NE(comms().shm->describe().find("\"path\": \"shm\""), std::string::npos) << comms().shm->describe();
  EXPECT_EQ(comms().ucx->describe().find("\"path\": \"shm\""), std::string::npos) << comms().ucx->describe();
}

TEST(UcxShm, TheSegmentIsUnlinkedOnceEveryRankMappedIt) {
  // Rank 0 names it after its pid: nothing of it may be left in /dev/shm,
  // so a crash from here on leaves nothing behind.
  if (comms().shm->rank() != 0) return;
  const std::string mine = "comms-ucx-" + std::to_string(getpid()) + "-";
  DIR* d = opendir("/dev/shm");
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) EXPECT_NE(std::strncmp(e->d_name, mine.c_str(), mine.size()), 0) << e->d_name;
  closedir(d);
}

TEST(UcxShm, AllReduceMatchesTheOracleAndTheUcxPathBitForBit) {
  auto& c = comms();
  const int rank = c.shm->rank(), size = c.shm->size();
  for (DataType t : oracle::all_data_types()) {
    for (const ReduceOp& op : oracle::reductions_for(t)) {
      for (size_t count : counts_around_switch(t, 1)) {
        for (bool in_place : {false, true}) {
          auto a = fill(t, op, rank, count), b = a, out_a = a, out_b = a;
          if (in_place) {
            c.shm->all_reduce(view(a, t, count), op);
            c.ucx->all_reduce(view(b, t, count), op);
          } else {
            c.shm->all_reduce(view(a, t, count), view(out_a, t, count), op);
            c.ucx->all_reduce(view(b, t, count), view(out_b, t, count), op);
          }
          const auto& got_a = in_place ? a : out_a;
          const auto& got_b = in_place ? b : out_b;
          ASSERT_EQ(std::memcmp(got_a.data(), got_b.data(), count * element_size(t)), 0)
              << what("all_reduce", t, op, count, in_place) << ": the two paths differ";
          if (is_floating_point(t) && op.kind == ReduceKind::kSum) continue;  // order-dependent inputs
          for (size_t i = 0; i < count; ++i) {
            const double want = oracle::round_to(t, oracle::expected_reduction(t, op, size, i));
            const double have = numeric::load_as_double(got_a.data(), t, i);
            ASSERT_TRUE(oracle::matches(t, want, have))
                << what("all_reduce", t, op, count, in_place) << " index " << i << ": " << have << " != " << want;
          }
        }
      }
    }
  }
}

TEST(UcxShm, ReduceScatterAllGatherAndBroadcastMatchTheUcxPath) {
  auto& c = comms();
  const int rank = c.shm->rank(), size = c.shm->size();
  const size_t n = static_cast<size_t>(size);
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kInt8, DataType::kBfloat16}) {
    const ReduceOp sum = ReduceOp::sum();
    for (size_t count : counts_around_switch(t, n)) {
      auto in = fill(t, sum, rank, count * n), out_a = in, out_b = in;
      c.shm->reduce_scatter(view(in, t, count * n), view(out_a, t, count), sum);
      c.ucx->reduce_scatter(view(in, t, count * n), view(out_b, t, count), sum);
      ASSERT_EQ(std::memcmp(out_a.data(), out_b.data(), count * element_size(t)), 0)
          << what("reduce_scatter", t, sum, count, false);
    }
    for (size_t count : counts_around_switch(t, 1)) {
      std::vector<uint8_t> mine(count * element_size(t) + 1), all_a(count * n * element_size(t) + 1), all_b;
      for (size_t i = 0; i < count; ++i) oracle::store(mine.data(), t, i, oracle::data_value(t, rank, i));
      all_b = all_a;
      c.shm->all_gather(view(mine, t, count), view(all_a, t, count * n));
      c.ucx->all_gather(view(mine, t, count), view(all_b, t, count * n));
      ASSERT_EQ(all_a, all_b) << what("all_gather", t, sum, count, false);
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(numeric::load_as_double(all_a.data(), t, static_cast<size_t>(r) * count + i),
                    oracle::round_to(t, oracle::data_value(t, r, i)))
              << what("all_gather", t, sum, count, false) << " block " << r << " index " << i;
        }
      }
      for (int root = 0; root < size; ++root) {
        std::vector<uint8_t> a(mine.size(), 0), b(mine.size(), 0);
        if (rank == root) a = b = mine;
        c.shm->broadcast(view(a, t, count), root);
        c.ucx->broadcast(view(b, t, count), root);
        ASSERT_EQ(a, b) << what("broadcast", t, sum, count, false) << " root " << root;
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(numeric::load_as_double(a.data(), t, i), oracle::round_to(t, oracle::data_value(t, root, i)))
              << what("broadcast", t, sum, count, false) << " root " << root << " index " << i;
        }
      }
    }
  }
}

// Ranks far out of step: each rank's slots are reused every 8 ops, so a
// rank that runs ahead (a broadcast's root waits for no one) must wait for
// the others to read before it writes a slot again.
TEST(UcxShm, ManyBackToBackOpsWithARankThatLagsStayCorrect) {
  auto& c = comms();
  const int rank = c.shm->rank(), size = c.shm->size();
  for (int i = 0; i < 300; ++i) {
    if (rank == i % size && i % 7 == 0) usleep(2000);
    std::vector<float> x(5, static_cast<float>(rank + i));
    if (i % 3 == 2) {
      c.shm->barrier();
      continue;
    }
    if (i % 3 == 1) {
      c.shm->broadcast(BufferView::of(x), i % size);
      ASSERT_EQ(x[4], static_cast<float>(i % size + i)) << "op " << i;
      continue;
    }
    // Every other all_reduce async: it runs on the backend's worker thread.
    OpOptions async;
    async.async = i % 2 == 0;
    c.shm->all_reduce(BufferView::of(x), ReduceOp::sum(), async).wait();
    ASSERT_EQ(x[0], static_cast<float>(size * i + size * (size - 1) / 2)) << "op " << i;
  }
}

// A broadcast's root waits for no reader: with the readers late, it runs up
// to the slot depth ahead and then must wait, never overwriting an unread op.
TEST(UcxShm, BroadcastsFromARootFarAheadOfItsReadersStayCorrect) {
  auto& c = comms();
  const int rank = c.shm->rank();
  for (int round = 0; round < 3; ++round) {
    if (rank != 0) usleep(50000);
    for (int i = 0; i < 40; ++i) {
      std::vector<int32_t> x(100, rank == 0 ? 1000 * round + i : -1);
      c.shm->broadcast(BufferView::of(x), 0);
      ASSERT_EQ(x[0], 1000 * round + i) << "round " << round << " op " << i;
      ASSERT_EQ(x[99], 1000 * round + i) << "round " << round << " op " << i;
    }
  }
}

// A ring all_reduce can end with a rank's last rendezvous send still in
// flight, which only that rank's UCX progress finishes; its peer's receive
// waits on it while the sender already waits in shared memory for the next
// op. The shared-memory wait must progress it (it once stalled both until
// the op timeout).
TEST(UcxShm, ALargeUcxOpFollowedByASmallOneDoesNotStallAPeerThatIsStillReceiving) {
  auto& c = comms();
  OpOptions within;
  within.timeout = std::chrono::seconds(10);
  // Ring segments just over UCX's eager limit (65537 bytes at 4 ranks): the
  // last piece goes rendezvous from a copy the transport keeps in flight.
  std::vector<float> big(65536 + 5), small(2);
  for (int i = 0; i < 10; ++i) {
    std::fill(big.begin(), big.end(), 1.0f);
    small.assign(2, 1.0f);
    c.shm->all_reduce(BufferView::of(big), ReduceOp::sum(), within);
    c.shm->all_reduce(BufferView::of(small), ReduceOp::sum(), within);
    ASSERT_EQ(big.back(), static_cast<float>(c.shm->size())) << "round " << i;
    ASSERT_EQ(small[1], static_cast<float>(c.shm->size())) << "round " << i;
  }
}

}  // namespace
}  // namespace comms
