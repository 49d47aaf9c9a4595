#include "nccl_backend.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "comms/numeric.h"

namespace comms::nccl {

using plugin::BackendInit;
using plugin::OpDesc;
using plugin::OpType;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr const char* kUniqueIdKey = "nccl/unique_id";
constexpr bool kHasFp8 = NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0);
constexpr bool kHasNativeAllToAllGatherScatter = NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0);

std::optional<ncclDataType_t> native_dtype(DataType t) {
  switch (t) {
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUint32: return ncclUint32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUint64: return ncclUint64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBfloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case DataType::kFloat8E4M3: return ncclFloat8e4m3;
    case DataType::kFloat8E5M2: return ncclFloat8e5m2;
#else
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: return std::nullopt;
#endif
    case DataType::kBool: return std::nullopt;
  }
  return std::nullopt;
}

std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

ncclDataType_t copy_dtype(DataType t) {
  // Data movement is type-agnostic; uint8 keeps fp8 and bool working on
  // every architecture and NCCL version.
  if (t == DataType::kBool || t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2) {
    return ncclUint8;
  }
  return *native_dtype(t);
}

ReductionPlan plan_reduction(DataType dtype, ReduceKind kind, int cc_major, int cc_minor) {
  ReductionPlan plan;
  auto reject = [&](std::string why) {
    plan.reason = "nccl cannot reduce " + std::string(to_string(dtype)) + " with " +
                  std::string(to_string(kind)) + ": " + std::move(why);
    return plan;
  };
  if (!reduction_defined(dtype, kind)) return reject("the reduction is not defined for this type");
  if (dtype == DataType::kBool) {
    plan.dtype = ncclUint8;
    switch (kind) {
      case ReduceKind::kSum:
      case ReduceKind::kMax:
      case ReduceKind::kBor: plan.op = ncclMax; return plan;  // logical or
      case ReduceKind::kProduct:
      case ReduceKind::kMin:
      case ReduceKind::kBand: plan.op = ncclMin; return plan;  // logical and
      default: return reject("NCCL has no logical xor");
    }
  }
  if (kind == ReduceKind::kBand || kind == ReduceKind::kBor || kind == ReduceKind::kBxor) {
    return reject("NCCL has no bitwise reductions");
  }
  const bool fp8 = dtype == DataType::kFloat8E4M3 || dtype == DataType::kFloat8E5M2;
  if (fp8 && !kHasFp8) {
    return reject("fp8 needs NCCL >= 2.24; this build links NCCL " +
                  nccl_version_string(NCCL_VERSION_CODE));
  }
  if (fp8 && cc_major >= 0 && cc_major < 9) {
    return reject("fp8 reductions need a device of compute capability 9.0 (sm_90) or newer; "
                  "this one is " + std::to_string(cc_major) + "." + std::to_string(cc_minor));
  }
  // NCCL (through 2.28 at least) reduces fp8 with sum, product, min and
  // max; avg and premul_sum fail at launch with "invalid argument", as seen
  // on an H100 with NCCL 2.28.3.
  if (fp8 && (kind == ReduceKind::kAvg || kind == ReduceKind::kPremulSum)) {
    return reject("NCCL has no " + std::string(to_string(kind)) + " for fp8 (it has sum, product, min and max)");
  }
  plan.dtype = *native_dtype(dtype);
  switch (kind) {
    case ReduceKind::kSum: plan.op = ncclSum; break;
    case ReduceKind::kProduct: plan.op = ncclProd; break;
    case ReduceKind::kMin: plan.op = ncclMin; break;
    case ReduceKind::kMax: plan.op = ncclMax; break;
    case ReduceKind::kAvg: plan.op = ncclAvg; break;
    case ReduceKind::kPremulSum: plan.premul_sum = true; break;
    default: break;
  }
  return plan;
}

void encode_scalar(double value, DataType dtype, void* out) {
  std::memset(out, 0, 8);
  numeric::store_from_double(out, dtype, 0, value);
}

namespace {

// A non-blocking communicator may answer ncclInProgress where a blocking one
// answers ncclSuccess: inside a group (ncclGroupEnd settles the group), and
// from abort/destroy (which release it in the background).
bool accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

Status nccl_status(NcclApi& api, ncclComm_t comm, ncclResult_t r, std::string_view what) {
  ErrorCode code = ErrorCode::kInternal;
  if (r == ncclRemoteError) code = ErrorCode::kPeerFailure;
  else if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = ErrorCode::kInvalidArgument;
  std::string msg = std::string(what) + " failed: " + api.error_string(r);
  if (const char* last = api.last_error(comm); last && *last) msg += " (" + std::string(last) + ")";
  return {code, std::move(msg)};
}

Status cuda_status(NcclApi& api, cudaError_t e, std::string_view what) {
  return {ErrorCode::kInternal, std::string(what) + " failed: " + api.cuda_error_string(e)};
}

// Makes `device` current for a scope and restores the caller's device, so
// that calling into the backend never changes the caller's CUDA context.
class DeviceGuard {
 public:
  DeviceGuard(NcclApi& api, int device) : api_(api) {
    if (api_.get_device(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = api_.set_device(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && status_ == cudaSuccess) api_.set_device(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  NcclApi& api_;
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// One op's completion, shared by its Work, the comm's queue and the watchdog.
// Reused end-of-op events: creating and destroying one per op cost about a
// microsecond of comms' per-op overhead over raw NCCL. Shared with the Works,
// which give their event back when they go; events are released with the last
// holder. Every event is created on the comm's device.
class EventPool {
 public:
  explicit EventPool(std::shared_ptr<NcclApi> api) : api_(std::move(api)) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) api_->event_destroy(e);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // The caller has the comm's device current.
  cudaError_t take(cudaEvent_t* e) {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        *e = free_.back();
        free_.pop_back();
        return cudaSuccess;
      }
    }
    return api_->event_create(e);
  }
  // Re-recording an event that is still pending is allowed: a wait already
  // enqueued on it keeps waiting for the capture it saw.
  void give(cudaEvent_t e) {
    {
      std::lock_guard lock(mu_);
      if (free_.size() < kKept) {
        free_.push_back(e);
        return;
      }
    }
    api_->event_destroy(e);
  }

 private:
  // Ops stay queued until the watchdog's next round: enough for 20 ms of ops
  // at a few microseconds each.
  static constexpr size_t kKept = 8192;
  std::shared_ptr<NcclApi> api_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

struct WorkState {
  std::shared_ptr<EventPool> events;
  uint64_t seq = 0;
  OpType type = OpType::kBarrier;
  cudaEvent_t end = nullptr;
  milliseconds timeout{0};
  Clock::time_point deadline;
  // Guarded by Core::mu.
  bool done = false;
  Status status;

  ~WorkState() {
    if (end) events->give(end);
  }
  std::string label() const {
    return std::string(plugin::op_name(type)) + " #" + std::to_string(seq);
  }
};

// The comm's state, shared with its Works so that a Work outliving the
// backend still answers.
class Core {
 public:
  Core(std::shared_ptr<NcclApi> api, BackendInit init, Hints raw_hints, TranslatedHints hints)
      : api_(std::move(api)),
        init_(std::move(init)),
        raw_hints_(std::move(raw_hints)),
        hints_(std::move(hints)),
        op_timeout_(init_.op_timeout) {
    device_ = init_.device.index >= 0 ? init_.device.index : init_.local_rank;
    events_ = std::make_shared<EventPool>(api_);
    if (api_->compute_capability(device_, &cc_major_, &cc_minor_) != cudaSuccess) {
      cc_major_ = cc_minor_ = -1;
    }
  }

  std::mutex mu;
  std::condition_variable watchdog_cv;

  NcclApi& api() { return *api_; }
  const std::shared_ptr<NcclApi>& api_ptr() { return api_; }
  const BackendInit& init() const { return init_; }
  int device() const { return device_; }
  int cc_major() const { return cc_major_; }
  int cc_minor() const { return cc_minor_; }

  void log(int level, const std::string& msg) const {
    const std::string text = "comms nccl [" + init_.comm_name + " rank " +
                             std::to_string(init_.rank) + "]: " + msg;
    if (init_.log) init_.log(level, text.c_str());
    else if (level >= 2) std::fprintf(stderr, "%s\n", text.c_str());
  }

  // --- init -------------------------------------------------------------

  Status init_locked() {
    if (comm_) return {};
    if (!failure_.is_ok()) return failure_;
    DeviceGuard guard(*api_, device_);
    if (cudaError_t e = guard.status(); e != cudaSuccess) {
      return {ErrorCode::kNotFound, "cannot bind cuda:" + std::to_string(device_) + ": " +
                                        api_->cuda_error_string(e) +
                                        " (is a CUDA device present and visible?)"};
    }
    ncclUniqueId id;
    if (Status s = exchange_unique_id(&id); !s.is_ok()) return s;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    fill_config(&config);
    ncclComm_t comm = nullptr;
    const auto deadline = Clock::now() + init_.init_timeout;
    ncclResult_t r = api_->comm_init_rank_config(&comm, init_.size, id, init_.rank, &config);
    if (Status s = settle(comm, r, deadline, "ncclCommInitRankConfig"); !s.is_ok()) {
      if (comm) api_->comm_abort(comm);
      if (s.code == ErrorCode::kTimeout) {
        s.message = "NCCL communicator init (rank " + std::to_string(init_.rank) + " of " +
                    std::to_string(init_.size) + ", cuda:" + std::to_string(device_) +
                    ") did not finish within " + ms_text(init_.init_timeout) +
                    "; are all ranks running and initializing this comm?";
      }
      // Sticky: retrying would publish or wait for a second unique id that
      // peers who got past this point never read.
      failure_ = s;
      return s;
    }
    if (Status s = adopt_locked(comm); !s.is_ok()) {
      failure_ = s;
      return s;
    }
    return {};
  }

  // Takes ownership of a ready communicator (from init or split) and creates
  // the stream, the caller-ordering event and the barrier scratch.
  Status adopt_locked(ncclComm_t comm) {
    comm_ = comm;
    auto fail = [&](Status s) {
      release_locked(/*graceful=*/false);
      return s;
    };
    DeviceGuard guard(*api_, device_);
    if (cudaError_t e = guard.status(); e != cudaSuccess) {
      return fail(cuda_status(*api_, e, "cudaSetDevice"));
    }
    int least = 0, greatest = 0;
    if (cudaError_t e = api_->stream_priority_range(&least, &greatest); e != cudaSuccess) {
      return fail(cuda_status(*api_, e, "cudaDeviceGetStreamPriorityRange"));
    }
    // 0 is CUDA's default priority; numerically lower is higher priority.
    stream_priority_ = hints_.priority == StreamPriority::kHigh ? greatest : 0;
    if (cudaError_t e = api_->stream_create(&stream_, stream_priority_); e != cudaSuccess) {
      return fail(cuda_status(*api_, e, "cudaStreamCreateWithPriority"));
    }
    if (cudaError_t e = api_->event_create(&caller_ready_); e != cudaSuccess) {
      return fail(cuda_status(*api_, e, "cudaEventCreate"));
    }
    if (cudaError_t e = api_->malloc_device(&scratch_, sizeof(float)); e != cudaSuccess) {
      return fail(cuda_status(*api_, e, "cudaMalloc of the barrier scratch"));
    }
    if (cudaError_t e = api_->memset_async(scratch_, 0, sizeof(float), stream_); e != cudaSuccess) {
      return fail(cuda_status(*api_, e, "cudaMemsetAsync of the barrier scratch"));
    }
    watchdog_cv.notify_all();
    return {};
  }

  bool initialized_locked() const { return comm_ != nullptr; }

  // --- ops --------------------------------------------------------------

  Status submit_locked(const OpDesc& op, std::shared_ptr<WorkState>* out_work) {
    if (!failure_.is_ok()) {
      return {ErrorCode::kAborted, "the NCCL communicator failed earlier: " + failure_.message};
    }
    if (abort_requested_) return {ErrorCode::kAborted, "the comm was aborted"};
    const milliseconds timeout = op.timeout.count() > 0 ? op.timeout : op_timeout_;
    const auto deadline = Clock::now() + timeout;
    DeviceGuard guard(*api_, device_);
    if (cudaError_t e = guard.status(); e != cudaSuccess) {
      return cuda_status(*api_, e, "cudaSetDevice");
    }
    auto caller = static_cast<cudaStream_t>(op.stream);
    if (cudaError_t e = api_->event_record(caller_ready_, caller); e != cudaSuccess) {
      return cuda_status(*api_, e, "cudaEventRecord on the caller's stream");
    }
    if (cudaError_t e = api_->stream_wait_event(stream_, caller_ready_); e != cudaSuccess) {
      return cuda_status(*api_, e, "cudaStreamWaitEvent on the internal stream");
    }
    if (Status s = enqueue_locked(op, deadline); !s.is_ok()) {
      if (s.code == ErrorCode::kTimeout || s.code == ErrorCode::kPeerFailure ||
          s.code == ErrorCode::kInternal) {
        fail_locked(s, nullptr);
      }
      return s;
    }
    auto work = std::make_shared<WorkState>();
    work->events = events_;
    work->seq = op.seq;
    work->type = op.type;
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

  // --- completion, timeouts, failure ------------------------------------

  // Marks `w` done if its event fired, or fails the comm if it is past its
  // deadline. Returns whether it is done (successfully or not).
  // `query` false: an earlier op on the stream is still running, so this
  // one is too; only its deadline is checked.
  bool check_work_locked(WorkState& w, Clock::time_point now, bool query = true) {
    if (w.done) return true;
    const cudaError_t q = query ? api_->event_query(w.end) : cudaErrorNotReady;
    if (q == cudaSuccess) {
      w.done = true;
      return true;
    }
    if (q != cudaErrorNotReady) {
      fail_locked(cuda_status(*api_, q, "waiting for " + w.label()), &w);
      return true;
    }
    if (now >= w.deadline) {
      fail_locked({ErrorCode::kTimeout, w.label() + " did not complete within " +
                                            ms_text(w.timeout) +
                                            "; the NCCL communicator was aborted"},
                  &w);
      return true;
    }
    return false;
  }

  // One watchdog round: NCCL's async error, then every outstanding op.
  void poll_locked(Clock::time_point now) {
    if (comm_ && failure_.is_ok()) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = api_->comm_get_async_error(comm_, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        fail_locked(nccl_status(*api_, comm_, async, "NCCL (asynchronous error)"), nullptr);
      }
    }
    // Ops finish in issue order on the one stream: events are queried up to
    // the first that has not fired (a round stays cheap with many ops queued).
    // A failure clears the queue (fail_locked): hold each op while checking
    // it, and stop there.
    bool query = true;
    for (size_t i = 0; i < outstanding_.size() && failure_.is_ok(); ++i) {
      const std::shared_ptr<WorkState> w = outstanding_[i];
      query = check_work_locked(*w, now, query) && query;
    }
    while (!outstanding_.empty() && outstanding_.front()->done) outstanding_.pop_front();
  }

  // The first failure aborts the NCCL communicator; the culprit gets `cause`
  // and every other outstanding op kAborted. Later ops see failure_.
  void fail_locked(Status cause, WorkState* culprit) {
    if (!failure_.is_ok()) return;
    failure_ = cause;
    if (culprit) {
      culprit->done = true;
      culprit->status = cause;
    }
    // Without a culprit (abort(), an async NCCL error) every outstanding op
    // fails for the same cause; with one, the others were collateral.
    const Status collateral =
        culprit ? Status(ErrorCode::kAborted,
                         "aborted because " + culprit->label() + " failed: " + cause.message)
                : cause;
    for (auto& w : outstanding_) {
      if (!w->done) {
        w->done = true;
        w->status = collateral;
      }
    }
    outstanding_.clear();
    if (comm_) {
      if (ncclResult_t r = api_->comm_abort(comm_); !accepted(r)) {
        log(3, std::string("ncclCommAbort failed: ") + api_->error_string(r));
      }
      comm_ = nullptr;
    }
    log(3, cause.message);
    if (init_.abort_process_on_error && cause.code != ErrorCode::kAborted) {
      log(3, "abort_process_on_error is set: aborting the process");
      std::abort();
    }
  }

  void request_abort(const std::string& reason) {
    abort_requested_ = true;
    std::lock_guard lock(mu);
    fail_locked({ErrorCode::kAborted, "comm aborted: " + reason}, nullptr);
  }

  Status failure_locked() const { return failure_; }
  bool has_outstanding_locked() const { return !outstanding_.empty(); }
  std::deque<std::shared_ptr<WorkState>> outstanding_copy_locked() const { return outstanding_; }

  // --- teardown ---------------------------------------------------------

  // graceful: ncclCommFinalize then ncclCommDestroy (bounded by the op
  // timeout, aborting on expiry); else ncclCommAbort. Every failure to
  // release is reported.
  Status release_locked(bool graceful) {
    std::vector<std::string> errors;
    if (comm_) {
      DeviceGuard guard(*api_, device_);
      if (graceful) {
        const auto deadline = Clock::now() + op_timeout_;
        ncclResult_t r = api_->comm_finalize(comm_);
        Status s = settle(comm_, r, deadline, "ncclCommFinalize");
        if (!s.is_ok()) {
          errors.push_back(s.message);
          if (ncclResult_t a = api_->comm_abort(comm_); !accepted(a)) {
            errors.push_back(std::string("ncclCommAbort failed: ") + api_->error_string(a));
          }
        } else if (ncclResult_t d = api_->comm_destroy(comm_); !accepted(d)) {
          errors.push_back(nccl_status(*api_, nullptr, d, "ncclCommDestroy").message);
        }
      } else if (ncclResult_t a = api_->comm_abort(comm_); !accepted(a)) {
        errors.push_back(std::string("ncclCommAbort failed: ") + api_->error_string(a));
      }
      comm_ = nullptr;
    }
    if (scratch_) {
      if (cudaError_t e = api_->free_device(scratch_); e != cudaSuccess) {
        errors.push_back(cuda_status(*api_, e, "cudaFree of the barrier scratch").message);
      }
      scratch_ = nullptr;
    }
    if (caller_ready_) {
      if (cudaError_t e = api_->event_destroy(caller_ready_); e != cudaSuccess) {
        errors.push_back(cuda_status(*api_, e, "cudaEventDestroy").message);
      }
      caller_ready_ = nullptr;
    }
    if (stream_) {
      if (cudaError_t e = api_->stream_destroy(stream_); e != cudaSuccess) {
        errors.push_back(cuda_status(*api_, e, "cudaStreamDestroy").message);
      }
      stream_ = nullptr;
    }
    if (errors.empty()) return {};
    std::string msg = "releasing the NCCL communicator failed:";
    for (const auto& e : errors) msg += " " + e + ";";
    msg.pop_back();
    return {ErrorCode::kInternal, msg};
  }

  // --- split ------------------------------------------------------------

  Status split_locked(int color, int key, const NcclConfigFields& child_fields,
                      const std::string& child_name, milliseconds timeout, ncclComm_t* child) {
    if (!failure_.is_ok()) {
      return {ErrorCode::kAborted, "the NCCL communicator failed earlier: " + failure_.message};
    }
    const NcclConfigFields fields = plugin_config_fields(child_fields, child_name);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    apply_to_config(fields, &config);
    DeviceGuard guard(*api_, device_);
    const auto deadline = Clock::now() + timeout;
    ncclComm_t out = nullptr;
    ncclResult_t r = api_->comm_split(comm_, color, key, &out, &config);
    // On a non-blocking parent the split may return ncclSuccess with the
    // parent still in progress and `out` not yet set (NCCL 2.28.3): NCCL
    // refuses the parent's next call ("Attempt to use communicator before the
    // previous operation returned ncclSuccess") until the parent is polled to
    // success. So the parent is always polled, then the child once it exists.
    // A non-member gets no child.
    Status s = settle(comm_, r == ncclSuccess ? ncclInProgress : r, deadline, "ncclCommSplit");
    if (s.is_ok() && out) s = settle(out, ncclInProgress, deadline, "ncclCommSplit (the new communicator)");
    if (!s.is_ok()) {
      if (out) api_->comm_abort(out);
      if (s.code == ErrorCode::kTimeout) {
        s.message = "ncclCommSplit did not finish within " + ms_text(timeout) +
                    "; do all ranks of the parent call split?";
      }
      fail_locked(s, nullptr);
      return s;
    }
    *child = out;
    return {};
  }

  // --- describe ---------------------------------------------------------

  NcclConfigFields effective_fields() const {
    return plugin_config_fields(hints_.config, init_.comm_name);
  }

  std::string describe_locked() const {
    nlohmann::ordered_json j;
    j["backend"] = "nccl";
    // The library loaded at run time, which may differ from the headers built against.
    int runtime_version = 0;
    j["nccl_version"] = api_->get_version(&runtime_version) == ncclSuccess ? nccl_version_string(runtime_version)
                                                                          : "unknown";
    j["nccl_headers"] = nccl_version_string(NCCL_VERSION_CODE);
    j["device"] = "cuda:" + std::to_string(device_);
    if (cc_major_ >= 0) j["compute_capability"] = std::to_string(cc_major_) + "." + std::to_string(cc_minor_);
    else j["compute_capability"] = nullptr;
    j["initialized"] = comm_ != nullptr;
    j["failed"] = failure_.is_ok() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(failure_.message);
    j["nccl_config"] = nlohmann::ordered_json::parse(config_json(effective_fields()));
    nlohmann::ordered_json prio;
    prio["class"] = hints_.priority == StreamPriority::kHigh ? "high" : "default";
    if (stream_) prio["value"] = stream_priority_;
    else prio["value"] = nullptr;
    // What CUDA reports for the stream itself, not what was asked for.
    int read_back = 0;
    if (stream_ && api_->stream_get_priority(stream_, &read_back) == cudaSuccess) prio["read_back"] = read_back;
    else prio["read_back"] = nullptr;
    j["stream_priority"] = prio;
    j["init_timeout_ms"] = init_.init_timeout.count();
    j["op_timeout_ms"] = op_timeout_.count();
    return j.dump();
  }

  const Hints& raw_hints() const { return raw_hints_; }
  const TranslatedHints& hints() const { return hints_; }
  void set_hints_locked(Hints raw, TranslatedHints t) {
    raw_hints_ = std::move(raw);
    hints_ = std::move(t);
  }
  void set_op_timeout_locked(milliseconds t) { op_timeout_ = t; }
  milliseconds op_timeout_locked() const { return op_timeout_; }
  bool abort_requested() const { return abort_requested_; }

 private:
  Status exchange_unique_id(ncclUniqueId* id) {
    try {
      if (init_.rank == 0) {
        if (ncclResult_t r = api_->get_unique_id(id); r != ncclSuccess) {
          return nccl_status(*api_, nullptr, r, "ncclGetUniqueId");
        }
        init_.store->set(kUniqueIdKey, std::string(id->internal, sizeof id->internal));
        return {};
      }
      const std::string bytes = init_.store->get(kUniqueIdKey, init_.init_timeout);
      if (bytes.size() != sizeof id->internal) {
        return {ErrorCode::kInternal, "store key '" + std::string(kUniqueIdKey) + "' holds " +
                                          std::to_string(bytes.size()) + " bytes, expected " +
                                          std::to_string(sizeof id->internal)};
      }
      std::memcpy(id->internal, bytes.data(), bytes.size());
      return {};
    } catch (const Error& e) {
      return {e.code(), "exchanging the NCCL unique id through store key '" +
                            std::string(kUniqueIdKey) + "' (rank 0 publishes it): " + e.what()};
    } catch (const std::exception& e) {
      return {ErrorCode::kInternal, "exchanging the NCCL unique id through store key '" +
                                        std::string(kUniqueIdKey) + "': " + e.what()};
    }
  }

  void fill_config(ncclConfig_t* config) {
    effective_ = effective_fields();
    apply_to_config(effective_, config);
  }

  // A non-blocking communicator answers ncclInProgress until the call took
  // effect; poll it (bounded) so that nothing after it runs too early.
  Status settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, std::string_view what) {
    auto sleep = std::chrono::microseconds(10);
    while (r == ncclInProgress) {
      if (abort_requested_) return {ErrorCode::kAborted, std::string(what) + ": comm aborted"};
      if (Clock::now() >= deadline) {
        return {ErrorCode::kTimeout, std::string(what) + " did not complete before the deadline"};
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
      ncclResult_t async = ncclSuccess;
      ncclResult_t q = api_->comm_get_async_error(comm, &async);
      r = q != ncclSuccess ? q : async;
    }
    if (r != ncclSuccess) return nccl_status(*api_, comm, r, what);
    return {};
  }

  Status call(ncclResult_t r, Clock::time_point deadline, std::string_view what) {
    return settle(comm_, r, deadline, what);
  }

  // Runs `body` inside ncclGroupStart/End; the group is always closed.
  template <class Body>
  Status grouped(Clock::time_point deadline, std::string_view what, Body body) {
    if (ncclResult_t r = api_->group_start(); r != ncclSuccess) {
      return nccl_status(*api_, comm_, r, "ncclGroupStart");
    }
    Status inner = body();
    Status end = call(api_->group_end(), deadline, what);
    return inner.is_ok() ? end : inner;
  }

  Status enqueue_locked(const OpDesc& op, Clock::time_point deadline);
  Status reduce_op(const OpDesc& op, Clock::time_point deadline,
                   const std::function<ncclResult_t(ncclDataType_t, ncclRedOp_t)>& run);

  std::shared_ptr<NcclApi> api_;
  BackendInit init_;
  Hints raw_hints_;
  TranslatedHints hints_;
  NcclConfigFields effective_;  // owns the strings the last ncclConfig_t pointed to
  milliseconds op_timeout_;
  int device_ = 0;
  int cc_major_ = -1;
  int cc_minor_ = -1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int stream_priority_ = 0;
  cudaEvent_t caller_ready_ = nullptr;
  void* scratch_ = nullptr;
  std::deque<std::shared_ptr<WorkState>> outstanding_;
  std::shared_ptr<EventPool> events_;
  Status failure_;
  std::atomic<bool> abort_requested_{false};
};

Status Core::reduce_op(const OpDesc& op, Clock::time_point deadline,
                       const std::function<ncclResult_t(ncclDataType_t, ncclRedOp_t)>& run) {
  ReductionPlan plan = plan_reduction(op.dtype, op.reduce.kind, cc_major_, cc_minor_);
  if (!plan.reason.empty()) return {ErrorCode::kUnsupported, plan.reason};
  const std::string what = "nccl " + std::string(plugin::op_name(op.type));
  if (!plan.premul_sum) return call(run(plan.dtype, plan.op), deadline, what);
  alignas(8) unsigned char scalar[8];
  encode_scalar(op.reduce.scalar, op.dtype, scalar);
  ncclRedOp_t premul;
  if (Status s = call(api_->red_op_create_pre_mul_sum(&premul, scalar, plan.dtype, comm_),
                      deadline, "ncclRedOpCreatePreMulSum");
      !s.is_ok()) {
    return s;
  }
  Status s = call(run(plan.dtype, premul), deadline, what);
  // The host-immediate scalar was consumed at enqueue, so the op can go now.
  if (Status d = call(api_->red_op_destroy(premul, comm_), deadline, "ncclRedOpDestroy");
      !d.is_ok() && s.is_ok()) {
    s = d;
  }
  return s;
}

// An op that NCCL runs with its one-rank scaling kernel on a one-rank comm.
bool one_rank_scaling(const OpDesc& op) {
  const bool reducing = op.type == OpType::kAllReduce || op.type == OpType::kReduce ||
                        op.type == OpType::kReduceScatter || op.type == OpType::kReduceScatterV;
  return reducing && (op.reduce.kind == ReduceKind::kAvg || op.reduce.kind == ReduceKind::kPremulSum);
}

Status Core::enqueue_locked(const OpDesc& op, Clock::time_point deadline) {
  const size_t elem = element_size(op.dtype);
  const ncclDataType_t cdt = copy_dtype(op.dtype);
  const int size = init_.size;
  const int rank = init_.rank;
  auto in_at = [&](size_t elements) {
    return static_cast<const char*>(op.input) + elements * elem;
  };
  auto out_at = [&](size_t elements) { return static_cast<char*>(op.output) + elements * elem; };
  const std::string what = "nccl " + std::string(plugin::op_name(op.type));
  cudaStream_t s = stream_;
  ncclComm_t c = comm_;

  if (size == 1 && one_rank_scaling(op)) {
    // NCCL 2.28.3 on one rank: avg and premul_sum (its one-rank scaling
    // kernel) leave every element past the last whole 512 KiB unwritten when
    // the buffer is larger than that (seen on an H100, every type). On one
    // rank these ops are elementwise: the tail goes in a call of its own.
    constexpr size_t kOneRankChunkBytes = size_t{512} << 10;
    const size_t count = op.type == OpType::kReduceScatterV ? op.counts[0] : op.count;
    const size_t bulk = count * elem / kOneRankChunkBytes * kOneRankChunkBytes / elem;
    if (bulk != 0 && bulk != count) {
      const char* in = static_cast<const char*>(op.input ? op.input : op.output);
      for (auto [from, n] : {std::pair{size_t{0}, bulk}, std::pair{bulk, count - bulk}}) {
        Status part = reduce_op(op, deadline, [&](ncclDataType_t dt, ncclRedOp_t rop) {
          return api_->all_reduce(in + from * elem, out_at(from), n, dt, rop, c, s);
        });
        if (!part.is_ok()) return part;
      }
      return {};
    }
  }

  switch (op.type) {
    case OpType::kAllReduce:
      return reduce_op(op, deadline, [&](ncclDataType_t dt, ncclRedOp_t rop) {
        return api_->all_reduce(op.input, op.output, op.count, dt, rop, c, s);
      });
    case OpType::kReduce:
      return reduce_op(op, deadline, [&](ncclDataType_t dt, ncclRedOp_t rop) {
        return api_->reduce(op.input, op.output, op.count, dt, rop, op.root, c, s);
      });
    case OpType::kReduceScatter:
      return reduce_op(op, deadline, [&](ncclDataType_t dt, ncclRedOp_t rop) {
        return api_->reduce_scatter(op.input, op.output, op.count, dt, rop, c, s);
      });
    case OpType::kReduceScatterV: {
      // One reduce per destination rank, fused in a group.
      ReductionPlan plan = plan_reduction(op.dtype, op.reduce.kind, cc_major_, cc_minor_);
      if (!plan.reason.empty()) return {ErrorCode::kUnsupported, plan.reason};
      if (plan.premul_sum) {
        return reduce_op(op, deadline, [&](ncclDataType_t dt, ncclRedOp_t rop) {
          ncclResult_t first = api_->group_start();
          size_t offset = 0;
          for (int r = 0; r < size && accepted(first); ++r) {
            first = api_->reduce(in_at(offset), op.output, op.counts[r], dt, rop, r, c, s);
            offset += op.counts[r];
          }
          ncclResult_t end = api_->group_end();
          return accepted(first) ? end : first;
        });
      }
      return grouped(deadline, what, [&]() -> Status {
        size_t offset = 0;
        for (int r = 0; r < size; ++r) {
          ncclResult_t res =
              api_->reduce(in_at(offset), op.output, op.counts[r], plan.dtype, plan.op, r, c, s);
          if (!accepted(res)) return nccl_status(*api_, c, res, "ncclReduce");
          offset += op.counts[r];
        }
        return {};
      });
    }
    case OpType::kBroadcast: {
      const void* in = op.input ? op.input : op.output;
      return call(api_->broadcast(in, op.output, op.count, cdt, op.root, c, s), deadline, what);
    }
    case OpType::kAllGather:
      return call(api_->all_gather(op.input, op.output, op.count, cdt, c, s), deadline, what);
    case OpType::kAllGatherList:
      // One broadcast per source rank straight into its output buffer: no
      // staging buffer, and NCCL fuses the group.
      return grouped(deadline, what, [&]() -> Status {
        for (int r = 0; r < size; ++r) {
          ncclResult_t res = api_->broadcast(op.input, op.output_list[r], op.count, cdt, r, c, s);
          if (!accepted(res)) return nccl_status(*api_, c, res, "ncclBroadcast");
        }
        return {};
      });
    case OpType::kAllGatherV:
      return grouped(deadline, what, [&]() -> Status {
        size_t offset = 0;
        for (int r = 0; r < size; ++r) {
          ncclResult_t res = api_->broadcast(op.input, out_at(offset), op.counts[r], cdt, r, c, s);
          if (!accepted(res)) return nccl_status(*api_, c, res, "ncclBroadcast");
          offset += op.counts[r];
        }
        return {};
      });
    case OpType::kAllToAll:
      if constexpr (kHasNativeAllToAllGatherScatter) {
        return call(api_->all_to_all(op.input, op.output, op.count, cdt, c, s), deadline, what);
      }
      return grouped(deadline, what, [&]() -> Status {
        for (int r = 0; r < size; ++r) {
          ncclResult_t a = api_->send(in_at(r * op.count), op.count, cdt, r, c, s);
          ncclResult_t b = api_->recv(out_at(r * op.count), op.count, cdt, r, c, s);
          if (!accepted(a) || !accepted(b)) {
            return nccl_status(*api_, c, accepted(a) ? b : a, "ncclSend/ncclRecv");
          }
        }
        return {};
      });
    case OpType::kAllToAllV:
      return grouped(deadline, what, [&]() -> Status {
        size_t send_off = 0, recv_off = 0;
        for (int r = 0; r < size; ++r) {
          if (op.counts[r] > 0) {
            ncclResult_t a = api_->send(in_at(send_off), op.counts[r], cdt, r, c, s);
            if (!accepted(a)) return nccl_status(*api_, c, a, "ncclSend");
          }
          if (op.output_counts[r] > 0) {
            ncclResult_t b = api_->recv(out_at(recv_off), op.output_counts[r], cdt, r, c, s);
            if (!accepted(b)) return nccl_status(*api_, c, b, "ncclRecv");
          }
          send_off += op.counts[r];
          recv_off += op.output_counts[r];
        }
        return {};
      });
    case OpType::kGather:
      if constexpr (kHasNativeAllToAllGatherScatter) {
        return call(api_->gather(op.input, op.output, op.count, cdt, op.root, c, s), deadline,
                    what);
      }
      return grouped(deadline, what, [&]() -> Status {
        if (rank == op.root) {
          for (int r = 0; r < size; ++r) {
            if (r == rank) continue;
            ncclResult_t b = api_->recv(out_at(r * op.count), op.count, cdt, r, c, s);
            if (!accepted(b)) return nccl_status(*api_, c, b, "ncclRecv");
          }
          // The root's own slice: a self send/recv pair keeps it on the stream.
          if (!op.in_place) {
            ncclResult_t a = api_->send(op.input, op.count, cdt, rank, c, s);
            ncclResult_t b = api_->recv(out_at(rank * op.count), op.count, cdt, rank, c, s);
            if (!accepted(a) || !accepted(b)) {
              return nccl_status(*api_, c, accepted(a) ? b : a, "ncclSend/ncclRecv");
            }
          }
          return {};
        }
        ncclResult_t a = api_->send(op.input, op.count, cdt, op.root, c, s);
        return accepted(a) ? Status() : nccl_status(*api_, c, a, "ncclSend");
      });
    case OpType::kScatter:
      if constexpr (kHasNativeAllToAllGatherScatter) {
        return call(api_->scatter(op.input, op.output, op.count, cdt, op.root, c, s), deadline,
                    what);
      }
      return grouped(deadline, what, [&]() -> Status {
        if (rank == op.root) {
          for (int r = 0; r < size; ++r) {
            if (r == rank && op.in_place) continue;
            ncclResult_t a = api_->send(in_at(r * op.count), op.count, cdt, r, c, s);
            if (!accepted(a)) return nccl_status(*api_, c, a, "ncclSend");
          }
          if (op.in_place) return {};
        }
        ncclResult_t b = api_->recv(op.output, op.count, cdt, op.root, c, s);
        return accepted(b) ? Status() : nccl_status(*api_, c, b, "ncclRecv");
      });
    case OpType::kBarrier:
      return call(api_->all_reduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, s), deadline,
                  what);
    case OpType::kSend:
      return call(api_->send(op.input, op.count, cdt, op.peer, c, s), deadline, what);
    case OpType::kRecv:
      return call(api_->recv(op.output, op.count, cdt, op.peer, c, s), deadline, what);
    case OpType::kBatchP2P:
      return grouped(deadline, what, [&]() -> Status {
        for (const P2POp& p : op.p2p) {
          const ncclDataType_t dt = copy_dtype(p.buffer.dtype);
          ncclResult_t r = p.kind == P2POp::Kind::kSend
                               ? api_->send(p.buffer.data, p.buffer.count, dt, p.peer, c, s)
                               : api_->recv(p.buffer.data, p.buffer.count, dt, p.peer, c, s);
          if (!accepted(r)) return nccl_status(*api_, c, r, "ncclSend/ncclRecv");
        }
        return {};
      });
  }
  return {ErrorCode::kUnsupported, "nccl: unknown op type"};
}

class NcclWork final : public plugin::Work {
 public:
  NcclWork(std::shared_ptr<Core> core, std::shared_ptr<WorkState> state, cudaStream_t caller)
      : core_(std::move(core)), state_(std::move(state)), caller_(caller) {}

  bool is_completed() override {
    std::lock_guard lock(core_->mu);
    return core_->check_work_locked(*state_, Clock::now());
  }

  Status wait(WaitMode mode) override {
    if (mode == WaitMode::kStream) {
      std::lock_guard lock(core_->mu);
      if (state_->done) return state_->status;
      if (cudaError_t e = core_->api().stream_wait_event(caller_, state_->end); e != cudaSuccess) {
        return cuda_status(core_->api(), e, "cudaStreamWaitEvent on the caller's stream");
      }
      return {};
    }
    // Poll with a short back-off: a condition variable would need a host
    // callback on the stream, which cannot be cancelled when NCCL hangs.
    auto sleep = std::chrono::microseconds(0);
    for (;;) {
      {
        std::lock_guard lock(core_->mu);
        if (core_->check_work_locked(*state_, Clock::now())) return state_->status;
      }
      if (sleep.count() == 0) std::this_thread::yield();
      else std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep + std::chrono::microseconds(20), std::chrono::microseconds(500));
    }
  }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<WorkState> state_;
  cudaStream_t caller_;
};

class NcclBackend final : public plugin::Backend {
 public:
  NcclBackend(std::shared_ptr<Core> core, NcclBackendOptions options)
      : core_(std::move(core)), options_(options) {
    watchdog_ = std::thread([this] { watchdog_loop(); });
  }

  ~NcclBackend() override {
    stop_watchdog();
    std::lock_guard lock(core_->mu);
    if (!finalized_) {
      core_->poll_locked(Clock::now());  // ops that did finish keep their success
      if (core_->has_outstanding_locked()) {
        core_->fail_locked({ErrorCode::kAborted, "the comm was destroyed with ops in flight"},
                           nullptr);
      }
      // Not finalized: abort rather than destroy, so that exit never waits on
      // a peer. Nothing can report a failure from a destructor; log it.
      if (Status s = core_->release_locked(/*graceful=*/false); !s.is_ok()) core_->log(3, s.message);
    }
  }

  Status init() override {
    std::lock_guard lock(core_->mu);
    return core_->init_locked();
  }

  Status submit(const OpDesc& op, std::unique_ptr<plugin::Work>* work) override {
    if (op.hints && !op.hints->empty()) {
      return {ErrorCode::kInvalidArgument,
              "nccl hint " + op.hints->begin()->first + "=" + op.hints->begin()->second +
                  ": NCCL hints configure the communicator (ncclConfig_t) and cannot be set "
                  "per op"};
    }
    if (op.device.type != DeviceType::kCuda) {
      return {ErrorCode::kInvalidArgument,
              std::string(plugin::op_name(op.type)) +
                  ": the nccl backend moves CUDA buffers only; give CPU buffers to a CPU backend "
                  "(e.g. backend \"cpu:gloo,cuda:nccl\")"};
    }
    if (op.device.index >= 0 && op.device.index != core_->device()) {
      return {ErrorCode::kInvalidArgument,
              std::string(plugin::op_name(op.type)) + ": buffer on cuda:" +
                  std::to_string(op.device.index) + " but this comm's NCCL communicator is bound "
                  "to cuda:" + std::to_string(core_->device())};
    }
    std::lock_guard lock(core_->mu);
    if (!core_->initialized_locked() && core_->failure_locked().is_ok()) {
      if (Status s = core_->init_locked(); !s.is_ok()) return s;  // lazy binding
    }
    std::shared_ptr<WorkState> state;
    if (Status s = core_->submit_locked(op, &state); !s.is_ok()) return s;
    auto caller = static_cast<cudaStream_t>(op.stream);
    if (op.async) {
      *work = std::make_unique<NcclWork>(core_, std::move(state), caller);
      return {};
    }
    // Synchronous on CUDA means stream-ordered: the caller's stream waits for
    // the op; the watchdog still enforces its timeout.
    if (cudaError_t e = core_->api().stream_wait_event(caller, state->end); e != cudaSuccess) {
      return cuda_status(core_->api(), e, "cudaStreamWaitEvent on the caller's stream");
    }
    return {};
  }

  Status split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) override {
    child->reset();
    const BackendInit& parent = core_->init();
    const bool member = !desc.ranks.empty();
    int color = NCCL_SPLIT_NOCOLOR;
    int key = 0;
    if (member) {
      color = *std::min_element(desc.ranks.begin(), desc.ranks.end());
      auto it = std::find(desc.ranks.begin(), desc.ranks.end(), parent.rank);
      if (it == desc.ranks.end()) {
        return {ErrorCode::kInvalidArgument,
                "split: rank " + std::to_string(parent.rank) +
                    " is not in the ranks it was given as a member of"};
      }
      key = static_cast<int>(it - desc.ranks.begin());
    }
    // The core already merges the parent's hints into desc.child.hints;
    // merging again is idempotent and keeps the parent's options reaching the
    // child even if a caller hands in only the call's hints.
    Hints merged;
    TranslatedHints translated;
    {
      std::lock_guard lock(core_->mu);
      merged = merge_split_hints(core_->raw_hints(), desc.child.hints);
    }
    if (Status s = translate_hints(merged, NCCL_VERSION_CODE, &translated); !s.is_ok()) return s;

    BackendInit child_init = desc.child;
    child_init.device = Device::cuda(core_->device());
    child_init.hints = merged;
    child_init.abort_process_on_error = parent.abort_process_on_error;
    if (!child_init.log) child_init.log = parent.log;
    if (child_init.init_timeout.count() <= 0) child_init.init_timeout = parent.init_timeout;
    if (child_init.op_timeout.count() <= 0) {
      std::lock_guard lock(core_->mu);
      child_init.op_timeout = core_->op_timeout_locked();
    }
    const milliseconds timeout = child_init.init_timeout;

    ncclComm_t child_comm = nullptr;
    {
      std::lock_guard lock(core_->mu);
      if (Status f = core_->failure_locked(); !f.is_ok()) {
        return {ErrorCode::kAborted, "split: the NCCL communicator failed earlier: " + f.message};
      }
      if (!core_->initialized_locked()) {
        return {ErrorCode::kInvalidArgument,
                "split needs the parent's NCCL communicator, which is created lazily and does "
                "not exist yet: create the parent comm with a device (e.g. device cuda:N, "
                "eager binding) before splitting it"};
      }
      if (Status s = core_->split_locked(color, key, translated.config, child_init.comm_name,
                                         timeout, &child_comm);
          !s.is_ok()) {
        return s;
      }
    }
    if (!member) return {};
    auto child_core = std::make_shared<Core>(core_->api_ptr(), child_init, merged, translated);
    auto backend = std::make_unique<NcclBackend>(child_core, options_);
    {
      std::lock_guard lock(child_core->mu);
      if (Status s = child_core->adopt_locked(child_comm); !s.is_ok()) return s;
    }
    *child = std::move(backend);
    return {};
  }

  Status set_hints(const Hints& hints) override {
    Hints merged;
    {
      std::lock_guard lock(core_->mu);
      merged = core_->raw_hints();
    }
    for (const auto& [k, v] : hints) {
      std::string key = k.starts_with("nccl.") ? k.substr(5) : k;
      merged.erase("nccl." + key);
      merged[key] = v;
    }
    TranslatedHints t;
    if (Status s = translate_hints(merged, NCCL_VERSION_CODE, &t); !s.is_ok()) return s;
    std::lock_guard lock(core_->mu);
    if (core_->initialized_locked() && !(t == core_->hints())) {
      std::string keys;
      for (const auto& [k, v] : hints) keys += (keys.empty() ? "" : ", ") + k + "=" + v;
      return {ErrorCode::kUnsupported,
              "nccl hints " + keys + ": ncclConfig_t and the stream priority are fixed when the "
              "NCCL communicator is created; split or recreate the comm with these hints"};
    }
    core_->set_hints_locked(std::move(merged), std::move(t));
    return {};
  }

  Status set_op_timeout(milliseconds timeout) override {
    std::lock_guard lock(core_->mu);
    core_->set_op_timeout_locked(timeout);
    return {};
  }

  void abort(const std::string& reason) override { core_->request_abort(reason); }

  Status finalize() override {
    // Outstanding ops first, each bounded by its own deadline.
    std::deque<std::shared_ptr<WorkState>> pending;
    {
      std::lock_guard lock(core_->mu);
      pending = core_->outstanding_copy_locked();
    }
    for (auto& w : pending) {
      NcclWork(core_, w, nullptr).wait(WaitMode::kBlocking);
    }
    stop_watchdog();
    std::lock_guard lock(core_->mu);
    finalized_ = true;
    return core_->release_locked(/*graceful=*/true);
  }

  std::string describe() const override {
    std::lock_guard lock(core_->mu);
    return core_->describe_locked();
  }

  bool supports_reduction(DataType dtype, ReduceKind kind) const override {
    return plan_reduction(dtype, kind, core_->cc_major(), core_->cc_minor()).reason.empty();
  }

 private:
  void watchdog_loop() {
    std::unique_lock lock(core_->mu);
    while (!stop_) {
      core_->watchdog_cv.wait_for(lock, options_.watchdog_interval);
      if (stop_) break;
      core_->poll_locked(Clock::now());
    }
  }

  void stop_watchdog() {
    {
      std::lock_guard lock(core_->mu);
      stop_ = true;
    }
    core_->watchdog_cv.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  std::shared_ptr<Core> core_;
  NcclBackendOptions options_;
  std::thread watchdog_;
  bool stop_ = false;  // guarded by core_->mu
  bool finalized_ = false;
};

}  // namespace

Status create_nccl_backend(std::shared_ptr<NcclApi> api, const BackendInit& init,
                           std::unique_ptr<plugin::Backend>* out, NcclBackendOptions options) {
  if (init.device.type != DeviceType::kCuda) {
    return {ErrorCode::kInvalidArgument,
            "the nccl backend serves cuda devices, not " +
                std::string(init.device.type == DeviceType::kCpu ? "cpu" : "this device type")};
  }
  if (init.size < 1 || init.rank < 0 || init.rank >= init.size) {
    return {ErrorCode::kInvalidArgument, "nccl backend: rank " + std::to_string(init.rank) +
                                             " outside a comm of size " + std::to_string(init.size)};
  }
  if (!init.store) {
    return {ErrorCode::kInvalidArgument, "nccl backend: no store to exchange the NCCL unique id"};
  }
  TranslatedHints t;
  if (Status s = translate_hints(init.hints, NCCL_VERSION_CODE, &t); !s.is_ok()) return s;
  auto core = std::make_shared<Core>(std::move(api), init, init.hints, std::move(t));
  *out = std::make_unique<NcclBackend>(std::move(core), options);
  return {};
}

Status explain_nccl_hints(const Hints& hints, std::string* json) {
  TranslatedHints t;
  if (Status s = translate_hints(hints, NCCL_VERSION_CODE, &t); !s.is_ok()) return s;
  *json = explain_json(t);
  return {};
}

}  // namespace comms::nccl
