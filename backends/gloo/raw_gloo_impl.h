// RawGloo's state, shared by raw_gloo.cc (the backend's own algorithms)
// and raw_gloo_native.cc (Gloo's algorithm classes and collectives).
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include "collectives.h"
#include "gloo_transport.h"
#include "op_rules.h"
#include "raw_gloo.h"

namespace comms::gloo_backend {

enum class Native : uint8_t { kNone, kAllgatherRing, kAllreduceRing, kBroadcastOneToAll, kBarrierAllToAll };

constexpr Native native_algorithm(plugin::OpType type, size_t bytes, int size) {
  switch (type) {
    case plugin::OpType::kBarrier:
      return Native::kBarrierAllToAll;
    case plugin::OpType::kAllReduce:
      if (bytes == 0 || bytes > kSyncPathMaxBytes) return Native::kNone;
      return bytes * static_cast<size_t>(size) <= kExchangeMaxBytes ? Native::kAllgatherRing
                                                                        : Native::kAllreduceRing;
    case plugin::OpType::kBroadcast:
      return bytes == 0 || bytes > kSyncPathMaxBytes ? Native::kNone : Native::kBroadcastOneToAll;
    default:
      return Native::kNone;
  }
}

class RawGloo::Impl {
 public:
  // --gloo-native: Gloo's algorithm class for the op, if it has one here.
  bool run_native(plugin::OpType type, uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceKind kind, int root);
  // Gloo's options-style collectives on the async mesh.
  void reduce_scatter_async(uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceKind kind);
  void run_async(plugin::OpType type, uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceKind kind, int root, int peer);

  int rank, size;
  std::chrono::milliseconds timeout;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> async_ctx, sync_ctx;
  bool native = false;
  std::unique_ptr<GlooTransport> transport;
  std::unique_ptr<cpu_algorithms::Collectives> mesh;  // the backend's CPU algorithms
  // Algorithm instances bound to the caller's buffers: every rank runs the
  // same sizes in the same order, so every rank builds them alike.
  using Key = std::tuple<int, const void*, void*, size_t, int, int, int>;
  struct Bound {
    std::unique_ptr<::gloo::Algorithm> algorithm;
    std::shared_ptr<void> reduction;
    std::vector<uint8_t> gathered;
  };
  std::map<Key, Bound> bound;
  std::vector<uint8_t> tmp;
};

}  // namespace comms::gloo_backend
