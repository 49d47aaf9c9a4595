// Bad calls fail on the rank that made them with invalid_argument or
// unsupported, and leave the comm usable; a missing peer times out; abort
// interrupts an op in flight; comms come and go without leaking.
#include <dirent.h>

#include <atomic>
#include <thread>

#include "harness.h"

namespace comms::conformance {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool on_cuda(const CaseContext& cx) { return cx.memory.device().type == DeviceType::kCuda; }

// The op after a rejected call must work: a small all_reduce, checked.
void expect_usable(CaseContext& cx, const std::string& after) {
  try {
    Buf b(cx.memory, DataType::kInt32, 3);
    for (size_t i = 0; i < 3; ++i) b.set(i, cx.comm.rank() + 1 + i);
    cx.comm.all_reduce(b.view(), ReduceOp::sum(), op_options(cx.memory));
    const int n = cx.comm.size();
    cx.check.values(b, 0, 3, {"all_reduce", DataType::kInt32, "sum", 3, -1, "sync", "the op after " + after},
                    [&](size_t i) { return n * (n + 1) / 2.0 + n * double(i); });
  } catch (const Error& e) {
    cx.check.fail("the op after " + after + " failed: " + e.what());
  }
}

// Makes the bad call synchronously and asynchronously; both must fail with
// one of `codes`, at the call or at wait().
void expect_rejected(CaseContext& cx, const std::string& what, std::initializer_list<ErrorCode> codes,
                     const std::function<Work(Comm&, const OpOptions&)>& call) {
  for (bool async : {false, true}) {
    const OpOptions o = op_options(cx.memory, async);
    const std::string label = what + (async ? " (async)" : " (sync)");
    try {
      call(cx.comm, o).wait();
      cx.check.fail(label + " was accepted; expected an error");
    } catch (const Error& e) {
      bool expected = false;
      for (ErrorCode c : codes) expected |= e.code() == c;
      if (!expected) {
        cx.check.fail(label + " failed with " + std::string(to_string(e.code())) +
                      "; expected invalid_argument or unsupported: " + e.what());
      }
    }
    expect_usable(cx, label);
  }
}

constexpr auto kInvalid = ErrorCode::kInvalidArgument;
constexpr auto kUnsupported = ErrorCode::kUnsupported;

int open_fd_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

// Runs `body` on a comm made for this case alone (a failed op marks its comm
// failed, and the world must stay healthy).
std::shared_ptr<Comm> dedicated(Comm& world, const std::string& name, std::chrono::milliseconds op_timeout) {
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  SplitOptions so;
  so.op_timeout = op_timeout;
  return world.split(all, name, so);
}

void destroy(CaseContext& cx, std::shared_ptr<Comm>& c, bool expect_clean) {
  if (!c) return;
  try {
    c->finalize();
  } catch (const Error& e) {
    if (expect_clean) cx.check.fail("finalize of '" + c->name() + "' failed: " + e.what());
  }
  c.reset();
}

}  // namespace

void add_error_cases(const std::string& shape, const Group& group, std::vector<Case>* cases) {
  auto add = [&](const std::string& name, std::function<void(CaseContext&)> body) {
    cases->push_back({shape + "/errors/" + name, "errors", "", std::move(body)});
  };
  (void)group;
  add("root_out_of_range", [](CaseContext& cx) {
    const int n = cx.comm.size();
    Buf a(cx.memory, DataType::kFloat32, 4), b(cx.memory, DataType::kFloat32, 4),
        big(cx.memory, DataType::kFloat32, 4 * n);
    expect_rejected(cx, "reduce with root = size", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.reduce(a.view(), b.view(), n, ReduceOp::sum(), o); });
    expect_rejected(cx, "broadcast with root -1", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.broadcast(a.view(), -1, o); });
    expect_rejected(cx, "gather with root = size", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.gather(a.view(), big.view(), n, o); });
    expect_rejected(cx, "scatter with root = size", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.scatter(big.view(), a.view(), n, o); });
  });
  add("mismatched_counts", [](CaseContext& cx) {
    const int n = cx.comm.size();
    Buf four(cx.memory, DataType::kInt32, 4), five(cx.memory, DataType::kInt32, 5),
        gathered(cx.memory, DataType::kInt32, 4 * n + 1);
    expect_rejected(cx, "all_reduce with output count != input count", {kInvalid}, [&](Comm& c, const OpOptions& o) {
      return c.all_reduce(four.view(), five.view(), ReduceOp::sum(), o);
    });
    expect_rejected(cx, "all_gather with output count != size * input count", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.all_gather(four.view(), gathered.view(), o); });
    expect_rejected(cx, "reduce_scatter with input count != size * output count", {kInvalid},
                    [&](Comm& c, const OpOptions& o) {
                      return c.reduce_scatter(gathered.view(), four.view(), ReduceOp::sum(), o);
                    });
    std::vector<size_t> short_counts(n > 1 ? n - 1 : 2, 1);
    expect_rejected(cx, "all_gather_v with one count per rank missing", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.all_gather_v(four.view(), gathered.view(), short_counts, o); });
  });
  add("null_buffer_with_count", [](CaseContext& cx) {
    const BufferView null4{nullptr, 4, DataType::kFloat32, cx.memory.device()};
    Buf out(cx.memory, DataType::kFloat32, 4);
    expect_rejected(cx, "all_reduce of a null buffer with 4 elements", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.all_reduce(null4, ReduceOp::sum(), o); });
    expect_rejected(cx, "all_reduce into a null output with 4 elements", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.all_reduce(out.view(), null4, ReduceOp::sum(), o); });
    expect_rejected(cx, "broadcast of a null buffer with 4 elements", {kInvalid},
                    [&](Comm& c, const OpOptions& o) { return c.broadcast(null4, 0, o); });
  });
  add("wrong_device", [](CaseContext& cx) {
    // Host buffers, whatever the suite's device.
    Buf in(DataType::kFloat32, 4), out(DataType::kFloat32, 4);
    // The library must refuse before touching it: it is host memory labelled cuda.
    BufferView mislabelled = out.view();
    mislabelled.device = cx.memory.device().type == DeviceType::kCuda ? cx.memory.device() : Device::cuda(0);
    expect_rejected(cx, "all_reduce with input on cpu and output on cuda", {kInvalid, kUnsupported},
                    [&](Comm& c, const OpOptions& o) {
                      return c.all_reduce(in.view(), mislabelled, ReduceOp::sum(), o);
                    });
    if (!cx.comm.backends().has(DeviceType::kCuda)) {
      expect_rejected(cx, "all_reduce of a cuda buffer on a comm without a cuda backend", {kInvalid, kUnsupported},
                      [&](Comm& c, const OpOptions& o) { return c.all_reduce(mislabelled, ReduceOp::sum(), o); });
    }
    if (cx.memory.device().type == DeviceType::kCuda) {
      Buf on_device(cx.memory, DataType::kFloat32, 4);
      expect_rejected(cx, "all_reduce with input on cuda and output on cpu", {kInvalid, kUnsupported},
                      [&](Comm& c, const OpOptions& o) {
                        return c.all_reduce(on_device.view(), out.view(), ReduceOp::sum(), o);
                      });
      if (!cx.comm.backends().has(DeviceType::kCpu)) {
        expect_rejected(cx, "all_reduce of a cpu buffer on a comm without a cpu backend", {kInvalid, kUnsupported},
                        [&](Comm& c, const OpOptions& o) { return c.all_reduce(in.view(), ReduceOp::sum(), o); });
      }
    }
  });
  add("undefined_dtype_op_pair", [](CaseContext& cx) {
    Buf f(cx.memory, DataType::kFloat32, 4), b(cx.memory, DataType::kBool, 4);
    expect_rejected(cx, "all_reduce band on float32", {kInvalid, kUnsupported},
                    [&](Comm& c, const OpOptions& o) { return c.all_reduce(f.view(), ReduceOp::band(), o); });
    expect_rejected(cx, "all_reduce avg on bool", {kInvalid, kUnsupported},
                    [&](Comm& c, const OpOptions& o) { return c.all_reduce(b.view(), ReduceOp::avg(), o); });
    expect_rejected(cx, "reduce_scatter premul_sum on bool", {kInvalid, kUnsupported}, [&](Comm& c, const OpOptions& o) {
      Buf in(cx.memory, DataType::kBool, 4 * c.size());
      return c.reduce_scatter(in.view(), b.view(), ReduceOp::premul_sum(2.0), o);
    });
  });
}

void add_lifecycle_cases(int world_size, const SuiteOptions& options, std::vector<Case>* cases) {
  const int n = world_size;
  auto add = [&](const std::string& group, const std::string& name, std::string skip,
                 std::function<void(CaseContext&)> body) {
    cases->push_back({"world/" + group + "/" + name, group, std::move(skip), std::move(body)});
  };
  const std::string needs_two = n < 2 ? "needs 2 or more ranks" : "";

  add("errors", "split_with_duplicate_ranks_fails", "", [](CaseContext& cx) {
    const std::vector<int> dup = {0, 0};
    try {
      cx.world.split(dup, "conformance-dup");
      cx.check.fail("split with ranks [0,0] succeeded; expected invalid_argument");
    } catch (const Error& e) {
      if (e.code() != kInvalid) cx.check.fail(std::string("split [0,0] failed with the wrong code: ") + e.what());
      else if (std::string(e.what()).find("twice") == std::string::npos)
        cx.check.fail(std::string("split [0,0] error does not say a rank is repeated: ") + e.what());
    }
    const std::vector<std::vector<int>> overlapping = {{0}, {0}};
    try {
      cx.world.split_group(overlapping, "conformance-overlap");
      cx.check.fail("split_group with rank 0 in two groups succeeded; expected invalid_argument");
    } catch (const Error& e) {
      if (e.code() != kInvalid) cx.check.fail(std::string("split_group overlap: wrong code: ") + e.what());
    }
    expect_usable(cx, "a rejected split");
  });
  add("errors", "split_with_rank_outside_parent_fails", "", [](CaseContext& cx) {
    const int size = cx.world.size();
    const std::vector<int> outside = {size};
    try {
      cx.world.split(outside, "conformance-outside");
      cx.check.fail("split with rank " + std::to_string(size) + " succeeded; expected invalid_argument");
    } catch (const Error& e) {
      if (e.code() != kInvalid) cx.check.fail(std::string("split outside: wrong code: ") + e.what());
      else if (std::string(e.what()).find("outside") == std::string::npos)
        cx.check.fail(std::string("split outside: error does not say the rank is outside: ") + e.what());
    }
    expect_usable(cx, "a rejected split");
  });

  // The last rank never issues the op; the others must fail, not hang. A rank
  // whose own timer fires first may close its connections, so a neighbour can
  // see peer_failure from it instead: each rank accepts either, and at least
  // one rank must report the timeout itself.
  add("errors", "rank_skipping_an_op_times_out_the_others", needs_two, [](CaseContext& cx) {
    constexpr auto kTimeout = 1500ms;
    constexpr double kMarginS = 3.0;
    auto c = dedicated(cx.world, "conformance-timeout", 60s);
    const bool skipper = cx.world.rank() == cx.world.size() - 1;
    int64_t saw_timeout = 0;
    if (!skipper) {
      Buf b(cx.memory, DataType::kFloat32, 16);
      // On CUDA a synchronous op only orders the stream; the failure reaches
      // the host through blocking_wait() of an async op.
      OpOptions o = op_options(cx.memory, on_cuda(cx));
      o.timeout = kTimeout;
      const auto t0 = Clock::now();
      try {
        c->all_reduce(b.view(), ReduceOp::sum(), o).blocking_wait();
        cx.check.fail("all_reduce with a rank missing succeeded");
      } catch (const Error& e) {
        const double took = seconds_since(t0);
        saw_timeout = e.code() == ErrorCode::kTimeout;
        if (e.code() != ErrorCode::kTimeout && e.code() != ErrorCode::kPeerFailure) {
          cx.check.fail(std::string("all_reduce with a rank missing failed with ") +
                        std::string(to_string(e.code())) + ", expected timeout: " + e.what());
        } else if (took > 1.5 + kMarginS) {
          cx.check.fail("the op failed after " + std::to_string(took) + " s; its timeout is 1.5 s: " + e.what());
        }
      }
    }
    // The skipper keeps its comm open until everyone has failed, so that the
    // others see a silent peer rather than a closed connection from it.
    try {
      Buf count(cx.memory, DataType::kInt64, 1);
      count.set(0, double(saw_timeout));
      cx.world.all_reduce(count.view(), ReduceOp::sum(), op_options(cx.memory, true)).blocking_wait();
      if (count.get(0) == 0) cx.check.fail("no rank reported a timeout (all saw peer_failure)");
    } catch (const Error& e) {
      cx.check.fail(std::string("world all_reduce after the timeout failed: ") + e.what());
    }
    destroy(cx, c, false);
  });

  add("lifecycle", "abort_interrupts_an_op_in_flight", needs_two, [](CaseContext& cx) {
    auto c = dedicated(cx.world, "conformance-abort", 60s);
    // Only rank 1 issues the op, so it stays in flight until rank 1 aborts it
    // (no peer's failure can complete it first).
    if (cx.world.rank() == 1) {
      OpOptions o = op_options(cx.memory, true);
      o.timeout = 30s;
      try {
        Buf b(cx.memory, DataType::kFloat32, 16);
        Work w = c->all_reduce(b.view(), ReduceOp::sum(), o);
        std::this_thread::sleep_for(200ms);
        if (w.is_completed()) cx.check.fail("the all_reduce completed without rank 0");
        const auto t0 = Clock::now();
        std::thread aborter([&] { c->abort("conformance: abort while in flight"); });
        // Blocking: on CUDA, wait() only makes the stream wait for the op.
        try {
          w.blocking_wait();
          cx.check.fail("wait() returned normally after abort");
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kAborted)
            cx.check.fail(std::string("after abort, wait() failed with ") + std::string(to_string(e.code())) +
                          ", expected aborted: " + e.what());
          else if (seconds_since(t0) > 2.0)
            cx.check.fail("wait() took " + std::to_string(seconds_since(t0)) + " s to see the abort");
        }
        aborter.join();
        try {
          c->all_reduce(b.view(), ReduceOp::sum(), op_options(cx.memory));
          cx.check.fail("an op on the aborted comm succeeded");
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kAborted)
            cx.check.fail(std::string("an op after abort failed with ") + e.what() + ", expected aborted");
        }
      } catch (const Error& e) {
        cx.check.fail(std::string("unexpected error: ") + e.what());
      }
    }
    try {
      cx.world.barrier(op_options(cx.memory, true)).blocking_wait();
    } catch (const Error& e) {
      cx.check.fail(std::string("world barrier after abort failed: ") + e.what());
    }
    destroy(cx, c, false);
  });

  const int how_many = options.quick ? 20 : 100;
  add("lifecycle", std::to_string(how_many) + "_comms_created_and_destroyed_keep_fds_stable", "",
      [how_many](CaseContext& cx) {
        auto make_use_destroy = [&](int i) {
          auto c = dedicated(cx.world, "conformance-life-" + std::to_string(i), 60s);
          Buf b(cx.memory, DataType::kInt64, 1);
          b.set(0, 1);
          c->all_reduce(b.view(), ReduceOp::sum(), op_options(cx.memory));
          cx.check.values(b, 0, 1, {"all_reduce", DataType::kInt64, "sum", 1, -1, "sync", "comm #" + std::to_string(i)},
                          [&](size_t) { return c->size(); });
          destroy(cx, c, true);
        };
        try {
          make_use_destroy(-1);  // warm-up: one-time allocations are not leaks
          const int before = open_fd_count();
          for (int i = 0; i < how_many; ++i) make_use_destroy(i);
          const int after = open_fd_count();
          if (after != before) {
            cx.check.fail("open file descriptors went from " + std::to_string(before) + " to " +
                          std::to_string(after) + " over " + std::to_string(how_many) + " comms");
          }
        } catch (const Error& e) {
          cx.check.fail(std::string("creating or using a comm failed: ") + e.what());
        }
      });

  add("lifecycle", "same_name_on_different_subgroups", "", [](CaseContext& cx) {
    const int size = cx.world.size();
    std::vector<std::vector<int>> halves(size > 1 ? 2 : 1);
    for (int r = 0; r < size; ++r) halves[r % halves.size()].push_back(r);
    try {
      auto c = cx.world.split_group(halves, "conformance-twin");
      if (!c) {
        cx.check.fail("split_group returned null for a member");
        return;
      }
      const auto& mine = halves[cx.world.rank() % halves.size()];
      Buf b(cx.memory, DataType::kInt64, 1);
      b.set(0, cx.world.rank() + 1);
      c->all_reduce(b.view(), ReduceOp::sum(), op_options(cx.memory));
      double want = 0;
      for (int r : mine) want += r + 1;
      cx.check.values(b, 0, 1, {"all_reduce", DataType::kInt64, "sum", 1, -1, "sync", "sum over my half"},
                      [&](size_t) { return want; });
      destroy(cx, c, true);
    } catch (const Error& e) {
      cx.check.fail(std::string("unexpected error: ") + e.what());
    }
  });

  add("lifecycle", "concurrent_ops_on_two_comms", "", [](CaseContext& cx) {
    std::shared_ptr<Comm> comms[2];
    // The second thread gets a stream of its own: on one stream, each
    // thread's op would wait for the other's, in a different order on each
    // rank, and deadlock.
    std::unique_ptr<DeviceMemory> second;
    try {
      comms[0] = dedicated(cx.world, "conformance-concurrent-a", 60s);
      comms[1] = dedicated(cx.world, "conformance-concurrent-b", 60s);
      second = cx.memory.with_own_stream();
    } catch (const Error& e) {
      cx.check.fail(std::string("split or stream creation failed: ") + e.what());
      return;  // every rank gets the same split error
    }
    DeviceMemory* memories[2] = {&cx.memory, second.get()};
    Checker checkers[2] = {Checker(cx.check.world_rank(), cx.world.rank()),
                           Checker(cx.check.world_rank(), cx.world.rank())};
    auto loop = [&](int k) {
      Comm& c = *comms[k];
      const int n = c.size();
      for (int iter = 0; iter < 30; ++iter) {
        Buf b;
        try {
          b = Buf(*memories[k], DataType::kInt32, 1024);
          for (size_t i = 0; i < 1024; ++i) b.set(i, (k + 1) * (c.rank() + 1) + int(i) + iter);
          c.all_reduce(b.view(), ReduceOp::sum(), op_options(*memories[k]));
        } catch (const Error& e) {
          checkers[k].fail(std::string("comm ") + c.name() + ": " + e.what());
          return;
        }
        checkers[k].values(b, 0, 1024, {"all_reduce", DataType::kInt32, "sum", 1024, -1, "thread " + std::to_string(k), c.name()},
                           [&](size_t i) { return (k + 1) * n * (n + 1) / 2.0 + n * double(i + iter); });
      }
    };
    std::thread other(loop, 1);
    loop(0);
    other.join();
    for (auto& ck : checkers) cx.check.merge(ck);
    for (auto& c : comms) destroy(cx, c, true);
  });
}

}  // namespace comms::conformance
