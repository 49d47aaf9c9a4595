// Small collectives through one shared-memory segment that every rank of a
// comm maps, beside the UCX transport, when all ranks share a host (as Open
// MPI's shared-memory collectives and NCCL's low-latency protocol do): each
// rank copies its input into its own slot and publishes the op's number in
// the slot's first cache line (beside up to 48 B of the data); readers wait
// for the numbers and read the slots. No messages, no tag matching: an 8 B
// all_reduce moves one cache line each way instead of a send and a receive
// per peer.
//
// Ops: barrier, and all_reduce, all_gather, reduce_scatter and broadcast
// whose data per rank fits kShmMaxBytes and which the CPU algorithms would
// run as a direct exchange (or broadcast from the root), as the UCX plan
// picks them (ucx_plan.h): the same reductions in rank order as
// Collectives::all_reduce, so the same bits on every rank and either path.
// Each slot starts with the op's length and number, so ranks
// that pass different counts get CountMismatch as on the exchange path.
//
// Each rank has kDepth slots, used in turn; a rank writes a slot again only
// once every peer has read the op that used it last: a peer that published
// a later op has (ops run in order), and a broadcast's readers, whose root
// waits for no one, publish a done flag. Waiting follows the UCX settings:
// poll (a pause between looks, no clock reads, for the first ~2 us), spin
// (yielding when asked) up to the spin time, then sleep on a futex in the
// segment, in slices of at most kSliceMs, between which a dead peer
// process, the deadline and abort are checked.
//
// The segment is created by rank 0 under a unique POSIX shm name and
// unlinked as soon as every rank has mapped it, so a crash leaves nothing
// behind once the comm is up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "comms/plugin.h"
#include "comms/store.h"
#include "reductions.h"
#include "transport.h"
#include "ucx_plan.h"
#include "ucx_transport.h"

namespace comms::ucx_backend {

class ShmCollectives {
 public:
  static constexpr int kSliceMs = 50;
  // Slots per rank, used in turn: a broadcast's root (which waits for no
  // one) runs at most this many ops ahead of its slowest reader.
  static constexpr uint64_t kDepth = 8;

  // Collective over the comm's store: every rank gets a segment, or every
  // rank gets nullptr (a rank could not map it; then the UCX path runs
  // everything). `transport` must outlive the result; it names dead peers.
  static std::unique_ptr<ShmCollectives> create(UcxTransport& transport, Store& store,
                                                std::chrono::milliseconds timeout, const UcxSettings& settings,
                                                LogFn log);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // An op the UCX plan gives to this path (ucx_plan.h). Throws TransportError (timeout, a dead peer, abort), CountMismatch, or
  // std::invalid_argument for a missing reduction.
  void run(const plugin::OpDesc& op);
  // From any thread: the running wait and every later one throw kAborted.
  void abort();
  void set_spin(const UcxSettings& s);

  // The op's timeout counts from the first wait that stops polling (one
  // clock read fewer on an op that never waits long).
  struct Deadline {
    std::chrono::milliseconds timeout;
    Clock::time_point when{};
    bool set = false;
    Clock::time_point at(Clock::time_point now) {
      if (!set) when = now + timeout, set = true;
      return when;
    }
  };
  // For a path that builds on this segment's ordering and waits (the
  // zero-copy path, zero_copy.h); each call is one op of this comm's
  // numbering, so every rank makes the same calls in the same order.
  // Publishes `record_bytes` (<= kShmMaxBytes) of `record`, waits for every
  // rank's record of this op and copies them, in rank order, into `all`
  // (size * record_bytes). op_bytes: the op's bytes per rank; ranks that
  // disagree get CountMismatch, as on the other paths.
  void exchange_records(const void* record, size_t record_bytes, size_t op_bytes, void* all, Deadline& deadline);
  // Returns once every rank has arrived.
  void sync(Deadline& deadline);

 private:
  struct Bell;
  struct Header;
  struct RankFlags;
  // Publishes this rank's done flag for an op when it leaves scope, if
  // `always` (a broadcast's reader) or the op did not reach finish() (it
  // threw): a peer never waits on this rank's reading. (A flag, not
  // std::uncaught_exceptions(), which costs a thread-local lookup per op.)
  struct Reading {
    Reading(ShmCollectives& s, uint64_t op, bool always) : s(s), op(op), always(always) {}
    ~Reading();
    void finish() { finished = true; }
    ShmCollectives& s;
    uint64_t op;
    bool always;
    bool finished = false;
  };
  ShmCollectives(UcxTransport& transport, void* base, size_t bytes, const UcxSettings& settings);

  unsigned char* slot(int rank, uint64_t op) const;
  [[noreturn, gnu::cold]] void throw_count_mismatch(int p, size_t block_bytes, bool same_op, size_t sent) const;
  Header* header(int rank, uint64_t op) const;
  // Writes this rank's slot for op and publishes it.
  void write_slot(uint64_t op, const void* data, size_t bytes, size_t block_bytes);
  // Throws CountMismatch naming the first rank (or only_peer) whose slot
  // header is not this op's with block_bytes.
  void check_lengths(uint64_t op, size_t block_bytes, int only_peer = -1) const;
  void reduce_slots(void* out, uint64_t op, size_t offset, size_t count, cpu_algorithms::ReduceFn fn) const;
  void publish(std::atomic<uint64_t>& flag, uint64_t op);
  // The publish's fence and bell: wakes the sleepers if some publish since
  // the last call may have been missed by them.
  void ring_if_sleepers();
  // Waits until every peer (or only_peer) has published its slot for op.
  void wait_arrived(uint64_t op, int only_peer, Deadline& deadline);
  // Returns once ready(p) holds for every peer p (only `only_peer` if >= 0);
  // throws on timeout, abort or a peer that exited.
  template <class Ready>
  void wait_until(Ready ready, int only_peer, Deadline& deadline, const char* what);
  // wait_until's slow part, from the first peer `p` found missing.
  template <class Ready>
  void wait_for(Ready ready, int p, int only_peer, Deadline& deadline, const char* what);
  template <class Ready>
  int first_missing(const Ready& ready, int only_peer) const;
  void sleep(Deadline& deadline);

  // Fills this rank's slot (bytes of in, headed by block_bytes) and waits
  // for every peer's; returns the op's number, whose slots are then read.
  uint64_t exchange(const void* in, size_t bytes, size_t block_bytes, Deadline& deadline);
  void reduce(const plugin::OpDesc& op, size_t blocks, Deadline& deadline);
  void all_gather(const plugin::OpDesc& op, Deadline& deadline);
  void broadcast(const plugin::OpDesc& op, Deadline& deadline);
  void barrier(Deadline& deadline);
  // Before writing this op's slot: the op kDepth back used it.
  void reuse_guard(uint64_t op, Deadline& deadline);

  UcxTransport& t_;
  const int rank_, size_;
  void* base_;
  size_t bytes_;
  Bell* bell_;
  RankFlags* flags_;
  unsigned char* slots_;
  bool ring_pending_ = false;
  uint64_t ops_ = 0;  // this comm's shm ops so far: the same on every rank
  std::vector<uint64_t> seen_;  // per rank: the last op whose slot this rank saw published
  // Per rank: its done flag as this rank last read it. A flag only grows, so
  // a broadcast's root reads a reader's line again only when the copy is
  // too old: about once every kDepth broadcasts, not every one.
  std::vector<uint64_t> done_seen_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> spin_forever_{false}, yield_{false};
  std::atomic<int64_t> spin_us_{0}, yield_after_us_{0};
};

}  // namespace comms::ucx_backend
