#include "gloo_backend.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

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
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <nlohmann/json.hpp>

#include "algorithms.h"
#include "bind_address.h"
#include "comms/env.h"
#include "reductions.h"
#include "send_buffers.h"
#include "sockets.h"
#include "store_adapter.h"
#include "sync_mesh.h"

namespace comms::gloo_backend {
namespace {

using plugin::OpType;
using Clock = std::chrono::steady_clock;

// Slot prefix for point-to-point messages; Gloo's collectives use 0x01..0x0f.
constexpr uint8_t kP2PSlotPrefix = 0x40;

std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) out.append(p);
  return out;
}

// One transport device (and its event-loop thread) per bind address, shared
// by every comm of the process.
std::shared_ptr<::gloo::transport::Device> shared_device(const GlooConfig& cfg) {
  static std::mutex mu;
  static auto* devices = new std::map<std::string, std::shared_ptr<::gloo::transport::Device>>();
  const std::string key = cfg.interface.empty() ? "host:" + cfg.hostname : "iface:" + cfg.interface;
  std::lock_guard<std::mutex> lock(mu);
  auto& d = (*devices)[key];
  if (!d) {
    ::gloo::transport::tcp::attr attr;
    if (!cfg.interface.empty()) attr.iface = cfg.interface;
    else attr.hostname = cfg.hostname;
    d = ::gloo::transport::tcp::CreateDevice(attr);
  }
  return d;
}

std::string endpoint_port(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return std::to_string(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
  if (a.ss_family == AF_INET6) return std::to_string(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
  return {};
}

// An op with everything it points to copied, so it can run later.
struct OwnedOp {
  plugin::OpDesc desc;
  std::vector<size_t> counts, output_counts;
  std::vector<void*> output_list;
  std::vector<P2POp> p2p;

  explicit OwnedOp(const plugin::OpDesc& d)
      : desc(d),
        counts(d.counts.begin(), d.counts.end()),
        output_counts(d.output_counts.begin(), d.output_counts.end()),
        output_list(d.output_list.begin(), d.output_list.end()),
        p2p(d.p2p.begin(), d.p2p.end()) {
    desc.counts = counts;
    desc.output_counts = output_counts;
    desc.output_list = output_list;
    desc.p2p = p2p;
    desc.hints = nullptr;  // per-op hints were applied at submit
  }
};

struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
};

class GlooWork : public plugin::Work {
 public:
  explicit GlooWork(std::shared_ptr<Completion> c) : c_(std::move(c)) {}
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(c_->mu);
    return c_->done;
  }
  Status wait(WaitMode) override {
    std::unique_lock<std::mutex> lock(c_->mu);
    c_->cv.wait(lock, [&] { return c_->done; });
    return c_->status;
  }

 private:
  std::shared_ptr<Completion> c_;
};

class GlooBackend : public plugin::Backend {
 public:
  GlooBackend(const plugin::BackendInit& init, GlooConfig config)
      : init_(init), config_(std::move(config)), op_timeout_(init.op_timeout) {}

  ~GlooBackend() override {
    if (!finalized_) finalize();
  }

  Status init() override;
  Status submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) override;
  Status split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) override;
  Status set_hints(const Hints& hints) override;
  Status set_op_timeout(std::chrono::milliseconds t) override {
    op_timeout_ = t;
    return {};
  }
  void abort(const std::string& reason) override;
  Status finalize() override;
  std::string describe() const override;
  bool supports_reduction(DataType dtype, ReduceKind kind) const override {
    return reduce_fn(dtype, kind) != nullptr;
  }

 private:
  Status execute(const plugin::OpDesc& op);
  void run(const plugin::OpDesc& op);
  Status translate(const std::exception& e, const plugin::OpDesc* op) const;
  void mark_broken(const std::string& reason);
  Status broken_status() const;
  void worker_loop();
  void* scratch(size_t bytes);
  int peer_of(const std::string& message) const;

  // Ops, with the Gloo call each is built on.
  void all_reduce(const plugin::OpDesc& op);
  void reduce(const plugin::OpDesc& op);
  void all_gather(const plugin::OpDesc& op, void* output);
  void reduce_scatter(const plugin::OpDesc& op, std::span<const size_t> counts);
  void all_to_all_v(const plugin::OpDesc& op, const void* input, std::span<const size_t> in_counts,
                    std::span<const size_t> out_counts);
  void gather(const plugin::OpDesc& op);
  void scatter(const plugin::OpDesc& op);
  void point_to_point(std::span<const P2POp> ops, std::chrono::milliseconds timeout);
  void run_locally(const plugin::OpDesc& op);
  bool fast_path_fits(const plugin::OpDesc& op) const;
  void run_fast(const plugin::OpDesc& op);
  std::shared_ptr<::gloo::rendezvous::Context> connect_mesh(const std::string& prefix);
  void finish_reduction(const plugin::OpDesc& op, void* data, size_t n) const;

  plugin::BackendInit init_;
  GlooConfig config_;
  std::atomic<std::chrono::milliseconds> op_timeout_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::rendezvous::Context> ctx_;       // async pairs: every op
  std::shared_ptr<::gloo::rendezvous::Context> fast_ctx_;  // sync pairs: small ops
  std::chrono::milliseconds fast_timeout_{0};  // fixed in the sync pairs at connect
  std::unique_ptr<SyncMesh> sync_;             // the sync mesh's collectives
  std::vector<sockaddr_storage> local_endpoints_;  // of our pairs, for abort()
  std::vector<std::pair<sockaddr_storage, int>> peer_endpoints_;  // remote end -> rank
  std::vector<uint8_t> scratch_;  // reused across ops; only the executing thread touches it

  // Failure state: after the first fatal error every op fails fast.
  mutable std::mutex broken_mu_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> aborted_{false};
  std::string broken_reason_;

  // Executor: async ops run in order on one worker; sync ops run on the
  // caller's thread once the worker is idle (no thread hop on the fast path).
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::pair<OwnedOp, std::shared_ptr<Completion>>> queue_;
  // Queued + running async ops. Only the submitting thread increments it, so
  // a sync op that reads 0 knows nothing is outstanding and skips the lock.
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::thread worker_;
  bool finalized_ = false;
};

std::shared_ptr<::gloo::rendezvous::Context> GlooBackend::connect_mesh(const std::string& prefix) {
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(init_.rank, init_.size);
  // Pairs copy the context timeout when they are created and use it as their
  // socket read/write timeout, so it must be the op timeout already.
  ctx->setTimeout(op_timeout_.load());
  StoreAdapter store(*init_.store, prefix, init_.init_timeout);
  ctx->connectFullMesh(store, device_);
  return ctx;
}

Status GlooBackend::init() {
  if (init_.size == 1) return {};  // nothing to connect to
  const std::set<int> sockets_before = socket_fds();
  try {
    device_ = shared_device(config_);
    ctx_ = connect_mesh("async/");
    // The sync pairs take their read timeout now; ops with another timeout
    // use the async mesh.
    fast_timeout_ = op_timeout_.load();
    fast_ctx_ = connect_mesh("sync/");
    for (int r = 0; r < init_.size; ++r) {
      if (r != init_.rank) fast_ctx_->getPair(r)->setSync(true, config_.busy_poll == "1");
    }
    size_send_buffers(*fast_ctx_, *ctx_, init_.init_timeout);
    sync_ = std::make_unique<SyncMesh>(fast_ctx_, config_.spin);
    set_cloexec_on_sockets_since(sockets_before);
    // Remember both ends of every connection: the local ends let abort()
    // find the sockets, the remote ends turn Gloo's "peer [addr]" messages
    // into ranks.
    std::vector<int> ranks_of_locals;
    for (auto* ctx : {ctx_.get(), fast_ctx_.get()}) {
      for (int r = 0; r < init_.size; ++r) {
        if (r == init_.rank) continue;
        auto& pair = ctx->getPair(r);
        if (!pair) continue;
        const auto& addr = static_cast<const ::gloo::transport::tcp::Address&>(pair->address());
        local_endpoints_.push_back(addr.getSockaddr());
        ranks_of_locals.push_back(r);
      }
    }
    for_each_socket_bound_to(local_endpoints_, [&](int fd, size_t i) {
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
        peer_endpoints_.emplace_back(peer, ranks_of_locals[i]);
      }
    });
    return {};
  } catch (const comms::Error& e) {
    return {e.code(), cat({"rendezvous through the store failed: ", e.what()})};
  } catch (const std::exception& e) {
    Status s = translate(e, nullptr);
    s.message = cat({"connecting the Gloo mesh (", config_.interface.empty() ? "host " : "interface ",
                     config_.interface.empty() ? config_.hostname : config_.interface, ") failed: ",
                     s.message});
    return s;
  }
}

bool GlooBackend::fast_path_fits(const plugin::OpDesc& op) const {
  return fast_ctx_ && op.timeout == fast_timeout_ &&
         sync_algorithm_for(op.type, op.count * element_size(op.dtype), init_.size) != SyncAlgorithm::kNone;
}

void GlooBackend::run_fast(const plugin::OpDesc& op) {
  const size_t es = element_size(op.dtype);
  const size_t bytes = op.count * es;
  const ReduceFn fn = reduce_fn(op.dtype, op.reduce.kind);
  switch (op.type) {
    case OpType::kBarrier:
      return sync_->barrier();
    case OpType::kBroadcast:
      return sync_->broadcast(op.input, op.output, bytes, op.root);
    case OpType::kAllReduce:
      sync_->all_reduce(op.input, op.output, op.count, es, fn);
      return finish_reduction(op, op.output, op.count);
    case OpType::kReduce:
      sync_->reduce(op.input, op.output, op.count, es, fn, op.root);
      if (init_.rank == op.root) finish_reduction(op, op.output, op.count);
      return;
    case OpType::kReduceScatter:
      sync_->reduce_scatter(op.input, op.output, op.count, es, fn);
      return finish_reduction(op, op.output, op.count);
    case OpType::kAllGather:
      return sync_->all_gather(op.input, op.output, bytes);
    case OpType::kAllToAll:
      return sync_->all_to_all(op.input, op.output, bytes);
    case OpType::kGather:
      return sync_->gather(op.input, op.output, bytes, op.root);
    case OpType::kScatter:
      return sync_->scatter(op.input, op.output, bytes, op.root);
    default:
      throw std::logic_error("no sync-mesh algorithm for this op");
  }
}

int GlooBackend::peer_of(const std::string& message) const {
  // Gloo names peers as "[<address>]:<port>"; match the port and address.
  for (const auto& [ep, rank] : peer_endpoints_) {
    const std::string port = endpoint_port(ep);
    char host[64] = {};
    if (ep.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ep).sin_addr, host, sizeof host);
    } else if (ep.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ep).sin6_addr, host, sizeof host);
    }
    if (message.find(cat({"[", host, "]:", port})) != std::string::npos) return rank;
  }
  return -1;
}

Status GlooBackend::translate(const std::exception& e, const plugin::OpDesc* op) const {
  const std::string what = e.what();
  const int peer = op && (op->type == OpType::kSend || op->type == OpType::kRecv) ? op->peer
                                                                                  : peer_of(what);
  if (aborted_) return {ErrorCode::kAborted, cat({"aborted: ", broken_reason_, " (", what, ")"}), peer};
  auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
  if (has("Timed out") || has("timeout") || has("Timeout")) {
    return {ErrorCode::kTimeout, what, peer};
  }
  if (dynamic_cast<const ::gloo::IoException*>(&e) || has("closed") || has("reset") ||
      has("Broken pipe") || has("Connection refused")) {
    return {ErrorCode::kPeerFailure, what, peer};
  }
  return {ErrorCode::kInternal, what, peer};
}

void GlooBackend::mark_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (!broken_) {
    broken_reason_ = reason;
    broken_ = true;
  }
}

Status GlooBackend::broken_status() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return {ErrorCode::kAborted, cat({"an earlier failure left this communicator unusable: ", broken_reason_})};
}

Status GlooBackend::execute(const plugin::OpDesc& op) {
  if (broken_) return broken_status();
  try {
    run(op);
    return {};
  } catch (const std::exception& e) {
    Status s = translate(e, &op);
    mark_broken(s.message);
    return s;
  }
}

Status GlooBackend::submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) {
  if (op.hints && !op.hints->empty()) {
    return {ErrorCode::kInvalidArgument,
            cat({"the gloo backend takes no per-op hints (got '", op.hints->begin()->first, "')"})};
  }
  if (broken_) return broken_status();
  if (!op.async) {
    // Ops run in order: wait until the worker drained the async ones.
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(q_mu_);
      idle_cv_.wait(lock, [&] { return pending_.load() == 0; });
    }
    return execute(op);
  }
  auto completion = std::make_shared<Completion>();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    queue_.emplace_back(OwnedOp(op), completion);
    ++pending_;
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  }
  q_cv_.notify_one();
  *work = std::make_unique<GlooWork>(std::move(completion));
  return {};
}

void GlooBackend::worker_loop() {
  std::unique_lock<std::mutex> lock(q_mu_);
  while (true) {
    q_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    auto [op, completion] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Status s = execute(op.desc);
    completion->finish(std::move(s));
    lock.lock();
    if (--pending_ == 0) idle_cv_.notify_all();
  }
}

void* GlooBackend::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void GlooBackend::finish_reduction(const plugin::OpDesc& op, void* data, size_t n) const {
  if (op.reduce.kind == ReduceKind::kAvg) divide(data, op.dtype, n, init_.size);
  else if (op.reduce.kind == ReduceKind::kPremulSum) scale(data, op.dtype, n, op.reduce.scalar);
}


void GlooBackend::all_reduce(const plugin::OpDesc& op) {
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
  finish_reduction(op, op.output, op.count);
}

void GlooBackend::reduce(const plugin::OpDesc& op) {
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
  if (init_.rank == op.root) finish_reduction(op, out, op.count);
}

void GlooBackend::all_gather(const plugin::OpDesc& op, void* output) {
  const size_t es = element_size(op.dtype);
  ::gloo::AllgatherOptions o(ctx_);
  const bool in_place = output == op.output && op.in_place;
  if (!in_place) o.setInput(static_cast<uint8_t*>(const_cast<void*>(op.input)), op.count * es);
  o.setOutput(static_cast<uint8_t*>(output), op.count * es * init_.size);
  o.setTimeout(op.timeout);
  ::gloo::allgather(o);
}

void GlooBackend::all_to_all_v(const plugin::OpDesc& op, const void* input,
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
void GlooBackend::reduce_scatter(const plugin::OpDesc& op, std::span<const size_t> counts) {
  const size_t es = element_size(op.dtype);
  const int n = init_.size;
  const size_t mine = counts[static_cast<size_t>(init_.rank)];
  std::vector<size_t> recv_counts(static_cast<size_t>(n), mine);
  uint8_t* tmp = static_cast<uint8_t*>(scratch(mine * es * static_cast<size_t>(n)));
  plugin::OpDesc exchange = op;
  exchange.output = tmp;
  all_to_all_v(exchange, op.input, counts, recv_counts);
  const ReduceFn fn = reduce_fn(op.dtype, op.reduce.kind);
  if (mine == 0) return;  // a _v op may give this rank nothing (and a null output)
  std::memcpy(op.output, tmp, mine * es);
  for (int r = 1; r < n; ++r) fn(op.output, op.output, tmp + static_cast<size_t>(r) * mine * es, mine);
  finish_reduction(op, op.output, mine);
}

void GlooBackend::gather(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  const void* input = op.input;
  if (op.in_place) input = std::memcpy(scratch(bytes), op.input, bytes);  // Gloo copies in -> out slice
  ::gloo::GatherOptions o(ctx_);
  o.setRoot(op.root);
  o.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes);
  if (init_.rank == op.root) o.setOutput(static_cast<uint8_t*>(op.output), bytes * init_.size);
  o.setTimeout(op.timeout);
  ::gloo::gather(o);
}

void GlooBackend::scatter(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  ::gloo::ScatterOptions o(ctx_);
  o.setRoot(op.root);
  if (init_.rank == op.root) {
    const uint8_t* base = static_cast<const uint8_t*>(op.input);
    if (op.in_place) base = static_cast<uint8_t*>(std::memcpy(scratch(bytes * init_.size), base, bytes * init_.size));
    std::vector<uint8_t*> inputs(static_cast<size_t>(init_.size));
    for (int r = 0; r < init_.size; ++r) inputs[static_cast<size_t>(r)] = const_cast<uint8_t*>(base) + r * bytes;
    o.setInputs(inputs, bytes);
  }
  o.setOutput(static_cast<uint8_t*>(op.output), bytes);
  o.setTimeout(op.timeout);
  ::gloo::scatter(o);
}

void GlooBackend::point_to_point(std::span<const P2POp> ops, std::chrono::milliseconds timeout) {
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

// A single rank: every collective is a copy (plus the avg/premul finish).
void GlooBackend::run_locally(const plugin::OpDesc& op) {
  const size_t bytes = op.count * element_size(op.dtype);
  auto copy = [](void* dst, const void* src, size_t n) {
    if (dst != src && n) std::memmove(dst, src, n);
  };
  switch (op.type) {
    case OpType::kAllReduce:
    case OpType::kReduce:
    case OpType::kReduceScatter:
      if (op.output) {
        copy(op.output, op.input, bytes);
        finish_reduction(op, op.output, op.count);
      }
      return;
    case OpType::kReduceScatterV:
      copy(op.output, op.input, op.counts[0] * element_size(op.dtype));
      finish_reduction(op, op.output, op.counts[0]);
      return;
    case OpType::kAllGather:
    case OpType::kGather:
    case OpType::kScatter:
    case OpType::kAllToAll:
      copy(op.output, op.input, bytes);
      return;
    case OpType::kAllGatherList:
      copy(op.output_list[0], op.input, bytes);
      return;
    case OpType::kAllGatherV:
      copy(op.output, op.input, op.counts[0] * element_size(op.dtype));
      return;
    case OpType::kAllToAllV:
      copy(op.output, op.input, op.counts[0] * element_size(op.dtype));
      return;
    case OpType::kBroadcast:
    case OpType::kBarrier:
    case OpType::kBatchP2P:  // validated: no peer but self exists, so empty
      return;
    case OpType::kSend:
    case OpType::kRecv:
      throw std::invalid_argument("point-to-point needs a peer");
  }
}

void GlooBackend::run(const plugin::OpDesc& op) {
  if (init_.size == 1) return run_locally(op);
  if (fast_path_fits(op)) return run_fast(op);
  const size_t es = element_size(op.dtype);
  switch (op.type) {
    case OpType::kAllReduce:
      if (op.count) all_reduce(op);
      return;
    case OpType::kReduce:
      if (op.count) reduce(op);
      return;
    case OpType::kBroadcast: {
      if (!op.count) return;
      ::gloo::BroadcastOptions o(ctx_);
      o.setRoot(op.root);
      o.setOutput(static_cast<uint8_t*>(op.output), op.count * es);
      o.setTimeout(op.timeout);
      ::gloo::broadcast(o);
      return;
    }
    case OpType::kAllGather:
      if (op.count) all_gather(op, op.output);
      return;
    case OpType::kAllGatherList: {
      if (!op.count) return;
      const size_t bytes = op.count * es;
      uint8_t* tmp = static_cast<uint8_t*>(scratch(bytes * init_.size));
      all_gather(op, tmp);
      for (int r = 0; r < init_.size; ++r) {
        if (op.output_list[static_cast<size_t>(r)] != tmp + r * bytes) {
          std::memcpy(op.output_list[static_cast<size_t>(r)], tmp + r * bytes, bytes);
        }
      }
      return;
    }
    case OpType::kAllGatherV: {
      std::vector<size_t> bytes(op.counts.size());
      size_t total = 0;
      for (size_t i = 0; i < bytes.size(); ++i) total += bytes[i] = op.counts[i] * es;
      if (!total) return;
      ::gloo::AllgathervOptions o(ctx_);
      if (!op.in_place) o.setInput(static_cast<uint8_t*>(const_cast<void*>(op.input)), bytes[static_cast<size_t>(init_.rank)]);
      o.setOutput(static_cast<uint8_t*>(op.output), bytes);
      o.setTimeout(op.timeout);
      ::gloo::allgatherv(o);
      return;
    }
    case OpType::kReduceScatter: {
      if (!op.count) return;
      std::vector<size_t> counts(static_cast<size_t>(init_.size), op.count);
      reduce_scatter(op, counts);
      return;
    }
    case OpType::kReduceScatterV: {
      size_t total = 0;
      for (size_t c : op.counts) total += c;
      if (total) reduce_scatter(op, op.counts);
      return;
    }
    case OpType::kAllToAll: {
      if (!op.count) return;
      const size_t bytes = op.count * es * init_.size;
      const void* input = op.in_place ? std::memcpy(scratch(bytes), op.input, bytes) : op.input;
      ::gloo::AlltoallOptions o(ctx_);
      o.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes);
      o.setOutput(static_cast<uint8_t*>(op.output), bytes);
      o.setTimeout(op.timeout);
      ::gloo::alltoall(o);
      return;
    }
    case OpType::kAllToAllV: {
      size_t in_total = 0, out_total = 0;
      for (size_t c : op.counts) in_total += c;
      for (size_t c : op.output_counts) out_total += c;
      const void* input = op.input;
      if (op.in_place && in_total) input = std::memcpy(scratch(in_total * es), op.input, in_total * es);
      all_to_all_v(op, input, op.counts, op.output_counts);
      return;
    }
    case OpType::kGather:
      if (op.count) gather(op);
      return;
    case OpType::kScatter:
      if (op.count) scatter(op);
      return;
    case OpType::kBarrier: {
      ::gloo::BarrierOptions o(ctx_);
      o.setTimeout(op.timeout);
      ::gloo::barrier(o);
      return;
    }
    case OpType::kSend:
    case OpType::kRecv: {
      const P2POp p{op.type == OpType::kSend ? P2POp::Kind::kSend : P2POp::Kind::kRecv,
                    BufferView{op.type == OpType::kSend ? const_cast<void*>(op.input) : op.output,
                               op.count, op.dtype, op.device},
                    op.peer, op.tag};
      point_to_point({&p, 1}, op.timeout);
      return;
    }
    case OpType::kBatchP2P:
      point_to_point(op.p2p, op.timeout);
      return;
  }
}

Status GlooBackend::split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) {
  if (desc.ranks.empty()) return {};  // a Gloo child is its own mesh: nothing to do here
  GlooConfig cfg;
  Status s = resolve_config(desc.child.hints, desc.child.local_size, desc.child.size,
                            init_.store_local_address, &cfg);
  if (!s.is_ok()) return s;
  plugin::BackendInit child_init = desc.child;
  child_init.store_local_address = init_.store_local_address;
  auto backend = std::make_unique<GlooBackend>(child_init, std::move(cfg));
  s = backend->init();
  if (!s.is_ok()) return s;
  *child = std::move(backend);
  return {};
}

Status GlooBackend::set_hints(const Hints& hints) {
  for (const auto& [k, v] : hints) {
    if (k == "busy_poll") {
      GlooConfig cfg = config_;
      Status s = resolve_busy_poll(v, "hint gloo.busy_poll", init_.local_size, &cfg);
      if (!s.is_ok()) return s;
      config_.busy_poll = cfg.busy_poll;
      config_.busy_poll_enabled = cfg.busy_poll_enabled;
      config_.spin = cfg.spin;
      if (fast_ctx_) {
        for (int r = 0; r < init_.size; ++r) {
          if (r != init_.rank) fast_ctx_->getPair(r)->setSync(true, cfg.busy_poll == "1");
        }
        sync_->set_spin(cfg.spin);
      }
    } else {
      return {ErrorCode::kUnsupported,
              cat({"gloo hint '", k, "' cannot change after the comm connected; pass it when creating the comm"})};
    }
  }
  return {};
}

void GlooBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (!broken_) broken_reason_ = reason;
    broken_ = true;
  }
  aborted_ = true;
  // Wake every thread blocked on these sockets (ours and Gloo's loop):
  // shutdown() makes their reads fail now, and the peers see EOF.
  for_each_socket_bound_to(local_endpoints_, [](int fd, size_t) { ::shutdown(fd, SHUT_RDWR); });
}

Status GlooBackend::finalize() {
  if (finalized_) return {};
  finalized_ = true;
  {
    std::unique_lock<std::mutex> lock(q_mu_);
    idle_cv_.wait(lock, [&] { return pending_.load() == 0; });
    stop_ = true;
  }
  q_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  sync_.reset();  // its buffers unregister from the pairs
  try {
    if (ctx_) ctx_->closeConnections();
    if (fast_ctx_) fast_ctx_->closeConnections();
  } catch (const std::exception& e) {
    ctx_.reset();
    fast_ctx_.reset();
    return {ErrorCode::kInternal, cat({"closing Gloo connections: ", e.what()})};
  }
  ctx_.reset();
  fast_ctx_.reset();
  return {};
}

std::string GlooBackend::describe() const {
  nlohmann::ordered_json j;
  j["transport"] = "tcp";
  j["interface"] = config_.interface;
  j["hostname"] = config_.hostname;
  j["busy_poll"] = config_.busy_poll;
  j["busy_poll_enabled"] = config_.busy_poll_enabled;
  j["spin_us"] = config_.spin.count();
  j["sync_path_max_bytes"] = kSyncPathMaxBytes;
  j["op_timeout_ms"] = op_timeout_.load().count();
  return j.dump();
}

}  // namespace

Status resolve_busy_poll(const std::string& value, const std::string& source, int local_size, GlooConfig* cfg) {
  std::string mode = value;
  for (char& c : mode) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (mode != "auto") {
    try {
      mode = env::parse_bool(value, source) ? "1" : "0";
    } catch (const Error&) {
      return {ErrorCode::kInvalidArgument,
              cat({source, "='", value, "' is not auto or a boolean; use auto, 1/0, true/false, yes/no or on/off"})};
    }
  }
  cfg->busy_poll = mode;
  cfg->spin = read_spin(mode, local_size);
  cfg->busy_poll_enabled = mode == "1" || cfg->spin.count() > 0;
  return {};
}

Status resolve_config(const Hints& hints, int local_size, int size,
                      const std::string& store_local_address, GlooConfig* out) {
  GlooConfig cfg;
  // Each setting with where it came from, for messages.
  std::string interface_from = "COMMS_GLOO_IFNAME", hostname_from = "COMMS_GLOO_HOSTNAME";
  std::string busy_poll_from = "COMMS_GLOO_BUSY_POLL";
  cfg.interface = env::get("COMMS_GLOO_IFNAME").value_or("");
  cfg.hostname = env::get("COMMS_GLOO_HOSTNAME").value_or("");
  std::string busy_poll = env::get("COMMS_GLOO_BUSY_POLL").value_or(std::string(kDefaultBusyPoll));
  if (hints.count("interface") && hints.count("hostname")) {
    return {ErrorCode::kInvalidArgument,
            cat({"hints gloo.interface='", hints.find("interface")->second, "' and gloo.hostname='",
                 hints.find("hostname")->second, "' are both given; give one"})};
  }
  for (const auto& [k, v] : hints) {
    if (k == "interface") {
      cfg.interface = v;
      interface_from = "hint gloo.interface";
      cfg.hostname.clear();
    } else if (k == "hostname") {
      cfg.hostname = v;
      hostname_from = "hint gloo.hostname";
      cfg.interface.clear();
    } else if (k == "busy_poll") {
      busy_poll = v;
      busy_poll_from = "hint gloo.busy_poll";
    } else {
      return {ErrorCode::kInvalidArgument, cat({"unknown gloo hint '", k, "'"})};
    }
  }
  // Values are checked once every key is known to be one: an unknown key is
  // reported first, whatever the map's order puts before it.
  if (hints.count("interface") && cfg.interface.empty()) {
    return {ErrorCode::kInvalidArgument, "hint gloo.interface is empty; name a network interface"};
  }
  if (hints.count("hostname") && cfg.hostname.empty()) {
    return {ErrorCode::kInvalidArgument, "hint gloo.hostname is empty; give a host name or address"};
  }
  Status s = resolve_busy_poll(busy_poll, busy_poll_from, local_size, &cfg);
  if (!s.is_ok()) return s;
  if (!cfg.interface.empty() && !cfg.hostname.empty()) {
    return {ErrorCode::kInvalidArgument,
            cat({"COMMS_GLOO_IFNAME='", cfg.interface, "' and COMMS_GLOO_HOSTNAME='", cfg.hostname,
                 "' are both set; set either a Gloo interface or a host name, not both"})};
  }
  if (cfg.interface.empty() && cfg.hostname.empty()) {
    // The address that reaches the store reaches the other hosts too. With
    // no TCP store, a job on one host stays on loopback.
    if (!store_local_address.empty()) {
      cfg.hostname = store_local_address;
      hostname_from = "the address this process reaches the store from";
    } else if (local_size >= size) {
      cfg.hostname = "127.0.0.1";
      hostname_from = "the default bind address";
    } else {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      cfg.hostname = host;
      hostname_from = "this host's name (gethostname(2); set COMMS_GLOO_IFNAME or COMMS_GLOO_HOSTNAME)";
    }
  }
  // Gloo crashes or throws on what it cannot bind: check it here first.
  s = cfg.interface.empty() ? check_hostname(cfg.hostname, hostname_from)
                            : check_interface(cfg.interface, interface_from);
  if (!s.is_ok()) return s;
  *out = std::move(cfg);
  return {};
}

// Gloo writes with writev(2), which cannot pass MSG_NOSIGNAL, so a write to
// a peer that has closed raises SIGPIPE, whose default kills the process
// instead of letting the op fail with peer_failure. Ignore it when it is at
// its default, as Python does; a handler the program installed stays.
void ignore_default_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

Status create_backend(const plugin::BackendInit& init, std::unique_ptr<plugin::Backend>* out) {
  ignore_default_sigpipe();
  GlooConfig cfg;
  Status s = resolve_config(init.hints, init.local_size, init.size, init.store_local_address, &cfg);
  if (!s.is_ok()) return s;
  *out = std::make_unique<GlooBackend>(init, std::move(cfg));
  return {};
}

}  // namespace comms::gloo_backend
