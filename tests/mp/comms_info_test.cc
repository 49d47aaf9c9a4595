// comms-info --parallel: Megatron's rank lists printed with no communicator,
// and a layout that does not fit refused with the reason.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "subprocess.h"

namespace {

using comms::testing::run;
using namespace std::chrono_literals;
using Lists = std::vector<std::vector<int>>;

TEST(CommsInfoParallel, Prints16GpuTp2Pp4ListsOfMegatronsDocstring) {
  auto p = run({COMMS_INFO, "--parallel", "world=16,tp=2,pp=4", "--json", "-"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  const auto j = nlohmann::json::parse(p.output);
  EXPECT_EQ(j["tp"].get<Lists>(), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(j["dp"].get<Lists>(), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(j["pp"].get<Lists>(), (Lists{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  for (const char* name : {"tp", "pp", "dp", "cp", "dp_cp", "mp", "tp_cp", "tp_dp", "tp_dp_cp", "ep", "expt_tp",
                           "tp_ep", "tp_ep_pp", "expt_dp"}) {
    EXPECT_TRUE(j.contains(name)) << name;
  }
}

TEST(CommsInfoParallel, HonoursOrderExpertSizesAndRankOffset) {
  auto p = run({COMMS_INFO, "--parallel", "world=8,tp=2,ep=2,etp=1,order=tp-ep-dp-pp,rank_offset=8", "--json", "-"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  const auto j = nlohmann::json::parse(p.output);
  EXPECT_EQ(j["ep"].get<Lists>(), (Lists{{8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(j["expt_dp"].get<Lists>(), (Lists{{8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(j["dp"].get<Lists>(), (Lists{{8, 10, 12, 14}, {9, 11, 13, 15}}));
}

TEST(CommsInfoParallel, AnInvalidLayoutExitsNonZeroWithTheReason) {
  auto p = run({COMMS_INFO, "--parallel", "world=10,tp=4", "--json", "-"}, {}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("the world size 10 is not divisible by tp*pp*cp = 4*1*1 = 4"), std::string::npos) << p.output;
  p = run({COMMS_INFO, "--parallel", "world=8,pp=2,order=tp-dp"}, {}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("pp is 2 but the order 'tp-dp' does not place it"), std::string::npos) << p.output;
  p = run({COMMS_INFO, "--parallel", "tp=2"}, {}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("needs world=N"), std::string::npos) << p.output;
}

TEST(CommsInfoParallel, HugeAndOverflowingLayoutsAreRefusedAtOnceNamingTheMaximum) {
  // These aborted with std::bad_alloc, ran without bound, or overflowed int.
  for (const char* layout : {"world=2147483647", "world=100000000", "world=2000000000,tp=2000000000,pp=2000000000",
                             "world=8,rank_offset=2147483645"}) {
    auto p = run({COMMS_INFO, "--parallel", layout, "--json", "-"}, {}, 20s);
    EXPECT_EQ(p.exit_code(), 2) << layout << ": " << p.output;
    EXPECT_LT(p.elapsed_s(), 10.0) << layout;
    EXPECT_NE(p.output.find("comms-info: invalid_argument: "), std::string::npos) << layout << ": " << p.output;
    EXPECT_NE(p.output.find("the largest supported world, 1048576 ranks"), std::string::npos) << layout << ": "
                                                                                              << p.output;
  }
}

TEST(CommsInfoHints, AGlooHostNameWithAQuoteIsRefusedWithTheReasonNotAnAbort) {
  auto p = run({COMMS_INFO, "--backend", "gloo", "--hints", "hostname=a\"b", "--json", "-"}, {}, 30s);
  EXPECT_EQ(p.exit_code(), 2) << p.output;  // was 134: unescaped JSON, then an uncaught parse error
  EXPECT_NE(p.output.find("hint gloo.hostname='a\"b' does not resolve"), std::string::npos) << p.output;
}

TEST(CommsInfoHints, TheGlooDryRunIsValidJsonWithTheResolvedSettings) {
  auto p = run({COMMS_INFO, "--backend", "gloo", "--hints", "interface=lo,busy_poll=off", "--json", "-"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  const auto j = nlohmann::json::parse(p.output);
  EXPECT_EQ(j["gloo_config"]["interface"], "lo");
  EXPECT_EQ(j["gloo_config"]["hostname"], "");
  EXPECT_EQ(j["gloo_config"]["busy_poll"], "0");
}

TEST(CommsInfoHints, AHintGivenTwiceUnderAnySpellingIsAnError) {
  const std::pair<const char*, const char*> cases[] = {
      {"busy_poll=1,busy_poll=0", "hint 'busy_poll' is given twice in 'busy_poll=1,busy_poll=0'"},
      {"busy_poll=1,gloo.busy_poll=1",
       "hints 'busy_poll' and 'gloo.busy_poll' of comm 'comms-info' both set gloo's 'busy_poll'; give it once"},
  };
  for (const auto& [twice, why] : cases) {
    auto p = run({COMMS_INFO, "--backend", "gloo", "--hints", twice, "--json", "-"}, {}, 30s);
    EXPECT_EQ(p.exit_code(), 2) << twice << ": " << p.output;
    EXPECT_NE(p.output.find(why), std::string::npos) << p.output;
  }
}

TEST(CommsInfoHints, NcclMaxCtasGivenTwiceIsAnError) {
  // The spelling; the plugin's dry run needs no GPU, only the plugin.
  auto info = run({COMMS_INFO, "--json", "-"}, {}, 30s);
  ASSERT_EQ(info.exit_code(), 0) << info.output;
  bool have_nccl = false;
  const auto listed = nlohmann::json::parse(info.output);  // outlives the loop over its plugins
  for (const auto& p : listed["plugins"]) {
    have_nccl = have_nccl || (p["name"] == "nccl" && !p.contains("error"));
  }
  if (!have_nccl) GTEST_SKIP() << "this build has no loadable nccl plugin";
  const std::pair<const char*, const char*> cases[] = {
      {"max_ctas=8,max_ctas=9", "hint 'max_ctas' is given twice in 'max_ctas=8,max_ctas=9'"},
      {"max_ctas=8,nccl.max_ctas=9", "hints 'max_ctas' and 'nccl.max_ctas' of comm 'comms-info' both set nccl's "
                                     "'max_ctas'; give it once"},
  };
  for (const auto& [twice, why] : cases) {
    auto p = run({COMMS_INFO, "--backend", "nccl", "--hints", twice, "--json", "-"}, {}, 30s);
    EXPECT_EQ(p.exit_code(), 2) << twice << ": " << p.output;
    EXPECT_NE(p.output.find(why), std::string::npos) << p.output;
  }
}

// The store's token is a secret: comms-info, whose output ends up in logs,
// says it is set and nothing more.
TEST(CommsInfoEnvironment, TheStoreTokenIsShownAsSetButNeverPrinted) {
  for (bool as_json : {true, false}) {
    std::vector<std::string> argv = {COMMS_INFO};
    if (as_json) argv.insert(argv.end(), {"--json", "-"});
    auto p = run(argv, {{"COMMS_STORE_TOKEN", "a-very-secret-token"}}, 30s);
    ASSERT_EQ(p.exit_code(), 0) << p.output;
    EXPECT_EQ(p.output.find("a-very-secret-token"), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("(set, not shown)"), std::string::npos) << p.output;
  }
}

}  // namespace
