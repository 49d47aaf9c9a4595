#include "window.h"

#ifdef C10D_BACKEND_HAS_WINDOW

#include "tensors.h"

namespace comms_torch {
namespace {

comms::OpOptions options_of(std::chrono::milliseconds timeout, bool async_op) {
  comms::OpOptions o;
  o.async = async_op;
  if (timeout != c10d::kUnsetTimeout) o.timeout = timeout;
  return o;
}


int peer_of(int64_t rank, const char* call) {
  TORCH_CHECK(rank >= 0 && rank <= INT32_MAX, call, ": rank ", rank, " is out of range");
  return static_cast<int>(rank);
}

}  // namespace

void CommsWindow::tensor_register(const at::Tensor& tensor, bool /*owning*/) {
  TORCH_CHECK(!window_.registered(), "tensor_register: this window already has a tensor; tensor_deregister first");
  const comms::BufferView v = view_of(tensor, Use::kMove, "tensor_register", "tensor");
  // torch's groups connect at their first op; registering is collective
  // too, so it may be that first op (a one-element all_reduce connects).
  if (comm_->backend_state(v.device.type) == comms::BackendState::kLazy) {
    at::Tensor probe = at::zeros({1}, tensor.options().dtype(at::kInt));
    comm_->all_reduce(view_of(probe, Use::kReduce, "tensor_register", "probe"), comms::ReduceOp::sum());
  }
  window_ = comms::register_window(*comm_, v);
  tensor_ = tensor;
}

void CommsWindow::tensor_deregister() {
  window_.deregister();
  tensor_ = at::Tensor();
}

c10::intrusive_ptr<c10d::Work> CommsWindow::wrap(comms::Work work, std::vector<at::Tensor> keep) {
  return c10::make_intrusive<CommsWork>(std::move(work), std::move(keep), std::vector<at::Tensor>{},
                                        c10d::OpType::UNKNOWN, comm_->rank(), watcher_);
}

c10::intrusive_ptr<c10d::Work> CommsWindow::put(const at::Tensor& tensor, int64_t dst_rank,
                                                int64_t target_offset_nelems, bool async_op,
                                                const c10d::PutOptions& opts) {
  TORCH_CHECK(tensor_.defined(), "put: the window has no registered tensor");
  TORCH_CHECK(target_offset_nelems >= 0, "put: target_offset_nelems is negative (", target_offset_nelems, ")");
  const comms::BufferView v = view_of(tensor, Use::kMove, "put", "tensor");
  const size_t offset = static_cast<size_t>(target_offset_nelems) * tensor_.element_size();
  auto w = issue([&] {
    return window_.put(v, peer_of(dst_rank, "put"), offset, false, options_of(opts.timeout, async_op));
  });
  return wrap(std::move(w), {tensor});
}

c10::intrusive_ptr<c10d::Work> CommsWindow::signal(int64_t peer_rank, bool async_op, const c10d::SignalOptions& opts) {
  auto w = issue([&] { return window_.signal(peer_of(peer_rank, "signal"), options_of(opts.timeout, async_op)); });
  return wrap(std::move(w), {});
}

c10::intrusive_ptr<c10d::Work> CommsWindow::wait_signal(int64_t peer_rank, bool async_op,
                                                        const c10d::WaitSignalOptions& opts) {
  auto w = issue([&] {
    return window_.wait_signal(peer_of(peer_rank, "wait_signal"), 1, options_of(opts.timeout, async_op));
  });
  return wrap(std::move(w), {});
}

c10d::WindowAttr CommsWindow::get_attr(int64_t /*peer_rank*/) {
  c10d::WindowAttr a;
  a.access_type = c10d::WindowAccessType::SEPARATE;  // reached through put only
  return a;
}

}  // namespace comms_torch

#endif  // C10D_BACKEND_HAS_WINDOW
