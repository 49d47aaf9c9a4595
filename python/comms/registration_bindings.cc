// comms.register_buffer / can_register_buffers (comms/registration.h). The
// handle keeps the Python buffer alive while it is registered.
#include "bindings.h"
#include "comms/registration.h"

namespace comms_py {

namespace {

struct PyRegisteredBuffer {
  comms::RegisteredBuffer reg;
  Keepalive keep;
  void deregister() {
    {
      py::gil_scoped_release nogil;
      reg.deregister();
    }
    keep.clear();
  }
};

}  // namespace

void bind_registration(py::module_& m) {
  py::class_<PyRegisteredBuffer, std::shared_ptr<PyRegisteredBuffer>>(
      m, "RegisteredBuffer",
      "A buffer registered with a comm's device backend (NCCL: ncclCommRegister). Released by "
      "deregister(), leaving a with-block, or the comm's finalize/offload.")
      .def("deregister", &PyRegisteredBuffer::deregister, "Idempotent; raises the backend's failure.")
      .def_property_readonly("registered", [](const PyRegisteredBuffer& r) { return r.reg.registered(); })
      .def("__enter__", [](const std::shared_ptr<PyRegisteredBuffer>& r) { return r; })
      .def("__exit__", [](PyRegisteredBuffer& r, py::args) { r.deregister(); });
  m.def("can_register_buffers", [](const comms::Comm& c, const std::string& device_type) {
        return comms::can_register_buffers(c, comms::parse_device_type(device_type));
      }, py::arg("comm"), py::arg("device_type"),
      "Whether the comm's backend for 'cpu'/'cuda' can register buffers (NCCL can; Gloo cannot).");
  m.def("register_buffer", [](comms::Comm& c, py::handle buffer) {
        auto r = std::make_shared<PyRegisteredBuffer>();
        const Buffer b = acquire(buffer, "buffer", Access::kRead, r->keep);
        {
          py::gil_scoped_release nogil;
          r->reg = comms::register_buffer(c, b.view);
        }
        return r;
      }, py::arg("comm"), py::arg("buffer"),
      "Registers a buffer (numpy, torch, anything with __dlpack__) with the comm's backend for its "
      "device; raises comms.Error(code='unsupported') where that backend cannot register.");
}

}  // namespace comms_py
