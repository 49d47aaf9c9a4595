// The comm's state: one NCCL communicator, its internal stream and the ops in
// flight. Shared with its Works so that a Work outliving the backend still
// answers. Its methods live with their job:
//   nccl_bootstrap.cc  unique id exchange, communicator init and split
//   nccl_enqueue.cc    submitting an op (one launch rule per op type)
//   nccl_capture.cc    submitting an op into a CUDA graph being captured
//   nccl_registration.cc  registered buffers (ncclCommRegister)
//   nccl_work.cc       completion, deadlines and failure (the watchdog's round)
//   nccl_teardown.cc   finalize, abort and destroy
//   nccl_shrink.cc     elastic recovery: revoke and native shrink
//   nccl_grow.cc       elastic growth: native grow (ncclCommGrow)
//   nccl_suspend.cc    offload by suspend (ncclCommSuspend/Resume, MemStats)
//   nccl_window.cc     windows and their one-sided ops (ncclPutSignal & co.)
//   nccl_core.cc       construction, settling NCCL calls, describe, memory
// Methods named *_locked need `mu` held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comms/plugin.h"
#include "nccl_api.h"
#include "nccl_call.h"
#include "nccl_hints.h"
#include "nccl_work.h"

namespace comms::nccl {

// Whether `stream` is capturing a CUDA graph (*capturing), or why an op
// cannot be issued on it (an invalidated capture, the legacy stream while
// another stream captures).
Status capture_state(NcclApi& api, cudaStream_t stream, bool* capturing);

// The descriptor's mem_alloc/mem_free: ncclMemAlloc/ncclMemFree on `device`.
Status nccl_mem_alloc(NcclApi& api, Device device, size_t bytes, void** ptr);
Status nccl_mem_free(NcclApi& api, Device device, void* ptr);

class Core {
 public:
  Core(std::shared_ptr<NcclApi> api, plugin::BackendInit init, Hints raw_hints,
       TranslatedHints hints);

  std::mutex mu;
  std::condition_variable watchdog_cv;

  NcclApi& api() { return *api_; }
  const std::shared_ptr<NcclApi>& api_ptr() { return api_; }
  const plugin::BackendInit& init() const { return init_; }
  int device() const { return device_; }
  int cc_major() const { return cc_major_; }
  int cc_minor() const { return cc_minor_; }

  void log(int level, const std::string& msg) const;

  // --- bootstrap (nccl_bootstrap.cc) ---
  Status init_locked();
  // Takes ownership of a ready communicator (from init or split) and creates
  // the stream, the caller-ordering event and the barrier scratch.
  Status adopt_locked(ncclComm_t comm);
  bool initialized_locked() const { return comm_ != nullptr; }
  Status split_locked(int color, int key, const NcclConfigFields& child_fields,
                      const std::string& child_name, std::chrono::milliseconds timeout,
                      ncclComm_t* child);

  // --- ops (nccl_enqueue.cc) ---
  Status submit_locked(const plugin::OpDesc& op, std::shared_ptr<WorkState>* out_work);

  // --- ops inside CUDA graph capture (nccl_capture.cc) ---
  // Enqueues the op's NCCL calls on `stream`, which is capturing: nothing
  // the watchdog tracks, no events. Refuses (nothing enqueued) an
  // uninitialised or failed comm.
  Status submit_captured_locked(const plugin::OpDesc& op, cudaStream_t stream);

  // --- offload by suspend (nccl_suspend.cc) ---
  // ncclCommSuspend(NCCL_SUSPEND_MEM): the communicator is kept, its memory
  // released; registrations and windows are released first (the caller
  // registers again after resume, as after a re-creation). kUnsupported
  // naming the loaded NCCL below 2.29. A failure aborts the communicator.
  // Needs no op in flight (the backend waits for them first).
  Status suspend_locked();
  // ncclCommResume: no rendezvous. A failure aborts the communicator.
  Status resume_locked();
  bool suspended_locked() const { return suspended_; }

  // --- windows (nccl_window.cc) ---
  // ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC), collective; the handle
  // is the ncclWindow_t. kUnsupported below NCCL 2.29.
  Status register_window_locked(void* data, size_t bytes, void** window);
  Status deregister_window_locked(void* window);
  Status submit_window_locked(const plugin::WindowOpDesc& op, std::shared_ptr<WorkState>* out_work);
  // Deregisters every window still registered (finalize, suspend); errors
  // are appended to `errors`.
  void release_windows_locked(std::vector<std::string>* errors);

  // --- registered buffers (nccl_registration.cc) ---
  Status register_locked(void* data, size_t bytes, void** handle);
  Status deregister_locked(void* handle);
  // Deregisters every handle still registered (before finalize); errors
  // are appended to `errors`.
  void deregister_all_locked(std::vector<std::string>* errors);
  size_t registered_count_locked() const { return registered_.size(); }

  // --- completion, timeouts, failure (nccl_work.cc) ---
  // Marks `w` done if its event fired, or fails the comm if it is past its
  // deadline. Returns whether it is done (successfully or not).
  // `query` false: an earlier op on the stream is still running, so this
  // one is too; only its deadline is checked.
  bool check_work_locked(WorkState& w, Clock::time_point now, bool query = true);
  // One watchdog round: NCCL's async error, then every outstanding op.
  void poll_locked(Clock::time_point now);
  // The first failure aborts the NCCL communicator; the culprit gets `cause`
  // and every other outstanding op kAborted. Later ops see failure_.
  void fail_locked(Status cause, WorkState* culprit);
  void request_abort(const std::string& reason);
  Status failure_locked() const { return failure_; }
  std::deque<std::shared_ptr<WorkState>> outstanding_copy_locked() const { return outstanding_; }

  // --- teardown (nccl_teardown.cc) ---
  // graceful: ncclCommFinalize then ncclCommDestroy (bounded by the op
  // timeout, aborting on expiry); else ncclCommAbort. Every failure to
  // release is reported.
  Status release_locked(bool graceful);
  // The backend went without finalize: ops that finished keep their status,
  // the rest fail, and the communicator is aborted (never waits on a peer).
  void destroy_locked();

  // --- elastic recovery (nccl_shrink.cc) ---
  // Fails every outstanding and later op with kRevoked. With ncclCommRevoke
  // (and a communicator that is up and healthy) the communicator is revoked
  // and kept, for shrink_locked; otherwise it is aborted as by abort().
  void request_revoke(const std::string& reason);
  bool revoked_locked() const { return revoked_; }
  // What made the communicator ("ncclCommInitRankConfig", "ncclCommSplit",
  // "ncclCommShrink"), for describe().
  void set_created_by_locked(const char* how) { created_by_ = how; }
  // Whether ncclCommShrink can run on the communicator: the loaded NCCL has
  // it and the communicator exists (healthy, or revoked), not aborted.
  bool can_shrink_locked();
  // ncclCommShrink excluding `exclude` (parent ranks), with
  // NCCL_SHRINK_ABORT on a revoked parent, NCCL_SHRINK_DEFAULT on a healthy
  // one (a planned shrink). The parent stays as it is (revoked or usable):
  // it is aborted or finalized with its backend, never here. *flags: the
  // flag used.
  Status shrink_locked(std::vector<int> exclude, const NcclConfigFields& child_fields,
                       const std::string& child_name, std::chrono::milliseconds timeout,
                       ncclComm_t* child, int* flags);
  // --- elastic growth (nccl_grow.cc) ---
  // Whether ncclCommGrow can run on this member's communicator: the loaded
  // NCCL has it (>= 2.29) and the communicator is up and healthy (not lazy,
  // failed, revoked or suspended).
  bool can_grow_locked();
  // ncclCommGetUniqueId on the communicator: the id of its next grow, which
  // one member takes and the newcomers join with.
  Status grow_unique_id_locked(ncclUniqueId* id);
  // A member's ncclCommGrow to `size` ranks (rank -1: it keeps its own), with
  // `id` on the member that took it and null on the others. The parent is
  // aborted if the grow fails (its state is then unknown to NCCL's users).
  Status grow_locked(int size, const ncclUniqueId* id, const NcclConfigFields& child_fields,
                     const std::string& child_name, std::chrono::milliseconds timeout, ncclComm_t* child);
  // A newcomer's ncclCommGrow (no parent, the members' id, rank init().rank,
  // this core's hints), bounded by the init timeout; adopts the result.
  Status join_grown_locked(const ncclUniqueId& id);

  // "<what>: the NCCL communicator failed earlier: ...", coded kRevoked
  // after a revoke, else kAborted.
  Status failed_earlier(const std::string& what) const {
    return {failure_.code == ErrorCode::kRevoked ? ErrorCode::kRevoked : ErrorCode::kAborted,
            what + (what.empty() ? "" : ": ") + "the NCCL communicator failed earlier: " + failure_.message};
  }

  // --- state (nccl_core.cc) ---
  std::string describe_locked() const;
  // Bytes in use on the comm's device (cudaMemGetInfo: total - free), -1 if
  // CUDA cannot tell. Needs no lock: it reads only the device.
  int64_t device_memory_used() const;
  const Hints& raw_hints() const { return raw_hints_; }
  const TranslatedHints& hints() const { return hints_; }
  void set_hints_locked(Hints raw, TranslatedHints t) {
    raw_hints_ = std::move(raw);
    hints_ = std::move(t);
  }
  void set_op_timeout_locked(std::chrono::milliseconds t) { op_timeout_ = t; }
  std::chrono::milliseconds op_timeout_locked() const { return op_timeout_; }

  // A non-blocking communicator answers ncclInProgress until the call took
  // effect; poll it (bounded) so that nothing after it runs too early.
  // A revoke interrupts it too unless `stop_on_revoke` is false (settling the
  // revoked communicator itself, or its shrink).
  Status settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, std::string_view what,
                bool stop_on_revoke = true);
  // The end of making a child of comm_ (split, shrink, grow) once the
  // parent's part gave `s`: the child, if there is one (a split's
  // non-member has none), is polled to success; on failure it is aborted,
  // and a timeout of ours (not ncclTimeout) says what every rank must call.
  Status settle_child(Status s, ncclComm_t child, Clock::time_point deadline, std::chrono::milliseconds timeout,
                      const std::string& call, const std::string& every_rank_must, bool stop_on_revoke = true);

 private:
  Status exchange_unique_id(ncclUniqueId* id);
  NcclConfigFields effective_fields() const {
    return plugin_config_fields(hints_.config, init_.comm_name);
  }
  Status enqueue_locked(const plugin::OpDesc& op, Clock::time_point deadline, cudaStream_t stream);
  // What every eager op does around its NCCL calls: orders the internal
  // stream after the caller's, runs `launch(deadline)`, records the end
  // event and queues the Work for the watchdog. `window_op` names a window
  // op (null for an OpType).
  template <class Launch>
  Status run_eager_locked(uint64_t seq, plugin::OpType type, const char* window_op, std::chrono::milliseconds timeout,
                          void* caller_stream, Launch launch, std::shared_ptr<WorkState>* out_work);
  // MemStats' figures of the communicator ("suspendable", "persistent",
  // "total" bytes and "suspended"), null where NCCL has no MemStats.
  std::string mem_stats_json_locked();

  std::shared_ptr<NcclApi> api_;
  plugin::BackendInit init_;
  Hints raw_hints_;
  TranslatedHints hints_;
  NcclConfigFields effective_;  // owns the strings the last ncclConfig_t pointed to
  std::chrono::milliseconds op_timeout_;
  int device_ = 0;
  int cc_major_ = -1;
  int cc_minor_ = -1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int stream_priority_ = 0;
  cudaEvent_t caller_ready_ = nullptr;
  void* scratch_ = nullptr;
  std::deque<std::shared_ptr<WorkState>> outstanding_;
  std::set<void*> registered_;  // ncclCommRegister handles on comm_
  // ncclCommWindowRegister handles on comm_, in registration order: the
  // release at finalize/suspend deregisters (collectively) in the order
  // every rank shares, not in the order of the handles' addresses.
  std::vector<ncclWindow_t> windows_;
  bool suspended_ = false;          // ncclCommSuspend'ed (or a lazy comm offloaded by suspend)
  // What the last suspend/resume saw (describe()): MemStats as JSON text, "" before any.
  std::string mem_before_suspend_, mem_after_suspend_, mem_after_resume_;
  int suspends_ = 0, resumes_ = 0;
  std::shared_ptr<EventPool> events_;
  Status failure_;
  std::atomic<bool> abort_requested_{false};
  std::atomic<bool> revoke_requested_{false};
  bool revoked_ = false;  // comm_ is revoked (ncclCommRevoke), not aborted
  const char* created_by_ = "ncclCommInitRankConfig";
};

template <class Launch>
Status Core::run_eager_locked(uint64_t seq, plugin::OpType type, const char* window_op,
                              std::chrono::milliseconds timeout, void* caller_stream, Launch launch,
                              std::shared_ptr<WorkState>* out_work) {
  if (!failure_.is_ok()) return failed_earlier("");
  if (abort_requested_) return {ErrorCode::kAborted, "the comm was aborted"};
  if (timeout.count() <= 0) timeout = op_timeout_;
  const auto deadline = Clock::now() + timeout;
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) {
    return cuda_status(*api_, e, "cudaSetDevice");
  }
  auto caller = static_cast<cudaStream_t>(caller_stream);
  if (cudaError_t e = api_->event_record(caller_ready_, caller); e != cudaSuccess) {
    return cuda_status(*api_, e, "cudaEventRecord on the caller's stream");
  }
  if (cudaError_t e = api_->stream_wait_event(stream_, caller_ready_); e != cudaSuccess) {
    return cuda_status(*api_, e, "cudaStreamWaitEvent on the internal stream");
  }
  if (Status s = launch(deadline); !s.is_ok()) {
    if (s.code == ErrorCode::kTimeout || s.code == ErrorCode::kPeerFailure ||
        s.code == ErrorCode::kInternal) {
      fail_locked(s, nullptr);
    }
    return s;
  }
  auto work = std::make_shared<WorkState>();
  work->events = events_;
  work->seq = seq;
  work->type = type;
  work->window_op = window_op;
  work->timeout = timeout;
  work->deadline = deadline;
  if (cudaError_t e = events_->take(&work->end); e != cudaSuccess) {
    work->end = nullptr;
    return cuda_status(*api_, e, "cudaEventCreate");
  }
  if (cudaError_t e = api_->event_record(work->end, stream_); e != cudaSuccess) {
    return cuda_status(*api_, e, "cudaEventRecord on the internal stream");
  }
  // The watchdog finds it at its next round (every watchdog_interval); no
  // wake-up per op: that cost a futex call and a contended lock per op.
  outstanding_.push_back(work);
  *out_work = std::move(work);
  return {};
}

}  // namespace comms::nccl
