// The implementation behind comms::Comm. Kept in a header so the dist layer
// and tests can reach the pieces they need; it is not part of the public API.
// Its definitions live in core/comm/, one file per job: backends.cc (device backends,
// creation, connecting), run.cc (ops and their failures), split.cc,
// control.cc (timeouts, hints, abort, finalize, offload, reload),
// describe.cc, names.cc, hint_routing.cc, work.cc, ops.cc and new_comm.cc.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comms/bootstrap.h"
#include "comms/comm.h"
#include "comms/plugin.h"
#include "comms/registration.h"
#include "comms/window.h"
#include "comm/plugin_call.h"
#include "bootstrap/init_progress.h"
#include "plugins/plugin_registry.h"
#include "trace/recorder.h"
#include "trace/service.h"
#include "comm/validate.h"

namespace comms {

namespace internal {

// What an outstanding async op needs to report its result with context.
class WorkState {
 public:
  // collective: Recorder::issued's number (0: a point-to-point op).
  WorkState(std::shared_ptr<Comm::Impl> comm, std::unique_ptr<plugin::Work> work,
            plugin::OpType type, uint64_t seq, uint64_t collective, DeviceType device_type)
      : comm_(std::move(comm)), work_(std::move(work)), type_(type), seq_(seq), collective_(collective),
        device_type_(device_type) {}
  // A window op's (window.cc): no collective number.
  WorkState(std::shared_ptr<Comm::Impl> comm, std::unique_ptr<plugin::Work> work,
            plugin::WindowOpType window_op, uint64_t seq, DeviceType device_type)
      : comm_(std::move(comm)), work_(std::move(work)), type_(plugin::OpType::kBarrier), seq_(seq),
        device_type_(device_type), window_op_(window_op) {}

  // Never waits for a wait() in progress on another thread.
  bool is_completed();
  // Waits and returns the error to throw, if any.
  std::optional<Error> wait(WaitMode mode);
  ErrorCode status();
  std::string error_message();

 private:
  bool plugin_says_completed();

  std::shared_ptr<Comm::Impl> comm_;
  std::unique_ptr<plugin::Work> work_;
  plugin::OpType type_;
  uint64_t seq_;
  uint64_t collective_ = 0;
  DeviceType device_type_;
  std::optional<plugin::WindowOpType> window_op_;
  std::mutex mu_;  // held through a wait
  std::optional<Error> error_;  // set once the op failed, before done_
  std::atomic<bool> done_{false};
};

// Whether an op error leaves the backend unusable.
inline bool is_fatal(ErrorCode code) {
  return code == ErrorCode::kTimeout || code == ErrorCode::kPeerFailure ||
         code == ErrorCode::kAborted || code == ErrorCode::kInternal || code == ErrorCode::kRevoked;
}

}  // namespace internal

class Comm::Impl : public std::enable_shared_from_this<Comm::Impl> {
 public:
  struct DeviceBackend {
    // Read on every op without a lock; changed under state_mu_.
    std::atomic<BackendState> state{BackendState::kAbsent};
    const internal::LoadedPlugin* plugin = nullptr;
    std::unique_ptr<plugin::Backend> backend;
    Hints hints;       // routed to this backend, prefix removed
    Device device;     // resolved
    int generation = 0;  // bumped by each reload; part of the store namespace
    bool offloaded_while_lazy = false;  // reload leaves it lazy again
    std::string failure;  // why it failed, for fail-fast messages
    // Device memory in use after the last offload released the backend
    // (measured between its finalize and its destruction); -1 if unknown.
    int64_t memory_after_offload = -1;
    // How the last offload went: "suspend" (Backend::suspend, ABI 2.6: the
    // backend is kept, offloaded, and resume()d by the reload, without a
    // rendezvous) or "destroy" (finalize, re-created by the reload); null
    // before any. `suspended`: the kept backend is suspended now.
    const char* offload_mode = nullptr;
    bool suspended = false;
    // How the backend was made when its comm grew (describe(); kept across
    // offload cycles, as the rest of describe()): "native" (Backend::grow or
    // the plugin's join_grown, ABI 2.7) or "recreate" (create()); null on
    // comms that did not grow.
    const char* grown = nullptr;
    // supports_reduction's answers for the backend of generation
    // `reductions_generation` (-1: none asked yet; a reload's new backend is
    // asked again): per ReduceKind, one bit per DataType. Relaxed atomics:
    // ops may come from different threads, one at a time (comm.h).
    std::atomic<int> reductions_generation{-1};
    std::array<std::atomic<uint16_t>, kNumReduceKinds> reductions_known{};
    std::array<std::atomic<uint16_t>, kNumReduceKinds> reductions_supported{};
  };

  // Everything needed to create a comm; also what a reload replays.
  // op_timeout and hints change at run time (set_timeout, set_hints): they
  // are written under config_mu_, and read from other threads through
  // op_timeout() and hints().
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
    bool elastic = false;  // watched for elastic recovery (elastic_watch.h)
    std::shared_ptr<Store> store;  // the job's root store
    std::string store_local_address;  // how this process reaches the store
    uint64_t epoch = 0;  // how many shrinks led to this comm (elastic recovery)
  };

  // Elastic recovery's per-comm state, used by the thread that issues ops.
  struct ElasticState {
    int round = 0;        // agreement round in progress (a failed shrink retries)
    uint64_t votes = 0;   // agree_all calls so far
    std::vector<int> lost;  // the last agreed failed set
    uint64_t admits = 0;  // admit calls so far
    // Join tickets of this comm's name already admitted or dropped (-1:
    // unknown, read from the store); a derived comm inherits it.
    int64_t tickets_handled = -1;
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

  // "comms[name rank r/s]", the start of every message about this comm.
  std::string prefix() const;
  // The name of the plugin serving `t` ("" if none), for messages.
  std::string plugin_name(DeviceType t) const;
  // An Error for `op` (new_comm, split, reload, ...): "<prefix> <what>".
  Error error(ErrorCode code, std::string_view what, std::string_view op) const;
  // Calls `function` of the plugin of backend `t` through call_plugin and
  // throws error() with "<action>: <reason>" when it fails.
  template <class F>
  void call_or_throw(DeviceType t, std::string_view function, std::string_view action, std::string_view op,
                     F&& f) const {
    const Status st = internal::call_plugin(plugin_name(t), function, std::forward<F>(f));
    if (!st.is_ok()) throw error(st.code, str::cat(action, ": ", st.message), op);
  }

  // The comm's three error builders. error() above: anything but an op.
  // op_error(): an op refused before it reached the backend, "<prefix>
  // <op> #<seq>: <code>: <message>" with comm, op, seq, rank and peer.
  // failed_op(): an op the backend failed: recorded, a collective's timeout
  // message names the ranks behind (trace::find_culprit, by `collective`,
  // Recorder::issued's number), and a fatal one fails the backend
  // (on_fatal); then op_error()'s text.
  Error op_error(plugin::OpType type, uint64_t seq, const Status& status) const;
  Error op_error(std::string_view op, uint64_t seq, const Status& status) const;
  Error failed_op(plugin::OpType type, uint64_t seq, uint64_t collective, Status status, DeviceType device_type);
  // The comm's flight recorder (never null).
  trace::Recorder& recorder() const { return *recorder_; }
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
  // Whether the backend for `type` is offloaded by suspend (kept) now.
  bool suspended(DeviceType type) const { return device_backend(type).suspended; }
  // Recreates the offloaded backend of `child` the way it was made: a split
  // of `parent`'s backend (collective over the parent). Non-members of the
  // child pass child == nullptr and only take part in the parent's split.
  static void reload_by_split(Impl* child, Impl& parent, DeviceType type,
                              const std::vector<int>& parent_ranks);
  std::string describe() const;
  // Device memory in use as the backend of `t` sees it; -1 if unknown.
  int64_t device_memory_used(DeviceType t) const;

  // The fields of config() that never change after creation; op_timeout
  // and hints only on the thread that issues ops.
  const Config& config() const { return config_; }
  // Safe from any thread.
  std::chrono::milliseconds op_timeout() const;
  Hints hints() const;
  BackendState state(DeviceType t) const;
  bool is_failed() const;

  // ---- registered buffers (registration.cc) ----
  bool can_register(DeviceType t) const;
  bool can_alloc(DeviceType t) const;  // the plugin has an allocator (alloc_backend_memory)
  std::shared_ptr<internal::Registration> register_buffer(BufferView buffer);
  // Deregisters unless the backend that registered it is gone.
  void deregister_buffer(internal::Registration& r);
  bool registration_live(const internal::Registration& r) const;
  const internal::LoadedPlugin& plugin_serving(DeviceType t, std::string_view op) const;
  // ---- end of registered buffers ----

  // ---- windows (window.cc) ----
  bool can_window(DeviceType t) const;
  // Collective: exchanges sizes through the store, then registers with the backend.
  std::shared_ptr<internal::WindowState> register_window(BufferView buffer);
  // Collective: flushes, waits for every rank, then deregisters (unless the
  // backend that registered it is gone).
  void deregister_window(internal::WindowState& w);
  bool window_live(const internal::WindowState& w) const;
  // The number the next op will get (for messages about refused ops).
  uint64_t next_seq() const { return seq_.load() + 1; }
  // Validates, numbers and runs one window op (put, signal, wait_signal, flush).
  Work run_window(internal::WindowState& w, plugin::WindowOpDesc d, BufferView src, const OpOptions& opts);
  // A window op the backend failed: a timeout of wait_signal leaves the
  // comm usable (nothing was consumed); other fatal codes fail the backend.
  Error failed_window_op(plugin::WindowOpType type, uint64_t seq, const Status& status, DeviceType t);
  // ---- end of windows ----

  // --- elastic recovery (elastic.cc, shrink.cc, elastic_watch.cc) ---------
  // Fails every pending and future op with kRevoked and aborts the backends;
  // local only (revoke() also tells the other ranks). Safe from any thread.
  void revoke_local(const std::string& reason);
  bool is_revoked() const { return revoked_.load(); }
  ElasticState& elastic() { return elastic_; }
  // A new comm of `members` (parent ranks, ascending) with this comm's
  // configuration, epoch `epoch`, its backends re-created (or natively
  // shrunk) under a fresh namespace ending in `ns_suffix`, named
  // "<base name>@e<epoch><name_suffix>". Collective over the members;
  // returns null on a non-member.
  std::shared_ptr<Comm> shrink_to(const std::vector<int>& members, uint64_t epoch, const std::string& ns_suffix,
                                  const std::string& name_suffix = "");
  // This comm's configuration as it is now (timeouts and hints set at run
  // time included) for a comm of `size` ranks derived from it: rank
  // `child_rank`, epoch `epoch`, namespace <this one><ns_suffix>, named
  // "<base name>@e<epoch><name_suffix>".
  Config derived_config(int size, int child_rank, uint64_t epoch, const std::string& ns_suffix,
                        const std::string& name_suffix) const;
  // A shrunk or grown comm of config `c`: its name registered (".2", ".3",
  // ... appended when this process has a live comm of that name), its
  // backends made by `build`; aborted and finalized if `build` throws.
  static std::shared_ptr<Impl> make_derived(Config c, int64_t tickets_handled, const std::function<void(Impl&)>& build);

  // --- elastic growth (grow.cc) --------------------------------------------
  // The device types of `spec` (bit 1 << DeviceType) whose backend this
  // participant could build natively in a grown comm: its plugin is of ABI
  // >= 2.7 and has join_grown, and on a member (`parent` given) the
  // parent's backend is live (not offloaded or failed).
  static uint32_t native_grow_types(const Impl* parent, const BackendSpec& spec);
  // Makes this grown comm's backends, collectively with every participant:
  // those of the `native` types by the parent's Backend::grow on a member,
  // by the plugin's join_grown on a newcomer (`parent` null), unless the
  // plugin declines everywhere; the others, and the declined, by create().
  // Then connects the bound one as create_backends() does.
  void grow_backends(Impl* parent, int members, uint32_t native);

 private:
  plugin::BackendInit init_for(DeviceType t) const;
  std::string store_prefix(DeviceType t) const;
  // Connects a lazy backend (collective); throws with op context on failure.
  void ensure_ready(DeviceBackend& db, DeviceType t, plugin::OpType type, uint64_t seq, uint64_t collective);
  // Which ranks came to, and how far they got in, connecting backend `t`.
  internal::InitProgress init_progress(DeviceType t) const;
  void flush_barrier(DeviceType t);
  // Steps of create_backends, grow_backends and split.
  void place_backend(DeviceType t, const Hints& routed);  // plugin, hints, device
  void create_backend(DeviceType t, const Hints& routed);
  void connect_bound_backend();
  void check_split_members(const std::vector<int>& members, const std::string& name, int* child_rank) const;
  BackendSpec split_spec(const SplitOptions& opts, const std::string& name) const;
  Config child_config(const std::vector<int>& members, int child_rank, const BackendSpec& spec,
                      const std::string& name, const SplitOptions& opts) const;
  // Splits each backend of `child.spec`; fills backends/plugins.
  void split_backends(const Config& child, const std::vector<int>& members, Impl* impl,
                      std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes>* backends,
                      std::array<const internal::LoadedPlugin*, kNumDeviceTypes>* plugins);
  trace::OpRecord op_record(const plugin::OpDesc& d, DeviceType t) const;
  // COMMS_DEBUG=detail: throws unless every rank called the same collective.
  void check_same_args(const trace::OpRecord& r, const internal::OpArgs& args, std::chrono::milliseconds timeout,
                       DeviceType t);
  plugin::OpDesc op_desc(const internal::OpArgs& args, const OpOptions& opts, const internal::Checked& c,
                         const DeviceBackend& s, uint64_t seq) const;
  // Which backend runs the op; throws when it cannot run ops.
  DeviceType op_device(const internal::OpArgs& args, const internal::Checked& c);
  // Why the options are refused: a collective given a tag, or a timeout
  // that is not positive (for op_error).
  [[gnu::cold]] Status bad_options(plugin::OpType type, const OpOptions& opts) const;
  // Why backend `t` cannot run ops: absent, offloaded, failed or revoked.
  [[gnu::cold]] Status unusable_backend(DeviceType t) const;
  // The backend's supports_reduction, asked once per dtype and kind.
  bool supports_reduction(DeviceBackend& s, DataType dtype, ReduceKind kind, plugin::OpType type) const;
  DeviceBackend& device_backend(DeviceType t) { return device_backends_[static_cast<size_t>(t)]; }
  const DeviceBackend& device_backend(DeviceType t) const { return device_backends_[static_cast<size_t>(t)]; }

  Config config_;
  std::array<DeviceBackend, kNumDeviceTypes> device_backends_;
  // Guards device backend state changes against abort()/describe() from other threads.
  mutable std::mutex state_mu_;
  // Guards config_.op_timeout and config_.hints (set_timeout, set_hints)
  // against readers on other threads (describe, accessors).
  mutable std::mutex config_mu_;
  std::atomic<uint64_t> seq_{0};
  bool finalized_ = false;
  std::shared_ptr<trace::Recorder> recorder_;
  const bool detail_checks_ = trace::detail_checks();  // COMMS_DEBUG=detail
  std::atomic<bool> revoked_{false};
  ElasticState elastic_;
  // Windows registered so far (collective, so equal on every rank): names
  // each window's store keys.
  uint64_t windows_made_ = 0;
  // Why a window op cannot run, or ok (window.cc).
  [[gnu::cold]] Status window_unusable(const internal::WindowState& w) const;
  // A step of shrink_to.
  bool shrink_natively(Impl& child, const std::vector<int>& members);
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

// "world@e2", "world@e1-without3" -> "world": every epoch's name derives
// from the first one, and newcomers join by it.
std::string base_comm_name(const std::string& name);

// Registers a live comm name; throws kInvalidArgument if it is taken.
void register_comm_name(const std::string& name);
void unregister_comm_name(const std::string& name);
// 0 for the first comm created with this namespace in this process, then 1, ...
int next_incarnation(const std::string& ns);

}  // namespace internal
}  // namespace comms
