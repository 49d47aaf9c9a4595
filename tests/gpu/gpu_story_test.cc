// The promises of the NCCL path through the public API, on CUDA devices,
// under commsrun (one rank per GPU): eager binding, hints that reach the
// device, offload/reload of a cpu:gloo,cuda:nccl comm and its split children
// with the memory back each time, and timeout and abort of an op that cannot
// complete. Every case skips with "no CUDA device" on a machine without one.
//
// With GPU_STORY_NCCL_LOG_DIR set, NCCL's own INFO log (init and collectives)
// goes to a file per process there, and the cases read it back to confirm
// what NCCL did, not only what comms says it asked for.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <optional>
#include <vector>

#include "comms/bootstrap.h"
#include "comms/comms.h"
#include "comms/lifecycle.h"
#include "comms/store.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using comms::BufferView;
using comms::DataType;
using comms::Device;
using comms::DeviceType;
using comms::ErrorCode;
using comms::ReduceOp;

constexpr size_t kMiB = size_t{1} << 20;

#define CUDA_OK(call)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);                     \
  } while (0)

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// NCCL's log of this process, if GPU_STORY_NCCL_LOG_DIR asked for one.
std::string nccl_log_path() {
  const char* dir = std::getenv("GPU_STORY_NCCL_LOG_DIR");
  if (!dir) return {};
  return std::string(dir) + "/nccl." + std::to_string(::getpid()) + ".log";
}

std::string read_file_from(const std::string& path, std::streamoff offset) {
  std::ifstream f(path);
  if (!f) return {};
  f.seekg(offset);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::streamoff file_size(const std::string& path) {
  std::ifstream f(path, std::ios::ate);
  return f ? static_cast<std::streamoff>(f.tellg()) : 0;
}

int count_matches(const std::string& text, const std::regex& re) {
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

size_t free_device_memory() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 0;
  return free_bytes;
}

class GpuStory : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    boot = comms::bootstrap_from_environment();
    if (boot.local_rank >= count) {
      GTEST_SKIP() << "local rank " << boot.local_rank << " has no GPU of its own (" << count << " on this host)";
    }
    device = Device::cuda(boot.local_rank);
    ASSERT_EQ(cudaSetDevice(boot.local_rank), cudaSuccess);
    ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the context exists before any baseline is read
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&scratch, kScratchFloats * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
  }

  // A unique comm name per case (every rank runs the cases in the same order).
  std::string name(const std::string& what) {
    return what + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // all_reduce(sum) of `value` at n floats on the device; returns element 0
  // and checks that every element agrees.
  float device_all_reduce(comms::Comm& c, float value, size_t n = 1024) {
    std::vector<float> host(n, value);
    EXPECT_EQ(cudaMemcpyAsync(scratch, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
    comms::OpOptions o;
    o.stream = stream;
    c.all_reduce(BufferView{scratch, n, DataType::kFloat32, device}, ReduceOp::sum(), o);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), scratch, n * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t i = 1; i < n; ++i) {
      if (host[i] != host[0]) {
        ADD_FAILURE() << "element " << i << " is " << host[i] << ", element 0 is " << host[0];
        break;
      }
    }
    return host[0];
  }

  static constexpr size_t kScratchFloats = 1 << 20;
  comms::BootstrapInfo boot;
  Device device = Device::cpu();
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;
};

// The NCCL backend's own description (its describe()), or null before it exists.
nlohmann::json nccl_description(const comms::Comm& c) {
  const auto j = nlohmann::json::parse(c.describe());
  const auto& cuda = j.at("backends").at("cuda");
  EXPECT_EQ(cuda.at("backend"), "nccl") << j.dump();
  return cuda.at("config");
}

// What an offload by suspend leaves on the device: ncclCommMemStats'
// persistent bytes, read by the backend right after ncclCommSuspend (NCCL
// >= 2.29 keeps them by design). 0 for a backend the offload destroyed.
size_t kept_through_suspend(const comms::Comm& c) {
  const auto cuda = nlohmann::json::parse(c.describe()).at("backends").at("cuda");
  if (cuda.value("offload", "") != "suspend") return 0;
  const auto& after = cuda.at("config").at("suspend").at("mem_stats_after_suspend");
  EXPECT_TRUE(after.is_object() && after.at("persistent").is_number()) << cuda.dump();
  return after.is_object() && after.at("persistent").is_number() ? after.at("persistent").get<size_t>() : 0;
}

TEST_F(GpuStory, EagerBindingReturnsWithNcclConnectedAndTheFlushBarrierDone) {
  const std::string log = nccl_log_path();
  const auto before = file_size(log);
  auto c = comms::new_comm("cpu:gloo,cuda:nccl", device, name("eager"));
  // Everything below is read before any op of ours.
  EXPECT_EQ(c->backend_state(DeviceType::kCuda), comms::BackendState::kReady);
  EXPECT_EQ(c->backend_state(DeviceType::kCpu), comms::BackendState::kLazy);
  const auto j = nccl_description(*c);
  EXPECT_EQ(j["initialized"], true) << j.dump();
  EXPECT_EQ(j["device"], device.to_string()) << j.dump();
  if (!log.empty()) {
    const std::string text = read_file_from(log, before);
    // NCCL logs its init and, with the COLL subsystem, every collective it is
    // handed: the flush barrier is one, issued inside new_comm.
    EXPECT_EQ(count_matches(text, std::regex(R"(Init COMPLETE)")), 1) << text;
    EXPECT_EQ(count_matches(text, std::regex(R"(AllReduce: opCount \d+ sendbuff \S+ recvbuff \S+ count 1 )")), 1)
        << text;
  }
  const int n = c->size();
  EXPECT_EQ(device_all_reduce(*c, 1.0f), float(n));
}

TEST_F(GpuStory, HintsReachTheDeviceStreamAndNcclsConfig) {
  int least = 0, greatest = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const std::string log = nccl_log_path();
  const auto before = file_size(log);
  comms::CommOptions o;
  o.hints = {{"nccl.high_priority_stream", "1"}, {"nccl.cga_cluster_size", "2"},
             {"nccl.min_ctas", "2"}, {"nccl.max_ctas", "4"}};
  auto c = comms::new_comm("cuda:nccl", device, name("hints"), o);
  auto j = nccl_description(*c);
  EXPECT_EQ(j["stream_priority"]["class"], "high") << j.dump();
  // cudaStreamGetPriority on the comm's own stream.
  EXPECT_EQ(j["stream_priority"]["read_back"], greatest) << j.dump();
  EXPECT_EQ(j["nccl_config"]["cga_cluster_size"], 2);
  EXPECT_EQ(j["nccl_config"]["min_ctas"], 2);
  EXPECT_EQ(j["nccl_config"]["max_ctas"], 4);
  EXPECT_EQ(device_all_reduce(*c, 2.0f), 2.0f * c->size());

  // A split child keeps the priority (a new stream, same class).
  std::vector<int> all(static_cast<size_t>(c->size()));
  for (int r = 0; r < c->size(); ++r) all[static_cast<size_t>(r)] = r;
  auto child = c->split(all, name("hints-child"));
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(nccl_description(*child)["stream_priority"]["read_back"], greatest);
  EXPECT_EQ(device_all_reduce(*child, 3.0f), 3.0f * c->size());

  // Without the hint: CUDA's default priority.
  auto plain = comms::new_comm("cuda:nccl", device, name("plain"));
  EXPECT_EQ(nccl_description(*plain)["stream_priority"]["read_back"], 0);

  if (!log.empty()) {
    // What NCCL itself says it was configured with (NCCL 2.28 logs each
    // config field it was given at INIT level, and the channels it built).
    const std::string text = read_file_from(log, before);
    for (const char* line : {"Comm config CGA cluster size set to 2", "Comm config Min CTAs set to 2",
                             "Comm config Max CTAs set to 4"}) {
      EXPECT_NE(text.find(line), std::string::npos) << "NCCL's log lacks '" << line << "'";
    }
    std::smatch m;
    const std::regex channels(R"((\d+) coll channels)");
    ASSERT_TRUE(std::regex_search(text, m, channels)) << "NCCL logged no channel count";
    EXPECT_GE(std::stoi(m[1]), 2);
    EXPECT_LE(std::stoi(m[1]), 4) << m.str() << ": max_ctas=4 did not bound the channels";
    std::printf("nccl log: %s; the comm's stream priority %d (greatest %d)\n", m.str().c_str(),
                j["stream_priority"]["read_back"].get<int>(), greatest);
  }
}

TEST_F(GpuStory, ThreeOffloadReloadCyclesGiveTheMemoryBackAndKeepResultsRight) {
  comms::dist::InitOptions init;
  init.backend = "cpu:gloo,cuda:nccl";
  init.device = device;
  const size_t baseline = free_device_memory();
  ASSERT_GT(baseline, 0u);
  {
    comms::dist::Session session(init);
    auto world = comms::dist::world();
    const int n = world.size();
    std::vector<int> all(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = r;
    comms::dist::GroupOptions go;
    go.name = "gpu-story-child";
    go.options.nccl.is_high_priority_stream = true;
    auto child = comms::dist::new_group(all, go);
    ASSERT_TRUE(child.is_member());
    std::vector<std::vector<int>> one_group = {all};
    comms::dist::SplitGroupOptions so;
    so.name = "gpu-story-split";
    auto split = comms::dist::split_group(world, one_group, so);
    ASSERT_TRUE(split.is_member());

    auto check_all = [&](float v, const char* when) {
      SCOPED_TRACE(when);
      EXPECT_EQ(device_all_reduce(world.comm(), v), v * n);
      EXPECT_EQ(device_all_reduce(child.comm(), v + 1), (v + 1) * n);
      EXPECT_EQ(device_all_reduce(split.comm(), v + 2), (v + 2) * n);
      int64_t cpu = world.rank() + 1;
      world.comm().all_reduce(BufferView::of(&cpu, 1), ReduceOp::sum());
      EXPECT_EQ(cpu, int64_t(n) * (n + 1) / 2);
    };
    check_all(1, "before the first offload");
    const size_t with_comms = free_device_memory();
    std::printf("free device memory: %.1f MiB before comms, %.1f MiB with 3 NCCL comms\n", baseline / double(kMiB),
                with_comms / double(kMiB));
    for (int cycle = 1; cycle <= 3; ++cycle) {
      SCOPED_TRACE("cycle " + std::to_string(cycle));
      const auto report = comms::dist::offload_groups();
      EXPECT_EQ(report.groups_offloaded, 3) << report.to_string();
      EXPECT_EQ(world.comm().backend_state(DeviceType::kCuda), comms::BackendState::kOffloaded);
      const size_t after = free_device_memory();
      const size_t kept =
          kept_through_suspend(world.comm()) + kept_through_suspend(child.comm()) + kept_through_suspend(split.comm());
      std::printf("cycle %d: after offload %.1f MiB free (%+.1f MiB from before comms, %.1f MiB kept by suspended "
                  "communicators); %s\n",
                  cycle, after / double(kMiB), (double(after) - double(baseline)) / kMiB, kept / double(kMiB),
                  report.to_string().c_str());
      EXPECT_EQ(report.communicators_destroyed + report.communicators_suspended, 3) << report.to_string();
      EXPECT_GE(after + 64 * kMiB + kept, baseline)
          << "offload left " << (baseline - after) / kMiB << " MiB in use, " << kept / kMiB
          << " MiB of it persistent by MemStats";
      // CPU ops keep working while the GPU backends are released.
      int64_t cpu = 1;
      world.comm().all_reduce(BufferView::of(&cpu, 1), ReduceOp::sum());
      EXPECT_EQ(cpu, n);
      const auto reload = comms::dist::reload_groups();
      EXPECT_EQ(reload.groups_reloaded, 3);
      EXPECT_EQ(nccl_description(child.comm())["stream_priority"]["class"], "high");
      check_all(float(10 * cycle), "after reload");
    }
  }
  const size_t at_end = free_device_memory();
  EXPECT_GE(at_end + 64 * kMiB, baseline) << "after shutdown " << (baseline - at_end) / kMiB << " MiB still in use";
}

// Issue 27 through libcomms: an all_reduce captured in a CUDA graph on a
// buffer from the backend's allocator, registered with the comm; an offload
// releases the registration (free memory back to the level before the comms
// but with the buffer) and, after the reload, a new registration and a new
// capture give the right values again. Graphs are destroyed before the
// offload: they hold the communicator the offload frees.
TEST_F(GpuStory, CapturedOpOnARegisteredBufferAndOffloadReleasesTheRegistration) {
  comms::dist::InitOptions init;
  init.backend = "cpu:gloo,cuda:nccl";
  init.device = device;
  const size_t baseline = free_device_memory();
  constexpr size_t n = size_t{16} << 20;  // 64 MiB of floats
  comms::dist::Session session(init);
  auto group = comms::dist::world();
  comms::Comm& world = group.comm();
  const int size = world.size();
  ASSERT_TRUE(comms::can_register_buffers(world, DeviceType::kCuda));
  auto* buf = static_cast<float*>(comms::alloc_backend_memory(world, device, n * sizeof(float)));
  const BufferView view{buf, n, DataType::kFloat32, device};
  auto replay_right = [&](const char* when) {
    SCOPED_TRACE(when);
    comms::RegisteredBuffer reg = comms::register_buffer(world, view);
    ASSERT_TRUE(reg.registered());
    comms::OpOptions o;
    o.stream = stream;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    world.all_reduce(view, ReduceOp::sum(), o);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::vector<float> host(1024);
    for (int r = 1; r <= 50; ++r) {
      std::fill(host.begin(), host.end(), float(r));
      ASSERT_EQ(cudaMemcpyAsync(buf, host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(host.data(), buf, host.size() * 4, cudaMemcpyDeviceToHost, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_EQ(host[0], float(r * size)) << "replay " << r;
      ASSERT_EQ(host[1023], float(r * size)) << "replay " << r;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    // Left registered on purpose: the offload must release it.
    const auto report = comms::dist::offload_groups();
    EXPECT_FALSE(reg.registered());
    const size_t after = free_device_memory();
    const size_t kept = kept_through_suspend(world);
    std::printf("%s: after offload %.1f MiB free, %.1f MiB before comms (the buffer is %.1f MiB, %.1f MiB kept by "
                "a suspended communicator)\n",
                when, after / double(kMiB), baseline / double(kMiB), n * 4 / double(kMiB), kept / double(kMiB));
    EXPECT_GE(after + 64 * kMiB + n * sizeof(float) + kept, baseline) << report.to_string();
    comms::dist::reload_groups();
  };
  replay_right("first registration");
  replay_right("after a reload");
  comms::free_backend_memory(world, device, buf);
}

// A two-rank comm of which only this process (rank 0) exists: its peer never
// joins. Each process makes its own, on its own store and GPU.
std::shared_ptr<comms::Comm> comm_without_its_peer(const std::string& name, std::optional<Device> device,
                                                   std::chrono::milliseconds init_timeout,
                                                   std::chrono::milliseconds op_timeout) {
  comms::CommOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.store = comms::make_memory_store();
  o.init_timeout = init_timeout;
  o.op_timeout = op_timeout;
  return comms::new_comm("cuda:nccl", device, name, o);
}

TEST_F(GpuStory, AnEagerCommWhosePeerNeverJoinsFailsWithTimeoutWithinTheTimeoutPlusFiveSeconds) {
  const auto start = Clock::now();
  try {
    comm_without_its_peer(name("lonely"), device, 3s, 3s);
    ADD_FAILURE() << "new_comm returned without its peer";
  } catch (const comms::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    std::printf("eager init without the peer: %.2f s: %s\n", seconds_since(start), e.what());
  }
  EXPECT_LT(seconds_since(start), 3.0 + 5.0);
}

TEST_F(GpuStory, AnOpOnALazyCommWhosePeerNeverJoinsFailsWithTimeout) {
  auto c = comm_without_its_peer(name("lonely-lazy"), std::nullopt, 3s, 3s);
  const auto start = Clock::now();
  EXPECT_THROW(
      {
        try {
          device_all_reduce(*c, 1.0f);
        } catch (const comms::Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
          EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
          std::printf("first op without the peer: %.2f s: %s\n", seconds_since(start), e.what());
          throw;
        }
      },
      comms::Error);
  EXPECT_LT(seconds_since(start), 3.0 + 5.0);
}

// Needs a peer on another GPU: rank 0 receives from rank 1, which never sends.
TEST_F(GpuStory, ARecvWithNoSenderFailsWithTimeoutWithinTheOpTimeoutPlusFiveSeconds) {
  comms::CommOptions o;
  o.op_timeout = 3s;
  auto c = comms::new_comm("cuda:nccl", device, name("recv"), o);
  if (c->size() < 2) GTEST_SKIP() << "needs two GPUs (world size " << c->size() << ")";
  if (c->rank() == 0) {
    comms::OpOptions opts;
    opts.stream = stream;
    const auto start = Clock::now();
    try {
      c->recv(BufferView{scratch, 16, DataType::kFloat32, device}, 1, opts).blocking_wait();
      ADD_FAILURE() << "a receive with no sender completed";
    } catch (const comms::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
      std::printf("recv without a sender: %.2f s: %s\n", seconds_since(start), e.what());
    }
    EXPECT_LT(seconds_since(start), 3.0 + 5.0);
  }
  // Every rank sees the comm fail (rank 0 by its timeout, the others when it aborts).
  c->abort("gpu-story: end of the case");
}

TEST_F(GpuStory, AbortFromAnotherThreadUnblocksAnOpWaitingForItsPeer) {
  auto c = comm_without_its_peer(name("abort"), std::nullopt, 120s, 120s);
  std::thread aborter([&] {
    std::this_thread::sleep_for(1s);
    c->abort("gpu-story: abort from another thread");
  });
  const auto start = Clock::now();
  try {
    device_all_reduce(*c, 1.0f);
    ADD_FAILURE() << "an op completed without its peer";
  } catch (const comms::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
  }
  aborter.join();
  const double took = seconds_since(start);
  std::printf("abort unblocked the op after %.2f s\n", took);
  EXPECT_LT(took, 1.0 + 5.0);
  EXPECT_TRUE(c->is_failed());
}

// NCCL reads its debug variables once, at its first call: set them before
// main (the tests' shared main, tests/support/gtest_main.cc) runs any case.
[[maybe_unused]] const bool nccl_log_configured = [] {
  if (const std::string log = nccl_log_path(); !log.empty()) {
    ::setenv("NCCL_DEBUG", "INFO", 1);
    ::setenv("NCCL_DEBUG_SUBSYS", "INIT,COLL,ENV", 1);
    ::setenv("NCCL_DEBUG_FILE", log.c_str(), 1);
    return true;
  }
  return false;
}();

}  // namespace
