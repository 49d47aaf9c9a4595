// What the Gloo and UCX backends share: the op queue (op_queue.h), the
// failure state (broken_state.h), the per-op checks of submit(), execute()'s
// error capture, the order of abort() and finalize(), split()'s and
// set_hints()' shape, and the reductions (reductions.h). A backend adds only
// what is its own: connecting, running a planned op (run()), turning what
// its run threw into a status (error_of()), waking its transport on abort,
// and tearing down after the queue stopped.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "broken_state.h"
#include "comms/plugin.h"
#include "op_queue.h"

namespace comms::cpu_algorithms {

class CpuBackend : public plugin::Backend {
 public:
  // name: "gloo" or "ucx", for error texts. execute: the backend's
  // `[this](const plugin::OpDesc& op) { return execute(*this, op); }`.
  // progress: moves along what a finished op left in flight
  // (OpQueue::Progress), or empty.
  CpuBackend(const plugin::BackendInit& init, const char* name, OpQueue::Execute execute,
             OpQueue::Progress progress = {});
  // A derived destructor calls close() first.
  ~CpuBackend() override = default;

  // Refuses per-op hints; fails fast once broken; else queues the op.
  Status submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) final;
  // A child of the ranks in desc: a new backend of this kind (make_child), connected.
  Status split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) final;
  // Only busy_poll may change after connecting (set_busy_poll).
  Status set_hints(const Hints& hints) final;
  Status set_op_timeout(std::chrono::milliseconds t) final {
    op_timeout_ = t;
    return {};
  }
  // Marks the comm broken, then wakes the running op (wake()); queued ops
  // still run, in order, and fail fast in execute().
  void abort(const std::string& reason) final;
  // Once: runs the queued ops (after abort() they fail fast), stops the
  // queue's thread, then tears down (release()).
  Status finalize() final;
  bool supports_reduction(DataType dtype, ReduceKind kind) const final;

 protected:
  // The op queue's execute, for a backend class B (declared final, and a
  // friend of this class) that has
  //   void run(const plugin::OpDesc& op): runs one op on the queue's thread
  //     (or the submitting thread for a blocking op) along the path its
  //     plan chose; throws on failure;
  //   Status error_of(const std::exception& e, const plugin::OpDesc& op,
  //     bool* fatal) const: what run() threw, as the op's status; *fatal:
  //     the comm is now broken (false only where nothing was sent).
  // Bound at compile time: no virtual call per op.
  template <class B>
  Status execute(B& backend, const plugin::OpDesc& op) {
    if (failure_.broken()) return failure_.status();
    try {
      backend.B::run(op);
      return {};
    } catch (const std::exception& e) {
      bool fatal = true;
      Status s = backend.B::error_of(e, op, &fatal);
      if (fatal) failure_.mark_broken(s.message);
      return s;
    }
  }
  // abort()'s part in the transport: make the running op's waits fail now.
  virtual void wake() = 0;
  // finalize()'s part after the queue stopped.
  virtual Status release() = 0;
  // split()'s child: resolves its configuration from desc.child's hints and
  // returns it unconnected.
  virtual Status make_child(const plugin::SplitDesc& desc, std::unique_ptr<CpuBackend>* child) const = 0;
  // A new busy_poll value (set_hints).
  virtual Status set_busy_poll(const std::string& value) = 0;

  // For a derived destructor: finalizes if nothing did, and in any case
  // joins the queue's thread while the derived members that run() uses
  // still exist.
  void close() {
    if (!finalized_) finalize();
    ops_.stop_and_join();
  }
  // For run(): the worker then calls the queue's progress until it says done.
  void progress_later() { ops_.progress_later(); }
  std::chrono::milliseconds op_timeout() const { return op_timeout_.load(); }
  const BrokenState& failure() const { return failure_; }
  // For calls outside the queue (UCX's window ops): every op submitted
  // before has completed, and a fatal failure fails the later ones fast.
  void drain_ops() { ops_.drain(); }
  void mark_broken(const std::string& reason) { failure_.mark_broken(reason); }

  const plugin::BackendInit init_;

 private:
  const char* name_;
  std::atomic<std::chrono::milliseconds> op_timeout_;
  // After the first fatal error (or abort()) every op fails fast.
  BrokenState failure_;
  bool finalized_ = false;
  // Runs ops in submission order (op_queue.h).
  OpQueue ops_;
};

}  // namespace comms::cpu_algorithms
