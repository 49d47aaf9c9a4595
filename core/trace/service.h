// What the recorder does beyond recording: the process's registry of comms,
// dumps to $COMMS_TRACE_DIR, a watcher thread that answers other ranks'
// questions (and SIGUSR1), the culprit search behind a timeout message, and
// COMMS_DEBUG=detail's argument check.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "trace/recorder.h"

namespace comms::trace {

// A recorder for a new comm, known to dumps and the watcher until it dies.
std::shared_ptr<Recorder> register_comm(CommInfo info);

// Runs `hook` on the watcher thread about every 100 ms (elastic recovery's
// heartbeats and revocation checks). It must not block for long.
void set_tick_hook(void (*hook)());
// Starts the watcher thread unless it runs (register_comm does for a comm
// with peers; a process with none yet, such as a newcomer waiting to join,
// still heartbeats through the tick hook).
void start_watcher();

// Writes $COMMS_TRACE_DIR/<comm>.rank<R>.json (nothing when it is unset).
// Never throws; a failure is logged.
// Returns whether a file was written.
bool dump(const Recorder& recorder, const std::string& reason);
// Every live comm of this process; returns how many files were written.
int dump_all(const std::string& reason);

// After `collective` (Recorder::issued's number) of `recorder`'s comm timed
// out: asks the store how far every rank got in collectives (bounded: about
// 3 s, never more than 5 s) and says who is behind, e.g. "ranks that never
// entered collective #5 (all_reduce): [2] (rank 2 last completed collective
// #4 (all_reduce))". Also makes every rank's watcher dump its comms. Empty
// for a point-to-point op (collective 0): its error names its peer.
std::string find_culprit(const std::shared_ptr<Recorder>& recorder, uint64_t collective, plugin::OpType op);

// COMMS_DEBUG=detail, read once.
bool detail_checks();
// Exchanges `r`'s op, dtype, count, root and reduction with every rank through
// the store; a difference is kInvalidArgument naming each rank's arguments.
// `counts` is the list a v-op agrees on ("" for others).
Status check_same_args(const Recorder& recorder, const OpRecord& r, const std::string& counts,
                       std::chrono::milliseconds timeout);

}  // namespace comms::trace
