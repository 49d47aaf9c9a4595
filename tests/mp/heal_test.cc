// The trainer heals: under commsrun --keep-going --replace a killed rank's
// replacement joins at a step boundary, receives the model and the step, and
// the job ends at its first size, with the final_loss of a run that shrinks
// and grows by plan at the same steps, to the bit. HEAL_BACKENDS: gloo and,
// when built, ucx.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "subprocess.h"
#include "cpu_backends.h"

namespace {

using comms::testing::Process;
using namespace std::chrono_literals;

// Steps of the outside-kill run: long enough for two kills at random
// moments and two admissions, and to end at 4 ranks after them.
constexpr int kKillRunSteps = 20000;

std::vector<std::string> backends() { return comms::testing::cpu_backends_built(); }

std::map<std::string, std::string> env_for(const std::string& backend) {
  return {{"COMMS_BACKEND", backend}, {"COMMS_OP_TIMEOUT", "20s"}, {"COMMS_INIT_TIMEOUT", "20s"}};
}

// The run's "final_loss=<x> world=<n>" line, or "none".
std::string final_loss(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(final_loss=(\S+) world=(\d+))"))) return "none";
  return m[1].str() + " world " + m[2].str();
}

std::string final_world(const std::string& output) {
  const std::string f = final_loss(output);
  return f == "none" ? f : f.substr(f.find(' ') + 1);
}

// The steps before which the run grew: "grown: ranks [..] joined in X ms at step G, world N".
std::vector<int> grow_steps(const std::string& output, int world) {
  std::vector<int> out;
  std::regex re(R"(grown: ranks \[\d+\] joined in [\d.]+ ms at step (\d+), world (\d+) \(state transfer [\d.]+ ms\))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it) {
    EXPECT_EQ(std::stoi((*it)[2]), world) << (*it)[0];
    out.push_back(std::stoi((*it)[1]));
  }
  return out;
}

std::vector<std::string> trainer_argv(int n, const std::vector<std::string>& launcher_flags, int steps,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(n), "--timeout", "100"};
  argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
  argv.insert(argv.end(), {"--", TRAINER, "--elastic", "--steps", std::to_string(steps), "--print-every", "500"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// A process's environment (Linux), as the launcher gave it.
std::map<std::string, std::string> environment_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, std::string> env;
  size_t start = 0;
  for (size_t end; (end = text.find('\0', start)) != std::string::npos; start = end + 1) {
    const std::string entry = text.substr(start, end - start);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

// Runs the job with a planned shrink and a planned grow, and starts the
// newcomer itself: the trainer with a rank's environment (the job's store),
// no RANK and COMMS_REPLACEMENT set, as commsrun --replace would.
std::pair<Process, Process> planned_run(int n, const std::string& backend, int steps,
                                        const std::vector<std::string>& extra) {
  Process job = Process::start(trainer_argv(n, {}, steps, extra), env_for(backend));
  std::vector<pid_t> ranks;
  for (int i = 0; i < 200 && ranks.size() < static_cast<size_t>(n); ++i) {
    std::this_thread::sleep_for(50ms);
    ranks = comms::testing::children_of(job.pid);
  }
  std::map<std::string, std::string> env;
  if (!ranks.empty()) env = environment_of(ranks.front());
  env["RANK"] = "";  // unset
  env["COMMS_REPLACEMENT"] = "1";
  std::vector<std::string> argv = trainer_argv(n, {}, steps, extra);
  argv.erase(argv.begin(), std::find(argv.begin(), argv.end(), std::string(TRAINER)));
  Process newcomer = Process::start(argv, env);
  job.wait(110s);
  newcomer.wait(20s);
  return {std::move(job), std::move(newcomer)};
}

double loss_value(const std::string& final) { return std::stod(final.substr(0, final.find(' '))); }

// Rank r dies inside step k's all_reduce; its replacement is admitted at
// some step G; the final_loss equals that of a planned shrink before k and
// a planned grow before G, and (to 1e-5) that of a run that lost nobody.
void expect_healed(int n, int r, int k, int steps) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    Process failed = comms::testing::run(
        trainer_argv(n, {"--keep-going", "--replace"}, steps,
                     {"--fail-rank", std::to_string(r), "--fail-step", std::to_string(k)}),
        env_for(backend), 110s);
    EXPECT_EQ(failed.exit_code(), 0) << failed.output;
    EXPECT_NE(failed.output.find("recovered: lost ranks [" + std::to_string(r) + "] in "), std::string::npos)
        << failed.output;
    EXPECT_TRUE(std::regex_search(failed.output, std::regex("--replace: 1 replacement: \\+1 \\(pid \\d+, in place of rank " +
                                                            std::to_string(r) + "\\)")))
        << failed.output;
    const std::vector<int> grown = grow_steps(failed.output, n);
    ASSERT_EQ(grown.size(), 1u) << failed.output;
    EXPECT_GE(grown[0], k);
    EXPECT_EQ(final_world(failed.output), "world " + std::to_string(n)) << failed.output;

    auto [planned, newcomer] = planned_run(n, backend, steps,
                                           {"--shrink-rank", std::to_string(r), "--shrink-step", std::to_string(k),
                                            "--grow-step", std::to_string(grown[0])});
    EXPECT_EQ(planned.exit_code(), 0) << planned.output;
    EXPECT_EQ(newcomer.exit_code(), 0) << newcomer.output;
    EXPECT_EQ(grow_steps(planned.output, n), grown) << planned.output;
    EXPECT_NE(newcomer.output.find("joined as rank " + std::to_string(n - 1) + " of " + std::to_string(n) +
                                   " before step " + std::to_string(grown[0]) + ":"),
              std::string::npos)
        << newcomer.output;
    ASSERT_NE(final_loss(failed.output), "none") << failed.output;
    EXPECT_EQ(final_loss(failed.output), final_loss(planned.output)) << failed.output << planned.output;

    Process plain = comms::testing::run(trainer_argv(n, {}, steps, {}), env_for(backend), 110s);
    EXPECT_EQ(plain.exit_code(), 0) << plain.output;
    ASSERT_NE(final_loss(plain.output), "none") << plain.output;
    const double healed = loss_value(final_loss(failed.output));
    const double unbroken = loss_value(final_loss(plain.output));
    EXPECT_LE(std::abs(healed - unbroken), 1e-5 * std::abs(unbroken)) << healed << " vs " << unbroken;
  }
}

TEST(Heal, AKilledRanksReplacementJoinsAndTheFinalLossEqualsAPlannedShrinkAndGrowAt4Ranks) {
  expect_healed(4, 1, 7, 3000);
}

TEST(Heal, AKilledRanksReplacementJoinsAndTheFinalLossEqualsAPlannedShrinkAndGrowAt8Ranks) {
  expect_healed(8, 5, 12, 3000);
}

// Two outside kill -9s at random moments, of two different ranks, the second
// once the first replacement is in: the job ends at 4 ranks and commsrun
// names both replacements.
TEST(Heal, TwoOutsideKillsAtRandomMomentsAreBothReplacedAndTheJobEndsAtItsFirstSize) {
  std::mt19937 pick(std::random_device{}());
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    Process p = Process::start(trainer_argv(4, {"--keep-going", "--replace"}, kKillRunSteps, {}), env_for(backend));
    ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("step 500 ") != std::string::npos; }, 40s))
        << p.output;
    std::vector<pid_t> ranks = comms::testing::children_of(p.pid);
    ASSERT_EQ(ranks.size(), 4u) << p.output;
    std::shuffle(ranks.begin(), ranks.end(), pick);
    std::vector<int> victims;
    for (int kill_count = 1; kill_count <= 2; ++kill_count) {
      std::this_thread::sleep_for(std::chrono::milliseconds(pick() % 1000));
      const pid_t pid = ranks[static_cast<size_t>(kill_count - 1)];
      kill(pid, SIGKILL);
      std::smatch m;
      ASSERT_TRUE(p.read_until(
          [&](const std::string& o) {
            return std::regex_search(o, m, std::regex("rank (\\d+) \\(pid " + std::to_string(pid) + "\\) was killed"));
          },
          20s))
          << p.output;
      victims.push_back(std::stoi(m[1]));
      // Its replacement is in: as many grown lines as kills.
      ASSERT_TRUE(p.read_until(
          [&](const std::string& o) { return static_cast<int>(grow_steps(o, 4).size()) == kill_count; }, 40s))
          << p.output;
    }
    ASSERT_TRUE(p.wait(90s)) << p.output;
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    EXPECT_EQ(final_world(p.output), "world 4") << p.output;
    const std::string named = "--replace: 2 replacements: \\+1 \\(pid \\d+, in place of rank " +
                              std::to_string(victims[0]) + "\\), \\+2 \\(pid \\d+, in place of rank " +
                              std::to_string(victims[1]) + "\\)";
    EXPECT_TRUE(std::regex_search(p.output, std::regex(named))) << p.output;
    EXPECT_NE(p.output.find("lost ranks [" + std::to_string(std::min(victims[0], victims[1])) + "," +
                            std::to_string(std::max(victims[0], victims[1])) + "]"),
              std::string::npos)
        << p.output;
  }
}

}  // namespace
