#include "cpu_backend.h"

#include "reductions.h"

namespace comms::cpu_algorithms {

CpuBackend::CpuBackend(const plugin::BackendInit& init, const char* name, OpQueue::Execute execute,
                       OpQueue::Progress progress)
    : init_(init), name_(name), op_timeout_(init.op_timeout), ops_(std::move(execute), std::move(progress)) {}

bool CpuBackend::supports_reduction(DataType dtype, ReduceKind kind) const {
  return reduce_fn(dtype, kind) != nullptr;
}

Status CpuBackend::submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) {
  if (op.hints && !op.hints->empty()) {
    return {ErrorCode::kInvalidArgument,
            std::string("the ") + name_ + " backend takes no per-op hints (got '" + op.hints->begin()->first + "')"};
  }
  if (failure_.broken()) return failure_.status();
  return ops_.submit(op, work);
}

Status CpuBackend::split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) {
  if (desc.ranks.empty()) return {};  // not a member: a CPU child is its members' own connections
  std::unique_ptr<CpuBackend> backend;
  Status s = make_child(desc, &backend);
  if (!s.is_ok()) return s;
  s = backend->init();
  if (!s.is_ok()) return s;
  *child = std::move(backend);
  return {};
}

Status CpuBackend::set_hints(const Hints& hints) {
  for (const auto& [k, v] : hints) {
    if (k != "busy_poll") {
      return {ErrorCode::kUnsupported, std::string(name_) + " hint '" + k +
                                           "' cannot change after the comm connected; pass it when creating the comm"};
    }
    Status s = set_busy_poll(v);
    if (!s.is_ok()) return s;
  }
  return {};
}

void CpuBackend::abort(const std::string& reason) {
  failure_.abort(reason);
  wake();
}

Status CpuBackend::finalize() {
  if (finalized_) return {};
  finalized_ = true;
  ops_.stop_and_join();  // queued ops run first (after abort() they fail fast)
  return release();
}

}  // namespace comms::cpu_algorithms
