// The thin seam between the plugin's logic and NCCL/CUDA. Production uses
// real_nccl_api(); CPU tests substitute a fake to drive init, timeouts,
// abort and argument handling without a device.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "nccl_hints.h"

// Older headers lack these (values as NCCL 2.27/2.28 define them).
#ifndef NCCL_SHRINK_DEFAULT
#define NCCL_SHRINK_DEFAULT 0x00
#endif
#ifndef NCCL_SHRINK_ABORT
#define NCCL_SHRINK_ABORT 0x01
#endif
#ifndef NCCL_REVOKE_DEFAULT
#define NCCL_REVOKE_DEFAULT 0x00
#endif

namespace comms::nccl {

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // NCCL
  virtual ncclResult_t get_version(int* version) = 0;
  virtual ncclResult_t get_unique_id(ncclUniqueId* id) = 0;
  virtual ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                             int rank, ncclConfig_t* config) = 0;
  virtual ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t* child,
                                  ncclConfig_t* config) = 0;
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
  // Native on NCCL >= 2.28; older builds emulate these three with grouped p2p.
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
                                   ncclComm_t* /*child*/, ncclConfig_t* /*config*/, int /*flags*/) {
    return ncclInvalidUsage;
  }
  virtual ncclResult_t comm_revoke(ncclComm_t /*comm*/, int /*flags*/) { return ncclInvalidUsage; }

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

// Writes the fields that are set into `config` (initialized by the caller
// with NCCL_CONFIG_INITIALIZER). String fields point into `fields`, which must
// outlive the config's use.
void apply_to_config(const NcclConfigFields& fields, ncclConfig_t* config);

}  // namespace comms::nccl
