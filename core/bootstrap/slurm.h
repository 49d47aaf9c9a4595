// Under srun, where a job's rendezvous is when nothing else says: the TCP
// store on the first host of the step's node list, at a port derived from
// the job id; and the name that keeps one job's file store apart from
// another's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace comms::slurm {

// The first host of a Slurm node list in its compact form:
// "node[01-04,07],gpu5" -> "node01", "rack[2-3]-n[08-09]" -> "rack2-n08".
// Throws comms::Error(kInvalidArgument) naming `variable` and the value when
// it is not a node list.
std::string first_host(std::string_view nodelist, std::string_view variable);

// 15000 + SLURM_JOB_ID % 20000: every rank of a job computes the same port
// and jobs sharing a first node rarely meet. Throws naming the variable when
// `job_id` is not a number.
uint16_t port_for_job(std::string_view job_id);

struct StoreAddress {
  std::string host;
  uint16_t port = 0;
  std::string source;  // e.g. "SLURM_STEP_NODELIST and SLURM_JOB_ID", for messages
};

// Where the TCP store is for a process started by srun (SLURM_PROCID and
// SLURM_JOB_ID set): the first host of SLURM_STEP_NODELIST, else
// SLURM_JOB_NODELIST, else SLURM_NODELIST, and port_for_job. nullopt when
// not under srun.
std::optional<StoreAddress> store_address();

// A name for this job's own subfolder of a shared file store: COMMS_JOB_ID,
// else SLURM_JOB_ID (".<SLURM_STEP_ID>" appended when set), else nullopt.
std::optional<std::string> job_namespace();

}  // namespace comms::slurm
