// Elastic recovery in the NCCL backend, with FakeNcclApi standing in for
// NCCL: revoke (ncclCommRevoke, else abort) and shrink (ncclCommShrink, else
// kUnsupported so that libcomms re-creates the comm), each depending on what
// the "loaded NCCL" has.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "nccl_backend.h"
#include "nccl_test_support.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::Backend;
using plugin::BackendInit;
using plugin::OpDesc;
using plugin::OpType;
using testing::FakeNcclApi;
using testing::MemoryStore;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NcclShrinkTest : public ::testing::Test {
 protected:
  BackendInit make_init(int rank, int size, std::shared_ptr<MemoryStore> s, Hints hints = {}) {
    BackendInit init;
    init.comm_name = "world";
    init.rank = rank;
    init.size = size;
    init.local_rank = 0;
    init.device = Device::cuda(0);
    init.eager = true;
    init.store = std::move(s);
    init.init_timeout = 2s;
    init.op_timeout = 2s;
    init.hints = std::move(hints);
    return init;
  }

  // Rank `rank` of a `size`-rank comm, connected (rank 0's unique id is in the store).
  std::unique_ptr<Backend> parent(int rank, int size, Hints hints = {}) {
    store->set("nccl/unique_id", std::string(128, 'x'));
    std::unique_ptr<Backend> b;
    Status s = create_nccl_backend(api, make_init(rank, size, store, std::move(hints)), &b,
                                   {.watchdog_interval = 5ms});
    EXPECT_TRUE(s.is_ok()) << s.message;
    if (b) { EXPECT_TRUE(b->init().is_ok()); }
    return b;
  }

  // The survivors' shrink desc: this rank is child rank `child_rank`; the
  // other survivors' votes (for ncclCommShrink or not) are already in the
  // child's store.
  plugin::SplitDesc shrink_desc(std::span<const int> ranks, int child_rank, Hints hints = {},
                                const std::string& others_vote = "1") {
    plugin::SplitDesc desc;
    desc.ranks = ranks;
    desc.child = make_init(child_rank, static_cast<int>(ranks.size()), child_store, std::move(hints));
    desc.child.comm_name = "world@e1";
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (static_cast<int>(r) != child_rank) child_store->set("nccl/shrink/native/" + std::to_string(r), others_vote);
    }
    return desc;
  }

  static OpDesc op(OpType type, size_t count = 4) {
    OpDesc d;
    d.type = type;
    d.seq = 1;
    d.count = count;
    d.dtype = DataType::kInt32;
    d.device = Device::cuda(0);
    d.input = reinterpret_cast<const void*>(0x10000);
    d.output = reinterpret_cast<void*>(0x20000);
    d.async = true;
    return d;
  }

  // Index of the first call named `name` on `comm` (calls.size() if none).
  size_t first_call(const std::string& name, ncclComm_t comm) {
    auto l = api->lock();
    for (size_t i = 0; i < api->calls.size(); ++i) {
      if (api->calls[i].name == name && api->calls[i].comm == comm) return i;
    }
    return api->calls.size();
  }

  std::shared_ptr<FakeNcclApi> api = std::make_shared<FakeNcclApi>();
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
  std::shared_ptr<MemoryStore> child_store = std::make_shared<MemoryStore>();
};

TEST_F(NcclShrinkTest, RevokeWithNcclCommRevokeFailsPendingAndLaterOpsAsRevokedAndKeepsTheComm) {
  auto b = parent(0, 2);
  api->events_complete_on_record = false;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
  std::thread waiter([&] {
    Status s = w->wait(WaitMode::kBlocking);
    EXPECT_EQ(s.code, ErrorCode::kRevoked);
    EXPECT_THAT(s.message, HasSubstr("peer 1 died"));
  });
  std::this_thread::sleep_for(20ms);
  b->revoke("peer 1 died");
  waiter.join();
  std::unique_ptr<plugin::Work> later;
  Status next = b->submit(op(OpType::kAllReduce), &later);
  EXPECT_EQ(next.code, ErrorCode::kRevoked);
  EXPECT_THAT(next.message, HasSubstr("peer 1 died"));
  {
    auto l = api->lock();
    EXPECT_THAT(api->revoked_comms, ElementsAre(api->created_comms[0]));
    EXPECT_EQ(api->aborts, 0);  // kept for a shrink
    EXPECT_EQ(api->destroys, 0);
  }
  EXPECT_EQ(nlohmann::json::parse(b->describe())["revoked"], true);
  // Finalizing a revoked communicator aborts it (ncclCommFinalize after a
  // revoke is invalid; a peer may be stuck in it).
  EXPECT_TRUE(b->finalize().is_ok());
  EXPECT_EQ(api->aborts, 1);
  EXPECT_EQ(api->finalizes, 0);
  EXPECT_EQ(api->destroys, 0);
}

TEST_F(NcclShrinkTest, RevokeWithoutNcclCommRevokeAbortsTheCommAndOpsFailAsRevoked) {
  api->revoke_available = false;
  auto b = parent(0, 2);
  api->events_complete_on_record = false;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
  b->revoke("peer 1 died");
  EXPECT_EQ(w->wait(WaitMode::kBlocking).code, ErrorCode::kRevoked);
  std::unique_ptr<plugin::Work> later;
  EXPECT_EQ(b->submit(op(OpType::kAllReduce), &later).code, ErrorCode::kRevoked);
  auto l = api->lock();
  EXPECT_TRUE(api->revoked_comms.empty());
  EXPECT_THAT(api->aborted_comms, ElementsAre(api->created_comms[0]));
}

TEST_F(NcclShrinkTest, AbortAfterRevokeAbortsTheRevokedComm) {
  auto b = parent(0, 2);
  b->revoke("peer 1 died");
  EXPECT_EQ(api->aborts, 0);
  b->abort("giving up");
  auto l = api->lock();
  EXPECT_THAT(api->aborted_comms, ElementsAre(api->created_comms[0]));
}

TEST_F(NcclShrinkTest, PlannedShrinkCallsNcclCommShrinkWithTheExcludedRanksAndInheritsTheHints) {
  auto b = parent(1, 4, {{"cga_cluster_size", "4"}, {"min_ctas", "2"}, {"high_priority_stream", "1"}});
  const int survivors[] = {0, 1, 3};
  // libcomms passes the parent's hints on to the child's init.
  plugin::SplitDesc desc = shrink_desc(survivors, 1, {{"cga_cluster_size", "4"}, {"min_ctas", "2"}});
  std::unique_ptr<Backend> child;
  Status s = b->shrink(desc, &child);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_NE(child, nullptr);
  ncclComm_t parent_comm, child_comm;
  {
    auto l = api->lock();
    parent_comm = api->created_comms[0];
    ASSERT_EQ(api->shrinks.size(), 1u);
    const auto& c = api->shrinks[0];
    EXPECT_EQ(c.parent, parent_comm);
    EXPECT_THAT(c.exclude, ElementsAre(2));
    EXPECT_EQ(c.flags, NCCL_SHRINK_DEFAULT);  // nothing failed: a planned shrink
    EXPECT_EQ(c.config.config.cgaClusterSize, 4);
    EXPECT_EQ(c.config.config.minCTAs, 2);
    EXPECT_EQ(c.config.config.blocking, 0);
    EXPECT_EQ(c.config.comm_name, "world@e1");
    child_comm = c.child;
    EXPECT_EQ(api->stream_priorities.size(), 2u);
    EXPECT_EQ(api->stream_priorities.back(), -5);  // high priority, inherited from the parent
    EXPECT_TRUE(api->aborted_comms.empty());
    EXPECT_TRUE(api->destroyed_comms.empty());
  }
  EXPECT_EQ(child_store->get("nccl/shrink/native/1", 0ms), "1");  // voted as child rank 1
  EXPECT_EQ(nlohmann::json::parse(child->describe())["created_by"], "ncclCommShrink");
  EXPECT_EQ(nlohmann::json::parse(b->describe())["created_by"], "ncclCommInitRankConfig");
  // The child's ops go to the child communicator, over its 3 ranks.
  const size_t counts[] = {2, 1, 3};
  OpDesc d = op(OpType::kAllGatherV, 0);
  d.counts = counts;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(child->submit(d, &w).is_ok());
  EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  {
    auto l = api->lock();
    std::vector<int> roots;
    for (const auto& c : api->calls) {
      if (c.name == "broadcast") {
        EXPECT_EQ(c.comm, child_comm);
        roots.push_back(c.root_or_peer);
      }
    }
    EXPECT_THAT(roots, ElementsAre(0, 1, 2));
  }
  // The parent of a planned shrink stays usable.
  std::unique_ptr<plugin::Work> pw;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &pw).is_ok());
  EXPECT_TRUE(pw->wait(WaitMode::kBlocking).is_ok());
  EXPECT_TRUE(child->finalize().is_ok());
  EXPECT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclShrinkTest, ShrinkAfterRevokeUsesShrinkAbortAndTheParentIsAbortedOnlyAfterTheChildExists) {
  auto b = parent(0, 3);
  api->events_complete_on_record = false;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(op(OpType::kAllReduce), &w).is_ok());
  b->revoke("rank 2 died");
  EXPECT_EQ(w->wait(WaitMode::kBlocking).code, ErrorCode::kRevoked);
  api->events_complete_on_record = true;
  const int survivors[] = {0, 1};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  Status s = b->shrink(desc, &child);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_NE(child, nullptr);
  ncclComm_t parent_comm, child_comm;
  {
    auto l = api->lock();
    ASSERT_EQ(api->shrinks.size(), 1u);
    EXPECT_THAT(api->shrinks[0].exclude, ElementsAre(2));
    EXPECT_EQ(api->shrinks[0].flags, NCCL_SHRINK_ABORT);
    parent_comm = api->shrinks[0].parent;
    child_comm = api->shrinks[0].child;
    EXPECT_TRUE(api->destroyed_comms.empty());
    EXPECT_TRUE(api->aborted_comms.empty());
  }
  std::unique_ptr<plugin::Work> cw;
  ASSERT_TRUE(child->submit(op(OpType::kAllReduce), &cw).is_ok());
  EXPECT_TRUE(cw->wait(WaitMode::kBlocking).is_ok());
  EXPECT_LT(first_call("comm_revoke", parent_comm), first_call("comm_shrink", parent_comm));
  EXPECT_NE(first_call("all_reduce", child_comm), api->calls.size());  // ran on the child
  // The revoked parent goes with its backend: aborted, never destroyed.
  b.reset();
  {
    auto l = api->lock();
    EXPECT_THAT(api->aborted_comms, ElementsAre(parent_comm));
    EXPECT_TRUE(api->destroyed_comms.empty());
  }
  EXPECT_GT(first_call("comm_abort", parent_comm), first_call("comm_shrink", parent_comm));
  EXPECT_TRUE(child->finalize().is_ok());
}

TEST_F(NcclShrinkTest, WithoutNcclCommShrinkTheBackendAsksForReCreationAndTheParentIsAbortedNotDestroyed) {
  api->shrink_available = false;
  api->revoke_available = false;
  auto b = parent(0, 3);
  b->revoke("rank 1 died");
  const int survivors[] = {0, 2};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  Status s = b->shrink(desc, &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_EQ(child, nullptr);
  EXPECT_EQ(child_store->get("nccl/shrink/native/0", 0ms), "0");
  // What libcomms does then: create() with desc.child, a new unique id in the child's store.
  std::unique_ptr<Backend> recreated;
  ASSERT_TRUE(create_nccl_backend(api, desc.child, &recreated, {.watchdog_interval = 5ms}).is_ok());
  ASSERT_TRUE(recreated->init().is_ok());
  EXPECT_EQ(child_store->get("nccl/unique_id", 0ms).size(), 128u);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(recreated->submit(op(OpType::kAllReduce), &w).is_ok());
  EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  {
    auto l = api->lock();
    EXPECT_TRUE(api->shrinks.empty());
    ASSERT_EQ(api->created_comms.size(), 2u);
    EXPECT_THAT(api->aborted_comms, ElementsAre(api->created_comms[0]));  // the parent, at revoke
    EXPECT_TRUE(api->destroyed_comms.empty());
    EXPECT_EQ(api->calls.back().comm, api->created_comms[1]);
  }
  b.reset();
  EXPECT_TRUE(recreated->finalize().is_ok());
  auto l = api->lock();
  EXPECT_THAT(api->destroyed_comms, ElementsAre(api->created_comms[1]));  // only the healthy child
}

TEST_F(NcclShrinkTest, ASurvivorThatCannotShrinkNativelyMakesEverySurvivorReCreate) {
  auto b = parent(1, 3);
  const int survivors[] = {0, 1};
  // Child rank 0's communicator was aborted (its op timed out before the revoke came).
  plugin::SplitDesc desc = shrink_desc(survivors, 1, {}, "0");
  std::unique_ptr<Backend> child;
  Status s = b->shrink(desc, &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("re-created"));
  EXPECT_EQ(child_store->get("nccl/shrink/native/1", 0ms), "1");
  auto l = api->lock();
  EXPECT_TRUE(api->shrinks.empty());
}

TEST_F(NcclShrinkTest, AParentAbortedByAFailureCannotShrinkNatively) {
  auto b = parent(0, 2);
  api->events_complete_on_record = false;
  OpDesc d = op(OpType::kAllReduce);
  d.timeout = 20ms;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(d, &w).is_ok());
  EXPECT_EQ(w->wait(WaitMode::kBlocking).code, ErrorCode::kTimeout);
  const int survivors[] = {0};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  EXPECT_EQ(b->shrink(desc, &child).code, ErrorCode::kUnsupported);
  EXPECT_EQ(child_store->get("nccl/shrink/native/0", 0ms), "0");
}

TEST_F(NcclShrinkTest, AFailedNcclCommShrinkIsReportedAndMakesNoChild) {
  auto b = parent(0, 2);
  api->shrink_result = ncclRemoteError;
  const int survivors[] = {0};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  Status s = b->shrink(desc, &child);
  EXPECT_EQ(s.code, ErrorCode::kPeerFailure);
  EXPECT_THAT(s.message, HasSubstr("ncclCommShrink"));
  EXPECT_EQ(child, nullptr);
  // The parent failed with it (as after a failed split): aborted, and the
  // next attempt re-creates.
  std::unique_ptr<plugin::Work> w;
  EXPECT_EQ(b->submit(op(OpType::kAllReduce), &w).code, ErrorCode::kAborted);
  {
    auto l = api->lock();
    EXPECT_THAT(api->aborted_comms, ElementsAre(api->created_comms[0]));
    EXPECT_TRUE(api->destroyed_comms.empty());
  }
  auto again = std::make_shared<MemoryStore>();
  child_store = again;
  plugin::SplitDesc retry = shrink_desc(survivors, 0);
  EXPECT_EQ(b->shrink(retry, &child).code, ErrorCode::kUnsupported);
}

TEST_F(NcclShrinkTest, AFailedShrinkOfARevokedParentAbortsTheParent) {
  auto b = parent(0, 3);
  b->revoke("rank 2 died");
  api->shrink_result = ncclRemoteError;
  const int survivors[] = {0, 1};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  EXPECT_EQ(b->shrink(desc, &child).code, ErrorCode::kPeerFailure);
  auto l = api->lock();
  EXPECT_THAT(api->aborted_comms, ElementsAre(api->created_comms[0]));
  EXPECT_TRUE(api->destroyed_comms.empty());
}

TEST_F(NcclShrinkTest, ArgumentsNcclCommShrinkRefusesMakeTheCommReCreated) {
  auto b = parent(0, 1);
  api->shrink_result = ncclInvalidArgument;
  const int survivors[] = {0};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  Status s = b->shrink(desc, &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("re-created"));
  auto l = api->lock();
  ASSERT_EQ(api->shrinks.size(), 1u);
  EXPECT_TRUE(api->shrinks[0].exclude.empty());
}

TEST_F(NcclShrinkTest, ShrinkOfARankNotAmongTheSurvivorsIsAnInvalidArgument) {
  auto b = parent(2, 3);
  const int survivors[] = {0, 1};
  plugin::SplitDesc desc = shrink_desc(survivors, 0);
  std::unique_ptr<Backend> child;
  EXPECT_EQ(b->shrink(desc, &child).code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace comms::nccl
