// The UCX plugin's registry of host-shared allocations
// (backends/ucx/host_shared_memory.h), linked directly: lookups of ranges
// inside and across allocations, release of unknown pointers, concurrent
// use, and mapping an allocation through /proc as a peer does (this process
// stands in for the peer: the kernel treats /proc/self like any pid).
#include "host_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace comms::ucx_backend::host_shared {
namespace {

void* must_allocate(size_t bytes) {
  void* p = nullptr;
  const Status s = allocate(bytes, &p);
  EXPECT_TRUE(s.is_ok()) << s.message;
  return p;
}

TEST(HostSharedMemory, FindsRangesInsideOneAllocationOnly) {
  const size_t before = live_allocations();
  auto* a = static_cast<uint8_t*>(must_allocate(5000));  // two pages
  auto* b = static_cast<uint8_t*>(must_allocate(100));
  EXPECT_EQ(live_allocations(), before + 2);
  const auto whole = find(a, 8192);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_EQ(whole->alloc_bytes, 8192u) << "sizes round up to whole pages";
  const auto inner = find(a + 4000, 100);
  ASSERT_TRUE(inner);
  EXPECT_EQ(inner->offset, 4000u);
  EXPECT_EQ(inner->fd, whole->fd);
  EXPECT_FALSE(find(a + 8000, 200)) << "runs past the allocation's end";
  EXPECT_FALSE(find(a - 1, 2)) << "starts before it";
  std::vector<uint8_t> plain(64);
  EXPECT_FALSE(find(plain.data(), plain.size()));
  const auto other = find(b, 1);
  ASSERT_TRUE(other);
  EXPECT_NE(other->inode, whole->inode);
  EXPECT_TRUE(release(a).is_ok());
  EXPECT_FALSE(find(a, 1)) << "found after release";
  EXPECT_TRUE(release(b).is_ok());
  EXPECT_EQ(live_allocations(), before);
}

TEST(HostSharedMemory, RefusesZeroBytesAndPointersItDidNotAllocate) {
  void* p = nullptr;
  EXPECT_EQ(allocate(0, &p).code, ErrorCode::kInvalidArgument);
  int x = 0;
  EXPECT_EQ(release(&x).code, ErrorCode::kInvalidArgument);
  auto* a = static_cast<uint8_t*>(must_allocate(64));
  EXPECT_EQ(release(a + 1).code, ErrorCode::kInvalidArgument) << "not an allocation's start";
  EXPECT_TRUE(find(a, 64)) << "a refused release touched the allocation";
  EXPECT_TRUE(release(a).is_ok());
  EXPECT_EQ(release(a).code, ErrorCode::kInvalidArgument) << "released twice";
}

TEST(HostSharedMemory, APeerMappingSeesTheSamePagesAndCannotBeShrunkUnderIt) {
  auto* a = static_cast<uint8_t*>(must_allocate(4096));
  const auto at = find(a, 4096);
  ASSERT_TRUE(at);
  std::string why;
  auto* peer = static_cast<uint8_t*>(map_peer(getpid(), *at, &why));
  ASSERT_NE(peer, nullptr) << why;
  peer[10] = 42;
  EXPECT_EQ(a[10], 42);
  a[20] = 7;
  EXPECT_EQ(peer[20], 7);
  EXPECT_NE(ftruncate(at->fd, 0), 0) << "the memfd is not sealed against shrinking";
  unmap_peer(peer, at->alloc_bytes);
  EXPECT_TRUE(release(a).is_ok());
}

TEST(HostSharedMemory, AStaleDescriptorIsRefusedNotMapped) {
  auto* a = static_cast<uint8_t*>(must_allocate(4096));
  const Location old = *find(a, 1);
  EXPECT_TRUE(release(a).is_ok());
  // The descriptor number is free again; a new allocation likely reuses it.
  auto* b = static_cast<uint8_t*>(must_allocate(4096));
  std::string why;
  EXPECT_EQ(map_peer(getpid(), old, &why), nullptr);
  EXPECT_FALSE(why.empty());
  EXPECT_TRUE(release(b).is_ok());
  Location gone = old;
  gone.fd = 1 << 20;  // no such descriptor
  EXPECT_EQ(map_peer(getpid(), gone, &why), nullptr);
  EXPECT_NE(why.find("open /proc/"), std::string::npos) << why;
}

TEST(HostSharedMemory, ThreadsAllocateFindAndReleaseConcurrently) {
  const size_t before = live_allocations();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < 50; ++i) {
        void* p = nullptr;
        if (!allocate(4096, &p).is_ok()) {
          ++failures[size_t(t)];
          continue;
        }
        static_cast<uint8_t*>(p)[0] = uint8_t(t);
        if (!find(p, 4096)) ++failures[size_t(t)];
        if (!release(p).is_ok()) ++failures[size_t(t)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[size_t(t)], 0) << "thread " << t;
  EXPECT_EQ(live_allocations(), before);
}

}  // namespace
}  // namespace comms::ucx_backend::host_shared
