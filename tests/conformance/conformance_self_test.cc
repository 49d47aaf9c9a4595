// The suite judged by a backend whose answers are known: the correct self
// plugin passes, and a build of it that ignores premul_sum's factor fails
// with a message naming the op, dtype and first wrong index.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "subprocess.h"

namespace {

using comms::testing::run;
using namespace std::chrono_literals;

comms::testing::Process conformance(const std::string& plugin, const std::string& filter) {
  return run({COMMSRUN, "-n", "1", "--", CONFORMANCE, "--plugin", plugin, "--filter", filter}, {}, 120s);
}

TEST(Conformance, TheCorrectSelfPluginPasses) {
  auto p = conformance(SELF_PLUGIN, "world/*");
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_TRUE(std::regex_search(p.output, std::regex(R"([1-9]\d* passed, 0 failed, \d+ skipped)"))) << p.output;
}

TEST(Conformance, AWrongReductionFailsTheSuiteNamingOpDtypeAndIndex) {
  auto p = conformance(SELF_PLUGIN_BROKEN, "world/all_reduce/*");
  EXPECT_NE(p.exit_code(), 0) << p.output;
  EXPECT_TRUE(std::regex_search(p.output, std::regex(R"(\d+ passed, [1-9]\d* failed, \d+ skipped)"))) << p.output;
  // The failing case names the premul_sum op on some dtype, where the first
  // mismatch is and what was expected.
  EXPECT_TRUE(std::regex_search(
      p.output, std::regex(R"(FAIL world/all_reduce/float32/premul_sum/.*rank 0 .*op all_reduce dtype float32 )"
                           R"(redop premul_sum count 1 .*first mismatch at index 0: expected \S+, got \S+)")))
      << p.output;
  // Reductions the bug does not touch still pass.
  EXPECT_NE(p.output.find("PASS world/all_reduce/float32/sum/out-of-place"), std::string::npos) << p.output;
}

TEST(Conformance, AFilterThatMatchesNothingRunsNothing) {
  auto p = conformance(SELF_PLUGIN, "no-such-case");
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("0 passed, 0 failed, 0 skipped"), std::string::npos) << p.output;
}

// Several --filter globs (repeated and comma-separated) select the union,
// --exclude removes from it, --require fails a run where a required case is
// missing.
TEST(Conformance, SeveralFiltersExcludesAndRequire) {
  auto p = run({COMMSRUN, "-n", "1", "--", CONFORMANCE, "--plugin", SELF_PLUGIN, "--filter",
                "world/barrier/*,world/all_reduce/float32/sum/*", "--filter", "world/broadcast/float32/*",
                "--exclude", "*/in-place"},
               {}, 120s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("PASS world/barrier/none"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("PASS world/all_reduce/float32/sum/out-of-place"), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("world/all_reduce/float32/sum/in-place"), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("world/broadcast/float32/in-place"), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("world/all_reduce/float64"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("2 passed, 0 failed, 0 skipped"), std::string::npos) << p.output;

  auto missing = run({COMMSRUN, "-n", "1", "--", CONFORMANCE, "--plugin", SELF_PLUGIN, "--filter",
                      "world/barrier/*", "--require", "world/barrier/*,world/gather/*"},
                     {}, 120s);
  EXPECT_NE(missing.exit_code(), 0) << missing.output;
  EXPECT_NE(missing.output.find("FAIL --require 'world/gather/*': no case of this run matches it"), std::string::npos)
      << missing.output;
  EXPECT_NE(missing.output.find("1 passed, 1 failed, 0 skipped"), std::string::npos) << missing.output;
}

// --json -: stdout is the JSON document alone (what `| jq` reads); the
// human report goes to stderr. One rank, run directly (commsrun prefixes
// each line of a rank's stdout with its rank).
TEST(Conformance, JsonToStdoutLeavesStdoutExactlyTheJsonDocument) {
  const std::string cmd = std::string(CONFORMANCE) + " --plugin " + SELF_PLUGIN +
                          " --filter 'world/barrier/*,world/all_reduce/float32/sum/*' --json -";
  auto out = run({"/bin/sh", "-c", cmd + " 2>/dev/null"}, {}, 120s);
  EXPECT_EQ(out.exit_code(), 0) << out.output;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out.output);
  } catch (const nlohmann::json::exception& e) {
    FAIL() << "stdout is not one JSON document (" << e.what() << "):\n" << out.output;
  }
  EXPECT_EQ(j["world_size"], 1);
  EXPECT_EQ(j["passed"], 3);
  EXPECT_EQ(j["failed"], 0);
  ASSERT_EQ(j["cases"].size(), 3u);
  std::map<std::string, std::string> status;
  for (const auto& c : j["cases"]) status[c["name"]] = c["status"];
  EXPECT_EQ(status["world/barrier/none"], "passed") << j.dump(2);
  EXPECT_EQ(status["world/all_reduce/float32/sum/in-place"], "passed") << j.dump(2);

  // The table and summary are still shown, on stderr.
  auto err = run({"/bin/sh", "-c", cmd + " 2>&1 >/dev/null"}, {}, 120s);
  EXPECT_EQ(err.exit_code(), 0) << err.output;
  EXPECT_NE(err.output.find("PASS world/barrier/none"), std::string::npos) << err.output;
  EXPECT_NE(err.output.find("3 passed, 0 failed, 0 skipped"), std::string::npos) << err.output;
}

}  // namespace
