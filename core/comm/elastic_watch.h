// Elastic recovery's background half: every comm with peers is watched, on
// the trace watcher's thread (about every 100 ms), for
// - heartbeats: each process bumps "comms/elastic/hb/<process token>" on its
//   comms' stores (the token is unique to the process; each comm records
//   its ranks' tokens under "<namespace>/elastic/process/<rank>" when it is
//   created), so an agreement can tell a dead or stopped rank (its counter
//   stands still) from a slow one;
// - revocations: revoke() publishes "<comm namespace>/elastic/revoked" and
//   bumps "comms/elastic/revocations"; a change of that one counter makes the
//   watcher look for its revoked comms and revoke them here too, so that
//   their pending and future ops fail with kRevoked on every rank.
// No thread of its own, no spinning: one or two store calls per tick.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comms/comm.h"
#include "comms/store.h"

namespace comms::internal {

// Records this process's token for `rank` of the comm and starts watching.
void watch_comm(Comm::Impl* impl, std::shared_ptr<Store> store, std::string ns, int rank);
// Blocks until a tick in progress has let go of `impl`.
void unwatch_comm(Comm::Impl* impl);

std::string revoked_key(const std::string& ns);
// This process's token ("host:pid:nonce"), which keys its heartbeat.
const std::string& process_token();
// Where rank `rank` of the comm `ns` recorded its process's token.
std::string process_key(const std::string& ns, int rank);
// The heartbeat counter of the process whose token is stored at `token_key`
// (process_key(), or a newcomer's ticket); *pid is that process's pid when
// it is on this host, else -1.
std::string heartbeat_key_at(Store& store, const std::string& token_key, std::chrono::milliseconds timeout,
                             int* pid);
// The pid of the process of `token` when it is on this host, else -1.
int local_pid(const std::string& token);
// Heartbeats this process on `store` while no comm of it is watched there
// (a newcomer waiting to be admitted): from construction to destruction.
class StoreHeartbeat {
 public:
  explicit StoreHeartbeat(std::shared_ptr<Store> store);
  ~StoreHeartbeat();
  StoreHeartbeat(const StoreHeartbeat&) = delete;
  StoreHeartbeat& operator=(const StoreHeartbeat&) = delete;

 private:
  std::shared_ptr<Store> store_;
};
// A process on this host, from /proc: a local rank needs no heartbeat to
// tell that it ended, nor that it runs (a stalled watcher thread on a busy
// machine is not a lost rank); only a stopped one (SIGSTOP) is judged by its
// heartbeat. (A dead rank's pid reused meanwhile reads as running: then
// only the agreement's deadline finds it.)
enum class LocalState { kRunning, kStopped, kEnded };
LocalState local_state(int pid);
// Why the watcher gave up on `store` (it failed several ticks in a row; the
// watched comms on it were revoked then), or nothing.
std::optional<std::string> store_lost(const Store& store);
// Tells every rank's watcher that the comm of namespace `ns` is revoked.
void publish_revocation(Store& store, const std::string& ns, const std::string& reason);

}  // namespace comms::internal
