// Elastic recovery on CUDA devices through the public API, under commsrun:
// a planned shrink with an empty exclude list (any world size), and at two
// ranks a planned shrink excluding rank 1 and a revoke followed by
// recover(). Where the loaded NCCL has ncclCommShrink the shrunk comm's
// NCCL communicator must come from it (describe()'s "created_by").
//
// One rank per GPU, or, with GPU_ELASTIC_SHARE_GPU=1, every rank on GPU 0,
// which NCCL allows from 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (the cases
// skip on an older NCCL). Every case skips with "no CUDA device" without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comms/bootstrap.h"
#include "comms/comms.h"
#include "comms/elastic.h"

namespace {

using comms::BufferView;
using comms::DataType;
using comms::Device;
using comms::ReduceOp;

bool share_gpu() {
  const char* v = std::getenv("GPU_ELASTIC_SHARE_GPU");
  return v && std::string(v) == "1";
}

class GpuElastic : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    boot = comms::bootstrap_from_environment();
    int gpu = boot.local_rank;
    if (share_gpu()) {
      int version = 0;
      if (boot.local_world_size > 1 && (ncclGetVersion(&version) != ncclSuccess || version < NCCL_VERSION(2, 30, 0))) {
        GTEST_SKIP() << "ranks share GPU 0 only from NCCL 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1); this NCCL is "
                     << version;
      }
      gpu = 0;
    } else if (boot.local_rank >= count) {
      GTEST_SKIP() << "local rank " << boot.local_rank << " has no GPU of its own (" << count << " on this host)";
    }
    device = Device::cuda(gpu);
    ASSERT_EQ(cudaSetDevice(gpu), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&scratch, kFloats * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
  }

  std::string name(const std::string& what) {
    return what + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // all_reduce(sum) of `value` on the device; element 0 (all must agree).
  float device_all_reduce(comms::Comm& c, float value) {
    std::vector<float> host(kFloats, value);
    EXPECT_EQ(cudaMemcpyAsync(scratch, host.data(), kFloats * sizeof(float), cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    comms::OpOptions o;
    o.stream = stream;
    c.all_reduce(BufferView{scratch, kFloats, DataType::kFloat32, device}, ReduceOp::sum(), o);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), scratch, kFloats * sizeof(float), cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t i = 1; i < kFloats; ++i) {
      if (host[i] != host[0]) {
        ADD_FAILURE() << "element " << i << " is " << host[i] << ", element 0 is " << host[0];
        break;
      }
    }
    return host[0];
  }

  // The NCCL backend's describe().
  static nlohmann::json nccl(const comms::Comm& c) {
    return nlohmann::json::parse(c.describe()).at("backends").at("cuda").at("config");
  }

  // With ncclCommShrink in the loaded NCCL, the child's communicator came from it.
  static void expect_native(const comms::Comm& parent, const comms::Comm& child) {
    const auto p = nccl(parent), c = nccl(child);
    std::printf("rank %d: NCCL %s, native shrink %s, child created by %s\n", parent.rank(),
                p.value("nccl_version", "?").c_str(), p.value("native_shrink", false) ? "yes" : "no",
                c.value("created_by", nlohmann::json()).dump().c_str());
    if (p.value("native_shrink", false)) EXPECT_EQ(c["created_by"], "ncclCommShrink") << c.dump();
    else EXPECT_EQ(c["created_by"], "ncclCommInitRankConfig") << c.dump();
  }

  static constexpr size_t kFloats = 1 << 16;
  comms::BootstrapInfo boot;
  Device device = Device::cpu();
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;
};

TEST_F(GpuElastic, PlannedShrinkWithAnEmptyExcludeListKeepsEveryRank) {
  auto c = comms::new_comm("cuda:nccl", device, name("world"));
  const int n = c->size();
  EXPECT_EQ(device_all_reduce(*c, 1.0f), float(n));
  auto child = comms::shrink(*c, std::vector<int>{});
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->size(), n);
  EXPECT_EQ(child->rank(), c->rank());
  expect_native(*c, *child);
  EXPECT_EQ(device_all_reduce(*child, 2.0f), 2.0f * n);
  EXPECT_EQ(device_all_reduce(*c, 3.0f), 3.0f * n);  // a planned shrink leaves the parent usable
}

TEST_F(GpuElastic, TwoRanksPlannedShrinkExcludingRankOne) {
  if (boot.world_size != 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = comms::new_comm("cuda:nccl", device, name("world"));
  EXPECT_EQ(device_all_reduce(*c, 1.0f), 2.0f);
  auto child = comms::shrink(*c, std::vector<int>{1});
  if (c->rank() == 1) {
    EXPECT_EQ(child, nullptr);
  } else {
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(child->size(), 1);
    expect_native(*c, *child);
    EXPECT_EQ(device_all_reduce(*child, 5.0f), 5.0f);
  }
  EXPECT_EQ(device_all_reduce(*c, 1.0f), 2.0f);
}

TEST_F(GpuElastic, TwoRanksRevokeThenRecover) {
  if (boot.world_size != 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = comms::new_comm("cuda:nccl", device, name("world"));
  EXPECT_EQ(device_all_reduce(*c, 1.0f), 2.0f);
  if (c->rank() == 0) comms::revoke(*c, "gpu_elastic test");
  comms::Recovery r = comms::recover(*c);
  ASSERT_NE(r.comm, nullptr);
  EXPECT_TRUE(r.agreement.lost.empty());
  EXPECT_EQ(r.comm->size(), 2);
  EXPECT_EQ(nccl(*c)["revoked"], nccl(*c)["native_revoke"]);  // ncclCommRevoke where NCCL has it
  expect_native(*c, *r.comm);
  EXPECT_EQ(device_all_reduce(*r.comm, 4.0f), 8.0f);
  std::printf("rank %d: recover took %lld ms\n", c->rank(), static_cast<long long>(r.took.count()));
}

}  // namespace
