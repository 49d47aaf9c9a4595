// The raw-NCCL baseline of comms-bench (--raw-nccl, --overhead on --device
// cuda): the NCCL calls the nccl backend makes for an op, called straight on
// a communicator of its own, with none of libcomms or the plugin around them
// (no validation, no dispatch, no internal stream, no events, no Work). It is
// made with the ncclConfig_t the plugin makes for the same hints
// (translate_hints + plugin_config_fields + apply_to_config) and runs on the
// caller's stream, so the difference to the same op through comms is
// libcomms' and the plugin's overhead.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comms/options.h"
#include "comms/plugin.h"
#include "comms/store.h"
#include "nccl_api.h"

namespace comms::nccl {

class RawNccl {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    int device = 0;  // made current; the communicator lives there
    Hints hints;     // the comm's nccl hints as routed to the backend (no "nccl." prefix)
    std::string comm_name;  // commName unless a hint sets one, as the plugin does
    std::chrono::milliseconds init_timeout{0};
    std::chrono::milliseconds op_timeout{0};
  };

  // Exchanges the unique id through `store` (rank 0 publishes it under
  // "nccl/unique_id") and creates the communicator. Collective over the job.
  // Throws comms::Error naming what failed.
  RawNccl(std::shared_ptr<NcclApi> api, Store& store, Options options);
  // Aborts a communicator that finalize() did not release (never waits).
  ~RawNccl();
  RawNccl(const RawNccl&) = delete;
  RawNccl& operator=(const RawNccl&) = delete;

  // Why NCCL cannot run comms-bench's `type` on `dtype` with `kind` (kind
  // only matters for reducing ops); empty when it can. cc_major < 0: the
  // device is not known yet (fp8's sm_90 requirement is not checked).
  static std::string refusal(plugin::OpType type, DataType dtype, ReduceKind kind, int cc_major,
                             int cc_minor);
  // The NCCL call(s) that run `type`, e.g. "ncclAllReduce".
  static std::string call_name(plugin::OpType type);

  // Enqueues one op on `stream` and returns once NCCL took it (a
  // non-blocking communicator's ncclInProgress settled, by spinning: a raw
  // caller has nothing else to do). Counts as in plugin::OpDesc; broadcast
  // works in place on `input`, like Comm::broadcast; kSend sends `input` to
  // `peer` and receives `output` from it in one group (comms-bench's
  // send_recv); kBarrier is a one-element all-reduce, as the plugin's.
  // Throws comms::Error.
  void run(plugin::OpType type, const void* input, void* output, size_t count, DataType dtype,
           const ReduceOp& op, int root, int peer, cudaStream_t stream);

  // ncclCommFinalize (bounded by the op timeout) and ncclCommDestroy; frees
  // the barrier scratch. Throws comms::Error on any failure.
  void finalize();

  // The fields the communicator was created with (tests compare them with
  // the plugin's).
  const NcclConfigFields& config_fields() const { return fields_; }

 private:
  enum class Wait { kSpin, kSleep };
  void settle(ncclResult_t r, std::chrono::milliseconds timeout, Wait wait, const char* what);
  void reduce(const plugin::OpType type, const void* input, void* output, size_t count, DataType dtype,
              const ReduceOp& op, int root, cudaStream_t stream);
  [[noreturn]] void fail(ncclResult_t r, const char* what);

  std::shared_ptr<NcclApi> api_;
  Options options_;
  NcclConfigFields fields_;  // owns the strings the ncclConfig_t pointed to
  ncclComm_t comm_ = nullptr;
  int cc_major_ = -1, cc_minor_ = -1;
  void* scratch_ = nullptr;  // the barrier's float, allocated on first use
};

}  // namespace comms::nccl
