#include "buffers.h"

#include <cstdint>
#include <optional>
#include <sstream>

namespace comms_py {
namespace {

// DLPack's ABI (dlpack.h, v0.8 and v1.x): only the layout is needed.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLManagedTensorVersioned {
  uint32_t major;
  uint32_t minor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLReadOnlyFlag = 1;
enum : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
};

struct PyBufferHolder : Holder {
  Py_buffer view{};
  ~PyBufferHolder() override { PyBuffer_Release(&view); }
};

// The capsule's own destructor calls the producer's deleter (we never rename
// it to "used_dltensor"), so holding it is holding the memory.
struct CapsuleHolder : Holder {
  py::object capsule;
  explicit CapsuleHolder(py::object c) : capsule(std::move(c)) {}
};

std::string type_name(py::handle object) { return py::str(py::type::of(object).attr("__name__")); }

[[noreturn]] void raise_value(const std::string& message) { throw py::value_error(message); }
[[noreturn]] void raise_type(const std::string& message) { throw py::type_error(message); }

std::optional<comms::DataType> data_type_of_dlpack(DLDataType t) {
  using comms::DataType;
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLInt:
      if (t.bits == 8) return DataType::kInt8;
      if (t.bits == 32) return DataType::kInt32;
      if (t.bits == 64) return DataType::kInt64;
      return std::nullopt;
    case kDLUInt:
      if (t.bits == 8) return DataType::kUint8;
      if (t.bits == 32) return DataType::kUint32;
      if (t.bits == 64) return DataType::kUint64;
      return std::nullopt;
    case kDLFloat:
      if (t.bits == 16) return DataType::kFloat16;
      if (t.bits == 32) return DataType::kFloat32;
      if (t.bits == 64) return DataType::kFloat64;
      return std::nullopt;
    case kDLBfloat: return t.bits == 16 ? std::optional(DataType::kBfloat16) : std::nullopt;
    case kDLBool: return t.bits == 8 ? std::optional(DataType::kBool) : std::nullopt;
    case kDLFloat8_e4m3fn: return t.bits == 8 ? std::optional(DataType::kFloat8E4M3) : std::nullopt;
    case kDLFloat8_e5m2: return t.bits == 8 ? std::optional(DataType::kFloat8E5M2) : std::nullopt;
    default: return std::nullopt;
  }
}

// Row-major and dense: strides (in elements) equal the shape's products,
// ignoring dimensions of extent 1.
bool dlpack_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

Buffer from_dltensor(const DLTensor& t, bool read_only, py::handle object, const char* role) {
  const auto dtype = data_type_of_dlpack(t.dtype);
  if (!dtype) {
    raise_type(std::string(role) + ": DLPack element type (code " + std::to_string(t.dtype.code) + ", " +
               std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) +
               " lanes) of " + type_name(object) + " has no comms data type");
  }
  if (!dlpack_contiguous(t)) raise_value(std::string(role) + ": " + type_name(object) + " is not contiguous");
  size_t count = 1;
  for (int d = 0; d < t.ndim; ++d) count *= static_cast<size_t>(t.shape[d]);
  comms::Device device = comms::Device::cpu();
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      device = comms::Device::cuda(t.device.device_id);
      break;
    default:
      raise_type(std::string(role) + ": DLPack device type " + std::to_string(t.device.device_type) +
                 " is neither CPU nor CUDA");
  }
  Buffer b;
  b.view = {static_cast<char*>(t.data) + t.byte_offset, count, *dtype, device};
  b.read_only = read_only;
  return b;
}

Buffer acquire_dlpack(py::handle object, const char* role, Keepalive& keep) {
  py::object capsule;
  try {
    capsule = object.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = object.attr("__dlpack__")();  // a producer older than DLPack 1.0
  }
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    auto* managed =
        static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
    keep.push_back(std::make_shared<CapsuleHolder>(capsule));
    if (managed->major != 1) {
      raise_type(std::string(role) + ": DLPack major version " + std::to_string(managed->major) +
                 " is not supported (1 is)");
    }
    return from_dltensor(managed->dl_tensor, managed->flags & kDLReadOnlyFlag, object, role);
  }
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    keep.push_back(std::make_shared<CapsuleHolder>(capsule));
    return from_dltensor(managed->dl_tensor, false, object, role);
  }
  raise_type(std::string(role) + ": " + type_name(object) + ".__dlpack__() returned no DLPack capsule");
}

Buffer acquire_buffer_protocol(py::handle object, const char* role, Keepalive& keep) {
  auto holder = std::make_shared<PyBufferHolder>();
  if (PyObject_GetBuffer(object.ptr(), &holder->view, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
  keep.push_back(holder);
  const Py_buffer& v = holder->view;
  if (!PyBuffer_IsContiguous(&v, 'C')) raise_value(std::string(role) + ": " + type_name(object) + " is not contiguous");
  const std::string format = v.format ? v.format : "B";
  const auto dtype = data_type_of_format(format, static_cast<size_t>(v.itemsize));
  if (!dtype) {
    raise_type(std::string(role) + ": element format '" + format + "' (" + std::to_string(v.itemsize) +
               " bytes) of " + type_name(object) + " has no comms data type");
  }
  Buffer b;
  b.view = {v.buf, static_cast<size_t>(v.len / v.itemsize), *dtype, comms::Device::cpu()};
  b.read_only = v.readonly != 0;
  return b;
}

}  // namespace

std::optional<comms::DataType> data_type_of_format(const std::string& format, size_t itemsize) {
  using comms::DataType;
  std::string f = format;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() != 1) return std::nullopt;  // '>', '!', structs, counts
  switch (f[0]) {
    case '?': return DataType::kBool;
    case 'b': return DataType::kInt8;
    case 'B': case 'c': return DataType::kUint8;
    case 'e': return DataType::kFloat16;
    case 'f': return DataType::kFloat32;
    case 'd': return DataType::kFloat64;
    case 'i': case 'l': case 'q': case 'n':
      if (itemsize == 4) return DataType::kInt32;
      if (itemsize == 8) return DataType::kInt64;
      return std::nullopt;
    case 'I': case 'L': case 'Q': case 'N':
      if (itemsize == 4) return DataType::kUint32;
      if (itemsize == 8) return DataType::kUint64;
      return std::nullopt;
    default: return std::nullopt;
  }
}

Buffer acquire(py::handle object, const char* role, Access access, Keepalive& keep) {
  if (object.is_none()) raise_type(std::string(role) + ": a buffer is required, got None");
  Buffer b;
  if (PyObject_CheckBuffer(object.ptr())) {
    b = acquire_buffer_protocol(object, role, keep);  // knows read-only, unlike DLPack < 1.0
  } else if (py::hasattr(object, "__dlpack__")) {
    b = acquire_dlpack(object, role, keep);
  } else {
    raise_type(std::string(role) + ": " + type_name(object) +
               " supports neither the buffer protocol nor __dlpack__");
  }
  if (access == Access::kWrite && b.read_only) {
    raise_value(std::string(role) + ": " + type_name(object) + " is read-only, but this op writes to it");
  }
  return b;
}

void check_same_dtype(const Buffer& a, const char* a_role, const Buffer& b, const char* b_role) {
  if (a.view.dtype == b.view.dtype) return;
  raise_type(std::string("dtype mismatch: ") + a_role + " is " + std::string(comms::to_string(a.view.dtype)) +
             ", " + b_role + " is " + std::string(comms::to_string(b.view.dtype)));
}

void check_count(const Buffer& buffer, const char* role, size_t count, const std::string& why) {
  if (buffer.view.count == count) return;
  raise_value(std::string(role) + " holds " + std::to_string(buffer.view.count) + " elements, but " + why +
              " needs " + std::to_string(count));
}

}  // namespace comms_py
