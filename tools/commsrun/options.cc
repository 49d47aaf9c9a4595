#include "options.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <string_view>

#include "output.h"
#include "strutil.h"

namespace commsrun {
namespace {

namespace str = comms::str;

// Usage errors print one line and return 2.
int usage_error(const std::string& message) {
  say(str::cat("error: ", message, " (see commsrun --help)"));
  return 2;
}

// The checks CLI11 cannot express: the command, ranges that depend on each
// other, finite times.
std::optional<int> check(const LaunchOptions& options) {
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
  return std::nullopt;
}

}  // namespace

std::optional<int> parse_command_line(int argc, char** argv, LaunchOptions* out) {
  LaunchOptions& options = *out;
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
  return check(options);
}

}  // namespace commsrun
