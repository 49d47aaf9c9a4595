// Ops issued on a stream that is capturing a CUDA graph. Their NCCL calls go
// straight onto that stream, so into the graph: no event on the caller's
// stream (querying one recorded in a capture invalidates it), no end event,
// no entry in the watchdog's queue and no host wait. Each launch of the
// graph runs them; the README says which timeouts hold for a replay.
#include "nccl_core.h"

namespace comms::nccl {

using plugin::OpDesc;

Status capture_state(NcclApi& api, cudaStream_t stream, bool* capturing) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = api.stream_capture_info(stream, &status, nullptr);
  if (e == cudaErrorStreamCaptureImplicit) {
    return {ErrorCode::kInvalidArgument,
            "the op's stream is the legacy default stream while another stream captures a "
            "CUDA graph; pass the capturing stream (OpOptions::stream)"};
  }
  if (e != cudaSuccess) return cuda_status(api, e, "cudaStreamGetCaptureInfo on the op's stream");
  if (status == cudaStreamCaptureStatusInvalidated) {
    return {ErrorCode::kInvalidArgument,
            "the op's stream is capturing a CUDA graph whose capture an earlier error "
            "invalidated; end that capture (cudaStreamEndCapture) and capture again"};
  }
  *capturing = status == cudaStreamCaptureStatusActive;
  return {};
}

Status Core::submit_captured_locked(const OpDesc& op, cudaStream_t stream) {
  const std::string what = std::string(plugin::op_name(op.type)) + " inside CUDA graph capture";
  if (!failure_.is_ok()) return failed_earlier(what);
  if (abort_requested_) return {ErrorCode::kAborted, what + ": the comm was aborted"};
  if (!comm_) {
    // Connecting exchanges the unique id through the store and allocates
    // device memory: neither can be recorded into a graph.
    return {ErrorCode::kInvalidArgument,
            what + ": the NCCL communicator does not exist yet (the comm binds lazily, at its "
                   "first op) and cannot be created during capture; run one op on the comm "
                   "before capturing, or create the comm with a device (eager binding)"};
  }
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(*api_, e, "cudaSetDevice");
  // The deadline bounds only NCCL's enqueue (ncclInProgress settling), a
  // host-side step of capture; the graph's launches are not timed here.
  const auto timeout = op.timeout.count() > 0 ? op.timeout : op_timeout_;
  if (Status s = enqueue_locked(op, Clock::now() + timeout, stream); !s.is_ok()) {
    if (s.code == ErrorCode::kTimeout || s.code == ErrorCode::kPeerFailure) fail_locked(s, nullptr);
    return s;
  }
  return {};
}

bool CapturedWork::is_completed() { return true; }

Status CapturedWork::wait(WaitMode mode) {
  if (mode == WaitMode::kStream) return {};  // it is on the caller's stream already
  return {ErrorCode::kInvalidArgument,
          std::string(plugin::op_name(type_)) +
              " was captured into a CUDA graph: it runs when the graph is launched, so there "
              "is nothing to wait for now; synchronize the stream the graph is launched on"};
}

}  // namespace comms::nccl
