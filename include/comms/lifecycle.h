// Group lifecycle: offload and reload that preserve every creation option,
// and ownership-aware shutdown.
//
// Offload releases the communicators of some device types in every group
// (an RL trainer frees GPU memory while its inference engine runs): it
// suspends those whose backend can (NCCL >= 2.29: memory freed, communicator
// kept) and destroys the others. Reload resumes the suspended ones and
// replays each destroyed group's creation spec verbatim, in creation order,
// by the route it was created by. Both are idempotent, and any failure to destroy is
// raised: the caller never believes memory was freed when it was not.
//
//   comms::dist::Session session(init);             // owns the world it creates
//   ... train ...
//   auto report = comms::dist::offload_groups();    // every non-CPU backend
//   ... generate with the GPU memory back ...
//   comms::dist::reload_groups();                   // same timeouts, hints, streams
//
// Offload, reload and shutdown are collective: every rank calls them in the
// same order.
#pragma once

#include "comms/export.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comms/dist.h"

namespace comms::dist {

struct COMMS_API OffloadReport {
  int groups_offloaded = 0;         // groups with at least one backend released
  // Each underlying communicator once, by how it was released.
  int communicators_destroyed = 0;
  int communicators_suspended = 0;
  std::vector<std::string> groups;  // their names, in creation order
  // Device memory in use before and after (bytes), where measurable.
  std::optional<int64_t> device_memory_before;
  std::optional<int64_t> device_memory_after;
  // "offload: groups=2 destroyed=1 suspended=1 device_memory_before=n/a .."
  std::string to_string() const;
};

struct COMMS_API ReloadReport {
  int groups_reloaded = 0;
  int communicators_created = 0;  // re-created (they had been destroyed)
  int communicators_resumed = 0;  // resumed (they had been suspended)
};

// Releases the backends of `device_types` (default: every non-CPU type) in
// every group this process created. Ops on a released backend fail at once
// with an error that says it is offloaded and how to reload it.
COMMS_API OffloadReport offload_groups(const std::vector<DeviceType>& device_types = {});
// Resumes every suspended backend and re-creates every destroyed one from
// its group's spec.
COMMS_API ReloadReport reload_groups();

// Destroys what the library created (groups made while a Session was alive,
// and the world when a Session created it), in reverse creation order.
// Leaves what the application created intact. Idempotent.
COMMS_API void shutdown();

// RAII ownership of the process-group state. If no world exists, the
// session creates it and destroys it when it ends; if the application
// already initialised one, the session uses it and leaves it intact.
class COMMS_API Session {
 public:
  explicit Session(const InitOptions& options = {});
  ~Session();  // shutdown(); failures are logged (destructors cannot raise)
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool owns_world() const { return owns_world_; }
  Group world() const;

 private:
  bool owns_world_ = false;
};

}  // namespace comms::dist
