// A comm's controls after creation: run-time timeouts and hints, abort,
// finalize, and offloading/reloading one backend.
#include "comm/comm_impl.h"
#include "trace/service.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

void Comm::Impl::set_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0) {
    throw error(ErrorCode::kInvalidArgument, "set_timeout: the timeout must be positive", "set_timeout");
  }
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    DeviceBackend& s = device_backends_[i];
    if (!s.backend) continue;
    call_or_throw(static_cast<DeviceType>(i), "set_op_timeout", "set_timeout", "set_timeout",
                  [&] { return s.backend->set_op_timeout(t); });
  }
  std::lock_guard<std::mutex> lock(config_mu_);
  config_.op_timeout = t;
}

void Comm::Impl::set_hints(const Hints& hints) {
  auto routed = internal::route_hints(hints, config_.spec, config_.name);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    DeviceBackend& s = device_backends_[i];
    if (routed[i].empty() || !s.backend) continue;
    call_or_throw(static_cast<DeviceType>(i), "set_hints", "set_hints", "set_hints",
                  [&] { return s.backend->set_hints(routed[i]); });
    std::lock_guard<std::mutex> lock(state_mu_);  // describe() reads them
    for (const auto& [k, v] : routed[i]) s.hints[k] = v;
  }
  std::lock_guard<std::mutex> lock(config_mu_);
  for (const auto& [k, v] : hints) config_.hints[k] = v;
}

void Comm::Impl::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_mu_);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    DeviceBackend& s = device_backends_[i];
    const BackendState st = s.state.load();
    if (st == BackendState::kAbsent || st == BackendState::kOffloaded) continue;
    if (s.failure.empty()) s.failure = str::cat("aborted: ", reason);
    s.state = BackendState::kFailed;
    if (!s.backend) continue;
    const Status called = internal::call_plugin(s.plugin->name, "abort", [&] {
      s.backend->abort(reason);
      return Status{};
    });
    if (!called.is_ok()) log::error(str::cat(prefix(), " abort: ", called.message));
  }
  trace::dump(*recorder_, str::cat("abort: ", reason));
}

void Comm::Impl::finalize() {
  if (finalized_) return;
  finalized_ = true;
  std::vector<std::string> failures;
  ErrorCode first = ErrorCode::kOk;
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    DeviceBackend& s = device_backends_[i];
    if (!s.backend) continue;
    const Status st = internal::call_plugin(s.plugin->name, "finalize", [&] { return s.backend->finalize(); });
    if (!st.is_ok()) {
      if (first == ErrorCode::kOk) first = st.code;
      failures.push_back(str::cat(s.plugin->name, " (", to_string(static_cast<DeviceType>(i)), "): ", st.message));
    }
    std::lock_guard<std::mutex> lock(state_mu_);
    s.backend.reset();
  }
  internal::unregister_comm_name(config_.name);
  if (!failures.empty()) {
    throw error(first, str::cat("finalize failed to release: ", str::join(failures, "; ")), "finalize");
  }
}

bool Comm::Impl::offload(DeviceType t) {
  DeviceBackend& s = device_backend(t);
  const BackendState st = s.state.load();
  if (st != BackendState::kReady && st != BackendState::kLazy) return false;
  // Suspend where the plugin can (ABI 2.6: NCCL >= 2.29 keeps its
  // communicator); kUnsupported falls back to finalize and re-creation.
  const char* mode = "destroy";
  Status result{ErrorCode::kUnsupported, ""};
  if (plugin::abi_minor(s.plugin->descriptor->abi_version) >= 6) {
    result = internal::call_plugin(s.plugin->name, "suspend", [&] { return s.backend->suspend(); });
  }
  if (result.code != ErrorCode::kUnsupported) {
    mode = "suspend";
  } else {
    result = internal::call_plugin(s.plugin->name, "finalize", [&] { return s.backend->finalize(); });
  }
  // What the device holds now that the backend released it: measured before
  // the object goes (after, nothing is left to ask).
  int64_t after = -1;
  if (result.is_ok()) {
    const Status measured = internal::call_plugin(s.plugin->name, "device_memory_used", [&] {
      after = s.backend->device_memory_used();
      return Status{};
    });
    if (!measured.is_ok()) log::warning(str::cat(prefix(), " ", measured.message));
  }
  std::lock_guard<std::mutex> lock(state_mu_);
  if (!result.is_ok()) {
    s.failure = str::cat("offload failed: ", result.message);
    s.state = BackendState::kFailed;
    throw error(result.code,
                str::cat("offloading the ", s.plugin->name, " backend for ", to_string(t), " (", mode,
                         ") failed; its resources may not be released: ", result.message),
                "offload");
  }
  s.suspended = mode == std::string_view("suspend");
  if (!s.suspended) s.backend.reset();
  s.offload_mode = mode;
  s.memory_after_offload = after;
  s.offloaded_while_lazy = st == BackendState::kLazy;
  s.state = BackendState::kOffloaded;
  return true;
}

bool Comm::Impl::reload(DeviceType t) {
  DeviceBackend& s = device_backend(t);
  if (s.state.load() != BackendState::kOffloaded) return false;
  ++s.generation;
  std::unique_ptr<plugin::Backend> backend;
  Status st;
  if (s.suspended) {
    // The kept backend comes back without a rendezvous; a lazy one stays lazy.
    st = internal::call_plugin(s.plugin->name, "resume", [&] { return s.backend->resume(); });
  } else {
    st = internal::call_plugin(
        s.plugin->name, "create", [&] { return s.plugin->descriptor->create(init_for(t), &backend); }, backend,
        "backend");
    // A backend that never connected comes back unconnected, as it was.
    if (st.is_ok() && !s.offloaded_while_lazy) {
      st = internal::call_plugin(s.plugin->name, "init", [&] { return backend->init(); });
    }
  }
  if (!st.is_ok()) {
    if (s.suspended) {
      // The backend aborted its communicator: the comm cannot run ops.
      std::lock_guard<std::mutex> lock(state_mu_);
      s.failure = str::cat("reload (resume) failed: ", st.message);
      s.state = BackendState::kFailed;
      s.suspended = false;
    }
    throw error(st.code,
                str::cat("reloading the ", s.plugin->name, " backend for ", to_string(t), " failed: ", st.message),
                "reload");
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!s.suspended) s.backend = std::move(backend);
    s.suspended = false;
    s.memory_after_offload = -1;
    s.state = s.offloaded_while_lazy ? BackendState::kLazy : BackendState::kReady;
  }
  if (s.state.load() == BackendState::kReady && config_.bound_device && config_.bound_device->type == t) {
    flush_barrier(t);
  }
  return true;
}

int64_t Comm::Impl::device_memory_used(DeviceType t) const {
  std::lock_guard<std::mutex> lock(state_mu_);
  const DeviceBackend& s = device_backend(t);
  if (!s.backend) return s.state.load() == BackendState::kOffloaded ? s.memory_after_offload : -1;
  int64_t used = -1;
  const Status st = internal::call_plugin(s.plugin->name, "device_memory_used", [&] {
    used = s.backend->device_memory_used();
    return Status{};
  });
  if (!st.is_ok()) log::warning(str::cat(prefix(), " ", st.message));
  return st.is_ok() ? used : -1;
}

void Comm::Impl::reload_by_split(Impl* child, Impl& parent, DeviceType t, const std::vector<int>& parent_ranks) {
  DeviceBackend& ps = parent.device_backend(t);
  // A child offloaded by suspend kept its communicator: it resumes, with no
  // split. A non-member cannot see the child; it follows the parent's last
  // offload, which ran on the same plugin (and so NCCL) as the members'.
  if (child && child->device_backend(t).suspended) {
    child->reload(t);
    return;
  }
  if (!child && ps.offload_mode && std::string_view(ps.offload_mode) == "suspend") return;
  if (ps.state.load() != BackendState::kReady && ps.state.load() != BackendState::kLazy) {
    throw parent.error(ErrorCode::kAborted,
                       str::cat("cannot re-split its ", to_string(t), " backend: it is ",
                                to_string(ps.state.load()), "; reload the parent first"),
                       "reload");
  }
  plugin::SplitDesc desc;
  if (child) {
    DeviceBackend& cs = child->device_backend(t);
    if (cs.state.load() != BackendState::kOffloaded) return;
    ++cs.generation;
    desc.ranks = parent_ranks;
    desc.child = child->init_for(t);
  } else {
    desc.child.comm_name = "(non-member)";
    desc.child.init_timeout = parent.config_.init_timeout;
    desc.child.op_timeout = parent.config_.op_timeout;
    desc.child.device = ps.device;
  }
  std::unique_ptr<plugin::Backend> backend;
  const auto call = [&] { return ps.backend->split(desc, &backend); };
  const Status st = child ? internal::call_plugin(ps.plugin->name, "split", call, backend, "child")
                          : internal::call_plugin(ps.plugin->name, "split", call);
  if (!st.is_ok()) {
    throw (child ? *child : parent)
        .error(st.code,
               str::cat("reloading the ", ps.plugin->name, " backend for ", to_string(t), " by splitting '",
                        parent.config_.name, "' failed: ", st.message),
               "reload");
  }
  if (!child) return;
  DeviceBackend& cs = child->device_backend(t);
  std::lock_guard<std::mutex> lock(child->state_mu_);
  cs.backend = std::move(backend);
  cs.memory_after_offload = -1;
  cs.state = BackendState::kReady;
}

}  // namespace comms
