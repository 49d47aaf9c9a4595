// The CPU backends' op queue (backends/cpu_algorithms/op_queue.h): the order
// of asynchronous ops, a blocking op waiting for the ones before it, and
// queued ops completing with the error after an abort. The execute callback
// records what ran, on which thread; a gate holds the first op so that
// later ones are still queued when the test acts.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "op_queue.h"

namespace comms::cpu_algorithms {
namespace {

using namespace std::chrono_literals;

struct Ran {
  uint64_t seq;
  std::thread::id thread;
  std::vector<size_t> counts;  // as the op saw them when it ran
};

// What a backend does around the queue, reduced to what the queue sees: an
// op with seq `gated_seq` blocks until open(); once broken, ops fail as a
// broken backend's do.
class FakeBackend {
 public:
  explicit FakeBackend(uint64_t gated_seq = 0) : gated_seq_(gated_seq) {}

  Status execute(const plugin::OpDesc& op) {
    std::unique_lock<std::mutex> lock(mu_);
    if (op.seq == gated_seq_) {
      gate_reached_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    ran_.push_back({op.seq, std::this_thread::get_id(), {op.counts.begin(), op.counts.end()}});
    if (broken_) return {ErrorCode::kAborted, "aborted: test abort (op " + std::to_string(op.seq) + ")"};
    return {};
  }
  void wait_until_gate_reached() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return gate_reached_; });
  }
  void open(bool broken = false) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = broken;
    open_ = true;
    cv_.notify_all();
  }
  std::vector<Ran> ran() {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t gated_seq_;
  bool gate_reached_ = false, open_ = false, broken_ = false;
  std::vector<Ran> ran_;
};

plugin::OpDesc op_number(uint64_t seq, bool async) {
  plugin::OpDesc op;
  op.seq = seq;
  op.async = async;
  return op;
}

std::vector<uint64_t> seqs(const std::vector<Ran>& ran) {
  std::vector<uint64_t> out;
  for (const auto& r : ran) out.push_back(r.seq);
  return out;
}

TEST(OpQueue, BlockingOpWithNothingQueuedRunsOnTheCallersThreadAndReturnsItsStatus) {
  FakeBackend backend;
  OpQueue queue([&](const plugin::OpDesc& op) -> Status {
    backend.execute(op);
    return {ErrorCode::kTimeout, "op " + std::to_string(op.seq)};
  });
  std::unique_ptr<plugin::Work> work;
  const Status s = queue.submit(op_number(7, false), &work);
  EXPECT_EQ(s.code, ErrorCode::kTimeout);
  EXPECT_EQ(s.message, "op 7");
  EXPECT_EQ(work, nullptr) << "a blocking op has no Work";
  const auto ran = backend.ran();
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_EQ(ran[0].thread, std::this_thread::get_id());
}

TEST(OpQueue, AsyncOpsRunInSubmissionOrderOnTheWorkerWithTheirOwnCopyOfTheCallersSpans) {
  FakeBackend backend(/*gated_seq=*/1);
  OpQueue queue([&](const plugin::OpDesc& op) { return backend.execute(op); });
  std::vector<std::unique_ptr<plugin::Work>> works(5);
  std::vector<size_t> counts = {10, 20, 30};
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    plugin::OpDesc op = op_number(seq, true);
    op.counts = counts;
    ASSERT_TRUE(queue.submit(op, &works[seq - 1]).is_ok());
    ASSERT_NE(works[seq - 1], nullptr) << "op " << seq;
  }
  backend.wait_until_gate_reached();
  counts = {0, 0, 0};  // the caller reuses its buffer once submit returned
  EXPECT_FALSE(works[4]->is_completed()) << "op 5 completed while op 1 was still running";
  backend.open();
  for (auto& w : works) EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  const auto ran = backend.ran();
  EXPECT_EQ(seqs(ran), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  for (const auto& r : ran) {
    EXPECT_NE(r.thread, std::this_thread::get_id()) << "op " << r.seq << " ran on the submitting thread";
    EXPECT_EQ(r.counts, (std::vector<size_t>{10, 20, 30})) << "op " << r.seq;
  }
}

TEST(OpQueue, BlockingOpWaitsForTheAsyncOpsSubmittedBeforeIt) {
  FakeBackend backend(/*gated_seq=*/1);
  OpQueue queue([&](const plugin::OpDesc& op) { return backend.execute(op); });
  std::unique_ptr<plugin::Work> first, second;
  ASSERT_TRUE(queue.submit(op_number(1, true), &first).is_ok());
  ASSERT_TRUE(queue.submit(op_number(2, true), &second).is_ok());
  backend.wait_until_gate_reached();
  std::thread::id submitter;
  bool earlier_ops_done_when_it_returned = false;
  std::thread caller([&] {
    submitter = std::this_thread::get_id();
    std::unique_ptr<plugin::Work> none;
    EXPECT_TRUE(queue.submit(op_number(3, false), &none).is_ok());
    earlier_ops_done_when_it_returned = first->is_completed() && second->is_completed();
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(seqs(backend.ran()), std::vector<uint64_t>{}) << "the blocking op ran before op 1 finished";
  backend.open();
  caller.join();
  const auto ran = backend.ran();
  EXPECT_EQ(seqs(ran), (std::vector<uint64_t>{1, 2, 3}));
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[2].thread, submitter) << "the blocking op ran on another thread than its caller's";
  EXPECT_TRUE(earlier_ops_done_when_it_returned);
}

TEST(OpQueue, StopAndJoinAfterAnAbortCompletesEveryQueuedOpWithTheError) {
  FakeBackend backend(/*gated_seq=*/1);
  OpQueue queue([&](const plugin::OpDesc& op) { return backend.execute(op); });
  std::vector<std::unique_ptr<plugin::Work>> works(4);
  for (uint64_t seq = 1; seq <= 4; ++seq) ASSERT_TRUE(queue.submit(op_number(seq, true), &works[seq - 1]).is_ok());
  backend.wait_until_gate_reached();
  backend.open(/*broken=*/true);  // what abort does: the running op and every later one fail
  queue.stop_and_join();
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    ASSERT_TRUE(works[seq - 1]->is_completed()) << "op " << seq << " was left behind by stop_and_join";
    const Status s = works[seq - 1]->wait(WaitMode::kBlocking);
    EXPECT_EQ(s.code, ErrorCode::kAborted) << "op " << seq;
    EXPECT_EQ(s.message, "aborted: test abort (op " + std::to_string(seq) + ")");
  }
  EXPECT_EQ(seqs(backend.ran()), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(OpQueue, AnAsyncOpAfterStopAndJoinStartsANewWorker) {
  FakeBackend backend;
  OpQueue queue([&](const plugin::OpDesc& op) { return backend.execute(op); });
  std::unique_ptr<plugin::Work> before, after;
  ASSERT_TRUE(queue.submit(op_number(1, true), &before).is_ok());
  queue.stop_and_join();
  EXPECT_TRUE(before->is_completed());
  ASSERT_TRUE(queue.submit(op_number(2, true), &after).is_ok());
  EXPECT_TRUE(after->wait(WaitMode::kBlocking).is_ok());
  EXPECT_EQ(seqs(backend.ran()), (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace comms::cpu_algorithms
