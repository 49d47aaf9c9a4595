#include "comms/lifecycle.h"

#include <algorithm>
#include <map>

#include "comm/comm_impl.h"
#include "dist_state.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

std::shared_ptr<GroupState> find_group(const std::vector<std::shared_ptr<GroupState>>& all, const std::string& name) {
  for (const auto& g : all) {
    if (g->spec.name == name && !g->destroyed) return g;
  }
  return nullptr;
}

std::optional<int64_t> device_memory(const std::vector<std::shared_ptr<GroupState>>& all,
                                     const std::vector<DeviceType>& types) {
  for (const auto& g : all) {
    if (!g->comm || g->destroyed) continue;
    for (DeviceType t : types) {
      const int64_t used = internal::CommAccess::impl(*g->comm).device_memory_used(t);
      if (used >= 0) return used;
    }
  }
  return std::nullopt;
}

std::vector<std::shared_ptr<GroupState>> live_groups() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<std::shared_ptr<GroupState>> out;
  for (const auto& g : reg.groups) {
    if (!g->destroyed) out.push_back(g);
  }
  return out;
}

}  // namespace

std::string OffloadReport::to_string() const {
  auto mem = [](const std::optional<int64_t>& v) { return v ? str::cat(*v) : std::string("n/a"); };
  return str::cat("offload: groups=", groups_offloaded, " destroyed=", communicators_destroyed,
                  " suspended=", communicators_suspended, " device_memory_before=", mem(device_memory_before),
                  " device_memory_after=", mem(device_memory_after));
}

OffloadReport offload_groups(const std::vector<DeviceType>& requested) {
  std::vector<DeviceType> types = requested;
  if (types.empty()) {
    for (int t = 0; t < kNumDeviceTypes; ++t) {
      if (static_cast<DeviceType>(t) != DeviceType::kCpu) types.push_back(static_cast<DeviceType>(t));
    }
  }
  const auto all = live_groups();
  OffloadReport report;
  report.device_memory_before = device_memory(all, types);
  std::vector<std::string> failures;
  ErrorCode first = ErrorCode::kOk;
  std::set<std::pair<const Comm*, DeviceType>> seen;  // each communicator once
  for (const auto& g : all) {
    bool released = false;
    for (DeviceType t : types) {
      if (!BackendSpec::parse(g->spec.backend).has(t)) continue;
      g->offloaded.insert(t);
      if (!g->comm || !seen.insert({g->comm.get(), t}).second) continue;
      try {
        if (g->comm->offload_backend(t)) {
          if (internal::CommAccess::impl(*g->comm).suspended(t)) ++report.communicators_suspended;
          else ++report.communicators_destroyed;
          released = true;
        }
      } catch (const Error& e) {
        if (first == ErrorCode::kOk) first = e.code();
        failures.push_back(str::cat("group '", g->spec.name, "': ", e.what()));
      }
    }
    if (released) {
      ++report.groups_offloaded;
      report.groups.push_back(g->spec.name);
    }
  }
  report.device_memory_after = device_memory(all, types);
  if (!failures.empty()) {
    throw Error(first, str::cat("comms::dist offload_groups failed to release ", failures.size(),
                                " communicator(s); their memory may still be in use: ",
                                str::join(failures, "; ")));
  }
  log::info(report.to_string());
  return report;
}

ReloadReport reload_groups() {
  const auto all = live_groups();
  ReloadReport report;
  // A suspended backend resumes by either route (Comm::Impl::reload and
  // reload_by_split): count it as resumed, not re-created.
  auto count = [&report](bool was_suspended) {
    ++(was_suspended ? report.communicators_resumed : report.communicators_created);
  };
  for (const auto& g : all) {
    if (g->offloaded.empty()) continue;
    bool recreated = false;
    for (DeviceType t : std::vector<DeviceType>(g->offloaded.begin(), g->offloaded.end())) {
      const bool suspended = g->comm && internal::CommAccess::impl(*g->comm).suspended(t);
      const bool is_world = g->spec.parent.empty();
      if (is_world || g->spec.route == Route::kDirect) {
        if (g->comm && g->comm->reload_backend(t)) {
          count(suspended);
          recreated = true;
        }
        continue;
      }
      // Split route: split the (already reloaded) parent again. Collective
      // over the parent, so non-members of this group take part too.
      auto parent = find_group(all, g->spec.parent);
      if (!parent) {
        throw Error(ErrorCode::kInternal,
                    str::cat("comms::dist reload: group '", g->spec.name, "' has lost its parent '",
                             g->spec.parent, "'"));
      }
      if (!parent->comm) continue;  // not in the parent: not part of its split
      std::vector<int> parent_ranks;
      if (g->comm) {
        for (int global : g->spec.ranks) {
          auto it = std::find(parent->spec.ranks.begin(), parent->spec.ranks.end(), global);
          parent_ranks.push_back(static_cast<int>(it - parent->spec.ranks.begin()));
        }
      }
      const bool member_needs_it = g->comm && g->comm->backend_state(t) == BackendState::kOffloaded;
      Comm::Impl::reload_by_split(g->comm ? &internal::CommAccess::impl(*g->comm) : nullptr,
                                  internal::CommAccess::impl(*parent->comm), t, parent_ranks);
      if (member_needs_it) {
        count(suspended);
        recreated = true;
      }
    }
    g->offloaded.clear();
    if (recreated) ++report.groups_reloaded;
  }
  return report;
}

void shutdown() {
  auto& reg = registry();
  std::vector<std::shared_ptr<GroupState>> owned;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (const auto& g : reg.groups) {
      if (g->library_owned && !g->destroyed) owned.push_back(g);
    }
  }
  std::vector<std::string> failures;
  ErrorCode first = ErrorCode::kOk;
  for (auto it = owned.rbegin(); it != owned.rend(); ++it) {
    try {
      destroy_state(**it);
    } catch (const Error& e) {
      if (first == ErrorCode::kOk) first = e.code();
      failures.push_back(e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    std::erase_if(reg.groups, [](const auto& g) { return g->destroyed; });
    if (reg.world && reg.world->destroyed) reg.world.reset();
  }
  if (!failures.empty()) {
    throw Error(first == ErrorCode::kOk ? ErrorCode::kInternal : first,
                str::cat("comms::dist shutdown: ", str::join(failures, "; ")));
  }
}

Session::Session(const InitOptions& options) {
  auto& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    ++reg.sessions;
  }
  if (!is_initialized()) {
    try {
      init_process_group(options);
    } catch (...) {
      std::lock_guard<std::mutex> lock(reg.mu);
      --reg.sessions;
      throw;
    }
    owns_world_ = true;
  }
}

Session::~Session() {
  auto& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    --reg.sessions;
  }
  try {
    shutdown();
  } catch (const std::exception& e) {
    log::error(str::cat("comms::dist::Session: ", e.what()));
  }
}

Group Session::world() const { return dist::world(); }

}  // namespace comms::dist
