// What Comm promises around its plugins and threads: every plugin call is
// guarded (a throwing or null-returning plugin gives a comms::Error naming
// the comm and rank, never a crash), config reads and writes are safe across
// threads, is_completed() never blocks, and a collective rejects a tag.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms {
namespace {

using namespace std::chrono_literals;

class CommContract : public ::testing::Test {
 protected:
  void SetUp() override { setenv("COMMS_BACKEND_LIB_FAKEGPU", TEST_FAKEGPU_PLUGIN, 1); }

  // A one-rank comm on the fakegpu test plugin with these fakegpu hints.
  std::shared_ptr<Comm> fake(const std::string& name, Hints fakegpu_hints, std::optional<Device> device = {}) {
    CommOptions o;
    o.rank = 0;
    o.world_size = 1;
    for (const auto& [k, v] : fakegpu_hints) o.hints["fakegpu." + k] = v;
    return new_comm("cuda:fakegpu", device, name, o);
  }
};

// Runs `call`, which must throw a comms::Error; returns its message.
template <class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "a " << typeid(e).name() << " escaped instead of a comms::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "nothing was thrown";
  return {};
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(CommContract, AReloadWhosePluginReturnsNoBackendIsAnErrorNamingTheCommAndRank) {
  auto c = fake("reload-null", {{"fault", "recreate:null"}});
  ASSERT_TRUE(c->offload_backend(DeviceType::kCuda));
  const std::string m = error_of([&] { c->reload_backend(DeviceType::kCuda); });
  EXPECT_CONTAINS(m, "comms[reload-null rank 0/1] reloading the fakegpu backend for cuda failed");
  EXPECT_CONTAINS(m, "fakegpu returned ok from create() but no backend");
  EXPECT_EQ(c->backend_state(DeviceType::kCuda), BackendState::kOffloaded);
}

TEST_F(CommContract, AReloadWhosePluginThrowsIsAnErrorNamingTheCommAndRank) {
  auto c = fake("reload-throw", {{"fault", "recreate:throw"}});
  ASSERT_TRUE(c->offload_backend(DeviceType::kCuda));
  const std::string m = error_of([&] { c->reload_backend(DeviceType::kCuda); });
  EXPECT_CONTAINS(m, "comms[reload-throw rank 0/1] reloading the fakegpu backend for cuda failed");
  EXPECT_CONTAINS(m, "fakegpu threw from create(): injected: fakegpu recreate threw");
}

TEST_F(CommContract, AThrowingSetTimeoutIsAnErrorNamingTheCommAndRankAndKeepsTheOldTimeout) {
  CommOptions o;
  auto c = fake("timeout-throw", {{"fault", "set_timeout:throw"}});
  const auto before = c->op_timeout();
  const std::string m = error_of([&] { c->set_timeout(1234ms); });
  EXPECT_CONTAINS(m, "comms[timeout-throw rank 0/1] set_timeout: fakegpu threw from set_op_timeout(): injected");
  EXPECT_EQ(c->op_timeout(), before);
}

TEST_F(CommContract, AThrowingSetHintsIsAnErrorNamingTheCommAndRank) {
  auto c = fake("hints-throw", {{"fault", "set_hints:throw"}});
  const std::string m = error_of([&] { c->set_hints({{"fakegpu.min_ctas", "4"}}); });
  EXPECT_CONTAINS(m, "comms[hints-throw rank 0/1] set_hints: fakegpu threw from set_hints(): injected");
  EXPECT_EQ(c->hints().count("fakegpu.min_ctas"), 0u) << "a rejected hint was recorded";
}

TEST_F(CommContract, AThrowingFlushBarrierFailsNewCommWithAnErrorNamingTheCommAndRank) {
  const std::string m = error_of([&] { fake("flush-throw", {{"fault", "submit:throw"}}, Device::cuda(0)); });
  EXPECT_CONTAINS(m, "comms[flush-throw rank 0/1] barrier #1: internal: flush barrier after binding cuda:0");
  EXPECT_CONTAINS(m, "fakegpu threw from submit(): injected");
  // The failed comm released its name.
  EXPECT_NO_THROW(fake("flush-throw", {}));
}

TEST_F(CommContract, AThrowingDescribeIsReportedInTheDescriptionNamingTheCommAndRank) {
  auto c = fake("describe-throw", {{"fault", "describe:throw"}});
  const auto j = nlohmann::json::parse(c->describe());
  const auto& config = j["backends"]["cuda"]["config"];
  ASSERT_TRUE(config.is_string()) << j.dump();
  EXPECT_CONTAINS(config.get<std::string>(),
                  "comms[describe-throw rank 0/1] fakegpu threw from describe(): injected: fakegpu describe threw");
}

TEST_F(CommContract, AReloadBySplitWhosePluginReturnsNoChildIsAnErrorNamingTheGroupAndRank) {
  setenv("COMMS_ROUTE", "split", 1);
  dist::InitOptions init;
  init.backend = "cpu:gloo,cuda:fakegpu";
  init.device = Device::cpu();
  init.rank = 0;
  init.world_size = 1;
  std::string m;
  {
    dist::Session session(init);
    dist::GroupOptions o;
    o.name = "resplit-null";
    o.options.hints["fakegpu.fault"] = "resplit:null";
    dist::Group g = dist::new_group(std::vector<int>{0}, o);
    ASSERT_EQ(g.route(), dist::Route::kSplit);
    dist::offload_groups();
    m = error_of([] { dist::reload_groups(); });
  }
  unsetenv("COMMS_ROUTE");
  EXPECT_CONTAINS(m, "comms[resplit-null rank 0/1] reloading the fakegpu backend for cuda by splitting 'world'");
  EXPECT_CONTAINS(m, "fakegpu returned ok from split() but no child");
}

// Config writes (set_timeout, set_hints) race with reads from another thread
// (describe, hints, op_timeout) unless they share a lock: TSan's case.
TEST_F(CommContract, ConfigCanBeReadFromAnotherThreadWhileItIsChanged) {
  auto c = fake("config-threads", {});
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const auto j = nlohmann::json::parse(c->describe());
      EXPECT_TRUE(j["hints"].is_object());
      EXPECT_GE(c->op_timeout().count(), 1000);
      EXPECT_LE(c->hints().size(), 1u);
    }
  });
  for (int i = 0; i < 200; ++i) {
    c->set_hints({{"fakegpu.min_ctas", std::to_string(i)}});
    c->set_timeout(std::chrono::milliseconds(1000 + i));
  }
  done = true;
  reader.join();
  EXPECT_EQ(c->hints().at("fakegpu.min_ctas"), "199");
  EXPECT_EQ(c->op_timeout(), 1199ms);
  const auto j = nlohmann::json::parse(c->describe());
  EXPECT_EQ(j["backends"]["cuda"]["hints"]["min_ctas"], "199");
}

TEST_F(CommContract, IsCompletedReturnsAtOnceWhileAnotherThreadIsBlockedInWait) {
  auto c = fake("is-completed", {{"block_wait_ms", "3000"}});
  float x = 1;
  BufferView view{&x, 1, DataType::kFloat32, Device::cuda(0)};
  OpOptions async;
  async.async = true;
  Work w = c->all_reduce(view, ReduceOp::sum(), async);
  std::thread waiter([&] { w.blocking_wait(); });
  std::this_thread::sleep_for(200ms);  // the waiter is inside the plugin's 3 s wait
  const auto start = std::chrono::steady_clock::now();
  const bool completed = w.is_completed();
  const auto took = std::chrono::steady_clock::now() - start;
  waiter.join();
  EXPECT_FALSE(completed);
  EXPECT_LT(took, 1s) << "is_completed() waited for the blocking wait()";
  EXPECT_TRUE(w.is_completed());
}

// The fakegpu plugin's count of op calls (init, submit, supports_reduction).
int plugin_op_calls(Comm& c) {
  return nlohmann::json::parse(c.describe())["backends"]["cuda"]["config"]["op_calls"].get<int>();
}

// A CUDA buffer on another device than the comm's is the caller's mistake:
// the core refuses it, naming comm, op, both devices and rank, before the
// plugin sees anything (no lazy init, no supports_reduction, no submit).
TEST_F(CommContract, ABufferOnAnotherCudaDeviceIsRefusedBeforeThePluginSeesTheOp) {
  float x = 1;
  const BufferView on_1{&x, 1, DataType::kFloat32, Device::cuda(1)};
  auto bound = fake("device-bound", {{"block_wait_ms", "0"}}, Device::cuda(0));
  auto lazy = fake("device-lazy", {{"block_wait_ms", "0"}});  // local rank 0: cuda:0
  for (auto* c : {bound.get(), lazy.get()}) {
    const int before = plugin_op_calls(*c);
    try {
      c->all_reduce(on_1, ReduceOp::sum());
      ADD_FAILURE() << c->name() << ": an all_reduce on cuda:1 was accepted by a comm on cuda:0";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_EQ(e.comm(), c->name());
      EXPECT_EQ(e.op(), "all_reduce");
      EXPECT_EQ(e.rank(), 0);
      EXPECT_CONTAINS(std::string(e.what()), "comms[" + c->name() + " rank 0/1] all_reduce");
      EXPECT_CONTAINS(std::string(e.what()), "input is on cuda:1 but this comm's cuda backend (fakegpu) is on cuda:0");
    }
    EXPECT_EQ(plugin_op_calls(*c), before) << c->name() << ": the plugin saw the refused op";
    const BufferView on_1_out{&x, 1, DataType::kFloat32, Device::cuda(1)};
    EXPECT_THROW(c->broadcast(on_1_out, 0), Error);
    EXPECT_EQ(plugin_op_calls(*c), before) << c->name() << ": the plugin saw the refused broadcast";
    // The comm's own device still reaches the plugin.
    c->all_reduce(BufferView{&x, 1, DataType::kFloat32, Device::cuda(0)}, ReduceOp::sum());
    EXPECT_GT(plugin_op_calls(*c), before);
  }
}

// supports_reduction's answer is fixed for a backend's life (plugin.h): the
// core asks once per dtype and kind, and a refusal it kept still fails the
// op as kUnsupported, naming the backend, before the plugin sees it.
TEST_F(CommContract, SupportsReductionIsAskedOncePerDtypeAndKindAndItsRefusalKept) {
  float x = 1;
  const BufferView on_0{&x, 1, DataType::kFloat32, Device::cuda(0)};
  auto c = fake("reductions", {{"block_wait_ms", "0"}, {"refuse_reduction", std::to_string(int(ReduceKind::kMax))}},
                Device::cuda(0));
  c->all_reduce(on_0, ReduceOp::sum());
  int before = plugin_op_calls(*c);
  c->all_reduce(on_0, ReduceOp::sum());
  EXPECT_EQ(plugin_op_calls(*c), before + 1) << "a second float32 sum asked supports_reduction again";
  before = plugin_op_calls(*c);
  c->all_reduce(on_0, ReduceOp::min());  // a new kind: asked, then submitted
  EXPECT_EQ(plugin_op_calls(*c), before + 2);
  for (int i = 0; i < 2; ++i) {
    before = plugin_op_calls(*c);
    const std::string m = error_of([&] { c->all_reduce(on_0, ReduceOp::max()); });
    EXPECT_CONTAINS(m, "unsupported: backend 'fakegpu' does not support max on float32");
    EXPECT_EQ(plugin_op_calls(*c), before + (i == 0 ? 1 : 0)) << "refusal " << i << ": asked or submitted";
  }
  before = plugin_op_calls(*c);
  c->all_reduce(on_0, ReduceOp::sum());  // the comm is still usable
  EXPECT_EQ(plugin_op_calls(*c), before + 1);
  // A reloaded backend is another object (it may sit at the old one's
  // address): it is asked again.
  ASSERT_TRUE(c->offload_backend(DeviceType::kCuda));
  ASSERT_TRUE(c->reload_backend(DeviceType::kCuda));
  before = plugin_op_calls(*c);
  c->all_reduce(on_0, ReduceOp::sum());
  EXPECT_EQ(plugin_op_calls(*c), before + 2) << "the reloaded backend was not asked";
}

// comms::revoke reaches Backend::revoke on a plugin of ABI >= 2.4, and abort()
// on an older one (whose vtable has no revoke slot).
TEST_F(CommContract, RevokeCallsRevokeOnAbi24PluginsAndAbortOnOlderOnes) {
  setenv("COMMS_BACKEND_LIB_FAKEGPU23", TEST_FAKEGPU23_PLUGIN, 1);
  std::vector<std::shared_ptr<Comm>> keep;  // a comm's end may abort its backend: none ends here
  const auto counts = [&](const std::string& backend, const std::string& name) {
    CommOptions o;
    o.rank = 0;
    o.world_size = 1;
    keep.push_back(new_comm("cuda:" + backend, std::nullopt, name, o));
    const auto j = nlohmann::json::parse(keep.back()->describe())["backends"]["cuda"]["config"];
    return std::make_pair(j.at("aborts").get<int>(), j.at("revokes").get<int>());
  };
  for (const std::string backend : {"fakegpu", "fakegpu23"}) {
    const auto before = counts(backend, "revoke-before-" + backend);
    CommOptions o;
    o.rank = 0;
    o.world_size = 1;
    auto c = new_comm("cuda:" + backend, std::nullopt, "revoke-" + backend, o);
    comms::revoke(*c, "contract test");
    EXPECT_TRUE(comms::is_revoked(*c));
    const auto after = counts(backend, "revoke-after-" + backend);
    if (backend == "fakegpu") {
      EXPECT_EQ(after, std::make_pair(before.first, before.second + 1)) << backend;
    } else {
      EXPECT_EQ(after, std::make_pair(before.first + 1, before.second)) << backend;
    }
  }
}

TEST_F(CommContract, ACollectiveGivenATagIsRejectedNamingTheOp) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto c = new_comm("cpu:gloo", std::nullopt, "tagged", o);
  float x = 3;
  OpOptions tagged;
  tagged.tag = 7;
  try {
    c->all_reduce(BufferView::of(&x, 1), ReduceOp::sum(), tagged);
    FAIL() << "a tag on all_reduce was ignored";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.op(), "all_reduce");
    EXPECT_CONTAINS(std::string(e.what()), "OpOptions::tag (7) only applies to send, recv and batch_p2p");
  }
  EXPECT_THROW(c->barrier(tagged), Error);
  EXPECT_THROW(c->broadcast(BufferView::of(&x, 1), 0, tagged), Error);
  // Without a tag the same op runs, and p2p ops still take one.
  c->all_reduce(BufferView::of(&x, 1), ReduceOp::sum());
  EXPECT_EQ(x, 3.0f);
  try {
    c->send(BufferView::of(&x, 1), 0, tagged);
    FAIL() << "sent to itself";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "peer 0 is this rank itself");  // not the tag
  }
}

// Every comms::Error names its comm, op, seq and rank: a failed argument
// check of an op, and a new_comm refused before any backend exists.
TEST_F(CommContract, ErrorsCarryCommOpSeqAndRank) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto c = new_comm("cpu:gloo", std::nullopt, "fields", o);
  float x = 1;
  c->barrier();  // seq 1
  try {
    c->broadcast(BufferView::of(&x, 1), 5);  // root outside the comm
    FAIL() << "a broadcast from rank 5 of 1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.comm(), "fields");
    EXPECT_EQ(e.op(), "broadcast");
    EXPECT_EQ(e.seq(), 2u) << e.what();
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.peer(), -1);  // no peer caused it
  }
  OpOptions hinted;
  hinted.hints = {{"gloo.algorithm", "ring"}};  // no such Gloo key
  try {
    c->all_reduce(BufferView::of(&x, 1), ReduceOp::sum(), hinted);
    FAIL() << "an unknown per-op hint was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_CONTAINS(std::string(e.what()), "comms[fields rank 0/1] all_reduce #2: invalid_argument: unknown hint 'gloo.algorithm'");
    EXPECT_EQ(e.comm(), "fields");
    EXPECT_EQ(e.op(), "all_reduce");
    EXPECT_EQ(e.seq(), 2u);  // the rejected broadcast took no number
    EXPECT_EQ(e.rank(), 0);
  }
  CommOptions bad = o;
  bad.hints = {{"nccl.max_ctas", "4"}};
  try {
    (void)new_comm("cpu:gloo", std::nullopt, "no_nccl_here", bad);
    FAIL() << "an nccl hint on a cpu:gloo comm was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.comm(), "no_nccl_here") << e.what();
    EXPECT_EQ(e.op(), "new_comm");
    EXPECT_EQ(e.seq(), 0u);
    EXPECT_EQ(e.rank(), 0);
  }
}

}  // namespace
}  // namespace comms
