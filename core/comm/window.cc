// One-sided windows: Window and the Comm::Impl calls behind it. Like a
// registered buffer (registration.cc), a window remembers the backend object
// and generation it was made on: once either changed (finalize, offload,
// reload) or the backend failed, the backend has released it and the handle
// refuses ops without calling the plugin. Store traffic happens only at
// registration and deregistration; an op is validated, numbered and handed
// to the plugin.
#include <algorithm>

#include "comm/comm_impl.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

using plugin::WindowOpType;
using plugin::window_op_name;

namespace internal {

struct WindowState {
  std::weak_ptr<Comm::Impl> comm;
  BufferView buffer;
  std::vector<size_t> sizes;  // bytes every rank registered
  const plugin::Backend* backend = nullptr;  // compared, never called through
  int generation = 0;
  uint64_t id = 0;  // the comm's windows_made_ when registered: names store keys
  void* handle = nullptr;
  bool released = false;  // deregistered by the caller
};

}  // namespace internal

namespace {

bool plugin_has_windows(const internal::LoadedPlugin& p) {
  return plugin::abi_minor(p.descriptor->abi_version) >= 6 &&
         (p.descriptor->features & plugin::kFeatureWindows) != 0;
}

Status invalid(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }

plugin::WindowOpDesc desc_of(WindowOpType type, int peer = -1) {
  plugin::WindowOpDesc d;
  d.type = type;
  d.peer = peer;
  return d;
}

}  // namespace

bool Comm::Impl::can_window(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  return s.plugin && plugin_has_windows(*s.plugin);
}

std::shared_ptr<internal::WindowState> Comm::Impl::register_window(BufferView buffer) {
  const DeviceType t = buffer.device.type;
  const internal::LoadedPlugin& p = plugin_serving(t, "register_window");
  if (!plugin_has_windows(p)) {
    const uint32_t minor = plugin::abi_minor(p.descriptor->abi_version);
    throw error(ErrorCode::kUnsupported,
                str::cat("register_window: the ", p.name, " backend for ", to_string(t),
                         " has no one-sided windows (",
                         minor < 6 ? str::cat("its plugin ABI is 2.", minor, "; windows need 2.6")
                                   : std::string("its plugin does not claim kFeatureWindows"),
                         "; has_windows() is false)"),
                "register_window");
  }
  if (!buffer.data || buffer.bytes() == 0) {
    throw error(ErrorCode::kInvalidArgument, "register_window: the buffer is null or empty", "register_window");
  }
  DeviceBackend& s = device_backend(t);
  if (finalized_ || s.state.load() != BackendState::kReady || !s.backend) {
    throw error(ErrorCode::kInvalidArgument,
                str::cat("register_window: the ", p.name, " backend is ",
                         finalized_ ? std::string("finalized") : std::string(to_string(s.state.load())),
                         "; register once it is connected (after the comm's first op on ", to_string(t),
                         ", or create the comm with that device)"),
                "register_window");
  }
  auto w = std::make_shared<internal::WindowState>();
  w->comm = weak_from_this();
  w->buffer = buffer;
  w->backend = s.backend.get();
  w->generation = s.generation;
  w->id = windows_made_++;
  // Every rank learns every rank's size (offsets are checked against the
  // peer's), which also proves every rank came to register.
  const auto timeout = op_timeout();
  try {
    auto store = make_prefix_store(str::cat(store_prefix(t), "/windows/", w->id), config_.store);
    store->set(std::to_string(config_.rank), std::to_string(buffer.bytes()));
    w->sizes.resize(static_cast<size_t>(config_.size));
    for (int r = 0; r < config_.size; ++r) {
      w->sizes[static_cast<size_t>(r)] =
          r == config_.rank ? buffer.bytes() : std::stoull(store->get(std::to_string(r), timeout));
    }
  } catch (const Error& e) {
    throw error(e.code(), str::cat("register_window: exchanging the window sizes: ", e.what()), "register_window");
  }
  call_or_throw(t, "register_window", "register_window", "register_window",
                [&] { return s.backend->register_window(buffer.data, buffer.bytes(), &w->handle); });
  return w;
}

bool Comm::Impl::window_live(const internal::WindowState& w) const {
  const DeviceBackend& s = device_backend(w.buffer.device.type);
  return !w.released && !finalized_ && s.backend.get() == w.backend && s.generation == w.generation &&
         s.state.load() == BackendState::kReady;
}

Status Comm::Impl::window_unusable(const internal::WindowState& w) const {
  const DeviceType t = w.buffer.device.type;
  const DeviceBackend& s = device_backend(t);
  if (w.released) return invalid("the window was deregistered");
  if (finalized_) return invalid("the window was released when the comm was finalized");
  const BackendState state = s.state.load();
  if (state == BackendState::kFailed) return unusable_backend(t);
  if (state == BackendState::kOffloaded || s.backend.get() != w.backend || s.generation != w.generation) {
    return invalid(str::cat("the window was released when the ", s.plugin->name, " backend for ", to_string(t),
                            " was offloaded; register a new one after reload_backend()"));
  }
  return {};
}

void Comm::Impl::deregister_window(internal::WindowState& w) {
  if (!window_live(w)) {
    w.released = true;  // gone with its backend
    return;
  }
  // No rank may unmap its part while a peer's puts into it are in flight:
  // each rank completes its own, then waits for every rank to get here.
  run_window(w, desc_of(WindowOpType::kFlush), {}, {});
  w.released = true;
  const DeviceType t = w.buffer.device.type;
  try {
    auto store = make_prefix_store(str::cat(store_prefix(t), "/windows/", w.id), config_.store);
    store->set(str::cat("done/", config_.rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < config_.size; ++r) keys.push_back(str::cat("done/", r));
    store->wait(keys, op_timeout());
  } catch (const Error& e) {
    throw error(e.code(), str::cat("deregister_window: waiting for every rank to deregister: ", e.what()),
                "deregister_window");
  }
  DeviceBackend& s = device_backend(t);
  call_or_throw(t, "deregister_window", "deregister_window", "deregister_window",
                [&] { return s.backend->deregister_window(w.handle); });
}

Error Comm::Impl::failed_window_op(WindowOpType type, uint64_t seq, const Status& status, DeviceType t) {
  Status st = status;
  if (revoked_.load() && internal::is_fatal(st.code) && st.code != ErrorCode::kRevoked) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      why = device_backend(t).failure;
    }
    st = Status(ErrorCode::kRevoked,
                str::cat(why, " (the backend said: ", to_string(st.code), ": ", st.message, ")"), st.peer);
  }
  recorder_->failed(seq, st.code, st.peer);
  Error e = op_error(window_op_name(type), seq, st);
  // A wait for signals that did not come consumed nothing: the comm stays
  // usable, and the signals may still arrive.
  const bool quiet_timeout = type == WindowOpType::kWaitSignal && st.code == ErrorCode::kTimeout;
  if (internal::is_fatal(st.code) && !quiet_timeout) on_fatal(t, e);
  return e;
}

Work Comm::Impl::run_window(internal::WindowState& w, plugin::WindowOpDesc d, BufferView src,
                            const OpOptions& opts) {
  const std::string_view op = window_op_name(d.type);
  const DeviceType t = w.buffer.device.type;
  const auto refuse = [&](const Status& st) { return op_error(op, seq_.load() + 1, st); };
  if (Status st = window_unusable(w); !st.is_ok()) [[unlikely]] throw refuse(st);
  if (opts.tag != 0) [[unlikely]] {
    throw refuse(invalid(str::cat("OpOptions::tag (", opts.tag, ") only applies to send, recv and batch_p2p; ",
                                  op, " takes no tag")));
  }
  if (!opts.hints.empty()) [[unlikely]] throw refuse(invalid(str::cat(op, " takes no per-op hints")));
  if (opts.timeout && opts.timeout->count() <= 0) [[unlikely]] {
    throw refuse(invalid("the op timeout must be positive"));
  }
  const int size = config_.size;
  if (d.type == WindowOpType::kPut || d.type == WindowOpType::kSignal) {
    if (d.peer < 0 || d.peer >= size) [[unlikely]] {
      throw refuse(invalid(str::cat("peer ", d.peer, " is out of range [0, ", size, ")")));
    }
  }
  if (d.type == WindowOpType::kPut) {
    const Device& wd = w.buffer.device;
    if (src.device.type != wd.type ||
        (src.device.index >= 0 && wd.index >= 0 && src.device.index != wd.index)) [[unlikely]] {
      throw refuse(invalid(str::cat("the source is on ", src.device.to_string(), " but the window is on ",
                                    wd.to_string())));
    }
    const size_t bytes = src.bytes();
    if (!src.data && bytes > 0) [[unlikely]] throw refuse(invalid("the source is null"));
    const size_t peer_bytes = w.sizes[static_cast<size_t>(d.peer)];
    if (d.offset > peer_bytes || bytes > peer_bytes - d.offset) [[unlikely]] {
      throw refuse(invalid(str::cat(bytes, " bytes at offset ", d.offset, " do not fit rank ", d.peer,
                                    "'s window of ", peer_bytes, " bytes")));
    }
    d.input = src.data;
    d.bytes = bytes;
  }
  if (d.type == WindowOpType::kWaitSignal && d.signal_counts.size() != static_cast<size_t>(size)) [[unlikely]] {
    throw refuse(invalid(str::cat("signal counts has ", d.signal_counts.size(), " entries; the comm has ", size,
                                  " ranks (one count per rank)")));
  }
  DeviceBackend& s = device_backend(t);
  const uint64_t seq = seq_.load(std::memory_order_relaxed) + 1;
  seq_.store(seq, std::memory_order_relaxed);
  d.seq = seq;
  d.window = w.handle;
  d.async = opts.async;
  d.timeout = opts.timeout ? *opts.timeout : op_timeout();
  d.stream = opts.stream;
  // In the flight recorder like any op (a wait_signal that hangs shows
  // there), numbered by seq alone: one-sided, so no collective number.
  trace::OpRecord record;
  record.seq = seq;
  record.window_op = d.type;
  record.device = t;
  record.async = opts.async;
  record.peer = d.type == WindowOpType::kPut || d.type == WindowOpType::kSignal ? d.peer : -1;
  record.count = d.bytes;
  recorder_->issued(record);
  std::unique_ptr<plugin::Work> work;
  Status st = internal::call_plugin(s.plugin->name, "submit_window", [&] { return s.backend->submit_window(d, &work); });
  if (!st.is_ok()) [[unlikely]] throw failed_window_op(d.type, seq, st, t);
  if (!work) {
    recorder_->completed_window_op(seq);
    return Work();
  }
  if (opts.async) {
    return Work(std::make_shared<internal::WorkState>(shared_from_this(), std::move(work), d.type, seq, t));
  }
  st = internal::call_plugin(s.plugin->name, "wait", [&] { return work->wait(WaitMode::kStream); });
  if (!st.is_ok()) [[unlikely]] throw failed_window_op(d.type, seq, st, t);
  recorder_->completed_window_op(seq);
  return Work();
}

Window::Window() = default;
Window::Window(std::shared_ptr<internal::WindowState> state) : state_(std::move(state)) {}
Window::Window(Window&&) noexcept = default;

Window& Window::operator=(Window&& other) noexcept {
  if (this != &other) {
    try {
      deregister();
    } catch (const std::exception& e) {
      log::error(str::cat("replacing a window: ", e.what()));
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

Window::~Window() {
  try {
    deregister();
  } catch (const std::exception& e) {
    log::error(str::cat("destroying a window: ", e.what()));
  }
}

void Window::deregister() {
  if (!state_ || state_->released) return;
  if (auto comm = state_->comm.lock()) {
    comm->deregister_window(*state_);
  } else {
    state_->released = true;  // the comm, and its backend, are gone
  }
}

bool Window::registered() const {
  if (!state_ || state_->released) return false;
  auto comm = state_->comm.lock();
  return comm && comm->window_live(*state_);
}

BufferView Window::buffer() const { return state_ ? state_->buffer : BufferView{}; }

size_t Window::size_of(int peer) const {
  if (!state_ || peer < 0 || static_cast<size_t>(peer) >= state_->sizes.size()) return 0;
  return state_->sizes[static_cast<size_t>(peer)];
}

namespace {

// The comm of a window op; a handle whose comm is gone cannot run one.
std::shared_ptr<Comm::Impl> comm_of(const std::shared_ptr<internal::WindowState>& state, std::string_view op) {
  std::shared_ptr<Comm::Impl> comm = state ? state->comm.lock() : nullptr;
  if (!comm) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat(op, ": the window is not registered (default-constructed, or its comm is gone)"));
  }
  return comm;
}

}  // namespace

Work Window::put(BufferView src, int peer, size_t offset, bool signal, const OpOptions& opts) {
  plugin::WindowOpDesc d = desc_of(WindowOpType::kPut, peer);
  d.offset = offset;
  d.signal = signal;
  return comm_of(state_, "put")->run_window(*state_, d, src, opts);
}

Work Window::signal(int peer, const OpOptions& opts) {
  return comm_of(state_, "signal")->run_window(*state_, desc_of(WindowOpType::kSignal, peer), {}, opts);
}

Work Window::wait_signal(std::span<const uint64_t> counts, const OpOptions& opts) {
  plugin::WindowOpDesc d = desc_of(WindowOpType::kWaitSignal);
  d.signal_counts = counts;
  return comm_of(state_, "wait_signal")->run_window(*state_, d, {}, opts);
}

Work Window::wait_signal(int peer, uint64_t count, const OpOptions& opts) {
  auto comm = comm_of(state_, "wait_signal");
  const int size = comm->config().size;
  if (peer < 0 || peer >= size) {
    throw comm->op_error("wait_signal", comm->next_seq(),
                         invalid(str::cat("peer ", peer, " is out of range [0, ", size, ")")));
  }
  std::vector<uint64_t> counts(static_cast<size_t>(size), 0);
  counts[static_cast<size_t>(peer)] = count;
  plugin::WindowOpDesc d = desc_of(WindowOpType::kWaitSignal);
  d.signal_counts = counts;
  return comm->run_window(*state_, d, {}, opts);
}

Work Window::flush(const OpOptions& opts) {
  return comm_of(state_, "flush")->run_window(*state_, desc_of(WindowOpType::kFlush), {}, opts);
}

bool has_windows(const Comm& comm, DeviceType type) { return internal::CommAccess::impl(comm).can_window(type); }

Window register_window(Comm& comm, BufferView buffer) {
  return Window(internal::CommAccess::impl(comm).register_window(buffer));
}

}  // namespace comms
