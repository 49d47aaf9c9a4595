// The algorithm column: which path a backend runs an op on, as the backend
// itself reports it. A backend may list in its describe() JSON a "paths"
// object mapping an op name ("all_reduce") to an ascending array of
// {"max_bytes": <inclusive bound on the bytes per rank, or null for no
// bound>, "path": "<name>"}; comms-bench looks a row's size up there and
// never works out a backend's choice itself. A backend that lists nothing
// (or a malformed list) leaves the column empty.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "comms/types.h"

namespace comms::bench {

class BackendPaths {
 public:
  BackendPaths() = default;
  // The "paths" of the backend serving `device` in a comm's describe()
  // (parsed): described["backends"][<device type>]["config"]["paths"].
  static BackendPaths from_describe(const nlohmann::json& described, DeviceType device);
  explicit BackendPaths(nlohmann::json paths) : paths_(std::move(paths)) {}

  // The path of `op` at `bytes_per_rank`: the first entry whose max_bytes
  // is null or at least that; "" when the backend does not say.
  std::string path(std::string_view op, size_t bytes_per_rank) const;

 private:
  nlohmann::json paths_;
};

// The ops the backend serving `device` ran on its zero-copy path so far,
// where its describe() counts them (cpu:ucx: config.zero_copy.ops): a row
// that ran every op there says so in the column (-R 1).
std::optional<int64_t> zero_copy_ops(const nlohmann::json& described, DeviceType device);

}  // namespace comms::bench
