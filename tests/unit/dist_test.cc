#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

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
    EXPECT_EQ(std::string(e.what()), "COMMS_ROUTE='bogus' is not a route; use direct or split");
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
  o.nccl.shrink_share = 1;
  o.nccl.nvlink_centric_sched = 0;
  o.gloo.interface = "eth1";
  o.gloo.busy_poll = false;
  o.hints["nccl.nchannels_per_net_peer"] = "2";
  const Hints expected = {
      {"nccl.high_priority_stream", "1"}, {"nccl.cga_cluster_size", "4"}, {"nccl.min_ctas", "2"},
      {"nccl.max_ctas", "16"},          {"nccl.net_name", "IB"},        {"nccl.split_share", "1"},
      {"nccl.traffic_class", "3"},      {"nccl.collnet_enable", "0"},   {"nccl.cta_policy", "1"},
      {"nccl.nvls_ctas", "8"},          {"gloo.interface", "eth1"},     {"gloo.busy_poll", "0"},
      {"nccl.nchannels_per_net_peer", "2"}, {"nccl.shrink_share", "1"}, {"nccl.nvlink_centric_sched", "0"},
  };
  EXPECT_EQ(to_hints(o), expected);
}

TEST(TypedOptions, EachRowOfTheSpellingTableSetsOnlyItsFieldAndBecomesOnlyItsHint) {
  std::set<std::string> hints, names;
  for (const OptionSpelling& row : kOptionSpellings) {
    EXPECT_TRUE(hints.insert(std::string(row.hint)).second) << "two rows become " << row.hint;
    EXPECT_TRUE(names.insert(std::string(row.name)).second) << "two rows are named " << row.name;
    EXPECT_TRUE(row.backend() == "nccl" || row.backend() == "gloo") << row.hint;
    EXPECT_EQ(find_option(row.backend(), row.name), &row);
    BackendOptions o;
    std::string text;
    switch (row.type) {
      case OptionType::kBool: row.set(o, true), text = "1"; break;
      case OptionType::kInt: row.set(o, 7), text = "7"; break;
      case OptionType::kString: row.set(o, std::string("IB")), text = "IB"; break;
    }
    for (const OptionSpelling& other : kOptionSpellings) {
      EXPECT_EQ(other.get(o).has_value(), &other == &row) << row.name << " also set " << other.name;
    }
    EXPECT_EQ(to_hints(o), (Hints{{std::string(row.hint), text}})) << row.name;
  }
  EXPECT_EQ(find_option("nccl", "busy_poll"), nullptr);  // Gloo's, not NCCL's
  EXPECT_EQ(find_option("gloo", "no_such_option"), nullptr);
  // The spellings torch and Megatron use, each to its hint.
  EXPECT_EQ(find_option("nccl", "is_high_priority_stream")->hint, "nccl.high_priority_stream");
  EXPECT_EQ(find_option("nccl", "cga_cluster_size")->hint, "nccl.cga_cluster_size");
  EXPECT_EQ(find_option("gloo", "interface")->hint, "gloo.interface");
}

TEST(TypedOptions, ASettingGivenTypedAndAsARawHintIsAnErrorNotAnOverride) {
  BackendOptions o;
  o.nccl.max_ctas = 8;
  o.hints["nccl.max_ctas"] = "9";
  try {
    to_hints(o);
    FAIL() << "the typed max_ctas silently replaced the hint";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()),
              "'nccl.max_ctas' is given both as a typed option (8) and as a hint (9); give it once");
  }
  BackendOptions g;
  g.gloo.busy_poll = true;
  g.hints["gloo.busy_poll"] = "1";
  EXPECT_THROW(to_hints(g), Error);
}

TEST(TypedOptions, UnsetFieldsAddNothing) {
  EXPECT_TRUE(to_hints(BackendOptions{}).empty());
  BackendOptions o;
  o.nccl.is_high_priority_stream = false;
  EXPECT_EQ(to_hints(o), (Hints{{"nccl.high_priority_stream", "0"}}));
}

}  // namespace
}  // namespace comms::dist

#include <nlohmann/json.hpp>

#include "comm/comm_impl.h"
#include "plugins/plugin_registry.h"

namespace comms::dist {
namespace {

const internal::LoadedPlugin* nccl_plugin() {
  try {
    return &internal::PluginRegistry::instance().get("nccl");
  } catch (const Error&) {
    return nullptr;
  }
}

TEST(TypedOptions, TheSplitRouteHintsGiveTheNcclConfigTheTypedOptionsAskFor) {
  const auto* nccl = nccl_plugin();
  if (!nccl) GTEST_SKIP() << "the nccl plugin is not built here";
  BackendOptions o;
  o.nccl.is_high_priority_stream = true;
  o.nccl.cga_cluster_size = 4;
  o.nccl.min_ctas = 2;
  o.nccl.max_ctas = 16;
  o.nccl.net_name = "IB";
  auto routed = internal::route_hints(to_hints(o), BackendSpec::parse("cpu:gloo,cuda:nccl"), "t");
  std::string text;
  Status s = nccl->descriptor->explain_hints(routed[static_cast<size_t>(DeviceType::kCuda)], &text);
  ASSERT_TRUE(s.is_ok()) << s.message;
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["high_priority_stream"], true);
  EXPECT_EQ(j["nccl_config"]["cga_cluster_size"], 4);
  EXPECT_EQ(j["nccl_config"]["min_ctas"], 2);
  EXPECT_EQ(j["nccl_config"]["max_ctas"], 16);
  EXPECT_EQ(j["nccl_config"]["net_name"], "IB");
  EXPECT_TRUE(j["nccl_config"]["split_share"].is_null()) << "an unset option must stay NCCL's default";
}

TEST(SplitRoute, ACpuGlooSubgroupOfACpuGlooCudaNcclParentWorks) {
  if (!nccl_plugin()) GTEST_SKIP() << "the nccl plugin is not built here";
  setenv("COMMS_ROUTE", "split", 1);
  InitOptions init;
  init.backend = "cpu:gloo,cuda:nccl";
  init.device = Device::cpu();  // the cuda half stays lazy: no GPU needed to create the group
  init.rank = 0;
  init.world_size = 1;
  Group w = init_process_group(init);
  GroupOptions cpu_only;
  cpu_only.backend = "cpu:gloo";
  Group g = new_group(std::vector<int>{0}, cpu_only);
  ASSERT_TRUE(g);
  EXPECT_EQ(g.route(), Route::kSplit);
  int32_t v = 7;
  g->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
  EXPECT_EQ(v, 7);
  destroy_process_group();
  unsetenv("COMMS_ROUTE");
}

}  // namespace
}  // namespace comms::dist
