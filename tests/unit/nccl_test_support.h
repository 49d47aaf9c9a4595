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
#include <mutex>
#include <string>
#include <vector>

#include "comms/error.h"
#include "comms/store.h"
#include "memory_store_for_tests.h"
#include "nccl_api.h"

namespace comms::nccl::testing {

// A copy of an ncclConfig_t whose strings outlive the call.
struct CapturedConfig {
  ncclConfig_t config;
  std::string net_name;
  std::string comm_name;
  bool has_net_name = false;
  bool has_comm_name = false;
};

struct NcclCall {
  std::string name;
  const void* in = nullptr;
  const void* out = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclInt8;
  ncclRedOp_t op = ncclSum;
  int root_or_peer = -1;
};

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
  // cudaMemGetInfo per device (indexed by device); mem_info_error fails it.
  std::vector<size_t> mem_total, mem_free;
  cudaError_t mem_info_error = cudaSuccess;

  // --- observations ---
  std::vector<NcclCall> calls;
  std::vector<CapturedConfig> init_configs;
  std::vector<CapturedConfig> split_configs;
  std::vector<std::pair<int, int>> split_color_key;
  std::vector<int> stream_priorities;
  int events_created = 0;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> stream_waits;
  std::vector<unsigned char> premul_scalar;
  std::atomic<int> aborts{0}, finalizes{0}, destroys{0}, frees{0}, streams_destroyed{0};
  int group_depth = 0;
  int current_device = 0;

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

  ncclResult_t get_version(int* v) override { *v = NCCL_VERSION_CODE; return ncclSuccess; }
  ncclResult_t get_unique_id(ncclUniqueId* id) override {
    std::memset(id->internal, 0x5a, sizeof id->internal);
    return ncclSuccess;
  }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int, ncclUniqueId, int,
                                     ncclConfig_t* config) override {
    std::lock_guard l(mu_);
    init_configs.push_back(capture(*config));
    *comm = next_comm();
    pending_ = in_progress_polls;
    record("comm_init");
    return ncclInProgress;
  }
  ncclResult_t comm_split(ncclComm_t, int color, int key, ncclComm_t* child,
                          ncclConfig_t* config) override {
    std::lock_guard l(mu_);
    split_configs.push_back(capture(*config));
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
  ncclResult_t comm_destroy(ncclComm_t) override {
    std::lock_guard l(mu_);
    ++destroys;
    record("comm_destroy");
    return destroy_result;
  }
  ncclResult_t comm_abort(ncclComm_t) override {
    std::lock_guard l(mu_);
    ++aborts;
    pending_ = 0;
    record("comm_abort");
    return ncclSuccess;
  }
  const char* error_string(ncclResult_t r) override {
    switch (r) {
      case ncclRemoteError: return "remote process exited or there was a network error";
      case ncclInternalError: return "internal error";
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
                          ncclComm_t, cudaStream_t) override {
    return op_call("all_reduce", in, out, n, dt, op, -1);
  }
  ncclResult_t reduce(const void* in, void* out, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                      int root, ncclComm_t, cudaStream_t) override {
    return op_call("reduce", in, out, n, dt, op, root);
  }
  ncclResult_t broadcast(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                         ncclComm_t, cudaStream_t) override {
    return op_call("broadcast", in, out, n, dt, ncclSum, root);
  }
  ncclResult_t all_gather(const void* in, void* out, size_t n, ncclDataType_t dt, ncclComm_t,
                          cudaStream_t) override {
    return op_call("all_gather", in, out, n, dt, ncclSum, -1);
  }
  ncclResult_t reduce_scatter(const void* in, void* out, size_t n, ncclDataType_t dt,
                              ncclRedOp_t op, ncclComm_t, cudaStream_t) override {
    return op_call("reduce_scatter", in, out, n, dt, op, -1);
  }
  ncclResult_t all_to_all(const void* in, void* out, size_t n, ncclDataType_t dt, ncclComm_t,
                          cudaStream_t) override {
    return op_call("all_to_all", in, out, n, dt, ncclSum, -1);
  }
  ncclResult_t gather(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                      ncclComm_t, cudaStream_t) override {
    return op_call("gather", in, out, n, dt, ncclSum, root);
  }
  ncclResult_t scatter(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                       ncclComm_t, cudaStream_t) override {
    return op_call("scatter", in, out, n, dt, ncclSum, root);
  }
  ncclResult_t send(const void* buf, size_t n, ncclDataType_t dt, int peer, ncclComm_t,
                    cudaStream_t) override {
    return op_call("send", buf, nullptr, n, dt, ncclSum, peer);
  }
  ncclResult_t recv(void* buf, size_t n, ncclDataType_t dt, int peer, ncclComm_t,
                    cudaStream_t) override {
    return op_call("recv", nullptr, buf, n, dt, ncclSum, peer);
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
  cudaError_t event_record(cudaEvent_t e, cudaStream_t) override {
    std::lock_guard l(mu_);
    events_[e] = events_complete_on_record;
    return cudaSuccess;
  }
  cudaError_t event_query(cudaEvent_t e) override {
    std::lock_guard l(mu_);
    auto it = events_.find(e);
    if (it == events_.end()) return cudaErrorInvalidResourceHandle;
    return it->second ? cudaSuccess : cudaErrorNotReady;
  }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) override {
    std::lock_guard l(mu_);
    stream_waits.emplace_back(s, e);
    return cudaSuccess;
  }
  cudaError_t malloc_device(void** p, size_t) override {
    std::lock_guard l(mu_);
    *p = reinterpret_cast<void*>(next_handle_++);
    return cudaSuccess;
  }
  cudaError_t free_device(void*) override {
    std::lock_guard l(mu_);
    ++frees;
    return cudaSuccess;
  }
  cudaError_t memset_async(void*, int, size_t, cudaStream_t) override { return cudaSuccess; }
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

 private:
  static CapturedConfig capture(const ncclConfig_t& c) {
    CapturedConfig out;
    out.config = c;
    if (c.netName) out.net_name = c.netName, out.has_net_name = true;
    if (c.commName) out.comm_name = c.commName, out.has_comm_name = true;
    out.config.netName = nullptr;
    out.config.commName = nullptr;
    return out;
  }
  ncclComm_t next_comm() { return reinterpret_cast<ncclComm_t>(next_handle_++); }
  void record(const char* name) { calls.push_back(NcclCall{name}); }
  ncclResult_t op_call(const char* name, const void* in, const void* out, size_t n,
                       ncclDataType_t dt, ncclRedOp_t op, int root) {
    std::lock_guard l(mu_);
    calls.push_back(NcclCall{name, in, out, n, dt, op, root});
    // NCCL refuses a call on a communicator whose last operation is still in
    // progress ("Attempt to use communicator before the previous operation
    // returned ncclSuccess").
    return pending_ != 0 ? ncclInvalidArgument : ncclSuccess;
  }

  std::mutex mu_;
  std::map<cudaEvent_t, bool> events_;
  std::map<cudaStream_t, size_t> stream_handles_;  // index into stream_priorities
  int pending_ = 0;
  ncclComm_t* deferred_child_ = nullptr;  // the split's output, written once the parent settles
  uintptr_t next_handle_ = 0x1000;
};

}  // namespace comms::nccl::testing
