// Gloo's options-style collectives on the async mesh: every op the CPU
// algorithms do not run (op_rules.h).
#include "gloo_ops.h"

#include <algorithm>
#include <cstring>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>
#include <gloo/types.h>

#include "reductions.h"

namespace comms::gloo_backend {

using namespace cpu_algorithms;  // reduce_fn, finish_reduction, with_element_type
using plugin::OpType;
using Clock = std::chrono::steady_clock;

// Slot prefix for point-to-point messages; Gloo's collectives use 0x01..0x0f.
constexpr uint8_t kP2PSlotPrefix = 0x40;

void* AsyncOps::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}


void AsyncOps::all_reduce(const plugin::OpDesc& op) {
  const ReduceFn fn = reduce_fn(op.dtype, op.reduce.kind);
  with_element_type(element_size(op.dtype), [&](auto tag) {
    using T = decltype(tag);
    ::gloo::AllreduceOptions o(ctx_);
    if (!op.in_place) o.setInput(static_cast<T*>(const_cast<void*>(op.input)), op.count);
    o.setOutput(static_cast<T*>(op.output), op.count);
    o.setReduceFunction(fn);
    o.setTimeout(op.timeout);
    ::gloo::allreduce(o);
  });
  finish_reduction(op, op.output, op.count, size_);
}

void AsyncOps::reduce(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  // Gloo's ring reduce needs an output buffer on every rank.
  void* out = op.output != nullptr ? op.output : scratch(bytes);
  const bool in_place = op.input == out;
  with_element_type(element_size(op.dtype), [&](auto tag) {
    using T = decltype(tag);
    ::gloo::ReduceOptions o(ctx_);
    o.setRoot(op.root);
    if (!in_place) o.setInput(static_cast<T*>(const_cast<void*>(op.input)), op.count);
    o.setOutput(static_cast<T*>(out), op.count);
    o.setReduceFunction(reduce_fn(op.dtype, op.reduce.kind));
    o.setTimeout(op.timeout);
    ::gloo::reduce(o);
  });
  if (rank_ == op.root) finish_reduction(op, out, op.count, size_);
}

void AsyncOps::all_gather(const plugin::OpDesc& op, void* output) {
  const size_t es = element_size(op.dtype);
  ::gloo::AllgatherOptions o(ctx_);
  const bool in_place = output == op.output && op.in_place;
  if (!in_place) o.setInput(static_cast<uint8_t*>(const_cast<void*>(op.input)), op.count * es);
  o.setOutput(static_cast<uint8_t*>(output), op.count * es * size_);
  o.setTimeout(op.timeout);
  ::gloo::allgather(o);
}

void AsyncOps::all_to_all_v(const plugin::OpDesc& op, const void* input,
                               std::span<const size_t> in_counts, std::span<const size_t> out_counts) {
  const size_t es = element_size(op.dtype);
  std::vector<int64_t> in_bytes(in_counts.size()), out_bytes(out_counts.size());
  for (size_t i = 0; i < in_counts.size(); ++i) in_bytes[i] = static_cast<int64_t>(in_counts[i] * es);
  for (size_t i = 0; i < out_counts.size(); ++i) out_bytes[i] = static_cast<int64_t>(out_counts[i] * es);
  ::gloo::AlltoallvOptions o(ctx_);
  o.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), in_bytes);
  o.setOutput(static_cast<uint8_t*>(op.output), out_bytes);
  o.setTimeout(op.timeout);
  ::gloo::alltoallv(o);
}

// Debian's Gloo has no options-style reduce_scatter: exchange the blocks with
// one all-to-all and reduce locally, which moves each element once (an
// all_reduce of the whole buffer would move it twice and reduce it size times).
void AsyncOps::reduce_scatter(const plugin::OpDesc& op, std::span<const size_t> counts) {
  const size_t es = element_size(op.dtype);
  const int n = size_;
  const size_t mine = counts[static_cast<size_t>(rank_)];
  std::vector<size_t> recv_counts(static_cast<size_t>(n), mine);
  uint8_t* tmp = static_cast<uint8_t*>(scratch(mine * es * static_cast<size_t>(n)));
  plugin::OpDesc exchange = op;
  exchange.output = tmp;
  all_to_all_v(exchange, op.input, counts, recv_counts);
  const ReduceFn fn = reduce_fn(op.dtype, op.reduce.kind);
  if (mine == 0) return;  // a _v op may give this rank nothing (and a null output)
  std::memcpy(op.output, tmp, mine * es);
  for (int r = 1; r < n; ++r) fn(op.output, op.output, tmp + static_cast<size_t>(r) * mine * es, mine);
  finish_reduction(op, op.output, mine, size_);
}

void AsyncOps::gather(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  const void* input = op.input;
  if (op.in_place) input = std::memcpy(scratch(bytes), op.input, bytes);  // Gloo copies in -> out slice
  ::gloo::GatherOptions o(ctx_);
  o.setRoot(op.root);
  o.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes);
  if (rank_ == op.root) o.setOutput(static_cast<uint8_t*>(op.output), bytes * size_);
  o.setTimeout(op.timeout);
  ::gloo::gather(o);
}

void AsyncOps::scatter(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  ::gloo::ScatterOptions o(ctx_);
  o.setRoot(op.root);
  if (rank_ == op.root) {
    const uint8_t* base = static_cast<const uint8_t*>(op.input);
    if (op.in_place) base = static_cast<uint8_t*>(std::memcpy(scratch(bytes * size_), base, bytes * size_));
    std::vector<uint8_t*> inputs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) inputs[static_cast<size_t>(r)] = const_cast<uint8_t*>(base) + r * bytes;
    o.setInputs(inputs, bytes);
  }
  o.setOutput(static_cast<uint8_t*>(op.output), bytes);
  o.setTimeout(op.timeout);
  ::gloo::scatter(o);
}

void AsyncOps::point_to_point(std::span<const P2POp> ops, std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> buffers;
  buffers.reserve(ops.size());
  for (const auto& p : ops) {
    auto buf = ctx_->createUnboundBuffer(p.buffer.data, p.buffer.bytes());
    const uint64_t slot = ::gloo::Slot::build(kP2PSlotPrefix, p.tag);
    if (p.kind == P2POp::Kind::kSend) buf->send(p.peer, slot);
    else buf->recv(p.peer, slot);
    buffers.push_back(std::move(buf));
  }
  const auto deadline = Clock::now() + timeout;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    const bool ok = ops[i].kind == P2POp::Kind::kSend ? buffers[i]->waitSend(left) : buffers[i]->waitRecv(left);
    if (!ok) throw ::gloo::IoException("point-to-point wait was interrupted");
  }
}

void AsyncOps::broadcast(const plugin::OpDesc& op) {
  ::gloo::BroadcastOptions o(ctx_);
  o.setRoot(op.root);
  o.setOutput(static_cast<uint8_t*>(op.output), op.count * element_size(op.dtype));
  o.setTimeout(op.timeout);
  ::gloo::broadcast(o);
}

void AsyncOps::all_gather_list(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  uint8_t* tmp = static_cast<uint8_t*>(scratch(bytes * size_));
  all_gather(op, tmp);
  for (int r = 0; r < size_; ++r) {
    if (op.output_list[static_cast<size_t>(r)] != tmp + r * bytes) {
      std::memcpy(op.output_list[static_cast<size_t>(r)], tmp + r * bytes, bytes);
    }
  }
}

void AsyncOps::all_gather_v(const plugin::OpDesc& op) {
  const size_t es = element_size(op.dtype);
  std::vector<size_t> bytes(op.counts.size());
  size_t total = 0;
  for (size_t i = 0; i < bytes.size(); ++i) total += bytes[i] = op.counts[i] * es;
  if (!total) return;
  ::gloo::AllgathervOptions o(ctx_);
  if (!op.in_place) o.setInput(static_cast<uint8_t*>(const_cast<void*>(op.input)), bytes[static_cast<size_t>(rank_)]);
  o.setOutput(static_cast<uint8_t*>(op.output), bytes);
  o.setTimeout(op.timeout);
  ::gloo::allgatherv(o);
}

void AsyncOps::all_to_all(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype) * size_;
  const void* input = op.in_place ? std::memcpy(scratch(bytes), op.input, bytes) : op.input;
  ::gloo::AlltoallOptions o(ctx_);
  o.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes);
  o.setOutput(static_cast<uint8_t*>(op.output), bytes);
  o.setTimeout(op.timeout);
  ::gloo::alltoall(o);
}

void AsyncOps::all_to_all_v(const plugin::OpDesc& op) {
  const size_t es = element_size(op.dtype);
  size_t in_total = 0;
  for (size_t c : op.counts) in_total += c;
  const void* input = op.input;
  if (op.in_place && in_total) input = std::memcpy(scratch(in_total * es), op.input, in_total * es);
  all_to_all_v(op, input, op.counts, op.output_counts);
}

void AsyncOps::barrier(const plugin::OpDesc& op) {
  ::gloo::BarrierOptions o(ctx_);
  o.setTimeout(op.timeout);
  ::gloo::barrier(o);
}

void AsyncOps::send_or_recv(const plugin::OpDesc& op) {
  const bool send = op.type == OpType::kSend;
  const P2POp p{send ? P2POp::Kind::kSend : P2POp::Kind::kRecv,
                BufferView{send ? const_cast<void*>(op.input) : op.output, op.count, op.dtype, op.device}, op.peer,
                op.tag};
  point_to_point({&p, 1}, op.timeout);
}

// Ops with nothing to move (count 0) return at once: Gloo's collectives
// refuse empty buffers.
void AsyncOps::run(const plugin::OpDesc& op) {
  switch (op.type) {
    case OpType::kAllReduce: return op.count ? all_reduce(op) : void();
    case OpType::kReduce: return op.count ? reduce(op) : void();
    case OpType::kBroadcast: return op.count ? broadcast(op) : void();
    case OpType::kAllGather: return op.count ? all_gather(op, op.output) : void();
    case OpType::kAllGatherList: return op.count ? all_gather_list(op) : void();
    case OpType::kAllGatherV: return all_gather_v(op);
    case OpType::kReduceScatter: {
      if (!op.count) return;
      std::vector<size_t> counts(static_cast<size_t>(size_), op.count);
      return reduce_scatter(op, counts);
    }
    case OpType::kReduceScatterV: {
      size_t total = 0;
      for (size_t c : op.counts) total += c;
      return total ? reduce_scatter(op, op.counts) : void();
    }
    case OpType::kAllToAll: return op.count ? all_to_all(op) : void();
    case OpType::kAllToAllV: return all_to_all_v(op);
    case OpType::kGather: return op.count ? gather(op) : void();
    case OpType::kScatter: return op.count ? scatter(op) : void();
    case OpType::kBarrier: return barrier(op);
    case OpType::kSend:
    case OpType::kRecv: return send_or_recv(op);
    case OpType::kBatchP2P: return point_to_point(op.p2p, op.timeout);
  }
}

}  // namespace comms::gloo_backend
