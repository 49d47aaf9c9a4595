// commsrun's command line: torchrun's options (either spelling,
// --nproc_per_node or --nproc-per-node), then PROGRAM ARGS... (parsing stops
// at the program, or at --).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace commsrun {

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
  bool store_only = false;  // --store-only: host the store, start no rank
  bool keep_going = false;  // --keep-going: a failed rank does not stop the others
  bool replace = false;     // --replace: a rank lost to a signal gets a replacement process
  int max_replacements = -1;  // --max-replacements; -1: one per rank of this node
  std::vector<std::string> command;
  std::string store_token;      // "" : the store is open
  bool token_generated = false;  // made here: the ranks get it from us
};

// Parses and checks the command line into *options. Returns the exit status
// when commsrun must stop here (--help: 0; a usage error, said in one line: 2).
std::optional<int> parse_command_line(int argc, char** argv, LaunchOptions* options);

// --nproc-per-node=auto: the CUDA devices this process may use (by
// CUDA_VISIBLE_DEVICES, else /dev/nvidiaN), else the CPUs it may run on, as
// torchrun counts.
int auto_nproc();

}  // namespace commsrun
