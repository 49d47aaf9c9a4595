// comms-bench's own element-wise reductions, for the floor (floor.h) and
// Gloo's algorithm classes (gloo_native.h): one plain loop per data type and
// operator, out[i] = a[i] (op) b[i] with out aliasing a or b or apart from
// both, left for the compiler to vectorize (the bench's library is built at
// -O3 for it). Integers wrap on overflow; 16- and 8-bit floats reduce in
// float and round back (comms/numeric.h); bool sum/max/bor are "or",
// product/min/band "and", bxor "xor". avg and premul_sum reduce as sum and
// are finished by finish_reduction().
#pragma once

#include <cstddef>
#include <cstdint>

#include "comms/types.h"

namespace comms::bench {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The loop for (dtype, kind); null where comms defines no such reduction
// (reduction_defined in comms/types.h).
ReduceFn plain_reduce_fn(DataType dtype, ReduceKind kind);

// What avg and premul_sum do after the sum of `ranks` inputs: divide by
// `ranks` (integers truncate toward zero) or multiply by the op's scalar
// (integers by the scalar converted to their type). Nothing for other ops.
void finish_reduction(void* data, DataType dtype, size_t n, const ReduceOp& op, int ranks);

// The same loops in place (x = x op y) on the unsigned storage type of the
// element's width, the shape Gloo's algorithm classes take; null where
// plain_reduce_fn is, or when Storage is not the element's width.
template <class Storage>
using InPlaceFn = void (*)(Storage* x, const Storage* y, size_t n);
template <class Storage>
InPlaceFn<Storage> plain_in_place_fn(DataType dtype, ReduceKind kind);

}  // namespace comms::bench
