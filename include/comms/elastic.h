// Elastic recovery: the survivors of a lost rank revoke the comm, agree on
// who is gone, and shrink to a comm of themselves, without a restart.
//
//   try {
//     comm->all_reduce(grad, ReduceOp::sum());
//   } catch (const comms::Error& e) {
//     if (e.code() == ErrorCode::kInvalidArgument) throw;
//     comms::Recovery r = comms::recover(*comm);  // revoke + agree + shrink
//                                                 // (comm made elastic)
//     comm = r.comm;                              // the survivors, renumbered
//   }
//
// Only elastic comms (CommOptions::elastic, COMMS_ELASTIC=1) can: the
// others have no heartbeats or revocation watch, and these calls refuse them
// with kInvalidArgument (a planned shrink works on any comm).
//
// Everything goes through the job's store (commsrun hosts it outside the
// ranks, so it outlives any of them). Liveness comes from heartbeats that
// each process's comms watcher writes there about every 100 ms: a rank whose
// heartbeat stands still for the liveness timeout (dead, or stopped with
// SIGSTOP) is lost, and one whose process ended on this host at once; so is
// one that has not joined the agreement by its deadline. A rank whose
// process runs on this host is never lost before that deadline, however
// late its heartbeat (a watcher thread on a busy machine misses ticks). A rank that is
// alive learns of a revocation from the store within about 100 ms, however
// idle it is. A store that fails three heartbeats in a row is lost: the
// watcher revokes its elastic comms, whose ops then fail saying so, and
// these calls fail with kPeerFailure naming the store (a store that stops
// answering without closing its connections is noticed only when a call on
// it times out: the store's default timeout, 5 min).
//
// Threading: call these from the thread that issues the comm's ops (like
// ops), except revoke() and is_revoked(), which are safe from any thread.
#pragma once

#include "comms/export.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comms/comm.h"
#include "comms/store.h"

namespace comms {

struct AgreeOptions {
  // How long to wait for every live rank to join; ranks still missing then
  // are lost. Unset: the comm's op timeout.
  std::optional<std::chrono::milliseconds> timeout;
  // A rank whose heartbeat has not moved for this long is lost at once.
  // Unset: COMMS_ELASTIC_LIVENESS_TIMEOUT, else 1 s (a heartbeat comes every
  // 100 ms; a loaded machine delays some by several hundred).
  std::optional<std::chrono::milliseconds> liveness_timeout;
};

// The outcome of an agreement: the same on every survivor, never two answers.
struct Agreement {
  uint64_t epoch = 0;     // the shrunk comm's epoch: the parent's + 1
  std::vector<int> lost;  // ranks of the agreeing comm, ascending
  int round = 0;          // 0, or more when a rank died during a shrink
};

// Marks the comm revoked here and tells every other rank through the store:
// each rank's pending ops (once the revocation reached it) and all its later
// ops on the comm fail with ErrorCode::kRevoked. The backends are revoked
// (aborted, or NCCL's ncclCommRevoke), never destroyed (a rank may be stuck
// in them). Idempotent; any thread.
COMMS_API void revoke(Comm& comm, const std::string& reason = "revoke() called");
COMMS_API bool is_revoked(const Comm& comm);

// Agrees with every live rank of `comm` on the set of lost ranks. Collective
// over the survivors; they all return the same Agreement. A rank that the
// others declared lost (it came too late) gets Error(kPeerFailure). A rank
// that dies during the agreement is either in the set or, if it died after
// the decision, found by the next round (recover() runs it).
COMMS_API Agreement agree_on_failures(Comm& comm, const AgreeOptions& options = {});

// The comm of the survivors of an agreement, ranks renumbered in order, with
// the parent's backends, device, options, hints and timeouts; named
// "<parent's name>@e<epoch>" (".2", ".3", ... appended if this process
// already has a live comm of that name). Every survivor confirms the new comm through
// the store before any returns it; if one died meanwhile, all of them throw
// Error(kPeerFailure) and agree again (the next round finds it).
COMMS_API std::shared_ptr<Comm> shrink(Comm& comm, const Agreement& agreement);
// A planned shrink with no failure: every rank of `comm` calls it with the
// same exclude list; the excluded ranks get null, the others the new comm,
// named "<parent's name>@e<epoch>-without<r>_<r>...". `comm` stays usable.
COMMS_API std::shared_ptr<Comm> shrink(Comm& comm, std::span<const int> exclude);

struct Recovery {
  std::shared_ptr<Comm> comm;  // the survivors' comm
  Agreement agreement;
  std::chrono::milliseconds took{0};
};
// After a failed op: revoke, agree, shrink; repeated while ranks keep dying
// during the shrink. The old comm stays revoked (destroy it when done).
COMMS_API Recovery recover(Comm& comm, const AgreeOptions& options = {});

// A cheap per-step commit vote: true on every rank when every rank of `comm`
// passed ok = true, false on every rank otherwise (a rank voted false, died,
// or missed the deadline). Store-only (works on a broken comm), about four
// store round trips. A trainer applies a step only when the vote is true, so
// no survivor applies a step that another could not complete.
COMMS_API bool agree_all(Comm& comm, bool ok, const AgreeOptions& options = {});

// How many shrinks and admissions led to this comm (0 for one made by
// new_comm or split).
COMMS_API uint64_t epoch(const Comm& comm);

// ---- Growing: a newcomer joins, the members admit it ----------------------
//
//   // newcomer (started with the job's store variables, COMMS_STORE etc.):
//   auto comm = comms::join("world");        // blocks until admitted
//   // every member, at a step boundary of its choice:
//   comm = comms::admit(comm);              // the same comm when nobody waits
//
// The members keep their ranks; newcomers get N, N+1, ... in the order they
// called join(). The grown comm inherits the parent's backends, device,
// options, hints and timeouts (the newcomer learns them from the members
// through the store), is named "<first name>@e<epoch + 1>" and is built
// under a fresh store namespace.

struct JoinOptions {
  // How long to wait to be admitted; then Error(kTimeout), and no admit
  // takes this newcomer any more. Unset: COMMS_INIT_TIMEOUT, else 5 min.
  std::optional<std::chrono::milliseconds> timeout;
  // The job's store. Unset: default_store() from COMMS_STORE or
  // MASTER_ADDR/MASTER_PORT (never hosted by the newcomer).
  std::shared_ptr<Store> store;
};

struct AdmitOptions {
  // How long to wait for the leader's decision and, once newcomers are
  // taken, for every participant to build the grown comm (on top of the
  // init timeout the building itself may take); participants still missing
  // then are lost. Unset: the comm's op timeout.
  std::optional<std::chrono::milliseconds> timeout;
  // As AgreeOptions::liveness_timeout.
  std::optional<std::chrono::milliseconds> liveness_timeout;
};

// Joins the elastic comm named `name` (the name the job gave new_comm, or
// any of its epochs' names) as a newcomer: takes a ticket in the store,
// heartbeats there, and blocks until the members admit it. Returns the
// grown comm. An admission that fails on the members' side (a member lost
// during it: they recover() and admit again at their next step; or the
// others dropped this process as lost) is retried with a new ticket. Throws
// Error(kTimeout) when none succeeded within the timeout (the last failure
// is thrown when it came at the deadline), and Error(kAborted) within about
// 200 ms once the job closed its admissions (close_admissions), unless the
// members had already offered this process a place.
COMMS_API std::shared_ptr<Comm> join(const std::string& name, const JoinOptions& options = {});

// Admits the newcomers waiting to join `comm`'s name. Collective over the
// members of `comm` (all call it at the same point); returns `comm` itself
// when nobody waits, which costs rank 0 (the leader) one store add and one
// set and every other rank one store get: no op on the comm. Otherwise
// every member and newcomer builds the grown comm and confirms it through
// the store before any returns it: every participant gets the same member
// list or an error. A newcomer lost meanwhile is dropped and the others
// build again without it (`comm` itself comes back when none is left); a
// member lost meanwhile fails the admission with Error(kPeerFailure) on
// every participant, and recover(*comm) then shrinks `comm` as after any
// loss. `comm` stays usable either way; destroy it once the grown comm is
// in use. Elastic comms only (kInvalidArgument otherwise).
COMMS_API std::shared_ptr<Comm> admit(const std::shared_ptr<Comm>& comm, const AdmitOptions& options = {});

// Ends admissions to `comm`'s name for good (a job past its last step): a
// newcomer waiting in join(), and every later one, fails with
// Error(kAborted) saying so, instead of waiting out its timeout for an
// admit() that will not come (a replacement started just as the job ended).
// Not collective: any member may call it; once is enough. Elastic comms only
// (kInvalidArgument otherwise).
COMMS_API void close_admissions(const Comm& comm);

}  // namespace comms
