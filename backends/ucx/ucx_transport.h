// The CPU algorithms' transport (backends/cpu_algorithms/transport.h) on
// UCX: one UCP context and worker per comm, an endpoint to every peer, tag
// send/recv. A message's tag is (class, sender, sequence): the class is a
// Channel or point-to-point, the sequence counts messages per (peer,
// channel), so a receive matches exactly the message it expects.
//
// Sends never wait on the receiver's receive: a send UCX cannot finish at
// once goes on eager when it is below the eager threshold (finishing needs
// only the peer's progress), else it is copied into a buffer the transport
// owns and left in flight, so two ranks sending to each other both reach
// their receives (the transport's buffering rule). Later waits progress it.
// Credit: a receiver grants its sender one for every kCreditMessages
// collective messages received, and a sender waits for credit beyond
// 2 x kCreditMessages unreceived, so a rank that only sends (a gather's or
// reduce's non-root) cannot fill its receiver's memory.
// send_stable sends in place and is waited for in wait_sends.
//
// Waiting: progress the worker; spin while the settings allow, else arm the
// worker and poll its event fd, in slices that end at the deadline.
// abort() signals the worker, so a wait wakes from any thread. A peer's
// endpoint failure (UCP_ERR_HANDLING_MODE_PEER) fails waits on that peer.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comms/store.h"
#include "transport.h"

namespace comms::ucx_backend {

using cpu_algorithms::Clock;

struct UcxSettings {
  std::string tls;          // UCX_TLS for this comm's context; empty: UCX's own (UCX_TLS or all)
  std::string rndv_thresh;  // UCX_RNDV_THRESH; empty: UCX's own
  std::string busy_poll;    // "auto", "1" or "0"
  bool spin_forever = false;                  // busy_poll 1
  std::chrono::microseconds spin{0};          // poll this long before sleeping on the event fd
  bool yield = false;                         // sched_yield between polls, once past yield_after
  std::chrono::microseconds yield_after{0};   // poll without yielding this long first
  bool shm = true;                            // COMMS_UCX_SHM: the shared-memory collectives
  size_t zero_copy_min_bytes = 0;             // the zero-copy path's smallest op per rank (zero_copy.h)
};

// How a wait loop spends the time between checks of what it waits for:
// progress the worker, spin, past yield_after hand the core over each pass,
// and past spin sleep on the worker's event fd. The busy_poll hint changes
// the settings while ops wait, hence atomics.
class WaitPolicy {
 public:
  void set(const UcxSettings& s) {
    spin_forever_ = s.spin_forever;
    spin_us_ = s.spin.count();
    yield_ = s.yield;
    yield_after_us_ = s.yield_after.count();
  }
  // When a wait that starts now stops spinning and starts yielding.
  struct Phases {
    Clock::time_point spin_until, yield_from;
  };
  Phases start() const {
    const auto now = Clock::now();
    return {now + std::chrono::microseconds(spin_us_.load(std::memory_order_relaxed)),
            now + std::chrono::microseconds(yield_after_us_.load(std::memory_order_relaxed))};
  }
  // One pass of a wait on `worker` that found nothing done. A sleep on
  // `efd` (-1: none, yield instead) lasts until `deadline`, clamped to
  // [min_sleep_ms, max_sleep_ms]: the bound is what a missed wake-up costs.
  void progress_or_sleep(ucp_worker_h worker, int efd, Clock::time_point deadline, const Phases& phases,
                         int min_sleep_ms, int max_sleep_ms) const;

 private:
  std::atomic<bool> spin_forever_{false};
  std::atomic<int64_t> spin_us_{0};
  std::atomic<bool> yield_{false};
  std::atomic<int64_t> yield_after_us_{0};
};

// The eager/rendezvous threshold a context gets, for describe(): the hint,
// else UCX_RNDV_THRESH, else comms' default (every small-op message eager).
std::string rndv_thresh_text(const UcxSettings& settings);

// The shape of the shared-memory transports' receive FIFO each context
// gets (UCX's MM_FIFO_ELEM_SIZE and MM_FIFO_SIZE): the environment's
// (UCX_SYSV_/UCX_POSIX_/UCX_MM_...), else comms' below.
inline constexpr size_t kFifoElemBytes = 16384 + 256;  // a 16 KiB message and its headers
inline constexpr size_t kFifoElems = 16;
struct FifoSetting {
  std::string key;  // UCX's variable without the UCX_ prefix
  std::string value;
  bool from_user = false;
};
std::vector<FifoSetting> fifo_settings();
std::string fifo_text();  // for describe()

// False once the process has exited (or is a zombie nobody reaped yet).
bool process_alive(int pid);

// Messages to and from comms' log (level 0 debug .. 3 error).
using LogFn = void (*)(int level, const char* message);

class UcxTransport final : public cpu_algorithms::Transport {
 public:
  // Creates the context and worker. Throws std::runtime_error naming the
  // UCX call that failed.
  UcxTransport(int rank, int size, const UcxSettings& settings, LogFn log);
  ~UcxTransport() override;

  // Collective: publishes this worker's address under "ucx/addr/<rank>" in
  // the store (the comm's prefix) and connects to every peer.
  void connect(Store& store, std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, cpu_algorithms::Channel ch, cpu_algorithms::Region src, size_t offset, size_t len,
            size_t dst_offset, Clock::time_point deadline) override;
  void recv(int peer, cpu_algorithms::Channel ch, cpu_algorithms::Region dst, size_t dst_offset, size_t len,
            Clock::time_point deadline) override;
  void send_stable(int peer, cpu_algorithms::Channel ch, cpu_algorithms::Region src, size_t offset, size_t len,
                   size_t dst_offset, Clock::time_point deadline) override;
  void wait_sends(Clock::time_point deadline) override;
  bool sends_in_place() const override { return true; }
  // A peer on this host whose endpoint UCX gave a cma lane (so cross-memory
  // attach is allowed, and UCX_TLS did not leave it out): one
  // process_vm_writev / process_vm_readv, in kDirectChunkBytes steps that
  // check abort, deadline and the peer between them.
  bool direct_possible(int peer) const override { return pids_[static_cast<size_t>(peer)] > 0; }
  // peer's pid when it runs on this host (connect() found it so), else 0.
  int pid_of(int peer) const { return pids_[static_cast<size_t>(peer)]; }
  bool copies_direct(int peer) const override { return direct_[static_cast<size_t>(peer)]; }
  // For describe(): "every peer", "none", or the ranks it copies with.
  std::string direct_text() const;
  void write_direct(int peer, const void* local, uint64_t remote, size_t len, Clock::time_point deadline) override;
  void read_direct(int peer, void* local, uint64_t remote, size_t len, Clock::time_point deadline) override;
  // Drops in-place sends an op left behind (it threw): UCX must not keep
  // reading a buffer the caller may free.
  void op_done() override;
  void abort() override;

  // Point-to-point with the caller's tag. Sends and receives are posted
  // first, then waited for together; a lone send returns once UCX or the
  // transport's copy holds the data.
  struct P2P {
    bool send = false;
    int peer = -1;
    uint32_t tag = 0;
    void* data = nullptr;
    size_t bytes = 0;
  };
  void point_to_point(const std::vector<P2P>& ops, Clock::time_point deadline);

  // Waits (until deadline) for the copies still in flight, then closes the
  // endpoints. Returns false if some did not finish.
  bool flush(Clock::time_point deadline);

  // Every peer runs on this host (connect() found them so).
  bool all_peers_local() const;
  // Per rank: its host, numbered by each host's lowest rank (the same
  // table on every rank; the hierarchical collectives group by it).
  const std::vector<int>& host_of() const { return hosts_; }
  // Throws kPeerFailure once peer's process has exited or its endpoint
  // failed (for waits outside UCX: the shared-memory collectives).
  void check_peer(int peer) {
    check_peer_alive(peer);
    if (peer_status_[static_cast<size_t>(peer)]) {
      fail(cpu_algorithms::TransportError::Kind::kPeerFailure, peer, peer_error(peer));
    }
  }

  // Sends an op left in flight (a rendezvous, a full FIFO) need this rank's
  // progress to finish, and a peer's receive may wait on them: a wait
  // outside UCX calls this between its polls. Progresses the worker only
  // while some are left; true while some are.
  bool progress_in_flight();
  // Whether a buffered send is still in flight (cheap: no UCX call).
  bool has_in_flight() const;

  // What describe() and comms-info show: the devices the context opened
  // and the transports an endpoint to a peer selected.
  std::string devices() const;
  std::string transports() const;

  // The polling part of the settings; may change while an op waits.
  void set_spin(const UcxSettings& s) { wait_policy_.set(s); }

 private:
  struct PeerSlot {
    UcxTransport* self;
    int rank;
  };
  struct Credit {
    uint64_t sent = 0;      // collective messages sent to the peer
    uint64_t granted = 0;   // of those, the ones the peer has reported received
    uint64_t received = 0;  // collective messages received from the peer
    uint32_t grant_seq = 0, take_seq = 0;  // grants sent to / received from the peer
    void* take_req = nullptr;  // the receive posted for the peer's next grant
    uint8_t take_buf = 0;
  };
  struct InFlight {
    void* req = nullptr;
    int peer = -1;
    uint64_t order = 0;  // posting order, to wait for the oldest first
    std::vector<unsigned char> copy;
  };
  void handshake(Clock::time_point deadline);
  // Marks a peer on this host failed once its process has exited; checks
  // at most every kLivenessPeriod.
  void check_peer_alive(int peer);
  static constexpr std::chrono::milliseconds kLivenessPeriod{50};
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Sends without waiting for the receiver: see the header comment.
  // peer_may_be_gone: the peer need not be in this op (a credit grant), so
  // an eager send is never waited for either.
  void send_buffered(int peer, uint64_t tag, const void* data, size_t len, Clock::time_point deadline,
                     bool peer_may_be_gone = false);
  // Credit (see the header comment): take_credit before each collective
  // message to peer, grant_credit after each one received from it.
  void take_credit(int peer, Clock::time_point deadline);
  void grant_credit(int peer, Clock::time_point deadline);
  void post_credit_receive(int peer);
  void* post_send(int peer, uint64_t tag, const void* data, size_t len);
  void* post_recv(int peer, uint64_t tag, void* data, size_t len);
  // Waits for req; throws TransportError on a timeout, abort or failure of peer.
  void wait(void*& req, int peer, Clock::time_point deadline, const char* what);
  void cancel(void*& req);
  void reap();  // frees finished in-flight copies
  void limit_in_flight(int peer, Clock::time_point deadline);
  static constexpr int kMaxInFlightPerPeer = 4;
  // The algorithms never need more than two unread messages per link, so a
  // window of 2 x kCreditMessages cannot deadlock.
  static constexpr uint64_t kCreditMessages = 8;
  [[noreturn]] void fail(cpu_algorithms::TransportError::Kind kind, int peer, const std::string& what) const;
  std::string peer_error(int peer) const;

  int rank_, size_;
  LogFn log_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<PeerSlot> slots_;
  std::vector<std::atomic<int>> peer_status_;  // ucs_status_t of a failed endpoint, 0 while fine
  std::vector<std::vector<uint32_t>> send_seq_, recv_seq_;  // per peer, per channel
  std::vector<int> pids_;       // per rank: its pid when on this host, else 0 (UCX watches it)
  std::vector<bool> dead_pid_;  // per rank: failed because its process exited
  std::vector<bool> direct_;    // per rank: copies_direct
  std::vector<int> hosts_;      // per rank: host_of
  static constexpr size_t kDirectChunkBytes = 16 << 20;
  void copy_direct(bool write, int peer, void* local, uint64_t remote, size_t len, Clock::time_point deadline);
  Clock::time_point next_liveness_check_{};
  std::vector<InFlight> in_flight_;
  std::vector<Credit> credit_;  // per peer; never resized after construction (receives point into it)
  uint64_t posted_ = 0;
  size_t eager_limit_ = 0;  // messages shorter than this go eager; 0: not known (a threshold was given)
  std::vector<std::pair<void*, int>> in_place_;  // this op's send_stable requests and their peers
  std::atomic<bool> aborted_{false};
  WaitPolicy wait_policy_;
};

}  // namespace comms::ucx_backend
