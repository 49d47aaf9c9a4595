#include "util/strutil.h"
#include "util/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "config/env.h"

namespace comms::log {
namespace {

const std::string& rank_tag() {
  static const std::string tag = [] {
    for (const char* name : {"COMMS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
      if (auto v = env::get(name)) return *v;
    }
    return std::string("?");
  }();
  return tag;
}

const Level& threshold() {
  static const Level level = [] {
    try {
      return level_from_environment();
    } catch (const std::exception& e) {
      write(Level::kWarning, str::cat(e.what(), " (logging at warning)"));
      return Level::kWarning;
    }
  }();
  return level;
}

}  // namespace

Level level_from_environment() {
  const std::string s = env::get_choice("COMMS_LOG_LEVEL", "warning", {"debug", "info", "warning", "error"},
                                        "a log level");
  if (s == "debug") return Level::kDebug;
  if (s == "info") return Level::kInfo;
  if (s == "error") return Level::kError;
  return Level::kWarning;
}

bool enabled(Level level) { return level >= threshold(); }

void write(Level level, std::string_view message) {
  static std::mutex mu;
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  std::string line = "comms[" + rank_tag() + "] ";
  line += kLetters[static_cast<int>(level)];
  line += ' ';
  line.append(message);
  line += '\n';
  std::lock_guard<std::mutex> lock(mu);
  // One write(2) per line keeps lines whole when ranks share a terminal.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void plugin_sink(int level, const char* message) {
  if (level < 0) level = 0;
  if (level > 3) level = 3;
  auto l = static_cast<Level>(level);
  if (enabled(l)) write(l, message);
}

}  // namespace comms::log
