#include "merge.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace comms::trace_tool {

using nlohmann::json;

namespace {

bool is_p2p(const std::string& op) { return op == "send" || op == "recv" || op == "batch_p2p"; }
bool reduces(const std::string& op) {
  return op == "all_reduce" || op == "reduce" || op == "reduce_scatter" || op == "reduce_scatter_v";
}
// Ops whose count is this rank's own and may differ between ranks.
bool own_count(const std::string& op) { return op == "all_gather_v" || op == "all_to_all_v"; }

// What the ranks must agree on for one entry.
json args_of(const json& e) {
  const std::string op = e.value("op", "");
  json a = {{"op", op}, {"dtype", e.value("dtype", "")}, {"count", e.value("count", 0)}};
  if (e.value("root", -1) >= 0) a["root"] = e["root"];
  if (reduces(op)) a["reduction"] = e.value("reduction", "");
  return a;
}

json comparable(json a) {
  if (own_count(a.value("op", ""))) a.erase("count");
  return a;
}

// Ranks are lined up by collective number, not seq: point-to-point ops
// move seq on some ranks only. In a dump without collective numbers (an
// older libcomms) seq stands in for them, as comms-trace read it before.
uint64_t collective_of(const json& e) {
  return e.value("collective", is_p2p(e.value("op", "")) ? uint64_t{0} : e.value("seq", uint64_t{0}));
}
uint64_t last_collective(const json& d, const char* which) {
  return d.value(std::string("last_") + which + "_collective", d.value(std::string("last_") + which, uint64_t{0}));
}

// Per rank: its collectives by number.
using Collectives = std::map<int, std::map<uint64_t, json>>;

std::string op_at(const Collectives& collectives, uint64_t n) {
  for (const auto& [rank, by_number] : collectives) {
    auto it = by_number.find(n);
    if (it != by_number.end()) return it->second.value("op", "op");
  }
  return "op";
}

// A rank without a dump that the others' failed ops name as their peer
// (killed, or crashed): the op it broke, and the last collective every rank
// with a dump completed, which it took part in.
void add_suspects(json& out, const std::map<int, std::vector<json>>& entries, const Collectives& collectives) {
  out["suspects"] = json::array();
  uint64_t all_completed = UINT64_MAX;
  for (auto& [rank, p] : out["progress"].items()) {
    all_completed = std::min(all_completed, p["last_completed_collective"].get<uint64_t>());
  }
  for (const json& r : out["no_dump"]) {
    json named_by = json::array();
    // Of each naming rank's first failure on r: the earliest collective,
    // else (only point-to-point or window ops failed) the first of those.
    const json* failed = nullptr;
    auto order = [](const json& e) { return collective_of(e) ? collective_of(e) : UINT64_MAX; };
    for (const auto& [rank, list] : entries) {
      for (const json& e : list) {
        if (e.value("state", "") != "failed" || e.value("peer", -1) != r.get<int>()) continue;
        named_by.push_back(rank);
        if (!failed || order(e) < order(*failed)) failed = &e;
        break;
      }
    }
    if (!failed) continue;
    json s = {{"rank", r}, {"named_by", named_by}, {"failed_op", failed->value("op", "op")},
              {"failed_collective", collective_of(*failed)}};
    if (all_completed != UINT64_MAX && all_completed > 0) {
      s["last_completed_by_all"] = {{"collective", all_completed}, {"op", op_at(collectives, all_completed)}};
    }
    out["suspects"].push_back(s);
  }
}

json merge_comm(const std::string& name, const std::vector<const json*>& dumps) {
  int size = 0;
  std::map<int, const json*> by_rank;
  std::map<int, std::vector<json>> entries;  // per rank, in seq order
  Collectives collectives;
  for (const json* d : dumps) {
    size = std::max(size, d->value("size", 0));
    const int rank = d->value("rank", -1);
    by_rank[rank] = d;
    for (const json& e : d->value("entries", json::array())) {
      entries[rank].push_back(e);
      if (const uint64_t n = collective_of(e)) collectives[rank][n] = e;
    }
  }
  json out = {{"comm", name}, {"ranks", json::array()}, {"no_dump", json::array()},
              {"progress", json::object()}, {"stuck", json::array()}, {"mismatches", json::array()},
              {"failures", json::array()}};
  for (int r = 0; r < size; ++r) (by_rank.count(r) ? out["ranks"] : out["no_dump"]).push_back(r);
  uint64_t low = UINT64_MAX, high = 0;
  for (const auto& [rank, d] : by_rank) {
    const uint64_t entered = last_collective(*d, "entered"), completed = last_collective(*d, "completed");
    low = std::min(low, entered);
    high = std::max(high, entered);
    out["progress"][std::to_string(rank)] = {{"last_entered_collective", entered},
                                             {"last_completed_collective", completed},
                                             {"last_entered_seq", d->value("last_entered", uint64_t{0})}};
  }
  for (auto& [rank, p] : out["progress"].items()) {
    p["entered_op"] = op_at(collectives, p["last_entered_collective"]);
    p["completed_op"] = op_at(collectives, p["last_completed_collective"]);
  }
  if (!by_rank.empty() && high > low) {
    // Each rank entered a prefix of the collectives: the first one not every
    // rank entered is the one after the least advanced rank's last.
    const uint64_t n = low + 1;
    json s = {{"collective", n}, {"op", op_at(collectives, n)}, {"entered", json::array()}, {"missing", json::array()}};
    for (const auto& [rank, d] : by_rank) s[last_collective(*d, "entered") >= n ? "entered" : "missing"].push_back(rank);
    out["stuck"].push_back(s);
  }
  // The first collective the ranks that recorded it disagree on.
  std::set<uint64_t> numbers;
  for (const auto& [rank, by_number] : collectives) {
    for (const auto& [n, e] : by_number) numbers.insert(n);
  }
  for (uint64_t n : numbers) {
    json by = json::object();
    std::set<std::string> kinds;
    for (const auto& [rank, by_number] : collectives) {
      auto it = by_number.find(n);
      if (it == by_number.end()) continue;
      by[std::to_string(rank)] = args_of(it->second);
      kinds.insert(comparable(args_of(it->second)).dump());
    }
    if (by.size() > 1 && kinds.size() > 1) {
      out["mismatches"].push_back({{"collective", n}, {"by_rank", by}});
      break;
    }
  }
  add_suspects(out, entries, collectives);
  for (const auto& [rank, list] : entries) {
    for (const json& e : list) {
      if (e.value("state", "") != "failed") continue;
      out["failures"].push_back({{"rank", rank}, {"seq", e.value("seq", uint64_t{0})}, {"collective", collective_of(e)},
                                 {"op", e.value("op", "")}, {"error", e.value("error", "")},
                                 {"peer", e.value("peer", -1)}});
      break;  // the first failure of each rank
    }
  }
  return out;
}

std::string list(const json& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + ranks[i].dump();
  return out + "]";
}

std::string args_text(const json& a) {
  std::string out = a.value("op", "") + " " + a.value("dtype", "");
  if (a.contains("count")) out += " x " + a["count"].dump();
  if (a.contains("root")) out += " root " + a["root"].dump();
  if (a.contains("reduction")) out += " " + a.value("reduction", "");
  return out;
}

}  // namespace

json merge(const std::vector<json>& dumps) {
  std::map<std::string, std::vector<const json*>> by_comm;
  for (const json& d : dumps) by_comm[d.value("comm", "")].push_back(&d);
  json out = {{"comms", json::array()}};
  for (const auto& [name, ds] : by_comm) out["comms"].push_back(merge_comm(name, ds));
  return out;
}

std::vector<json> read_dumps(const std::string& dir) {
  std::vector<json> out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    try {
      out.push_back(json::parse(in));
    } catch (const json::exception& e) {
      throw std::runtime_error(f.string() + " is not a flight-recorder dump: " + e.what());
    }
  }
  return out;
}

std::string to_text(const json& merged) {
  std::ostringstream o;
  for (const json& c : merged["comms"]) {
    const size_t size = c["ranks"].size() + c["no_dump"].size();
    o << "comm " << c["comm"].get<std::string>() << " (" << size << " ranks, dumps from " << list(c["ranks"]) << ")\n";
    for (auto& [rank, p] : c["progress"].items()) {
      o << "  rank " << rank << ": last completed collective #" << p["last_completed_collective"] << " ("
        << p["completed_op"].get<std::string>() << "), last entered collective #" << p["last_entered_collective"]
        << " (" << p["entered_op"].get<std::string>() << ")\n";
    }
    if (!c["no_dump"].empty()) o << "  no dump from " << list(c["no_dump"]) << " (dead, killed or not reached)\n";
    for (const json& s : c["suspects"]) {
      o << "  rank " << s["rank"] << " left no dump and ranks " << list(s["named_by"]) << " failed "
        << (s["failed_collective"] == 0 ? s["failed_op"].get<std::string>()
                                        : "collective #" + s["failed_collective"].dump() + " (" +
                                              s["failed_op"].get<std::string>() + ")")
        << " on it";
      if (s.contains("last_completed_by_all")) {
        o << "; its last collective: #" << s["last_completed_by_all"]["collective"] << " ("
          << s["last_completed_by_all"]["op"].get<std::string>() << "), completed by every rank with a dump";
      }
      o << "\n";
    }
    for (const json& f : c["failures"]) {
      o << "  rank " << f["rank"] << " failed " << f["op"].get<std::string>() << " seq #" << f["seq"];
      if (f["collective"] != 0) o << " (collective #" << f["collective"] << ")";
      o << " with " << f["error"].get<std::string>();
      if (f["peer"].get<int>() >= 0) o << " naming peer rank " << f["peer"];
      o << "\n";
    }
    for (const json& s : c["stuck"]) {
      o << "  stuck: collective #" << s["collective"] << " (" << s["op"].get<std::string>() << ") entered by "
        << list(s["entered"]) << ", never entered by " << list(s["missing"]) << "\n";
    }
    if (c["stuck"].empty()) o << "  no collective was entered by some ranks and not others\n";
    for (const json& m : c["mismatches"]) {
      o << "  mismatch at collective #" << m["collective"] << ":";
      bool first = true;
      for (auto& [rank, a] : m["by_rank"].items()) {
        o << (first ? " " : ", ") << "rank " << rank << ": " << args_text(a);
        first = false;
      }
      o << "\n";
    }
  }
  return o.str();
}

}  // namespace comms::trace_tool
