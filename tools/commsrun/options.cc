#include "options.h"

#include <sched.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <string_view>

#include "config/env.h"
#include "output.h"
#include "util/strutil.h"

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
  if (options.store_only && !options.command.empty()) {
    return usage_error(str::cat("--store-only starts no program, but '", options.command.front(), "' was given"));
  }
  if (!options.store_only && options.command.empty()) {
    return usage_error("missing PROGRAM to run (commsrun -n N PROGRAM ARGS...)");
  }
  if (!options.command.empty() && options.command.front().starts_with("-")) {
    return usage_error(str::cat("unknown option '", options.command.front(), "'"));
  }
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
  if (options.replace && !options.keep_going) {
    return usage_error("--replace needs --keep-going: the other ranks must outlive the lost one");
  }
  if (options.max_replacements >= 0 && !options.replace) return usage_error("--max-replacements needs --replace");
  if (!std::isfinite(options.timeout_s) || !std::isfinite(options.grace_s) ||
      !std::isfinite(options.exit_barrier_s)) {
    return usage_error("--timeout, --grace and --exit-barrier-timeout must be finite numbers of seconds");
  }
  return std::nullopt;
}

// "4" or "auto"; anything else is a usage error (said).
std::optional<int> parse_nproc(const std::string& text, int* out) {
  if (text == "auto") {
    *out = auto_nproc();
    return std::nullopt;
  }
  if (!str::parse_int(text, out)) return usage_error(str::cat("--nproc-per-node='", text, "': give a number or auto"));
  return std::nullopt;
}

void add_options(CLI::App& app, LaunchOptions& options, std::string& nproc_text, bool& standalone) {
  // Both spellings of each of torchrun's options, like torchrun.
  app.add_option("-n,--nproc-per-node,--nproc_per_node", nproc_text, "Ranks to start on this node, or auto")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", options.master_addr, "Address of the TCP store (node 0 binds it)")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", options.master_port,
                 "Port of the TCP store; 0 picks a free one (single node only)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--nnodes", options.nnodes, "Number of nodes")->capture_default_str();
  app.add_option("--node-rank,--node_rank", options.node_rank, "This node's index, 0 to nnodes-1")
      ->capture_default_str();
  app.add_flag("--standalone", standalone,
               "Single node, store on 127.0.0.1 at a free port (torchrun's --standalone; the default here)");
  app.add_flag("--store-only", options.store_only,
               "Host the TCP store only, for ranks launched otherwise: print its address and serve until "
               "killed or --timeout");
  app.add_option("--timeout", options.timeout_s, "Stop every rank after this many seconds (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grace", options.grace_s, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--keep-going", options.keep_going,
               "When a rank fails, leave the others running until they exit by themselves (to see each "
               "survivor detect the failure, or an elastic job recover; like srun --kill-on-bad-exit=0). "
               "Exits 0, naming the lost ranks, when the survivors finished and the failed ranks were lost "
               "to signals; --timeout still applies. Sets COMMS_ELASTIC=1 for the ranks unless it is set");
  app.add_flag("--replace", options.replace,
               "With --keep-going: when a rank is lost to a signal, start a replacement process on this "
               "node with the same command, to join the elastic job (comms::join). It gets the rank's "
               "environment without RANK, plus COMMS_REPLACEMENT (1, 2, ... on this node) and "
               "COMMS_REPLACES_RANK; its output is prefixed [+1], [+2], ...");
  app.add_option("--max-replacements", options.max_replacements,
                 "At most this many replacements on this node (default: one per rank, -n)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--exit-barrier-timeout", options.exit_barrier_s,
                 "With several nodes: how long node 0 keeps the store up for the other nodes after its "
                 "own ranks succeeded")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  // The program and its arguments are never ours: parsing stops there.
  app.prefix_command();
  app.footer("Usage: commsrun [OPTIONS] PROGRAM ARGS... (or OPTIONS -- PROGRAM ARGS...)\n"
             "Example: commsrun --nproc_per_node 4 ./trainer --steps 100");
}

// Where commsrun's own arguments end: at the first "--", or at the first
// argument that is neither an option of ours nor an option's value.
int launcher_end(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--" || !arg.starts_with("-") || arg == "-") return i;
    // "--name=value" and "-n4" carry their value.
    if (arg.find('=') != std::string_view::npos || (!arg.starts_with("--") && arg.size() > 2)) continue;
    const CLI::Option* option = app.get_option_no_throw(std::string(arg));
    if (option != nullptr && option->get_items_expected_min() > 0) ++i;  // its value
  }
  return argc;
}

}  // namespace

int auto_nproc() {
  if (auto visible = comms::env::get("CUDA_VISIBLE_DEVICES")) {
    int count = 0;
    for (std::string_view item : str::split(*visible, ',')) {
      item = str::strip(item);
      if (item.empty() || item.starts_with("-")) break;  // CUDA stops at the first invalid entry
      ++count;
    }
    if (count > 0) return count;
  } else {
    int count = 0;
    while (std::filesystem::exists(str::cat("/dev/nvidia", count))) ++count;
    if (count > 0) return count;
  }
  cpu_set_t cpus;
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) == 0) return std::max(1, CPU_COUNT(&cpus));
  return 1;
}

std::optional<int> parse_command_line(int argc, char** argv, LaunchOptions* out) {
  LaunchOptions& options = *out;
  CLI::App app{"Starts the ranks of a comms job on this node and hosts its rendezvous store.", "commsrun"};
  std::string nproc_text = "1";
  bool standalone = false;
  add_options(app, options, nproc_text, standalone);
  // The command starts at the first "--" or at the program, whichever comes
  // first: a "--" after the program is the program's.
  const int end = launcher_end(app, argc, argv);
  const bool has_separator = end < argc && std::string_view(argv[end]) == "--";
  options.command.assign(argv + end + (has_separator ? 1 : 0), argv + argc);
  std::vector<std::string> launcher_args;
  for (int i = end - 1; i >= 1; --i) launcher_args.emplace_back(argv[i]);  // CLI11 wants them reversed
  try {
    app.parse(launcher_args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<std::string> before_separator = app.remaining();
  if (!before_separator.empty()) {
    return usage_error(str::cat("unexpected '", before_separator.front(), "' before ",
                                has_separator ? "--" : "the program"));
  }
  if (auto code = parse_nproc(nproc_text, &options.nproc)) return code;
  if (options.replace && options.max_replacements < 0) options.max_replacements = options.nproc;
  options.master_port_given = app.count("--master-port") > 0;
  if (standalone) {
    if (options.nnodes != 1) return usage_error("--standalone is a single-node job; drop --nnodes");
    if (app.count("--master-addr") == 0) options.master_addr = "127.0.0.1";
  }
  return check(options);
}

}  // namespace commsrun
