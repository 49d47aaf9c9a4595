// comms::join and comms::admit in one process over an in-memory store: a
// one-rank elastic comm admits a newcomer joining from another thread, a
// join that nobody admits times out and withdraws its ticket, and bad
// arguments are refused saying why. (tests/mp/grow_test.cc runs processes.)
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "comms/comms.h"

namespace comms {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<Comm> one_rank(const std::string& name, std::shared_ptr<Store> store) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.elastic = true;
  o.store = std::move(store);
  o.op_timeout = 20s;
  o.init_timeout = 20s;
  return new_comm("cpu:gloo", Device::cpu(), name, o);
}

ErrorCode code_of(const std::function<void()>& call, std::string* message = nullptr) {
  try {
    call();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

// admit() until the newcomer's ticket shows (it is taken on another thread).
std::shared_ptr<Comm> admit_until_grown(const std::shared_ptr<Comm>& comm) {
  for (int i = 0; i < 400; ++i) {
    auto next = admit(comm);
    if (next != comm) return next;
    std::this_thread::sleep_for(25ms);
  }
  return comm;
}

float sum_of_rank_plus_one(Comm& comm) {
  float x = static_cast<float>(comm.rank() + 1);
  comm.all_reduce(BufferView::of(&x, 1), ReduceOp::sum());
  return x;
}

TEST(GrowUnit, AOneRankCommAdmitsANewcomerFromAnotherThreadAndBothSumOverTwoRanks) {
  auto store = make_memory_store();
  auto member = one_rank("grow-unit", store);
  EXPECT_EQ(admit(member), member);  // nobody waits yet
  auto joined = std::async(std::launch::async, [&] {
    JoinOptions o;
    o.store = store;
    o.timeout = 20s;
    return join("grow-unit", o);
  });
  auto grown = admit_until_grown(member);
  auto newcomer = joined.get();
  ASSERT_NE(grown, member);
  ASSERT_TRUE(newcomer);
  EXPECT_EQ(grown->rank(), 0);
  EXPECT_EQ(newcomer->rank(), 1);
  EXPECT_EQ(grown->size(), 2);
  EXPECT_EQ(newcomer->size(), 2);
  EXPECT_EQ(grown->name(), "grow-unit@e1");
  EXPECT_EQ(newcomer->name(), "grow-unit@e1.2");  // the same process holds both
  EXPECT_EQ(epoch(*grown), 1u);
  EXPECT_EQ(epoch(*newcomer), 1u);
  EXPECT_EQ(newcomer->op_timeout(), 20s);
  EXPECT_EQ(newcomer->init_timeout(), 20s);
  EXPECT_TRUE(newcomer->elastic());
  auto other = std::async(std::launch::async, [&] { return sum_of_rank_plus_one(*newcomer); });
  EXPECT_EQ(sum_of_rank_plus_one(*grown), 3.0f);
  EXPECT_EQ(other.get(), 3.0f);
}

TEST(GrowUnit, AJoinThatNobodyAdmitsTimesOutAndTheNextAdmitDoesNotTakeIt) {
  auto store = make_memory_store();
  JoinOptions o;
  o.store = store;
  o.timeout = 200ms;
  std::string message;
  EXPECT_EQ(code_of([&] { join("lonely", o); }, &message), ErrorCode::kTimeout);
  EXPECT_NE(message.find("comms[join 'lonely' ticket 0] join: no member of 'lonely' admitted this process within 200 ms"),
            std::string::npos)
      << message;
  auto member = one_rank("lonely", store);
  EXPECT_EQ(admit(member), member);  // the withdrawn ticket is not offered
  EXPECT_EQ(admit(member), member);
}

TEST(GrowUnit, BadArgumentsAreRefusedSayingWhy) {
  std::string message;
  EXPECT_EQ(code_of([] { admit(nullptr); }, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("admit: no comm given"), std::string::npos) << message;
  EXPECT_EQ(code_of([] { join(""); }, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("the name of the comm to join is empty"), std::string::npos) << message;
  JoinOptions o;
  o.store = make_memory_store();
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(code_of([&] { join("x", o); }, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("timeout must be positive"), std::string::npos) << message;
}

TEST(GrowUnit, ARevokedCommRefusesToAdmit) {
  auto store = make_memory_store();
  auto member = one_rank("revoked-grow", store);
  revoke(*member, "test");
  std::string message;
  EXPECT_EQ(code_of([&] { admit(member); }, &message), ErrorCode::kRevoked);
  EXPECT_NE(message.find("recover() it first"), std::string::npos) << message;
}

}  // namespace
}  // namespace comms
