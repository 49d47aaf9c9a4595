// The UCX backend: every comms operation on CPU buffers over UCX (shared
// memory and cross-memory attach on one host, TCP or RDMA across hosts).
// Built only against include/comms/plugin.h and UCX; the backend class is
// a cpu_algorithms::CpuBackend, its collectives the CPU algorithms
// (backends/cpu_algorithms/plan.h) on a UCX transport (ucx_transport.h) or
// the shared-memory collectives (shm_collectives.h), as its plan
// (ucx_plan.h) picks.
#pragma once

#include <memory>
#include <string>

#include "comms/plugin.h"
#include "ucx_transport.h"

namespace comms::ucx_backend {

// Hint keys (without the "ucx." prefix): UCX_TLS and UCX_RNDV_THRESH for
// this comm's UCX context, how waits poll (as gloo.busy_poll), and the
// zero-copy path's smallest op.
inline constexpr const char* kHintKeys[] = {"tls", "rndv_thresh", "busy_poll", "zero_copy_min_bytes", nullptr};

// The zero-copy path (zero_copy.h) takes ops of at least this many bytes
// per rank. Rule: an op whose buffers are not all host-shared pays one
// exchange through the segment to learn so; from this size up that is a few
// percent of its usual path at most, and less the larger the op, while
// ops on host-shared buffers already run near the floor here
// (docs/PERFORMANCE.md, "Zero-copy CPU buffers (UCX)").
inline constexpr size_t kZeroCopyDefaultMinBytes = 256 * 1024;

// Spin before sleeping on the worker's event fd, when ranks on the host do
// not outnumber its cores ("auto").
inline constexpr std::chrono::microseconds kAutoSpin{100};
// ... of which the first microseconds poll without yielding: a peer running
// on the other core answers within them (a yield per poll cost 0.6 us at
// 4 KiB), while a peer that shares this core gets it soon after.
inline constexpr std::chrono::microseconds kAutoPureSpin{3};
// When they do outnumber them ("auto"): poll this long, yielding the core
// after every empty poll, then sleep. A peer that needs the core gets it at
// once, and a message that is a few microseconds away costs no wake-up.
inline constexpr std::chrono::microseconds kOversubscribedYield{50};

// Resolves hints, then COMMS_UCX_BUSY_POLL and COMMS_UCX_ZERO_COPY_MIN_BYTES, then defaults. UCX_TLS and
// UCX_RNDV_THRESH in the environment stay UCX's own defaults. Errors name
// the hint or variable, the value and why.
Status resolve_settings(const Hints& hints, int local_size, UcxSettings* out);

Status create_backend(const plugin::BackendInit& init, std::unique_ptr<plugin::Backend>* out);

}  // namespace comms::ucx_backend
