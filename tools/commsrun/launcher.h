// The launcher of one node: starts its ranks, relays their output, and
// stops them all as soon as one fails, on a signal or at the deadline. One
// thread: output, child exits and signals all arrive through one poll(2),
// signals through a signalfd.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "options.h"
#include "spawn.h"

namespace commsrun {

using Clock = std::chrono::steady_clock;

class Launcher {
 public:
  Launcher(LaunchOptions options, std::string program_path)
      : options_(std::move(options)), program_path_(std::move(program_path)) {}

  // Starts the ranks and returns the node's exit status once they are done.
  int run(uint16_t store_port);

 private:
  bool setup_signals();
  bool start_rank(int local_rank, const RankAddresses& addresses);
  int running_count() const;
  // Signals the rank's process group, or the rank alone if it has none yet.
  static void signal_rank(const RankProcess& rank, int sig);
  void begin_stop(int sig);
  void kill_all();
  void reap();
  void read_signals();
  void check_deadlines(Clock::time_point now);
  // Output may stay open after every rank exited (a grandchild that left
  // the rank's process group holds the pipe): wait for it only briefly.
  static constexpr auto kDrainAfterExit = std::chrono::seconds(1);
  void event_loop();
  // (exit_barrier.cc) Node 0's store outlives every node's ranks.
  int exit_barrier(int code, uint16_t store_port);
  // SIGINT, SIGTERM or SIGHUP received since the ranks ended, else 0.
  int pending_stop_signal();
  // (master_port.cc) The ranks' MASTER_PORT, the same on every node; none
  // (said) when it cannot be had, with exit_code_ set when a signal ended
  // the wait for node 0.
  std::optional<uint16_t> choose_master_port(uint16_t store_port);
  // --keep-going: 0 when the survivors finished (every other rank exited 0,
  // and every failed rank was lost to a signal), else `code`.
  int keep_going_status(int code);
  // --replace: starts a replacement in the place of each process lost to a
  // signal, while --max-replacements allows.
  void replace_lost(const std::vector<std::pair<int, std::string>>& lost);

  LaunchOptions options_;
  std::string program_path_;
  std::vector<RankProcess> ranks_;
  int signal_fd_ = -1;
  bool stopping_ = false;
  int received_signal_ = 0;
  std::optional<int> exit_code_;
  RankAddresses addresses_;
  struct Failure {
    int rank;         // RankProcess::rank
    int replacement;  // RankProcess::replacement
    int status;       // from waitpid
  };
  std::vector<Failure> failed_;
  int replacements_ = 0;  // started so far
  std::optional<Clock::time_point> run_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> all_exited_at_;
};

}  // namespace commsrun
