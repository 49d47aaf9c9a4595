// Runs under commsrun for the flight-recorder tests. Modes:
//   skip   every rank runs all_reduces; the last rank never enters the 5th
//          (it sleeps until commsrun stops it). The others must time out
//          naming it.
//   count  rank 1 passes 1000 elements to the 3rd all_reduce, the others
//          1024; then every rank dumps its traces.
//   count-ring  the same with 65536 and 65000 elements (the ring path).
//   kill   the last rank SIGKILLs itself before its 21st all_reduce.
//   pipeline  before each all_reduce rank 0 sends rank 1 two messages (the
//          other ranks send nothing, so seq differs on every rank); rank 1
//          receives the fifth round's, then never enters its all_reduce.
//   usr1   after 5 all_reduces every rank sends itself SIGUSR1 and waits
//          for the recorder's watcher thread to dump.
//   exit   every rank keeps its store connection busy (a get that times
//          out) while the watcher polls, so the watcher opens connections
//          of its own (libcrypto state in its thread), then exits. An exit
//          handler that runs after libcrypto's cleanup sleeps, so that a
//          watcher still running then ends during it and its libcrypto
//          state leaks (LeakSanitizer fails the rank in the asan stage).
//   window  on cpu:ucx: every rank registers a window; rank 1 puts 64 bytes
//          into rank 0's, unsignalled; rank 0 waits for a signal from rank
//          1 that never comes (its own 300 ms timeout, far inside the comm's;
//          the comm stays usable); then a barrier, and every rank dumps its
//          traces.
// A rank whose op fails prints "FAULT rank <r> code <code> after_ms <ms>:
// <message>" and exits 3; "OK rank <r>" when every op succeeded.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comms/comms.h"

using namespace comms;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  signal(SIGTERM, SIG_IGN);
  const std::string mode = argc > 1 ? argv[1] : "skip";
  if (mode == "exit") {
    // Registered before libcomms and libcrypto register theirs: runs after them.
    std::atexit([] { std::this_thread::sleep_for(std::chrono::milliseconds(800)); });
  }
  if (mode == "window") {
    auto world = new_comm("cpu:ucx", Device::cpu(), "world");
    std::vector<unsigned char> mine(4096, 0), src(64, 7);
    Window w = register_window(*world, BufferView{mine.data(), mine.size(), DataType::kUint8});
    if (world->rank() == 1) w.put(BufferView{src.data(), src.size(), DataType::kUint8}, 0, 128);
    if (world->rank() == 1) w.flush();
    if (world->rank() == 0) {
      try {
        OpOptions opts;
        opts.timeout = std::chrono::milliseconds(300);
        w.wait_signal(1, 1, opts);
      } catch (const Error& e) {
        std::printf("WAIT rank 0 code %s\n", std::string(to_string(e.code())).c_str());
      }
    }
    world->barrier();
    std::printf("OK rank %d dumped %d\n", world->rank(), dump_traces());
    std::fflush(stdout);
    return 0;
  }
  auto world = new_comm("cpu:gloo", Device::cpu(), "world");
  const int last = world->size() - 1;
  const size_t n = mode == "count-ring" ? 65536 : 1024;
  std::vector<float> x(n, 1.0f);
  auto start = Clock::now();
  try {
    for (int i = 1; i <= (mode == "kill" ? 100000 : 5); ++i) {
      if (mode == "skip" && i == 5 && world->rank() == last) {
        std::this_thread::sleep_for(std::chrono::seconds(30));  // stopped by commsrun
        return 0;
      }
      if (mode == "kill" && i == 21 && world->rank() == last) raise(SIGKILL);
      if (mode == "pipeline") {
        start = Clock::now();
        for (int m = 0; m < 2; ++m) {
          if (world->rank() == 0) world->send(BufferView::of(x.data(), 4), 1);
          if (world->rank() == 1) world->recv(BufferView::of(x.data(), 4), 0);
        }
        if (i == 5 && world->rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // stopped by commsrun
          return 0;
        }
      }
      const bool short_rank = mode.rfind("count", 0) == 0 && i == 3 && world->rank() == 1;
      const size_t count = short_rank ? n - (n == 1024 ? 24 : 536) : n;
      start = Clock::now();
      world->all_reduce(BufferView::of(x.data(), count), ReduceOp::sum());
    }
  } catch (const Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::printf("FAULT rank %d code %s after_ms %lld: %s\n", world->rank(), std::string(to_string(e.code())).c_str(),
                static_cast<long long>(ms), e.what());
    std::fflush(stdout);
    dump_traces();
    return 3;
  }
  if (mode == "exit") {
    try {
      world->store()->get("trace-helper/never-set", std::chrono::milliseconds(1500));
    } catch (const Error&) {
    }
    std::printf("OK rank %d exits\n", world->rank());
    std::fflush(stdout);
    return 0;
  }
  if (mode == "usr1") {
    raise(SIGUSR1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::printf("OK rank %d after SIGUSR1\n", world->rank());
    std::fflush(stdout);
    return 0;
  }
  std::printf("OK rank %d dumped %d\n", world->rank(), dump_traces());
  std::fflush(stdout);
  return 0;
}
