// Tensors as comms buffers: the checks every op makes before anything is
// sent (one dense tensor per list, matching dtypes and sizes, a device the
// group can reach), and the views comms takes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comms/error.h"
#include "comms/types.h"
#include "comms/work.h"

namespace comms_torch {

// Whether the op combines values (then the dtype must be one comms reduces)
// or only moves them (then a dtype comms has no name for travels as bytes).
[[noreturn]] void fail(const char* call, const std::string& what);

// Runs f, which issues a comms op. comms refuses bad input with
// kInvalidArgument before anything is sent; torch users expect ValueError
// for that (pybind11 maps std::invalid_argument).
template <class F>
comms::Work issue(F&& f) {
  try {
    return f();
  } catch (const comms::Error& e) {
    if (e.code() == comms::ErrorCode::kInvalidArgument) throw std::invalid_argument(e.what());
    throw;
  }
}

// torch's name of a dtype: "float32", "int16", "complex64".
std::string dtype_name(at::ScalarType s);

enum class Use : uint8_t { kMove, kReduce };

// The view of a dense tensor. Complex tensors are their real pairs (as
// torch's own backends treat them); int16 and other dtypes without a comms
// type travel as bytes when `use` is kMove. Throws std::invalid_argument
// naming `call` and `role` for a tensor comms cannot take.
comms::BufferView view_of(const at::Tensor& t, Use use, const char* call, const char* role);

// The single element of a list (c10d passes lists of one per process).
template <class T>
const T& single(const std::vector<T>& list, const char* call, const char* role) {
  if (list.size() != 1) {
    fail(call, std::string(role) + " holds " + std::to_string(list.size()) + " entries; comms takes one per process");
  }
  return list[0];
}

// Every tensor of `list` has the dtype, device and element count of `like`.
void check_like(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* call,
                const char* role);
// One tensor per rank of a group of `size`, each like `like`.
void check_per_rank(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* call,
                    const char* role);
void check_same(const at::Tensor& t, const at::Tensor& like, const char* call, const char* role,
                int64_t numel);

// Element counts of an all_to_all_single split: `splits` of dim 0 (even when
// empty), scaled by the elements of one row, in the units of `view`.
std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                 const comms::BufferView& view, const char* call, const char* role);


}  // namespace comms_torch
