// comms.torch._C: creates "comms" process groups for torch.distributed and
// exposes what comms.torch needs of their comms (describe, offload, reload,
// finalize). The Python side (comms/torch/__init__.py) registers the backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "comms/registration.h"
#include "process_group.h"
#include "tensors.h"

namespace py = pybind11;
using comms_torch::GroupConfig;
using comms_torch::ProcessGroupComms;
using Millis = std::chrono::milliseconds;

namespace {

GroupConfig config_of(const std::string& name, const std::string& backend, const comms::Hints& hints,
                      std::optional<Millis> op_timeout, std::optional<Millis> init_timeout,
                      const std::optional<std::string>& device) {
  GroupConfig c;
  c.name = name;
  c.backend = backend;
  c.hints = hints;
  c.op_timeout = op_timeout;
  c.init_timeout = init_timeout;
  if (device) c.device = comms::Device::parse(*device);
  return c;
}

// comms::Error of creation: ValueError for what the caller got wrong.
template <class F>
auto translate(F&& f) {
  try {
    return f();
  } catch (const comms::Error& e) {
    if (e.code() == comms::ErrorCode::kInvalidArgument) throw py::value_error(e.what());
    throw;
  }
}

comms::Comm& comm_of(ProcessGroupComms& pg) {
  if (!pg.comm()) throw py::value_error("comms.torch: the group was destroyed (destroy_process_group)");
  return *pg.comm();
}

// A tensor registered with a group's device backend; holds the tensor so its
// memory outlives the registration.
struct RegisteredTensor {
  comms::RegisteredBuffer registration;
  at::Tensor tensor;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  py::module_::import("torch.distributed");  // registers c10d's classes with pybind11
  py::class_<ProcessGroupComms, comms_torch::BackendBase, c10::intrusive_ptr<ProcessGroupComms>>(
      m, "ProcessGroupComms")
      .def("describe", [](ProcessGroupComms& pg) { return comm_of(pg).describe(); })
      .def_property_readonly("comm_name", [](ProcessGroupComms& pg) { return comm_of(pg).name(); })
      .def_property_readonly("comm_backend", [](ProcessGroupComms& pg) { return comm_of(pg).backend_string(); })
      .def_property_readonly("is_finalized", [](ProcessGroupComms& pg) { return !pg.comm(); })
      .def(
          "offload",
          [](ProcessGroupComms& pg, const std::string& type) {
            return comm_of(pg).offload_backend(comms::parse_device_type(type));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "reload",
          [](ProcessGroupComms& pg, const std::string& type) {
            return comm_of(pg).reload_backend(comms::parse_device_type(type));
          },
          py::call_guard<py::gil_scoped_release>())
      .def("backend_state",
           [](ProcessGroupComms& pg, const std::string& type) {
             return std::string(comms::to_string(comm_of(pg).backend_state(comms::parse_device_type(type))));
           })
      .def("finalize", &ProcessGroupComms::finalize, py::call_guard<py::gil_scoped_release>())
      .def("can_register",
           [](ProcessGroupComms& pg, const std::string& type) {
             return comms::can_register_buffers(comm_of(pg), comms::parse_device_type(type));
           })
      .def("register_tensor", [](ProcessGroupComms& pg, const at::Tensor& tensor) {
        const auto view = comms_torch::view_of(tensor, comms_torch::Use::kMove, "register_tensor", "tensor");
        py::gil_scoped_release release;
        return std::make_shared<RegisteredTensor>(RegisteredTensor{comms::register_buffer(comm_of(pg), view), tensor});
      });

  py::class_<RegisteredTensor, std::shared_ptr<RegisteredTensor>>(
      m, "RegisteredTensor", "A tensor registered with a group's device backend (comms/registration.h).")
      .def("deregister", [](RegisteredTensor& r) { r.registration.deregister(); },
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("registered", [](const RegisteredTensor& r) { return r.registration.registered(); })
      .def("__enter__", [](const std::shared_ptr<RegisteredTensor>& r) { return r; })
      .def("__exit__", [](RegisteredTensor& r, py::args) { r.registration.deregister(); });

  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& name,
         const std::string& backend, const comms::Hints& hints, std::optional<Millis> op_timeout,
         std::optional<Millis> init_timeout, const std::optional<std::string>& device) {
        const auto config = config_of(name, backend, hints, op_timeout, init_timeout, device);
        return translate([&] {
          py::gil_scoped_release release;
          return c10::make_intrusive<ProcessGroupComms>(store, rank, size, config);
        });
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("name"), py::arg("backend"), py::arg("hints"),
      py::arg("op_timeout"), py::arg("init_timeout"), py::arg("device"),
      "A group bootstrapped through torch's store (COMMS_ROUTE=direct).");
  m.def(
      "split",
      [](ProcessGroupComms& parent, const std::vector<int>& ranks, int rank, const std::string& name,
         const std::string& backend, const comms::Hints& hints, std::optional<Millis> op_timeout,
         std::optional<Millis> init_timeout) {
        const auto config = config_of(name, backend, hints, op_timeout, init_timeout, std::nullopt);
        return translate([&] {
          py::gil_scoped_release release;
          return c10::make_intrusive<ProcessGroupComms>(parent, ranks, rank, config);
        });
      },
      "A member's group carved from `parent` (COMMS_ROUTE=split).");
  m.def(
      "split_nonmember",
      [](ProcessGroupComms& parent, const std::string& name) {
        translate([&] {
          py::gil_scoped_release release;
          return comm_of(parent).split(std::span<const int>(), name);
        });
      },
      "A non-member's part in a split: the parent's ranks split collectively.");
}
