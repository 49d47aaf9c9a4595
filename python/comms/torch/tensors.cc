#include "tensors.h"

#include <optional>
#include <stdexcept>

#include <torch/version.h>

namespace comms_torch {

void fail(const char* call, const std::string& what) {
  throw std::invalid_argument(std::string("comms.torch ") + call + ": " + what);
}

namespace {

struct Mapped {
  comms::DataType dtype;
  int64_t per_element;  // comms elements per torch element (complex: 2)
  bool reducible;
};

std::optional<Mapped> map_dtype(at::ScalarType s) {
  using comms::DataType;
  switch (s) {
    case at::kFloat: return Mapped{DataType::kFloat32, 1, true};
    case at::kDouble: return Mapped{DataType::kFloat64, 1, true};
    case at::kHalf: return Mapped{DataType::kFloat16, 1, true};
    case at::kBFloat16: return Mapped{DataType::kBfloat16, 1, true};
    case at::kChar: return Mapped{DataType::kInt8, 1, true};
    case at::kByte: return Mapped{DataType::kUint8, 1, true};
    case at::kInt: return Mapped{DataType::kInt32, 1, true};
    case at::kLong: return Mapped{DataType::kInt64, 1, true};
    case at::kBool: return Mapped{DataType::kBool, 1, true};
    case at::kComplexFloat: return Mapped{DataType::kFloat32, 2, true};
    case at::kComplexDouble: return Mapped{DataType::kFloat64, 2, true};
    case at::kComplexHalf: return Mapped{DataType::kFloat16, 2, true};
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    case at::kFloat8_e4m3fn: return Mapped{DataType::kFloat8E4M3, 1, true};
    case at::kFloat8_e5m2: return Mapped{DataType::kFloat8E5M2, 1, true};
#endif
    default: return std::nullopt;
  }
}

}  // namespace

std::string dtype_name(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(s);
  }
}

namespace {

comms::Device device_of(const at::Tensor& t, const char* call, const char* role) {
  if (t.device().is_cpu()) return comms::Device::cpu();
  if (t.device().is_cuda()) return comms::Device::cuda(t.device().index());
  fail(call, std::string(role) + " is on " + t.device().str() + "; comms takes cpu and cuda tensors");
}

}  // namespace

comms::BufferView view_of(const at::Tensor& t, Use use, const char* call, const char* role) {
  if (!t.defined()) fail(call, std::string(role) + " is an undefined tensor");
  if (t.is_sparse()) fail(call, std::string(role) + " is sparse; comms takes dense tensors");
  if (!t.is_contiguous()) fail(call, std::string(role) + " is not contiguous (call .contiguous() first)");
  comms::BufferView v;
  v.data = t.data_ptr();
  v.device = device_of(t, call, role);
  const auto mapped = map_dtype(t.scalar_type());
  if (mapped && (use == Use::kMove || mapped->reducible)) {
    v.dtype = mapped->dtype;
    v.count = static_cast<size_t>(t.numel() * mapped->per_element);
    return v;
  }
  if (use == Use::kReduce) {
    fail(call, std::string(role) + " has dtype " + dtype_name(t.scalar_type()) +
                   ", which comms cannot reduce");
  }
  v.dtype = comms::DataType::kUint8;  // moved, never combined: the bytes are the value
  v.count = static_cast<size_t>(t.numel()) * t.element_size();
  return v;
}

void check_same(const at::Tensor& t, const at::Tensor& like, const char* call, const char* role,
                int64_t numel) {
  if (t.scalar_type() != like.scalar_type()) {
    fail(call, std::string(role) + " has dtype " + dtype_name(t.scalar_type()) + ", expected " +
                   dtype_name(like.scalar_type()));
  }
  if (t.device() != like.device()) {
    fail(call, std::string(role) + " is on " + t.device().str() + ", expected " + like.device().str());
  }
  if (t.numel() != numel) {
    fail(call, std::string(role) + " has " + std::to_string(t.numel()) + " elements, expected " +
                   std::to_string(numel));
  }
}

void check_like(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* call,
                const char* role) {
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string name = std::string(role) + "[" + std::to_string(i) + "]";
    check_same(list[i], like, call, name.c_str(), like.numel());
  }
}

void check_per_rank(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* call,
                    const char* role) {
  if (list.size() != static_cast<size_t>(size)) {
    fail(call, std::string(role) + " has " + std::to_string(list.size()) + " tensors, but the group has " +
                   std::to_string(size) + " ranks");
  }
  check_like(list, like, call, role);
}

std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                 const comms::BufferView& view, const char* call, const char* role) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t per_row = rows == 0 ? 0 : view.count / static_cast<size_t>(rows);
  std::vector<size_t> counts(static_cast<size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0) {
      fail(call, std::string(role) + " has " + std::to_string(rows) + " rows, not divisible by the group size " +
                     std::to_string(size));
    }
    for (auto& c : counts) c = per_row * static_cast<size_t>(rows / size);
    return counts;
  }
  if (splits.size() != static_cast<size_t>(size)) {
    fail(call, std::string(role) + " split sizes has " + std::to_string(splits.size()) +
                   " entries, but the group has " + std::to_string(size) + " ranks");
  }
  int64_t sum = 0;
  for (size_t r = 0; r < splits.size(); ++r) {
    if (splits[r] < 0) fail(call, std::string(role) + " split sizes has a negative entry");
    sum += splits[r];
    counts[r] = per_row * static_cast<size_t>(splits[r]);
  }
  if (sum != rows) {
    fail(call, std::string(role) + " split sizes add up to " + std::to_string(sum) + ", but it has " +
                   std::to_string(rows) + " rows");
  }
  return counts;
}

}  // namespace comms_torch
