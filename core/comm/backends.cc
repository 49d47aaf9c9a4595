// A comm's device backends: creating each backend, connecting it (eagerly or
// before its first op), and the message prefix every error of the comm uses.
#include "comm/comm_impl.h"
#include "trace/service.h"
#include "comm/elastic_watch.h"
#include "comm/exit_guard.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

using plugin::OpType;

std::string internal::comm_prefix(std::string_view name, int rank, int size) {
  return str::cat("comms[", name, " rank ", rank, "/", size, "]");
}

Comm::Impl::Impl(Config config)
    : config_(std::move(config)),
      recorder_(trace::register_comm(
          {config_.name, config_.rank, config_.size, config_.rendezvous_ns, config_.store})) {
  internal::track_live_comm(this);
  if (config_.elastic && config_.store && config_.size > 1) {
    internal::watch_comm(this, config_.store, config_.rendezvous_ns, config_.rank);
  }
}

Comm::Impl::~Impl() {
  internal::unwatch_comm(this);
  internal::untrack_live_comm(this);
  if (!finalized_) {
    try {
      finalize();
    } catch (const std::exception& e) {
      log::error(str::cat("destroying comm '", config_.name, "': ", e.what()));
    }
  }
}

std::string Comm::Impl::prefix() const { return internal::comm_prefix(config_.name, config_.rank, config_.size); }

Error Comm::Impl::error(ErrorCode code, std::string_view what, std::string_view op) const {
  return Error(code, str::cat(prefix(), " ", what), config_.name, std::string(op), 0, config_.rank);
}

std::string Comm::Impl::plugin_name(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  return s.plugin ? s.plugin->name : config_.spec.backend_for(t);
}

BackendState Comm::Impl::state(DeviceType t) const { return device_backend(t).state.load(); }

bool Comm::Impl::is_failed() const {
  for (const auto& s : device_backends_) {
    if (s.state.load() == BackendState::kFailed) return true;
  }
  return false;
}

std::chrono::milliseconds Comm::Impl::op_timeout() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return config_.op_timeout;
}

Hints Comm::Impl::hints() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return config_.hints;
}

std::string Comm::Impl::store_prefix(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  return str::cat(config_.rendezvous_ns, "/", to_string(t), "-", config_.spec.backend_for(t),
                      "/g", s.generation);
}

plugin::BackendInit Comm::Impl::init_for(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  plugin::BackendInit init;
  init.comm_name = config_.name;
  init.rank = config_.rank;
  init.size = config_.size;
  init.local_rank = config_.local_rank;
  init.local_size = config_.local_size;
  init.device = s.device;
  init.eager = config_.bound_device && config_.bound_device->type == t;
  init.store = init_progress(t).counting(make_prefix_store(store_prefix(t), config_.store));
  init.init_timeout = config_.init_timeout;
  init.op_timeout = config_.op_timeout;
  init.hints = s.hints;
  init.abort_process_on_error = config_.abort_process_on_error;
  init.log = &log::plugin_sink;
  init.store_local_address = config_.store_local_address;
  return init;
}

void Comm::Impl::place_backend(DeviceType t, const Hints& routed) {
  DeviceBackend& s = device_backend(t);
  s.plugin = &internal::PluginRegistry::instance().get(config_.spec.backend_for(t));
  s.hints = routed;
  s.device = Device{t, -1};
  if (t == DeviceType::kCuda) {
    const bool given = config_.bound_device && config_.bound_device->type == t && config_.bound_device->index >= 0;
    s.device.index = given ? config_.bound_device->index : config_.local_rank;
  }
}

void Comm::Impl::create_backend(DeviceType t, const Hints& routed) {
  place_backend(t, routed);
  DeviceBackend& s = device_backend(t);
  const Status st = internal::call_plugin(
      s.plugin->name, "create", [&] { return s.plugin->descriptor->create(init_for(t), &s.backend); }, s.backend,
      "backend");
  if (!st.is_ok()) {
    throw error(st.code, str::cat("creating the ", s.plugin->name, " backend for ", to_string(t), ": ", st.message),
                "new_comm");
  }
  s.state = BackendState::kLazy;
}

void Comm::Impl::create_backends() {
  auto routed = internal::route_hints(config_.hints, config_.spec, config_.name);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (config_.spec.has(t)) create_backend(t, routed[i]);
  }
  connect_bound_backend();
}

void Comm::Impl::connect_bound_backend() {
  // A backend made ready by its parent (a native grow) is connected already.
  if (config_.bound_device && device_backend(config_.bound_device->type).state.load() == BackendState::kLazy) {
    const DeviceType t = config_.bound_device->type;
    ensure_ready(device_backend(t), t, OpType::kBarrier, 0, 0);
    flush_barrier(t);
  }
  if (log::enabled(log::Level::kInfo)) {
    log::info(str::cat("created comm '", config_.name, "': ", describe()));
  }
}

void Comm::Impl::adopt_backends(
    std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes> backends,
    const std::array<const internal::LoadedPlugin*, kNumDeviceTypes>& plugins) {
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    if (!backends[i]) continue;
    device_backends_[i].backend = std::move(backends[i]);
    device_backends_[i].plugin = plugins[i];
    device_backends_[i].state = BackendState::kReady;
  }
}

internal::InitProgress Comm::Impl::init_progress(DeviceType t) const {
  return internal::InitProgress(config_.store, store_prefix(t), config_.rank, config_.size);
}

void Comm::Impl::ensure_ready(DeviceBackend& s, DeviceType t, OpType type, uint64_t seq, uint64_t collective) {
  if (s.state.load() != BackendState::kLazy) return;
  const auto progress = init_progress(t);
  progress.arrived();
  Status st = internal::call_plugin(s.plugin->name, "init", [&] { return s.backend->init(); });
  if (st.is_ok()) progress.finished();
  // The ranks to look at lead; the store key this rank waited for follows.
  if (st.code == ErrorCode::kTimeout) {
    if (const std::string who = progress.laggards(); !who.empty()) {
      st.message = str::cat("timed out: ", who, "; the wait that expired: ", st.message);
    }
  }
  if (!st.is_ok()) {
    const bool eager = config_.bound_device && config_.bound_device->type == t;
    Status wrapped{st.code,
                   str::cat(eager ? "initialising" : "lazy initialisation of", " the ",
                                s.plugin->name, " backend for ", s.device.to_string(), " failed: ",
                                st.message,
                                eager ? ""
                                      : ". Connecting is collective: every rank must issue this "
                                        "first op (or pass a device to new_comm to connect "
                                        "eagerly)"),
                   st.peer};
    throw failed_op(type, seq, collective, wrapped, t);
  }
  s.state = BackendState::kReady;
}

void Comm::Impl::flush_barrier(DeviceType t) {
  DeviceBackend& s = device_backend(t);
  plugin::OpDesc d;
  d.type = OpType::kBarrier;
  d.seq = ++seq_;
  d.device = s.device;
  d.timeout = config_.init_timeout;
  trace::OpRecord record;  // recorded like any op, so the ring has no gap at #1
  record.seq = d.seq;
  record.op = OpType::kBarrier;
  record.device = t;
  const uint64_t collective = recorder_->issued(record);
  std::unique_ptr<plugin::Work> work;
  Status st = internal::call_plugin(s.plugin->name, "submit", [&] { return s.backend->submit(d, &work); });
  if (st.is_ok() && work) {
    st = internal::call_plugin(s.plugin->name, "wait", [&] { return work->wait(WaitMode::kBlocking); });
  }
  if (!st.is_ok()) {
    st.message = str::cat("flush barrier after binding ", s.device.to_string(), ": ", st.message);
    throw failed_op(OpType::kBarrier, d.seq, collective, st, t);
  }
  recorder_->completed(d.seq, OpType::kBarrier, collective);
}

}  // namespace comms
