// Zero-copy collectives on host-shared buffers (host_shared_memory.h): when
// every rank's buffers of an op lie in memory from alloc_backend_memory,
// each rank maps its peers' buffers and runs its share of the op on them
// (cpu_algorithms/zero_copy_kernels.h): it reads its slice of every input
// and writes the result straight into every output. Every byte crosses
// memory once, as in comms-bench's floor; no kernel copy, no bounce.
//
// Per op, through the shared-memory segment's slots and waits
// (shm_collectives.h), so every rank decides alike:
//   1. every rank publishes where its buffers lie (or that they are not
//      host-shared) and its count of released allocations;
//   2. if any rank's buffer is not host-shared, every rank returns false
//      and the op takes its usual path; else each rank maps what it lacks
//      and publishes whether that worked (a failed mapping is a fall-back
//      too, before anyone has written anything), unless every rank's
//      record equals its record of the last op that ran here: then every
//      rank holds those mappings still and all skip this exchange alike;
//   3. each rank runs its share, then waits for every other: an op returns
//      only once no rank reads its input or writes its output any more.
// A peer that dies meanwhile fails the waits with kPeerFailure naming it;
// its memory stays mapped, so a rank in the middle of its share finishes it.
//
// Mappings are cached per (rank, inode) and dropped when that rank's count
// of released allocations moved (its freed memory is not kept alive here),
// and all of them on finalize and offload (the destructor) and on abort.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "comms/plugin.h"
#include "shm_collectives.h"

namespace comms::ucx_backend {

class ZeroCopy {
 public:
  // pids: every rank's process id (this rank's unused). Which ops come
  // here is the plan's to say (ucx_plan.h, Plan::zero_copy_first).
  ZeroCopy(ShmCollectives& shm, int rank, std::vector<int> pids, LogFn log);
  ~ZeroCopy();
  ZeroCopy(const ZeroCopy&) = delete;
  ZeroCopy& operator=(const ZeroCopy&) = delete;

  // Runs op (one the zero-copy kernels have) zero-copy and returns true, or returns false having touched no
  // buffer when some rank's buffers are not host-shared (every rank then
  // returns false). Throws as ShmCollectives::run does.
  bool run(const plugin::OpDesc& op);
  // From any thread, after ShmCollectives::abort(): unmaps every peer's
  // buffer once the running op (whose waits now throw) lets go, within
  // 200 ms; the comm is broken, so no op maps again.
  void abort();
  // The ops that skipped step 2 (describe()'s zero_copy.ops_on_held_mappings).
  uint64_t ops_on_held_mappings() const { return held_ops_.load(std::memory_order_relaxed); }


 private:
  struct Mapping {
    uint64_t inode;
    unsigned char* base;
    size_t bytes;
  };
  struct Peer {
    int pid = 0;
    uint64_t releases_seen = 0;
    std::vector<Mapping> mappings;
  };
  struct Record;
  // A peer's buffer at `where`, mapped now or earlier; null (logged) when
  // mapping fails.
  unsigned char* map(int peer, const Record& r, bool output);
  void drop_mappings(Peer& p);
  // Publishes mine, reads every rank's record into records_, and says
  // whether every rank is ready (the same answer on every rank).
  bool all_ready(const Record& mine, size_t op_bytes, ShmCollectives::Deadline& deadline);
  // Every rank's record equals the one of the last op that ran here.
  bool same_as_last(const std::vector<Record>& now) const;

  ShmCollectives& shm_;
  const int rank_, size_;
  LogFn log_;
  std::mutex mu_;  // held by run(): abort() unmaps only between ops
  bool aborted_ = false;
  std::vector<Peer> peers_;
  // Per op, kept to spare the allocations.
  std::vector<Record> records_;
  // The step-1 records of the last op, and whether it ran here (and every
  // op since went through step 1 on every rank: the same on every rank).
  std::vector<Record> last_records_;
  bool last_ran_ = false;
  std::atomic<uint64_t> held_ops_{0};
  std::vector<const void*> inputs_;
  std::vector<void*> outputs_;
};

}  // namespace comms::ucx_backend
