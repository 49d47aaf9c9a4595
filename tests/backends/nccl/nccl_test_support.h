// Test doubles for the NCCL plugin: an in-memory Store and a fake NcclApi
// that records calls and lets a test decide when events and NCCL calls
// complete. Header-only; no libcomms.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <string>
#include <vector>

#include "comms/error.h"
#include "comms/store.h"
#include "memory_store_for_tests.h"
#include "nccl_fake_records.h"
#include "nccl_api.h"

namespace comms::nccl::testing {

class FakeNcclApi final : public NcclApi {
 public:
  // --- knobs (set before use, or under lock()) ---
  int device_count = 1;
  int cc_major = 9, cc_minor = 0;
  int greatest_priority = -5;
  // comm_get_async_error answers ncclInProgress this many times after an
  // init/split/finalize/group end before settling; -1: forever.
  int in_progress_polls = 2;
  ncclResult_t async_error = ncclSuccess;
  ncclResult_t destroy_result = ncclSuccess;
  bool events_complete_on_record = true;
  // NCCL calls that run (eagerly, or when their graph is launched) move data
  // as on one rank: output = input (count elements of dtype), so that a test
  // with host buffers can check that each replay really ran the op.
  bool move_data = false;
  // Off: NCCL calls and stream waits are not recorded (calls, executed,
  // stream_waits stay empty), so that measuring the plugin's per-op cost
  // (nccl_op_cost) does not count the fake's growing logs.
  bool record_calls = true;
  // cudaMemGetInfo per device (indexed by device); mem_info_error fails it.
  std::vector<size_t> mem_total, mem_free;
  cudaError_t mem_info_error = cudaSuccess;
  // The "loaded NCCL": ncclGetVersion's answer and, through it, the entry
  // points that release has (set_version; 2.28.9 unless a test picks one).
  int version = 22809;
  // Whether the "loaded NCCL" has ncclCommShrink / ncclCommRevoke.
  bool shrink_available = true;
  bool revoke_available = true;
  ncclResult_t shrink_result = ncclSuccess;
  // ncclCommSuspend/Resume's answers; MemStats' bytes per communicator. A
  // suspend frees the suspendable bytes on the current device (mem_free), a
  // resume takes them back, so that cudaMemGetInfo tells the difference.
  ncclResult_t suspend_result = ncclSuccess;
  ncclResult_t resume_result = ncclSuccess;
  uint64_t suspendable_bytes = 96 << 20;
  uint64_t persistent_bytes = 4 << 20;
  ncclResult_t window_register_result = ncclSuccess;
  // ncclCommGrow's answer (from 2.29; see has_grow).
  ncclResult_t grow_result = ncclSuccess;

  // A release: 2.28 (ncclAlltoAll/Gather/Scatter, revoke), 2.29 (+ suspend,
  // MemStats, ncclPutSignal/Signal/WaitSignal, ncclCommGetUniqueId/Grow),
  // 2.30 (+ result 8 = ncclTimeout).
  void set_version(int v) {
    std::lock_guard l(mu_);
    version = v;
    shrink_available = v >= NCCL_VERSION(2, 27, 0);
    revoke_available = v >= NCCL_VERSION(2, 28, 0);
  }

  // --- observations ---
  std::vector<NcclCall> calls;
  // The NCCL calls that ran: eager ones when called, captured ones per launch.
  std::vector<NcclCall> executed;
  // Live ncclCommRegister handles (buffer, bytes) and ncclMemAlloc blocks.
  std::map<void*, std::pair<void*, size_t>> registrations;
  std::map<void*, size_t> allocations;
  int graphs_launched = 0, graphs_destroyed = 0, graph_execs_destroyed = 0;
  std::vector<CapturedConfig> init_configs;
  std::vector<CapturedConfig> split_configs;
  std::vector<std::pair<int, int>> split_color_key;
  using ShrinkCall = testing::ShrinkCall;
  std::vector<ShrinkCall> shrinks;
  using GrowCall = testing::GrowCall;
  std::vector<GrowCall> grows;
  std::vector<ncclComm_t> grow_ids_from;  // ncclCommGetUniqueId's communicators
  std::vector<ncclComm_t> revoked_comms, aborted_comms, destroyed_comms, created_comms;
  std::set<ncclComm_t> suspended;  // communicators suspended now
  int comm_inits = 0;              // ncclCommInitRankConfig calls: one per rendezvous
  // Live windows: handle -> (buffer, bytes, communicator).
  struct Window {
    void* buf;
    size_t bytes;
    ncclComm_t comm;
  };
  std::map<ncclWindow_t, Window> windows;
  std::vector<int> stream_priorities;
  int events_created = 0;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> stream_waits;
  std::vector<unsigned char> premul_scalar;
  std::atomic<int> aborts{0}, finalizes{0}, destroys{0}, frees{0}, streams_destroyed{0};
  int group_depth = 0;
  int current_device = 0;
  int set_device_calls = 0;

  std::unique_lock<std::mutex> lock() { return std::unique_lock(mu_); }
  void complete_all_events() {
    std::lock_guard l(mu_);
    for (auto& [e, done] : events_) done = true;
  }
  std::vector<std::string> call_names() {
    std::lock_guard l(mu_);
    std::vector<std::string> out;
    for (auto& c : calls) out.push_back(c.name);
    return out;
  }

  ncclResult_t get_version(int* v) override {
    std::lock_guard l(mu_);
    *v = version;
    return ncclSuccess;
  }
  ncclResult_t get_unique_id(ncclUniqueId* id) override {
    std::memset(id->internal, 0x5a, sizeof id->internal);
    return ncclSuccess;
  }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int, ncclUniqueId, int,
                                     NcclConfig* config) override {
    std::lock_guard l(mu_);
    ++comm_inits;
    init_configs.push_back(capture_config(*config));
    *comm = next_comm();
    created_comms.push_back(*comm);
    pending_ = in_progress_polls;
    record("comm_init", *comm);
    return ncclInProgress;
  }
  ncclResult_t comm_split(ncclComm_t, int color, int key, ncclComm_t* child,
                          NcclConfig* config) override {
    std::lock_guard l(mu_);
    split_configs.push_back(capture_config(*config));
    split_color_key.emplace_back(color, key);
    // As NCCL 2.28.3 does on a non-blocking parent: success at once, the
    // parent in progress, and the child handle written only once the parent
    // has been polled to success.
    *child = nullptr;
    deferred_child_ = color == NCCL_SPLIT_NOCOLOR ? nullptr : child;
    pending_ = in_progress_polls;
    record("comm_split");
    return ncclSuccess;
  }
  ncclResult_t comm_get_async_error(ncclComm_t, ncclResult_t* e) override {
    std::lock_guard l(mu_);
    if (pending_ != 0) {
      if (pending_ > 0) --pending_;
      *e = ncclInProgress;
      if (pending_ == 0 && deferred_child_) {
        *deferred_child_ = next_comm();
        deferred_child_ = nullptr;
      }
    } else {
      *e = async_error;
    }
    return ncclSuccess;
  }
  ncclResult_t comm_finalize(ncclComm_t) override {
    std::lock_guard l(mu_);
    ++finalizes;
    record("comm_finalize");
    pending_ = in_progress_polls;
    return ncclInProgress;
  }
  ncclResult_t comm_destroy(ncclComm_t comm) override {
    std::lock_guard l(mu_);
    ++destroys;
    destroyed_comms.push_back(comm);
    record("comm_destroy", comm);
    return destroy_result;
  }
  ncclResult_t comm_abort(ncclComm_t comm) override {
    std::lock_guard l(mu_);
    ++aborts;
    aborted_comms.push_back(comm);
    pending_ = 0;
    record("comm_abort", comm);
    return ncclSuccess;
  }
  const char* error_string(ncclResult_t r) override {
    switch (r) {
      case ncclRemoteError: return "remote process exited or there was a network error";
      case ncclInternalError: return "internal error";
      case kNcclTimeoutResult: return "operation timed out";
      default: return "fake nccl error";
    }
  }
  const char* last_error(ncclComm_t) override { return ""; }
  ncclResult_t group_start() override {
    std::lock_guard l(mu_);
    ++group_depth;
    record("group_start");
    return ncclSuccess;
  }
  ncclResult_t group_end() override {
    std::lock_guard l(mu_);
    --group_depth;
    record("group_end");
    return ncclSuccess;
  }
  ncclResult_t red_op_create_pre_mul_sum(ncclRedOp_t* op, void* scalar, ncclDataType_t dt,
                                         ncclComm_t) override {
    std::lock_guard l(mu_);
    const unsigned char* p = static_cast<const unsigned char*>(scalar);
    premul_scalar.assign(p, p + 8);
    *op = static_cast<ncclRedOp_t>(ncclNumOps + 1);
    NcclCall c{"premul_create"};
    c.dtype = dt;
    calls.push_back(c);
    return ncclSuccess;
  }
  ncclResult_t red_op_destroy(ncclRedOp_t, ncclComm_t) override {
    std::lock_guard l(mu_);
    record("premul_destroy");
    return ncclSuccess;
  }
  ncclResult_t all_reduce(const void* in, void* out, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                          ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("all_reduce", in, out, n, dt, op, -1, s, comm);
  }
  ncclResult_t reduce(const void* in, void* out, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                      int root, ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("reduce", in, out, n, dt, op, root, s, comm);
  }
  ncclResult_t broadcast(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                         ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("broadcast", in, out, n, dt, ncclSum, root, s, comm);
  }
  ncclResult_t all_gather(const void* in, void* out, size_t n, ncclDataType_t dt, ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("all_gather", in, out, n, dt, ncclSum, -1, s, comm);
  }
  ncclResult_t reduce_scatter(const void* in, void* out, size_t n, ncclDataType_t dt,
                              ncclRedOp_t op, ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("reduce_scatter", in, out, n, dt, op, -1, s, comm);
  }
  ncclResult_t all_to_all(const void* in, void* out, size_t n, ncclDataType_t dt, ncclComm_t comm,
                    cudaStream_t s) override {
    if (!has_native_collectives()) return ncclInvalidUsage;  // no such symbol before 2.28
    return op_call("all_to_all", in, out, n, dt, ncclSum, -1, s, comm);
  }
  ncclResult_t gather(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                      ncclComm_t comm,
                    cudaStream_t s) override {
    if (!has_native_collectives()) return ncclInvalidUsage;
    return op_call("gather", in, out, n, dt, ncclSum, root, s, comm);
  }
  ncclResult_t scatter(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                       ncclComm_t comm,
                    cudaStream_t s) override {
    if (!has_native_collectives()) return ncclInvalidUsage;
    return op_call("scatter", in, out, n, dt, ncclSum, root, s, comm);
  }
  ncclResult_t send(const void* buf, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("send", buf, nullptr, n, dt, ncclSum, peer, s, comm);
  }
  ncclResult_t recv(void* buf, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                    cudaStream_t s) override {
    return op_call("recv", nullptr, buf, n, dt, ncclSum, peer, s, comm);
  }
  ncclResult_t comm_register(ncclComm_t, void* buf, size_t bytes, void** handle) override {
    std::lock_guard l(mu_);
    record("comm_register");
    *handle = reinterpret_cast<void*>(next_handle_++);
    registrations[*handle] = {buf, bytes};
    return ncclSuccess;
  }
  ncclResult_t comm_deregister(ncclComm_t, void* handle) override {
    std::lock_guard l(mu_);
    record("comm_deregister");
    return registrations.erase(handle) ? ncclSuccess : ncclInvalidArgument;
  }
  ncclResult_t nccl_alloc(void** ptr, size_t bytes) override {
    std::lock_guard l(mu_);
    *ptr = reinterpret_cast<void*>(next_handle_++);
    allocations[*ptr] = bytes;
    return ncclSuccess;
  }
  ncclResult_t nccl_free(void* ptr) override {
    std::lock_guard l(mu_);
    return allocations.erase(ptr) ? ncclSuccess : ncclInvalidArgument;
  }

  // ncclCommShrink / ncclCommRevoke, when `*_available`. A shrink writes the
  // child at once and leaves the parent and the child in progress for
  // in_progress_polls polls; a revoke leaves the comm in progress (until
  // quiescent) as NCCL 2.28 does.
  bool has_shrink() override { return shrink_available; }
  bool has_revoke() override { return revoke_available; }
  ncclResult_t comm_shrink(ncclComm_t comm, int* exclude, int n, ncclComm_t* child, NcclConfig* config,
                           int flags) override {
    std::lock_guard l(mu_);
    if (!shrink_available) return ncclInvalidUsage;
    ShrinkCall c;
    c.parent = comm;
    c.exclude.assign(exclude, exclude + n);
    c.flags = flags;
    c.config = capture_config(*config);
    record("comm_shrink", comm);
    if (shrink_result != ncclSuccess) {
      shrinks.push_back(c);
      return shrink_result;
    }
    *child = c.child = next_comm();
    created_comms.push_back(*child);
    shrinks.push_back(c);
    pending_ = in_progress_polls;
    return ncclSuccess;
  }
  ncclResult_t comm_revoke(ncclComm_t comm, int flags) override {
    std::lock_guard l(mu_);
    if (!revoke_available || flags != NCCL_REVOKE_DEFAULT) return ncclInvalidUsage;
    revoked_comms.push_back(comm);
    record("comm_revoke", comm);
    pending_ = in_progress_polls;
    return ncclSuccess;
  }

  // ncclCommGetUniqueId gives 128 bytes of 0x6b; ncclCommGrow writes the
  // child at once and leaves it (and a member's parent) in progress for
  // in_progress_polls polls.
  bool has_grow() override { return at_least(kGrowVersion); }
  ncclResult_t comm_get_unique_id(ncclComm_t comm, ncclUniqueId* id) override {
    std::lock_guard l(mu_);
    if (version < kGrowVersion) return ncclInvalidUsage;
    record("comm_get_unique_id", comm);
    grow_ids_from.push_back(comm);
    std::memset(id->internal, 0x6b, sizeof id->internal);
    return ncclSuccess;
  }
  ncclResult_t comm_grow(ncclComm_t comm, int nranks, const ncclUniqueId* id, int rank, ncclComm_t* child,
                         NcclConfig* config) override {
    std::lock_guard l(mu_);
    if (version < kGrowVersion) return ncclInvalidUsage;
    GrowCall c;
    c.parent = comm;
    c.nranks = nranks;
    if (id) c.id.assign(id->internal, sizeof id->internal);
    c.rank = rank;
    c.config = capture_config(*config);
    record("comm_grow", comm);
    if (grow_result != ncclSuccess) {
      grows.push_back(c);
      return grow_result;
    }
    *child = c.child = next_comm();
    created_comms.push_back(*child);
    grows.push_back(c);
    pending_ = in_progress_polls;
    return comm ? ncclSuccess : ncclInProgress;
  }

  bool has_native_collectives() override { return at_least(kNativeCollectivesVersion); }
  bool has_suspend() override { return at_least(kSuspendVersion); }
  bool has_one_sided() override { return at_least(kOneSidedVersion); }
  ncclResult_t comm_suspend(ncclComm_t comm, int flags) override {
    std::lock_guard l(mu_);
    if (version < kSuspendVersion) return ncclInvalidUsage;
    record("comm_suspend", comm);
    if (flags != NCCL_SUSPEND_MEM || suspended.count(comm)) return ncclInvalidUsage;
    if (suspend_result != ncclSuccess) return suspend_result;
    suspended.insert(comm);
    adjust_free(static_cast<int64_t>(suspendable_bytes));
    return ncclSuccess;
  }
  ncclResult_t comm_resume(ncclComm_t comm) override {
    std::lock_guard l(mu_);
    if (version < kSuspendVersion) return ncclInvalidUsage;
    record("comm_resume", comm);
    if (!suspended.count(comm)) return ncclInvalidUsage;
    if (resume_result != ncclSuccess) return resume_result;
    suspended.erase(comm);
    adjust_free(-static_cast<int64_t>(suspendable_bytes));
    return ncclSuccess;
  }
  ncclResult_t comm_mem_stats(ncclComm_t comm, MemStat stat, uint64_t* value) override {
    std::lock_guard l(mu_);
    if (version < kSuspendVersion) return ncclInvalidUsage;
    const bool off = suspended.count(comm) > 0;
    switch (stat) {
      case MemStat::kSuspendable: *value = off ? 0 : suspendable_bytes; break;
      case MemStat::kSuspended: *value = off ? 1 : 0; break;
      case MemStat::kPersistent: *value = persistent_bytes; break;
      case MemStat::kTotal: *value = persistent_bytes + (off ? 0 : suspendable_bytes); break;
      default: return ncclInvalidArgument;
    }
    return ncclSuccess;
  }
  ncclResult_t window_register(ncclComm_t comm, void* buf, size_t bytes, ncclWindow_t* win, int flags) override {
    std::lock_guard l(mu_);
    if (version < kOneSidedVersion) return ncclInvalidUsage;
    record("window_register", comm);
    if (flags != NCCL_WIN_COLL_SYMMETRIC || suspended.count(comm)) return ncclInvalidUsage;
    if (window_register_result != ncclSuccess) return window_register_result;
    *win = reinterpret_cast<ncclWindow_t>(next_handle_++);
    windows[*win] = {buf, bytes, comm};
    return ncclSuccess;
  }
  ncclResult_t window_deregister(ncclComm_t comm, ncclWindow_t win) override {
    std::lock_guard l(mu_);
    if (version < kOneSidedVersion) return ncclInvalidUsage;
    record("window_deregister", comm);
    auto it = windows.find(win);
    if (it == windows.end() || it->second.comm != comm) return ncclInvalidArgument;
    windows.erase(it);
    return ncclSuccess;
  }
  ncclResult_t put_signal(const void* in, size_t count, ncclDataType_t dt, int peer, ncclWindow_t win, size_t offset,
                          int sig_index, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (version < kOneSidedVersion) return ncclInvalidUsage;
    NcclCall call{"put_signal", in, nullptr, count, dt, ncclSum, peer, s};
    call.comm = comm, call.window = win, call.offset = offset;
    return one_sided_call(call, sig_index, ctx, flags);
  }
  ncclResult_t signal(int peer, int sig_index, int ctx, unsigned int flags, ncclComm_t comm,
                      cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (version < kOneSidedVersion) return ncclInvalidUsage;
    NcclCall call{"signal", nullptr, nullptr, 0, ncclInt8, ncclSum, peer, s};
    call.comm = comm;
    return one_sided_call(call, sig_index, ctx, flags);
  }
  ncclResult_t wait_signal(int n, WaitSignalDesc* descs, ncclComm_t comm, cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (version < kOneSidedVersion) return ncclInvalidUsage;
    NcclCall call{"wait_signal", nullptr, nullptr, static_cast<size_t>(n), ncclInt8, ncclSum, -1, s};
    call.comm = comm;
    call.waits.assign(descs, descs + n);
    for (const WaitSignalDesc& d : call.waits) {
      if (d.op_count <= 0 || d.sig_index != 0 || d.ctx != 0) return ncclInvalidArgument;
    }
    return one_sided_call(call, 0, 0, 0);
  }

  cudaError_t get_device_count(int* n) override { *n = device_count; return cudaSuccess; }
  cudaError_t get_device(int* d) override {
    std::lock_guard l(mu_);
    *d = current_device;
    return device_count > 0 ? cudaSuccess : cudaErrorNoDevice;
  }
  cudaError_t set_device(int d) override {
    std::lock_guard l(mu_);
    if (d >= device_count) return cudaErrorInvalidDevice;
    ++set_device_calls;
    current_device = d;
    return cudaSuccess;
  }
  cudaError_t compute_capability(int d, int* major, int* minor) override {
    if (d >= device_count) return cudaErrorInvalidDevice;
    *major = cc_major;
    *minor = cc_minor;
    return cudaSuccess;
  }
  cudaError_t stream_priority_range(int* least, int* greatest) override {
    *least = 0;
    *greatest = greatest_priority;
    return cudaSuccess;
  }
  cudaError_t stream_create(cudaStream_t* s, int priority) override {
    std::lock_guard l(mu_);
    stream_priorities.push_back(priority);
    *s = reinterpret_cast<cudaStream_t>(next_handle_++);
    stream_handles_[*s] = stream_priorities.size() - 1;
    return cudaSuccess;
  }
  cudaError_t stream_get_priority(cudaStream_t s, int* priority) override {
    std::lock_guard l(mu_);
    auto it = stream_handles_.find(s);
    if (it == stream_handles_.end()) return cudaErrorInvalidResourceHandle;
    *priority = stream_priorities[it->second];
    return cudaSuccess;
  }
  cudaError_t stream_destroy(cudaStream_t) override {
    std::lock_guard l(mu_);
    ++streams_destroyed;
    return cudaSuccess;
  }
  cudaError_t event_create(cudaEvent_t* e) override {
    std::lock_guard l(mu_);
    ++events_created;
    *e = reinterpret_cast<cudaEvent_t>(next_handle_++);
    events_[*e] = false;
    return cudaSuccess;
  }
  cudaError_t event_destroy(cudaEvent_t e) override {
    std::lock_guard l(mu_);
    events_.erase(e);
    return cudaSuccess;
  }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (Capture* c = capture_of(s)) {
      if (c->status != cudaStreamCaptureStatusActive) return cudaErrorStreamCaptureInvalidated;
      GraphNode n;
      n.call.name = "event_record";
      n.call.stream = s;
      n.event = e;
      add_node(*c, s, n);
      captured_events_[e] = {c->id, s, c->nodes_on[s]};
      return cudaSuccess;
    }
    captured_events_.erase(e);
    events_[e] = events_complete_on_record;
    return cudaSuccess;
  }
  // As CUDA: an event last recorded in a capture cannot be queried; doing so
  // is an error that invalidates that capture.
  cudaError_t event_query(cudaEvent_t e) override {
    std::lock_guard l(mu_);
    if (auto c = captured_events_.find(e); c != captured_events_.end()) {
      invalidate(c->second.capture_id);
      return cudaErrorCapturedEvent;
    }
    auto it = events_.find(e);
    if (it == events_.end()) return cudaErrorInvalidResourceHandle;
    return it->second ? cudaSuccess : cudaErrorNotReady;
  }
  // Waiting on an event recorded in a capture pulls `s` into that capture
  // (a fork); the origin waiting on an event recorded after a forked
  // stream's last node joins that stream back.
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) override {
    std::lock_guard l(mu_);
    if (record_calls) stream_waits.emplace_back(s, e);
    auto ce = captured_events_.find(e);
    if (ce == captured_events_.end()) return cudaSuccess;
    auto cap = captures_by_id_.find(ce->second.capture_id);
    if (cap == captures_by_id_.end()) return cudaSuccess;  // that capture ended
    Capture& c = *cap->second;
    if (Capture* mine = capture_of(s); mine && mine != &c) return cudaErrorStreamCaptureIsolation;
    capturing_[s] = cap->second;
    if (ce->second.stream != s && c.nodes_on[ce->second.stream] == ce->second.nodes_before) {
      c.unjoined.erase(ce->second.stream);
    }
    return cudaSuccess;
  }
  // cudaMalloc is not allowed while a stream captures (global mode): it
  // fails and invalidates every capture.
  cudaError_t malloc_device(void** p, size_t) override {
    std::lock_guard l(mu_);
    if (!captures_by_id_.empty()) {
      for (auto& [id, c] : captures_by_id_) c->status = cudaStreamCaptureStatusInvalidated;
      return cudaErrorStreamCaptureUnsupported;
    }
    *p = reinterpret_cast<void*>(next_handle_++);
    return cudaSuccess;
  }
  cudaError_t free_device(void*) override {
    std::lock_guard l(mu_);
    ++frees;
    return cudaSuccess;
  }
  cudaError_t memset_async(void* p, int value, size_t bytes, cudaStream_t s) override {
    std::lock_guard l(mu_);
    GraphNode n;
    n.call.name = "memset";
    n.call.stream = s;
    n.ptr = p, n.value = value, n.bytes = bytes;
    if (Capture* c = capture_of(s)) {
      if (c->status != cudaStreamCaptureStatusActive) return cudaErrorStreamCaptureInvalidated;
      add_node(*c, s, n);
    }
    return cudaSuccess;
  }
  cudaError_t mem_get_info(size_t* free_bytes, size_t* total_bytes) override {
    std::lock_guard l(mu_);
    if (mem_info_error != cudaSuccess) return mem_info_error;
    const auto d = static_cast<size_t>(current_device);
    if (d >= mem_total.size() || d >= mem_free.size()) return cudaErrorInvalidDevice;
    *free_bytes = mem_free[d];
    *total_bytes = mem_total[d];
    return cudaSuccess;
  }
  const char* cuda_error_string(cudaError_t) override { return "fake cuda error"; }

  // --- CUDA graphs, as cudaStreamBeginCapture & co. answer ---
  cudaError_t stream_capture_info(cudaStream_t s, cudaStreamCaptureStatus* status,
                                  unsigned long long* id) override {
    std::lock_guard l(mu_);
    ++capture_queries;
    Capture* c = capture_of(s);
    *status = c ? c->status : cudaStreamCaptureStatusNone;
    if (id) *id = c ? c->id : 0;
    return cudaSuccess;
  }
  cudaError_t stream_begin_capture(cudaStream_t s, cudaStreamCaptureMode) override {
    std::lock_guard l(mu_);
    if (s == nullptr) return cudaErrorStreamCaptureUnsupported;  // the legacy stream
    if (capture_of(s)) return cudaErrorIllegalState;
    auto c = std::make_shared<Capture>();
    c->id = ++last_capture_id_;
    c->origin = s;
    capturing_[s] = c;
    captures_by_id_[c->id] = c;
    return cudaSuccess;
  }
  cudaError_t stream_end_capture(cudaStream_t s, cudaGraph_t* graph) override {
    std::lock_guard l(mu_);
    *graph = nullptr;
    Capture* c = capture_of(s);
    if (!c || c->origin != s) return cudaErrorIllegalState;
    const std::shared_ptr<Capture> ended = capturing_[s];
    std::erase_if(capturing_, [&](const auto& kv) { return kv.second == ended; });
    captures_by_id_.erase(ended->id);
    if (ended->status != cudaStreamCaptureStatusActive) return cudaErrorStreamCaptureInvalidated;
    if (!ended->unjoined.empty()) return cudaErrorStreamCaptureUnjoined;
    *graph = reinterpret_cast<cudaGraph_t>(next_handle_++);
    graphs_[*graph] = ended->nodes;
    return cudaSuccess;
  }
  cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) override {
    std::lock_guard l(mu_);
    auto it = graphs_.find(graph);
    if (it == graphs_.end()) return cudaErrorInvalidValue;
    *exec = reinterpret_cast<cudaGraphExec_t>(next_handle_++);
    execs_[*exec] = it->second;
    return cudaSuccess;
  }
  // Runs every node in order, as a launch on a stream that is not capturing.
  cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t s) override {
    std::lock_guard l(mu_);
    auto it = execs_.find(exec);
    if (it == execs_.end()) return cudaErrorInvalidValue;
    if (capture_of(s)) return cudaErrorStreamCaptureUnsupported;  // not modelled
    ++graphs_launched;
    for (const GraphNode& n : it->second) {
      if (n.call.name == "event_record") {
        events_[n.event] = events_complete_on_record;
      } else if (n.call.name == "memset") {
        if (move_data) std::memset(n.ptr, n.value, n.bytes);
      } else {
        execute(n.call);
      }
    }
    return cudaSuccess;
  }
  cudaError_t graph_exec_destroy(cudaGraphExec_t exec) override {
    std::lock_guard l(mu_);
    graph_execs_destroyed += static_cast<int>(execs_.erase(exec));
    return cudaSuccess;
  }
  cudaError_t graph_destroy(cudaGraph_t graph) override {
    std::lock_guard l(mu_);
    graphs_destroyed += static_cast<int>(graphs_.erase(graph));
    return cudaSuccess;
  }
  // Synchronizing a capturing stream is an error that invalidates its capture.
  cudaError_t stream_synchronize(cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (Capture* c = capture_of(s)) {
      c->status = cudaStreamCaptureStatusInvalidated;
      return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
  }
  std::atomic<int> capture_queries{0};

 private:
  ncclComm_t next_comm() { return reinterpret_cast<ncclComm_t>(next_handle_++); }
  bool at_least(int v) {
    std::lock_guard l(mu_);
    return version >= v;
  }
  void adjust_free(int64_t bytes) {
    const auto d = static_cast<size_t>(current_device);
    if (d < mem_free.size()) mem_free[d] = static_cast<size_t>(static_cast<int64_t>(mem_free[d]) + bytes);
  }
  // One put/signal/wait: refused on a suspended or busy communicator, with
  // arguments NCCL 2.30 rejects (one signal slot and context, no flags).
  ncclResult_t one_sided_call(NcclCall call, int sig_index, int ctx, unsigned int flags) {
    if (record_calls) calls.push_back(call);
    if (pending_ != 0 || suspended.count(call.comm)) return ncclInvalidUsage;
    if (sig_index != 0 || ctx != 0 || flags != 0) return ncclInvalidArgument;
    if (call.window && !windows.count(call.window)) return ncclInvalidArgument;
    executed.push_back(call);
    return ncclSuccess;
  }
  void record(const char* name, ncclComm_t comm = nullptr) {
    NcclCall c{name};
    c.comm = comm;
    calls.push_back(c);
  }
  ncclResult_t op_call(const char* name, const void* in, const void* out, size_t n,
                       ncclDataType_t dt, ncclRedOp_t op, int root, cudaStream_t s,
                       ncclComm_t comm = nullptr) {
    std::lock_guard l(mu_);
    NcclCall call{name, in, out, n, dt, op, root, s};
    call.comm = comm;
    Capture* c = capture_of(s);
    call.captured = c != nullptr;
    if (record_calls) calls.push_back(call);
    // NCCL refuses a call on a communicator whose last operation is still in
    // progress ("Attempt to use communicator before the previous operation
    // returned ncclSuccess").
    if (pending_ != 0) return ncclInvalidArgument;
    if (suspended.count(comm)) return ncclInvalidUsage;  // "the communicator cannot be used while suspended"
    if (c) {
      // Launching into an invalidated capture fails in CUDA; NCCL says so.
      if (c->status != cudaStreamCaptureStatusActive) return ncclUnhandledCudaError;
      GraphNode node;
      node.call = call;
      add_node(*c, s, node);
      return ncclSuccess;
    }
    execute(call);
    return ncclSuccess;
  }
  // One rank's effect of a call: output = input.
  void execute(NcclCall call) {
    call.captured = false;
    if (record_calls) executed.push_back(call);
    if (move_data && call.in && call.out && call.in != call.out) {
      std::memmove(const_cast<void*>(call.out), call.in, call.count * type_size(call.dtype));
    }
  }
  static size_t type_size(ncclDataType_t dt) {
    switch (dt) {
      case ncclInt8: case ncclUint8: return 1;
      case ncclFloat16: case ncclBfloat16: return 2;
      case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
      default: return 8;
    }
  }

  struct Capture {
    unsigned long long id = 0;
    cudaStream_t origin = nullptr;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    std::vector<GraphNode> nodes;
    std::map<cudaStream_t, size_t> nodes_on;  // per stream in the capture
    std::set<cudaStream_t> unjoined;          // forked streams with work not joined back
  };
  struct CapturedEvent {
    unsigned long long capture_id;
    cudaStream_t stream;
    size_t nodes_before;  // nodes on `stream` when it was recorded
  };
  Capture* capture_of(cudaStream_t s) {
    auto it = capturing_.find(s);
    return it == capturing_.end() ? nullptr : it->second.get();
  }
  void add_node(Capture& c, cudaStream_t s, const GraphNode& n) {
    c.nodes.push_back(n);
    ++c.nodes_on[s];
    if (s != c.origin) c.unjoined.insert(s);
  }
  void invalidate(unsigned long long id) {
    if (auto it = captures_by_id_.find(id); it != captures_by_id_.end()) {
      it->second->status = cudaStreamCaptureStatusInvalidated;
    }
  }

  std::mutex mu_;
  std::unordered_map<cudaEvent_t, bool> events_;
  std::map<cudaStream_t, size_t> stream_handles_;  // index into stream_priorities
  std::map<cudaStream_t, std::shared_ptr<Capture>> capturing_;  // every stream in a capture
  std::map<unsigned long long, std::shared_ptr<Capture>> captures_by_id_;
  std::map<cudaEvent_t, CapturedEvent> captured_events_;
  std::map<cudaGraph_t, std::vector<GraphNode>> graphs_;
  std::map<cudaGraphExec_t, std::vector<GraphNode>> execs_;
  unsigned long long last_capture_id_ = 0;
  int pending_ = 0;
  ncclComm_t* deferred_child_ = nullptr;  // the split's output, written once the parent settles
  uintptr_t next_handle_ = 0x1000;
};

}  // namespace comms::nccl::testing
