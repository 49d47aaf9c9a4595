// Growth of a model-parallel collection: the layout derived again for the
// grown world, on the members (admit_model_parallel) and on the newcomers
// (join_collection) by the same walk over the new plan, so that every
// group comm made on the way is made collectively, in the same order.
#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "comms/parallel.h"
#include "dist_state.h"
#include "spec_json.h"
#include "util/json_text.h"
#include "util/strutil.h"

namespace comms::dist {

struct CollectionAccess {
  // Each group of the new layout, in plan order: kept when a group of that
  // name holds the same list, given a new comm when its list changed,
  // created when the old layout had no such group. A world size the layout
  // cannot take makes the collection unusable, saying why.
  static void reshape(ProcessGroupCollection& c, uint64_t epoch, AdmitResult& out) {
    const Group w = world();
    ParallelPlan plan;
    try {
      plan = plan_model_parallel(c.config_, w.size(), w.backend());
    } catch (const Error& e) {
      c.unusable_ = str::cat("the world grew to ", w.size(), " ranks, which its layout cannot take: ", e.what());
      for (auto& [name, entry] : c.entries_) entry.group = Group();
      return;
    }
    std::map<std::string, std::shared_ptr<GroupState>> by_name;
    for (const Group& g : groups()) {
      if (!g.state()->destroyed) by_name[g.state()->spec.name] = g.state();
    }
    for (const PlannedGroup& planned : plan.groups) {
      auto& e = c.entries_[planned.name];
      e.created = true;
      e.rank_lists = planned.rank_lists;
      e.group = Group();
      for (size_t i = 0; i < planned.rank_lists.size(); ++i) {
        const std::vector<int>& list = planned.rank_lists[i];
        const GroupOptions o = collection_group_options(c.config_, c.prefix_, planned, i);
        // Named by the epoch: the name alone may have been used by a group
        // a recovery removed, with another count of incarnations per process.
        const std::string comm_name = str::cat(o.name, "@e", epoch);
        std::shared_ptr<GroupState> s;
        auto it = by_name.find(o.name);
        if (it == by_name.end()) {
          s = create_group(list, o, comm_name);
          out.created.push_back(o.name);
        } else if (it->second->spec.ranks == list) {
          s = it->second;
        } else {
          s = it->second;
          retire(s->comm, "rebuilt by comms::dist::admit for the grown world");
          s->spec.ranks = list;
          auto mine = std::find(list.begin(), list.end(), w.rank());
          const int member_rank = mine == list.end() ? -1 : static_cast<int>(mine - list.begin());
          s->comm = create_group_comm(s->spec, *w.state(), member_rank, comm_name);
          if (s->comm) s->device = s->comm->device();
          out.rebuilt.push_back(o.name);
        }
        if (s->comm) e.group = Group(s);
      }
    }
    if (c.config_.world_size) c.config_.world_size = w.size();
    c.plan_ = std::move(plan);
  }

  static std::string record(const ProcessGroupCollection& c) {
    return json_text(nlohmann::json{{"prefix", c.prefix_}, {"config", config_to_json(c.config_)}});
  }

  static std::shared_ptr<ProcessGroupCollection> from_record(const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text);
    auto c = std::make_shared<ProcessGroupCollection>();
    c->prefix_ = j.at("prefix").get<std::string>();
    c->config_ = config_from_json(j.at("config"));
    for (const auto& name : group_names()) c->entries_[name] = {};
    return c;
  }

  static const std::string& unusable(const ProcessGroupCollection& c) { return c.unusable_; }
};

void check_reshapable(const ProcessGroupCollection& c, const char* reshape) {
  const Group w = world();
  const std::string who = str::cat("comms::dist model parallel: collection '", c.prefix(), "'");
  const std::string& unusable = CollectionAccess::unusable(c);
  if (!unusable.empty()) throw Error(ErrorCode::kInvalidArgument, str::cat(who, " is unusable: ", unusable));
  if (c.config().rank_offset != 0 || c.plan().world_size != w.size()) {
    throw Error(ErrorCode::kUnsupported,
                str::cat(who, " covers ranks [", c.config().rank_offset, ", ",
                         c.config().rank_offset + c.plan().world_size, ") of a world of ", w.size(), "; ", reshape,
                         " reshapes only a collection over the whole world"));
  }
}

AdmitResult admit_model_parallel(ProcessGroupCollection& c, const AdmitOptions& options) {
  check_reshapable(c, "growth");
  CollectionGrowth growth;
  growth.record = CollectionAccess::record(c);
  growth.reshape = [&c](uint64_t epoch, AdmitResult& out) { CollectionAccess::reshape(c, epoch, out); };
  AdmitResult r = admit_world(options, &growth);
  if (!CollectionAccess::unusable(c).empty()) {
    throw Error(ErrorCode::kInvalidArgument, str::cat("comms::dist admit_model_parallel: collection '", c.prefix(),
                                                      "' is unusable: ", CollectionAccess::unusable(c)));
  }
  return r;
}

std::shared_ptr<ProcessGroupCollection> join_collection(const std::string& record, uint64_t epoch, AdmitResult& out) {
  auto c = CollectionAccess::from_record(record);
  CollectionAccess::reshape(*c, epoch, out);
  return c;
}

}  // namespace comms::dist
