// comms-trace's analysis: merges the flight-recorder dumps of all ranks
// (<comm>.rank<R>.json, written by libcomms) into, per comm, how far each
// rank got, the first collective some ranks entered and others never did,
// and the first collective the ranks called with different arguments. Ranks
// are lined up by collective number, not seq: sends and receives move seq
// on some ranks only.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace comms::trace_tool {

// Merges parsed dumps. The result has the shape of `comms-trace --json`:
// {"comms": [{"comm", "ranks", "no_dump", "progress", "stuck", "mismatches",
// "failures", "suspects"}]}, comms sorted by name.
nlohmann::json merge(const std::vector<nlohmann::json>& dumps);

// Every *.json dump under `dir` (not recursive); throws std::runtime_error
// naming a file that cannot be parsed.
std::vector<nlohmann::json> read_dumps(const std::string& dir);

// The human-readable report of merge()'s result.
std::string to_text(const nlohmann::json& merged);

}  // namespace comms::trace_tool
