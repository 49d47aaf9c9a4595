// What FakeNcclApi (nccl_test_support.h) records of the plugin's calls:
// the configs, NCCL calls, CUDA graph nodes, shrinks and grows. Header-only.
#pragma once

#include <string>
#include <vector>

#include "nccl_api.h"

namespace comms::nccl::testing {

// A copy of the config the plugin passed (NcclConfig, ncclConfig_t's
// layout) whose strings outlive the call.
struct CapturedConfig {
  NcclConfig config;
  std::string net_name;
  std::string comm_name;
  bool has_net_name = false;
  bool has_comm_name = false;
};

struct NcclCall {
  std::string name;
  const void* in = nullptr;
  const void* out = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclInt8;
  ncclRedOp_t op = ncclSum;
  int root_or_peer = -1;
  cudaStream_t stream = nullptr;
  bool captured = false;  // recorded into a graph instead of running
  ncclComm_t comm = nullptr;  // the communicator (NCCL ops, shrink, revoke, abort, destroy)
  // One-sided ops: the window, the byte offset into the peer's, and what
  // ncclWaitSignal was asked to wait for.
  ncclWindow_t window = nullptr;
  size_t offset = 0;
  std::vector<WaitSignalDesc> waits{};
};

// What a fake CUDA graph holds, in capture order: NCCL calls, event records
// and memsets, each replayed by graph_launch.
struct GraphNode {
  NcclCall call;  // name "event_record" / "memset" for those nodes
  cudaEvent_t event = nullptr;
  void* ptr = nullptr;
  int value = 0;
  size_t bytes = 0;
};

// An ncclCommShrink call.
struct ShrinkCall {
  ncclComm_t parent = nullptr;
  std::vector<int> exclude;
  int flags = -1;
  CapturedConfig config;
  ncclComm_t child = nullptr;
};
// An ncclCommGrow call: the parent (null on a newcomer), the grown size,
// the id passed (empty when null), the rank (-1 on a member).
struct GrowCall {
  ncclComm_t parent = nullptr;
  int nranks = 0;
  std::string id;
  int rank = -2;
  CapturedConfig config;
  ncclComm_t child = nullptr;
};
// `c` with its strings copied out (the plugin's outlive only the call).
inline CapturedConfig capture_config(const NcclConfig& c) {
  CapturedConfig out;
  out.config = c;
  if (c.netName) out.net_name = c.netName, out.has_net_name = true;
  if (c.commName) out.comm_name = c.commName, out.has_comm_name = true;
  out.config.netName = nullptr;
  out.config.commName = nullptr;
  return out;
}

}  // namespace comms::nccl::testing
