// The one oracle for collective results, shared by the multi-process op
// tests (tests/mp/ops_test.cc) and the conformance suite
// (tests/conformance): the values each rank contributes, the closed-form
// result of every reduction, and how closely each dtype must match it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comms/types.h"

namespace comms::oracle {

// Every dtype, and every reduction defined on one (premul_sum with factor 2).
std::vector<DataType> all_data_types();
std::vector<ReduceOp> reductions_for(DataType t);

// The value rank r puts at index i for reduction `kind`, chosen so that every
// partial result a backend can form (in any order) is exact in the type; only
// avg's final division rounds. They stay small so no sum wraps; products
// (powers of two) may wrap, which expected_reduction reproduces.
double reduce_input(DataType t, ReduceKind kind, int r, size_t i);
// The reduction of reduce_input over ranks 0..size-1 at index i.
double expected_reduction(DataType t, const ReduceOp& op, int size, size_t i);
// A value that identifies (rank, index) as far as the type can, for data
// movement ops; exact in every type.
double data_value(DataType t, int r, size_t i);

// Stores v at element i of bytes of type t; integers wrap (two's complement),
// where a direct conversion of an out-of-range double would be undefined.
void store(void* bytes, DataType t, size_t i, double v);
// v as the type holds it (rounded, or wrapped for integers).
double round_to(DataType t, double v);

// The relative tolerance of a floating result (0: exact).
double tolerance(DataType t);
// Whether `have` matches the expectation `want` (already round_to'd):
// exactly for integers and bool, within tolerance(t) relative to
// max(1, |want|) for floating types.
bool matches(DataType t, double want, double have);

}  // namespace comms::oracle
