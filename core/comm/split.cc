// Comm::split and split_group: checking the members, the child's config,
// and splitting each backend of the parent (collective over the parent).
#include <set>

#include "comm/comm_impl.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

namespace {

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

Error split_error(const Comm::Impl& parent, ErrorCode code, const std::string& name, const std::string& why) {
  return parent.error(code, str::cat("split '", name, "': ", why), "split");
}

}  // namespace

void Comm::Impl::check_split_members(const std::vector<int>& members, const std::string& name,
                                     int* child_rank) const {
  *child_rank = -1;
  std::set<int> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    const int r = members[i];
    if (r < 0 || r >= config_.size) {
      throw split_error(*this, ErrorCode::kInvalidArgument,  name,
                        str::cat("rank ", r, " is outside the parent (size ", config_.size, ")"));
    }
    if (!seen.insert(r).second) {
      throw split_error(*this, ErrorCode::kInvalidArgument, name,
                        str::cat("rank ", r, " appears twice in [", str::join(members, ","), "]"));
    }
    if (r == config_.rank) *child_rank = static_cast<int>(i);
  }
  if (!members.empty() && *child_rank < 0) {
    throw split_error(*this, ErrorCode::kInvalidArgument, name,
                      str::cat("this rank (", config_.rank, ") is not in its own list [", str::join(members, ","),
                               "]; non-members pass an empty list"));
  }
}

BackendSpec Comm::Impl::split_spec(const SplitOptions& opts, const std::string& name) const {
  // The filter names a subset of the parent's backends; it is checked
  // against the parent's map, so no plugin lookup can mask the real reason.
  BackendSpec child_spec = config_.spec;
  if (!opts.backend.empty()) {
    try {
      child_spec = config_.spec.select(opts.backend);
    } catch (const Error& e) {
      throw split_error(*this, e.code(), name, e.what());
    }
  }
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!child_spec.has(t)) continue;
    const BackendState st = device_backend(t).state.load();
    if (st == BackendState::kFailed || st == BackendState::kOffloaded) {
      throw split_error(*this, ErrorCode::kAborted, name,
                        str::cat("the parent's ", to_string(t), " backend is ", to_string(st)));
    }
  }
  return child_spec;
}

Comm::Impl::Config Comm::Impl::child_config(const std::vector<int>& members, int child_rank,
                                            const BackendSpec& spec, const std::string& name,
                                            const SplitOptions& opts) const {
  Config child;
  child.name = name.empty() ? str::cat(config_.name, "/split-", members_digest(members)) : name;
  const std::string ns_base = str::cat(config_.rendezvous_ns, "/", child.name, "[", members_digest(members), "]");
  child.rendezvous_ns = str::cat(ns_base, "/i", internal::next_incarnation(ns_base));
  child.rank = child_rank;
  child.size = static_cast<int>(members.size());
  child.local_rank = config_.local_rank;
  child.local_size = config_.local_size;
  child.spec = spec;
  if (config_.bound_device && spec.has(config_.bound_device->type)) child.bound_device = config_.bound_device;
  child.init_timeout = opts.init_timeout.value_or(config_.init_timeout);
  child.op_timeout = opts.op_timeout.value_or(config_.op_timeout);
  child.hints = config_.hints;
  for (const auto& [k, v] : opts.hints) child.hints[k] = v;
  child.abort_process_on_error = opts.abort_process_on_error.value_or(config_.abort_process_on_error);
  child.elastic = config_.elastic;
  child.store = config_.store;
  child.store_local_address = config_.store_local_address;
  return child;
}

void Comm::Impl::split_backends(const Config& child, const std::vector<int>& members, Impl* impl,
                                std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes>* backends,
                                std::array<const internal::LoadedPlugin*, kNumDeviceTypes>* plugins) {
  auto routed = internal::route_hints(child.hints, child.spec, child.name);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!child.spec.has(t)) continue;
    DeviceBackend& parent = device_backend(t);
    plugin::SplitDesc desc;
    desc.ranks = members;
    if (impl) {
      DeviceBackend& cs = impl->device_backend(t);
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
    auto& out = (*backends)[i];
    const auto call = [&] { return parent.backend->split(desc, &out); };
    const Status st = impl ? internal::call_plugin(parent.plugin->name, "split", call, out, "child for a member")
                           : internal::call_plugin(parent.plugin->name, "split", call);
    if (!st.is_ok()) throw split_error(*this, st.code, child.name, str::cat(parent.plugin->name, ": ", st.message));
    (*plugins)[i] = parent.plugin;
  }
}

std::shared_ptr<Comm> Comm::Impl::split(std::span<const int> ranks, const std::string& name,
                                        const SplitOptions& opts) {
  const std::vector<int> members(ranks.begin(), ranks.end());
  int child_rank = -1;
  check_split_members(members, name, &child_rank);
  const BackendSpec child_spec = split_spec(opts, name);
  const Config child = child_config(members, child_rank, child_spec, name, opts);

  std::shared_ptr<Impl> impl;
  if (!members.empty()) {
    internal::register_comm_name(child.name);
    impl = std::make_shared<Impl>(child);
  }
  std::array<std::unique_ptr<plugin::Backend>, kNumDeviceTypes> backends;
  std::array<const internal::LoadedPlugin*, kNumDeviceTypes> plugins{};
  try {
    split_backends(child, members, impl.get(), &backends, &plugins);
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

// ---------------------------------------------------------------------------

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
                    str::cat(impl_->prefix(), " split_group '", name, "': rank ", r,
                             " is outside the parent (size ", size(), ")"));
      }
      if (!seen.insert(r).second) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat(impl_->prefix(), " split_group '", name, "': rank ", r,
                             " is in more than one group (groups must be disjoint)"));
      }
      if (r == rank()) mine = &g;
    }
  }
  static const std::vector<int> kNone;
  return impl_->split(mine ? *mine : kNone, name, opts);
}

}  // namespace comms
