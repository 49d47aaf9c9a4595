// Windows (plugin ABI 2.6) on NCCL >= 2.29: ncclCommWindowRegister with
// NCCL_WIN_COLL_SYMMETRIC, and the one-sided ncclPutSignal, ncclSignal and
// ncclWaitSignal, each found by dlsym in the loaded NCCL
// (NcclApi::has_one_sided). NCCL 2.30 takes signal index 0, context 0 and
// flags 0 only, so every signal of a peer lands in one counter, which is
// what WindowOpType::kWaitSignal counts.
#include <algorithm>
#include <climits>
#include <string>

#include "nccl_core.h"

namespace comms::nccl {

using plugin::WindowOpDesc;
using plugin::WindowOpType;

namespace {

Status no_windows(NcclApi& api) {
  return {ErrorCode::kUnsupported, "nccl: windows need NCCL >= " + nccl_version_string(kOneSidedVersion) +
                                       " (ncclPutSignal, ncclSignal, ncclWaitSignal); the loaded NCCL is " +
                                       nccl_version_string(api.loaded_version())};
}

}  // namespace

Status Core::register_window_locked(void* data, size_t bytes, void** window) {
  *window = nullptr;
  if (!api_->has_one_sided()) return no_windows(*api_);
  if (!failure_.is_ok()) return failed_earlier("register_window");
  if (!comm_) {
    return {ErrorCode::kInvalidArgument,
            "register_window needs the NCCL communicator, which a lazy comm creates at its first op: run one "
            "op first, or create the comm with a device (eager binding)"};
  }
  if (suspended_) return {ErrorCode::kInvalidArgument, "register_window: the comm is offloaded; reload it first"};
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(*api_, e, "cudaSetDevice");
  ncclWindow_t win = nullptr;
  // Collective: every rank registers; bounded like an op.
  ncclResult_t r = api_->window_register(comm_, data, bytes, &win, NCCL_WIN_COLL_SYMMETRIC);
  if (Status s = settle(comm_, r, Clock::now() + op_timeout_, "ncclCommWindowRegister"); !s.is_ok()) {
    if (s.code == ErrorCode::kTimeout || s.code == ErrorCode::kPeerFailure) fail_locked(s, nullptr);
    return s;
  }
  windows_.push_back(win);
  *window = win;
  return {};
}

Status Core::deregister_window_locked(void* window) {
  auto win = static_cast<ncclWindow_t>(window);
  if (std::erase(windows_, win) == 0) {
    return {ErrorCode::kInvalidArgument,
            "deregister_window: not a window registered on this communicator (deregistered already, or "
            "released when the comm was finalized, offloaded or failed)"};
  }
  DeviceGuard guard(*api_, device_);
  ncclResult_t r = api_->window_deregister(comm_, win);
  return settle(comm_, r, Clock::now() + op_timeout_, "ncclCommWindowDeregister");
}

void Core::release_windows_locked(std::vector<std::string>* errors) {
  for (ncclWindow_t win : windows_) {
    ncclResult_t r = api_->window_deregister(comm_, win);
    if (Status s = settle(comm_, r, Clock::now() + op_timeout_, "ncclCommWindowDeregister"); !s.is_ok()) {
      errors->push_back(s.message);
    }
  }
  windows_.clear();
}

Status Core::submit_window_locked(const WindowOpDesc& op, std::shared_ptr<WorkState>* out_work) {
  if (!api_->has_one_sided()) return no_windows(*api_);
  const char* name = plugin::window_op_name(op.type).data();  // a literal: null-terminated, static
  if (!failure_.is_ok()) return failed_earlier(name);  // its windows went with the communicator
  auto win = static_cast<ncclWindow_t>(op.window);
  if (op.type != WindowOpType::kSignal && op.type != WindowOpType::kWaitSignal &&
      std::find(windows_.begin(), windows_.end(), win) == windows_.end()) {
    return {ErrorCode::kInvalidArgument, std::string(name) +
                                             ": not a window registered on this communicator"};
  }
  std::vector<WaitSignalDesc> waits;
  switch (op.type) {
    case WindowOpType::kPut:
      // NCCL has no put without a signal: ncclPutSignal always counts one at
      // the peer (index 0, the only one), which would break the peer's count.
      if (!op.signal) {
        return {ErrorCode::kUnsupported,
                "nccl put: NCCL " + nccl_version_string(api_->loaded_version()) +
                    " has only ncclPutSignal, which always signals the peer; put with signal=true"};
      }
      break;
    case WindowOpType::kWaitSignal:
      for (size_t r = 0; r < op.signal_counts.size(); ++r) {
        if (op.signal_counts[r] == 0) continue;
        if (op.signal_counts[r] > static_cast<uint64_t>(INT_MAX)) {
          return {ErrorCode::kInvalidArgument, "nccl wait_signal: " + std::to_string(op.signal_counts[r]) +
                                                   " signals from rank " + std::to_string(r) +
                                                   " exceed NCCL's count (int)"};
        }
        waits.push_back({static_cast<int>(op.signal_counts[r]), static_cast<int>(r), 0, 0});
      }
      break;
    case WindowOpType::kSignal:
      break;
    case WindowOpType::kFlush:
      // A put completes on its stream once its source may be reused; NCCL
      // has no call that waits for remote visibility (a peer knows data
      // landed from the put's signal, in ncclWaitSignal).
      return {ErrorCode::kUnsupported,
              "nccl flush: NCCL " + nccl_version_string(api_->loaded_version()) +
                  " has no remote completion of puts; the peer's wait_signal on the put's signal orders it"};
  }
  if (suspended_) return {ErrorCode::kInvalidArgument, std::string(name) + ": the comm is offloaded"};
  return run_eager_locked(
      op.seq, plugin::OpType::kSend, name, op.timeout, op.stream,
      [&](Clock::time_point deadline) -> Status {
        switch (op.type) {
          case WindowOpType::kPut:
            return settle(comm_,
                          api_->put_signal(op.input, op.bytes, ncclUint8, op.peer, win, op.offset, 0, 0, 0, comm_,
                                           stream_),
                          deadline, "ncclPutSignal");
          case WindowOpType::kSignal:
            return settle(comm_, api_->signal(op.peer, 0, 0, 0, comm_, stream_), deadline, "ncclSignal");
          case WindowOpType::kWaitSignal:
            // Nothing to wait for is still an op, ordered on the stream.
            if (waits.empty()) return Status();
            return settle(comm_,
                          api_->wait_signal(static_cast<int>(waits.size()), waits.data(), comm_, stream_),
                          deadline, "ncclWaitSignal");
          case WindowOpType::kFlush:
            break;
        }
        return Status();
      },
      out_work);
}

}  // namespace comms::nccl
