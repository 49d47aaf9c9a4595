// Comm::Impl::shrink_to: the survivors' comm, configured as its parent is
// now (timeouts and hints set at run time included), under a fresh store
// namespace. A backend's native shrink (plugin ABI 2.3) is used when every
// backend of the comm has one; otherwise each backend is re-created through
// its plugin's create(), which every plugin supports.
#include "comm/comm_impl.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

std::string internal::base_comm_name(const std::string& name) {
  const size_t at = name.rfind("@e");
  if (at == std::string::npos || at + 2 == name.size() || name[at + 2] < '0' || name[at + 2] > '9') return name;
  return name.substr(0, at);
}

namespace {

// Registers `name`, or "<name>.2", "<name>.3", ... when this process already
// has a live comm of that name (say, a planned shrink's that is still used).
// The rendezvous never depends on it: the namespace is the shrink's own.
std::string register_unique(const std::string& name) {
  for (int k = 1;; ++k) {
    const std::string candidate = k == 1 ? name : str::cat(name, ".", k);
    try {
      internal::register_comm_name(candidate);
      return candidate;
    } catch (const Error&) {
      if (k > 1000) throw;
    }
  }
}

}  // namespace

Comm::Impl::Config Comm::Impl::derived_config(int size, int child_rank, uint64_t epoch, const std::string& ns_suffix,
                                              const std::string& name_suffix) const {
  Config c;
  c.name = str::cat(internal::base_comm_name(config_.name), "@e", epoch, name_suffix);
  c.rendezvous_ns = config_.rendezvous_ns + ns_suffix;
  c.rank = child_rank;
  c.size = size;
  c.local_rank = config_.local_rank;
  c.local_size = config_.local_size;
  c.spec = config_.spec;
  c.bound_device = config_.bound_device;
  c.init_timeout = config_.init_timeout;
  c.op_timeout = op_timeout();
  c.hints = hints();
  c.abort_process_on_error = config_.abort_process_on_error;
  c.elastic = config_.elastic;
  c.store = config_.store;
  c.store_local_address = config_.store_local_address;
  c.epoch = epoch;
  return c;
}

bool Comm::Impl::shrink_natively(Impl& child, const std::vector<int>& members) {
  auto routed = internal::route_hints(child.config_.hints, child.config_.spec, child.config_.name);
  std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes> backends;
  std::array<const internal::LoadedPlugin*, kNumDeviceTypes> plugins{};
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!config_.spec.has(t)) continue;
    DeviceBackend& parent = device_backend(t);
    // An offloaded parent (a suspended backend is kept) is re-created instead.
    if (!parent.backend || parent.state.load() == BackendState::kOffloaded ||
        plugin::abi_minor(parent.plugin->descriptor->abi_version) < 3) {
      return false;
    }
    DeviceBackend& cs = child.device_backend(t);
    cs.plugin = parent.plugin;
    cs.hints = routed[i];
    cs.device = parent.device;
    plugin::SplitDesc desc;
    desc.ranks = members;
    desc.child = child.init_for(t);
    const Status st = internal::call_plugin(parent.plugin->name, "shrink",
                                            [&] { return parent.backend->shrink(desc, &backends[i]); },
                                            backends[i], "child");
    if (st.code == ErrorCode::kUnsupported) return false;  // re-created instead; nothing was made
    if (!st.is_ok()) throw error(st.code, str::cat("shrink: ", parent.plugin->name, ": ", st.message), "shrink");
    plugins[i] = parent.plugin;
  }
  child.adopt_backends(std::move(backends), plugins);
  return true;
}

std::shared_ptr<Comm> Comm::Impl::shrink_to(const std::vector<int>& members, uint64_t epoch,
                                            const std::string& ns_suffix, const std::string& name_suffix) {
  int child_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == config_.rank) child_rank = static_cast<int>(i);
  }
  if (child_rank < 0) return nullptr;
  auto impl = make_derived(derived_config(static_cast<int>(members.size()), child_rank, epoch, ns_suffix, name_suffix),
                           elastic_.tickets_handled, [&](Impl& child) {
                             if (!shrink_natively(child, members)) child.create_backends();
                           });
  if (log::enabled(log::Level::kInfo)) {
    log::info(str::cat("shrunk comm '", config_.name, "' to '", impl->config().name, "' (ranks [",
                       str::join(members, ","), "]): ", impl->describe()));
  }
  return std::make_shared<Comm>(impl);
}

std::shared_ptr<Comm::Impl> Comm::Impl::make_derived(Config c, int64_t tickets_handled,
                                                     const std::function<void(Impl&)>& build) {
  c.name = register_unique(c.name);
  auto impl = std::make_shared<Impl>(c);
  impl->elastic_.tickets_handled = tickets_handled;
  try {
    build(*impl);
  } catch (...) {
    try {
      impl->abort("building it failed");
      impl->finalize();
    } catch (const std::exception& e) {
      log::error(str::cat("cleaning up after failing to build comm '", c.name, "': ", e.what()));
    }
    throw;
  }
  return impl;
}

}  // namespace comms
