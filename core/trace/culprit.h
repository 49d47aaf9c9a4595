// The store protocol of the culprit search (service.h's find_culprit): a
// timed-out rank bumps kRequestKey; every rank's watcher then publishes, for
// each of its comms, how far it got under that request number.
#pragma once

#include <cstdint>
#include <string>

#include "trace/recorder.h"

namespace comms::trace {

inline constexpr const char* kRequestKey = "comms-trace/request";

// Sets this rank's progress on `recorder`'s comm for request `req`, in
// collectives (Recorder::last_entered_collective):
// "<entered> <completed> <entered op> <completed op>".
void publish_progress(const Recorder& recorder, int64_t req);

}  // namespace comms::trace
