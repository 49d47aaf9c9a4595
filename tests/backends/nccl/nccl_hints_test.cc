// Hint translation, validation and version gating of the NCCL plugin (CPU).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "nccl_api.h"
#include "nccl_hints.h"

namespace comms::nccl {
namespace {

// The release the fake NCCL models unless a test picks one.
constexpr int kDefaultVersion = 22809;

TranslatedHints translate_ok(const Hints& hints, int version = kDefaultVersion) {
  TranslatedHints t;
  Status s = translate_hints(hints, version, &t);
  EXPECT_TRUE(s.is_ok()) << s.message;
  return t;
}

Status translate_err(const Hints& hints, int version = kDefaultVersion) {
  TranslatedHints t;
  return translate_hints(hints, version, &t);
}

TEST(NcclHints, EveryKeyReachesItsNcclConfigField) {
  const Hints hints = {
      {"blocking", "0"},        {"cga_cluster_size", "4"}, {"min_ctas", "2"},
      {"max_ctas", "16"},       {"net_name", "socket"},    {"split_share", "1"},
      {"traffic_class", "106"}, {"comm_name", "dp_ag"},    {"collnet_enable", "true"},
      {"cta_policy", "efficiency"}, {"shrink_share", "on"}, {"nvls_ctas", "8"},
      {"nchannels_per_net_peer", "3"}, {"nvlink_centric_sched", "1"},
      {"high_priority_stream", "yes"}};
  TranslatedHints t = translate_ok(hints);
  NcclConfig c = initial_config(kDefaultVersion);
  apply_to_config(t.config, &c);
  EXPECT_EQ(c.blocking, 0);
  EXPECT_EQ(c.cgaClusterSize, 4);
  EXPECT_EQ(c.minCTAs, 2);
  EXPECT_EQ(c.maxCTAs, 16);
  EXPECT_STREQ(c.netName, "Socket");
  EXPECT_EQ(c.splitShare, 1);
  EXPECT_EQ(c.trafficClass, 106);
  EXPECT_STREQ(c.commName, "dp_ag");
  EXPECT_EQ(c.collnetEnable, 1);
  EXPECT_EQ(c.CTAPolicy, NCCL_CTA_POLICY_EFFICIENCY);
  EXPECT_EQ(c.shrinkShare, 1);
  EXPECT_EQ(c.nvlsCTAs, 8);
  EXPECT_EQ(c.nChannelsPerNetPeer, 3);
  EXPECT_EQ(c.nvlinkCentricSched, 1);
  EXPECT_EQ(t.priority, StreamPriority::kHigh);
}

TEST(NcclHints, UnsetKeysLeaveNcclDefaults) {
  TranslatedHints t = translate_ok({});
  NcclConfig c = initial_config(kDefaultVersion);
  apply_to_config(t.config, &c);
  EXPECT_EQ(c.blocking, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(c.cgaClusterSize, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(c.minCTAs, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(c.netName, nullptr);
  EXPECT_EQ(c.commName, nullptr);
  EXPECT_EQ(c.nvlinkCentricSched, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(t.priority, StreamPriority::kDefault);
}

TEST(NcclHints, PrefixedKeysAreAccepted) {
  TranslatedHints t = translate_ok({{"nccl.min_ctas", "3"}});
  EXPECT_EQ(t.config.min_ctas, 3);
}

struct BadHint {
  const char* key;
  const char* value;
};

class NcclHintsRejects : public ::testing::TestWithParam<BadHint> {};

TEST_P(NcclHintsRejects, InvalidValueWithErrorNamingKeyAndValue) {
  const BadHint& bad = GetParam();
  Status s = translate_err({{bad.key, bad.value}});
  ASSERT_FALSE(s.is_ok()) << bad.key << "=" << bad.value << " was accepted";
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find(std::string(bad.key) + "=" + bad.value), std::string::npos)
      << s.message;
}

INSTANTIATE_TEST_SUITE_P(
    Values, NcclHintsRejects,
    ::testing::Values(BadHint{"cga_cluster_size", "9"}, BadHint{"cga_cluster_size", "-1"},
                      BadHint{"min_ctas", "0"}, BadHint{"min_ctas", "65"},
                      BadHint{"max_ctas", "abc"}, BadHint{"max_ctas", "4x"},
                      BadHint{"nvls_ctas", "100"}, BadHint{"nchannels_per_net_peer", "0"},
                      BadHint{"traffic_class", "256"}, BadHint{"split_share", "maybe"},
                      BadHint{"collnet_enable", "2"}, BadHint{"cta_policy", "fast"},
                      BadHint{"net_name", "Carrier-Pigeon"}, BadHint{"comm_name", ""},
                      BadHint{"high_priority_stream", "very"}, BadHint{"blocking", "1"},
                      BadHint{"no_such_key", "1"}));

TEST(NcclHints, BlockingOneIsRejectedWithTheReason) {
  Status s = translate_err({{"blocking", "1"}});
  EXPECT_NE(s.message.find("non-blocking"), std::string::npos) << s.message;
  EXPECT_TRUE(translate_ok({{"blocking", "false"}}).config.blocking == 0);
}

TEST(NcclHints, MinCtasAboveMaxCtasIsRejectedNamingBoth) {
  Status s = translate_err({{"min_ctas", "32"}, {"max_ctas", "8"}});
  ASSERT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find("min_ctas=32"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("max_ctas=8"), std::string::npos) << s.message;
  translate_ok({{"min_ctas", "8"}, {"max_ctas", "8"}});
}

TEST(NcclHints, AKeyGivenBareAndPrefixedIsRejectedNotOneSilentlyWinning) {
  // Before, the map's order made nccl.max_ctas=9 win without a word.
  Status s = translate_err({{"max_ctas", "8"}, {"nccl.max_ctas", "9"}});
  ASSERT_EQ(s.code, ErrorCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find("max_ctas=8 and nccl.max_ctas=9 both set max_ctas; give it once"), std::string::npos)
      << s.message;
}

TEST(NcclHints, UnknownKeyErrorListsTheKnownKeys) {
  Status s = translate_err({{"no_such_key", "1"}});
  EXPECT_NE(s.message.find("no_such_key"), std::string::npos);
  EXPECT_NE(s.message.find("cga_cluster_size"), std::string::npos);
}

TEST(NcclHints, NetNamesAreNcclBuiltinsOrListedInTheEnvironment) {
  EXPECT_EQ(translate_ok({{"net_name", "ib"}}).config.net_name, "IB");
  ASSERT_EQ(::setenv("COMMS_NCCL_NET_NAMES", "AWS Libfabric, Acme", 1), 0);
  EXPECT_EQ(translate_ok({{"net_name", "aws libfabric"}}).config.net_name, "AWS Libfabric");
  EXPECT_EQ(translate_ok({{"net_name", "ACME"}}).config.net_name, "Acme");
  ::unsetenv("COMMS_NCCL_NET_NAMES");
  EXPECT_FALSE(translate_err({{"net_name", "Acme"}}).is_ok());
}

TEST(NcclHints, CtaPolicyAcceptsNamesAndNumbers) {
  EXPECT_EQ(translate_ok({{"cta_policy", "default"}}).config.cta_policy, NCCL_CTA_POLICY_DEFAULT);
  EXPECT_EQ(translate_ok({{"cta_policy", "1"}}).config.cta_policy, NCCL_CTA_POLICY_EFFICIENCY);
  EXPECT_EQ(translate_ok({{"cta_policy", "Zero"}}).config.cta_policy, NCCL_CTA_POLICY_ZERO);
}

TEST(NcclHints, KeyMissingFromTheLinkedNcclIsAnErrorSayingSo) {
  Status s = translate_err({{"traffic_class", "3"}}, 22609);
  ASSERT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_NE(s.message.find("traffic_class=3"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("NCCL >= 2.27.0"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("2.26.9"), std::string::npos) << s.message;

  EXPECT_EQ(translate_err({{"split_share", "1"}}, 21703).code, ErrorCode::kUnsupported);
  EXPECT_EQ(translate_err({{"nvlink_centric_sched", "1"}}, 22705).code, ErrorCode::kUnsupported);
  EXPECT_EQ(translate_err({{"cta_policy", "zero"}}, 22705).code, ErrorCode::kInvalidArgument);
  translate_ok({{"blocking", "0"}, {"high_priority_stream", "1"}}, 21403);
}

// NCCL reads cgaClusterSize, minCTAs, maxCTAs and netName from a config of
// version 2.17 or later only (its parseCommConfig resets them below).
TEST(NcclHints, CtaKeysAndNetNameNeedNccl217) {
  for (const char* key : {"cga_cluster_size", "min_ctas", "max_ctas", "net_name"}) {
    const std::string value = std::string(key) == "net_name" ? "IB" : "2";
    Status s = translate_err({{key, value}}, 21609);
    ASSERT_EQ(s.code, ErrorCode::kUnsupported) << key;
    EXPECT_NE(s.message.find("NCCL >= 2.17.0"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("the loaded NCCL is 2.16.9"), std::string::npos) << s.message;
    translate_ok({{key, value}}, 21700);
  }
}

// Each key of NCCL 2.29 and 2.30 is refused below its release, naming the
// key, the release and the loaded one, and reaches its field from it.
TEST(NcclHints, NewerConfigKeysAreGatedByTheLoadedVersion) {
  struct Case {
    const char* key;
    const char* value;
    int first;        // the first release with the field
    int just_before;  // the release before it
    int NcclConfig::*field;
    int expected;
  };
  const Case cases[] = {
      {"graph_usage_mode", "1", 22900, 22809, &NcclConfig::graphUsageMode, 1},
      {"num_rma_ctx", "4", 22900, 22809, &NcclConfig::numRmaCtx, 4},
      {"max_p2p_peers", "16", 23003, 23002, &NcclConfig::maxP2pPeers, 16},
      {"graph_stream_ordering", "0", 23006, 23005, &NcclConfig::graphStreamOrdering, 0},
  };
  for (const Case& c : cases) {
    Status s = translate_err({{c.key, c.value}}, c.just_before);
    ASSERT_EQ(s.code, ErrorCode::kUnsupported) << c.key;
    EXPECT_NE(s.message.find(std::string(c.key) + "=" + c.value), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("NCCL >= " + nccl_version_string(c.first)), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("the loaded NCCL is " + nccl_version_string(c.just_before)), std::string::npos)
        << s.message;
    TranslatedHints t = translate_ok({{c.key, c.value}}, c.first);
    NcclConfig config = initial_config(c.first);
    apply_to_config(t.config, &config);
    EXPECT_EQ(config.*c.field, c.expected) << c.key;
    EXPECT_EQ(config.version, static_cast<unsigned>(c.first)) << c.key;
    auto j = nlohmann::json::parse(explain_json(t));
    EXPECT_EQ(j["nccl_config"][c.key], c.expected) << c.key;
  }
  EXPECT_EQ(translate_err({{"graph_usage_mode", "3"}}, 23007).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(translate_err({{"max_p2p_peers", "0"}}, 23007).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(translate_err({{"num_rma_ctx", "-1"}}, 23007).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(translate_err({{"graph_stream_ordering", "maybe"}}, 23007).code, ErrorCode::kInvalidArgument);
}

// The config the plugin fills: ncclConfig_t's layout through NCCL 2.30,
// every field unset, and the loaded release as its version (NCCL reads a
// field only from a config whose version has it), capped at the layout's.
TEST(NcclHints, TheConfigCarriesTheLoadedVersionAndItsOwnSize) {
  NcclConfig c = initial_config(22900);
  EXPECT_EQ(c.size, sizeof(NcclConfig));
  EXPECT_EQ(c.magic, 0xcafebeefu);
  EXPECT_EQ(c.version, 22900u);
  EXPECT_EQ(c.graphUsageMode, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(c.graphStreamOrdering, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(initial_config(23203).version, static_cast<unsigned>(kNcclConfigLayoutVersion));
  EXPECT_EQ(offsetof(NcclConfig, nvlinkCentricSched), offsetof(ncclConfig_t, nvlinkCentricSched));
}

TEST(NcclHints, EveryKeyFitsTheConfigLayoutThePluginFills) {
  for (const char* key : hint_keys()) {
    EXPECT_LE(min_nccl_version_for(key), kNcclConfigLayoutVersion) << key;
    EXPECT_GE(min_nccl_version_for(key), 0) << key;
  }
  EXPECT_EQ(hint_keys().size(), std::size(kHintKeyVersions));
  EXPECT_EQ(kHintKeys[hint_keys().size()], nullptr);
}

TEST(NcclHints, HighPriorityStreamSelectsTheHighClassOnlyWhenTrue) {
  EXPECT_EQ(translate_ok({{"high_priority_stream", "1"}}).priority, StreamPriority::kHigh);
  EXPECT_EQ(translate_ok({{"high_priority_stream", "off"}}).priority, StreamPriority::kDefault);
  EXPECT_EQ(translate_ok({}).priority, StreamPriority::kDefault);
}

TEST(NcclHints, ExplainShowsExactlyTheGivenValuesAndNullForTheRest) {
  TranslatedHints t = translate_ok({{"cga_cluster_size", "4"},
                                    {"min_ctas", "2"},
                                    {"max_ctas", "16"},
                                    {"high_priority_stream", "1"}});
  auto j = nlohmann::json::parse(explain_json(t));
  EXPECT_EQ(j["high_priority_stream"], true);
  const auto& c = j["nccl_config"];
  EXPECT_EQ(c["cga_cluster_size"], 4);
  EXPECT_EQ(c["min_ctas"], 2);
  EXPECT_EQ(c["max_ctas"], 16);
  for (const char* key : hint_keys()) {
    std::string k = key;
    if (k == "high_priority_stream") continue;
    ASSERT_TRUE(c.contains(k)) << k;
    if (k != "cga_cluster_size" && k != "min_ctas" && k != "max_ctas") {
      EXPECT_TRUE(c[k].is_null()) << k;
    }
  }
  EXPECT_EQ(c.size(), hint_keys().size() - 1);
}

TEST(NcclHints, SplitChildGetsParentHintsOverriddenByTheCall) {
  const Hints parent = {{"high_priority_stream", "1"}, {"cga_cluster_size", "4"},
                        {"min_ctas", "2"}, {"comm_name", "world"}};
  const Hints call = {{"nccl.min_ctas", "4"}, {"max_ctas", "8"}};
  Hints merged = merge_split_hints(parent, call);
  EXPECT_EQ(merged, (Hints{{"high_priority_stream", "1"},
                           {"cga_cluster_size", "4"},
                           {"min_ctas", "4"},
                           {"max_ctas", "8"}}));
  // Merging the already merged hints again changes nothing.
  EXPECT_EQ(merge_split_hints(parent, merged), merged);
  TranslatedHints t = translate_ok(merged);
  EXPECT_EQ(t.priority, StreamPriority::kHigh);
  EXPECT_EQ(t.config.cga_cluster_size, 4);
  EXPECT_EQ(t.config.min_ctas, 4);
  EXPECT_EQ(t.config.max_ctas, 8);
  EXPECT_FALSE(t.config.comm_name.has_value());
}

TEST(NcclHints, VersionStringsDecodeBothEncodings) {
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(21403), "2.14.3");
  EXPECT_EQ(nccl_version_string(2708), "2.7.8");
}

}  // namespace
}  // namespace comms::nccl
