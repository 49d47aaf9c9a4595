// Enqueue: an op is ordered after the caller's stream, launched on the comm's
// internal stream and followed by its end event. What NCCL is called with for
// each op type is one function below, listed in kLaunches (indexed by OpType).
#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "comms/numeric.h"
#include "nccl_backend.h"
#include "nccl_core.h"

namespace comms::nccl {

using plugin::OpDesc;
using plugin::OpType;
using std::chrono::milliseconds;

namespace {

// What launching one op needs: the op, the communicator and stream it runs on,
// and NCCL's answers as Status. Built under Core::mu.
struct Launch {
  Core& core;
  NcclApi& api;
  const OpDesc& op;
  ncclComm_t c;
  cudaStream_t s;
  void* scratch;  // one float on the device, for barrier
  int rank;
  int size;
  int cc_major;
  int cc_minor;
  size_t elem;         // bytes per element of op.dtype
  ncclDataType_t cdt;  // the element type for ops that only move data
  Clock::time_point deadline;
  std::string_view what;  // "nccl <op name>"

  const char* in_at(size_t elements) const {
    return static_cast<const char*>(op.input) + elements * elem;
  }
  char* out_at(size_t elements) const { return static_cast<char*>(op.output) + elements * elem; }

  // One NCCL call, settled within the op's deadline.
  Status call(ncclResult_t r, std::string_view name) const {
    return core.settle(c, r, deadline, name);
  }
  Status call(ncclResult_t r) const { return call(r, what); }
  // One call inside a group: ncclGroupEnd settles it.
  Status check(ncclResult_t r, std::string_view name) const {
    return accepted(r) ? Status() : nccl_status(api, c, r, name);
  }

  // Runs `body` inside ncclGroupStart/End; the group is always closed.
  template <class Body>
  Status grouped(Body body) const {
    if (ncclResult_t r = api.group_start(); r != ncclSuccess) {
      return nccl_status(api, c, r, "ncclGroupStart");
    }
    Status inner = body();
    Status end = call(api.group_end());
    return inner.is_ok() ? end : inner;
  }

  // A reduction: `run(dtype, op)` with NCCL's type and operator for the op's
  // (dtype, reduce), around a premul_sum operator made for the call.
  template <class Run>
  Status reduce(Run run) const {
    ReductionPlan plan = plan_reduction(op.dtype, op.reduce.kind, cc_major, cc_minor);
    if (!plan.reason.empty()) return {ErrorCode::kUnsupported, plan.reason};
    if (!plan.premul_sum) return call(run(plan.dtype, plan.op));
    alignas(8) unsigned char scalar[8];
    encode_scalar(op.reduce.scalar, op.dtype, scalar);
    ncclRedOp_t premul;
    if (Status s = call(api.red_op_create_pre_mul_sum(&premul, scalar, plan.dtype, c),
                        "ncclRedOpCreatePreMulSum");
        !s.is_ok()) {
      return s;
    }
    Status s = call(run(plan.dtype, premul));
    // The host-immediate scalar was consumed at enqueue, so the op can go now.
    if (Status d = call(api.red_op_destroy(premul, c), "ncclRedOpDestroy"); !d.is_ok() && s.is_ok()) {
      s = d;
    }
    return s;
  }
};

// "nccl <op name>" for each op type, built once: a string built per op only
// to name the call in an error cost every op a copy.
std::string_view call_name(OpType type) {
  static const auto names = [] {
    std::array<std::string, plugin::kNumOpTypes> out;
    for (int i = 0; i < plugin::kNumOpTypes; ++i) {
      out[static_cast<size_t>(i)] = "nccl " + std::string(plugin::op_name(static_cast<OpType>(i)));
    }
    return out;
  }();
  return names[static_cast<size_t>(type)];
}

// An op that NCCL runs with its one-rank scaling kernel on a one-rank comm.
bool one_rank_scaling(const OpDesc& op) {
  const bool reducing = op.type == OpType::kAllReduce || op.type == OpType::kReduce ||
                        op.type == OpType::kReduceScatter || op.type == OpType::kReduceScatterV;
  return reducing && (op.reduce.kind == ReduceKind::kAvg || op.reduce.kind == ReduceKind::kPremulSum);
}

// NCCL 2.28.3 on one rank: avg and premul_sum (its one-rank scaling kernel)
// leave every element past the last whole 512 KiB unwritten when the buffer
// is larger than that (seen on an H100, every type). On one rank these ops
// are elementwise: the tail goes in a call of its own. Empty when the op
// needs no such split.
std::optional<Status> launch_one_rank_in_parts(const Launch& l) {
  const OpDesc& op = l.op;
  if (l.size != 1 || !one_rank_scaling(op)) return std::nullopt;
  constexpr size_t kOneRankChunkBytes = size_t{512} << 10;
  const size_t count = op.type == OpType::kReduceScatterV ? op.counts[0] : op.count;
  const size_t bulk = count * l.elem / kOneRankChunkBytes * kOneRankChunkBytes / l.elem;
  if (bulk == 0 || bulk == count) return std::nullopt;
  const char* in = static_cast<const char*>(op.input ? op.input : op.output);
  for (auto [from, n] : {std::pair{size_t{0}, bulk}, std::pair{bulk, count - bulk}}) {
    Status part = l.reduce([&](ncclDataType_t dt, ncclRedOp_t rop) {
      return l.api.all_reduce(in + from * l.elem, l.out_at(from), n, dt, rop, l.c, l.s);
    });
    if (!part.is_ok()) return part;
  }
  return Status();
}

// --- one function per op type ------------------------------------------------

Status launch_all_reduce(const Launch& l) {
  return l.reduce([&](ncclDataType_t dt, ncclRedOp_t rop) {
    return l.api.all_reduce(l.op.input, l.op.output, l.op.count, dt, rop, l.c, l.s);
  });
}

Status launch_reduce(const Launch& l) {
  return l.reduce([&](ncclDataType_t dt, ncclRedOp_t rop) {
    return l.api.reduce(l.op.input, l.op.output, l.op.count, dt, rop, l.op.root, l.c, l.s);
  });
}

Status launch_reduce_scatter(const Launch& l) {
  return l.reduce([&](ncclDataType_t dt, ncclRedOp_t rop) {
    return l.api.reduce_scatter(l.op.input, l.op.output, l.op.count, dt, rop, l.c, l.s);
  });
}

// One reduce per destination rank, fused in a group.
Status launch_reduce_scatter_v(const Launch& l) {
  const OpDesc& op = l.op;
  ReductionPlan plan = plan_reduction(op.dtype, op.reduce.kind, l.cc_major, l.cc_minor);
  if (!plan.reason.empty()) return {ErrorCode::kUnsupported, plan.reason};
  if (plan.premul_sum) {
    // The group inside the reduction: the premul_sum operator outlives it.
    return l.reduce([&](ncclDataType_t dt, ncclRedOp_t rop) {
      ncclResult_t first = l.api.group_start();
      size_t offset = 0;
      for (int r = 0; r < l.size && accepted(first); ++r) {
        first = l.api.reduce(l.in_at(offset), op.output, op.counts[r], dt, rop, r, l.c, l.s);
        offset += op.counts[r];
      }
      ncclResult_t end = l.api.group_end();
      return accepted(first) ? end : first;
    });
  }
  return l.grouped([&]() -> Status {
    size_t offset = 0;
    for (int r = 0; r < l.size; ++r) {
      ncclResult_t res =
          l.api.reduce(l.in_at(offset), op.output, op.counts[r], plan.dtype, plan.op, r, l.c, l.s);
      if (Status s = l.check(res, "ncclReduce"); !s.is_ok()) return s;
      offset += op.counts[r];
    }
    return {};
  });
}

Status launch_broadcast(const Launch& l) {
  const void* in = l.op.input ? l.op.input : l.op.output;
  return l.call(l.api.broadcast(in, l.op.output, l.op.count, l.cdt, l.op.root, l.c, l.s));
}

Status launch_all_gather(const Launch& l) {
  return l.call(l.api.all_gather(l.op.input, l.op.output, l.op.count, l.cdt, l.c, l.s));
}

// One broadcast per source rank straight into its output buffer: no staging
// buffer, and NCCL fuses the group.
Status launch_all_gather_list(const Launch& l) {
  return l.grouped([&]() -> Status {
    for (int r = 0; r < l.size; ++r) {
      ncclResult_t res =
          l.api.broadcast(l.op.input, l.op.output_list[r], l.op.count, l.cdt, r, l.c, l.s);
      if (Status s = l.check(res, "ncclBroadcast"); !s.is_ok()) return s;
    }
    return {};
  });
}

Status launch_all_gather_v(const Launch& l) {
  return l.grouped([&]() -> Status {
    size_t offset = 0;
    for (int r = 0; r < l.size; ++r) {
      ncclResult_t res =
          l.api.broadcast(l.op.input, l.out_at(offset), l.op.counts[r], l.cdt, r, l.c, l.s);
      if (Status s = l.check(res, "ncclBroadcast"); !s.is_ok()) return s;
      offset += l.op.counts[r];
    }
    return {};
  });
}

// A send and a receive that both must be accepted, named as one.
Status check_pair(const Launch& l, ncclResult_t a, ncclResult_t b) {
  if (accepted(a) && accepted(b)) return {};
  return nccl_status(l.api, l.c, accepted(a) ? b : a, "ncclSend/ncclRecv");
}

// all_to_all, gather and scatter: NCCL's own call where the loaded NCCL has
// it (>= 2.28, which also runs them without CTAs under cta_policy=zero),
// else grouped send/recv.
Status launch_all_to_all(const Launch& l) {
  const size_t n = l.op.count;
  if (l.api.has_native_collectives()) {
    return l.call(l.api.all_to_all(l.op.input, l.op.output, n, l.cdt, l.c, l.s));
  }
  return l.grouped([&]() -> Status {
    for (int r = 0; r < l.size; ++r) {
      ncclResult_t a = l.api.send(l.in_at(r * n), n, l.cdt, r, l.c, l.s);
      ncclResult_t b = l.api.recv(l.out_at(r * n), n, l.cdt, r, l.c, l.s);
      if (Status s = check_pair(l, a, b); !s.is_ok()) return s;
    }
    return {};
  });
}

Status launch_all_to_all_v(const Launch& l) {
  const OpDesc& op = l.op;
  return l.grouped([&]() -> Status {
    size_t send_off = 0, recv_off = 0;
    for (int r = 0; r < l.size; ++r) {
      if (op.counts[r] > 0) {
        ncclResult_t a = l.api.send(l.in_at(send_off), op.counts[r], l.cdt, r, l.c, l.s);
        if (Status s = l.check(a, "ncclSend"); !s.is_ok()) return s;
      }
      if (op.output_counts[r] > 0) {
        ncclResult_t b = l.api.recv(l.out_at(recv_off), op.output_counts[r], l.cdt, r, l.c, l.s);
        if (Status s = l.check(b, "ncclRecv"); !s.is_ok()) return s;
      }
      send_off += op.counts[r];
      recv_off += op.output_counts[r];
    }
    return {};
  });
}

Status launch_gather(const Launch& l) {
  const OpDesc& op = l.op;
  const size_t n = op.count;
  if (l.api.has_native_collectives()) {
    return l.call(l.api.gather(op.input, op.output, n, l.cdt, op.root, l.c, l.s));
  }
  return l.grouped([&]() -> Status {
    if (l.rank != op.root) return l.check(l.api.send(op.input, n, l.cdt, op.root, l.c, l.s), "ncclSend");
    for (int r = 0; r < l.size; ++r) {
      if (r == l.rank) continue;
      if (Status s = l.check(l.api.recv(l.out_at(r * n), n, l.cdt, r, l.c, l.s), "ncclRecv");
          !s.is_ok()) {
        return s;
      }
    }
    // The root's own slice: a self send/recv pair keeps it on the stream.
    if (op.in_place) return {};
    ncclResult_t a = l.api.send(op.input, n, l.cdt, l.rank, l.c, l.s);
    ncclResult_t b = l.api.recv(l.out_at(l.rank * n), n, l.cdt, l.rank, l.c, l.s);
    return check_pair(l, a, b);
  });
}

Status launch_scatter(const Launch& l) {
  const OpDesc& op = l.op;
  const size_t n = op.count;
  if (l.api.has_native_collectives()) {
    return l.call(l.api.scatter(op.input, op.output, n, l.cdt, op.root, l.c, l.s));
  }
  return l.grouped([&]() -> Status {
    if (l.rank == op.root) {
      for (int r = 0; r < l.size; ++r) {
        if (r == l.rank && op.in_place) continue;
        if (Status s = l.check(l.api.send(l.in_at(r * n), n, l.cdt, r, l.c, l.s), "ncclSend");
            !s.is_ok()) {
          return s;
        }
      }
      if (op.in_place) return {};
    }
    return l.check(l.api.recv(op.output, n, l.cdt, op.root, l.c, l.s), "ncclRecv");
  });
}

// A one-float all-reduce of the comm's scratch.
Status launch_barrier(const Launch& l) {
  return l.call(l.api.all_reduce(l.scratch, l.scratch, 1, ncclFloat32, ncclSum, l.c, l.s));
}

Status launch_send(const Launch& l) {
  return l.call(l.api.send(l.op.input, l.op.count, l.cdt, l.op.peer, l.c, l.s));
}

Status launch_recv(const Launch& l) {
  return l.call(l.api.recv(l.op.output, l.op.count, l.cdt, l.op.peer, l.c, l.s));
}

Status launch_batch_p2p(const Launch& l) {
  return l.grouped([&]() -> Status {
    for (const P2POp& p : l.op.p2p) {
      const ncclDataType_t dt = copy_dtype(p.buffer.dtype);
      ncclResult_t r = p.kind == P2POp::Kind::kSend
                           ? l.api.send(p.buffer.data, p.buffer.count, dt, p.peer, l.c, l.s)
                           : l.api.recv(p.buffer.data, p.buffer.count, dt, p.peer, l.c, l.s);
      if (Status s = l.check(r, "ncclSend/ncclRecv"); !s.is_ok()) return s;
    }
    return {};
  });
}

struct OpLaunch {
  OpType type;
  Status (*launch)(const Launch&);
};

// Every op type, in OpType order (checked below).
constexpr OpLaunch kLaunches[] = {
    {OpType::kAllReduce, launch_all_reduce},
    {OpType::kReduce, launch_reduce},
    {OpType::kBroadcast, launch_broadcast},
    {OpType::kAllGather, launch_all_gather},
    {OpType::kAllGatherList, launch_all_gather_list},
    {OpType::kAllGatherV, launch_all_gather_v},
    {OpType::kReduceScatter, launch_reduce_scatter},
    {OpType::kReduceScatterV, launch_reduce_scatter_v},
    {OpType::kAllToAll, launch_all_to_all},
    {OpType::kAllToAllV, launch_all_to_all_v},
    {OpType::kGather, launch_gather},
    {OpType::kScatter, launch_scatter},
    {OpType::kBarrier, launch_barrier},
    {OpType::kSend, launch_send},
    {OpType::kRecv, launch_recv},
    {OpType::kBatchP2P, launch_batch_p2p},
};

constexpr bool launches_in_op_type_order() {
  if (std::size(kLaunches) != static_cast<size_t>(plugin::kNumOpTypes)) return false;
  for (size_t i = 0; i < std::size(kLaunches); ++i) {
    if (static_cast<size_t>(kLaunches[i].type) != i) return false;
  }
  return true;
}
static_assert(launches_in_op_type_order(),
              "kLaunches needs one entry per plugin::OpType, in the enum's order");

}  // namespace

Status Core::enqueue_locked(const OpDesc& op, Clock::time_point deadline, cudaStream_t stream) {
  const auto index = static_cast<size_t>(op.type);
  if (index >= std::size(kLaunches)) return {ErrorCode::kUnsupported, "nccl: unknown op type"};
  const Launch l{*this,
                 *api_,
                 op,
                 comm_,
                 stream,
                 scratch_,
                 init_.rank,
                 init_.size,
                 cc_major_,
                 cc_minor_,
                 element_size(op.dtype),
                 copy_dtype(op.dtype),
                 deadline,
                 call_name(op.type)};
  if (std::optional<Status> s = launch_one_rank_in_parts(l)) return *s;
  return kLaunches[index].launch(l);
}

Status Core::submit_locked(const OpDesc& op, std::shared_ptr<WorkState>* out_work) {
  return run_eager_locked(
      op.seq, op.type, nullptr, op.timeout, op.stream,
      [&](Clock::time_point deadline) { return enqueue_locked(op, deadline, stream_); }, out_work);
}

}  // namespace comms::nccl
