// The built plugin, loaded with dlopen and driven only through its
// descriptor, as libcomms will drive it. The descriptor tests run anywhere;
// the device tests (world size 1) skip with "no CUDA device" without one.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "comms/numeric.h"
#include "comms/plugin.h"
#include "memory_store_for_tests.h"

namespace {

using namespace std::chrono_literals;
using comms::DataType;
using comms::Device;
using comms::ErrorCode;
using comms::ReduceKind;
using comms::ReduceOp;
using comms::Status;
using comms::WaitMode;
using comms::plugin::Backend;
using comms::plugin::BackendInit;
using comms::plugin::OpDesc;
using comms::plugin::OpType;
using comms::plugin::PluginDescriptor;

const PluginDescriptor* plugin() {
  static const PluginDescriptor* descriptor = [] {
    const char* path = std::getenv("COMMS_NCCL_PLUGIN");
    if (!path) return static_cast<const PluginDescriptor*>(nullptr);
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // never closed, like libcomms
    if (!handle) {
      ADD_FAILURE() << "dlopen " << path << ": " << dlerror();
      return static_cast<const PluginDescriptor*>(nullptr);
    }
    auto entry = reinterpret_cast<comms_plugin_entry_fn>(dlsym(handle, COMMS_PLUGIN_ENTRY_SYMBOL));
    return entry ? entry() : nullptr;
  }();
  return descriptor;
}

class NcclPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    d = plugin();
    ASSERT_NE(d, nullptr) << "set COMMS_NCCL_PLUGIN to build/backends/nccl/libcomms-nccl.so";
  }
  const PluginDescriptor* d = nullptr;
};

TEST_F(NcclPlugin, DescriptorNamesNcclTheLinkedVersionAndCuda) {
  EXPECT_EQ(d->abi_version, COMMS_PLUGIN_ABI_VERSION);
  EXPECT_STREQ(d->name, "nccl");
  int code = 0;
  ASSERT_EQ(ncclGetVersion(&code), ncclSuccess);
  const std::string expected_prefix =
      std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + ".";
  EXPECT_EQ(std::string(d->version).rfind(expected_prefix, 0), 0u) << d->version;
  EXPECT_EQ(d->device_types, comms::plugin::device_bit(comms::DeviceType::kCuda));
  std::vector<std::string> keys;
  for (const char* const* k = d->hint_keys; *k; ++k) keys.emplace_back(*k);
  EXPECT_EQ(keys.size(), 19u);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "high_priority_stream"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "nvlink_centric_sched"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "graph_stream_ordering"), keys.end());
  // Windows are claimed for every NCCL; a backend below 2.29 says unsupported.
  EXPECT_NE(d->features & comms::plugin::kFeatureWindows, 0u);
}

TEST_F(NcclPlugin, DeviceCountIsZeroNotACrashWithoutADevice) {
  EXPECT_GE(d->device_count(comms::DeviceType::kCuda), 0);
  EXPECT_EQ(d->device_count(comms::DeviceType::kCpu), 0);
}

TEST_F(NcclPlugin, ExplainHintsShowsExactlyTheGivenValues) {
  std::string json;
  Status s = d->explain_hints({{"cga_cluster_size", "4"},
                               {"min_ctas", "2"},
                               {"max_ctas", "16"},
                               {"high_priority_stream", "1"}},
                              &json);
  ASSERT_TRUE(s.is_ok()) << s.message;
  auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["nccl_config"]["cga_cluster_size"], 4);
  EXPECT_EQ(j["nccl_config"]["min_ctas"], 2);
  EXPECT_EQ(j["nccl_config"]["max_ctas"], 16);
  EXPECT_TRUE(j["nccl_config"]["net_name"].is_null());
  EXPECT_EQ(j["high_priority_stream"], true);
}

TEST_F(NcclPlugin, ExplainHintsRejectsInvalidHintsNamingTheKey) {
  std::string json;
  Status s = d->explain_hints({{"min_ctas", "32"}, {"max_ctas", "8"}}, &json);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find("min_ctas"), std::string::npos) << s.message;
  s = d->explain_hints({{"no_such_key", "1"}}, &json);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message.find("no_such_key"), std::string::npos) << s.message;
}

TEST_F(NcclPlugin, CreateRejectsACpuDevice) {
  BackendInit init;
  init.comm_name = "t";
  init.device = Device::cpu();
  init.store = std::make_shared<comms::nccl::testing::MemoryStore>();
  std::unique_ptr<Backend> b;
  EXPECT_EQ(d->create(init, &b).code, ErrorCode::kInvalidArgument);
}

// ---- device tests, world size 1 ------------------------------------------

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

class NcclGpu : public NcclPlugin {
 protected:
  void SetUp() override {
    NcclPlugin::SetUp();
    if (d == nullptr) return;
    if (d->device_count(comms::DeviceType::kCuda) == 0) GTEST_SKIP() << "no CUDA device";
  }

  std::unique_ptr<Backend> make(comms::Hints hints = {}, std::chrono::milliseconds op_timeout = 60s) {
    BackendInit init;
    init.comm_name = "gpu_test";
    init.device = Device::cuda(0);
    init.eager = true;
    init.store = std::make_shared<comms::nccl::testing::MemoryStore>();
    init.init_timeout = 60s;
    init.op_timeout = op_timeout;
    init.hints = std::move(hints);
    std::unique_ptr<Backend> b;
    Status s = d->create(init, &b);
    EXPECT_TRUE(s.is_ok()) << s.message;
    if (!b) return nullptr;
    s = b->init();
    EXPECT_TRUE(s.is_ok()) << s.message;
    return b;
  }

  static OpDesc desc(OpType type, size_t count, DataType dtype, const void* in, void* out) {
    OpDesc o;
    o.type = type;
    o.seq = ++seq_;
    o.count = count;
    o.dtype = dtype;
    o.device = Device::cuda(0);
    o.input = in;
    o.output = out;
    o.root = 0;
    o.peer = 0;
    o.async = true;
    return o;
  }
  static inline uint64_t seq_ = 0;
};

using NcclGpuGraphs = NcclGpu;

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  void* ptr = nullptr;
};

constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,      DataType::kInt32,      DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,     DataType::kFloat16,    DataType::kBfloat16,
    DataType::kFloat32, DataType::kFloat64,    DataType::kFloat8E4M3, DataType::kFloat8E5M2,
    DataType::kBool};

const char* type_name(DataType t) {
  static const char* names[] = {"int8",    "uint8",   "int32",   "uint32",      "int64",
                                "uint64",  "float16", "bfloat16", "float32",    "float64",
                                "float8_e4m3", "float8_e5m2", "bool"};
  return names[static_cast<int>(t)];
}

// At world size 1 every op copies its input (scaled by premul_sum's factor).
TEST_F(NcclGpu, EveryOpAndDtypeGivesTheSingleRankResult) {
  auto b = make();
  ASSERT_NE(b, nullptr);
  constexpr size_t n = 16;
  const OpType ops[] = {OpType::kAllReduce, OpType::kReduce,        OpType::kBroadcast,
                        OpType::kAllGather, OpType::kAllGatherList, OpType::kAllGatherV,
                        OpType::kReduceScatter, OpType::kReduceScatterV, OpType::kAllToAll,
                        OpType::kAllToAllV, OpType::kGather, OpType::kScatter,
                        OpType::kBatchP2P};
  const ReduceOp reductions[] = {ReduceOp::sum(), ReduceOp::product(), ReduceOp::min(),
                                 ReduceOp::max(), ReduceOp::avg(), ReduceOp::premul_sum(2.0)};
  for (DataType t : kAllTypes) {
    const size_t bytes = n * comms::element_size(t);
    std::vector<unsigned char> host(bytes), back(bytes);
    for (size_t i = 0; i < n; ++i) {
      comms::numeric::store_from_double(host.data(), t, i, t == DataType::kBool ? i % 2 : i % 7);
    }
    DeviceBuffer in(bytes), out(bytes);
    for (OpType op : ops) {
      const bool reducing = op == OpType::kAllReduce || op == OpType::kReduce ||
                            op == OpType::kReduceScatter || op == OpType::kReduceScatterV;
      std::vector<ReduceOp> rops = reducing ? std::vector<ReduceOp>(std::begin(reductions),
                                                                    std::end(reductions))
                                            : std::vector<ReduceOp>{ReduceOp::sum()};
      for (const ReduceOp& rop : rops) {
        if (reducing && !b->supports_reduction(t, rop.kind)) continue;
        CUDA_OK(cudaMemcpy(in.ptr, host.data(), bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(out.ptr, 0xff, bytes));
        OpDesc o = desc(op, n, t, in.ptr, out.ptr);
        o.reduce = rop;
        const size_t counts[] = {n};
        void* list[] = {out.ptr};
        const comms::P2POp p2p[] = {
            comms::P2POp::send(comms::BufferView{in.ptr, n, t, Device::cuda(0)}, 0),
            comms::P2POp::recv(comms::BufferView{out.ptr, n, t, Device::cuda(0)}, 0)};
        o.counts = counts;
        o.output_counts = counts;
        o.output_list = list;
        o.p2p = p2p;
        std::unique_ptr<comms::plugin::Work> w;
        Status s = b->submit(o, &w);
        ASSERT_TRUE(s.is_ok()) << comms::plugin::op_name(op) << " " << type_name(t) << " " << comms::to_string(rop.kind) << ": "
                               << s.message;
        s = w->wait(WaitMode::kBlocking);
        ASSERT_TRUE(s.is_ok()) << comms::plugin::op_name(op) << " " << type_name(t) << " " << comms::to_string(rop.kind) << ": "
                               << s.message;
        CUDA_OK(cudaMemcpy(back.data(), out.ptr, bytes, cudaMemcpyDeviceToHost));
        const double factor = rop.kind == ReduceKind::kPremulSum ? 2.0 : 1.0;
        for (size_t i = 0; i < n; ++i) {
          const double want = comms::numeric::load_as_double(host.data(), t, i) * factor;
          const double got = comms::numeric::load_as_double(back.data(), t, i);
          ASSERT_EQ(got, want) << "rank 0 " << comms::plugin::op_name(op) << " "
                               << type_name(t) << " reduce kind "
                               << static_cast<int>(rop.kind) << " index " << i;
        }
      }
    }
  }
  EXPECT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclGpu, BarrierCompletes) {
  auto b = make();
  ASSERT_NE(b, nullptr);
  std::unique_ptr<comms::plugin::Work> w;
  ASSERT_TRUE(b->submit(desc(OpType::kBarrier, 0, DataType::kFloat32, nullptr, nullptr), &w).is_ok());
  EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
}

TEST_F(NcclGpu, HighPriorityHintGivesTheGreatestStreamPriority) {
  auto b = make({{"high_priority_stream", "1"}, {"cga_cluster_size", "2"}, {"max_ctas", "8"}});
  ASSERT_NE(b, nullptr);
  int least = 0, greatest = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  auto j = nlohmann::json::parse(b->describe());
  EXPECT_EQ(j["stream_priority"]["class"], "high");
  EXPECT_EQ(j["stream_priority"]["value"], greatest);
  // cudaStreamGetPriority on the comm's own stream.
  EXPECT_EQ(j["stream_priority"]["read_back"], greatest);
  EXPECT_EQ(j["nccl_config"]["cga_cluster_size"], 2);
  EXPECT_EQ(j["nccl_config"]["max_ctas"], 8);
  auto plain = nlohmann::json::parse(make()->describe());
  EXPECT_EQ(plain["stream_priority"]["value"], 0);
  EXPECT_EQ(plain["stream_priority"]["read_back"], 0);
}

TEST_F(NcclGpu, SplitChildWorksAndKeepsTheParentsHints) {
  auto b = make({{"high_priority_stream", "1"}, {"cga_cluster_size", "2"}});
  ASSERT_NE(b, nullptr);
  const int ranks[] = {0};
  comms::plugin::SplitDesc split;
  split.ranks = ranks;
  split.child.comm_name = "gpu_test/child";
  split.child.device = Device::cuda(0);
  split.child.init_timeout = 60s;
  split.child.op_timeout = 60s;
  split.child.hints = {{"min_ctas", "1"}};
  std::unique_ptr<Backend> child;
  Status s = b->split(split, &child);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_NE(child, nullptr);
  auto j = nlohmann::json::parse(child->describe());
  EXPECT_EQ(j["stream_priority"]["class"], "high");
  EXPECT_EQ(j["nccl_config"]["cga_cluster_size"], 2);
  EXPECT_EQ(j["nccl_config"]["min_ctas"], 1);
  DeviceBuffer buf(64);
  std::unique_ptr<comms::plugin::Work> w;
  ASSERT_TRUE(child->submit(desc(OpType::kAllReduce, 16, DataType::kFloat32, buf.ptr, buf.ptr), &w).is_ok());
  EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  EXPECT_TRUE(child->finalize().is_ok());
}

void CUDART_CB sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

// The op waits for the caller's stream, which a host callback holds up, so
// the op cannot finish within its timeout.
TEST_F(NcclGpu, OpPastItsTimeoutFailsWithTimeoutAndLaterOpsAreAborted) {
  auto b = make({}, 200ms);
  ASSERT_NE(b, nullptr);
  cudaStream_t caller;
  CUDA_OK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  CUDA_OK(cudaLaunchHostFunc(caller, sleep_on_stream, reinterpret_cast<void*>(intptr_t{2000})));
  DeviceBuffer buf(64);
  OpDesc o = desc(OpType::kAllReduce, 16, DataType::kFloat32, buf.ptr, buf.ptr);
  o.stream = caller;
  std::unique_ptr<comms::plugin::Work> w;
  ASSERT_TRUE(b->submit(o, &w).is_ok());
  const auto start = std::chrono::steady_clock::now();
  Status s = w->wait(WaitMode::kBlocking);
  EXPECT_EQ(s.code, ErrorCode::kTimeout) << s.message;
  // Bounded, not instant: ncclCommAbort may wait for the held-up stream.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  std::unique_ptr<comms::plugin::Work> later;
  EXPECT_EQ(b->submit(desc(OpType::kAllReduce, 16, DataType::kFloat32, buf.ptr, buf.ptr), &later).code,
            ErrorCode::kAborted);
  CUDA_OK(cudaStreamSynchronize(caller));
  CUDA_OK(cudaStreamDestroy(caller));
}

TEST_F(NcclGpu, AbortFailsAnInFlightOp) {
  auto b = make();
  ASSERT_NE(b, nullptr);
  cudaStream_t caller;
  CUDA_OK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  CUDA_OK(cudaLaunchHostFunc(caller, sleep_on_stream, reinterpret_cast<void*>(intptr_t{1000})));
  DeviceBuffer buf(64);
  OpDesc o = desc(OpType::kAllReduce, 16, DataType::kFloat32, buf.ptr, buf.ptr);
  o.stream = caller;
  std::unique_ptr<comms::plugin::Work> w;
  ASSERT_TRUE(b->submit(o, &w).is_ok());
  b->abort("test abort");
  Status s = w->wait(WaitMode::kBlocking);
  EXPECT_EQ(s.code, ErrorCode::kAborted);
  EXPECT_NE(s.message.find("test abort"), std::string::npos) << s.message;
  CUDA_OK(cudaStreamSynchronize(caller));
  CUDA_OK(cudaStreamDestroy(caller));
}

TEST_F(NcclGpu, FinalizeReleasesDeviceMemoryAcrossCycles) {
  size_t free_before = 0, total = 0;
  {
    auto warm = make();
    ASSERT_NE(warm, nullptr);
    ASSERT_TRUE(warm->finalize().is_ok());
  }
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  for (int i = 0; i < 3; ++i) {
    auto b = make();
    ASSERT_NE(b, nullptr);
    std::unique_ptr<comms::plugin::Work> w;
    ASSERT_TRUE(b->submit(desc(OpType::kBarrier, 0, DataType::kFloat32, nullptr, nullptr), &w).is_ok());
    ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
    Status s = b->finalize();
    ASSERT_TRUE(s.is_ok()) << s.message;
  }
  size_t free_after = 0;
  CUDA_OK(cudaMemGetInfo(&free_after, &total));
  // Allow for allocator granularity; a leaked communicator costs far more.
  EXPECT_LT(static_cast<long long>(free_before) - static_cast<long long>(free_after), 64ll << 20);
}

// Offload by suspend (NCCL >= 2.29): ncclCommSuspend frees device memory and
// keeps the communicator; after ncclCommResume the same backend runs ops
// right. Free memory and MemStats are read back around it.
TEST_F(NcclGpu, SuspendFreesMemoryAndResumeRunsOpsAgain) {
  auto b = make();
  ASSERT_NE(b, nullptr);
  if (!nlohmann::json::parse(b->describe())["suspend"]["available"].get<bool>()) {
    GTEST_SKIP() << "the loaded NCCL has no ncclCommSuspend (needs 2.29): "
                 << nlohmann::json::parse(b->describe())["nccl_version"];
  }
  constexpr size_t n = 1024;
  DeviceBuffer in(n * 4), out(n * 4);
  std::vector<float> host(n, 3.0f), back(n, 0.0f);
  CUDA_OK(cudaMemcpy(in.ptr, host.data(), n * 4, cudaMemcpyHostToDevice));
  auto all_reduce = [&] {
    std::unique_ptr<comms::plugin::Work> w;
    Status s = b->submit(desc(OpType::kAllReduce, n, DataType::kFloat32, in.ptr, out.ptr), &w);
    ASSERT_TRUE(s.is_ok()) << s.message;
    ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  };
  all_reduce();
  size_t free_running = 0, free_suspended = 0, free_resumed = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_running, &total));
  Status s = b->suspend();
  ASSERT_TRUE(s.is_ok()) << s.message;
  CUDA_OK(cudaMemGetInfo(&free_suspended, &total));
  auto j = nlohmann::json::parse(b->describe())["suspend"];
  std::printf("suspend: free %.1f -> %.1f MiB; MemStats before %s, after %s\n", free_running / 1048576.0,
              free_suspended / 1048576.0, j["mem_stats_before_suspend"].dump().c_str(),
              j["mem_stats_after_suspend"].dump().c_str());
  EXPECT_EQ(j["mem_stats_after_suspend"]["suspended"], true);
  EXPECT_GT(free_suspended, free_running) << "ncclCommSuspend freed nothing";
  s = b->resume();
  ASSERT_TRUE(s.is_ok()) << s.message;
  CUDA_OK(cudaMemGetInfo(&free_resumed, &total));
  std::printf("resume: free %.1f MiB\n", free_resumed / 1048576.0);
  CUDA_OK(cudaMemset(out.ptr, 0, n * 4));
  all_reduce();
  CUDA_OK(cudaMemcpy(back.data(), out.ptr, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, host) << "the resumed communicator's all_reduce";
  EXPECT_TRUE(b->finalize().is_ok());
}

// A window at world size 1 (NCCL >= 2.29): a signalled put to oneself lands
// in the window, and waiting for that one signal returns.
TEST_F(NcclGpu, SignalledPutToOwnWindowLandsAndItsSignalIsCounted) {
  auto b = make();
  ASSERT_NE(b, nullptr);
  if (!nlohmann::json::parse(b->describe())["windows"].get<bool>()) {
    GTEST_SKIP() << "the loaded NCCL has no one-sided ops (needs 2.29): "
                 << nlohmann::json::parse(b->describe())["nccl_version"];
  }
  constexpr size_t n = 1024;
  void* window_mem = nullptr;
  ASSERT_TRUE(d->mem_alloc(Device::cuda(0), n * 4, &window_mem).is_ok());
  DeviceBuffer in(n * 4);
  std::vector<float> host(n), back(n, 0.0f);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  CUDA_OK(cudaMemcpy(in.ptr, host.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(window_mem, 0, n * 4));
  void* win = nullptr;
  Status s = b->register_window(window_mem, n * 4, &win);
  ASSERT_TRUE(s.is_ok()) << s.message;
  comms::plugin::WindowOpDesc put;
  put.type = comms::plugin::WindowOpType::kPut;
  put.seq = ++seq_;
  put.window = win;
  put.input = in.ptr;
  put.bytes = n * 4;
  put.peer = 0;
  put.signal = true;
  put.async = true;
  std::unique_ptr<comms::plugin::Work> w;
  s = b->submit_window(put, &w);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  comms::plugin::WindowOpDesc wait = put;
  wait.type = comms::plugin::WindowOpType::kWaitSignal;
  wait.seq = ++seq_;
  const uint64_t counts[] = {1};
  wait.signal_counts = counts;
  s = b->submit_window(wait, &w);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  CUDA_OK(cudaMemcpy(back.data(), window_mem, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, host);
  EXPECT_TRUE(b->deregister_window(win).is_ok());
  EXPECT_TRUE(b->finalize().is_ok());
  EXPECT_TRUE(d->mem_free(Device::cuda(0), window_mem).is_ok());
}

// ---- CUDA graphs and registered buffers -----------------------------------

// Captures the op (synchronous, on `stream`) and returns the instantiated graph.
cudaGraphExec_t capture(Backend& b, cudaStream_t stream, OpDesc o) {
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  o.stream = stream;
  o.async = false;
  std::unique_ptr<comms::plugin::Work> w;
  Status s = b.submit(o, &w);
  EXPECT_TRUE(s.is_ok()) << s.message;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
  }
  return exec;
}

// Each replay runs on fresh input: the host writes replay-specific values,
// the graph reduces them, and the output must hold exactly those.
void replay_and_check(cudaGraphExec_t exec, cudaStream_t stream, void* in, void* out, size_t n, int replays) {
  std::vector<float> host(n), back(n);
  for (int r = 0; r < replays; ++r) {
    for (size_t i = 0; i < n; ++i) host[i] = float(r) + float(i) * 0.25f;
    CUDA_OK(cudaMemcpyAsync(in, host.data(), n * 4, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemsetAsync(out, 0xff, n * 4, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaMemcpyAsync(back.data(), out, n * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(back, host) << "replay " << r;
  }
}

TEST_F(NcclGpuGraphs, AllReduceCapturedInAGraphIsRightOnEachOf1000Replays) {
  auto b = make();
  ASSERT_NE(b, nullptr);
  constexpr size_t n = 1024;
  DeviceBuffer in(n * 4), out(n * 4);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = capture(*b, stream, desc(OpType::kAllReduce, n, DataType::kFloat32, in.ptr, out.ptr));
  ASSERT_NE(exec, nullptr);
  EXPECT_EQ(nlohmann::json::parse(b->describe())["ops_in_flight"], 0);
  replay_and_check(exec, stream, in.ptr, out.ptr, n, 1000);
  EXPECT_EQ(nlohmann::json::parse(b->describe())["ops_in_flight"], 0);  // the watchdog never saw them
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaStreamDestroy(stream));
  EXPECT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclGpuGraphs, CapturedAllReduceOnRegisteredNcclMemory) {
  ASSERT_NE(d->mem_alloc, nullptr);
  ASSERT_TRUE(d->features & comms::plugin::kFeatureRegisterBuffers);
  auto b = make();
  ASSERT_NE(b, nullptr);
  constexpr size_t n = size_t{1} << 20;  // 4 MiB
  void *in = nullptr, *out = nullptr;
  ASSERT_TRUE(d->mem_alloc(Device::cuda(0), n * 4, &in).is_ok());
  ASSERT_TRUE(d->mem_alloc(Device::cuda(0), n * 4, &out).is_ok());
  void *hin = nullptr, *hout = nullptr;
  Status s = b->register_buffer(in, n * 4, &hin);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_TRUE(b->register_buffer(out, n * 4, &hout).is_ok());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = capture(*b, stream, desc(OpType::kAllReduce, n, DataType::kFloat32, in, out));
  ASSERT_NE(exec, nullptr);
  replay_and_check(exec, stream, in, out, n, 20);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaStreamDestroy(stream));
  EXPECT_TRUE(b->deregister_buffer(hin).is_ok());
  EXPECT_TRUE(b->deregister_buffer(hout).is_ok());
  EXPECT_TRUE(b->finalize().is_ok());
  EXPECT_TRUE(d->mem_free(Device::cuda(0), in).is_ok());
  EXPECT_TRUE(d->mem_free(Device::cuda(0), out).is_ok());
}

// Free memory returns to its level before the comm, its buffer and the
// registration existed: after deregistering, and after a finalize (what an
// offload runs) that found the registration left.
TEST_F(NcclGpuGraphs, FreeMemoryComesBackAfterDeregistrationAndAfterFinalize) {
  constexpr size_t bytes = size_t{256} << 20;
  auto free_now = [] {
    size_t free_bytes = 0, total = 0;
    EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    return static_cast<long long>(free_bytes);
  };
  {
    auto warm = make();  // NCCL's first init keeps process-wide state
    ASSERT_NE(warm, nullptr);
    ASSERT_TRUE(warm->finalize().is_ok());
  }
  for (bool leave_registered : {false, true}) {
    const long long before = free_now();
    auto b = make();
    ASSERT_NE(b, nullptr);
    void* buf = nullptr;
    ASSERT_TRUE(d->mem_alloc(Device::cuda(0), bytes, &buf).is_ok());
    ASSERT_LT(free_now(), before - static_cast<long long>(bytes) / 2);  // the allocation shows
    void* h = nullptr;
    ASSERT_TRUE(b->register_buffer(buf, bytes, &h).is_ok());
    if (!leave_registered) {
      ASSERT_TRUE(b->deregister_buffer(h).is_ok());
    }
    ASSERT_TRUE(b->finalize().is_ok());
    b.reset();
    EXPECT_TRUE(d->mem_free(Device::cuda(0), buf).is_ok());
    // Allocator granularity at most; a pinned 256 MiB buffer costs more.
    EXPECT_LT(before - free_now(), 64ll << 20) << (leave_registered ? "left registered" : "deregistered");
  }
}

}  // namespace
