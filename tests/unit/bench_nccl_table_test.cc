// comms-bench's --raw-nccl table (tools/comms-bench/nccl_table.h), checked
// without a GPU: which NCCL call runs each op, how each type and reduction
// maps onto NCCL's, what it refuses and why, and the ncclConfig_t it builds
// from the config the nccl plugin reports. The calls themselves need a
// device (tools/dev gpu-check runs them).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstring>

#include "nccl_table.h"

namespace comms::bench {
namespace {

using plugin::OpType;
using ::testing::HasSubstr;

TEST(BenchNcclTable, EachOpHasItsNcclCall) {
  EXPECT_EQ(nccl_call_for(OpType::kAllReduce), "ncclAllReduce");
  EXPECT_EQ(nccl_call_for(OpType::kReduce), "ncclReduce");
  EXPECT_EQ(nccl_call_for(OpType::kReduceScatter), "ncclReduceScatter");
  EXPECT_EQ(nccl_call_for(OpType::kBroadcast), "ncclBroadcast");
  EXPECT_EQ(nccl_call_for(OpType::kAllGather), "ncclAllGather");
  EXPECT_EQ(nccl_call_for(OpType::kAllToAll), "ncclAlltoAll");
  EXPECT_EQ(nccl_call_for(OpType::kGather), "ncclGather");
  EXPECT_EQ(nccl_call_for(OpType::kScatter), "ncclScatter");
  EXPECT_EQ(nccl_call_for(OpType::kBarrier), "ncclAllReduce (1 float)");
  EXPECT_EQ(nccl_call_for(OpType::kSend), "ncclSend+ncclRecv (grouped)");
}

TEST(BenchNcclTable, TypesAndReductionsMapOntoNccls) {
  const NcclReduction f = nccl_reduction_for(DataType::kBfloat16, ReduceKind::kAvg, -1, -1);
  EXPECT_EQ(f.refusal, "");
  EXPECT_EQ(f.dtype, ncclBfloat16);
  EXPECT_EQ(f.op, ncclAvg);
  EXPECT_TRUE(nccl_reduction_for(DataType::kFloat32, ReduceKind::kPremulSum, -1, -1).premul_sum);
  EXPECT_EQ(nccl_reduction_for(DataType::kInt64, ReduceKind::kMin, -1, -1).op, ncclMin);
  // bool reduces as uint8: or is max, and is min.
  const NcclReduction any = nccl_reduction_for(DataType::kBool, ReduceKind::kSum, -1, -1);
  EXPECT_EQ(any.dtype, ncclUint8);
  EXPECT_EQ(any.op, ncclMax);
  EXPECT_EQ(nccl_reduction_for(DataType::kBool, ReduceKind::kBand, -1, -1).op, ncclMin);
  // Moving data ignores the type: bool and fp8 move as bytes.
  EXPECT_EQ(nccl_copy_type(DataType::kBool), ncclUint8);
  EXPECT_EQ(nccl_copy_type(DataType::kFloat8E4M3), ncclUint8);
  EXPECT_EQ(nccl_copy_type(DataType::kFloat16), ncclFloat16);
  EXPECT_EQ(nccl_copy_type(DataType::kFloat32), ncclFloat32);
}

TEST(BenchNcclTable, RefusesWhatNcclLacksNamingTheReason) {
  EXPECT_THAT(raw_nccl_refusal(OpType::kAllReduce, DataType::kInt64, ReduceKind::kBand, -1, -1),
              HasSubstr("nccl cannot reduce int64 with band: NCCL has no bitwise reductions"));
  EXPECT_THAT(raw_nccl_refusal(OpType::kReduce, DataType::kBool, ReduceKind::kBxor, -1, -1),
              HasSubstr("NCCL has no logical xor"));
  EXPECT_THAT(raw_nccl_refusal(OpType::kAllReduce, DataType::kFloat8E5M2, ReduceKind::kSum, 8, 0),
              HasSubstr("compute capability 9.0 (sm_90)"));
  EXPECT_EQ(raw_nccl_refusal(OpType::kAllReduce, DataType::kFloat8E5M2, ReduceKind::kSum, 9, 0), "");
  EXPECT_THAT(raw_nccl_refusal(OpType::kReduceScatter, DataType::kFloat8E4M3, ReduceKind::kAvg, 9, 0),
              HasSubstr("no avg for fp8"));
  // Ops that only move data ignore the reduction.
  EXPECT_EQ(raw_nccl_refusal(OpType::kAllGather, DataType::kFloat32, ReduceKind::kBxor, -1, -1), "");
  EXPECT_EQ(raw_nccl_refusal(OpType::kAllToAll, DataType::kFloat32, ReduceKind::kSum, -1, -1) == "",
            kNcclHasAllToAllGatherScatter);
  EXPECT_THAT(raw_nccl_refusal(OpType::kAllGatherV, DataType::kFloat32, ReduceKind::kSum, -1, -1),
              HasSubstr("not one of comms-bench's ops"));
}

TEST(BenchNcclTable, TheConfigIsWhatThePluginReportsAndNothingMore) {
  // The shape of the nccl plugin's describe()["nccl_config"].
  const auto reported = nlohmann::json::parse(R"({"blocking": 0, "cga_cluster_size": 2, "min_ctas": 4,
      "max_ctas": 16, "net_name": "Socket", "split_share": null, "comm_name": "bench", "nvls_ctas": null})");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  const ncclConfig_t untouched = NCCL_CONFIG_INITIALIZER;
  std::vector<std::string> strings;
  apply_nccl_config(reported, &config, &strings);
  EXPECT_EQ(config.blocking, 0);
  EXPECT_EQ(config.cgaClusterSize, 2);
  EXPECT_EQ(config.minCTAs, 4);
  EXPECT_EQ(config.maxCTAs, 16);
  ASSERT_NE(config.netName, nullptr);
  EXPECT_STREQ(config.netName, "Socket");
  ASSERT_NE(config.commName, nullptr);
  EXPECT_STREQ(config.commName, "bench");
  // null: left as NCCL's initializer leaves it.
  EXPECT_EQ(config.splitShare, untouched.splitShare);
  EXPECT_EQ(config.trafficClass, untouched.trafficClass);
}

TEST(BenchNcclTable, MinCtasAloneGetsNcclsDefaultMaxCtas) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  std::vector<std::string> strings;
  apply_nccl_config(nlohmann::json::parse(R"({"min_ctas": 2, "max_ctas": null})"), &config, &strings);
  EXPECT_EQ(config.minCTAs, 2);
  EXPECT_EQ(config.maxCTAs, 64);
}

// NCCL 2.29's and 2.30's keys: set where comms-bench's nccl.h has the
// field, refused (never dropped) where it does not.
TEST(BenchNcclTable, AFieldTheHeaderLacksIsRefusedNotDropped) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  std::vector<std::string> strings;
  const auto reported = nlohmann::json::parse(R"({"graph_usage_mode": 1, "graph_stream_ordering": 0})");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 6)
  apply_nccl_config(reported, &config, &strings);
  EXPECT_EQ(config.graphUsageMode, 1);
  EXPECT_EQ(config.graphStreamOrdering, 0);
#else
  try {
    apply_nccl_config(reported, &config, &strings);
    FAIL() << "a field this nccl.h lacks was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_THAT(e.what(), HasSubstr("lacks"));
  }
#endif
}

TEST(BenchNcclTable, AConfigFieldItDoesNotKnowIsRefused) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  std::vector<std::string> strings;
  try {
    apply_nccl_config(nlohmann::json::parse(R"({"warp_speed": 9})"), &config, &strings);
    FAIL() << "an unknown field was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("'warp_speed'"));
  }
}

}  // namespace
}  // namespace comms::bench
