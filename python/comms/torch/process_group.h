// The c10d backend "comms": a torch process group over one comms::Comm.
//
// A c10d::Backend of torch 2.x (docs/TORCH.md says which versions are
// checked). Virtuals that newer torch releases added are declared without
// `override`, so an older torch builds the same source (the method is then
// simply ours). Every op is issued asynchronously on the comm and returns a
// CommsWork that keeps its tensors until the op finished; CUDA ops follow
// torch's current stream. torch reaches split, shrink, coalescing, timeouts,
// shutdown and abort through the Backend's own virtuals: nothing of torch is
// patched.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comms/comm.h"
#include "comms/store.h"

static_assert(TORCH_VERSION_MAJOR >= 2, "comms.torch needs torch 2.x (docs/TORCH.md)");

namespace comms_torch {

// comms' Store interface over the c10d::Store torch hands a backend (already
// prefixed with the group's name, so each group has its own namespace).
class C10dStore final : public comms::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

class FutureWatcher;
std::shared_ptr<FutureWatcher> make_future_watcher();
class P2PChannels;

class CommsWork final : public c10d::Work {
 public:
  CommsWork(comms::Work work, std::vector<at::Tensor> keep, std::vector<at::Tensor> outputs,
            c10d::OpType type, int rank, std::shared_ptr<FutureWatcher> watcher);
  ~CommsWork() override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // Runs once after the op succeeded, before anyone sees its outputs: copies
  // a staging buffer out into the caller's list of tensors.
  void set_finish(std::function<void()> finish) { finish_ = std::move(finish); }
  // A send or recv posted before its channel's comm exists (P2PChannels):
  // it waits for the comm's work, or the error that stopped the channel.
  void expect_assignment();
  void assign(comms::Work work);
  void assign_error(std::exception_ptr error);

 private:
  friend class FutureWatcher;
  void finish_once();
  // False if `timeout` passed before the work was assigned.
  bool await_assignment(std::chrono::milliseconds timeout);
  bool assigned() const { return assigned_.load(std::memory_order_acquire); }
  comms::Work work_;
  std::exception_ptr error_;
  std::atomic<bool> assigned_{true};
  std::mutex assign_mutex_;
  std::condition_variable assign_cv_;
  std::mutex finish_mutex_;
  std::function<void()> finish_;
  std::vector<at::Tensor> keep_;  // every tensor the op reads or writes
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<FutureWatcher> watcher_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// What the Python side decided for a group (comms.torch.Options).
struct GroupConfig {
  std::string name;     // the comm's name: unique in the process, keys rendezvous
  std::string backend;  // BackendSpec; "" = COMMS_BACKEND
  comms::Hints hints;
  std::optional<std::chrono::milliseconds> op_timeout;
  std::optional<std::chrono::milliseconds> init_timeout;
  std::optional<comms::Device> device;  // binds eagerly
};

// The group's options as torch keeps them (getBackendOptions): split_group
// hands a clone to split(), so a child inherits every option of its parent.
struct CommsOptions final : c10d::Backend::Options {
  CommsOptions() : Options("comms") {}
  c10::intrusive_ptr<c10d::Backend::Options> clone() const {
    return c10::make_intrusive<CommsOptions>(*this);
  }
  GroupConfig config;
};

class ProcessGroupComms final : public c10d::Backend {
 public:
  ProcessGroupComms(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const GroupConfig& config);
  // A member's group carved from `parent`: `ranks` are the parent's ranks of
  // the members, in group-rank order.
  ProcessGroupComms(ProcessGroupComms& parent, const std::vector<int>& ranks, const GroupConfig& config);
  // The survivors' group of a shrink.
  ProcessGroupComms(std::shared_ptr<comms::Comm> comm, const c10::intrusive_ptr<c10d::Store>& store,
                    const GroupConfig& config);
  ~ProcessGroupComms() override;

  const std::string getBackendName() const override { return "comms"; }
  const std::shared_ptr<comms::Comm>& comm() const { return comm_; }
  // Waits for every op, then releases the comm (destroy_process_group).
  void finalize();
  // A non-member's part in a split of this group (the split is collective
  // over it): torch's new_group on a device-bound world, and split().
  void split_as_nonmember(const std::string& name);
  // Releases / recreates the backend of one device type, channels included.
  bool offload(comms::DeviceType type);
  bool reload(comms::DeviceType type);

#ifdef C10D_BACKEND_HAS_WINDOW
  // One-sided windows (window.h) where the group's comm has them.
  bool supportsWindow() const override;
  c10::intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>& tensor = std::nullopt) override;
#endif
  // CPU tensors in the memory of the comm's cpu backend (tensor_alloc.cc):
  // on cpu:ucx memory every rank of the host maps, where ops take the
  // zero-copy path. torch names the device by its index alone: a CPU device
  // has none (-1); an index is a CUDA device, which comms.torch does not
  // allocate on.
  bool supportsTensorAlloc(c10::DeviceIndex device_index);
  at::Tensor allocateTensor(long size, at::TensorOptions options = {});
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }
  bool supportsShrinking() const { return true; }
  bool isInitialized() override { return comm_ != nullptr; }
  // The collectives issued on the group so far, the same on every rank of a
  // correct program: TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper compares them.
  void setSequenceNumberForGroup() override { collectives_issued_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return collectives_issued_; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<c10d::Backend::Options>& opts_override);
  void setTimeout(std::chrono::milliseconds timeout);
  void eagerConnectSingleDevice(at::Device device);
  void shutdown() { finalize(); }
  void abort();

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;
  // batch_isend_irecv and _coalescing_manager: the sends and receives between
  // start and end go out as one comms batch_p2p; endCoalescing's work is done
  // when every op of the window is (ops on one comm finish in issue order).
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  friend class P2PChannels;
  comms::OpOptions op_options(std::chrono::milliseconds timeout, const std::vector<at::Tensor>& tensors,
                              bool async = true);
  c10::intrusive_ptr<c10d::Work> track(comms::Work work, std::vector<at::Tensor> keep,
                                       std::vector<at::Tensor> outputs, c10d::OpType type);
  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag, bool is_send);
  comms::Comm& live(const char* call);
  GroupConfig child_config(const c10::intrusive_ptr<c10d::Backend::Options>& opts, const std::string& name,
                           const char* call) const;

  std::shared_ptr<comms::Comm> comm_;
  c10::intrusive_ptr<c10d::Store> store_;
  GroupConfig config_;
  std::shared_ptr<FutureWatcher> watcher_;
  // Ops not known to be finished: their tensors stay alive until then.
  std::deque<c10::intrusive_ptr<CommsWork>> pending_;
  std::unique_ptr<P2PChannels> channels_;
  uint64_t collectives_issued_ = 0;
  // Between startCoalescing and endCoalescing: the queued sends and
  // receives, and the last work issued in the window.
  bool coalescing_ = false;
  std::vector<comms::P2POp> coalesced_ops_;
  std::vector<at::Tensor> coalesced_tensors_;
  std::vector<c10::intrusive_ptr<CommsWork>> coalesced_works_;
  c10::intrusive_ptr<c10d::Work> window_last_;
};

}  // namespace comms_torch
