// The plugin::Backend over a Core: checks what the core cannot know about
// (per-op hints, buffer devices), binds lazily, and builds split children.
// The communicator's life is in Core (nccl_core.h).
#include "nccl_backend.h"

#include <algorithm>
#include <cstring>

#include "nccl_core.h"
#include "nccl_work.h"

namespace comms::nccl {

using plugin::BackendInit;
using plugin::OpDesc;
using std::chrono::milliseconds;

namespace {

class NcclBackend final : public plugin::Backend {
 public:
  NcclBackend(std::shared_ptr<Core> core, NcclBackendOptions options)
      : core_(std::move(core)), options_(options), watchdog_(core_, options.watchdog_interval) {}

  ~NcclBackend() override {
    watchdog_.stop();
    std::lock_guard lock(core_->mu);
    // Not finalized: abort rather than destroy, so that exit never waits on
    // a peer.
    if (!finalized_) core_->destroy_locked();
  }

  // A lazy comm connects in its first submit instead, where the op's stream
  // is known: an op inside CUDA graph capture must be refused before the
  // unique id is exchanged (a failed init is sticky).
  Status init() override {
    if (!core_->init().eager) return {};
    std::lock_guard lock(core_->mu);
    return core_->init_locked();
  }

  Status submit(const OpDesc& op, std::unique_ptr<plugin::Work>* work) override;
  Status split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) override;
  Status set_hints(const Hints& hints) override;

  Status set_op_timeout(milliseconds timeout) override {
    std::lock_guard lock(core_->mu);
    core_->set_op_timeout_locked(timeout);
    return {};
  }

  void abort(const std::string& reason) override { core_->request_abort(reason); }
  void revoke(const std::string& reason) override { core_->request_revoke(reason); }
  Status shrink(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) override;
  Status grow(const plugin::GrowDesc& desc, std::unique_ptr<plugin::Backend>* child) override;

  Status finalize() override {
    wait_outstanding();
    watchdog_.stop();
    std::lock_guard lock(core_->mu);
    finalized_ = true;
    return core_->release_locked(/*graceful=*/true);
  }

  std::string describe() const override {
    std::lock_guard lock(core_->mu);
    return core_->describe_locked();
  }

  bool supports_reduction(DataType dtype, ReduceKind kind) const override {
    return plan_reduction(dtype, kind, core_->cc_major(), core_->cc_minor()).reason.empty();
  }

  int64_t device_memory_used() const override { return core_->device_memory_used(); }

  Status register_buffer(void* data, size_t bytes, void** handle) override {
    std::lock_guard lock(core_->mu);
    return core_->register_locked(data, bytes, handle);
  }
  Status deregister_buffer(void* handle) override {
    std::lock_guard lock(core_->mu);
    return core_->deregister_locked(handle);
  }

  Status suspend() override {
    wait_outstanding();
    std::lock_guard lock(core_->mu);
    return core_->suspend_locked();
  }
  Status resume() override {
    std::lock_guard lock(core_->mu);
    return core_->resume_locked();
  }

  Status register_window(void* data, size_t bytes, void** window) override {
    std::lock_guard lock(core_->mu);
    return core_->register_window_locked(data, bytes, window);
  }
  Status deregister_window(void* window) override {
    std::lock_guard lock(core_->mu);
    return core_->deregister_window_locked(window);
  }
  Status submit_window(const plugin::WindowOpDesc& op, std::unique_ptr<plugin::Work>* work) override;

 private:
  // Outstanding ops, each bounded by its own deadline.
  void wait_outstanding() {
    std::deque<std::shared_ptr<WorkState>> pending;
    {
      std::lock_guard lock(core_->mu);
      pending = core_->outstanding_copy_locked();
    }
    for (auto& w : pending) {
      NcclWork(core_, w, nullptr).wait(WaitMode::kBlocking);
    }
  }

  std::shared_ptr<Core> core_;
  NcclBackendOptions options_;
  Watchdog watchdog_;
  bool finalized_ = false;
};

// The child's init and hints for a split or shrink: the parent's hints under
// the call's, the parent's device, logging and timeouts where unset.
Status child_setup(Core& core, const plugin::BackendInit& given, BackendInit* child_init, Hints* merged,
                   TranslatedHints* translated) {
  const BackendInit& parent = core.init();
  {
    std::lock_guard lock(core.mu);
    *merged = merge_split_hints(core.raw_hints(), given.hints);
  }
  if (Status s = translate_hints(*merged, core.api().loaded_version(), translated); !s.is_ok()) return s;
  *child_init = given;
  child_init->device = Device::cuda(core.device());
  child_init->hints = *merged;
  child_init->abort_process_on_error = parent.abort_process_on_error;
  if (!child_init->log) child_init->log = parent.log;
  if (child_init->init_timeout.count() <= 0) child_init->init_timeout = parent.init_timeout;
  if (child_init->op_timeout.count() <= 0) {
    std::lock_guard lock(core.mu);
    child_init->op_timeout = core.op_timeout_locked();
  }
  return {};
}

// Native (ncclCommShrink, ncclCommGrow) or not must be the same on every
// participant, and one whose communicator was aborted (say, an op timed out
// before the revoke came) or whose NCCL lacks the call cannot take part:
// each votes through the child's store under "nccl/<job>/native/", and any
// "no" makes every participant return kUnsupported, so that libcomms
// re-creates the comm (a new unique id among all of them) everywhere.
Status vote_native(Store& store, const std::string& job, const char* call, int child_rank, int child_size, bool mine,
                   milliseconds timeout, bool* all) {
  const std::string dir = "nccl/" + job + "/native/";
  const std::string what = job + ": agreeing on " + call + " through the store: ";
  try {
    store.set(dir + std::to_string(child_rank), mine ? "1" : "0");
    *all = mine;
    for (int r = 0; r < child_size; ++r) {
      if (store.get(dir + std::to_string(r), timeout) != "1") *all = false;
    }
    return {};
  } catch (const Error& e) {
    return {e.code(), what + e.what()};
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, what + e.what()};
  }
}

// The id of a native grow: the member of rank 0 takes it from its
// communicator and publishes it here; the newcomers read it.
constexpr const char* kGrowIdKey = "nccl/grow/unique_id";

Status NcclBackend::submit(const OpDesc& op, std::unique_ptr<plugin::Work>* work) {
  if (op.hints && !op.hints->empty()) {
    return {ErrorCode::kInvalidArgument,
            "nccl hint " + op.hints->begin()->first + "=" + op.hints->begin()->second +
                ": NCCL hints configure the communicator (ncclConfig_t) and cannot be set "
                "per op"};
  }
  if (op.device.type != DeviceType::kCuda) {
    return {ErrorCode::kInvalidArgument,
            std::string(plugin::op_name(op.type)) +
                ": the nccl backend moves CUDA buffers only; give CPU buffers to a CPU backend "
                "(e.g. backend \"cpu:gloo,cuda:nccl\")"};
  }
  if (op.device.index >= 0 && op.device.index != core_->device()) {
    return {ErrorCode::kInvalidArgument,
            std::string(plugin::op_name(op.type)) + ": buffer on cuda:" +
                std::to_string(op.device.index) + " but this comm's NCCL communicator is bound "
                "to cuda:" + std::to_string(core_->device())};
  }
  auto caller = static_cast<cudaStream_t>(op.stream);
  bool capturing = false;
  if (Status s = capture_state(core_->api(), caller, &capturing); !s.is_ok()) return s;
  std::lock_guard lock(core_->mu);
  if (capturing) {
    if (Status s = core_->submit_captured_locked(op, caller); !s.is_ok()) return s;
    if (op.async) *work = std::make_unique<CapturedWork>(op.type);
    return {};
  }
  if (!core_->initialized_locked() && core_->failure_locked().is_ok()) {
    if (Status s = core_->init_locked(); !s.is_ok()) return s;  // lazy binding
  }
  std::shared_ptr<WorkState> state;
  if (Status s = core_->submit_locked(op, &state); !s.is_ok()) return s;
  if (op.async) {
    *work = std::make_unique<NcclWork>(core_, std::move(state), caller);
    return {};
  }
  // Synchronous on CUDA means stream-ordered: the caller's stream waits for
  // the op; the watchdog still enforces its timeout.
  if (cudaError_t e = core_->api().stream_wait_event(caller, state->end); e != cudaSuccess) {
    return cuda_status(core_->api(), e, "cudaStreamWaitEvent on the caller's stream");
  }
  return {};
}

Status NcclBackend::submit_window(const plugin::WindowOpDesc& op, std::unique_ptr<plugin::Work>* work) {
  auto caller = static_cast<cudaStream_t>(op.stream);
  bool capturing = false;
  if (Status s = capture_state(core_->api(), caller, &capturing); !s.is_ok()) return s;
  // NCCL 2.29's one-sided ops cannot be captured; eager ones record events,
  // which a capture must not see.
  if (capturing) {
    return {ErrorCode::kUnsupported, "nccl window ops cannot run inside CUDA graph capture"};
  }
  std::lock_guard lock(core_->mu);
  std::shared_ptr<WorkState> state;
  if (Status s = core_->submit_window_locked(op, &state); !s.is_ok()) return s;
  if (op.async) {
    *work = std::make_unique<NcclWork>(core_, std::move(state), caller);
    return {};
  }
  // As submit(): synchronous on CUDA means ordered on the caller's stream.
  if (cudaError_t e = core_->api().stream_wait_event(caller, state->end); e != cudaSuccess) {
    return cuda_status(core_->api(), e, "cudaStreamWaitEvent on the caller's stream");
  }
  return {};
}

Status NcclBackend::split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) {
  child->reset();
  const BackendInit& parent = core_->init();
  const bool member = !desc.ranks.empty();
  int color = NCCL_SPLIT_NOCOLOR;
  int key = 0;
  if (member) {
    color = *std::min_element(desc.ranks.begin(), desc.ranks.end());
    auto it = std::find(desc.ranks.begin(), desc.ranks.end(), parent.rank);
    if (it == desc.ranks.end()) {
      return {ErrorCode::kInvalidArgument,
              "split: rank " + std::to_string(parent.rank) +
                  " is not in the ranks it was given as a member of"};
    }
    key = static_cast<int>(it - desc.ranks.begin());
  }
  // The core already merges the parent's hints into desc.child.hints;
  // merging again is idempotent and keeps the parent's options reaching the
  // child even if a caller hands in only the call's hints.
  BackendInit child_init;
  Hints merged;
  TranslatedHints translated;
  if (Status s = child_setup(*core_, desc.child, &child_init, &merged, &translated); !s.is_ok()) return s;
  const milliseconds timeout = child_init.init_timeout;

  ncclComm_t child_comm = nullptr;
  bool parent_lazy = false;
  {
    std::lock_guard lock(core_->mu);
    if (Status f = core_->failure_locked(); !f.is_ok()) {
      return {ErrorCode::kAborted, "split: the NCCL communicator failed earlier: " + f.message};
    }
    parent_lazy = !core_->initialized_locked();
  }
  if (parent_lazy) {
    // A lazy parent has no communicator to split (no CUDA op has run): the
    // child makes its own among its members (ncclCommInitRank under its own
    // store prefix, on its first op or now if it is bound), as a comm
    // created for those ranks would. Non-members have nothing to do.
    if (!member) return {};
    auto lazy_child = std::make_unique<NcclBackend>(
        std::make_shared<Core>(core_->api_ptr(), child_init, merged, translated), options_);
    if (Status s = lazy_child->init(); !s.is_ok()) return s;
    *child = std::move(lazy_child);
    return {};
  }
  {
    std::lock_guard lock(core_->mu);
    if (Status s = core_->split_locked(color, key, translated.config, child_init.comm_name,
                                       timeout, &child_comm);
        !s.is_ok()) {
      return s;
    }
  }
  if (!member) return {};
  auto child_core = std::make_shared<Core>(core_->api_ptr(), child_init, merged, translated);
  auto backend = std::make_unique<NcclBackend>(child_core, options_);
  {
    std::lock_guard lock(child_core->mu);
    child_core->set_created_by_locked("ncclCommSplit");
    if (Status s = child_core->adopt_locked(child_comm); !s.is_ok()) return s;
  }
  *child = std::move(backend);
  return {};
}

Status NcclBackend::shrink(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) {
  child->reset();
  const BackendInit& parent = core_->init();
  auto it = std::find(desc.ranks.begin(), desc.ranks.end(), parent.rank);
  if (it == desc.ranks.end() || !desc.child.store) {
    return {ErrorCode::kInvalidArgument, "shrink: rank " + std::to_string(parent.rank) +
                                             " is not among the survivors it was given, or no store"};
  }
  const int child_rank = static_cast<int>(it - desc.ranks.begin());
  std::vector<int> exclude;
  for (int r = 0; r < parent.size; ++r) {
    if (std::find(desc.ranks.begin(), desc.ranks.end(), r) == desc.ranks.end()) exclude.push_back(r);
  }
  BackendInit child_init;
  Hints merged;
  TranslatedHints translated;
  if (Status s = child_setup(*core_, desc.child, &child_init, &merged, &translated); !s.is_ok()) return s;
  bool mine = false;
  {
    std::lock_guard lock(core_->mu);
    mine = core_->can_shrink_locked();
  }
  bool all = false;
  if (Status s = vote_native(*desc.child.store, "shrink", "ncclCommShrink", child_rank,
                             static_cast<int>(desc.ranks.size()), mine, child_init.init_timeout, &all);
      !s.is_ok()) {
    return s;
  }
  if (!all) {
    return {ErrorCode::kUnsupported,
            mine ? "a survivor cannot use ncclCommShrink: the comm is re-created"
                 : "ncclCommShrink is not available (NCCL < 2.27, or the communicator was aborted): the comm is "
                   "re-created"};
  }
  ncclComm_t child_comm = nullptr;
  int flags = 0;
  {
    std::lock_guard lock(core_->mu);
    if (Status s = core_->shrink_locked(exclude, translated.config, child_init.comm_name, child_init.init_timeout,
                                        &child_comm, &flags);
        !s.is_ok()) {
      return s;
    }
  }
  core_->log(1, "ncclCommShrink excluding " + std::to_string(exclude.size()) + " rank(s), flags " +
                    std::to_string(flags) + ": rank " + std::to_string(child_rank) + " of " +
                    std::to_string(desc.ranks.size()));
  auto child_core = std::make_shared<Core>(core_->api_ptr(), child_init, merged, translated);
  auto backend = std::make_unique<NcclBackend>(child_core, options_);
  {
    std::lock_guard lock(child_core->mu);
    child_core->set_created_by_locked("ncclCommShrink");
    if (Status s = child_core->adopt_locked(child_comm); !s.is_ok()) return s;
  }
  *child = std::move(backend);
  return {};
}

Status NcclBackend::grow(const plugin::GrowDesc& desc, std::unique_ptr<plugin::Backend>* child) {
  child->reset();
  const BackendInit& parent = core_->init();
  if (!desc.child.store || desc.members != parent.size || desc.child.rank != parent.rank ||
      desc.child.size <= desc.members) {
    return {ErrorCode::kInvalidArgument,
            "grow: rank " + std::to_string(parent.rank) + " of " + std::to_string(parent.size) +
                " cannot be rank " + std::to_string(desc.child.rank) + " of a comm grown from " +
                std::to_string(desc.members) + " to " + std::to_string(desc.child.size) + " ranks, or no store"};
  }
  BackendInit child_init;
  Hints merged;
  TranslatedHints translated;
  // A participant that cannot go on still votes (no), so that the others
  // do not wait for its vote.
  const Status setup = child_setup(*core_, desc.child, &child_init, &merged, &translated);
  bool mine = false;
  if (setup.is_ok()) {
    wait_outstanding();  // NCCL grows only a parent with no op outstanding
    std::lock_guard lock(core_->mu);
    mine = core_->can_grow_locked();
  }
  bool all = false;
  if (Status s = vote_native(*desc.child.store, "grow", "ncclCommGrow", desc.child.rank, desc.child.size, mine,
                             setup.is_ok() ? child_init.init_timeout : desc.child.init_timeout, &all);
      !s.is_ok()) {
    return s;
  }
  if (!setup.is_ok()) return setup;
  if (!all) {
    return {ErrorCode::kUnsupported,
            mine ? "a participant cannot use ncclCommGrow: the comm is re-created"
                 : "ncclCommGrow is not available (NCCL < 2.29, or the communicator is not up and healthy): the "
                   "comm is re-created"};
  }
  // Only after the vote: an id taken and never used would refuse the next.
  ncclUniqueId id;
  const bool takes_id = parent.rank == 0;
  if (takes_id) {
    std::lock_guard lock(core_->mu);
    if (Status s = core_->grow_unique_id_locked(&id); !s.is_ok()) return s;
    try {
      desc.child.store->set(kGrowIdKey, std::string(id.internal, sizeof id.internal));
    } catch (const std::exception& e) {
      return {ErrorCode::kPeerFailure, std::string("grow: publishing the ncclCommGrow id through the store: ") +
                                           e.what()};
    }
  }
  ncclComm_t child_comm = nullptr;
  {
    std::lock_guard lock(core_->mu);
    if (Status s = core_->grow_locked(desc.child.size, takes_id ? &id : nullptr, translated.config,
                                      child_init.comm_name, child_init.init_timeout, &child_comm);
        !s.is_ok()) {
      return s;
    }
  }
  core_->log(1, "ncclCommGrow from " + std::to_string(desc.members) + " to " + std::to_string(desc.child.size) +
                    " ranks: rank " + std::to_string(desc.child.rank));
  auto child_core = std::make_shared<Core>(core_->api_ptr(), child_init, merged, translated);
  auto backend = std::make_unique<NcclBackend>(child_core, options_);
  {
    std::lock_guard lock(child_core->mu);
    child_core->set_created_by_locked("ncclCommGrow");
    if (Status s = child_core->adopt_locked(child_comm); !s.is_ok()) return s;
  }
  *child = std::move(backend);
  return {};
}

Status NcclBackend::set_hints(const Hints& hints) {
  Hints merged;
  {
    std::lock_guard lock(core_->mu);
    merged = core_->raw_hints();
  }
  for (const auto& [k, v] : hints) {
    std::string key = k.starts_with("nccl.") ? k.substr(5) : k;
    merged.erase("nccl." + key);
    merged[key] = v;
  }
  TranslatedHints t;
  if (Status s = translate_hints(merged, core_->api().loaded_version(), &t); !s.is_ok()) return s;
  std::lock_guard lock(core_->mu);
  if (core_->initialized_locked() && !(t == core_->hints())) {
    std::string keys;
    for (const auto& [k, v] : hints) keys += (keys.empty() ? "" : ", ") + k + "=" + v;
    return {ErrorCode::kUnsupported,
            "nccl hints " + keys + ": ncclConfig_t and the stream priority are fixed when the "
            "NCCL communicator is created; split or recreate the comm with these hints"};
  }
  core_->set_hints_locked(std::move(merged), std::move(t));
  return {};
}

}  // namespace

namespace {

// What create() checks before anything connects; the hints translated for
// the loaded NCCL.
Status checked_init(NcclApi& api, const BackendInit& init, TranslatedHints* t) {
  if (init.device.type != DeviceType::kCuda) {
    return {ErrorCode::kInvalidArgument,
            "the nccl backend serves cuda devices, not " +
                std::string(init.device.type == DeviceType::kCpu ? "cpu" : "this device type")};
  }
  if (init.size < 1 || init.rank < 0 || init.rank >= init.size) {
    return {ErrorCode::kInvalidArgument, "nccl backend: rank " + std::to_string(init.rank) +
                                             " outside a comm of size " + std::to_string(init.size)};
  }
  if (!init.store) {
    return {ErrorCode::kInvalidArgument, "nccl backend: no store to exchange the NCCL unique id"};
  }
  return translate_hints(init.hints, api.loaded_version(), t);
}

}  // namespace

Status create_nccl_backend(std::shared_ptr<NcclApi> api, const BackendInit& init,
                           std::unique_ptr<plugin::Backend>* out, NcclBackendOptions options) {
  TranslatedHints t;
  if (Status s = checked_init(*api, init, &t); !s.is_ok()) return s;
  auto core = std::make_shared<Core>(std::move(api), init, init.hints, std::move(t));
  *out = std::make_unique<NcclBackend>(std::move(core), options);
  return {};
}

Status join_grown_nccl_backend(std::shared_ptr<NcclApi> api, const plugin::GrowDesc& desc,
                               std::unique_ptr<plugin::Backend>* out, NcclBackendOptions options) {
  const BackendInit& init = desc.child;
  if (init.rank < desc.members) {
    return {ErrorCode::kInvalidArgument, "join_grown: rank " + std::to_string(init.rank) +
                                             " is a member's rank, not a newcomer's (members: " +
                                             std::to_string(desc.members) + ")"};
  }
  if (!init.store) return {ErrorCode::kInvalidArgument, "join_grown: no store to vote and read the id through"};
  // As in grow(): a newcomer that cannot go on still votes (no).
  TranslatedHints t;
  const Status checked = checked_init(*api, init, &t);
  bool all = false;
  if (Status s = vote_native(*init.store, "grow", "ncclCommGrow", init.rank, init.size,
                             checked.is_ok() && api->has_grow(), init.init_timeout, &all);
      !s.is_ok()) {
    return s;
  }
  if (!checked.is_ok()) return checked;
  if (!all) {
    return {ErrorCode::kUnsupported, api->has_grow() ? "a participant cannot use ncclCommGrow: the comm is re-created"
                                                     : "ncclCommGrow is not available (NCCL < 2.29): the comm is "
                                                       "re-created"};
  }
  ncclUniqueId id;
  try {
    const std::string bytes = init.store->get(kGrowIdKey, init.init_timeout);
    if (bytes.size() != sizeof id.internal) {
      return {ErrorCode::kInternal, "store key '" + std::string(kGrowIdKey) + "' holds " +
                                        std::to_string(bytes.size()) + " bytes, expected " +
                                        std::to_string(sizeof id.internal)};
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  } catch (const Error& e) {
    return {e.code(), "join_grown: reading the ncclCommGrow id (member rank 0 publishes it): " + std::string(e.what())};
  }
  auto core = std::make_shared<Core>(std::move(api), init, init.hints, std::move(t));
  {
    std::lock_guard lock(core->mu);
    if (Status s = core->join_grown_locked(id); !s.is_ok()) return s;
  }
  core->log(1, "ncclCommGrow as newcomer rank " + std::to_string(init.rank) + " of " + std::to_string(init.size));
  *out = std::make_unique<NcclBackend>(std::move(core), options);
  return {};
}

Status explain_nccl_hints(NcclApi& api, const Hints& hints, std::string* json) {
  TranslatedHints t;
  if (Status s = translate_hints(hints, api.loaded_version(), &t); !s.is_ok()) return s;
  *json = explain_json(t);
  return {};
}

}  // namespace comms::nccl
