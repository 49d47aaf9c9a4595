// Minimal leveled logging to stderr. The level comes from COMMS_LOG_LEVEL
// (debug, info, warning, error; default warning). Never used on the per-op
// hot path except for errors.
#pragma once

#include <string_view>

namespace comms::log {

enum class Level : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// COMMS_LOG_LEVEL, or kWarning when unset. Throws comms::Error naming the
// variable when malformed; new_comm calls it so that a typo is an error. The
// logger itself (which must not throw) logs at warning and says so instead.
Level level_from_environment();

bool enabled(Level level);
// Writes one line: "comms[<rank>] W <message>". Thread-safe.
void write(Level level, std::string_view message);

inline void debug(std::string_view m) { if (enabled(Level::kDebug)) write(Level::kDebug, m); }
inline void info(std::string_view m) { if (enabled(Level::kInfo)) write(Level::kInfo, m); }
inline void warning(std::string_view m) { if (enabled(Level::kWarning)) write(Level::kWarning, m); }
inline void error(std::string_view m) { write(Level::kError, m); }

// The sink handed to plugins (BackendInit::log).
void plugin_sink(int level, const char* message);

}  // namespace comms::log
