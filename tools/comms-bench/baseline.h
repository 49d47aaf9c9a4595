// What comms-bench times an op against: one op in the plugin ABI's shape,
// and the baselines that run it without libcomms (plugin_baseline.h: the
// comm's own plugin called directly; gloo_native.h: Gloo's own algorithm
// classes; raw_nccl.h: NCCL's API called directly).
#pragma once

#include <string>

#include "comms/plugin.h"
#include "comms/types.h"

namespace comms::bench {

// One op as comms-bench issues it, in plugin::OpDesc's conventions: `count`
// is OpDesc's count, pointers are the rank's buffers (device buffers on
// cuda), `in_place` follows OpDesc::in_place. kSend is comms-bench's
// send_recv: send `input` to `peer` and receive `output` from it at once.
struct BenchOp {
  plugin::OpType type = plugin::OpType::kBarrier;
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop;
  int root = 0;
  int peer = -1;
  bool in_place = false;
  Device device = Device::cpu();
  void* stream = nullptr;  // the bench's cudaStream_t on cuda
};

class Baseline {
 public:
  virtual ~Baseline() = default;
  // Runs one op until it is done as the comm's op would be (on cuda:
  // enqueued on op.stream); throws comms::Error naming what failed.
  virtual void run(const BenchOp& op) = 0;
  // What runs `op`, for the algorithm column; "" when unknown.
  virtual std::string algorithm(const BenchOp& op) const = 0;
  // The JSON's name of this baseline ("plugin:gloo", "gloo-native", "raw-nccl").
  virtual std::string name() const = 0;
  // Releases connections and memory before the comm is finalized; throws
  // comms::Error on a failure to release.
  virtual void finalize() = 0;
};

}  // namespace comms::bench
