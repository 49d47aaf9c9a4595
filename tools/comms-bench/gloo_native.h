// comms-bench's --gloo-native baseline: what Gloo itself offers for an op,
// through Gloo's public headers only, on meshes of its own (connected
// through the job's store), without libcomms. Gloo's synchronous algorithm
// class for the op where Gloo has one and the size is one that comms' CPU
// backends run on their own synchronous paths; Gloo's options-style
// collective otherwise:
//   barrier                            BarrierAllToAll
//   all_reduce up to kNativeSyncMaxBytes per rank:
//     n x bytes <= kNativeGatherMaxBytes  AllgatherRing, then a local reduction
//     else                                AllreduceRing
//   broadcast up to kNativeSyncMaxBytes BroadcastOneToAll
//   everything else                    gloo::allreduce, reduce, broadcast,
//                                      allgather, alltoall, gather, scatter;
//                                      reduce_scatter as alltoall and a local
//                                      reduction; send_recv as unbound buffers
// One rank connects nothing: each op is the copy a one-rank comm makes.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "baseline.h"
#include "comms/store.h"

namespace comms::bench {

// The bench's choice of sizes for Gloo's synchronous algorithm classes:
// those up to which comms' CPU backends run small collectives on their own
// synchronous paths, so that each of those paths meets Gloo's counterpart.
inline constexpr size_t kNativeSyncMaxBytes = 256 * 1024;
inline constexpr size_t kNativeGatherMaxBytes = 64 * 1024;

// Connects a synchronous and an asynchronous mesh of Gloo's tcp pairs
// through `store` (collective over the job), on loopback when every rank is
// on this host (local_size == size), else on this host's name. `busy_poll`: the synchronous pairs spin on their sockets (Gloo's
// busy-poll mode) instead of blocking, as the gloo backend's busy_poll=1.
std::unique_ptr<Baseline> open_gloo_native(Store& store, int rank, int size, int local_size,
                                           std::chrono::milliseconds timeout, bool busy_poll);

}  // namespace comms::bench
