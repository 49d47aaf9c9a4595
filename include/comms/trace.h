// The flight recorder's public side. Every comm keeps its last
// COMMS_TRACE_BUFFER ops (default 2000; 0: off); with COMMS_TRACE_DIR set,
// each rank writes them to $COMMS_TRACE_DIR/<comm>.rank<R>.json on an op's
// timeout, a peer failure, abort(), SIGUSR1 (when the program has no handler
// of its own), or this call. `comms-trace DIR` merges the dumps of all ranks;
// docs/DEBUGGING.md shows how.
#pragma once

#include "comms/export.h"

namespace comms {

// Dumps every live comm of this process; returns how many files were written
// (0 when COMMS_TRACE_DIR is unset). Safe from any thread.
COMMS_API int dump_traces();

}  // namespace comms
