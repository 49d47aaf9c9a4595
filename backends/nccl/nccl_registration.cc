// Registered buffers: ncclCommRegister handles kept per communicator, so
// that finalize (and so an offload) deregisters what the caller left behind
// before ncclCommFinalize, and memory from ncclMemAlloc.
#include "nccl_core.h"

namespace comms::nccl {

namespace {

constexpr int kRegisterVersion = NCCL_VERSION(2, 19, 0);

Status need_version(NcclApi& api, std::string_view what) {
  int version = 0;
  if (api.get_version(&version) != ncclSuccess) version = 0;
  if (version >= kRegisterVersion) return {};
  return {ErrorCode::kUnsupported, std::string(what) + " needs NCCL >= " +
                                       nccl_version_string(kRegisterVersion) + "; the loaded NCCL is " +
                                       nccl_version_string(version)};
}

}  // namespace

Status Core::register_locked(void* data, size_t bytes, void** handle) {
  *handle = nullptr;
  if (!failure_.is_ok()) {
    return {ErrorCode::kAborted, "register_buffer: the NCCL communicator failed earlier: " + failure_.message};
  }
  if (!comm_) {
    return {ErrorCode::kInvalidArgument,
            "register_buffer needs the NCCL communicator, which a lazy comm creates at its first "
            "op: run one op first, or create the comm with a device (eager binding)"};
  }
  if (Status s = need_version(*api_, "ncclCommRegister"); !s.is_ok()) return s;
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(*api_, e, "cudaSetDevice");
  if (ncclResult_t r = api_->comm_register(comm_, data, bytes, handle); r != ncclSuccess) {
    *handle = nullptr;
    return nccl_status(*api_, comm_, r, "ncclCommRegister");
  }
  registered_.insert(*handle);
  return {};
}

Status Core::deregister_locked(void* handle) {
  if (registered_.erase(handle) == 0) {
    return {ErrorCode::kInvalidArgument,
            "deregister_buffer: not a handle registered on this communicator (deregistered "
            "already, or released when the comm was finalized, offloaded or failed)"};
  }
  DeviceGuard guard(*api_, device_);
  if (ncclResult_t r = api_->comm_deregister(comm_, handle); r != ncclSuccess) {
    return nccl_status(*api_, comm_, r, "ncclCommDeregister");
  }
  return {};
}

void Core::deregister_all_locked(std::vector<std::string>* errors) {
  for (void* handle : registered_) {
    if (ncclResult_t r = api_->comm_deregister(comm_, handle); r != ncclSuccess) {
      errors->push_back(nccl_status(*api_, comm_, r, "ncclCommDeregister").message);
    }
  }
  registered_.clear();
}

Status nccl_mem_alloc(NcclApi& api, Device device, size_t bytes, void** ptr) {
  *ptr = nullptr;
  if (device.type != DeviceType::kCuda || device.index < 0) {
    return {ErrorCode::kInvalidArgument, "nccl mem_alloc: needs a cuda:N device"};
  }
  if (Status s = need_version(api, "ncclMemAlloc"); !s.is_ok()) return s;
  DeviceGuard guard(api, device.index);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(api, e, "cudaSetDevice");
  if (ncclResult_t r = api.nccl_alloc(ptr, bytes); r != ncclSuccess) {
    *ptr = nullptr;
    return nccl_status(api, nullptr, r, "ncclMemAlloc of " + std::to_string(bytes) + " bytes");
  }
  return {};
}

Status nccl_mem_free(NcclApi& api, Device device, void* ptr) {
  if (device.type != DeviceType::kCuda || device.index < 0) {
    return {ErrorCode::kInvalidArgument, "nccl mem_free: needs a cuda:N device"};
  }
  DeviceGuard guard(api, device.index);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(api, e, "cudaSetDevice");
  if (ncclResult_t r = api.nccl_free(ptr); r != ncclSuccess) return nccl_status(api, nullptr, r, "ncclMemFree");
  return {};
}

}  // namespace comms::nccl
