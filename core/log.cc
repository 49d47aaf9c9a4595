#include "strutil.h"
#include "log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "env.h"

namespace comms::log {
namespace {

Level level_from_env() {
  auto v = env::get("COMMS_LOG_LEVEL");
  if (!v) return Level::kWarning;
  std::string s = str::lower(*v);
  if (s == "debug") return Level::kDebug;
  if (s == "info") return Level::kInfo;
  if (s == "error") return Level::kError;
  return Level::kWarning;
}

const Level& threshold() {
  static const Level level = level_from_env();
  return level;
}

const std::string& rank_tag() {
  static const std::string tag = [] {
    for (const char* name : {"COMMS_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
      if (const char* v = std::getenv(name); v && *v) return std::string(v);
    }
    return std::string("?");
  }();
  return tag;
}

}  // namespace

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
