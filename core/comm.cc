#include <cstdlib>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "comm_impl.h"
#include "exit_guard.h"
#include "strutil.h"
#include "comms/store.h"
#include "env.h"
#include "log.h"
#include "store/store_tcp.h"

namespace comms {

using plugin::OpType;

namespace {

constexpr auto kDefaultInitTimeout = std::chrono::minutes(5);
constexpr auto kDefaultOpTimeout = std::chrono::minutes(10);

bool is_fatal(ErrorCode code) {
  return code == ErrorCode::kTimeout || code == ErrorCode::kPeerFailure ||
         code == ErrorCode::kAborted || code == ErrorCode::kInternal;
}

bool reduces(OpType t) {
  return t == OpType::kAllReduce || t == OpType::kReduce || t == OpType::kReduceScatter ||
         t == OpType::kReduceScatterV;
}

// A stable digest of a member list, the same in every process.
std::string members_digest(std::span<const int> ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) {
    for (int i = 0; i < 4; ++i) {
      h ^= static_cast<uint8_t>(r >> (8 * i));
      h *= 1099511628211ull;
    }
  }
  return str::cat(ranks.size(), "x", str::hex(h));
}

std::chrono::milliseconds timeout_from(std::optional<std::chrono::milliseconds> given,
                                       const char* variable, std::chrono::milliseconds fallback) {
  if (given) {
    if (given->count() <= 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("timeout must be positive; got ", given->count(), " ms"));
    }
    return *given;
  }
  if (auto v = env::get(variable)) return env::parse_duration(*v, variable);
  return fallback;
}

}  // namespace

// ---------------------------------------------------------------------------
// Process-wide registries

namespace internal {
namespace {
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::set<std::string>& live_names() {
  static auto* names = new std::set<std::string>();
  return *names;
}
std::unordered_map<std::string, int>& incarnations() {
  static auto* m = new std::unordered_map<std::string, int>();
  return *m;
}
}  // namespace

void register_comm_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mu());
  if (!live_names().insert(name).second) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("a comm named '", name,
                             "' is already alive in this process; comm names must be unique "
                             "(they key the rendezvous namespace)"));
  }
}

void unregister_comm_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mu());
  live_names().erase(name);
}

int next_incarnation(const std::string& ns) {
  std::lock_guard<std::mutex> lock(registry_mu());
  return incarnations()[ns]++;
}

std::array<Hints, kNumDeviceTypes> route_hints(const Hints& hints, const BackendSpec& spec,
                                               std::string_view comm_name) {
  std::array<Hints, kNumDeviceTypes> routed;
  // Read before the early return so that a malformed value is reported
  // whether or not this comm has hints.
  const bool strict = env::get_bool("COMMS_HINTS_STRICT", true);
  if (hints.empty()) return routed;
  auto& registry = PluginRegistry::instance();

  auto knows = [](const LoadedPlugin& p, std::string_view key) {
    for (const char* const* k = p.descriptor->hint_keys; k && *k; ++k) {
      if (key == *k) return true;
    }
    return false;
  };
  auto reject = [&](const std::string& message) {
    if (strict) throw Error(ErrorCode::kInvalidArgument, message);
    log::warning(str::cat(message, " (ignored: COMMS_HINTS_STRICT is off)"));
  };

  std::map<std::pair<size_t, std::string>, std::string> given_as;  // (device type, bare key) -> key
  for (const auto& [key, value] : hints) {
    std::vector<DeviceType> targets;
    std::string bare = key;
    if (auto dot = key.find('.'); dot != std::string::npos) {
      const std::string prefix = key.substr(0, dot);
      bare = key.substr(dot + 1);
      for (int t = 0; t < kNumDeviceTypes; ++t) {
        if (spec.backend_for(static_cast<DeviceType>(t)) == prefix) targets.push_back(static_cast<DeviceType>(t));
      }
      if (targets.empty()) {
        reject(str::cat("hint '", key, "' is for backend '", prefix, "', which comm '", comm_name,
                            "' does not have (backends: ", spec.to_string(), ")"));
        continue;
      }
      const auto& p = registry.get(prefix);
      if (!knows(p, bare)) {
        std::vector<std::string> keys;
        for (const char* const* k = p.descriptor->hint_keys; k && *k; ++k) keys.emplace_back(*k);
        reject(str::cat("unknown hint '", key, "' for backend '", prefix,
                            "'; it accepts: ", keys.empty() ? "none" : str::join(keys, ", ")));
        continue;
      }
    } else {
      std::set<std::string> knowers;
      for (int t = 0; t < kNumDeviceTypes; ++t) {
        const auto type = static_cast<DeviceType>(t);
        if (!spec.has(type)) continue;
        if (knows(registry.get(spec.backend_for(type)), key)) {
          targets.push_back(type);
          knowers.insert(spec.backend_for(type));
        }
      }
      if (knowers.size() > 1) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("hint '", key, "' is known to several backends of comm '", comm_name,
                                 "' (", str::join(knowers, ", "),
                                 "); prefix it with the backend, e.g. '", *knowers.begin(), ".", key,
                                 "'"));
      }
      if (targets.empty()) {
        reject(str::cat("unknown hint '", key, "': no backend of comm '", comm_name,
                            "' (", spec.to_string(), ") accepts it"));
        continue;
      }
    }
    for (DeviceType t : targets) {
      // "max_ctas" and "nccl.max_ctas" name the same setting: one must not
      // silently win over the other.
      auto [it, fresh] = given_as.try_emplace({static_cast<size_t>(t), bare}, key);
      if (!fresh) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("hints '", it->second, "' and '", key, "' of comm '", comm_name, "' both set ",
                             spec.backend_for(t), "'s '", bare, "'; give it once"));
      }
      routed[static_cast<size_t>(t)][bare] = value;
    }
  }
  return routed;
}

}  // namespace internal

// ---------------------------------------------------------------------------
// WorkState

namespace detail {

bool WorkState::is_completed() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
  }
  return work_->is_completed();
}

std::optional<Error> WorkState::wait(WaitMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return error_;
  Status st;
  try {
    st = work_->wait(mode);
  } catch (const std::exception& e) {
    st = {ErrorCode::kInternal, str::cat("backend threw from wait(): ", e.what())};
  }
  // A stream wait on a device op only orders the caller's stream: the op may
  // still be running and may still fail, so the Work stays open.
  if (st.is_ok() && mode == WaitMode::kStream && !work_->is_completed()) return std::nullopt;
  done_ = true;
  if (!st.is_ok()) {
    error_ = comm_->make_error(type_, seq_, st);
    if (is_fatal(st.code)) comm_->on_fatal(device_type_, *error_);
  }
  return error_;
}

ErrorCode WorkState::status() {
  if (!is_completed()) return ErrorCode::kOk;
  auto e = wait(WaitMode::kBlocking);
  return e ? e->code() : ErrorCode::kOk;
}

std::string WorkState::error_message() {
  if (!is_completed()) return {};
  auto e = wait(WaitMode::kBlocking);
  return e ? e->what() : std::string();
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Comm::Impl

Comm::Impl::Impl(Config config) : config_(std::move(config)) { internal::track_live_comm(this); }

Comm::Impl::~Impl() {
  internal::untrack_live_comm(this);
  if (!finalized_) {
    try {
      finalize();
    } catch (const std::exception& e) {
      log::error(str::cat("destroying comm '", config_.name, "': ", e.what()));
    }
  }
}

BackendState Comm::Impl::state(DeviceType t) const { return slot(t).state.load(); }

bool Comm::Impl::is_failed() const {
  for (const auto& s : slots_) {
    if (s.state.load() == BackendState::kFailed) return true;
  }
  return false;
}

std::string Comm::Impl::store_prefix(DeviceType t) const {
  const Slot& s = slot(t);
  return str::cat(config_.rendezvous_ns, "/", to_string(t), "-", config_.spec.backend_for(t),
                      "/g", s.generation);
}

plugin::BackendInit Comm::Impl::init_for(DeviceType t) const {
  const Slot& s = slot(t);
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

void Comm::Impl::create_backends() {
  auto routed = internal::route_hints(config_.hints, config_.spec, config_.name);
  auto& registry = internal::PluginRegistry::instance();
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!config_.spec.has(t)) continue;
    Slot& s = slot(t);
    s.plugin = &registry.get(config_.spec.backend_for(t));
    s.hints = std::move(routed[i]);
    s.device = Device{t, -1};
    if (t == DeviceType::kCuda) {
      const bool given = config_.bound_device && config_.bound_device->type == t &&
                         config_.bound_device->index >= 0;
      s.device.index = given ? config_.bound_device->index : config_.local_rank;
    }
    Status st;
    try {
      st = s.plugin->descriptor->create(init_for(t), &s.backend);
    } catch (const std::exception& e) {
      st = {ErrorCode::kInternal, str::cat("plugin threw: ", e.what())};
    }
    if (st.is_ok() && !s.backend) st = {ErrorCode::kInternal, "plugin created no backend"};
    if (!st.is_ok()) {
      throw Error(st.code, str::cat("comms[", config_.name, " rank ", config_.rank, "/",
                                        config_.size, "] creating the ", s.plugin->name,
                                        " backend for ", to_string(t), ": ", st.message),
                  config_.name, "new_comm", 0, config_.rank);
    }
    s.state = BackendState::kLazy;
  }
  if (config_.bound_device) {
    const DeviceType t = config_.bound_device->type;
    ensure_ready(slot(t), t, OpType::kBarrier, 0);
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
    slots_[i].backend = std::move(backends[i]);
    slots_[i].plugin = plugins[i];
    slots_[i].state = BackendState::kReady;
  }
}

Error Comm::Impl::make_error(OpType type, uint64_t seq, const Status& status) const {
  std::string message = str::cat("comms[", config_.name, " rank ", config_.rank, "/",
                                     config_.size, "] ", plugin::op_name(type), " #", seq, ": ",
                                     to_string(status.code), ": ", status.message);
  if (status.peer >= 0) str::append(message, " (peer rank ", status.peer, ")");
  return Error(status.code, message, config_.name, std::string(plugin::op_name(type)), seq,
               config_.rank, status.peer);
}

void Comm::Impl::on_fatal(DeviceType t, const Error& error) {
  Slot& s = slot(t);
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (s.state.load() == BackendState::kReady || s.state.load() == BackendState::kLazy) {
      s.failure = error.what();
      s.state = BackendState::kFailed;
      // Tell the peers at once (they see this rank as failed) instead of
      // letting each of them wait for its own timeout.
      if (s.backend) s.backend->abort(error.what());
    }
  }
  if (config_.abort_process_on_error) {
    log::error(str::cat(error.what(), " -- aborting the process (abort_process_on_error)"));
    std::abort();
  }
}

void Comm::Impl::fail_op(OpType type, uint64_t seq, const Status& status, DeviceType t) {
  Error e = make_error(type, seq, status);
  if (is_fatal(status.code)) on_fatal(t, e);
  throw e;
}

internal::InitProgress Comm::Impl::init_progress(DeviceType t) const {
  return internal::InitProgress(config_.store, store_prefix(t), config_.rank, config_.size);
}

void Comm::Impl::ensure_ready(Slot& s, DeviceType t, OpType type, uint64_t seq) {
  if (s.state.load() != BackendState::kLazy) return;
  Status st;
  const auto progress = init_progress(t);
  progress.arrived();
  try {
    st = s.backend->init();
  } catch (const std::exception& e) {
    st = {ErrorCode::kInternal, str::cat("plugin threw from init(): ", e.what())};
  }
  if (st.is_ok()) progress.finished();
  if (st.code == ErrorCode::kTimeout) st.message += progress.laggards();
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
    fail_op(type, seq, wrapped, t);
  }
  s.state = BackendState::kReady;
}

void Comm::Impl::flush_barrier(DeviceType t) {
  plugin::OpDesc d;
  d.type = OpType::kBarrier;
  d.seq = ++seq_;
  d.device = slot(t).device;
  d.timeout = config_.init_timeout;
  std::unique_ptr<plugin::Work> work;
  Status st = slot(t).backend->submit(d, &work);
  if (st.is_ok() && work) st = work->wait(WaitMode::kBlocking);
  if (!st.is_ok()) {
    st.message = str::cat("flush barrier after binding ", slot(t).device.to_string(), ": ",
                              st.message);
    fail_op(OpType::kBarrier, d.seq, st, t);
  }
}

Work Comm::Impl::run(const internal::OpArgs& args, const OpOptions& opts) {
  internal::Checked c;
  Status st = internal::validate(args, config_.rank, config_.size, &c);
  if (!st.is_ok()) throw make_error(args.type, seq_.load() + 1, st);

  DeviceType t = c.device_type;
  if (args.type == OpType::kBarrier || (args.type == OpType::kBatchP2P && args.p2p.empty())) {
    t = config_.bound_device ? config_.bound_device->type
        : config_.spec.has(DeviceType::kCpu) ? DeviceType::kCpu
                                             : DeviceType::kCuda;
  }
  Slot& s = slot(t);
  const BackendState state = s.state.load();
  if (state == BackendState::kAbsent) {
    throw make_error(args.type, seq_.load() + 1,
                     {ErrorCode::kInvalidArgument,
                      str::cat("no backend for device type '", to_string(t), "' in this comm (backends: ",
                                   config_.spec.to_string(), "); create the comm with e.g. 'cpu:gloo,cuda:nccl'")});
  }
  if (state == BackendState::kOffloaded) {
    throw make_error(args.type, seq_.load() + 1,
                     {ErrorCode::kAborted,
                      str::cat("the ", s.plugin->name, " backend for ", to_string(t),
                                   " is offloaded; reload it first (dist::reload_groups() or "
                                   "Comm::reload_backend)")});
  }
  if (state == BackendState::kFailed) {
    throw make_error(args.type, seq_.load() + 1,
                     {ErrorCode::kAborted, str::cat("the comm failed earlier and cannot run ops: ",
                                                        s.failure)});
  }
  if (reduces(args.type) && !s.backend->supports_reduction(c.dtype, args.reduce.kind)) {
    throw make_error(args.type, seq_.load() + 1,
                     {ErrorCode::kUnsupported,
                      str::cat("backend '", s.plugin->name, "' does not support ",
                                   to_string(args.reduce.kind), " on ", to_string(c.dtype))});
  }
  std::chrono::milliseconds timeout = config_.op_timeout;
  if (opts.timeout) {
    if (opts.timeout->count() <= 0) {
      throw make_error(args.type, seq_.load() + 1,
                       {ErrorCode::kInvalidArgument, "the op timeout must be positive"});
    }
    timeout = *opts.timeout;
  }
  const uint64_t seq = ++seq_;
  ensure_ready(s, t, args.type, seq);

  plugin::OpDesc d;
  d.type = args.type;
  d.seq = seq;
  d.input = args.input.data;
  d.output = args.output.data;
  d.count = c.count;
  d.dtype = c.dtype;
  d.device = s.device;
  d.reduce = args.reduce;
  d.root = args.root;
  d.peer = args.peer;
  d.tag = opts.tag;
  d.in_place = c.in_place;
  d.async = opts.async;
  d.counts = args.counts;
  d.output_counts = args.output_counts;
  d.p2p = args.p2p;
  d.timeout = timeout;
  d.stream = opts.stream;
  std::vector<void*> output_list;
  if (args.type == OpType::kAllGatherList) {
    output_list.reserve(args.outputs.size());
    for (const auto& b : args.outputs) output_list.push_back(b.data);
    d.output_list = output_list;
  }
  std::array<Hints, kNumDeviceTypes> op_hints;
  if (!opts.hints.empty()) {
    op_hints = internal::route_hints(opts.hints, config_.spec, config_.name);
    d.hints = &op_hints[static_cast<size_t>(t)];
  }

  std::unique_ptr<plugin::Work> work;
  try {
    st = s.backend->submit(d, &work);
  } catch (const std::exception& e) {
    st = {ErrorCode::kInternal, str::cat("backend threw from submit(): ", e.what())};
  }
  if (!st.is_ok()) fail_op(args.type, seq, st, t);
  if (!work) return Work();
  if (opts.async) {
    return Work(std::make_shared<detail::WorkState>(shared_from_this(), std::move(work), args.type,
                                                    seq, t));
  }
  st = work->wait(WaitMode::kStream);
  if (!st.is_ok()) fail_op(args.type, seq, st, t);
  return Work();
}

std::shared_ptr<Comm> Comm::Impl::split(std::span<const int> ranks, const std::string& name,
                                        const SplitOptions& opts) {
  auto split_error = [&](ErrorCode code, const std::string& why) {
    return Error(code,
                 str::cat("comms[", config_.name, " rank ", config_.rank, "/", config_.size,
                              "] split '", name, "': ", why),
                 config_.name, "split", 0, config_.rank);
  };
  const std::vector<int> members(ranks.begin(), ranks.end());
  int child_rank = -1;
  std::set<int> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    const int r = members[i];
    if (r < 0 || r >= config_.size) {
      throw split_error(ErrorCode::kInvalidArgument,
                        str::cat("rank ", r, " is outside the parent (size ", config_.size, ")"));
    }
    if (!seen.insert(r).second) {
      throw split_error(ErrorCode::kInvalidArgument,
                        str::cat("rank ", r, " appears twice in [", str::join(members, ","), "]"));
    }
    if (r == config_.rank) child_rank = static_cast<int>(i);
  }
  if (!members.empty() && child_rank < 0) {
    throw split_error(ErrorCode::kInvalidArgument,
                      str::cat("this rank (", config_.rank, ") is not in its own list [",
                                   str::join(members, ","),
                                   "]; non-members pass an empty list"));
  }

  // The filter names a subset of the parent's backends; it is checked
  // against the parent's map, so no plugin lookup can mask the real reason.
  BackendSpec child_spec = config_.spec;
  if (!opts.backend.empty()) {
    try {
      child_spec = config_.spec.select(opts.backend);
    } catch (const Error& e) {
      throw split_error(e.code(), e.what());
    }
  }
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!child_spec.has(t)) continue;
    const BackendState st = slot(t).state.load();
    if (st == BackendState::kFailed || st == BackendState::kOffloaded) {
      throw split_error(ErrorCode::kAborted,
                        str::cat("the parent's ", to_string(t), " backend is ", to_string(st)));
    }
  }

  Config child;
  child.name = name.empty() ? str::cat(config_.name, "/split-", members_digest(members)) : name;
  const std::string ns_base = str::cat(config_.rendezvous_ns, "/", child.name, "[",
                                           members_digest(members), "]");
  child.rendezvous_ns = str::cat(ns_base, "/i", internal::next_incarnation(ns_base));
  child.rank = child_rank;
  child.size = static_cast<int>(members.size());
  child.local_rank = config_.local_rank;
  child.local_size = config_.local_size;
  child.spec = child_spec;
  if (config_.bound_device && child_spec.has(config_.bound_device->type)) {
    child.bound_device = config_.bound_device;
  }
  child.init_timeout = opts.init_timeout.value_or(config_.init_timeout);
  child.op_timeout = opts.op_timeout.value_or(config_.op_timeout);
  child.hints = config_.hints;
  for (const auto& [k, v] : opts.hints) child.hints[k] = v;
  child.abort_process_on_error = opts.abort_process_on_error.value_or(config_.abort_process_on_error);
  child.store = config_.store;
  child.store_local_address = config_.store_local_address;

  auto routed = internal::route_hints(child.hints, child_spec, child.name);
  std::shared_ptr<Impl> impl;
  if (!members.empty()) {
    internal::register_comm_name(child.name);
    impl = std::make_shared<Impl>(child);
  }
  std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes> backends;
  std::array<const internal::LoadedPlugin*, kNumDeviceTypes> plugins{};
  try {
    for (int i = 0; i < kNumDeviceTypes; ++i) {
      const auto t = static_cast<DeviceType>(i);
      if (!child_spec.has(t)) continue;
      Slot& parent = slot(t);
      plugin::SplitDesc desc;
      desc.ranks = members;
      if (impl) {
        Slot& cs = impl->slot(t);
        cs.plugin = parent.plugin;
        cs.hints = routed[i];
        cs.device = parent.device;
        desc.child = impl->init_for(t);
      } else {
        desc.child.comm_name = child.name;
        desc.child.hints = routed[i];
        desc.child.init_timeout = child.init_timeout;
        desc.child.op_timeout = child.op_timeout;
        desc.child.device = parent.device;
      }
      Status st;
      try {
        st = parent.backend->split(desc, &backends[i]);
      } catch (const std::exception& e) {
        st = {ErrorCode::kInternal, str::cat("backend threw from split(): ", e.what())};
      }
      if (!st.is_ok()) throw split_error(st.code, str::cat(parent.plugin->name, ": ", st.message));
      if (impl && !backends[i]) {
        throw split_error(ErrorCode::kInternal,
                          str::cat(parent.plugin->name, " returned no child for a member"));
      }
      plugins[i] = parent.plugin;
    }
  } catch (...) {
    if (impl) {
      impl->finalized_ = true;  // it owns no backend yet
      internal::unregister_comm_name(child.name);
    }
    throw;
  }
  if (!impl) return nullptr;
  impl->adopt_backends(std::move(backends), plugins);
  if (log::enabled(log::Level::kInfo)) {
    log::info(str::cat("split comm '", child.name, "' from '", config_.name, "': ", impl->describe()));
  }
  return std::make_shared<Comm>(impl);
}

void Comm::Impl::set_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("comms[", config_.name, "] set_timeout: the timeout must be positive"));
  }
  for (auto& s : slots_) {
    if (!s.backend) continue;
    Status st = s.backend->set_op_timeout(t);
    if (!st.is_ok()) {
      throw Error(st.code, str::cat("comms[", config_.name, "] set_timeout: ", st.message));
    }
  }
  config_.op_timeout = t;
}

void Comm::Impl::set_hints(const Hints& hints) {
  auto routed = internal::route_hints(hints, config_.spec, config_.name);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    if (routed[i].empty() || !slots_[i].backend) continue;
    Status st = slots_[i].backend->set_hints(routed[i]);
    if (!st.is_ok()) {
      throw Error(st.code, str::cat("comms[", config_.name, "] set_hints: ", st.message));
    }
    for (const auto& [k, v] : routed[i]) slots_[i].hints[k] = v;
  }
  for (const auto& [k, v] : hints) config_.hints[k] = v;
}

void Comm::Impl::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_mu_);
  for (auto& s : slots_) {
    const BackendState st = s.state.load();
    if (st == BackendState::kAbsent || st == BackendState::kOffloaded) continue;
    if (s.failure.empty()) s.failure = str::cat("aborted: ", reason);
    s.state = BackendState::kFailed;
    if (s.backend) s.backend->abort(reason);
  }
}

void Comm::Impl::finalize() {
  if (finalized_) return;
  finalized_ = true;
  std::vector<std::string> failures;
  ErrorCode first = ErrorCode::kOk;
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    Slot& s = slots_[i];
    if (!s.backend) continue;
    Status st;
    try {
      st = s.backend->finalize();
    } catch (const std::exception& e) {
      st = {ErrorCode::kInternal, str::cat("backend threw from finalize(): ", e.what())};
    }
    if (!st.is_ok()) {
      if (first == ErrorCode::kOk) first = st.code;
      failures.push_back(str::cat(s.plugin->name, " (", to_string(static_cast<DeviceType>(i)),
                                      "): ", st.message));
    }
    std::lock_guard<std::mutex> lock(state_mu_);
    s.backend.reset();
  }
  internal::unregister_comm_name(config_.name);
  if (!failures.empty()) {
    throw Error(first, str::cat("comms[", config_.name, " rank ", config_.rank, "/", config_.size,
                                    "] finalize failed to release: ", str::join(failures, "; ")),
                config_.name, "finalize", 0, config_.rank);
  }
}

bool Comm::Impl::offload(DeviceType t) {
  Slot& s = slot(t);
  const BackendState st = s.state.load();
  if (st != BackendState::kReady && st != BackendState::kLazy) return false;
  Status result;
  try {
    result = s.backend->finalize();
  } catch (const std::exception& e) {
    result = {ErrorCode::kInternal, str::cat("backend threw from finalize(): ", e.what())};
  }
  std::lock_guard<std::mutex> lock(state_mu_);
  if (!result.is_ok()) {
    s.failure = str::cat("offload failed: ", result.message);
    s.state = BackendState::kFailed;
    throw Error(result.code,
                str::cat("comms[", config_.name, " rank ", config_.rank, "/", config_.size,
                             "] offloading the ", s.plugin->name, " backend for ", to_string(t),
                             " failed; its resources may not be released: ", result.message),
                config_.name, "offload", 0, config_.rank);
  }
  s.backend.reset();
  s.offloaded_while_lazy = st == BackendState::kLazy;
  s.state = BackendState::kOffloaded;
  return true;
}

bool Comm::Impl::reload(DeviceType t) {
  Slot& s = slot(t);
  if (s.state.load() != BackendState::kOffloaded) return false;
  ++s.generation;
  std::unique_ptr<plugin::Backend> backend;
  Status st = s.plugin->descriptor->create(init_for(t), &backend);
  // A backend that never connected comes back unconnected, as it was.
  if (st.is_ok() && !s.offloaded_while_lazy) st = backend->init();
  if (!st.is_ok()) {
    throw Error(st.code,
                str::cat("comms[", config_.name, " rank ", config_.rank, "/", config_.size,
                             "] reloading the ", s.plugin->name, " backend for ", to_string(t),
                             " failed: ", st.message),
                config_.name, "reload", 0, config_.rank);
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    s.backend = std::move(backend);
    s.state = s.offloaded_while_lazy ? BackendState::kLazy : BackendState::kReady;
  }
  if (s.state.load() == BackendState::kReady && config_.bound_device && config_.bound_device->type == t) {
    flush_barrier(t);
  }
  return true;
}

int64_t Comm::Impl::device_memory_used(DeviceType t) const {
  std::lock_guard<std::mutex> lock(state_mu_);
  const Slot& s = slot(t);
  return s.backend ? s.backend->device_memory_used() : -1;
}

void Comm::Impl::reload_by_split(Impl* child, Impl& parent, DeviceType t,
                                 const std::vector<int>& parent_ranks) {
  Slot& ps = parent.slot(t);
  if (ps.state.load() != BackendState::kReady && ps.state.load() != BackendState::kLazy) {
    throw Error(ErrorCode::kAborted,
                str::cat("comms[", parent.config_.name, "] cannot re-split its ", to_string(t),
                         " backend: it is ", to_string(ps.state.load()), "; reload the parent first"),
                parent.config_.name, "reload", 0, parent.config_.rank);
  }
  plugin::SplitDesc desc;
  if (child) {
    Slot& cs = child->slot(t);
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
  Status st = ps.backend->split(desc, &backend);
  if (st.is_ok() && child && !backend) st = {ErrorCode::kInternal, "the backend returned no child"};
  if (!st.is_ok()) {
    const Config& c = child ? child->config_ : parent.config_;
    throw Error(st.code,
                str::cat("comms[", c.name, " rank ", c.rank, "/", c.size, "] reloading the ", ps.plugin->name,
                         " backend for ", to_string(t), " by splitting '", parent.config_.name, "' failed: ", st.message),
                c.name, "reload", 0, c.rank);
  }
  if (!child) return;
  Slot& cs = child->slot(t);
  std::lock_guard<std::mutex> lock(child->state_mu_);
  cs.backend = std::move(backend);
  cs.state = BackendState::kReady;
}

std::string Comm::Impl::describe() const {
  using nlohmann::json;
  json j;
  j["name"] = config_.name;
  j["rank"] = config_.rank;
  j["size"] = config_.size;
  j["backend"] = config_.spec.to_string();
  j["device"] = config_.bound_device ? json(config_.bound_device->to_string()) : json(nullptr);
  j["init_timeout_ms"] = config_.init_timeout.count();
  j["op_timeout_ms"] = config_.op_timeout.count();
  j["hints"] = json::object();
  for (const auto& [k, v] : config_.hints) j["hints"][k] = v;
  j["abort_process_on_error"] = config_.abort_process_on_error;
  json backends = json::object();
  std::lock_guard<std::mutex> lock(state_mu_);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const Slot& s = slots_[i];
    if (s.state.load() == BackendState::kAbsent && !s.plugin) continue;
    json b;
    b["backend"] = s.plugin ? s.plugin->name : "";
    b["plugin_version"] = s.plugin ? s.plugin->descriptor->version : "";
    b["device"] = s.device.to_string();
    b["state"] = std::string(to_string(s.state.load()));
    b["hints"] = json::object();
    for (const auto& [k, v] : s.hints) b["hints"][k] = v;
    if (s.backend) {
      try {
        b["config"] = json::parse(s.backend->describe());
      } catch (const std::exception& e) {
        b["config"] = str::cat("unparsable describe(): ", e.what());
      }
    } else {
      b["config"] = nullptr;
    }
    backends[std::string(to_string(static_cast<DeviceType>(i)))] = b;
  }
  j["backends"] = backends;
  return j.dump(2);
}

// ---------------------------------------------------------------------------
// Comm

Comm::Comm(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Comm::~Comm() {
  try {
    impl_->finalize();
  } catch (const std::exception& e) {
    log::error(str::cat("destroying comm: ", e.what()));
  }
}

const std::string& Comm::name() const { return impl_->config().name; }
int Comm::rank() const { return impl_->config().rank; }
int Comm::size() const { return impl_->config().size; }
const BackendSpec& Comm::backends() const { return impl_->config().spec; }
std::optional<Device> Comm::device() const { return impl_->config().bound_device; }
std::chrono::milliseconds Comm::init_timeout() const { return impl_->config().init_timeout; }
std::chrono::milliseconds Comm::op_timeout() const { return impl_->config().op_timeout; }
Hints Comm::hints() const { return impl_->config().hints; }
bool Comm::abort_process_on_error() const { return impl_->config().abort_process_on_error; }
BackendState Comm::backend_state(DeviceType t) const { return impl_->state(t); }
bool Comm::is_failed() const { return impl_->is_failed(); }

namespace {
internal::OpArgs args_of(OpType type) {
  internal::OpArgs a;
  a.type = type;
  return a;
}
}  // namespace

Work Comm::all_reduce(BufferView buffer, ReduceOp op, const OpOptions& opts) {
  return all_reduce(buffer, buffer, op, opts);
}

Work Comm::all_reduce(BufferView input, BufferView output, ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kAllReduce);
  a.input = input;
  a.output = output;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::reduce(BufferView buffer, int root, ReduceOp op, const OpOptions& opts) {
  return reduce(buffer, buffer, root, op, opts);
}

Work Comm::reduce(BufferView input, BufferView output, int root, ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kReduce);
  a.input = input;
  a.output = output;
  a.root = root;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::broadcast(BufferView buffer, int root, const OpOptions& opts) {
  auto a = args_of(OpType::kBroadcast);
  a.input = buffer;
  a.output = buffer;
  a.root = root;
  return impl_->run(a, opts);
}

Work Comm::all_gather(BufferView input, BufferView output, const OpOptions& opts) {
  auto a = args_of(OpType::kAllGather);
  a.input = input;
  a.output = output;
  return impl_->run(a, opts);
}

Work Comm::all_gather(BufferView input, std::span<const BufferView> outputs, const OpOptions& opts) {
  auto a = args_of(OpType::kAllGatherList);
  a.input = input;
  a.outputs = outputs;
  return impl_->run(a, opts);
}

Work Comm::all_gather_v(BufferView input, BufferView output, std::span<const size_t> counts,
                        const OpOptions& opts) {
  auto a = args_of(OpType::kAllGatherV);
  a.input = input;
  a.output = output;
  a.counts = counts;
  return impl_->run(a, opts);
}

Work Comm::reduce_scatter(BufferView input, BufferView output, ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kReduceScatter);
  a.input = input;
  a.output = output;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::reduce_scatter_v(BufferView input, BufferView output, std::span<const size_t> counts,
                            ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kReduceScatterV);
  a.input = input;
  a.output = output;
  a.counts = counts;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::all_to_all(BufferView input, BufferView output, const OpOptions& opts) {
  auto a = args_of(OpType::kAllToAll);
  a.input = input;
  a.output = output;
  return impl_->run(a, opts);
}

Work Comm::all_to_all_v(BufferView input, std::span<const size_t> input_counts, BufferView output,
                        std::span<const size_t> output_counts, const OpOptions& opts) {
  auto a = args_of(OpType::kAllToAllV);
  a.input = input;
  a.output = output;
  a.counts = input_counts;
  a.output_counts = output_counts;
  return impl_->run(a, opts);
}

Work Comm::gather(BufferView input, BufferView output, int root, const OpOptions& opts) {
  auto a = args_of(OpType::kGather);
  a.input = input;
  a.output = output;
  a.root = root;
  return impl_->run(a, opts);
}

Work Comm::scatter(BufferView input, BufferView output, int root, const OpOptions& opts) {
  auto a = args_of(OpType::kScatter);
  a.input = input;
  a.output = output;
  a.root = root;
  return impl_->run(a, opts);
}

Work Comm::barrier(const OpOptions& opts) { return impl_->run(args_of(OpType::kBarrier), opts); }

Work Comm::send(BufferView buffer, int peer, const OpOptions& opts) {
  auto a = args_of(OpType::kSend);
  a.input = buffer;
  a.peer = peer;
  return impl_->run(a, opts);
}

Work Comm::recv(BufferView buffer, int peer, const OpOptions& opts) {
  auto a = args_of(OpType::kRecv);
  a.input = buffer;
  a.output = buffer;
  a.peer = peer;
  return impl_->run(a, opts);
}

Work Comm::batch_p2p(std::span<const P2POp> ops, const OpOptions& opts) {
  auto a = args_of(OpType::kBatchP2P);
  a.p2p = ops;
  return impl_->run(a, opts);
}

std::shared_ptr<Comm> Comm::split(std::span<const int> ranks, const std::string& name,
                                  const SplitOptions& opts) {
  return impl_->split(ranks, name, opts);
}

std::shared_ptr<Comm> Comm::split_group(std::span<const std::vector<int>> groups,
                                        const std::string& name, const SplitOptions& opts) {
  std::set<int> seen;
  const std::vector<int>* mine = nullptr;
  for (const auto& g : groups) {
    for (int r : g) {
      if (r < 0 || r >= size()) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("comms[", this->name(), "] split_group '", name, "': rank ", r,
                                 " is outside the parent (size ", size(), ")"));
      }
      if (!seen.insert(r).second) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("comms[", this->name(), "] split_group '", name, "': rank ", r,
                                 " is in more than one group (groups must be disjoint)"));
      }
      if (r == rank()) mine = &g;
    }
  }
  static const std::vector<int> kNone;
  return impl_->split(mine ? *mine : kNone, name, opts);
}

void Comm::set_timeout(std::chrono::milliseconds op_timeout) { impl_->set_timeout(op_timeout); }
void Comm::set_hints(const Hints& hints) { impl_->set_hints(hints); }
void Comm::abort(const std::string& reason) { impl_->abort(reason); }
void Comm::finalize() { impl_->finalize(); }
bool Comm::offload_backend(DeviceType type) { return impl_->offload(type); }
bool Comm::reload_backend(DeviceType type) { return impl_->reload(type); }
std::string Comm::describe() const { return impl_->describe(); }

// ---------------------------------------------------------------------------

std::shared_ptr<Comm> new_comm(const std::string& backend, std::optional<Device> device,
                               const std::string& name, const CommOptions& options) {
  if (name.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "new_comm: a comm needs a name (it keys its rendezvous)");
  }
  if (options.rank.has_value() != options.world_size.has_value()) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("new_comm '", name, "': set both rank and world_size, or neither"));
  }
  log::level_from_environment();  // a malformed COMMS_LOG_LEVEL is an error here
  const BootstrapInfo boot = bootstrap_from_environment();
  Comm::Impl::Config c;
  c.name = name;
  c.rank = options.rank.value_or(boot.rank);
  c.size = options.world_size.value_or(boot.world_size);
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("new_comm '", name, "': rank ", c.rank, " is not in [0, ", c.size, ")"));
  }
  if (options.rank && boot.source == "default") {
    c.local_rank = c.rank;  // no launcher: assume one host
    c.local_size = c.size;
  } else {
    c.local_rank = boot.local_rank;
    c.local_size = boot.local_world_size;
  }
  if (!backend.empty()) {
    c.spec = BackendSpec::parse(backend);
  } else if (auto from_env = env::get("COMMS_BACKEND")) {
    try {
      c.spec = BackendSpec::parse(*from_env);
    } catch (const Error& e) {
      throw Error(e.code(), str::cat("COMMS_BACKEND='", *from_env, "': ", e.what()));
    }
  } else {
    c.spec = BackendSpec::parse("");
  }
  if (device) {
    if (!c.spec.has(device->type)) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("new_comm '", name, "': device ", device->to_string(),
                               " was given but backend string '", c.spec.to_string(),
                               "' has no backend for ", to_string(device->type)));
    }
    c.bound_device = device;
  }
  c.init_timeout = timeout_from(options.init_timeout, "COMMS_INIT_TIMEOUT", kDefaultInitTimeout);
  c.op_timeout = timeout_from(options.op_timeout, "COMMS_OP_TIMEOUT", kDefaultOpTimeout);
  c.hints = options.hints;
  c.abort_process_on_error = options.abort_process_on_error;
  c.store = options.store ? options.store : default_store(c.rank, c.size, c.init_timeout);
  c.store_local_address = tcp_store_local_address(*c.store);
  const std::string ns_base = str::cat("comms/", name);
  c.rendezvous_ns = str::cat(ns_base, "/i", internal::next_incarnation(ns_base));

  internal::register_comm_name(name);
  auto impl = std::make_shared<Comm::Impl>(c);
  try {
    impl->create_backends();
  } catch (...) {
    try {
      impl->finalize();
    } catch (const std::exception& e) {
      log::error(str::cat("cleaning up after a failed new_comm '", name, "': ", e.what()));
    }
    throw;
  }
  return std::make_shared<Comm>(impl);
}

}  // namespace comms
