// Elastic recovery across processes, through commsrun --keep-going: a rank
// killed inside a collective, a rank stopped with SIGSTOP, a second rank
// lost during the agreement, revocation reaching every rank, shrink cycles
// that leak nothing, and the trainer's loss unchanged by how a rank left.
// ELASTIC_BACKENDS (set by meson) lists the backends to run on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "subprocess.h"
#include "cpu_backends.h"

namespace {

using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;

std::vector<std::string> backends() { return comms::testing::cpu_backends_built(); }

// Short timeouts: a stopped rank is found by its heartbeat, a dead one at once.
// COMMS_ELASTIC=1: the helper's runs without --keep-going need elastic comms too.
std::map<std::string, std::string> env_for(const std::string& backend) {
  return {{"COMMS_BACKEND", backend}, {"ELASTIC_BACKEND", backend}, {"COMMS_OP_TIMEOUT", "20s"},
          {"COMMS_INIT_TIMEOUT", "20s"}, {"COMMS_ELASTIC", "1"}};
}

std::string final_loss(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(final_loss=(\S+) world=(\d+))"))) return "none";
  return m[1].str() + " world " + m[2].str();
}

Process trainer(int n, const std::string& backend, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(n), "--keep-going", "--timeout", "100", "--",
                                   TRAINER, "--elastic", "--steps", "30", "--print-every", "10"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run(argv, env_for(backend), 110s);
}

void expect_fail_equals_shrink(int n, int r, int k) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    Process failed = trainer(n, backend, {"--fail-rank", std::to_string(r), "--fail-step", std::to_string(k)});
    Process planned = trainer(n, backend, {"--shrink-rank", std::to_string(r), "--shrink-step", std::to_string(k)});
    EXPECT_EQ(failed.exit_code(), 0) << failed.output;
    EXPECT_EQ(planned.exit_code(), 0) << planned.output;
    EXPECT_NE(failed.output.find("recovered: lost ranks [" + std::to_string(r) + "] in "), std::string::npos)
        << failed.output;
    EXPECT_NE(failed.output.find("world " + std::to_string(n - 1)), std::string::npos) << failed.output;
    EXPECT_NE(failed.output.find("--keep-going: the survivors finished; lost ranks [" + std::to_string(r) + "]"),
              std::string::npos)
        << failed.output;
    EXPECT_NE(final_loss(failed.output), "none") << failed.output;
    EXPECT_EQ(final_loss(failed.output), final_loss(planned.output)) << failed.output << planned.output;
    EXPECT_EQ(final_loss(planned.output).substr(final_loss(planned.output).find("world")),
              "world " + std::to_string(n - 1));
  }
}

TEST(Elastic, ARankKilledInsideAllReduceGivesTheFinalLossOfAPlannedShrinkAt4Ranks) {
  expect_fail_equals_shrink(4, 1, 7);
}

TEST(Elastic, ARankKilledInsideAllReduceGivesTheFinalLossOfAPlannedShrinkAt8Ranks) {
  expect_fail_equals_shrink(8, 5, 12);
}

struct Agreed {
  int rank;
  std::string rest;  // epoch, lost, size, sum, world_sum
};

std::vector<Agreed> agreed(const std::string& output) {
  std::vector<Agreed> out;
  std::regex re(R"(AGREED rank (\d+) (epoch .*))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back({std::stoi((*it)[1]), (*it)[2]});
  }
  return out;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// What every survivor of n ranks that lost `lost` (ascending) prints after
// "AGREED rank <r> ": the new comm's size, the sum of (new rank + 1) and of
// (world rank + 1) over it. Each survivor prints it once.
void expect_all_agree(const std::string& output, int n, const std::vector<int>& lost) {
  const int size = n - static_cast<int>(lost.size());
  int world_sum = n * (n + 1) / 2;
  for (int l : lost) world_sum -= l + 1;
  const std::string want = "epoch 1 lost [" + join(lost) + "] size " + std::to_string(size) + " sum " +
                           std::to_string(size * (size + 1) / 2) + " world_sum " + std::to_string(world_sum);
  std::set<int> want_ranks, ranks;
  for (int r = 0; r < n; ++r) {
    if (std::find(lost.begin(), lost.end(), r) == lost.end()) want_ranks.insert(r);
  }
  auto a = agreed(output);
  for (const auto& x : a) {
    EXPECT_TRUE(ranks.insert(x.rank).second) << "rank " << x.rank << " twice\n" << output;
    EXPECT_EQ(x.rest, want) << "rank " << x.rank << "\n" << output;
  }
  EXPECT_EQ(ranks, want_ranks) << output;
}

void expect_revoked_everywhere(int n) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    auto p = run({COMMSRUN, "-n", std::to_string(n), "--timeout", "60", "--", ELASTIC_HELPER, "revoked"},
                 env_for(backend), 70s);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    std::regex re(R"(REVOKED rank (\d+) first (\w+) later (\w+) after_recover (\w+) is_revoked (\d))");
    std::set<int> seen;
    for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), re); it != std::sregex_iterator(); ++it) {
      seen.insert(std::stoi((*it)[1]));
      EXPECT_EQ((*it)[2], "revoked") << (*it)[0];
      EXPECT_EQ((*it)[3], "revoked") << (*it)[0];
      EXPECT_EQ((*it)[4], "revoked") << (*it)[0];
      EXPECT_EQ((*it)[5], "1") << (*it)[0];
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << p.output;
    expect_all_agree(p.output, n, {});
  }
}

TEST(Elastic, ACommThatIsNotElasticCostsTheStoreNothingAndRefusesRecoveryWithoutLosingAnything) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    auto p = run({COMMSRUN, "-n", "3", "--timeout", "60", "--", ELASTIC_HELPER, "not-elastic"}, env_for(backend), 70s);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    std::regex re(R"(NOT_ELASTIC rank (\d) (.*))");
    int seen = 0;
    for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), re); it != std::sregex_iterator(); ++it) {
      ++seen;
      EXPECT_EQ((*it)[2], "elastic 0 ticked 0 agree invalid_argument (says why) revoke invalid_argument (says why) "
                          "sum 6 is_revoked 0; elastic 1 ticked 1")
          << p.output;
    }
    EXPECT_EQ(seen, 3) << p.output;
  }
}

// Kills what a test started when it ends early (a failed ASSERT): the store
// host and the ranks run until killed otherwise.
struct KillAtExit {
  std::vector<pid_t> pids;
  ~KillAtExit() {
    for (pid_t pid : pids) {
      if (waitpid(pid, nullptr, WNOHANG) != 0) continue;  // reaped already: the pid is not ours any more
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// The store's host dies mid-job: no agreement can run, so every rank's
// watcher revokes the comm and its ops fail saying the store is lost, within
// seconds, and recover() fails saying so; no rank hangs. (A rank whose peer
// was revoked first may see that peer's abort as peer_failure instead.)
TEST(Elastic, ALostStoreFailsEveryRanksOpsAndRecoverSayingSoInsteadOfHanging) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    Process store = Process::start({ELASTIC_HELPER, "store-host"});
    KillAtExit cleanup{{store.pid}};
    ASSERT_TRUE(store.read_until([](const std::string& o) { return o.find('\n') != std::string::npos; }, 20s))
        << store.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(store.output, m, std::regex(R"(STORE_PORT (\d+))"))) << store.output;
    std::vector<Process> ranks;
    const int n = 3;
    for (int r = 0; r < n; ++r) {
      auto env = env_for(backend);
      env.insert({{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(n)},
                  {"COMMS_STORE", "tcp://127.0.0.1:" + m[1].str()}});
      ranks.push_back(Process::start({ELASTIC_HELPER, "store-lost"}, env));
      cleanup.pids.push_back(ranks.back().pid);
    }
    for (auto& p : ranks) {
      ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("READY") != std::string::npos; }, 40s))
          << p.output;
    }
    kill(store.pid, SIGKILL);
    int told_by_own_watcher = 0;
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(ranks[r].wait(30s)) << ranks[r].output;  // 20 s op timeout: a hang would pass it
      EXPECT_EQ(ranks[r].exit_code(), 0) << ranks[r].output;
      std::smatch line;
      ASSERT_TRUE(std::regex_search(ranks[r].output, line,
                                    std::regex("STORE_LOST rank " + std::to_string(r) + " op (\\w+ \\d) recover (.*)")))
          << ranks[r].output;
      EXPECT_TRUE(line[1] == "revoked 1" || line[1] == "peer_failure 0") << ranks[r].output;
      told_by_own_watcher += line[1] == "revoked 1";
      EXPECT_EQ(line[2], "peer_failure 1") << ranks[r].output;
    }
    EXPECT_GE(told_by_own_watcher, 1);
    store.wait(10s);
  }
}

TEST(Elastic, RevokingOnOneRankFailsEveryRanksOpsWithRevokedAndTheParentStaysRevokedAt4Ranks) {
  expect_revoked_everywhere(4);
}

TEST(Elastic, RevokingOnOneRankFailsEveryRanksOpsWithRevokedAndTheParentStaysRevokedAt8Ranks) {
  expect_revoked_everywhere(8);
}

// Rank `first` dies inside an all_reduce; rank `second` dies before it
// joins the agreement (early) or after joining its first round (late).
void expect_second_loss_agreed(int n, int first, int second, bool late) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    auto env = env_for(backend);
    if (late) env["COMMS_INIT_TIMEOUT"] = "4s";  // the shrink that still counts the second victim fails at this
    auto p = run({COMMSRUN, "-n", std::to_string(n), "--keep-going", "--timeout", "80", "--", ELASTIC_HELPER,
                  late ? "double-late" : "double-early", std::to_string(first), std::to_string(second)},
                 env, 90s);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const std::vector<int> lost = {std::min(first, second), std::max(first, second)};
    if (late) {
      EXPECT_NE(p.output.find("rank " + std::to_string(second) + " joined round 0 (lost [" + std::to_string(first) +
                              "]) and dies"),
                std::string::npos)
          << p.output;
    }
    EXPECT_NE(p.output.find("lost ranks [" + join(lost) + "]"), std::string::npos) << p.output;
    expect_all_agree(p.output, n, lost);
  }
}

TEST(Elastic, ASecondRankLostBeforeJoiningTheAgreementIsInTheSameSetOnEverySurvivorAt4Ranks) {
  expect_second_loss_agreed(4, 1, 2, false);
}

TEST(Elastic, ASecondRankLostBeforeJoiningTheAgreementIsInTheSameSetOnEverySurvivorAt8Ranks) {
  expect_second_loss_agreed(8, 6, 3, false);
}

TEST(Elastic, ASecondRankLostAfterJoiningTheAgreementMakesASecondRoundThatFindsItAt4Ranks) {
  expect_second_loss_agreed(4, 1, 2, true);
}

TEST(Elastic, ASecondRankLostAfterJoiningTheAgreementMakesASecondRoundThatFindsItAt8Ranks) {
  expect_second_loss_agreed(8, 2, 7, true);
}

void expect_cycles_flat(int n, const char* default_cycles) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    // The sanitizer stages run fewer (ELASTIC_CYCLES): what leaks, leaks every cycle.
    const char* cycles = std::getenv("ELASTIC_CYCLES");
    auto p = run({COMMSRUN, "-n", std::to_string(n), "--timeout", "150", "--", ELASTIC_HELPER, "cycles",
                  cycles ? cycles : default_cycles},
                 env_for(backend), 160s);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    std::regex re(R"(CYCLES rank (\d+) (\w+) fds (\d+) -> (\d+) threads (\d+) -> (\d+))");
    std::set<std::pair<int, std::string>> seen;
    for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), re); it != std::sregex_iterator(); ++it) {
      seen.insert({std::stoi((*it)[1]), (*it)[2]});
      // A leak grows with every cycle (19 of them after the first count);
      // a store connection or socket still closing is at most a few.
      EXPECT_LE(std::stoi((*it)[4]), std::stoi((*it)[3]) + 3) << (*it)[0];
      EXPECT_LE(std::stoi((*it)[6]), std::stoi((*it)[5]) + 1) << (*it)[0];
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(2 * n)) << p.output;  // recover and planned, every rank
  }
}

TEST(Elastic, TwentyRecoverAndShrinkCyclesLeaveFileDescriptorsAndThreadsFlatAt4Ranks) {
  expect_cycles_flat(4, "20");
}

TEST(Elastic, TwentyRecoverAndShrinkCyclesLeaveFileDescriptorsAndThreadsFlatAt8Ranks) {
  expect_cycles_flat(8, "20");
}

void expect_stopped_rank_shrunk_away(int n, int victim, int steps) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    auto env = env_for(backend);
    env["COMMS_OP_TIMEOUT"] = "3s";
    Process p = Process::start({COMMSRUN, "-n", std::to_string(n), "--keep-going", "--timeout", "80", "--", TRAINER,
                                "--elastic", "--steps", std::to_string(steps), "--print-every", "50"},
                               env);
    ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("step 100 ") != std::string::npos; }, 40s))
        << p.output;
    auto ranks = comms::testing::children_of(p.pid);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(n));
    kill(ranks[static_cast<size_t>(victim)], SIGSTOP);
    const bool finished =
        p.read_until([](const std::string& o) { return o.find("final_loss=") != std::string::npos; }, 60s);
    kill(ranks[static_cast<size_t>(victim)], SIGKILL);  // the launcher reaps it: lost
    ASSERT_TRUE(p.wait(20s)) << p.output;
    ASSERT_TRUE(finished) << p.output;
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const std::string lost = "lost ranks [" + std::to_string(victim) + "]";
    EXPECT_NE(p.output.find("recovered: " + lost + " in "), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("world=" + std::to_string(n - 1)), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("--keep-going: the survivors finished; " + lost), std::string::npos) << p.output;
  }
}

TEST(Elastic, AStoppedRankIsTimedOutAgreedOnAndShrunkAwayAndTheOthersFinishAt4Ranks) {
  expect_stopped_rank_shrunk_away(4, 2, 1500);
}

TEST(Elastic, AStoppedRankIsTimedOutAgreedOnAndShrunkAwayAndTheOthersFinishAt8Ranks) {
  expect_stopped_rank_shrunk_away(8, 5, 1500);
}

TEST(Elastic, AnOutsideKillAtARandomMomentLeavesTheOthersFinishingAndCommsrunNamingTheLostRank) {
  std::mt19937 pick(std::random_device{}());
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    // 10000 steps: with shared-memory collectives a step takes 0.1-0.4 ms
    // here, and 1500 were over before the random moment came.
    Process p = Process::start({COMMSRUN, "-n", "4", "--keep-going", "--timeout", "80", "--", TRAINER, "--elastic",
                                "--steps", "10000", "--print-every", "500"},
                               env_for(backend));
    ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("step 500 ") != std::string::npos; }, 40s))
        << p.output;
    auto ranks = comms::testing::children_of(p.pid);
    ASSERT_EQ(ranks.size(), 4u) << p.output;
    std::this_thread::sleep_for(std::chrono::milliseconds(pick() % 300));
    const pid_t pid = ranks[pick() % ranks.size()];
    kill(pid, SIGKILL);
    ASSERT_TRUE(p.wait(70s)) << p.output;
    std::smatch m;
    const std::string pid_text = std::to_string(pid);
    ASSERT_TRUE(std::regex_search(p.output, m, std::regex("rank (\\d+) \\(pid " + pid_text + "\\) was killed by signal 9")))
        << p.output;
    const int victim = std::stoi(m[1]);
    EXPECT_EQ(p.exit_code(), 0) << "killed rank " << victim << "\n" << p.output;
    EXPECT_NE(p.output.find("--keep-going: the survivors finished; lost ranks [" + std::to_string(victim) + "]"),
              std::string::npos)
        << p.output;
    EXPECT_NE(p.output.find("world=3"), std::string::npos) << p.output;
  }
}

}  // namespace
