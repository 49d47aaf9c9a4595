// Recovery of a model-parallel collection: the layout derived again for the
// smaller world. dist::recover rebuilds each group from its surviving
// members, renumbered in order; when the lost (and dropped) ranks are whole
// data-parallel replicas that is exactly the rank generator's layout for the
// new world (removing one coordinate of one axis keeps the mixed-radix order
// of the rest), which why_layout_cannot_shrink checks group by group.
#include <algorithm>
#include <set>

#include "comms/parallel.h"
#include "dist_state.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

std::string ranks_text(const std::vector<int>& v) { return str::cat("[", str::join(v, ","), "]"); }

std::string layout_text(const ParallelConfig& c) {
  return str::cat("tp=", c.tp, " pp=", c.pp, " cp=", c.cp, " ep=", c.ep,
                  c.expert_tp ? str::cat(" expert_tp=", *c.expert_tp) : std::string(), " order=", c.order);
}

// Groups whose size does not depend on the world size: they may not change.
bool fixed_size_group(const std::string& name) { return name.find("dp") == std::string::npos; }

}  // namespace

std::string why_layout_cannot_shrink(const ParallelConfig& config, int world_size, const std::vector<int>& gone_in) {
  std::set<int> gone(gone_in.begin(), gone_in.end());
  const int left = world_size - static_cast<int>(gone.size());
  const std::string head = str::cat("losing ranks ", ranks_text({gone.begin(), gone.end()}), " of ", world_size,
                                    " leaves ", left, " ranks");
  if (left < 1) return str::cat(head, ": no rank is left");
  ParallelPlan after;
  try {
    after = plan_model_parallel(config, left);
  } catch (const Error& e) {
    return str::cat(head, ", which the layout (", layout_text(config), ") cannot take: ", e.what());
  }
  const ParallelPlan before = plan_model_parallel(config, world_size);
  std::vector<int> survivors;
  for (int r = 0; r < world_size; ++r) {
    if (!gone.count(r)) survivors.push_back(r);
  }
  // The single axes first, so the reason names the axis the loss breaks.
  std::vector<const PlannedGroup*> fixed;
  for (const char* axis : {"tp", "pp", "cp", "ep", "expt_tp"}) {
    if (const PlannedGroup* g = after.find(axis)) fixed.push_back(g);
  }
  for (const PlannedGroup& g : after.groups) {
    if (fixed_size_group(g.name) && std::find(fixed.begin(), fixed.end(), &g) == fixed.end()) fixed.push_back(&g);
  }
  for (const PlannedGroup* gp : fixed) {
    const PlannedGroup& g = *gp;
    const PlannedGroup* old = before.find(g.name);
    const std::set<std::vector<int>> old_lists(old->rank_lists.begin(), old->rank_lists.end());
    for (const auto& list : g.rank_lists) {
      std::vector<int> mapped;
      for (int x : list) mapped.push_back(survivors[static_cast<size_t>(x)]);
      if (old_lists.count(mapped)) continue;
      std::vector<int> broken, lost_there;
      for (const auto& o : old->rank_lists) {
        if (std::find(o.begin(), o.end(), mapped.front()) == o.end()) continue;
        broken = o;
        for (int x : o)
          if (gone.count(x)) lost_there.push_back(x);
      }
      return str::cat(head, ", but ", lost_there.empty() ? "the loss" : str::cat("the loss of ", ranks_text(lost_there)),
                      " breaks ", g.name, " group ", ranks_text(broken), " (", layout_text(config),
                      "): a ", g.name, " group cannot shrink, and the layout derived again for ", left,
                      " ranks would make ranks ", ranks_text(mapped), " of different data-parallel replicas one ",
                      g.name, " group; drop whole replicas (drop_replicas())");
    }
  }
  return "";
}

ShrinkRule drop_replicas() {
  return [](const LayoutLoss& loss) {
    const PlannedGroup* dp = loss.plan->find("dp");
    std::set<size_t> coordinates;  // the dp index of each replica that lost a rank
    for (int l : loss.lost) {
      for (const auto& list : dp->rank_lists) {
        auto it = std::find(list.begin(), list.end(), l);
        if (it != list.end()) coordinates.insert(static_cast<size_t>(it - list.begin()));
      }
    }
    std::set<int> drop;
    for (const auto& list : dp->rank_lists) {
      for (size_t c : coordinates) drop.insert(list[c]);
    }
    for (int l : loss.lost) drop.erase(l);
    return std::vector<int>(drop.begin(), drop.end());
  };
}

RecoverResult recover_model_parallel(ProcessGroupCollection& c, const ShrinkRule& rule, const AgreeOptions& options) {
  check_reshapable(c, "recovery");
  const std::string who = str::cat("comms::dist model parallel: collection '", c.prefix_, "'");
  RecoverOptions o;
  o.agree = options;
  std::string refused;
  o.exclude = [&](const std::vector<int>& lost, int world_size) -> std::vector<int> {
    const std::string why = why_layout_cannot_shrink(c.config_, world_size, lost);
    if (why.empty()) return {};
    if (!rule) {
      refused = str::cat(who, " cannot shrink: ", why,
                         ". Pass a ShrinkRule (drop_replicas() drops every data-parallel replica holding a lost rank)");
      throw Error(ErrorCode::kInvalidArgument, refused);
    }
    std::vector<int> drops = rule(LayoutLoss{&c.config_, &c.plan_, world_size, lost});
    std::vector<int> gone = lost;
    gone.insert(gone.end(), drops.begin(), drops.end());
    if (const std::string still = why_layout_cannot_shrink(c.config_, world_size, gone); !still.empty()) {
      std::sort(drops.begin(), drops.end());
      refused = str::cat(who, " cannot shrink even with the rule's drops ", ranks_text(drops), ": ", still);
      throw Error(ErrorCode::kInvalidArgument, refused);
    }
    return drops;
  };
  RecoverResult r;
  try {
    r = recover(o);
  } catch (const Error&) {
    if (!refused.empty()) c.unusable_ = refused;
    throw;
  }
  if (r.excluded) {
    c.unusable_ = str::cat("this rank (", r.old_rank, ") was dropped by the recovery (lost ", ranks_text(r.lost),
                           ", dropped ", ranks_text(r.dropped), ")");
    for (auto& [name, e] : c.entries_) e.group = Group();
    return r;
  }
  ParallelPlan plan = plan_model_parallel(c.config_, r.world_size, world().backend());
  if (c.config_.world_size) c.config_.world_size = r.world_size;
  for (auto& [name, e] : c.entries_) {
    if (!e.created) continue;
    e.rank_lists = plan.find(name)->rank_lists;
    if (!e.group.state()) continue;  // in no group of this kind, before and after
    const std::vector<int>& now = e.group.global_ranks();
    if (std::find(e.rank_lists.begin(), e.rank_lists.end(), now) == e.rank_lists.end()) {
      throw Error(ErrorCode::kInternal,
                  str::cat(who, ": after the recovery group '", e.group.name(), "' holds ", ranks_text(now),
                           ", which is no ", name, " group of the layout for ", r.world_size, " ranks"));
    }
  }
  c.plan_ = std::move(plan);
  return r;
}

}  // namespace comms::dist
