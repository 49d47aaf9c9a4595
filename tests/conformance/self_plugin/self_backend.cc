// "self": a complete backend for groups of one rank, built only against the
// plugin ABI (comms/plugin.h) and comms/numeric.h. It is the smallest plugin
// that passes comms-conformance, and the template for a third party's own.
//
// With one rank every collective is a copy, except the reductions that change
// a lone value: avg divides by 1 and premul_sum multiplies by its factor.
// Built with -DSELF_PLUGIN_BROKEN it ignores premul_sum's factor, so that the
// suite's own test can show the suite catching a wrong reduction. Built with
// -DSELF_PLUGIN_CUDA it is "selfcuda": it claims one cuda device and moves
// the buffers as host memory, and refuses an op without the caller's stream,
// so that the suite's cuda paths run without a GPU (comms-conformance
// --stand-in-device keeps its "device" buffers on the host).
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "comms/numeric.h"
#include "comms/plugin.h"

namespace {

using comms::DataType;
using comms::ErrorCode;
using comms::ReduceKind;
using comms::Status;
using comms::plugin::OpDesc;
using comms::plugin::OpType;

// Every op finishes inside submit(), so a Work only carries the status.
class DoneWork : public comms::plugin::Work {
 public:
  explicit DoneWork(Status s) : status_(std::move(s)) {}
  bool is_completed() override { return true; }
  Status wait(comms::WaitMode) override { return status_; }

 private:
  Status status_;
};

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

// Integers multiply in two's complement (wrapping), like the other backends.
int64_t wrap_to(DataType t, int64_t v) {
  switch (t) {
    case DataType::kInt8: return static_cast<int8_t>(v);
    case DataType::kUint8: return static_cast<uint8_t>(v);
    case DataType::kInt32: return static_cast<int32_t>(v);
    case DataType::kUint32: return static_cast<uint32_t>(v);
    default: return v;
  }
}

[[maybe_unused]] void scale(void* data, DataType t, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) {
    const double v = comms::numeric::load_as_double(data, t, i);
    if (comms::is_integral(t)) {
      const int64_t product = wrap_to(t, static_cast<int64_t>(v) * static_cast<int64_t>(factor));
      switch (t) {
        case DataType::kInt8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(product); break;
        case DataType::kUint8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(product); break;
        case DataType::kInt32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(product); break;
        case DataType::kUint32: static_cast<uint32_t*>(data)[i] = static_cast<uint32_t>(product); break;
        case DataType::kInt64: static_cast<int64_t*>(data)[i] = product; break;
        case DataType::kUint64: static_cast<uint64_t*>(data)[i] = static_cast<uint64_t>(product); break;
        default: break;
      }
    } else {
      comms::numeric::store_from_double(data, t, i, v * factor);
    }
  }
}

class SelfBackend : public comms::plugin::Backend {
 public:
  explicit SelfBackend(comms::plugin::BackendInit init) : init_(std::move(init)) {}

  Status init() override { return {}; }

  Status submit(const OpDesc& op, std::unique_ptr<comms::plugin::Work>* work) override {
#ifdef SELF_PLUGIN_CUDA
    // libcomms' own flush barrier after an eager bind has no caller stream.
    if (op.stream == nullptr && op.type != OpType::kBarrier) {
      return {ErrorCode::kInvalidArgument, "selfcuda: a cuda op without the caller's stream"};
    }
#endif
    Status s = aborted_.load() ? Status(ErrorCode::kAborted, abort_reason()) : execute(op);
    if (op.async) *work = std::make_unique<DoneWork>(s);
    return op.async ? Status() : s;
  }

  Status split(const comms::plugin::SplitDesc& desc, std::unique_ptr<Backend>* child) override {
    if (desc.ranks.empty()) return {};
    if (desc.ranks.size() != 1 || desc.ranks[0] != 0) {
      return {ErrorCode::kUnsupported, "the self backend only forms groups of one rank"};
    }
    *child = std::make_unique<SelfBackend>(desc.child);
    return {};
  }

  Status set_hints(const comms::Hints& hints) override {
    if (!hints.empty()) return {ErrorCode::kInvalidArgument, "the self backend takes no hints"};
    return {};
  }
  Status set_op_timeout(std::chrono::milliseconds) override { return {}; }  // nothing ever waits

  void abort(const std::string& reason) override {
    std::lock_guard lock(mu_);
    reason_ = reason;
    aborted_ = true;
  }
  Status finalize() override { return {}; }
  std::string describe() const override { return "{\"ranks\":1}"; }
  bool supports_reduction(DataType dtype, ReduceKind kind) const override {
    return comms::reduction_defined(dtype, kind);
  }

 private:
  std::string abort_reason() {
    std::lock_guard lock(mu_);
    return "aborted: " + reason_;
  }

  Status execute(const OpDesc& op) {
    const size_t bytes = op.count * comms::element_size(op.dtype);
    switch (op.type) {
      case OpType::kAllReduce:
      case OpType::kReduce:
      case OpType::kReduceScatter:
      case OpType::kReduceScatterV:
        // counts[0] is the whole buffer for the v-form; count for the others.
        copy(op.output, op.input, bytes);
        return reduce_lone_value(op);
      case OpType::kBroadcast:
      case OpType::kAllGather:
      case OpType::kGather:
      case OpType::kScatter:
      case OpType::kAllToAll:
        copy(op.output, op.input, bytes);
        return {};
      case OpType::kAllGatherV:
      case OpType::kAllToAllV:
        copy(op.output, op.input, op.counts.empty() ? 0 : op.counts[0] * comms::element_size(op.dtype));
        return {};
      case OpType::kAllGatherList:
        copy(op.output_list[0], op.input, bytes);
        return {};
      case OpType::kBarrier:
        return {};
      case OpType::kSend:
      case OpType::kRecv:
      case OpType::kBatchP2P:
        if (op.type == OpType::kBatchP2P && op.p2p.empty()) return {};
        return {ErrorCode::kInvalidArgument, "a group of one rank has no peer"};
    }
    return {ErrorCode::kInternal, "unknown op"};
  }

  Status reduce_lone_value(const OpDesc& op) {
    if (!comms::reduction_defined(op.dtype, op.reduce.kind)) {
      return {ErrorCode::kUnsupported, "reduction not defined for this type"};
    }
    if (op.reduce.kind == ReduceKind::kPremulSum) {
#ifndef SELF_PLUGIN_BROKEN
      scale(op.output, op.dtype, op.count, op.reduce.scalar);
#endif
    }
    return {};  // sum, product, min, max, avg (over one rank) and bitwise ops keep the value
  }

  comms::plugin::BackendInit init_;
  std::mutex mu_;
  std::string reason_;
  std::atomic<bool> aborted_{false};
};

Status create(const comms::plugin::BackendInit& init, std::unique_ptr<comms::plugin::Backend>* out) {
  if (init.size != 1) {
    return {ErrorCode::kUnsupported,
            "the self backend serves groups of one rank; this comm has " + std::to_string(init.size)};
  }
  *out = std::make_unique<SelfBackend>(init);
  return {};
}

const char* const kHintKeys[] = {nullptr};

#ifdef SELF_PLUGIN_CUDA
int one_cuda_device(comms::DeviceType t) { return t == comms::DeviceType::kCuda ? 1 : 0; }
#endif

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const comms::plugin::PluginDescriptor* comms_plugin_entry() {
#ifdef SELF_PLUGIN_CUDA
  static const comms::plugin::PluginDescriptor descriptor = {
      .name = "selfcuda",
      .version = "1.0",
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCuda),
      .hint_keys = kHintKeys,
      .create = create,
      .device_count = one_cuda_device,
  };
#else
  static const comms::plugin::PluginDescriptor descriptor = {
      .name = "self",
      .version = "1.0",
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCpu),
      .hint_keys = kHintKeys,
      .create = create,
  };
#endif
  return &descriptor;
}
