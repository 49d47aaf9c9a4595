// UCX's log output (errors when a peer dies, warnings about transports)
// goes to comms' log instead of stderr.
#pragma once

namespace comms::ucx_backend {

// Installs, once per process, a UCS log handler that hands every message
// UCX emits (at UCX_LOG_LEVEL, warn by default) to `log`; later calls only
// replace the sink. A null sink leaves UCX's own handler printing.
void route_ucx_logs(void (*log)(int level, const char* message));

// While one lives, UCX messages from this thread are dropped: validating a
// hint through UCX's parser reports the error in the hint's Status instead.
class QuietUcxLogs {
 public:
  QuietUcxLogs();
  ~QuietUcxLogs();
  QuietUcxLogs(const QuietUcxLogs&) = delete;
  QuietUcxLogs& operator=(const QuietUcxLogs&) = delete;
};

}  // namespace comms::ucx_backend
