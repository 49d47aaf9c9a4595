// Offload/reload and ownership on one rank, with the fakegpu test plugin as
// the "device" half of a cpu:gloo,cuda:fakegpu world.
#include <gtest/gtest.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms::dist {
namespace {

InitOptions one_rank(const std::string& backend) {
  InitOptions o;
  o.backend = backend;
  o.device = Device::cpu();
  o.rank = 0;
  o.world_size = 1;
  return o;
}

class Lifecycle : public ::testing::Test {
 protected:
  void SetUp() override { setenv("COMMS_BACKEND_LIB_FAKEGPU", TEST_FAKEGPU_PLUGIN, 1); }
  void TearDown() override {
    if (is_initialized()) destroy_process_group();
  }
};

TEST_F(Lifecycle, ADeviceOffloadLeavesTheCpuHalfUntouchedAndReloadRestoresTheSameConfiguration) {
  Session session(one_rank("cpu:gloo,cuda:fakegpu"));
  GroupOptions o;
  o.timeout = std::chrono::seconds(77);
  o.options.hints["fakegpu.min_ctas"] = "3";
  Group g = new_group(std::vector<int>{0}, o);
  const std::string before = g.describe();

  OffloadReport r = offload_groups();  // default: every non-CPU type
  EXPECT_EQ(r.groups_offloaded, 2);
  EXPECT_EQ(r.communicators_destroyed, 2);
  EXPECT_EQ(r.groups, (std::vector<std::string>{"world", g.name()}));
  EXPECT_EQ(g->backend_state(DeviceType::kCuda), BackendState::kOffloaded);
  EXPECT_EQ(g->backend_state(DeviceType::kCpu), BackendState::kReady);
  EXPECT_EQ(world()->backend_state(DeviceType::kCpu), BackendState::kReady);

  float x = 2.0f;
  g->all_reduce(BufferView::of(&x, 1), ReduceOp::sum());  // the cpu half still works
  EXPECT_EQ(x, 2.0f);
  auto gpu_view = BufferView::of(&x, 1);
  gpu_view.device = Device::cuda(0);
  try {
    g->all_reduce(gpu_view, ReduceOp::sum());
    FAIL() << "an op ran on an offloaded backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is offloaded"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reload_groups()"), std::string::npos) << e.what();
  }

  OffloadReport again = offload_groups();
  EXPECT_EQ(again.communicators_destroyed, 0) << "offloading twice did work twice";

  ReloadReport back = reload_groups();
  EXPECT_EQ(back.groups_reloaded, 2);
  EXPECT_EQ(back.communicators_created, 2);
  EXPECT_EQ(reload_groups().communicators_created, 0) << "reloading twice did work twice";
  EXPECT_EQ(g->backend_state(DeviceType::kCuda), BackendState::kLazy) << "it never connected before the offload";
  EXPECT_EQ(g.describe(), before);
  auto j = nlohmann::json::parse(g.describe());
  EXPECT_EQ(j["comm"]["op_timeout_ms"], 77000);
  EXPECT_EQ(j["comm"]["backends"]["cuda"]["config"]["hints"]["min_ctas"], "3");
}

// fakegpu's backend holds 4096 bytes of a device 1 MiB of which others use.
TEST_F(Lifecycle, TheOffloadReportMeasuresTheDeviceBeforeAndAfterTheBackendIsReleased) {
  InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
  init.options.hints["fakegpu.memory_used"] = "4096";
  Session session(init);
  OffloadReport r = offload_groups();
  EXPECT_EQ(r.device_memory_before, std::optional<int64_t>((1 << 20) + 4096));
  EXPECT_EQ(r.device_memory_after, std::optional<int64_t>(1 << 20)) << r.to_string();
  reload_groups();
  OffloadReport again = offload_groups();  // the reloaded backend holds its memory again
  EXPECT_EQ(again.device_memory_before, std::optional<int64_t>((1 << 20) + 4096));
  EXPECT_EQ(again.device_memory_after, std::optional<int64_t>(1 << 20));
}

nlohmann::json cuda_of(const Group& g) { return nlohmann::json::parse(g.describe())["comm"]["backends"]["cuda"]; }

// A plugin of ABI 2.6 that can suspend keeps its backend across the offload:
// the reload resumes it (no create(), so no rendezvous), with every option.
TEST_F(Lifecycle, OffloadBySuspendKeepsTheBackendAndTheReloadResumesIt) {
  InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
  init.options.hints["fakegpu.memory_used"] = "4096";
  init.options.hints["fakegpu.suspend"] = "1";
  init.timeout = std::chrono::seconds(55);
  Session session(init);
  Group w = world();
  const int creates = cuda_of(w)["config"]["creates"];
  const int suspends = cuda_of(w)["config"]["suspends"];
  const int resumes = cuda_of(w)["config"]["resumes"];
  EXPECT_FALSE(cuda_of(w).contains("offload"));

  OffloadReport r = offload_groups();
  EXPECT_EQ(r.communicators_suspended, 1) << r.to_string();
  EXPECT_EQ(r.communicators_destroyed, 0) << "a suspended communicator is kept, not destroyed";
  EXPECT_NE(r.to_string().find("destroyed=0 suspended=1"), std::string::npos) << r.to_string();
  EXPECT_EQ(r.device_memory_before, std::optional<int64_t>((1 << 20) + 4096));
  EXPECT_EQ(r.device_memory_after, std::optional<int64_t>(1 << 20)) << r.to_string();
  EXPECT_EQ(w->backend_state(DeviceType::kCuda), BackendState::kOffloaded);
  nlohmann::json j = cuda_of(w);
  EXPECT_EQ(j["offload"], "suspend");
  EXPECT_EQ(j["config"]["suspends"], suspends + 1) << "the kept backend still describes itself";
  const OffloadReport again = offload_groups();
  EXPECT_EQ(again.communicators_suspended + again.communicators_destroyed, 0) << "offloading twice did work twice";

  ReloadReport back = reload_groups();
  EXPECT_EQ(back.communicators_resumed, 1);
  EXPECT_EQ(back.communicators_created, 0) << "resumed, not re-created";
  const ReloadReport twice = reload_groups();
  EXPECT_EQ(twice.communicators_resumed + twice.communicators_created, 0) << "reloading twice did work twice";
  j = cuda_of(w);
  EXPECT_EQ(j["config"]["resumes"], resumes + 1);
  EXPECT_EQ(j["config"]["creates"], creates) << "a resume must not re-create (rendezvous) the backend";
  EXPECT_FALSE(j.contains("offload")) << "said only while offloaded";
  EXPECT_EQ(w->backend_state(DeviceType::kCuda), BackendState::kLazy);
  EXPECT_EQ(nlohmann::json::parse(w.describe())["comm"]["op_timeout_ms"], 55000);
  EXPECT_EQ(offload_groups().device_memory_before, std::optional<int64_t>((1 << 20) + 4096))
      << "the resumed backend holds its memory again";
}

// A group carved by split and offloaded by suspend comes back by resume,
// not by splitting the parent again.
TEST_F(Lifecycle, ASuspendedSplitChildResumesInsteadOfSplittingAgain) {
  setenv("COMMS_ROUTE", "split", 1);
  InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
  init.options.hints["fakegpu.suspend"] = "1";
  {
    Session session(init);
    GroupOptions o;
    o.options.hints["fakegpu.suspend"] = "1";
    Group g = new_group(std::vector<int>{0}, o);
    ASSERT_EQ(g.route(), Route::kSplit);
    const int suspends = cuda_of(g)["config"]["suspends"];
    const int resumes = cuda_of(g)["config"]["resumes"];
    const BackendState state = g->backend_state(DeviceType::kCuda);
    EXPECT_EQ(offload_groups().communicators_suspended, 2);
    EXPECT_EQ(cuda_of(g)["offload"], "suspend");
    EXPECT_EQ(cuda_of(g)["config"]["suspends"], suspends + 2) << "the world and the group";
    ReloadReport back = reload_groups();
    EXPECT_EQ(back.communicators_resumed, 2);
    EXPECT_EQ(back.communicators_created, 0);
    EXPECT_EQ(cuda_of(g)["config"]["resumes"], resumes + 2) << "the group resumed, not re-split";
    EXPECT_EQ(g->backend_state(DeviceType::kCuda), state);
  }
  unsetenv("COMMS_ROUTE");
}

// kUnsupported from suspend() (here: a plugin without the hint) falls back to
// finalize and re-creation, as for plugins older than ABI 2.6.
TEST_F(Lifecycle, WithoutSuspendTheOffloadDestroysAndTheReloadRecreates) {
  InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
  init.options.hints["fakegpu.suspend"] = "unsupported";
  Session session(init);
  Group w = world();
  const int creates = cuda_of(w)["config"]["creates"];
  const OffloadReport r = offload_groups();
  EXPECT_EQ(r.communicators_destroyed, 1) << r.to_string();
  EXPECT_EQ(r.communicators_suspended, 0) << r.to_string();
  EXPECT_EQ(cuda_of(w)["offload"], "destroy");
  EXPECT_TRUE(cuda_of(w)["config"].is_null()) << "the backend is gone";
  const ReloadReport back = reload_groups();
  EXPECT_EQ(back.communicators_created, 1);
  EXPECT_EQ(back.communicators_resumed, 0);
  EXPECT_EQ(cuda_of(w)["config"]["creates"], creates + 1);
}

TEST_F(Lifecycle, AFailedSuspendOrResumeIsRaisedAndFailsTheBackend) {
  {
    InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
    init.options.hints["fakegpu.suspend"] = "fail";
    Session session(init);
    try {
      offload_groups({DeviceType::kCuda});
      FAIL() << "a failed suspend was swallowed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
      EXPECT_NE(std::string(e.what()).find("(suspend) failed"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("could not suspend"), std::string::npos) << e.what();
    }
    EXPECT_EQ(world()->backend_state(DeviceType::kCuda), BackendState::kFailed);
  }
  InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
  init.options.hints["fakegpu.suspend"] = "fail_resume";
  Session session(init);
  offload_groups({DeviceType::kCuda});
  EXPECT_EQ(cuda_of(world())["offload"], "suspend");
  try {
    reload_groups();
    FAIL() << "a failed resume was swallowed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("could not resume"), std::string::npos) << e.what();
  }
  EXPECT_EQ(world()->backend_state(DeviceType::kCuda), BackendState::kFailed);
}

TEST_F(Lifecycle, AFailureToDestroyIsRaisedNotSwallowed) {
  InitOptions init = one_rank("cpu:gloo,cuda:fakegpu");
  init.options.hints["fakegpu.fail_finalize"] = "1";
  init_process_group(init);
  try {
    offload_groups({DeviceType::kCuda});
    FAIL() << "a failed destroy was swallowed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("group 'world'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("may still be in use"), std::string::npos) << e.what();
  }
  EXPECT_EQ(world()->backend_state(DeviceType::kCuda), BackendState::kFailed);
  EXPECT_EQ(world()->backend_state(DeviceType::kCpu), BackendState::kReady);
  // The memory is still not freed, so tearing down says so again.
  EXPECT_THROW(destroy_process_group(), Error);
  EXPECT_FALSE(is_initialized());
}

TEST_F(Lifecycle, ASessionDestroysTheWorldItCreated) {
  {
    Session s(one_rank("cpu:gloo"));
    EXPECT_TRUE(s.owns_world());
    EXPECT_TRUE(is_initialized());
    new_group(std::vector<int>{0});
  }
  EXPECT_FALSE(is_initialized());
  EXPECT_TRUE(groups().empty());
}

TEST_F(Lifecycle, ASessionLeavesAnApplicationWorldIntactAndDestroysOnlyWhatItCreated) {
  Group user_world = init_process_group(one_rank("cpu:gloo"));
  Group user_group = new_group(std::vector<int>{0});
  Group session_group;
  {
    Session s;
    EXPECT_FALSE(s.owns_world());
    session_group = new_group(std::vector<int>{0});
    EXPECT_TRUE(session_group);
  }
  EXPECT_TRUE(is_initialized());
  EXPECT_TRUE(user_world);
  EXPECT_TRUE(user_group);
  EXPECT_FALSE(session_group) << "the session's own group survived it";
  int32_t v = 5;
  user_group->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
  EXPECT_EQ(v, 5);
  shutdown();  // nothing of the library's is left: a no-op
  EXPECT_TRUE(user_world);
}

}  // namespace
}  // namespace comms::dist
