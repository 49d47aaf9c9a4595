// Running an op on a comm: validation, choosing the backend, the OpDesc the
// plugin sees, and turning a failure into an Error (fatal ones fail the
// backend so later ops fail fast).
#include <cstdlib>

#include "comm/comm_impl.h"
#include "comm/elastic_watch.h"
#include "util/log.h"
#include "util/strutil.h"
#include "trace/service.h"

namespace comms {

using plugin::OpType;

namespace {

bool reduces(OpType t) {
  return t == OpType::kAllReduce || t == OpType::kReduce || t == OpType::kReduceScatter ||
         t == OpType::kReduceScatterV;
}

bool has_root(OpType t) {
  return t == OpType::kReduce || t == OpType::kBroadcast || t == OpType::kGather || t == OpType::kScatter;
}


}  // namespace

Error Comm::Impl::op_error(OpType type, uint64_t seq, const Status& status) const {
  return op_error(plugin::op_name(type), seq, status);
}

Error Comm::Impl::op_error(std::string_view op, uint64_t seq, const Status& status) const {
  std::string message = str::cat(prefix(), " ", op, " #", seq, ": ", to_string(status.code), ": ", status.message);
  if (status.peer >= 0) str::append(message, " (peer rank ", status.peer, ")");
  return Error(status.code, message, config_.name, std::string(op), seq, config_.rank, status.peer);
}

void Comm::Impl::on_fatal(DeviceType t, const Error& error) {
  DeviceBackend& s = device_backend(t);
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (s.state.load() == BackendState::kReady || s.state.load() == BackendState::kLazy) {
      s.failure = error.what();
      s.state = BackendState::kFailed;
      // Tell the peers at once (they see this rank as failed) instead of
      // letting each of them wait for its own timeout.
      trace::dump(*recorder_, error.what());
      if (s.backend) {
        const Status st = internal::call_plugin(s.plugin->name, "abort", [&] {
          s.backend->abort(error.what());
          return Status{};
        });
        if (!st.is_ok()) log::error(str::cat(prefix(), " ", st.message));
      }
    }
  }
  if (config_.abort_process_on_error) {
    log::error(str::cat(error.what(), " -- aborting the process (abort_process_on_error)"));
    std::abort();
  }
}

Error Comm::Impl::failed_op(OpType type, uint64_t seq, uint64_t collective, Status status, DeviceType t) {
  if (revoked_.load() && internal::is_fatal(status.code) && status.code != ErrorCode::kRevoked) {
    // The revocation ended it (its abort), whatever the backend saw.
    std::string why;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      why = device_backend(t).failure;
    }
    status = Status(ErrorCode::kRevoked, str::cat(why, " (the backend said: ", to_string(status.code), ": ",
                                                  status.message, ")"), status.peer);
  }
  recorder_->failed(seq, status.code, status.peer);
  if (status.code == ErrorCode::kTimeout) {
    const std::string culprit = trace::find_culprit(recorder_, collective, type);
    if (!culprit.empty()) str::append(status.message, "; ", culprit);
  }
  Error e = op_error(type, seq, status);
  if (internal::is_fatal(status.code)) on_fatal(t, e);
  return e;
}

Status Comm::Impl::unusable_backend(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  switch (s.state.load()) {
    case BackendState::kAbsent:
      return {ErrorCode::kInvalidArgument,
              str::cat("no backend for device type '", to_string(t), "' in this comm (backends: ",
                       config_.spec.to_string(), "); create the comm with e.g. 'cpu:gloo,cuda:nccl'")};
    case BackendState::kOffloaded:
      return {ErrorCode::kAborted, str::cat("the ", s.plugin->name, " backend for ", to_string(t),
                                            " is offloaded; reload it first (dist::reload_groups() or "
                                            "Comm::reload_backend)")};
    default: {
      std::string failure;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        failure = s.failure;
      }
      if (revoked_.load()) {
        // Recovery runs through the store: no advice to recover when it is gone.
        const bool store_alive = !config_.store || !internal::store_lost(*config_.store);
        return {ErrorCode::kRevoked,
                str::cat(failure, store_alive ? "; recover (comms::recover) and use the shrunk comm" : "")};
      }
      return {ErrorCode::kAborted, str::cat("the comm failed earlier and cannot run ops: ", failure)};
    }
  }
}

bool Comm::Impl::supports_reduction(DeviceBackend& s, DataType dtype, ReduceKind kind, OpType type) const {
  // Asked once per (dtype, kind) of each backend: the answer is fixed for a
  // backend's life (plugin.h), and a reload (a new generation) asks again.
  static_assert(kNumDataTypes <= 16, "one bit per dtype");
  const uint16_t mask = static_cast<uint16_t>(1u << static_cast<unsigned>(dtype));
  auto& known = s.reductions_known[static_cast<size_t>(kind)];
  auto& yes = s.reductions_supported[static_cast<size_t>(kind)];
  if (s.reductions_generation.load(std::memory_order_relaxed) == s.generation) {
    if (known.load(std::memory_order_relaxed) & mask) return (yes.load(std::memory_order_relaxed) & mask) != 0;
  } else {
    for (auto& k : s.reductions_known) k.store(0, std::memory_order_relaxed);
    for (auto& y : s.reductions_supported) y.store(0, std::memory_order_relaxed);
    s.reductions_generation.store(s.generation, std::memory_order_relaxed);
  }
  bool supported = false;
  const Status st = internal::call_plugin(s.plugin->name, "supports_reduction", [&] {
    supported = s.backend->supports_reduction(dtype, kind);
    return Status{};
  });
  if (!st.is_ok()) throw op_error(type, seq_.load() + 1, st);
  if (supported) yes.fetch_or(mask, std::memory_order_relaxed);
  known.fetch_or(mask, std::memory_order_relaxed);
  return supported;
}

DeviceType Comm::Impl::op_device(const internal::OpArgs& args, const internal::Checked& c) {
  DeviceType t = c.device_type;
  if (args.type == OpType::kBarrier || (args.type == OpType::kBatchP2P && args.p2p.empty())) [[unlikely]] {
    t = config_.bound_device ? config_.bound_device->type
        : config_.spec.has(DeviceType::kCpu) ? DeviceType::kCpu
                                             : DeviceType::kCuda;
  }
  DeviceBackend& s = device_backend(t);
  const BackendState state = s.state.load();
  if (state != BackendState::kReady && state != BackendState::kLazy) [[unlikely]] {
    throw op_error(args.type, seq_.load() + 1, unusable_backend(t));
  }
  // Before any plugin call (lazy init, supports_reduction, submit): a buffer
  // on another device would reach the plugin as if it were on the comm's.
  if (s.device.index >= 0) [[unlikely]] {
    if (Status st = internal::check_device(args, s.device, s.plugin->name); !st.is_ok()) {
      throw op_error(args.type, seq_.load() + 1, st);
    }
  }
  if (reduces(args.type) && !supports_reduction(s, c.dtype, args.reduce.kind, args.type)) [[unlikely]] {
    throw op_error(args.type, seq_.load() + 1,
                     {ErrorCode::kUnsupported, str::cat("backend '", s.plugin->name, "' does not support ",
                                                        to_string(args.reduce.kind), " on ", to_string(c.dtype))});
  }
  return t;
}

plugin::OpDesc Comm::Impl::op_desc(const internal::OpArgs& args, const OpOptions& opts, const internal::Checked& c,
                                   const DeviceBackend& s, uint64_t seq) const {
  plugin::OpDesc d;
  d.type = args.type;
  d.seq = seq;
  d.input = args.input.data;
  d.output = args.output.data;
  d.count = c.count;
  d.dtype = c.dtype;
  d.device = s.device;
  d.reduce = args.reduce;
  d.root = args.root;
  d.peer = args.peer;
  d.tag = opts.tag;
  d.in_place = c.in_place;
  d.async = opts.async;
  d.counts = args.counts;
  d.output_counts = args.output_counts;
  d.p2p = args.p2p;
  d.timeout = opts.timeout ? *opts.timeout : config_.op_timeout;
  d.stream = opts.stream;
  return d;
}

trace::OpRecord Comm::Impl::op_record(const plugin::OpDesc& d, DeviceType t) const {
  trace::OpRecord r;
  r.seq = d.seq;
  r.op = d.type;
  r.dtype = d.dtype;
  r.reduction = d.reduce.kind;
  r.device = t;
  r.async = d.async;
  r.root = has_root(d.type) ? d.root : -1;
  r.peer = d.type == OpType::kSend || d.type == OpType::kRecv ? d.peer : -1;
  r.count = d.count;
  return r;
}

void Comm::Impl::check_same_args(const trace::OpRecord& r, const internal::OpArgs& args,
                                 std::chrono::milliseconds timeout, DeviceType t) {
  // The lists every rank passes alike; all_to_all_v's differ by design.
  std::string counts;
  if (args.type == OpType::kAllGatherV || args.type == OpType::kReduceScatterV) {
    for (size_t i = 0; i < args.counts.size(); ++i) str::append(counts, i ? "," : "", args.counts[i]);
  }
  const Status st = trace::check_same_args(*recorder_, r, counts, timeout);
  if (st.is_ok()) return;
  Error e = failed_op(r.op, r.seq, r.collective, st, t);
  if (!internal::is_fatal(st.code)) trace::dump(*recorder_, e.what());
  throw e;
}

[[gnu::cold]] Status Comm::Impl::bad_options(OpType type, const OpOptions& opts) const {
  if (opts.tag != 0 && trace::is_collective(type)) {
    // Every option takes effect or is rejected: collectives have no tags.
    return {ErrorCode::kInvalidArgument, str::cat("OpOptions::tag (", opts.tag, ") only applies to send, recv and "
                                                  "batch_p2p; ", plugin::op_name(type),
                                                  " is a collective and takes no tag")};
  }
  return {ErrorCode::kInvalidArgument, "the op timeout must be positive"};
}

Work Comm::Impl::run(const internal::OpArgs& args, const OpOptions& opts) {
  // The path of every op: what a passing op does not need (messages,
  // routed hints, the COMMS_DEBUG=detail exchange) stays off it.
  internal::Checked c;
  Status st = internal::validate(args, config_.rank, config_.size, &c);
  if (!st.is_ok()) [[unlikely]] throw op_error(args.type, seq_.load() + 1, st);
  if (opts.tag != 0 && trace::is_collective(args.type)) [[unlikely]] {
    throw op_error(args.type, seq_.load() + 1, bad_options(args.type, opts));
  }
  const DeviceType t = op_device(args, c);
  if (opts.timeout && opts.timeout->count() <= 0) [[unlikely]] {
    throw op_error(args.type, seq_.load() + 1, bad_options(args.type, opts));
  }
  DeviceBackend& s = device_backend(t);
  // One issuing thread at a time (comm.h): no locked add on every op.
  const uint64_t seq = seq_.load(std::memory_order_relaxed) + 1;
  seq_.store(seq, std::memory_order_relaxed);
  plugin::OpDesc d = op_desc(args, opts, c, s, seq);
  const bool lazy = s.state.load() == BackendState::kLazy;
  const bool checks = detail_checks_ && trace::is_collective(args.type);
  // Nothing runs between issue and start unless the backend connects or
  // the arguments are compared first: then start is stamped on its own.
  trace::OpRecord record = op_record(d, t);
  record.collective =
      recorder_->issued(record, recorder_->capacity() ? trace::ticks() : 0, /*started=*/!lazy && !checks);
  const uint64_t collective = record.collective;
  if (lazy) ensure_ready(s, t, args.type, seq, collective);
  if (checks) check_same_args(record, args, d.timeout, t);
  if (lazy || checks) recorder_->started(seq);

  std::vector<void*> output_list;
  if (args.type == OpType::kAllGatherList) {
    output_list.reserve(args.outputs.size());
    for (const auto& b : args.outputs) output_list.push_back(b.data);
    d.output_list = output_list;
  }
  std::unique_ptr<std::array<Hints, kNumDeviceTypes>> op_hints;  // built only when given
  if (!opts.hints.empty()) [[unlikely]] {
    try {
      op_hints = std::make_unique<std::array<Hints, kNumDeviceTypes>>(
          internal::route_hints(opts.hints, config_.spec, config_.name));
    } catch (const Error& e) {  // with the op's comm, name, seq and rank
      throw op_error(args.type, seq, {e.code(), e.what()});
    }
    d.hints = &(*op_hints)[static_cast<size_t>(t)];
  }

  std::unique_ptr<plugin::Work> work;
  st = internal::call_plugin(s.plugin->name, "submit", [&] { return s.backend->submit(d, &work); });
  if (!st.is_ok()) [[unlikely]] throw failed_op(args.type, seq, collective, st, t);
  if (!work) {
    recorder_->completed(seq, args.type, collective);
    return Work();
  }
  if (opts.async) {
    return Work(std::make_shared<internal::WorkState>(shared_from_this(), std::move(work), args.type, seq,
                                                      collective, t));
  }
  st = internal::call_plugin(s.plugin->name, "wait", [&] { return work->wait(WaitMode::kStream); });
  if (!st.is_ok()) [[unlikely]] throw failed_op(args.type, seq, collective, st, t);
  recorder_->completed(seq, args.type, collective);
  return Work();
}

}  // namespace comms
