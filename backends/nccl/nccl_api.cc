#include "nccl_api.h"

#include <dlfcn.h>

namespace comms::nccl {
namespace {

// Every key that the version table allows for the linked NCCL must have its
// ncclConfig_t field; otherwise the table is wrong and the build says so.
#define COMMS_CHECK_FIELD(key, field)                                                    \
  static_assert(min_nccl_version_for(key) > NCCL_VERSION_CODE ||                              \
                    requires(ncclConfig_t c) { c.field; },                               \
                "ncclConfig_t of this NCCL lacks " #field " although the table allows " key)

COMMS_CHECK_FIELD("blocking", blocking);
COMMS_CHECK_FIELD("cga_cluster_size", cgaClusterSize);
COMMS_CHECK_FIELD("min_ctas", minCTAs);
COMMS_CHECK_FIELD("max_ctas", maxCTAs);
COMMS_CHECK_FIELD("net_name", netName);
COMMS_CHECK_FIELD("split_share", splitShare);
COMMS_CHECK_FIELD("traffic_class", trafficClass);
COMMS_CHECK_FIELD("comm_name", commName);
COMMS_CHECK_FIELD("collnet_enable", collnetEnable);
COMMS_CHECK_FIELD("cta_policy", CTAPolicy);
COMMS_CHECK_FIELD("shrink_share", shrinkShare);
COMMS_CHECK_FIELD("nvls_ctas", nvlsCTAs);
COMMS_CHECK_FIELD("nchannels_per_net_peer", nChannelsPerNetPeer);
COMMS_CHECK_FIELD("nvlink_centric_sched", nvlinkCentricSched);

// Assigns only when the linked ncclConfig_t has the field; translate_hints
// has already rejected keys the linked NCCL lacks.
#define COMMS_SET_FIELD(field, value)                                 \
  if constexpr (requires(ncclConfig_t c) { c.field; }) {              \
    if (value) config->field = *value;                                \
  }
#define COMMS_SET_STRING_FIELD(field, value)                          \
  if constexpr (requires(ncclConfig_t c) { c.field; }) {              \
    if (value) config->field = value->c_str();                        \
  }

// ncclCommShrink / ncclCommRevoke of the libnccl this process loaded, or
// null: looked up by dlsym in the library that holds ncclGetVersion (the
// plugin is loaded RTLD_LOCAL, so RTLD_DEFAULT would not see it), and only
// when that library's version has them.
using ShrinkFn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
struct OptionalSymbols {
  ShrinkFn shrink = nullptr;
  RevokeFn revoke = nullptr;
};

OptionalSymbols find_optional_symbols() {
  OptionalSymbols out;
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return out;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || !info.dli_fname) return out;
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return out;
  // The handle stays open: NCCL is never unloaded while the plugin lives.
  if (version >= NCCL_VERSION(2, 27, 0)) out.shrink = reinterpret_cast<ShrinkFn>(dlsym(lib, "ncclCommShrink"));
  if (version >= NCCL_VERSION(2, 28, 0)) out.revoke = reinterpret_cast<RevokeFn>(dlsym(lib, "ncclCommRevoke"));
  return out;
}

class RealNcclApi final : public NcclApi {
 public:
  bool has_shrink() override { return syms_.shrink != nullptr; }
  bool has_revoke() override { return syms_.revoke != nullptr; }
  ncclResult_t comm_shrink(ncclComm_t comm, int* exclude, int n, ncclComm_t* child, ncclConfig_t* config,
                           int flags) override {
    return syms_.shrink ? syms_.shrink(comm, exclude, n, child, config, flags) : ncclInvalidUsage;
  }
  ncclResult_t comm_revoke(ncclComm_t comm, int flags) override {
    return syms_.revoke ? syms_.revoke(comm, flags) : ncclInvalidUsage;
  }

  ncclResult_t get_version(int* v) override { return ncclGetVersion(v); }
  ncclResult_t get_unique_id(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, config);
  }
  ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t* child,
                          ncclConfig_t* config) override {
    return ncclCommSplit(comm, color, key, child, config);
  }
  ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* e) override {
    return ncclCommGetAsyncError(comm, e);
  }
  ncclResult_t comm_finalize(ncclComm_t comm) override { return ncclCommFinalize(comm); }
  ncclResult_t comm_destroy(ncclComm_t comm) override { return ncclCommDestroy(comm); }
  ncclResult_t comm_abort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  const char* error_string(ncclResult_t r) override { return ncclGetErrorString(r); }
  const char* last_error(ncclComm_t comm) override { return ncclGetLastError(comm); }
  ncclResult_t group_start() override { return ncclGroupStart(); }
  ncclResult_t group_end() override { return ncclGroupEnd(); }
  ncclResult_t red_op_create_pre_mul_sum(ncclRedOp_t* op, void* scalar, ncclDataType_t dt,
                                         ncclComm_t comm) override {
    return ncclRedOpCreatePreMulSum(op, scalar, dt, ncclScalarHostImmediate, comm);
  }
  ncclResult_t red_op_destroy(ncclRedOp_t op, ncclComm_t comm) override {
    return ncclRedOpDestroy(op, comm);
  }
  ncclResult_t all_reduce(const void* in, void* out, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                          ncclComm_t comm, cudaStream_t s) override {
    return ncclAllReduce(in, out, n, dt, op, comm, s);
  }
  ncclResult_t reduce(const void* in, void* out, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                      int root, ncclComm_t comm, cudaStream_t s) override {
    return ncclReduce(in, out, n, dt, op, root, comm, s);
  }
  ncclResult_t broadcast(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                         ncclComm_t comm, cudaStream_t s) override {
    return ncclBroadcast(in, out, n, dt, root, comm, s);
  }
  ncclResult_t all_gather(const void* in, void* out, size_t n, ncclDataType_t dt,
                          ncclComm_t comm, cudaStream_t s) override {
    return ncclAllGather(in, out, n, dt, comm, s);
  }
  ncclResult_t reduce_scatter(const void* in, void* out, size_t n, ncclDataType_t dt,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) override {
    return ncclReduceScatter(in, out, n, dt, op, comm, s);
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  ncclResult_t all_to_all(const void* in, void* out, size_t n, ncclDataType_t dt,
                          ncclComm_t comm, cudaStream_t s) override {
    return ncclAlltoAll(in, out, n, dt, comm, s);
  }
  ncclResult_t gather(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                      ncclComm_t comm, cudaStream_t s) override {
    return ncclGather(in, out, n, dt, root, comm, s);
  }
  ncclResult_t scatter(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                       ncclComm_t comm, cudaStream_t s) override {
    return ncclScatter(in, out, n, dt, root, comm, s);
  }
#else
  ncclResult_t all_to_all(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                          cudaStream_t) override { return ncclInvalidUsage; }
  ncclResult_t gather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                      cudaStream_t) override { return ncclInvalidUsage; }
  ncclResult_t scatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) override { return ncclInvalidUsage; }
#endif
  ncclResult_t send(const void* buf, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                    cudaStream_t s) override {
    return ncclSend(buf, n, dt, peer, comm, s);
  }
  ncclResult_t recv(void* buf, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm,
                    cudaStream_t s) override {
    return ncclRecv(buf, n, dt, peer, comm, s);
  }
  ncclResult_t comm_register(ncclComm_t comm, void* buf, size_t bytes, void** handle) override {
    return ncclCommRegister(comm, buf, bytes, handle);
  }
  ncclResult_t comm_deregister(ncclComm_t comm, void* handle) override {
    return ncclCommDeregister(comm, handle);
  }
  ncclResult_t nccl_alloc(void** ptr, size_t bytes) override { return ncclMemAlloc(ptr, bytes); }
  ncclResult_t nccl_free(void* ptr) override { return ncclMemFree(ptr); }

  cudaError_t get_device_count(int* n) override { return cudaGetDeviceCount(n); }
  cudaError_t get_device(int* d) override { return cudaGetDevice(d); }
  cudaError_t set_device(int d) override { return cudaSetDevice(d); }
  cudaError_t compute_capability(int d, int* major, int* minor) override {
    cudaError_t e = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, d);
    if (e != cudaSuccess) return e;
    return cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, d);
  }
  cudaError_t stream_priority_range(int* least, int* greatest) override {
    return cudaDeviceGetStreamPriorityRange(least, greatest);
  }
  cudaError_t stream_create(cudaStream_t* s, int priority) override {
    return cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, priority);
  }
  cudaError_t stream_get_priority(cudaStream_t s, int* priority) override {
    return cudaStreamGetPriority(s, priority);
  }
  cudaError_t stream_destroy(cudaStream_t s) override { return cudaStreamDestroy(s); }
  cudaError_t event_create(cudaEvent_t* e) override {
    return cudaEventCreateWithFlags(e, cudaEventDisableTiming);
  }
  cudaError_t event_destroy(cudaEvent_t e) override { return cudaEventDestroy(e); }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) override {
    return cudaEventRecord(e, s);
  }
  cudaError_t event_query(cudaEvent_t e) override { return cudaEventQuery(e); }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) override {
    return cudaStreamWaitEvent(s, e, 0);
  }
  cudaError_t malloc_device(void** p, size_t bytes) override { return cudaMalloc(p, bytes); }
  cudaError_t free_device(void* p) override { return cudaFree(p); }
  cudaError_t memset_async(void* p, int v, size_t bytes, cudaStream_t s) override {
    return cudaMemsetAsync(p, v, bytes, s);
  }
  cudaError_t mem_get_info(size_t* free_bytes, size_t* total_bytes) override {
    return cudaMemGetInfo(free_bytes, total_bytes);
  }
  const char* cuda_error_string(cudaError_t e) override { return cudaGetErrorString(e); }

  cudaError_t stream_capture_info(cudaStream_t s, cudaStreamCaptureStatus* status,
                                  unsigned long long* id) override {
    return cudaStreamGetCaptureInfo(s, status, id);
  }
  cudaError_t stream_begin_capture(cudaStream_t s, cudaStreamCaptureMode mode) override {
    return cudaStreamBeginCapture(s, mode);
  }
  cudaError_t stream_end_capture(cudaStream_t s, cudaGraph_t* graph) override {
    return cudaStreamEndCapture(s, graph);
  }
  cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) override {
    return cudaGraphInstantiate(exec, graph, 0);
  }
  cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t s) override {
    return cudaGraphLaunch(exec, s);
  }
  cudaError_t graph_exec_destroy(cudaGraphExec_t exec) override {
    return cudaGraphExecDestroy(exec);
  }
  cudaError_t graph_destroy(cudaGraph_t graph) override { return cudaGraphDestroy(graph); }
  cudaError_t stream_synchronize(cudaStream_t s) override { return cudaStreamSynchronize(s); }

 private:
  const OptionalSymbols syms_ = find_optional_symbols();
};

}  // namespace

std::shared_ptr<NcclApi> real_nccl_api() {
  static const std::shared_ptr<NcclApi> api = std::make_shared<RealNcclApi>();
  return api;
}

void apply_to_config(const NcclConfigFields& f, ncclConfig_t* config) {
  COMMS_SET_FIELD(blocking, f.blocking);
  COMMS_SET_FIELD(cgaClusterSize, f.cga_cluster_size);
  COMMS_SET_FIELD(minCTAs, f.min_ctas);
  COMMS_SET_FIELD(maxCTAs, f.max_ctas);
  // NCCL checks minCTAs > maxCTAs even when maxCTAs is unset (its "undefined"
  // is INT_MIN), so min_ctas alone fails init and split with "Invalid config
  // min/max channels attribute value 2/-2147483648" (NCCL 2.28.3). Give
  // maxCTAs its default then.
  if (f.min_ctas && !f.max_ctas) config->maxCTAs = kMaxCtas;
  COMMS_SET_STRING_FIELD(netName, f.net_name);
  COMMS_SET_FIELD(splitShare, f.split_share);
  COMMS_SET_FIELD(trafficClass, f.traffic_class);
  COMMS_SET_STRING_FIELD(commName, f.comm_name);
  COMMS_SET_FIELD(collnetEnable, f.collnet_enable);
  COMMS_SET_FIELD(CTAPolicy, f.cta_policy);
  COMMS_SET_FIELD(shrinkShare, f.shrink_share);
  COMMS_SET_FIELD(nvlsCTAs, f.nvls_ctas);
  COMMS_SET_FIELD(nChannelsPerNetPeer, f.nchannels_per_net_peer);
  COMMS_SET_FIELD(nvlinkCentricSched, f.nvlink_centric_sched);
}

}  // namespace comms::nccl
