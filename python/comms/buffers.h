// Turning Python objects into comms::BufferView: the buffer protocol (numpy,
// array, bytearray) or DLPack (__dlpack__: numpy, torch, CuPy). Every check
// happens here, before anything is sent.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "comms/types.h"

namespace comms_py {

namespace py = pybind11;

// Keeps the memory behind a view alive (a Py_buffer or a DLPack capsule).
// Destroyed with the GIL held.
struct Holder {
  virtual ~Holder() = default;
};
using Keepalive = std::vector<std::shared_ptr<Holder>>;

struct Buffer {
  comms::BufferView view;
  bool read_only = false;
};

enum class Access { kRead, kWrite };

// `role` names the argument in error messages ("output"). Raises ValueError
// for a non-contiguous buffer or a read-only one given kWrite, TypeError for
// an object that is no buffer or an element type comms has no DataType for.
Buffer acquire(py::handle object, const char* role, Access access, Keepalive& keep);

// TypeError unless both have the same element type.
void check_same_dtype(const Buffer& a, const char* a_role, const Buffer& b, const char* b_role);
// ValueError unless `buffer` holds exactly `count` elements; `why` says where
// the count comes from ("size() * input").
void check_count(const Buffer& buffer, const char* role, size_t count, const std::string& why);

// The DataType of a buffer-protocol format string with its item size, or
// nullopt when comms has none.
std::optional<comms::DataType> data_type_of_format(const std::string& format, size_t itemsize);

}  // namespace comms_py
