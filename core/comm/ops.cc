// The op calls of comms::Comm: each packs its arguments for Impl::run.
#include "comm/comm_impl.h"

namespace comms {

using plugin::OpType;

namespace {
internal::OpArgs args_of(OpType type) {
  internal::OpArgs a;
  a.type = type;
  return a;
}
}  // namespace

Work Comm::all_reduce(BufferView buffer, ReduceOp op, const OpOptions& opts) {
  return all_reduce(buffer, buffer, op, opts);
}

Work Comm::all_reduce(BufferView input, BufferView output, ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kAllReduce);
  a.input = input;
  a.output = output;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::reduce(BufferView buffer, int root, ReduceOp op, const OpOptions& opts) {
  return reduce(buffer, buffer, root, op, opts);
}

Work Comm::reduce(BufferView input, BufferView output, int root, ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kReduce);
  a.input = input;
  a.output = output;
  a.root = root;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::broadcast(BufferView buffer, int root, const OpOptions& opts) {
  auto a = args_of(OpType::kBroadcast);
  a.input = buffer;
  a.output = buffer;
  a.root = root;
  return impl_->run(a, opts);
}

Work Comm::all_gather(BufferView input, BufferView output, const OpOptions& opts) {
  auto a = args_of(OpType::kAllGather);
  a.input = input;
  a.output = output;
  return impl_->run(a, opts);
}

Work Comm::all_gather(BufferView input, std::span<const BufferView> outputs, const OpOptions& opts) {
  auto a = args_of(OpType::kAllGatherList);
  a.input = input;
  a.outputs = outputs;
  return impl_->run(a, opts);
}

Work Comm::all_gather_v(BufferView input, BufferView output, std::span<const size_t> counts,
                        const OpOptions& opts) {
  auto a = args_of(OpType::kAllGatherV);
  a.input = input;
  a.output = output;
  a.counts = counts;
  return impl_->run(a, opts);
}

Work Comm::reduce_scatter(BufferView input, BufferView output, ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kReduceScatter);
  a.input = input;
  a.output = output;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::reduce_scatter_v(BufferView input, BufferView output, std::span<const size_t> counts,
                            ReduceOp op, const OpOptions& opts) {
  auto a = args_of(OpType::kReduceScatterV);
  a.input = input;
  a.output = output;
  a.counts = counts;
  a.reduce = op;
  return impl_->run(a, opts);
}

Work Comm::all_to_all(BufferView input, BufferView output, const OpOptions& opts) {
  auto a = args_of(OpType::kAllToAll);
  a.input = input;
  a.output = output;
  return impl_->run(a, opts);
}

Work Comm::all_to_all_v(BufferView input, std::span<const size_t> input_counts, BufferView output,
                        std::span<const size_t> output_counts, const OpOptions& opts) {
  auto a = args_of(OpType::kAllToAllV);
  a.input = input;
  a.output = output;
  a.counts = input_counts;
  a.output_counts = output_counts;
  return impl_->run(a, opts);
}

Work Comm::gather(BufferView input, BufferView output, int root, const OpOptions& opts) {
  auto a = args_of(OpType::kGather);
  a.input = input;
  a.output = output;
  a.root = root;
  return impl_->run(a, opts);
}

Work Comm::scatter(BufferView input, BufferView output, int root, const OpOptions& opts) {
  auto a = args_of(OpType::kScatter);
  a.input = input;
  a.output = output;
  a.root = root;
  return impl_->run(a, opts);
}

Work Comm::barrier(const OpOptions& opts) { return impl_->run(args_of(OpType::kBarrier), opts); }

Work Comm::send(BufferView buffer, int peer, const OpOptions& opts) {
  auto a = args_of(OpType::kSend);
  a.input = buffer;
  a.peer = peer;
  return impl_->run(a, opts);
}

Work Comm::recv(BufferView buffer, int peer, const OpOptions& opts) {
  auto a = args_of(OpType::kRecv);
  a.input = buffer;
  a.output = buffer;
  a.peer = peer;
  return impl_->run(a, opts);
}

Work Comm::batch_p2p(std::span<const P2POp> ops, const OpOptions& opts) {
  auto a = args_of(OpType::kBatchP2P);
  a.p2p = ops;
  return impl_->run(a, opts);
}

}  // namespace comms
