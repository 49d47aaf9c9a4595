// describe()'s "paths": for every op, the path its backend's plan gives at
// each byte count per rank, as ascending runs. Built from the plan itself,
// so it cannot disagree with it: a plan's answer changes only where bytes
// cross one of the size rules' limits (bytes against a limit, bytes times
// the ranks against one, or bytes over the ranks against one), so reading
// the plan on both sides of each such point finds every change.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "comms/plugin.h"

namespace comms::cpu_algorithms {

// The byte counts up to `max_bytes` (inclusive) after the previous run take
// `path`; kUnbounded: every larger count.
inline constexpr size_t kUnbounded = SIZE_MAX;
struct PathRun {
  size_t max_bytes;
  std::string path;  // owned: name() may return a temporary
};

// name(bytes): the plan's path name at `bytes` per rank. `limits`: the size
// limits the plan reads besides algorithms.h's (e.g. the shared-memory
// path's).
template <class Name>
std::vector<PathRun> path_runs(const Name& name, int size, std::initializer_list<size_t> limits) {
  const size_t n = static_cast<size_t>(size);
  std::vector<size_t> last{0};  // candidates for the last byte count of a run
  auto add = [&](size_t k) {
    if (k == 0) return;
    for (size_t c : {k - 1, k, k / n, k * n - 1}) last.push_back(c);
  };
  for (size_t k : {kExchangeMaxBytes, kSyncPathMaxBytes, kAllReduceDirectMinSegmentBytes, kBroadcastDirectMinBytes,
                   kAllGatherDirectMinBytes}) {
    add(k);
  }
  for (size_t k : limits) add(k);
  std::sort(last.begin(), last.end());
  last.erase(std::unique(last.begin(), last.end()), last.end());
  std::vector<PathRun> runs;
  for (size_t c : last) {
    std::string here(name(c));
    if (here != std::string_view(name(c + 1))) runs.push_back({c, std::move(here)});
  }
  runs.push_back({kUnbounded, std::string(name(last.back() + 1))});
  return runs;
}

// {"all_reduce": [{"max_bytes": 0, "path": "..."}, ...], ...} for every op
// type; name(type, bytes) as above. max_bytes is null for the last run.
// `Json` is the caller's nlohmann type: this library takes no JSON
// dependency of its own.
template <class Json, class Name>
Json paths_json(const Name& name, int size, std::initializer_list<size_t> limits) {
  Json out = Json::object();
  for (int t = 0; t < plugin::kNumOpTypes; ++t) {
    const auto type = static_cast<plugin::OpType>(t);
    Json runs = Json::array();
    for (PathRun& r : path_runs([&](size_t bytes) { return name(type, bytes); }, size, limits)) {
      Json run = Json::object();
      run["max_bytes"] = r.max_bytes == kUnbounded ? Json(nullptr) : Json(r.max_bytes);
      run["path"] = std::move(r.path);
      runs.push_back(std::move(run));
    }
    out[std::string(plugin::op_name(type))] = std::move(runs);
  }
  return out;
}

}  // namespace comms::cpu_algorithms
