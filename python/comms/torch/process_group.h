// The c10d backend "comms": a torch process group over one comms::Comm.
//
// One source for torch 1.13 (backends subclass c10d::ProcessGroup) and
// torch >= 2 (c10d::Backend), guarded by torch's own version header. Every
// op is issued asynchronously on the comm and returns a CommsWork that keeps
// its tensors until the op finished; CUDA ops follow torch's current stream.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comms/comm.h"
#include "comms/store.h"

namespace comms_torch {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

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
class P2PQueue;
class ProcessGroupComms;

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
  // A queued send or recv: the queue issues it (P2PQueue) before anyone
  // looks at the work, then gives it the batch's work or its error.
  void set_queue(std::shared_ptr<P2PQueue> queue) { queue_ = std::move(queue); }
  void set_work(comms::Work work) { work_ = std::move(work); }
  void set_error(std::exception_ptr error) { error_ = std::move(error); }

 private:
  friend class FutureWatcher;
  void finish_once();
  void flush_queue();
  comms::Work work_;
  std::shared_ptr<P2PQueue> queue_;
  std::exception_ptr error_;
  std::mutex finish_mutex_;
  std::function<void()> finish_;
  std::vector<at::Tensor> keep_;  // every tensor the op reads or writes
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<FutureWatcher> watcher_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Sends and receives wait here until the program looks at one of their works
// or issues any other op, on any group of the process; then they go out as
// one comms batch_p2p. comms runs a comm's ops in issue order, so an isend
// and an irecv that cross between two ranks would otherwise wait for each
// other, where torch programs expect them to progress together.
class P2PQueue {
 public:
  explicit P2PQueue(ProcessGroupComms* group);
  ~P2PQueue();
  void add(const comms::P2POp& op, const at::Tensor& tensor, const c10::intrusive_ptr<CommsWork>& work);
  void flush();
  // The group is going: issue what is queued, then forget the group.
  void detach();
  // Every group's queue; cheap (one atomic load) when nothing is queued.
  static void flush_all();

 private:
  std::mutex mutex_;
  ProcessGroupComms* group_;
  std::vector<comms::P2POp> ops_;
  std::vector<at::Tensor> tensors_;
  std::vector<c10::intrusive_ptr<CommsWork>> works_;
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

class ProcessGroupComms final : public BackendBase {
 public:
  ProcessGroupComms(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    const GroupConfig& config);
  // Splits from `parent` (COMMS_ROUTE=split): `ranks` are the parent's ranks
  // of the members, in group-rank order.
  ProcessGroupComms(ProcessGroupComms& parent, const std::vector<int>& ranks, int rank,
                    const GroupConfig& config);
  ~ProcessGroupComms() override;

  const std::string getBackendName() const override { return "comms"; }
  const std::shared_ptr<comms::Comm>& comm() const { return comm_; }
  // Waits for every op, then releases the comm (destroy_process_group).
  void finalize();

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
  // batch_isend_irecv: the sends and receives between start and end go out
  // as one comms batch_p2p (the queue flushes at both ends).
  void startCoalescing() override;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  // Torch 2.1 made endCoalescing return the work every queued op waits on.
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
#else
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) override;
#endif
#if TORCH_VERSION_MAJOR >= 2
  // Torch 2.x names (not `override`: which release added each one varies,
  // and a method the base lacks is then simply ours).
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {});
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {});
  // device_id= at init: connect that device's backend now.
  void eagerConnectSingleDevice(at::Device device);
#endif

 private:
  struct Issued;
  comms::OpOptions op_options(std::chrono::milliseconds timeout, const std::vector<at::Tensor>& tensors);
  c10::intrusive_ptr<c10d::Work> track(comms::Work work, std::vector<at::Tensor> keep,
                                       std::vector<at::Tensor> outputs, c10d::OpType type);
  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag, bool is_send);
  // The comm, after sending what other groups queued (unless `flush` is off).
  comms::Comm& live(const char* call, bool flush = true);
  friend class P2PQueue;
  void issue_batch(std::vector<comms::P2POp> ops, std::vector<at::Tensor> tensors,
                   std::vector<c10::intrusive_ptr<CommsWork>> works);
  // The work of the last batch issue_batch issued (torch 2.1's endCoalescing).
  c10::intrusive_ptr<c10d::Work> last_batch_;

  std::shared_ptr<comms::Comm> comm_;
  std::shared_ptr<FutureWatcher> watcher_;
  // Ops not known to be finished: their tensors stay alive until then.
  std::deque<c10::intrusive_ptr<CommsWork>> pending_;
  std::shared_ptr<P2PQueue> p2p_;
};

}  // namespace comms_torch
