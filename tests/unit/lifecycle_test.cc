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
