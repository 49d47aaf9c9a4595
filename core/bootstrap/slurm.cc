#include "bootstrap/slurm.h"

#include <cctype>

#include "comms/error.h"
#include "config/env.h"
#include "util/strutil.h"

namespace comms::slurm {
namespace {

[[noreturn]] void not_a_nodelist(std::string_view variable, std::string_view value, std::string_view why) {
  throw Error(ErrorCode::kInvalidArgument,
              str::cat(variable, "='", value, "' is not a Slurm node list (", why,
                       "); expected e.g. node[01-04,07],gpu5"));
}

}  // namespace

std::string first_host(std::string_view nodelist, std::string_view variable) {
  std::string host;
  size_t i = 0;
  const std::string_view list = str::strip(nodelist);
  while (i < list.size() && list[i] != ',') {
    if (list[i] == ']') not_a_nodelist(variable, nodelist, "']' without '['");
    if (list[i] != '[') {
      host += list[i++];
      continue;
    }
    const size_t close = list.find(']', i);
    if (close == std::string_view::npos) not_a_nodelist(variable, nodelist, "'[' without ']'");
    // The first number of the first range, its leading zeros kept.
    const std::string_view ranges = list.substr(i + 1, close - i - 1);
    const std::string_view first = ranges.substr(0, ranges.find_first_of(",-"));
    if (first.empty()) not_a_nodelist(variable, nodelist, "an empty range");
    for (char c : first) {
      if (!std::isdigit(static_cast<unsigned char>(c))) not_a_nodelist(variable, nodelist, "a range that is not numbers");
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) not_a_nodelist(variable, nodelist, "no host");
  return host;
}

uint16_t port_for_job(std::string_view job_id) {
  int64_t id = 0;
  if (!str::parse_int(str::strip(job_id), &id) || id < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("SLURM_JOB_ID='", job_id, "' is not a job id; expected a non-negative integer"));
  }
  return static_cast<uint16_t>(15000 + id % 20000);
}

std::optional<StoreAddress> store_address() {
  const auto procid = env::get("SLURM_PROCID");
  const auto job_id = env::get("SLURM_JOB_ID");
  if (!procid || !job_id) return std::nullopt;
  for (const char* variable : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const auto list = env::get(variable)) {
      return StoreAddress{first_host(*list, variable), port_for_job(*job_id),
                          str::cat(variable, " and SLURM_JOB_ID")};
    }
  }
  return std::nullopt;
}

std::optional<std::string> job_namespace() {
  if (const auto id = env::get("COMMS_JOB_ID")) {
    const std::string_view name = str::strip(*id);
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("COMMS_JOB_ID='", *id, "' cannot name a folder; use letters, digits, '-', '_' or '.'"));
    }
    return std::string(name);
  }
  const auto job_id = env::get("SLURM_JOB_ID");
  if (!job_id) return std::nullopt;
  port_for_job(*job_id);  // the same check: a job id is a number
  const auto step = env::get("SLURM_STEP_ID");
  return str::cat("slurm-", str::strip(*job_id), step ? str::cat(".", str::strip(*step)) : "");
}

}  // namespace comms::slurm
