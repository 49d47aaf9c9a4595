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
using comms_torch::CommsOptions;
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

// comms::Error as comms.Error. This module builds on torch's pybind11, whose
// translators are not the _comms module's: it asks _comms for the instance.
void raise_comms_error(const comms::Error& e) {
  auto none_if = [](bool unknown, py::object value) { return unknown ? py::none() : value; };
  py::object instance = py::module_::import("comms._comms").attr("_error")(
      std::string(e.what()), std::string(comms::to_string(e.code())), none_if(e.comm().empty(), py::str(e.comm())),
      none_if(e.op().empty(), py::str(e.op())), none_if(e.op().empty(), py::int_(e.seq())),
      none_if(e.rank() < 0, py::int_(e.rank())), none_if(e.peer() < 0, py::int_(e.peer())));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(instance.ptr())), instance.ptr());
}

PYBIND11_MODULE(_C, m) {
  py::module_::import("torch.distributed");  // registers c10d's classes with pybind11
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const comms::Error& e) {
      raise_comms_error(e);
    }
  });
  py::class_<ProcessGroupComms, c10d::Backend, c10::intrusive_ptr<ProcessGroupComms>>(m, "ProcessGroupComms")
      .def("describe", [](ProcessGroupComms& pg) { return comm_of(pg).describe(); })
      .def_property_readonly("comm_name", [](ProcessGroupComms& pg) { return comm_of(pg).name(); })
      .def_property_readonly("comm_backend", [](ProcessGroupComms& pg) { return comm_of(pg).backend_string(); })
      .def_property_readonly("is_finalized", [](ProcessGroupComms& pg) { return !pg.comm(); })
      .def(
          "offload", [](ProcessGroupComms& pg, const std::string& type) { return pg.offload(comms::parse_device_type(type)); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "reload", [](ProcessGroupComms& pg, const std::string& type) { return pg.reload(comms::parse_device_type(type)); },
          py::call_guard<py::gil_scoped_release>())
      .def("backend_state",
           [](ProcessGroupComms& pg, const std::string& type) {
             return std::string(comms::to_string(comm_of(pg).backend_state(comms::parse_device_type(type))));
           })
      .def("finalize", &ProcessGroupComms::finalize, py::call_guard<py::gil_scoped_release>())
      // torch's new_group on a device-bound world: a non-member's part in the
      // members' split (torch names the method after NCCL's).
      .def(
          "perform_nocolor_split",
          [](ProcessGroupComms& pg, const py::object& /*device*/) {
            translate([&] {
              py::gil_scoped_release release;
              pg.split_as_nonmember("nocolor");
              return 0;
            });
          },
          py::arg("device") = py::none())
      // torch's allocate_tensor, with comms' errors as comms.Error (torch's
      // binding of allocate_tensor turns them into RuntimeError).
      .def("_allocate_tensor",
           [](ProcessGroupComms& pg, int64_t size, at::ScalarType dtype) {
             return pg.allocateTensor(size, at::TensorOptions().dtype(dtype).device(at::kCPU));
           },
           py::arg("size"), py::arg("dtype"))
      .def("can_register",
           [](ProcessGroupComms& pg, const std::string& type) {
             return comms::can_register_buffers(comm_of(pg), comms::parse_device_type(type));
           })
      .def("register_tensor", [](ProcessGroupComms& pg, const at::Tensor& tensor) {
        const auto view = comms_torch::view_of(tensor, comms_torch::Use::kMove, "register_tensor", "tensor");
        py::gil_scoped_release release;
        return std::make_shared<RegisteredTensor>(RegisteredTensor{comms::register_buffer(comm_of(pg), view), tensor});
      });

  // The C++ half of comms.torch.Options: what torch keeps and hands back to
  // split() (split_group's pg_options, a parent's getBackendOptions).
  py::class_<CommsOptions, c10d::Backend::Options, c10::intrusive_ptr<CommsOptions>>(m, "_CommsOptions")
      .def(py::init<>())
      .def("_set_config",
           [](CommsOptions& o, const std::string& backend, const comms::Hints& hints, std::optional<Millis> op_timeout,
              std::optional<Millis> init_timeout) {
             o.config = config_of("", backend, hints, op_timeout, init_timeout, std::nullopt);
             if (op_timeout) o.timeout = *op_timeout;
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
      "A group bootstrapped through torch's store.");
  m.def(
      "split",
      [](ProcessGroupComms& parent, const std::vector<int>& ranks, const std::string& name,
         const std::string& backend, const comms::Hints& hints, std::optional<Millis> op_timeout,
         std::optional<Millis> init_timeout) {
        const auto config = config_of(name, backend, hints, op_timeout, init_timeout, std::nullopt);
        return translate([&] {
          py::gil_scoped_release release;
          return c10::make_intrusive<ProcessGroupComms>(parent, ranks, config);
        });
      },
      "A member's group carved from `parent` (new_group on a device-bound world).");
}
