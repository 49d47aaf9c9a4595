// Every c10d call of the "comms" backend: checks, views, then one comms op.
#include "process_group.h"

#include <algorithm>
#include <stdexcept>

#ifdef COMMS_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "comms/elastic.h"
#include "p2p_channels.h"
#include "tensors.h"
#include "window.h"

namespace comms_torch {

namespace {

using Ms = std::chrono::milliseconds;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using Tensors = std::vector<at::Tensor>;

comms::ReduceOp reduce_op_of(const c10d::ReduceOp& op, const at::Tensor& t, const char* call) {
  const bool complex = t.is_complex();
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return comms::ReduceOp::sum();
    case c10d::ReduceOp::AVG: return comms::ReduceOp::avg();
    case c10d::ReduceOp::PREMUL_SUM: {
      // torch 2.15 renamed it PreMulSumSupplement; the old name stays an alias.
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (s == nullptr) fail(call, "PREMUL_SUM without its factor");
      const double f = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      return comms::ReduceOp::premul_sum(f);
    }
    default: break;
  }
  if (complex) fail(call, "complex tensors reduce with SUM, AVG or PREMUL_SUM only");
  switch (op.op_) {
    case c10d::ReduceOp::PRODUCT: return comms::ReduceOp::product();
    case c10d::ReduceOp::MIN: return comms::ReduceOp::min();
    case c10d::ReduceOp::MAX: return comms::ReduceOp::max();
    case c10d::ReduceOp::BAND: return comms::ReduceOp::band();
    case c10d::ReduceOp::BOR: return comms::ReduceOp::bor();
    case c10d::ReduceOp::BXOR: return comms::ReduceOp::bxor();
    default: fail(call, "unknown ReduceOp " + std::to_string(static_cast<int>(op.op_)));
  }
}


// Whether torch will wait for the op's work before anything else (torch sets
// asyncOp from async_op; a torch without the field: always asynchronous).
template <class Options>
bool async_of(const Options& opts) {
  if constexpr (requires { opts.asyncOp; }) {
    return opts.asyncOp;
  } else {
    return true;
  }
}

void check_root(int64_t root, int size, const char* call) {
  if (root < 0 || root >= size) {
    fail(call, "root rank " + std::to_string(root) + " is outside the group of " + std::to_string(size));
  }
}

}  // namespace

ProcessGroupComms::ProcessGroupComms(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     const GroupConfig& config)
    : c10d::Backend(rank, size), store_(store), config_(config), watcher_(make_future_watcher()) {
  comms::CommOptions options;
  options.store = std::make_shared<C10dStore>(store);
  options.rank = rank;
  options.world_size = size;
  options.hints = config.hints;
  options.op_timeout = config.op_timeout;
  options.init_timeout = config.init_timeout;
  comm_ = comms::new_comm(config.backend, config.device, config.name, options);
  channels_ = std::make_unique<P2PChannels>(store_, config_, comm_->backend_string(), rank);
}

ProcessGroupComms::ProcessGroupComms(ProcessGroupComms& parent, const std::vector<int>& ranks,
                                     const GroupConfig& config)
    : c10d::Backend(0, static_cast<int>(ranks.size())),
      store_(parent.store_),
      config_(config),
      watcher_(make_future_watcher()) {
  comms::SplitOptions options;
  options.hints = config.hints;
  options.op_timeout = config.op_timeout;
  options.init_timeout = config.init_timeout;
  options.backend = config.backend;
  comm_ = parent.live("split").split(ranks, config.name, options);
  rank_ = comm_->rank();
  channels_ = std::make_unique<P2PChannels>(store_, config_, comm_->backend_string(), rank_);
}

ProcessGroupComms::ProcessGroupComms(std::shared_ptr<comms::Comm> comm, const c10::intrusive_ptr<c10d::Store>& store,
                                     const GroupConfig& config)
    : c10d::Backend(comm->rank(), comm->size()),
      comm_(std::move(comm)),
      store_(store),
      config_(config),
      watcher_(make_future_watcher()) {
  config_.name = comm_->name();
  channels_ = std::make_unique<P2PChannels>(store_, config_, comm_->backend_string(), rank_);
}

ProcessGroupComms::~ProcessGroupComms() {
  try {
    finalize();
  } catch (const std::exception& e) {
    TORCH_WARN("comms.torch: finalizing group ", config_.name, " failed: ", e.what());
  }
}

void ProcessGroupComms::finalize() {
  if (!comm_) return;
  // Every op finishes (or fails) before its tensors may go.
  for (auto& w : pending_) {
    try {
      w->wait();
    } catch (const std::exception&) {
      // the op's caller sees its error through its own Work
    }
  }
  pending_.clear();
  std::exception_ptr channel_failure;
  try {
    channels_->finalize();
  } catch (...) {
    channel_failure = std::current_exception();
  }
  auto comm = std::move(comm_);
  comm_.reset();
  comm->finalize();
  if (channel_failure) std::rethrow_exception(channel_failure);
}

void ProcessGroupComms::abort() {
  if (!comm_) return;
  channels_->abort("the group was aborted");
  comm_->abort("the group was aborted (torch abort)");
}

comms::Comm& ProcessGroupComms::live(const char* call) {
  if (!comm_) fail(call, "the group was destroyed (destroy_process_group)");
  return *comm_;
}

void ProcessGroupComms::split_as_nonmember(const std::string& name) {
  live("split").split(std::span<const int>(), name);
}

bool ProcessGroupComms::offload(comms::DeviceType type) {
  channels_->finalize();  // remade on the next send or recv
  return live("offload").offload_backend(type);
}

bool ProcessGroupComms::reload(comms::DeviceType type) { return live("reload").reload_backend(type); }

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupComms::getBackendOptions() {
  // What a split child inherits: backend, hints and init timeout; its op
  // timeout is split_group's (torch writes it into these options).
  auto opts = c10::make_intrusive<CommsOptions>();
  opts->config = config_;
  opts->config.name.clear();
  opts->config.device.reset();
  opts->config.op_timeout.reset();
  if (comm_) opts->timeout = comm_->op_timeout();
  return opts;
}

GroupConfig ProcessGroupComms::child_config(const c10::intrusive_ptr<c10d::Backend::Options>& opts,
                                            const std::string& name, const char* call) const {
  GroupConfig child = config_;
  child.op_timeout.reset();
  if (opts) {
    auto* own = dynamic_cast<CommsOptions*>(opts.get());
    if (own == nullptr) {
      fail(call, "options of backend '" + opts->backend +
                     "' cannot configure a comms group: pass comms.torch.Options (pg_options)");
    }
    child = own->config;
    // comms.torch.Options' timeout wins; else the call's (torch sets it).
    if (!child.op_timeout && opts->timeout.count() > 0) child.op_timeout = opts->timeout;
  }
  child.device.reset();  // a split child is bound as its parent is
  child.name = name;
  return child;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupComms::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                           const std::vector<int>& ranks,
                                                           const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  (void)store;  // the child bootstraps inside the parent's comm (its own store namespace)
  const std::string group = opts && !opts->group_name.empty() ? opts->group_name : "split";
  const std::string name = config_.name + "/" + group;
  const auto child = child_config(opts, name, "split_group");
  if (std::find(ranks.begin(), ranks.end(), getRank()) == ranks.end()) {
    split_as_nonmember(name);
    return nullptr;
  }
  return c10::make_intrusive<ProcessGroupComms>(*this, ranks, child);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupComms::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                            int shrink_flags,
                                                            const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  auto& c = live("shrink_group");
  if (opts) fail("shrink_group", "pg_options: a shrunk comms group keeps its parent's options");
  std::vector<int> exclude(ranks_to_exclude.begin(), ranks_to_exclude.end());
  // The survivors' comm bootstraps through the store, not through the old
  // comm, so the ops in flight there do not hold it up. SHRINK_ABORT makes
  // them fail now instead of waiting for the lost rank.
  auto survivors = comms::shrink(c, exclude);
  if (shrink_flags != 0) abort();
  if (!survivors) return nullptr;
  return c10::make_intrusive<ProcessGroupComms>(std::move(survivors), store_, config_);
}

void ProcessGroupComms::setTimeout(std::chrono::milliseconds timeout) {
  live("set_timeout").set_timeout(timeout);
  config_.op_timeout = timeout;
  channels_->set_timeout(timeout);
}

comms::OpOptions ProcessGroupComms::op_options(Ms timeout, const Tensors& tensors, bool async) {
  comms::OpOptions o;
  // A CPU op torch will wait for at once (asyncOp false: the call was not
  // async_op=True) runs on this thread, without the hop to the backend's
  // worker. CUDA ops stay asynchronous: they are ordered on streams.
  o.async = async || (!tensors.empty() && tensors[0].is_cuda());
  if (timeout != c10d::kUnsetTimeout) o.timeout = timeout;
#ifdef COMMS_TORCH_CUDA
  // Ordered after the work already queued on torch's current stream; tensors
  // freed on another stream are not reused before the op used them.
  if (!tensors.empty() && tensors[0].is_cuda()) {
    auto stream = c10::cuda::getCurrentCUDAStream(tensors[0].device().index());
    o.stream = stream.stream();
    for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
  }
#else
  (void)tensors;
#endif
  return o;
}

WorkPtr ProcessGroupComms::track(comms::Work work, Tensors keep, Tensors outputs, c10d::OpType type) {
  while (!pending_.empty() && pending_.front()->isCompleted()) pending_.pop_front();
  auto w = c10::make_intrusive<CommsWork>(std::move(work), std::move(keep), std::move(outputs), type, getRank(),
                                          watcher_);
  pending_.push_back(w);
  ++collectives_issued_;
  if (coalescing_) window_last_ = w;
  return w;
}

WorkPtr ProcessGroupComms::broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
  const char* call = "broadcast";
  auto& c = live(call);
  const auto& t = single(tensors, call, "tensor");
  check_root(opts.rootRank, getSize(), call);
  const auto v = view_of(t, Use::kMove, call, "tensor");
  const auto o = op_options(opts.timeout, tensors, async_of(opts));
  auto w = issue([&] { return c.broadcast(v, static_cast<int>(opts.rootRank), o); });
  return track(std::move(w), tensors, tensors, c10d::OpType::BROADCAST);
}

WorkPtr ProcessGroupComms::allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
  const char* call = "all_reduce";
  auto& c = live(call);
  const auto& t = single(tensors, call, "tensor");
  const auto v = view_of(t, Use::kReduce, call, "tensor");
  const auto op = reduce_op_of(opts.reduceOp, t, call);
  auto w = issue([&] { return c.all_reduce(v, op, op_options(opts.timeout, tensors, async_of(opts))); });
  return track(std::move(w), tensors, tensors, c10d::OpType::ALLREDUCE);
}

WorkPtr ProcessGroupComms::allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* call = "all_reduce_coalesced";
  auto& c = live(call);
  if (tensors.empty()) fail(call, "no tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_same(tensors[i], tensors[0], call, ("tensors[" + std::to_string(i) + "]").c_str(), tensors[i].numel());
    view_of(tensors[i], Use::kReduce, call, "tensor");
  }
  at::Tensor flat = at::cat(c10::fmap(tensors, [](const at::Tensor& t) { return t.reshape(-1); }));
  const auto op = reduce_op_of(opts.reduceOp, flat, call);
  const auto v = view_of(flat, Use::kReduce, call, "tensors");
  auto w = issue([&] { return c.all_reduce(v, op, op_options(opts.timeout, {flat}, async_of(opts))); });
  Tensors keep = tensors;
  keep.push_back(flat);
  auto work = track(std::move(w), std::move(keep), tensors, c10d::OpType::ALLREDUCE_COALESCED);
  static_cast<CommsWork*>(work.get())->set_finish([flat, tensors]() mutable {
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.view(-1).copy_(flat.narrow(0, offset, t.numel()));
      offset += t.numel();
    }
  });
  return work;
}

WorkPtr ProcessGroupComms::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  const char* call = "reduce";
  auto& c = live(call);
  const auto& t = single(tensors, call, "tensor");
  check_root(opts.rootRank, getSize(), call);
  const auto v = view_of(t, Use::kReduce, call, "tensor");
  const auto op = reduce_op_of(opts.reduceOp, t, call);
  const auto o = op_options(opts.timeout, tensors, async_of(opts));
  auto w = issue([&] { return c.reduce(v, static_cast<int>(opts.rootRank), op, o); });
  return track(std::move(w), tensors, tensors, c10d::OpType::REDUCE);
}

WorkPtr ProcessGroupComms::allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                                     const c10d::AllgatherOptions& opts) {
  const char* call = "all_gather";
  auto& c = live(call);
  const auto& in = single(inputs, call, "input");
  const auto& outs = single(outputs, call, "output");
  check_per_rank(outs, in, getSize(), call, "output list");
  const auto vin = view_of(in, Use::kMove, call, "input");
  std::vector<comms::BufferView> vout;
  for (const auto& o : outs) vout.push_back(view_of(o, Use::kMove, call, "output"));
  Tensors keep = outs;
  keep.push_back(in);
  const auto o = op_options(opts.timeout, keep, async_of(opts));
  auto w = issue([&] { return c.all_gather(vin, std::span<const comms::BufferView>(vout), o); });
  return track(std::move(w), std::move(keep), outs, c10d::OpType::ALLGATHER);
}

WorkPtr ProcessGroupComms::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* call = "all_gather_into_tensor";
  auto& c = live(call);
  check_same(output, input, call, "output", input.numel() * getSize());
  const auto vin = view_of(input, Use::kMove, call, "input");
  const auto vout = view_of(output, Use::kMove, call, "output");
  Tensors keep{output, input};
  auto w = issue([&] { return c.all_gather(vin, vout, op_options(opts.timeout, keep, async_of(opts))); });
  return track(std::move(w), std::move(keep), {output}, c10d::OpType::_ALLGATHER_BASE);
}

WorkPtr ProcessGroupComms::allgather_coalesced(std::vector<Tensors>& outputs, Tensors& inputs,
                                               const c10d::AllgatherOptions& opts) {
  const char* call = "all_gather_coalesced";
  auto& c = live(call);
  if (inputs.empty()) fail(call, "input_tensor_list is empty");
  if (outputs.size() != static_cast<size_t>(getSize())) {
    fail(call, "output_tensor_lists holds " + std::to_string(outputs.size()) + " lists; it needs one per rank (" +
                   std::to_string(getSize()) + ")");
  }
  int64_t numel = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string role = "input_tensor_list[" + std::to_string(i) + "]";
    check_same(inputs[i], inputs[0], call, role.c_str(), inputs[i].numel());
    view_of(inputs[i], Use::kMove, call, role.c_str());
    numel += inputs[i].numel();
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size()) {
      fail(call, "output_tensor_lists[" + std::to_string(r) + "] holds " + std::to_string(outputs[r].size()) +
                     " tensors; it needs one per input (" + std::to_string(inputs.size()) + ")");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string role = "output_tensor_lists[" + std::to_string(r) + "][" + std::to_string(i) + "]";
      check_same(outputs[r][i], inputs[i], call, role.c_str(), inputs[i].numel());
      view_of(outputs[r][i], Use::kMove, call, role.c_str());
    }
  }
  // One all_gather of the inputs end to end; rank r's block lands in outputs[r].
  at::Tensor in_flat = at::cat(c10::fmap(inputs, [](const at::Tensor& t) { return t.reshape(-1); }));
  at::Tensor out_flat = at::empty({numel * getSize()}, inputs[0].options());
  Tensors keep{in_flat, out_flat};
  const auto vin = view_of(in_flat, Use::kMove, call, "input_tensor_list");
  const auto vout = view_of(out_flat, Use::kMove, call, "output_tensor_lists");
  auto w = issue([&] { return c.all_gather(vin, vout, op_options(opts.timeout, keep, async_of(opts))); });
  Tensors outs;
  for (const auto& list : outputs) outs.insert(outs.end(), list.begin(), list.end());
  auto work = track(std::move(w), keep, outs, c10d::OpType::ALLGATHER_COALESCED);
  static_cast<CommsWork*>(work.get())->set_finish([out_flat, outs]() mutable {
    int64_t offset = 0;
    for (auto& o : outs) {
      o.view(-1).copy_(out_flat.narrow(0, offset, o.numel()));
      offset += o.numel();
    }
  });
  return work;
}

WorkPtr ProcessGroupComms::gather(std::vector<Tensors>& outputs, Tensors& inputs, const c10d::GatherOptions& opts) {
  const char* call = "gather";
  auto& c = live(call);
  const auto& in = single(inputs, call, "input");
  check_root(opts.rootRank, getSize(), call);
  const bool is_root = getRank() == opts.rootRank;
  Tensors outs;
  if (is_root) {
    outs = single(outputs, call, "gather_list");
    check_per_rank(outs, in, getSize(), call, "gather_list");
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(call, "gather_list is given on a rank that is not the root");
  }
  const auto vin = view_of(in, Use::kMove, call, "input");
  at::Tensor staging = is_root ? at::empty({getSize() * in.numel()}, in.options()) : at::empty({0}, in.options());
  auto vout = view_of(staging, Use::kMove, call, "gather_list");
  Tensors keep{in, staging};
  auto w = issue([&] {
    return c.gather(vin, vout, static_cast<int>(opts.rootRank), op_options(opts.timeout, keep, async_of(opts)));
  });
  auto work = track(std::move(w), keep, outs, c10d::OpType::GATHER);
  if (is_root) {
    static_cast<CommsWork*>(work.get())->set_finish([staging, outs]() mutable {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].view(-1).copy_(staging.narrow(0, static_cast<int64_t>(r) * outs[r].numel(), outs[r].numel()));
      }
    });
  }
  return work;
}

WorkPtr ProcessGroupComms::scatter(Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ScatterOptions& opts) {
  const char* call = "scatter";
  auto& c = live(call);
  const auto& out = single(outputs, call, "output");
  check_root(opts.rootRank, getSize(), call);
  const bool is_root = getRank() == opts.rootRank;
  at::Tensor staging = at::empty({0}, out.options());
  if (is_root) {
    const auto& ins = single(inputs, call, "scatter_list");
    check_per_rank(ins, out, getSize(), call, "scatter_list");
    staging = at::cat(c10::fmap(ins, [](const at::Tensor& t) { return t.reshape(-1); }));
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(call, "scatter_list is given on a rank that is not the root");
  }
  const auto vout = view_of(out, Use::kMove, call, "output");
  const auto vin = view_of(staging, Use::kMove, call, "scatter_list");
  Tensors keep{out, staging};
  auto w = issue([&] {
    return c.scatter(vin, vout, static_cast<int>(opts.rootRank), op_options(opts.timeout, keep, async_of(opts)));
  });
  return track(std::move(w), std::move(keep), outputs, c10d::OpType::SCATTER);
}

WorkPtr ProcessGroupComms::reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                          const c10d::ReduceScatterOptions& opts) {
  const char* call = "reduce_scatter";
  auto& c = live(call);
  const auto& out = single(outputs, call, "output");
  const auto& ins = single(inputs, call, "input_list");
  check_per_rank(ins, out, getSize(), call, "input_list");
  const auto vout = view_of(out, Use::kReduce, call, "output");
  const auto op = reduce_op_of(opts.reduceOp, out, call);
  at::Tensor staging = at::cat(c10::fmap(ins, [](const at::Tensor& t) { return t.reshape(-1); }));
  const auto vin = view_of(staging, Use::kReduce, call, "input_list");
  Tensors keep{out, staging};
  const auto o = op_options(opts.timeout, keep, async_of(opts));
  auto w = issue([&] { return c.reduce_scatter(vin, vout, op, o); });
  return track(std::move(w), std::move(keep), outputs, c10d::OpType::REDUCE_SCATTER);
}

WorkPtr ProcessGroupComms::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts) {
  const char* call = "reduce_scatter_tensor";
  auto& c = live(call);
  check_same(input, output, call, "input", output.numel() * getSize());
  const auto vin = view_of(input, Use::kReduce, call, "input");
  const auto vout = view_of(output, Use::kReduce, call, "output");
  const auto op = reduce_op_of(opts.reduceOp, output, call);
  Tensors keep{output, input};
  const auto o = op_options(opts.timeout, keep, async_of(opts));
  auto w = issue([&] { return c.reduce_scatter(vin, vout, op, o); });
  return track(std::move(w), std::move(keep), {output}, c10d::OpType::_REDUCE_SCATTER_BASE);
}

WorkPtr ProcessGroupComms::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                         std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  const char* call = "all_to_all_single";
  auto& c = live(call);
  check_same(output, input, call, "output", output.numel());
  const auto vin = view_of(input, Use::kMove, call, "input");
  const auto vout = view_of(output, Use::kMove, call, "output");
  const auto in_counts = split_counts(input, input_splits, getSize(), vin, call, "input");
  const auto out_counts = split_counts(output, output_splits, getSize(), vout, call, "output");
  Tensors keep{output, input};
  auto w = issue([&] {
    if (input_splits.empty() && output_splits.empty() && vin.count == vout.count) {
      return c.all_to_all(vin, vout, op_options(opts.timeout, keep, async_of(opts)));
    }
    return c.all_to_all_v(vin, in_counts, vout, out_counts, op_options(opts.timeout, keep, async_of(opts)));
  });
  return track(std::move(w), std::move(keep), {output}, c10d::OpType::ALLTOALL_BASE);
}

WorkPtr ProcessGroupComms::alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) {
  const char* call = "all_to_all";
  auto& c = live(call);
  const size_t n = static_cast<size_t>(getSize());
  if (inputs.size() != n || outputs.size() != n) {
    fail(call, "input and output lists need " + std::to_string(n) + " tensors each (one per rank)");
  }
  std::vector<size_t> in_counts, out_counts;
  for (size_t r = 0; r < n; ++r) {
    check_same(inputs[r], inputs[0], call, ("input[" + std::to_string(r) + "]").c_str(), inputs[r].numel());
    check_same(outputs[r], inputs[0], call, ("output[" + std::to_string(r) + "]").c_str(), outputs[r].numel());
    in_counts.push_back(view_of(inputs[r], Use::kMove, call, "input").count);
    out_counts.push_back(view_of(outputs[r], Use::kMove, call, "output").count);
  }
  at::Tensor in_flat = at::cat(c10::fmap(inputs, [](const at::Tensor& t) { return t.reshape(-1); }));
  at::Tensor out_flat = at::empty({static_cast<int64_t>(0)}, inputs[0].options());
  int64_t out_numel = 0;
  for (const auto& o : outputs) out_numel += o.numel();
  out_flat = at::empty({out_numel}, inputs[0].options());
  const auto vin = view_of(in_flat, Use::kMove, call, "input");
  const auto vout = view_of(out_flat, Use::kMove, call, "output");
  Tensors keep{in_flat, out_flat};
  const auto o = op_options(opts.timeout, keep, async_of(opts));
  auto w = issue([&] { return c.all_to_all_v(vin, in_counts, vout, out_counts, o); });
  auto work = track(std::move(w), keep, outputs, c10d::OpType::ALLTOALL);
  static_cast<CommsWork*>(work.get())->set_finish([out_flat, outputs]() mutable {
    int64_t offset = 0;
    for (auto& o : outputs) {
      o.view(-1).copy_(out_flat.narrow(0, offset, o.numel()));
      offset += o.numel();
    }
  });
  return work;
}

WorkPtr ProcessGroupComms::p2p(Tensors& tensors, int peer, int tag, bool is_send) {
  const char* call = is_send ? "send" : "recv";
  live(call);
  const auto& t = single(tensors, call, "tensor");
  if (peer < 0 || peer >= getSize() || peer == getRank()) {
    fail(call, "peer rank " + std::to_string(peer) + " is not another rank of the group of " +
                   std::to_string(getSize()));
  }
  if (tag < 0) fail(call, "tag " + std::to_string(tag) + " is negative");
  const auto v = view_of(t, Use::kMove, call, "tensor");
  const auto type = is_send ? c10d::OpType::SEND : c10d::OpType::RECV;
  const auto u = static_cast<uint32_t>(tag);
  auto w = c10::make_intrusive<CommsWork>(comms::Work(), Tensors{t}, tensors, type, getRank(), watcher_);
  if (coalescing_) {  // one batch_p2p at endCoalescing
    w->expect_assignment();
    coalesced_ops_.push_back(is_send ? comms::P2POp::send(v, peer, u) : comms::P2POp::recv(v, peer, u));
    coalesced_tensors_.push_back(t);
    coalesced_works_.push_back(w);
    return w;
  }
  auto opts = op_options(c10d::kUnsetTimeout, tensors);
  opts.tag = u;
  channels_->post(is_send, peer, v, opts, w);
  while (!pending_.empty() && pending_.front()->isCompleted()) pending_.pop_front();
  pending_.push_back(w);
  return w;
}

#ifdef C10D_BACKEND_HAS_WINDOW
bool ProcessGroupComms::supportsWindow() const {
  return comm_ && (comms::has_windows(*comm_, comms::DeviceType::kCpu) ||
                   comms::has_windows(*comm_, comms::DeviceType::kCuda));
}

c10::intrusive_ptr<c10d::Window> ProcessGroupComms::new_window(const std::optional<at::Tensor>& tensor) {
  live("new_window");
  auto w = c10::make_intrusive<CommsWindow>(comm_, watcher_);
  if (tensor) w->tensor_register(*tensor);
  return w;
}
#endif

WorkPtr ProcessGroupComms::send(Tensors& tensors, int dst, int tag) { return p2p(tensors, dst, tag, true); }

WorkPtr ProcessGroupComms::recv(Tensors& tensors, int src, int tag) { return p2p(tensors, src, tag, false); }

WorkPtr ProcessGroupComms::recvAnysource(Tensors&, int) {
  fail("recv", "receiving from any source (src=None) is not supported by comms: name the source rank");
}

WorkPtr ProcessGroupComms::barrier(const c10d::BarrierOptions& opts) {
  auto& c = live("barrier");
  auto w = issue([&] { return c.barrier(op_options(opts.timeout, {}, async_of(opts))); });
  return track(std::move(w), {}, {}, c10d::OpType::BARRIER);
}

void ProcessGroupComms::startCoalescing() {
  live("start_coalescing");
  coalescing_ = true;
  window_last_.reset();
}

WorkPtr ProcessGroupComms::endCoalescing() {
  coalescing_ = false;
  auto ops = std::move(coalesced_ops_);
  auto tensors = std::move(coalesced_tensors_);
  auto works = std::move(coalesced_works_);
  coalesced_ops_.clear();
  coalesced_tensors_.clear();
  coalesced_works_.clear();
  if (!ops.empty()) {
    try {
      auto w = issue([&] { return live("batch_p2p").batch_p2p(ops, op_options(c10d::kUnsetTimeout, tensors)); });
      for (auto& each : works) each->assign(w);
      window_last_ = track(std::move(w), std::move(tensors), {}, c10d::OpType::COALESCED);
    } catch (...) {  // each send and recv reports it when waited on
      for (auto& each : works) each->assign_error(std::current_exception());
      throw;
    }
  }
  auto last = std::move(window_last_);
  window_last_.reset();
  if (last) return last;
  return c10::make_intrusive<CommsWork>(comms::Work(), Tensors{}, Tensors{}, c10d::OpType::COALESCED, getRank(),
                                        watcher_);  // nothing was issued: done
}

WorkPtr ProcessGroupComms::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  if (outputs.size() != inputs.size()) fail("all_gather_into_tensor_coalesced", "as many outputs as inputs");
  WorkPtr last;
  for (size_t i = 0; i < inputs.size(); ++i) last = _allgather_base(outputs[i], inputs[i], opts);
  return last;  // ops on one comm finish in issue order
}

WorkPtr ProcessGroupComms::reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != inputs.size()) fail("reduce_scatter_tensor_coalesced", "as many outputs as inputs");
  WorkPtr last;
  for (size_t i = 0; i < inputs.size(); ++i) last = _reduce_scatter_base(outputs[i], inputs[i], opts);
  return last;
}

void ProcessGroupComms::eagerConnectSingleDevice(at::Device device) {
  auto t = at::zeros({1}, at::TensorOptions().device(device));
  Tensors ts{t};
  allreduce(ts)->wait();
}

}  // namespace comms_torch
