// The process-wide state behind comms::dist (internal).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comms/dist.h"

namespace comms::dist {

class GroupState {
 public:
  GroupSpec spec;
  std::shared_ptr<Comm> comm;   // null on ranks that are not members
  std::optional<Device> device; // the bound device, kept for replays
  bool destroyed = false;
};

struct Registry {
  std::mutex mu;
  std::shared_ptr<GroupState> world;
  std::vector<std::shared_ptr<GroupState>> groups;  // creation order, world first
  uint64_t next_index = 0;
  int next_name = 0;  // pg<N>: every rank counts every new_group call alike
  Route route = Route::kDirect;
};

Registry& registry();
void destroy_state(GroupState& s);

}  // namespace comms::dist
