#include "nccl_call.h"

namespace comms::nccl {

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

Status nccl_status(NcclApi& api, ncclComm_t comm, ncclResult_t r, std::string_view what) {
  ErrorCode code = ErrorCode::kInternal;
  if (r == ncclRemoteError) code = ErrorCode::kPeerFailure;
  else if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = ErrorCode::kInvalidArgument;
  // 8 is ncclTimeout only from NCCL 2.30 (before, ncclNumResults, never an
  // answer): what the loaded library means by it decides, not the header.
  else if (static_cast<int>(r) == kNcclTimeoutResult && api.loaded_version() >= kTimeoutResultVersion) {
    code = ErrorCode::kTimeout;
  }
  std::string msg = std::string(what) + " failed: " + api.error_string(r);
  if (const char* last = api.last_error(comm); last && *last) msg += " (" + std::string(last) + ")";
  return {code, std::move(msg)};
}

Status cuda_status(NcclApi& api, cudaError_t e, std::string_view what) {
  return {ErrorCode::kInternal, std::string(what) + " failed: " + api.cuda_error_string(e)};
}

}  // namespace comms::nccl
