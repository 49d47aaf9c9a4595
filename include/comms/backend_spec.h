// Backend strings, with the rules users know from PyTorch c10d:
//   "gloo"                -> every device type the gloo plugin supports (cpu)
//   "nccl"                -> cuda
//   "cpu:gloo,cuda:nccl"  -> explicit pairs
//   "" or "undefined"     -> cpu:gloo, plus cuda:nccl when a CUDA device and
//                            the nccl plugin are present
// Case and whitespace around items are ignored.
#pragma once

#include "comms/export.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "comms/types.h"

namespace comms {

// What parsing needs to know about one available plugin.
struct PluginCapabilities {
  std::string name;
  uint32_t device_types = 0;         // bitmask of 1 << DeviceType
  uint32_t devices_present = 0;      // types with at least one usable device
};

class COMMS_API BackendSpec {
 public:
  BackendSpec() = default;

  // Parses against the plugins found at run time. Throws
  // comms::Error(kInvalidArgument) naming the offending part, or
  // comms::Error(kNotFound) for a backend no plugin provides (listing the
  // available ones).
  static BackendSpec parse(std::string_view text);
  // The same against an explicit list of plugins (tools and tests).
  static BackendSpec parse(std::string_view text, std::span<const PluginCapabilities> plugins);

  // "cpu:gloo,cuda:nccl", device types in enum order; "" when empty.
  std::string to_string() const;

  // A split's filter against this (the parent's) map: the entries that
  // `filter` names, as "backend" (every device type the parent gives it) or
  // "device:backend" items separated by commas; case, whitespace and blank
  // items are ignored. Throws comms::Error(kInvalidArgument) naming an item
  // the parent does not have.
  BackendSpec select(std::string_view filter) const;

  bool empty() const;
  bool has(DeviceType t) const { return !entries_[index(t)].empty(); }
  // The backend name for a device type, or "" if none.
  const std::string& backend_for(DeviceType t) const { return entries_[index(t)]; }
  void set(DeviceType t, std::string backend) { entries_[index(t)] = std::move(backend); }
  void erase(DeviceType t) { entries_[index(t)].clear(); }

  friend bool operator==(const BackendSpec&, const BackendSpec&) = default;

 private:
  static size_t index(DeviceType t) { return static_cast<size_t>(t); }
  std::array<std::string, kNumDeviceTypes> entries_;
};

}  // namespace comms
