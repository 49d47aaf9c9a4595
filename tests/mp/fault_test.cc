// Faults across processes, driven through commsrun: a peer killed mid-op, a
// peer that skips an op, and abort() with an op in flight. Each must end in
// errors on the survivors within the op timeout plus a small margin.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "subprocess.h"

namespace {

using comms::testing::run;
using namespace std::chrono_literals;

struct Report {
  int rank;
  std::string code;
  long long ms;
};

std::vector<Report> reports(const std::string& output) {
  std::vector<Report> out;
  std::regex re(R"(FAULT rank (\d+) code (\w+) after_ms (\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back({std::stoi((*it)[1]), (*it)[2], std::stoll((*it)[3])});
  }
  return out;
}

TEST(Faults, APeerKilledMidOpGivesPeerFailureOnEveryOtherRankAndNoHang) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "10", "--", FAULT_HELPER, "kill"},
               {{"COMMS_OP_TIMEOUT", "60s"}}, 50s);
  ASSERT_NE(p.status, -1) << p.output;
  EXPECT_NE(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("rank 2"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("signal 9"), std::string::npos) << p.output;
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_TRUE(rep.code == "peer_failure" || rep.code == "aborted") << "rank " << rep.rank << " got " << rep.code;
    // Far below the 60 s op timeout: the failure is detected, not waited out.
    EXPECT_LT(rep.ms, 5000) << "rank " << rep.rank;
  }
}

TEST(Faults, APeerThatClosesItsCommGivesTheOthersPeerFailure) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "20", "--", FAULT_HELPER, "close"},
               {{"COMMS_OP_TIMEOUT", "60s"}}, 50s);
  ASSERT_NE(p.status, -1) << p.output;
  EXPECT_EQ(p.output.find("killed by signal"), std::string::npos) << p.output;
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "peer_failure") << "rank " << rep.rank << "\n" << p.output;
    EXPECT_LT(rep.ms, 5000) << "rank " << rep.rank;
  }
}

TEST(Faults, APeerThatSkipsAnOpMakesTheOthersTimeOutWithinTheOpTimeout) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", FAULT_HELPER, "skip"},
               {{"COMMS_OP_TIMEOUT", "2s"}}, 50s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "timeout") << "rank " << rep.rank << "\n" << p.output;
    EXPECT_GE(rep.ms, 1900) << "rank " << rep.rank;
    EXPECT_LT(rep.ms, 2000 + 3000) << "rank " << rep.rank;
  }
  EXPECT_NE(p.exit_code(), 0);
}

// The error of a Gloo read timeout carries every field, the peer included:
// at 2 ranks the only rank rank 0 can wait for is rank 1.
TEST(Faults, ATimeoutErrorNamesCommOpSeqRankAndThePeerItWaitedFor) {
  auto p = run({COMMSRUN, "-n", "2", "--grace", "3", "--", FAULT_HELPER, "skip"},
               {{"COMMS_OP_TIMEOUT", "1s"}}, 40s);
  std::smatch m;
  const std::regex re(R"(FAULT rank (\d+) code (\w+) after_ms \d+ comm (\S+) op (\S+) seq (\d+) peer (-?\d+): ([^\n]*))");
  ASSERT_TRUE(std::regex_search(p.output, m, re)) << p.output;
  EXPECT_EQ(m[1], "0");
  EXPECT_EQ(m[2], "timeout");
  EXPECT_EQ(m[3], "world");
  EXPECT_EQ(m[4], "all_reduce");
  EXPECT_EQ(m[5], "3") << "seq 1 is the binding barrier, 2 the first all_reduce";
  EXPECT_EQ(m[6], "1") << m[7];
  EXPECT_NE(m[7].str().find("comms[world rank 0/2] all_reduce #3: timeout: "), std::string::npos) << m[7];
  EXPECT_NE(m[7].str().find("(peer rank 1)"), std::string::npos) << m[7];
}

TEST(Faults, AbortWakesAnInFlightOpWithAbortedAndLaterOpsFailFast) {
  auto p = run({COMMSRUN, "-n", "2", "--grace", "5", "--", FAULT_HELPER, "abort"},
               {{"COMMS_OP_TIMEOUT", "60s"}}, 40s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 1u) << p.output;
  EXPECT_EQ(r[0].rank, 0);
  EXPECT_EQ(r[0].code, "aborted") << p.output;
  EXPECT_LT(r[0].ms, 3000) << p.output;
  EXPECT_NE(p.output.find("AFTER code aborted"), std::string::npos) << p.output;
}

// abort() shuts every socket of the comm, those its side connected and those
// it accepted, so every peer waiting for it fails at once: on the sync mesh
// each survivor reads rank 1's socket itself (an abort that shut one side
// only would leave the others waiting). On Gloo's own collectives the rank
// comes from Gloo's text, which names the peer by the connection's remote
// end or, on the accepting side, by the address the peer listened on, with
// the port unconverted.
TEST(Faults, AbortShutsThePairsOfBothSidesAndThePeersErrorsNameTheAbortedRank) {
  for (const std::string mesh : {"sync", "async"}) {
    auto p = run({COMMSRUN, "-n", "4", "--grace", "2", "--", FAULT_HELPER, "abort-peer", mesh},
                 {{"COMMS_OP_TIMEOUT", "60s"}}, 60s);
    EXPECT_NE(p.output.find("ABORTED rank 1"), std::string::npos) << p.output;
    const std::regex re(R"(FAULT rank (\d+) code (\w+) after_ms (\d+) comm \S+ op (\S+) seq \d+ peer (-?\d+): ([^\n]*))");
    std::set<int> reported, named;
    for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), re); it != std::sregex_iterator(); ++it) {
      const auto& m = *it;
      const int rank = std::stoi(m[1]);
      const int peer = std::stoi(m[5]);
      reported.insert(rank);
      named.insert(peer);
      EXPECT_EQ(m[2], "peer_failure") << mesh << " rank " << rank << ": " << m[6];
      // Rank 1 lives 20 s past its abort; the op's timeout is 30 s or more.
      EXPECT_LT(std::stoll(m[3]), 5000) << mesh << " rank " << rank << " waited: " << m[6];
      EXPECT_EQ(m[4], "all_to_all") << m[6];
      // A survivor that failed first aborts and exits too, so a rank that
      // was still reading from it may name it instead of rank 1: either is
      // the connection that really closed. Naming no one (-1) is the bug.
      EXPECT_TRUE(peer >= 0 && peer != rank && peer < 4) << mesh << " rank " << rank << " named no peer: " << m[6];
      EXPECT_NE(m[6].str().find("(peer rank " + std::to_string(peer) + ")"), std::string::npos)
          << mesh << " rank " << rank << ": " << m[6];
    }
    EXPECT_EQ(reported, (std::set<int>{0, 2, 3})) << mesh << ": a survivor did not fail promptly\n" << p.output;
    EXPECT_TRUE(named.contains(1)) << mesh << ": no survivor named the aborted rank\n" << p.output;
  }
}

TEST(Faults, AProgramThatExitsWithoutShutdownDoesNotHang) {
  auto p = run({COMMSRUN, "-n", "3", "--", FAULT_HELPER, "exit-without-shutdown"}, {}, 40s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_LT(p.elapsed_s(), 15.0) << p.output;
  EXPECT_NE(p.output.find("[2] returning from main without shutdown"), std::string::npos) << p.output;
}

}  // namespace

#if UCX_PLUGIN_BUILT
// The same faults under cpu:ucx: a killed peer's endpoint fails (UCX's peer
// error handling), a skipped op times out, abort() signals the worker.
// The 4 KiB all_reduces of these faults take the shared-memory path
// (backends/ucx/shm_collectives.h) unless COMMS_UCX_SHM=0 gives them UCX's.
void expect_killed_peer_reported(const char* shm) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "10", "--", FAULT_HELPER, "kill"},
               {{"COMMS_OP_TIMEOUT", "20s"}, {"FAULT_BACKEND", "cpu:ucx"}, {"COMMS_UCX_SHM", shm}}, 50s);
  ASSERT_NE(p.status, -1) << p.output;
  EXPECT_NE(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("signal 9"), std::string::npos) << p.output;
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_TRUE(rep.code == "peer_failure" || rep.code == "timeout") << "rank " << rep.rank << " got " << rep.code;
    EXPECT_LT(rep.ms, 20000 + 5000) << "rank " << rep.rank;
  }
  EXPECT_NE(p.output.find("all_reduce #22"), std::string::npos) << "the op and its sequence number\n" << p.output;
}

// A wait for a killed rank's signal (it dies during the wait) and a put to
// it: peer_failure naming it, well within the op timeout (its pid is watched).
void expect_window_kill_reported(const char* memory) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "10", "--", FAULT_HELPER, "window-kill"},
               {{"COMMS_OP_TIMEOUT", "20s"}, {"FAULT_BACKEND", "cpu:ucx"}, {"FAULT_WINDOW_MEMORY", memory}}, 50s);
  ASSERT_NE(p.status, -1) << p.output;
  EXPECT_NE(p.output.find("signal 9"), std::string::npos) << p.output;
  const std::regex re(R"(FAULT rank (\d+) code (\w+) after_ms (\d+) comm \S+ op (\S+) seq \d+ peer (-?\d+))");
  int reported = 0;
  for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), re); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    ++reported;
    EXPECT_EQ(m[2], "peer_failure") << m[0] << "\n" << p.output;
    EXPECT_LT(std::stoll(m[3]), 5000) << m[0];
    EXPECT_EQ(m[4], m[1] == "0" ? "wait_signal" : "put") << m[0];
    EXPECT_EQ(m[5], "2") << m[0];
  }
  EXPECT_EQ(reported, 2) << p.output;
}

TEST(UcxFaults, AKilledPeerFailsAWindowPutOrSignalWaitWithPeerFailureNamingIt) { expect_window_kill_reported("plain"); }

// The same with windows in the allocator's memory, which the survivors have
// mapped: a put there is a memcpy, and still fails naming the dead rank.
TEST(UcxFaults, AKilledPeerFailsAPutIntoItsMappedWindowWithPeerFailureNamingIt) {
  expect_window_kill_reported("backend");
}

TEST(UcxFaults, APeerKilledMidOpGivesPeerFailureOrTimeoutOnEveryOtherRankWellWithinTheOpTimeout) {
  expect_killed_peer_reported("1");
}

TEST(UcxFaults, APeerKilledMidOpIsReportedOnTheUcxPathToo) { expect_killed_peer_reported("0"); }

// Killed while every rank reads and writes the others' mapped buffers: the
// survivors finish their share on the dead rank's memory (still mapped)
// and their wait for it fails naming it, long before the op timeout.
TEST(UcxFaults, APeerKilledMidZeroCopyOpGivesPeerFailureNamingIt) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "10", "--", FAULT_HELPER, "zero-copy-kill"},
               {{"COMMS_OP_TIMEOUT", "120s"}, {"FAULT_BACKEND", "cpu:ucx"}}, 60s);
  ASSERT_NE(p.status, -1) << p.output;
  EXPECT_NE(p.output.find("signal 9"), std::string::npos) << p.output;
  const std::regex re(R"(FAULT rank (\d+) code (\w+) after_ms \d+ comm \S+ op (\S+) seq \d+ peer (-?\d+))");
  int reported = 0;
  for (auto it = std::sregex_iterator(p.output.begin(), p.output.end(), re); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    ++reported;
    EXPECT_EQ(m[2], "peer_failure") << m[0] << "\n" << p.output;
    EXPECT_EQ(m[3], "all_reduce") << m[0];
    EXPECT_EQ(m[4], "2") << m[0];
  }
  EXPECT_EQ(reported, 2) << p.output;
  // The ops before the kill took the zero-copy path.
  std::smatch m;
  for (const char* rank : {"0", "1"}) {
    ASSERT_TRUE(std::regex_search(p.output, m, std::regex(std::string("ZEROCOPY rank ") + rank + R"( ops (\d+))")))
        << p.output;
    EXPECT_GE(std::stoll(m[1]), 1) << p.output;
  }
}

TEST(UcxFaults, APeerThatSkipsAnOpMakesTheOthersTimeOutWithinTheOpTimeout) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", FAULT_HELPER, "skip"},
               {{"COMMS_OP_TIMEOUT", "2s"}, {"FAULT_BACKEND", "cpu:ucx"}}, 50s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "timeout") << "rank " << rep.rank << "\n" << p.output;
    EXPECT_GE(rep.ms, 1900) << "rank " << rep.rank;
    EXPECT_LT(rep.ms, 2000 + 3000) << "rank " << rep.rank;
  }
  EXPECT_NE(p.output.find("(shared memory) timed out"), std::string::npos) << p.output;
  EXPECT_NE(p.exit_code(), 0);
}

// A gather's non-root never waits for the root, and UCX keeps each eager
// message the root has not asked for in the root's memory: while the root
// waited for a late rank, rank 1 ran all 400 gathers ahead (without the
// transport's credit; a long run grew the root by gigabytes).
TEST(UcxFaults, ASenderRunsAtMostTheCreditWindowAheadOfARootThatWaitsForALateRank) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", FAULT_HELPER, "late-sender"},
               {{"COMMS_OP_TIMEOUT", "30s"}, {"FAULT_BACKEND", "cpu:ucx"}}, 60s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(p.output, m, std::regex(R"(LATESENDER rank 1 early (\d+))"))) << p.output;
  // At most the credit window: 2 x 8 messages per peer.
  EXPECT_LE(std::stoi(m[1]), 16) << p.output;
  EXPECT_NE(p.output.find("LATESENDER rank 0 early 0 wrong 0"), std::string::npos) << p.output;
}

TEST(UcxFaults, AbortWakesAnInFlightOpWithAbortedAndLaterOpsFailFast) {
  auto p = run({COMMSRUN, "-n", "2", "--grace", "5", "--", FAULT_HELPER, "abort"},
               {{"COMMS_OP_TIMEOUT", "60s"}, {"FAULT_BACKEND", "cpu:ucx"}}, 40s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 1u) << p.output;
  EXPECT_EQ(r[0].code, "aborted") << p.output;
  EXPECT_LT(r[0].ms, 3000) << p.output;
  EXPECT_NE(p.output.find("(shared memory) aborted"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("AFTER code aborted"), std::string::npos) << p.output;
}
#endif
