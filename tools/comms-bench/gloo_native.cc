#include "gloo_native.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gloo/algorithm.h>
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
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "plain_reductions.h"
#include "util/strutil.h"

namespace comms::bench {
namespace {

using plugin::OpType;

// Gloo's rendezvous store over the job's, every key under one prefix per mesh.
class GlooStore final : public ::gloo::rendezvous::Store {
 public:
  GlooStore(comms::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(prefix_ + key, timeout_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> prefixed;
    for (const auto& k : keys) prefixed.push_back(prefix_ + k);
    store_.wait(prefixed, timeout_);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  comms::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// Calls f with a value of the unsigned type of an element's width: Gloo's
// algorithm classes are typed, and only the width matters to them.
template <class F>
void with_storage_type(size_t element_size, F&& f) {
  switch (element_size) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

enum class SyncClass : uint8_t { kNone, kAllgatherRing, kAllreduceRing, kBroadcastOneToAll, kBarrierAllToAll };

SyncClass sync_class_for(OpType type, size_t bytes, int size) {
  switch (type) {
    case OpType::kBarrier: return SyncClass::kBarrierAllToAll;
    case OpType::kAllReduce:
      if (bytes == 0 || bytes > kNativeSyncMaxBytes) return SyncClass::kNone;
      return bytes * static_cast<size_t>(size) <= kNativeGatherMaxBytes ? SyncClass::kAllgatherRing
                                                                        : SyncClass::kAllreduceRing;
    case OpType::kBroadcast:
      return bytes == 0 || bytes > kNativeSyncMaxBytes ? SyncClass::kNone : SyncClass::kBroadcastOneToAll;
    default: return SyncClass::kNone;
  }
}

class GlooNative final : public Baseline {
 public:
  GlooNative(Store& store, int rank, int size, int local_size, std::chrono::milliseconds timeout, bool busy_poll);
  ~GlooNative() override { close(); }

  void run(const BenchOp& op) override;
  std::string algorithm(const BenchOp& op) const override;
  std::string name() const override { return "gloo-native"; }
  void finalize() override { close(); }

 private:
  bool run_sync(const BenchOp& op, uint8_t* in, uint8_t* out);
  void run_async(const BenchOp& op, uint8_t* in, uint8_t* out);
  void one_rank(const BenchOp& op, const uint8_t* in, uint8_t* out) const;
  void close();

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::rendezvous::Context> async_ctx_, sync_ctx_;
  // Algorithm instances bound to the bench's buffers: every rank runs the
  // same sizes in the same order, so every rank builds them alike.
  using Key = std::tuple<int, const void*, void*, size_t, int, int, int>;
  struct Bound {
    std::unique_ptr<::gloo::Algorithm> algorithm;
    std::shared_ptr<void> reduction;
    std::vector<uint8_t> gathered;
  };
  std::map<Key, Bound> bound_;
  std::vector<uint8_t> tmp_;
};

GlooNative::GlooNative(Store& store, int rank, int size, int local_size, std::chrono::milliseconds timeout,
                       bool busy_poll)
    : rank_(rank), size_(size), timeout_(timeout) {
  if (size == 1) return;  // nothing to connect, and the algorithm classes need a pair
  ::gloo::transport::tcp::attr attr;
  if (local_size >= size) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    attr.hostname = host;
  }
  device_ = ::gloo::transport::tcp::CreateDevice(attr);
  for (auto* ctx : {&async_ctx_, &sync_ctx_}) {
    *ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    (*ctx)->setTimeout(timeout);
    GlooStore s(store, ctx == &async_ctx_ ? "async/" : "sync/", timeout);
    (*ctx)->connectFullMesh(s, device_);
  }
  for (int r = 0; r < size; ++r) {
    if (r != rank) sync_ctx_->getPair(r)->setSync(true, busy_poll);
  }
}

void GlooNative::close() {
  bound_.clear();
  if (async_ctx_) async_ctx_->closeConnections();
  if (sync_ctx_) sync_ctx_->closeConnections();
  async_ctx_.reset();
  sync_ctx_.reset();
}

std::string GlooNative::algorithm(const BenchOp& op) const {
  if (size_ == 1) return "one-rank copy";
  switch (sync_class_for(op.type, op.count * element_size(op.dtype), size_)) {
    case SyncClass::kAllgatherRing: return "sync AllgatherRing + local reduce";
    case SyncClass::kAllreduceRing: return "sync AllreduceRing";
    case SyncClass::kBroadcastOneToAll: return "sync BroadcastOneToAll";
    case SyncClass::kBarrierAllToAll: return "sync BarrierAllToAll";
    case SyncClass::kNone: break;
  }
  switch (op.type) {
    case OpType::kReduceScatter: return "alltoall + local reduce";
    case OpType::kSend: return "unbound-buffer send/recv";
    default: return "options-style collective";
  }
}

void GlooNative::run(const BenchOp& op) {
  auto* in = static_cast<uint8_t*>(const_cast<void*>(op.input));
  // Broadcast works in place on its one buffer, as Comm::broadcast does.
  auto* out = op.type == OpType::kBroadcast ? in : static_cast<uint8_t*>(op.output);
  if (size_ == 1) return one_rank(op, in, out);
  if (!run_sync(op, in, out)) run_async(op, in, out);
}

// What a one-rank comm makes of each op: the input is the output.
void GlooNative::one_rank(const BenchOp& op, const uint8_t* in, uint8_t* out) const {
  const size_t bytes = op.count * element_size(op.dtype);
  if (op.type == OpType::kBarrier || op.type == OpType::kBroadcast) return;
  if (out != in) std::memcpy(out, in, bytes);
  finish_reduction(out, op.dtype, op.count, op.redop, 1);
}

bool GlooNative::run_sync(const BenchOp& op, uint8_t* in, uint8_t* out) {
  const size_t es = element_size(op.dtype);
  const size_t count = op.count, bytes = count * es;
  const Key key{int(op.type), in, out, count, int(op.dtype), int(op.redop.kind), op.root};
  switch (sync_class_for(op.type, bytes, size_)) {
    case SyncClass::kAllgatherRing: {
      auto& b = bound_[key];
      if (!b.algorithm) {
        b.gathered.resize(bytes * static_cast<size_t>(size_));
        with_storage_type(es, [&](auto t) {
          using S = decltype(t);
          std::vector<const S*> ins = {reinterpret_cast<const S*>(in)};
          b.algorithm = std::make_unique<::gloo::AllgatherRing<S>>(sync_ctx_, ins,
                                                                   reinterpret_cast<S*>(b.gathered.data()), int(count));
        });
      }
      b.algorithm->run();
      const ReduceFn fn = plain_reduce_fn(op.dtype, op.redop.kind);
      fn(out, b.gathered.data(), b.gathered.data() + bytes, count);
      for (int r = 2; r < size_; ++r) fn(out, out, b.gathered.data() + r * bytes, count);
      finish_reduction(out, op.dtype, count, op.redop, size_);
      return true;
    }
    case SyncClass::kAllreduceRing: {
      if (out != in) std::memcpy(out, in, bytes);  // Gloo's ring works in place
      auto& b = bound_[key];
      if (!b.algorithm) {
        with_storage_type(es, [&](auto t) {
          using S = decltype(t);
          auto fn = std::make_shared<::gloo::ReductionFunction<S>>(::gloo::CUSTOM,
                                                                   plain_in_place_fn<S>(op.dtype, op.redop.kind));
          std::vector<S*> ptrs = {reinterpret_cast<S*>(out)};
          b.algorithm = std::make_unique<::gloo::AllreduceRing<S>>(sync_ctx_, ptrs, int(count), fn.get());
          b.reduction = fn;
        });
      }
      b.algorithm->run();
      finish_reduction(out, op.dtype, count, op.redop, size_);
      return true;
    }
    case SyncClass::kBroadcastOneToAll: {
      auto& b = bound_[key];
      if (!b.algorithm) {
        with_storage_type(es, [&](auto t) {
          using S = decltype(t);
          std::vector<S*> ptrs = {reinterpret_cast<S*>(out)};
          b.algorithm = std::make_unique<::gloo::BroadcastOneToAll<S>>(sync_ctx_, ptrs, int(count), op.root);
        });
      }
      b.algorithm->run();
      return true;
    }
    case SyncClass::kBarrierAllToAll: {
      auto& b = bound_[key];
      if (!b.algorithm) b.algorithm = std::make_unique<::gloo::BarrierAllToAll>(sync_ctx_);
      b.algorithm->run();
      return true;
    }
    case SyncClass::kNone: break;
  }
  return false;
}

// Gloo's options-style collectives on the asynchronous mesh.
void GlooNative::run_async(const BenchOp& op, uint8_t* in, uint8_t* out) {
  const size_t es = element_size(op.dtype);
  const size_t count = op.count, bytes = count * es;
  const auto n = static_cast<size_t>(size_);
  const ReduceFn fn = plain_reduce_fn(op.dtype, op.redop.kind);
  switch (op.type) {
    case OpType::kAllReduce:
    case OpType::kReduce:
      with_storage_type(es, [&](auto t) {
        using S = decltype(t);
        if (op.type == OpType::kAllReduce) {
          ::gloo::AllreduceOptions o(async_ctx_);
          if (in != out) o.setInput(reinterpret_cast<S*>(in), count);
          o.setOutput(reinterpret_cast<S*>(out), count);
          o.setReduceFunction(fn);
          o.setTimeout(timeout_);
          ::gloo::allreduce(o);
        } else {
          ::gloo::ReduceOptions o(async_ctx_);
          o.setRoot(op.root);
          if (in != out) o.setInput(reinterpret_cast<S*>(in), count);
          o.setOutput(reinterpret_cast<S*>(out), count);
          o.setReduceFunction(fn);
          o.setTimeout(timeout_);
          ::gloo::reduce(o);
        }
      });
      if (op.type == OpType::kAllReduce || rank_ == op.root) finish_reduction(out, op.dtype, count, op.redop, size_);
      return;
    case OpType::kBroadcast: {
      ::gloo::BroadcastOptions o(async_ctx_);
      o.setRoot(op.root);
      o.setOutput(out, bytes);
      o.setTimeout(timeout_);
      ::gloo::broadcast(o);
      return;
    }
    case OpType::kAllGather: {
      ::gloo::AllgatherOptions o(async_ctx_);
      o.setInput(in, bytes);
      o.setOutput(out, bytes * n);
      o.setTimeout(timeout_);
      ::gloo::allgather(o);
      return;
    }
    case OpType::kReduceScatter:
    case OpType::kAllToAll: {
      // reduce_scatter: every rank's slice for this rank, then reduced here.
      const bool scatter = op.type == OpType::kReduceScatter;
      if (scatter) tmp_.resize(bytes * n);
      ::gloo::AlltoallOptions o(async_ctx_);
      o.setInput(in, bytes * n);
      o.setOutput(scatter ? tmp_.data() : out, bytes * n);
      o.setTimeout(timeout_);
      ::gloo::alltoall(o);
      if (!scatter) return;
      fn(out, tmp_.data(), tmp_.data() + bytes, count);
      for (size_t r = 2; r < n; ++r) fn(out, out, tmp_.data() + r * bytes, count);
      finish_reduction(out, op.dtype, count, op.redop, size_);
      return;
    }
    case OpType::kGather: {
      ::gloo::GatherOptions o(async_ctx_);
      o.setRoot(op.root);
      o.setInput(in, bytes);
      if (rank_ == op.root) o.setOutput(out, bytes * n);
      o.setTimeout(timeout_);
      ::gloo::gather(o);
      return;
    }
    case OpType::kScatter: {
      ::gloo::ScatterOptions o(async_ctx_);
      o.setRoot(op.root);
      if (rank_ == op.root) {
        std::vector<uint8_t*> ins(n);
        for (size_t r = 0; r < n; ++r) ins[r] = in + r * bytes;
        o.setInputs(ins, bytes);
      }
      o.setOutput(out, bytes);
      o.setTimeout(timeout_);
      ::gloo::scatter(o);
      return;
    }
    case OpType::kSend: {
      auto s = async_ctx_->createUnboundBuffer(in, bytes);
      auto r = async_ctx_->createUnboundBuffer(out, bytes);
      const uint64_t slot = ::gloo::Slot::build(0x41, 0);
      s->send(op.peer, slot);
      r->recv(op.peer, slot);
      s->waitSend(timeout_);
      r->waitRecv(timeout_);
      return;
    }
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("comms-bench --gloo-native: ", plugin::op_name(op.type), " is not one of its ops"));
  }
}

}  // namespace

std::unique_ptr<Baseline> open_gloo_native(Store& store, int rank, int size, int local_size,
                                           std::chrono::milliseconds timeout, bool busy_poll) {
  return std::make_unique<GlooNative>(store, rank, size, local_size, timeout, busy_poll);
}

}  // namespace comms::bench
