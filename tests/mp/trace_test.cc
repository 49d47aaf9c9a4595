// The flight recorder across processes (tests/mp/trace_helper.cc under
// commsrun): a timeout that names the rank that never entered the op, the
// count mismatch with and without COMMS_DEBUG=detail, a killed rank, and
// comms-trace's reading of the dumps each leaves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "subprocess.h"

namespace {

using comms::testing::run;
using nlohmann::json;
using namespace std::chrono_literals;

struct Report {
  int rank;
  std::string code;
  long long ms;
  std::string message;
};

std::vector<Report> reports(const std::string& output) {
  std::vector<Report> out;
  std::regex re(R"(FAULT rank (\d+) code (\w+) after_ms (\d+): ([^\n]*))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back({std::stoi((*it)[1]), (*it)[2], std::stoll((*it)[3]), (*it)[4]});
  }
  return out;
}

// A fresh dump directory, removed at the end.
struct TraceDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("comms-trace-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  TraceDir() { std::filesystem::remove_all(path); }
  ~TraceDir() { std::filesystem::remove_all(path); }
  static inline int counter = 0;
};

json trace_json(const TraceDir& dir) {
  auto p = run({COMMS_TRACE, dir.path.string(), "--json"}, {}, 30s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  return json::parse(p.output);
}

TEST(Trace, ARankThatNeverEntersTheFifthAllReduceIsNamedByEveryOtherRankAndByCommsTrace) {
  TraceDir dir;
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "skip"},
               {{"COMMS_OP_TIMEOUT", "3s"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 60s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  // The comm's connect barrier is #1, so the 5th all_reduce is #6.
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "timeout") << p.output;
    EXPECT_LT(rep.ms, 8000) << rep.message;
    EXPECT_GE(rep.ms, 2900) << rep.message;
    EXPECT_NE(rep.message.find("ranks that never entered collective #6 (all_reduce): [2] (rank 2 last completed "
                               "collective #5 (all_reduce))"),
              std::string::npos)
        << rep.message;
  }
  const json merged = trace_json(dir);
  ASSERT_EQ(merged["comms"].size(), 1u) << merged.dump(1);
  const json& c = merged["comms"][0];
  EXPECT_EQ(c["comm"], "world");
  EXPECT_EQ(c["ranks"], json({0, 1, 2}));  // the stuck rank dumped too, asked through the store
  ASSERT_EQ(c["stuck"].size(), 1u) << c.dump(1);
  EXPECT_EQ(c["stuck"][0]["collective"], 6);
  EXPECT_EQ(c["stuck"][0]["op"], "all_reduce");
  EXPECT_EQ(c["stuck"][0]["entered"], json({0, 1}));
  EXPECT_EQ(c["stuck"][0]["missing"], json({2}));
  EXPECT_EQ(c["progress"]["2"]["last_completed_collective"], 5);
  EXPECT_TRUE(c["mismatches"].empty()) << c.dump(1);
}

// Pipeline parallelism's shape: sends and receives on some ranks only, so
// each rank's seq of the same all_reduce differs (rank 0: 16, rank 1 would
// be 16, rank 2: 6). Both waiting ranks still name rank 1 alone, and
// comms-trace lines the dumps up by collective.
TEST(Trace, SendsOnSomeRanksDoNotShiftWhoIsNamed) {
  TraceDir dir;
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "pipeline"},
               {{"COMMS_OP_TIMEOUT", "3s"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 60s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_NE(rep.rank, 1) << rep.message;
    EXPECT_EQ(rep.code, "timeout") << p.output;
    EXPECT_NE(rep.message.find("all_reduce #" + std::string(rep.rank == 0 ? "16" : "6") + ": timeout"),
              std::string::npos)
        << rep.message;
    EXPECT_NE(rep.message.find("ranks that never entered collective #6 (all_reduce): [1] (rank 1 last completed "
                               "collective #5 (all_reduce))"),
              std::string::npos)
        << rep.message;
    EXPECT_EQ(rep.message.find("already past"), std::string::npos) << rep.message;
  }
  const json c = trace_json(dir)["comms"][0];
  EXPECT_EQ(c["ranks"], json({0, 1, 2}));
  ASSERT_EQ(c["stuck"].size(), 1u) << c.dump(1);
  EXPECT_EQ(c["stuck"][0]["collective"], 6);
  EXPECT_EQ(c["stuck"][0]["entered"], json({0, 2}));
  EXPECT_EQ(c["stuck"][0]["missing"], json({1}));
  EXPECT_EQ(c["progress"]["1"]["last_entered_seq"], 15);  // the fifth round's receives
  EXPECT_TRUE(c["mismatches"].empty()) << c.dump(1);
}

// A window's ops take a seq and an entry like any op, without a collective
// number: a wait_signal that timed out shows in the dump, with the put
// that preceded it on the other rank.
TEST(Trace, WindowOpsAreRecordedWithTheirPeerAndState) {
#if !COMMS_TEST_UCX
  GTEST_SKIP() << "windows on CPU buffers need the UCX plugin";
#endif
  TraceDir dir;
  // The comm's timeout leaves rank 1's barrier waiting for rank 0 however
  // slowly rank 0's wait_signal (300 ms) times out.
  auto p = run({COMMSRUN, "-n", "2", "--", TRACE_HELPER, "window"},
               {{"COMMS_OP_TIMEOUT", "60s"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 90s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("WAIT rank 0 code timeout"), std::string::npos) << p.output;
  auto entries = [&](int rank) {
    std::ifstream in(dir.path / ("world.rank" + std::to_string(rank) + ".json"));
    return json::parse(in)["entries"];
  };
  auto find = [](const json& es, const std::string& op) {
    for (const json& e : es) {
      if (e["op"] == op) return e;
    }
    return json();
  };
  const json wait = find(entries(0), "wait_signal");
  ASSERT_FALSE(wait.is_null()) << entries(0).dump(1);
  EXPECT_EQ(wait["state"], "failed");
  EXPECT_EQ(wait["error"], "timeout");
  EXPECT_EQ(wait["collective"], 0);
  const json put = find(entries(1), "put");
  ASSERT_FALSE(put.is_null()) << entries(1).dump(1);
  EXPECT_EQ(put["state"], "completed");
  EXPECT_EQ(put["peer"], 0);
  EXPECT_EQ(put["count"], 64);
  EXPECT_EQ(put["collective"], 0);
  // The barrier after them is each rank's 2nd collective (the connect
  // barrier is the 1st), at a different seq on each rank.
  const json b0 = entries(0).back(), b1 = entries(1).back();
  EXPECT_EQ(b0["op"], "barrier");
  EXPECT_EQ(b0["collective"], b1["collective"]);
  EXPECT_NE(b0["seq"], b1["seq"]);
}

TEST(Trace, WithTheRingOffTheTimeoutStillNamesTheMissingRankAndItsLastOp) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "skip"},
               {{"COMMS_OP_TIMEOUT", "2s"}, {"COMMS_TRACE_BUFFER", "0"}}, 60s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 2u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "timeout") << p.output;
    EXPECT_LT(rep.ms, 7000) << rep.message;
    EXPECT_NE(rep.message.find("ranks that never entered collective #6 (all_reduce): [2] (rank 2 last completed "
                               "collective #5 (all_reduce))"),
              std::string::npos)
        << rep.message;
  }
}

TEST(Trace, DetailModeFailsEveryRankWithBothCountsBeforeTheOpTimeout) {
  TraceDir dir;
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "count"},
               {{"COMMS_OP_TIMEOUT", "30s"}, {"COMMS_DEBUG", "detail"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 60s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 3u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "invalid_argument") << rep.message;
    EXPECT_LT(rep.ms, 5000) << rep.message;
    EXPECT_NE(rep.message.find("rank 1: all_reduce float32 x 1000 sum"), std::string::npos) << rep.message;
    EXPECT_NE(rep.message.find("ranks 0,2: all_reduce float32 x 1024 sum"), std::string::npos) << rep.message;
  }
  const json c = trace_json(dir)["comms"][0];
  ASSERT_EQ(c["mismatches"].size(), 1u) << c.dump(1);
  EXPECT_EQ(c["mismatches"][0]["collective"], 4);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["1"]["count"], 1000);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["0"]["count"], 1024);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["2"]["count"], 1024);
}

TEST(Trace, WithoutDetailModeTheExchangeHeaderFailsEveryRankWithTheCountsAndCommsTraceFindsIt) {
  TraceDir dir;
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "count"},
               {{"COMMS_OP_TIMEOUT", "30s"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 60s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 3u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "invalid_argument") << rep.message;
    EXPECT_LT(rep.ms, 5000) << rep.message;
    // 1024 and 1000 float32 elements, in bytes.
    const std::string expected = rep.rank == 1 ? "rank 1 expects 4000 bytes from each peer, rank 0 sent 4096, rank 2 sent 4096"
                                               : "expects 4096 bytes from each peer, rank 1 sent 4000";
    EXPECT_NE(rep.message.find(expected), std::string::npos) << rep.message;
  }
  const json c = trace_json(dir)["comms"][0];
  ASSERT_EQ(c["mismatches"].size(), 1u) << c.dump(1);
  EXPECT_EQ(c["mismatches"][0]["collective"], 4);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["1"]["count"], 1000);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["0"]["count"], 1024);
}

TEST(Trace, OnTheRingPathOnlyDetailModeCatchesTheCountMismatch) {
  // Documented in docs/DEBUGGING.md: the ring sends from the caller's
  // buffers with no header, so without detail mode this run succeeds.
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "count-ring"},
               {{"COMMS_OP_TIMEOUT", "30s"}, {"COMMS_DEBUG", "detail"}}, 60s);
  auto r = reports(p.output);
  ASSERT_EQ(r.size(), 3u) << p.output;
  for (const auto& rep : r) {
    EXPECT_EQ(rep.code, "invalid_argument") << rep.message;
    EXPECT_NE(rep.message.find("rank 1: all_reduce float32 x 65000 sum"), std::string::npos) << rep.message;
    EXPECT_NE(rep.message.find("ranks 0,2: all_reduce float32 x 65536 sum"), std::string::npos) << rep.message;
  }
}

TEST(Trace, TheSurvivorsDumpsNameAKilledRankAndItsLastOp) {
  TraceDir dir;
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "kill"},
               {{"COMMS_OP_TIMEOUT", "60s"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 60s);
  ASSERT_EQ(reports(p.output).size(), 2u) << p.output;
  const json c = trace_json(dir)["comms"][0];
  EXPECT_EQ(c["ranks"], json({0, 1}));
  EXPECT_EQ(c["no_dump"], json({2}));
  ASSERT_EQ(c["suspects"].size(), 1u) << c.dump(1);
  const json& s = c["suspects"][0];
  EXPECT_EQ(s["rank"], 2);
  EXPECT_EQ(s["named_by"], json({0, 1}));
  EXPECT_EQ(s["failed_collective"], 22);  // its 21st all_reduce, which it never entered
  EXPECT_EQ(s["last_completed_by_all"]["collective"], 21);
  EXPECT_EQ(s["last_completed_by_all"]["op"], "all_reduce");
  auto text = run({COMMS_TRACE, dir.path.string()}, {}, 30s);
  EXPECT_NE(text.output.find("rank 2 left no dump and ranks [0, 1] failed collective #22 (all_reduce) on it; its "
                             "last collective: #21 (all_reduce)"),
            std::string::npos)
      << text.output;
}

TEST(Trace, SigusrOneMakesEveryRankDumpWithoutStoppingIt) {
  TraceDir dir;
  auto p = run({COMMSRUN, "-n", "3", "--grace", "5", "--", TRACE_HELPER, "usr1"},
               {{"COMMS_OP_TIMEOUT", "30s"}, {"COMMS_TRACE_DIR", dir.path.string()}}, 60s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(p.output.find("OK rank " + std::to_string(r) + " after SIGUSR1"), std::string::npos) << p.output;
    std::ifstream in(dir.path / ("world.rank" + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "no dump from rank " << r << "\n" << p.output;
    const json d = json::parse(in);
    EXPECT_EQ(d["reason"], "SIGUSR1");
    EXPECT_EQ(d["last_completed"], 6);  // the connect barrier and 5 all_reduces
    ASSERT_EQ(d["entries"].size(), 6u);
    EXPECT_EQ(d["entries"][0]["op"], "barrier");
    EXPECT_EQ(d["entries"][5]["state"], "completed");
  }
}

// The watcher thread ends before exit-time cleanup: under the asan stage a
// watcher still running when libcrypto's cleanup ran leaked its per-thread
// libcrypto state (LeakSanitizer fails the rank).
TEST(Trace, TheWatcherThreadEndsBeforeExitTimeCleanup) {
  auto p = run({COMMSRUN, "-n", "2", "--", TRACE_HELPER, "exit"}, {}, 60s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("OK rank 0 exits"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("OK rank 1 exits"), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("LeakSanitizer"), std::string::npos) << p.output;
}

}  // namespace
