// Resolving the UCX backend's settings from hints, the environment and
// defaults (ucx_backend.h).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>

#include <ucp/api/ucp.h>

#include "comms/env.h"
#include "ucx_backend.h"
#include "ucx_log.h"

namespace comms::ucx_backend {
namespace {

// The cores this host's ranks run on. A rank bound to a single core
// (mpirun's binding, `tools/dev bench-mpi`, taskset per rank) sees one core
// in its mask while its peers run on the others: it counts the online
// cores. Counting one made every bound 2-rank job look oversubscribed: each
// poll yielded, about 0.6 yields per op and 0.8 us per 8 B all_reduce
// against 0.2 us spinning. (A whole job bound to one core then spins
// kAutoPureSpin per wait before it yields.)
int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mask = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return mask == 1 && online > 1 ? static_cast<int>(online) : mask;
}

// Asks UCX whether it parses value for its variable `name`.
Status check_ucx_value(const char* name, const std::string& value, const std::string& hint) {
  if (value.empty()) return {ErrorCode::kInvalidArgument, "hint " + hint + " is empty"};
  const QuietUcxLogs quiet;  // the Status says it
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    return {ErrorCode::kInternal, "ucp_config_read failed while checking hint " + hint};
  }
  const ucs_status_t s = ucp_config_modify(config, name, value.c_str());
  ucp_config_release(config);
  if (s != UCS_OK) {
    return {ErrorCode::kInvalidArgument,
            "hint " + hint + "='" + value + "' is not a valid UCX_" + name + ": " + ucs_status_string(s)};
  }
  return {};
}

// "262144", "256K", "1M" (binary units), as a byte count.
bool parse_bytes(const std::string& text, size_t* out) {
  size_t i = 0, value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (value > (SIZE_MAX - 9) / 10) return false;
    value = value * 10 + static_cast<size_t>(text[i++] - '0');
  }
  if (i == 0) return false;
  int shift = 0;
  if (i < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[i++]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: return false;
    }
  }
  if (i != text.size() || (shift && value > (SIZE_MAX >> shift))) return false;
  *out = value << shift;
  return true;
}

}  // namespace

Status resolve_settings(const Hints& hints, int local_size, UcxSettings* out) {
  UcxSettings cfg;
  std::string busy_poll = env::get("COMMS_UCX_BUSY_POLL").value_or("auto");
  std::string busy_poll_from = "COMMS_UCX_BUSY_POLL";
  std::optional<std::string> zero_copy = env::get("COMMS_UCX_ZERO_COPY_MIN_BYTES");
  std::string zero_copy_from = "COMMS_UCX_ZERO_COPY_MIN_BYTES";
  for (const auto& [k, v] : hints) {
    if (k == "tls") {
      // Hint strings separate hints with commas: "sm+self" stands for UCX's "sm,self".
      cfg.tls = v;
      std::replace(cfg.tls.begin(), cfg.tls.end(), '+', ',');
    }
    else if (k == "rndv_thresh") cfg.rndv_thresh = v;
    else if (k == "busy_poll") {
      busy_poll = v;
      busy_poll_from = "hint ucx.busy_poll";
    } else if (k == "zero_copy_min_bytes") {
      zero_copy = v;
      zero_copy_from = "hint ucx.zero_copy_min_bytes";
    } else {
      return {ErrorCode::kInvalidArgument,
              "unknown ucx hint '" + k + "' (known: tls, rndv_thresh, busy_poll, zero_copy_min_bytes)"};
    }
  }
  cfg.zero_copy_min_bytes = kZeroCopyDefaultMinBytes;
  if (zero_copy && !parse_bytes(*zero_copy, &cfg.zero_copy_min_bytes)) {
    return {ErrorCode::kInvalidArgument, zero_copy_from + "='" + *zero_copy +
                                             "' is not a byte count; use digits with an optional K, M or G (1024-based)"};
  }
  if (hints.count("tls")) {
    Status s = check_ucx_value("TLS", cfg.tls, "ucx.tls");
    if (!s.is_ok()) return s;
  }
  if (hints.count("rndv_thresh")) {
    Status s = check_ucx_value("RNDV_THRESH", cfg.rndv_thresh, "ucx.rndv_thresh");
    if (!s.is_ok()) return s;
  }
  std::string mode = busy_poll;
  for (char& c : mode) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (mode != "auto") {
    try {
      mode = env::parse_bool(busy_poll, busy_poll_from) ? "1" : "0";
    } catch (const Error&) {
      return {ErrorCode::kInvalidArgument, busy_poll_from + "='" + busy_poll +
                                               "' is not auto or a boolean; use auto, 1/0, true/false, yes/no or on/off"};
    }
  }
  try {
    cfg.shm = env::get_bool("COMMS_UCX_SHM", true);
  } catch (const Error&) {
    return {ErrorCode::kInvalidArgument, "COMMS_UCX_SHM='" + env::get("COMMS_UCX_SHM").value_or("") +
                                             "' is not a boolean; use 1/0, true/false, yes/no or on/off"};
  }
  cfg.busy_poll = mode;
  cfg.spin_forever = mode == "1";
  const bool fits = local_size <= cores();
  cfg.spin = mode != "auto" ? std::chrono::microseconds{0} : fits ? kAutoSpin : kOversubscribedYield;
  cfg.yield = mode == "auto";
  cfg.yield_after = mode == "auto" && fits ? kAutoPureSpin : std::chrono::microseconds{0};
  *out = std::move(cfg);
  return {};
}

}  // namespace comms::ucx_backend
