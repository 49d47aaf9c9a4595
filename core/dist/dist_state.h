// The process-wide state behind comms::dist (internal).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "comms/dist.h"

namespace comms::dist {

class GroupState {
 public:
  GroupSpec spec;
  std::shared_ptr<Comm> comm;   // null on ranks that are not members
  std::optional<Device> device; // the bound device, kept for replays
  bool destroyed = false;
  // Created while a Session was alive (or the world a Session created):
  // shutdown() destroys exactly these.
  bool library_owned = false;
  // Device types released by offload_groups and not yet reloaded. Kept on
  // non-members too, so every rank replays the same collective splits.
  std::set<DeviceType> offloaded;
};

struct Registry {
  std::mutex mu;
  std::shared_ptr<GroupState> world;
  std::vector<std::shared_ptr<GroupState>> groups;  // creation order, world first
  uint64_t next_index = 0;
  int next_name = 0;  // pg<N>: every rank counts every new_group call alike
  Route route = Route::kDirect;
  int sessions = 0;  // live Session objects
};

Registry& registry();
void destroy_state(GroupState& s);

}  // namespace comms::dist
