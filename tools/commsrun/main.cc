// commsrun: starts the ranks of one node of a job, hosts the TCP store on
// node 0, prefixes every output line with the rank, and tears the whole node
// down as soon as one rank fails (with --keep-going, lets the others run on).
//
//   commsrun -n N [--master-addr A] [--master-port P] [--nnodes K --node-rank R]
//            [--timeout S] [--grace S] [--keep-going] [--exit-barrier-timeout S] [--] PROGRAM ARGS...
//   commsrun --store-only [--master-addr A] [--master-port P] [--timeout S]
//
// torchrun's spellings work too (--nproc_per_node, --master_addr, --node_rank,
// --standalone, --nproc-per-node=auto). --store-only hosts the store alone,
// for ranks started some other way (COMMS_STORE=tcp://A:P).
//
// Ranks get the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), MASTER_PORT being a free port
// left to the program's own store (torch's TCPStore), and COMMS_STORE=
// tcp://A:P, the store commsrun hosts, which comms reads first.
// The store asks every client for a token: COMMS_STORE_TOKEN or
// COMMS_STORE_TOKEN_FILE when set (the ranks inherit it), else, for a
// single-node job, a random one that only this launcher's ranks receive
// (COMMS_STORE_TOKEN in their environment). A multi-node job without a token
// runs with an open store, and says so.
// Each rank runs in its own process group, so that stopping a rank also stops
// what it started, and its stdin is /dev/null.
//
// The launcher is single-threaded apart from the store server's thread. All
// events (output, child exits, signals) arrive through one poll(2): signals
// are blocked and read from a signalfd.
//
// Files: options (the command line), spawn (one rank's process), output (line
// relays), launcher (the node's event loop), master_port (the program's
// port), exit_barrier (multi-node exit).
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>

#include "comms/error.h"
#include "comms/store.h"
#include "launcher.h"
#include "options.h"
#include "output.h"
#include "store/store_auth.h"
#include "util/strutil.h"

namespace {

namespace str = comms::str;
using commsrun::say;

// The store's token: the user's, else a fresh one for a single-node job.
// Returns false (said) when the user's cannot be read.
bool choose_token(commsrun::LaunchOptions& options) {
  try {
    options.store_token = comms::store_auth::token_from_environment();
    // --store-only serves ranks started elsewhere: a token made here would not reach them.
    if (options.store_token.empty() && options.nnodes == 1 && !options.store_only) {
      options.store_token = comms::store_auth::new_token();
      options.token_generated = true;
    }
  } catch (const comms::Error& e) {
    say(str::cat("error: ", e.what()));
    return false;
  }
  if (options.store_token.empty()) {
    say(str::cat("warning: no COMMS_STORE_TOKEN: the store at ", options.master_addr, ":", options.master_port,
                 " serves anyone who can reach it; set the same COMMS_STORE_TOKEN (or COMMS_STORE_TOKEN_FILE) "
                 "on every node"));
  }
  return true;
}

// --store-only: serves until SIGINT/SIGTERM/SIGHUP or --timeout. The
// signals are blocked already; they are waited for here.
int serve_store_only(const commsrun::LaunchOptions& options, comms::TcpStoreServer& store, const sigset_t& handled) {
  const std::string address = str::cat("tcp://", options.master_addr, ":", store.port());
  std::printf("%s\n", address.c_str());
  std::fflush(stdout);
  say(str::cat("hosting the store at ", address, " until killed",
               options.timeout_s > 0 ? str::cat(" or for ", commsrun::seconds_text(options.timeout_s), " s") : "",
               "; start each rank with COMMS_STORE=", address,
               options.store_token.empty() ? "" : " and the same COMMS_STORE_TOKEN"));
  timespec limit{};
  if (options.timeout_s > 0) {
    limit.tv_sec = static_cast<time_t>(options.timeout_s);
    limit.tv_nsec = static_cast<long>((options.timeout_s - double(limit.tv_sec)) * 1e9);
  }
  for (;;) {
    const int sig = options.timeout_s > 0 ? ::sigtimedwait(&handled, nullptr, &limit) : ::sigwaitinfo(&handled, nullptr);
    if (sig == SIGCHLD || (sig < 0 && errno == EINTR)) continue;
    if (sig < 0) {
      say("store-only: --timeout reached; the store stops");
      return 0;
    }
    say(str::cat("store-only: ", commsrun::signal_name(sig), "; the store stops"));
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  commsrun::LaunchOptions options;
  if (auto code = commsrun::parse_command_line(argc, argv, &options)) return *code;

  std::optional<std::string> program_path;
  if (!options.store_only) program_path = commsrun::find_program(options.command.front());
  if (!options.store_only && !program_path) {
    say(str::cat("error: ", options.command.front(), ": command not found or not executable"));
    return 127;
  }

  // Blocked before the store server's thread starts, so that every thread
  // blocks them and they all reach the signalfd.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher

  if (!choose_token(options)) return 2;

  std::unique_ptr<comms::TcpStoreServer> store;
  uint16_t port = static_cast<uint16_t>(options.master_port);
  if (options.node_rank == 0) {
    try {
      comms::TcpStoreServerOptions store_options;
      store_options.token = options.store_token;
      store = std::make_unique<comms::TcpStoreServer>(options.master_addr, port, store_options);
    } catch (const comms::Error& e) {
      say(str::cat("error: cannot host the store: ", e.what()));
      return 1;
    }
    port = store->port();
  }
  if (options.store_only) return serve_store_only(options, *store, handled);
  commsrun::Launcher launcher(std::move(options), std::move(*program_path));
  return launcher.run(port);
}
