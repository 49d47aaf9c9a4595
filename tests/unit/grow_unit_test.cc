// comms::join and comms::admit in one process over an in-memory store: a
// one-rank elastic comm admits a newcomer joining from another thread, a
// join that nobody admits times out and withdraws its ticket, and bad
// arguments are refused saying why. With the fakegpu test plugin as the
// device half: its backend grows natively (plugin ABI 2.7) when every
// participant can, and is re-created otherwise. (tests/mp/grow_test.cc runs
// processes.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "comms/comms.h"

namespace comms {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::shared_ptr<Comm> one_rank(const std::string& name, std::shared_ptr<Store> store,
                               const std::string& backend = "cpu:gloo", Hints hints = {}) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.elastic = true;
  o.store = std::move(store);
  o.op_timeout = 20s;
  o.init_timeout = 20s;
  o.hints = std::move(hints);
  return new_comm(backend, Device::cpu(), name, o);
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
  // The same process holds both: whichever side registered second (the
  // two threads build at once) gets ".2".
  EXPECT_EQ(std::set<std::string>({grown->name(), newcomer->name()}),
            std::set<std::string>({"grow-unit@e1", "grow-unit@e1.2"}));
  EXPECT_EQ(epoch(*grown), 1u);
  EXPECT_EQ(epoch(*newcomer), 1u);
  EXPECT_EQ(newcomer->op_timeout(), 20s);
  EXPECT_EQ(newcomer->init_timeout(), 20s);
  EXPECT_TRUE(newcomer->elastic());
  auto other = std::async(std::launch::async, [&] { return sum_of_rank_plus_one(*newcomer); });
  EXPECT_EQ(sum_of_rank_plus_one(*grown), 3.0f);
  EXPECT_EQ(other.get(), 3.0f);
}

// A one-rank comm of `backend` (cpu:gloo plus a fakegpu plugin, with these
// hints) admits one newcomer joining from another thread; `before` runs on
// the member's comm first. Both sides' grown comms.
struct GrownPair {
  std::shared_ptr<Comm> member, newcomer;
  json backend(const std::shared_ptr<Comm>& c, const char* type) const {
    return json::parse(c->describe())["backends"][type];
  }
};

class GrowNative : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("COMMS_BACKEND_LIB_FAKEGPU", TEST_FAKEGPU_PLUGIN, 1);
    setenv("COMMS_BACKEND_LIB_FAKEGPU23", TEST_FAKEGPU23_PLUGIN, 1);
  }

  GrownPair grow_one(const std::string& name, const std::string& backend, Hints hints = {},
                     const std::function<void(Comm&)>& before = {}) {
    auto store = make_memory_store();
    auto member = one_rank(name, store, backend, std::move(hints));
    if (before) before(*member);
    auto joined = std::async(std::launch::async, [&] {
      JoinOptions o;
      o.store = store;
      o.timeout = 20s;
      return join(name, o);
    });
    GrownPair g;
    g.member = admit_until_grown(member);
    g.newcomer = joined.get();
    EXPECT_NE(g.member, member);
    return g;
  }

  // Both sides' backend for `type` was made by `way` ("native" or
  // "recreate"), by these plugin functions.
  void expect_made(const GrownPair& g, const char* type, const std::string& way, const std::string& member_by,
                   const std::string& newcomer_by) {
    const json m = g.backend(g.member, type), n = g.backend(g.newcomer, type);
    EXPECT_EQ(m["grow"], way) << m.dump();
    EXPECT_EQ(n["grow"], way) << n.dump();
    if (!member_by.empty()) {
      EXPECT_EQ(m["config"]["made_by"], member_by) << m.dump();
    }
    if (!newcomer_by.empty()) {
      EXPECT_EQ(n["config"]["made_by"], newcomer_by) << n.dump();
    }
  }
};

TEST_F(GrowNative, EveryParticipantCanSoTheDeviceBackendGrowsNativelyAndGlooIsRecreated) {
  const GrownPair g = grow_one("grow-native", "cpu:gloo,cuda:fakegpu", {{"fakegpu.min_ctas", "3"}});
  ASSERT_TRUE(g.member && g.newcomer);
  expect_made(g, "cuda", "native", "grow", "join_grown");
  expect_made(g, "cpu", "recreate", "", "");
  const json m = g.backend(g.member, "cuda")["config"], n = g.backend(g.newcomer, "cuda")["config"];
  EXPECT_EQ(m["rank"], 0);
  EXPECT_EQ(n["rank"], 1);
  EXPECT_EQ(m["size"], 2);
  EXPECT_EQ(n["size"], 2);
  EXPECT_EQ(m["members"], 1);
  EXPECT_EQ(n["members"], 1);
  EXPECT_EQ(n["hints"]["min_ctas"], "3") << "the newcomer's native backend lost the parent's hints";
  EXPECT_EQ(g.backend(g.newcomer, "cuda")["state"], "ready");
  auto other = std::async(std::launch::async, [&] { return sum_of_rank_plus_one(*g.newcomer); });
  EXPECT_EQ(sum_of_rank_plus_one(*g.member), 3.0f);
  EXPECT_EQ(other.get(), 3.0f);
}

TEST_F(GrowNative, AMemberWhoseDeviceBackendIsOffloadedMakesEveryParticipantRecreateIt) {
  const GrownPair g = grow_one("grow-offloaded", "cpu:gloo,cuda:fakegpu", {},
                               [](Comm& c) { ASSERT_TRUE(c.offload_backend(DeviceType::kCuda)); });
  ASSERT_TRUE(g.member && g.newcomer);
  expect_made(g, "cuda", "recreate", "create", "create");
}

TEST_F(GrowNative, APluginOlderThanAbi27IsRecreatedThoughItHasTheEntries) {
  const GrownPair g = grow_one("grow-abi23", "cpu:gloo,cuda:fakegpu23");
  ASSERT_TRUE(g.member && g.newcomer);
  expect_made(g, "cuda", "recreate", "create", "create");
}

TEST_F(GrowNative, APluginThatDeclinesEverywhereIsRecreated) {
  const GrownPair g = grow_one("grow-declined", "cpu:gloo,cuda:fakegpu", {{"fakegpu.grow", "unsupported"}});
  ASSERT_TRUE(g.member && g.newcomer);
  expect_made(g, "cuda", "recreate", "create", "create");
}

TEST_F(GrowNative, ANativeGrowThatFailsFailsTheAdmissionOnBothSidesAndTheCommStaysUsable) {
  auto store = make_memory_store();
  auto member = one_rank("grow-fails", store, "cpu:gloo,cuda:fakegpu", {{"fakegpu.grow", "fail"}});
  auto joined = std::async(std::launch::async, [&] {
    JoinOptions o;
    o.store = store;
    o.timeout = 20s;
    std::string message;
    const ErrorCode code = code_of([&] { join("grow-fails", o); }, &message);
    return std::make_pair(code, message);
  });
  std::optional<Error> failure;
  for (int i = 0; i < 400 && !failure; ++i) {
    try {
      if (admit(member) != member) break;
    } catch (const Error& e) {
      failure = e;
    }
    std::this_thread::sleep_for(25ms);
  }
  ASSERT_TRUE(failure) << "the admission did not fail";
  EXPECT_EQ(failure->code(), ErrorCode::kInternal);
  EXPECT_EQ(failure->comm(), "grow-fails");
  EXPECT_EQ(failure->op(), "admit");
  EXPECT_EQ(failure->rank(), 0);
  const std::string m = failure->what();
  EXPECT_NE(m.find("comms[grow-fails rank 0/1] admit: building the grown comm of epoch 1 failed"), std::string::npos)
      << m;
  EXPECT_NE(m.find("growing the fakegpu backend for cuda"), std::string::npos) << m;
  EXPECT_NE(m.find("injected failure: fakegpu could not grow"), std::string::npos) << m;
  const auto [code, message] = joined.get();
  EXPECT_EQ(code, ErrorCode::kInternal) << message;
  EXPECT_NE(message.find("could not grow"), std::string::npos) << message;
  EXPECT_EQ(sum_of_rank_plus_one(*member), 1.0f);  // the comm stays as it was
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
