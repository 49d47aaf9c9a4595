// Runs under commsrun for the fault tests. Modes:
//   kill   the last rank SIGKILLs itself in the middle of a stream of
//          all_reduces; the others must get an error, not hang.
//   skip   the last rank skips one all_reduce; the others must time out
//          within the op timeout.
//   abort  rank 0 aborts its comm while an op is in flight; wait() must
//          throw kAborted promptly.
//   close  the last rank finalizes its comm between two all_reduces and
//          lives on; the others write to reset connections, which must give
//          them peer_failure.
//   late-sender  the last rank joins a stream of 16 KiB gathers to rank 0
//          1 s late; each rank prints how many gathers it finished in the
//          first 0.5 s, and the root how many values it got wrong.
//   exit-without-shutdown  groups are created, an async op is left in
//          flight, and main returns without shutdown: the process must
//          still exit promptly.
//   window-kill  every rank registers a window; the last rank SIGKILLs
//          itself 0.3 s after a barrier, while rank 0 waits for its signal;
//          the others put to it after it died: all get peer_failure naming it.
//          FAULT_WINDOW_MEMORY=backend: the window and the source come from
//          the comm's allocator (alloc_backend_memory).
//   zero-copy-kill  every rank runs 16 MiB all_reduces on buffers from the
//          comm's allocator (the UCX zero-copy path); after the first op the
//          last rank SIGKILLs itself from a second thread, while ops run:
//          the others must get peer_failure naming it. Each survivor first
//          prints "ZEROCOPY rank <r> ops <n>": what describe() counted.
//   abort-peer sync|async  rank 1 aborts its comm (and lives on) while the
//          others wait for it in an all_to_all: on the sync mesh (the CPU
//          algorithms read each peer's socket) or, given a timeout of its
//          own, on Gloo's collectives. Only rank 1's shut sockets tell them.
// Survivors print "FAULT rank <r> code <code> after_ms <ms> comm <c> op <o>
// seq <s> peer <p>: <message>" (the comms::Error's fields) and
// exit 3. SIGTERM is ignored so commsrun's stop signal cannot race the report.
// FAULT_BACKEND picks the backend (default cpu:gloo).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

using namespace comms;
using Clock = std::chrono::steady_clock;

int report(const Error& e, Clock::time_point since) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
  std::printf("FAULT rank %d code %s after_ms %lld comm %s op %s seq %llu peer %d: %s\n", e.rank(),
              std::string(to_string(e.code())).c_str(), static_cast<long long>(ms), e.comm().c_str(),
              e.op().c_str(), static_cast<unsigned long long>(e.seq()), e.peer(), e.what());
  std::fflush(stdout);
  return 3;
}

int main(int argc, char** argv) {
  signal(SIGTERM, SIG_IGN);
  const std::string mode = argc > 1 ? argv[1] : "kill";
  if (mode == "exit-without-shutdown") {
    dist::InitOptions init;
    init.device = Device::cpu();
    dist::Group w = dist::init_process_group(init);
    std::vector<int> all(static_cast<size_t>(w.size()));
    for (int r = 0; r < w.size(); ++r) all[static_cast<size_t>(r)] = r;
    dist::Group g = dist::new_group(all);
    static std::vector<float> y(4096, 1.0f);
    OpOptions async;
    async.async = true;
    g->all_reduce(BufferView::of(y), ReduceOp::sum(), async);  // never waited for
    std::printf("returning from main without shutdown\n");
    return 0;
  }
  const char* chosen = std::getenv("FAULT_BACKEND");
  const std::string backend = chosen && *chosen ? chosen : "cpu:gloo";
  auto world = new_comm(backend, Device::cpu(), "world");
  const int last = world->size() - 1;
  std::vector<float> x(1024, 1.0f);
  if (mode == "kill") {
    auto start = Clock::now();
    try {
      for (int i = 0; i < 100000; ++i) {
        if (world->rank() == last && i == 20) raise(SIGKILL);
        start = Clock::now();
        world->all_reduce(BufferView::of(x), ReduceOp::max());
      }
    } catch (const Error& e) {
      return report(e, start);
    }
    std::printf("no error on rank %d\n", world->rank());
    return 0;
  }
  if (mode == "window-kill") {
    const char* memory = std::getenv("FAULT_WINDOW_MEMORY");
    const bool from_backend = memory && std::string(memory) == "backend";
    std::vector<uint8_t> plain_mine(4096, 0), plain_src(4096, 1);
    uint8_t* mine = plain_mine.data();
    uint8_t* src = plain_src.data();
    if (from_backend) {  // released by the process's exit
      mine = static_cast<uint8_t*>(alloc_backend_memory(*world, Device::cpu(), 4096));
      src = static_cast<uint8_t*>(alloc_backend_memory(*world, Device::cpu(), 4096));
      std::memset(src, 1, 4096);
    }
    Window w = register_window(*world, BufferView{mine, 4096, DataType::kUint8});
    world->barrier();
    // Rank 0 is already waiting for the last rank's signal when it dies;
    // the other ranks put to it once it is gone.
    if (world->rank() == last) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    if (world->rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    auto start = Clock::now();
    try {
      if (world->rank() == 0) w.wait_signal(last, 1);
      w.put(BufferView{src, 4096, DataType::kUint8}, last, 0, /*signal=*/true);
    } catch (const Error& e) {
      return report(e, start);
    }
    std::printf("no error on rank %d\n", world->rank());
    return 0;
  }
  if (mode == "close") {
    // The other ranks write only once the close has happened (a barrier on a
    // second comm orders it), so their writes meet a reset connection.
    auto side = new_comm(backend, Device::cpu(), "side");
    for (int i = 0; i < 20; ++i) world->all_reduce(BufferView::of(x), ReduceOp::sum());
    if (world->rank() == last) {
      world->finalize();
      side->barrier();
      // Alive while the others write and report, and gone well inside the
      // test's --grace, so it is never the one commsrun kills.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return 0;
    }
    side->barrier();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the resets arrive
    const auto start = Clock::now();
    try {
      for (int i = 0; i < 100; ++i) world->all_reduce(BufferView::of(x), ReduceOp::sum());
    } catch (const Error& e) {
      return report(e, start);
    }
    std::printf("no error on rank %d\n", world->rank());
    return 0;
  }
  if (mode == "zero-copy-kill") {
    constexpr size_t kBytes = 16 << 20;
    const size_t n = kBytes / sizeof(float);
    // Released by the process's exit.
    auto* in = static_cast<float*>(alloc_backend_memory(*world, Device::cpu(), kBytes));
    auto* out = static_cast<float*>(alloc_backend_memory(*world, Device::cpu(), kBytes));
    for (size_t i = 0; i < n; ++i) in[i] = 1.0f;
    const BufferView vin{in, n, DataType::kFloat32}, vout{out, n, DataType::kFloat32};
    world->all_reduce(vin, vout, ReduceOp::sum());
    std::thread killer;
    if (world->rank() == last) {
      killer = std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        raise(SIGKILL);
      });
    }
    auto start = Clock::now();
    try {
      for (int i = 0; i < 100000; ++i) {
        start = Clock::now();
        world->all_reduce(vin, vout, ReduceOp::sum());
      }
    } catch (const Error& e) {
      const auto config = nlohmann::json::parse(world->describe())["backends"]["cpu"]["config"];
      std::printf("ZEROCOPY rank %d ops %lld\n", world->rank(),
                  static_cast<long long>(config["zero_copy"]["ops"].get<int64_t>()));
      return report(e, start);
    }
    std::printf("no error on rank %d\n", world->rank());
    return 0;
  }
  if (mode == "late-sender") {
    constexpr int kOps = 400;
    constexpr size_t kFloats = 4096;  // 16 KiB: over UCX an eager message
    std::vector<float> mine(kFloats), all(kFloats * static_cast<size_t>(world->size()));
    auto value = [](int rank, int op, size_t k) { return static_cast<float>(rank * 100000 + op * 16 + k % 16); };
    // The comm's creation lined the ranks up; the late one starts 1 s after.
    const auto surely_not_started = Clock::now() + std::chrono::milliseconds(500);
    if (world->rank() == last) std::this_thread::sleep_for(std::chrono::seconds(1));
    int early = 0;
    long wrong = 0;
    for (int i = 0; i < kOps; ++i) {
      for (size_t k = 0; k < kFloats; ++k) mine[k] = value(world->rank(), i, k);
      world->gather(BufferView::of(mine), BufferView::of(all), 0);
      if (world->rank() == 0) {
        for (int r = 0; r < world->size(); ++r) {
          for (size_t k = 0; k < kFloats; ++k) wrong += all[static_cast<size_t>(r) * kFloats + k] != value(r, i, k);
        }
      }
      if (Clock::now() < surely_not_started) ++early;
    }
    std::printf("LATESENDER rank %d early %d wrong %ld\n", world->rank(), early, wrong);
    return 0;
  }
  if (mode == "skip") {
    world->all_reduce(BufferView::of(x), ReduceOp::sum());
    if (world->rank() == last) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // stopped by commsrun
      return 0;
    }
    const auto start = Clock::now();
    try {
      world->all_reduce(BufferView::of(x), ReduceOp::sum());
    } catch (const Error& e) {
      return report(e, start);
    }
    std::printf("no error on rank %d\n", world->rank());
    return 0;
  }
  if (mode == "abort-peer") {
    world->barrier();
    if (world->rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the others are waiting now
      world->abort("test abort of rank 1");
      std::printf("ABORTED rank 1\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(20));  // alive: its exit would close the sockets too
      return 0;
    }
    const size_t n = static_cast<size_t>(world->size());
    std::vector<float> in(64 * n, 1.0f), out(64 * n);
    OpOptions opts;
    if (argc > 2 && std::string(argv[2]) == "async") {
      opts.timeout = std::chrono::seconds(30);  // not the comm's: Gloo's collective on the async mesh
    }
    const auto start = Clock::now();
    try {
      world->all_to_all(BufferView::of(in), BufferView::of(out), opts);
    } catch (const Error& e) {
      return report(e, start);
    }
    std::printf("no error on rank %d\n", world->rank());
    return 0;
  }
  if (mode == "abort") {
    if (world->rank() != 0) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return 0;
    }
    OpOptions async;
    async.async = true;
    Work w = world->all_reduce(BufferView::of(x), ReduceOp::sum(), async);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      world->abort("test abort");
    });
    const auto start = Clock::now();
    int rc = 0;
    try {
      w.wait();
      std::printf("no error on rank 0\n");
    } catch (const Error& e) {
      rc = report(e, start);
    }
    aborter.join();
    // Later ops fail fast with the same cause.
    try {
      world->barrier();
    } catch (const Error& e) {
      std::printf("AFTER code %s: %s\n", std::string(to_string(e.code())).c_str(), e.what());
    }
    std::fflush(stdout);
    return rc;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
