// Shared pieces of the _comms extension: waiting without holding the GIL,
// the Python Work object, and the binding entry points of each file.
#pragma once

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "buffers.h"
#include "comms/comm.h"
#include "comms/elastic.h"

namespace comms_py {

namespace py = pybind11;
using Millis = std::chrono::milliseconds;

// An op's handle as Python sees it: the Work and the buffers it uses, which
// stay alive until the op finished.
struct PyWork {
  comms::Work work;
  Keepalive keep;
  std::shared_ptr<comms::Comm> comm;
  std::string op;
  // Waits with the GIL released; raises the op's comms.Error, or
  // KeyboardInterrupt (the op stays in flight and keeps its buffers).
  void wait();
  bool is_completed() const { return work.is_completed(); }
  // A Work dropped before its op finished (async_op=True, never waited)
  // waits for it here: the backend may still write into the buffers.
  ~PyWork();
};

// Polls `work` with the GIL released, running Python's signal handlers
// between slices. False when a handler raised (the Python error is set).
bool wait_interruptible(const comms::Work& work);

// Issues `issue` asynchronously with the GIL released. async_op: returns the
// Work. Otherwise waits; on Ctrl-C the comm is aborted (the op must not write
// into buffers Python may free) and KeyboardInterrupt is raised.
py::object run_op(const std::shared_ptr<comms::Comm>& comm, const char* op, bool async_op,
                  std::optional<Millis> timeout, const comms::Hints& hints, uint32_t tag, Keepalive keep,
                  const std::function<comms::Work(const comms::OpOptions&)>& issue);

comms::ReduceOp reduce_op_of(py::handle op);
std::optional<comms::Device> device_of(const std::optional<std::string>& text);
// The timeouts of an agreement (comms/elastic.h); unset: the comm's own.
comms::AgreeOptions agree_options(std::optional<Millis> timeout, std::optional<Millis> liveness_timeout);
py::object device_to_py(const std::optional<comms::Device>& device);

void bind_comm(py::module_& m);
void bind_dist(py::module_& m);
void bind_parallel(py::module_& m);
void bind_registration(py::module_& m);
void bind_window(py::module_& m);
void bind_elastic(py::module_& m);

}  // namespace comms_py
