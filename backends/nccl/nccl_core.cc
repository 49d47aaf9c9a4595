// Core's construction and state: logging, settling non-blocking NCCL calls,
// describe() and device memory.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "nccl_core.h"

namespace comms::nccl {

Core::Core(std::shared_ptr<NcclApi> api, plugin::BackendInit init, Hints raw_hints,
           TranslatedHints hints)
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

void Core::log(int level, const std::string& msg) const {
  const std::string text = "comms nccl [" + init_.comm_name + " rank " +
                           std::to_string(init_.rank) + "]: " + msg;
  if (init_.log) init_.log(level, text.c_str());
  else if (level >= 2) std::fprintf(stderr, "%s\n", text.c_str());
}

Status Core::settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline,
                    std::string_view what, bool stop_on_revoke) {
  auto sleep = std::chrono::microseconds(10);
  while (r == ncclInProgress) {
    if (abort_requested_) return {ErrorCode::kAborted, std::string(what) + ": comm aborted"};
    if (stop_on_revoke && revoke_requested_) return {ErrorCode::kRevoked, std::string(what) + ": comm revoked"};
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

Status Core::settle_child(Status s, ncclComm_t child, Clock::time_point deadline, std::chrono::milliseconds timeout,
                          const std::string& call, const std::string& every_rank_must, bool stop_on_revoke) {
  if (s.is_ok() && child) s = settle(child, ncclInProgress, deadline, call + " (the new communicator)", stop_on_revoke);
  if (s.is_ok()) return s;
  if (child) api_->comm_abort(child);
  if (s.code == ErrorCode::kTimeout && Clock::now() >= deadline) {
    s.message = call + " did not finish within " + ms_text(timeout) + "; " + every_rank_must;
  }
  return s;
}

std::string Core::describe_locked() const {
  nlohmann::ordered_json j;
  j["backend"] = "nccl";
  // The library loaded at run time, which may differ from the headers built against.
  int runtime_version = 0;
  j["nccl_version"] = api_->get_version(&runtime_version) == ncclSuccess
                          ? nccl_version_string(runtime_version)
                          : "unknown";
  j["nccl_headers"] = nccl_version_string(NCCL_VERSION_CODE);
  j["device"] = "cuda:" + std::to_string(device_);
  if (cc_major_ >= 0) j["compute_capability"] = std::to_string(cc_major_) + "." + std::to_string(cc_minor_);
  else j["compute_capability"] = nullptr;
  j["initialized"] = comm_ != nullptr;
  j["failed"] = failure_.is_ok() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(failure_.message);
  j["created_by"] = comm_ ? nlohmann::ordered_json(created_by_) : nlohmann::ordered_json(nullptr);
  j["revoked"] = revoked_;
  j["native_shrink"] = api_->has_shrink();
  j["native_revoke"] = api_->has_revoke();
  j["native_grow"] = api_->has_grow();
  // all_to_all, gather and scatter: ncclAlltoAll/ncclGather/ncclScatter, or
  // grouped send/recv on an NCCL without them.
  j["native_all_to_all_gather_scatter"] = api_->has_native_collectives();
  j["windows"] = api_->has_one_sided();
  j["windows_registered"] = windows_.size();
  // Offload by suspend: whether the loaded NCCL can (else libcomms destroys
  // and re-creates), whether the communicator is suspended now, and
  // ncclCommMemStats around the last suspend and resume.
  nlohmann::ordered_json suspend;
  suspend["available"] = api_->has_suspend();
  suspend["suspended"] = suspended_;
  suspend["suspends"] = suspends_;
  suspend["resumes"] = resumes_;
  auto stats = [](const std::string& text) {
    return text.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json::parse(text);
  };
  suspend["mem_stats_before_suspend"] = stats(mem_before_suspend_);
  suspend["mem_stats_after_suspend"] = stats(mem_after_suspend_);
  suspend["mem_stats_after_resume"] = stats(mem_after_resume_);
  j["suspend"] = suspend;
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
  // Ops the watchdog tracks; ops captured into CUDA graphs are never among them.
  j["ops_in_flight"] = outstanding_.size();
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
}

int64_t Core::device_memory_used() const {
  // cudaMemGetInfo answers for the current device: bind the comm's for the
  // call (the caller's is restored). Needs no communicator, so it also
  // measures a comm that was never bound or was already released.
  DeviceGuard guard(*api_, device_);
  if (guard.status() != cudaSuccess) return -1;
  size_t free_bytes = 0, total_bytes = 0;
  if (api_->mem_get_info(&free_bytes, &total_bytes) != cudaSuccess) return -1;
  if (free_bytes > total_bytes) return -1;
  return static_cast<int64_t>(total_bytes - free_bytes);
}

}  // namespace comms::nccl
