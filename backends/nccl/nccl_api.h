// The thin seam between the plugin's logic and NCCL/CUDA. Production uses
// real_nccl_api(); CPU tests substitute a fake to drive init, timeouts,
// abort and argument handling without a device.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>

#include "nccl_hints.h"

// What headers older than the loaded NCCL may lack, declared here with the
// values the newer headers define (nccl_api.cc checks each against the header
// when it has it): the plugin is built against one header and uses what the
// NCCL loaded at run time has.
#ifndef NCCL_SHRINK_DEFAULT
#define NCCL_SHRINK_DEFAULT 0x00
#endif
#ifndef NCCL_SHRINK_ABORT
#define NCCL_SHRINK_ABORT 0x01
#endif
#ifndef NCCL_REVOKE_DEFAULT
#define NCCL_REVOKE_DEFAULT 0x00
#endif
#ifndef NCCL_SUSPEND_MEM
#define NCCL_SUSPEND_MEM 0x01
#endif
#ifndef NCCL_WIN_COLL_SYMMETRIC
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#endif

namespace comms::nccl {

// The first NCCL release with each optional feature, checked against the
// loaded library's ncclGetVersion (never NCCL_VERSION_CODE).
inline constexpr int kNativeCollectivesVersion = 22800;  // ncclAlltoAll, ncclGather, ncclScatter
inline constexpr int kSuspendVersion = 22900;            // ncclCommSuspend/Resume/MemStats
inline constexpr int kOneSidedVersion = 22900;           // ncclPutSignal, ncclSignal, ncclWaitSignal
inline constexpr int kGrowVersion = 22900;               // ncclCommGetUniqueId, ncclCommGrow
inline constexpr int kTimeoutResultVersion = 23000;      // ncclTimeout

// ncclResult_t 8: ncclTimeout from NCCL 2.30; before, 8 was ncclNumResults
// (never returned). Compare with this, not with ncclTimeout, which older
// headers lack.
inline constexpr int kNcclTimeoutResult = 8;

// ncclCommMemStat_t (NCCL 2.29).
enum class MemStat : int { kSuspendable = 0, kSuspended = 1, kPersistent = 2, kTotal = 3 };

// ncclWaitSignalDesc_t (NCCL 2.29): wait for op_count signals from `peer`.
struct WaitSignalDesc {
  int op_count;
  int peer;
  int sig_index;
  int ctx;
};

// ncclConfig_t as NCCL 2.30 lays it out (ncclConfig_v23000): the plugin
// fills this, not the header's ncclConfig_t, so that a plugin built
// against an older header still sets the fields a newer loaded NCCL reads.
// NCCL takes only min(size, its own sizeof) bytes and reads a field only
// when `version` is at least the release that added it, so `version` is
// the loaded NCCL's (at most kNcclConfigLayoutVersion). nccl_api.cc checks
// every offset against the header's ncclConfig_t where it has the field.
inline constexpr int kNcclConfigLayoutVersion = 23007;
struct NcclConfig {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
};
// NCCL_CONFIG_INITIALIZER for an NCCL of `loaded_version`: every field unset.
NcclConfig initial_config(int loaded_version);

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // NCCL
  virtual ncclResult_t get_version(int* version) = 0;
  virtual ncclResult_t get_unique_id(ncclUniqueId* id) = 0;
  virtual ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                             int rank, NcclConfig* config) = 0;
  virtual ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t* child,
                                  NcclConfig* config) = 0;
  virtual ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* error) = 0;
  virtual ncclResult_t comm_finalize(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_destroy(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_abort(ncclComm_t comm) = 0;
  virtual const char* error_string(ncclResult_t r) = 0;
  virtual const char* last_error(ncclComm_t comm) = 0;
  virtual ncclResult_t group_start() = 0;
  virtual ncclResult_t group_end() = 0;
  virtual ncclResult_t red_op_create_pre_mul_sum(ncclRedOp_t* op, void* scalar,
                                                 ncclDataType_t dtype, ncclComm_t comm) = 0;
  virtual ncclResult_t red_op_destroy(ncclRedOp_t op, ncclComm_t comm) = 0;
  virtual ncclResult_t all_reduce(const void* in, void* out, size_t count, ncclDataType_t dt,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t reduce(const void* in, void* out, size_t count, ncclDataType_t dt,
                              ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t broadcast(const void* in, void* out, size_t count, ncclDataType_t dt,
                                 int root, ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t all_gather(const void* in, void* out, size_t count, ncclDataType_t dt,
                                  ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t reduce_scatter(const void* in, void* out, size_t count, ncclDataType_t dt,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) = 0;
  // Native on NCCL >= 2.28 (has_native_collectives); without, the calls
  // answer ncclInvalidUsage and the plugin uses grouped send/recv.
  virtual ncclResult_t all_to_all(const void* in, void* out, size_t count, ncclDataType_t dt,
                                  ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t gather(const void* in, void* out, size_t count, ncclDataType_t dt,
                              int root, ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t scatter(const void* in, void* out, size_t count, ncclDataType_t dt,
                               int root, ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t send(const void* buf, size_t count, ncclDataType_t dt, int peer,
                            ncclComm_t comm, cudaStream_t s) = 0;
  virtual ncclResult_t recv(void* buf, size_t count, ncclDataType_t dt, int peer,
                            ncclComm_t comm, cudaStream_t s) = 0;
  // Registered buffers (NCCL >= 2.19, checked at run time by the caller).
  virtual ncclResult_t comm_register(ncclComm_t comm, void* buf, size_t bytes, void** handle) = 0;
  virtual ncclResult_t comm_deregister(ncclComm_t comm, void* handle) = 0;
  virtual ncclResult_t nccl_alloc(void** ptr, size_t bytes) = 0;
  virtual ncclResult_t nccl_free(void* ptr) = 0;
  // Elastic recovery, optional: whether the NCCL loaded at run time has
  // ncclCommShrink (>= 2.27) / ncclCommRevoke (>= 2.28), found by dlsym and
  // its version, never linked (an older libnccl still loads the plugin).
  // Absent, the calls answer ncclInvalidUsage.
  virtual bool has_shrink() { return false; }
  virtual bool has_revoke() { return false; }
  virtual ncclResult_t comm_shrink(ncclComm_t /*comm*/, int* /*exclude*/, int /*exclude_count*/,
                                   ncclComm_t* /*child*/, NcclConfig* /*config*/, int /*flags*/) {
    return ncclInvalidUsage;
  }
  virtual ncclResult_t comm_revoke(ncclComm_t /*comm*/, int /*flags*/) { return ncclInvalidUsage; }
  // Elastic growth, optional likewise: ncclCommGetUniqueId and ncclCommGrow
  // (>= 2.29). A member passes its communicator (and, on the one that took
  // the id from it, the id), rank -1; a newcomer no communicator, the id and
  // its rank.
  virtual bool has_grow() { return false; }
  virtual ncclResult_t comm_get_unique_id(ncclComm_t /*comm*/, ncclUniqueId* /*id*/) { return ncclInvalidUsage; }
  virtual ncclResult_t comm_grow(ncclComm_t /*comm*/, int /*nranks*/, const ncclUniqueId* /*id*/, int /*rank*/,
                                 ncclComm_t* /*child*/, NcclConfig* /*config*/) {
    return ncclInvalidUsage;
  }
  // Likewise: ncclAlltoAll/ncclGather/ncclScatter (>= 2.28);
  // ncclCommSuspend/Resume/MemStats (>= 2.29); windows with one-sided ops:
  // ncclCommWindowRegister/Deregister, ncclPutSignal, ncclSignal and
  // ncclWaitSignal (>= 2.29).
  virtual bool has_native_collectives() { return false; }
  virtual bool has_suspend() { return false; }
  virtual bool has_one_sided() { return false; }
  virtual ncclResult_t comm_suspend(ncclComm_t /*comm*/, int /*flags*/) { return ncclInvalidUsage; }
  virtual ncclResult_t comm_resume(ncclComm_t /*comm*/) { return ncclInvalidUsage; }
  virtual ncclResult_t comm_mem_stats(ncclComm_t /*comm*/, MemStat /*stat*/, uint64_t* /*value*/) {
    return ncclInvalidUsage;
  }
  virtual ncclResult_t window_register(ncclComm_t /*comm*/, void* /*buf*/, size_t /*bytes*/, ncclWindow_t* /*win*/,
                                       int /*flags*/) {
    return ncclInvalidUsage;
  }
  virtual ncclResult_t window_deregister(ncclComm_t /*comm*/, ncclWindow_t /*win*/) { return ncclInvalidUsage; }
  virtual ncclResult_t put_signal(const void* /*in*/, size_t /*count*/, ncclDataType_t /*dt*/, int /*peer*/,
                                  ncclWindow_t /*peer_win*/, size_t /*offset*/, int /*sig_index*/, int /*ctx*/,
                                  unsigned int /*flags*/, ncclComm_t /*comm*/, cudaStream_t /*s*/) {
    return ncclInvalidUsage;
  }
  virtual ncclResult_t signal(int /*peer*/, int /*sig_index*/, int /*ctx*/, unsigned int /*flags*/,
                              ncclComm_t /*comm*/, cudaStream_t /*s*/) {
    return ncclInvalidUsage;
  }
  virtual ncclResult_t wait_signal(int /*n*/, WaitSignalDesc* /*descs*/, ncclComm_t /*comm*/,
                                   cudaStream_t /*s*/) {
    return ncclInvalidUsage;
  }

  // The loaded NCCL's version code (ncclGetVersion), 0 if it cannot tell.
  int loaded_version() {
    int v = 0;
    return get_version(&v) == ncclSuccess ? v : 0;
  }

  // CUDA
  virtual cudaError_t get_device_count(int* count) = 0;
  virtual cudaError_t get_device(int* device) = 0;
  virtual cudaError_t set_device(int device) = 0;
  virtual cudaError_t compute_capability(int device, int* major, int* minor) = 0;
  virtual cudaError_t stream_priority_range(int* least, int* greatest) = 0;
  virtual cudaError_t stream_create(cudaStream_t* s, int priority) = 0;
  // The priority CUDA gave the stream (it clamps a requested one to the range).
  virtual cudaError_t stream_get_priority(cudaStream_t s, int* priority) = 0;
  virtual cudaError_t stream_destroy(cudaStream_t s) = 0;
  virtual cudaError_t event_create(cudaEvent_t* e) = 0;  // timing disabled
  virtual cudaError_t event_destroy(cudaEvent_t e) = 0;
  virtual cudaError_t event_record(cudaEvent_t e, cudaStream_t s) = 0;
  virtual cudaError_t event_query(cudaEvent_t e) = 0;
  virtual cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) = 0;
  virtual cudaError_t malloc_device(void** p, size_t bytes) = 0;
  virtual cudaError_t free_device(void* p) = 0;
  virtual cudaError_t memset_async(void* p, int value, size_t bytes, cudaStream_t s) = 0;
  // cudaMemGetInfo: free and total bytes of the current device.
  virtual cudaError_t mem_get_info(size_t* free_bytes, size_t* total_bytes) = 0;
  virtual const char* cuda_error_string(cudaError_t e) = 0;

  // CUDA graphs. The plugin asks only capture_info (cudaStreamGetCaptureInfo:
  // status and capture id); the rest lets tests and gpu-check drive capture
  // and replay through the same seam (and the fake).
  virtual cudaError_t stream_capture_info(cudaStream_t s, cudaStreamCaptureStatus* status,
                                          unsigned long long* id) = 0;
  virtual cudaError_t stream_begin_capture(cudaStream_t s, cudaStreamCaptureMode mode) = 0;
  virtual cudaError_t stream_end_capture(cudaStream_t s, cudaGraph_t* graph) = 0;
  virtual cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) = 0;
  virtual cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t s) = 0;
  virtual cudaError_t graph_exec_destroy(cudaGraphExec_t exec) = 0;
  virtual cudaError_t graph_destroy(cudaGraph_t graph) = 0;
  virtual cudaError_t stream_synchronize(cudaStream_t s) = 0;
};

// The process-wide NcclApi over the linked NCCL and CUDA runtime.
std::shared_ptr<NcclApi> real_nccl_api();

// Writes the fields that are set into `config` (from initial_config). String
// fields point into `fields`, which must outlive the config's use.
void apply_to_config(const NcclConfigFields& fields, NcclConfig* config);

}  // namespace comms::nccl
