// Registered buffers through FakeNcclApi: handles live on the communicator
// until deregistered, finalize (what an offload runs) and destruction
// release what is left, and ops on registered buffers run as on any other.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "nccl_backend_for_tests.h"
#include "nccl_core.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::Backend;
using plugin::OpDesc;
using plugin::OpType;
using testing::FakeNcclApi;
using ::testing::HasSubstr;

class NcclRegistrationTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> make(bool eager = true) { return testing::one_rank_backend(api, eager, 5ms); }
  size_t live_registrations() {
    auto l = api->lock();
    return api->registrations.size();
  }
  int count(const std::string& name) {
    auto names = api->call_names();
    return static_cast<int>(std::count(names.begin(), names.end(), name));
  }

  std::shared_ptr<FakeNcclApi> api = std::make_shared<FakeNcclApi>();
};

TEST_F(NcclRegistrationTest, RegisterAndDeregisterReachNcclWithTheBuffer) {
  auto b = make();
  std::vector<float> buf(256);
  void* h = nullptr;
  ASSERT_TRUE(b->register_buffer(buf.data(), 1024, &h).is_ok());
  ASSERT_NE(h, nullptr);
  {
    auto l = api->lock();
    ASSERT_EQ(api->registrations.count(h), 1u);
    EXPECT_EQ(api->registrations[h].first, buf.data());
    EXPECT_EQ(api->registrations[h].second, 1024u);
  }
  ASSERT_TRUE(b->deregister_buffer(h).is_ok());
  EXPECT_EQ(live_registrations(), 0u);
  Status again = b->deregister_buffer(h);
  EXPECT_EQ(again.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(again.message, HasSubstr("deregistered already"));
  EXPECT_EQ(count("comm_deregister"), 1);  // the second never reached NCCL
}

TEST_F(NcclRegistrationTest, FinalizeDeregistersWhatIsLeftBeforeFinalizingTheComm) {
  auto b = make();
  std::vector<float> x(16), y(16);
  void *hx, *hy;
  ASSERT_TRUE(b->register_buffer(x.data(), 64, &hx).is_ok());
  ASSERT_TRUE(b->register_buffer(y.data(), 64, &hy).is_ok());
  ASSERT_TRUE(b->deregister_buffer(hx).is_ok());
  ASSERT_TRUE(b->finalize().is_ok());  // libcomms' offload runs finalize, then destroys
  EXPECT_EQ(live_registrations(), 0u);
  auto names = api->call_names();
  auto dereg = std::find(names.rbegin(), names.rend(), "comm_deregister");
  auto fin = std::find(names.begin(), names.end(), "comm_finalize");
  ASSERT_NE(dereg, names.rend());
  ASSERT_NE(fin, names.end());
  EXPECT_LT(names.rend() - dereg - 1, fin - names.begin());
  EXPECT_EQ(count("comm_deregister"), 2);
}

TEST_F(NcclRegistrationTest, ReloadedBackendStartsWithNoRegistrations) {
  std::vector<float> x(16);
  void* old_handle;
  {
    auto b = make();
    ASSERT_TRUE(b->register_buffer(x.data(), 64, &old_handle).is_ok());
    ASSERT_TRUE(b->finalize().is_ok());
  }
  auto reloaded = make();
  Status s = reloaded->deregister_buffer(old_handle);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("offloaded"));
  void* h;
  ASSERT_TRUE(reloaded->register_buffer(x.data(), 64, &h).is_ok());  // register again
  EXPECT_EQ(live_registrations(), 1u);
  ASSERT_TRUE(reloaded->finalize().is_ok());
  EXPECT_EQ(live_registrations(), 0u);
}

TEST_F(NcclRegistrationTest, AFailedCommDropsItsHandlesWithTheAbortedCommunicator) {
  auto b = make();
  std::vector<float> x(16);
  void* h;
  ASSERT_TRUE(b->register_buffer(x.data(), 64, &h).is_ok());
  b->abort("test");
  EXPECT_EQ(b->deregister_buffer(h).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(b->register_buffer(x.data(), 64, &h).code, ErrorCode::kAborted);
  EXPECT_EQ(count("comm_deregister"), 0);  // ncclCommAbort released it
}

TEST_F(NcclRegistrationTest, LazyCommCannotRegisterBeforeItConnects) {
  auto b = make(/*eager=*/false);
  std::vector<float> x(16);
  void* h;
  Status s = b->register_buffer(x.data(), 64, &h);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("first op"));
  EXPECT_TRUE(api->call_names().empty());
}

TEST_F(NcclRegistrationTest, OpsOnRegisteredBuffersRunAsOnAnyOther) {
  api->move_data = true;
  auto b = make();
  std::vector<float> in(32), out(32, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i) * 0.5f;
  void *hi, *ho;
  ASSERT_TRUE(b->register_buffer(in.data(), in.size() * 4, &hi).is_ok());
  ASSERT_TRUE(b->register_buffer(out.data(), out.size() * 4, &ho).is_ok());
  OpDesc d;
  d.type = OpType::kAllReduce;
  d.seq = 1;
  d.count = in.size();
  d.device = Device::cuda(0);
  d.input = in.data();
  d.output = out.data();
  d.async = true;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(d, &w).is_ok());
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE(b->finalize().is_ok());
  EXPECT_EQ(live_registrations(), 0u);
}

TEST_F(NcclRegistrationTest, MemAllocAndFreeRunOnTheDeviceAskedFor) {
  api->device_count = 2;
  void* p = nullptr;
  ASSERT_TRUE(nccl_mem_alloc(*api, Device::cuda(1), 4096, &p).is_ok());
  EXPECT_EQ(api->current_device, 0);  // the caller's device is restored
  {
    auto l = api->lock();
    ASSERT_EQ(api->allocations.count(p), 1u);
    EXPECT_EQ(api->allocations[p], 4096u);
  }
  ASSERT_TRUE(nccl_mem_free(*api, Device::cuda(1), p).is_ok());
  EXPECT_TRUE(api->allocations.empty());
  EXPECT_EQ(nccl_mem_free(*api, Device::cuda(1), p).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(nccl_mem_alloc(*api, Device::cpu(), 8, &p).code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace comms::nccl
