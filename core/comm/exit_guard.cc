#include "comm/exit_guard.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include "comm/comm_impl.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::internal {
namespace {

struct LiveComms {
  std::mutex mu;
  std::set<Comm::Impl*> impls;
  bool exiting = false;
};

LiveComms& live() {
  static auto* l = new LiveComms();  // never destroyed: exit handlers use it
  return *l;
}

void abort_live_comms() {
  auto& l = live();
  // Held throughout, so no comm can be destroyed under us; finalize()
  // only joins backend threads, which never take this lock.
  std::lock_guard<std::mutex> lock(l.mu);
  if (l.exiting) return;
  l.exiting = true;
  for (Comm::Impl* impl : l.impls) {
    log::info(str::cat("comm '", impl->config().name,
                       "' is still alive at exit: aborting its in-flight ops and closing it "
                       "(finalize() it, or dist::destroy_process_group(), before exit)"));
    try {
      impl->abort("the process is exiting");
      impl->finalize();
    } catch (const std::exception& e) {
      log::warning(str::cat("closing comm '", impl->config().name, "' at exit: ", e.what()));
    }
  }
}

// glibc's exit() runs the exiting thread's thread_local destructors before
// any atexit handler or static destructor, so this fires first when main
// returns. (A pthread_exit of the main thread while others run on would
// fire it too: such a program must finalize its comms first.)
struct MainThreadExitHook {
  ~MainThreadExitHook() { abort_live_comms(); }
};

void plant_exit_hooks() {
  // The atexit handler covers comms created only on other threads; it runs
  // after the destructors of statics constructed after the first comm.
  static const bool registered = [] { return std::atexit(abort_live_comms) == 0; }();
  (void)registered;
  if (::syscall(SYS_gettid) == ::getpid()) {
    thread_local MainThreadExitHook hook;
    (void)hook;
  }
}

}  // namespace

void track_live_comm(Comm::Impl* impl) {
  plant_exit_hooks();
  auto& l = live();
  std::lock_guard<std::mutex> lock(l.mu);
  l.impls.insert(impl);
}

void untrack_live_comm(Comm::Impl* impl) {
  auto& l = live();
  std::lock_guard<std::mutex> lock(l.mu);
  l.impls.erase(impl);
}

}  // namespace comms::internal
