// Values read from the environment. The first byte picks what the rest is:
//   0  a duration (env::parse_duration, COMMS_INIT_TIMEOUT / COMMS_OP_TIMEOUT)
//   1  an integer variable (env::get_int)
//   2  COMMS_RANK, COMMS_WORLD_SIZE, COMMS_LOCAL_RANK, COMMS_LOCAL_WORLD_SIZE,
//      one per line (bootstrap_from_environment); a missing line is unset
//   3  the same for SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//      SLURM_NTASKS_PER_NODE (which may read "4(x2)")
// Properties:
//   - rejections are comms::Error kInvalidArgument naming the variable;
//   - a duration is at least 1 ms, agrees with the plain reading of
//     "<digits><unit>", and its value in ms parses back to itself;
//   - an integer is accepted exactly when it is [+|-]digits within int
//     (surrounding whitespace allowed), with that value;
//   - a bootstrap gives 0 <= rank < world_size, 0 <= local_rank <
//     local_world_size, the values given, and defaults from the same family.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comms/bootstrap.h"
#include "config/env.h"
#include "fuzz_check.h"
#include "util/strutil.h"

namespace {

using comms::ErrorCode;
using std::chrono::milliseconds;

// [+|-]digits within int, after stripping whitespace.
std::optional<int> reference_int(std::string_view s) {
  s = comms::str::strip(s);
  bool negative = false;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = std::min<int64_t>(v * 10 + (c - '0'), int64_t{1} << 40);  // saturates far above int
  }
  if (negative) v = -v;
  if (v < INT_MIN || v > INT_MAX) return std::nullopt;
  return static_cast<int>(v);
}

void check_duration(const std::string& text) {
  milliseconds ms{0};
  if (!fuzz::accepts([&] { ms = comms::env::parse_duration(text, "COMMS_OP_TIMEOUT"); },
                     {ErrorCode::kInvalidArgument}, "COMMS_OP_TIMEOUT", FUZZ_HERE)) {
    return;
  }
  FUZZ_CHECK(ms.count() >= 1, "'" + text + "' gives " + std::to_string(ms.count()) + " ms");
  milliseconds again{0};
  const std::string canonical = std::to_string(ms.count()) + "ms";
  FUZZ_CHECK(fuzz::accepts([&] { again = comms::env::parse_duration(canonical, "x"); }, {}, "", FUZZ_HERE) &&
                 again == ms,
             "'" + canonical + "' (from '" + text + "') does not parse back");
  // "<digits><unit>" has an exact value.
  std::string_view t = comms::str::strip(text);
  int64_t scale = 1000;
  if (comms::str::consume_suffix(t, "ms")) scale = 1;
  else if (comms::str::consume_suffix(t, "s")) scale = 1000;
  else if (comms::str::consume_suffix(t, "m")) scale = 60'000;
  else if (comms::str::consume_suffix(t, "h")) scale = 3'600'000;
  if (!t.empty() && t.size() <= 9 && t.find_first_not_of("0123456789") == t.npos) {
    FUZZ_CHECK(ms.count() == std::stoll(std::string(t)) * scale, "'" + text + "' misread as " + std::to_string(ms.count()) + " ms");
  }
}

void check_int(const std::string& value) {
  setenv("COMMS_LOCAL_RANK", value.c_str(), 1);
  const std::string seen = value.substr(0, value.find('\0'));  // what setenv stored
  int v = 0;
  const bool ok = fuzz::accepts([&] { v = comms::env::get_int("COMMS_LOCAL_RANK", -7); }, {ErrorCode::kInvalidArgument},
                                "COMMS_LOCAL_RANK", FUZZ_HERE);
  if (seen.empty()) {
    FUZZ_CHECK(ok && v == -7, "an empty variable does not give the fallback");
    return;
  }
  const auto expected = reference_int(seen);
  FUZZ_CHECK(ok == expected.has_value(), "'" + seen + "' " + (ok ? "accepted" : "rejected") + " as an integer");
  if (ok) FUZZ_CHECK(v == *expected, "'" + seen + "' read as " + std::to_string(v));
}

void check_bootstrap(std::string_view text, const char* const names[4]) {
  for (const char* family : {"COMMS_RANK", "COMMS_WORLD_SIZE", "COMMS_LOCAL_RANK", "COMMS_LOCAL_WORLD_SIZE", "RANK",
                             "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                             "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    unsetenv(family);
  }
  std::vector<std::string> values;
  while (values.size() < 4) {
    const size_t nl = text.find('\n');
    std::string line(text.substr(0, nl));
    line = line.substr(0, line.find('\0'));
    setenv(names[values.size()], line.c_str(), 1);
    values.push_back(line);
    if (nl == text.npos) break;
    text.remove_prefix(nl + 1);
  }
  comms::BootstrapInfo info;
  if (!fuzz::accepts([&] { info = comms::bootstrap_from_environment(); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE)) {
    return;
  }
  const std::string why = "from " + std::to_string(values.size()) + " values, first '" + values[0] + "'";
  if (info.source == "default") {
    FUZZ_CHECK(info.rank == 0 && info.world_size == 1, why);
    return;
  }
  FUZZ_CHECK(0 <= info.rank && info.rank < info.world_size, "rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size) + " " + why);
  FUZZ_CHECK(0 <= info.local_rank && info.local_rank < info.local_world_size,
             "local rank " + std::to_string(info.local_rank) + " of " + std::to_string(info.local_world_size) + " " + why);
  FUZZ_CHECK(info.rank == std::stoi(values[0]) && info.world_size == std::stoi(values[1]), "rank or size misread " + why);
  if (values.size() > 2 && !values[2].empty()) FUZZ_CHECK(info.local_rank == std::stoi(values[2]), "local rank misread " + why);
  else FUZZ_CHECK(info.local_rank == info.rank, "the local rank does not default to the rank " + why);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const char* const kComms[4] = {"COMMS_RANK", "COMMS_WORLD_SIZE", "COMMS_LOCAL_RANK", "COMMS_LOCAL_WORLD_SIZE"};
  static const char* const kSlurm[4] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
  switch (data[0] % 4) {
    case 0: check_duration(rest); break;
    case 1: check_int(rest); break;
    case 2: check_bootstrap(rest, kComms); break;
    case 3: check_bootstrap(rest, kSlurm); break;
  }
  return 0;
}
