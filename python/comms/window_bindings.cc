// comms.register_window / has_windows and comms.Window (comms/window.h).
// The handle keeps the window's Python buffer and its comm alive while it is
// registered; ops go through run_op like the comm's (timeouts, async_op,
// comms.Error), and an op's source stays alive until the op finished.
#include "bindings.h"
#include "comms/window.h"

namespace comms_py {

namespace {

struct PyWindow {
  comms::Window window;
  std::shared_ptr<comms::Comm> comm;
  Keepalive keep;
  void deregister() {
    {
      py::gil_scoped_release nogil;
      window.deregister();
    }
    keep.clear();
  }
};

using WindowPtr = std::shared_ptr<PyWindow>;

py::object put(const WindowPtr& w, py::handle src, int peer, size_t offset, bool signal, bool async_op,
               std::optional<Millis> timeout) {
  Keepalive keep;
  const Buffer b = acquire(src, "src", Access::kRead, keep);
  return run_op(w->comm, "put", async_op, timeout, {}, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return w->window.put(b.view, peer, offset, signal, o); });
}

py::object wait_signal(const WindowPtr& w, py::handle peer_or_counts, std::optional<uint64_t> count, bool async_op,
                       std::optional<Millis> timeout) {
  if (py::isinstance<py::int_>(peer_or_counts)) {
    const int peer = peer_or_counts.cast<int>();
    const uint64_t n = count.value_or(1);
    return run_op(w->comm, "wait_signal", async_op, timeout, {}, 0, {},
                  [&](const comms::OpOptions& o) { return w->window.wait_signal(peer, n, o); });
  }
  if (count) throw py::type_error("wait_signal(counts) takes no count: counts has one entry per rank");
  const auto counts = peer_or_counts.cast<std::vector<uint64_t>>();
  if (counts.size() != static_cast<size_t>(w->comm->size())) {
    throw py::value_error("counts has " + std::to_string(counts.size()) + " entries, but the comm has " +
                          std::to_string(w->comm->size()) + " ranks");
  }
  return run_op(w->comm, "wait_signal", async_op, timeout, {}, 0, {},
                [&](const comms::OpOptions& o) { return w->window.wait_signal(counts, o); });
}

}  // namespace

void bind_window(py::module_& m) {
  py::class_<PyWindow, WindowPtr>(
      m, "Window",
      "One-sided window: memory every rank registered together (register_window). Ranks put into each "
      "other's windows and count each other's signals. Released by deregister() (collective), leaving a "
      "with-block, or the comm's finalize/offload/abort.")
      .def("put", &put, py::arg("src"), py::arg("peer"), py::arg("offset") = 0, py::kw_only(),
           py::arg("signal") = false, py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Copies src into peer's window at byte offset; with signal=True then signals peer.")
      .def("signal", [](const WindowPtr& w, int peer, bool async_op, std::optional<Millis> timeout) {
        return run_op(w->comm, "signal", async_op, timeout, {}, 0, {},
                      [&](const comms::OpOptions& o) { return w->window.signal(peer, o); });
      }, py::arg("peer"), py::kw_only(), py::arg("async_op") = false, py::arg("timeout") = py::none())
      .def("wait_signal", &wait_signal, py::arg("peer_or_counts"), py::arg("count") = py::none(), py::kw_only(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "wait_signal(peer, count=1), or wait_signal(counts) with one count per rank: waits for that many "
           "new signals and consumes them. A timeout consumes none and leaves the comm usable.")
      .def("flush", [](const WindowPtr& w, bool async_op, std::optional<Millis> timeout) {
        return run_op(w->comm, "flush", async_op, timeout, {}, 0, {},
                      [&](const comms::OpOptions& o) { return w->window.flush(o); });
      }, py::kw_only(), py::arg("async_op") = false, py::arg("timeout") = py::none())
      .def("size_of", [](const PyWindow& w, int peer) { return w.window.size_of(peer); }, py::arg("peer"),
           "The bytes rank `peer` registered.")
      .def("deregister", &PyWindow::deregister, "Collective; idempotent; raises the backend's failure.")
      .def_property_readonly("registered", [](const PyWindow& w) { return w.window.registered(); })
      .def("__enter__", [](const WindowPtr& w) { return w; })
      .def("__exit__", [](PyWindow& w, py::args) { w.deregister(); });
  m.def("has_windows", [](const comms::Comm& c, const std::string& device_type) {
        return comms::has_windows(c, comms::parse_device_type(device_type));
      }, py::arg("comm"), py::arg("device_type"),
      "Whether the comm's backend for 'cpu'/'cuda' has one-sided windows (UCX does; Gloo does not).");
  m.def("register_window", [](const std::shared_ptr<comms::Comm>& c, py::handle buffer) {
        auto w = std::make_shared<PyWindow>();
        w->comm = c;
        const Buffer b = acquire(buffer, "buffer", Access::kWrite, w->keep);
        {
          py::gil_scoped_release nogil;
          w->window = comms::register_window(*c, b.view);
        }
        return w;
      }, py::arg("comm"), py::arg("buffer"),
      "Collective: registers this rank's buffer (numpy, torch, anything with __dlpack__; writable) as its "
      "part of a window; raises comms.Error(code='unsupported') where the backend has no windows.");
}

}  // namespace comms_py
