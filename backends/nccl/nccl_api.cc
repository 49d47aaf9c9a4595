#include "nccl_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace comms::nccl {
namespace {

// NcclConfig must lay out every field where the header's ncclConfig_t has
// it (a field the header lacks is checked by the header that has it: the CI
// build against the newest wheel's nccl.h).
#define COMMS_CHECK_FIELD(field)                                                      \
  static_assert(                                                                      \
      []<class C>(C*) {                                                               \
        if constexpr (requires(C c) { c.field; }) {                                   \
          return offsetof(C, field) == offsetof(NcclConfig, field);                   \
        } else {                                                                      \
          return true;                                                                \
        }                                                                             \
      }(static_cast<ncclConfig_t*>(nullptr)),                                         \
      "NcclConfig::" #field " is not where the linked nccl.h has it")
COMMS_CHECK_FIELD(size);
COMMS_CHECK_FIELD(magic);
COMMS_CHECK_FIELD(version);
COMMS_CHECK_FIELD(blocking);
COMMS_CHECK_FIELD(cgaClusterSize);
COMMS_CHECK_FIELD(minCTAs);
COMMS_CHECK_FIELD(maxCTAs);
COMMS_CHECK_FIELD(netName);
COMMS_CHECK_FIELD(splitShare);
COMMS_CHECK_FIELD(trafficClass);
COMMS_CHECK_FIELD(commName);
COMMS_CHECK_FIELD(collnetEnable);
COMMS_CHECK_FIELD(CTAPolicy);
COMMS_CHECK_FIELD(shrinkShare);
COMMS_CHECK_FIELD(nvlsCTAs);
COMMS_CHECK_FIELD(nChannelsPerNetPeer);
COMMS_CHECK_FIELD(nvlinkCentricSched);
COMMS_CHECK_FIELD(graphUsageMode);
COMMS_CHECK_FIELD(numRmaCtx);
COMMS_CHECK_FIELD(maxP2pPeers);
COMMS_CHECK_FIELD(graphStreamOrdering);
// A header with graphStreamOrdering has at least NcclConfig's fields.
static_assert(
    []<class C>(C*) {
      if constexpr (requires(C c) { c.graphStreamOrdering; }) return sizeof(C) >= sizeof(NcclConfig);
      return true;
    }(static_cast<ncclConfig_t*>(nullptr)),
    "the linked ncclConfig_t is smaller than NcclConfig");

// The declarations of nccl_api.h against the header, where it has them.
static_assert(NCCL_SUSPEND_MEM == 0x01 && NCCL_WIN_COLL_SYMMETRIC == 0x01 && NCCL_SHRINK_ABORT == 0x01);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
static_assert(static_cast<int>(ncclTimeout) == kNcclTimeoutResult);
#else
static_assert(static_cast<int>(ncclNumResults) == kNcclTimeoutResult);
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
// The grow entry points as GrowFn/GrowIdFn below call them (NcclConfig in
// place of ncclConfig_t, as for every config).
static_assert(std::is_same_v<decltype(&ncclCommGrow), ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int,
                                                                         ncclComm_t*, ncclConfig_t*)> &&
              std::is_same_v<decltype(&ncclCommGetUniqueId), ncclResult_t (*)(ncclComm_t, ncclUniqueId*)>);
static_assert(static_cast<int>(ncclStatGpuMemSuspend) == static_cast<int>(MemStat::kSuspendable) &&
              static_cast<int>(ncclStatGpuMemSuspended) == static_cast<int>(MemStat::kSuspended) &&
              static_cast<int>(ncclStatGpuMemPersist) == static_cast<int>(MemStat::kPersistent) &&
              static_cast<int>(ncclStatGpuMemTotal) == static_cast<int>(MemStat::kTotal));
static_assert(sizeof(WaitSignalDesc) == sizeof(ncclWaitSignalDesc_t) &&
              offsetof(WaitSignalDesc, op_count) == offsetof(ncclWaitSignalDesc_t, opCnt) &&
              offsetof(WaitSignalDesc, peer) == offsetof(ncclWaitSignalDesc_t, peer) &&
              offsetof(WaitSignalDesc, sig_index) == offsetof(ncclWaitSignalDesc_t, sigIdx) &&
              offsetof(WaitSignalDesc, ctx) == offsetof(ncclWaitSignalDesc_t, ctx));
#endif

// The optional entry points of the libnccl this process loaded, or null:
// looked up by dlsym in the library that holds ncclGetVersion (the plugin
// is loaded RTLD_LOCAL, so RTLD_DEFAULT would not see it), and only when
// that library's version has them. Signatures as NCCL 2.30.7's nccl.h.
using ShrinkFn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, NcclConfig*, int);
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
using CollFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
using RootedFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using SuspendFn = ncclResult_t (*)(ncclComm_t, int);
using ResumeFn = ncclResult_t (*)(ncclComm_t);
using MemStatsFn = ncclResult_t (*)(ncclComm_t, int, uint64_t*);
using WinRegisterFn = ncclResult_t (*)(ncclComm_t, void*, size_t, ncclWindow_t*, int);
using WinDeregisterFn = ncclResult_t (*)(ncclComm_t, ncclWindow_t);
using PutSignalFn = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int, int,
                                     unsigned int, ncclComm_t, cudaStream_t);
using SignalFn = ncclResult_t (*)(int, int, int, unsigned int, ncclComm_t, cudaStream_t);
using WaitSignalFn = ncclResult_t (*)(int, WaitSignalDesc*, ncclComm_t, cudaStream_t);
using GrowIdFn = ncclResult_t (*)(ncclComm_t, ncclUniqueId*);
using GrowFn = ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, NcclConfig*);

struct OptionalSymbols {
  ShrinkFn shrink = nullptr;
  RevokeFn revoke = nullptr;
  CollFn all_to_all = nullptr;
  RootedFn gather = nullptr, scatter = nullptr;
  SuspendFn suspend = nullptr;
  ResumeFn resume = nullptr;
  MemStatsFn mem_stats = nullptr;
  WinRegisterFn win_register = nullptr;
  WinDeregisterFn win_deregister = nullptr;
  PutSignalFn put_signal = nullptr;
  SignalFn signal = nullptr;
  WaitSignalFn wait_signal = nullptr;
  GrowIdFn grow_id = nullptr;
  GrowFn grow = nullptr;
  bool native_collectives() const { return all_to_all && gather && scatter; }
  bool suspend_resume() const { return suspend && resume && mem_stats; }
  bool one_sided() const { return win_register && win_deregister && put_signal && signal && wait_signal; }
  bool growth() const { return grow_id && grow; }
};

template <class Fn>
void find(void* lib, int version, int needed, const char* name, Fn* out) {
  if (version >= needed) *out = reinterpret_cast<Fn>(dlsym(lib, name));
}

OptionalSymbols find_optional_symbols() {
  OptionalSymbols out;
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return out;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || !info.dli_fname) return out;
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return out;
  // The handle stays open: NCCL is never unloaded while the plugin lives.
  find(lib, version, NCCL_VERSION(2, 27, 0), "ncclCommShrink", &out.shrink);
  find(lib, version, NCCL_VERSION(2, 28, 0), "ncclCommRevoke", &out.revoke);
  find(lib, version, kNativeCollectivesVersion, "ncclAlltoAll", &out.all_to_all);
  find(lib, version, kNativeCollectivesVersion, "ncclGather", &out.gather);
  find(lib, version, kNativeCollectivesVersion, "ncclScatter", &out.scatter);
  find(lib, version, kSuspendVersion, "ncclCommSuspend", &out.suspend);
  find(lib, version, kSuspendVersion, "ncclCommResume", &out.resume);
  find(lib, version, kSuspendVersion, "ncclCommMemStats", &out.mem_stats);
  find(lib, version, kOneSidedVersion, "ncclCommWindowRegister", &out.win_register);
  find(lib, version, kOneSidedVersion, "ncclCommWindowDeregister", &out.win_deregister);
  find(lib, version, kOneSidedVersion, "ncclPutSignal", &out.put_signal);
  find(lib, version, kOneSidedVersion, "ncclSignal", &out.signal);
  find(lib, version, kOneSidedVersion, "ncclWaitSignal", &out.wait_signal);
  find(lib, version, kGrowVersion, "ncclCommGetUniqueId", &out.grow_id);
  find(lib, version, kGrowVersion, "ncclCommGrow", &out.grow);
  return out;
}

class RealNcclApi final : public NcclApi {
 public:
  bool has_shrink() override { return syms_.shrink != nullptr; }
  bool has_revoke() override { return syms_.revoke != nullptr; }
  ncclResult_t comm_shrink(ncclComm_t comm, int* exclude, int n, ncclComm_t* child, NcclConfig* config,
                           int flags) override {
    return syms_.shrink ? syms_.shrink(comm, exclude, n, child, config, flags) : ncclInvalidUsage;
  }
  ncclResult_t comm_revoke(ncclComm_t comm, int flags) override {
    return syms_.revoke ? syms_.revoke(comm, flags) : ncclInvalidUsage;
  }
  bool has_grow() override { return syms_.growth(); }
  ncclResult_t comm_get_unique_id(ncclComm_t comm, ncclUniqueId* id) override {
    return has_grow() ? syms_.grow_id(comm, id) : ncclInvalidUsage;
  }
  ncclResult_t comm_grow(ncclComm_t comm, int nranks, const ncclUniqueId* id, int rank, ncclComm_t* child,
                         NcclConfig* config) override {
    return has_grow() ? syms_.grow(comm, nranks, id, rank, child, config) : ncclInvalidUsage;
  }
  bool has_native_collectives() override { return syms_.native_collectives(); }
  bool has_suspend() override { return syms_.suspend_resume(); }
  bool has_one_sided() override { return syms_.one_sided(); }
  ncclResult_t comm_suspend(ncclComm_t comm, int flags) override {
    return has_suspend() ? syms_.suspend(comm, flags) : ncclInvalidUsage;
  }
  ncclResult_t comm_resume(ncclComm_t comm) override { return has_suspend() ? syms_.resume(comm) : ncclInvalidUsage; }
  ncclResult_t comm_mem_stats(ncclComm_t comm, MemStat stat, uint64_t* value) override {
    return has_suspend() ? syms_.mem_stats(comm, static_cast<int>(stat), value) : ncclInvalidUsage;
  }
  ncclResult_t window_register(ncclComm_t comm, void* buf, size_t bytes, ncclWindow_t* win, int flags) override {
    return has_one_sided() ? syms_.win_register(comm, buf, bytes, win, flags) : ncclInvalidUsage;
  }
  ncclResult_t window_deregister(ncclComm_t comm, ncclWindow_t win) override {
    return has_one_sided() ? syms_.win_deregister(comm, win) : ncclInvalidUsage;
  }
  ncclResult_t put_signal(const void* in, size_t count, ncclDataType_t dt, int peer, ncclWindow_t win, size_t offset,
                          int sig_index, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t s) override {
    return has_one_sided() ? syms_.put_signal(in, count, dt, peer, win, offset, sig_index, ctx, flags, comm, s)
                           : ncclInvalidUsage;
  }
  ncclResult_t signal(int peer, int sig_index, int ctx, unsigned int flags, ncclComm_t comm,
                      cudaStream_t s) override {
    return has_one_sided() ? syms_.signal(peer, sig_index, ctx, flags, comm, s) : ncclInvalidUsage;
  }
  ncclResult_t wait_signal(int n, WaitSignalDesc* descs, ncclComm_t comm, cudaStream_t s) override {
    return has_one_sided() ? syms_.wait_signal(n, descs, comm, s) : ncclInvalidUsage;
  }

  ncclResult_t get_version(int* v) override { return ncclGetVersion(v); }
  ncclResult_t get_unique_id(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  // NCCL reads the config through its size and version fields, so NcclConfig
  // goes where the header's ncclConfig_t is expected.
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     NcclConfig* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, reinterpret_cast<ncclConfig_t*>(config));
  }
  ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t* child,
                          NcclConfig* config) override {
    return ncclCommSplit(comm, color, key, child, reinterpret_cast<ncclConfig_t*>(config));
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
  ncclResult_t all_to_all(const void* in, void* out, size_t n, ncclDataType_t dt,
                          ncclComm_t comm, cudaStream_t s) override {
    return has_native_collectives() ? syms_.all_to_all(in, out, n, dt, comm, s) : ncclInvalidUsage;
  }
  ncclResult_t gather(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                      ncclComm_t comm, cudaStream_t s) override {
    return has_native_collectives() ? syms_.gather(in, out, n, dt, root, comm, s) : ncclInvalidUsage;
  }
  ncclResult_t scatter(const void* in, void* out, size_t n, ncclDataType_t dt, int root,
                       ncclComm_t comm, cudaStream_t s) override {
    return has_native_collectives() ? syms_.scatter(in, out, n, dt, root, comm, s) : ncclInvalidUsage;
  }
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

NcclConfig initial_config(int loaded_version) {
  NcclConfig c{};
  c.size = sizeof(NcclConfig);
  c.magic = 0xcafebeef;  // NCCL_API_MAGIC
  c.version = static_cast<unsigned int>(std::clamp(loaded_version, NCCL_VERSION(2, 14, 0), kNcclConfigLayoutVersion));
  c.blocking = c.cgaClusterSize = c.minCTAs = c.maxCTAs = NCCL_CONFIG_UNDEF_INT;
  c.netName = c.commName = nullptr;
  c.splitShare = c.trafficClass = c.collnetEnable = c.CTAPolicy = c.shrinkShare = NCCL_CONFIG_UNDEF_INT;
  c.nvlsCTAs = c.nChannelsPerNetPeer = c.nvlinkCentricSched = NCCL_CONFIG_UNDEF_INT;
  c.graphUsageMode = c.numRmaCtx = c.maxP2pPeers = c.graphStreamOrdering = NCCL_CONFIG_UNDEF_INT;
  return c;
}

void apply_to_config(const NcclConfigFields& f, NcclConfig* config) {
  auto set = [](int& field, const std::optional<int>& value) {
    if (value) field = *value;
  };
  set(config->blocking, f.blocking);
  set(config->cgaClusterSize, f.cga_cluster_size);
  set(config->minCTAs, f.min_ctas);
  set(config->maxCTAs, f.max_ctas);
  // NCCL checks minCTAs > maxCTAs even when maxCTAs is unset (its "undefined"
  // is INT_MIN), so min_ctas alone fails init and split with "Invalid config
  // min/max channels attribute value 2/-2147483648" (NCCL 2.28.3). Give
  // maxCTAs its default then.
  if (f.min_ctas && !f.max_ctas) config->maxCTAs = kMaxCtas;
  if (f.net_name) config->netName = f.net_name->c_str();
  set(config->splitShare, f.split_share);
  set(config->trafficClass, f.traffic_class);
  if (f.comm_name) config->commName = f.comm_name->c_str();
  set(config->collnetEnable, f.collnet_enable);
  set(config->CTAPolicy, f.cta_policy);
  set(config->shrinkShare, f.shrink_share);
  set(config->nvlsCTAs, f.nvls_ctas);
  set(config->nChannelsPerNetPeer, f.nchannels_per_net_peer);
  set(config->nvlinkCentricSched, f.nvlink_centric_sched);
  set(config->graphUsageMode, f.graph_usage_mode);
  set(config->numRmaCtx, f.num_rma_ctx);
  set(config->maxP2pPeers, f.max_p2p_peers);
  set(config->graphStreamOrdering, f.graph_stream_ordering);
}

}  // namespace comms::nccl
