// The implementation behind comms::Comm. Kept in a header so the dist layer
// and tests can reach the pieces they need; it is not part of the public API.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comms/bootstrap.h"
#include "comms/comm.h"
#include "comms/plugin.h"
#include "init_progress.h"
#include "plugin_registry.h"
#include "validate.h"

namespace comms {

namespace detail {

// What an outstanding async op needs to report its result with context.
class WorkState {
 public:
  WorkState(std::shared_ptr<Comm::Impl> comm, std::unique_ptr<plugin::Work> work,
            plugin::OpType type, uint64_t seq, DeviceType device_type)
      : comm_(std::move(comm)), work_(std::move(work)), type_(type), seq_(seq),
        device_type_(device_type) {}

  bool is_completed();
  // Waits and returns the error to throw, if any.
  std::optional<Error> wait(WaitMode mode);
  ErrorCode status();
  std::string error_message();

 private:
  std::shared_ptr<Comm::Impl> comm_;
  std::unique_ptr<plugin::Work> work_;
  plugin::OpType type_;
  uint64_t seq_;
  DeviceType device_type_;
  std::mutex mu_;
  std::optional<Error> error_;  // set once the op failed
  bool done_ = false;
};

}  // namespace detail

class Comm::Impl : public std::enable_shared_from_this<Comm::Impl> {
 public:
  struct Slot {
    // Read on every op without a lock; changed under state_mu_.
    std::atomic<BackendState> state{BackendState::kAbsent};
    const internal::LoadedPlugin* plugin = nullptr;
    std::unique_ptr<plugin::Backend> backend;
    Hints hints;       // routed to this backend, prefix removed
    Device device;     // resolved
    int generation = 0;  // bumped by each reload; part of the store namespace
    bool offloaded_while_lazy = false;  // reload leaves it lazy again
    std::string failure;  // why it failed, for fail-fast messages
  };

  // Everything needed to create a comm; also what a reload replays.
  struct Config {
    std::string name;
    std::string rendezvous_ns;  // unique per comm incarnation
    int rank = 0;
    int size = 1;
    int local_rank = 0;
    int local_size = 1;
    BackendSpec spec;
    std::optional<Device> bound_device;
    std::chrono::milliseconds init_timeout{0};
    std::chrono::milliseconds op_timeout{0};
    Hints hints;  // as given (validated)
    bool abort_process_on_error = false;
    std::shared_ptr<Store> store;  // the job's root store
    std::string store_local_address;  // how this process reaches the store
  };

  explicit Impl(Config config);
  ~Impl();

  // Creates one backend per device type (no connections), and connects the
  // bound one eagerly with a flush barrier.
  void create_backends();
  // A child from split: its backends come from the parent's split.
  void adopt_backends(std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes> backends,
                      const std::array<const internal::LoadedPlugin*, kNumDeviceTypes>& plugins);

  Work run(const internal::OpArgs& args, const OpOptions& opts);

  [[noreturn]] void fail_op(plugin::OpType type, uint64_t seq, const Status& status,
                            DeviceType device_type);
  Error make_error(plugin::OpType type, uint64_t seq, const Status& status) const;
  // Marks the backend failed after a fatal op error; honours
  // abort_process_on_error.
  void on_fatal(DeviceType device_type, const Error& error);

  std::shared_ptr<Comm> split(std::span<const int> ranks, const std::string& name,
                              const SplitOptions& opts);
  void set_timeout(std::chrono::milliseconds t);
  void set_hints(const Hints& hints);
  void abort(const std::string& reason);
  void finalize();
  bool offload(DeviceType type);
  bool reload(DeviceType type);
  // Recreates the offloaded backend of `child` the way it was made: a split
  // of `parent`'s backend (collective over the parent). Non-members of the
  // child pass child == nullptr and only take part in the parent's split.
  static void reload_by_split(Impl* child, Impl& parent, DeviceType type,
                              const std::vector<int>& parent_ranks);
  std::string describe() const;
  // Device memory in use as the backend of `t` sees it; -1 if unknown.
  int64_t device_memory_used(DeviceType t) const;

  const Config& config() const { return config_; }
  BackendState state(DeviceType t) const;
  bool is_failed() const;

 private:
  plugin::BackendInit init_for(DeviceType t) const;
  std::string store_prefix(DeviceType t) const;
  // Connects a lazy backend (collective); throws with op context on failure.
  void ensure_ready(Slot& slot, DeviceType t, plugin::OpType type, uint64_t seq);
  // Which ranks came to, and how far they got in, connecting backend `t`.
  internal::InitProgress init_progress(DeviceType t) const;
  void flush_barrier(DeviceType t);
  Slot& slot(DeviceType t) { return slots_[static_cast<size_t>(t)]; }
  const Slot& slot(DeviceType t) const { return slots_[static_cast<size_t>(t)]; }

  Config config_;
  std::array<Slot, kNumDeviceTypes> slots_;
  // Guards slot state changes against abort()/describe() from other threads.
  mutable std::mutex state_mu_;
  std::atomic<uint64_t> seq_{0};
  bool finalized_ = false;
};

namespace internal {

// The library's way from a Comm to its implementation (Comm has no public
// accessor, so user code cannot reach it).
struct CommAccess {
  static Comm::Impl& impl(const Comm& comm) { return *comm.impl_; }
};

// Routes user hints to backends: "gloo.x" to gloo, an unprefixed key to the
// one backend of the spec that knows it. Throws kInvalidArgument for an
// unknown key (a warning under COMMS_HINTS_STRICT=0), an ambiguous key, a
// prefix naming a backend the comm does not have, and one setting given
// twice ("max_ctas" and "nccl.max_ctas").
std::array<Hints, kNumDeviceTypes> route_hints(const Hints& hints, const BackendSpec& spec,
                                               std::string_view comm_name);

// Registers a live comm name; throws kInvalidArgument if it is taken.
void register_comm_name(const std::string& name);
void unregister_comm_name(const std::string& name);
// 0 for the first comm created with this namespace in this process, then 1, ...
int next_incarnation(const std::string& ns);

}  // namespace internal
}  // namespace comms
