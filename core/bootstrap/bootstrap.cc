#include "util/strutil.h"
#include "comms/bootstrap.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <thread>

#include "comms/error.h"
#include "comms/store.h"
#include "config/env.h"
#include "util/log.h"
#include "bootstrap/local_placement.h"
#include "bootstrap/slurm.h"

namespace comms {
namespace {

struct Family {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr Family kFamilies[] = {
    {"COMMS", "COMMS_RANK", "COMMS_WORLD_SIZE", "COMMS_LOCAL_RANK", "COMMS_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

int read_int(const char* name, std::string_view value, int min) {
  // SLURM_NTASKS_PER_NODE may read "4(x2)": the leading number is this node's.
  std::string_view digits = value;
  size_t end = 0;
  while (end < digits.size() && (std::isdigit(static_cast<unsigned char>(digits[end])) || (end == 0 && digits[0] == '-'))) ++end;
  int out = 0;
  if (end == 0 || !str::parse_int(digits.substr(0, end), &out) || out < min ||
      (end != digits.size() && std::string_view(name) != "SLURM_NTASKS_PER_NODE")) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat(name, "='", value, "' is not a valid ", min == 0 ? "rank" : "size",
                         "; use an integer from ", min));
  }
  return out;
}

}  // namespace

BootstrapInfo bootstrap_from_environment() {
  for (const auto& f : kFamilies) {
    auto rank = env::get(f.rank);
    auto size = env::get(f.size);
    if (!rank && !size) continue;
    if (!rank || !size) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat(rank ? f.rank : f.size, " is set but ", rank ? f.size : f.rank,
                               " is not; set both"));
    }
    BootstrapInfo info;
    info.source = f.source;
    info.rank = read_int(f.rank, *rank, 0);
    info.world_size = read_int(f.size, *size, 1);
    if (info.rank >= info.world_size) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat(f.rank, "=", info.rank, " is not below ", f.size, "=", info.world_size));
    }
    auto local_rank = env::get(f.local_rank);
    auto local_size = env::get(f.local_size);
    info.local_rank = local_rank ? read_int(f.local_rank, *local_rank, 0) : info.rank;
    // A local rank is one of the job's ranks; this also keeps local_rank + 1 below in range.
    if (info.local_rank >= info.world_size) {
      throw Error(ErrorCode::kInvalidArgument, str::cat(f.local_rank, "=", info.local_rank, " is not below ",
                                                        f.size, "=", info.world_size));
    }
    info.local_world_size = local_size ? read_int(f.local_size, *local_size, 1) : info.world_size;
    if (info.local_rank >= info.local_world_size) info.local_world_size = info.local_rank + 1;
    return info;
  }
  return {};
}

namespace internal {

LocalPlacement local_placement_from_environment(int rank, int size) {
  for (const auto& f : kFamilies) {
    auto local_rank = env::get(f.local_rank);
    if (!local_rank) continue;
    auto local_size = env::get(f.local_size);
    LocalPlacement p;
    try {
      p.local_rank = read_int(f.local_rank, *local_rank, 0);
      p.local_size = local_size ? read_int(f.local_size, *local_size, 1) : std::max(size, p.local_rank + 1);
    } catch (const Error& e) {
      log::info(str::cat("rank and world size given: ignoring ", e.what()));
      break;
    }
    if (p.local_rank < p.local_size) return p;
    log::info(str::cat("rank and world size given: ignoring ", f.local_rank, "=", p.local_rank, ", not below ",
                       f.local_size, "=", p.local_size));
    break;
  }
  return {rank, size};
}

}  // namespace internal

namespace {

struct DefaultStore {
  std::mutex mu;
  std::string key;  // the configuration it was made for
  std::shared_ptr<Store> store;
  std::unique_ptr<TcpStoreServer> server;  // when this process (rank 0) hosts it
};

DefaultStore& default_store_state() {
  static DefaultStore* s = new DefaultStore();  // lives until exit, with its server
  return *s;
}

uint16_t parse_port(const std::string& text, const char* what) {
  int port = 0;
  if (!str::parse_int(text, &port) || port <= 0 || port > 65535) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat(what, "='", text, "' is not a TCP port (1..65535)"));
  }
  return static_cast<uint16_t>(port);
}

// About when this process started: libcomms is loaded with it.
const auto kStarted = std::filesystem::file_time_type::clock::now();

// A file store shared by every job (no job id to give each its own folder)
// must not hold an earlier run's keys: a peer's old address reads as
// "Connection refused" much later. Keys older than this process by more
// than the init timeout cannot be from a live peer of this job (it would
// have timed out).
void refuse_stale_file_store(const std::string& spec, const std::string& dir, std::chrono::milliseconds timeout) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") || !e.is_regular_file(ec)) continue;
    const auto age = kStarted - e.last_write_time(ec);
    if (ec || age <= timeout) continue;
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("COMMS_STORE='", spec, "' holds keys from an earlier run ('", name, "' was written ",
                         std::chrono::duration_cast<std::chrono::seconds>(age).count(),
                         " s before this process started, longer ago than the init timeout): remove them (rm -r ",
                         dir, ") or set COMMS_JOB_ID to a value unique to each job, so that each job uses its own "
                         "subfolder (under srun, SLURM_JOB_ID does)"));
  }
}

std::shared_ptr<Store> open_file_store(const std::string& spec, const std::string& dir,
                                       std::chrono::milliseconds timeout) {
  if (const auto job = slurm::job_namespace()) {
    log::info(str::cat("file store: this job's keys go to ", dir, "/", *job));
    return make_file_store(str::cat(dir, "/", *job));
  }
  refuse_stale_file_store(spec, dir, timeout);
  return make_file_store(dir);
}

}  // namespace

std::shared_ptr<Store> default_store(int rank, int world_size,
                                     std::chrono::milliseconds connect_timeout) {
  auto& state = default_store_state();
  std::lock_guard<std::mutex> lock(state.mu);
  const auto spec = env::get("COMMS_STORE");
  auto addr = env::get("MASTER_ADDR");
  auto port = env::get("MASTER_PORT");
  // Under srun, what MASTER_ADDR and MASTER_PORT do not give comes from Slurm.
  if (!spec && (!addr || !port) && world_size > 1) {
    if (const auto slurm_store = slurm::store_address()) {
      if (!addr) addr = slurm_store->host;
      if (!port) port = std::to_string(slurm_store->port);
      log::info(str::cat("the TCP store is at ", *addr, ":", *port, " (from ", slurm_store->source, ")"));
    }
  }
  const std::string key = str::cat(spec.value_or(""), "|", addr.value_or(""), "|",
                                       port.value_or(""), "|", rank, "|", world_size);
  if (state.store && state.key == key) return state.store;

  std::shared_ptr<Store> store;
  if (spec) {
    std::string_view s = *spec;
    if (str::consume_prefix(s, "file://")) {
      store = open_file_store(*spec, std::string(s), connect_timeout);
    } else if (str::consume_prefix(s, "tcp://")) {
      auto colon = s.rfind(':');
      if (colon == std::string_view::npos) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("COMMS_STORE='", *spec, "': expected tcp://host:port"));
      }
      std::string host(s.substr(0, colon));
      if (std::string_view(host).starts_with( "[") && std::string_view(host).ends_with( "]")) host = host.substr(1, host.size() - 2);
      try {
        store = connect_tcp_store(host, parse_port(std::string(s.substr(colon + 1)), "COMMS_STORE port"),
                                  connect_timeout);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kTimeout) throw;  // e.g. refused for its token: not about hosting
        // Nothing in the job hosts a tcp:// store: say who must.
        throw Error(e.code(), str::cat("COMMS_STORE='", *spec, "': ", e.what(),
                                       "; no rank hosts a COMMS_STORE store: start one first, e.g. "
                                       "commsrun --store-only --master-addr HOST --master-port PORT"));
      }
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("COMMS_STORE='", *spec,
                               "': expected file:///path/to/dir or tcp://host:port"));
    }
  } else if (addr && port) {
    const uint16_t p = parse_port(*port, "MASTER_PORT");
    const bool launcher_hosts = env::get_bool("COMMS_LAUNCHER_STORE", false);
    if (!launcher_hosts && rank == 0 && !state.server) {
      try {
        state.server = std::make_unique<TcpStoreServer>(*addr, p);
      } catch (const Error& e) {
        throw Error(e.code(), str::cat("MASTER_ADDR='", *addr, "', MASTER_PORT='", *port, "': ", e.what()));
      }
      log::info(str::cat("rank 0 hosts the TCP store at ", *addr, ":", p));
    }
    store = connect_tcp_store(*addr, p, connect_timeout);
  } else if (world_size == 1) {
    store = make_memory_store();
  } else {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("no rendezvous store for a job of ", world_size,
                             " processes: set MASTER_ADDR and MASTER_PORT (commsrun and torchrun "
                             "do; under srun SLURM_NODELIST and SLURM_JOB_ID give them), or "
                             "COMMS_STORE=file:///shared/dir or tcp://host:port (commsrun --store-only hosts one)"));
  }
  store->set_default_timeout(connect_timeout);
  state.key = key;
  state.store = store;
  return store;
}

}  // namespace comms
