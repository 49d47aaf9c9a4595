#include "config/env.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>

#include "util/strutil.h"
#include "comms/error.h"

namespace comms::env {
namespace {

constexpr Variable kVariables[] = {
    {"COMMS_BACKEND", "", "Backend string for comms created without one, e.g. cpu:gloo,cuda:nccl. Unset: cpu:gloo, plus cuda:nccl when a CUDA device and the nccl plugin are present."},
    {"COMMS_ROUTE", "direct", "How comms::dist creates groups: direct (each group bootstraps its own communicators from the store) or split (groups are carved from the bound world with Comm::split). Any other value is an error at init_process_group."},
    {"COMMS_INIT_TIMEOUT", "5m", "Timeout of communicator initialisation and rendezvous (250ms, 30s, 5m, or plain seconds). CommOptions::init_timeout wins over it."},
    {"COMMS_OP_TIMEOUT", "10m", "Timeout of each operation. CommOptions::op_timeout and OpOptions::timeout win over it."},
    {"COMMS_ELASTIC", "0", "Boolean. 1: comms are elastic unless CommOptions::elastic says otherwise: each rank heartbeats and looks for revocations in the store about every 100 ms, which recover()/agree_on_failures()/revoke() need. commsrun --keep-going sets it for its ranks."},
    {"COMMS_ELASTIC_LIVENESS_TIMEOUT", "1s", "Elastic recovery: a rank on another host, or a stopped process on this one, whose store heartbeat (written about every 100 ms) has not moved for this long is lost to an agreement at once (a running process on this host is alive, from /proc). AgreeOptions::liveness_timeout wins over it."},
    {"COMMS_REPLACEMENT", "", "Set by commsrun --keep-going --replace for a replacement process (1, 2, ... on its node), which has no RANK: the example trainers (--elastic) then join the running job with comms::join instead of creating it. libcomms does not read it."},
    {"COMMS_STORE", "", "Rendezvous store: file:///shared/dir or tcp://host:port. Unset: MASTER_ADDR/MASTER_PORT, or an in-process store for a single process."},
    {"COMMS_LAUNCHER_STORE", "0", "Boolean. 1: a launcher hosts the TCP store at MASTER_ADDR:MASTER_PORT. 0: rank 0 hosts it. (commsrun announces its store in COMMS_STORE instead.)"},
    {"COMMS_STORE_TOKEN", "", "Shared secret of the TCP store: every client proves it (HMAC-SHA256 challenge-response, never sent in clear) before any request is served, and the server proves it back. Set the same value on every node of a multi-node job; commsrun makes a random one for a single-node job. Unset (and no COMMS_STORE_TOKEN_FILE): the store is open to anyone who can reach it."},
    {"COMMS_STORE_TOKEN_FILE", "", "File holding the TCP store's token (trailing white space ignored), instead of COMMS_STORE_TOKEN; setting both is an error."},
    {"COMMS_PLUGIN_PATH", "", "Colon-separated directories searched for libcomms-<name>.so before the install and build directories."},
    {"COMMS_BACKEND_LIB_<NAME>", "", "Exact plugin file for backend <name> (upper case), e.g. COMMS_BACKEND_LIB_GLOO=/opt/libcomms-gloo.so. Wins over every search directory."},
    {"COMMS_HINTS_STRICT", "1", "Boolean. 1: an unknown hint key is an error. 0: it is a warning and the key is ignored."},
    {"COMMS_LOG_LEVEL", "warning", "debug, info, warning or error. At info, every comm logs its effective configuration when created."},
    {"COMMS_RANK", "", "Rank of this process; wins over every launcher's variables."},
    {"COMMS_WORLD_SIZE", "", "Number of processes; read with COMMS_RANK."},
    {"COMMS_LOCAL_RANK", "", "Rank among the processes on this host; the default device index."},
    {"COMMS_TRACE_BUFFER", "2000", "Flight recorder: how many of its last ops each comm keeps (a fixed ring, no allocation per op). 0 turns it off."},
    {"COMMS_TRACE_DIR", "", "Flight recorder: directory where each rank writes <comm>.rank<R>.json on an op timeout, a peer failure, abort(), SIGUSR1 or comms::dump_traces(). Unset: no dumps. Read them with comms-trace DIR."},
    {"COMMS_DEBUG", "off", "off or detail. detail: before each collective every rank checks through the store that all ranks called the same op, dtype, count, root and reduction, and all fail with invalid_argument otherwise (costs a store round trip per rank and op)."},
    {"COMMS_LOCAL_WORLD_SIZE", "", "Processes on this host; CPU backends spin on reads only when it is at most the number of cores."},
    {"RANK", "", "Rank, as set by torchrun and commsrun."},
    {"WORLD_SIZE", "", "World size, as set by torchrun and commsrun."},
    {"LOCAL_RANK", "", "Local rank, as set by torchrun and commsrun."},
    {"LOCAL_WORLD_SIZE", "", "Local world size, as set by torchrun and commsrun."},
    {"MASTER_ADDR", "", "Host of the TCP store when COMMS_STORE is unset (under commsrun, which sets COMMS_STORE, the program's own, e.g. torch's TCPStore)."},
    {"MASTER_PORT", "", "Port of the TCP store when COMMS_STORE is unset (under commsrun: a free port for the program's own store)."},
    {"OMPI_COMM_WORLD_RANK", "", "Rank under Open MPI's mpirun."},
    {"OMPI_COMM_WORLD_SIZE", "", "World size under Open MPI's mpirun."},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "", "Local rank under Open MPI's mpirun."},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "", "Local world size under Open MPI's mpirun."},
    {"PMI_RANK", "", "Rank under PMI launchers (MPICH, Intel MPI)."},
    {"PMI_SIZE", "", "World size under PMI launchers."},
    {"MPI_LOCALRANKID", "", "Local rank under MPICH/Intel MPI."},
    {"MPI_LOCALNRANKS", "", "Local world size under MPICH/Intel MPI."},
    {"SLURM_PROCID", "", "Rank under srun."},
    {"SLURM_NTASKS", "", "World size under srun."},
    {"SLURM_LOCALID", "", "Local rank under srun."},
    {"SLURM_NTASKS_PER_NODE", "", "Local world size under srun (the leading number is used)."},
    {"SLURM_JOB_ID", "", "Under srun (with SLURM_PROCID), when MASTER_PORT is unset: the TCP store's port is 15000 + SLURM_JOB_ID % 20000. Also names the job's subfolder of a file store (slurm-<id>[.<step>])."},
    {"SLURM_STEP_ID", "", "With SLURM_JOB_ID: the file store's subfolder is per job step (slurm-<job>.<step>), so that steps never read each other's keys."},
    {"SLURM_STEP_NODELIST", "", "Under srun, when MASTER_ADDR is unset: the TCP store is on the first host of this node list (compact form, e.g. node[01-04,07]); rank 0 hosts it."},
    {"SLURM_JOB_NODELIST", "", "As SLURM_STEP_NODELIST, when that is unset."},
    {"SLURM_NODELIST", "", "As SLURM_STEP_NODELIST, when neither it nor SLURM_JOB_NODELIST is set."},
    {"COMMS_JOB_ID", "", "Names this job's own subfolder of a file store (COMMS_STORE=file://DIR uses DIR/<id>); wins over SLURM_JOB_ID. Without either, a file store holding keys older than the init timeout is refused as stale."},
    {"CUDA_VISIBLE_DEVICES", "", "commsrun --nproc-per-node=auto: the number of devices listed (up to the first invalid entry), else /dev/nvidiaN, else the CPUs this process may use."},
    {"PATH", "/usr/local/bin:/usr/bin:/bin", "commsrun: where it looks for a program named without a '/', as execvp(3) does."},
    {"COMMS_TEST_REPORT_DIR", "", "Test harness only: directory where each test binary writes its per-rank gtest JSON report."},
};

}  // namespace

std::span<const Variable> documented() { return kVariables; }

std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what) {
  std::string_view t = str::strip(text);
  double scale_ms = 1000.0;  // plain numbers are seconds
  if (str::consume_suffix(t, "ms")) scale_ms = 1;
  else if (str::consume_suffix(t, "s")) scale_ms = 1000;
  else if (str::consume_suffix(t, "m")) scale_ms = 60'000;
  else if (str::consume_suffix(t, "h")) scale_ms = 3'600'000;
  double value = 0;
  // Written to reject NaN too. The bounds are on the result, whatever the
  // unit, so that every accepted duration can also be written in ms; under
  // half a millisecond would round to none.
  const bool ok = !t.empty() && str::parse_double(t, &value) && value * scale_ms >= 0.5 &&
                  value * scale_ms <= 1e12;
  if (!ok) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat(what, "='", text,
                         "' is not a positive duration; use e.g. 250ms, 30s, 5m, 1h, or seconds (at most 31 years)"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(value * scale_ms + 0.5));
}

std::vector<std::pair<std::string, std::string>> with_prefix(std::string_view prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq + 1 == kv.size() || !kv.substr(0, eq).starts_with(prefix)) continue;
    out.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return out;
}

int get_int(std::string_view name, int fallback, int min, int max) {
  auto v = get(name);
  if (!v) return fallback;
  int out = 0;
  if (!str::parse_int(*v, &out) || out < min || out > max) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat(name, "='", *v, "' is not an integer from ", min, " to ", max));
  }
  return out;
}

std::optional<std::chrono::milliseconds> get_duration(std::string_view name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_duration(*v, name);
}

std::string get_choice(std::string_view name, std::string_view fallback,
                       const std::vector<std::string_view>& choices, std::string_view kind) {
  auto v = get(name);
  if (!v) return std::string(fallback);
  std::string s = str::lower(str::strip(*v));
  for (std::string_view c : choices) {
    if (s == c) return s;
  }
  std::string listed;
  for (size_t i = 0; i < choices.size(); ++i) {
    str::append(listed, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", choices[i]);
  }
  throw Error(ErrorCode::kInvalidArgument, str::cat(name, "='", *v, "' is not ", kind, "; use ", listed));
}

}  // namespace comms::env
