// commsrun: starts the ranks of one node of a job, hosts the TCP store on
// node 0, prefixes every output line with the rank, and tears the whole node
// down as soon as one rank fails.
//
//   commsrun -n N [--master-addr A] [--master-port P] [--nnodes K --node-rank R]
//            [--timeout S] [--grace S] [--exit-barrier-timeout S] -- PROGRAM ARGS...
//
// Ranks get the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus COMMS_LAUNCHER_STORE=1.
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
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "env.h"
#include "comms/error.h"
#include "comms/store.h"
#include "store/store_auth.h"
#include "strutil.h"

extern char** environ;

namespace {

namespace str = comms::str;
using Clock = std::chrono::steady_clock;

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  bool master_port_given = false;
  int nnodes = 1;
  int node_rank = 0;
  double timeout_s = 0;  // 0: none
  double grace_s = 3;
  double exit_barrier_s = 300;
  std::vector<std::string> command;
  std::string store_token;      // "" : the store is open
  bool token_generated = false;  // made here: the ranks get it from us
};

// Output longer than this without a newline is passed on as a line of its
// own, so that one rank cannot make the launcher buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. our reader went away: the output is dropped
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "commsrun: " + message + "\n"); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? str::cat("SIG", abbrev) : str::cat("signal ", sig);
}

std::string seconds_text(double s) { return str::cat(s); }

std::string ranks_text(int count) { return str::cat(count, count == 1 ? " rank" : " ranks"); }

// One of a rank's output pipes, cut into lines that are written whole.
class LineRelay {
 public:
  LineRelay(int read_fd, int target_fd, std::string prefix)
      : fd_(read_fd), target_fd_(target_fd), prefix_(std::move(prefix)) {}

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }

  // Reads what is available; closes the pipe at end of file.
  void pump() {
    char buffer[64 * 1024];
    ssize_t n = ::read(fd_, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_and_flush();
      return;
    }
    pending_.append(buffer, static_cast<size_t>(n));
    std::string lines;
    size_t start = 0;
    for (size_t newline; (newline = pending_.find('\n', start)) != std::string::npos; start = newline + 1) {
      lines += prefix_;
      lines.append(pending_, start, newline + 1 - start);
    }
    pending_.erase(0, start);
    if (pending_.size() >= kMaxLineBytes) {
      str::append(lines, prefix_, pending_, "\n");
      pending_.clear();
    }
    if (!lines.empty()) write_all(target_fd_, lines);
  }

  // Passes on a partial last line and closes the pipe.
  void close_and_flush() {
    if (!pending_.empty()) write_all(target_fd_, str::cat(prefix_, pending_, "\n"));
    pending_.clear();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  int target_fd_;
  std::string prefix_;
  std::string pending_;
};

struct RankProcess {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::unique_ptr<LineRelay> out;
  std::unique_ptr<LineRelay> err;
};

// The program's path, found on PATH the way execvp would, but before fork:
// the child may only make async-signal-safe calls.
std::optional<std::string> find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) != 0) return std::nullopt;
    return name;
  }
  const std::string dirs = comms::env::get("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(start, colon - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = colon + 1;
  }
  return std::nullopt;
}

// The parent's environment with the launcher's variables replacing any
// inherited ones.
std::vector<std::string> rank_environment(const LaunchOptions& options, int local_rank, uint16_t port) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(options.node_rank * options.nproc + local_rank)},
      {"WORLD_SIZE", std::to_string(options.nnodes * options.nproc)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"COMMS_LAUNCHER_STORE", "1"},
  };
  if (options.token_generated) ours.emplace_back("COMMS_STORE_TOKEN", options.store_token);
  std::vector<std::string> env;
  for (char** entry = environ; *entry; ++entry) {
    std::string_view text(*entry);
    std::string_view name = text.substr(0, text.find('='));
    bool replaced = std::any_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env.emplace_back(text);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

class Launcher {
 public:
  Launcher(LaunchOptions options, std::string program_path)
      : options_(std::move(options)), program_path_(std::move(program_path)) {}

  int run(uint16_t store_port) {
    if (!setup_signals()) return 1;
    for (int local = 0; local < options_.nproc; ++local) {
      if (!start_rank(local, store_port)) {
        begin_stop(SIGTERM);
        exit_code_ = 1;
        break;
      }
    }
    if (options_.timeout_s > 0) {
      run_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(options_.timeout_s));
    }
    event_loop();
    int code = exit_code_.value_or(0);
    if (options_.nnodes > 1) code = exit_barrier(code, store_port);
    return code;
  }

 private:
  bool setup_signals() {
    sigset_t handled;
    sigemptyset(&handled);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
    signal_fd_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) {
      say(str::cat("signalfd failed: ", std::strerror(errno)));
      return false;
    }
    return true;
  }

  bool start_rank(int local_rank, uint16_t store_port) {
    RankProcess rank;
    rank.local_rank = local_rank;
    rank.rank = options_.node_rank * options_.nproc + local_rank;
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
      say(str::cat("pipe failed: ", std::strerror(errno)));
      return false;
    }
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      say(str::cat("pipe failed: ", std::strerror(errno)));
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      return false;
    }
    // Everything the child needs is built before fork: the store server's
    // thread may hold the allocator's lock at the moment we fork.
    std::vector<std::string> env = rank_environment(options_, local_rank, store_port);
    std::vector<char*> envp = c_strings(env);
    std::vector<std::string> args = options_.command;
    std::vector<char*> argv = c_strings(args);
    std::string exec_failed = str::cat("commsrun: cannot execute ", program_path_, ": ");
    int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t parent = ::getpid();

    pid_t pid = ::fork();
    if (pid < 0) {
      say(str::cat("fork failed: ", std::strerror(errno)));
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], dev_null}) ::close(fd);
      return false;
    }
    if (pid == 0) {
      // Async-signal-safe calls only from here to exec. PDEATHSIG fires when
      // the forking *thread* ends: that is the main thread, which outlives
      // every rank.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
      ::setpgid(0, 0);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      if (dev_null >= 0) ::dup2(dev_null, STDIN_FILENO);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      ::execve(program_path_.c_str(), argv.data(), envp.data());
      int err = errno;
      ssize_t ignored = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
      const char* reason = ::strerror(err);  // glibc's is a table look-up
      ignored = ::write(STDERR_FILENO, reason, std::strlen(reason));
      ignored = ::write(STDERR_FILENO, "\n", 1);
      (void)ignored;
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so that no signal races the child's own call
    for (int fd : {out_pipe[1], err_pipe[1], dev_null}) {
      if (fd >= 0) ::close(fd);
    }
    rank.pid = pid;
    rank.running = true;
    std::string prefix = str::cat("[", rank.rank, "] ");
    rank.out = std::make_unique<LineRelay>(out_pipe[0], STDOUT_FILENO, prefix);
    rank.err = std::make_unique<LineRelay>(err_pipe[0], STDERR_FILENO, prefix);
    ranks_.push_back(std::move(rank));
    return true;
  }

  int running_count() const {
    return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const auto& r) { return r.running; }));
  }

  // Signals the rank's process group, or the rank alone if it has none yet.
  static void signal_rank(const RankProcess& rank, int sig) {
    if (::kill(-rank.pid, sig) != 0) ::kill(rank.pid, sig);
  }

  void begin_stop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    for (const auto& rank : ranks_) {
      if (rank.running) signal_rank(rank, sig);
    }
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.grace_s));
  }

  void kill_all() {
    for (const auto& rank : ranks_) {
      if (rank.running) signal_rank(rank, SIGKILL);
    }
    kill_deadline_.reset();
  }

  void reap() {
    // Collect every rank that has exited since the last pass first: when a
    // rank dies, its peers fail within microseconds, and the launcher must
    // blame the rank that died, not the peer it happened to reap first.
    struct Exit {
      const RankProcess* rank;
      int status;
    };
    std::vector<Exit> failures;
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      int status = 0;
      pid_t done = ::waitpid(rank.pid, &status, WNOHANG);
      if (done != rank.pid) continue;
      rank.running = false;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failures.push_back({&rank, status});
    }
    if (failures.empty()) {
      if (running_count() == 0 && !all_exited_at_) all_exited_at_ = Clock::now();
      return;
    }
    auto describe = [](const Exit& e) {
      if (WIFSIGNALED(e.status)) {
        const int sig = WTERMSIG(e.status);
        return str::cat("rank ", e.rank->rank, " (pid ", e.rank->pid, ") was killed by signal ", sig, " (",
                        signal_name(sig), ")");
      }
      return str::cat("rank ", e.rank->rank, " (pid ", e.rank->pid, ") exited with status ", WEXITSTATUS(e.status));
    };
    if (stopping_) {
      // After the stop began these are consequences; say so, for the record.
      for (const auto& e : failures) say(str::cat(describe(e), " (while stopping)"));
    } else {
      auto cause = std::find_if(failures.begin(), failures.end(), [](const Exit& e) { return WIFSIGNALED(e.status); });
      if (cause == failures.end()) cause = failures.begin();
      say(describe(*cause));
      exit_code_ = WIFSIGNALED(cause->status) ? 128 + WTERMSIG(cause->status) : WEXITSTATUS(cause->status);
      for (auto it = failures.begin(); it != failures.end(); ++it) {
        if (it != cause) say(str::cat(describe(*it), " (at the same time)"));
      }
      const int others = running_count();
      if (others > 0) {
        say(str::cat("stopping the other ", ranks_text(others), " (SIGTERM, then SIGKILL after ",
                     seconds_text(options_.grace_s), " s)"));
      }
      begin_stop(SIGTERM);
    }
    if (running_count() == 0 && !all_exited_at_) all_exited_at_ = Clock::now();
  }

  void read_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reaped below, whatever the count
      if (received_signal_) {
        say(str::cat("received ", signal_name(sig), " again; killing ", running_count(), " ranks"));
        kill_all();
        continue;
      }
      received_signal_ = sig;
      say(str::cat("received ", signal_name(sig), "; forwarding it to ", ranks_text(running_count())));
      if (!exit_code_) exit_code_ = 128 + sig;
      if (stopping_) {
        for (const auto& rank : ranks_) {
          if (rank.running) signal_rank(rank, sig);
        }
      } else {
        begin_stop(sig);
      }
    }
    reap();
  }

  void check_deadlines(Clock::time_point now) {
    if (run_deadline_ && now >= *run_deadline_) {
      run_deadline_.reset();
      if (running_count() > 0 && !stopping_) {
        say(str::cat("timeout after ", seconds_text(options_.timeout_s), " s; stopping ", ranks_text(running_count())));
        exit_code_ = 124;
        begin_stop(SIGTERM);
      }
    }
    if (kill_deadline_ && now >= *kill_deadline_) {
      if (running_count() > 0) {
        say(str::cat(ranks_text(running_count()), " still running after ", seconds_text(options_.grace_s),
                         " s; sending SIGKILL"));
      }
      kill_all();
    }
  }

  // Output may stay open after every rank exited (a grandchild that left
  // the rank's process group holds the pipe): wait for it only briefly.
  static constexpr auto kDrainAfterExit = std::chrono::seconds(1);

  void event_loop() {
    while (true) {
      auto now = Clock::now();
      check_deadlines(now);
      bool pipes_open = std::any_of(ranks_.begin(), ranks_.end(),
                                    [](const auto& r) { return r.out->open() || r.err->open(); });
      if (running_count() == 0) {
        if (!all_exited_at_) all_exited_at_ = now;
        if (!pipes_open || now - *all_exited_at_ >= kDrainAfterExit) break;
      }

      std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
      std::vector<LineRelay*> relays = {nullptr};
      for (auto& rank : ranks_) {
        for (LineRelay* relay : {rank.out.get(), rank.err.get()}) {
          if (!relay->open()) continue;
          fds.push_back({relay->fd(), POLLIN, 0});
          relays.push_back(relay);
        }
      }
      std::optional<Clock::time_point> wake;
      auto earliest = [&](std::optional<Clock::time_point> t) {
        if (t && (!wake || *t < *wake)) wake = t;
      };
      earliest(run_deadline_);
      earliest(kill_deadline_);
      if (all_exited_at_) earliest(*all_exited_at_ + kDrainAfterExit);
      int timeout_ms = -1;
      if (wake) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(*wake - now).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
      }
      int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0) {
        if (errno == EINTR) continue;
        say(str::cat("poll failed: ", std::strerror(errno), "; killing the ranks"));
        exit_code_ = exit_code_.value_or(1);
        kill_all();
        break;
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) relays[i]->pump();
      }
      if (fds[0].revents & POLLIN) read_signals();
    }
    for (auto& rank : ranks_) {
      rank.out->close_and_flush();
      rank.err->close_and_flush();
    }
    // Ranks still unreaped here were SIGKILLed: collect them.
    for (auto& rank : ranks_) {
      if (rank.running) ::waitpid(rank.pid, nullptr, 0);
    }
  }

  // Node 0's store must outlive the ranks of every node, so each node
  // reports its exit status under "commsrun/node_exit/<node>", and node 0
  // (when its own ranks succeeded) waits for all of them before the store
  // goes. A failed node 0 does not wait: its store vanishing is what tells
  // the other nodes' ranks, at once, that the job is over.
  int exit_barrier(int code, uint16_t store_port) {
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
  int pending_stop_signal() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      if (info.ssi_signo != SIGCHLD) return static_cast<int>(info.ssi_signo);
    }
    return 0;
  }

  LaunchOptions options_;
  std::string program_path_;
  std::vector<RankProcess> ranks_;
  int signal_fd_ = -1;
  bool stopping_ = false;
  int received_signal_ = 0;
  std::optional<int> exit_code_;
  std::optional<Clock::time_point> run_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> all_exited_at_;
};

// Usage errors print one line and return 2.
int usage_error(const std::string& message) {
  say(str::cat("error: ", message, " (see commsrun --help)"));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions options;
  CLI::App app{"Starts the ranks of a comms job on this node and hosts its rendezvous store.", "commsrun"};
  app.add_option("-n,--nproc-per-node", options.nproc, "Ranks to start on this node")->required();
  app.add_option("--master-addr", options.master_addr, "Address of the TCP store (node 0 binds it)")
      ->capture_default_str();
  auto* port_option = app.add_option("--master-port", options.master_port,
                                     "Port of the TCP store; 0 picks a free one (single node only)")
                          ->check(CLI::Range(0, 65535));
  app.add_option("--nnodes", options.nnodes, "Number of nodes")->capture_default_str();
  app.add_option("--node-rank", options.node_rank, "This node's index, 0 to nnodes-1")->capture_default_str();
  app.add_option("--timeout", options.timeout_s, "Stop every rank after this many seconds (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grace", options.grace_s, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  std::vector<std::string> positional_command;
  app.add_option("--exit-barrier-timeout", options.exit_barrier_s,
                 "With several nodes: how long node 0 keeps the store up for the other nodes after its "
                 "own ranks succeeded")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("command", positional_command, "PROGRAM ARGS... (after --)");
  app.footer("Example: commsrun -n 4 -- ./trainer --steps 100");
  // Everything after the first "--" is the command, untouched: CLI11 would
  // otherwise read the program's own options (e.g. its -n) as ours.
  std::vector<std::string> launcher_args;
  bool has_separator = false;
  for (int i = argc - 1; i >= 1; --i) launcher_args.emplace_back(argv[i]);  // CLI11 wants them reversed
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      has_separator = true;
      options.command.assign(argv + i + 1, argv + argc);
      launcher_args.erase(launcher_args.begin(), launcher_args.begin() + (argc - i));
      break;
    }
  }
  try {
    app.parse(launcher_args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.master_port_given = port_option->count() > 0;
  if (has_separator && !positional_command.empty()) {
    return usage_error(str::cat("unexpected '", positional_command.front(), "' before --"));
  }
  if (!has_separator) options.command = positional_command;

  if (options.command.empty()) return usage_error("missing PROGRAM to run (commsrun -n N -- PROGRAM ARGS...)");
  if (options.nproc < 1) return usage_error(str::cat("-n must be at least 1, got ", options.nproc));
  if (options.nnodes < 1) return usage_error(str::cat("--nnodes must be at least 1, got ", options.nnodes));
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    return usage_error(str::cat("--node-rank ", options.node_rank, " is out of range for --nnodes ",
                                    options.nnodes, " (0 to ", options.nnodes - 1, ")"));
  }
  if (options.nnodes > 1 && (!options.master_port_given || options.master_port == 0)) {
    return usage_error("--nnodes > 1 needs an explicit, non-zero --master-port that every node shares");
  }
  if (options.master_addr.empty()) return usage_error("--master-addr is empty");
  if (!std::isfinite(options.timeout_s) || !std::isfinite(options.grace_s) ||
      !std::isfinite(options.exit_barrier_s)) {
    return usage_error("--timeout, --grace and --exit-barrier-timeout must be finite numbers of seconds");
  }

  auto program_path = find_program(options.command.front());
  if (!program_path) {
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

  try {
    options.store_token = comms::store_auth::token_from_environment();
    if (options.store_token.empty() && options.nnodes == 1) {
      options.store_token = comms::store_auth::new_token();
      options.token_generated = true;
    }
  } catch (const comms::Error& e) {
    say(str::cat("error: ", e.what()));
    return 2;
  }
  if (options.store_token.empty()) {
    say(str::cat("warning: no COMMS_STORE_TOKEN: the store at ", options.master_addr, ":", options.master_port,
                 " serves anyone who can reach it; set the same COMMS_STORE_TOKEN (or COMMS_STORE_TOKEN_FILE) "
                 "on every node"));
  }

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
  Launcher launcher(std::move(options), std::move(*program_path));
  return launcher.run(port);
}
