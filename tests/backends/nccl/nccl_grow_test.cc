// Elastic growth in the NCCL backend, with FakeNcclApi standing in for NCCL:
// from 2.29 a member grows its communicator with ncclCommGrow (the member of
// rank 0 takes the id from it with ncclCommGetUniqueId and publishes it) and
// a newcomer joins with that id and no parent; below 2.29, or when any
// participant votes no, both sides answer kUnsupported, having consumed
// nothing, so that libcomms re-creates the comm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "nccl_backend.h"
#include "nccl_test_support.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::Backend;
using plugin::BackendInit;
using plugin::GrowDesc;
using plugin::OpDesc;
using plugin::OpType;
using testing::FakeNcclApi;
using testing::MemoryStore;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int k228 = 22809, k229 = 22907;
const std::string kId(128, '\x6b');  // what the fake's ncclCommGetUniqueId gives

class NcclGrowTest : public ::testing::Test {
 protected:
  BackendInit make_init(int rank, int size, std::shared_ptr<MemoryStore> s, Hints hints = {}, bool eager = true) {
    BackendInit init;
    init.comm_name = "world";
    init.rank = rank;
    init.size = size;
    init.device = Device::cuda(0);
    init.eager = eager;
    init.store = std::move(s);
    init.init_timeout = 2s;
    init.op_timeout = 2s;
    init.hints = std::move(hints);
    return init;
  }

  // Rank `rank` of a `size`-rank comm on an NCCL of `version`, connected
  // unless lazy.
  std::unique_ptr<Backend> parent(int version, int rank, int size, Hints hints = {}, bool eager = true) {
    api->set_version(version);
    store->set("nccl/unique_id", std::string(128, 'x'));
    std::unique_ptr<Backend> b;
    Status s = create_nccl_backend(api, make_init(rank, size, store, std::move(hints), eager), &b,
                                   {.watchdog_interval = 5ms});
    EXPECT_TRUE(s.is_ok()) << s.message;
    if (b) { EXPECT_TRUE(b->init().is_ok()); }
    return b;
  }

  // Rank `rank` of the comm grown from `members` to `size` ranks; every
  // other participant's vote (for ncclCommGrow or not) is in the child's
  // store already.
  GrowDesc grow_desc(int members, int rank, int size, Hints hints = {}, const std::string& others_vote = "1") {
    GrowDesc desc;
    desc.members = members;
    desc.child = make_init(rank, size, child_store, std::move(hints));
    desc.child.comm_name = "world@e1";
    for (int r = 0; r < size; ++r) {
      if (r != rank) child_store->set("nccl/grow/native/" + std::to_string(r), others_vote);
    }
    return desc;
  }

  static OpDesc op(OpType type) {
    OpDesc d;
    d.type = type;
    d.seq = 1;
    d.count = 4;
    d.dtype = DataType::kInt32;
    d.device = Device::cuda(0);
    d.input = reinterpret_cast<const void*>(0x10000);
    d.output = reinterpret_cast<void*>(0x20000);
    d.async = true;
    return d;
  }

  // The communicator of the last NCCL all_reduce.
  ncclComm_t last_all_reduce_comm() {
    auto l = api->lock();
    for (auto it = api->calls.rbegin(); it != api->calls.rend(); ++it) {
      if (it->name == "all_reduce") return it->comm;
    }
    return nullptr;
  }

  void expect_all_reduce_on(Backend& b, ncclComm_t comm) {
    std::unique_ptr<plugin::Work> w;
    Status s = b.submit(op(OpType::kAllReduce), &w);
    ASSERT_TRUE(s.is_ok()) << s.message;
    EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
    EXPECT_EQ(last_all_reduce_comm(), comm);
  }

  std::shared_ptr<FakeNcclApi> api = std::make_shared<FakeNcclApi>();
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
  std::shared_ptr<MemoryStore> child_store = std::make_shared<MemoryStore>();
};

TEST_F(NcclGrowTest, At229MemberRank0TakesTheIdFromItsCommunicatorPublishesItAndGrowsInheritingTheHints) {
  auto b = parent(k229, 0, 2, {{"cga_cluster_size", "4"}, {"high_priority_stream", "1"}});
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 0, 3, {{"cga_cluster_size", "4"}}), &child);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_NE(child, nullptr);
  ncclComm_t parent_comm, child_comm;
  {
    auto l = api->lock();
    parent_comm = api->created_comms[0];
    EXPECT_THAT(api->grow_ids_from, ElementsAre(parent_comm));
    ASSERT_EQ(api->grows.size(), 1u);
    const auto& g = api->grows[0];
    EXPECT_EQ(g.parent, parent_comm);
    EXPECT_EQ(g.nranks, 3);
    EXPECT_EQ(g.id, kId);
    EXPECT_EQ(g.rank, -1);  // a member keeps its rank
    EXPECT_EQ(g.config.config.cgaClusterSize, 4);
    EXPECT_EQ(g.config.config.blocking, 0);
    EXPECT_EQ(g.config.comm_name, "world@e1");
    child_comm = g.child;
    EXPECT_EQ(api->stream_priorities.back(), -5);  // high priority, inherited from the parent
    EXPECT_EQ(api->comm_inits, 1);                 // the parent's only
    EXPECT_TRUE(api->aborted_comms.empty());
  }
  EXPECT_EQ(child_store->get("nccl/grow/unique_id", 0ms), kId);
  EXPECT_EQ(child_store->get("nccl/grow/native/0", 0ms), "1");
  EXPECT_EQ(nlohmann::json::parse(child->describe())["created_by"], "ncclCommGrow");
  EXPECT_EQ(nlohmann::json::parse(child->describe())["native_grow"], true);
  expect_all_reduce_on(*child, child_comm);
  expect_all_reduce_on(*b, parent_comm);  // the parent stays usable
  EXPECT_TRUE(child->finalize().is_ok());
  EXPECT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclGrowTest, AMemberOfAnotherRankPassesNoIdAndTakesNone) {
  auto b = parent(k229, 1, 2);
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 1, 4), &child);
  ASSERT_TRUE(s.is_ok()) << s.message;
  auto l = api->lock();
  EXPECT_TRUE(api->grow_ids_from.empty());
  ASSERT_EQ(api->grows.size(), 1u);
  EXPECT_EQ(api->grows[0].id, "");
  EXPECT_EQ(api->grows[0].rank, -1);
  EXPECT_EQ(api->grows[0].nranks, 4);
  EXPECT_FALSE(child_store->check({"nccl/grow/unique_id"}));
}

TEST_F(NcclGrowTest, ANewcomerGrowsWithNoParentTheMembersIdAndItsRankAndNoInit) {
  api->set_version(k229);
  GrowDesc desc = grow_desc(2, 2, 3, {{"min_ctas", "2"}});
  child_store->set("nccl/grow/unique_id", kId);
  std::unique_ptr<Backend> b;
  Status s = join_grown_nccl_backend(api, desc, &b, {.watchdog_interval = 5ms});
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_NE(b, nullptr);
  ncclComm_t comm;
  {
    auto l = api->lock();
    ASSERT_EQ(api->grows.size(), 1u);
    const auto& g = api->grows[0];
    EXPECT_EQ(g.parent, nullptr);
    EXPECT_EQ(g.nranks, 3);
    EXPECT_EQ(g.id, kId);
    EXPECT_EQ(g.rank, 2);
    EXPECT_EQ(g.config.config.minCTAs, 2);  // the parent's hints, offered by the members
    EXPECT_EQ(g.config.comm_name, "world@e1");
    comm = g.child;
    EXPECT_EQ(api->comm_inits, 0);
    EXPECT_TRUE(api->grow_ids_from.empty());
  }
  EXPECT_EQ(child_store->get("nccl/grow/native/2", 0ms), "1");
  const auto j = nlohmann::json::parse(b->describe());
  EXPECT_EQ(j["created_by"], "ncclCommGrow");
  EXPECT_EQ(j["initialized"], true);
  expect_all_reduce_on(*b, comm);
  EXPECT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclGrowTest, Below229NeitherSideGrowsNativelyAndNothingIsConsumed) {
  auto b = parent(k228, 0, 2);
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 0, 3), &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("NCCL < 2.29"));
  EXPECT_EQ(child, nullptr);
  EXPECT_EQ(child_store->get("nccl/grow/native/0", 0ms), "0");

  auto newcomer_store = std::make_shared<MemoryStore>();
  child_store = newcomer_store;
  std::unique_ptr<Backend> joined;
  s = join_grown_nccl_backend(api, grow_desc(2, 2, 3), &joined);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("NCCL < 2.29"));
  EXPECT_EQ(joined, nullptr);
  EXPECT_EQ(newcomer_store->get("nccl/grow/native/2", 0ms), "0");
  {
    auto l = api->lock();
    EXPECT_TRUE(api->grows.empty());
    EXPECT_TRUE(api->grow_ids_from.empty());
  }
  expect_all_reduce_on(*b, api->created_comms[0]);  // untouched
}

TEST_F(NcclGrowTest, AParticipantThatCannotMakesEveryParticipantRecreateBeforeAnIdIsTaken) {
  auto b = parent(k229, 0, 2);
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 0, 3, {}, "0"), &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_THAT(s.message, HasSubstr("a participant cannot use ncclCommGrow"));
  EXPECT_EQ(child_store->get("nccl/grow/native/0", 0ms), "1");
  auto l = api->lock();
  EXPECT_TRUE(api->grow_ids_from.empty()) << "an id taken and never used would refuse the next grow";
  EXPECT_TRUE(api->grows.empty());
}

TEST_F(NcclGrowTest, ALazyMemberHasNoCommunicatorToGrowFromAndVotesNo) {
  auto b = parent(k229, 0, 2, {}, /*eager=*/false);
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 0, 3), &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_EQ(child_store->get("nccl/grow/native/0", 0ms), "0");
  EXPECT_TRUE(api->grows.empty());
}

// NCCL grows only a parent with no op outstanding: the member waits for its
// ops first, and one that times out fails the communicator, which then
// votes no.
TEST_F(NcclGrowTest, AMemberWaitsForItsOutstandingOpsAndOneThatNeverFinishesMakesItVoteNo) {
  auto b = parent(k229, 0, 2);
  api->events_complete_on_record = false;
  OpDesc d = op(OpType::kAllReduce);
  d.timeout = 50ms;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(d, &w).is_ok());
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 0, 3), &child);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(w->wait(WaitMode::kBlocking).code, ErrorCode::kTimeout);
  EXPECT_EQ(child_store->get("nccl/grow/native/0", 0ms), "0");
  auto l = api->lock();
  EXPECT_TRUE(api->grow_ids_from.empty());
  EXPECT_TRUE(api->grows.empty());
}

TEST_F(NcclGrowTest, AFailedNcclCommGrowIsReportedAndAbortsTheParent) {
  auto b = parent(k229, 1, 2);
  api->grow_result = ncclRemoteError;
  std::unique_ptr<Backend> child;
  Status s = b->grow(grow_desc(2, 1, 3), &child);
  EXPECT_EQ(s.code, ErrorCode::kPeerFailure);
  EXPECT_THAT(s.message, HasSubstr("ncclCommGrow failed"));
  EXPECT_EQ(child, nullptr);
  {
    auto l = api->lock();
    EXPECT_THAT(api->aborted_comms, ElementsAre(api->created_comms[0]));
  }
  std::unique_ptr<plugin::Work> w;
  Status later = b->submit(op(OpType::kAllReduce), &w);
  EXPECT_EQ(later.code, ErrorCode::kAborted);
  EXPECT_THAT(later.message, HasSubstr("ncclCommGrow failed"));
}

TEST_F(NcclGrowTest, ANewcomerWhoseNcclCommGrowFailsGetsTheErrorAndNoBackend) {
  api->set_version(k229);
  api->grow_result = ncclInternalError;
  GrowDesc desc = grow_desc(1, 1, 2);
  child_store->set("nccl/grow/unique_id", kId);
  std::unique_ptr<Backend> b;
  Status s = join_grown_nccl_backend(api, desc, &b);
  EXPECT_EQ(s.code, ErrorCode::kInternal);
  EXPECT_THAT(s.message, HasSubstr("ncclCommGrow failed"));
  EXPECT_EQ(b, nullptr);
}

TEST_F(NcclGrowTest, ANewcomerWhoseIdNeverComesTimesOutSayingWhatItWaitedFor) {
  api->set_version(k229);
  GrowDesc desc = grow_desc(1, 1, 2);
  desc.child.init_timeout = 50ms;
  std::unique_ptr<Backend> b;
  Status s = join_grown_nccl_backend(api, desc, &b);
  EXPECT_EQ(s.code, ErrorCode::kTimeout);
  EXPECT_THAT(s.message, HasSubstr("reading the ncclCommGrow id (member rank 0 publishes it)"));
  EXPECT_TRUE(api->grows.empty());
}

TEST_F(NcclGrowTest, ANewcomerGivenAMembersRankOrABadDeviceVotesNoAndSaysWhy) {
  api->set_version(k229);
  std::unique_ptr<Backend> b;
  Status s = join_grown_nccl_backend(api, grow_desc(2, 1, 3), &b);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("is a member's rank"));
  GrowDesc cpu = grow_desc(2, 2, 3);
  cpu.child.device = Device::cpu();
  s = join_grown_nccl_backend(api, cpu, &b);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("serves cuda devices"));
  EXPECT_EQ(child_store->get("nccl/grow/native/2", 0ms), "0") << "the others would wait for its vote";
}

}  // namespace
}  // namespace comms::nccl
