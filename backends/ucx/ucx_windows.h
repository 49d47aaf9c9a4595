// One-sided windows on UCX (plugin ABI 2.6): a UCP context and worker of
// their own (RMA and 64-bit atomics), made at the comm's first window, so
// the tag transport of the collectives keeps the lanes and the progress it
// had. Per window, this rank maps its buffer (ucp_mem_map) and a signal
// array UCX allocates (one uint64 per source rank), and every rank unpacks
// every peer's remote keys, exchanged through the store at registration.
//
// put: to a peer on this host whose window lies in host-shared memory
// (alloc_backend_memory, host_shared_memory.h), a memcpy into this rank's
// mapping of that memory, mapped once per peer allocation at registration
// and kept while a window uses it. Otherwise, to a peer on this host with cross-memory attach, the transport's
// direct copy (process_vm_writev) into its buffer: UCX 1.13 gives plain RMA
// no cma lane, and its software emulation through the peer's worker waits
// for the peer's progress. To other peers ucp_put_nbx, waited for until the
// source may be reused. signal: a flush of the endpoint to the peer when
// UCX puts went to it since the last one (a direct copy is visible when it
// returns), then ucp_atomic_op_nbx(ADD, 1) on the peer's counter of this
// rank, and a flush again, so that the signal has left this worker when it
// returns (skipped once the endpoint to a peer on this host is wired up:
// the add is then a CPU atomic on the shared counters, done in place). wait_signal
// polls this rank's counters against what earlier waits consumed,
// progressing the worker (software-emulated RMA needs it), with acquire
// loads that pair with the release before each signal: a memcpy put is
// visible to whoever saw the signal after it. flush: a flush of every
// endpoint with unflushed puts (memcpy puts are complete when they return).
//
// Waiting: spin and yield as the backend's busy_poll settings say, then
// sleep on the worker's event fd in slices of at most 1 ms (a CPU atomic
// raises no event: the slice bounds the delay). A peer on this host is
// watched by its pid (UCX's shared-memory transports cannot report its
// failure), one on another host by UCX's endpoint error handler.
//
// Ops run on the issuing thread, one at a time (a mutex: abort() takes it to
// release the windows once the running op has woken; the destructor
// releases what abort() could not).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comms/plugin.h"
#include "comms/store.h"
#include "host_shared_memory.h"
#include "ucx_transport.h"

namespace comms::ucx_backend {

class UcxWindows {
 public:
  // pids: per rank, its pid when on this host, else 0 (UcxTransport::pid_of).
  // direct: the transport, whose cross-memory attach copies (write_direct)
  // carry puts to the peers it copies_direct with; may be null.
  UcxWindows(int rank, int size, std::vector<int> pids, cpu_algorithms::Transport* direct,
             const UcxSettings& settings, LogFn log);
  ~UcxWindows();  // releases every window, then the worker and context
  UcxWindows(const UcxWindows&) = delete;
  UcxWindows& operator=(const UcxWindows&) = delete;

  // Collective over the comm. The first call connects the worker to every
  // peer (addresses through `store`). Throws TransportError or
  // std::runtime_error.
  void* register_window(Store& store, void* data, size_t bytes, std::chrono::milliseconds timeout);
  // Unmaps this rank's part and drops the peers' keys (libcomms made every
  // rank flush and arrive first).
  void deregister_window(void* window);
  // Runs one op (validated by libcomms); throws TransportError on a
  // timeout, abort or failed peer.
  void run(const plugin::WindowOpDesc& op);
  // Wakes the running op (it fails with kAborted), then releases every
  // window; later ops fail with kAborted. Safe from any thread.
  void abort();
  void set_spin(const UcxSettings& s);

 private:
  struct Window;
  void connect(Store& store, std::chrono::milliseconds timeout);
  void deregister_window_locked(Window* w);
  void release_all();
  void put(Window& w, const plugin::WindowOpDesc& op, Clock::time_point deadline);
  void signal(Window& w, int peer, Clock::time_point deadline);
  void wait_signal(Window& w, const plugin::WindowOpDesc& op, Clock::time_point deadline);
  void flush_peer(Window& w, int peer, Clock::time_point deadline);
  // Waits for a UCX request (null: done at once), failing on peer's death,
  // abort or the deadline.
  void wait(ucs_status_ptr_t req, int peer, Clock::time_point deadline, const char* what);
  // Throws kPeerFailure once peer is known dead (its pid checked at most
  // every kLivenessPeriod).
  void check_peer(int peer);
  void progress_or_sleep(Clock::time_point deadline, const WaitPolicy::Phases& phases);
  [[noreturn]] void fail(cpu_algorithms::TransportError::Kind kind, int peer, const std::string& what) const;
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // A peer's host-shared allocation mapped here, shared by the windows in it.
  struct PeerMapping {
    int peer;
    uint64_t inode;
    unsigned char* base;
    size_t bytes;
    int windows;  // using it; unmapped at 0
  };
  // The base of peer's allocation mapped here (cached), or null when it
  // cannot be mapped (the window then takes the ordinary path; logged).
  unsigned char* map_peer(int peer, const host_shared::Location& at);
  void unmap_peer(int peer, unsigned char* base);

  struct PeerSlot {
    UcxWindows* self;
    int rank;
  };
  static constexpr std::chrono::milliseconds kLivenessPeriod{50};

  const int rank_, size_;
  const std::vector<int> pids_;
  cpu_algorithms::Transport* direct_;
  LogFn log_;
  std::string tls_;
  // One op, registration or release at a time. abort() tries it for a
  // bounded time: it does not wait out a registration blocked on the store
  // (the destructor releases).
  std::mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<PeerSlot> slots_;
  std::vector<std::atomic<int>> peer_status_;  // ucs_status_t of a failed peer, 0 while fine
  std::vector<Clock::time_point> next_liveness_check_;
  std::vector<bool> wired_;  // per peer: a flush of its endpoint completed
  std::vector<std::unique_ptr<Window>> windows_;
  std::vector<PeerMapping> mappings_;
  uint64_t windows_made_ = 0;  // names each window's store keys (registration is collective)
  const uint64_t one_ = 1;     // the operand of every signal
  std::atomic<bool> aborted_{false};
  WaitPolicy wait_policy_;
};

}  // namespace comms::ucx_backend
