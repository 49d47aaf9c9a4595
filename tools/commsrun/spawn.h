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
  int rank = 0;  // a replacement: the rank first started in its place
  int local_rank = 0;
  int replacement = 0;  // 0: started with the job; k: the node's k-th replacement (commsrun --replace)
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
// `replacement` k > 0 starts the node's k-th replacement in the place of
// `local_rank`: the rank's environment without RANK (it has no rank until
// the job admits it), plus COMMS_REPLACEMENT=k; its output is prefixed [+k].
bool spawn_rank(const LaunchOptions& options, const std::string& program_path, int local_rank,
                const RankAddresses& addresses, RankProcess* out, int replacement = 0);

// "rank 2", or "replacement +1" for a replacement.
std::string process_name(const RankProcess& process);

}  // namespace commsrun
