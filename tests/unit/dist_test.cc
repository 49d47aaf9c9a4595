#include <gtest/gtest.h>

#include <cstdlib>

#include "comms/dist.h"

namespace comms::dist {
namespace {

TEST(Route, ComesFromCommsRouteAndRejectsOtherValuesListingTheValidOnes) {
  unsetenv("COMMS_ROUTE");
  EXPECT_EQ(route_from_environment(), Route::kDirect);
  setenv("COMMS_ROUTE", "split", 1);
  EXPECT_EQ(route_from_environment(), Route::kSplit);
  setenv("COMMS_ROUTE", " Direct ", 1);
  EXPECT_EQ(route_from_environment(), Route::kDirect);
  setenv("COMMS_ROUTE", "bogus", 1);
  try {
    route_from_environment();
    FAIL() << "accepted COMMS_ROUTE=bogus";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("COMMS_ROUTE='bogus'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid values: direct, split"), std::string::npos) << e.what();
  }
  unsetenv("COMMS_ROUTE");
}

TEST(TypedOptions, EverySetFieldBecomesExactlyOnePrefixedHint) {
  BackendOptions o;
  o.nccl.is_high_priority_stream = true;
  o.nccl.cga_cluster_size = 4;
  o.nccl.min_ctas = 2;
  o.nccl.max_ctas = 16;
  o.nccl.net_name = "IB";
  o.nccl.split_share = 1;
  o.nccl.traffic_class = 3;
  o.nccl.collnet_enable = 0;
  o.nccl.cta_policy = 1;
  o.nccl.nvls_ctas = 8;
  o.gloo.interface = "eth1";
  o.gloo.busy_poll = false;
  o.hints["nccl.nchannels_per_net_peer"] = "2";
  const Hints expected = {
      {"nccl.high_priority_stream", "1"}, {"nccl.cga_cluster_size", "4"}, {"nccl.min_ctas", "2"},
      {"nccl.max_ctas", "16"},          {"nccl.net_name", "IB"},        {"nccl.split_share", "1"},
      {"nccl.traffic_class", "3"},      {"nccl.collnet_enable", "0"},   {"nccl.cta_policy", "1"},
      {"nccl.nvls_ctas", "8"},          {"gloo.interface", "eth1"},     {"gloo.busy_poll", "0"},
      {"nccl.nchannels_per_net_peer", "2"},
  };
  EXPECT_EQ(to_hints(o), expected);
}

TEST(TypedOptions, UnsetFieldsAddNothing) {
  EXPECT_TRUE(to_hints(BackendOptions{}).empty());
  BackendOptions o;
  o.nccl.is_high_priority_stream = false;
  EXPECT_EQ(to_hints(o), (Hints{{"nccl.high_priority_stream", "0"}}));
}

}  // namespace
}  // namespace comms::dist
