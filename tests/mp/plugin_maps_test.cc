// A process opens only the plugins its backend string names: a Gloo job
// never maps UCX (libucm's memory hooks would patch mmap in it). Read from
// /proc/<pid>/maps of a running trainer rank, and of a probe that only
// parses a backend string.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "subprocess.h"

namespace {

using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;

// The plugins and UCX libraries (libucp, libucs, libuct, libucm) mapped in `pid`.
std::set<std::string> mapped(pid_t pid) {
  std::set<std::string> names;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find('/') == std::string::npos) continue;
    const std::string file = line.substr(line.rfind('/') + 1);
    if (file.starts_with("libcomms-") || file.starts_with("libuc")) names.insert(file);
  }
  return names;
}

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += n + " ";
  return out;
}

bool has_prefix(const std::set<std::string>& names, const std::string& prefix) {
  for (const auto& n : names) {
    if (n.starts_with(prefix)) return true;
  }
  return false;
}

// What each rank of a 2-rank trainer job maps once it is training.
std::vector<std::set<std::string>> trainer_ranks_mapped(const std::string& backend) {
  Process p = Process::start({COMMSRUN, "-n", "2", "--", TRAINER, "--steps", "100000000", "--print-every", "20"},
                             {{"COMMS_BACKEND", backend}});
  std::vector<std::set<std::string>> out;
  const bool training =
      p.read_until([](const std::string& o) { return o.find("step 20 ") != std::string::npos; }, 60s);
  EXPECT_TRUE(training) << backend << ": " << p.output;
  if (training) {
    for (pid_t rank : comms::testing::children_of(p.pid)) out.push_back(mapped(rank));
  }
  kill(-p.pid, SIGKILL);
  p.wait(10s);
  EXPECT_EQ(out.size(), training ? 2u : 0u) << p.output;
  return out;
}

TEST(PluginMaps, AGlooTrainerRankMapsTheGlooPluginAndNothingOfUcx) {
  for (const auto& names : trainer_ranks_mapped("cpu:gloo")) {
    EXPECT_TRUE(names.count("libcomms-gloo.so")) << joined(names);
    EXPECT_FALSE(has_prefix(names, "libcomms-ucx")) << joined(names);
    EXPECT_FALSE(has_prefix(names, "libuc")) << "UCX's libraries (libucp, libucs, libuct, libucm): " << joined(names);
  }
}

TEST(PluginMaps, TheDefaultBackendMapsNothingOfUcx) {
  for (const auto& names : trainer_ranks_mapped("")) {
    EXPECT_TRUE(names.count("libcomms-gloo.so")) << joined(names);
    EXPECT_FALSE(has_prefix(names, "libuc")) << joined(names);
    EXPECT_FALSE(has_prefix(names, "libcomms-ucx")) << joined(names);
  }
}

TEST(PluginMaps, AUcxTrainerRankMapsTheUcxPluginAndNotGloo) {
  if (!UCX_PLUGIN_BUILT) {
    GTEST_SKIP() << "the UCX plugin is not built (no libucx-dev)";
  }
  for (const auto& names : trainer_ranks_mapped("cpu:ucx")) {
    EXPECT_TRUE(names.count("libcomms-ucx.so")) << joined(names);
    EXPECT_TRUE(has_prefix(names, "libucp")) << joined(names);
    EXPECT_FALSE(names.count("libcomms-gloo.so")) << joined(names);
  }
}

TEST(PluginMaps, AnUnknownBackendListsTheAvailableOnesWithoutOpeningThem) {
  auto p = run({PLUGIN_MAPS_PROBE, "cpu:nope"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("ERROR: no plugin provides backend 'nope'"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("available backends: gloo"), std::string::npos) << p.output;
  if (UCX_PLUGIN_BUILT) {
    EXPECT_NE(p.output.find("ucx"), std::string::npos) << p.output;
  }
  EXPECT_NE(p.output.find("MAPS:\n"), std::string::npos) << "mapped more than nothing: " << p.output;
}

TEST(PluginMaps, ParsingABackendStringOpensOnlyThePluginsItNames) {
  auto p = run({PLUGIN_MAPS_PROBE, "gloo"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("MAPS: libcomms-gloo.so\n"), std::string::npos) << p.output;
}

}  // namespace
