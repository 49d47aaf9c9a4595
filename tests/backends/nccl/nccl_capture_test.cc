// Ops inside CUDA graph capture, through FakeNcclApi's capture model: the
// NCCL calls go into the graph (nothing runs, nothing is tracked), every
// launch runs them, and what cannot be captured is refused before anything
// is enqueued, leaving the comm usable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "nccl_backend_for_tests.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::Backend;
using plugin::OpDesc;
using plugin::OpType;
using testing::FakeNcclApi;
using ::testing::HasSubstr;

class NcclCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api->move_data = true;
    ASSERT_EQ(api->stream_create(&stream, 0), cudaSuccess);
  }

  std::unique_ptr<Backend> make(bool eager = true) { return testing::one_rank_backend(api, eager, 2ms); }

  // An all_reduce of `in` into `out` (host memory: the fake moves it).
  OpDesc all_reduce(const std::vector<float>& in, std::vector<float>& out, uint64_t seq,
                    bool async = true) {
    OpDesc d;
    d.type = OpType::kAllReduce;
    d.seq = seq;
    d.count = in.size();
    d.dtype = DataType::kFloat32;
    d.device = Device::cuda(0);
    d.input = in.data();
    d.output = out.data();
    d.async = async;
    d.stream = stream;
    return d;
  }

  cudaStreamCaptureStatus capture_status() {
    cudaStreamCaptureStatus st;
    EXPECT_EQ(api->stream_capture_info(stream, &st, nullptr), cudaSuccess);
    return st;
  }

  size_t executed() {
    auto l = api->lock();
    return api->executed.size();
  }

  static int64_t ops_in_flight(Backend& b) {
    return nlohmann::json::parse(b.describe())["ops_in_flight"].get<int64_t>();
  }

  std::shared_ptr<FakeNcclApi> api = std::make_shared<FakeNcclApi>();
  cudaStream_t stream = nullptr;
};

TEST_F(NcclCaptureTest, FakeCaptureBehavesLikeCuda) {
  cudaEvent_t e;
  ASSERT_EQ(api->event_create(&e), cudaSuccess);
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusNone);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive);
  ASSERT_EQ(api->event_record(e, stream), cudaSuccess);
  // Querying an event recorded in the capture is an error that invalidates it.
  EXPECT_EQ(api->event_query(e), cudaErrorCapturedEvent);
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusInvalidated);
  cudaGraph_t g;
  EXPECT_EQ(api->stream_end_capture(stream, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusNone);
  // So is synchronizing the capturing stream, and cudaMalloc.
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(api->stream_synchronize(stream), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(api->stream_end_capture(stream, &g), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* p;
  EXPECT_EQ(api->malloc_device(&p, 4), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(api->stream_end_capture(stream, &g), cudaErrorStreamCaptureInvalidated);
  // A stream forked off a capture must be joined back before it ends.
  cudaStream_t side;
  ASSERT_EQ(api->stream_create(&side, 0), cudaSuccess);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(api->event_record(e, stream), cudaSuccess);
  ASSERT_EQ(api->stream_wait_event(side, e), cudaSuccess);
  ASSERT_EQ(api->memset_async(p, 0, 4, side), cudaSuccess);
  EXPECT_EQ(api->stream_end_capture(stream, &g), cudaErrorStreamCaptureUnjoined);
}

TEST_F(NcclCaptureTest, CapturedAllReduceRunsOnEveryReplayAndNeverReachesTheWatchdog) {
  auto b = make();
  std::vector<float> in(64), out(64, -1.0f);
  const int events_before = [&] { auto l = api->lock(); return api->events_created; }();
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(all_reduce(in, out, 1), &w).is_ok());
  // Captured, not run: the output is untouched and nothing is tracked.
  EXPECT_EQ(executed(), 0u);
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(ops_in_flight(*b), 0);
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->wait(WaitMode::kStream).is_ok());
  std::this_thread::sleep_for(10ms);  // watchdog rounds during capture leave it valid
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive);
  cudaGraph_t graph;
  ASSERT_EQ(api->stream_end_capture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(api->graph_instantiate(&exec, graph), cudaSuccess);
  {
    auto l = api->lock();
    // One NCCL call, on the caller's own stream: no fork to the internal
    // stream, no events recorded or created, no stream waits.
    ASSERT_EQ(api->calls.size(), 2u);  // comm_init, all_reduce
    EXPECT_EQ(api->calls[1].name, "all_reduce");
    EXPECT_TRUE(api->calls[1].captured);
    EXPECT_EQ(api->calls[1].stream, stream);
    EXPECT_EQ(api->calls[1].count, 64u);
    EXPECT_EQ(api->calls[1].op, ncclSum);
    EXPECT_TRUE(api->stream_waits.empty());
    EXPECT_EQ(api->events_created, events_before);
  }
  constexpr int kReplays = 50;
  for (int r = 0; r < kReplays; ++r) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = float(r * 1000 + int(i));
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_EQ(api->graph_launch(exec, stream), cudaSuccess);
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], float(r * 1000 + int(i))) << "replay " << r;
  }
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(executed(), size_t{kReplays});
  EXPECT_EQ(ops_in_flight(*b), 0);
  {
    auto l = api->lock();
    EXPECT_EQ(api->calls.size(), 2u);  // replays call nothing in the plugin
  }
  EXPECT_EQ(api->graph_exec_destroy(exec), cudaSuccess);
  EXPECT_EQ(api->graph_destroy(graph), cudaSuccess);
  EXPECT_TRUE(b->finalize().is_ok());
}

TEST_F(NcclCaptureTest, SeveralOpsReplayInTheirCaptureOrderBetweenEagerOps) {
  auto b = make();
  std::vector<float> a(8, 1.0f), a_out(8), c(8, 2.0f), c_out(8);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(all_reduce(a, a_out, 1), &w).is_ok());  // eager
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  OpDesc bcast = all_reduce(c, c_out, 2, /*async=*/false);
  bcast.type = OpType::kBroadcast;
  bcast.root = 0;
  std::unique_ptr<plugin::Work> none;
  ASSERT_TRUE(b->submit(bcast, &none).is_ok());
  EXPECT_EQ(none, nullptr);  // synchronous: no Work, and nothing to order
  ASSERT_TRUE(b->submit(all_reduce(a, c_out, 3), &w).is_ok());
  cudaGraph_t graph;
  ASSERT_EQ(api->stream_end_capture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(api->graph_instantiate(&exec, graph), cudaSuccess);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(api->graph_launch(exec, stream), cudaSuccess);
  ASSERT_TRUE(b->submit(all_reduce(a, a_out, 4), &w).is_ok());  // eager again
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  std::vector<std::string> ran;
  {
    auto l = api->lock();
    for (const auto& call : api->executed) ran.push_back(call.name);
  }
  EXPECT_THAT(ran, ::testing::ElementsAre("all_reduce", "broadcast", "all_reduce", "broadcast",
                                          "all_reduce", "broadcast", "all_reduce", "all_reduce"));
  EXPECT_EQ(c_out[0], 1.0f);  // the last node of each replay wrote `a` over the broadcast
}

TEST_F(NcclCaptureTest, LazyCommIsRefusedInsideCaptureAndConnectsAtItsFirstEagerOp) {
  auto b = make(/*eager=*/false);
  std::vector<float> in(4, 3.0f), out(4);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::unique_ptr<plugin::Work> w;
  Status s = b->submit(all_reduce(in, out, 1), &w);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("all_reduce inside CUDA graph capture"));
  EXPECT_THAT(s.message, HasSubstr("does not exist yet"));
  EXPECT_EQ(w, nullptr);
  EXPECT_TRUE(api->call_names().empty());  // no init, no NCCL call, no id published
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive);  // nothing invalidated it
  cudaGraph_t graph;
  ASSERT_EQ(api->stream_end_capture(stream, &graph), cudaSuccess);
  // Usable: the next op, outside capture, connects and runs.
  ASSERT_TRUE(b->submit(all_reduce(in, out, 2), &w).is_ok());
  ASSERT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_THAT(api->call_names(), ::testing::ElementsAre("comm_init", "all_reduce"));
}

TEST_F(NcclCaptureTest, BlockingWaitOnACapturedOpIsRefusedNotAHang) {
  auto b = make();
  std::vector<float> in(4), out(4);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(all_reduce(in, out, 5), &w).is_ok());
  Status s = w->wait(WaitMode::kBlocking);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("captured into a CUDA graph"));
  EXPECT_EQ(capture_status(), cudaStreamCaptureStatusActive);
  cudaGraph_t graph;
  EXPECT_EQ(api->stream_end_capture(stream, &graph), cudaSuccess);
}

TEST_F(NcclCaptureTest, OpOnAnInvalidatedCaptureIsRefusedBeforeNccl) {
  auto b = make();
  std::vector<float> in(4), out(4);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(api->stream_synchronize(stream), cudaErrorStreamCaptureUnsupported);
  std::unique_ptr<plugin::Work> w;
  Status s = b->submit(all_reduce(in, out, 1), &w);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message, HasSubstr("invalidated"));
  EXPECT_THAT(api->call_names(), ::testing::ElementsAre("comm_init"));
}

// The README's timeout story: replays are not timed by the watchdog (it
// never sees them), but NCCL's asynchronous error, which the watchdog polls
// every round, still fails the comm, and later captures are refused.
TEST_F(NcclCaptureTest, AsyncNcclErrorDuringReplaysFailsTheCommAndLaterCaptures) {
  auto b = make();
  std::vector<float> in(4), out(4);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(b->submit(all_reduce(in, out, 1), &w).is_ok());
  cudaGraph_t graph;
  ASSERT_EQ(api->stream_end_capture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(api->graph_instantiate(&exec, graph), cudaSuccess);
  ASSERT_EQ(api->graph_launch(exec, stream), cudaSuccess);
  {
    auto l = api->lock();
    api->async_error = ncclRemoteError;  // a peer died during a replay
  }
  for (int i = 0; i < 200 && api->aborts == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(api->aborts, 1);
  ASSERT_EQ(api->stream_begin_capture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  Status s = b->submit(all_reduce(in, out, 2), &w);
  EXPECT_EQ(s.code, ErrorCode::kAborted);
  EXPECT_THAT(s.message, HasSubstr("remote process exited"));
  EXPECT_EQ(api->stream_end_capture(stream, &graph), cudaSuccess);
}

}  // namespace
}  // namespace comms::nccl
