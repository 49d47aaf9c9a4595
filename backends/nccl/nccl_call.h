// Calling NCCL and CUDA from the backend: their return codes as Status, and
// the device the calls run on. Internal to the plugin.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "comms/error.h"
#include "nccl_api.h"

namespace comms::nccl {

using Clock = std::chrono::steady_clock;

std::string ms_text(std::chrono::milliseconds ms);

// A non-blocking communicator may answer ncclInProgress where a blocking one
// answers ncclSuccess: inside a group (ncclGroupEnd settles the group), and
// from abort/destroy (which release it in the background).
inline bool accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// "<what> failed: <NCCL's text> (<last error>)", coded peer_failure for a
// remote error, invalid_argument for misuse, timeout for ncclTimeout (NCCL
// >= 2.30), internal otherwise.
Status nccl_status(NcclApi& api, ncclComm_t comm, ncclResult_t r, std::string_view what);
Status cuda_status(NcclApi& api, cudaError_t e, std::string_view what);

// Makes `device` current for a scope and restores the caller's device, so
// that calling into the backend never changes the caller's CUDA context.
class DeviceGuard {
 public:
  DeviceGuard(NcclApi& api, int device) : api_(api) {
    if (api_.get_device(&previous_) != cudaSuccess) previous_ = -1;
    changed_ = previous_ != device;
    if (changed_) status_ = api_.set_device(device);
  }
  // Restores only a device it changed: a cudaSetDevice per op otherwise.
  ~DeviceGuard() {
    if (changed_ && previous_ >= 0 && status_ == cudaSuccess) api_.set_device(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  NcclApi& api_;
  int previous_ = -1;
  bool changed_ = false;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace comms::nccl
