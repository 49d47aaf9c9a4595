// The conformance suite's buffers: staged on the host, uploaded before an op
// and read back before a check, here through a stand-in device that keeps
// its "device" memory on the host and counts the copies. And the suite with
// --device cuda on a host without a GPU: every case skipped, saying why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "device_memory.h"
#include "harness.h"
#include "subprocess.h"

namespace comms::conformance {
namespace {

using namespace std::chrono_literals;

// Labels its memory cuda:3; the bytes live on the host.
class StandInDevice final : public DeviceMemory {
 public:
  Device device() const override { return Device::cuda(3); }
  void* stream() const override { return const_cast<int*>(&stream_tag_); }
  std::string describe() const override { return "stand-in cuda:3"; }
  void* allocate(size_t bytes) override {
    ++allocations;
    return std::malloc(bytes);
  }
  void release(void* p) noexcept override {
    ++releases;
    std::free(p);
  }
  void upload(void* device, const void* host, size_t bytes) override {
    ++uploads;
    std::memcpy(device, host, bytes);
  }
  void download(void* host, const void* device, size_t bytes) override {
    ++downloads;
    if (fail_downloads) throw Error(ErrorCode::kTimeout, "the stream did not drain");
    std::memcpy(host, device, bytes);
  }
  std::unique_ptr<DeviceMemory> with_own_stream() const override { return std::make_unique<StandInDevice>(); }

  int allocations = 0, releases = 0, uploads = 0, downloads = 0;
  bool fail_downloads = false;

 private:
  int stream_tag_ = 0;
};

// What an op on the device does: writes through the view.
void device_writes(const BufferView& v, size_t i, int32_t value) {
  std::memcpy(static_cast<int32_t*>(v.data) + i, &value, sizeof value);
}

int32_t device_reads(const BufferView& v, size_t i) {
  int32_t x;
  std::memcpy(&x, static_cast<const int32_t*>(v.data) + i, sizeof x);
  return x;
}

TEST(ConformanceBuffers, OnTheHostAViewIsTheHostBytesLabelledCpu) {
  auto host = host_memory();
  EXPECT_EQ(host->device(), Device::cpu());
  EXPECT_EQ(host->stream(), nullptr);
  Buf b(*host, DataType::kInt32, 4);
  b.set(2, 42);
  const BufferView v = b.view();
  EXPECT_EQ(v.device, Device::cpu());
  EXPECT_EQ(v.count, 4u);
  EXPECT_EQ(device_reads(v, 2), 42);
  device_writes(v, 1, 7);
  EXPECT_EQ(b.get(1), 7);
  EXPECT_EQ(op_options(*host, true).stream, nullptr);
}

TEST(ConformanceBuffers, ValuesSetOnTheHostReachTheDeviceOnceAtTheFirstView) {
  StandInDevice dev;
  {
    Buf b(dev, DataType::kInt32, 5);
    EXPECT_EQ(dev.allocations, 1);
    for (size_t i = 0; i < 5; ++i) b.set(i, 10 + i);
    EXPECT_EQ(dev.uploads, 0) << "nothing goes to the device before an op needs it";
    const BufferView v = b.view();
    const BufferView part = b.view(2, 3);
    EXPECT_EQ(dev.uploads, 1) << "a second view of unchanged values uploads nothing";
    EXPECT_EQ(v.device, Device::cuda(3));
    EXPECT_EQ(part.device, Device::cuda(3));
    EXPECT_EQ(static_cast<char*>(part.data) - static_cast<char*>(v.data), 2 * 4);
    EXPECT_EQ(part.count, 3u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(device_reads(v, i), int32_t(10 + i)) << i;
  }
  EXPECT_EQ(dev.releases, 1);
}

TEST(ConformanceBuffers, ABufferNeverSetStillStartsAsZerosOnTheDevice) {
  StandInDevice dev;
  Buf b(dev, DataType::kInt32, 3);
  const BufferView v = b.view();
  EXPECT_EQ(dev.uploads, 1);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(device_reads(v, i), 0) << i;
}

TEST(ConformanceBuffers, WhatTheDeviceWroteIsReadBackOnceBeforeTheCheck) {
  StandInDevice dev;
  Buf b(dev, DataType::kInt32, 4);
  const BufferView v = b.view();
  device_writes(v, 0, -5);
  device_writes(v, 3, 99);
  EXPECT_EQ(b.get(0), -5);
  EXPECT_EQ(b.get(3), 99);
  EXPECT_EQ(dev.downloads, 1);
  // Another view may be written again: the next read fetches it again.
  device_writes(b.view(), 3, 100);
  EXPECT_EQ(b.get(3), 100);
  EXPECT_EQ(dev.downloads, 2);
  EXPECT_EQ(dev.uploads, 1) << "unchanged host values are not uploaded again";
}

TEST(ConformanceBuffers, SettingOneValueAfterAnOpKeepsTheOthersTheDeviceWrote) {
  StandInDevice dev;
  Buf b(dev, DataType::kInt32, 3);
  const BufferView v = b.view();
  device_writes(v, 0, 11);
  device_writes(v, 2, 33);
  b.set(1, 22);
  const BufferView again = b.view();
  EXPECT_EQ(device_reads(again, 0), 11);
  EXPECT_EQ(device_reads(again, 1), 22);
  EXPECT_EQ(device_reads(again, 2), 33);
}

TEST(ConformanceBuffers, AZeroCountViewOnTheDeviceIsNotNull) {
  StandInDevice dev;
  Buf b(dev, DataType::kFloat64, 0);
  const BufferView v = b.view();
  EXPECT_NE(v.data, nullptr);
  EXPECT_EQ(v.count, 0u);
  EXPECT_EQ(v.device, Device::cuda(3));
  Buf h(DataType::kFloat64, 0);
  EXPECT_NE(h.view().data, nullptr);
}

TEST(ConformanceBuffers, AMovedBufferReleasesItsDeviceMemoryOnce) {
  StandInDevice dev;
  {
    Buf a(dev, DataType::kInt32, 2);
    a.set(0, 5);
    Buf b = std::move(a);
    EXPECT_EQ(b.get(0), 5);
    Buf c(dev, DataType::kInt32, 1);
    c = std::move(b);  // c's first allocation is released here
    EXPECT_EQ(dev.releases, 1);
    EXPECT_EQ(device_reads(c.view(), 0), 5);
  }
  EXPECT_EQ(dev.allocations, 2);
  EXPECT_EQ(dev.releases, 2);
}

TEST(ConformanceBuffers, AFailedReadBackIsACheckFailureNotAThrow) {
  StandInDevice dev;
  Buf b(dev, DataType::kInt32, 2);
  b.view();
  dev.fail_downloads = true;
  Checker check(0, 0);
  Where w;
  w.op = "all_reduce";
  w.dtype = DataType::kInt32;
  EXPECT_NO_THROW(check.values(b, 0, 2, w, [](size_t) { return 0.0; }));
  ASSERT_TRUE(check.failed());
  EXPECT_NE(check.first_failure().find("reading the result back failed"), std::string::npos) << check.first_failure();
  EXPECT_NE(check.first_failure().find("did not drain"), std::string::npos) << check.first_failure();
}

TEST(ConformanceBuffers, OpOptionsCarryTheMemorysStream) {
  StandInDevice dev;
  const OpOptions sync = op_options(dev);
  const OpOptions async = op_options(dev, true);
  EXPECT_EQ(sync.stream, dev.stream());
  EXPECT_NE(sync.stream, nullptr);
  EXPECT_FALSE(sync.async);
  EXPECT_TRUE(async.async);
  EXPECT_EQ(async.stream, dev.stream());
}

TEST(ConformanceBuffers, WithoutADeviceCudaMemoryIsRefusedSayingNoCudaDevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  std::string why;
  EXPECT_EQ(cuda_memory(0, 1, 1s, &why), nullptr);
  EXPECT_NE(why.find("no CUDA device"), std::string::npos) << why;
}

// On a GPU host: bytes go to the device and come back through the stream, in
// a buffer the host never wrote.
TEST(ConformanceBuffers, OnARealGpuBytesRoundTripThroughTheDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::string why;
  auto gpu = cuda_memory(0, 1, 30s, &why);
  ASSERT_NE(gpu, nullptr) << why;
  EXPECT_NE(gpu->stream(), nullptr);
  EXPECT_EQ(gpu->device(), Device::cuda(0));
  EXPECT_NE(gpu->describe().find("compute capability"), std::string::npos) << gpu->describe();
  Buf b(*gpu, DataType::kInt32, 1000);
  for (size_t i = 0; i < 1000; ++i) b.set(i, int(i) * 7 - 3);
  const BufferView v = b.view();
  std::vector<int32_t> back(1000, 0);
  gpu->download(back.data(), v.data, 1000 * sizeof(int32_t));
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(back[i], int32_t(i) * 7 - 3) << i;
  EXPECT_EQ(b.get(999), 999 * 7 - 3);
  auto second = gpu->with_own_stream();
  EXPECT_NE(second->stream(), gpu->stream());
}

// Done-means 1 of the GPU issue: on a host without a GPU, every case of
// `--device cuda --backend cuda:nccl` is listed, and every one is skipped
// because there is no CUDA device (none runs, none skips for another reason).
TEST(ConformanceOnCuda, WithoutADeviceEveryCaseIsSkippedSayingNoCudaDevice) {
  if (!NCCL_PLUGIN_BUILT) GTEST_SKIP() << "the NCCL plugin is not part of this build";
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the suite runs on it (conformance_nccl_n1)";
  const auto dir = std::filesystem::temp_directory_path() / ("conformance_cuda_test." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string json_path = (dir / "results.json").string();
  auto p = comms::testing::run({COMMSRUN, "-n", "1", "--timeout", "150", "--", CONFORMANCE, "--device", "cuda",
                                "--backend", "cuda:nccl", "--json", json_path},
                               {}, 170s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("comms-conformance: backend cuda:nccl, device cuda, world size 1"), std::string::npos)
      << p.output;
  std::ifstream in(json_path);
  ASSERT_TRUE(in.good()) << "no JSON report at " << json_path << "\n" << p.output;
  const auto j = nlohmann::json::parse(in);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(j["passed"], 0);
  EXPECT_EQ(j["failed"], 0);
  const auto& cases = j["cases"];
  ASSERT_TRUE(cases.is_array());
  // Every op x dtype x reduction x placement of every shape, the error and
  // lifecycle cases: thousands (6006 when this was written).
  EXPECT_GT(cases.size(), 5000u);
  EXPECT_EQ(j["skipped"], cases.size());
  int wrong = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"], status = c["status"], reason = c["reason"];
    if (status != "skipped" || reason.find("no CUDA device") == std::string::npos) {
      if (++wrong <= 5) ADD_FAILURE() << name << ": " << status << ": " << reason;
    }
  }
  EXPECT_EQ(wrong, 0);
  // Each kind of case is among them, by its exact name.
  for (const char* name : {"world/all_reduce/float32/sum/in-place", "two_levels/all_to_all_v/bfloat16/out-of-place",
                           "world/errors/wrong_device", "world/lifecycle/concurrent_ops_on_two_comms",
                           "world/errors/rank_skipping_an_op_times_out_the_others", "without_rank0/*"}) {
    bool found = false;
    for (const auto& c : cases) found |= c["name"] == name;
    EXPECT_TRUE(found) << name;
  }
}

}  // namespace
}  // namespace comms::conformance
