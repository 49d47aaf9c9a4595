// Starting one rank: its environment, its process group, its pipes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "options.h"
#include "output.h"

namespace commsrun {

// Where a rank's rendezvous happen: commsrun's store (COMMS_STORE), and a
// port nothing of ours listens on for the program's own (MASTER_PORT, where
// rank 0 of a torch program hosts torch's TCPStore).
struct RankAddresses {
  uint16_t store_port = 0;
  uint16_t master_port = 0;
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
std::optional<std::string> find_program(const std::string& name);

// Forks and executes the rank `local_rank` of this node in its own process
// group, stdin /dev/null, its output relayed with a "[rank] " prefix. Says
// why and returns false if it could not.
bool spawn_rank(const LaunchOptions& options, const std::string& program_path, int local_rank,
                const RankAddresses& addresses, RankProcess* out);

}  // namespace commsrun
