#include "launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "util/strutil.h"

namespace commsrun {

namespace str = comms::str;

int Launcher::run(uint16_t store_port) {
  if (!setup_signals()) return 1;
  const auto master_port = choose_master_port(store_port);
  if (!master_port) return exit_code_.value_or(1);
  addresses_ = {store_port, *master_port};
  for (int local = 0; local < options_.nproc; ++local) {
    if (!start_rank(local, addresses_)) {
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
  int code = keep_going_status(exit_code_.value_or(0));
  if (options_.nnodes > 1) code = exit_barrier(code, store_port);
  return code;
}

int Launcher::keep_going_status(int code) {
  if (!options_.keep_going || failed_.empty() || stopping_ || received_signal_ != 0) return code;
  if (failed_.size() == ranks_.size()) return code;
  std::vector<int> lost;
  std::vector<std::string> lost_replacements;
  for (const Failure& f : failed_) {
    if (!WIFSIGNALED(f.status)) return code;  // a rank failed by itself: the job did not recover
    if (f.replacement > 0) {
      lost_replacements.push_back(str::cat("+", f.replacement));
    } else {
      lost.push_back(f.rank);
    }
  }
  std::sort(lost.begin(), lost.end());
  std::string text = str::cat("--keep-going: the survivors finished; lost ranks [", str::join(lost, ","), "]");
  if (!lost_replacements.empty()) text += str::cat(" and replacements [", str::join(lost_replacements, ","), "]");
  say(text);
  if (replacements_ > 0) {
    std::vector<std::string> started;
    for (const RankProcess& p : ranks_) {
      if (p.replacement > 0) started.push_back(str::cat("+", p.replacement, " (pid ", p.pid, ", in place of rank ", p.rank, ")"));
    }
    say(str::cat("--replace: ", replacements_, replacements_ == 1 ? " replacement: " : " replacements: ",
                 str::join(started, ", ")));
  }
  return 0;
}

void Launcher::replace_lost(const std::vector<std::pair<int, std::string>>& lost) {
  for (const auto& [local_rank, name] : lost) {
    if (replacements_ >= options_.max_replacements) {
      say(str::cat("--replace: no replacement for ", name, ": --max-replacements ", options_.max_replacements,
                   " reached"));
      continue;
    }
    RankProcess process;
    if (!spawn_rank(options_, program_path_, local_rank, addresses_, &process, replacements_ + 1)) {
      say(str::cat("--replace: could not start a replacement for ", name));
      continue;
    }
    ++replacements_;
    say(str::cat("--replace: started replacement +", replacements_, " (pid ", process.pid, ") in place of ", name));
    ranks_.push_back(std::move(process));
    all_exited_at_.reset();
  }
}

bool Launcher::setup_signals() {
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

bool Launcher::start_rank(int local_rank, const RankAddresses& addresses) {
  RankProcess rank;
  if (!spawn_rank(options_, program_path_, local_rank, addresses, &rank)) return false;
  ranks_.push_back(std::move(rank));
  return true;
}

int Launcher::running_count() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const auto& r) { return r.running; }));
}

// Signals the rank's process group, or the rank alone if it has none yet.
void Launcher::signal_rank(const RankProcess& rank, int sig) {
  if (::kill(-rank.pid, sig) != 0) ::kill(rank.pid, sig);
}

void Launcher::begin_stop(int sig) {
  if (stopping_) return;
  stopping_ = true;
  for (const auto& rank : ranks_) {
    if (rank.running) signal_rank(rank, sig);
  }
  kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.grace_s));
}

void Launcher::kill_all() {
  for (const auto& rank : ranks_) {
    if (rank.running) signal_rank(rank, SIGKILL);
  }
  kill_deadline_.reset();
}

void Launcher::reap() {
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
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      failures.push_back({&rank, status});
      failed_.push_back({rank.rank, rank.replacement, status});
    }
  }
  if (failures.empty()) {
    if (running_count() == 0 && !all_exited_at_) all_exited_at_ = Clock::now();
    return;
  }
  auto describe = [](const Exit& e) {
    if (WIFSIGNALED(e.status)) {
      const int sig = WTERMSIG(e.status);
      return str::cat(process_name(*e.rank), " (pid ", e.rank->pid, ") was killed by signal ", sig, " (",
                      signal_name(sig), ")");
    }
    return str::cat(process_name(*e.rank), " (pid ", e.rank->pid, ") exited with status ", WEXITSTATUS(e.status));
  };
  // Under --keep-going, a set exit code without a stop means a rank failed.
  const bool after_first_failure = options_.keep_going && exit_code_.has_value();
  if (stopping_ || after_first_failure) {
    // After the stop began, or the first failure under --keep-going, these
    // are consequences; say so, for the record.
    const char* when = stopping_ ? " (while stopping)" : " (after the first failure)";
    for (const auto& e : failures) say(str::cat(describe(e), when));
  } else {
    auto cause = std::find_if(failures.begin(), failures.end(), [](const Exit& e) { return WIFSIGNALED(e.status); });
    if (cause == failures.end()) cause = failures.begin();
    say(describe(*cause));
    exit_code_ = WIFSIGNALED(cause->status) ? 128 + WTERMSIG(cause->status) : WEXITSTATUS(cause->status);
    for (auto it = failures.begin(); it != failures.end(); ++it) {
      if (it != cause) say(str::cat(describe(*it), " (at the same time)"));
    }
    const int others = running_count();
    if (options_.keep_going) {
      if (others > 0) say(str::cat("--keep-going: leaving the other ", ranks_text(others), " running"));
    } else {
      if (others > 0) {
        say(str::cat("stopping the other ", ranks_text(others), " (SIGTERM, then SIGKILL after ",
                     seconds_text(options_.grace_s), " s)"));
      }
      begin_stop(SIGTERM);
    }
  }
  if (options_.replace && !stopping_ && received_signal_ == 0) {
    // Copied out first: starting a process grows ranks_, which `failures` points into.
    std::vector<std::pair<int, std::string>> lost;
    for (const auto& e : failures) {
      if (WIFSIGNALED(e.status)) lost.emplace_back(e.rank->local_rank, process_name(*e.rank));
    }
    replace_lost(lost);
  }
  if (running_count() == 0 && !all_exited_at_) all_exited_at_ = Clock::now();
}

void Launcher::read_signals() {
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

void Launcher::check_deadlines(Clock::time_point now) {
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

void Launcher::event_loop() {
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

}  // namespace commsrun
