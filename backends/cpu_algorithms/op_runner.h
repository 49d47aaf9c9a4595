// Every collective of the plugin API (not point-to-point) on the CPU
// algorithms over one Transport: Collectives (collectives.h) where
// algorithms.h picks one, VectorCollectives (vector_collectives.h) for the
// rest, local copies on a one-rank comm. A backend that only has a
// transport gets the whole collective contract from this class.
#pragma once

#include <chrono>

#include "collectives.h"
#include "comms/plugin.h"
#include "transport.h"
#include "vector_collectives.h"

namespace comms::cpu_algorithms {

// avg divides by size, premul_sum scales: after the sum.
void finish_reduction(const plugin::OpDesc& op, void* data, size_t n, int size);

// A collective on a one-rank comm: a copy (plus the avg/premul finish), or
// nothing for broadcast, barrier and an empty batch. Throws
// std::invalid_argument for a send or receive (no peer exists).
void run_on_one_rank(const plugin::OpDesc& op);

// An op that algorithms.h gives to Collectives (algorithm_for != kNone),
// with the avg/premul finish; the caller set the op's timeout on
// `collectives`. Shared by OpRunner and the Gloo backend's sync mesh.
// Throws TransportError, or std::invalid_argument for a missing reduction.
void run_collective(Collectives& collectives, const plugin::OpDesc& op);

class OpRunner {
 public:
  // The transport must outlive this object.
  OpRunner(Transport& transport, std::chrono::milliseconds timeout)
      : t_(transport), collectives_(transport, timeout), vector_(transport) {}

  // Runs op with op.timeout as its deadline. Throws TransportError, or
  // std::invalid_argument for point-to-point ops and missing reductions.
  void run(const plugin::OpDesc& op);

 private:
  void run_vector(const plugin::OpDesc& op, Clock::time_point deadline);

  Transport& t_;
  Collectives collectives_;
  VectorCollectives vector_;
};

}  // namespace comms::cpu_algorithms
