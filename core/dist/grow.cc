// comms::dist::admit and join_process_group: the world grown through
// comms::admit / comms::join, the members' group list sent to the newcomers
// through the store, and a model-parallel collection reshaped on every
// participant by the same code (parallel_grow.cc).
//
// Store key, under the grown world comm's namespace:
//   <namespace>/dist/groups   written once by rank 0: the registry as it was
//                             before the growth (specs in creation order,
//                             the counters new names come from, and the
//                             collection to reshape, if any)
#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "comm/comm_impl.h"
#include "dist_state.h"
#include "spec_json.h"
#include "util/json_text.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::string record_key(const Comm& grown) {
  return str::cat(internal::CommAccess::impl(grown).config().rendezvous_ns, "/dist/groups");
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

// What a newcomer needs to hold the same group list as the members. A
// split_group group's list is sent empty: only its members know it, and a
// newcomer is in none.
std::string registry_record(const std::vector<std::shared_ptr<GroupState>>& all, int members,
                            const CollectionGrowth* collection) {
  auto& reg = registry();
  json j;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    j["route"] = std::string(to_string(reg.route));
    j["next_index"] = reg.next_index;
    j["next_name"] = reg.next_name;
    j["collections"] = reg.collections;
  }
  j["members"] = members;
  json groups = json::array();
  for (const auto& g : all) {
    if (g->destroyed) continue;
    json spec = spec_to_json(g->spec);
    if (g->from_split_group) spec["ranks"] = json::array();
    groups.push_back(json{{"spec", spec}, {"from_split_group", g->from_split_group}});
  }
  j["groups"] = groups;  // the world first
  j["collection"] = collection ? json(collection->record) : json(nullptr);
  return json_text(j);
}

void refuse_offloaded(const std::vector<std::shared_ptr<GroupState>>& all) {
  for (const auto& g : all) {
    if (!g->destroyed && !g->offloaded.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("comms::dist admit: group '", g->spec.name,
                           "' is offloaded; reload_groups() before admitting newcomers"),
                  "world", "admit", 0, world().rank());
    }
  }
}

// The members are past building every group before the old world goes (a
// native grow may still use the parent's connections).
void release_old_world(const std::shared_ptr<Comm>& grown, const std::shared_ptr<Comm>& old) {
  grown->barrier();
  if (!old) return;
  try {
    old->finalize();
  } catch (const std::exception& e) {
    log::warning(str::cat("comms::dist admit: releasing '", old->name(), "': ", e.what()));
  }
}

void log_growth(const AdmitResult& out) {
  log::info(str::cat("comms::dist admit: ranks [", str::join(out.joined, ","), "] joined; world of ",
                     out.world_size, " at epoch ", out.epoch, "; rebuilt [", str::join(out.rebuilt, ","),
                     "], created [", str::join(out.created, ","), "], kept ", out.kept.size(), " groups in ",
                     out.took.count(), " ms"));
}

// Every group other than the world that neither got a new comm nor was made now.
void list_kept(const std::vector<std::shared_ptr<GroupState>>& before, AdmitResult& out) {
  for (const auto& g : before) {
    if (g->destroyed || g->spec.parent.empty()) continue;
    const std::string& n = g->spec.name;
    if (std::find(out.rebuilt.begin(), out.rebuilt.end(), n) == out.rebuilt.end()) out.kept.push_back(n);
  }
}

void adopt_world(GroupState& w, const std::shared_ptr<Comm>& grown) {
  w.comm = grown;
  w.spec.ranks.resize(static_cast<size_t>(grown->size()));
  std::iota(w.spec.ranks.begin(), w.spec.ranks.end(), 0);
  w.device = grown->device();
}

}  // namespace

AdmitResult admit_world(const AdmitOptions& options, const CollectionGrowth* collection) {
  const auto start = Clock::now();
  const std::shared_ptr<GroupState> w = world().state();
  std::vector<std::shared_ptr<GroupState>> all;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    all = reg.groups;  // world first, creation order
  }
  refuse_offloaded(all);
  AdmitResult out;
  const std::shared_ptr<Comm> old = w->comm;
  out.rank = old->rank();
  out.old_world_size = old->size();
  std::shared_ptr<Comm> grown = comms::admit(old, options);
  out.epoch = comms::epoch(*grown);
  out.world_size = grown->size();
  if (grown == old) {
    out.took = since(start);
    return out;
  }
  out.grown = true;
  for (int r = out.old_world_size; r < out.world_size; ++r) out.joined.push_back(r);
  if (grown->rank() == 0) {
    internal::CommAccess::impl(*grown).config().store->set(record_key(*grown),
                                                          registry_record(all, out.old_world_size, collection));
  }
  adopt_world(*w, grown);
  if (collection) collection->reshape(out.epoch, out);
  list_kept(all, out);
  release_old_world(grown, old);
  out.took = since(start);
  log_growth(out);
  return out;
}

AdmitResult admit(const AdmitOptions& options) { return admit_world(options, nullptr); }

JoinResult join_process_group(const JoinOptions& options) {
  const auto start = Clock::now();
  if (is_initialized()) {
    throw Error(ErrorCode::kInvalidArgument,
                "comms::dist join_process_group: this process is already initialized; a newcomer joins "
                "before init_process_group (or after destroy_process_group)",
                "world", "join", 0, world().rank());
  }
  std::shared_ptr<Comm> grown = comms::join("world", options);
  const auto& config = internal::CommAccess::impl(*grown).config();
  json j;
  try {
    j = json::parse(config.store->get(record_key(*grown), grown->op_timeout()));
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInternal, str::cat("comms::dist join_process_group: unreadable group list: ", e.what()),
                grown->name(), "join", 0, grown->rank());
  }
  auto& reg = registry();
  std::vector<std::shared_ptr<GroupState>> all;
  for (const auto& entry : j.at("groups")) {
    auto state = std::make_shared<GroupState>();
    state->spec = spec_from_json(entry.at("spec"));
    state->from_split_group = entry.at("from_split_group").get<bool>();
    all.push_back(std::move(state));
  }
  adopt_world(*all.front(), grown);
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto& g : all) g->library_owned = reg.sessions > 0;
    reg.route = j.at("route").get<std::string>() == "split" ? Route::kSplit : Route::kDirect;
    reg.next_index = j.at("next_index").get<uint64_t>();
    reg.next_name = j.at("next_name").get<int>();
    reg.collections = j.at("collections").get<int>();
    reg.world = all.front();
    reg.groups = all;
  }
  JoinResult result;
  AdmitResult& out = result.admission;
  out.grown = true;
  out.epoch = comms::epoch(*grown);
  out.rank = grown->rank();
  out.old_world_size = j.at("members").get<int>();
  out.world_size = grown->size();
  for (int r = out.old_world_size; r < out.world_size; ++r) out.joined.push_back(r);
  if (!j.at("collection").is_null()) {
    result.collection = join_collection(j.at("collection").get<std::string>(), out.epoch, out);
  }
  list_kept(all, out);
  release_old_world(grown, nullptr);
  out.took = since(start);
  log_growth(out);
  return result;
}

}  // namespace comms::dist
