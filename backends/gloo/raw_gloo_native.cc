// comms-bench's --gloo-native baseline (Gloo's own algorithm classes on the
// sync mesh) and the ops the backend runs with Gloo's collectives.
#include <cstring>

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
#include <gloo/scatter.h>
#include <gloo/types.h>

#include "raw_gloo_impl.h"
#include "reductions.h"

namespace comms::gloo_backend {

using namespace cpu_algorithms;
using plugin::OpType;

bool RawGloo::Impl::run_native(OpType type, uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceKind kind,
                               int root) {
  const size_t es = element_size(dtype);
  const size_t bytes = count * es;
  const Key key{int(type), in, out, count, int(dtype), int(kind), root};
  switch (native_algorithm(type, bytes, size)) {
    case Native::kAllgatherRing: {
      auto& b = bound[key];
      if (!b.algorithm) {
        b.gathered.resize(bytes * static_cast<size_t>(size));
        with_element_type(es, [&](auto t) {
          using S = decltype(t);
          std::vector<const S*> ins = {reinterpret_cast<const S*>(in)};
          b.algorithm = std::make_unique<::gloo::AllgatherRing<S>>(sync_ctx, ins,
                                                                   reinterpret_cast<S*>(b.gathered.data()), int(count));
        });
      }
      b.algorithm->run();
      const ReduceFn fn = reduce_fn(dtype, kind);
      fn(out, b.gathered.data(), b.gathered.data() + bytes, count);
      for (int r = 2; r < size; ++r) fn(out, out, b.gathered.data() + r * bytes, count);
      return true;
    }
    case Native::kAllreduceRing: {
      // In place on the output, as Gloo's ring works.
      if (out != in) std::memcpy(out, in, bytes);
      auto& b = bound[key];
      if (!b.algorithm) {
        with_element_type(es, [&](auto t) {
          using S = decltype(t);
          auto fn = std::make_shared<::gloo::ReductionFunction<S>>(::gloo::CUSTOM, in_place_fn<S>(dtype, kind));
          std::vector<S*> ptrs = {reinterpret_cast<S*>(out)};
          b.algorithm = std::make_unique<::gloo::AllreduceRing<S>>(sync_ctx, ptrs, int(count), fn.get());
          b.reduction = fn;
        });
      }
      b.algorithm->run();
      return true;
    }
    case Native::kBroadcastOneToAll: {
      auto& b = bound[key];
      if (!b.algorithm) {
        with_element_type(es, [&](auto t) {
          using S = decltype(t);
          std::vector<S*> ptrs = {reinterpret_cast<S*>(out)};
          b.algorithm = std::make_unique<::gloo::BroadcastOneToAll<S>>(sync_ctx, ptrs, int(count), root);
        });
      }
      b.algorithm->run();
      return true;
    }
    case Native::kBarrierAllToAll: {
      auto& b = bound[key];
      if (!b.algorithm) b.algorithm = std::make_unique<::gloo::BarrierAllToAll>(sync_ctx);
      b.algorithm->run();
      return true;
    }
    case Native::kNone:
      break;
  }
  return false;
}

// As the backend: an all-to-all, then a local reduction.
void RawGloo::Impl::reduce_scatter_async(uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceKind kind) {
  const size_t bytes = count * element_size(dtype);
  tmp.resize(bytes * size);
  ::gloo::AlltoallOptions o(async_ctx);
  o.setInput(in, bytes * size);
  o.setOutput(tmp.data(), bytes * size);
  o.setTimeout(timeout);
  ::gloo::alltoall(o);
  const ReduceFn fn = reduce_fn(dtype, kind);
  std::memcpy(out, tmp.data(), bytes);
  for (int r = 1; r < size; ++r) fn(out, out, tmp.data() + r * bytes, count);
}

void RawGloo::Impl::run_async(OpType type, uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceKind kind,
                              int root, int peer) {
  const size_t es = element_size(dtype);
  const size_t bytes = count * es;
  const auto& ctx = async_ctx;
  switch (type) {
    case OpType::kAllReduce:
      with_element_type(es, [&](auto t) {
        using S = decltype(t);
        ::gloo::AllreduceOptions o(ctx);
        if (in != out) o.setInput(reinterpret_cast<S*>(in), count);
        o.setOutput(reinterpret_cast<S*>(out), count);
        o.setReduceFunction(reduce_fn(dtype, kind));
        o.setTimeout(timeout);
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
        o.setTimeout(timeout);
        ::gloo::reduce(o);
      });
      return;
    case OpType::kBroadcast: {
      ::gloo::BroadcastOptions o(ctx);
      o.setRoot(root);
      o.setOutput(out, bytes);
      o.setTimeout(timeout);
      ::gloo::broadcast(o);
      return;
    }
    case OpType::kAllGather: {
      ::gloo::AllgatherOptions o(ctx);
      o.setInput(in, bytes);
      o.setOutput(out, bytes * size);
      o.setTimeout(timeout);
      ::gloo::allgather(o);
      return;
    }
    case OpType::kReduceScatter:
      return reduce_scatter_async(in, out, count, dtype, kind);
    case OpType::kAllToAll: {
      ::gloo::AlltoallOptions o(ctx);
      o.setInput(in, bytes * size);
      o.setOutput(out, bytes * size);
      o.setTimeout(timeout);
      ::gloo::alltoall(o);
      return;
    }
    case OpType::kGather: {
      ::gloo::GatherOptions o(ctx);
      o.setRoot(root);
      o.setInput(in, bytes);
      if (rank == root) o.setOutput(out, bytes * size);
      o.setTimeout(timeout);
      ::gloo::gather(o);
      return;
    }
    case OpType::kScatter: {
      ::gloo::ScatterOptions o(ctx);
      o.setRoot(root);
      if (rank == root) {
        std::vector<uint8_t*> ins(static_cast<size_t>(size));
        for (int r = 0; r < size; ++r) ins[static_cast<size_t>(r)] = in + r * bytes;
        o.setInputs(ins, bytes);
      }
      o.setOutput(out, bytes);
      o.setTimeout(timeout);
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
      s->waitSend(timeout);
      r->waitRecv(timeout);
      return;
    }
    default:
      throw std::invalid_argument("raw gloo: op not benchmarked");
  }
}


}  // namespace comms::gloo_backend
