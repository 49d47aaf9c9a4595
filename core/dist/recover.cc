// comms::dist::recover: the world recovered through comms::recover (one
// agreement through the store), then every group rebuilt from its spec on
// the new world, or kept when it lost nobody.
#include <algorithm>
#include <exception>
#include <map>
#include <set>

#include "comms/dist.h"
#include "dist_state.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> checked_drops(std::vector<int> drops, const std::vector<int>& lost, int size) {
  std::sort(drops.begin(), drops.end());
  for (size_t i = 0; i < drops.size(); ++i) {
    const int r = drops[i];
    if (r < 0 || r >= size || (i > 0 && drops[i - 1] == r) || std::binary_search(lost.begin(), lost.end(), r)) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("comms::dist recover: the exclude rule gave [", str::join(drops, ","), "]: rank ", r,
                           " is outside [0, ", size, "), listed twice, or already lost [", str::join(lost, ","),
                           "]"));
    }
  }
  if (drops.size() + lost.size() >= static_cast<size_t>(size)) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("comms::dist recover: the exclude rule drops [", str::join(drops, ","),
                         "], which with the lost ranks [", str::join(lost, ","), "] leaves no rank of ", size));
  }
  return drops;
}

// This rank was dropped: every group (the world last) is released here.
void tear_down(std::vector<std::shared_ptr<GroupState>>& all) {
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    (*it)->destroyed = true;
    retire((*it)->comm, "this rank was dropped by the recovery's exclude rule");
  }
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.groups.clear();
  reg.world.reset();
}

// A planned shrink of the survivors' comm without the dropped ranks (null on
// them); `survivors` is released once the smaller comm is in use.
std::shared_ptr<Comm> drop_ranks(std::shared_ptr<Comm> survivors, RecoverResult& out) {
  std::vector<int> exclude;  // in the survivors' numbering
  for (int d : out.dropped) {
    exclude.push_back(d - static_cast<int>(std::count_if(out.lost.begin(), out.lost.end(), [&](int l) { return l < d; })));
  }
  std::shared_ptr<Comm> smaller = comms::shrink(*survivors, exclude);
  out.epoch = comms::epoch(*survivors) + 1;
  // Released once every member of the smaller comm is past the shrink (a
  // native shrink may still use the survivors' connections).
  if (smaller) smaller->barrier();
  try {
    survivors->finalize();
  } catch (const std::exception& e) {
    log::warning(str::cat("comms::dist recover: releasing '", survivors->name(), "': ", e.what()));
  }
  return smaller;
}

// Every group after the world, in creation order: kept (renumbered) when it
// lost no rank, else made again from its spec on the recovered parent.
// Returns the groups left with no member.
std::vector<std::shared_ptr<GroupState>> rebuild_groups(const std::vector<std::shared_ptr<GroupState>>& all,
                                                        const std::shared_ptr<GroupState>& w,
                                                        const std::set<int>& gone, RecoverResult& out) {
  const auto new_rank = [&](int old) {
    return old - static_cast<int>(std::distance(gone.begin(), gone.lower_bound(old)));
  };
  std::map<std::string, std::shared_ptr<GroupState>> by_name{{w->spec.name, w}};
  std::vector<std::shared_ptr<GroupState>> removed;
  for (const auto& g : all) {
    if (g == w || g->destroyed) continue;
    by_name[g->spec.name] = g;
    const bool held_gone = std::any_of(g->spec.ranks.begin(), g->spec.ranks.end(), [&](int x) { return gone.count(x) > 0; });
    std::vector<int> survivors;
    for (int x : g->spec.ranks) {
      if (!gone.count(x)) survivors.push_back(new_rank(x));
    }
    if (!held_gone && !g->from_split_group) {
      g->spec.ranks = std::move(survivors);
      out.kept.push_back(g->spec.name);
      continue;
    }
    auto parent = by_name.find(g->spec.parent);
    if (parent == by_name.end()) {
      throw Error(ErrorCode::kInternal, str::cat("comms::dist recover: group '", g->spec.name,
                                                 "' has lost its parent '", g->spec.parent, "'"));
    }
    retire(g->comm, "rebuilt by comms::dist::recover");
    // Every rank keeps the spec of a new_group group, so all decide alike;
    // a split_group group's list only its members hold (empty elsewhere).
    const int me = out.rank;
    auto mine = std::find(survivors.begin(), survivors.end(), me);
    const int member_rank = mine == survivors.end() ? -1 : static_cast<int>(mine - survivors.begin());
    g->spec.ranks = std::move(survivors);
    if (!g->from_split_group && g->spec.ranks.empty()) {
      g->destroyed = true;
      removed.push_back(g);
      out.removed.push_back(g->spec.name);
      continue;
    }
    // Outside the parent (a split_group of a group this rank is not in): no
    // part in its split, as at creation.
    if (parent->second->destroyed || !parent->second->comm) continue;
    g->comm = create_group_comm(g->spec, *parent->second, member_rank, str::cat(g->spec.name, "@e", out.epoch));
    if (g->comm) g->device = g->comm->device();
    out.rebuilt.push_back(g->spec.name);
  }
  return removed;
}

}  // namespace

RecoverResult recover(const RecoverOptions& options) {
  const auto start = Clock::now();
  const std::shared_ptr<GroupState> w = world().state();
  auto& reg = registry();
  std::vector<std::shared_ptr<GroupState>> all;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    all = reg.groups;  // world first, creation order
  }
  RecoverResult out;
  const int old_size = w->comm->size();
  out.old_rank = w->comm->rank();

  Recovery r = comms::recover(*w->comm, options.agree);
  out.lost = r.agreement.lost;
  out.epoch = r.agreement.epoch;
  std::shared_ptr<Comm> next = std::move(r.comm);
  std::exception_ptr rule_failure;
  if (options.exclude) {
    try {
      out.dropped = checked_drops(options.exclude(out.lost, old_size), out.lost, old_size);
    } catch (...) {
      rule_failure = std::current_exception();  // recover without drops, then raise it
    }
  }
  std::set<int> gone(out.lost.begin(), out.lost.end());
  if (!out.dropped.empty()) {
    next = drop_ranks(std::move(next), out);
    gone.insert(out.dropped.begin(), out.dropped.end());
  }
  retire(w->comm, "replaced by the recovered world");
  if (!next) {
    out.excluded = true;
    tear_down(all);
    log::info(str::cat("comms::dist recover: rank ", out.old_rank, " was dropped (lost [", str::join(out.lost, ","),
                       "], dropped [", str::join(out.dropped, ","), "])"));
    out.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    return out;
  }
  w->comm = next;
  w->spec.ranks.resize(static_cast<size_t>(next->size()));
  for (int i = 0; i < next->size(); ++i) w->spec.ranks[static_cast<size_t>(i)] = i;
  out.rank = next->rank();
  out.world_size = next->size();

  std::vector<std::shared_ptr<GroupState>> removed = rebuild_groups(all, w, gone, out);
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    std::erase_if(reg.groups, [&](const auto& g) {
      return std::find(removed.begin(), removed.end(), g) != removed.end();
    });
  }
  out.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  log::info(str::cat("comms::dist recover: lost [", str::join(out.lost, ","), "], dropped [",
                     str::join(out.dropped, ","), "]; world of ", out.world_size, " at epoch ", out.epoch,
                     "; rebuilt [", str::join(out.rebuilt, ","), "], kept [", str::join(out.kept, ","),
                     "], removed [", str::join(out.removed, ","), "] in ", out.took.count(), " ms"));
  if (rule_failure) std::rethrow_exception(rule_failure);
  return out;
}

}  // namespace comms::dist
