// comms-bench -C put: one-sided windows (comms/window.h) beside the same
// transfer by send/recv, in one run, on pairs of ranks (r, r ^ 1; the even
// rank starts). Four rows per size:
//   put lat        a signalled put and the peer's signalled put back (a
//                  ping-pong); half the round trip, p50 and p99 over -n
//   send_recv lat  the same ping-pong by send and recv
//   put bw         -n puts of the size in a row, then one signal and the
//                  peer's signal back; bytes / (time / n)
//   send_recv bw   -n sends in a row, then a 1-byte reply
// The bandwidth rows' data is checked on the receiver (#wrong). With -R 1
// the window, the sources and the receive buffers come from the comm's
// allocator, registered (on cpu:ucx: puts become copies into a mapping).
#pragma once

#include <memory>

#include "comms/comm.h"
#include "options.h"

namespace comms::bench {

// Runs every size of -b..-e (-f/-i steps) and prints the rows on rank 0.
// Returns the process status (1 when some data was wrong).
int run_put_bench(const Flags& flags, std::shared_ptr<Comm> comm);

}  // namespace comms::bench
