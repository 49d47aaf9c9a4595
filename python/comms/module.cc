// The _comms extension: error translation, waiting, and the module's entry.
#include <thread>
#include <utility>

#include "bindings.h"
#include "comms/comms.h"

namespace comms_py {
namespace {

PyObject* error_type = nullptr;

py::object none_if(bool unknown, py::object value) { return unknown ? py::none() : value; }

// A comms.Error instance. Other extensions (comms.torch) build theirs through
// _comms._error: they may use another pybind11 whose exception translators
// this module's do not see.
py::object error_instance(const std::string& what, const std::string& code, const py::object& comm,
                          const py::object& op, const py::object& seq, const py::object& rank,
                          const py::object& peer) {
  py::object instance = py::reinterpret_steal<py::object>(PyObject_CallFunction(error_type, "s", what.c_str()));
  if (!instance) throw py::error_already_set();
  instance.attr("code") = py::str(code);
  instance.attr("comm") = comm;
  instance.attr("op") = op;
  instance.attr("seq") = seq;
  instance.attr("rank") = rank;
  instance.attr("peer") = peer;
  return instance;
}

void raise_comms_error(const comms::Error& e) {
  py::object instance = error_instance(
      e.what(), std::string(comms::to_string(e.code())), none_if(e.comm().empty(), py::str(e.comm())),
      none_if(e.op().empty(), py::str(e.op())), none_if(e.op().empty(), py::int_(e.seq())),
      none_if(e.rank() < 0, py::int_(e.rank())), none_if(e.peer() < 0, py::int_(e.peer())));
  PyErr_SetObject(error_type, instance.ptr());
}

void register_error(py::module_& m) {
  py::dict defaults;
  for (const char* name : {"code", "comm", "op", "seq", "rank", "peer"}) defaults[name] = py::none();
  defaults["__module__"] = "comms";
  error_type = PyErr_NewExceptionWithDoc(
      "comms.Error",
      "A failed comms call. .code: 'timeout', 'peer_failure', 'invalid_argument', 'aborted', ...; "
      ".comm, .op, .seq, .rank, .peer: where it happened (None when unknown).",
      PyExc_RuntimeError, defaults.ptr());
  if (!error_type) throw py::error_already_set();
  m.attr("Error") = py::handle(error_type);
  m.def("_error", &error_instance, "A comms.Error (for comms.torch's translator).");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const comms::Error& e) {
      raise_comms_error(e);
    }
  });
}

void give_up_buffers(Keepalive keep) {
  // The op never finished after abort(): its buffers must outlive it.
  new Keepalive(std::move(keep));  // NOLINT: deliberately leaked
}

}  // namespace

bool wait_interruptible(const comms::Work& work) {
  using std::chrono::steady_clock;
  {
    py::gil_scoped_release nogil;
    // A small op ends microseconds after it was issued, and a sleep costs at
    // least the timer slack (50 us by default): poll first, yielding the core
    // (to the worker that runs the op, when ranks outnumber cores).
    const auto yield_end = steady_clock::now() + std::chrono::microseconds(100);
    while (!work.is_completed()) {
      if (steady_clock::now() >= yield_end) break;
      std::this_thread::yield();
    }
  }
  auto pause = std::chrono::microseconds(10);
  while (true) {
    bool done = false;
    {
      py::gil_scoped_release nogil;
      // Signals are checked every 50 ms; the sleeps grow so that a long op
      // costs no CPU, capped so a short one is noticed soon after it ends.
      const auto slice_end = steady_clock::now() + std::chrono::milliseconds(50);
      while (!(done = work.is_completed()) && steady_clock::now() < slice_end) {
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(1000));
      }
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) return false;
  }
}

void PyWork::wait() {
  if (!wait_interruptible(work)) throw py::error_already_set();
  {
    py::gil_scoped_release nogil;
    work.wait();  // done: returns at once or throws the op's error
  }
  keep.clear();
}

PyWork::~PyWork() {
  if (keep.empty() || work.is_completed()) return;
  py::gil_scoped_release nogil;  // destroyed by Python, with the GIL
  while (!work.is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

py::object run_op(const std::shared_ptr<comms::Comm>& comm, const char* op, bool async_op,
                  std::optional<Millis> timeout, const comms::Hints& hints, uint32_t tag, Keepalive keep,
                  const std::function<comms::Work(const comms::OpOptions&)>& issue) {
  comms::OpOptions options;
  options.async = true;
  options.timeout = timeout;
  options.hints = hints;
  options.tag = tag;
  auto work = std::make_shared<PyWork>();
  work->comm = comm;
  work->op = op;
  {
    py::gil_scoped_release nogil;
    work->work = issue(options);
  }
  work->keep = std::move(keep);
  if (async_op) return py::cast(work);
  if (!wait_interruptible(work->work)) {
    py::error_already_set interrupt;  // fetched: the wait below runs without it
    comm->abort(std::string("interrupted in ") + op + " by a Python signal (KeyboardInterrupt)");
    {
      py::gil_scoped_release nogil;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!work->work.is_completed() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (!work->work.is_completed()) give_up_buffers(std::exchange(work->keep, {}));
    throw interrupt;
  }
  {
    py::gil_scoped_release nogil;
    work->work.wait();
  }
  return py::none();
}

comms::ReduceOp reduce_op_of(py::handle op) {
  if (!py::isinstance<py::str>(op)) throw py::type_error("op must be a string such as 'sum' or 'premul_sum:0.5'");
  return comms::parse_reduce_op(op.cast<std::string>());
}

std::optional<comms::Device> device_of(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  return comms::Device::parse(*text);
}

py::object device_to_py(const std::optional<comms::Device>& device) {
  if (!device) return py::none();
  return py::str(device->to_string());
}

}  // namespace comms_py

PYBIND11_MODULE(_comms, m) {
  namespace py = pybind11;
  m.doc() = "comms: collective communication over plugin backends (Gloo, NCCL, ...)";
  comms_py::register_error(m);
  py::class_<comms_py::PyWork, std::shared_ptr<comms_py::PyWork>>(m, "Work",
      "The handle of an async op (async_op=True). Keeps its buffers alive until the op finished.")
      .def("wait", &comms_py::PyWork::wait,
           "Waits for the op (GIL released, Ctrl-C raises KeyboardInterrupt); raises its comms.Error.")
      .def("is_completed", &comms_py::PyWork::is_completed, "Non-blocking: whether the op finished.")
      .def_property_readonly("status", [](const comms_py::PyWork& w) {
        return std::string(comms::to_string(w.work.status()));
      }, "'ok' while pending or after success, else the error code.")
      .def_property_readonly("error_message", [](const comms_py::PyWork& w) { return w.work.error_message(); })
      .def_readonly("op", &comms_py::PyWork::op);
  m.def("parse_hints", &comms::parse_hints, py::arg("text"), "'k=v,k=v' -> dict");
  m.def("format_hints", &comms::format_hints, py::arg("hints"));
  comms_py::bind_comm(m);
  comms_py::bind_registration(m);
  comms_py::bind_window(m);
  comms_py::bind_elastic(m);
  py::module_ dist = m.def_submodule("dist", "comms::dist: process groups");
  comms_py::bind_dist(dist);
  py::module_ parallel = m.def_submodule("parallel", "comms::dist model-parallel groups");
  comms_py::bind_parallel(parallel);
}
