// Options of a communicator and of a single operation.
#pragma once

#include "comms/export.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace comms {

class Store;

// Backend hints: "key" -> "value". A key may carry its backend's prefix
// ("nccl.min_ctas", "gloo.interface"); an unprefixed key goes to the one
// backend of the comm that knows it. Unknown keys are errors unless
// COMMS_HINTS_STRICT=0, which makes them warnings.
using Hints = std::map<std::string, std::string, std::less<>>;

// Parses "k=v,k=v" (whitespace around items ignored). Throws
// comms::Error(kInvalidArgument) on an item without '=' and on a key given
// twice. (A key given both bare and prefixed, "max_ctas" and
// "nccl.max_ctas", is an error when the comm routes its hints.)
COMMS_API Hints parse_hints(const std::string& text);
COMMS_API std::string format_hints(const Hints& hints);

struct CommOptions {
  // Unset timeouts come from COMMS_INIT_TIMEOUT / COMMS_OP_TIMEOUT, else from
  // the defaults (5 min for init, 10 min for ops). An explicit value always
  // wins over the environment.
  std::optional<std::chrono::milliseconds> init_timeout;
  std::optional<std::chrono::milliseconds> op_timeout;
  Hints hints;
  // The store to rendezvous through. Unset: COMMS_STORE, else
  // MASTER_ADDR/MASTER_PORT, else (world size 1) an in-process store.
  std::shared_ptr<Store> store;
  // Unset: from the bootstrap variables (COMMS_RANK, RANK, OMPI_*, PMI_*, SLURM_*).
  std::optional<int> rank;
  std::optional<int> world_size;
  // Off: errors are delivered to callers. On: the process logs and aborts on
  // the first failed op, as some schedulers prefer.
  bool abort_process_on_error = false;
  // Elastic recovery (comms/elastic.h) needs every rank of the comm watched:
  // a store heartbeat and a look for revocations about every 100 ms, from
  // creation on. Only elastic comms pay for that. Unset: COMMS_ELASTIC
  // (commsrun --keep-going sets it), else off. Children made by split or
  // shrink inherit it.
  std::optional<bool> elastic;
};

enum class WaitMode : uint8_t {
  kStream,    // CUDA: the caller's stream waits for the op; CPU: blocks
  kBlocking,  // the calling thread blocks until the op finished
};

struct OpOptions {
  // Run asynchronously: the call returns at once and Work::wait() delivers the
  // result. Synchronous calls throw directly.
  bool async = false;
  // Overrides the comm's op timeout for this op.
  std::optional<std::chrono::milliseconds> timeout;
  // Per-op backend hints, routed and checked like the comm's hints (each
  // backend's keys: comms-info). The Gloo backend takes none and refuses any
  // (kInvalidArgument); a plugin may accept some.
  Hints hints;
  // The caller's cudaStream_t for CUDA buffers; null is the default stream.
  void* stream = nullptr;
  // Tag matching send and recv (and batch_p2p); a collective given a
  // nonzero tag throws kInvalidArgument.
  uint32_t tag = 0;
};

}  // namespace comms
