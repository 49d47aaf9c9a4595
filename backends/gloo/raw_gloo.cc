#include "raw_gloo.h"

#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/alltoall.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "algorithms.h"
#include "reductions.h"
#include "send_buffers.h"
#include "store_adapter.h"
#include "sync_mesh.h"

namespace comms::gloo_backend {
namespace {

using plugin::OpType;

// --gloo-native: Gloo's own algorithm classes on the sync mesh, for the
// sizes where the backend runs its own algorithms there.
enum class Native : uint8_t { kNone, kAllgatherRing, kAllreduceRing, kBroadcastOneToAll, kBarrierAllToAll };

Native native_algorithm(OpType type, size_t bytes, int size) {
  switch (type) {
    case OpType::kBarrier:
      return Native::kBarrierAllToAll;
    case OpType::kAllReduce:
      if (bytes == 0 || bytes > kSyncPathMaxBytes) return Native::kNone;
      return bytes * static_cast<size_t>(size) <= kExchangeMaxBytes ? Native::kAllgatherRing
                                                                        : Native::kAllreduceRing;
    case OpType::kBroadcast:
      return bytes == 0 || bytes > kSyncPathMaxBytes ? Native::kNone : Native::kBroadcastOneToAll;
    default:
      return Native::kNone;
  }
}

}  // namespace

class RawGloo::Impl {
 public:
  int rank, size;
  std::chrono::milliseconds timeout;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> async_ctx, sync_ctx;
  bool native = false;
  std::unique_ptr<SyncMesh> mesh;  // the backend's sync-mesh algorithms
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

RawGloo::RawGloo(Store& store, int rank, int size, int local_size, std::chrono::milliseconds timeout,
                 std::string_view mode, Baseline baseline)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->size = size;
  impl_->timeout = timeout;
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  impl_->device = ::gloo::transport::tcp::CreateDevice(attr);
  for (auto* which : {&impl_->async_ctx, &impl_->sync_ctx}) {
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout);
    StoreAdapter a(store, which == &impl_->async_ctx ? "raw-async/" : "raw-sync/", timeout);
    ctx->connectFullMesh(a, impl_->device);
    *which = ctx;
  }
  for (int r = 0; r < size; ++r) {
    if (r != rank) impl_->sync_ctx->getPair(r)->setSync(true, mode == "1");
  }
  size_send_buffers(*impl_->sync_ctx, *impl_->async_ctx, timeout);
  impl_->native = baseline == Baseline::kGlooNative;
  impl_->mesh = std::make_unique<SyncMesh>(impl_->sync_ctx, read_spin(mode, local_size));
}

RawGloo::~RawGloo() {
  impl_->bound.clear();
  impl_->mesh.reset();
  impl_->async_ctx->closeConnections();
  impl_->sync_ctx->closeConnections();
}

std::string RawGloo::algorithm(OpType type, size_t bytes) const {
  if (!impl_->native) return std::string(algorithm_name(type, sync_algorithm_for(type, bytes, impl_->size)));
  switch (native_algorithm(type, bytes, impl_->size)) {
    case Native::kAllgatherRing: return "sync AllgatherRing + local reduce";
    case Native::kAllreduceRing: return "sync AllreduceRing";
    case Native::kBroadcastOneToAll: return "sync BroadcastOneToAll";
    case Native::kBarrierAllToAll: return "sync BarrierAllToAll";
    case Native::kNone: break;
  }
  return std::string(algorithm_name(type, SyncAlgorithm::kNone));
}

void RawGloo::run(OpType type, const void* input, void* output, size_t count, DataType dtype, ReduceKind kind,
                  int root, int peer) {
  auto& im = *impl_;
  const size_t es = element_size(dtype);
  const size_t bytes = count * es;
  auto* in = static_cast<uint8_t*>(const_cast<void*>(input));
  // Broadcast works in place on its one buffer, as Comm::broadcast does.
  auto* out = type == OpType::kBroadcast ? in : static_cast<uint8_t*>(output);
  if (!im.native) {
    switch (sync_algorithm_for(type, bytes, im.size)) {
      case SyncAlgorithm::kPipelinedRing:
      case SyncAlgorithm::kExchange:
        switch (type) {
          case OpType::kAllReduce: return im.mesh->all_reduce(in, out, count, es, reduce_fn(dtype, kind));
          case OpType::kReduce: return im.mesh->reduce(in, out, count, es, reduce_fn(dtype, kind), root);
          case OpType::kReduceScatter:
            return im.mesh->reduce_scatter(in, out, count, es, reduce_fn(dtype, kind));
          case OpType::kAllGather: return im.mesh->all_gather(in, out, bytes);
          case OpType::kAllToAll: return im.mesh->all_to_all(in, out, bytes);
          case OpType::kGather: return im.mesh->gather(in, out, bytes, root);
          case OpType::kScatter: return im.mesh->scatter(in, out, bytes, root);
          default: break;
        }
        break;
      case SyncAlgorithm::kBroadcast:
        return im.mesh->broadcast(in, out, bytes, root);
      case SyncAlgorithm::kBarrier:
        return im.mesh->barrier();
      case SyncAlgorithm::kNone:
        break;
    }
  }
  const Native native = im.native ? native_algorithm(type, bytes, im.size) : Native::kNone;
  const Impl::Key key{int(type), input, output, count, int(dtype), int(kind), root};
  switch (native) {
    case Native::kAllgatherRing: {
      auto& b = im.bound[key];
      if (!b.algorithm) {
        b.gathered.resize(bytes * static_cast<size_t>(im.size));
        with_element_type(es, [&](auto t) {
          using S = decltype(t);
          std::vector<const S*> ins = {reinterpret_cast<const S*>(in)};
          b.algorithm = std::make_unique<::gloo::AllgatherRing<S>>(im.sync_ctx, ins,
                                                                   reinterpret_cast<S*>(b.gathered.data()), int(count));
        });
      }
      b.algorithm->run();
      const ReduceFn fn = reduce_fn(dtype, kind);
      fn(out, b.gathered.data(), b.gathered.data() + bytes, count);
      for (int r = 2; r < im.size; ++r) fn(out, out, b.gathered.data() + r * bytes, count);
      return;
    }
    case Native::kAllreduceRing: {
      // In place on the output, as Gloo's ring works.
      if (out != in) std::memcpy(out, in, bytes);
      auto& b = im.bound[key];
      if (!b.algorithm) {
        with_element_type(es, [&](auto t) {
          using S = decltype(t);
          auto fn = std::make_shared<::gloo::ReductionFunction<S>>(::gloo::CUSTOM, in_place_fn<S>(dtype, kind));
          std::vector<S*> ptrs = {reinterpret_cast<S*>(out)};
          b.algorithm = std::make_unique<::gloo::AllreduceRing<S>>(im.sync_ctx, ptrs, int(count), fn.get());
          b.reduction = fn;
        });
      }
      b.algorithm->run();
      return;
    }
    case Native::kBroadcastOneToAll: {
      auto& b = im.bound[key];
      if (!b.algorithm) {
        with_element_type(es, [&](auto t) {
          using S = decltype(t);
          std::vector<S*> ptrs = {reinterpret_cast<S*>(out)};
          b.algorithm = std::make_unique<::gloo::BroadcastOneToAll<S>>(im.sync_ctx, ptrs, int(count), root);
        });
      }
      b.algorithm->run();
      return;
    }
    case Native::kBarrierAllToAll: {
      auto& b = im.bound[key];
      if (!b.algorithm) b.algorithm = std::make_unique<::gloo::BarrierAllToAll>(im.sync_ctx);
      b.algorithm->run();
      return;
    }
    case Native::kNone:
      break;
  }
  const auto& ctx = im.async_ctx;
  switch (type) {
    case OpType::kAllReduce:
      with_element_type(es, [&](auto t) {
        using S = decltype(t);
        ::gloo::AllreduceOptions o(ctx);
        if (in != out) o.setInput(reinterpret_cast<S*>(in), count);
        o.setOutput(reinterpret_cast<S*>(out), count);
        o.setReduceFunction(reduce_fn(dtype, kind));
        o.setTimeout(im.timeout);
        ::gloo::allreduce(o);
      });
      return;
    case OpType::kReduce:
      with_element_type(es, [&](auto t) {
        using S = decltype(t);
        ::gloo::ReduceOptions o(ctx);
        o.setRoot(root);
        if (in != out) o.setInput(reinterpret_cast<S*>(in), count);
        o.setOutput(reinterpret_cast<S*>(out), count);
        o.setReduceFunction(reduce_fn(dtype, kind));
        o.setTimeout(im.timeout);
        ::gloo::reduce(o);
      });
      return;
    case OpType::kBroadcast: {
      ::gloo::BroadcastOptions o(ctx);
      o.setRoot(root);
      o.setOutput(out, bytes);
      o.setTimeout(im.timeout);
      ::gloo::broadcast(o);
      return;
    }
    case OpType::kAllGather: {
      ::gloo::AllgatherOptions o(ctx);
      o.setInput(in, bytes);
      o.setOutput(out, bytes * im.size);
      o.setTimeout(im.timeout);
      ::gloo::allgather(o);
      return;
    }
    case OpType::kReduceScatter: {
      im.tmp.resize(bytes * im.size);
      ::gloo::AlltoallOptions o(ctx);
      o.setInput(in, bytes * im.size);
      o.setOutput(im.tmp.data(), bytes * im.size);
      o.setTimeout(im.timeout);
      ::gloo::alltoall(o);
      const ReduceFn fn = reduce_fn(dtype, kind);
      std::memcpy(out, im.tmp.data(), bytes);
      for (int r = 1; r < im.size; ++r) fn(out, out, im.tmp.data() + r * bytes, count);
      return;
    }
    case OpType::kAllToAll: {
      ::gloo::AlltoallOptions o(ctx);
      o.setInput(in, bytes * im.size);
      o.setOutput(out, bytes * im.size);
      o.setTimeout(im.timeout);
      ::gloo::alltoall(o);
      return;
    }
    case OpType::kGather: {
      ::gloo::GatherOptions o(ctx);
      o.setRoot(root);
      o.setInput(in, bytes);
      if (im.rank == root) o.setOutput(out, bytes * im.size);
      o.setTimeout(im.timeout);
      ::gloo::gather(o);
      return;
    }
    case OpType::kScatter: {
      ::gloo::ScatterOptions o(ctx);
      o.setRoot(root);
      if (im.rank == root) {
        std::vector<uint8_t*> ins(static_cast<size_t>(im.size));
        for (int r = 0; r < im.size; ++r) ins[static_cast<size_t>(r)] = in + r * bytes;
        o.setInputs(ins, bytes);
      }
      o.setOutput(out, bytes);
      o.setTimeout(im.timeout);
      ::gloo::scatter(o);
      return;
    }
    case OpType::kSend:
    case OpType::kRecv:
    case OpType::kBatchP2P: {
      auto s = ctx->createUnboundBuffer(in, bytes);
      auto r = ctx->createUnboundBuffer(out, bytes);
      const uint64_t slot = ::gloo::Slot::build(0x41, 0);
      s->send(peer, slot);
      r->recv(peer, slot);
      s->waitSend(im.timeout);
      r->waitRecv(im.timeout);
      return;
    }
    default:
      throw std::invalid_argument("raw gloo: op not benchmarked");
  }
}

}  // namespace comms::gloo_backend
