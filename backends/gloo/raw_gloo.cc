#include "raw_gloo.h"

#include "sockets.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "raw_gloo_impl.h"
#include "op_rules.h"
#include "plan.h"
#include "reductions.h"
#include "send_buffers.h"
#include "store_adapter.h"

namespace comms::gloo_backend {

using cpu_algorithms::reduce_fn;
using plugin::OpType;

RawGloo::RawGloo(Store& store, int rank, int size, int local_size, std::chrono::milliseconds timeout,
                 std::string_view mode, Baseline baseline)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->size = size;
  impl_->timeout = timeout;
  impl_->native = baseline == Baseline::kGlooNative;
  // One rank has nothing to connect, and Gloo's algorithm classes need a
  // pair: run() does what the backend does there (a copy) without meshes.
  if (size == 1) return;
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  impl_->device = ::gloo::transport::tcp::CreateDevice(attr);
  const SocketFds sockets_before = socket_fds();
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
  impl_->transport =
      std::make_unique<GlooTransport>(impl_->sync_ctx, read_spin(mode, local_size), sockets_opened_since(sockets_before));
  impl_->mesh = std::make_unique<cpu_algorithms::Collectives>(*impl_->transport, timeout);
}

RawGloo::~RawGloo() {
  impl_->bound.clear();
  impl_->mesh.reset();
  impl_->transport.reset();
  if (impl_->async_ctx) impl_->async_ctx->closeConnections();
  if (impl_->sync_ctx) impl_->sync_ctx->closeConnections();
}

std::string RawGloo::algorithm(OpType type, size_t bytes) const {
  if (impl_->size == 1) return "one-rank copy";
  if (!impl_->native) return std::string(path_name(type, plan(type, bytes, {impl_->size, true})));
  switch (native_algorithm(type, bytes, impl_->size)) {
    case Native::kAllgatherRing: return "sync AllgatherRing + local reduce";
    case Native::kAllreduceRing: return "sync AllreduceRing";
    case Native::kBroadcastOneToAll: return "sync BroadcastOneToAll";
    case Native::kBarrierAllToAll: return "sync BarrierAllToAll";
    case Native::kNone: break;
  }
  return std::string(path_name(type, Plan{Path::kGlooNative}));
}

void RawGloo::run(OpType type, const void* input, void* output, size_t count, DataType dtype, ReduceKind kind,
                  int root, int peer) {
  auto& im = *impl_;
  const size_t es = element_size(dtype);
  const size_t bytes = count * es;
  auto* in = static_cast<uint8_t*>(const_cast<void*>(input));
  // Broadcast works in place on its one buffer, as Comm::broadcast does.
  auto* out = type == OpType::kBroadcast ? in : static_cast<uint8_t*>(output);
  if (im.size == 1) {  // as the backend's one-rank comm (its plan: the one-rank copy)
    plugin::OpDesc d;
    d.type = type;
    d.input = in;
    d.output = out;
    d.count = count;
    d.dtype = dtype;
    d.reduce.kind = kind;
    d.root = root;
    d.peer = peer;
    d.in_place = in == out;
    return cpu_algorithms::run_on_one_rank(d);
  }
  if (!im.native) {
    const Algorithm a = plan(type, bytes, {im.size, true}).algorithm;
    switch (a) {
      case Algorithm::kPipelinedRing:
      case Algorithm::kExchange:
        switch (type) {
          case OpType::kAllReduce: return im.mesh->all_reduce(a, in, out, count, es, reduce_fn(dtype, kind));
          case OpType::kReduce: return im.mesh->reduce(a, in, out, count, es, reduce_fn(dtype, kind), root);
          case OpType::kReduceScatter:
            return im.mesh->reduce_scatter(a, in, out, count, es, reduce_fn(dtype, kind));
          case OpType::kAllGather: return im.mesh->all_gather(a, in, out, bytes);
          case OpType::kAllToAll: return im.mesh->all_to_all(in, out, bytes);
          case OpType::kGather: return im.mesh->gather(in, out, bytes, root);
          case OpType::kScatter: return im.mesh->scatter(in, out, bytes, root);
          default: break;
        }
        break;
      case Algorithm::kBroadcast:
        return im.mesh->broadcast(a, in, out, bytes, root);
      case Algorithm::kBarrier:
        return im.mesh->barrier();
      case Algorithm::kDirectCopies:  // only on a transport that sends in place
      case Algorithm::kNone:
        break;
    }
  }
  if (im.native && im.run_native(type, in, out, count, dtype, kind, root)) return;
  im.run_async(type, in, out, count, dtype, kind, root, peer);
}

}  // namespace comms::gloo_backend
