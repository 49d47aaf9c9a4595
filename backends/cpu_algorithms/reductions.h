// Element-wise reductions for every comms data type, in the shape Gloo's
// collectives call them: out[i] = a[i] (op) b[i], where out may alias a or b.
// avg and premul_sum reduce with sum and then finish the result with
// divide()/scale(); both are linear, so the result is the same as scaling the
// inputs first, up to floating-point rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comms/types.h"

namespace comms::cpu_algorithms {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The kernel for (dtype, kind); null when the pair is not defined.
ReduceFn reduce_fn(DataType dtype, ReduceKind kind);

// data[i] *= factor (integers multiply by the factor converted to their type).
void scale(void* data, DataType dtype, size_t n, double factor);

// data[i] /= divisor (integers truncate toward zero).
void divide(void* data, DataType dtype, size_t n, int divisor);

}  // namespace comms::cpu_algorithms

namespace comms::cpu_algorithms {

// The same kernels in the in-place, typed shape of Gloo's algorithm classes
// (x = x op y), on the unsigned storage type of the element's width.
// Calls f with a value of the unsigned storage type of an element's width.
template <class F>
void with_element_type(size_t element_size, F&& f) {
  switch (element_size) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

template <class Storage>
using InPlaceFn = void (*)(Storage* x, const Storage* y, size_t n);

template <class Storage>
InPlaceFn<Storage> in_place_fn(DataType dtype, ReduceKind kind);

}  // namespace comms::cpu_algorithms
