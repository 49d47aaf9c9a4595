// The UCX plugin's allocator (backends/ucx/host_shared_memory.h) through the
// public API, under commsrun on one host: alloc_backend_memory on cpu:ucx
// gives memory that register_buffer takes (and other memory it refuses), a
// window in it is mapped by every peer (seen in /proc/self/maps) and puts
// into it land, the peers' mappings go at deregistration, offload, finalize
// and abort, and descriptors and mappings stay flat over many cycles.
#include <gtest/gtest.h>

#include <dirent.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "comms/comms.h"
#include "host_shared_mappings.h"

namespace comms {
namespace {

Comm& world() {
  static std::shared_ptr<Comm> c = new_comm("cpu:ucx", Device::cpu(), "host-shared");
  return *c;
}

// Open descriptors of this process.
int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Descriptors of the plugin's memfds (its own allocations; a peer's is
// closed once mapped).
int memfd_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (e->d_name[0] != '.' && readlink(link.c_str(), target, sizeof(target) - 1) > 0) {
      n += std::string(target).find("/memfd:comms-ucx") != std::string::npos;
    }
  }
  closedir(d);
  return n;
}

// What the descriptors are, for a failure message.
std::string fd_targets() {
  std::string out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(link.c_str(), target, sizeof(target) - 1) > 0) out += std::string(e->d_name) + "->" + target + " ";
  }
  closedir(d);
  return out;
}

// Mappings of the plugin's memfds in this process: its own allocations and
// the peers' it mapped.
using testing_support::host_shared_mappings;

struct Allocation {
  Comm& comm;
  uint8_t* data;
  size_t bytes;
  Allocation(Comm& c, size_t n)
      : comm(c), data(static_cast<uint8_t*>(alloc_backend_memory(c, Device::cpu(), n))), bytes(n) {}
  ~Allocation() {
    try {
      free_backend_memory(comm, Device::cpu(), data);
    } catch (const Error& e) {
      ADD_FAILURE() << "free_backend_memory: " << e.what();
    }
  }
  BufferView view() const { return {data, bytes, DataType::kUint8, Device::cpu()}; }
};

template <class F>
void expect_error(ErrorCode code, const std::string& must_say, F&& call) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected " << to_string(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(must_say), std::string::npos) << e.what();
  }
}

uint8_t pattern(int from, int to, size_t i) { return uint8_t(from * 37 + to * 11 + i * 7); }

// Every rank puts `bytes` to its slot in every peer's window (itself too),
// signalled; each then checks what landed.
void put_to_everyone(Comm& c, Window& w, uint8_t* window_data, size_t bytes, uint8_t* src) {
  const int n = c.size(), me = c.rank();
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < bytes; ++i) src[size_t(p) * bytes + i] = pattern(me, p, i);
    w.put(BufferView{src + size_t(p) * bytes, bytes, DataType::kUint8}, p, size_t(me) * bytes, true);
  }
  w.wait_signal(std::vector<uint64_t>(size_t(n), 1));
  for (int from = 0; from < n; ++from) {
    for (size_t i = 0; i < bytes; ++i) {
      if (window_data[size_t(from) * bytes + i] != pattern(from, me, i)) {
        ADD_FAILURE() << "rank " << me << ": byte " << i << " from rank " << from << " is "
                      << int(window_data[size_t(from) * bytes + i]) << ", expected " << int(pattern(from, me, i));
        return;
      }
    }
  }
  c.barrier();  // every check done before the window is reused
}

TEST(UcxHostShared, AllocatorMemoryIsZeroedWritableAndRegistrable) {
  ASSERT_TRUE(can_register_buffers(world(), DeviceType::kCpu));
  Allocation a(world(), 10000);
  for (size_t i = 0; i < a.bytes; ++i) ASSERT_EQ(a.data[i], 0) << "byte " << i;
  std::memset(a.data, 7, a.bytes);
  RegisteredBuffer whole = register_buffer(world(), a.view());
  EXPECT_TRUE(whole.registered());
  // A part of an allocation is inside it too.
  RegisteredBuffer part = register_buffer(world(), BufferView{a.data + 100, 200, DataType::kUint8});
  EXPECT_TRUE(part.registered());
  part.deregister();
  EXPECT_FALSE(part.registered());
  whole.deregister();
}

TEST(UcxHostShared, OtherMemoryAndBadPointersAreRefusedSayingWhy) {
  std::vector<uint8_t> plain(4096);
  expect_error(ErrorCode::kInvalidArgument, "alloc_backend_memory",
               [&] { register_buffer(world(), BufferView::of(plain)); });
  Allocation a(world(), 4096);  // one page: a view one byte past it is not inside
  expect_error(ErrorCode::kInvalidArgument, "alloc_backend_memory",
               [&] { register_buffer(world(), BufferView{a.data, 4097, DataType::kUint8}); });
  expect_error(ErrorCode::kInvalidArgument, "alloc_backend_memory",
               [&] { free_backend_memory(world(), Device::cpu(), plain.data()); });
  expect_error(ErrorCode::kInvalidArgument, "not the start",
               [&] { free_backend_memory(world(), Device::cpu(), a.data + 8); });
  expect_error(ErrorCode::kInvalidArgument, "0 bytes", [&] { alloc_backend_memory(world(), Device::cpu(), 0); });
  a.data[0] = 1;  // still allocated and usable after the refusals
  world().barrier();
}

TEST(UcxHostShared, PeersMapAWindowInAllocatorMemoryAndPutsIntoItLand) {
  Comm& c = world();
  const int n = c.size();
  constexpr size_t kSlot = 3000;  // not a multiple of anything UCX aligns to
  Allocation src(c, kSlot * size_t(n));
  Allocation win(c, kSlot * size_t(n) + 4096);
  const int before = host_shared_mappings();
  // The window starts inside its allocation: peers add the offset.
  Window w = register_window(c, BufferView{win.data + 4096, kSlot * size_t(n), DataType::kUint8});
  EXPECT_EQ(host_shared_mappings(), before + n - 1) << "each peer's window allocation mapped once";
  put_to_everyone(c, w, win.data + 4096, kSlot, src.data);
  // A second window in the same allocation reuses the mappings.
  Window again = register_window(c, BufferView{win.data, 4096, DataType::kUint8});
  EXPECT_EQ(host_shared_mappings(), before + n - 1) << "a second window in the same allocations mapped them again";
  again.deregister();
  EXPECT_EQ(host_shared_mappings(), before + n - 1) << "the first window's mappings went with the second's";
  put_to_everyone(c, w, win.data + 4096, kSlot, src.data);
  w.deregister();
  EXPECT_EQ(host_shared_mappings(), before) << "deregistration left peers' memory mapped";
}

TEST(UcxHostShared, DescriptorsAndMappingsStayFlatOverTwentyCycles) {
  Comm& c = world();
  const int n = c.size();
  auto cycle = [&] {
    Allocation src(c, 64 * size_t(n));
    Allocation win(c, 64 * size_t(n));
    RegisteredBuffer r = register_buffer(c, win.view());
    Window w = register_window(c, win.view());
    put_to_everyone(c, w, win.data, 64, src.data);
    w.deregister();
    r.deregister();
  };
  cycle();  // the windows' UCX worker is made at the first window
  const int fds = open_fds(), memfds = memfd_fds(), maps = host_shared_mappings();
  const std::string before = fd_targets();
  for (int i = 0; i < 20; ++i) cycle();
  EXPECT_EQ(memfd_fds(), memfds);
  // UCX starts its async thread's descriptors (an eventfd, an epoll, a
  // timerfd and a socket) when its timers say, which under load can fall
  // inside these cycles: that is 4 once. A descriptor leaked per cycle would
  // be 20 or more.
  EXPECT_LE(open_fds(), fds + 4) << "before: " << before << "\nafter: " << fd_targets();
  EXPECT_EQ(host_shared_mappings(), maps);
}

TEST(UcxHostShared, OffloadFinalizeAndAbortReleaseThePeersMappings) {
  const int n = world().size();
  std::vector<int> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) all[size_t(r)] = r;
  Allocation win(world(), 4096);
  const int before = host_shared_mappings();
  auto c = world().split(all, "host-shared-life");
  Window w = register_window(*c, win.view());
  EXPECT_EQ(host_shared_mappings(), before + n - 1);
  c->offload_backend(DeviceType::kCpu);
  EXPECT_EQ(host_shared_mappings(), before) << "after offload";
  c->reload_backend(DeviceType::kCpu);
  Window again = register_window(*c, win.view());
  EXPECT_EQ(host_shared_mappings(), before + n - 1) << "after reload and a new window";
  c->barrier();
  c->finalize();
  EXPECT_EQ(host_shared_mappings(), before) << "after finalize";

  auto d = world().split(all, "host-shared-abort");
  Window doomed = register_window(*d, win.view());
  EXPECT_EQ(host_shared_mappings(), before + n - 1);
  testing_support::expect_abort_unmaps(*d, before, "test: a comm with a window in shared memory aborted");
  world().barrier();
}

}  // namespace
}  // namespace comms
