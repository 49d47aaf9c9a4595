// The exit barrier of a multi-node job.
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdlib>

#include "comms/error.h"
#include "comms/store.h"
#include "launcher.h"
#include "util/strutil.h"

namespace commsrun {

namespace str = comms::str;

// Node 0's store must outlive the ranks of every node, so each node
// reports its exit status under "commsrun/node_exit/<node>", and node 0
// (when its own ranks succeeded) waits for all of them before the store
// goes. A failed node 0 does not wait: its store vanishing is what tells
// the other nodes' ranks, at once, that the job is over.
int Launcher::exit_barrier(int code, uint16_t store_port) {
  const std::string prefix = "commsrun/node_exit/";
  std::shared_ptr<comms::Store> store;
  try {
    store = comms::connect_tcp_store(options_.master_addr, store_port, std::chrono::seconds(5),
                                     options_.store_token);
    store->set(prefix + std::to_string(options_.node_rank), std::to_string(code));
  } catch (const comms::Error& e) {
    say(str::cat("could not report node ", options_.node_rank, "'s exit to the store: ", e.what()));
    return code;
  }
  if (options_.node_rank != 0 || code != 0) return code;

  std::vector<std::string> keys;
  for (int node = 0; node < options_.nnodes; ++node) keys.push_back(prefix + std::to_string(node));
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(options_.exit_barrier_s));
  try {
    if (!store->check(keys)) {
      say(str::cat("waiting up to ", seconds_text(options_.exit_barrier_s),
                       " s for the other nodes to finish (their store lives here)"));
    }
    // In slices, so that a signal still ends the wait.
    while (true) {
      try {
        store->wait(keys, std::chrono::seconds(1));
        break;
      } catch (const comms::Error& e) {
        if (e.code() != comms::ErrorCode::kTimeout) throw;
      }
      if (int sig = pending_stop_signal()) {
        say(str::cat("received ", signal_name(sig), " while waiting for the other nodes; closing the store"));
        return 128 + sig;
      }
      if (Clock::now() >= deadline) {
        say(str::cat("the other nodes did not all finish within ", seconds_text(options_.exit_barrier_s),
                         " s; closing the store"));
        return 1;
      }
    }
    for (int node = 1; node < options_.nnodes; ++node) {
      std::string status = store->get(keys[node], std::chrono::seconds(5));
      if (status != "0") {
        say(str::cat("node ", node, " exited with status ", status));
        if (code == 0) code = std::atoi(status.c_str());
      }
    }
  } catch (const comms::Error& e) {
    say(str::cat("waiting for the other nodes failed: ", e.what()));
    return 1;
  }
  return code;
}

// SIGINT, SIGTERM or SIGHUP received since the ranks ended, else 0.
int Launcher::pending_stop_signal() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
    if (info.ssi_signo != SIGCHLD) return static_cast<int>(info.ssi_signo);
  }
  return 0;
}

}  // namespace commsrun
