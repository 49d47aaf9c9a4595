// The communicator: one group of ranks, with one backend per device type.
//
// Threading: ops on one comm must be issued from one thread at a time, and
// they run in issue order. Different comms progress concurrently. abort(),
// describe(), is_failed() and the accessors may be called from any thread.
#pragma once

#include "comms/export.h"

#include <chrono>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comms/backend_spec.h"
#include "comms/error.h"
#include "comms/options.h"
#include "comms/types.h"
#include "comms/work.h"

namespace comms {

class Store;
namespace internal {
struct CommAccess;  // the library's own way to the implementation
}

struct SplitOptions {
  // Unset: inherited from the parent.
  std::optional<std::chrono::milliseconds> init_timeout;
  std::optional<std::chrono::milliseconds> op_timeout;
  // Merged over the parent's hints; the call's value wins per key.
  Hints hints;
  // "" splits every backend of the parent. Otherwise a device-qualified subset
  // of the parent's map, e.g. "cpu:gloo" out of "cpu:gloo,cuda:nccl".
  std::string backend;
  std::optional<bool> abort_process_on_error;
};

// The state of a comm's backend for one device type.
enum class BackendState : uint8_t {
  kAbsent,     // no backend for this device type
  kLazy,       // configured, connects on first use
  kReady,
  kOffloaded,  // released by offload_backend(); reload_backend() restores it
  kFailed,     // an op failed or abort() was called; every op fails fast
};
COMMS_API std::string_view to_string(BackendState s);

class COMMS_API Comm {
 public:
  class COMMS_LOCAL Impl;
  explicit Comm(std::shared_ptr<Impl> impl);
  ~Comm();  // finalizes if needed; never throws (failures are logged)
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const std::string& name() const;
  int rank() const;
  int size() const;
  // This process's place among the ranks of its host (from the bootstrap).
  int local_rank() const;
  int local_size() const;
  // The job's root store the comm rendezvoused through; tools may derive
  // their own prefixed stores from it (make_prefix_store).
  std::shared_ptr<Store> store() const;
  const BackendSpec& backends() const;
  std::string backend_string() const { return backends().to_string(); }
  // The device bound at creation, if any.
  std::optional<Device> device() const;
  std::chrono::milliseconds init_timeout() const;
  std::chrono::milliseconds op_timeout() const;
  Hints hints() const;
  bool abort_process_on_error() const;
  // Whether the comm is watched for elastic recovery (CommOptions::elastic).
  bool elastic() const;
  BackendState backend_state(DeviceType t) const;
  bool is_failed() const;

  // --- collectives -------------------------------------------------------
  Work all_reduce(BufferView buffer, ReduceOp op, const OpOptions& opts = {});
  Work all_reduce(BufferView input, BufferView output, ReduceOp op, const OpOptions& opts = {});
  // The result lands in `output` on the root; `output` is unused elsewhere.
  Work reduce(BufferView buffer, int root, ReduceOp op, const OpOptions& opts = {});
  Work reduce(BufferView input, BufferView output, int root, ReduceOp op,
              const OpOptions& opts = {});
  Work broadcast(BufferView buffer, int root, const OpOptions& opts = {});
  // output holds size() * input.count elements, rank r's at r * input.count.
  // In place when input is that slice of output.
  Work all_gather(BufferView input, BufferView output, const OpOptions& opts = {});
  Work all_gather(BufferView input, std::span<const BufferView> outputs,
                  const OpOptions& opts = {});
  // counts[r] elements come from rank r; input.count must be counts[rank()].
  Work all_gather_v(BufferView input, BufferView output, std::span<const size_t> counts,
                    const OpOptions& opts = {});
  // input holds size() * output.count elements. In place when output is the
  // slice rank() * output.count of input.
  Work reduce_scatter(BufferView input, BufferView output, ReduceOp op,
                      const OpOptions& opts = {});
  // Rank r receives counts[r] elements; input holds sum(counts).
  Work reduce_scatter_v(BufferView input, BufferView output, std::span<const size_t> counts,
                        ReduceOp op, const OpOptions& opts = {});
  // input and output hold size() equal blocks; block r goes to rank r.
  Work all_to_all(BufferView input, BufferView output, const OpOptions& opts = {});
  // input_counts[r] elements go to rank r, output_counts[r] come from rank r;
  // blocks are contiguous in rank order.
  Work all_to_all_v(BufferView input, std::span<const size_t> input_counts, BufferView output,
                    std::span<const size_t> output_counts, const OpOptions& opts = {});
  // output (root only) holds size() * input.count elements.
  Work gather(BufferView input, BufferView output, int root, const OpOptions& opts = {});
  // input (root only) holds size() * output.count elements.
  Work scatter(BufferView input, BufferView output, int root, const OpOptions& opts = {});
  // Runs on the bound device's backend, else on the cpu backend.
  Work barrier(const OpOptions& opts = {});

  // --- point to point ----------------------------------------------------
  Work send(BufferView buffer, int peer, const OpOptions& opts = {});
  Work recv(BufferView buffer, int peer, const OpOptions& opts = {});
  // Issues every send and receive together; all buffers on one device type.
  Work batch_p2p(std::span<const P2POp> ops, const OpOptions& opts = {});

  // --- groups ------------------------------------------------------------
  // Collective over this comm. Members pass the parent ranks of their group,
  // in child-rank order; non-members pass an empty list and get null.
  std::shared_ptr<Comm> split(std::span<const int> ranks, const std::string& name,
                              const SplitOptions& opts = {});
  // split({0, 1}, "pair"); split({}, "pair") on non-members.
  std::shared_ptr<Comm> split(std::initializer_list<int> ranks, const std::string& name,
                              const SplitOptions& opts = {}) {
    return split(std::span<const int>(ranks.begin(), ranks.size()), name, opts);
  }
  // Every rank passes the same disjoint rank lists; each gets the group it is
  // in, or null.
  std::shared_ptr<Comm> split_group(std::span<const std::vector<int>> groups,
                                    const std::string& name, const SplitOptions& opts = {});
  // split_group({{0, 1}, {2, 3}}, "pairs").
  std::shared_ptr<Comm> split_group(std::initializer_list<std::vector<int>> groups,
                                    const std::string& name, const SplitOptions& opts = {}) {
    return split_group(std::span<const std::vector<int>>(groups.begin(), groups.size()), name, opts);
  }

  // --- run-time configuration ---------------------------------------------
  void set_timeout(std::chrono::milliseconds op_timeout);
  // Validated like creation hints; merged into the comm's hints.
  void set_hints(const Hints& hints);

  // --- lifecycle -----------------------------------------------------------
  // Fails every in-flight and future op with kAborted and wakes blocked
  // threads. Safe from any thread.
  void abort(const std::string& reason = "abort() called");
  // Waits for outstanding ops, then releases every backend. Throws the first
  // failure to release after attempting all. Idempotent.
  void finalize();
  // Releases the backend of one device type (its connections, memory and
  // threads); the comm stays valid and ops on that device fail with a message
  // saying it is offloaded. Returns false if it was not ready (no double work).
  bool offload_backend(DeviceType type);
  // Recreates an offloaded backend with the same configuration. Collective.
  // Returns false if it was not offloaded.
  bool reload_backend(DeviceType type);

  // The effective configuration as pretty-printed JSON: name, ranks,
  // timeouts, hints, and each backend's own description.
  std::string describe() const;

 private:
  friend struct internal::CommAccess;
  std::shared_ptr<Impl> impl_;
};

// Creates a communicator. `backend` follows BackendSpec; "" uses
// COMMS_BACKEND, else the default map. With a device the comm binds eagerly:
// that device's backend connects inside new_comm and a one-element barrier
// proves the connection before it returns. Without, backends connect on first
// use (which is then collective). `name` must be unique among live comms of
// this process; it keys the rendezvous namespace.
COMMS_API std::shared_ptr<Comm> new_comm(const std::string& backend, std::optional<Device> device,
                               const std::string& name, const CommOptions& options = {});

// The names of this process's comms that are not finalized yet, sorted: what a
// leak check counts (a comm dropped without finalize stays here until its last
// reference goes).
COMMS_API std::vector<std::string> live_comm_names();

}  // namespace comms
