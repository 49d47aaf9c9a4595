// comms-bench's raw-NCCL baseline on CPU, with FakeNcclApi: it must be made
// with the ncclConfig_t the plugin makes for the same hints, and run each op
// as the very NCCL calls the plugin makes, so that their difference is only
// libcomms' and the plugin's overhead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>

#include "nccl_backend.h"
#include "nccl_test_support.h"
#include "raw_nccl.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::OpDesc;
using plugin::OpType;
using testing::CapturedConfig;
using testing::FakeNcclApi;
using testing::MemoryStore;
using ::testing::HasSubstr;

const auto kIn = reinterpret_cast<const void*>(0x10000);
const auto kOut = reinterpret_cast<void*>(0x20000);
const auto kStream = reinterpret_cast<cudaStream_t>(0x30000);

RawNccl::Options raw_options(Hints hints = {}, int rank = 0, int size = 2) {
  RawNccl::Options o;
  o.rank = rank;
  o.size = size;
  o.device = 0;
  o.hints = std::move(hints);
  o.comm_name = "bench";
  o.init_timeout = 2s;
  o.op_timeout = 2s;
  return o;
}

// The plugin's backend for the same comm: rank 0 of 2, named "bench".
std::unique_ptr<plugin::Backend> plugin_backend(std::shared_ptr<FakeNcclApi> api, Hints hints = {}) {
  plugin::BackendInit init;
  init.comm_name = "bench";
  init.rank = 0;
  init.size = 2;
  init.device = Device::cuda(0);
  init.eager = true;
  init.store = std::make_shared<MemoryStore>();
  init.init_timeout = 2s;
  init.op_timeout = 2s;
  init.hints = std::move(hints);
  std::unique_ptr<plugin::Backend> b;
  Status s = create_nccl_backend(std::move(api), init, &b, {.watchdog_interval = 5ms});
  EXPECT_TRUE(s.is_ok()) << s.message;
  if (b) {
    s = b->init();
    EXPECT_TRUE(s.is_ok()) << s.message;
  }
  return b;
}

// Every field a hint can set, and the strings.
auto config_tuple(const CapturedConfig& c) {
  const ncclConfig_t& k = c.config;
  return std::tuple(k.blocking, k.cgaClusterSize, k.minCTAs, k.maxCTAs, k.splitShare, k.trafficClass,
                    k.collnetEnable, k.CTAPolicy, k.shrinkShare, k.nvlsCTAs, k.nChannelsPerNetPeer,
                    k.nvlinkCentricSched, c.has_net_name, c.net_name, c.has_comm_name, c.comm_name);
}

// The NCCL calls after init, with their arguments (pointers compared only
// where `pointers`).
std::vector<std::string> calls_after_init(FakeNcclApi& api, bool pointers) {
  auto l = api.lock();
  std::vector<std::string> out;
  for (const auto& c : api.calls) {
    if (c.name == "comm_init") continue;
    std::string s = c.name + " count=" + std::to_string(c.count) + " dtype=" + std::to_string(int(c.dtype)) +
                    " op=" + std::to_string(int(c.op)) + " root/peer=" + std::to_string(c.root_or_peer);
    if (pointers) {
      s += " in=" + std::to_string(reinterpret_cast<uintptr_t>(c.in)) +
           " out=" + std::to_string(reinterpret_cast<uintptr_t>(c.out));
    }
    out.push_back(s);
  }
  return out;
}

TEST(RawNccl, IsCreatedWithTheConfigThePluginMakesForTheSameHints) {
  const Hints hints = {{"cga_cluster_size", "2"}, {"max_ctas", "16"}, {"min_ctas", "4"},
                       {"net_name", "socket"},    {"nvls_ctas", "8"},  {"high_priority_stream", "1"}};
  auto plugin_api = std::make_shared<FakeNcclApi>();
  auto backend = plugin_backend(plugin_api, hints);
  auto raw_api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  RawNccl raw(raw_api, store, raw_options(hints));
  ASSERT_EQ(plugin_api->init_configs.size(), 1u);
  ASSERT_EQ(raw_api->init_configs.size(), 1u);
  EXPECT_EQ(config_tuple(raw_api->init_configs[0]), config_tuple(plugin_api->init_configs[0]));
  // Not vacuous: the hints reached it, and it is non-blocking like the plugin's.
  EXPECT_EQ(raw_api->init_configs[0].config.maxCTAs, 16);
  EXPECT_EQ(raw_api->init_configs[0].config.blocking, 0);
  EXPECT_EQ(raw_api->init_configs[0].net_name, "Socket");
  EXPECT_EQ(raw_api->init_configs[0].comm_name, "bench");
  // An explicit comm_name wins over the comm's name for both.
  auto named_plugin_api = std::make_shared<FakeNcclApi>();
  auto named = plugin_backend(named_plugin_api, {{"comm_name", "mine"}});
  auto named_raw_api = std::make_shared<FakeNcclApi>();
  MemoryStore named_store;
  RawNccl named_raw(named_raw_api, named_store, raw_options({{"comm_name", "mine"}}));
  EXPECT_EQ(config_tuple(named_raw_api->init_configs[0]), config_tuple(named_plugin_api->init_configs[0]));
  EXPECT_EQ(named_raw_api->init_configs[0].comm_name, "mine");
}

TEST(RawNccl, RefusesHintsThePluginRefuses) {
  auto api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  try {
    RawNccl raw(api, store, raw_options({{"blocking", "1"}}));
    FAIL() << "blocking=1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("blocking"));
  }
  EXPECT_TRUE(api->init_configs.empty());
}

TEST(RawNccl, RankZeroPublishesTheUniqueIdAndOtherRanksReadIt) {
  auto api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  RawNccl first(api, store, raw_options({}, 0, 2));
  EXPECT_EQ(store.get("nccl/unique_id", 0ms), std::string(128, '\x5a'));
  RawNccl second(api, store, raw_options({}, 1, 2));
  EXPECT_EQ(api->init_configs.size(), 2u);

  MemoryStore short_store;
  short_store.set("nccl/unique_id", "abc");
  try {
    RawNccl bad(api, short_store, raw_options({}, 1, 2));
    FAIL() << "a 3-byte unique id was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("store key 'nccl/unique_id'"));
    EXPECT_THAT(e.what(), HasSubstr("holds 3 bytes, expected 128"));
  }
}

TEST(RawNccl, InitThatNeverSettlesTimesOutAndAbortsTheCommunicator) {
  auto api = std::make_shared<FakeNcclApi>();
  api->in_progress_polls = -1;
  MemoryStore store;
  RawNccl::Options o = raw_options();
  o.init_timeout = 100ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    RawNccl raw(api, store, o);
    FAIL() << "init returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_THAT(e.what(), HasSubstr("ncclCommInitRankConfig did not complete within 100 ms"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(api->aborts.load(), 1);
}

struct OpCase {
  const char* name;
  OpType type;
  DataType dtype;
  ReduceOp reduce;
  int root;
};

TEST(RawNccl, RunsEachOpAsTheNcclCallsThePluginMakes) {
  const OpCase cases[] = {
      {"all_reduce float32 sum", OpType::kAllReduce, DataType::kFloat32, ReduceOp::sum(), -1},
      {"all_reduce bfloat16 avg", OpType::kAllReduce, DataType::kBfloat16, ReduceOp::avg(), -1},
      {"all_reduce bool max", OpType::kAllReduce, DataType::kBool, ReduceOp::max(), -1},
      {"all_reduce float64 premul_sum", OpType::kAllReduce, DataType::kFloat64, ReduceOp::premul_sum(0.5), -1},
      {"reduce int32 min", OpType::kReduce, DataType::kInt32, ReduceOp::min(), 0},
      {"reduce_scatter float16 product", OpType::kReduceScatter, DataType::kFloat16, ReduceOp::product(), -1},
      {"broadcast int64", OpType::kBroadcast, DataType::kInt64, {}, 0},
      {"all_gather uint8", OpType::kAllGather, DataType::kUint8, {}, -1},
      {"all_to_all float32", OpType::kAllToAll, DataType::kFloat32, {}, -1},
      {"gather float8_e4m3", OpType::kGather, DataType::kFloat8E4M3, {}, 0},
      {"scatter int8", OpType::kScatter, DataType::kInt8, {}, 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto plugin_api = std::make_shared<FakeNcclApi>();
    auto backend = plugin_backend(plugin_api);
    OpDesc d;
    d.type = c.type;
    d.seq = 1;
    d.count = 4;
    d.dtype = c.dtype;
    d.device = Device::cuda(0);
    d.reduce = c.reduce;
    d.root = c.root;
    // Broadcast is in place on its one buffer, as Comm::broadcast makes it.
    d.input = kIn;
    d.output = c.type == OpType::kBroadcast ? const_cast<void*>(kIn) : kOut;
    d.stream = kStream;
    std::unique_ptr<plugin::Work> work;
    Status s = backend->submit(d, &work);
    ASSERT_TRUE(s.is_ok()) << s.message;

    auto raw_api = std::make_shared<FakeNcclApi>();
    MemoryStore store;
    RawNccl raw(raw_api, store, raw_options());
    raw.run(c.type, kIn, kOut, 4, c.dtype, c.reduce, c.root, -1, kStream);
    const auto want = calls_after_init(*plugin_api, true);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(calls_after_init(*raw_api, true), want);
    EXPECT_EQ(raw_api->premul_scalar, plugin_api->premul_scalar);
  }
}

TEST(RawNccl, SendRecvIsOneGroupOfASendAndARecvToThePeerAsThePluginsBatch) {
  auto plugin_api = std::make_shared<FakeNcclApi>();
  auto backend = plugin_backend(plugin_api);
  const P2POp ops[] = {P2POp::send(BufferView{const_cast<void*>(kIn), 4, DataType::kFloat32, Device::cuda(0)}, 1),
                       P2POp::recv(BufferView{kOut, 4, DataType::kFloat32, Device::cuda(0)}, 1)};
  OpDesc d;
  d.type = OpType::kBatchP2P;
  d.seq = 1;
  d.device = Device::cuda(0);
  d.p2p = ops;
  d.stream = kStream;
  std::unique_ptr<plugin::Work> work;
  Status s = backend->submit(d, &work);
  ASSERT_TRUE(s.is_ok()) << s.message;

  auto raw_api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  RawNccl raw(raw_api, store, raw_options());
  raw.run(OpType::kSend, kIn, kOut, 4, DataType::kFloat32, {}, 0, 1, kStream);
  EXPECT_EQ(calls_after_init(*raw_api, true), calls_after_init(*plugin_api, true));
  EXPECT_EQ(raw_api->call_names(),
            (std::vector<std::string>{"comm_init", "group_start", "send", "recv", "group_end"}));
}

TEST(RawNccl, BarrierIsTheOneFloatAllReduceThePluginRuns) {
  auto plugin_api = std::make_shared<FakeNcclApi>();
  auto backend = plugin_backend(plugin_api);
  OpDesc d;
  d.type = OpType::kBarrier;
  d.seq = 1;
  d.device = Device::cuda(0);
  std::unique_ptr<plugin::Work> work;
  ASSERT_TRUE(backend->submit(d, &work).is_ok());

  auto raw_api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  RawNccl raw(raw_api, store, raw_options());
  raw.run(OpType::kBarrier, nullptr, nullptr, 0, DataType::kFloat32, {}, 0, -1, kStream);
  raw.run(OpType::kBarrier, nullptr, nullptr, 0, DataType::kFloat32, {}, 0, -1, kStream);
  // Each side has a scratch of its own: the pointers differ, not the call.
  const auto want = calls_after_init(*plugin_api, false);
  ASSERT_EQ(want.size(), 1u);
  EXPECT_EQ(calls_after_init(*raw_api, false), std::vector<std::string>(2, want[0]));
  raw.finalize();
  EXPECT_EQ(raw_api->frees.load(), 1) << "one scratch, allocated once and freed";
}

TEST(RawNccl, RefusesWhatNcclLacksNamingTheReason) {
  EXPECT_THAT(RawNccl::refusal(OpType::kAllReduce, DataType::kInt64, ReduceKind::kBand, -1, -1),
              HasSubstr("nccl cannot reduce int64 with band: NCCL has no bitwise reductions"));
  EXPECT_THAT(RawNccl::refusal(OpType::kAllReduce, DataType::kFloat8E5M2, ReduceKind::kSum, 8, 0),
              HasSubstr("compute capability 9.0 (sm_90)"));
  EXPECT_EQ(RawNccl::refusal(OpType::kAllReduce, DataType::kFloat8E5M2, ReduceKind::kSum, 9, 0), "");
  // Ops that only move data ignore the reduction.
  EXPECT_EQ(RawNccl::refusal(OpType::kAllGather, DataType::kFloat32, ReduceKind::kBxor, -1, -1), "");
  EXPECT_THAT(RawNccl::refusal(OpType::kAllGatherV, DataType::kFloat32, ReduceKind::kSum, -1, -1),
              HasSubstr("not one of comms-bench's ops"));

  auto api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  RawNccl raw(api, store, raw_options());
  try {
    raw.run(OpType::kAllReduce, kIn, kOut, 4, DataType::kInt32, ReduceOp::bxor(), -1, -1, kStream);
    FAIL() << "bxor ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_THAT(e.what(), HasSubstr("NCCL has no bitwise reductions"));
  }
  EXPECT_EQ(api->call_names(), std::vector<std::string>{"comm_init"}) << "nothing reached NCCL";
}

TEST(RawNccl, FinalizeReleasesTheCommunicatorAndDestructionWithoutItAborts) {
  auto api = std::make_shared<FakeNcclApi>();
  MemoryStore store;
  {
    RawNccl raw(api, store, raw_options());
    raw.finalize();
  }
  EXPECT_EQ(api->finalizes.load(), 1);
  EXPECT_EQ(api->destroys.load(), 1);
  EXPECT_EQ(api->aborts.load(), 0);
  { RawNccl raw(api, store, raw_options()); }
  EXPECT_EQ(api->finalizes.load(), 1);
  EXPECT_EQ(api->aborts.load(), 1);
}

}  // namespace
}  // namespace comms::nccl
