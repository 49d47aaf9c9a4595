// What the NCCL loaded at run time decides, on the fake NCCL at 2.28, 2.29
// and 2.30: result 8 (ncclTimeout from 2.30), native all_to_all/gather/
// scatter, offload by suspend and windows with their one-sided ops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "nccl_backend.h"
#include "nccl_backend_for_tests.h"
#include "nccl_test_support.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::Backend;
using plugin::OpDesc;
using plugin::OpType;
using plugin::WindowOpDesc;
using plugin::WindowOpType;
using testing::FakeNcclApi;
using testing::MemoryStore;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int k228 = 22809, k229 = 22907, k230 = 23007;

class NcclVersionsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> make(int version, int rank = 0, int size = 1, bool eager = true) {
    api->set_version(version);
    std::unique_ptr<Backend> b;
    Status s = create_nccl_backend(api, testing::backend_init(store, rank, size, {}, eager), &b,
                                   {.watchdog_interval = 5ms});
    EXPECT_TRUE(s.is_ok()) << s.message;
    if (b && eager) {
      s = b->init();
      EXPECT_TRUE(s.is_ok()) << s.message;
    }
    return b;
  }

  static OpDesc op(OpType type, size_t count = 4) {
    OpDesc d;
    d.type = type;
    d.seq = 1;
    d.count = count;
    d.dtype = DataType::kFloat32;
    d.device = Device::cuda(0);
    d.input = reinterpret_cast<const void*>(0x10000);
    d.output = reinterpret_cast<void*>(0x20000);
    d.async = true;
    return d;
  }

  // The names of the NCCL calls that ran, in order.
  std::vector<std::string> executed() {
    auto l = api->lock();
    std::vector<std::string> out;
    for (const auto& c : api->executed) out.push_back(c.name);
    return out;
  }
  void clear_calls() {
    auto l = api->lock();
    api->calls.clear();
    api->executed.clear();
  }
  nlohmann::json describe(Backend& b) { return nlohmann::json::parse(b.describe()); }

  std::shared_ptr<FakeNcclApi> api = std::make_shared<FakeNcclApi>();
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
};

TEST_F(NcclVersionsTest, TheFakeExposesEachReleasesEntryPoints) {
  struct Row {
    int version;
    bool native, suspend, one_sided, revoke, grow;
  };
  for (const Row& r : {Row{22703, false, false, false, false, false}, Row{k228, true, false, false, true, false},
                       Row{k229, true, true, true, true, true}, Row{k230, true, true, true, true, true}}) {
    api->set_version(r.version);
    EXPECT_EQ(api->loaded_version(), r.version);
    EXPECT_EQ(api->has_native_collectives(), r.native) << r.version;
    EXPECT_EQ(api->has_suspend(), r.suspend) << r.version;
    EXPECT_EQ(api->has_one_sided(), r.one_sided) << r.version;
    EXPECT_EQ(api->has_revoke(), r.revoke) << r.version;
    EXPECT_EQ(api->has_grow(), r.grow) << r.version;
    ncclUniqueId id;
    EXPECT_EQ(api->comm_get_unique_id(nullptr, &id) == ncclSuccess, r.grow) << r.version;
    uint64_t value = 0;
    EXPECT_EQ(api->comm_mem_stats(nullptr, MemStat::kTotal, &value) == ncclSuccess, r.suspend) << r.version;
  }
}

// Result 8 is ncclTimeout from NCCL 2.30; before, it is ncclNumResults, so
// the same number from an older library is not read as a timeout.
TEST_F(NcclVersionsTest, ResultEightIsATimeoutOnlyFromNccl230) {
  for (int version : {k229, k230}) {
    auto b = make(version);
    api->events_complete_on_record = false;
    std::unique_ptr<plugin::Work> w;
    ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
    {
      auto l = api->lock();
      api->async_error = static_cast<ncclResult_t>(kNcclTimeoutResult);
    }
    Status s = w->wait(WaitMode::kBlocking);
    EXPECT_EQ(s.code, version >= k230 ? ErrorCode::kTimeout : ErrorCode::kInternal) << version;
    EXPECT_THAT(s.message, HasSubstr("NCCL (asynchronous error)"));
    {
      auto l = api->lock();
      api->async_error = ncclSuccess;
      api->events_complete_on_record = true;
    }
  }
}

// NCCL's own timeout during init keeps NCCL's words (not the plugin's
// "did not finish within", which is for its own deadline).
TEST_F(NcclVersionsTest, NcclsOwnTimeoutInInitIsATimeoutInItsWords) {
  api->set_version(k230);
  api->async_error = static_cast<ncclResult_t>(kNcclTimeoutResult);
  std::unique_ptr<Backend> b;
  ASSERT_TRUE(create_nccl_backend(api, testing::backend_init(store), &b, {.watchdog_interval = 5ms}).is_ok());
  Status s = b->init();
  EXPECT_EQ(s.code, ErrorCode::kTimeout);
  EXPECT_THAT(s.message, HasSubstr("ncclCommInitRankConfig failed: operation timed out"));
}

TEST_F(NcclVersionsTest, AllToAllGatherScatterAreNativeFrom228AndGroupedSendRecvBefore) {
  for (int version : {22703, k228}) {
    auto b = make(version, 0, 1);
    EXPECT_EQ(describe(*b)["native_all_to_all_gather_scatter"], version >= k228);
    for (OpType t : {OpType::kAllToAll, OpType::kGather, OpType::kScatter}) {
      clear_calls();
      std::unique_ptr<plugin::Work> w;
      OpDesc d = op(t);
      d.root = 0;
      ASSERT_TRUE(b->submit(d, &w).is_ok()) << plugin::op_name(t);
      ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
      const std::vector<std::string> ran = executed();
      if (version >= k228) {
        EXPECT_THAT(ran, ElementsAre(std::string(plugin::op_name(t)))) << version;
      } else {
        // One rank: its own slice goes by a send and a receive to itself.
        EXPECT_THAT(ran, ElementsAre("send", "recv")) << plugin::op_name(t);
      }
    }
    ASSERT_TRUE(b->finalize().is_ok());
  }
}

// --- offload by suspend ---------------------------------------------------

TEST_F(NcclVersionsTest, SuspendBelow229IsUnsupportedNamingTheLoadedNccl) {
  auto b = make(k228);
  Status s = b->suspend();
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("NCCL >= 2.29.0"));
  EXPECT_THAT(s.message, HasSubstr("the loaded NCCL is 2.28.9"));
  EXPECT_EQ(describe(*b)["suspend"]["available"], false);
  // Nothing changed: the comm still runs ops.
  std::unique_ptr<plugin::Work> w;
  EXPECT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
}

TEST_F(NcclVersionsTest, SuspendReleasesMemoryKeepsTheCommAndResumeNeedsNoRendezvous) {
  api->mem_total = {80ull << 30};
  api->mem_free = {70ull << 30};
  auto b = make(k229);
  void* handle = nullptr;
  ASSERT_TRUE(b->register_buffer(reinterpret_cast<void*>(0x5000), 64, &handle).is_ok());
  const int64_t used_before = b->device_memory_used();
  ASSERT_TRUE(b->suspend().is_ok());
  EXPECT_EQ(b->device_memory_used(), used_before - static_cast<int64_t>(api->suspendable_bytes));
  ncclComm_t comm = nullptr;
  {
    auto l = api->lock();
    ASSERT_EQ(api->created_comms.size(), 1u);
    comm = api->created_comms[0];
    EXPECT_TRUE(api->suspended.count(comm));
    EXPECT_TRUE(api->registrations.empty()) << "suspend deregisters what the caller left";
    EXPECT_EQ(api->destroys, 0);
    EXPECT_EQ(api->aborts, 0);
  }
  auto j = describe(*b)["suspend"];
  EXPECT_EQ(j["suspended"], true);
  EXPECT_EQ(j["mem_stats_before_suspend"]["suspendable"], api->suspendable_bytes);
  EXPECT_EQ(j["mem_stats_before_suspend"]["suspended"], false);
  EXPECT_EQ(j["mem_stats_after_suspend"]["suspendable"], 0);
  EXPECT_EQ(j["mem_stats_after_suspend"]["suspended"], true);
  EXPECT_EQ(j["mem_stats_after_suspend"]["persistent"], api->persistent_bytes);
  // The handle died with the suspend, as with a re-created backend.
  EXPECT_EQ(b->deregister_buffer(handle).code, ErrorCode::kInvalidArgument);

  ASSERT_TRUE(b->resume().is_ok());
  EXPECT_EQ(b->device_memory_used(), used_before);
  {
    auto l = api->lock();
    EXPECT_EQ(api->comm_inits, 1) << "resume must not rendezvous again";
    EXPECT_TRUE(api->suspended.empty());
  }
  j = describe(*b)["suspend"];
  EXPECT_EQ(j["suspended"], false);
  EXPECT_EQ(j["suspends"], 1);
  EXPECT_EQ(j["resumes"], 1);
  EXPECT_EQ(j["mem_stats_after_resume"]["suspendable"], api->suspendable_bytes);
  clear_calls();
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  {
    auto l = api->lock();
    ASSERT_EQ(api->executed.size(), 1u);
    EXPECT_EQ(api->executed[0].comm, comm) << "the same communicator runs after the resume";
  }
  ASSERT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclVersionsTest, SuspendIsIdempotentAndResumeOfARunningCommIsRefused) {
  auto b = make(k230);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());  // finished, maybe not yet polled
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  EXPECT_EQ(b->resume().code, ErrorCode::kInvalidArgument);
  ASSERT_TRUE(b->suspend().is_ok());
  ASSERT_TRUE(b->suspend().is_ok());
  {
    auto l = api->lock();
    int suspends = 0;
    for (const auto& c : api->calls) suspends += c.name == "comm_suspend";
    EXPECT_EQ(suspends, 1);
  }
  ASSERT_TRUE(b->resume().is_ok());
  EXPECT_EQ(b->resume().code, ErrorCode::kInvalidArgument);
}

TEST_F(NcclVersionsTest, AFailedSuspendAbortsTheCommunicatorAndSaysWhy) {
  auto b = make(k229);
  {
    auto l = api->lock();
    api->suspend_result = ncclInternalError;
  }
  Status s = b->suspend();
  EXPECT_EQ(s.code, ErrorCode::kInternal);
  EXPECT_THAT(s.message, HasSubstr("ncclCommSuspend failed"));
  EXPECT_EQ(api->aborts, 1);
  std::unique_ptr<plugin::Work> w;
  EXPECT_EQ(b->submit(op(OpType::kAllReduce), &w).code, ErrorCode::kAborted);
  EXPECT_EQ(b->resume().code, ErrorCode::kAborted);
}

TEST_F(NcclVersionsTest, FinalizeOfASuspendedCommAbortsItWithoutResuming) {
  auto b = make(k229);
  ASSERT_TRUE(b->suspend().is_ok());
  ASSERT_TRUE(b->finalize().is_ok());
  auto l = api->lock();
  EXPECT_EQ(api->aborts, 1);
  EXPECT_EQ(api->finalizes, 0);
  for (const auto& c : api->calls) EXPECT_NE(c.name, "comm_resume");
}

TEST_F(NcclVersionsTest, ALazyCommSuspendsWithoutACommunicatorAndConnectsAfterResume) {
  auto b = make(k229, 0, 1, /*eager=*/false);
  ASSERT_TRUE(b->suspend().is_ok());
  ASSERT_TRUE(b->resume().is_ok());
  EXPECT_EQ(api->comm_inits, 0);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
  EXPECT_EQ(api->comm_inits, 1);
}

// --- windows --------------------------------------------------------------

class NcclWindowsTest : public NcclVersionsTest {
 protected:
  static WindowOpDesc wop(WindowOpType type, void* window, int peer = 0) {
    WindowOpDesc d;
    d.type = type;
    d.seq = 7;
    d.window = window;
    d.input = reinterpret_cast<const void*>(0x30000);
    d.bytes = 256;
    d.peer = peer;
    d.offset = 512;
    d.signal = true;
    d.async = true;
    return d;
  }
  Status run(Backend& b, const WindowOpDesc& d) {
    std::unique_ptr<plugin::Work> w;
    if (Status s = b.submit_window(d, &w); !s.is_ok()) return s;
    return w ? w->wait(WaitMode::kBlocking) : Status();
  }
};

TEST_F(NcclWindowsTest, Below229WindowsAreUnsupportedNamingNcclAndTheLoadedVersion) {
  auto b = make(k228);
  void* win = nullptr;
  Status s = b->register_window(reinterpret_cast<void*>(0x40000), 4096, &win);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("nccl"));
  EXPECT_THAT(s.message, HasSubstr("NCCL >= 2.29.0"));
  EXPECT_THAT(s.message, HasSubstr("the loaded NCCL is 2.28.9"));
  EXPECT_EQ(win, nullptr);
  EXPECT_EQ(run(*b, wop(WindowOpType::kSignal, nullptr)).code, ErrorCode::kUnsupported);
  auto l = api->lock();
  EXPECT_TRUE(api->windows.empty());
}

TEST_F(NcclWindowsTest, PutSignalAndWaitSignalReachNcclWithTheirArguments) {
  for (int version : {k229, k230}) {
    auto b = make(version, 0, 3);
    void* win = nullptr;
    ASSERT_TRUE(b->register_window(reinterpret_cast<void*>(0x40000), 4096, &win).is_ok()) << version;
    clear_calls();
    ASSERT_TRUE(run(*b, wop(WindowOpType::kPut, win, 2)).is_ok());
    ASSERT_TRUE(run(*b, wop(WindowOpType::kSignal, win, 1)).is_ok());
    WindowOpDesc wait = wop(WindowOpType::kWaitSignal, win);
    const uint64_t counts[] = {0, 3, 1};
    wait.signal_counts = counts;
    ASSERT_TRUE(run(*b, wait).is_ok());
    auto l = api->lock();
    ASSERT_EQ(api->executed.size(), 3u);
    const auto& put = api->executed[0];
    EXPECT_EQ(put.name, "put_signal");
    EXPECT_EQ(put.in, reinterpret_cast<const void*>(0x30000));
    EXPECT_EQ(put.count, 256u);
    EXPECT_EQ(put.dtype, ncclUint8);
    EXPECT_EQ(put.root_or_peer, 2);
    EXPECT_EQ(put.window, static_cast<ncclWindow_t>(win));
    EXPECT_EQ(put.offset, 512u);
    EXPECT_EQ(api->executed[1].name, "signal");
    EXPECT_EQ(api->executed[1].root_or_peer, 1);
    const auto& waited = api->executed[2];
    EXPECT_EQ(waited.name, "wait_signal");
    ASSERT_EQ(waited.waits.size(), 2u) << "one descriptor per rank with a nonzero count";
    EXPECT_EQ(waited.waits[0].peer, 1);
    EXPECT_EQ(waited.waits[0].op_count, 3);
    EXPECT_EQ(waited.waits[1].peer, 2);
    EXPECT_EQ(waited.waits[1].op_count, 1);
  }
}

TEST_F(NcclWindowsTest, UnsignalledPutAndFlushAreUnsupportedWithTheReason) {
  auto b = make(k230, 0, 2);
  void* win = nullptr;
  ASSERT_TRUE(b->register_window(reinterpret_cast<void*>(0x40000), 4096, &win).is_ok());
  clear_calls();
  WindowOpDesc put = wop(WindowOpType::kPut, win, 1);
  put.signal = false;
  Status s = run(*b, put);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("only ncclPutSignal"));
  s = run(*b, wop(WindowOpType::kFlush, win));
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("no remote completion"));
  EXPECT_TRUE(executed().empty());
  // Refused before anything moved: the comm still works.
  EXPECT_TRUE(run(*b, wop(WindowOpType::kPut, win, 1)).is_ok());
}

TEST_F(NcclWindowsTest, WindowsAreReleasedAtFinalizeSuspendAndAbort) {
  auto b = make(k229, 0, 2);
  void* w1 = nullptr;
  void* w2 = nullptr;
  ASSERT_TRUE(b->register_window(reinterpret_cast<void*>(0x40000), 4096, &w1).is_ok());
  ASSERT_TRUE(b->register_window(reinterpret_cast<void*>(0x50000), 4096, &w2).is_ok());
  ASSERT_TRUE(b->deregister_window(w1).is_ok());
  EXPECT_EQ(b->deregister_window(w1).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(describe(*b)["windows_registered"], 1);
  ASSERT_TRUE(b->suspend().is_ok());
  {
    auto l = api->lock();
    EXPECT_TRUE(api->windows.empty()) << "suspend releases the windows";
  }
  EXPECT_EQ(run(*b, wop(WindowOpType::kPut, w2, 1)).code, ErrorCode::kInvalidArgument);
  ASSERT_TRUE(b->resume().is_ok());
  ASSERT_TRUE(b->register_window(reinterpret_cast<void*>(0x40000), 4096, &w1).is_ok());
  ASSERT_TRUE(b->finalize().is_ok());
  {
    auto l = api->lock();
    EXPECT_TRUE(api->windows.empty()) << "finalize releases the windows";
  }

  auto c = make(k229, 0, 2);
  ASSERT_TRUE(c->register_window(reinterpret_cast<void*>(0x40000), 4096, &w1).is_ok());
  c->abort("test");
  Status s = run(*c, wop(WindowOpType::kPut, w1, 1));
  EXPECT_EQ(s.code, ErrorCode::kAborted);
  EXPECT_THAT(s.message, HasSubstr("comm aborted: test"));
  EXPECT_EQ(describe(*c)["windows_registered"], 0);
}

TEST_F(NcclWindowsTest, AWaitForSignalsThatNeverComeTimesOut) {
  auto b = make(k230, 0, 2);
  void* win = nullptr;
  ASSERT_TRUE(b->register_window(reinterpret_cast<void*>(0x40000), 4096, &win).is_ok());
  api->events_complete_on_record = false;
  WindowOpDesc wait = wop(WindowOpType::kWaitSignal, win);
  const uint64_t counts[] = {0, 1};
  wait.signal_counts = counts;
  wait.timeout = 50ms;
  const auto start = std::chrono::steady_clock::now();
  Status s = run(*b, wait);
  EXPECT_EQ(s.code, ErrorCode::kTimeout);
  EXPECT_THAT(s.message, HasSubstr("wait_signal #7"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace comms::nccl
