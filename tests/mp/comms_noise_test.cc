// comms-noise: its JSON adds up, and a core it shares with another spinning
// thread shows as time lost in long gaps.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <thread>

#include <nlohmann/json.hpp>

#include "subprocess.h"

namespace {

using comms::testing::run;
using namespace std::chrono_literals;

nlohmann::json probe(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {COMMS_NOISE, "--json", "-"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = run(argv, {}, 30s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  return nlohmann::json::parse(p.output);
}

void expect_consistent(const nlohmann::json& core, double seconds) {
  int64_t bucketed = 0;
  for (const auto& [name, n] : core["gaps_by_length"].items()) bucketed += n.get<int64_t>();
  const auto gaps = core["gaps"].get<int64_t>();
  EXPECT_EQ(bucketed, gaps) << core.dump();
  EXPECT_NEAR(core["gaps_per_second"].get<double>(), double(gaps) / seconds, 0.1 * double(gaps) / seconds + 1)
      << core.dump();
  const double lost = core["lost_fraction"].get<double>();
  EXPECT_GE(lost, 0);
  EXPECT_LT(lost, 1);
  if (gaps > 0) {
    EXPECT_GE(core["longest_gap_us"].get<double>(), core["mean_gap_us"].get<double>()) << core.dump();
    // Every gap is over the threshold (1 us), and together they are the time lost.
    EXPECT_GT(core["mean_gap_us"].get<double>(), 1.0) << core.dump();
    EXPECT_NEAR(core["mean_gap_us"].get<double>() * double(gaps), lost * seconds * 1e6, 0.1 * lost * seconds * 1e6)
        << core.dump();
  }
}

TEST(CommsNoise, OneBoundThreadPerCoreAndCountsThatAddUp) {
  const auto j = probe({"--seconds", "0.05", "--cpus", "0"});
  ASSERT_EQ(j["cores"].size(), 1u) << j.dump();
  const auto& core = j["cores"][0];
  EXPECT_EQ(core["cpu"], 0);
  EXPECT_TRUE(core["bound"].get<bool>());
  EXPECT_EQ(j["threshold_ns"], 1000);
  expect_consistent(core, 0.05);
}

// A thread of this test spinning on cpu 0 takes the core for scheduler
// slices of a millisecond and more: about half the probe's time, in gaps
// over 64 us.
TEST(CommsNoise, ACompetingSpinnerShowsAsTimeLostInLongGaps) {
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const auto j = probe({"--seconds", "0.4", "--cpus", "0"});
  stop = true;
  spinner.join();
  ASSERT_EQ(j["cores"].size(), 1u) << j.dump();
  const auto& core = j["cores"][0];
  EXPECT_GT(core["lost_fraction"].get<double>(), 0.25) << core.dump();
  EXPECT_GT(core["gaps_by_length"][">64us"].get<int64_t>(), 0) << core.dump();
  EXPECT_GT(core["longest_gap_us"].get<double>(), 500) << core.dump();
  expect_consistent(core, 0.4);
}

TEST(CommsNoise, RefusesASpanOutsideItsRange) {
  auto p = run({COMMS_NOISE, "--seconds", "0"}, {}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("--seconds"), std::string::npos) << p.output;
}

}  // namespace
