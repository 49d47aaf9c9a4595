// Registered buffers through libcomms, with the fakegpu test plugin as a
// backend that can register (it counts live handles in describe()) and Gloo
// as one that cannot.
#include <gtest/gtest.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms {
namespace {

class Registration : public ::testing::Test {
 protected:
  void SetUp() override { setenv("COMMS_BACKEND_LIB_FAKEGPU", TEST_FAKEGPU_PLUGIN, 1); }

  // A one-rank cpu:gloo,cuda:fakegpu comm whose cuda half connected (its
  // first op ran).
  std::shared_ptr<Comm> make(const std::string& name) {
    CommOptions o;
    o.hints["fakegpu.block_wait_ms"] = "1";
    auto c = new_comm("cpu:gloo,cuda:fakegpu", Device::cpu(), name, o);
    float x = 1.0f;
    c->all_reduce(cuda_view(&x), ReduceOp::sum(), {.async = true}).blocking_wait();
    EXPECT_EQ(c->backend_state(DeviceType::kCuda), BackendState::kReady);
    return c;
  }
  static BufferView cuda_view(float* p, size_t n = 1) {
    BufferView v = BufferView::of(p, n);
    v.device = Device::cuda(0);
    return v;
  }
  static int live(const Comm& c) {
    return nlohmann::json::parse(c.describe())["backends"]["cuda"]["config"]["registered"].get<int>();
  }

  float buf[16] = {};
};

TEST_F(Registration, TheHandleDeregistersOnceAndOnDestruction) {
  auto c = make("reg_once");
  ASSERT_TRUE(can_register_buffers(*c, DeviceType::kCuda));
  {
    RegisteredBuffer r = register_buffer(*c, cuda_view(buf, 16));
    EXPECT_TRUE(r.registered());
    EXPECT_EQ(r.buffer().data, buf);
    EXPECT_EQ(live(*c), 1);
    RegisteredBuffer moved = std::move(r);
    EXPECT_FALSE(r.registered());
    EXPECT_EQ(live(*c), 1);
    RegisteredBuffer second = register_buffer(*c, cuda_view(buf + 8, 8));
    EXPECT_EQ(live(*c), 2);
    second.deregister();
    second.deregister();  // idempotent
    EXPECT_FALSE(second.registered());
    EXPECT_EQ(live(*c), 1);
  }
  EXPECT_EQ(live(*c), 0);  // `moved` deregistered when it went
}

TEST_F(Registration, OffloadReleasesRegistrationsAndReloadNeedsNewOnes) {
  auto c = make("reg_offload");
  RegisteredBuffer r = register_buffer(*c, cuda_view(buf, 4));
  ASSERT_EQ(live(*c), 1);
  ASSERT_TRUE(c->offload_backend(DeviceType::kCuda));
  EXPECT_FALSE(r.registered());
  EXPECT_NO_THROW(r.deregister());  // released with the backend: nothing to do
  try {
    register_buffer(*c, cuda_view(buf, 4));
    FAIL() << "registered on an offloaded backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("offloaded"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(c->reload_backend(DeviceType::kCuda));
  float x = 1.0f;
  c->all_reduce(cuda_view(&x), ReduceOp::sum(), {.async = true}).blocking_wait();
  EXPECT_EQ(live(*c), 0);  // the reloaded backend holds none of the old ones
  EXPECT_FALSE(r.registered());
  RegisteredBuffer again = register_buffer(*c, cuda_view(buf, 4));
  EXPECT_TRUE(again.registered());
  EXPECT_EQ(live(*c), 1);
}

TEST_F(Registration, FinalizeReleasesWhatIsStillRegistered) {
  auto c = make("reg_finalize");
  RegisteredBuffer r = register_buffer(*c, cuda_view(buf, 4));
  const std::string before = c->describe();
  ASSERT_EQ(nlohmann::json::parse(before)["backends"]["cuda"]["config"]["registered"], 1);
  c->finalize();
  EXPECT_FALSE(r.registered());
  EXPECT_NO_THROW(r.deregister());
  // The count is the process's fakegpu backends': the finalized one released it.
  auto other = make("reg_finalize_after");
  EXPECT_EQ(live(*other), 0);
}

TEST_F(Registration, ABackendThatCannotRegisterSaysSo) {
  auto c = make("reg_gloo");
  EXPECT_FALSE(can_register_buffers(*c, DeviceType::kCpu));
  try {
    register_buffer(*c, BufferView::of(buf, 4));
    FAIL() << "gloo registered a buffer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("gloo backend for cpu cannot register"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(can_alloc_backend_memory(*c, DeviceType::kCpu));
  EXPECT_FALSE(can_alloc_backend_memory(*c, DeviceType::kCuda));
  try {
    alloc_backend_memory(*c, Device::cuda(0), 64);
    FAIL() << "fakegpu has no allocator";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no allocator"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comms
