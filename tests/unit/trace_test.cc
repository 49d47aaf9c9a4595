// The flight recorder's ring and comms-trace's merge logic.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "comms/store.h"
#include "merge.h"
#include "trace/recorder.h"
#include "trace/service.h"

namespace {

using comms::trace::OpRecord;
using comms::trace::OpState;
using comms::trace::Recorder;
using nlohmann::json;

OpRecord op(uint64_t seq, uint64_t count = 1024) {
  OpRecord r;
  r.seq = seq;
  r.op = comms::plugin::OpType::kAllReduce;
  r.count = count;
  return r;
}

TEST(TraceRing, KeepsTheLastCapacityOpsOldestFirstWithTheirStates) {
  Recorder rec({"w", 0, 2, "ns", nullptr}, 4);
  for (uint64_t s = 1; s <= 6; ++s) {
    EXPECT_EQ(rec.issued(op(s, s * 10)), s);  // collectives only: numbered as seq
    rec.started(s);
    if (s != 6) rec.completed(s, comms::plugin::OpType::kAllReduce, s);
  }
  rec.failed(6, comms::ErrorCode::kTimeout, 1);
  const auto snap = rec.snapshot();
  ASSERT_EQ(snap.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(snap[i].seq, i + 3);
    EXPECT_EQ(snap[i].count, (i + 3) * 10);
  }
  EXPECT_EQ(snap[2].state, OpState::kCompleted);
  EXPECT_EQ(snap[3].state, OpState::kFailed);
  EXPECT_EQ(snap[3].error, comms::ErrorCode::kTimeout);
  EXPECT_EQ(snap[3].peer, 1);
  EXPECT_GE(snap[3].ended_ns, snap[3].started_ns);
  EXPECT_EQ(rec.last_entered(), 6u);
  EXPECT_EQ(rec.last_completed(), 5u);
  OpRecord found;
  EXPECT_FALSE(rec.find(2, &found));  // overwritten by #6
  ASSERT_TRUE(rec.find(5, &found));
  EXPECT_EQ(found.count, 50u);
  // An update for an op the ring no longer holds must not touch its slot.
  rec.completed(2, comms::plugin::OpType::kAllReduce, 2);
  ASSERT_TRUE(rec.find(6, &found));
  EXPECT_EQ(found.state, OpState::kFailed);
}

// The ring stamps with ticks() (the TSC where the kernel's clock is the
// TSC) and reads back steady_clock nanoseconds: a stamp taken between two
// now_ns() readings reads back between them, after any delay.
TEST(TraceRing, TimesReadBackOnTheSteadyClock) {
  Recorder rec({"w", 0, 2, "ns", nullptr}, 4);
  const int64_t before = comms::trace::now_ns();
  rec.issued(op(1));
  const int64_t after = comms::trace::now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int64_t before_end = comms::trace::now_ns();
  rec.completed(1, comms::plugin::OpType::kAllReduce, 1);
  const int64_t after_end = comms::trace::now_ns();
  OpRecord r;
  ASSERT_TRUE(rec.find(1, &r));
  // Slack for the rate's estimate (parts per million over 30 ms) and the
  // reading pairs' own spread; a wrong offset or rate is off by far more.
  const int64_t slack = 50000;
  EXPECT_GE(r.issued_ns, before - slack);
  EXPECT_LE(r.issued_ns, after + slack);
  EXPECT_EQ(r.started_ns, r.ended_ns);  // never started: completed stamps both
  EXPECT_GE(r.ended_ns, before_end - slack);
  EXPECT_LE(r.ended_ns, after_end + slack);
  EXPECT_GE(r.ended_ns - r.issued_ns, 30000000 - slack);
}

TEST(TraceRing, CapacityZeroRecordsNothingButStillCountsProgress) {
  Recorder rec({"w", 0, 2, "ns", nullptr}, 0);
  OpRecord barrier = op(1);
  barrier.op = comms::plugin::OpType::kBarrier;
  EXPECT_EQ(rec.issued(barrier), 1u);
  EXPECT_EQ(rec.last_entered_collective_op(), comms::plugin::OpType::kBarrier);
  rec.completed(1, comms::plugin::OpType::kBarrier, 1);
  EXPECT_EQ(rec.last_completed_collective_op(), comms::plugin::OpType::kBarrier);
  rec.completed(1, comms::plugin::OpType::kAllReduce, 1);  // not newer: ignored
  EXPECT_EQ(rec.issued(op(2)), 2u);
  EXPECT_TRUE(rec.snapshot().empty());
  EXPECT_EQ(rec.last_entered(), 2u);
  EXPECT_EQ(rec.last_completed(), 1u);
  // The culprit search still names the ops.
  EXPECT_EQ(rec.last_entered_collective(), 2u);
  EXPECT_EQ(rec.last_completed_collective(), 1u);
  EXPECT_EQ(rec.last_entered_collective_op(), comms::plugin::OpType::kAllReduce);
  EXPECT_EQ(rec.last_completed_collective_op(), comms::plugin::OpType::kBarrier);
}

// Sends and receives move seq on some ranks only: collectives keep their
// own numbers, which the dump shows beside seq.
TEST(TraceRing, PointToPointOpsTakeASeqButNoCollectiveNumber) {
  Recorder rec({"w", 0, 2, "ns", nullptr}, 8);
  OpRecord send = op(1);
  send.op = comms::plugin::OpType::kSend;
  send.peer = 1;
  EXPECT_EQ(rec.issued(send), 0u);
  rec.completed(1, comms::plugin::OpType::kSend, 0);
  EXPECT_EQ(rec.issued(op(2)), 1u);
  rec.completed(2, comms::plugin::OpType::kAllReduce, 1);
  OpRecord recv = op(3);
  recv.op = comms::plugin::OpType::kRecv;
  EXPECT_EQ(rec.issued(recv), 0u);
  EXPECT_EQ(rec.issued(op(4)), 2u);
  EXPECT_EQ(rec.last_entered(), 4u);
  EXPECT_EQ(rec.last_entered_collective(), 2u);
  EXPECT_EQ(rec.last_completed_collective(), 1u);
  const json dump = json::parse(rec.to_json("test"));
  ASSERT_EQ(dump["entries"].size(), 4u);
  EXPECT_EQ(dump["entries"][0]["collective"], 0);
  EXPECT_EQ(dump["entries"][1]["collective"], 1);
  EXPECT_EQ(dump["entries"][2]["collective"], 0);
  EXPECT_EQ(dump["entries"][3]["collective"], 2);
  EXPECT_EQ(dump["last_entered_collective"], 2);
  EXPECT_EQ(dump["last_completed_collective"], 1);
}

TEST(TraceRing, AWindowOpIsNamedByItsOwnNameAndTakesNoCollectiveNumber) {
  Recorder rec({"w", 0, 2, "ns", nullptr}, 8);
  OpRecord put;
  put.seq = 1;
  put.window_op = comms::plugin::WindowOpType::kPut;
  put.peer = 1;
  put.count = 64;
  EXPECT_EQ(rec.issued(put), 0u);
  rec.completed_window_op(1);
  OpRecord wait = put;
  wait.seq = 2;
  wait.window_op = comms::plugin::WindowOpType::kWaitSignal;
  EXPECT_EQ(rec.issued(wait), 0u);
  rec.failed(2, comms::ErrorCode::kTimeout, -1);
  EXPECT_EQ(rec.last_entered(), 2u);
  EXPECT_EQ(rec.last_completed(), 1u);
  EXPECT_EQ(rec.last_entered_collective(), 0u);
  const json dump = json::parse(rec.to_json("test"));
  ASSERT_EQ(dump["entries"].size(), 2u);
  EXPECT_EQ(dump["entries"][0]["op"], "put");
  EXPECT_EQ(dump["entries"][0]["state"], "completed");
  EXPECT_EQ(dump["entries"][0]["count"], 64);
  EXPECT_EQ(dump["entries"][1]["op"], "wait_signal");
  EXPECT_EQ(dump["entries"][1]["state"], "failed");
  EXPECT_EQ(dump["entries"][1]["error"], "timeout");
  EXPECT_EQ(dump["entries"][1]["collective"], 0);
}

TEST(TraceRing, ADumpWhileOpsAreWrittenSeesOnlyWholeEntries) {
  Recorder rec({"w", 0, 2, "ns", nullptr}, 8);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t s = 1; !stop.load(); ++s) {
      const uint64_t n = rec.issued(op(s, s * 3));  // count is always 3 x seq: a torn read breaks it
      rec.completed(s, comms::plugin::OpType::kAllReduce, n);
    }
  });
  while (rec.last_entered() < 100) std::this_thread::yield();
  size_t seen = 0;
  for (int i = 0; i < 2000; ++i) {
    for (const OpRecord& r : rec.snapshot()) {
      ASSERT_EQ(r.count, r.seq * 3);
      ASSERT_EQ(r.collective, r.seq);
      ++seen;
    }
  }
  stop = true;
  writer.join();
  EXPECT_GT(seen, 0u);
  const json dump = json::parse(rec.to_json("test"));
  EXPECT_EQ(dump["comm"], "w");
  EXPECT_EQ(dump["reason"], "test");
  EXPECT_EQ(dump["entries"].size(), 8u);
}

// Three ranks of one comm in this process, sharing a store: the watcher
// thread answers for those that did not time out.
TEST(TraceCulprit, ATimeoutNamesTheRankThatNeverEnteredTheOpAndItsLastCompletedOp) {
  auto store = comms::make_memory_store();
  std::vector<std::shared_ptr<Recorder>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(comms::trace::register_comm({"culprit", r, 3, "culprit-ns", store}));
    for (uint64_t s = 1; s <= (r == 2 ? 5u : 6u); ++s) {
      ranks[r]->issued(op(s));
      if (s <= 5) ranks[r]->completed(s, comms::plugin::OpType::kAllReduce, s);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string text = comms::trace::find_culprit(ranks[0], 6, comms::plugin::OpType::kAllReduce);
  EXPECT_EQ(text,
            "ranks that never entered collective #6 (all_reduce): [2] (rank 2 last completed collective #5 "
            "(all_reduce))");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2500));
}

// A pipeline's ranks: rank 0 sends twice to rank 1 before each collective,
// rank 2 takes no part, so seq differs on every rank; the search still
// names rank 1, which never entered the second all_reduce, and counts
// rank 2, inside it at a lower seq, as there.
TEST(TraceCulprit, SendsOnSomeRanksDoNotMakeTheOthersLookBehind) {
  auto store = comms::make_memory_store();
  std::vector<std::shared_ptr<Recorder>> ranks;
  std::vector<uint64_t> seq(3, 0);
  auto p2p = [&](int r, comms::plugin::OpType t) {
    OpRecord o = op(++seq[r]);
    o.op = t;
    ranks[r]->issued(o);
    ranks[r]->completed(seq[r], t, 0);
  };
  for (int r = 0; r < 3; ++r) ranks.push_back(comms::trace::register_comm({"pipeline", r, 3, "pipeline-ns", store}));
  for (int round = 1; round <= 2; ++round) {
    for (int i = 0; i < 2; ++i) {
      p2p(0, comms::plugin::OpType::kSend);
      if (round == 1) p2p(1, comms::plugin::OpType::kRecv);
    }
    for (int r = 0; r < 3; ++r) {
      if (round == 2 && r == 1) continue;  // rank 1 never enters the second all_reduce
      const uint64_t n = ranks[r]->issued(op(++seq[r]));
      EXPECT_EQ(n, static_cast<uint64_t>(round));
      if (round == 1) ranks[r]->completed(seq[r], comms::plugin::OpType::kAllReduce, n);
    }
  }
  ASSERT_EQ(seq, (std::vector<uint64_t>{6, 3, 2}));
  const std::string text = comms::trace::find_culprit(ranks[0], 2, comms::plugin::OpType::kAllReduce);
  EXPECT_EQ(text,
            "ranks that never entered collective #2 (all_reduce): [1] (rank 1 last completed collective #1 "
            "(all_reduce))");
}

TEST(TraceCulprit, APointToPointTimeoutSearchesNothing) {
  auto store = comms::make_memory_store();
  auto rec = comms::trace::register_comm({"p2p", 0, 2, "p2p-ns", store});
  OpRecord recv = op(1);
  recv.op = comms::plugin::OpType::kRecv;
  ASSERT_EQ(rec->issued(recv), 0u);
  EXPECT_EQ(comms::trace::find_culprit(rec, 0, comms::plugin::OpType::kRecv), "");
}

// A store whose calls never return, or fail.
class BrokenStore final : public comms::Store {
 public:
  explicit BrokenStore(bool hang) : hang_(hang) {}
  void set(const std::string&, const std::string&) override { fail(); }
  std::string get(const std::string&, std::chrono::milliseconds) override { return fail(), ""; }
  void wait(const std::vector<std::string>&, std::chrono::milliseconds) override { fail(); }
  int64_t add(const std::string&, int64_t) override { return fail(), 0; }
  bool check(const std::vector<std::string>&) override { return fail(), false; }
  bool delete_key(const std::string&) override { return fail(), false; }
  std::string compare_set(const std::string&, const std::string&, const std::string&) override { return fail(), ""; }

 private:
  void fail() {
    if (hang_) std::this_thread::sleep_for(std::chrono::seconds(20));
    throw comms::Error(comms::ErrorCode::kPeerFailure, "store connection refused");
  }
  bool hang_;
};

TEST(TraceCulprit, AStoreThatNeverAnswersIsSaidSoWithinFiveSeconds) {
  auto rec = std::make_shared<Recorder>(comms::trace::CommInfo{"w", 0, 2, "ns", std::make_shared<BrokenStore>(true)}, 8);
  rec->issued(op(1));
  const auto start = std::chrono::steady_clock::now();
  const std::string text = comms::trace::find_culprit(rec, 1, comms::plugin::OpType::kAllReduce);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(text, "the store did not answer within 4 s, so which ranks are behind is unknown");
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_GE(took, std::chrono::milliseconds(3900));
}

TEST(TraceCulprit, AStoreThatFailsIsNamedWithItsError) {
  auto rec = std::make_shared<Recorder>(comms::trace::CommInfo{"w", 0, 2, "ns", std::make_shared<BrokenStore>(false)}, 8);
  rec->issued(op(1));
  const std::string text = comms::trace::find_culprit(rec, 1, comms::plugin::OpType::kAllReduce);
  EXPECT_NE(text.find("could not ask the store how far the other ranks got: "), std::string::npos) << text;
  EXPECT_NE(text.find("store connection refused"), std::string::npos) << text;
}

json entry(uint64_t seq, const std::string& op, uint64_t count, const std::string& state = "completed",
           int peer = -1) {
  return {{"seq", seq}, {"op", op}, {"dtype", "float32"}, {"count", count}, {"root", -1},
          {"peer", peer}, {"reduction", "sum"}, {"state", state}};
}

json dump(int rank, int size, uint64_t entered, uint64_t completed, json entries) {
  return {{"comm", "world"}, {"rank", rank}, {"size", size}, {"last_entered", entered},
          {"last_completed", completed}, {"entries", std::move(entries)}};
}

TEST(CommsTraceMerge, TheFirstOpSomeRanksNeverEnteredIsStuckWithExactlyThoseRanksMissing) {
  std::vector<json> dumps = {
      dump(0, 4, 6, 5, {entry(5, "all_reduce", 8), entry(6, "all_reduce", 8, "failed")}),
      dump(1, 4, 6, 5, {entry(5, "all_reduce", 8), entry(6, "all_reduce", 8, "failed")}),
      dump(2, 4, 5, 5, {entry(5, "all_reduce", 8)}),
      dump(3, 4, 4, 4, {entry(4, "barrier", 0)}),
  };
  const json c = comms::trace_tool::merge(dumps)["comms"][0];
  ASSERT_EQ(c["stuck"].size(), 1u);
  EXPECT_EQ(c["stuck"][0]["collective"], 5);
  EXPECT_EQ(c["stuck"][0]["op"], "all_reduce");
  EXPECT_EQ(c["stuck"][0]["entered"], json({0, 1, 2}));
  EXPECT_EQ(c["stuck"][0]["missing"], json({3}));
  EXPECT_EQ(c["progress"]["3"]["completed_op"], "barrier");
  EXPECT_TRUE(c["mismatches"].empty());
}

TEST(CommsTraceMerge, TheFirstDisagreementIsReportedButSendAgainstRecvIsNot) {
  std::vector<json> dumps = {
      dump(0, 2, 3, 3, {entry(1, "send", 4), entry(2, "all_reduce", 8), entry(3, "all_reduce", 16)}),
      dump(1, 2, 3, 3, {entry(1, "recv", 4), entry(2, "all_reduce", 9), entry(3, "all_gather", 16)}),
  };
  // Dumps without collective numbers (older libcomms) count seq.
  const json c = comms::trace_tool::merge(dumps)["comms"][0];
  EXPECT_TRUE(c["stuck"].empty());
  ASSERT_EQ(c["mismatches"].size(), 1u);
  EXPECT_EQ(c["mismatches"][0]["collective"], 2);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["0"]["count"], 8);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["1"]["count"], 9);
  EXPECT_EQ(c["mismatches"][0]["by_rank"]["1"]["reduction"], "sum");
}

TEST(CommsTraceMerge, ARankWithoutADumpThatTheOthersFailedOnIsASuspectWithItsLastOp) {
  std::vector<json> dumps = {
      dump(0, 3, 8, 7, {entry(7, "all_reduce", 8), entry(8, "all_reduce", 8, "failed", 2)}),
      dump(1, 3, 8, 7, {entry(7, "all_reduce", 8), entry(8, "all_reduce", 8, "failed", 2)}),
  };
  const json c = comms::trace_tool::merge(dumps)["comms"][0];
  EXPECT_EQ(c["no_dump"], json({2}));
  ASSERT_EQ(c["suspects"].size(), 1u);
  EXPECT_EQ(c["suspects"][0]["rank"], 2);
  EXPECT_EQ(c["suspects"][0]["failed_collective"], 8);
  EXPECT_EQ(c["suspects"][0]["last_completed_by_all"]["collective"], 7);
  const std::string text = comms::trace_tool::to_text(comms::trace_tool::merge(dumps));
  EXPECT_NE(text.find("rank 2 left no dump and ranks [0, 1] failed collective #8 (all_reduce) on it; its last "
                      "collective: #7 (all_reduce)"),
            std::string::npos)
      << text;
}

json numbered(json e, uint64_t collective) {
  e["collective"] = collective;
  return e;
}

json numbered_dump(int rank, int size, uint64_t entered, uint64_t completed, json entries) {
  json d = dump(rank, size, 0, 0, std::move(entries));
  d["last_entered_collective"] = entered;
  d["last_completed_collective"] = completed;
  return d;
}

// A pipeline: rank 0 sent twice before each all_reduce, rank 1 received,
// rank 2 took no part; rank 1 never entered the second all_reduce. Seq
// differs on every rank, collective numbers line them up.
TEST(CommsTraceMerge, SendsOnSomeRanksLineUpByCollectiveNumberNotSeq) {
  std::vector<json> dumps = {
      numbered_dump(0, 3, 2, 1,
                    {numbered(entry(1, "send", 4), 0), numbered(entry(2, "send", 4), 0),
                     numbered(entry(3, "all_reduce", 8), 1), numbered(entry(4, "send", 4), 0),
                     numbered(entry(5, "send", 4), 0), numbered(entry(6, "all_reduce", 8, "failed", 1), 2)}),
      numbered_dump(1, 3, 1, 1,
                    {numbered(entry(1, "recv", 4), 0), numbered(entry(2, "recv", 4), 0),
                     numbered(entry(3, "all_reduce", 8), 1)}),
      numbered_dump(2, 3, 2, 1,
                    {numbered(entry(1, "all_reduce", 8), 1), numbered(entry(2, "all_reduce", 8, "failed", 1), 2)}),
  };
  const json c = comms::trace_tool::merge(dumps)["comms"][0];
  EXPECT_TRUE(c["mismatches"].empty()) << c["mismatches"].dump();
  ASSERT_EQ(c["stuck"].size(), 1u);
  EXPECT_EQ(c["stuck"][0]["collective"], 2);
  EXPECT_EQ(c["stuck"][0]["op"], "all_reduce");
  EXPECT_EQ(c["stuck"][0]["entered"], json({0, 2}));
  EXPECT_EQ(c["stuck"][0]["missing"], json({1}));
  EXPECT_EQ(c["failures"][0]["seq"], 6);
  EXPECT_EQ(c["failures"][1]["seq"], 2);
  EXPECT_EQ(c["failures"][1]["collective"], 2);
  const std::string text = comms::trace_tool::to_text(comms::trace_tool::merge(dumps));
  EXPECT_NE(text.find("stuck: collective #2 (all_reduce) entered by [0, 2], never entered by [1]"), std::string::npos)
      << text;
}

}  // namespace
