#include "ucx_log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

#include <ucs/debug/log_def.h>

namespace comms::ucx_backend {
namespace {

// Process-wide like UCX's handler list itself; every comm passes the same
// host sink, so the last one set wins harmlessly.
std::atomic<void (*)(int, const char*)> g_sink{nullptr};
thread_local int t_quiet = 0;

void install_handler();

int level_of(ucs_log_level_t level) {
  if (level <= UCS_LOG_LEVEL_ERROR) return 3;
  if (level == UCS_LOG_LEVEL_WARN) return 2;
  if (level <= UCS_LOG_LEVEL_INFO) return 1;
  return 0;
}

ucs_log_func_rc_t handler(const char* file, unsigned line, const char*, ucs_log_level_t level,
                          const ucs_log_component_config_t*, const char* format, va_list ap) {
  if (t_quiet) return UCS_LOG_FUNC_RC_STOP;
  auto* sink = g_sink.load();
  if (!sink) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[1024];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, format, copy);
  va_end(copy);
  const char* base = file;
  for (const char* p = file; p && *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  const std::string message = std::string("ucx ") + (base ? base : "?") + ":" + std::to_string(line) + ": " + text;
  sink(level_of(level), message.c_str());
  return UCS_LOG_FUNC_RC_STOP;
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&handler); });
}

}  // namespace

void route_ucx_logs(void (*log)(int level, const char* message)) {
  if (!log) return;
  g_sink = log;
  install_handler();
}

QuietUcxLogs::QuietUcxLogs() {
  install_handler();
  ++t_quiet;
}

QuietUcxLogs::~QuietUcxLogs() { --t_quiet; }

}  // namespace comms::ucx_backend
