// The registry of live recorders, dumps, and the watcher thread. The watcher
// polls the job's store every kPollPeriod for a culprit search request (one
// counter read) and answers it for every comm of this process; it runs the
// tick hook (elastic recovery's heartbeats and revocations) every
// kTickPeriod; it also turns SIGUSR1 (through a self-pipe, the only thing
// the handler touches) into dumps. At exit it is woken and joined before libcrypto's exit-time
// cleanup (see start_watcher); the registry itself is leaked, as exit-time
// destructors may still run while the watcher does.
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "config/env.h"
#include "util/log.h"
#include "util/strutil.h"
#include "trace/culprit.h"
#include "trace/service.h"
#include "comms/trace.h"

namespace comms::trace {

namespace {

constexpr auto kPollPeriod = std::chrono::milliseconds(500);
// The tick hook (elastic recovery's heartbeats and revocations) runs this often.
constexpr auto kTickPeriod = std::chrono::milliseconds(100);
std::atomic<void (*)()> tick_hook{nullptr};
constexpr int64_t kRecentRequests = 2;

struct Registry {
  std::mutex mu;
  std::atomic<bool> stopping{false};
  std::atomic<bool> done{false};  // the watcher has left its loop
  std::vector<std::weak_ptr<Recorder>> recorders;
  bool watcher_started = false;
  std::thread watcher;
  pid_t watcher_pid = 0;  // a forked child has the object but not the thread
  // The self-pipe: atomics, as the signal handler may run on any thread.
  std::atomic<int> wake_read{-1}, wake_write{-1};
};

Registry& registry() {
  static Registry* r = new Registry;  // leaked: see the file comment
  return *r;
}

std::vector<std::shared_ptr<Recorder>> live() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<std::shared_ptr<Recorder>> out;
  std::erase_if(reg.recorders, [&](const std::weak_ptr<Recorder>& w) {
    auto r = w.lock();
    if (!r) return true;
    out.push_back(std::move(r));
    return false;
  });
  return out;
}

void wake_watcher() {
  const int saved = errno;
  const char byte = 'U';
  [[maybe_unused]] ssize_t n = ::write(registry().wake_write.load(), &byte, 1);
  errno = saved;
}

void on_sigusr1(int) { wake_watcher(); }

// SIGUSR1 dumps only when there is somewhere to dump to, and never replaces
// a handler the program installed.
void install_sigusr1() {
  if (!env::get("COMMS_TRACE_DIR")) return;
  struct sigaction old {};
  if (::sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
}

// Per store: the last request number seen, and whether it still answers.
struct StoreWatch {
  int64_t seen = -1;
  int failures = 0;
};
// Keyed by the store object's ownership, not its address: a new store made
// where a freed one was starts unseen, with its own request numbers.
using StoreWatches = std::map<std::weak_ptr<Store>, StoreWatch, std::owner_less<>>;

void answer_requests(StoreWatches& watches) {
  std::map<std::shared_ptr<Store>, std::vector<std::shared_ptr<Recorder>>, std::owner_less<>> by_store;
  for (auto& r : live()) {
    if (r->info().store) by_store[r->info().store].push_back(r);
  }
  std::erase_if(watches, [](const auto& w) { return w.first.expired(); });
  for (auto& [store, recorders] : by_store) {
    StoreWatch& w = watches[store];
    if (w.failures >= 3) continue;  // the store is gone (the job is ending)
    int64_t now = 0;
    try {
      now = store->add(kRequestKey, 0);
      w.failures = 0;
    } catch (const std::exception&) {
      ++w.failures;
      continue;
    }
    // First sight of this store: a request made just before (by a comm that
    // timed out within a poll period of its creation) still gets answers;
    // older ones at most cost a dump.
    if (w.seen < 0) w.seen = std::max<int64_t>(0, now - kRecentRequests);
    if (now <= w.seen) continue;
    for (int64_t req = w.seen + 1; req <= now; ++req) {
      for (auto& r : recorders) publish_progress(*r, req);
    }
    w.seen = now;
    for (auto& r : recorders) dump(*r, "another rank timed out");
  }
}

void watch() {
  StoreWatches watches;
  Registry& reg = registry();
  const int fd = reg.wake_read.load();
  auto next_answer = std::chrono::steady_clock::now();
  while (!reg.stopping.load()) {
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(kTickPeriod.count()));
    if (reg.stopping.load()) break;
    if (n > 0 && (p.revents & POLLIN)) {
      char buf[64];
      if (::read(fd, buf, sizeof(buf)) > 0) dump_all("SIGUSR1");
    }
    if (auto hook = tick_hook.load()) hook();
    if (std::chrono::steady_clock::now() < next_answer) continue;
    answer_requests(watches);
    next_answer = std::chrono::steady_clock::now() + kPollPeriod;
  }
  reg.done = true;
}

// At exit: wakes the watcher and joins it, so that its thread has ended, and
// its thread-local state (libcrypto's, from a store connection of its own)
// been freed, before exit-time cleanup. A store call in progress normally
// ends in milliseconds; one stuck on an unresponsive store is not waited
// for beyond kExitWait (the thread is then left to the process's end):
// a rank whose store host is gone must still exit promptly (multihost's
// link-down test ended 0.8 s late with a 1 s wait).
constexpr auto kExitWait = std::chrono::milliseconds(200);

void stop_watcher() {
  Registry& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mu);  // start_watcher may have run on another thread
    if (!reg.watcher.joinable() || reg.watcher_pid != ::getpid() ||
        reg.watcher.get_id() == std::this_thread::get_id()) {
      return;
    }
  }
  reg.stopping = true;
  wake_watcher();
  const auto give_up = std::chrono::steady_clock::now() + kExitWait;
  // Polled, not a timed wait: std's timed waits use pthread's clock calls,
  // and ThreadSanitizer misread pthread_mutex_clocklock (an unbalanced unlock).
  while (!reg.done.load()) {
    if (std::chrono::steady_clock::now() >= give_up) {
      reg.watcher.detach();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  reg.watcher.join();
}

void start_watcher(Registry& reg) {
  if (reg.watcher_started) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    log::warning("comms trace: no pipe for the watcher thread; other ranks' timeouts will not name this rank's progress");
    return;
  }
  reg.wake_read = fds[0];
  reg.wake_write = fds[1];
  reg.watcher_started = true;
  // libcrypto registers its exit-time cleanup on first use, which may be the
  // watcher's own (a spare store connection authenticates). Initialising it
  // now registers that cleanup before stop_watcher, so stop_watcher runs
  // first (atexit runs in reverse): libcrypto frees its global state after
  // the watcher's thread-local state, not under a running watcher.
  OPENSSL_init_crypto(0, nullptr);
  std::atexit(stop_watcher);
  install_sigusr1();
  reg.watcher_pid = ::getpid();
  reg.watcher = std::thread(watch);
}

std::string file_name(const CommInfo& info) {
  std::string name = info.name;
  for (char& c : name) {
    if (c == '/' || c == '\\' || c == ' ' || c == ':') c = '_';
  }
  return str::cat(name, ".rank", info.rank, ".json");
}

}  // namespace

std::shared_ptr<Recorder> register_comm(CommInfo info) {
  detail_checks();  // a malformed COMMS_DEBUG fails here, not at the first op
  auto r = std::make_shared<Recorder>(std::move(info), configured_capacity());
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::erase_if(reg.recorders, [](const std::weak_ptr<Recorder>& w) { return w.expired(); });
  reg.recorders.push_back(r);
  if (r->info().store && r->info().size > 1) start_watcher(reg);
  return r;
}

void set_tick_hook(void (*hook)()) { tick_hook.store(hook); }

void start_watcher() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  start_watcher(reg);
}

bool dump(const Recorder& recorder, const std::string& reason) {
  const auto dir = env::get("COMMS_TRACE_DIR");
  if (!dir || dir->empty()) return false;
  try {
    std::filesystem::create_directories(*dir);
    const std::filesystem::path path = std::filesystem::path(*dir) / file_name(recorder.info());
    const std::filesystem::path tmp = path.string() + str::cat(".tmp", ::getpid());
    {
      std::ofstream out(tmp);
      out << recorder.to_json(reason) << "\n";
      if (!out) throw std::runtime_error("write failed");
    }
    std::filesystem::rename(tmp, path);  // readers never see half a dump
    return true;
  } catch (const std::exception& e) {
    log::error(str::cat("comms trace: cannot dump comm '", recorder.info().name, "' to ", *dir, ": ", e.what()));
    return false;
  }
}

int dump_all(const std::string& reason) {
  int written = 0;
  for (auto& r : live()) written += dump(*r, reason) ? 1 : 0;
  return written;
}

}  // namespace comms::trace

namespace comms {
int dump_traces() { return trace::dump_all("comms::dump_traces()"); }
}  // namespace comms
