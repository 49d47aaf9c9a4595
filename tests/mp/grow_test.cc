// Elastic growth across processes, through commsrun: admit() with nobody
// waiting costs no op, a newcomer joins at a step boundary, a killed rank's
// replacement brings the world back, a newcomer lost before or during its
// admission leaves the members as they were, and join/shrink cycles leak
// nothing. grow_helper.cc does the ranks' side; these read what they print.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "rank_lines.h"
#include "subprocess.h"
#include "cpu_backends.h"

namespace {

using comms::testing::rank_lines;
using comms::testing::ranks_of;
using comms::testing::run;
using namespace std::chrono_literals;

std::vector<std::string> backends() { return comms::testing::cpu_backends_built(); }

std::map<std::string, std::string> env_for(const std::string& backend) {
  return {{"COMMS_BACKEND", backend}, {"GROW_BACKEND", backend}, {"COMMS_OP_TIMEOUT", "20s"},
          {"COMMS_INIT_TIMEOUT", "20s"}, {"COMMS_ELASTIC", "1"}};
}

comms::testing::Process helper(int n, const std::vector<std::string>& args, std::map<std::string, std::string> env,
                               bool keep_going = false) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(n)};
  if (keep_going) argv.push_back("--keep-going");
  argv.insert(argv.end(), {"--timeout", "100", "--", GROW_HELPER});
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env, 110s);
}

std::set<int> first_ranks(int n) {
  std::set<int> out;
  for (int r = 0; r < n; ++r) out.insert(r);
  return out;
}

// Every rank of the grown comm printed its GROWN line: name, epoch, size,
// the exact sum of 2^rank, and (on every rank, the newcomer's included) the
// op timeout (23 s) and the busy_poll hint the members set at run time.
void expect_grown(const std::string& output, int size, int epoch, const std::set<int>& newcomers,
                  const std::string& settings) {
  const auto grown = rank_lines(output, "GROWN");
  EXPECT_EQ(ranks_of(grown), first_ranks(size)) << output;
  for (const auto& [r, rest] : grown) {
    EXPECT_EQ(rest, "name world@e" + std::to_string(epoch) + " epoch " + std::to_string(epoch) + " size " +
                        std::to_string(size) + " sum " + std::to_string((1 << size) - 1) + settings +
                        " newcomer " + (newcomers.count(r) ? "1" : "0"))
        << "rank " << r << "\n" << output;
  }
}

void expect_idle_costs_no_op(int n) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    const auto dir = std::filesystem::temp_directory_path() / ("grow_idle_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    auto env = env_for(backend);
    env["COMMS_TRACE_DIR"] = dir.string();
    auto p = helper(n, {"idle"}, env);
    std::filesystem::remove_all(dir);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto idle = rank_lines(p.output, "IDLE");
    EXPECT_EQ(ranks_of(idle), first_ranks(n)) << p.output;
    std::regex re(R"(same (\d) ops (-?\d+) -> (-?\d+) store (.*))");
    for (const auto& [r, rest] : idle) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(rest, m, re)) << rest;
      EXPECT_EQ(m[1], "1") << "rank " << r << ": admit returned another comm";
      EXPECT_GT(std::stoll(m[2]), 0) << "rank " << r << ": no flight record";
      EXPECT_EQ(m[2], m[3]) << "rank " << r << ": admit ran an op on the comm";
      // The leader reads the ticket counter and writes its decision; every
      // other rank reads that decision once.
      EXPECT_EQ(m[4], r == 0 ? "add 1 get 0 set 0 cas 1 check 0 wait 0 delete 0"
                             : "add 0 get 1 set 0 cas 0 check 0 wait 0 delete 0")
          << "rank " << r;
    }
  }
}

TEST(Grow, AdmitWithNobodyWaitingReturnsTheSameCommRunsNoOpAndCostsOneStoreReadPerRankAt4Ranks) {
  expect_idle_costs_no_op(4);
}

void expect_planned_grow(int members, int step) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " with " + std::to_string(members) + " members");
    auto p = helper(members, {"grow", std::to_string(step)}, env_for(backend));
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto steps = rank_lines(p.output, "STEP");
    EXPECT_EQ(ranks_of(steps), first_ranks(members)) << p.output;
    for (const auto& [r, rest] : steps) {
      EXPECT_EQ(rest, "step " + std::to_string(step) + " grew " + std::to_string(members) + " -> " +
                          std::to_string(members + 1))
          << p.output;
    }
    expect_grown(p.output, members + 1, 1, {members}, " op_timeout_ms 23000 busy_poll 0");
    const auto done = rank_lines(p.output, "DONE");
    EXPECT_EQ(ranks_of(done), first_ranks(members)) << p.output;
    for (const auto& [r, rest] : done) EXPECT_EQ(rest, "size " + std::to_string(members + 1)) << p.output;
  }
}

TEST(Grow, ANewcomerJoinsAndTheMembersAdmitItAtAStepBoundaryInheritingTimeoutsAndHintsAt4Ranks) {
  expect_planned_grow(3, 2);
}

TEST(Grow, ANewcomerJoinsAndTheMembersAdmitItAtAStepBoundaryInheritingTimeoutsAndHintsAt8Ranks) {
  expect_planned_grow(7, 2);
}

TEST(Grow, AKilledRankIsShrunkAwayAndAReplacementJoinsBringingTheWorldBackAt4Ranks) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    auto p = helper(4, {"replace", "3"}, env_for(backend), /*keep_going=*/true);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto recovered = rank_lines(p.output, "RECOVERED");
    EXPECT_EQ(ranks_of(recovered), first_ranks(3)) << p.output;
    for (const auto& [r, rest] : recovered) EXPECT_EQ(rest, "lost 1 size 3") << p.output;
    // epoch 1: the shrink; epoch 2: the admission. The helper sets no
    // timeout or hint here: the environment's 20 s and none come through.
    expect_grown(p.output, 4, 2, {3}, " op_timeout_ms 20000 busy_poll none");
    const auto done = rank_lines(p.output, "DONE");
    EXPECT_EQ(ranks_of(done), first_ranks(3)) << p.output;
    for (const auto& [r, rest] : done) EXPECT_EQ(rest, "size 4") << p.output;
  }
}

TEST(Grow, ATicketWhoseNewcomerDiedBeforeRecordingItselfIsSkippedAndTheNextNewcomerAdmittedAt4Ranks) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    auto p = helper(3, {"gap"}, env_for(backend));
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    expect_grown(p.output, 4, 1, {3}, " op_timeout_ms 20000 busy_poll none");
  }
}

void expect_kept(const std::string& mode, const std::map<std::string, std::string>& extra_env) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    auto env = env_for(backend);
    for (const auto& [k, v] : extra_env) env[k] = v;
    auto p = helper(4, {mode}, env);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto kept = rank_lines(p.output, "KEPT");
    EXPECT_EQ(ranks_of(kept), first_ranks(4)) << p.output;
    for (const auto& [r, rest] : kept) EXPECT_EQ(rest, "same 1 size 4 sum 15") << "rank " << r << "\n" << p.output;
  }
}

TEST(Grow, ANewcomerKilledBeforeTheAdmissionIsDroppedAndTheMembersKeepWorkingAt4Ranks) {
  expect_kept("killed", {});
}

// Taken into the admission, it never builds the grown comm: the members'
// connect to it fails at the init timeout, its heartbeat stands still, and
// they end where they were.
TEST(Grow, ANewcomerStoppedDuringItsAdmissionIsDroppedAndTheMembersKeepWorkingAt4Ranks) {
  expect_kept("stopped", {{"COMMS_INIT_TIMEOUT", "5s"}});
}

// A newcomer that comes as the job ends (a replacement for a rank lost
// in the last step) learns that no admit will come, in well under its 60 s
// join timeout; one that comes later takes no ticket at all.
TEST(Grow, AfterCloseAdmissionsAWaitingNewcomerAndALaterOneFailWithAbortedAt4Ranks) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    auto p = helper(4, {"closed"}, env_for(backend));
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(p.output, m, std::regex(R"(CLOSED waiting (-?\d+) later (-?\d+) tickets (\d+))")))
        << p.output;
    EXPECT_EQ(m[1], "0") << "the waiting newcomer did not fail with aborted\n" << p.output;
    EXPECT_EQ(m[2], "0") << "the later newcomer did not fail with aborted\n" << p.output;
    EXPECT_EQ(m[3], "1") << "the later newcomer took a ticket\n" << p.output;
    std::vector<long long> took;
    const std::regex newcomer(R"(NEWCOMER aborted after (\d+) ms)");
    for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), newcomer); it != std::sregex_iterator();
         ++it) {
      took.push_back(std::stoll((*it)[1]));
    }
    ASSERT_EQ(took.size(), 2u) << p.output;
    for (long long ms : took) EXPECT_LT(ms, 30000) << "a newcomer waited out (half) its 60 s timeout\n" << p.output;
  }
}

// A member that dies instead of admitting fails the admission on every
// member; recover() shrinks as after any loss, and the newcomer, whose
// join() takes a new ticket, is admitted into the shrunk comm.
TEST(Grow, AMemberLostDuringAnAdmissionFailsItOnTheMembersAndTheNewcomerJoinsTheRecoveredCommAt4Ranks) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    auto env = env_for(backend);
    env["COMMS_INIT_TIMEOUT"] = "5s";  // the others' connect to the dead member fails at this
    auto p = helper(4, {"member-lost"}, env, /*keep_going=*/true);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto admitted = rank_lines(p.output, "ADMIT");
    EXPECT_EQ(ranks_of(admitted), (std::set<int>{0, 1, 3})) << p.output;
    for (const auto& [r, rest] : admitted) EXPECT_EQ(rest, "peer_failure") << "rank " << r << "\n" << p.output;
    // The newcomer's first admission failed too; it joined again.
    EXPECT_NE(p.output.find("] admit: member rank(s) [2] were lost during the admission (the members' recover() "
                            "shrinks their comm); joining again"),
              std::string::npos)
        << p.output;
    // epoch 1: the shrink to 3; epoch 2: the admission.
    expect_grown(p.output, 4, 2, {3}, " op_timeout_ms 20000 busy_poll none");
  }
}

TEST(Grow, TwentyJoinAndShrinkCyclesLeaveFileDescriptorsAndThreadsFlatAt4Ranks) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    // The sanitizer stages run fewer (ELASTIC_CYCLES): what leaks, leaks every cycle.
    const char* env_cycles = std::getenv("ELASTIC_CYCLES");
    const int cycles = env_cycles ? std::atoi(env_cycles) : 20;
    auto p = run({COMMSRUN, "-n", "4", "--timeout", "280", "--", GROW_HELPER, "cycles", std::to_string(cycles)},
                 env_for(backend), 290s);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto seen = rank_lines(p.output, "CYCLES");
    EXPECT_EQ(ranks_of(seen), first_ranks(4)) << p.output;
    std::regex re(R"(epoch (\d+) fds (\d+) -> (\d+) threads (\d+) -> (\d+))");
    for (const auto& [r, rest] : seen) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(rest, m, re)) << rest;
      EXPECT_EQ(std::stoi(m[1]), 2 * cycles) << rest;  // an admission and a shrink per cycle
      // A leak grows with every cycle; a socket still closing is a few.
      EXPECT_LE(std::stoi(m[3]), std::stoi(m[2]) + 3) << "rank " << r << ": " << rest;
      EXPECT_LE(std::stoi(m[5]), std::stoi(m[4]) + 1) << "rank " << r << ": " << rest;
    }
  }
}

}  // namespace
