// What happens to comms still alive when the program exits.
#pragma once

#include "comms/comm.h"

namespace comms::internal {

// Every Comm::Impl registers itself while it lives. When the process starts
// to exit, each one still alive is aborted and finalized, so its in-flight
// ops end with kAborted and its backend threads are joined before exit()
// destroys the program's static objects (which may be those ops' buffers).
// Without this, a program returning from main with an async op in flight
// has a backend thread reading freed memory and peers waiting on it.
void track_live_comm(Comm::Impl* impl);
void untrack_live_comm(Comm::Impl* impl);

}  // namespace comms::internal
