// The UCX zero-copy path (backends/ucx/zero_copy.h) through the public API,
// under commsrun on one host: ops whose buffers every rank took from
// alloc_backend_memory run there (describe()'s zero_copy.ops counts them)
// and give the right result; a mix of allocator and plain memory, or an op
// under the size threshold, takes the usual path with the same result; the
// peers' mappings of freed buffers go at the next op, and all of them at
// offload, finalize and abort.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comms/comms.h"
#include "host_shared_mappings.h"

namespace comms {
namespace {

constexpr size_t kCount = 256 * 1024;  // floats: 1 MiB per rank, over the default threshold

Comm& world() {
  static std::shared_ptr<Comm> c = new_comm("cpu:ucx", Device::cpu(), "zero-copy");
  return *c;
}

std::vector<int> all_ranks(const Comm& c) {
  std::vector<int> all(static_cast<size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) all[size_t(r)] = r;
  return all;
}

int64_t zero_copy_count(const Comm& c, const char* key) {
  return nlohmann::json::parse(c.describe())["backends"]["cpu"]["config"]["zero_copy"][key].get<int64_t>();
}
int64_t zero_copy_ops(const Comm& c) { return zero_copy_count(c, "ops"); }
// The zero-copy ops that found every rank's buffers where the last one did,
// and skipped asking whether every rank mapped them.
int64_t ops_on_held_mappings(const Comm& c) { return zero_copy_count(c, "ops_on_held_mappings"); }

// Mappings of the plugin's memfds in this process: its own allocations and
// the peers' it mapped.
using testing_support::host_shared_mappings;

// Floats from the allocator, or plain memory.
struct Floats {
  Comm& comm;
  bool shared;
  std::vector<float> plain;
  float* data;
  Floats(Comm& c, size_t n, bool from_allocator)
      : comm(c), shared(from_allocator), plain(from_allocator ? 0 : n),
        data(from_allocator ? static_cast<float*>(alloc_backend_memory(c, Device::cpu(), n * sizeof(float)))
                            : plain.data()) {}
  ~Floats() {
    if (!shared) return;
    try {
      free_backend_memory(comm, Device::cpu(), data);
    } catch (const Error& e) {
      ADD_FAILURE() << "free_backend_memory: " << e.what();
    }
  }
  BufferView view(size_t n) const { return BufferView{data, n, DataType::kFloat32}; }
};

// An all_reduce (sum) of rank-dependent values; checks every element.
// `salt` shifts the values, so that a stale output from an op before fails.
void all_reduce_and_check(Comm& c, Floats& in, Floats& out, size_t n, size_t salt = 0) {
  const int size = c.size(), me = c.rank();
  for (size_t i = 0; i < n; ++i) in.data[i] = float(me + 1) * float((i + salt) % 13);
  c.all_reduce(in.view(n), out.view(n), ReduceOp::sum());
  const float ranks = float(size * (size + 1) / 2);
  for (size_t i = 0; i < n; ++i) {
    if (out.data[i] != ranks * float((i + salt) % 13)) {
      ADD_FAILURE() << "rank " << me << ": element " << i << " is " << out.data[i] << ", expected "
                    << ranks * float((i + salt) % 13);
      return;
    }
  }
}

TEST(UcxZeroCopy, AllReduceOnAllocatorMemoryRunsZeroCopyWithTheSum) {
  Comm& c = world();
  Floats in(c, kCount, true), out(c, kCount, true);
  const int64_t before = zero_copy_ops(c);
  all_reduce_and_check(c, in, out, kCount);
  EXPECT_EQ(zero_copy_ops(c), before + 1);
  all_reduce_and_check(c, out, out, kCount);  // in place
  EXPECT_EQ(zero_copy_ops(c), before + 2);
}

// An op on the buffers of the op before (every rank's) skips the check that
// every rank mapped them; new buffers, other placements or another op's
// needs ask again. Every result is checked, with values new to each op.
TEST(UcxZeroCopy, AnOpOnTheLastOpsBuffersSkipsTheMappingCheckWithTheRightResult) {
  Comm& c = world();
  Floats in(c, kCount, true), out(c, kCount, true);
  const int64_t ops = zero_copy_ops(c), held = ops_on_held_mappings(c);
  all_reduce_and_check(c, in, out, kCount, 1);  // new allocations
  EXPECT_EQ(ops_on_held_mappings(c), held);
  all_reduce_and_check(c, in, out, kCount, 2);
  all_reduce_and_check(c, in, out, kCount, 3);
  EXPECT_EQ(ops_on_held_mappings(c), held + 2);
  all_reduce_and_check(c, out, out, kCount, 4);  // in place: another input
  EXPECT_EQ(ops_on_held_mappings(c), held + 2);
  all_reduce_and_check(c, out, out, kCount, 5);
  EXPECT_EQ(ops_on_held_mappings(c), held + 3);
  // A broadcast needs no input on the ranks other than the root.
  for (size_t i = 0; i < kCount; ++i) out.data[i] = c.rank() == 0 ? float(i % 7) : -1.0f;
  c.broadcast(out.view(kCount), 0);
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out.data[i], float(i % 7)) << "element " << i;
  EXPECT_EQ(ops_on_held_mappings(c), held + 3);
  {
    Floats other(c, kCount, true);  // a new input on every rank
    all_reduce_and_check(c, other, out, kCount, 6);
    all_reduce_and_check(c, other, out, kCount, 7);
  }
  EXPECT_EQ(ops_on_held_mappings(c), held + 4);
  all_reduce_and_check(c, in, out, kCount, 8);  // `other` was freed: ask again
  EXPECT_EQ(ops_on_held_mappings(c), held + 4);
  EXPECT_EQ(zero_copy_ops(c), ops + 9);  // eight all_reduces and the broadcast
}

TEST(UcxZeroCopy, AMixOfAllocatorAndPlainMemoryTakesTheUsualPathWithTheSameResult) {
  Comm& c = world();
  const int64_t before = zero_copy_ops(c);
  {
    // Only rank 0's buffers are host-shared: every rank falls back.
    Floats in(c, kCount, c.rank() == 0), out(c, kCount, c.rank() == 0);
    all_reduce_and_check(c, in, out, kCount);
  }
  {
    // Every input host-shared, every output plain.
    Floats in(c, kCount, true), out(c, kCount, false);
    all_reduce_and_check(c, in, out, kCount);
  }
  EXPECT_EQ(zero_copy_ops(c), before) << "an op ran zero-copy although some buffer was not host-shared";
}

TEST(UcxZeroCopy, TheThresholdHintDecidesWhichSizesRunZeroCopy) {
  Comm& c = world();
  const int64_t before = zero_copy_ops(c);
  Floats in(c, kCount, true), out(c, kCount, true);
  all_reduce_and_check(c, in, out, 1000);  // 4000 bytes: under the default threshold
  EXPECT_EQ(zero_copy_ops(c), before);
  SplitOptions o;
  o.hints = {{"ucx.zero_copy_min_bytes", "4K"}};
  auto small = c.split(all_ranks(c), "zero-copy-small", o);
  const auto config = nlohmann::json::parse(small->describe())["backends"]["cpu"]["config"]["zero_copy"];
  EXPECT_EQ(config["min_bytes"], 4096) << config;
  all_reduce_and_check(*small, in, out, 1024);
  all_reduce_and_check(*small, in, out, 1023);  // one element under it
  EXPECT_EQ(zero_copy_ops(*small), 1);
  small->finalize();
}

// A peer that frees a buffer it used moves its count of releases; each
// other rank then drops its mappings of that peer's buffers at the next op,
// so cycles of allocate, op and free leave the mappings flat.
TEST(UcxZeroCopy, MappingsOfFreedBuffersGoAtTheNextOp) {
  Comm& c = world();
  auto cycle = [&] {
    Floats in(c, kCount, true), out(c, kCount, true);
    all_reduce_and_check(c, in, out, kCount);
    c.barrier();  // every rank's op is over before any rank frees
  };
  cycle();
  const int maps = host_shared_mappings();
  const int64_t before = zero_copy_ops(c);
  for (int i = 0; i < 10; ++i) cycle();
  EXPECT_EQ(zero_copy_ops(c), before + 10);
  EXPECT_EQ(host_shared_mappings(), maps) << "peers' freed buffers stayed mapped";
}

TEST(UcxZeroCopy, OffloadFinalizeAndAbortUnmapThePeersBuffers) {
  const int n = world().size();
  Floats in(world(), kCount, true), out(world(), kCount, true);
  const int before = host_shared_mappings();
  auto c = world().split(all_ranks(world()), "zero-copy-life");
  all_reduce_and_check(*c, in, out, kCount);
  EXPECT_EQ(host_shared_mappings(), before + 2 * (n - 1)) << "each peer's input and output mapped once";
  c->offload_backend(DeviceType::kCpu);
  EXPECT_EQ(host_shared_mappings(), before) << "after offload";
  c->reload_backend(DeviceType::kCpu);
  all_reduce_and_check(*c, in, out, kCount);
  EXPECT_EQ(zero_copy_ops(*c), 1) << "the reloaded backend counts from 0";
  EXPECT_EQ(host_shared_mappings(), before + 2 * (n - 1));
  c->finalize();
  EXPECT_EQ(host_shared_mappings(), before) << "after finalize";

  auto d = world().split(all_ranks(world()), "zero-copy-abort");
  all_reduce_and_check(*d, in, out, kCount);
  EXPECT_EQ(host_shared_mappings(), before + 2 * (n - 1));
  testing_support::expect_abort_unmaps(*d, before, "test: a comm that ran zero-copy aborted");
  world().barrier();
}

}  // namespace
}  // namespace comms
