// c10d::Window over comms::Window (torch's one-sided API, guarded by
// C10D_BACKEND_HAS_WINDOW): tensor_register / tensor_deregister are
// collective; put writes `tensor` into dst's registered tensor at an
// element offset (in the registered tensor's elements); signal and
// wait_signal count one signal at a time, as torch's API does. UCX data is
// reached only through put (get_attr: SEPARATE; no map_remote_tensor).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#ifdef C10D_BACKEND_HAS_WINDOW

#include <memory>

#include "comms/window.h"
#include "process_group.h"

namespace comms_torch {

class CommsWindow final : public c10d::Window {
 public:
  CommsWindow(std::shared_ptr<comms::Comm> comm, std::shared_ptr<FutureWatcher> watcher)
      : comm_(std::move(comm)), watcher_(std::move(watcher)) {}
  ~CommsWindow() override = default;

  void tensor_register(const at::Tensor& tensor, bool owning = true) override;
  void tensor_deregister() override;
  c10::intrusive_ptr<c10d::Work> put(const at::Tensor& tensor, int64_t dst_rank, int64_t target_offset_nelems,
                                     bool async_op, const c10d::PutOptions& opts = c10d::PutOptions()) override;
  c10::intrusive_ptr<c10d::Work> signal(int64_t peer_rank, bool async_op,
                                        const c10d::SignalOptions& opts = c10d::SignalOptions()) override;
  c10::intrusive_ptr<c10d::Work> wait_signal(int64_t peer_rank, bool async_op,
                                             const c10d::WaitSignalOptions& opts = c10d::WaitSignalOptions()) override;
  c10d::WindowAttr get_attr(int64_t peer_rank) override;

 private:
  c10::intrusive_ptr<c10d::Work> wrap(comms::Work work, std::vector<at::Tensor> keep);

  std::shared_ptr<comms::Comm> comm_;
  std::shared_ptr<FutureWatcher> watcher_;
  comms::Window window_;
  at::Tensor tensor_;  // the registered tensor, alive while registered
};

}  // namespace comms_torch

#endif  // C10D_BACKEND_HAS_WINDOW
