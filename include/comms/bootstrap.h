// Where a process learns its rank, world size and local rank, and the store it
// rendezvouses through.
#pragma once

#include "comms/export.h"

#include <chrono>
#include <memory>
#include <string>

namespace comms {

class Store;

struct BootstrapInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // The variable family the values came from: "COMMS", "torchrun", "openmpi",
  // "pmi", "slurm", or "default" when none is set.
  std::string source = "default";
};

// Reads, in this order of precedence: COMMS_RANK/COMMS_WORLD_SIZE;
// RANK/WORLD_SIZE (torchrun, commsrun); OMPI_COMM_WORLD_RANK/_SIZE;
// PMI_RANK/PMI_SIZE; SLURM_PROCID/SLURM_NTASKS. The local rank comes from the
// same family (COMMS_LOCAL_RANK, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, SLURM_LOCALID). Throws comms::Error(kInvalidArgument) on a
// malformed or inconsistent value.
COMMS_API BootstrapInfo bootstrap_from_environment();

// The process-wide store for a job of `world_size`, created on first use:
//   COMMS_STORE=file:///dir   a file store;
//   COMMS_STORE=tcp://h:p     a TCP store at h:p;
//   MASTER_ADDR/MASTER_PORT   a TCP store there, hosted by the launcher when
//                             COMMS_LAUNCHER_STORE=1, else by rank 0;
//   nothing, world size 1     an in-process store.
// Throws comms::Error(kInvalidArgument) when a multi-process job has none.
COMMS_API std::shared_ptr<Store> default_store(int rank, int world_size,
                                     std::chrono::milliseconds connect_timeout);

}  // namespace comms
