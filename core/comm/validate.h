// Argument checks of every op, done once in libcomms before a backend sees
// the op. Pure functions: they only read the arguments.
#pragma once

#include <span>
#include <string_view>

#include "comms/error.h"
#include "comms/plugin.h"
#include "comms/types.h"

namespace comms::internal {

struct OpArgs {
  plugin::OpType type = plugin::OpType::kBarrier;
  BufferView input;
  BufferView output;
  std::span<const BufferView> outputs;   // all_gather list form
  std::span<const size_t> counts;        // v-forms (input counts for all_to_all_v)
  std::span<const size_t> output_counts; // all_to_all_v
  std::span<const P2POp> p2p;
  ReduceOp reduce;
  int root = -1;
  int peer = -1;
};

struct Checked {
  size_t count = 0;        // OpDesc::count
  bool in_place = false;
  DeviceType device_type = DeviceType::kCpu;
  DataType dtype = DataType::kFloat32;
};

// Returns kInvalidArgument (or kUnsupported for an undefined reduction) with
// a message that names the argument, its value and what was expected.
Status validate(const OpArgs& args, int rank, int size, Checked* out);

// The op's buffers of `device`'s type must be on `device`, the one the comm's
// backend for that type (named `backend`) is bound to: a backend moves the
// memory of its own device only. An index of -1 on either side matches any.
Status check_device(const OpArgs& args, const Device& device, std::string_view backend);

}  // namespace comms::internal
