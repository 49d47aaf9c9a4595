// comms.register_buffer / can_register_buffers and alloc_backend_memory /
// can_alloc_backend_memory (comms/registration.h). The registration handle
// keeps the Python buffer alive while it is registered.
#include "bindings.h"
#include "comms/registration.h"

namespace comms_py {

namespace {

// Memory from a comm's allocator as a Python buffer (1-D, unsigned bytes,
// writable). Every view (numpy.frombuffer, torch.frombuffer, memoryview)
// holds this object through the buffer protocol, so the memory is freed
// once, when the last reference is gone, never under a live view. It holds
// the comm: freeing goes through it, and the memory stays valid after the
// comm's finalize (comms/registration.h: not tied to the comm's lifetime).
class BackendMemory {
 public:
  BackendMemory(std::shared_ptr<comms::Comm> comm, comms::Device device, size_t bytes)
      : comm_(std::move(comm)), device_(device), bytes_(bytes) {
    py::gil_scoped_release nogil;
    data_ = comms::alloc_backend_memory(*comm_, device_, bytes_);
  }
  BackendMemory(const BackendMemory&) = delete;
  BackendMemory& operator=(const BackendMemory&) = delete;
  // Python destroys it with the GIL held. A destructor cannot raise: a
  // failure goes where Python reports those of __del__ (sys.unraisablehook).
  ~BackendMemory() {
    try {
      comms::free_backend_memory(*comm_, device_, data_);
    } catch (const std::exception& e) {
      py::error_scope keep_pending;  // an exception already propagating stays
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(nullptr);
    }
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const comms::Device& device() const { return device_; }

 private:
  std::shared_ptr<comms::Comm> comm_;
  comms::Device device_;
  size_t bytes_;
  void* data_ = nullptr;
};

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

  py::class_<BackendMemory, std::shared_ptr<BackendMemory>>(
      m, "BackendMemory", py::buffer_protocol(),
      "Memory from a comm's allocator (alloc_backend_memory): a writable buffer of bytes that "
      "numpy.frombuffer and torch.frombuffer view without a copy. Freed when the last view is gone.")
      .def_buffer([](BackendMemory& mem) {
        return py::buffer_info(mem.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(mem.bytes())}, {1}, /*readonly=*/false);
      })
      .def_property_readonly("nbytes", &BackendMemory::bytes)
      .def_property_readonly("device", [](const BackendMemory& mem) { return mem.device().to_string(); })
      .def_property_readonly("address", [](const BackendMemory& mem) { return reinterpret_cast<uintptr_t>(mem.data()); },
                             "The first byte's address (a view's data pointer equals it: no copy).")
      .def("__len__", &BackendMemory::bytes);
  m.def("can_alloc_backend_memory", [](const comms::Comm& c, const std::string& device_type) {
        return comms::can_alloc_backend_memory(c, comms::parse_device_type(device_type));
      }, py::arg("comm"), py::arg("device_type"),
      "Whether the comm's backend for 'cpu'/'cuda' has an allocator of its own (UCX and NCCL do; Gloo does not).");
  m.def("alloc_backend_memory", [](const std::shared_ptr<comms::Comm>& c, const std::string& device, size_t nbytes) {
        const comms::Device d = comms::Device::parse(device);
        if (d.type != comms::DeviceType::kCpu) {
          throw py::value_error("alloc_backend_memory: Python takes cpu memory only (a buffer object), not " +
                                d.to_string());
        }
        return std::make_shared<BackendMemory>(c, d, nbytes);
      }, py::arg("comm"), py::arg("device"), py::arg("nbytes"),
      "nbytes of the memory the comm's backend for `device` prefers (cpu:ucx: memory every rank of the "
      "host maps, so ops on it skip the kernel copy); raises comms.Error(code='unsupported') where the "
      "backend has no allocator (Gloo).");
}

}  // namespace comms_py
